//! Deploy end to end with real parts: the rivetd binary, the rivet-agent binary (as a ramdisk
//! would run it, restricted to a loop device with `--devices`), a loopback HTTP image server,
//! and the stock API (`PUT …/states/provision {"target": "active", "configdrive": {…}}`).
//!
//! Checked: the image's bytes on the disk, its digest, the backup GPT moved to the end of the
//! disk (`sgdisk -v`), a `config-2` partition `blkid` finds with the node's uuid in
//! `openstack/latest/meta_data.json`; undeploy → cleaning → available with the instance
//! forgotten and the disk's first MiB zero; abort in wait call-back; a checksum mismatch; and
//! rivetd killed mid-write, the deploy finishing with the new process.
//!
//! Needs root (loop devices), sgdisk, blkid and xorriso or isoinfo for reading the
//! configdrive; skips without them unless `RIVET_REQUIRE_PEERS=1`.

use anyhow::{bail, ensure, Context, Result};
use rivet_tests::agentproc::{have, is_root, read_at, AgentProcess, LoopDevice};
use rivet_tests::fileserver::FileServer;
use rivet_tests::{prerequisite, run_tool, sha256_file, Rivetd, DEPLOY_TEST_CONFIG};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// Size of the test image (a GPT whole-disk image).
const IMAGE_MIB: u64 = 64;
/// Size of the target disk.
const DISK_MIB: u64 = 256;

fn ready() -> bool {
    prerequisite(is_root(), "root (loop devices)")
        && prerequisite(have("sgdisk"), "sgdisk (gdisk)")
        && prerequisite(have("blkid"), "blkid (util-linux)")
        && prerequisite(have("sha256sum"), "sha256sum (coreutils)")
        && prerequisite(
            have("osirrox") || have("xorriso"),
            "xorriso (reads the configdrive)",
        )
}

