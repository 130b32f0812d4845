//! BMC faults: the real rivetd with the `redfish` driver talks to sushy-tools (fake driver)
//! through a fault-injecting proxy (tests/faultproxy.rs) that, for a window the test picks,
//! answers 500, drops connections or delays answers past rivetd's request timeout.
//!
//! - a power action rides out a short 500 window and a short drop window: the retries are
//!   visible at the proxy, spaced by a growing back-off, and the reset is sent once;
//! - a manual clean (power steps, no ramdisk) does not fail on one transient BMC error;
//! - a BMC that stays down past the retry budget fails cleaning with a `last_error` that
//!   names the node, the BMC address, the operation and what to check;
//! - power sync never flips or clears `power_state` on timeouts or 500s: it keeps the last
//!   known value, records the failure in `last_error` after 3 failed passes in a row, and
//!   clears it once the BMC answers again.
//!
//! rivetd runs with short driver timeouts ([drivers] in its config), so the whole file takes
//! well under 60 s (its tests run in parallel; the emulator applies power changes 1–2 s
//! late, see `Sushy::start`). Needs `.venv-sushy` (scripts/setup-peers.sh); skipped without it
//! unless RIVET_REQUIRE_PEERS=1.

use rivet_tests::faultproxy::{Fault, FaultProxy, Seen};
use rivet_tests::peers::{have_sushy, FakeSystem, Sushy, SushyOptions};
use rivet_tests::{prerequisite, Rivetd};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const USER: &str = "admin";
const PASSWORD: &str = "s3cret-Fault-pw";

/// First back-off (ms) and extra attempts rivetd is configured with.
const BACKOFF_MS: u64 = 150;
const RETRIES: u32 = 4;

fn sushy_ok() -> bool {
    prerequisite(
        have_sushy(),
        "sushy-emulator in .venv-sushy (scripts/setup-peers.sh installs sushy-tools)",
    )
}

/// An emulator with one powered-off system, a proxy in front of it, and rivetd with short
/// driver timeouts (`extra` appended to its config) and a node `name` on the proxy,
/// managed (verified through the proxy, no faults yet).
struct Scene {
    sushy: Sushy,
    sys: FakeSystem,
    proxy: FaultProxy,
    rivetd: Rivetd,
    _dir: tempfile::TempDir,
}

fn scene(name: &str, mac: &str, retries: u32, extra: &str) -> anyhow::Result<Scene> {
    let sys = FakeSystem::new(name, mac);
    let sushy = Sushy::start(SushyOptions {
        systems: vec![sys.clone()],
        ..SushyOptions::default()
    })?;
    let proxy = FaultProxy::start(sushy.port)?;
    let dir = tempfile::tempdir()?;
    let config = format!(
        "[drivers]\npoll_interval_ms = 200\nredfish_connect_timeout_s = 1\n\
         redfish_request_timeout_s = 1\nredfish_retries = {retries}\n\
         redfish_retry_backoff_ms = {BACKOFF_MS}\npower_wait_s = 30\n{extra}\n"
    );
    let rivetd = Rivetd::start_in(dir.path(), &config)?;
    let mut info = sushy.driver_info(&sys.uuid, USER, PASSWORD);
    info["redfish_address"] = proxy.url.clone().into();
    let (s, v) = rivetd.call(
        "POST",
        "/v1/nodes",
        Some(
            json!({"driver": "redfish", "name": name, "driver_info": info,
                     "automated_clean": false}),
        ),
    )?;
    anyhow::ensure!(s == 201, "create {name}: {s} {v}");
    provision(&rivetd, name, json!({"target": "manage"}))?;
    let n = rivetd.wait_node(name, Duration::from_secs(30), |v| {
        v["provision_state"] != "verifying" && v["target_provision_state"].is_null()
    })?;
    anyhow::ensure!(n["provision_state"] == "manageable", "manage {name}: {n}");
    anyhow::ensure!(n["power_state"] == "power off", "manage {name}: {n}");
    Ok(Scene {
        sushy,
        sys,
        proxy,
        rivetd,
        _dir: dir,
    })
}

fn provision(d: &Rivetd, name: &str, body: Value) -> anyhow::Result<()> {
    let (s, v) = d.call(
        "PUT",
        &format!("/v1/nodes/{name}/states/provision"),
        Some(body),
    )?;
    anyhow::ensure!(s == 202, "provision {name}: {s} {v}");
    Ok(())
}

fn power(d: &Rivetd, name: &str, target: &str) -> anyhow::Result<()> {
    let (s, v) = d.call(
        "PUT",
        &format!("/v1/nodes/{name}/states/power"),
        Some(json!({ "target": target })),
    )?;
    anyhow::ensure!(s == 202, "power {target} {name}: {s} {v}");
    Ok(())
}

/// Requests seen since `from`, for the system's own resource or its reset action.
fn system_requests(seen: &[Seen], from: usize, sys: &FakeSystem) -> Vec<Seen> {
    seen[from..]
        .iter()
        .filter(|s| s.path.contains(&sys.uuid))
        .cloned()
        .collect()
}

