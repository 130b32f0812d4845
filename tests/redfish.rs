//! The `redfish` driver against the real sushy-tools emulator (fake driver, loopback), both
//! through rivetd's API and through the driver directly: `manage` with right and wrong
//! credentials, power on/off/reboot seen in the emulator, the one-time boot override,
//! virtual media insert/eject (the emulator really downloads the image), NIC MACs from
//! out-of-band inspection, the power sync (record and enforce), and the failure modes an
//! operator meets: an unreachable BMC, an https address on a plain-HTTP port, an untrusted
//! certificate — each a clear `last_error` in bounded time, never a hung node.
//!
//! BIOS, firmware update and Processors are tested against the in-tree mock
//! (tests/redfish_mock.rs): sushy's fake driver answers 501/500 for them.
//!
//! Needs `.venv-sushy` (scripts/setup-peers.sh); skipped without it unless
//! RIVET_REQUIRE_PEERS=1.

use rivet_drivers::redfish::RedfishBmc;
use rivet_drivers::{Bmc, BootDevice, BootMode, DriversConfig};
use rivet_tests::peers::{
    closed_port, have_sushy, on_path, FakeSystem, FileServer, Sushy, SushyOptions, TlsFiles,
};
use rivet_tests::{prerequisite, Rivetd};
use serde_json::{json, Map, Value};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const USER: &str = "admin";
const PASSWORD: &str = "s3cret-Right-pw";
const WRONG: &str = "Wr0ng-Pass-xyz";

fn sushy_ok() -> bool {
    prerequisite(
        have_sushy(),
        "sushy-emulator in .venv-sushy (scripts/setup-peers.sh installs sushy-tools)",
    )
}

/// rivetd with a config file (`toml` appended to fast driver polling).
fn rivetd(dir: &Path, toml: &str) -> anyhow::Result<Rivetd> {
    let conf = dir.join("rivetd.toml");
    std::fs::write(
        &conf,
        format!("[drivers]\npoll_interval_ms = 200\n\n{toml}\n"),
    )?;
    let db = dir.join("rivet.db");
    let conf = conf.to_string_lossy().to_string();
    Rivetd::start(&db, 0, &["--config", &conf])
}

fn create(d: &Rivetd, name: &str, driver_info: Value) -> anyhow::Result<()> {
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(json!({"driver": "redfish", "name": name, "driver_info": driver_info, "automated_clean": false})),
    )?;
    anyhow::ensure!(s == 201, "create {name}: {s} {v}");
    Ok(())
}

fn verb(d: &Rivetd, name: &str, target: &str) -> anyhow::Result<()> {
    let (s, v) = d.call(
        "PUT",
        &format!("/v1/nodes/{name}/states/provision"),
        Some(json!({ "target": target })),
    )?;
    anyhow::ensure!(s == 202, "{target} {name}: {s} {v}");
    Ok(())
}

