//! `image_download_source = "local"` end to end: the rivetd binary, real agents on loop
//! devices, and a real origin (tests/fileserver.rs, which counts whole GETs and answers
//! conditional requests with 304).
//!
//! - five nodes deploying the same image: the origin sends it once, every disk holds it,
//!   the cache counts one miss and four hits;
//! - a second deploy revalidates with a conditional request (304), no second download;
//! - the download URL is refused without its token (401), with another node's or after the
//!   deploy ended (403), and for an unknown image (404);
//! - a wrong checksum, and an origin 404, fail every node waiting on the one download with
//!   the origin's or the checksum's error in its last_error;
//! - a cached file corrupted on disk is discarded and fetched again;
//! - a restarted rivetd keeps the cache;
//! - `[conductor] max_concurrent_deploy` refuses a deploy past it with Ironic's 503;
//! - over `max_bytes`, the least recently used image goes but never one a running deploy
//!   reads (a simulated ramdisk holds its `write_image` open); the cache URL answers
//!   `Range` requests with 206 and exactly those bytes, and a download under way while
//!   another image is evicted reads on to the end;
//! - an origin that drops the connection half-way fails every node waiting on the one
//!   download with that in its last_error, and leaves nothing cached;
//! - `instance_info.image_download_source = "http"` on a node sends its agent to the origin
//!   though the config says `local`;
//! - a configdrive longer than `configdrive_inline_max_bytes` is served from the cache with
//!   the node's token (its user_data lands on the disk; the URL refused without the token),
//!   a short one stays inline;
//! - an agent whose download from the cache is cut part-way (a proxy in front of rivetd's
//!   `public_url`) resumes it with `Range` from where it stopped and the disk holds the image.
//!
//! Needs root (loop devices) and sgdisk; skips without them unless `RIVET_REQUIRE_PEERS=1`.

use anyhow::{ensure, Context, Result};
use rivet_protocol::agent::{Command as AgentCommand, CommandKind};
use rivet_protocol::deploy::{WRITE_IMAGE, WRITE_IMAGE_PRIORITY};
use rivet_protocol::steps::StepDescriptor;
use rivet_tests::agentproc::{have, is_root, read_at, AgentProcess, LoopDevice};
use rivet_tests::faultproxy::{Fault, FaultProxy};
use rivet_tests::fileserver::FileServer;
use rivet_tests::simagent::{SimAgent, Steps};
use rivet_tests::{prerequisite, run_tool, sha256_file, Rivetd};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const IMAGE_MIB: u64 = 16;
const DISK_MIB: u64 = 64;

fn ready() -> bool {
    prerequisite(is_root(), "root (loop devices)") && prerequisite(have("sgdisk"), "sgdisk (gdisk)")
}

/// rivetd's configuration: local downloads, no automated cleaning (provide goes straight
/// to available), every validation asked of the origin.
fn config(extra: &str, cache: &str) -> String {
    format!(
        "[agent]\nlong_poll_s = 2\nimage_download_source = \"local\"\n\
         [conductor]\ncheck_interval_s = 1\nautomated_clean = false\n{extra}\n\
         [image_cache]\nrevalidate_after_s = 0\n{cache}\n"
    )
}

/// A 16 MiB GPT whole-disk image with pseudo-random data in its partition.
fn make_image(path: &Path, seed: u64) -> Result<()> {
    let f = std::fs::File::create(path)?;
    f.set_len(IMAGE_MIB * MIB)?;
    drop(f);
    run_tool(
        Command::new("sgdisk")
            .args(["-o", "-n", "1:2048:0", "-t", "1:8300"])
            .arg(path),
    )?;
    let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
    use std::io::Seek;
    f.seek(std::io::SeekFrom::Start(MIB))?;
    let mut x = seed | 1;
    let mut buf = vec![0u8; MIB as usize];
    for _ in 0..(IMAGE_MIB - 2) {
        for chunk in buf.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        f.write_all(&buf)?;
    }
    f.sync_all()?;
    Ok(())
}

struct Fleet {
    dir: tempfile::TempDir,
    rivetd: Rivetd,
    origin: FileServer,
    disks: Vec<LoopDevice>,
    agents: Vec<Option<AgentProcess>>,
    boots: usize,
}

impl Fleet {
    /// rivetd, the origin and `n` nodes `n0…` in available, each with its own loop device.
    fn new(n: usize, extra: &str) -> Result<Fleet> {
        Self::new_with(n, extra, "")
    }