/// A GPT whole-disk image: a 1 MiB BIOS-boot partition and a data partition filled with
/// pseudo-random bytes (so a wrong offset or a short write shows), written to `path`.
fn make_image(path: &Path, seed: u64) -> Result<()> {
    let f = std::fs::File::create(path)?;
    f.set_len(IMAGE_MIB * MIB)?;
    drop(f);
    run_tool(
        Command::new("sgdisk")
            .args([
                "-o",
                "-n",
                "1:2048:+1M",
                "-t",
                "1:ef02",
                "-n",
                "2:0:0",
                "-t",
                "2:8300",
            ])
            .arg(path),
    )?;
    // Data partition from 2 MiB: fill all but its last MiB (the backup GPT follows it).
    let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
    use std::io::Seek;
    f.seek(std::io::SeekFrom::Start(2 * MIB))?;
    let mut x = seed | 1;
    let mut buf = vec![0u8; MIB as usize];
    for _ in 0..(IMAGE_MIB - 4) {
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

struct Scene {
    dir: tempfile::TempDir,
    rivetd: Rivetd,
    images: FileServer,
    disk: LoopDevice,
    uuid: String,
    agent: Option<AgentProcess>,
    boots: u32,
}

impl Scene {
    /// rivetd, the image server, a zeroed 256 MiB loop device, and node n1 (fake-hardware,
    /// the agent's deploy interface) in available after its first automated cleaning.
    fn new() -> Result<Scene> {
        let dir = tempfile::tempdir()?;
        let rivetd = Rivetd::start_in(dir.path(), DEPLOY_TEST_CONFIG)?;
        let www = dir.path().join("www");
        std::fs::create_dir(&www)?;
        let images = FileServer::start(&www)?;
        let file = dir.path().join("disk0.img");
        std::fs::File::create(&file)?.set_len(DISK_MIB * MIB)?;
        let disk = LoopDevice::attach(&file)?;
        let (s, v) = rivetd.call(
            "POST",
            "/v1/nodes",
            Some(
                json!({"driver": "fake-hardware", "deploy_interface": "direct", "name": "n1",
                        "properties": {"root_device": {"name": disk.path.display().to_string()}}}),
            ),
        )?;
        ensure!(s == 201, "{v}");
        let uuid = v["uuid"].as_str().unwrap_or_default().to_string();
        let mut scene = Scene {
            dir,
            rivetd,
            images,
            disk,
            uuid,
            agent: None,
            boots: 0,
        };
        scene.verb(json!({"target": "manage"}))?;
        scene.state("manageable", 20)?;
        scene.boot()?;
        scene.verb(json!({"target": "provide"}))?;
        scene.state("available", 120)?;
        Ok(scene)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A fresh "ramdisk boot": a new agent process (the old one, if any, is killed).
    fn boot(&mut self) -> Result<()> {
        self.agent = None;
        self.boots += 1;
        let log = self.path(&format!("agent-{}.log", self.boots));
        self.agent = Some(AgentProcess::start(
            &self.rivetd.url,
            &self.uuid,
            &[self.disk.path.as_path()],
            None,
            &log,
            &[],
        )?);
        Ok(())
    }

    fn verb(&self, body: Value) -> Result<(u16, Value)> {
        let r = self
            .rivetd
            .call("PUT", "/v1/nodes/n1/states/provision", Some(body.clone()))?;
        ensure!(r.0 == 202, "{body}: {} {}", r.0, r.1);
        Ok(r)
    }

    fn logs(&self) -> String {
        let mut out = format!("--- rivetd log ---\n{}", tail(&self.rivetd.log_text()));
        for i in 1..=self.boots {
            let t =
                std::fs::read_to_string(self.path(&format!("agent-{i}.log"))).unwrap_or_default();
            out.push_str(&format!("\n--- agent log (boot {i}) ---\n{}", tail(&t)));
        }
        out
    }

    fn wait(&self, what: &str, secs: u64, pred: impl Fn(&Value) -> bool) -> Result<Value> {
        self.rivetd
            .wait_node("n1", Duration::from_secs(secs), pred)
            .map_err(|e| anyhow::anyhow!("{what}: {e}\n{}", self.logs()))
    }

    fn state(&self, s: &'static str, secs: u64) -> Result<Value> {
        self.wait(s, secs, move |v| v["provision_state"] == s)
    }

    /// Publish `image` and point the node at it.
    fn set_image(&self, image: &Path, sha256_hex: &str) -> Result<()> {
        let name = image
            .file_name()
            .and_then(|n| n.to_str())
            .context("image name")?;
        std::fs::copy(image, self.dir.path().join("www").join(name))?;
        let (s, v) = self.rivetd.call(
            "PATCH",
            "/v1/nodes/n1",
            Some(json!([
                {"op": "add", "path": "/instance_info/image_source", "value": self.images.url_of(name)},
                {"op": "add", "path": "/instance_info/image_os_hash_algo", "value": "sha256"},
                {"op": "add", "path": "/instance_info/image_os_hash_value", "value": sha256_hex},
            ])),
        )?;
        ensure!(s == 200, "{v}");
        Ok(())
    }
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The partition of `disk` whose filesystem label is config-2, by blkid.
fn config2_partition(disk: &Path) -> Result<PathBuf> {
    let _ = Command::new("partx").arg("-u").arg(disk).status();
    let name = disk
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_string();
    for _ in 0..50 {
        let mut parts: Vec<PathBuf> = std::fs::read_dir("/dev")?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .map(|n| n.starts_with(&format!("{name}p")))
                    .unwrap_or(false)
            })
            .collect();
        parts.sort();
        for p in parts {
            let out = Command::new("blkid")
                .args(["-p", "-o", "export"])
                .arg(&p)
                .output()?;
            let text = String::from_utf8_lossy(&out.stdout);
            if text.contains("LABEL=config-2") && text.contains("TYPE=iso9660") {
                return Ok(p);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!(
        "no partition labelled config-2 (iso9660) on {}",
        disk.display()
    )
}

/// `openstack/latest/meta_data.json` of an ISO 9660 configdrive.
fn read_meta_data(iso: &Path, dir: &Path) -> Result<Value> {
    let out = dir.join("meta_data.json");
    let _ = std::fs::remove_file(&out);
    // xorriso takes a block device only with the stdio: prefix.
    run_tool(
        Command::new("osirrox")
            .arg("-indev")
            .arg(format!("stdio:{}", iso.display()))
            .args(["-extract", "/openstack/latest/meta_data.json"])
            .arg(&out),
    )?;
    Ok(serde_json::from_str(&std::fs::read_to_string(&out)?)?)
}

#[test]
fn deploy_with_configdrive_then_undeploy() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let mut sc = Scene::new()?;
    let image = sc.path("disk.raw");
    make_image(&image, 7)?;
    let digest = sha256_file(&image)?;
    sc.set_image(&image, &digest)?;

    sc.boot()?;
    let started = Instant::now();
    sc.verb(json!({"target": "active", "configdrive": {
        "meta_data": {"hostname": "deployed.example"},
        "user_data": {"runcmd": ["echo hi"]},
    }}))?;
    // Progress shows in deploy_step while the image is written (bytes and total).
    let active = sc.state("active", 180)?;
    eprintln!(
        "deploy: active after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(active["last_error"].is_null(), "{active}");
    assert_eq!(active["deploy_step"], json!({}), "{active}");
    assert_eq!(active["instance_info"]["configdrive"], "******", "{active}");
    let written = &active["driver_internal_info"]["deployed_image"];
    assert_eq!(written["hash_value"], digest.as_str(), "{active}");
    assert_eq!(
        written["device"],
        sc.disk.path.display().to_string(),
        "{active}"
    );
    assert_eq!(written["image_bytes"], IMAGE_MIB * MIB, "{active}");

    // The image's bytes are on the disk (its data partition, byte for byte).
    let want = read_at(&image, 2 * MIB, ((IMAGE_MIB - 4) * MIB) as usize)?;
    let got = read_at(&sc.disk.path, 2 * MIB, ((IMAGE_MIB - 4) * MIB) as usize)?;
    assert!(
        want == got,
        "the disk does not hold the image's data partition"
    );
    // The backup GPT moved to the end of the disk: sgdisk finds nothing wrong.
    let verify = run_tool(Command::new("sgdisk").arg("-v").arg(&sc.disk.path))?;
    assert!(verify.contains("No problems found"), "{verify}");
    // config-2 is there, with the node's uuid and the hostname given.
    let part = config2_partition(&sc.disk.path)?;
    let meta = read_meta_data(&part, sc.dir.path())?;
    assert_eq!(meta["uuid"], sc.uuid.as_str(), "{meta}");
    assert_eq!(meta["hostname"], "deployed.example", "{meta}");

    // Undeploy: tear down, automated cleaning (metadata erase), available, instance gone.
    sc.boot()?;
    sc.verb(json!({"target": "deleted"}))?;
    let avail = sc.state("available", 180)?;
    assert_eq!(avail["instance_info"], json!({}), "{avail}");
    assert!(avail["instance_uuid"].is_null(), "{avail}");
    assert!(
        avail["driver_internal_info"]
            .get("deployed_image")
            .is_none(),
        "{avail}"
    );
    let first = read_at(&sc.disk.path, 0, MIB as usize)?;
    assert!(
        first.iter().all(|b| *b == 0),
        "first MiB not erased after undeploy"
    );
    Ok(())
}

#[test]
fn checksum_mismatch_fails_with_both_digests() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let mut sc = Scene::new()?;
    let image = sc.path("other.raw");
    make_image(&image, 11)?;
    let real = sha256_file(&image)?;
    let wrong = "0".repeat(64);
    sc.set_image(&image, &wrong)?;
    sc.boot()?;
    sc.verb(json!({"target": "active"}))?;
    let failed = sc.state("deploy failed", 180)?;
    let err = failed["last_error"].as_str().unwrap_or_default();
    assert!(err.contains(&real) && err.contains(&wrong), "{err}");
    assert!(err.contains("write_image"), "{err}");
    // Fixed, `rebuild` from deploy failed deploys it.
    sc.set_image(&image, &real)?;
    sc.boot()?;
    sc.verb(json!({"target": "rebuild"}))?;
    let active = sc.state("active", 180)?;
    assert_eq!(
        active["driver_internal_info"]["deployed_image"]["hash_value"],
        real.as_str()
    );
    Ok(())
}

#[test]
fn abort_during_write_image_and_refused_outside_a_wait() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let mut sc = Scene::new()?;
    let image = sc.path("slow.raw");
    make_image(&image, 3)?;
    let digest = sha256_file(&image)?;
    sc.set_image(&image, &digest)?;
    // 4 MiB/s: the 64 MiB image takes ~16 s, time to abort in the middle.
    sc.images.set_pace(4 * MIB);
    // Abort outside a wait state: 400, nothing changes.
    let (s, v) = sc.rivetd.call(
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "abort"})),
    )?;
    assert_eq!(s, 400, "{v}");
    assert_eq!(sc.rivetd.node("n1")?["provision_state"], "available");

    sc.boot()?;
    sc.verb(json!({"target": "active"}))?;
    let writing = sc.wait("write_image running", 120, |v| {
        v["deploy_step"]["step"] == "write_image"
            && v["deploy_step"]["progress"]["done"].as_u64().unwrap_or(0) > 0
    })?;
    assert_eq!(writing["provision_state"], "wait call-back", "{writing}");
    let total = writing["deploy_step"]["progress"]["total"]
        .as_u64()
        .unwrap_or(0);
    assert_eq!(total, IMAGE_MIB * MIB, "{writing}");
    let (s, v) = sc.rivetd.call("DELETE", "/v1/nodes/n1/provision", None)?;
    assert_eq!(s, 202, "{v}");
    let failed = sc.state("deploy failed", 30)?;
    let err = failed["last_error"].as_str().unwrap_or_default();
    assert!(
        err.contains("aborted") && err.contains("write_image"),
        "{err}"
    );
    // The agent was told: its step ends as aborted, well before the image would be done.
    let agent_log = sc.agent.as_ref().map(|a| a.log_text()).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut log = agent_log;
    while !log.to_ascii_lowercase().contains("abort") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        log = sc.agent.as_ref().map(|a| a.log_text()).unwrap_or_default();
    }
    assert!(
        log.to_ascii_lowercase().contains("abort"),
        "agent never heard of the abort:\n{}",
        sc.logs()
    );
    let off = sc.wait("powered off", 20, |v| v["power_state"] == "power off")?;
    assert_eq!(off["provision_state"], "deploy failed");
    // A failed deploy may be retried: `active` again, at full speed this time.
    sc.images.set_pace(0);
    sc.boot()?;
    sc.verb(json!({"target": "active"}))?;
    sc.state("active", 180)?;
    Ok(())
}

