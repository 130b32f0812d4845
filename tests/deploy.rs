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
//! Deploy integrity: every failed deploy (checksum mismatch, abort, the agent killed
//! mid-write) ends powered off through the node's power interface (`[deploy]
//! power_off_after_deploy_failure`, with power sync reading the fake BMC back every second so
//! a power state only written to the database would not last), with a history entry saying
//! so — or, with the option false, powered as it was — and leaves a disk that was seeded with
//! an old GPT with no partition table a firmware would boot: no MBR signature, no primary
//! GPT header (512- or 4096-byte sectors), no backup GPT header in the last MiB.
//!
//! Needs root (loop devices), sgdisk, blkid and xorriso or isoinfo for reading the
//! configdrive; skips without them unless `RIVET_REQUIRE_PEERS=1`.

use anyhow::{bail, ensure, Context, Result};
use rivet_tests::agentproc::{have, is_root, read_at, AgentProcess, LoopDevice};
use rivet_tests::fileserver::FileServer;
use rivet_tests::{
    deploy_test_config_with, prerequisite, run_tool, sha256_file, Rivetd, DEPLOY_TEST_CONFIG,
};
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
/// Power sync every second (record): a `power_state` the conductor wrote without the BMC
/// being off would be read back as `power on` within a second or two.
const POWER_SYNC_EVERY_SECOND: &str = "[power_sync]\ninterval_s = 1\n";

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
        Self::with_config(DEPLOY_TEST_CONFIG)
    }

    /// [`Scene::new`] with rivetd running `config`.
    fn with_config(config: &str) -> Result<Scene> {
        let dir = tempfile::tempdir()?;
        let rivetd = Rivetd::start_in(dir.path(), config)?;
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
                        // The agent stands in for a ramdisk on this BIOS host: no UEFI.
                        "properties": {"root_device": {"name": disk.path.display().to_string()},
                                       "capabilities": "boot_mode:bios"}}),
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

impl Scene {
    /// Give the target disk an old GPT over the whole disk (as a previous instance would
    /// have left), so a stale table after a failed deploy would show; checked to be seen.
    fn seed_old_gpt(&self) -> Result<()> {
        run_tool(
            Command::new("sgdisk")
                .args(["-o", "-n", "1:0:0"])
                .arg(&self.disk.path),
        )?;
        let found = bootable_metadata(&self.disk.path)?;
        ensure!(
            found.len() >= 3,
            "the seeded GPT is not detected: {found:?}"
        );
        Ok(())
    }

    /// The node history entries (detail), oldest first.
    fn history(&self) -> Result<Vec<Value>> {
        let (s, v) = self
            .rivetd
            .call("GET", "/v1/nodes/n1/history?detail=true", None)?;
        ensure!(s == 200, "history: {s} {v}");
        Ok(v["history"].as_array().cloned().unwrap_or_default())
    }

