//! The `ipmi` driver against OpenIPMI's `ipmi_sim` (Debian `openipmi`) with ipmitool:
//! `manage`, power on/off/reboot and the boot device as the simulator's chassis_control
//! script records them; a wrong password and an unreachable BMC end `manage` in enroll with
//! a clear last_error in bounded time; the password never appears on ipmitool's command
//! line (a wrapper around ipmitool records what rivetd passes).
//!
//! Needs ipmi_sim and ipmitool (scripts/setup-peers.sh); skipped without them unless
//! RIVET_REQUIRE_PEERS=1.

use rivet_drivers::ipmi::IpmiBmc;
use rivet_drivers::{Bmc, BootDevice, BootMode, DriversConfig};
use rivet_tests::peers::{free_udp_port, have_ipmi_sim, IpmiSim};
use rivet_tests::{prerequisite, Rivetd};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

const USER: &str = "admin";
const PASSWORD: &str = "ipmi-S3cret-pw";
const WRONG: &str = "ipmi-Wr0ng-pw";

fn ipmi_ok() -> bool {
    prerequisite(
        have_ipmi_sim(),
        "ipmi_sim and ipmitool (Debian openipmi, ipmitool; scripts/setup-peers.sh)",
    )
}

/// An ipmitool wrapper that logs its arguments and whether IPMI_PASSWORD is set.
fn wrapper(dir: &Path) -> anyhow::Result<(String, std::path::PathBuf)> {
    let log = dir.join("ipmitool-calls.log");
    let script = dir.join("ipmitool-wrapper.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"ARGS $*\" >> {log}\n[ -n \"${{IPMI_PASSWORD+x}}\" ] && echo \"ENV IPMI_PASSWORD set\" >> {log}\nexec ipmitool \"$@\"\n",
            log = log.display()
        ),
    )?;
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&script)
        .status()?;
    Ok((script.display().to_string(), log))
}

fn rivetd(dir: &Path, ipmitool: &str) -> anyhow::Result<Rivetd> {
    let conf = dir.join("rivetd.toml");
    std::fs::write(
        &conf,
        format!("[drivers]\npoll_interval_ms = 100\nipmitool = {ipmitool:?}\n"),
    )?;
    let conf = conf.to_string_lossy().to_string();
    Rivetd::start(&dir.join("rivet.db"), 0, &["--config", &conf])
}

fn create(d: &Rivetd, name: &str, info: Value) -> anyhow::Result<()> {
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(json!({"driver": "ipmi", "name": name, "driver_info": info})),
    )?;
    anyhow::ensure!(s == 201, "create {name}: {s} {v}");
    Ok(())
}

fn manage(d: &Rivetd, name: &str) -> anyhow::Result<(Value, Duration)> {
    let started = Instant::now();
    let (s, v) = d.call(
        "PUT",
        &format!("/v1/nodes/{name}/states/provision"),
        Some(json!({"target": "manage"})),
    )?;
    anyhow::ensure!(s == 202, "manage {name}: {s} {v}");
    let v = d.wait_node(name, Duration::from_secs(60), |v| {
        v["provision_state"] != "verifying" && v["target_provision_state"].is_null()
    })?;
    Ok((v, started.elapsed()))
}

fn power(d: &Rivetd, name: &str, target: &str) -> anyhow::Result<Value> {
    let (s, v) = d.call(
        "PUT",
        &format!("/v1/nodes/{name}/states/power"),
        Some(json!({ "target": target })),
    )?;
    anyhow::ensure!(s == 202, "power {target} {name}: {s} {v}");
    d.wait_node(name, Duration::from_secs(60), |v| {
        v["target_power_state"].is_null()
    })
}

#[test]
fn manage_and_power_through_ipmi_sim() -> anyhow::Result<()> {
    if !ipmi_ok() {
        return Ok(());
    }
    let sim = IpmiSim::start(USER, PASSWORD)?;
    let dir = tempfile::tempdir()?;
    let (ipmitool, calls) = wrapper(dir.path())?;
    let d = rivetd(dir.path(), &ipmitool)?;
    create(&d, "i", sim.driver_info(PASSWORD))?;

    let (n, _) = manage(&d, "i")?;
    assert_eq!(n["provision_state"], "manageable", "{n}");
    assert_eq!(n["power_state"], "power off", "{n}");
    assert_eq!(n["driver_info"]["ipmi_password"], "******");

    let n = power(&d, "i", "power on")?;
    assert_eq!(n["power_state"], "power on", "{n}");
    assert!(n["last_error"].is_null(), "{n}");
    assert_eq!(sim.power(), "1");

    let n = power(&d, "i", "rebooting")?;
    assert_eq!(n["power_state"], "power on", "{n}");
    assert!(sim.calls().contains("set reset 1"), "{}", sim.calls());

    let n = power(&d, "i", "power off")?;
    assert_eq!(n["power_state"], "power off", "{n}");
    assert_eq!(sim.power(), "0");

    // What rivetd ran: lanplus with -C 3, the password only in the environment.
    let log = std::fs::read_to_string(&calls)?;
    assert!(
        log.contains("-I lanplus") && log.contains("-C 3") && log.contains(" -E"),
        "{log}"
    );
    assert!(log.contains("ENV IPMI_PASSWORD set"), "{log}");
    assert!(
        !log.contains(PASSWORD),
        "the password reached the command line"
    );
    assert!(
        !d.log_text().contains(PASSWORD),
        "the password reached the log"
    );
    Ok(())
}

