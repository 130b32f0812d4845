//! Inspection end to end with the real rivetd and a real rivet-agent process: derived
//! properties, ports and resource class, rules in order, a failing rule, abort, timeout,
//! re-inspection, and out-of-band inspection through the fake driver.

use anyhow::{ensure, Result};
use rivet_tests::agentproc::AgentProcess;
use rivet_tests::Rivetd;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

struct Scene {
    dir: tempfile::TempDir,
    rivetd: Rivetd,
    uuid: String,
}

impl Scene {
    fn new(extra_config: &str, node: Value) -> Result<Scene> {
        let dir = tempfile::tempdir()?;
        let cfg = dir.path().join("rivetd.toml");
        std::fs::write(
            &cfg,
            format!("[agent]\nlong_poll_s = 2\n[conductor]\ncheck_interval_s = 1\n{extra_config}"),
        )?;
        let cfg = cfg.display().to_string();
        let rivetd = Rivetd::start(&dir.path().join("rivet.db"), 0, &["--config", &cfg])?;
        // In-band inspection through the simulated agent (fake-hardware's default is `fake`).
        let mut body =
            json!({"driver": "fake-hardware", "name": "n1", "inspect_interface": "agent"});
        if let (Some(b), Some(extra)) = (body.as_object_mut(), node.as_object()) {
            b.extend(extra.clone());
        }
        let (s, v) = rivetd.call("POST", "/v1/nodes", Some(body))?;
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
        Ok(Scene { dir, rivetd, uuid })
    }

    fn disk(&self, gib: u64) -> Result<PathBuf> {
        let p = self.dir.path().join("disk.img");
        std::fs::File::create(&p)?.set_len(gib << 30)?;
        Ok(p)
    }

    fn agent(&self, disk: &std::path::Path) -> Result<AgentProcess> {
        AgentProcess::start(
            &self.rivetd.url,
            &self.uuid,
            &[disk],
            None,
            &self.dir.path().join("agent.log"),
            &[],
        )
    }

    fn verb(&self, target: &str) -> Result<(u16, Value)> {
        self.rivetd.call(
            "PUT",
            "/v1/nodes/n1/states/provision",
            Some(json!({"target": target})),
        )
    }

    fn state(&self, s: &'static str, secs: u64) -> Result<Value> {
        self.rivetd
            .wait_node("n1", Duration::from_secs(secs), move |v| {
                v["provision_state"] == s
            })
            .map_err(|e| anyhow::anyhow!("{e}\n--- rivetd ---\n{}", self.rivetd.log_text()))
    }

    fn rule(&self, rule: Value) -> Result<Value> {
        let (s, v) = self
            .rivetd
            .call("POST", "/v1/inspection_rules", Some(rule))?;
        ensure!(s == 201, "{v}");
        Ok(v)
    }
}

/// The error's human message (Ironic nests it as a JSON string): the protocol's own decoder.
fn message(v: &Value) -> String {
    serde_json::from_value::<rivet_protocol::api::ErrorBody>(v.clone())
        .map(|b| b.message())
        .unwrap_or_default()
}

