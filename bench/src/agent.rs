//! `rivet-bench agent`: the ramdisk agent's footprint — static binary size, `rivet-agent
//! inventory` wall time and peak RSS on this machine.
//!
//! Step dispatch latency is measured by `tests/dispatch_bench.rs` (the real agent library
//! against a release rivetd); `scripts/bench.sh` runs it and prints its rows next to these.

use crate::procstat::run_measured;
use crate::stats::{mib, ms, percentile};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Options of `rivet-bench agent`.
#[derive(Debug, Clone)]
pub struct AgentOpts {
    /// The agent binary; default: build it with scripts/build-agent.sh.
    pub agent_bin: Option<PathBuf>,
    /// Timed `inventory` runs (after one untimed).
    pub runs: usize,
}

/// The workspace root (this crate's parent directory, fixed at build time).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// `scripts/build-agent.sh` prints the static binary's path last on stdout.
pub(crate) fn static_agent() -> Result<PathBuf> {
    let root = repo_root();
    let out = Command::new("bash")
        .arg(root.join("scripts/build-agent.sh"))
        .current_dir(&root)
        .stderr(Stdio::inherit())
        .output()
        .context("running scripts/build-agent.sh")?;
    if !out.status.success() {
        bail!("scripts/build-agent.sh failed ({})", out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let path = text
        .lines()
        .last()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .context("scripts/build-agent.sh printed no path")?;
    Ok(PathBuf::from(path))
}

/// `file -L` of the binary, e.g. "… statically linked …".
fn file_kind(bin: &Path) -> String {
    Command::new("file")
        .arg("-L")
        .arg("-b")
        .arg(bin)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// `rivet-bench agent`.
pub fn run(o: AgentOpts) -> Result<Vec<String>> {
    let (bin, note) = match o.agent_bin {
        Some(b) => (b, String::new()),
        None => match static_agent() {
            Ok(b) => (b, String::new()),
            Err(e) => {
                let fallback = repo_root().join("target/release/rivet-agent");
                eprintln!("{e:#}; falling back to {}", fallback.display());
                (
                    fallback,
                    " (fallback: target/release/rivet-agent, not the static build)".to_string(),
                )
            }
        },
    };
    if !bin.is_file() {
        bail!("{} not found", bin.display());
    }
    let size = std::fs::metadata(&bin)?.len();
    let kind = file_kind(&bin);
    let linkage = if kind.contains("statically linked") || kind.contains("static-pie linked") {
        "static"
    } else {
        "NOT static"
    };
    let stripped = if kind.contains(", stripped") {
        ", stripped"
    } else {
        ""
    };

    // Check the output once (it must be the inventory), then time runs with stdout discarded.
    let out = Command::new(&bin)
        .arg("inventory")
        .stderr(Stdio::null())
        .output()
        .with_context(|| format!("running {} inventory", bin.display()))?;
    if !out.status.success() {
        bail!("{} inventory failed ({})", bin.display(), out.status);
    }
    let inv: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("inventory output is not JSON")?;
    let disks = inv["disks"].as_array().map(Vec::len).unwrap_or(0);
    let nics = inv["interfaces"].as_array().map(Vec::len).unwrap_or(0);

    let mut walls: Vec<Duration> = Vec::with_capacity(o.runs);
    let mut peak_kib = 0;
    for _ in 0..o.runs.max(1) {
        let (wall, rss, ok) = run_measured(
            Command::new(&bin)
                .arg("inventory")
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )?;
        if !ok {
            bail!("{} inventory failed during the timed runs", bin.display());
        }
        walls.push(wall);
        peak_kib = peak_kib.max(rss);
    }
    walls.sort_unstable();
    let runs = walls.len();
    Ok(vec![
        format!(
            "| agent: binary size{note} | {:.2} MiB ({size} bytes), {linkage}{stripped} | `bash scripts/build-agent.sh` then `rivet-bench agent` |",
            size as f64 / (1 << 20) as f64
        ),
        format!(
            "| agent: `rivet-agent inventory` on this machine ({disks} disks, {nics} NICs) | median {} wall (min {}, max {}, {runs} runs); peak RSS {} | `rivet-bench agent --runs {runs}` |",
            ms(percentile(&walls, 50.0)),
            ms(walls[0]),
            ms(walls[runs - 1]),
            mib(peak_kib)
        ),
    ])
}