#[test]
fn rivetd_killed_mid_write_then_deploy_finishes() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let mut sc = Scene::new()?;
    let image = sc.path("restart.raw");
    make_image(&image, 5)?;
    let digest = sha256_file(&image)?;
    sc.set_image(&image, &digest)?;
    sc.images.set_pace(8 * MIB);
    sc.boot()?;
    sc.verb(json!({"target": "active"}))?;
    sc.wait("write_image running", 120, |v| {
        v["deploy_step"]["progress"]["done"].as_u64().unwrap_or(0) > 0
    })?;
    let cfg = sc.path("rivetd.toml").display().to_string();
    let port = sc.rivetd.port;
    sc.rivetd.kill9();
    std::thread::sleep(Duration::from_secs(2));
    sc.rivetd = Rivetd::start(&sc.path("rivet.db"), port, &["--config", &cfg])?;
    sc.images.set_pace(0);
    let active = sc.state("active", 180)?;
    assert_eq!(
        active["driver_internal_info"]["deployed_image"]["hash_value"],
        digest.as_str()
    );
    // The image was written once: one GET of it reached the image server.
    assert_eq!(
        sc.images
            .requests
            .load(std::sync::atomic::Ordering::Relaxed),
        1,
        "the image was fetched more than once"
    );
    Ok(())
}
