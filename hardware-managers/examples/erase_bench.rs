//! Erase throughput benchmark (not a test).
//!
//! ```text
//! cargo run --release -p rivet-hardware-managers --example erase_bench -- \
//!     [--dir DIR] [--size-gib N] [--meta-gib N] [--reps N] [--no-loop]
//! ```
//!
//! Each case runs `--reps` times (default 3), interleaved with its baseline so that both see
//! the same state of the host's storage (a virtual disk's first write to fresh space can be
//! several times slower than later ones); the median is reported.
//!
//! 1. Baseline: a plain sequential write of zeros (4 MiB writes, then fsync) of N GiB to a
//!    fresh file in DIR, and — as root — through O_DIRECT to a loop device of the same size.
//! 2. `erase_devices` (the real step, through the Dispatcher) on the same kinds of target:
//!    a file of N GiB (zero overwrite) and a loop device (BLKZEROOUT), and the same with one
//!    random pass.
//! 3. `erase_devices_metadata` on a 10 GiB sparse disk with a GPT of 4 partitions (made by
//!    sgdisk when installed), as a file and as a loop device.

use rivet_hardware_managers::{
    Dispatcher, GenericManager, HardwareManager, ManagerConfig, StepContext,
};
use serde_json::{json, Value};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

struct Loop(String);
impl Loop {
    fn attach(file: &Path) -> Option<Loop> {
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(file)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| Loop(String::from_utf8_lossy(&out.stdout).trim().to_string()))
    }
}
impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

fn sparse(path: &Path, size: u64) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    File::create(path)?.set_len(size)
}

/// Plain sequential zero write, the reference an erase is compared with.
fn sequential_write(path: &Path, size: u64, direct: bool) -> std::io::Result<f64> {
    let mut o = OpenOptions::new();
    o.write(true);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    let mut f = o.open(path)?;
    // 4 MiB, 4 KiB-aligned (O_DIRECT): over-allocate and slice.
    let raw = vec![0u8; 4 * MIB as usize + 4096];
    let off = (4096 - raw.as_ptr() as usize % 4096) % 4096;
    let buf = &raw[off..off + 4 * MIB as usize];
    let t = Instant::now();
    let mut left = size;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.sync_all()?;
    Ok(t.elapsed().as_secs_f64())
}

fn erase(device: &Path, step: &str, args: Value) -> Result<(f64, Value), String> {
    let cfg = ManagerConfig {
        devices: Some(vec![device.to_path_buf()]),
        plugin_dir: PathBuf::from("/nonexistent"),
        ..ManagerConfig::default()
    };
    let m: Arc<dyn HardwareManager> = Arc::new(GenericManager::new(&cfg));
    let d = Dispatcher::new(vec![m]);
    let a = args.as_object().cloned().unwrap_or_default();
    let t = Instant::now();
    let r = d
        .execute(step, &a, &StepContext::new())
        .map_err(|e| e.to_string())?;
    Ok((t.elapsed().as_secs_f64(), r))
}