    /// Wait for the history entry whose event starts with `prefix`.
    fn history_entry(&self, prefix: &str, secs: u64) -> Result<Value> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let h = self.history()?;
            if let Some(e) = h
                .iter()
                .find(|e| e["event"].as_str().is_some_and(|ev| ev.starts_with(prefix)))
            {
                return Ok(e.clone());
            }
            if Instant::now() > deadline {
                bail!(
                    "no history entry {prefix:?} after {secs} s: {}\n{}",
                    serde_json::to_string_pretty(&h)?,
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The node ends `deploy failed` powered off through its power interface: `power off`
    /// recorded, still so after power sync has read the fake BMC a few times, and a history
    /// entry saying so.
    fn assert_powered_off_after_failure(&self) -> Result<()> {
        let off = self.wait("powered off after the failure", 30, |v| {
            v["power_state"] == "power off"
        })?;
        assert_eq!(off["provision_state"], "deploy failed", "{off}");
        let entry = self.history_entry("node powered off after the deploy failure", 10)?;
        assert_eq!(entry["severity"], "INFO", "{entry}");
        assert_eq!(entry["event_type"], "deploying", "{entry}");
        assert_eq!(entry["state"], "deploy failed", "{entry}");
        std::thread::sleep(Duration::from_millis(2500));
        let later = self.rivetd.node("n1")?;
        assert_eq!(
            later["power_state"], "power off",
            "power sync read the BMC as on: the power off was not real: {later}"
        );
        Ok(())
    }

    /// Nothing on the disk a firmware would boot or a tool would take for a partition table.
    fn assert_nothing_bootable(&self, when: &str) -> Result<()> {
        let found = bootable_metadata(&self.disk.path)?;
        assert!(
            found.is_empty(),
            "{when}: the disk still holds {}\n{}",
            found.join(", "),
            self.logs()
        );
        Ok(())
    }
}

/// What on `disk` makes it look bootable: the MBR boot signature, a primary GPT header
/// (512- or 4096-byte sectors), a backup GPT header in the last MiB (any 512-byte-aligned
/// position). Read after dropping the block device's cached pages, so the bytes are the
/// device's.
fn bootable_metadata(disk: &Path) -> Result<Vec<String>> {
    let _ = Command::new("blockdev")
        .arg("--flushbufs")
        .arg(disk)
        .status();
    let mut found = Vec::new();
    let head = read_at(disk, 0, 8192)?;
    if head[510..512] == [0x55, 0xAA] {
        found.push("an MBR boot signature (0x55 0xAA at byte 510)".to_string());
    }
    for at in [512usize, 4096] {
        if &head[at..at + 8] == b"EFI PART" {
            found.push(format!("a primary GPT header at byte {at}"));
        }
    }
    let size = DISK_MIB * MIB;
    let tail = read_at(disk, size - MIB, MIB as usize)?;
    for (i, sector) in tail.chunks(512).enumerate() {
        if sector.starts_with(b"EFI PART") {
            found.push(format!(
                "a backup GPT header at byte {}",
                size - MIB + (i as u64) * 512
            ));
        }
    }
    Ok(found)
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

/// A download cut twice mid-way is resumed by the agent (HTTP Range) and the deploy still
/// ends `active` with the image's bytes on the disk and the digest over the whole image.
#[test]
fn a_download_cut_twice_still_ends_active() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let mut sc = Scene::new()?;
    let image = sc.path("cut.raw");
    make_image(&image, 5)?;
    let digest = sha256_file(&image)?;
    sc.set_image(&image, &digest)?;
    sc.boot()?;
    sc.images.cut_next(2, 8 * MIB);
    let ranges = sc.images.range_requests();
    sc.verb(json!({"target": "active"}))?;
    let active = sc.state("active", 180)?;
    assert_eq!(
        sc.images.range_requests() - ranges,
        2,
        "two resumed requests: {}",
        sc.logs()
    );
    let written = &active["driver_internal_info"]["deployed_image"];
    assert_eq!(written["hash_value"], digest.as_str(), "{active}");
    assert_eq!(written["image_bytes"], IMAGE_MIB * MIB, "{active}");
    let want = read_at(&image, 2 * MIB, ((IMAGE_MIB - 4) * MIB) as usize)?;
    let got = read_at(&sc.disk.path, 2 * MIB, ((IMAGE_MIB - 4) * MIB) as usize)?;
    assert!(
        want == got,
        "the disk does not hold the image after the cuts"
    );
    Ok(())
}

/// A digest mismatch fails the deploy with both digests, powers the node off through its
/// power interface (history says so) and leaves nothing bootable on a disk that held an old
/// GPT; fixed, `rebuild` deploys.
/// A UEFI node whose agent stands in for a ramdisk (`--devices`, on this host): the agent
/// never writes its host's firmware, so the deploy fails before the download, saying why,
/// with the disk untouched.
#[test]
fn a_stand_in_agent_refuses_a_uefi_deploy_before_writing() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let mut sc = Scene::new()?;
    let (s, v) = sc.rivetd.call(
        "PATCH",
        "/v1/nodes/n1",
        Some(json!([{"op": "replace", "path": "/properties/capabilities", "value": "boot_mode:uefi"}])),
    )?;
    ensure!(s == 200, "{v}");
    let image = sc.path("uefi.raw");
    make_image(&image, 5)?;
    sc.set_image(&image, &sha256_file(&image)?)?;
    sc.seed_old_gpt()?;
    let before = read_at(&sc.disk.path, 0, MIB as usize)?;
    sc.boot()?;
    sc.verb(json!({"target": "active"}))?;
    let failed = sc.state("deploy failed", 120)?;
    let err = failed["last_error"].as_str().unwrap_or_default();
    assert!(
        err.contains("stands in for a ramdisk") && err.contains("boot_mode"),
        "{err}"
    );
    assert_eq!(
        read_at(&sc.disk.path, 0, MIB as usize)?,
        before,
        "the disk was written"
    );
    Ok(())
}

#[test]
fn checksum_mismatch_fails_with_both_digests() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let mut sc = Scene::with_config(&deploy_test_config_with("", POWER_SYNC_EVERY_SECOND))?;
    let image = sc.path("other.raw");
    make_image(&image, 11)?;
    let real = sha256_file(&image)?;
    let wrong = "0".repeat(64);
    sc.set_image(&image, &wrong)?;
    sc.seed_old_gpt()?;
    sc.boot()?;
    sc.verb(json!({"target": "active"}))?;
    let failed = sc.state("deploy failed", 180)?;
    let err = failed["last_error"].as_str().unwrap_or_default();
    assert!(err.contains(&real) && err.contains(&wrong), "{err}");
    assert!(err.contains("write_image"), "{err}");
    sc.assert_powered_off_after_failure()?;
    sc.assert_nothing_bootable("after a digest mismatch")?;
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
    sc.seed_old_gpt()?;
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
    // Powered off once (the abort and the failure are one path), and said so.
    let powered: Vec<Value> = sc
        .history()?
        .into_iter()
        .filter(|e| {
            e["event"]
                .as_str()
                .unwrap_or_default()
                .contains("after the deploy failure")
        })
        .collect();
    assert_eq!(powered.len(), 1, "{powered:?}");
    assert!(
        powered[0]["event"]
            .as_str()
            .unwrap_or_default()
            .starts_with("node powered off"),
        "{powered:?}"
    );
    // By the time the power is cut nothing on the disk boots.
    sc.assert_nothing_bootable("after an abort during write_image")?;
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

/// `[deploy] power_off_after_deploy_failure = false`: a failed deploy leaves the node powered
/// as it was (the ramdisk stays up to be looked at), the agent is not asked to power off, and
/// the history says why.
#[test]
fn deploy_failure_leaves_the_power_when_told_to() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let mut sc = Scene::with_config(&deploy_test_config_with(
        "",
        &format!("{POWER_SYNC_EVERY_SECOND}[deploy]\npower_off_after_deploy_failure = false\n"),
    ))?;
    let image = sc.path("left.raw");
    make_image(&image, 13)?;
    sc.set_image(&image, &"0".repeat(64))?;
    sc.boot()?;
    sc.verb(json!({"target": "active"}))?;
    let waiting = sc.state("wait call-back", 60)?;
    let before = waiting["power_state"].clone();
    assert_eq!(
        before, "power on",
        "the ramdisk boot powered it on: {waiting}"
    );
    sc.state("deploy failed", 180)?;
    let entry = sc.history_entry("node not powered off after the deploy failure", 20)?;
    let event = entry["event"].as_str().unwrap_or_default();
    assert!(
        event.contains("power_off_after_deploy_failure is false"),
        "{entry}"
    );
    assert_eq!(entry["severity"], "INFO", "{entry}");
    // Power sync has read the fake BMC since: still as it was.
    std::thread::sleep(Duration::from_millis(2500));
    let after = sc.rivetd.node("n1")?;
    assert_eq!(after["power_state"], before, "{after}");
    assert_eq!(after["provision_state"], "deploy failed", "{after}");
    let agent_log = sc.agent.as_ref().map(|a| a.log_text()).unwrap_or_default();
    assert!(
        !agent_log.contains("power off requested"),
        "the agent was asked to power off:\n{}",
        sc.logs()
    );
    Ok(())
}

