//! Restart: rivetd on a SQLite file, nodes created and some caught mid-operation, kill -9,
//! start again: every record is there and no node stays in a transient state.

use rivet_tests::{prerequisite, Rivetd};
use serde_json::json;
use std::process::Command;
use std::time::Duration;

const TRANSIENT: &[&str] = &[
    "verifying",
    "inspecting",
    "cleaning",
    "deploying",
    "deleting",
    "adopting",
    "rescuing",
    "unrescuing",
];

#[test]
fn kill9_and_restart_loses_nothing_and_leaves_nothing_stuck() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("rivet.db");
    let mut d = Rivetd::start(&db, 0, &[])?;

    // Five quick nodes and three whose BMC answers slowly, so `manage` is still verifying
    // when rivetd dies.
    for i in 0..5 {
        let (s, v) = d.call("POST", "/v1/nodes", Some(json!({"driver": "fake-hardware", "name": format!("quick-{i}"), "automated_clean": false})))?;
        assert_eq!(s, 201, "{v}");
        let (s, v) = d.call("POST", "/v1/ports", Some(json!({"node_uuid": format!("quick-{i}"), "address": format!("52:54:00:00:00:{i:02x}")})))?;
        assert_eq!(s, 201, "{v}");
    }
    for i in 0..3 {
        let (s, v) = d.call(
            "POST",
            "/v1/nodes",
            Some(json!({"driver": "fake-hardware", "deploy_interface": "direct", "name": format!("slow-{i}"), "driver_info": {"fake_delay_ms": 2000}})),
        )?;
        assert_eq!(s, 201, "{v}");
    }
    for i in 0..2 {
        d.call(
            "PUT",
            &format!("/v1/nodes/quick-{i}/states/provision"),
            Some(json!({"target": "manage"})),
        )?;
        d.wait_node(&format!("quick-{i}"), Duration::from_secs(10), |v| {
            v["provision_state"] == "manageable"
        })?;
    }
    d.call(
        "PUT",
        "/v1/nodes/quick-0/states/provision",
        Some(json!({"target": "provide"})),
    )?;
    d.wait_node("quick-0", Duration::from_secs(10), |v| {
        v["provision_state"] == "available"
    })?;
    for i in 0..3 {
        let (s, v) = d.call(
            "PUT",
            &format!("/v1/nodes/slow-{i}/states/provision"),
            Some(json!({"target": "manage"})),
        )?;
        assert_eq!(s, 202, "{v}");
    }
    for i in 0..3 {
        d.wait_node(&format!("slow-{i}"), Duration::from_secs(5), |v| {
            v["provision_state"] == "verifying" && v["reservation"].is_string()
        })?;
    }
    let (_, before) = d.call("GET", "/v1/nodes/detail", None)?;
    d.kill9();

    // While it is down, also leave nodes as a crash inside other operations would.
    if prerequisite(
        which("sqlite3"),
        "sqlite3 CLI (to simulate crashes in more states)",
    ) {
        let sql = "UPDATE nodes SET provision_state='deploying', target_provision_state='active', reservation='test-conductor' WHERE name='quick-2'; \
                   UPDATE nodes SET provision_state='deleting', target_provision_state='available', reservation='test-conductor' WHERE name='quick-3';";
        let st = Command::new("sqlite3").arg(&db).arg(sql).status()?;
        assert!(st.success());
    }

    let d2 = Rivetd::start(&db, d.port, &[])?;
    let (_, after) = d2.call("GET", "/v1/nodes/detail", None)?;
    let names = |v: &serde_json::Value| -> Vec<String> {
        let mut n: Vec<String> = v["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n["name"].as_str().map(String::from))
            .collect();
        n.sort();
        n
    };
    assert_eq!(names(&before), names(&after), "nodes lost across kill -9");
    let (_, ports) = d2.call("GET", "/v1/ports", None)?;
    assert_eq!(
        ports["ports"].as_array().map(Vec::len),
        Some(5),
        "ports lost: {ports}"
    );
    assert_eq!(d2.node("quick-0")?["provision_state"], "available");

    // Every node leaves its transient state: resumed to where it was going.
    for name in names(&after) {
        let v = d2.wait_node(&name, Duration::from_secs(20), |v| {
            let s = v["provision_state"].as_str().unwrap_or("");
            !TRANSIENT.contains(&s) && v["reservation"].is_null()
        })?;
        let state = v["provision_state"].as_str().unwrap_or("");
        if name.starts_with("slow-") {
            assert_eq!(state, "manageable", "{name}: {v}");
        }
        if name == "quick-2" && which("sqlite3") {
            assert_eq!(state, "active", "{name}: {v}");
        }
        if name == "quick-3" && which("sqlite3") {
            assert_eq!(state, "available", "{name}: {v}");
        }
    }
    assert!(
        d2.log_text().contains("resuming node"),
        "restart should log what it resumed:\n{}",
        d2.log_text()
    );
    Ok(())
}

fn which(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool} >/dev/null"))
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}