/// Retries of the faulted GETs come back after a back-off that doubles each time.
fn assert_backoff(faulted: &[&Seen]) {
    for (i, pair) in faulted.windows(2).enumerate() {
        let gap = pair[1].at.duration_since(pair[0].at);
        // The sleep is a lower bound; allow a little for request latency jitter.
        let want =
            Duration::from_millis(BACKOFF_MS * (1 << i)).saturating_sub(Duration::from_millis(40));
        assert!(
            gap >= want,
            "retry {} came {gap:?} after the previous attempt, expected at least {want:?}",
            i + 1
        );
    }
}

/// A power action during a short fault window succeeds once the window is over.
fn power_through(
    s: &Scene,
    fault: Fault,
    target: &str,
    want: &str,
    bmc_want: &str,
) -> anyhow::Result<()> {
    let name = s.sys.name.as_str();
    let from = s.proxy.seen().len();
    s.proxy
        .fail_window_from_next(fault, Duration::from_millis(600));
    power(&s.rivetd, name, target)?;
    let n = s.rivetd.wait_node(name, Duration::from_secs(40), |v| {
        v["target_power_state"].is_null()
    })?;
    assert_eq!(n["power_state"], want, "{fault:?}: {n}");
    assert!(n["last_error"].is_null(), "{fault:?}: {n}");
    assert_eq!(s.sushy.power_state(&s.sys.uuid)?, bmc_want);

    let seen = system_requests(&s.proxy.seen(), from, &s.sys);
    let faulted: Vec<&Seen> = seen.iter().filter(|r| r.fault.is_some()).collect();
    assert!(
        faulted.len() >= 2,
        "{fault:?}: expected the first read and at least one retry to meet the fault: {seen:?}"
    );
    assert!(
        faulted.iter().all(|r| r.method == "GET"),
        "{fault:?}: the window is over before the reset is sent: {seen:?}"
    );
    assert_backoff(&faulted);
    // The action itself went through exactly once, after the window.
    let resets: Vec<&Seen> = seen
        .iter()
        .filter(|r| r.path.contains("ComputerSystem.Reset"))
        .collect();
    assert_eq!(resets.len(), 1, "{fault:?}: {seen:?}");
    assert!(resets[0].fault.is_none(), "{fault:?}: {seen:?}");
    eprintln!(
        "{fault:?}: {} faulted attempts, then success; {} requests for the system in all",
        faulted.len(),
        seen.len()
    );
    Ok(())
}

#[test]
fn power_actions_ride_out_500_and_drop_windows() -> anyhow::Result<()> {
    if !sushy_ok() {
        return Ok(());
    }
    let started = Instant::now();
    let s = scene(
        "pw",
        "52:54:00:fa:00:01",
        RETRIES,
        "[power_sync]\ninterval_s = 0",
    )?;
    power_through(&s, Fault::Status(500), "power on", "power on", "On")?;
    power_through(&s, Fault::Drop, "power off", "power off", "Off")?;
    eprintln!(
        "power_actions_ride_out_500_and_drop_windows: {:?}",
        started.elapsed()
    );
    Ok(())
}

#[test]
fn manual_clean_survives_one_transient_bmc_error() -> anyhow::Result<()> {
    if !sushy_ok() {
        return Ok(());
    }
    let started = Instant::now();
    let s = scene(
        "cl",
        "52:54:00:fa:00:02",
        RETRIES,
        "[power_sync]\ninterval_s = 0",
    )?;
    let from = s.proxy.seen().len();
    // The next request the BMC gets has its connection dropped.
    s.proxy.fail_next(Fault::Drop, 1);
    provision(
        &s.rivetd,
        "cl",
        json!({"target": "clean", "clean_steps": [{"interface": "power", "step": "power_on"}]}),
    )?;
    let n = s.rivetd.wait_node("cl", Duration::from_secs(45), |v| {
        v["provision_state"] == "manageable" || v["provision_state"] == "clean failed"
    })?;
    assert_eq!(n["provision_state"], "manageable", "{n}");
    assert!(n["last_error"].is_null(), "{n}");
    let seen = &s.proxy.seen()[from..];
    let faulted: Vec<&Seen> = seen.iter().filter(|r| r.fault.is_some()).collect();
    assert_eq!(faulted.len(), 1, "{seen:?}");
    // The step really ran: the system was switched on (and cleaning's end switched it off).
    let resets = seen
        .iter()
        .filter(|r| r.path.contains("ComputerSystem.Reset"))
        .count();
    assert_eq!(
        resets, 2,
        "power on, then off at the end of cleaning: {seen:?}"
    );
    assert_eq!(s.sushy.power_state(&s.sys.uuid)?, "Off");
    eprintln!(
        "manual_clean_survives_one_transient_bmc_error: {:?}",
        started.elapsed()
    );
    Ok(())
}