    /// As [`Fleet::new`], with more `[image_cache]` settings.
    fn new_with(n: usize, extra: &str, cache: &str) -> Result<Fleet> {
        let dir = tempfile::tempdir()?;
        let rivetd = Rivetd::start_in(dir.path(), &config(extra, cache))?;
        let www = dir.path().join("www");
        std::fs::create_dir(&www)?;
        let origin = FileServer::start(&www)?;
        let mut disks = Vec::new();
        for i in 0..n {
            let file = dir.path().join(format!("disk{i}.img"));
            std::fs::File::create(&file)?.set_len(DISK_MIB * MIB)?;
            let disk = LoopDevice::attach(&file)?;
            let (s, v) = rivetd.call(
                "POST",
                "/v1/nodes",
                Some(json!({"driver": "fake-hardware", "deploy_interface": "direct", "name": format!("n{i}"),
                            "properties": {"root_device": {"name": disk.path.display().to_string()},
                                           "capabilities": "boot_mode:bios"}})),
            )?;
            ensure!(s == 201, "{v}");
            disks.push(disk);
        }
        let fleet = Fleet {
            dir,
            rivetd,
            origin,
            disks,
            agents: (0..n).map(|_| None).collect(),
            boots: 0,
        };
        for i in 0..n {
            fleet.verb(i, json!({"target": "manage"}))?;
            fleet.state(i, "manageable", 20)?;
            fleet.verb(i, json!({"target": "provide"}))?;
            fleet.state(i, "available", 20)?;
        }
        Ok(fleet)
    }

    fn name(i: usize) -> String {
        format!("n{i}")
    }

    fn verb(&self, i: usize, body: Value) -> Result<()> {
        let (s, v) = self.rivetd.call(
            "PUT",
            &format!("/v1/nodes/{}/states/provision", Self::name(i)),
            Some(body.clone()),
        )?;
        ensure!(s == 202, "n{i} {body}: {s} {v}");
        Ok(())
    }

    fn state(&self, i: usize, want: &'static str, secs: u64) -> Result<Value> {
        self.rivetd
            .wait_node(&Self::name(i), Duration::from_secs(secs), move |v| {
                v["provision_state"] == want
            })
            .map_err(|e| anyhow::anyhow!("n{i} → {want}: {e}\n{}", self.logs()))
    }

    /// A fresh agent for node `i`.
    fn boot(&mut self, i: usize) -> Result<()> {
        self.agents[i] = None;
        self.boots += 1;
        let log = self
            .dir
            .path()
            .join(format!("agent-n{i}-{}.log", self.boots));
        let node = self.rivetd.node(&Self::name(i))?;
        let uuid = node["uuid"].as_str().unwrap_or_default().to_string();
        self.agents[i] = Some(AgentProcess::start(
            &self.rivetd.url,
            &uuid,
            &[self.disks[i].path.as_path()],
            None,
            &log,
            &[],
        )?);
        Ok(())
    }

    /// A fresh agent for node `i`, then the provision verb `target` (`active`, `rebuild`).
    fn deploy(&mut self, i: usize, target: &str) -> Result<()> {
        self.boot(i)?;
        self.verb(i, json!({ "target": target }))
    }

    /// Every node of `which` ends in `deploy failed` with a `last_error` that `says` accepts.
    fn all_failed(&self, which: &[usize], says: impl Fn(&str) -> bool) -> Result<()> {
        for &i in which {
            let failed = self.state(i, "deploy failed", 120)?;
            let err = failed["last_error"].as_str().unwrap_or_default();
            ensure!(says(err), "n{i}: {err}");
        }
        Ok(())
    }

