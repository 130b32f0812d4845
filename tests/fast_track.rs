//! Fast track end to end: the real rivetd binary, the real rivet-agent binary restricted to a
//! loop device, a loopback image server, fake-hardware (whose BMC is in memory: its "reboot"
//! does not stop the agent process, so a test starts a new agent process where a real node
//! would boot a new ramdisk).
//!
//! - `[deploy] fast_track = true`: cleaning ends in available with the node powered on (power
//!   sync reading the fake BMC back every second) and the agent heartbeating with its token;
//!   manage, inspect and provide inspect and clean again on the same agent; a deploy right
//!   after starts
//!   `write_image` (the agent's first request to the image server) within a second of the
//!   request, with no new agent.
//! - fast track off: cleaning powers the node off and the agent loses its token (unchanged);
//!   the same deploy measurement with a ramdisk that "boots" the instant it is asked to.
//! - a stale agent (`fast_track_timeout_s = 1`, the agent gone for longer): the deploy takes
//!   the ramdisk boot path, and nothing is handed to the gone agent.
//!
//! Needs root (loop devices) and sgdisk; skips without them unless `RIVET_REQUIRE_PEERS=1`.

use anyhow::{bail, ensure, Context, Result};
use rivet_tests::agentproc::{have, is_root, AgentProcess, LoopDevice};
use rivet_tests::fileserver::FileServer;
use rivet_tests::{deploy_test_config_with, prerequisite, run_tool, sha256_file, Rivetd};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// The deploy latency fast track promises: `write_image` starts within one agent poll of the
/// request, which the long poll makes one round trip, so well under a second.
const FAST_TRACK_LIMIT: Duration = Duration::from_secs(1);
/// Slack on top of it for a loaded test machine (two cores shared with other builds).
const MARGIN: Duration = Duration::from_millis(500);

/// The scenarios measure latencies: run them one at a time, not side by side in this binary.
static SERIAL: Mutex<()> = Mutex::new(());

fn ready() -> bool {
    prerequisite(is_root(), "root (loop devices)")
        && prerequisite(have("sgdisk"), "sgdisk (gdisk)")
        && prerequisite(have("sha256sum"), "sha256sum (coreutils)")
}