fn mbps(size: u64, secs: f64) -> f64 {
    size as f64 / MIB as f64 / secs.max(1e-9)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn row(what: &str, size: u64, times: Vec<f64>, note: &str) {
    let all: Vec<String> = times.iter().map(|t| format!("{t:.2}")).collect();
    let secs = median(times);
    println!(
        "{what:<52} {:>5.1} GiB {:>8.3} s {:>7.0} MiB/s  {note} [runs: {}]",
        size as f64 / GIB as f64,
        secs,
        mbps(size, secs),
        all.join(" ")
    );
}

fn method(r: &Value) -> String {
    r["devices"][0]["method"]
        .as_str()
        .unwrap_or("?")
        .to_string()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut dir = std::env::temp_dir();
    let mut size_gib = 2u64;
    let mut meta_gib = 10u64;
    let mut use_loop = true;
    let mut reps = 3usize;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--dir" => dir = PathBuf::from(it.next().ok_or("--dir needs a value")?),
            "--size-gib" => size_gib = it.next().ok_or("--size-gib needs a value")?.parse()?,
            "--meta-gib" => meta_gib = it.next().ok_or("--meta-gib needs a value")?.parse()?,
            "--no-loop" => use_loop = false,
            "--reps" => {
                reps = it
                    .next()
                    .ok_or("--reps needs a value")?
                    .parse::<usize>()?
                    .max(1)
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let work = tempfile::tempdir_in(&dir)?;
    let size = size_gib * GIB;
    let root = std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    let use_loop = use_loop && root && Path::new("/dev/loop-control").exists();
    println!(
        "erase_bench: target dir {} ({} cores)",
        dir.display(),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    println!(
        "{:<52} {:>9} {:>10} {:>13}  method",
        "case", "size", "median", "throughput"
    );

    // --- regular file -------------------------------------------------------------------
    let f = work.path().join("file.img");
    let (mut base, mut full, mut rand, mut expr) = (vec![], vec![], vec![], vec![]);
    let (mut m_full, mut m_rand, mut m_expr) = (String::new(), String::new(), String::new());
    for _ in 0..reps {
        sparse(&f, size)?;
        base.push(sequential_write(&f, size, false)?);
        sparse(&f, size)?;
        let (t, r) = erase(&f, "erase_devices", json!({}))?;
        full.push(t);
        m_full = method(&r);
        sparse(&f, size)?;
        let (t, r) = erase(&f, "erase_devices", json!({"random_passes": 1}))?;
        rand.push(t);
        m_rand = method(&r);
        let (t, r) = erase(&f, "erase_devices_express", json!({}))?;
        expr.push(t);
        m_expr = method(&r);
    }
    row(
        "file: plain sequential zero write + fsync (baseline)",
        size,
        base,
        "",
    );
    row("file: erase_devices", size, full, &m_full);
    row(
        "file: erase_devices random_passes=1 (2 passes)",
        2 * size,
        rand,
        &m_rand,
    );
    row("file: erase_devices_express", size, expr, &m_expr);
    std::fs::remove_file(&f)?;

    // --- loop device ----------------------------------------------------------------------
    if use_loop {
        let lf = work.path().join("loop.img");
        let (mut base, mut full, mut rand) = (vec![], vec![], vec![]);
        let (mut m_full, mut m_rand) = (String::new(), String::new());
        for _ in 0..reps {
            sparse(&lf, size)?;
            let l = Loop::attach(&lf).ok_or("losetup failed")?;
            base.push(sequential_write(Path::new(&l.0), size, true)?);
            drop(l);
            sparse(&lf, size)?;
            let l = Loop::attach(&lf).ok_or("losetup failed")?;
            let (t, r) = erase(Path::new(&l.0), "erase_devices", json!({}))?;
            full.push(t);
            m_full = method(&r);
            let (t, r) = erase(
                Path::new(&l.0),
                "erase_devices",
                json!({"random_passes": 1}),
            )?;
            rand.push(t);
            m_rand = method(&r);
        }
        row(
            "loop: plain sequential O_DIRECT zero write (baseline)",
            size,
            base,
            "",
        );
        row("loop: erase_devices", size, full, &m_full);
        row(
            "loop: erase_devices random_passes=1 (2 passes)",
            2 * size,
            rand,
            &m_rand,
        );
        std::fs::remove_file(&lf)?;
    } else {
        println!("(loop device cases skipped: need root and /dev/loop-control)");
    }

    // --- metadata on a partitioned sparse disk ---------------------------------------------
    let mf = work.path().join("meta.img");
    let msize = meta_gib * GIB;
    sparse(&mf, msize)?;
    let parted = Command::new("sgdisk")
        .args(["-n1:0:+1G", "-n2:0:+2G", "-n3:0:+3G", "-n4:0:0"])
        .arg(&mf)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    let (t, r) = erase(&mf, "erase_devices_metadata", json!({}))?;
    let d0 = &r["devices"][0];
    println!(
        "file {meta_gib} GiB disk, GPT {}: erase_devices_metadata {:.1} ms, {} partitions, {} KiB written",
        if parted { "with 4 partitions" } else { "(sgdisk missing: none)" },
        t * 1000.0,
        d0["partitions"].as_array().map(Vec::len).unwrap_or(0),
        d0["bytes"].as_u64().unwrap_or(0) / 1024
    );
    if use_loop {
        sparse(&mf, msize)?;
        if parted {
            let _ = Command::new("sgdisk")
                .args(["-n1:0:+1G", "-n2:0:+2G", "-n3:0:+3G", "-n4:0:0"])
                .arg(&mf)
                .output();
        }
        if let Some(l) = Loop::attach(&mf) {
            let (t, r) = erase(Path::new(&l.0), "erase_devices_metadata", json!({}))?;
            let d0 = &r["devices"][0];
            println!(
                "loop {meta_gib} GiB disk: erase_devices_metadata {:.1} ms, {} partitions, {} KiB written",
                t * 1000.0,
                d0["partitions"].as_array().map(Vec::len).unwrap_or(0),
                d0["bytes"].as_u64().unwrap_or(0) / 1024
            );
        }
    }
    Ok(())
}
