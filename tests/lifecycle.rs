//! Rescue, unrescue, adopt, servicing and hold end to end: the real rivetd, the real
//! rivet-agent binary (a "ramdisk" on this machine, restricted to a sparse file with
//! `--devices`), the stock `baremetal` client where it has the command, and `rivet`.
//!
//! Each flow is checked for its work, not just its state: the rescue password's SHA-512 crypt
//! hash in the agent's rescue root (verified against the password with `openssl passwd -6`),
//! the plaintext nowhere in rivetd's database, log or API output; the instance booted from its
//! disk after unrescue and servicing; no power change on adopt; an in-band service step's
//! marker file written by the agent's plugin.

use anyhow::{ensure, Context, Result};
use rivet_tests::agentproc::have;
use rivet_tests::{bin, clients, prerequisite, Rivetd};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// An in-band step for servicing: `mark_step` writes a marker into RIVET_TEST_DIR.
const TEST_PLUGIN: &str = r#"#!/bin/sh
set -u
case "${1:-}" in
describe) echo '{"name": "lifecycle-steps", "support_level": 1}' ;;
steps) echo '[{"interface": "deploy", "step": "mark_step", "priority": 0, "abortable": true, "argsinfo": {"tag": {"description": "marker text", "required": false}}}]' ;;
execute)
  req=$(cat)
  tag=${req#*\"tag\":\"}; [ "$tag" = "$req" ] && tag=none; tag=${tag%%\"*}
  echo "$tag" >> "$RIVET_TEST_DIR/marker"
  echo '{"marked": true}' ;;
esac
"#;

/// A `rivet-agent run` child, killed on drop.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Scene {
    dir: tempfile::TempDir,
    rivetd: Rivetd,
}

