//! Shared test helpers: root/tool checks that explain a skip, guards that always detach loop
//! devices and unmount (also when a test panics), sparse backing files, byte checks.
#![allow(dead_code)]

use anyhow::{bail, Context, Result};
use rivet_hardware_managers::{
    Dispatcher, GenericManager, HardwareManager, ManagerConfig, StepContext, StepError,
};
use serde_json::{Map, Value};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// Whether we run as root (reads /proc so no unsafe geteuid is needed).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// Full path of a tool, looking in PATH and the sbin directories.
pub fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"])
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file());
    found
}

/// True when the test can run; otherwise prints why it skips.
pub fn require(root: bool, tools: &[&str]) -> bool {
    if root && !is_root() {
        eprintln!("skipping: needs root for losetup/mount");
        return false;
    }
    for t in tools {
        if tool(t).is_none() {
            eprintln!("skipping: {t} not installed (run scripts/install-erase-test-tools.sh)");
            return false;
        }
    }
    if root && !Path::new("/dev/loop-control").exists() {
        eprintln!("skipping: no /dev/loop-control (loop module not available)");
        return false;
    }
    true
}

/// Run a tool, fail with its stderr if it fails; returns stdout.
pub fn run(name: &str, args: &[&str]) -> Result<String> {
    let exe = tool(name).with_context(|| format!("{name} not found"))?;
    let out = Command::new(&exe)
        .args(args)
        .output()
        .with_context(|| format!("running {name}"))?;
    if !out.status.success() {
        bail!(
            "{name} {args:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Run a tool and return (exit code, stdout) without failing.
pub fn run_status(name: &str, args: &[&str]) -> Result<(i32, String)> {
    let exe = tool(name).with_context(|| format!("{name} not found"))?;
    let out = Command::new(&exe).args(args).output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    ))
}

/// A sparse file of `size` bytes.
pub fn sparse(dir: &Path, name: &str, size: u64) -> Result<PathBuf> {
    let p = dir.join(name);
    let f = File::create(&p)?;
    f.set_len(size)?;
    Ok(p)
}

/// An attached loop device, detached on drop (also during a panic unwind).
pub struct LoopDev {
    pub path: PathBuf,
}

impl LoopDev {
    /// `losetup --find --show --partscan FILE`.
    pub fn attach(file: &Path) -> Result<LoopDev> {
        Self::attach_args(file, &["--partscan"])
    }

    /// `losetup --find --show FILE`: no partscan, so the kernel lists only the partitions
    /// someone adds with BLKPG (`partx -a`), and keeps them when the table changes.
    pub fn attach_no_partscan(file: &Path) -> Result<LoopDev> {
        Self::attach_args(file, &[])
    }

    /// A read-only attach.
    pub fn attach_ro(file: &Path) -> Result<LoopDev> {
        Self::attach_args(file, &["--read-only"])
    }

    /// A window of the file (a partition view): `--offset O --sizelimit S`.
    pub fn attach_range(file: &Path, offset: u64, size: u64) -> Result<LoopDev> {
        let (o, s) = (offset.to_string(), size.to_string());
        Self::attach_args(file, &["--offset", &o, "--sizelimit", &s])
    }

    fn attach_args(file: &Path, extra: &[&str]) -> Result<LoopDev> {
        let f = file.to_str().context("utf8 path")?;
        let mut args = vec!["--find", "--show"];
        args.extend_from_slice(extra);
        args.push(f);
        let out = run("losetup", &args)?;
        Ok(LoopDev {
            path: PathBuf::from(out.trim()),
        })
    }

    pub fn name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    pub fn as_str(&self) -> &str {
        self.path.to_str().unwrap_or_default()
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        // Partitions added with BLKPG (partx, sfdisk) outlive a detach on a device without
        // partscan, and the next test to get this loop device would see them: drop them first.
        let _ = Command::new("partx")
            .arg("-d")
            .arg(&self.path)
            .stderr(std::process::Stdio::null())
            .status();
        if let Err(e) = run("losetup", &["-d", self.as_str()]) {
            eprintln!("warning: detaching {}: {e}", self.path.display());
        }
    }
}

/// A mount, unmounted on drop.
pub struct MountGuard {
    pub dir: PathBuf,
}

impl MountGuard {
    pub fn mount(dev: &str, dir: &Path) -> Result<MountGuard> {
        std::fs::create_dir_all(dir)?;
        run("mount", &[dev, dir.to_str().context("utf8")?])?;
        Ok(MountGuard {
            dir: dir.to_path_buf(),
        })
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        let d = self.dir.to_string_lossy().into_owned();
        if run("umount", &[&d]).is_err() {
            let _ = run("umount", &["-l", &d]);
        }
    }
}

/// Write `data` at `offset` and sync.
pub fn write_at(path: &Path, offset: u64, data: &[u8]) -> Result<()> {
    let f = OpenOptions::new().write(true).open(path)?;
    f.write_all_at(data, offset)?;
    f.sync_all()?;
    Ok(())
}

/// Read `len` bytes at `offset`.
pub fn read_at(path: &Path, offset: u64, len: usize) -> Result<Vec<u8>> {
    let f = File::open(path)?;
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, offset)?;
    Ok(b)
}