    fn logs(&self) -> String {
        let text = self.rivetd.log_text();
        let tail: Vec<&str> = text.lines().rev().take(60).collect();
        let mut out = format!(
            "--- rivetd ---\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
        for a in self.agents.iter().flatten() {
            let t = a.log_text();
            let tail: Vec<&str> = t.lines().rev().take(15).collect();
            out.push_str(&format!(
                "\n--- {} ---\n{}",
                a.log.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ));
        }
        out
    }

    /// Publish `image` at the origin and point nodes `which` at it with `digest`.
    fn set_image(&self, which: &[usize], image: &Path, digest: &str) -> Result<String> {
        let name = image.file_name().and_then(|n| n.to_str()).context("name")?;
        let url = self.origin.url_of(name);
        if !self.dir.path().join("www").join(name).exists() {
            std::fs::copy(image, self.dir.path().join("www").join(name))?;
        }
        for &i in which {
            let (s, v) = self.rivetd.call(
                "PATCH",
                &format!("/v1/nodes/{}", Self::name(i)),
                Some(json!([
                    {"op": "add", "path": "/instance_info/image_source", "value": url},
                    {"op": "add", "path": "/instance_info/image_os_hash_algo", "value": "sha256"},
                    {"op": "add", "path": "/instance_info/image_os_hash_value", "value": digest},
                ])),
            )?;
            ensure!(s == 200, "{v}");
        }
        Ok(url)
    }

    fn cache(&self) -> Result<Value> {
        let (s, v) = self.rivetd.call("GET", "/v1/image_cache", None)?;
        ensure!(s == 200, "{s} {v}");
        Ok(v)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// Raw HTTP GET of a cache URL with optional Basic credentials: the status.
fn get_status(
    url: &str,
    auth: Option<(&str, &str)>,
    range: Option<&str>,
) -> Result<(u16, Vec<u8>)> {
    let c = reqwest::blocking::Client::new();
    let mut r = c.get(url);
    if let Some((u, p)) = auth {
        r = r.basic_auth(u, Some(p));
    }
    if let Some(range) = range {
        r = r.header("Range", range);
    }
    let resp = r.send()?;
    let s = resp.status().as_u16();
    Ok((s, resp.bytes()?.to_vec()))
}

#[test]
fn five_nodes_one_origin_download_then_revalidated_and_tokens_checked() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    const N: usize = 5;
    let mut f = Fleet::new(N, "")?;
    let image = f.path("fleet.raw");
    make_image(&image, 3)?;
    let digest = sha256_file(&image)?;
    let all: Vec<usize> = (0..N).collect();
    f.set_image(&all, &image, &digest)?;
    // Slow the origin a little so that every node asks while the one download runs.
    f.origin.set_pace(8 * MIB);
    for i in 0..N {
        f.boot(i)?;
    }
    for i in 0..N {
        f.verb(i, json!({"target": "active"}))?;
    }
    for i in 0..N {
        let active = f.state(i, "active", 240)?;
        assert_eq!(
            active["driver_internal_info"]["deployed_image"]["hash_value"],
            digest.as_str(),
            "{active}"
        );
    }
    assert_eq!(
        f.origin.full_gets(),
        1,
        "one whole GET at the origin\n{}",
        f.logs()
    );
    let want = read_at(&image, 0, (IMAGE_MIB - 1) as usize * MIB as usize)?;
    for (i, d) in f.disks.iter().enumerate() {
        let got = read_at(&d.path, 0, (IMAGE_MIB - 1) as usize * MIB as usize)?;
        // The primary GPT is rewritten by the backup move: compare from the data on.
        assert!(
            got[MIB as usize..] == want[MIB as usize..],
            "n{i}'s disk does not hold the image"
        );
    }
    let cache = f.cache()?;
    assert_eq!(cache["images"].as_array().map(Vec::len), Some(1), "{cache}");
    let name = format!("sha256-{digest}");
    assert_eq!(cache["images"][0]["name"], name.as_str(), "{cache}");
    assert_eq!(cache["images"][0]["bytes"], IMAGE_MIB * MIB, "{cache}");
    assert_eq!(cache["images"][0]["pinned_by"], json!([]), "{cache}");
    assert_eq!(cache["stats"]["misses"], 1, "{cache}");
    assert_eq!(cache["stats"]["hits"], (N - 1) as u64, "{cache}");
    // /metrics carries the same.
    let text = reqwest::blocking::get(format!("{}/metrics", f.rivetd.url))?.text()?;
    assert!(text.contains("rivet_image_cache_misses_total 1"), "{text}");
    assert!(
        text.contains(&format!("rivet_image_cache_hits_total {}", N - 1)),
        "{text}"
    );
    // Every agent read the image once from rivetd, whole.
    assert!(
        text.contains(&format!(
            "rivet_image_cache_served_bytes_total {}",
            N as u64 * IMAGE_MIB * MIB
        )),
        "{text}"
    );

    // The download URL outside a deploy: no token 401, a wrong or stale one 403, an
    // unknown image 404.
    let url = format!("{}/image-cache/{name}", f.rivetd.url);
    let n0 = f.rivetd.node("n0")?;
    let uuid0 = n0["uuid"].as_str().unwrap_or_default();
    assert_eq!(get_status(&url, None, None)?.0, 401);
    assert_eq!(get_status(&url, Some((uuid0, "0123")), None)?.0, 403);
    let other = format!("{}/image-cache/sha256-{}", f.rivetd.url, "0".repeat(64));
    assert_eq!(get_status(&other, Some((uuid0, "x")), None)?.0, 403);
    let bogus = format!("{}/image-cache/..%2Fetc", f.rivetd.url);
    assert_eq!(get_status(&bogus, Some((uuid0, "x")), None)?.0, 404);
    // No token reaches the logs: every agent logged its URL with the password masked.
    let log = f.rivetd.log_text();
    for a in f.agents.iter().flatten() {
        let t = a.log_text();
        assert!(
            !t.contains(&format!("{uuid0}:")) || t.contains(":***@"),
            "{t}"
        );
    }
    assert!(!log.contains("Basic "), "no credentials in rivetd's log");

    // A second deploy of the same image: a conditional request answered 304, no download.
    f.deploy(0, "rebuild")?;
    let again = f.state(0, "active", 120)?;
    assert!(again["last_error"].is_null(), "{again}");
    let (conditional, not_modified) = f.origin.conditional();
    assert!(
        conditional >= 1 && not_modified >= 1,
        "{conditional} {not_modified}\n{}",
        f.logs()
    );
    assert_eq!(f.origin.full_gets(), 1, "no second download");
    assert_eq!(f.cache()?["stats"]["revalidations"], 1);
    Ok(())
}

#[test]
fn a_bad_checksum_or_an_origin_404_fails_every_waiting_node() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let mut f = Fleet::new(3, "")?;
    let image = f.path("bad.raw");
    make_image(&image, 5)?;
    let real = sha256_file(&image)?;
    let wrong = "1".repeat(64);
    f.set_image(&[0, 1, 2], &image, &wrong)?;
    f.origin.set_pace(16 * MIB);
    // Every ramdisk up first, then the three deploys at once: all three join the one
    // download (it lasts a second) however slowly a loaded machine starts the agents.
    for i in 0..3 {
        f.boot(i)?;
    }
    for i in 0..3 {
        f.verb(i, json!({"target": "active"}))?;
    }
    f.all_failed(&[0, 1, 2], |err| {
        err.contains("failed its checksum") && err.contains(&wrong) && err.contains(&real)
    })?;
    assert_eq!(f.origin.full_gets(), 1, "one download for the three");
    assert_eq!(f.cache()?["images"], json!([]), "nothing cached");

    // An origin 404: every node's last_error names the origin's answer.
    for i in 0..3 {
        let (s, v) = f.rivetd.call(
            "PATCH",
            &format!("/v1/nodes/n{i}"),
            Some(json!([
                {"op": "add", "path": "/instance_info/image_source", "value": f.origin.url_of("missing.raw")},
                {"op": "add", "path": "/instance_info/image_os_hash_value", "value": real},
            ])),
        )?;
        ensure!(s == 200, "{v}");
        f.deploy(i, "rebuild")?;
    }
    for i in 0..3 {
        let failed = f
            .rivetd
            .wait_node(&format!("n{i}"), Duration::from_secs(120), |v| {
                v["provision_state"] == "deploy failed"
                    && v["last_error"].as_str().is_some_and(|e| e.contains("404"))
            })?;
        let err = failed["last_error"].as_str().unwrap_or_default();
        assert!(
            err.contains("missing.raw") && err.contains("404"),
            "n{i}: {err}"
        );
    }
    Ok(())
}

#[test]
fn a_corrupted_cached_file_is_fetched_again_and_a_restart_keeps_the_cache() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let mut f = Fleet::new(1, "")?;
    let image = f.path("one.raw");
    make_image(&image, 9)?;
    let digest = sha256_file(&image)?;
    f.set_image(&[0], &image, &digest)?;
    f.deploy(0, "active")?;
    f.state(0, "active", 120)?;
    assert_eq!(f.origin.full_gets(), 1);
    // Restart: the index comes back from the directory; the image is revalidated (304).
    let cfg = f.dir.path().join("rivetd.toml").display().to_string();
    f.rivetd.terminate(Duration::from_secs(10))?;
    let port = f.rivetd.port;
    f.rivetd = Rivetd::start(&f.dir.path().join("rivet.db"), port, &["--config", &cfg])?;
    let cache = f.cache()?;
    assert_eq!(
        cache["images"][0]["name"],
        format!("sha256-{digest}"),
        "{cache}"
    );
    f.deploy(0, "rebuild")?;
    f.state(0, "active", 120)?;
    assert_eq!(
        f.origin.full_gets(),
        1,
        "kept across the restart\n{}",
        f.logs()
    );
    assert!(f.origin.conditional().1 >= 1);
    // Corrupt the cached file: the next deploy finds it no longer matches, discards it and
    // downloads it again; the disk gets the right bytes.
    let cached = f
        .dir
        .path()
        .join("image-cache/images")
        .join(format!("sha256-{digest}"));
    let mut file = std::fs::OpenOptions::new().write(true).open(&cached)?;
    use std::io::{Seek, SeekFrom};
    file.seek(SeekFrom::Start(4 * MIB))?;
    file.write_all(b"corrupted")?;
    drop(file);
    f.deploy(0, "rebuild")?;
    let active = f.state(0, "active", 120)?;
    assert_eq!(
        active["driver_internal_info"]["deployed_image"]["hash_value"],
        digest.as_str()
    );
    assert_eq!(f.origin.full_gets(), 2, "fetched again\n{}", f.logs());
    assert!(f.cache()?["stats"]["evictions"].as_u64() >= Some(1));
    // The CLI lists and purges it.
    let rivet = |args: &[&str]| -> Result<String> {
        let out = Command::new(rivet_tests::bin("rivet"))
            .args(["--url", &f.rivetd.url, "image-cache"])
            .args(args)
            .output()?;
        ensure!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let listed = rivet(&["list"])?;
    assert!(
        listed.contains(&format!("sha256-{digest}")) && listed.contains("misses"),
        "{listed}"
    );
    let purged = rivet(&["purge"])?;
    assert!(purged.contains("removed 1 image(s)"), "{purged}");
    assert_eq!(f.cache()?["images"], json!([]));
    assert!(!cached.exists(), "the file is gone");
    Ok(())
}

#[test]
fn max_concurrent_deploy_refuses_with_ironic_s_503() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let mut f = Fleet::new(2, "max_concurrent_deploy = 1")?;
    let image = f.path("lim.raw");
    make_image(&image, 13)?;
    let digest = sha256_file(&image)?;
    f.set_image(&[0, 1], &image, &digest)?;
    // n0 deploys without an agent: it stays in wait call-back.
    f.verb(0, json!({"target": "active"}))?;
    f.state(0, "wait call-back", 30)?;
    let (s, v) = f.rivetd.call(
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "active"})),
    )?;
    assert_eq!(s, 503, "{v}");
    assert!(
        v.to_string()
            .contains("concurrent action limit for provisioning"),
        "{v}"
    );
    assert_eq!(f.rivetd.node("n1")?["provision_state"], "available");
    // Once n0 is done, n1 may deploy.
    f.boot(0)?;
    f.state(0, "active", 120)?;
    f.deploy(1, "active")?;
    f.state(1, "active", 120)?;
    Ok(())
}