/// `manage`, then wait until verifying is over; the node and how long it took.
fn manage(d: &Rivetd, name: &str) -> anyhow::Result<(Value, Duration)> {
    let started = Instant::now();
    verb(d, name, "manage")?;
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

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn map(v: Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}

#[test]
fn manage_with_right_and_wrong_credentials() -> anyhow::Result<()> {
    if !sushy_ok() {
        return Ok(());
    }
    let sys = FakeSystem::new("node-a", "52:54:00:12:34:01");
    let sushy = Sushy::start(SushyOptions {
        systems: vec![sys.clone()],
        auth: Some((USER.into(), PASSWORD.into())),
        tls: None,
    })?;
    let dir = tempfile::tempdir()?;
    let d = rivetd(dir.path(), "")?;
    create(&d, "good", sushy.driver_info(&sys.uuid, USER, PASSWORD))?;
    create(&d, "bad", sushy.driver_info(&sys.uuid, USER, WRONG))?;

    let (good, _) = manage(&d, "good")?;
    assert_eq!(good["provision_state"], "manageable", "{good}");
    assert_eq!(good["power_state"], "power off", "{good}");

    let (bad, took) = manage(&d, "bad")?;
    assert_eq!(bad["provision_state"], "enroll", "{bad}");
    let err = bad["last_error"].as_str().unwrap_or("");
    eprintln!("wrong password: {err}");
    assert!(
        err.contains("401") && err.contains("redfish_password"),
        "{err}"
    );
    assert!(took < Duration::from_secs(30), "{took:?}");
    assert_eq!(bad["driver_info"]["redfish_password"], "******", "{bad}");

    let everything = format!("{good}{bad}{}", d.log_text());
    for secret in [PASSWORD, WRONG] {
        assert!(
            !everything.contains(secret),
            "a password leaked into the API or the log"
        );
    }
    Ok(())
}

#[test]
fn power_on_off_reboot_reach_the_emulator() -> anyhow::Result<()> {
    if !sushy_ok() {
        return Ok(());
    }
    let sys = FakeSystem::new("node-p", "52:54:00:12:34:02");
    let sushy = Arc::new(Sushy::start(SushyOptions {
        systems: vec![sys.clone()],
        ..SushyOptions::default()
    })?);
    let dir = tempfile::tempdir()?;
    let d = rivetd(dir.path(), "")?;
    create(&d, "p", sushy.driver_info(&sys.uuid, USER, PASSWORD))?;
    let (n, _) = manage(&d, "p")?;
    assert_eq!(n["provision_state"], "manageable", "{n}");

    let n = power(&d, "p", "power on")?;
    assert_eq!(n["power_state"], "power on", "{n}");
    assert!(n["last_error"].is_null(), "{n}");
    assert_eq!(sushy.power_state(&sys.uuid)?, "On");

    // A reboot: a reset action while the system is on; the emulator shows it off for a
    // second or two, then on again.
    let resets_before = sushy.reset_requests();
    let done = Arc::new(AtomicBool::new(false));
    let saw_off = {
        let (sushy, uuid, done) = (sushy.clone(), sys.uuid.clone(), done.clone());
        std::thread::spawn(move || {
            let mut off = false;
            while !done.load(Ordering::SeqCst) {
                off |= sushy
                    .power_state(&uuid)
                    .map(|p| p == "Off")
                    .unwrap_or(false);
                std::thread::sleep(Duration::from_millis(20));
            }
            off
        })
    };
    let n = power(&d, "p", "rebooting")?;
    done.store(true, Ordering::SeqCst);
    assert_eq!(n["power_state"], "power on", "{n}");
    assert!(n["last_error"].is_null(), "{n}");
    assert!(
        sushy.reset_requests() > resets_before,
        "no reset reached the emulator"
    );
    // The off phase can be as short as a few ms (the emulator's delay is whole seconds
    // from a truncated clock), so seeing it is reported, not required.
    eprintln!(
        "reboot: emulator seen off in between: {}",
        saw_off.join().unwrap_or(false)
    );
    assert_eq!(sushy.power_state(&sys.uuid)?, "On");

    let n = power(&d, "p", "power off")?;
    assert_eq!(n["power_state"], "power off", "{n}");
    assert_eq!(sushy.power_state(&sys.uuid)?, "Off");
    Ok(())
}

#[test]
fn boot_override_virtual_media_and_inspection() -> anyhow::Result<()> {
    if !sushy_ok() {
        return Ok(());
    }
    let sys = FakeSystem::new("node-b", "52:54:00:AB:CD:03");
    let sushy = Sushy::start(SushyOptions {
        systems: vec![sys.clone()],
        auth: Some((USER.into(), PASSWORD.into())),
        tls: None,
    })?;
    let mut info = map(sushy.driver_info(&sys.uuid, USER, PASSWORD));
    let bmc = RedfishBmc::new(DriversConfig::default());
    let rt = rt();
    let node = "node-b";

    for (dev, want) in [
        (BootDevice::Pxe, "Pxe"),
        (BootDevice::Cdrom, "Cd"),
        (BootDevice::Disk, "Hdd"),
    ] {
        rt.block_on(bmc.set_boot_device(node, &info, dev, None))?;
        let boot = &sushy.system(&sys.uuid)?["Boot"];
        assert_eq!(boot["BootSourceOverrideTarget"], want, "{boot}");
    }
    info.insert("boot_mode".into(), "bios".into());
    rt.block_on(bmc.set_boot_device(node, &info, BootDevice::Pxe, None))?;
    let boot = &sushy.system(&sys.uuid)?["Boot"];
    assert_eq!(boot["BootSourceOverrideMode"], "Legacy", "{boot}");
    assert_eq!(boot["BootSourceOverrideTarget"], "Pxe", "{boot}");
    // In Legacy mode Secure Boot is refused (Ironic refuses it too), naming what to do.
    let err = rt
        .block_on(bmc.set_secure_boot(node, &info, true))
        .expect_err("secure boot in Legacy");
    assert!(
        err.to_string().contains("set the boot mode to uefi first"),
        "{err}"
    );
    // The mode the conductor passes in wins over the older driver_info field, and is what
    // the BMC then reports.
    rt.block_on(bmc.set_boot_device(node, &info, BootDevice::Pxe, Some(BootMode::Uefi)))?;
    let boot = &sushy.system(&sys.uuid)?["Boot"];
    assert_eq!(boot["BootSourceOverrideMode"], "UEFI", "{boot}");
    let (mode, _) = rt.block_on(bmc.boot_mode(node, &info))?;
    assert_eq!(mode.as_deref(), Some("uefi"));

    // Virtual media: the emulator downloads the image from our file server.
    let files = FileServer::start(b"not really an ISO, but bytes to download".to_vec())?;
    let url = format!("{}/rivet.iso", files.url);
    rt.block_on(bmc.insert_virtual_media(node, &info, &url))?;
    let cd = sushy.get(&format!("/redfish/v1/Systems/{}/VirtualMedia/Cd", sys.uuid))?;
    assert_eq!(cd["Inserted"], true, "{cd}");
    assert_eq!(cd["Image"], url.as_str(), "{cd}");
    assert!(files.hits() >= 1, "the emulator did not download the image");
    rt.block_on(bmc.eject_virtual_media(node, &info))?;
    let cd = sushy.get(&format!("/redfish/v1/Systems/{}/VirtualMedia/Cd", sys.uuid))?;
    assert_eq!(cd["Inserted"], false, "{cd}");
    // Ejecting twice is fine.
    rt.block_on(bmc.eject_virtual_media(node, &info))?;

    let inv = rt.block_on(bmc.inspect(node, &info))?;
    assert_eq!(inv.macs, vec!["52:54:00:ab:cd:03".to_string()]);
    Ok(())
}

#[test]
fn cleaning_boots_the_ramdisk_through_a_pxe_override() -> anyhow::Result<()> {
    if !sushy_ok() {
        return Ok(());
    }
    let sys = FakeSystem::new("node-c", "52:54:00:12:34:04");
    let sushy = Sushy::start(SushyOptions {
        systems: vec![sys.clone()],
        ..SushyOptions::default()
    })?;
    let dir = tempfile::tempdir()?;
    let d = rivetd(dir.path(), "")?;
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(
            json!({"driver": "redfish", "name": "c", "automated_clean": true,
                    "driver_info": sushy.driver_info(&sys.uuid, USER, PASSWORD)}),
        ),
    )?;
    anyhow::ensure!(s == 201, "{v}");
    manage(&d, "c")?;
    // Point the boot override elsewhere first, so the test sees the conductor set it.
    sushy_patch_boot(&sushy, &sys.uuid, "Hdd")?;
    verb(&d, "c", "provide")?;
    let n = d.wait_node("c", Duration::from_secs(60), |v| {
        v["provision_state"] == "clean wait" || v["provision_state"] == "clean failed"
    })?;
    assert_eq!(n["provision_state"], "clean wait", "{n}");
    assert_eq!(
        sushy.system(&sys.uuid)?["Boot"]["BootSourceOverrideTarget"],
        "Pxe"
    );
    sushy.wait_power(&sys.uuid, "On", Duration::from_secs(15))?;
    Ok(())
}

