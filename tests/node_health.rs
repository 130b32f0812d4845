//! `node.health` (API 1.109) on a real rivetd against the in-tree Redfish mock: power sync
//! reads the System's `Status.Health` with the power state, stores a change (only a
//! change) and records it in the node history as a `monitoring` event in Ironic's words;
//! the field is hidden below 1.109, read-only, and what both stock clients show.

use anyhow::{ensure, Result};
use rivet_tests::clients;
use rivet_tests::peers::{MockState, RedfishMock};
use rivet_tests::Rivetd;
use serde_json::{json, Value};
use std::time::Duration;

const PASSWORD: &str = "mock-password";

/// The node's `monitoring` history events, oldest first.
fn monitoring_events(d: &Rivetd, node: &str) -> Result<Vec<Value>> {
    let (s, v) = d.call_at(
        Some("latest"),
        "GET",
        &format!("/v1/nodes/{node}/history?detail=true"),
        None,
    )?;
    ensure!(s == 200, "history: {s} {v}");
    Ok(v["history"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e["event_type"] == "monitoring")
        .collect())
}

fn start(dir: &std::path::Path) -> Result<Rivetd> {
    let conf = dir.join("rivetd.toml");
    std::fs::write(
        &conf,
        "[drivers]\npoll_interval_ms = 100\n[power_sync]\ninterval_s = 1\npolicy = \"record\"\n",
    )?;
    let conf = conf.to_string_lossy().to_string();
    Rivetd::start(&dir.join("rivet.db"), 0, &["--config", &conf])
}

#[test]
fn power_sync_keeps_node_health_and_records_changes() -> Result<()> {
    let mock = RedfishMock::start(MockState {
        health: Some("OK".into()),
        ..MockState::default()
    })?;
    let dir = tempfile::tempdir()?;
    let d = start(dir.path())?;
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(json!({"name": "hn", "driver": "redfish",
                    "driver_info": Value::Object(mock.driver_info(PASSWORD))})),
    )?;
    ensure!(s == 201, "create: {s} {v}");
    // Null until a sync has read the BMC (nodes in enroll are not synced).
    assert_eq!(v["health"], Value::Null, "{v}");
    let (s, v) = d.call(
        "PUT",
        "/v1/nodes/hn/states/provision",
        Some(json!({"target": "manage"})),
    )?;
    ensure!(s == 202, "manage: {s} {v}");
    d.wait_node("hn", Duration::from_secs(30), |v| {
        v["provision_state"] == "manageable"
    })?;

    let n = d.wait_node("hn", Duration::from_secs(30), |v| v["health"] == "OK")?;
    assert_eq!(n["power_state"], "power off", "{n}");

    // The BMC reports a problem: the next sync stores it.
    mock.with(|s| s.health = Some("Critical".into()));
    d.wait_node("hn", Duration::from_secs(30), |v| v["health"] == "Critical")?;
    // Further syncs with the same reading record nothing more.
    std::thread::sleep(Duration::from_millis(2500));
    let events = monitoring_events(&d, "hn")?;
    let texts: Vec<&str> = events.iter().filter_map(|e| e["event"].as_str()).collect();
    assert_eq!(
        texts,
        [
            "Node health status changed: health='OK' (previously 'None')",
            "Node health status changed: health='Critical' (previously 'OK')",
        ],
        "{events:?}"
    );
    for e in &events {
        assert_eq!(e["severity"], "INFO", "{e}");
        assert_eq!(e["state"], "manageable", "{e}");
    }

    // A BMC that stops reporting health: the node's health goes back to null.
    mock.with(|s| s.health = None);
    d.wait_node("hn", Duration::from_secs(30), |v| v["health"].is_null())?;
    let events = monitoring_events(&d, "hn")?;
    assert_eq!(
        events.last().and_then(|e| e["event"].as_str()),
        Some("Node health status changed: health='None' (previously 'Critical')"),
        "{events:?}"
    );
    mock.with(|s| s.health = Some("Warning".into()));
    d.wait_node("hn", Duration::from_secs(30), |v| v["health"] == "Warning")?;

    // Hidden below 1.109, shown from it, in show and detailed listings alike.
    let (s, v) = d.call_at(Some("1.108"), "GET", "/v1/nodes/hn", None)?;
    ensure!(s == 200, "{s} {v}");
    assert!(v.get("health").is_none(), "health shown at 1.108: {v}");
    let (s, v) = d.call_at(Some("1.109"), "GET", "/v1/nodes/hn", None)?;
    ensure!(s == 200, "{s} {v}");
    assert_eq!(v["health"], "Warning", "{v}");
    let (_, v) = d.call_at(Some("1.108"), "GET", "/v1/nodes/detail", None)?;
    assert!(v["nodes"][0].get("health").is_none(), "{v}");
    let (_, v) = d.call_at(Some("1.109"), "GET", "/v1/nodes/detail", None)?;
    assert_eq!(v["nodes"][0]["health"], "Warning", "{v}");

    let (s, v) = d.call_at(
        Some("1.109"),
        "GET",
        "/v1/nodes/hn?fields=uuid,health",
        None,
    )?;
    ensure!(s == 200, "{s} {v}");
    assert_eq!(v["health"], "Warning", "{v}");
    let (s, v) = d.call_at(
        Some("1.108"),
        "GET",
        "/v1/nodes/hn?fields=uuid,health",
        None,
    )?;
    assert!(s == 400 || s == 406, "fields=health at 1.108: {s} {v}");

    // Read-only, as in Ironic (not among the fields a PATCH may touch); nothing changes.
    let (s, v) = d.call_at(
        Some("1.109"),
        "PATCH",
        "/v1/nodes/hn",
        Some(json!([{"op": "replace", "path": "/health", "value": "OK"}])),
    )?;
    assert_eq!(s, 400, "{v}");
    assert_eq!(d.node("hn")?["health"], "Warning");

    if !clients::available() {
        return Ok(());
    }
    let shown = clients::baremetal_json(
        &d,
        &["--os-baremetal-api-version", "1.109", "node", "show", "hn"],
    )?;
    assert_eq!(shown["health"], "Warning", "{shown}");
    let old = clients::baremetal_json(
        &d,
        &["--os-baremetal-api-version", "1.108", "node", "show", "hn"],
    )?;
    assert!(
        old.get("health").is_none_or(Value::is_null),
        "health at 1.108: {old}"
    );
    let sdk = clients::sdk(&d, "emit(conn.baremetal.get_node('hn').health)")?;
    assert_eq!(sdk, "Warning");
    Ok(())
}

/// Drivers that report no health (fake-hardware) leave the field null through syncs.
#[test]
fn drivers_without_health_leave_it_null() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start(dir.path())?;
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(json!({"name": "fk", "driver": "fake-hardware"})),
    )?;
    ensure!(s == 201, "create: {s} {v}");
    let (s, v) = d.call(
        "PUT",
        "/v1/nodes/fk/states/provision",
        Some(json!({"target": "manage"})),
    )?;
    ensure!(s == 202, "manage: {s} {v}");
    let n = d.wait_node("fk", Duration::from_secs(30), |v| {
        v["provision_state"] == "manageable" && !v["power_state"].is_null()
    })?;
    std::thread::sleep(Duration::from_millis(2500));
    let n2 = d.node("fk")?;
    assert_eq!(n2["health"], Value::Null, "{n} {n2}");
    assert!(monitoring_events(&d, "fk")?.is_empty());
    Ok(())
}
