//! Cleaning end to end: the real rivetd binary, the real rivet-agent binary, real loop
//! devices (root) or sparse files, and a test exec plugin whose steps leave traces on disk.

use anyhow::{ensure, Result};
use rivet_tests::agentproc::{
    all_zero, have, is_root, read_at, write_at, AgentProcess, LoopDevice,
};
use rivet_tests::{prerequisite, Rivetd};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A plugin with two steps: `count_step` (abortable; records start/done lines) and
/// `slow_firmware` (not abortable; leaves a marker when it completes).
const TEST_PLUGIN: &str = r#"#!/bin/sh
set -u
case "${1:-}" in
describe) echo '{"name": "test-steps", "support_level": 1}' ;;
steps) cat <<'JSON'
[{"interface": "deploy", "step": "count_step", "priority": 0, "abortable": true,
  "argsinfo": {"tag": {"description": "line to record", "required": true},
               "seconds": {"description": "how long", "required": false}}},
 {"interface": "deploy", "step": "slow_firmware", "priority": 0, "abortable": false,
  "argsinfo": {"seconds": {"description": "how long", "required": false}}}]
JSON
;;
execute)
  req=$(cat)
  secs=${req#*\"seconds\":}; [ "$secs" = "$req" ] && secs=1; secs=${secs%%[,\}]*}
  tag=${req#*\"tag\":\"}; [ "$tag" = "$req" ] && tag=none; tag=${tag%%\"*}
  case "$req" in
  *'"step":"count_step"'*)
    echo "start $tag" >> "$RIVET_TEST_DIR/count"
    n=$((secs * 10)); i=0
    while [ $i -lt $n ]; do sleep 0.1; i=$((i + 1)); echo "progress $i/$n" >&2; done
    echo "done $tag" >> "$RIVET_TEST_DIR/count"
    echo "{\"tag\": \"$tag\"}" ;;
  *'"step":"slow_firmware"'*)
    sleep "$secs"; touch "$RIVET_TEST_DIR/firmware-done"; echo '{"flashed": true}' ;;
  *) echo "unknown step: $req" >&2; exit 2 ;;
  esac ;;
esac
"#;

struct Scene {
    dir: tempfile::TempDir,
    rivetd: Rivetd,
    uuid: String,
}