/// The ramdisk dies (SIGKILL) in the middle of write_image: the deploy fails when its
/// heartbeats stop, the node is powered off, and the disk that held an old GPT has nothing
/// bootable — the image's first MiB is written last, after the digest matched, and the old
/// table was wiped before the first byte of the image went down.
#[test]
fn agent_killed_mid_write_leaves_nothing_bootable() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let mut sc = Scene::with_config(&deploy_test_config_with(
        "heartbeat_timeout_s = 10",
        POWER_SYNC_EVERY_SECOND,
    ))?;
    let image = sc.path("killed.raw");
    make_image(&image, 17)?;
    let digest = sha256_file(&image)?;
    sc.set_image(&image, &digest)?;
    sc.seed_old_gpt()?;
    // 4 MiB/s: the 64 MiB image takes ~16 s.
    sc.images.set_pace(4 * MIB);
    sc.boot()?;
    sc.verb(json!({"target": "active"}))?;
    let writing = sc.wait("write_image well under way", 120, |v| {
        v["deploy_step"]["step"] == "write_image"
            && v["deploy_step"]["progress"]["done"].as_u64().unwrap_or(0) >= 8 * MIB
    })?;
    assert_eq!(writing["provision_state"], "wait call-back", "{writing}");
    if let Some(agent) = sc.agent.as_mut() {
        agent.kill9();
    }
    let failed = sc.state("deploy failed", 60)?;
    let err = failed["last_error"].as_str().unwrap_or_default();
    assert!(err.contains("no heartbeat"), "{err}");
    assert!(err.contains("write_image"), "{err}");
    // The abort goes unanswered (the agent is dead): the power off follows after a bound.
    sc.assert_powered_off_after_failure()?;
    sc.assert_nothing_bootable("after the agent was killed mid-write")?;
    // The image was partly written (the kill happened mid-write, not before it).
    let mid = read_at(&sc.disk.path, 4 * MIB, MIB as usize)?;
    assert!(
        mid != vec![0u8; MIB as usize],
        "nothing of the image reached the disk before the kill"
    );
    Ok(())
}
