//! Out-of-band BIOS steps on the Redfish driver, end to end: the real rivetd against the
//! in-tree Redfish mock (tests/peers.rs `RedfishMock`, which stages `Bios/Settings` PATCHes
//! and applies them at the next reset, like a real BMC). Manual cleaning and servicing run
//! `bios.apply_configuration`: the setting is staged, the node reboots, the value is checked
//! and the node's BIOS cache (`GET /v1/nodes/{node}/bios`) shows it. A setting the BMC
//! refuses (unknown name) or silently drops fails the step with a message naming it.
//!
//! sushy-tools (tests/redfish.rs) serves BIOS for its libvirt driver only (kept in the
//! domain's metadata); its fake driver, which tests/redfish.rs uses, has no BIOS support,
//! so the in-tree mock stands in for the BMC here.

use anyhow::{ensure, Result};
use rivet_tests::clients::{self, baremetal, baremetal_json};
use rivet_tests::peers::{MockState, RedfishMock};
use rivet_tests::Rivetd;
use serde_json::{json, Value};
use std::time::Duration;

fn start(dir: &std::path::Path) -> Result<Rivetd> {
    let conf = dir.join("rivetd.toml");
    std::fs::write(
        &conf,
        "[drivers]\npoll_interval_ms = 100\npower_wait_s = 3\n",
    )?;
    let conf = conf.to_string_lossy().to_string();
    Rivetd::start(&dir.join("rivet.db"), 0, &["--config", &conf])
}

fn verb(d: &Rivetd, node: &str, body: Value) -> Result<()> {
    let (s, v) = d.call(
        "PUT",
        &format!("/v1/nodes/{node}/states/provision"),
        Some(body.clone()),
    )?;
    ensure!(s == 202, "{body}: {s} {v}");
    Ok(())
}

fn wait_state(d: &Rivetd, node: &str, states: &[&str]) -> Result<Value> {
    d.wait_node(node, Duration::from_secs(60), |v| {
        states.iter().any(|s| v["provision_state"] == *s) && v["target_provision_state"].is_null()
    })
}

fn cached(d: &Rivetd, node: &str, name: &str) -> Result<Value> {
    let (s, v) = d.call("GET", &format!("/v1/nodes/{node}/bios/{name}"), None)?;
    ensure!(s == 200, "GET bios/{name}: {s} {v}");
    Ok(v[name]["value"].clone())
}

/// Resets that boot the system (and so apply staged settings); power-offs are not counted.
fn boots(mock: &RedfishMock) -> usize {
    mock.snapshot()
        .resets
        .iter()
        .filter(|r| !matches!(r.as_str(), "ForceOff" | "GracefulShutdown" | "Nmi"))
        .count()
}

fn apply(name: &str, value: Value) -> Value {
    json!([{"interface": "bios", "step": "apply_configuration",
            "args": {"settings": [{"name": name, "value": value}]}}])
}

/// An enrolled Redfish node on the mock, `manageable` (which read the BIOS cache).
fn manageable(d: &Rivetd, mock: &RedfishMock, name: &str) -> Result<()> {
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(json!({"driver": "redfish", "name": name,
                    "driver_info": mock.driver_info("mock-password")})),
    )?;
    ensure!(s == 201, "{v}");
    verb(d, name, json!({"target": "manage"}))?;
    wait_state(d, name, &["manageable"])?;
    Ok(())
}

#[test]
fn manual_cleaning_applies_bios_settings_and_lists_the_step() -> Result<()> {
    let mock = RedfishMock::start(MockState::default())?;
    let dir = tempfile::tempdir()?;
    let d = start(dir.path())?;
    manageable(&d, &mock, "c")?;
    assert_eq!(cached(&d, "c", "ProcTurboMode")?, "Enabled");

    verb(
        &d,
        "c",
        json!({"target": "clean", "clean_steps": apply("ProcTurboMode", json!("Disabled"))}),
    )?;
    let end = wait_state(&d, "c", &["manageable", "clean failed"])?;
    assert_eq!(end["provision_state"], "manageable", "{end}");
    assert!(end["last_error"].is_null(), "{end}");
    let snap = mock.snapshot();
    assert_eq!(snap.bios["ProcTurboMode"], "Disabled", "the BMC applied it");
    assert!(snap.bios_pending.is_empty(), "{:?}", snap.bios_pending);
    assert!(!snap.resets.is_empty(), "no reboot applied the setting");
    assert_eq!(cached(&d, "c", "ProcTurboMode")?, "Disabled");

    // The step is listed as the driver's (out-of-band), manual only, no ramdisk.
    let (s, v) = d.call("GET", "/v1/nodes/c/clean_steps", None)?;
    ensure!(s == 200, "{v}");
    let listed = v["clean_steps"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .find(|st| st["interface"] == "bios" && st["step"] == "apply_configuration")
        })
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(listed["source"], "driver", "{v}");
    assert_eq!(listed["priority"], 0, "{v}");
    assert_eq!(listed["requires_ramdisk"], false, "{v}");
    assert!(listed["argsinfo"]["settings"]["required"] == true, "{v}");

    // A name the BMC does not know: refused by its PATCH, named in the error, no reboot.
    let resets = boots(&mock);
    verb(
        &d,
        "c",
        json!({"target": "clean", "clean_steps": apply("NoSuchKnob", json!("On"))}),
    )?;
    let failed = wait_state(&d, "c", &["clean failed", "manageable"])?;
    assert_eq!(failed["provision_state"], "clean failed", "{failed}");
    let err = failed["last_error"].as_str().unwrap_or_default();
    assert!(
        err.contains("apply_configuration") && err.contains("NoSuchKnob"),
        "{err}"
    );
    assert!(!err.contains("mock-password"), "{err}");
    assert_eq!(boots(&mock), resets, "rebooted for nothing");
    Ok(())
}