impl Scene {
    /// rivetd with quick timings and a fake-hardware node "n1" in manageable.
    fn new(heartbeat_timeout_s: u64) -> Result<Scene> {
        let dir = tempfile::tempdir()?;
        let cfg = dir.path().join("rivetd.toml");
        std::fs::write(
            &cfg,
            format!("[agent]\nlong_poll_s = 2\nheartbeat_timeout_s = {heartbeat_timeout_s}\n[conductor]\ncheck_interval_s = 1\n"),
        )?;
        let cfg_arg = cfg.display().to_string();
        let rivetd = Rivetd::start(&dir.path().join("rivet.db"), 0, &["--config", &cfg_arg])?;
        let (s, v) = rivetd.call(
            "POST",
            "/v1/nodes",
            Some(json!({"driver": "fake-hardware", "deploy_interface": "direct", "name": "n1"})),
        )?;
        ensure!(s == 201, "{v}");
        let uuid = v["uuid"].as_str().unwrap_or_default().to_string();
        rivetd.call(
            "PUT",
            "/v1/nodes/n1/states/provision",
            Some(json!({"target": "manage"})),
        )?;
        rivetd.wait_node("n1", Duration::from_secs(10), |v| {
            v["provision_state"] == "manageable"
        })?;
        let plugins = dir.path().join("plugins");
        std::fs::create_dir(&plugins)?;
        let plugin = plugins.join("test-steps");
        std::fs::write(&plugin, TEST_PLUGIN)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755))?;
        Ok(Scene { dir, rivetd, uuid })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn restart(&mut self) -> Result<()> {
        let cfg = self.path("rivetd.toml").display().to_string();
        let port = self.rivetd.port;
        self.rivetd.kill9();
        std::thread::sleep(Duration::from_millis(1500));
        self.rivetd = Rivetd::start(&self.path("rivet.db"), port, &["--config", &cfg])?;
        Ok(())
    }

    fn agent(&self, devices: &[&Path]) -> Result<AgentProcess> {
        let dir = self.dir.path().display().to_string();
        AgentProcess::start(
            &self.rivetd.url,
            &self.uuid,
            devices,
            Some(&self.path("plugins")),
            &self.path("agent.log"),
            &[("RIVET_TEST_DIR", dir.as_str())],
        )
    }

    fn provision(&self, body: Value) -> Result<(u16, Value)> {
        self.rivetd
            .call("PUT", "/v1/nodes/n1/states/provision", Some(body))
    }

    fn wait(&self, what: &str, secs: u64, pred: impl Fn(&Value) -> bool) -> Result<Value> {
        self.rivetd
            .wait_node("n1", Duration::from_secs(secs), pred)
            .map_err(|e| {
                anyhow::anyhow!(
                    "{what}: {e}\n--- rivetd log ---\n{}\n--- agent log ---\n{}",
                    tail(&self.rivetd.log_text()),
                    tail(&std::fs::read_to_string(self.path("agent.log")).unwrap_or_default())
                )
            })
    }

    fn state(&self, s: &'static str, secs: u64) -> Result<Value> {
        self.wait(s, secs, move |v| v["provision_state"] == s)
    }

    fn count_lines(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("count"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Results of the agent commands for a step, straight from the store.
    fn step_results(&self, step: &str) -> Result<Vec<Value>> {
        let c = rusqlite::Connection::open(self.path("rivet.db"))?;
        let mut stmt = c.prepare("SELECT command, result FROM agent_commands ORDER BY seq")?;
        let rows = stmt.query_map([], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (cmd, res) = row?;
            let cmd: Value = serde_json::from_str(&cmd)?;
            if cmd["params"]["step"] == step {
                out.push(
                    res.map(|r| serde_json::from_str(&r))
                        .transpose()?
                        .unwrap_or(Value::Null),
                );
            }
        }
        Ok(out)
    }
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

fn sparse(path: &Path, size: u64) -> Result<()> {
    std::fs::File::create(path)?.set_len(size)?;
    Ok(())
}

fn run(cmd: &str, args: &[&str]) -> Result<()> {
    let out = Command::new(cmd).args(args).output()?;
    ensure!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The error's human message (Ironic nests it as a JSON string): the protocol's own decoder.
fn message(v: &Value) -> String {
    serde_json::from_value::<rivet_protocol::api::ErrorBody>(v.clone())
        .map(|b| b.message())
        .unwrap_or_default()
}

#[test]
fn automated_cleaning_erases_loop_devices_and_refuses_power_actions() -> Result<()> {
    if !prerequisite(
        is_root() && have("losetup") && have("sgdisk") && have("mkfs.ext4"),
        "root with losetup, sgdisk and mkfs.ext4",
    ) {
        return Ok(());
    }
    let scene = Scene::new(60)?;
    let (f0, f1) = (scene.path("disk0.img"), scene.path("disk1.img"));
    sparse(&f0, 64 << 20)?;
    sparse(&f1, 64 << 20)?;
    run(
        "sgdisk",
        &[
            "-n",
            "1:2048:+16M",
            "-n",
            "2:0:0",
            f0.to_str().unwrap_or_default(),
        ],
    )?;
    run("mkfs.ext4", &["-q", "-F", f1.to_str().unwrap_or_default()])?;
    write_at(&f0, 40 << 20, b"RIVET-DATA-PATTERN")?;
    let l0 = LoopDevice::attach(&f0)?;
    let l1 = LoopDevice::attach(&f1)?;

    let (s, v) = scene.provision(json!({"target": "provide"}))?;
    ensure!(s == 202, "{v}");
    scene.state("clean wait", 10)?;
    // Power actions are refused while cleaning, naming the state.
    let (s, v) = scene.rivetd.call(
        "PUT",
        "/v1/nodes/n1/states/power",
        Some(json!({"target": "power off"})),
    )?;
    assert_eq!(s, 400, "{v}");
    assert!(message(&v).contains("clean wait"), "{v}");

    let _agent = scene.agent(&[&l0.path, &l1.path])?;
    let node = scene.state("available", 120)?;
    assert!(node["last_error"].is_null(), "{node}");
    assert!(node["reservation"].is_null(), "{node}");
    assert_eq!(node["power_state"], "power off");
    assert_eq!(node["clean_step"], json!({}));

    assert!(
        all_zero(&l0.path)?,
        "disk0 not all zero after erase_devices"
    );
    assert!(
        all_zero(&l1.path)?,
        "disk1 not all zero after erase_devices"
    );
    for dev in [&l0.path, &l1.path] {
        let out = Command::new("blkid").arg("-p").arg(dev).output()?;
        assert!(
            out.stdout.is_empty(),
            "blkid still finds {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }

    let (s, steps) = scene.rivetd.call("GET", "/v1/nodes/n1/clean_steps", None)?;
    assert_eq!(s, 200, "{steps}");
    assert!(steps["updated_at"].is_string());
    let find = |name: &str| {
        steps["clean_steps"]
            .as_array()
            .and_then(|a| a.iter().find(|s| s["step"] == name).cloned())
    };
    let meta = find("erase_devices_metadata").expect("metadata step cached");
    assert_eq!(
        (meta["priority"].as_i64(), meta["source"].as_str()),
        (Some(99), Some("agent"))
    );
    assert_eq!(find("erase_devices").expect("erase cached")["priority"], 10);
    assert_eq!(
        find("count_step").expect("plugin step cached")["priority"],
        0
    );
    Ok(())
}

#[test]
fn manual_cleaning_validates_before_running_and_passes_args() -> Result<()> {
    let scene = Scene::new(60)?;
    let disk = scene.path("disk0.img");
    sparse(&disk, 32 << 20)?;

    // An empty manual clean only gathers and caches the steps.
    let (s, v) = scene.provision(json!({"target": "clean", "clean_steps": []}))?;
    ensure!(s == 202, "{v}");
    scene.state("clean wait", 10)?;
    let mut agent = scene.agent(&[&disk])?;
    let node = scene.state("manageable", 60)?;
    assert!(node["last_error"].is_null(), "{node}");
    agent.kill9();
    let (s, steps) = scene.rivetd.call("GET", "/v1/nodes/n1/clean_steps", None)?;
    assert_eq!(s, 200, "{steps}");
    assert!(steps.to_string().contains("count_step"), "{steps}");

    // Unknown step and missing required argument: 400 before anything runs.
    let before = scene.rivetd.node("n1")?;
    let (s, v) = scene.provision(json!({"target": "clean", "clean_steps": [{"interface": "deploy", "step": "paint_it_blue"}]}))?;
    assert_eq!(s, 400, "{v}");
    assert!(message(&v).contains("paint_it_blue"), "{v}");
    let (s, v) = scene.provision(json!({"target": "clean", "clean_steps": [{"interface": "deploy", "step": "count_step", "args": {}}]}))?;
    assert_eq!(s, 400, "{v}");
    assert!(message(&v).contains("tag"), "{v}");
    let (s, v) = scene.provision(json!({"target": "clean", "clean_steps": [{"interface": "deploy", "step": "count_step", "colour": 1}]}))?;
    assert_eq!(s, 400, "{v}");
    assert_eq!(
        scene.rivetd.node("n1")?,
        before,
        "a refused clean request changed the node"
    );
    assert!(
        scene.count_lines().is_empty(),
        "a step ran: {:?}",
        scene.count_lines()
    );

    // A real manual clean with args, in the operator's order.
    let (s, v) = scene.provision(json!({"target": "clean", "clean_steps": [
        {"interface": "deploy", "step": "count_step", "args": {"tag": "alpha", "seconds": 1}},
        {"interface": "deploy", "step": "erase_devices_metadata", "args": {}},
        {"interface": "deploy", "step": "count_step", "args": {"tag": "omega", "seconds": 1}}
    ]}))?;
    ensure!(s == 202, "{v}");
    scene.state("clean wait", 10)?;
    let _agent = scene.agent(&[&disk])?;
    let node = scene.state("manageable", 60)?;
    assert!(node["last_error"].is_null(), "{node}");
    assert_eq!(
        scene.count_lines(),
        ["start alpha", "done alpha", "start omega", "done omega"]
    );
    let results = scene.step_results("count_step")?;
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["result"]["tag"], "alpha");
    Ok(())
}

#[test]
fn abort_during_erase_stops_the_erase() -> Result<()> {
    let scene = Scene::new(60)?;
    let disk = scene.path("big.img");
    let size: u64 = 8 << 30;
    sparse(&disk, size)?;
    write_at(&disk, size - 4096, b"END-OF-DISK-PATTERN")?;
    let (s, v) = scene.provision(json!({"target": "clean", "clean_steps": [
        {"interface": "deploy", "step": "erase_devices", "args": {"random_passes": 1}}]}))?;
    ensure!(s == 202, "{v}");
    scene.state("clean wait", 10)?;
    let _agent = scene.agent(&[&disk])?;
    scene.wait("erase running with progress", 60, |v| {
        v["clean_step"]["step"] == "erase_devices"
            && v["clean_step"]["progress"]["done"].as_u64().unwrap_or(0) > 0
    })?;
    let (s, v) = scene.provision(json!({"target": "abort"}))?;
    assert_eq!(s, 202, "{v}");
    let node = scene.state("clean failed", 5)?;
    let err = node["last_error"].as_str().unwrap_or_default();
    assert!(
        err.contains("aborted") && err.contains("erase_devices"),
        "{err}"
    );
    // The agent stops the erase: its result comes back ABORTED, and the end of the disk was
    // never reached.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = scene.step_results("erase_devices")?;
        if r.first().map(|r| r["status"] == "ABORTED").unwrap_or(false) {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "erase not reported aborted: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        read_at(&disk, size - 4096, 19)?,
        b"END-OF-DISK-PATTERN",
        "erase ran to the end"
    );
    Ok(())
}

#[test]
fn abort_during_non_abortable_step_waits_for_it() -> Result<()> {
    let scene = Scene::new(60)?;
    let disk = scene.path("disk0.img");
    sparse(&disk, 16 << 20)?;
    let (s, v) = scene.provision(json!({"target": "clean", "clean_steps": [
        {"interface": "deploy", "step": "slow_firmware", "args": {"seconds": 3}},
        {"interface": "deploy", "step": "count_step", "args": {"tag": "never"}}]}))?;
    ensure!(s == 202, "{v}");
    scene.state("clean wait", 10)?;
    let _agent = scene.agent(&[&disk])?;
    scene.wait("firmware step running", 30, |v| {
        v["clean_step"]["step"] == "slow_firmware"
    })?;
    // The seed's spelling of abort refuses outright while the running step cannot be
    // interrupted (403 naming it), and changes nothing.
    let before = scene.rivetd.node("n1")?;
    let (s, v) = scene
        .rivetd
        .call("DELETE", "/v1/nodes/n1/provision", None)?;
    assert_eq!(s, 403, "{v}");
    assert!(message(&v).contains("slow_firmware"), "{v}");
    let after = scene.rivetd.node("n1")?;
    assert_eq!(
        after["clean_step"]["abort_after"],
        before["clean_step"]["abort_after"]
    );
    assert_eq!(after["provision_state"], "clean wait", "{after}");
    let (s, v) = scene.provision(json!({"target": "abort"}))?;
    assert_eq!(s, 202, "{v}");
    let node = scene.rivetd.node("n1")?;
    assert_eq!(node["provision_state"], "clean wait", "{node}");
    assert_eq!(node["clean_step"]["abort_after"], true, "{node}");
    assert!(
        !scene.path("firmware-done").exists(),
        "step should still be running"
    );
    let node = scene.state("clean failed", 30)?;
    assert!(
        scene.path("firmware-done").exists(),
        "the non-abortable step was interrupted"
    );
    let err = node["last_error"].as_str().unwrap_or_default();
    assert!(
        err.contains("aborted") && err.contains("slow_firmware") && err.contains("not abortable"),
        "{err}"
    );
    assert!(
        scene.count_lines().is_empty(),
        "the next step ran after the abort"
    );
    Ok(())
}

#[test]
fn agent_killed_mid_step_fails_on_heartbeat_timeout() -> Result<()> {
    let scene = Scene::new(6)?;
    let disk = scene.path("disk0.img");
    sparse(&disk, 16 << 20)?;
    let (s, v) = scene.provision(json!({"target": "clean", "clean_steps": [
        {"interface": "deploy", "step": "count_step", "args": {"tag": "long", "seconds": 60}}]}))?;
    ensure!(s == 202, "{v}");
    scene.state("clean wait", 10)?;
    let mut agent = scene.agent(&[&disk])?;
    scene.wait("step running", 30, |v| {
        v["clean_step"]["step"] == "count_step"
    })?;
    let killed = Instant::now();
    agent.kill9();
    let node = scene.state("clean failed", 20)?;
    let err = node["last_error"].as_str().unwrap_or_default();
    assert!(
        err.contains("no heartbeat") && err.contains("count_step"),
        "{err}"
    );
    assert!(
        killed.elapsed() < Duration::from_secs(15),
        "took {:?}",
        killed.elapsed()
    );
    Ok(())
}

#[test]
fn controller_killed_mid_cleaning_resumes_and_runs_nothing_twice() -> Result<()> {
    let mut scene = Scene::new(60)?;
    let disk = scene.path("disk0.img");
    sparse(&disk, 16 << 20)?;
    let (s, v) = scene.provision(json!({"target": "clean", "clean_steps": [
        {"interface": "deploy", "step": "count_step", "args": {"tag": "a", "seconds": 3}},
        {"interface": "deploy", "step": "count_step", "args": {"tag": "b", "seconds": 1}}]}))?;
    ensure!(s == 202, "{v}");
    scene.state("clean wait", 10)?;
    let _agent = scene.agent(&[&disk])?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !scene.count_lines().contains(&"start a".to_string()) {
        ensure!(Instant::now() < deadline, "step a never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    scene.restart()?;
    let node = scene.state("manageable", 60)?;
    assert!(node["last_error"].is_null(), "{node}");
    assert_eq!(
        scene.count_lines(),
        ["start a", "done a", "start b", "done b"],
        "a step ran twice or was lost"
    );
    Ok(())
}