/// The simulated ramdisk of a deploy that is still reading: it hands its `write_image`
/// arguments (rivetd's cache URL with the node's token) to the test and never finishes
/// the step, so the node's deploy stays running and its image pinned until the test ends.
struct HeldWrite {
    args: std::sync::mpsc::Sender<Value>,
}

impl Steps for HeldWrite {
    async fn execute(&mut self, _node: &str, cmd: &AgentCommand) -> Value {
        match &cmd.kind {
            CommandKind::GetDeploySteps => json!({
                "deploy_steps": [StepDescriptor::in_band(WRITE_IMAGE, WRITE_IMAGE_PRIORITY)],
                "hardware_manager_versions": {"image-cache-test": "1"}
            }),
            CommandKind::ExecuteStep { step, args, .. } if step == WRITE_IMAGE => {
                let _ = self.args.send(Value::Object(args.clone()));
                std::future::pending::<()>().await;
                json!({})
            }
            _ => json!({}),
        }
    }

    fn unexpected(&mut self, _node: &str, _what: &str, _status: u16, _body: &str) -> Result<()> {
        Ok(())
    }
}

#[test]
fn an_image_being_read_is_not_evicted_and_the_cache_answers_ranges() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    // Room for two of the three 16 MiB images.
    let mut f = Fleet::new_with(3, "", &format!("max_bytes = {}", 40 * MIB))?;
    let mut images = Vec::new();
    for (i, name) in ["a.raw", "b.raw", "c.raw"].iter().enumerate() {
        let p = f.path(name);
        make_image(&p, 21 + i as u64)?;
        let d = sha256_file(&p)?;
        f.set_image(&[i], &p, &d)?;
        images.push((p, format!("sha256-{d}")));
    }
    // n0's deploy: image a cached and handed to a ramdisk that is still writing it.
    let uuid0 = f.rivetd.node("n0")?["uuid"]
        .as_str()
        .context("uuid")?
        .to_string();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let (tx, rx) = std::sync::mpsc::channel();
    let sim = SimAgent::new(
        &uuid0,
        vec![f.rivetd.url.clone()],
        "image-cache-test",
        reqwest::Client::builder()
            .timeout(Duration::from_secs(15))
            .build()?,
        HeldWrite { args: tx },
    );
    let _held = rt.spawn(sim.run(Instant::now() + Duration::from_secs(300)));
    f.verb(0, json!({"target": "active"}))?;
    let args = rx
        .recv_timeout(Duration::from_secs(120))
        .map_err(|e| anyhow::anyhow!("no write_image for n0 ({e})\n{}", f.logs()))?;
    let url = args["image_source"]
        .as_str()
        .context("image_source")?
        .to_string();
    ensure!(
        url.contains(&format!("/image-cache/{}", images[0].1)),
        "{url}"
    );
    let cache = f.cache()?;
    assert_eq!(cache["images"][0]["pinned_by"], json!([uuid0]), "{cache}");

    // Ranges, as a resuming agent asks: 206 with exactly those bytes.
    let want = std::fs::read(&images[0].0)?;
    let m = MIB as usize;
    let (s, body) = get_status(&url, None, Some("bytes=1048576-1049599"))?;
    assert_eq!(s, 206);
    assert!(body == want[m..m + 1024], "bytes 1 MiB … +1 KiB");
    let (s, tail) = get_status(&url, None, Some(&format!("bytes={}-", want.len() - 4096)))?;
    assert_eq!(s, 206);
    assert!(tail == want[want.len() - 4096..], "the last 4 KiB");
    // A download of it under way: opened, its first MiB read.
    let mut reading = reqwest::blocking::Client::new().get(&url).send()?;
    ensure!(reading.status() == 200, "{}", reading.status());
    let mut got = vec![0u8; m];
    reading.read_exact(&mut got)?;

    // b, then c: c needs room, and the least recently used image not being read is b.
    for i in [1, 2] {
        f.deploy(i, "active")?;
        f.state(i, "active", 120)?;
    }
    let cache = f.cache()?;
    let mut names: Vec<&str> = cache["images"]
        .as_array()
        .context("images")?
        .iter()
        .filter_map(|i| i["name"].as_str())
        .collect();
    names.sort_unstable();
    let mut kept = vec![images[0].1.as_str(), images[2].1.as_str()];
    kept.sort_unstable();
    assert_eq!(names, kept, "a (being read) and c kept, b evicted\n{cache}");
    assert_eq!(cache["stats"]["evictions"], 1, "{cache}");
    let stored = f.dir.path().join("image-cache/images");
    assert!(!stored.join(&images[1].1).exists(), "b's file is gone");
    // The download that was under way reads on to the end, every byte right.
    reading.read_to_end(&mut got)?;
    assert!(got == want, "the reader got image a whole");
    rt.shutdown_background();
    Ok(())
}

