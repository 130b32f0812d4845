//! "No state reached without its work", per hardware type: the scenario each BMC test runs
//! against its real peer (sushy-tools, ipmi_sim). A node of a real hardware type must never
//! reach `active` by `deploy` unless an agent wrote the image, never reach `rescue` (its
//! hardware type serves no rescue interface yet: refused up front), and `adopt` reaches
//! `active` only after the BMC answered and with the image the instance came from named.

use crate::Rivetd;
use anyhow::{ensure, Result};
use serde_json::{json, Value};
use std::time::Duration;

fn verb(d: &Rivetd, name: &str, body: Value) -> Result<(u16, Value)> {
    d.call(
        "PUT",
        &format!("/v1/nodes/{name}/states/provision"),
        Some(body),
    )
}

fn state(d: &Rivetd, name: &str, want: &'static str, secs: u64) -> Result<Value> {
    d.wait_node(name, Duration::from_secs(secs), |v| {
        v["provision_state"] == want
    })
}

fn set_image(d: &Rivetd, name: &str) -> Result<()> {
    let (s, v) = d.call(
        "PATCH",
        &format!("/v1/nodes/{name}"),
        Some(json!([
            {"op": "add", "path": "/instance_info/image_source", "value": "http://127.0.0.1:9/never.raw"},
            {"op": "add", "path": "/instance_info/image_os_hash_algo", "value": "sha256"},
            {"op": "add", "path": "/instance_info/image_os_hash_value", "value": "a".repeat(64)},
        ])),
    )?;
    ensure!(s == 200, "patch image of {name}: {s} {v}");
    Ok(())
}

/// Run the scenario on node `name`, created with `automated_clean: false` and in
/// `manageable`. `powered_off` reads the BMC's own view of the power.
pub fn no_state_without_work(
    d: &Rivetd,
    name: &str,
    powered_off: &dyn Fn() -> Result<bool>,
) -> Result<()> {
    // adopt without the image the instance came from: 400, nothing changes.
    let (s, v) = verb(d, name, json!({"target": "adopt"}))?;
    ensure!(s == 400, "adopt without image_source: {s} {v}");
    ensure!(
        v.to_string().contains("image_source"),
        "adopt refusal should name image_source: {v}"
    );
    ensure!(d.node(name)?["provision_state"] == "manageable");

    let (s, v) = verb(d, name, json!({"target": "provide"}))?;
    ensure!(s == 202, "provide: {s} {v}");
    state(d, name, "available", 60)?;
    // deploy without an image: 400 up front.
    let (s, v) = verb(d, name, json!({"target": "active"}))?;
    ensure!(s == 400, "active without image: {s} {v}");
    ensure!(d.node(name)?["provision_state"] == "available");

    // deploy with an image: the ramdisk is booted through the BMC, and without an agent the
    // node waits — it never reports active.
    set_image(d, name)?;
    let (s, v) = verb(d, name, json!({"target": "active"}))?;
    ensure!(s == 202, "active: {s} {v}");
    let n = state(d, name, "wait call-back", 60)?;
    ensure!(
        n["power_state"] == "power on",
        "the ramdisk boot powered the node on: {n}"
    );
    std::thread::sleep(Duration::from_secs(3));
    let n = d.node(name)?;
    ensure!(
        n["provision_state"] == "wait call-back",
        "no agent wrote anything, yet: {n}"
    );
    // abort: deploy failed, powered off at the BMC.
    let (s, v) = d.call("DELETE", &format!("/v1/nodes/{name}/provision"), None)?;
    ensure!(s == 202, "abort: {s} {v}");
    state(d, name, "deploy failed", 30)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !powered_off()? {
        ensure!(
            std::time::Instant::now() < deadline,
            "the BMC still reports power on after the abort"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // undeploy from deploy failed: tear down; cleaning is disabled for this node.
    let (s, v) = verb(d, name, json!({"target": "deleted"}))?;
    ensure!(s == 202, "deleted: {s} {v}");
    let n = state(d, name, "available", 60)?;
    ensure!(n["instance_info"] == json!({}), "instance forgotten: {n}");

    // adopt: validates and reads the power state, writes nothing.
    let (s, v) = verb(d, name, json!({"target": "manage"}))?;
    ensure!(s == 202, "manage: {s} {v}");
    state(d, name, "manageable", 60)?;
    set_image(d, name)?;
    let (s, v) = verb(d, name, json!({"target": "adopt"}))?;
    ensure!(s == 202, "adopt: {s} {v}");
    let n = state(d, name, "active", 60)?;
    ensure!(n["last_error"].is_null(), "{n}");
    // rescue: this hardware type has no rescue interface that does work: 400 up front.
    let (s, v) = verb(
        d,
        name,
        json!({"target": "rescue", "rescue_password": "pw"}),
    )?;
    ensure!(s == 400, "rescue: {s} {v}");
    ensure!(
        v.to_string().contains("rescue_interface"),
        "rescue refusal should name the interface: {v}"
    );
    ensure!(d.node(name)?["provision_state"] == "active");
    Ok(())
}
