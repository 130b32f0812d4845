//! Controller and agent faults with the real rivetd and rivet-agent binaries (issue 22,
//! item 3):
//!
//! * `agent_cut_off_for_two_minutes_mid_erase_finishes_once`: rivetd and the agent in two
//!   network namespaces joined by a veth pair; the agent erases a loop device whose writes a
//!   blkio cgroup throttles, so the full erase takes ~2.9 min; the link goes down for 120 s
//!   in the middle. The erase goes on, the agent reconnects with bounded backoff, the node
//!   is not timed out (default `heartbeat_timeout_s`), the step runs once. ~3 min.
//! * `sigterm_mid_step_then_new_rivetd_finishes_cleaning`: SIGTERM while a step runs on the
//!   agent, exit 0 with the lease handed back, a new rivetd on the same database and the
//!   agent finishes the cleaning. (`agent_controller.rs`
//!   `sigterm_answers_held_polls_and_hands_leases_back` covers the held long poll.) ~10 s.
//! * `duplicate_conductor_id_is_refused_while_alive_and_taken_over_when_dead` (PostgreSQL):
//!   a second rivetd under a live id is refused, naming the id; after the first dies the id
//!   is taken over. ~10 s. `same_conductor_id_on_sqlite_is_refused_and_restart_is_immediate`:
//!   the same on SQLite, by the file lock. ~3 s.
//!
//! Everything the tests create (namespaces, which take their veth pair with them, the cgroup,
//! loop devices, processes) is removed by guards on every path, panics included.