impl Scene {
    fn new(extra_conductor: &str) -> Result<Scene> {
        let dir = tempfile::tempdir()?;
        let cfg = format!(
            "[agent]\nlong_poll_s = 2\n[conductor]\ncheck_interval_s = 1\n{extra_conductor}"
        );
        let rivetd = Rivetd::start_in(dir.path(), &cfg)?;
        let plugins = dir.path().join("plugins");
        std::fs::create_dir(&plugins)?;
        let plugin = plugins.join("lifecycle-steps");
        std::fs::write(&plugin, TEST_PLUGIN)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755))?;
        std::fs::File::create(dir.path().join("disk0.img"))?.set_len(64 << 20)?;
        Ok(Scene { dir, rivetd })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A fake-hardware node (fake deploy, agent rescue) in `manageable`.
    fn node(&self, name: &str, driver_info: Value) -> Result<String> {
        let (s, v) = self.rivetd.call(
            "POST",
            "/v1/nodes",
            Some(json!({"driver": "fake-hardware", "name": name,
                        "rescue_interface": "agent", "driver_info": driver_info})),
        )?;
        ensure!(s == 201, "{v}");
        self.verb(name, json!({"target": "manage"}))?;
        self.state(name, "manageable", 20)?;
        Ok(v["uuid"].as_str().unwrap_or_default().to_string())
    }

    /// The node deployed (fake deploy interface: nothing written) and `active`.
    fn active_node(&self, name: &str, driver_info: Value) -> Result<String> {
        let uuid = self.node(name, driver_info)?;
        self.verb(name, json!({"target": "provide"}))?;
        self.state(name, "available", 30)?;
        self.set_image(name)?;
        self.verb(name, json!({"target": "active"}))?;
        self.state(name, "active", 30)?;
        Ok(uuid)
    }

    fn set_image(&self, name: &str) -> Result<()> {
        let (s, v) = self.rivetd.call(
            "PATCH",
            &format!("/v1/nodes/{name}"),
            Some(json!([{"op": "add", "path": "/instance_info/image_source",
                          "value": "http://images.example/running.img"}])),
        )?;
        ensure!(s == 200, "{v}");
        Ok(())
    }

    fn call_verb(&self, name: &str, body: Value) -> Result<(u16, Value)> {
        self.rivetd.call(
            "PUT",
            &format!("/v1/nodes/{name}/states/provision"),
            Some(body),
        )
    }

    fn verb(&self, name: &str, body: Value) -> Result<()> {
        let (s, v) = self.call_verb(name, body.clone())?;
        ensure!(s == 202, "{body}: {s} {v}");
        Ok(())
    }

    fn state(&self, name: &str, want: &'static str, secs: u64) -> Result<Value> {
        self.rivetd
            .wait_node(name, Duration::from_secs(secs), move |v| {
                v["provision_state"] == want
            })
            .map_err(|e| {
                anyhow::anyhow!(
                    "{want}: {e}\n--- rivetd log ---\n{}\n--- agent log ---\n{}",
                    tail(&self.rivetd.log_text()),
                    tail(&std::fs::read_to_string(self.path("agent.log")).unwrap_or_default())
                )
            })
    }

    /// Start the agent binary for `uuid`, with `--rescue-root` when given.
    fn agent(&self, uuid: &str, rescue_root: Option<&Path>) -> Result<Agent> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("agent.log"))?;
        let mut cmd = Command::new(bin("rivet-agent"));
        cmd.args(["run", "--controller", &self.rivetd.url, "--node", uuid])
            .arg("--devices")
            .arg(self.path("disk0.img"))
            .arg("--plugin-dir")
            .arg(self.path("plugins"))
            .env("RIVET_LOG", "info")
            .env("RIVET_TEST_DIR", self.dir.path())
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(r) = rescue_root {
            cmd.arg("--rescue-root").arg(r);
        }
        Ok(Agent(cmd.spawn().context("spawning rivet-agent")?))
    }

    fn boot_device(&self, name: &str) -> Result<Value> {
        let (s, v) = self.rivetd.call(
            "GET",
            &format!("/v1/nodes/{name}/management/boot_device"),
            None,
        )?;
        ensure!(s == 200, "{v}");
        Ok(v)
    }
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// `PUT path` at one API version.
fn put_at_version(d: &Rivetd, path: &str, version: &str, body: Value) -> Result<(u16, Value)> {
    let resp = reqwest::blocking::Client::new()
        .put(format!("{}{path}", d.url))
        .header("X-OpenStack-Ironic-API-Version", version)
        .json(&body)
        .send()?;
    let status = resp.status().as_u16();
    let text = resp.text()?;
    Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

fn message(v: &Value) -> String {
    serde_json::from_value::<rivet_protocol::api::ErrorBody>(v.clone())
        .map(|b| b.message())
        .unwrap_or_default()
}

/// Every byte of rivetd's state directory (database, WAL) and its log, as text.
fn everything_rivetd_kept(sc: &Scene) -> Result<String> {
    let mut all = sc.rivetd.log_text();
    for e in std::fs::read_dir(sc.dir.path())? {
        let p = e?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.starts_with("rivet") && p.is_file() {
            all.push_str(&String::from_utf8_lossy(&std::fs::read(&p)?));
        }
    }
    Ok(all)
}

#[test]
fn rescue_writes_the_password_hash_and_unrescue_boots_the_instance() -> Result<()> {
    if !prerequisite(have("openssl"), "openssl (verifies the SHA-512 crypt hash)") {
        return Ok(());
    }
    let sc = Scene::new("")?;
    let uuid = sc.active_node("r1", json!({}))?;
    let root = sc.path("rescue-root");
    let _agent = sc.agent(&uuid, Some(&root))?;
    let password = "Corr3ct-horse-battery";
    sc.verb(
        "r1",
        json!({"target": "rescue", "rescue_password": password}),
    )?;
    let rescued = sc.state("r1", "rescue", 60)?;
    assert!(rescued["last_error"].is_null(), "{rescued}");
    // The ramdisk was booted through the boot interface: a one-time network boot.
    let dev = sc.boot_device("r1")?;
    assert_eq!(dev["boot_device"], "pxe", "{dev}");
    let shadow = std::fs::read_to_string(root.join("etc/shadow"))?;
    let line = shadow
        .lines()
        .find(|l| l.starts_with("rescue:"))
        .with_context(|| format!("no rescue user in {shadow}"))?;
    let hash = line.split(':').nth(1).unwrap_or_default();
    assert!(hash.starts_with("$6$"), "{line}");
    let salt = hash.split('$').nth(2).unwrap_or_default();
    let out = Command::new("openssl")
        .args(["passwd", "-6", "-salt", salt, password])
        .output()?;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        hash,
        "the hash does not verify against the password"
    );
    let wrong = Command::new("openssl")
        .args(["passwd", "-6", "-salt", salt, "not-the-password"])
        .output()?;
    assert_ne!(String::from_utf8_lossy(&wrong.stdout).trim(), hash);
    let passwd = std::fs::read_to_string(root.join("etc/passwd"))?;
    assert!(
        passwd.lines().any(|l| l.starts_with("rescue:x:")),
        "{passwd}"
    );
    // The plaintext is nowhere: not in the API, not in the database, not in the log.
    assert!(!rescued.to_string().contains(password), "{rescued}");
    assert!(
        !everything_rivetd_kept(&sc)?.contains(password),
        "the rescue password was stored or logged by rivetd"
    );

    // Unrescue: the instance boots from its disk again.
    sc.verb("r1", json!({"target": "unrescue"}))?;
    let active = sc.state("r1", "active", 30)?;
    assert!(active["last_error"].is_null(), "{active}");
    assert_eq!(active["power_state"], "power on", "{active}");
    assert!(
        active["instance_info"]
            .get("hashed_rescue_password")
            .is_none(),
        "{active}"
    );
    let dev = sc.boot_device("r1")?;
    assert_eq!(dev["boot_device"], "disk", "{dev}");
    Ok(())
}

