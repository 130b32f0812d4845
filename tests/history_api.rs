//! Node history (1.78, read from the audit trail's transitions), shards (1.82) and external
//! events (1.54) on a real rivetd, with Ironic's shapes, codes and microversion gates.

use anyhow::{ensure, Context, Result};
use rivet_tests::peers::closed_port;
use rivet_tests::Rivetd;
use serde_json::{json, Value};
use std::time::Duration;

fn provision(d: &Rivetd, node: &str, target: &str) -> Result<()> {
    let (s, v) = d.call(
        "PUT",
        &format!("/v1/nodes/{node}/states/provision"),
        Some(json!({"target": target})),
    )?;
    ensure!(s == 202, "{target}: {s} {v}");
    Ok(())
}

fn state_is(want: &'static str) -> impl Fn(&Value) -> bool {
    move |v| v["provision_state"] == want
}

#[test]
fn history_shows_transitions_failures_and_is_gated() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start_in(dir.path(), "")?;
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(json!({"driver": "fake-hardware", "name": "h1", "automated_clean": false})),
    )?;
    ensure!(s == 201, "create: {s} {v}");
    provision(&d, "h1", "manage")?;
    d.wait_node("h1", Duration::from_secs(30), state_is("manageable"))?;
    provision(&d, "h1", "provide")?;
    d.wait_node("h1", Duration::from_secs(30), state_is("available"))?;

    let (s, v) = d.call("GET", "/v1/nodes/h1/history?detail=true", None)?;
    ensure!(s == 200, "history: {s} {v}");
    let h = v["history"].as_array().context("history array")?;
    let states: Vec<&str> = h.iter().filter_map(|e| e["state"].as_str()).collect();
    ensure!(
        states.first() == Some(&"verifying")
            && states.contains(&"manageable")
            && states.last() == Some(&"available"),
        "order: {states:?} {v}"
    );
    for e in h {
        ensure!(
            e["severity"] == "INFO" && e["user"] == "anonymous",
            "entry: {e}"
        );
        ensure!(
            e["conductor"] == "test-conductor" && e["project"].is_null(),
            "entry: {e}"
        );
        ensure!(
            e["links"][0]["href"]
                .as_str()
                .is_some_and(|l| l.ends_with(e["uuid"].as_str().unwrap_or("?"))),
            "links: {e}"
        );
    }
    ensure!(
        h[0]["event_type"] == "verifying" && h[0]["target_provision_state"] == "manageable",
        "first: {}",
        h[0]
    );
    // Without detail: uuid, created_at, severity, event, links.
    let (_, brief) = d.call("GET", "/v1/nodes/h1/history", None)?;
    let keys: Vec<&String> = brief["history"][0]
        .as_object()
        .context("entry")?
        .keys()
        .collect();
    ensure!(
        keys.len() == 5 && brief["history"][0].get("event_type").is_none(),
        "brief: {brief}"
    );
    // Paging by marker.
    let first = h[0]["uuid"].as_str().context("uuid")?;
    let (s, page) = d.call(
        "GET",
        &format!("/v1/nodes/h1/history?limit=1&marker={first}"),
        None,
    )?;
    ensure!(
        s == 200 && page["history"][0]["uuid"] == h[1]["uuid"] && page["next"].is_string(),
        "page: {page}"
    );
    // One entry by UUID; an unknown one is a 404.
    let (s, one) = d.call("GET", &format!("/v1/nodes/h1/history/{first}"), None)?;
    ensure!(
        s == 200 && one["uuid"] == first && one["event_type"] == "verifying",
        "one: {s} {one}"
    );
    let (s, _) = d.call(
        "GET",
        "/v1/nodes/h1/history/6f1b8a3c-0000-4000-8000-000000000000",
        None,
    )?;
    ensure!(s == 404, "unknown entry: {s}");
    // Gates: 404 below 1.78; project at 1.113; state fields at 1.115.
    let (s, _) = d.call_at(Some("1.77"), "GET", "/v1/nodes/h1/history", None)?;
    ensure!(s == 404, "1.77: {s}");
    let (s, v) = d.call_at(
        Some("1.78"),
        "GET",
        &format!("/v1/nodes/h1/history/{first}"),
        None,
    )?;
    ensure!(
        s == 200 && v.get("project").is_none() && v.get("state").is_none(),
        "1.78: {s} {v}"
    );
    let (_, v) = d.call_at(
        Some("1.113"),
        "GET",
        &format!("/v1/nodes/h1/history/{first}"),
        None,
    )?;
    ensure!(
        v.get("project").is_some() && v.get("duration_seconds").is_none(),
        "1.113: {v}"
    );

    // A redfish node whose BMC does not answer: manage fails, an ERROR entry says why.
    let port = closed_port()?;
    let (s, v) = d.call("POST", "/v1/nodes", Some(json!({"driver": "redfish", "name": "r1",
        "driver_info": {"redfish_address": format!("http://127.0.0.1:{port}"), "redfish_system_id": "/redfish/v1/Systems/x",
        "redfish_username": "u", "redfish_password": "p"}})))?;
    ensure!(s == 201, "create redfish: {s} {v}");
    provision(&d, "r1", "manage")?;
    d.wait_node("r1", Duration::from_secs(60), |v| {
        v["provision_state"] == "enroll" && !v["last_error"].is_null()
    })?;
    let (_, v) = d.call("GET", "/v1/nodes/r1/history?detail=1", None)?;
    let errors: Vec<&Value> = v["history"]
        .as_array()
        .context("history")?
        .iter()
        .filter(|e| e["severity"] == "ERROR")
        .collect();
    ensure!(
        errors.len() == 1
            && errors[0]["event_type"] == "verifying"
            && errors[0]["state"] == "enroll",
        "errors: {v}"
    );
    ensure!(
        !errors[0]["event"].as_str().unwrap_or_default().is_empty()
            && errors[0]["user"] == "anonymous",
        "error entry: {v}"
    );
    Ok(())
}

