//! `rivet-bench fleet-deploy`: N real `rivet-agent run` processes deploying the same
//! incompressible raw image at once, with `image_download_source = "http"` (every agent
//! reads the origin) and `"local"` (rivetd downloads it once and serves its cached copy),
//! for each N of `--nodes`, in one run (issue 47).
//!
//! The origin is the tests' loopback file server, which counts the body bytes it sends.
//! Each agent's disk is a sparse regular file under `--dir` (the agent writes files as it
//! writes disks, buffered and fsynced). Per round: the origin's bytes / the image size, the
//! wall time from the deploy requests to the last `active` (and relative to the same
//! source's N = 1), rivetd's CPU time, peak RSS, and its egress of image bytes to the
//! agents (`rivet_image_cache_served_bytes_total` in `/metrics`) per second of the round.
//! With `local`, a warm second round of the largest N (a rebuild of
//! every node; the origin only answers a conditional request) measures what the origin
//! sends when the image is already cached. The baseline is the same N writes with the
//! image already on this machine: `dd if=IMAGE of=DISK bs=4M conv=fsync`, all at once.
//!
//! Every round ends by comparing every disk with the image byte for byte; a mismatch, a
//! failed deploy or a round past `--round-limit-s` ends the bench with an error. No root:
//! regular files only; everything on loopback.

use crate::procstat::cpu_time;
use crate::rivetd::{self, Admin, Rivetd, Settings};
use anyhow::{bail, Context, Result};
use reqwest::Method;
use rivet_tests::fileserver::FileServer;
use serde_json::json;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// Options of `rivet-bench fleet-deploy`.
#[derive(Debug, Clone)]
pub struct FleetDeployOpts {
    /// Fleet sizes, each a round per source.
    pub nodes: Vec<usize>,
    /// Image size in MiB.
    pub image_mib: u64,
    /// Sources to run (`http`, `local`).
    pub sources: Vec<String>,
    /// Where the image, the disks and rivetd's state go (a temporary directory inside it).
    pub dir: Option<PathBuf>,
    /// rivetd binary.
    pub rivetd: Option<PathBuf>,
    /// rivet-agent binary (default: next to rivetd).
    pub agent_bin: Option<PathBuf>,
    /// Upper bound of one round.
    pub round_limit: Duration,
    /// Keep the temporary directory.
    pub keep: bool,
}

/// What one round measured.
struct Round {
    source: String,
    nodes: usize,
    warm: bool,
    wall: Duration,
    origin_bytes: u64,
    cpu: Duration,
    hwm_kib: u64,
    served: u64,
}

/// The image: pseudo-random bytes (xorshift), which no compression shrinks.
fn make_image(path: &Path, mib: u64) -> Result<()> {
    let mut f = std::io::BufWriter::with_capacity(4 << 20, std::fs::File::create(path)?);
    let mut block = vec![0u8; MIB as usize];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..mib {
        crate::deploy::fill_incompressible(&mut block, &mut x);
        f.write_all(&block)?;
    }
    f.flush()?;
    Ok(())
}

fn sha256_hex(path: &Path) -> Result<String> {
    rivet_tests::sha256_file(path)
}

/// Whether `disk` starts with exactly the bytes of `image`.
fn holds_image(disk: &Path, image: &Path) -> Result<bool> {
    let mut a = std::fs::File::open(image)?;
    let mut b = std::fs::File::open(disk).with_context(|| disk.display().to_string())?;
    let mut x = vec![0u8; 4 << 20];
    let mut y = vec![0u8; 4 << 20];
    loop {
        let n = a.read(&mut x)?;
        if n == 0 {
            return Ok(true);
        }
        if b.read_exact(&mut y[..n]).is_err() || x[..n] != y[..n] {
            return Ok(false);
        }
    }
}