#[test]
fn rescue_failures_timeout_and_abort() -> Result<()> {
    let sc = Scene::new("rescue_wait_timeout_s = 6\n")?;
    let uuid = sc.active_node("r2", json!({}))?;
    // Rescue is refused without a password, and an unknown verb argument is refused.
    let (s, v) = sc.call_verb("r2", json!({"target": "rescue"}))?;
    assert_eq!(s, 400, "{v}");
    let (s, v) = sc.call_verb("r2", json!({"target": "rescue", "rescue_password": ""}))?;
    assert_eq!(s, 400, "{v}");

    // No ramdisk ever calls back: the wait times out.
    sc.verb("r2", json!({"target": "rescue", "rescue_password": "pw1"}))?;
    sc.state("r2", "rescue wait", 20)?;
    let failed = sc.state("r2", "rescue failed", 30)?;
    let err = failed["last_error"].as_str().unwrap_or_default();
    assert!(err.contains("timeout"), "{failed}");

    // A local agent without --rescue-root refuses to touch this machine's accounts.
    let agent = sc.agent(&uuid, None)?;
    sc.verb("r2", json!({"target": "rescue", "rescue_password": "pw2"}))?;
    let failed = sc.state("r2", "rescue failed", 60)?;
    let err = failed["last_error"].as_str().unwrap_or_default();
    assert!(err.contains("rescue-root"), "{failed}");
    drop(agent);

    // Abort while waiting for the ramdisk.
    sc.verb("r2", json!({"target": "rescue", "rescue_password": "pw3"}))?;
    sc.state("r2", "rescue wait", 20)?;
    sc.verb("r2", json!({"target": "abort"}))?;
    let aborted = sc.state("r2", "rescue failed", 10)?;
    let err = aborted["last_error"].as_str().unwrap_or_default();
    assert!(err.contains("aborted"), "{aborted}");
    assert!(
        aborted["instance_info"]
            .get("hashed_rescue_password")
            .is_none(),
        "{aborted}"
    );
    // Unrescue with a BMC that does not answer: unrescue failed, with the reason; fixed,
    // unrescue goes back to active.
    let patch = |ops: Value| -> Result<()> {
        let (s, v) = sc.rivetd.call("PATCH", "/v1/nodes/r2", Some(ops))?;
        ensure!(s == 200, "{v}");
        Ok(())
    };
    patch(json!([{"op": "add", "path": "/driver_info/fake_fail", "value": "BMC gone"}]))?;
    sc.verb("r2", json!({"target": "unrescue"}))?;
    let failed = sc.state("r2", "unrescue failed", 30)?;
    let err = failed["last_error"].as_str().unwrap_or_default();
    assert!(
        err.contains("unrescue") && err.contains("BMC gone"),
        "{failed}"
    );
    patch(json!([{"op": "remove", "path": "/driver_info/fake_fail"}]))?;
    sc.verb("r2", json!({"target": "unrescue"}))?;
    let active = sc.state("r2", "active", 30)?;
    assert_eq!(active["power_state"], "power on", "{active}");
    Ok(())
}