/// A small GPT whole-disk image with pseudo-random data, at `path`.
fn make_image(path: &Path) -> Result<()> {
    let f = std::fs::File::create(path)?;
    f.set_len(16 * MIB)?;
    drop(f);
    run_tool(
        Command::new("sgdisk")
            .args(["-o", "-n", "1:2048:0"])
            .arg(path),
    )?;
    let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
    use std::io::Seek;
    f.seek(std::io::SeekFrom::Start(MIB))?;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut buf = vec![0u8; MIB as usize];
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    for _ in 0..8 {
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
    agent: Option<AgentProcess>,
    boots: u32,
}

impl Scene {
    /// rivetd with `deploy` as its `[deploy]` table (and power sync every second), the image
    /// server with an image published, a 64 MiB loop device, node n1 (fake-hardware, the
    /// agent's deploy interface) cleaned into available by an agent process.
    fn new(deploy: &str) -> Result<Scene> {
        let dir = tempfile::tempdir()?;
        let config = deploy_test_config_with(
            "",
            &format!("[deploy]\n{deploy}\n[power_sync]\ninterval_s = 1\n"),
        );
        let rivetd = Rivetd::start_in(dir.path(), &config)?;
        let www = dir.path().join("www");
        std::fs::create_dir(&www)?;
        let images = FileServer::start(&www)?;
        let file = dir.path().join("disk0.img");
        std::fs::File::create(&file)?.set_len(64 * MIB)?;
        let disk = LoopDevice::attach(&file)?;
        let (s, v) = rivetd.call(
            "POST",
            "/v1/nodes",
            Some(
                json!({"driver": "fake-hardware", "deploy_interface": "direct", "name": "n1",
                        "inspect_interface": "agent",
                        // The agent stands in for a ramdisk on this BIOS host: no UEFI.
                        "properties": {"root_device": {"name": disk.path.display().to_string()},
                                       "capabilities": "boot_mode:bios"}}),
            ),
        )?;
        ensure!(s == 201, "{v}");
        let image = www.join("disk.raw");
        make_image(&image)?;
        let digest = sha256_file(&image)?;
        let (s, v) = rivetd.call(
            "PATCH",
            "/v1/nodes/n1",
            Some(json!([
                {"op": "add", "path": "/instance_info/image_source", "value": images.url_of("disk.raw")},
                {"op": "add", "path": "/instance_info/image_os_hash_algo", "value": "sha256"},
                {"op": "add", "path": "/instance_info/image_os_hash_value", "value": digest},
            ])),
        )?;
        ensure!(s == 200, "{v}");
        let mut scene = Scene {
            dir,
            rivetd,
            images,
            disk,
            agent: None,
            boots: 0,
        };
        scene.verb("manage")?;
        scene.state("manageable", 20)?;
        scene.boot()?;
        scene.verb("provide")?;
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
        let node = self.rivetd.node("n1")?["uuid"]
            .as_str()
            .context("node uuid")?
            .to_string();
        self.agent = Some(AgentProcess::start(
            &self.rivetd.url,
            &node,
            &[self.disk.path.as_path()],
            None,
            &log,
            &[],
        )?);
        Ok(())
    }

    fn verb(&self, target: &str) -> Result<()> {
        let (s, v) = self.rivetd.call(
            "PUT",
            "/v1/nodes/n1/states/provision",
            Some(json!({"target": target})),
        )?;
        ensure!(s == 202, "{target}: {s} {v}");
        Ok(())
    }

    fn agent_log(&self, boot: u32) -> String {
        std::fs::read_to_string(self.path(&format!("agent-{boot}.log"))).unwrap_or_default()
    }

    fn logs(&self) -> String {
        let mut out = format!("--- rivetd log ---\n{}", tail(&self.rivetd.log_text()));
        for i in 1..=self.boots {
            out.push_str(&format!(
                "\n--- agent log (boot {i}) ---\n{}",
                tail(&self.agent_log(i))
            ));
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

    /// The node history's events, oldest first.
    fn history(&self) -> Result<Vec<String>> {
        let (s, v) = self
            .rivetd
            .call("GET", "/v1/nodes/n1/history?detail=true", None)?;
        ensure!(s == 200, "history: {s} {v}");
        Ok(v["history"]
            .as_array()
            .map(|h| {
                h.iter()
                    .filter_map(|e| e["event"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default())
    }

    fn fast_track_events(&self) -> Result<Vec<String>> {
        Ok(self
            .history()?
            .into_iter()
            .filter(|e| e.starts_with("fast track"))
            .collect())
    }

    /// `driver_internal_info.agent_last_heartbeat` (null when none is recorded).
    fn last_heartbeat(&self) -> Result<Value> {
        Ok(self.rivetd.node("n1")?["driver_internal_info"]["agent_last_heartbeat"].clone())
    }

    /// The node stays `power` for a few power-sync rounds (the fake BMC read back each second).
    fn assert_power_held(&self, power: &str) -> Result<()> {
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(1000));
            let v = self.rivetd.node("n1")?;
            ensure!(
                v["power_state"] == power,
                "expected {power}, power sync reads {}: {v}\n{}",
                v["power_state"],
                self.logs()
            );
        }
        Ok(())
    }

    /// Ask for the deploy (while `on_request` runs at the same instant, e.g. a ramdisk
    /// boot) and measure until the agent's first request to the image server: `write_image`
    /// has started on the agent.
    fn time_to_write_image(
        &mut self,
        on_request: impl FnOnce(&mut Scene) -> Result<()>,
    ) -> Result<Duration> {
        let before = self.images.requests.load(Ordering::SeqCst);
        let started = Instant::now();
        self.verb("active")?;
        on_request(self)?;
        let deadline = started + Duration::from_secs(120);
        while self.images.requests.load(Ordering::SeqCst) == before {
            if Instant::now() > deadline {
                bail!("write_image never fetched the image\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(started.elapsed())
    }
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

#[test]
fn fast_track_keeps_the_ramdisk_and_deploys_within_a_second() -> Result<()> {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !ready() {
        return Ok(());
    }
    let mut sc = Scene::new("fast_track = true")?;

    // Cleaning ended without a power off: on, the agent keeps its token and heartbeats.
    let n = sc.rivetd.node("n1")?;
    assert_eq!(n["power_state"], "power on", "{n}\n{}", sc.logs());
    assert!(n["last_error"].is_null(), "{n}");
    sc.assert_power_held("power on")?;
    // (Refusals before: with fast track the agent looked up in manageable, and the cleaning
    // ramdisk boot of the powered-off node voided that token.)
    let refusals = |sc: &Scene| sc.agent_log(1).matches("no longer accepts").count();
    let refused_before = refusals(&sc);
    let first = sc.last_heartbeat()?;
    ensure!(first.is_string(), "no heartbeat recorded: {first}");
    sc.wait("the agent heartbeats on in available", 15, |v| {
        v["driver_internal_info"]["agent_last_heartbeat"].is_string()
            && v["driver_internal_info"]["agent_last_heartbeat"] != first
    })?;
    assert_eq!(
        refusals(&sc),
        refused_before,
        "the agent lost its token in available:\n{}",
        sc.logs()
    );
    let events = sc.fast_track_events()?;
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("fast track: cleaning ended with the ramdisk left running")),
        "{events:?}"
    );

    // manage keeps the agent; inspection runs on it and leaves it running; provide cleans
    // on it; none reboots.
    sc.verb("manage")?;
    sc.state("manageable", 20)?;
    sc.verb("inspect")?;
    let inspected = sc.wait("inspected", 60, |v| {
        v["provision_state"] == "manageable" && v["inspection_finished_at"].is_string()
    })?;
    assert!(inspected["last_error"].is_null(), "{inspected}");
    assert_eq!(inspected["power_state"], "power on", "{inspected}");
    let events = sc.fast_track_events()?;
    for e in [
        "fast track: inspection uses the ramdisk already running",
        "fast track: inspection ended with the ramdisk left running",
    ] {
        assert!(
            events.iter().any(|x| x.starts_with(e)),
            "{e}: {events:?}\n{}",
            sc.logs()
        );
    }
    sc.verb("provide")?;
    sc.state("available", 120)?;
    let events = sc.fast_track_events()?;
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("fast track: cleaning uses the ramdisk already running")),
        "{events:?}\n{}",
        sc.logs()
    );

    // The deploy: write_image starts on the same agent within a second of the request.
    let took = sc.time_to_write_image(|_| Ok(()))?;
    eprintln!(
        "fast track ON: deploy request -> write_image fetching the image: {} ms",
        took.as_millis()
    );
    assert!(
        took <= FAST_TRACK_LIMIT + MARGIN,
        "write_image started {} ms after the deploy request (limit {} ms + {} ms)\n{}",
        took.as_millis(),
        FAST_TRACK_LIMIT.as_millis(),
        MARGIN.as_millis(),
        sc.logs()
    );
    let active = sc.state("active", 120)?;
    assert!(active["last_error"].is_null(), "{active}");
    assert_eq!(
        active["driver_internal_info"]["deployed_image"]["device"],
        sc.disk.path.display().to_string(),
        "{active}"
    );
    assert_eq!(
        sc.boots, 1,
        "one ramdisk boot served cleaning twice and the deploy"
    );
    let events = sc.fast_track_events()?;
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("fast track: deploy uses the ramdisk already running")),
        "{events:?}"
    );
    // The instance runs now: the agent's token went with tear_down_agent, and a ramdisk is
    // never let back in on an active node.
    sc.wait("agent refused on the active node", 20, |_| {
        refusals(&sc) > refused_before
    })?;
    Ok(())
}

#[test]
fn without_fast_track_cleaning_powers_off_and_the_deploy_boots_the_ramdisk() -> Result<()> {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !ready() {
        return Ok(());
    }
    let mut sc = Scene::new("fast_track = false")?;
    let n = sc.rivetd.node("n1")?;
    assert_eq!(n["power_state"], "power off", "{n}\n{}", sc.logs());
    sc.assert_power_held("power off")?;
    sc.wait("the agent loses its token", 20, |_| {
        sc.agent_log(1).contains("no longer accepts")
    })?;
    assert_eq!(sc.fast_track_events()?, Vec::<String>::new());

    // The same measurement on the boot path, with a ramdisk that comes up the instant the
    // node is asked to boot it (a real one adds firmware POST and the ramdisk's own boot).
    let took = sc.time_to_write_image(|sc| sc.boot())?;
    eprintln!(
        "fast track OFF: deploy request -> write_image fetching the image: {} ms \
         (ramdisk 'boot' = starting the agent process at the request; real hardware adds POST and boot)",
        took.as_millis()
    );
    let active = sc.state("active", 120)?;
    assert!(active["last_error"].is_null(), "{active}");
    assert_eq!(sc.fast_track_events()?, Vec::<String>::new());
    Ok(())
}

#[test]
fn a_stale_agent_is_not_used_and_the_ramdisk_is_booted() -> Result<()> {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !ready() {
        return Ok(());
    }
    let mut sc = Scene::new("fast_track = true\nfast_track_timeout_s = 1")?;
    let n = sc.rivetd.node("n1")?;
    assert_eq!(n["power_state"], "power on", "{n}\n{}", sc.logs());
    // The ramdisk goes away (a crash, someone's console) and stays silent past the timeout.
    if let Some(mut a) = sc.agent.take() {
        a.kill9();
    }
    std::thread::sleep(Duration::from_secs(3));
    let requests = sc.images.requests.load(Ordering::SeqCst);
    sc.verb("active")?;
    sc.state("wait call-back", 20)?;
    let refused = sc.wait("fast track refused in the history", 10, |_| {
        sc.fast_track_events().unwrap_or_default().iter().any(|e| {
            e.starts_with("fast track not used for deploy: the agent's last heartbeat was")
        })
    });
    refused?;
    let events = sc.fast_track_events()?;
    assert!(
        !events
            .iter()
            .any(|e| e.starts_with("fast track: deploy uses")),
        "{events:?}"
    );
    // Nothing reaches the image server while no ramdisk answers: the gone agent was given
    // nothing and the node waits for its new ramdisk.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(sc.images.requests.load(Ordering::SeqCst), requests);
    let n = sc.rivetd.node("n1")?;
    assert_eq!(n["provision_state"], "wait call-back", "{n}");
    // The booted ramdisk looks up, gets a new token and deploys.
    sc.boot()?;
    let active = sc.state("active", 120)?;
    assert!(active["last_error"].is_null(), "{active}");
    assert!(
        sc.images.requests.load(Ordering::SeqCst) > requests,
        "the deploy never fetched the image"
    );
    Ok(())
}
