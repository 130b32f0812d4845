//! Real agent processes and real block devices for the cleaning scenarios.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Whether this process runs as root (loop devices need it).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// Whether a command is on PATH.
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool} >/dev/null"))
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// A loop device over a file, detached on drop (every path, panics included).
pub struct LoopDevice {
    /// `/dev/loopN`.
    pub path: PathBuf,
}

impl LoopDevice {
    /// `losetup --find --show FILE`.
    pub fn attach(file: &Path) -> Result<LoopDevice> {
        let out = Command::new("losetup")
            .arg("--find")
            .arg("--show")
            .arg(file)
            .output()?;
        if !out.status.success() {
            bail!("losetup failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        Ok(LoopDevice { path })
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        // Partitions added with BLKPG (`partx -u`, sfdisk) outlive a detach on a device
        // without partscan, and the next test to get this loop device would see them.
        let _ = Command::new("partx")
            .arg("-d")
            .arg(&self.path)
            .stderr(std::process::Stdio::null())
            .status();
        let _ = Command::new("losetup").arg("-d").arg(&self.path).status();
    }
}

/// A `rivet-agent run` child process, killed on drop.
pub struct AgentProcess {
    child: Option<Child>,
    /// Its stderr log.
    pub log: PathBuf,
}

impl AgentProcess {
    /// Start the real agent binary against `controller` for `node` on `devices`.
    pub fn start(
        controller: &str,
        node: &str,
        devices: &[&Path],
        plugin_dir: Option<&Path>,
        log: &Path,
        env: &[(&str, &str)],
    ) -> Result<AgentProcess> {
        let exe = crate::bin("rivet-agent");
        if !exe.exists() {
            bail!(
                "{} not built: run `cargo build --workspace --bins`",
                exe.display()
            );
        }
        let devs: Vec<String> = devices.iter().map(|d| d.display().to_string()).collect();
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let mut cmd = Command::new(&exe);
        cmd.arg("run")
            .arg("--controller")
            .arg(controller)
            .arg("--node")
            .arg(node)
            .arg("--devices")
            .arg(devs.join(","))
            .arg("--plugin-dir")
            .arg(
                plugin_dir
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| PathBuf::from("/nonexistent")),
            )
            .env("RIVET_LOG", "info")
            .stdout(Stdio::null())
            .stderr(logf);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("spawning {}", exe.display()))?;
        Ok(AgentProcess {
            child: Some(child),
            log: log.to_path_buf(),
        })
    }

    /// kill -9.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Whether every byte of a file (or device) reads zero.
pub fn all_zero(path: &Path) -> Result<bool> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(true);
        }
        if buf[..n].iter().any(|b| *b != 0) {
            return Ok(false);
        }
    }
}

/// Write `data` at `offset` of a file.
pub fn write_at(path: &Path, offset: u64, data: &[u8]) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path)?;
    f.write_all_at(data, offset)?;
    f.sync_all()?;
    Ok(())
}

/// Read `len` bytes at `offset`.
pub fn read_at(path: &Path, offset: u64, len: usize) -> Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, offset)?;
    Ok(buf)
}