#[test]
fn adopt_leaves_power_alone_and_fails_clearly() -> Result<()> {
    let sc = Scene::new("")?;
    sc.node("a1", json!({}))?;
    // Powered off on purpose: adoption must not switch it on.
    let (s, v) = sc.rivetd.call(
        "PUT",
        "/v1/nodes/a1/states/power",
        Some(json!({"target": "power off"})),
    )?;
    ensure!(s == 202, "{v}");
    sc.rivetd.wait_node("a1", Duration::from_secs(10), |v| {
        v["power_state"] == "power off" && v["target_power_state"].is_null()
    })?;
    // No image information: 400, nothing changes.
    let (s, v) = sc.call_verb("a1", json!({"target": "adopt"}))?;
    assert_eq!(s, 400, "{v}");
    assert!(message(&v).contains("image_source"), "{v}");
    assert_eq!(sc.rivetd.node("a1")?["provision_state"], "manageable");

    sc.set_image("a1")?;
    sc.verb("a1", json!({"target": "adopt"}))?;
    let active = sc.state("a1", "active", 20)?;
    assert_eq!(active["power_state"], "power off", "{active}");
    assert!(active["last_error"].is_null(), "{active}");

    // A BMC that does not answer: adopt failed, with the reason.
    sc.node("a2", json!({}))?;
    sc.set_image("a2")?;
    let (s, v) = sc.rivetd.call(
        "PATCH",
        "/v1/nodes/a2",
        Some(json!([{"op": "add", "path": "/driver_info/fake_fail", "value": "BMC unreachable"}])),
    )?;
    ensure!(s == 200, "{v}");
    sc.verb("a2", json!({"target": "adopt"}))?;
    let failed = sc.state("a2", "adopt failed", 20)?;
    let err = failed["last_error"].as_str().unwrap_or_default();
    assert!(
        err.contains("adoption") && err.contains("BMC unreachable"),
        "{failed}"
    );
    Ok(())
}