#[test]
fn cleaning_fails_clearly_when_the_bmc_stays_down() -> anyhow::Result<()> {
    if !sushy_ok() {
        return Ok(());
    }
    let started = Instant::now();
    let s = scene(
        "down",
        "52:54:00:fa:00:03",
        RETRIES,
        "[power_sync]\ninterval_s = 0",
    )?;
    let from = s.proxy.seen().len();
    s.proxy.fail_always(Fault::Status(500));
    provision(
        &s.rivetd,
        "down",
        json!({"target": "clean", "clean_steps": [{"interface": "power", "step": "power_on"}]}),
    )?;
    let n = s.rivetd.wait_node("down", Duration::from_secs(30), |v| {
        v["provision_state"] == "clean failed"
    })?;
    let err = n["last_error"].as_str().unwrap_or_default();
    eprintln!("last_error: {err}");
    assert!(err.contains("down"), "names the node: {err}");
    assert!(err.contains(&s.proxy.url), "names the BMC address: {err}");
    assert!(err.contains("power_on"), "names the operation: {err}");
    assert!(
        err.contains("HTTP 500"),
        "says what the BMC answered: {err}"
    );
    assert!(
        err.contains(&format!("{} attempts", RETRIES + 1)),
        "says it retried: {err}"
    );
    assert!(
        err.contains("check"),
        "tells the operator what to check: {err}"
    );
    assert!(!err.contains(PASSWORD), "{err}");
    // Every attempt reached the proxy, and nothing was ever forwarded to the BMC.
    let seen = &s.proxy.seen()[from..];
    assert!(seen.iter().all(|r| r.fault.is_some()), "{seen:?}");
    assert_eq!(seen.len(), RETRIES as usize + 1, "{seen:?}");
    assert_eq!(s.sushy.power_state(&s.sys.uuid)?, "Off");
    eprintln!(
        "cleaning_fails_clearly_when_the_bmc_stays_down: {:?}",
        started.elapsed()
    );
    Ok(())
}

#[test]
fn power_sync_keeps_the_last_known_state_through_bmc_faults() -> anyhow::Result<()> {
    if !sushy_ok() {
        return Ok(());
    }
    let started = Instant::now();
    // One retry here: a pass that times out costs 2 requests of 1 s, not 5.
    let s = scene(
        "ps",
        "52:54:00:fa:00:04",
        1,
        "[power_sync]\ninterval_s = 1\npolicy = \"record\"",
    )?;
    let name = "ps";
    let from = s.proxy.seen().len();
    // The BMC answers 500 for a while, then stops answering in time (each answer 2 s late,
    // past the 1 s request timeout).
    s.proxy.fail_always(Fault::Status(500));
    // Meanwhile someone powers the server on behind rivetd's back: once the BMC answers
    // again, the sync must record that — and not before.
    let on = s.sushy.post(
        &format!(
            "/redfish/v1/Systems/{}/Actions/ComputerSystem.Reset",
            s.sys.uuid
        ),
        json!({"ResetType": "On"}),
    )?;
    anyhow::ensure!(on == 204, "reset: {on}");
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut timeouts_armed = false;
    let n = loop {
        let n = s.rivetd.node(name)?;
        // Whatever the BMC does, the recorded power state never moves while it fails.
        assert_eq!(n["power_state"], "power off", "{n}");
        assert!(n["target_power_state"].is_null(), "{n}");
        let faulted = s.proxy.seen()[from..]
            .iter()
            .filter(|r| r.fault.is_some())
            .count();
        if !timeouts_armed && faulted >= 2 {
            s.proxy.fail_always(Fault::Delay(Duration::from_secs(2)));
            timeouts_armed = true;
        }
        if n["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("power sync"))
        {
            break n;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the sync never recorded the failure: {n}\n{}",
            s.rivetd.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let err = n["last_error"].as_str().unwrap_or_default();
    eprintln!("last_error: {err}");
    assert!(err.contains(name), "names the node: {err}");
    assert!(err.contains(&s.proxy.url), "names the BMC address: {err}");
    assert!(err.contains("power off"), "says which value is kept: {err}");
    assert!(
        err.contains("check"),
        "tells the operator what to check: {err}"
    );
    assert!(err.contains("in time"), "says the BMC timed out: {err}");
    let seen = &s.proxy.seen()[from..];
    assert!(
        seen.iter().any(|r| r.fault == Some(Fault::Status(500))),
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .any(|r| matches!(r.fault, Some(Fault::Delay(_)))),
        "{seen:?}"
    );

    // The BMC is back: the next pass clears the error and records what the BMC says.
    s.proxy.heal();
    s.sushy
        .wait_power(&s.sys.uuid, "On", Duration::from_secs(15))?;
    let n = s.rivetd.wait_node(name, Duration::from_secs(15), |v| {
        v["power_state"] == "power on" && v["last_error"].is_null()
    })?;
    assert_eq!(n["provision_state"], "manageable", "{n}");
    eprintln!(
        "power_sync_keeps_the_last_known_state_through_bmc_faults: {:?}",
        started.elapsed()
    );
    Ok(())
}