/// `redfish-virtual-media`: cleaning inserts the node's own ISO (the emulator downloads it
/// from rivetd through `external_http_url`), sets the CD override after inserting, powers on;
/// the ISO rivetd serves is image-build's with the node's parameters in its region; the ISO is
/// refused once the node expects no ramdisk. A rivetd without
/// an ISO fails the node with a message naming the setting.
#[test]
fn cleaning_boots_the_ramdisk_from_virtual_media() -> anyhow::Result<()> {
    use rivet_protocol::bootparams;
    if !sushy_ok() {
        return Ok(());
    }
    let sys = FakeSystem::new("node-vm", "52:54:00:12:34:07");
    let sushy = Sushy::start(SushyOptions {
        systems: vec![sys.clone()],
        ..SushyOptions::default()
    })?;
    let dir = tempfile::tempdir()?;
    let artefacts = dir.path().join("artefacts");
    std::fs::create_dir_all(&artefacts)?;
    // An "ISO" shaped like image-build's: bytes, grub.cfg's kernel line with the region, bytes.
    let baked = bootparams::region("rivet.controller=http://baked:6385")?;
    let mut iso = vec![0x5a_u8; 300_000];
    iso.extend(format!("    linux /boot/vmlinuz console=ttyS0 {baked}\n").as_bytes());
    iso.extend(vec![0xa5_u8; 100_000]);
    std::fs::write(artefacts.join("rivet.iso"), &iso)?;
    let port = rivet_tests::free_port()?;
    let conf = dir.path().join("rivetd.toml");
    std::fs::write(
        &conf,
        format!(
            "[drivers]\npoll_interval_ms = 200\n\n[boot]\nartefact_dir = {:?}\n\
             public_url = \"http://192.0.2.10:6385\"\nexternal_http_url = \"http://127.0.0.1:{port}\"\n",
            artefacts.display().to_string()
        ),
    )?;
    let conf = conf.to_string_lossy().to_string();
    let d = Rivetd::start(&dir.path().join("rivet.db"), port, &["--config", &conf])?;
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(
            json!({"driver": "redfish", "name": "vm", "automated_clean": true,
                    "boot_interface": "redfish-virtual-media",
                    "driver_info": sushy.driver_info(&sys.uuid, USER, PASSWORD)}),
        ),
    )?;
    anyhow::ensure!(s == 201, "{v}");
    let uuid = v["uuid"].as_str().unwrap_or_default().to_string();
    assert_eq!(v["boot_interface"], "redfish-virtual-media", "{v}");
    manage(&d, "vm")?;
    let iso_url = format!("{}/boot/iso/{uuid}.iso", d.url);
    let fetch = |url: &str| -> anyhow::Result<(u16, Vec<u8>)> {
        let r = reqwest::blocking::get(url)?;
        Ok((r.status().as_u16(), r.bytes()?.to_vec()))
    };
    assert_eq!(
        fetch(&iso_url)?.0,
        404,
        "no ISO for a node that expects no ramdisk"
    );

    sushy_patch_boot(&sushy, &sys.uuid, "Hdd")?;
    verb(&d, "vm", "provide")?;
    let n = d.wait_node("vm", Duration::from_secs(60), |v| {
        v["provision_state"] == "clean wait" || v["provision_state"] == "clean failed"
    })?;
    assert_eq!(n["provision_state"], "clean wait", "{n}");
    let cd = sushy.get(&format!("/redfish/v1/Systems/{}/VirtualMedia/Cd", sys.uuid))?;
    assert_eq!(cd["Inserted"], true, "{cd}");
    assert_eq!(cd["Image"], iso_url.as_str(), "{cd}");
    assert_eq!(
        sushy.system(&sys.uuid)?["Boot"]["BootSourceOverrideTarget"],
        "Cd"
    );
    sushy.wait_power(&sys.uuid, "On", Duration::from_secs(15))?;

    // The served ISO is the artefact with only the region changed, to this node's.
    let (status, served) = fetch(&iso_url)?;
    assert_eq!(status, 200);
    assert_eq!(served.len(), iso.len());
    let at = bootparams::find_regions(&served);
    assert_eq!(at, bootparams::find_regions(&iso));
    let region = String::from_utf8_lossy(&served[at[0]..at[0] + bootparams::WIDTH]).to_string();
    assert_eq!(
        region.trim_end(),
        format!("rivet.params=v1 rivet.controller=http://192.0.2.10:6385 rivet.node={uuid}")
    );
    let mut rest = served.clone();
    rest[at[0]..at[0] + bootparams::WIDTH].copy_from_slice(baked.as_bytes());
    assert!(rest == iso, "bytes outside the region changed");

    // Abort: the node leaves the ramdisk states, so its ISO is no longer served. (Ejecting
    // when a run finishes is seen in the VM lab scenario, where a real agent finishes it.)
    verb(&d, "vm", "abort")?;
    let n = d.wait_node("vm", Duration::from_secs(30), |v| {
        v["provision_state"] == "clean failed"
    })?;
    assert_eq!(n["provision_state"], "clean failed", "{n}");
    assert_eq!(
        fetch(&iso_url)?.0,
        404,
        "no ISO once the ramdisk is not expected"
    );

    // Without its ISO, a virtual-media boot fails the node and says what to set.
    std::fs::remove_file(artefacts.join("rivet.iso"))?;
    verb(&d, "vm", "manage")?;
    d.wait_node("vm", Duration::from_secs(30), |v| {
        v["provision_state"] == "manageable"
    })?;
    verb(&d, "vm", "provide")?;
    let n = d.wait_node("vm", Duration::from_secs(30), |v| {
        v["provision_state"] == "clean failed"
    })?;
    let err = n["last_error"].as_str().unwrap_or_default();
    assert!(err.contains("rivet.iso") && err.contains("vm"), "{n}");
    Ok(())
}