#[test]
fn servicing_out_of_band_in_band_and_hold() -> Result<()> {
    let sc = Scene::new("")?;
    let bios = json!({"fake_steps": [
        {"interface": "bios", "step": "apply_configuration", "priority": 0, "sleep_ms": 1500}
    ]});
    let uuid = sc.active_node("s1", bios)?;

    // Refused before anything changes.
    for (body, what) in [
        (json!({"target": "service"}), "service_steps"),
        (
            json!({"target": "service", "service_steps": [{"interface": "deploy", "step": "erase_devices"}]}),
            "erase_instance_disk",
        ),
        (
            json!({"target": "service", "disable_ramdisk": true,
                   "service_steps": [{"interface": "deploy", "step": "mark_step"}]}),
            "disable_ramdisk",
        ),
    ] {
        let (s, v) = sc.call_verb("s1", body.clone())?;
        assert_eq!(s, 400, "{body}: {v}");
        assert!(message(&v).contains(what), "{body}: {v}");
        assert_eq!(sc.rivetd.node("s1")?["provision_state"], "active");
    }

    // Out-of-band only, without the ramdisk: the BIOS step runs (shown as service_step).
    sc.verb(
        "s1",
        json!({"target": "service", "disable_ramdisk": true,
               "service_steps": [{"interface": "bios", "step": "apply_configuration",
                                  "args": {"settings": [{"name": "ProcTurboMode", "value": "Disabled"}]}}]}),
    )?;
    let running = sc.rivetd.wait_node("s1", Duration::from_secs(10), |v| {
        v["service_step"]["step"] == "apply_configuration"
    })?;
    assert_eq!(running["provision_state"], "servicing", "{running}");
    let done = sc.state("s1", "active", 20)?;
    assert!(done["last_error"].is_null(), "{done}");
    assert_eq!(done["service_step"], json!({}), "{done}");

    // In-band: the ramdisk boots, the agent's plugin step runs, the instance boots again.
    let _agent = sc.agent(&uuid, None)?;
    sc.verb(
        "s1",
        json!({"target": "service",
               "service_steps": [{"interface": "deploy", "step": "mark_step", "args": {"tag": "serviced"}}]}),
    )?;
    let done = sc.state("s1", "active", 60)?;
    assert!(done["last_error"].is_null(), "{done}");
    let marker = std::fs::read_to_string(sc.path("marker")).unwrap_or_default();
    assert_eq!(marker.trim(), "serviced", "the in-band step did not run");
    assert_eq!(done["power_state"], "power on", "{done}");
    assert_eq!(sc.boot_device("s1")?["boot_device"], "disk");

    // Hold: service hold, unhold goes on with the next step.
    sc.verb(
        "s1",
        json!({"target": "service", "service_steps": [
            {"interface": "deploy", "step": "hold"},
            {"interface": "bios", "step": "apply_configuration"}]}),
    )?;
    sc.state("s1", "service hold", 20)?;
    sc.verb("s1", json!({"target": "unhold"}))?;
    sc.state("s1", "active", 20)?;

    // Abort from hold: service failed; abort again: back to active.
    sc.verb(
        "s1",
        json!({"target": "service", "service_steps": [{"interface": "deploy", "step": "hold"}]}),
    )?;
    sc.state("s1", "service hold", 20)?;
    sc.verb("s1", json!({"target": "abort"}))?;
    let failed = sc.state("s1", "service failed", 10)?;
    assert!(
        failed["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("service operation was aborted"),
        "{failed}"
    );
    sc.verb("s1", json!({"target": "abort"}))?;
    sc.state("s1", "active", 10)?;

    // A failing out-of-band step: service failed, then `service` again is allowed.
    sc.verb(
        "s1",
        json!({"target": "service", "service_steps": [{"interface": "bios", "step": "no_such_step"}]}),
    )?;
    let failed = sc.state("s1", "service failed", 60)?;
    assert!(
        failed["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("no_such_step"),
        "{failed}"
    );
    sc.verb(
        "s1",
        json!({"target": "service", "disable_ramdisk": true,
               "service_steps": [{"interface": "bios", "step": "apply_configuration"}]}),
    )?;
    sc.state("s1", "active", 20)?;
    Ok(())
}

#[test]
fn hold_and_unhold_in_manual_cleaning_and_abort_from_hold() -> Result<()> {
    let sc = Scene::new("")?;
    sc.node(
        "c1",
        json!({"fake_steps": [
            {"interface": "bios", "step": "apply_configuration", "priority": 0, "sleep_ms": 1500}]}),
    )?;
    let hold = json!({"target": "clean", "clean_steps": [
        {"interface": "deploy", "step": "hold"},
        {"interface": "bios", "step": "apply_configuration"}]});
    sc.verb("c1", hold.clone())?;
    let held = sc.state("c1", "clean hold", 20)?;
    assert_eq!(held["target_provision_state"], "manageable", "{held}");
    sc.verb("c1", json!({"target": "unhold"}))?;
    // The step after the hold runs (shown as clean_step), then manual cleaning ends.
    let running = sc.rivetd.wait_node("c1", Duration::from_secs(10), |v| {
        v["clean_step"]["step"] == "apply_configuration"
    })?;
    assert_eq!(running["provision_state"], "cleaning", "{running}");
    let done = sc.state("c1", "manageable", 20)?;
    assert!(done["last_error"].is_null(), "{done}");
    sc.verb("c1", hold)?;
    sc.state("c1", "clean hold", 20)?;
    sc.verb("c1", json!({"target": "abort"}))?;
    let failed = sc.state("c1", "clean failed", 10)?;
    assert!(
        failed["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("aborted"),
        "{failed}"
    );
    sc.verb("c1", json!({"target": "manage"}))?;
    sc.state("c1", "manageable", 10)?;

    // disable_ramdisk (1.70): out-of-band steps only; an in-band step is a 400 (on a node
    // whose deploy interface has the agent's steps at all).
    let (s, v) = sc.rivetd.call(
        "POST",
        "/v1/nodes",
        Some(json!({"driver": "fake-hardware", "deploy_interface": "direct", "name": "c2",
                    "properties": {"capabilities": "boot_mode:bios"},
                    "driver_info": {"fake_steps": [
                        {"interface": "bios", "step": "apply_configuration", "priority": 0, "sleep_ms": 1500}]}})),
    )?;
    ensure!(s == 201, "{v}");
    sc.verb("c2", json!({"target": "manage"}))?;
    sc.state("c2", "manageable", 20)?;
    let (s, v) = sc.call_verb(
        "c2",
        json!({"target": "clean", "disable_ramdisk": true,
               "clean_steps": [{"interface": "deploy", "step": "erase_devices_metadata"}]}),
    )?;
    assert_eq!(s, 400, "{v}");
    assert!(message(&v).contains("disable_ramdisk"), "{v}");
    assert_eq!(sc.rivetd.node("c2")?["provision_state"], "manageable");
    // Below 1.70 the field is refused.
    let (s, v) = put_at_version(
        &sc.rivetd,
        "/v1/nodes/c2/states/provision",
        "1.69",
        json!({"target": "clean", "disable_ramdisk": true,
               "clean_steps": [{"interface": "bios", "step": "apply_configuration"}]}),
    )?;
    assert_eq!(s, 400, "{v}");
    // No agent runs for c2: an out-of-band clean that booted the ramdisk would sit in
    // clean wait; it runs the step and ends instead.
    sc.verb(
        "c2",
        json!({"target": "clean", "disable_ramdisk": true,
               "clean_steps": [{"interface": "bios", "step": "apply_configuration"}]}),
    )?;
    let running = sc.rivetd.wait_node("c2", Duration::from_secs(10), |v| {
        v["clean_step"]["step"] == "apply_configuration"
    })?;
    assert_eq!(running["provision_state"], "cleaning", "{running}");
    let done = sc.state("c2", "manageable", 20)?;
    assert!(done["last_error"].is_null(), "{done}");
    Ok(())
}

#[test]
fn stock_client_and_rivet_cli_drive_the_lifecycle() -> Result<()> {
    if !clients::available() || !prerequisite(have("openssl"), "openssl") {
        return Ok(());
    }
    let sc = Scene::new("")?;
    let uuid = sc.active_node(
        "k1",
        json!({"fake_steps": [
        {"interface": "bios", "step": "apply_configuration", "priority": 0}]}),
    )?;
    let root = sc.path("rescue-root");
    let _agent = sc.agent(&uuid, Some(&root))?;
    let api = ["--os-baremetal-api-version", "1.87"];
    let with = |args: &[&str]| -> Vec<String> {
        api.iter()
            .chain(args.iter())
            .map(|s| s.to_string())
            .collect()
    };
    let run = |args: Vec<String>| -> Result<String> {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        clients::baremetal(&sc.rivetd, &a)
    };
    run(with(&[
        "node",
        "rescue",
        "k1",
        "--rescue-password",
        "st0ck-client",
    ]))?;
    sc.state("k1", "rescue", 60)?;
    let shadow = std::fs::read_to_string(root.join("etc/shadow"))?;
    assert!(shadow.contains("rescue:$6$"), "{shadow}");
    run(with(&["node", "unrescue", "k1"]))?;
    sc.state("k1", "active", 30)?;
    run(with(&[
        "node",
        "service",
        "k1",
        "--service-steps",
        r#"[{"interface": "deploy", "step": "hold"}, {"interface": "bios", "step": "apply_configuration"}]"#,
    ]))?;
    sc.state("k1", "service hold", 20)?;
    let shown = clients::baremetal_json(
        &sc.rivetd,
        &["--os-baremetal-api-version", "1.87", "node", "show", "k1"],
    )?;
    assert_eq!(shown["provision_state"], "service hold", "{shown}");
    run(with(&["node", "unhold", "k1"]))?;
    sc.state("k1", "active", 20)?;

    // Adopt with the stock client; a node without image info is refused with a 400.
    sc.node("k2", json!({}))?;
    let err = clients::baremetal_failing(
        &sc.rivetd,
        &["--os-baremetal-api-version", "1.87", "node", "adopt", "k2"],
    )?;
    assert!(err.contains("image_source"), "{err}");
    sc.set_image("k2")?;
    run(with(&["node", "adopt", "k2"]))?;
    sc.state("k2", "active", 20)?;

    // rivet's own commands.
    let rivet = |args: &[&str], env: &[(&str, &str)]| -> Result<String> {
        let mut cmd = Command::new(bin("rivet"));
        cmd.arg("--url").arg(&sc.rivetd.url).args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output()?;
        ensure!(
            out.status.success(),
            "rivet {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).to_string())
    };
    rivet(
        &["node", "rescue", "k1"],
        &[("RIVET_RESCUE_PASSWORD", "r1vet-cli")],
    )?;
    sc.state("k1", "rescue", 60)?;
    let shadow = std::fs::read_to_string(root.join("etc/shadow"))?;
    let hash = shadow
        .lines()
        .find_map(|l| l.strip_prefix("rescue:"))
        .and_then(|l| l.split(':').next())
        .unwrap_or_default()
        .to_string();
    let salt = hash.split('$').nth(2).unwrap_or_default();
    let out = Command::new("openssl")
        .args(["passwd", "-6", "-salt", salt, "r1vet-cli"])
        .output()?;
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), hash);
    rivet(&["node", "unrescue", "k1"], &[])?;
    sc.state("k1", "active", 30)?;
    rivet(&["node", "hold", "k1", "--in", "service"], &[])?;
    sc.state("k1", "service hold", 20)?;
    let shown = rivet(&["node", "show", "k1", "--fields", "provision_state"], &[])?;
    assert!(shown.contains("service hold"), "{shown}");
    rivet(&["node", "unhold", "k1"], &[])?;
    sc.state("k1", "active", 20)?;
    rivet(
        &[
            "node",
            "service",
            "k1",
            "--disable-ramdisk",
            "--steps",
            r#"[{"interface": "bios", "step": "apply_configuration"}]"#,
        ],
        &[],
    )?;
    sc.state("k1", "active", 20)?;
    sc.node("k3", json!({}))?;
    rivet(
        &[
            "node",
            "adopt",
            "k3",
            "--image",
            "http://images.example/k3.img",
        ],
        &[],
    )?;
    sc.state("k3", "active", 20)?;
    Ok(())
}

/// Deploy with a requested `hold` step, on a loop device: `deploy hold` before the image is
/// written; `abort` fails the deploy without writing; `unhold` writes the image and ends
/// `active`.
#[test]
fn hold_in_deploy_then_abort_or_unhold() -> Result<()> {
    use rivet_tests::agentproc::{is_root, read_at, LoopDevice};
    use rivet_tests::fileserver::FileServer;
    if !prerequisite(
        is_root() && have("losetup"),
        "root with losetup (loop devices)",
    ) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let rivetd = Rivetd::start_in(dir.path(), rivet_tests::DEPLOY_TEST_CONFIG)?;
    let www = dir.path().join("www");
    std::fs::create_dir(&www)?;
    let images = FileServer::start(&www)?;
    // A raw image of pseudo-random bytes: what lands on the disk is checked byte for byte.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let image: Vec<u8> = (0..(4usize << 20))
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(www.join("img.raw"), &image)?;
    let digest = rivet_tests::sha256_file(&www.join("img.raw"))?;
    let file = dir.path().join("disk0.img");
    std::fs::File::create(&file)?.set_len(64 << 20)?;
    let disk = LoopDevice::attach(&file)?;
    let (s, v) = rivetd.call(
        "POST",
        "/v1/nodes",
        Some(
            json!({"driver": "fake-hardware", "deploy_interface": "direct", "name": "d1",
                    // The agent stands in for a ramdisk on this BIOS host: no UEFI.
                    "properties": {"root_device": {"name": disk.path.display().to_string()},
                                   "capabilities": "boot_mode:bios"},
                    "instance_info": {"image_source": images.url_of("img.raw"),
                                      "image_os_hash_algo": "sha256",
                                      "image_os_hash_value": digest}}),
        ),
    )?;
    ensure!(s == 201, "{v}");
    let uuid = v["uuid"].as_str().unwrap_or_default().to_string();
    let log = dir.path().join("agent.log");
    let start_agent = || {
        rivet_tests::agentproc::AgentProcess::start(
            &rivetd.url,
            &uuid,
            &[disk.path.as_path()],
            None,
            &log,
            &[],
        )
    };
    let verb = |body: Value| -> Result<()> {
        let (s, v) = rivetd.call("PUT", "/v1/nodes/d1/states/provision", Some(body.clone()))?;
        ensure!(s == 202, "{body}: {s} {v}");
        Ok(())
    };
    let state = |want: &'static str, secs: u64| -> Result<Value> {
        rivetd
            .wait_node("d1", Duration::from_secs(secs), move |v| {
                v["provision_state"] == want
            })
            .map_err(|e| {
                anyhow::anyhow!(
                    "{want}: {e}\n--- rivetd ---\n{}\n--- agent ---\n{}",
                    tail(&rivetd.log_text()),
                    tail(&std::fs::read_to_string(&log).unwrap_or_default())
                )
            })
    };
    verb(json!({"target": "manage"}))?;
    state("manageable", 20)?;
    let mut agent = start_agent()?;
    verb(json!({"target": "provide"}))?;
    state("available", 120)?;
    let hold = json!({"target": "active", "deploy_steps": [
        {"interface": "deploy", "step": "hold", "priority": 90, "args": {}}]});

    // Abort from deploy hold: deploy failed, nothing written.
    agent.kill9();
    agent = start_agent()?;
    verb(hold.clone())?;
    let held = state("deploy hold", 60)?;
    assert!(held["last_error"].is_null(), "{held}");
    verb(json!({"target": "abort"}))?;
    let failed = state("deploy failed", 20)?;
    assert!(
        failed["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("aborted"),
        "{failed}"
    );
    assert!(
        read_at(&disk.path, 0, 1 << 20)?.iter().all(|b| *b == 0),
        "the image was written although the deploy was aborted in deploy hold"
    );

    // Again, and unhold: the image is written, active.
    agent.kill9();
    let _agent = start_agent()?;
    verb(hold)?;
    state("deploy hold", 60)?;
    verb(json!({"target": "unhold"}))?;
    let active = state("active", 120)?;
    assert!(active["last_error"].is_null(), "{active}");
    let got = read_at(&disk.path, 0, image.len())?;
    assert!(
        got == image,
        "the disk does not hold the image after unhold"
    );
    Ok(())
}