#[test]
fn in_band_inspection_fills_properties_ports_and_applies_rules_in_order() -> Result<()> {
    let scene = Scene::new("", json!({}))?;
    scene.rule(json!({"description": "first", "priority": 10,
        "conditions": [{"op": "gt", "args": {"values": ["{inventory[cpu][count]}", 0]}}],
        "actions": [{"op": "add-trait", "args": {"name": "CUSTOM_FIRST"}}, {"op": "set-attribute", "args": {"path": "extra/order", "value": "first"}},
                    {"op": "set-capability", "args": {"name": "tested", "value": "yes"}}]}))?;
    scene.rule(json!({"description": "second", "priority": 5,
        "conditions": [{"op": "eq", "args": {"values": ["{node[driver]}", "fake-hardware"]}}],
        "actions": [{"op": "add-trait", "args": {"name": "CUSTOM_SECOND"}}, {"op": "set-attribute", "args": {"path": "extra/order", "value": "second"}}]}))?;
    scene.rule(json!({"description": "never applies", "priority": 99,
        "conditions": [{"op": "matches", "args": {"value": "{inventory[cpu][architecture]}", "regex": "sparc.*"}}],
        "actions": [{"op": "fail", "args": {"msg": "sparc is not welcome"}}]}))?;

    let disk = scene.disk(10)?;
    let (s, v) = scene.verb("inspect")?;
    ensure!(s == 202, "{v}");
    scene.state("inspect wait", 10)?;
    let _agent = scene.agent(&disk)?;
    let n = scene.state("manageable", 60)?;
    assert!(n["last_error"].is_null(), "{n}");
    let p = &n["properties"];
    let nproc = std::thread::available_parallelism()
        .map(|n| n.get() as u64)
        .unwrap_or(0);
    assert!(p["cpus"].as_u64().unwrap_or(0) >= nproc.min(1), "{p}");
    assert_eq!(p["cpu_arch"], std::env::consts::ARCH);
    assert!(p["memory_mb"].as_u64().unwrap_or(0) > 0, "{p}");
    assert_eq!(p["local_gb"], 9, "a 10 GiB root disk gives local_gb 9: {p}");
    let caps = p["capabilities"].as_str().unwrap_or_default();
    assert!(
        caps.contains("boot_mode:") && caps.contains("tested:yes"),
        "{caps}"
    );
    let rc = format!(
        "bm-{}-{}-{}",
        p["memory_mb"],
        p["cpus"],
        std::env::consts::ARCH
    );
    assert_eq!(n["resource_class"], rc.as_str());
    assert_eq!(
        n["traits"],
        json!(["CUSTOM_FIRST", "CUSTOM_SECOND"]),
        "rules run highest priority first"
    );
    assert_eq!(
        n["extra"]["order"], "second",
        "the later rule has the last word"
    );
    assert!(n["inspection_finished_at"].is_string());
    assert_eq!(n["power_state"], "power off");

    let (s, inv) = scene.rivetd.call("GET", "/v1/nodes/n1/inventory", None)?;
    ensure!(s == 200, "{inv}");
    let macs: Vec<String> = inv["inventory"]["interfaces"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["mac_address"].as_str().map(str::to_string))
        .filter(|m| m != "00:00:00:00:00:00")
        .collect();
    let (_, ports) = scene
        .rivetd
        .call("GET", "/v1/ports?node=n1&detail=true", None)?;
    let mut port_macs: Vec<String> = ports["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["address"].as_str().map(str::to_string))
        .collect();
    let mut want = macs.clone();
    port_macs.sort();
    want.sort();
    want.dedup();
    assert_eq!(port_macs, want, "one port per NIC with a MAC");
    Ok(())
}

#[test]
fn failing_rule_fails_inspection_then_reinspection_succeeds() -> Result<()> {
    let scene = Scene::new("", json!({}))?;
    let rule = scene.rule(json!({"priority": 1,
        "conditions": [{"op": "lt", "args": {"values": ["{inventory[disks][0][size]}", 1_099_511_627_776u64]}}],
        "actions": [{"op": "fail", "args": {"msg": "root disk smaller than 1 TiB"}}]}))?;
    let disk = scene.disk(5)?;
    scene.verb("inspect")?;
    scene.state("inspect wait", 10)?;
    let mut agent = scene.agent(&disk)?;
    let n = scene.state("inspect failed", 60)?;
    assert!(
        n["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("root disk smaller than 1 TiB"),
        "{n}"
    );
    agent.kill9();

    let uuid = rule["uuid"].as_str().unwrap_or_default();
    let (s, _) = scene
        .rivetd
        .call("DELETE", &format!("/v1/inspection_rules/{uuid}"), None)?;
    assert_eq!(s, 204);
    let (s, v) = scene.verb("inspect")?;
    ensure!(s == 202, "re-inspect from inspect failed: {v}");
    scene.state("inspect wait", 10)?;
    let _agent = scene.agent(&disk)?;
    let n = scene.state("manageable", 60)?;
    assert!(n["last_error"].is_null(), "{n}");
    assert_eq!(n["properties"]["local_gb"], 4);
    Ok(())
}

#[test]
fn abort_in_inspect_wait_tells_the_agent_to_stop() -> Result<()> {
    let scene = Scene::new("", json!({}))?;
    scene.verb("inspect")?;
    scene.state("inspect wait", 10)?;
    // Play the ramdisk by hand so it is caught between lookup and inventory.
    let (s, lookup) = scene.rivetd.call(
        "POST",
        "/agent/v1/lookup",
        Some(json!({"node_uuid": scene.uuid, "agent_version": "test"})),
    )?;
    ensure!(s == 200, "{lookup}");
    let token = lookup["agent_token"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let (s, v) = scene.verb("abort")?;
    ensure!(s == 202, "{v}");
    let n = scene.state("inspect failed", 10)?;
    assert!(
        n["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("aborted"),
        "{n}"
    );
    // The ramdisk's next heartbeats are answered with the queued commands; a power-off is
    // among them.
    let http = reqwest::blocking::Client::new();
    let mut names = Vec::new();
    for _ in 0..5 {
        let resp: Value = http
            .post(format!("{}/agent/v1/heartbeat/{}", scene.rivetd.url, scene.uuid))
            .bearer_auth(&token)
            .json(&json!({"agent_version": "test", "wait": false, "results": names.iter().map(|(id, name): &(String, String)| json!({"id": id, "name": name, "status": "SUCCEEDED", "result": {}})).collect::<Vec<_>>()}))
            .send()?
            .json()?;
        if let Some(cmd) = resp["command"].as_object() {
            let id = cmd
                .get("id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let name = cmd
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            names.push((id, name));
        }
    }
    assert!(
        names.iter().any(|(_, n)| n == "power_off"),
        "agent was not told to stop: {names:?}"
    );
    let (s, v) = scene.verb("manage")?;
    ensure!(s == 202, "{v}");
    scene.state("manageable", 10)?;
    Ok(())
}

#[test]
fn inspect_wait_timeout_fails_and_manage_recovers() -> Result<()> {
    let scene = Scene::new("inspect_wait_timeout_s = 2\n", json!({}))?;
    scene.verb("inspect")?;
    let n = scene.state("inspect failed", 20)?;
    assert!(
        n["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("timeout"),
        "{n}"
    );
    let (s, v) = scene.verb("manage")?;
    ensure!(s == 202, "{v}");
    scene.state("manageable", 10)?;
    Ok(())
}

#[test]
fn out_of_band_inspection_and_its_abort_refused() -> Result<()> {
    let scene = Scene::new(
        "",
        json!({"inspect_interface": "fake", "driver_info": {
        "fake_delay_ms": 1500,
        "fake_inventory": {"cpus": 16, "cpu_arch": "x86_64", "memory_mb": 65536, "macs": ["52:54:00:00:0A:01", "52:54:00:00:0a:02"]}}}),
    )?;
    scene.verb("inspect")?;
    scene.state("inspecting", 5)?;
    let (s, v) = scene.verb("abort")?;
    assert_eq!(s, 400, "{v}");
    assert!(message(&v).contains("inspecting"), "{v}");
    let n = scene.state("manageable", 30)?;
    assert_eq!(n["properties"]["cpus"], 16);
    assert_eq!(n["properties"]["memory_mb"], 65536);
    assert_eq!(n["resource_class"], "bm-65536-16-x86_64");
    let (_, ports) = scene.rivetd.call("GET", "/v1/ports?node=n1", None)?;
    let mut macs: Vec<&str> = ports["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["address"].as_str())
        .collect();
    macs.sort();
    assert_eq!(macs, ["52:54:00:00:0a:01", "52:54:00:00:0a:02"]);
    Ok(())
}

#[test]
fn rule_validation_is_400_naming_the_field() -> Result<()> {
    let scene = Scene::new("", json!({}))?;
    let cases = [
        (
            json!({"conditions": [{"op": "gte", "args": {"values": ["{inventory[cpu][count]}", 1]}}], "actions": [{"op": "add-trait", "args": {"name": "X"}}]}),
            "conditions[0].op",
        ),
        (
            json!({"conditions": [{"op": "eq", "args": {"value": 1}}], "actions": [{"op": "add-trait", "args": {"name": "X"}}]}),
            "missing required argument(s): values",
        ),
        (
            json!({"actions": [{"op": "launch", "args": {"name": "X"}}]}),
            "actions[0].op",
        ),
        (json!({"actions": []}), "actions"),
        (
            json!({"priority": "high", "actions": [{"op": "add-trait", "args": {"name": "X"}}]}),
            "priority",
        ),
    ];
    for (rule, field) in cases {
        let (s, v) = scene
            .rivetd
            .call("POST", "/v1/inspection_rules", Some(rule))?;
        assert_eq!(s, 400, "{v}");
        assert!(
            message(&v).contains(field),
            "error should name {field}: {v}"
        );
    }
    let (_, list) = scene.rivetd.call("GET", "/v1/inspection_rules", None)?;
    assert_eq!(list["inspection_rules"], json!([]), "nothing stored");
    Ok(())
}