#[test]
fn wrong_password_and_unreachable_bmc_end_in_enroll_quickly() -> anyhow::Result<()> {
    if !ipmi_ok() {
        return Ok(());
    }
    let sim = IpmiSim::start(USER, PASSWORD)?;
    let dir = tempfile::tempdir()?;
    let d = rivetd(dir.path(), "ipmitool")?;
    let silent = free_udp_port()?;
    let cases = [
        (
            "wrong-password",
            sim.driver_info(WRONG),
            "check ipmi_password",
        ),
        (
            "wrong-user",
            json!({"ipmi_address": "127.0.0.1", "ipmi_port": sim.port, "ipmi_username": "nobody", "ipmi_password": PASSWORD}),
            "check ipmi_username",
        ),
        (
            "unreachable",
            json!({"ipmi_address": "127.0.0.1", "ipmi_port": silent, "ipmi_username": USER, "ipmi_password": PASSWORD}),
            "no answer",
        ),
    ];
    for (name, info, _) in &cases {
        create(&d, name, info.clone())?;
    }
    for (name, _, want) in &cases {
        let (n, took) = manage(&d, name)?;
        let err = n["last_error"].as_str().unwrap_or("");
        eprintln!("{name} ({took:?}): {err}");
        assert_eq!(n["provision_state"], "enroll", "{name}: {n}");
        assert!(err.contains(want), "{name}: {err}");
        assert!(
            !err.contains(PASSWORD) && !err.contains(WRONG),
            "{name}: {err}"
        );
        assert!(took < Duration::from_secs(30), "{name} took {took:?}");
    }
    assert!(!d.log_text().contains(WRONG), "a password reached the log");
    Ok(())
}

#[test]
fn boot_device_reaches_the_chassis() -> anyhow::Result<()> {
    if !ipmi_ok() {
        return Ok(());
    }
    let sim = IpmiSim::start(USER, PASSWORD)?;
    let info = sim.driver_info(PASSWORD);
    let info = info.as_object().cloned().unwrap_or_default();
    let bmc = IpmiBmc::new(DriversConfig::default());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    for (dev, want) in [
        (BootDevice::Pxe, "pxe"),
        (BootDevice::Disk, "default"),
        (BootDevice::Cdrom, "cdrom"),
        (BootDevice::Pxe, "pxe"),
    ] {
        rt.block_on(bmc.set_boot_device("n1", &info, dev, None))?;
        assert_eq!(sim.boot(), want, "{dev:?}");
    }
    let mut uefi = info.clone();
    uefi.insert("boot_mode".into(), "uefi".into());
    rt.block_on(bmc.set_boot_device("n1", &uefi, BootDevice::Disk, None))?;
    assert_eq!(sim.boot(), "default");
    Ok(())
}

/// The boot mode rides on the boot device override as IPMI's EFI boot flag. ipmi_sim keeps
/// only the device of a Set System Boot Options request (its `bootparam get 5` rebuilds the
/// flags from the chassis script's device, always "legacy"), so the flag cannot be read back
/// from it: the test runs the real ipmitool through a wrapper that records its arguments,
/// checks ipmi_sim accepted each request (the device reached the chassis) and that exactly
/// the uefi requests carried `efiboot`.
#[test]
fn boot_mode_rides_on_the_override_as_the_efi_flag() -> anyhow::Result<()> {
    if !ipmi_ok() {
        return Ok(());
    }
    let sim = IpmiSim::start(USER, PASSWORD)?;
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("args");
    let wrapper = dir.path().join("ipmitool");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\necho \"$*\" >> {}\nexec ipmitool \"$@\"\n",
            log.display()
        ),
    )?;
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&wrapper)
        .status()?;
    let bmc = IpmiBmc::new(DriversConfig {
        ipmitool: wrapper.to_string_lossy().into_owned(),
        ..DriversConfig::default()
    });
    let info = sim.driver_info(PASSWORD);
    let mut info = info.as_object().cloned().unwrap_or_default();
    // The older driver_info field says bios: the mode passed in wins over it.
    info.insert("boot_mode".into(), "bios".into());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let last = || -> anyhow::Result<String> {
        let text = std::fs::read_to_string(&log)?;
        Ok(text.lines().last().unwrap_or_default().to_string())
    };
    rt.block_on(bmc.set_boot_device("n1", &info, BootDevice::Pxe, Some(BootMode::Uefi)))?;
    assert_eq!(sim.boot(), "pxe");
    let sent = last()?;
    assert!(
        sent.ends_with("chassis bootdev pxe options=efiboot"),
        "{sent}"
    );
    rt.block_on(bmc.set_boot_device_persistent(
        "n1",
        &info,
        BootDevice::Disk,
        Some(BootMode::Uefi),
    ))?;
    assert_eq!(sim.boot(), "default");
    let sent = last()?;
    assert!(
        sent.ends_with("chassis bootdev disk options=persistent,efiboot"),
        "{sent}"
    );
    rt.block_on(bmc.set_boot_device("n1", &info, BootDevice::Pxe, Some(BootMode::Bios)))?;
    let sent = last()?;
    assert!(sent.ends_with("chassis bootdev pxe"), "{sent}");
    // No mode passed: driver_info's (bios) applies, no flag.
    rt.block_on(bmc.set_boot_device("n1", &info, BootDevice::Cdrom, None))?;
    assert_eq!(sim.boot(), "cdrom");
    assert!(last()?.ends_with("chassis bootdev cdrom"));
    // What ipmi_sim answers for the boot flags: the device it kept.
    let flags = sim.ipmitool(&["chassis", "bootparam", "get", "5"])?;
    assert!(
        flags.contains("Boot Device Selector : Force Boot from CD/DVD"),
        "{flags}"
    );
    Ok(())
}