#[test]
fn servicing_applies_bios_settings_through_the_bmc() -> Result<()> {
    if !clients::available() {
        return Ok(());
    }
    let mock = RedfishMock::start(MockState::default())?;
    let dir = tempfile::tempdir()?;
    let d = start(dir.path())?;
    manageable(&d, &mock, "s")?;
    // Adoption makes the node `active` without deploying (it only reads the BMC).
    let (s, v) = d.call(
        "PATCH",
        "/v1/nodes/s",
        Some(json!([{"op": "add", "path": "/instance_info/image_source",
                      "value": "http://images.example/running.img"},
                     {"op": "add", "path": "/instance_info/image_os_hash_algo", "value": "sha256"},
                     {"op": "add", "path": "/instance_info/image_os_hash_value",
                      "value": "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"}])),
    )?;
    ensure!(s == 200, "{v}");
    verb(&d, "s", json!({"target": "adopt"}))?;
    wait_state(&d, "s", &["active"])?;
    mock.with(|s| s.power = "On".into());

    // Through the stock client, as an operator would.
    let steps = apply("ProcTurboMode", json!("Disabled")).to_string();
    baremetal(
        &d,
        &[
            "--os-baremetal-api-version",
            "1.87",
            "node",
            "service",
            "s",
            "--service-steps",
            &steps,
        ],
    )?;
    let end = wait_state(&d, "s", &["active", "service failed"])?;
    assert_eq!(end["provision_state"], "active", "{end}");
    assert!(end["last_error"].is_null(), "{end}");
    let snap = mock.snapshot();
    assert_eq!(snap.bios["ProcTurboMode"], "Disabled", "the BMC applied it");
    assert_eq!(snap.resets.last().map(String::as_str), Some("ForceRestart"));
    assert_eq!(snap.power, "On", "the instance is back on");
    let shown = baremetal_json(
        &d,
        &["node", "bios", "setting", "show", "s", "ProcTurboMode"],
    )?;
    assert_eq!(shown["value"], "Disabled", "{shown}");

    // Already in effect: nothing staged, no reboot (as Ironic skips it).
    let resets = boots(&mock);
    verb(
        &d,
        "s",
        json!({"target": "service", "service_steps": apply("ProcTurboMode", json!("Disabled"))}),
    )?;
    let end = wait_state(&d, "s", &["active", "service failed"])?;
    assert_eq!(end["provision_state"], "active", "{end}");
    assert_eq!(boots(&mock), resets, "needless reboot");

    // A value the BMC stages but drops at boot: the check after the reboot names it.
    mock.with(|s| s.bios_dropped = vec!["NumLock".into()]);
    verb(
        &d,
        "s",
        json!({"target": "service", "service_steps": apply("NumLock", json!(false))}),
    )?;
    let failed = wait_state(&d, "s", &["service failed", "active"])?;
    assert_eq!(failed["provision_state"], "service failed", "{failed}");
    let err = failed["last_error"].as_str().unwrap_or_default();
    assert!(
        err.contains("bios.apply_configuration") && err.contains("NumLock"),
        "{err}"
    );
    assert_eq!(mock.snapshot().bios["NumLock"], true);
    assert_eq!(
        cached(&d, "s", "NumLock")?,
        "True",
        "the cache shows the BMC's value (as Ironic stores it)"
    );

    // An unknown name: the BMC's refusal reaches last_error.
    mock.with(|s| s.bios_dropped.clear());
    verb(
        &d,
        "s",
        json!({"target": "service", "service_steps": apply("NoSuchKnob", json!(1))}),
    )?;
    let failed = d.wait_node("s", Duration::from_secs(60), |v| {
        v["provision_state"] == "service failed"
            && v["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("NoSuchKnob"))
    })?;
    assert!(
        failed["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("not in the list of valid properties"),
        "{failed}"
    );
    Ok(())
}