#[test]
fn shards_are_counted_and_events_validated() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start_in(dir.path(), "")?;
    for (name, shard) in [
        ("a", Some("s1")),
        ("b", Some("s1")),
        ("c", Some("s2")),
        ("e", None),
    ] {
        let mut body = json!({"driver": "fake-hardware", "name": name});
        if let Some(s) = shard {
            body["shard"] = json!(s);
        }
        let (s, v) = d.call("POST", "/v1/nodes", Some(body))?;
        ensure!(s == 201, "create {name}: {s} {v}");
    }
    let (s, v) = d.call("GET", "/v1/shards", None)?;
    ensure!(s == 200, "shards: {s} {v}");
    ensure!(
        v["shards"][0] == json!({"name": "s1", "count": 2}),
        "shards: {v}"
    );
    let all = v["shards"].as_array().context("shards")?;
    ensure!(
        all.len() == 3
            && all.contains(&json!({"name": "None", "count": 1}))
            && all.contains(&json!({"name": "s2", "count": 1})),
        "shards: {v}"
    );
    let (s, _) = d.call_at(Some("1.81"), "GET", "/v1/shards", None)?;
    ensure!(s == 404, "shards at 1.81: {s}");
    let (s, _) = d.call("GET", "/v1/shards/s1", None)?;
    ensure!(s == 404, "one shard: {s}");

    let event = json!({"event": "network.bind_port", "port_id": "11111111-aaaa-bbbb-cccc-555555555555",
        "mac_address": "de:ad:be:ef:00:01", "status": "ACTIVE", "device_id": null, "binding:vnic_type": "baremetal"});
    let (s, v) = d.call("POST", "/v1/events", Some(json!({"events": [event]})))?;
    ensure!(s == 204, "event: {s} {v}");
    for bad in [
        json!({}),
        json!({"events": []}),
        json!({"events": [{"event": "network.bind_port"}]}),
        json!({"events": [{"event": "x", "port_id": "11111111-aaaa-bbbb-cccc-555555555555", "mac_address": "de:ad:be:ef:00:01", "status": "A"}]}),
    ] {
        let (s, v) = d.call("POST", "/v1/events", Some(bad.clone()))?;
        ensure!(s == 400, "{bad}: {s} {v}");
    }
    let (s, _) = d.call_at(
        Some("1.53"),
        "POST",
        "/v1/events",
        Some(json!({"events": [event]})),
    )?;
    ensure!(s == 404, "events at 1.53: {s}");
    Ok(())
}