/// ipmi nodes reach no state without its work: deploy waits for an agent (the ramdisk boot
/// reaches the chassis), abort powers the chassis off, adopt reads the BMC, rescue is
/// refused up front (tests/workcheck.rs).
#[test]
fn no_state_without_work_through_ipmi_sim() -> anyhow::Result<()> {
    if !ipmi_ok() {
        return Ok(());
    }
    let sim = IpmiSim::start(USER, PASSWORD)?;
    let dir = tempfile::tempdir()?;
    let d = rivetd(dir.path(), "ipmitool")?;
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(
            json!({"driver": "ipmi", "name": "w", "automated_clean": false,
                    "driver_info": sim.driver_info(PASSWORD)}),
        ),
    )?;
    anyhow::ensure!(s == 201, "{v}");
    assert_eq!(v["deploy_interface"], "direct");
    assert_eq!(v["boot_interface"], "ipxe");
    let (n, _) = manage(&d, "w")?;
    assert_eq!(n["provision_state"], "manageable", "{n}");
    rivet_tests::workcheck::no_state_without_work(&d, "w", &|| Ok(sim.power() == "0"))?;
    // The deploy step set a network boot at the chassis; tear-down left it there for the
    // next (cleaning) boot, persistently.
    assert!(sim.calls().contains("set boot pxe"), "{}", sim.calls());
    Ok(())
}

/// A node as Metal3's tooling enrols it (`driver: ipmi`, `boot_interface: ipxe`,
/// `raid_interface: agent`) is accepted, keeps a validated target RAID configuration, and
/// goes through manage and provide as any ipmi node; provide builds no array by itself.
/// (The agent RAID steps themselves: tests/raid_api.rs.)
#[test]
fn metal3_style_agent_raid_node_manages_and_provides() -> anyhow::Result<()> {
    if !ipmi_ok() {
        return Ok(());
    }
    let sim = IpmiSim::start(USER, PASSWORD)?;
    let dir = tempfile::tempdir()?;
    let d = rivetd(dir.path(), "ipmitool")?;
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(
            json!({"driver": "ipmi", "name": "m3", "boot_interface": "ipxe",
                    "raid_interface": "agent", "automated_clean": false,
                    "driver_info": sim.driver_info(PASSWORD)}),
        ),
    )?;
    anyhow::ensure!(s == 201, "{v}");
    assert_eq!(v["raid_interface"], "agent");
    let cfg =
        json!({"logical_disks": [{"raid_level": "1", "size_gb": "MAX", "is_root_volume": true}]});
    let (s, v) = d.call("PUT", "/v1/nodes/m3/states/raid", Some(cfg.clone()))?;
    anyhow::ensure!(s == 204, "{v}");
    let (n, _) = manage(&d, "m3")?;
    assert_eq!(n["provision_state"], "manageable", "{n}");
    assert_eq!(n["target_raid_config"], cfg, "{n}");
    let (s, v) = d.call(
        "PUT",
        "/v1/nodes/m3/states/provision",
        Some(json!({"target": "provide"})),
    )?;
    anyhow::ensure!(s == 202, "{v}");
    let n = d.wait_node("m3", Duration::from_secs(60), |v| {
        v["target_provision_state"].is_null() && v["provision_state"] != "cleaning"
    })?;
    assert_eq!(n["provision_state"], "available", "{n}");
    assert!(n["last_error"].is_null(), "{n}");
    assert_eq!(n["raid_config"], json!({}), "no array was pretended: {n}");
    Ok(())
}