#[test]
fn an_origin_that_cuts_the_download_fails_every_waiting_node_and_caches_nothing() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let mut f = Fleet::new(3, "")?;
    let image = f.path("cut.raw");
    make_image(&image, 17)?;
    let digest = sha256_file(&image)?;
    f.set_image(&[0, 1, 2], &image, &digest)?;
    // Half the image in a second, then the connection drops; a node that came late and
    // started a download of its own would fail alike.
    f.origin.set_pace(8 * MIB);
    f.origin.cut_next(3, IMAGE_MIB * MIB / 2);
    // Every ramdisk up first, then the deploys at once (they all join the one download).
    for i in 0..3 {
        f.boot(i)?;
    }
    for i in 0..3 {
        f.verb(i, json!({"target": "active"}))?;
    }
    f.all_failed(&[0, 1, 2], |err| {
        err.contains("cut.raw")
            && (err.contains("download cut after")
                || err.contains(&format!("of {} bytes", IMAGE_MIB * MIB)))
    })?;
    assert_eq!(f.origin.full_gets(), 1, "one download for the three");
    assert_eq!(f.cache()?["images"], json!([]), "nothing cached");
    let partial = f.dir.path().join("image-cache/partial");
    assert_eq!(
        std::fs::read_dir(&partial)?.count(),
        0,
        "no partial file left in {}",
        partial.display()
    );
    // The origin whole again: the next deploy fetches it and succeeds.
    f.origin.cut_next(0, 0);
    f.origin.set_pace(0);
    f.deploy(0, "rebuild")?;
    let active = f.state(0, "active", 120)?;
    assert_eq!(
        active["driver_internal_info"]["deployed_image"]["hash_value"],
        digest.as_str()
    );
    assert_eq!(f.origin.full_gets(), 2);
    Ok(())
}