/// `rivet_image_cache_served_bytes_total` from rivetd's `/metrics`: image bytes it sent to
/// agents from its cache.
async fn served_bytes(url: &str) -> Result<u64> {
    let text = reqwest::get(format!("{url}/metrics")).await?.text().await?;
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix("rivet_image_cache_served_bytes_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or(0))
}

/// Fresh sparse disk files `disk0…` in `dir`, each a little larger than the image.
fn fresh_disks(dir: &Path, n: usize, image_bytes: u64) -> Result<Vec<PathBuf>> {
    (0..n)
        .map(|i| {
            let p = dir.join(format!("disk{i}.img"));
            let _ = std::fs::remove_file(&p);
            std::fs::File::create(&p)?.set_len(image_bytes + 8 * MIB)?;
            Ok(p)
        })
        .collect()
}

/// `rivet-agent run` children, killed when dropped.
struct Agents(Vec<Child>);

impl Agents {
    fn boot(agent: &Path, url: &str, nodes: &[(String, PathBuf)], logs: &Path) -> Result<Agents> {
        let mut kids = Vec::new();
        for (uuid, disk) in nodes {
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(logs.join(format!("agent-{uuid}.log")))?;
            kids.push(
                Command::new(agent)
                    .args(["run", "--controller", url, "--node", uuid])
                    .arg("--devices")
                    .arg(disk)
                    .args(["--plugin-dir", "/nonexistent"])
                    .env("RIVET_LOG", "info")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(log)
                    .spawn()
                    .with_context(|| format!("starting {}", agent.display()))?,
            );
        }
        Ok(Agents(kids))
    }
}

impl Drop for Agents {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Wait until every node is `active`; an error names the first failed node's last_error.
async fn all_active(admin: &Admin, n: usize, limit: Duration, dir: &Path) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let v = admin
            .call(
                Method::GET,
                "/v1/nodes?fields=name,provision_state,last_error&limit=1000",
                None,
            )
            .await?;
        let nodes = v["nodes"].as_array().cloned().unwrap_or_default();
        let mut active = 0;
        for node in &nodes {
            let state = node["provision_state"].as_str().unwrap_or_default();
            if state == "active" {
                active += 1;
            } else if state.ends_with("failed") {
                bail!(
                    "{} is in {state}: {} (logs in {}; --keep keeps them)",
                    node["name"],
                    node["last_error"],
                    dir.display()
                );
            }
        }
        if active == n {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{active} of {n} nodes active after {limit:?} (logs in {}; --keep keeps them)",
                dir.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every disk must hold the image byte for byte.
fn check_disks(disks: &[PathBuf], image: &Path, what: &str) -> Result<()> {
    for d in disks {
        if !holds_image(d, image)? {
            bail!(
                "{what}: {} does not hold the image byte for byte",
                d.display()
            );
        }
    }
    Ok(())
}

/// One rivetd with `n` nodes of `source`: a cold round, and with `warm` a rebuild of every
/// node after it.
#[allow(clippy::too_many_arguments)]
async fn rounds(
    o: &FleetDeployOpts,
    exe: &Path,
    agent: &Path,
    base: &Path,
    origin: &FileServer,
    image: &Path,
    digest: &str,
    source: &str,
    n: usize,
    warm: bool,
) -> Result<Vec<Round>> {
    let dir = base.join(format!("{source}-{n}"));
    std::fs::create_dir_all(&dir)?;
    let image_bytes = std::fs::metadata(image)?.len();
    let settings = Settings {
        long_poll_s: 2,
        check_interval_s: 1,
        power_sync_interval_s: 0,
        agent_extra: format!("image_download_source = \"{source}\"\n"),
        conductor_extra: "automated_clean = false\n".into(),
        // Every round of `local` after the first asks the origin (a conditional request):
        // the warm round measures what that costs.
        tables: "\n[image_cache]\nrevalidate_after_s = 0\n".into(),
        ..Default::default()
    };
    let mut d = Rivetd::start(exe, &dir, &dir.join("rivet.db"), &settings).await?;
    let admin = Admin::new(&d.url)?;
    let disks = fresh_disks(&dir, n, image_bytes)?;
    let url = origin.url_of("image.raw");
    let mut nodes = Vec::new();
    for (i, disk) in disks.iter().enumerate() {
        let v = admin
            .call(
                Method::POST,
                "/v1/nodes",
                Some(
                    json!({"driver": "fake-hardware", "deploy_interface": "direct",
                            "name": format!("n{i}"),
                            "properties": {"root_device": {"name": disk.display().to_string()},
                                           "capabilities": "boot_mode:bios"}}),
                ),
            )
            .await?;
        let uuid = v["uuid"].as_str().context("node without uuid")?.to_string();
        admin
            .call(
                Method::PATCH,
                &format!("/v1/nodes/{uuid}"),
                Some(json!([
                    {"op": "add", "path": "/instance_info/image_source", "value": url},
                    {"op": "add", "path": "/instance_info/image_os_hash_algo", "value": "sha256"},
                    {"op": "add", "path": "/instance_info/image_os_hash_value", "value": digest},
                ])),
            )
            .await?;
        for (verb, want) in [("manage", "manageable"), ("provide", "available")] {
            admin.provision(&uuid, verb).await?;
            admin
                .wait_state(
                    &uuid,
                    want,
                    Duration::from_millis(50),
                    Duration::from_secs(30),
                )
                .await?;
        }
        nodes.push((uuid, disk.clone()));
    }
    let mut out = Vec::new();
    for (verb, is_warm) in [("active", false), ("rebuild", true)] {
        if is_warm && !warm {
            break;
        }
        if is_warm {
            // Blank disks again, so the check after the warm round means something.
            fresh_disks(&dir, n, image_bytes)?;
        }
        let (cpu0, s0, o0) = (
            cpu_time(d.pid()).unwrap_or_default(),
            served_bytes(&d.url).await?,
            origin.body_bytes(),
        );
        let t = Instant::now();
        // The requests first, then the "power on": the agents boot as the nodes would.
        let admin2 = admin.clone();
        let uuids: Vec<String> = nodes.iter().map(|(u, _)| u.clone()).collect();
        rivetd::for_each_concurrent(n, 32, move |i| {
            let (admin, uuid) = (admin2.clone(), uuids[i].clone());
            async move { admin.provision(&uuid, verb).await }
        })
        .await?;
        let agents = Agents::boot(agent, &d.url, &nodes, &dir)?;
        all_active(&admin, n, o.round_limit, &dir).await?;
        let wall = t.elapsed();
        let round = Round {
            source: source.to_string(),
            nodes: n,
            warm: is_warm,
            wall,
            origin_bytes: origin.body_bytes().saturating_sub(o0),
            cpu: cpu_time(d.pid()).unwrap_or_default().saturating_sub(cpu0),
            hwm_kib: d.hwm_kib(),
            served: served_bytes(&d.url).await?.saturating_sub(s0),
        };
        drop(agents);
        let what = format!("{source} N={n}{}", if is_warm { " (warm)" } else { "" });
        check_disks(&disks, image, &what)?;
        eprintln!(
            "fleet-deploy: {what}: {:.2?}, origin {:.2}× the image, rivetd CPU {:.2?}, peak RSS {} MiB; every disk holds the image",
            round.wall,
            round.origin_bytes as f64 / image_bytes as f64,
            round.cpu,
            round.hwm_kib / 1024
        );
        out.push(round);
    }
    d.terminate(Duration::from_secs(10)).await;
    if !o.keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(out)
}

/// The baseline: `n` concurrent `dd if=IMAGE of=DISK bs=4M conv=fsync`, image in the page
/// cache.
fn local_writes(dir: &Path, image: &Path, n: usize) -> Result<Duration> {
    let dir = dir.join(format!("baseline-{n}"));
    std::fs::create_dir_all(&dir)?;
    let bytes = std::fs::metadata(image)?.len();
    let disks = fresh_disks(&dir, n, bytes)?;
    // Warm the page cache with the image, as a local copy would be.
    std::io::copy(&mut std::fs::File::open(image)?, &mut std::io::sink())?;
    let t = Instant::now();
    let mut kids = Vec::new();
    for d in &disks {
        kids.push(
            Command::new("dd")
                .arg(format!("if={}", image.display()))
                .arg(format!("of={}", d.display()))
                .args(["bs=4M", "conv=fsync,notrunc", "status=none"])
                .spawn()
                .context("starting dd")?,
        );
    }
    for mut k in kids {
        if !k.wait()?.success() {
            bail!("dd failed");
        }
    }
    let took = t.elapsed();
    check_disks(&disks, image, "baseline")?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(took)
}

/// Run the bench; markdown rows for docs/numbers.md.
pub async fn run(o: FleetDeployOpts) -> Result<Vec<String>> {
    if o.nodes.is_empty() || o.sources.is_empty() {
        bail!("--nodes and --sources need at least one value");
    }
    for s in &o.sources {
        if s != "http" && s != "local" {
            bail!("--sources takes http and/or local, not {s:?}");
        }
    }
    let exe = rivetd::locate(o.rivetd.as_deref())?;
    let agent = match &o.agent_bin {
        Some(a) => a.clone(),
        None => exe.with_file_name("rivet-agent"),
    };
    if !agent.is_file() {
        bail!(
            "{} not found: build it (`cargo build --release -p rivet-agent`) or pass --agent-bin",
            agent.display()
        );
    }
    let tmp = match &o.dir {
        Some(d) => tempfile::tempdir_in(d)?,
        None => tempfile::tempdir()?,
    };
    let base = tmp.path().to_path_buf();
    let www = base.join("www");
    std::fs::create_dir(&www)?;
    let image = www.join("image.raw");
    make_image(&image, o.image_mib)?;
    let image_bytes = std::fs::metadata(&image)?.len();
    let digest = sha256_hex(&image)?;
    let origin = FileServer::start(&www)?;
    let biggest = o.nodes.iter().copied().max().unwrap_or(1);

    let baseline = local_writes(&base, &image, biggest)?;
    eprintln!("fleet-deploy: baseline: {biggest} dd writes of the local image in {baseline:.2?}");
    let mut all = Vec::new();
    for source in &o.sources {
        for &n in &o.nodes {
            let warm = source == "local" && n == biggest;
            all.extend(
                rounds(
                    &o, &exe, &agent, &base, &origin, &image, &digest, source, n, warm,
                )
                .await?,
            );
        }
    }
    if o.keep {
        eprintln!("fleet-deploy: kept {}", tmp.keep().display());
    }

    let cmd = format!(
        "`rivet-bench fleet-deploy --nodes {} --image-mib {}`",
        o.nodes
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(","),
        o.image_mib
    );
    let one = |source: &str| {
        all.iter()
            .find(|r| r.source == source && r.nodes == 1 && !r.warm)
            .map(|r| r.wall)
    };
    let mut rows = Vec::new();
    for r in &all {
        let rel = match one(&r.source) {
            Some(w) if !r.warm => format!(
                " ({:.2}× one deploy)",
                r.wall.as_secs_f64() / w.as_secs_f64()
            ),
            _ => String::new(),
        };
        let secs = r.wall.as_secs_f64().max(1e-3);
        rows.push(format!(
            "| Fleet deploy: `{}`, {} node(s), {} MiB raw image{} | origin sent **{:.2}× the image** ({:.1} MiB); last `active` after {:.2} s{rel}; rivetd CPU {:.2} s ({:.2} cores), peak RSS {} MiB; rivetd sent the agents {:.2}× the image ({:.0} MiB/s) | {cmd} |",
            r.source,
            r.nodes,
            o.image_mib,
            if r.warm { ", warm second round (rebuild)" } else { "" },
            r.origin_bytes as f64 / image_bytes as f64,
            r.origin_bytes as f64 / MIB as f64,
            secs,
            r.cpu.as_secs_f64(),
            r.cpu.as_secs_f64() / secs,
            r.hwm_kib / 1024,
            r.served as f64 / image_bytes as f64,
            r.served as f64 / MIB as f64 / secs,
        ));
    }
    // The aims, judged on these numbers.
    let local: Vec<&Round> = all.iter().filter(|r| r.source == "local").collect();
    if !local.is_empty() {
        let worst = local
            .iter()
            .filter(|r| !r.warm)
            .map(|r| r.origin_bytes as f64 / image_bytes as f64)
            .fold(0.0, f64::max);
        let warm = local.iter().find(|r| r.warm).map(|r| r.origin_bytes);
        let big = local
            .iter()
            .find(|r| r.nodes == biggest && !r.warm)
            .map(|r| r.wall);
        let met = |ok: bool| if ok { "met" } else { "**not met**" };
        rows.push(format!(
            "| Fleet deploy aims (`local`) | origin ≤ 1.05× the image for every N: {:.2}× at worst, {}; warm round ≤ 1 MiB from the origin: {}; {biggest} deploys ≤ 1.5× {biggest} local writes (`dd bs=4M conv=fsync` of the cached image, all at once: {:.2} s): {} | {cmd} |",
            worst,
            met(worst <= 1.05),
            match warm {
                Some(b) => format!("{} bytes, {}", b, met(b <= MIB)),
                None => "not run".into(),
            },
            baseline.as_secs_f64(),
            match big {
                Some(w) => format!(
                    "{:.2}× ({:.2} s), {}",
                    w.as_secs_f64() / baseline.as_secs_f64(),
                    w.as_secs_f64(),
                    met(w.as_secs_f64() <= 1.5 * baseline.as_secs_f64())
                ),
                None => "not run".into(),
            },
        ));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_image_compares_every_byte() -> Result<()> {
        let d = tempfile::tempdir()?;
        let (img, disk) = (d.path().join("i"), d.path().join("d"));
        make_image(&img, 1)?;
        std::fs::copy(&img, &disk)?;
        std::fs::OpenOptions::new()
            .append(true)
            .open(&disk)?
            .write_all(b"tail beyond the image")?;
        assert!(holds_image(&disk, &img)?);
        let mut bytes = std::fs::read(&disk)?;
        bytes[MIB as usize - 1] ^= 1;
        std::fs::write(&disk, &bytes)?;
        assert!(!holds_image(&disk, &img)?);
        std::fs::write(&disk, b"short")?;
        assert!(!holds_image(&disk, &img)?);
        Ok(())
    }
}
