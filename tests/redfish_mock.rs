//! The Redfish driver against the in-tree Redfish mock (`rivet_tests::peers::RedfishMock`),
//! for what sushy-tools' fake driver cannot serve: it answers 501 for BIOS and Processors
//! and 500 for UpdateService.SimpleUpdate. Covered here: BIOS `apply_configuration` and
//! `factory_reset` out-of-band steps, the firmware `update` step polling its task to the
//! end, a failing call's `@Message.ExtendedInfo` message carried into the error, out-of-band
//! inspection (CPUs, memory, MACs), session auth with re-login, and retries on 503.

use rivet_drivers::redfish::RedfishBmc;
use rivet_drivers::{Bmc, DriverError, DriversConfig};
use rivet_protocol::states::PowerState;
use rivet_protocol::steps::StepDescriptor;
use rivet_tests::peers::{MockState, RedfishMock, MOCK_MACS};
use serde_json::{json, Map, Value};
use std::time::{Duration, Instant};

const NODE: &str = "0b8c0d2e-7f4c-4a57-9d7e-1f2a3b4c5d6e";

fn bmc() -> RedfishBmc {
    RedfishBmc::new(DriversConfig {
        poll_interval_ms: 50,
        redfish_retry_backoff_ms: 50,
        ..DriversConfig::default()
    })
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn step(bmc: &RedfishBmc, interface: &str, name: &str) -> StepDescriptor {
    rt().block_on(bmc.steps(NODE, &Map::new()))
        .into_iter()
        .find(|s| s.interface == interface && s.step == name)
        .unwrap_or_else(|| panic!("driver offers no {interface}.{name}"))
}

fn args(v: Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}

#[test]
fn bios_apply_configuration_and_factory_reset() -> anyhow::Result<()> {
    let mock = RedfishMock::start(MockState::default())?;
    let info = mock.driver_info("mock-password");
    let b = bmc();
    let rt = rt();
    let apply = step(&b, "bios", "apply_configuration");
    assert!(apply.reboot_requested && !apply.requires_ramdisk && apply.priority == 0);

    let settings = args(json!({"settings": [{"name": "ProcTurboMode", "value": "Disabled"}]}));
    let out = rt.block_on(b.execute_step(NODE, &info, &apply, &settings))?;
    assert_eq!(out["pending"]["ProcTurboMode"], "Disabled", "{out}");
    assert_eq!(out["reboot_required"], true, "{out}");
    assert_eq!(
        mock.snapshot().bios_pending.get("ProcTurboMode"),
        Some(&json!("Disabled"))
    );

    // The BMC applies staged settings at the next boot.
    rt.block_on(b.set_power(NODE, &info, PowerState::Rebooting))?;
    let attrs = rt.block_on(b.bios_attributes(&info))?;
    assert_eq!(attrs["ProcTurboMode"], "Disabled");

    let reset = step(&b, "bios", "factory_reset");
    let out = rt.block_on(b.execute_step(NODE, &info, &reset, &Map::new()))?;
    assert_eq!(out["reboot_required"], true);
    assert_eq!(mock.snapshot().bios_factory_resets, 1);
    rt.block_on(b.set_power(NODE, &info, PowerState::Rebooting))?;
    let attrs = rt.block_on(b.bios_attributes(&info))?;
    assert_eq!(attrs["ProcTurboMode"], "Enabled", "defaults back");

    // Missing arguments are refused before the BMC is contacted.
    let before = mock.snapshot().requests.len();
    let err = rt
        .block_on(b.execute_step(NODE, &info, &apply, &Map::new()))
        .expect_err("no settings");
    assert!(matches!(err, DriverError::BadStepArgs { .. }), "{err}");
    assert_eq!(mock.snapshot().requests.len(), before);
    Ok(())
}

#[test]
fn bmc_error_extended_info_reaches_the_error() -> anyhow::Result<()> {
    let mock = RedfishMock::start(MockState::default())?;
    let info = mock.driver_info("mock-password");
    let b = bmc();
    let apply = step(&b, "bios", "apply_configuration");
    let settings = args(json!({"settings": [{"name": "NoSuchKnob", "value": 1}]}));
    let err = rt()
        .block_on(b.execute_step(NODE, &info, &apply, &settings))
        .expect_err("unknown attribute")
        .to_string();
    assert!(
        err.contains("The property NoSuchKnob is not in the list of valid properties"),
        "{err}"
    );
    assert!(err.contains("400"), "{err}");
    assert!(!err.contains("mock-password"), "{err}");
    Ok(())
}

#[test]
fn firmware_update_polls_its_task_to_the_end() -> anyhow::Result<()> {
    let mock = RedfishMock::start(MockState {
        task_polls_needed: 4,
        ..MockState::default()
    })?;
    let info = mock.driver_info("mock-password");
    let b = bmc();
    let rt = rt();
    let fw = step(&b, "firmware", "update");
    assert!(!fw.abortable, "a firmware flash must never be interrupted");

    let a = args(json!({"firmware_images": [{"url": "http://10.0.0.1/bmc-2.1.bin"}]}));
    let out = rt.block_on(b.execute_step(NODE, &info, &fw, &a))?;
    let snap = mock.snapshot();
    assert_eq!(snap.updates.len(), 1);
    assert_eq!(snap.updates[0]["ImageURI"], "http://10.0.0.1/bmc-2.1.bin");
    assert_eq!(snap.updates[0]["TransferProtocol"], "HTTP");
    assert!(snap.task_polls >= 4, "polled {} times", snap.task_polls);
    assert_eq!(
        out["firmware_images"][0]["messages"][0], "Update successful",
        "{out}"
    );

    // A task that ends in Exception fails the step with the task's message.
    let a = args(json!({"image_url": "http://10.0.0.1/bad-image.bin"}));
    let err = rt
        .block_on(b.execute_step(NODE, &info, &fw, &a))
        .expect_err("bad image")
        .to_string();
    assert!(err.contains("Image verification failed"), "{err}");
    Ok(())
}

#[test]
fn oob_inspection_fills_cpus_memory_and_macs() -> anyhow::Result<()> {
    let mock = RedfishMock::start(MockState::default())?;
    let info = mock.driver_info("mock-password");
    let inv = rt().block_on(bmc().inspect(NODE, &info))?;
    assert_eq!(inv.cpus, Some(16));
    assert_eq!(inv.memory_mb, Some(64 * 1024));
    assert_eq!(inv.cpu_arch.as_deref(), Some("x86_64"));
    let want: Vec<String> = MOCK_MACS.iter().map(|m| m.to_lowercase()).collect();
    assert_eq!(inv.macs, want);
    Ok(())
}

#[test]
fn session_auth_logs_in_again_after_401() -> anyhow::Result<()> {
    let mock = RedfishMock::start(MockState {
        sessions_only: true,
        ..MockState::default()
    })?;
    let mut info = mock.driver_info("mock-password");
    info.insert("redfish_auth_type".into(), "session".into());
    let b = bmc();
    let rt = rt();
    assert_eq!(rt.block_on(b.get_power(NODE, &info))?, PowerState::Off);
    assert_eq!(mock.snapshot().logins, 1);
    assert_eq!(rt.block_on(b.get_power(NODE, &info))?, PowerState::Off);
    assert_eq!(mock.snapshot().logins, 1, "the session is reused");

    // The BMC forgets its sessions (expiry, BMC reboot): the driver logs in again.
    mock.with(|s| s.sessions.clear());
    rt.block_on(b.set_power(NODE, &info, PowerState::On))?;
    assert_eq!(mock.snapshot().logins, 2);
    assert_eq!(mock.snapshot().power, "On");

    // A wrong password is a clear error without the password in it.
    let bad = mock.driver_info("not-the-password");
    let mut bad = bad;
    bad.insert("redfish_auth_type".into(), "session".into());
    let err = rt
        .block_on(b.get_power(NODE, &bad))
        .expect_err("wrong password")
        .to_string();
    assert!(
        err.contains("401") && err.contains("redfish_password"),
        "{err}"
    );
    assert!(!err.contains("not-the-password"), "{err}");
    Ok(())
}

#[test]
fn retries_5xx_a_bounded_number_of_times() -> anyhow::Result<()> {
    let mock = RedfishMock::start(MockState {
        fail_next: 2,
        ..MockState::default()
    })?;
    let info = mock.driver_info("mock-password");
    let b = bmc();
    let rt = rt();
    assert_eq!(rt.block_on(b.get_power(NODE, &info))?, PowerState::Off);

    mock.with(|s| s.fail_next = 100);
    let started = Instant::now();
    let err = rt
        .block_on(b.get_power(NODE, &info))
        .expect_err("always 503")
        .to_string();
    assert!(err.contains("503"), "{err}");
    assert!(err.contains("temporarily unavailable"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // 1 try + redfish_retries (2) = 3 requests.
    assert_eq!(100 - mock.snapshot().fail_next, 3);
    Ok(())
}

/// Manual cleaning through rivetd with only out-of-band steps: no ramdisk is booted, the
/// BIOS setting is staged and applied by the reboot the step requests, the firmware flash
/// polls its task to the end, and an `abort` during the flash never interrupts it (the
/// conductor either refuses the abort or defers it to the end of the step).
#[test]
fn manual_cleaning_runs_bios_and_firmware_steps_out_of_band() -> anyhow::Result<()> {
    let needed = 25;
    let mock = RedfishMock::start(MockState {
        task_polls_needed: needed,
        ..MockState::default()
    })?;
    let dir = tempfile::tempdir()?;
    let conf = dir.path().join("rivetd.toml");
    std::fs::write(&conf, "[drivers]\npoll_interval_ms = 200\n")?;
    let conf = conf.to_string_lossy().to_string();
    let d = rivet_tests::Rivetd::start(&dir.path().join("rivet.db"), 0, &["--config", &conf])?;
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(json!({"driver": "redfish", "name": "m", "driver_info": mock.driver_info("mock-password")})),
    )?;
    anyhow::ensure!(s == 201, "{v}");
    d.call(
        "PUT",
        "/v1/nodes/m/states/provision",
        Some(json!({"target": "manage"})),
    )?;
    d.wait_node("m", Duration::from_secs(30), |v| {
        v["provision_state"] == "manageable"
    })?;

    let (s, v) = d.call(
        "PUT",
        "/v1/nodes/m/states/provision",
        Some(json!({"target": "clean", "clean_steps": [
            {"interface": "bios", "step": "apply_configuration",
             "args": {"settings": [{"name": "ProcTurboMode", "value": "Disabled"}]}},
            {"interface": "firmware", "step": "update",
             "args": {"firmware_images": [{"url": "http://10.0.0.1/bmc-2.2.bin"}]}}
        ]})),
    )?;
    anyhow::ensure!(s == 202, "clean: {s} {v}");
    let running = d.wait_node("m", Duration::from_secs(30), |v| {
        v["clean_step"]["step"] == "update"
    })?;
    assert_eq!(running["clean_step"]["abortable"], false, "{running}");
    assert!(
        mock.snapshot().task_polls < needed,
        "the flash ended before the abort"
    );
    let (abort_status, abort_answer) = d.call(
        "PUT",
        "/v1/nodes/m/states/provision",
        Some(json!({"target": "abort"})),
    )?;
    eprintln!("abort during firmware.update: {abort_status} {abort_answer}");
    let end = d.wait_node("m", Duration::from_secs(60), |v| {
        v["provision_state"] == "manageable" || v["provision_state"] == "clean failed"
    })?;

    let snap = mock.snapshot();
    assert!(
        snap.task_polls >= needed,
        "the firmware task was not followed to its end"
    );
    assert_eq!(snap.updates.len(), 1);
    assert_eq!(
        snap.bios["ProcTurboMode"], "Disabled",
        "the reboot applied the BIOS setting"
    );
    assert!(
        snap.resets.iter().any(|r| r == "ForceRestart" || r == "On"),
        "{:?}",
        snap.resets
    );
    if (200..300).contains(&abort_status) {
        assert_eq!(end["provision_state"], "clean failed", "{end}");
        let err = end["last_error"].as_str().unwrap_or("");
        assert!(err.contains("not abortable"), "{err}");
    } else {
        assert_eq!(end["provision_state"], "manageable", "{end}");
        assert!(end["last_error"].is_null(), "{end}");
    }
    Ok(())
}

#[test]
fn power_and_health_come_from_one_system_read() -> anyhow::Result<()> {
    use rivet_drivers::Health;
    let mock = RedfishMock::start(MockState {
        health: Some("Warning".into()),
        ..MockState::default()
    })?;
    let info = mock.driver_info("mock-password");
    let b = bmc();
    let rt = rt();
    let before = mock.snapshot().requests.len();
    let read = rt.block_on(b.get_power_and_health(NODE, &info))?;
    assert_eq!(read, (PowerState::Off, Some(Health::Warning)));
    let system_gets = mock.snapshot().requests[before..]
        .iter()
        .filter(|r| *r == &format!("GET {}", rivet_tests::peers::MOCK_SYSTEM))
        .count();
    assert_eq!(system_gets, 1, "{:?}", mock.snapshot().requests);
    // Unknown vendor text and no Status at all are no health.
    mock.with(|s| s.health = Some("Degraded".into()));
    assert_eq!(rt.block_on(b.get_power_and_health(NODE, &info))?.1, None);
    mock.with(|s| s.health = None);
    assert_eq!(rt.block_on(b.get_power_and_health(NODE, &info))?.1, None);
    Ok(())
}
