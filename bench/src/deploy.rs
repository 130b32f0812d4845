//! `rivet-bench deploy`: the static agent's `write_image` against `curl | dd`, on one loop
//! device, in the same run.
//!
//! A GPT whole-disk image of `--size-gib` GiB (half pseudo-random MiBs, half zero MiBs, as
//! real images mix code and empty space) is served over loopback HTTP by a Rust file
//! server. Each round writes it to the same loop device twice, interleaved so both see the
//! same machine: `curl -s URL | dd of=DEV bs=4M oflag=direct` (the baseline, no
//! verification) and `rivet-agent step write_image` (streamed, sha256 verified, GPT fixed).
//! The same content as qcow2 (qemu-img) and zstd (`zstd -3`) is timed too. Needs root
//! (losetup), curl, qemu-img and zstd; the loop device is detached on every way out.

use crate::stats::percentile;
use anyhow::{bail, Result};
use rivet_tests::agentproc::LoopDevice;
use rivet_tests::fileserver::FileServer;
use rivet_tests::{gpt_one_partition, run_tool, sha256_file};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Options of `rivet-bench deploy`.
#[derive(Debug, Clone)]
pub struct DeployOpts {
    /// Image size in GiB.
    pub size_gib: u64,
    /// Rounds (each: dd once, write_image once, per format).
    pub reps: usize,
    /// The agent binary (default: the static one, built by scripts/build-agent.sh).
    pub agent_bin: Option<PathBuf>,
    /// Directory for the image, its variants and the loop device's backing file.
    pub dir: Option<PathBuf>,
}

const MIB: u64 = 1 << 20;

/// The raw image: odd MiBs pseudo-random, even MiBs zero, a GPT around them.
fn make_image(path: &Path, gib: u64) -> Result<()> {
    let mut f = std::io::BufWriter::with_capacity(8 << 20, std::fs::File::create(path)?);
    let mut block = vec![0u8; MIB as usize];
    let zero = vec![0u8; MIB as usize];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for i in 0..gib * 1024 {
        if i % 2 == 1 {
            fill_incompressible(&mut block, &mut x);
            f.write_all(&block)?;
        } else {
            f.write_all(&zero)?;
        }
    }
    f.flush()?;
    drop(f);
    gpt_one_partition(path)?;
    Ok(())
}

fn time(cmd: &mut Command) -> Result<Duration> {
    let t = Instant::now();
    let out = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).output()?;
    let took = t.elapsed();
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(took)
}

fn rate(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / MIB as f64
}

/// Median of a set of times.
fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    percentile(&v, 50.0)
}

/// Run the bench; markdown rows for docs/numbers.md.
pub fn run_bench(o: DeployOpts) -> Result<Vec<String>> {
    for tool in [
        "losetup",
        "curl",
        "dd",
        "qemu-img",
        "zstd",
        "sgdisk",
        "sha256sum",
    ] {
        if which(tool).is_none() {
            bail!("{tool} is not installed (scripts/setup.sh installs what the benches need)");
        }
    }
    let agent = match &o.agent_bin {
        Some(p) => p.clone(),
        None => crate::agent::static_agent()?,
    };
    let tmp = match &o.dir {
        Some(d) => tempfile::tempdir_in(d)?,
        None => tempfile::tempdir_in(std::env::temp_dir())?,
    };
    let www = tmp.path().join("www");
    std::fs::create_dir(&www)?;
    let raw = www.join("image.raw");
    let t = Instant::now();
    make_image(&raw, o.size_gib)?;
    run_tool(
        Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "qcow2"])
            .arg(&raw)
            .arg(www.join("image.qcow2")),
    )?;
    run_tool(Command::new("sh").arg("-c").arg(format!(
        "zstd -q -3 -T2 -c {} > {}",
        raw.display(),
        www.join("image.raw.zst").display()
    )))?;
    eprintln!("deploy bench: images made in {:.1?}", t.elapsed());
    let server = FileServer::start(&www)?;
    let backing = tmp.path().join("disk.img");
    let size = o.size_gib * 1024 * MIB;
    std::fs::File::create(&backing)?.set_len(size + 256 * MIB)?;
    let dev = LoopDevice::attach(&backing)?;
    let devs = dev.path.display().to_string();
    let bytes = |name: &str| {
        std::fs::metadata(www.join(name))
            .map(|m| m.len())
            .unwrap_or(0)
    };

    let dd = |name: &str| {
        time(Command::new("sh").arg("-c").arg(format!(
            "curl -sf {} | dd of={devs} bs=4M oflag=direct status=none",
            server.url_of(name)
        )))
    };
    let agent_write = |name: &str| -> Result<Duration> {
        let args = serde_json::json!({
            "image_source": server.url_of(name),
            "os_hash_algo": "sha256",
            "os_hash_value": sha256_file(&www.join(name))?,
            "root_device": {"name": devs},
        });
        time(
            Command::new(&agent)
                .args(["step", "write_image", "--devices", &devs, "--args"])
                .arg(args.to_string())
                .env("RIVET_LOG", "warn"),
        )
    };
    let mut dd_raw = Vec::new();
    let mut agent_raw = Vec::new();
    let mut qcow = Vec::new();
    let mut zst = Vec::new();
    for round in 0..o.reps.max(1) {
        dd_raw.push(dd("image.raw")?);
        agent_raw.push(agent_write("image.raw")?);
        qcow.push(agent_write("image.qcow2")?);
        zst.push(agent_write("image.raw.zst")?);
        eprintln!(
            "deploy bench: round {round}: dd {:.2?}, write_image raw {:.2?}, qcow2 {:.2?}, zstd {:.2?}",
            dd_raw[round], agent_raw[round], qcow[round], zst[round]
        );
    }
    let (d, a, q, z) = (median(dd_raw), median(agent_raw), median(qcow), median(zst));
    let cmd = format!(
        "`rivet-bench deploy --size-gib {} --reps {}` (root)",
        o.size_gib, o.reps
    );
    Ok(vec![
        format!(
            "| Deploy a {} GiB raw image over loopback HTTP onto a loop device: `write_image` (static agent, sha256 verified, GPT fixed) vs `curl -s URL \\| dd of=DEV bs=4M oflag=direct` (no verification), median of {} interleaved rounds | write_image {:.0} MiB/s ({:.2?}) vs dd {:.0} MiB/s ({:.2?}): **{:.2}× the dd rate** (aim ≥ 0.9) | {cmd} |",
            o.size_gib,
            o.reps,
            rate(size, a),
            a,
            rate(size, d),
            d,
            d.as_secs_f64() / a.as_secs_f64()
        ),
        format!(
            "| Same content as qcow2 ({} MiB file, zero clusters unallocated) and as zstd ({} MiB), written by `write_image` | qcow2 {:.2?} ({:.0} MiB/s of disk), zstd {:.2?} ({:.0} MiB/s of disk) | same command |",
            bytes("image.qcow2") / MIB,
            bytes("image.raw.zst") / MIB,
            q,
            rate(size, q),
            z,
            rate(size, z)
        ),
    ])
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
    })
}

/// Fills `block` (a multiple of 8 bytes) from a xorshift64 generator whose state is `x`:
/// bytes no compressor shrinks, made at memory speed.
pub(crate) fn fill_incompressible(block: &mut [u8], x: &mut u64) {
    for c in block.chunks_mut(8) {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
}