/// Offset of the first non-zero byte of `path`, reading all of it.
pub fn first_nonzero(path: &Path) -> Result<Option<u64>> {
    let f = File::open(path)?;
    let mut buf = vec![0u8; 4 << 20];
    let mut pos = 0u64;
    loop {
        let n = f.read_at(&mut buf, pos)?;
        if n == 0 {
            return Ok(None);
        }
        if let Some(i) = buf[..n].iter().position(|b| *b != 0) {
            return Ok(Some(pos + i as u64));
        }
        pos += n as u64;
    }
}

/// A recognisable pattern.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

/// A dispatcher with just the generic manager over `devices`.
pub fn generic_over(devices: Vec<PathBuf>) -> (Dispatcher, ManagerConfig) {
    let cfg = ManagerConfig {
        devices: Some(devices),
        plugin_dir: PathBuf::from("/nonexistent"),
        ..ManagerConfig::default()
    };
    let m: Arc<dyn HardwareManager> = Arc::new(GenericManager::new(&cfg));
    (Dispatcher::new(vec![m]), cfg)
}

/// JSON object args.
pub fn args(v: Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}

/// Run a step on a fresh context.
pub fn step(d: &Dispatcher, name: &str, a: Value) -> Result<Value, StepError> {
    d.execute(name, &args(a), &StepContext::new())
}

/// `wipefs --no-act` signature lines (empty = nothing found).
pub fn wipefs_signatures(dev: &str) -> Result<Vec<String>> {
    let out = run("wipefs", &["--no-act", "--noheadings", dev])?;
    Ok(out
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(String::from)
        .collect())
}

/// `blkid -p` on a device (optionally at an offset/size of it): Some(output) when something
/// is found, None when blkid reports nothing (exit 2).
pub fn blkid_probe(dev: &str, range: Option<(u64, u64)>) -> Result<Option<String>> {
    let mut a: Vec<String> = vec!["-p".into()];
    if let Some((o, s)) = range {
        a.extend(["-O".into(), o.to_string(), "-S".into(), s.to_string()]);
    }
    a.push(dev.into());
    let refs: Vec<&str> = a.iter().map(String::as_str).collect();
    match run_status("blkid", &refs)? {
        (0, out) => Ok(Some(out)),
        (2, _) => Ok(None),
        (c, out) => bail!("blkid {refs:?} exited {c}: {out}"),
    }
}

/// (start, size) in bytes of each partition in the table of `dev` (userspace parse: works
/// even when the kernel has no partition-table support).
pub fn partitions(dev: &str) -> Result<Vec<(u64, u64)>> {
    let out = run(
        "partx",
        &["--raw", "--noheadings", "-o", "START,SECTORS", dev],
    )?;
    out.lines()
        .map(|l| {
            let mut it = l.split_whitespace();
            let s: u64 = it.next().context("start")?.parse()?;
            let n: u64 = it.next().context("sectors")?.parse()?;
            Ok((s * 512, n * 512))
        })
        .collect()
}