use anyhow::{bail, ensure, Context, Result};
use rivet_store::postgres::ScratchDatabase;
use rivet_tests::agentproc::{all_zero, have, is_root, write_at, AgentProcess, LoopDevice};
use rivet_tests::{bin, prerequisite, Rivetd};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn run(cmd: &str, args: &[&str]) -> Result<String> {
    rivet_tests::run_tool(Command::new(cmd).args(args))
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

// ---------------------------------------------------------------------------------------
// Agent cut off mid-erase.

/// The erased device: with one random pass and the zeroing pass 2 × 256 MiB are written at
/// 3 MiB/s, ~171 s, so the 120 s outage and the agent's reconnection (at most one 30 s
/// backoff cap later) both fall inside the erase.
const DISK_BYTES: u64 = 256 << 20;
const WRITE_BPS: u64 = 3 << 20;
const OUTAGE: Duration = Duration::from_secs(120);
/// The controller's address inside its namespace; nothing outside the namespaces sees it.
const CTL_ADDR: &str = "10.231.0.1";
const AGENT_ADDR: &str = "10.231.0.2";
const PORT: u16 = 6385;
const ADMIN_SECRET: &str = "faults-admin-secret";

/// A network namespace, deleted on drop (its veth end goes with it, and the peer with that).
struct Netns(String);

impl Netns {
    fn add(name: String) -> Result<Netns> {
        run("ip", &["netns", "add", &name])?;
        let ns = Netns(name);
        ns.exec(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    fn exec(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["netns", "exec", self.0.as_str()];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// Move the calling thread (and the threads and processes it starts afterwards) into
    /// this namespace.
    fn enter(&self) -> Result<()> {
        use std::os::fd::AsRawFd;
        let f = std::fs::File::open(format!("/run/netns/{}", self.0))?;
        // SAFETY: setns(2) on a namespace file descriptor we hold open; it changes only the
        // calling thread's network namespace.
        let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        ensure!(
            rc == 0,
            "setns into {}: {}",
            self.0,
            std::io::Error::last_os_error()
        );
        Ok(())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.0])
            .stderr(Stdio::null())
            .status();
    }
}

/// A blkio cgroup (v1) that throttles writes to one device; removed on drop.
struct ThrottleGroup(PathBuf);

impl ThrottleGroup {
    const ROOT: &'static str = "/sys/fs/cgroup/blkio";

    fn available() -> bool {
        Path::new(Self::ROOT)
            .join("blkio.throttle.write_bps_device")
            .exists()
    }

    fn new(name: &str, device: &Path, bps: u64) -> Result<ThrottleGroup> {
        let majmin = run("lsblk", &["-dno", "MAJ:MIN", &device.display().to_string()])?
            .trim()
            .to_string();
        let dir = Path::new(Self::ROOT).join(name);
        std::fs::create_dir(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
        let g = ThrottleGroup(dir);
        std::fs::write(
            g.0.join("blkio.throttle.write_bps_device"),
            format!("{majmin} {bps}\n"),
        )?;
        Ok(g)
    }

    /// Bytes written to any device by the group's processes so far.
    fn written(&self) -> u64 {
        std::fs::read_to_string(self.0.join("blkio.throttle.io_service_bytes"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                let (_, op, n) = (w.next()?, w.next()?, w.next()?);
                (op == "Write").then(|| n.parse::<u64>().ok())?
            })
            .sum()
    }
}

impl Drop for ThrottleGroup {
    fn drop(&mut self) {
        // The processes are gone by now (the agent guard is dropped first); a cgroup
        // directory is removed with rmdir, not rm -r.
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A child killed and reaped on drop.
struct Proc(Option<Child>);

impl Proc {
    fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The admin API of the namespaced rivetd (the test thread has entered its namespace).
struct Api {
    http: reqwest::blocking::Client,
    base: String,
}

impl Api {
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<(u16, Value)> {
        let m = reqwest::Method::from_bytes(method.as_bytes())?;
        let mut req = self
            .http
            .request(m, format!("{}{path}", self.base))
            .header("X-OpenStack-Ironic-API-Version", "latest")
            .header("X-Auth-Token", ADMIN_SECRET);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().with_context(|| format!("{method} {path}"))?;
        let status = resp.status().as_u16();
        Ok((status, resp.json().unwrap_or(Value::Null)))
    }

    fn node(&self) -> Result<Value> {
        let (s, v) = self.call("GET", "/v1/nodes/n1", None)?;
        ensure!(s == 200, "GET node: {s} {v}");
        Ok(v)
    }

    fn wait(&self, secs: u64, what: &str, pred: impl Fn(&Value) -> bool) -> Result<Value> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let v = self.node()?;
            if pred(&v) {
                return Ok(v);
            }
            if Instant::now() > deadline {
                bail!("{what}: not reached in {secs} s: {v}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Everything the cut-off scenario runs, torn down in this order: processes, cgroup, loop
/// device, namespaces.
struct CutOffLab {
    agent: Proc,
    rivetd: Proc,
    throttle: Option<ThrottleGroup>,
    disk: Option<LoopDevice>,
    agent_ns: Option<Netns>,
    ctl_ns: Option<Netns>,
    dir: tempfile::TempDir,
}

impl Drop for CutOffLab {
    fn drop(&mut self) {
        self.agent.kill();
        self.rivetd.kill();
        self.throttle.take();
        self.disk.take();
        self.agent_ns.take();
        self.ctl_ns.take();
    }
}

impl CutOffLab {
    fn logs(&self) -> String {
        let read = |n: &str| std::fs::read_to_string(self.dir.path().join(n)).unwrap_or_default();
        format!(
            "--- rivetd log ---\n{}\n--- agent log ---\n{}",
            tail(&read("rivetd.log")),
            tail(&read("agent.log"))
        )
    }

    fn agent_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }

    fn link(&self, state: &str) -> Result<String> {
        let ns = self.agent_ns.as_ref().context("agent namespace")?;
        ns.exec(&["ip", "link", "set", "rvt-agent", state])
    }
}

#[test]
fn agent_cut_off_for_two_minutes_mid_erase_finishes_once() -> Result<()> {
    if !prerequisite(
        is_root() && have("ip") && have("losetup") && have("lsblk") && ThrottleGroup::available(),
        "root with ip (netns), losetup, lsblk and the blkio cgroup (v1) throttle",
    ) {
        return Ok(());
    }
    let started = Instant::now();
    let tag = format!("rvt{}", std::process::id());
    let dir = tempfile::tempdir()?;
    let mut lab = CutOffLab {
        agent: Proc(None),
        rivetd: Proc(None),
        throttle: None,
        disk: None,
        agent_ns: None,
        ctl_ns: None,
        dir,
    };
    let path = |n: &str| lab.dir.path().join(n);

    // The disk, with a pattern at both ends that the erase must remove.
    let image = path("disk.img");
    std::fs::File::create(&image)?.set_len(DISK_BYTES)?;
    for off in [0, DISK_BYTES / 2, DISK_BYTES - (1 << 20)] {
        write_at(&image, off, &[0xA5; 1 << 20])?;
    }
    let disk = LoopDevice::attach(&image)?;
    let dev = disk.path.clone();
    lab.disk = Some(disk);
    lab.throttle = Some(ThrottleGroup::new(&tag, &dev, WRITE_BPS)?);

    // Two namespaces and a veth pair between them; the host's network is not touched.
    let ctl_ns = Netns::add(format!("{tag}-ctl"))?;
    let agent_ns = Netns::add(format!("{tag}-agent"))?;
    agent_ns.exec(&[
        "ip",
        "link",
        "add",
        "rvt-agent",
        "type",
        "veth",
        "peer",
        "name",
        "rvt-ctl",
        "netns",
        &ctl_ns.0,
    ])?;
    agent_ns.exec(&[
        "ip",
        "addr",
        "add",
        &format!("{AGENT_ADDR}/24"),
        "dev",
        "rvt-agent",
    ])?;
    agent_ns.exec(&["ip", "link", "set", "rvt-agent", "up"])?;
    ctl_ns.exec(&[
        "ip",
        "addr",
        "add",
        &format!("{CTL_ADDR}/24"),
        "dev",
        "rvt-ctl",
    ])?;
    ctl_ns.exec(&["ip", "link", "set", "rvt-ctl", "up"])?;
    // This test's thread talks to rivetd from inside the controller's namespace.
    ctl_ns.enter()?;
    let ctl_name = ctl_ns.0.clone();
    let agent_name = agent_ns.0.clone();
    lab.ctl_ns = Some(ctl_ns);
    lab.agent_ns = Some(agent_ns);

    // rivetd on the namespace address: not loopback, so with an admin token and plain HTTP
    // explicitly allowed. Agent timeouts are the defaults (heartbeat_timeout_s = 300).
    let cfg = path("rivetd.toml");
    std::fs::write(
        &cfg,
        format!(
            "allow_plain_http = true\n[auth]\ntokens = [{{ name = \"faults\", hash = \"{}\" }}]\n\
             [conductor]\ncheck_interval_s = 1\n",
            rivet_tests::hash_secret(ADMIN_SECRET)?
        ),
    )?;
    let listen = format!("{CTL_ADDR}:{PORT}");
    let rivetd = Command::new("ip")
        .args(["netns", "exec", &ctl_name])
        .arg(bin("rivetd"))
        .args(["--listen", &listen, "--conductor-id", "faults", "--config"])
        .arg(&cfg)
        .arg("--db")
        .arg(format!("sqlite:{}", path("rivet.db").display()))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(path("rivetd.log"))?)
        .spawn()?;
    lab.rivetd = Proc(Some(rivetd));
    let api = Api {
        http: reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()?,
        base: format!("http://{listen}"),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while api.call("GET", "/v1", None).is_err() {
        ensure!(
            Instant::now() < deadline,
            "rivetd did not start\n{}",
            lab.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let (s, v) = api.call(
        "POST",
        "/v1/nodes",
        Some(json!({"driver": "fake-hardware", "deploy_interface": "direct", "name": "n1"})),
    )?;
    ensure!(s == 201, "{v}");
    let uuid = v["uuid"].as_str().unwrap_or_default().to_string();
    api.call(
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "manage"})),
    )?;
    api.wait(10, "manageable", |v| v["provision_state"] == "manageable")?;
    let (s, v) = api.call(
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "clean", "clean_steps": [
            {"interface": "deploy", "step": "erase_devices", "args": {"random_passes": 1}}]})),
    )?;
    ensure!(s == 202, "{v}");
    api.wait(10, "clean wait", |v| v["provision_state"] == "clean wait")?;

    // The real agent in its namespace, inside the throttling cgroup from its first
    // instruction (the shell puts itself there, then execs).
    let throttle_procs = lab
        .throttle
        .as_ref()
        .context("cgroup")?
        .0
        .join("cgroup.procs");
    let agent = Command::new("sh")
        .arg("-c")
        .arg("echo $$ > \"$0\" && exec \"$@\"")
        .arg(&throttle_procs)
        .args(["ip", "netns", "exec", &agent_name])
        .arg(bin("rivet-agent"))
        .args(["run", "--controller", &format!("http://{listen}")])
        .args(["--node", &uuid, "--plugin-dir", "/nonexistent", "--devices"])
        .arg(&dev)
        .env("RIVET_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(path("agent.log"))?)
        .spawn()?;
    lab.agent = Proc(Some(agent));
    let throttle = lab.throttle.as_ref().context("cgroup")?;

    // Cut the link once the controller has seen the erase make progress.
    let seen = api
        .wait(60, "erase progress seen by rivetd", |v| {
            v["clean_step"]["step"] == "erase_devices"
                && v["clean_step"]["progress"]["done"].as_u64().unwrap_or(0) > 0
        })
        .map_err(|e| anyhow::anyhow!("{e}\n{}", lab.logs()))?;
    let failures_before = lab.agent_log().matches("heartbeat failed").count();
    lab.link("down")?;
    let cut_at = Instant::now();
    let written_at_cut = throttle.written();
    let progress_at_cut = api.node()?["clean_step"]["progress"]["done"].clone();
    eprintln!(
        "link down at {:?}; controller saw progress {progress_at_cut} (first {})",
        started.elapsed(),
        seen["clean_step"]["progress"]
    );
    while cut_at.elapsed() < OUTAGE {
        let v = api.node()?;
        ensure!(
            v["provision_state"] == "clean wait" && v["last_error"].is_null(),
            "node left clean wait during the outage: {v}\n{}",
            lab.logs()
        );
        std::thread::sleep(Duration::from_secs(2));
    }
    let v = api.node()?;
    let written_in_outage = throttle.written() - written_at_cut;
    let blind = v["clean_step"]["progress"]["done"] == progress_at_cut
        || v["clean_step"].is_null()
        || v["provision_state"] != "clean wait";
    lab.link("up")?;
    let up_at = Instant::now();
    eprintln!(
        "link up at {:?}; {} MiB written during the outage",
        started.elapsed(),
        written_in_outage >> 20
    );
    // The cut was real: the controller saw no progress while the agent kept erasing.
    ensure!(
        blind,
        "rivetd saw progress during the outage: {v}\n{}",
        lab.logs()
    );
    ensure!(
        written_in_outage >= 64 << 20,
        "the erase stalled during the outage: {written_in_outage} bytes written\n{}",
        lab.logs()
    );

    // The agent retried with backoff bounded by its 30 s cap, and reaches rivetd again
    // within one cap of the link returning, while the erase still runs.
    let beat_before = v["driver_internal_info"]["agent_last_heartbeat"].clone();
    api.wait(45, "agent heartbeat after the link returned", |v| {
        v["driver_internal_info"]["agent_last_heartbeat"] != beat_before
    })
    .map_err(|e| anyhow::anyhow!("{e}\n{}", lab.logs()))?;
    let still_erasing = api.node()?["provision_state"] == "clean wait";
    std::thread::sleep(Duration::from_millis(500));
    ensure!(
        !still_erasing
            || lab
                .agent_log()
                .contains("heartbeat answered again after failures"),
        "agent did not log its reconnection\n{}",
        lab.logs()
    );
    eprintln!("agent answered again {:?} after link up", up_at.elapsed());
    let log = lab.agent_log();
    let delays: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("heartbeat failed"))
        .filter_map(|l| {
            let rest = l.split("retry_in_ms=").nth(1)?;
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect();
    ensure!(
        log.matches("heartbeat failed").count() > failures_before && !delays.is_empty(),
        "no failed heartbeats logged during the outage\n{}",
        lab.logs()
    );
    let longest = delays.iter().copied().max().unwrap_or(0);
    ensure!(
        (15_000..=30_000).contains(&longest),
        "backoff not grown to / bounded by its 30 s cap: {delays:?}"
    );
    // Attempts kept coming for the whole outage: no retry storm, no giving up.
    ensure!(
        delays.len() < 40,
        "{} retries in 2 min: {delays:?}",
        delays.len()
    );

    let node = api
        .wait(90, "cleaning finished", |v| {
            v["provision_state"] == "manageable" || v["provision_state"] == "clean failed"
        })
        .map_err(|e| anyhow::anyhow!("{e}\n{}", lab.logs()))?;
    ensure!(
        node["provision_state"] == "manageable" && node["last_error"].is_null(),
        "{node}\n{}",
        lab.logs()
    );
    eprintln!("cleaning finished at {:?}", started.elapsed());

    // Erased completely, and once: one command in the store, received once by the agent,
    // and the agent wrote the device exactly once per pass (2 passes).
    ensure!(all_zero(&dev)?, "the device is not all zeroes");
    let c = rusqlite::Connection::open(path("rivet.db"))?;
    let ids: Vec<String> = c
        .prepare("SELECT id, command FROM agent_commands ORDER BY seq")?
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?
        .filter_map(|r| r.ok())
        .filter(|(_, cmd)| cmd.contains("\"erase_devices\""))
        .map(|(id, _)| id)
        .collect();
    ensure!(
        ids.len() == 1,
        "erase_devices sent {} times: {ids:?}",
        ids.len()
    );
    let received = log
        .lines()
        .filter(|l| l.contains("command received") && l.contains(&ids[0]))
        .count();
    ensure!(received == 1, "agent received {} {received} times", ids[0]);
    let written = throttle.written();
    ensure!(
        (2 * DISK_BYTES..3 * DISK_BYTES).contains(&written),
        "the agent wrote {written} bytes for two passes over {DISK_BYTES}: a pass ran twice?"
    );
    eprintln!("total {:?}", started.elapsed());
    Ok(())
}

// ---------------------------------------------------------------------------------------
// SIGTERM mid-step.

/// An exec plugin whose step records its start and end, so a test sees it run once.
const STEP_PLUGIN: &str = r#"#!/bin/sh
set -u
case "${1:-}" in
describe) echo '{"name": "fault-steps", "support_level": 1}' ;;
steps) echo '[{"interface": "deploy", "step": "mark_step", "priority": 0, "abortable": true,
  "argsinfo": {"tag": {"description": "line to record", "required": true},
               "seconds": {"description": "how long", "required": false}}}]' ;;
execute)
  req=$(cat)
  secs=${req#*\"seconds\":}; [ "$secs" = "$req" ] && secs=1; secs=${secs%%[,\}]*}
  tag=${req#*\"tag\":\"}; tag=${tag%%\"*}
  echo "start $tag" >> "$RIVET_TEST_DIR/marks"
  n=$((secs * 10)); i=0
  while [ $i -lt $n ]; do sleep 0.1; i=$((i + 1)); echo "progress $i/$n" >&2; done
  echo "done $tag" >> "$RIVET_TEST_DIR/marks"
  echo "{\"tag\": \"$tag\"}" ;;
esac
"#;

#[test]
fn sigterm_mid_step_then_new_rivetd_finishes_cleaning() -> Result<()> {
    let started = Instant::now();
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("rivetd.toml");
    std::fs::write(
        &cfg,
        "[agent]\nlong_poll_s = 2\n[conductor]\ncheck_interval_s = 1\n",
    )?;
    let cfg = cfg.display().to_string();
    let db = dir.path().join("rivet.db");
    let mut d = Rivetd::start(&db, 0, &["--config", &cfg])?;
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(json!({"driver": "fake-hardware", "deploy_interface": "direct", "name": "n1"})),
    )?;
    ensure!(s == 201, "{v}");
    let uuid = v["uuid"].as_str().unwrap_or_default().to_string();
    d.call(
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "manage"})),
    )?;
    d.wait_node("n1", Duration::from_secs(10), |v| {
        v["provision_state"] == "manageable"
    })?;
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins)?;
    std::fs::write(plugins.join("fault-steps"), STEP_PLUGIN)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        plugins.join("fault-steps"),
        std::fs::Permissions::from_mode(0o755),
    )?;
    let disk = dir.path().join("disk.img");
    std::fs::File::create(&disk)?.set_len(16 << 20)?;
    let (s, v) = d.call(
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "clean", "clean_steps": [
            {"interface": "deploy", "step": "mark_step", "args": {"tag": "a", "seconds": 6}},
            {"interface": "deploy", "step": "mark_step", "args": {"tag": "b", "seconds": 1}}]})),
    )?;
    ensure!(s == 202, "{v}");
    d.wait_node("n1", Duration::from_secs(10), |v| {
        v["provision_state"] == "clean wait"
    })?;
    let test_dir = dir.path().display().to_string();
    let agent = AgentProcess::start(
        &d.url,
        &uuid,
        &[&disk],
        Some(&plugins),
        &dir.path().join("agent.log"),
        &[("RIVET_TEST_DIR", test_dir.as_str())],
    )?;
    let marks = || -> Vec<String> {
        std::fs::read_to_string(dir.path().join("marks"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while marks().is_empty() {
        ensure!(
            Instant::now() < deadline,
            "step a never started\n{}",
            tail(&agent.log_text())
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // SIGTERM while step a runs on the agent.
    let port = d.port;
    let status = d.terminate(Duration::from_secs(20))?;
    let log = d.log_text();
    let status = status.with_context(|| format!("rivetd ignored SIGTERM for 20 s:\n{log}"))?;
    ensure!(status.success(), "rivetd exited with {status}:\n{log}");
    ensure!(log.contains("node leases handed back"), "{log}");
    let reserved: Option<String> = rusqlite::Connection::open(&db)?.query_row(
        "SELECT reservation FROM nodes WHERE uuid = ?1",
        [&uuid],
        |r| r.get(0),
    )?;
    ensure!(reserved.is_none(), "lease still held by {reserved:?}");
    ensure!(
        marks() == ["start a"],
        "step a should still be running on the agent: {:?}",
        marks()
    );

    // A new rivetd on the same database and port; the agent, still polling, finishes.
    let d = Rivetd::start(&db, port, &["--config", &cfg])?;
    let node = d
        .wait_node("n1", Duration::from_secs(30), |v| {
            v["provision_state"] == "manageable" || v["provision_state"] == "clean failed"
        })
        .map_err(|e| anyhow::anyhow!("{e}\n{}", tail(&d.log_text())))?;
    ensure!(
        node["provision_state"] == "manageable" && node["last_error"].is_null(),
        "{node}\n{}\n{}",
        tail(&d.log_text()),
        tail(&agent.log_text())
    );
    assert_eq!(
        marks(),
        ["start a", "done a", "start b", "done b"],
        "a step ran twice or was lost"
    );
    eprintln!("sigterm scenario took {:?}", started.elapsed());
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Two controllers under one conductor id.

/// Start rivetd as `id` and expect it to exit non-zero within `within`; its stderr.
fn refused_start(db_url: &str, id: &str, cfg: &str, within: Duration) -> Result<String> {
    let port = rivet_tests::free_port()?;
    let mut child = Command::new(bin("rivetd"))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--db", db_url])
        .args(["--no-auth", "--conductor-id", id, "--config", cfg])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait()? {
            let mut err = String::new();
            use std::io::Read;
            if let Some(mut e) = child.stderr.take() {
                e.read_to_string(&mut err)?;
            }
            ensure!(!status.success(), "refused start exited 0: {err}");
            return Ok(err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("a second rivetd under conductor id {id:?} kept running for {within:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn duplicate_conductor_id_is_refused_while_alive_and_taken_over_when_dead() -> Result<()> {
    let base = std::env::var("RIVET_TEST_POSTGRES").unwrap_or_default();
    if !prerequisite(
        !base.is_empty(),
        "RIVET_TEST_POSTGRES (a PostgreSQL server; scripts/setup-postgres.sh starts one)",
    ) {
        return Ok(());
    }
    let started = Instant::now();
    let db = ScratchDatabase::create(&base, "rivet_faults").context("scratch database")?;
    let dir = tempfile::tempdir()?;
    let key = dir.path().join("secrets.key");
    run(
        &bin("rivetd").display().to_string(),
        &["secrets", "init-key", &key.display().to_string()],
    )?;
    let cfg = dir.path().join("rivetd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[secrets]\nkey_file = {:?}\n\
             [conductor]\ncheck_interval_s = 1\nheartbeat_interval_s = 1\ndead_after_s = 3\n\
             [power_sync]\ninterval_s = 0\n",
            key.display().to_string()
        ),
    )?;
    let cfg = cfg.display().to_string();
    let mut first = Rivetd::start_url(db.url(), dir.path(), "host-a", 0, &["--config", &cfg])?;

    // Same id while the first is alive: refused, naming the id; the first keeps serving.
    let err = refused_start(db.url(), "host-a", &cfg, Duration::from_secs(15))?;
    ensure!(
        err.contains("conductor id \"host-a\" is already registered by a live controller")
            && err.contains("--conductor-id"),
        "{err}"
    );
    ensure!(first.call("GET", "/v1/nodes", None)?.0 == 200);
    // Another id on the same PostgreSQL is welcome.
    let other = Rivetd::start_url(db.url(), dir.path(), "host-b", 0, &["--config", &cfg])?;
    ensure!(other.call("GET", "/v1/nodes", None)?.0 == 200);

    // The first dies without a word; its heartbeat row stays fresh for dead_after_s. A
    // replacement under its id waits for the row to expire, then takes the id over.
    first.kill9();
    let t = Instant::now();
    let again = Rivetd::start_url(db.url(), dir.path(), "host-a", 0, &["--config", &cfg])?;
    let took = t.elapsed();
    ensure!(
        took < Duration::from_secs(10),
        "takeover of a dead id took {took:?}"
    );
    ensure!(again.call("GET", "/v1/nodes", None)?.0 == 200);
    ensure!(
        again.log_text().contains("taking the id over"),
        "{}",
        tail(&again.log_text())
    );

    // A clean stop marks the id offline: the other controller sees it dead at once, and a
    // restart under the id does not wait for the heartbeat to age (dead_after_s = 3 here;
    // the default is 10).
    let mut again = again;
    let status = again.terminate(Duration::from_secs(20))?;
    ensure!(
        status.map(|s| s.success()) == Some(true),
        "SIGTERM: {status:?}\n{}",
        tail(&again.log_text())
    );
    let (code, body) = other.call("GET", "/v1/conductors/host-a", None)?;
    ensure!(
        code == 200 && body["alive"] == json!(false),
        "host-a after a clean stop: {code} {body}"
    );
    // The controllers in `dir` share one log file: look at the restart's part only.
    let seen = again.log_text().len();
    let t = Instant::now();
    let restarted = Rivetd::start_url(db.url(), dir.path(), "host-a", 0, &["--config", &cfg])?;
    let restart = t.elapsed();
    let log = restarted.log_text();
    let log = log.get(seen..).unwrap_or(&log);
    ensure!(
        !log.contains("waiting to see whether it is still alive"),
        "a restart after a clean stop waited for the old heartbeat:\n{}",
        tail(log)
    );
    let (code, body) = other.call("GET", "/v1/conductors/host-a", None)?;
    ensure!(
        code == 200 && body["alive"] == json!(true),
        "host-a after the restart: {code} {body}"
    );
    eprintln!(
        "duplicate id scenario took {:?} (takeover {took:?}, restart after SIGTERM {restart:?})",
        started.elapsed()
    );
    Ok(())
}

/// SQLite: the heartbeat check cannot tell a second process under the same id from the first,
/// so the file lock refuses it; the lock dies with its holder, so a restart after kill -9 is
/// not delayed.
#[test]
fn same_conductor_id_on_sqlite_is_refused_and_restart_is_immediate() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("rivet.db");
    let cfg = dir.path().join("rivetd.toml");
    std::fs::write(&cfg, "[conductor]\ncheck_interval_s = 1\n")?;
    let cfg = cfg.display().to_string();
    let mut first = Rivetd::start(&db, 0, &["--config", &cfg])?;
    let url = format!("sqlite:{}", db.display());
    let err = refused_start(&url, "test-conductor", &cfg, Duration::from_secs(15))?;
    ensure!(
        err.contains("another rivetd already serves SQLite database") && err.contains("PostgreSQL"),
        "{err}"
    );
    ensure!(first.call("GET", "/v1/nodes", None)?.0 == 200);
    first.kill9();
    let t = Instant::now();
    let again = Rivetd::start(&db, 0, &["--config", &cfg])?;
    ensure!(
        t.elapsed() < Duration::from_secs(5),
        "restart after kill -9 took {:?}",
        t.elapsed()
    );
    ensure!(again.call("GET", "/v1/nodes", None)?.0 == 200);
    Ok(())
}