#[test]
fn a_node_s_instance_info_http_reads_the_origin_while_the_config_says_local() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let mut f = Fleet::new(1, "")?;
    let image = f.path("direct.raw");
    make_image(&image, 19)?;
    let digest = sha256_file(&image)?;
    let url = f.set_image(&[0], &image, &digest)?;
    let (s, v) = f.rivetd.call(
        "PATCH",
        "/v1/nodes/n0",
        Some(
            json!([{"op": "add", "path": "/instance_info/image_download_source", "value": "http"}]),
        ),
    )?;
    ensure!(s == 200, "{v}");
    f.deploy(0, "active")?;
    let active = f.state(0, "active", 120)?;
    assert_eq!(
        active["driver_internal_info"]["deployed_image"]["hash_value"],
        digest.as_str()
    );
    assert_eq!(f.origin.full_gets(), 1, "the agent's own GET");
    let cache = f.cache()?;
    assert_eq!(cache["images"], json!([]), "{cache}");
    assert_eq!(cache["stats"]["misses"], 0, "{cache}");
    assert_eq!(cache["stats"]["hits"], 0, "{cache}");
    // The agent was given the origin's URL, not rivetd's.
    let log = f.agents[0]
        .as_ref()
        .map(|a| a.log_text())
        .unwrap_or_default();
    assert!(
        log.contains(&url) && !log.contains("/image-cache/"),
        "{log}"
    );
    Ok(())
}

