//! The stock python-ironicclient (`baremetal`) drives the core flow against rivetd:
//! node create, list, show, manage.

use rivet_tests::{prerequisite, Rivetd};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

fn baremetal() -> PathBuf {
    std::env::var_os("RIVET_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv")))
        .join("bin/baremetal")
}

fn run(d: &Rivetd, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(baremetal())
        .args(["--os-endpoint", &d.url, "--os-auth-type", "none"])
        .args(args)
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    anyhow::ensure!(
        out.status.success(),
        "baremetal {args:?} failed: {}\nstdout: {stdout}\nstderr: {}\nrivetd log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        d.log_text()
    );
    Ok(stdout)
}

#[test]
fn stock_ironic_client_drives_core_flow() -> anyhow::Result<()> {
    if !prerequisite(
        baremetal().exists(),
        "python-ironicclient venv (.venv/bin/baremetal)",
    ) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start(&dir.path().join("rivet.db"), 0, &[])?;

    let created = run(
        &d,
        &[
            "node",
            "create",
            "--driver",
            "fake-hardware",
            "--name",
            "n1",
            "-f",
            "json",
        ],
    )?;
    let created: serde_json::Value = serde_json::from_str(&created)?;
    assert_eq!(created["name"], "n1");
    assert_eq!(created["provision_state"], "enroll");

    let list = run(&d, &["node", "list", "-f", "json"])?;
    let list: serde_json::Value = serde_json::from_str(&list)?;
    assert_eq!(list[0]["name"], "n1", "{list}");

    let long = run(&d, &["node", "list", "--long", "-f", "json"])?;
    assert!(long.contains("fake-hardware"), "{long}");

    let show = run(&d, &["node", "show", "n1", "-f", "json"])?;
    let show: serde_json::Value = serde_json::from_str(&show)?;
    assert_eq!(show["uuid"], created["uuid"]);
    assert_eq!(show["driver"], "fake-hardware");

    run(&d, &["node", "manage", "n1"])?;
    d.wait_node("n1", Duration::from_secs(20), |v| {
        v["provision_state"] == "manageable"
    })?;
    let state = run(
        &d,
        &["node", "show", "n1", "-f", "value", "-c", "provision_state"],
    )?;
    assert_eq!(state.trim(), "manageable");

    // The controllers and the node's owner, as Ironic's conductor API shows them.
    let conductors = run(&d, &["conductor", "list", "-f", "json"])?;
    let conductors: serde_json::Value = serde_json::from_str(&conductors)?;
    assert_eq!(conductors[0]["hostname"], "test-conductor", "{conductors}");
    assert_eq!(conductors[0]["alive"], true, "{conductors}");
    let owner = run(
        &d,
        &["node", "show", "n1", "-f", "value", "-c", "conductor"],
    )?;
    assert_eq!(owner.trim(), "test-conductor");

    // An error comes back as the client's error text, not a crash.
    let out = Command::new(baremetal())
        .args([
            "--os-endpoint",
            &d.url,
            "--os-auth-type",
            "none",
            "node",
            "show",
            "ghost",
        ])
        .output()?;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ghost"), "{stderr}");
    Ok(())
}