fn sushy_patch_boot(sushy: &Sushy, uuid: &str, target: &str) -> anyhow::Result<()> {
    let rt = rt();
    let info = map(sushy.driver_info(uuid, USER, PASSWORD));
    let dev = match target {
        "Hdd" => BootDevice::Disk,
        "Cd" => BootDevice::Cdrom,
        _ => BootDevice::Pxe,
    };
    rt.block_on(RedfishBmc::default().set_boot_device("setup", &info, dev, None))?;
    Ok(())
}

#[test]
fn power_sync_records_or_enforces() -> anyhow::Result<()> {
    if !sushy_ok() {
        return Ok(());
    }
    let rec = FakeSystem::new("node-rec", "52:54:00:12:34:05");
    let enf = FakeSystem::new("node-enf", "52:54:00:12:34:06");
    let sushy = Sushy::start(SushyOptions {
        systems: vec![rec.clone(), enf.clone()],
        ..SushyOptions::default()
    })?;
    let (d1, d2) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let recorder = rivetd(
        d1.path(),
        "[power_sync]\ninterval_s = 1\npolicy = \"record\"",
    )?;
    let enforcer = rivetd(
        d2.path(),
        "[power_sync]\ninterval_s = 1\npolicy = \"enforce\"",
    )?;
    create(
        &recorder,
        "rec",
        sushy.driver_info(&rec.uuid, USER, PASSWORD),
    )?;
    create(
        &enforcer,
        "enf",
        sushy.driver_info(&enf.uuid, USER, PASSWORD),
    )?;
    for (d, name) in [(&recorder, "rec"), (&enforcer, "enf")] {
        let (n, _) = manage(d, name)?;
        assert_eq!(n["power_state"], "power off", "{n}");
    }

    // Someone powers both servers on behind rivetd's back.
    for uuid in [&rec.uuid, &enf.uuid] {
        let s = sushy.post(
            &format!("/redfish/v1/Systems/{uuid}/Actions/ComputerSystem.Reset"),
            json!({"ResetType": "On"}),
        )?;
        anyhow::ensure!(s == 204, "reset: {s}");
    }
    // record: the node follows the BMC.
    recorder.wait_node("rec", Duration::from_secs(30), |v| {
        v["power_state"] == "power on"
    })?;
    // enforce: the sync sees the BMC on (its own log says so: polling the BMC for the
    // transient "On" races the enforcer under load) and turns it off again.
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    while !enforcer
        .log_text()
        .contains("BMC differs from the recorded power state; enforcing")
    {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the enforcer never saw the BMC powered on; log:\n{}",
            enforcer.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    sushy.wait_power(&enf.uuid, "Off", Duration::from_secs(40))?;
    // The sync holds target_power_state while it works, and releases it once the BMC
    // reports the enforced state.
    let n = enforcer.wait_node("enf", Duration::from_secs(10), |v| {
        v["target_power_state"].is_null()
    })?;
    assert_eq!(n["power_state"], "power off", "{n}");
    assert!(n["last_error"].is_null(), "{n}");
    Ok(())
}

#[test]
fn unreachable_bmc_and_tls_failures_end_in_enroll_quickly() -> anyhow::Result<()> {
    if !sushy_ok() {
        return Ok(());
    }
    let sys = FakeSystem::new("node-t", "52:54:00:12:34:07");
    let plain = Sushy::start(SushyOptions {
        systems: vec![sys.clone()],
        ..SushyOptions::default()
    })?;
    let dir = tempfile::tempdir()?;
    let d = rivetd(dir.path(), "")?;
    let mut cases: Vec<(&str, Value, &str)> = Vec::new();
    let port = closed_port()?;
    cases.push((
        "unreachable",
        json!({"redfish_address": format!("http://127.0.0.1:{port}"), "redfish_system_id": sys.uuid,
               "redfish_username": USER, "redfish_password": PASSWORD}),
        "cannot connect",
    ));
    cases.push((
        "https-on-http",
        json!({"redfish_address": format!("https://127.0.0.1:{}", plain.port), "redfish_system_id": sys.uuid,
               "redfish_username": USER, "redfish_password": PASSWORD}),
        "TLS failure",
    ));

    // A BMC with a certificate from a CA rivetd does not trust, unless told to.
    let certs = tempfile::tempdir()?;
    let tls = if on_path("openssl") {
        let files = TlsFiles::generate(certs.path())?;
        let s = Sushy::start(SushyOptions {
            systems: vec![sys.clone()],
            auth: None,
            tls: Some((files.cert.clone(), files.key.clone())),
        })?;
        Some((files, s))
    } else {
        prerequisite(false, "openssl CLI (for the TLS certificate cases)");
        None
    };
    if let Some((_, s)) = &tls {
        cases.push((
            "untrusted-cert",
            json!({"redfish_address": s.url, "redfish_system_id": sys.uuid,
                   "redfish_username": USER, "redfish_password": PASSWORD}),
            "certificate",
        ));
    }
    for (name, info, _) in &cases {
        create(&d, name, info.clone())?;
    }
    for (name, _, want) in &cases {
        let (n, took) = manage(&d, name)?;
        assert_eq!(n["provision_state"], "enroll", "{name}: {n}");
        let err = n["last_error"].as_str().unwrap_or("");
        eprintln!("{name} ({took:?}): {err}");
        assert!(err.contains(want), "{name}: {err}");
        assert!(!err.contains(PASSWORD), "{name}: {err}");
        assert!(took < Duration::from_secs(30), "{name} took {took:?}");
    }

    // The same BMC is fine with its CA as redfish_verify_ca, or with verification off.
    if let Some((files, s)) = &tls {
        let base = json!({"redfish_address": s.url, "redfish_system_id": sys.uuid,
                          "redfish_username": USER, "redfish_password": PASSWORD});
        let mut with_ca = base.clone();
        with_ca["redfish_verify_ca"] = files.ca.to_string_lossy().to_string().into();
        let mut no_verify = base;
        no_verify["redfish_verify_ca"] = false.into();
        create(&d, "with-ca", with_ca)?;
        create(&d, "no-verify", no_verify)?;
        for name in ["with-ca", "no-verify"] {
            let (n, _) = manage(&d, name)?;
            assert_eq!(n["provision_state"], "manageable", "{name}: {n}");
        }
    }
    Ok(())
}

/// redfish nodes reach no state without its work: deploy boots the ramdisk through a Pxe
/// override and waits for an agent, abort powers the system off in the emulator, adopt
/// reads the BMC, rescue is refused up front (tests/workcheck.rs).
#[test]
fn no_state_without_work_through_sushy() -> anyhow::Result<()> {
    if !sushy_ok() {
        return Ok(());
    }
    let sys = FakeSystem::new("node-w", "52:54:00:12:34:09");
    let sushy = Sushy::start(SushyOptions {
        systems: vec![sys.clone()],
        ..SushyOptions::default()
    })?;
    let dir = tempfile::tempdir()?;
    let d = rivetd(dir.path(), "")?;
    create(&d, "w", sushy.driver_info(&sys.uuid, USER, PASSWORD))?;
    let (n, _) = manage(&d, "w")?;
    assert_eq!(n["provision_state"], "manageable", "{n}");
    assert_eq!(n["deploy_interface"], "direct", "{n}");
    rivet_tests::workcheck::no_state_without_work(&d, "w", &|| {
        Ok(sushy.power_state(&sys.uuid)? == "Off")
    })?;
    Ok(())
}