#[test]
fn a_long_configdrive_is_served_from_the_cache_and_a_short_one_stays_inline() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let mut f = Fleet::new(2, "")?;
    let image = f.path("cd.raw");
    make_image(&image, 23)?;
    let digest = sha256_file(&image)?;
    f.set_image(&[0, 1], &image, &digest)?;
    // ~200 KiB of hex user_data: ~140 KiB once gzipped and base64'd, past the default 64 KiB.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let user_data: String = (0..200 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b"0123456789abcdef"[(x % 16) as usize])
        })
        .collect();
    f.boot(0)?;
    f.verb(
        0,
        json!({"target": "active",
               "configdrive": {"meta_data": {"hostname": "n0"}, "user_data": user_data}}),
    )?;
    f.boot(1)?;
    f.verb(
        1,
        json!({"target": "active", "configdrive": {"meta_data": {"hostname": "n1"}}}),
    )?;
    for i in [0, 1] {
        f.state(i, "active", 120)?;
    }
    // The long one is an entry of its own (the image is the other); the short one is not.
    let cache = f.cache()?;
    let entries = cache["images"].as_array().context("images")?;
    let drives: Vec<&Value> = entries
        .iter()
        .filter(|e| e["url"] == "configdrive (from a deploy request)")
        .collect();
    ensure!(drives.len() == 1, "one configdrive entry: {cache}");
    ensure!(entries.len() == 2, "the image and one configdrive: {cache}");
    let bytes = drives[0]["bytes"].as_u64().unwrap_or(0);
    ensure!(bytes > 64 * 1024, "{cache}");
    // rivetd served both images and that configdrive, each once and whole: n0's agent read
    // the configdrive from the cache, not from its arguments.
    let text = reqwest::blocking::get(format!("{}/metrics", f.rivetd.url))?.text()?;
    let served = format!(
        "rivet_image_cache_served_bytes_total {}",
        2 * IMAGE_MIB * MIB + bytes
    );
    ensure!(text.contains(&served), "want {served}:\n{text}");
    // Its user_data is on n0's disk (an ISO 9660 file is one extent): the agent downloaded it.
    let disk = std::fs::read(f.path("disk0.img"))?;
    ensure!(
        find(&disk, user_data.as_bytes()),
        "n0's configdrive partition does not hold its user_data"
    );
    // The URL without credentials: 401; with a made-up token after the deploy: 403.
    let uuid = f.rivetd.node("n0")?["uuid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let url = format!(
        "{}/image-cache/{}",
        f.rivetd.url,
        drives[0]["name"].as_str().unwrap_or("")
    );
    assert_eq!(get_status(&url, None, None)?.0, 401);
    assert_eq!(get_status(&url, Some((&uuid, "0123abcd")), None)?.0, 403);
    // Neither log shows the token: every "UUID:" in a URL is followed by the mask.
    let log = format!(
        "{}{}",
        f.rivetd.log_text(),
        f.agents[0]
            .as_ref()
            .map(|a| a.log_text())
            .unwrap_or_default()
    );
    let at = format!("{uuid}:");
    for (i, _) in log.match_indices(&at) {
        let rest = &log[i + at.len()..];
        ensure!(
            !rest.starts_with(|c: char| c.is_ascii_hexdigit()) || rest.starts_with("***"),
            "a token in a log: {}",
            &log[i..(i + 120).min(log.len())]
        );
    }
    Ok(())
}

/// `needle` occurs in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn an_agent_cut_off_mid_download_resumes_from_the_cache_with_range() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    // Agents reach the cache through the proxy (rivetd's public_url); heartbeats go direct.
    let proxy = FaultProxy::start(0)?;
    let mut f = Fleet::new(1, &format!("[boot]\npublic_url = \"{}\"", proxy.url))?;
    let port = f
        .rivetd
        .url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .context("rivetd's port")?;
    proxy.forward_to(port);
    let image = f.path("resume.raw");
    make_image(&image, 29)?;
    let digest = sha256_file(&image)?;
    f.set_image(&[0], &image, &digest)?;
    let cut = 6 * MIB as usize;
    proxy.fail_next(Fault::Cut(cut), 1);
    f.deploy(0, "active")?;
    f.state(0, "active", 120)?;
    let want = read_at(&image, 0, (IMAGE_MIB - 1) as usize * MIB as usize)?;
    let got = read_at(&f.disks[0].path, 0, want.len())?;
    // The primary GPT is rewritten by the backup move: compare from the data on.
    let m = MIB as usize;
    let first_difference = got[m..].iter().zip(&want[m..]).position(|(a, b)| a != b);
    ensure!(
        first_difference.is_none(),
        "n0's disk differs from the image {first_difference:?} bytes past its first MiB\n{}",
        f.logs()
    );
    // Two requests for the image: the first cut, the second a Range from where it stopped
    // (at most the cut: the head and what the agent had not yet written are read again).
    let gets: Vec<_> = proxy
        .seen()
        .into_iter()
        .filter(|s| s.path.starts_with(&format!("/image-cache/sha256-{digest}")))
        .collect();
    ensure!(gets.len() == 2, "{gets:?}\n{}", f.logs());
    ensure!(
        gets[0].range.is_none() && gets[0].fault == Some(Fault::Cut(cut)),
        "{gets:?}"
    );
    let from: u64 = gets[1]
        .range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("the second request is not an open Range: {gets:?}"))?;
    ensure!(from > 0 && from < cut as u64, "resumed at {from}: {gets:?}");
    // rivetd sent the whole image for the first request (the proxy reads an answer whole
    // before passing on its start) and the rest from the resume point for the second.
    let text = reqwest::blocking::get(format!("{}/metrics", f.rivetd.url))?.text()?;
    let served: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("rivet_image_cache_served_bytes_total "))
        .and_then(|v| v.trim().parse().ok())
        .context("served bytes in /metrics")?;
    ensure!(
        served == 2 * IMAGE_MIB * MIB - from,
        "served {served} bytes for a {IMAGE_MIB} MiB image resumed at {from}"
    );
    Ok(())
}
