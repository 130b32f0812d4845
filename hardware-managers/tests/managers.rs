//! Dispatch across managers: the example vendor manager overrides the generic one by
//! support level; exec plugins run through the adapter, report progress, and fail clearly.

use crate::common;
use common::*;
use rivet_hardware_managers::plugin::{load_dir, PluginError};
use rivet_hardware_managers::{
    default_managers, Dispatcher, ExampleVendorManager, ExecPlugin, GenericManager,
    HardwareManager, ManagerConfig, StepContext, StepError, SupportLevel,
};
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn example_plugin() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("plugins/example-firmware")
}

fn write_plugin(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).expect("write plugin");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    p
}

/// describe/steps that work, with a custom execute body.
fn plugin_with_execute(dir: &Path, name: &str, abortable: bool, execute: &str) -> PathBuf {
    write_plugin(
        dir,
        name,
        &format!(
            r#"case "$1" in
describe) echo '{{"name": "{name}", "support_level": 2}}' ;;
steps) echo '[{{"interface": "deploy", "step": "{name}_step", "priority": 0, "abortable": {abortable}}}]' ;;
execute) cat >/dev/null; {execute} ;;
esac"#
        ),
    )
}

fn fast_cfg() -> ManagerConfig {
    ManagerConfig {
        plugin_describe_timeout: Duration::from_millis(800),
        plugin_kill_grace: Duration::from_millis(300),
        ..ManagerConfig::default()
    }
}

fn vendor_dmi(dir: &Path, vendor: &str) -> PathBuf {
    let dmi = dir.join("dmi");
    std::fs::create_dir_all(&dmi).expect("mkdir");
    std::fs::write(dmi.join("sys_vendor"), format!("{vendor}\n")).expect("write");
    dmi
}

#[test]
fn vendor_manager_overrides_generic_by_support_level() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let disk = sparse(dir.path(), "disk.img", 4 << 20)?;
    write_at(&disk, 0, &pattern(4096, 1))?;
    let cfg = ManagerConfig {
        devices: Some(vec![disk.clone()]),
        ..ManagerConfig::default()
    };
    let dmi = vendor_dmi(dir.path(), "Rivet Example Corp");
    let vendor = Arc::new(ExampleVendorManager::with_dmi(
        &cfg,
        &dmi,
        "Rivet Example Corp",
    ));
    assert_eq!(vendor.evaluate_support(), SupportLevel::Vendor);
    // Generic registered first: order must not matter, support level does.
    let d = Dispatcher::new(vec![
        Arc::new(GenericManager::new(&cfg)),
        vendor.clone() as Arc<dyn HardwareManager>,
    ]);
    let levels: Vec<_> = d.managers().map(|(n, l)| (n.to_string(), l)).collect();
    assert_eq!(
        levels[0],
        (
            "example_vendor_hardware_manager".into(),
            SupportLevel::Vendor
        )
    );
    let r = step(&d, "erase_devices_metadata", json!({}))?;
    assert_eq!(r["manager"], json!("example_vendor_hardware_manager"));
    assert_eq!(vendor.metadata_runs(), 1);
    assert_eq!(
        first_nonzero(&disk)?,
        None,
        "delegated to the generic erase"
    );
    // The generic-only steps still run on the generic manager.
    assert!(d.step("erase_devices").is_some());
    // The vendor step, with its required argument checked by the dispatcher.
    let s = d.step("example_vendor_step").expect("offered");
    assert_eq!((s.priority, s.interface.as_str()), (0, "deploy"));
    assert!(matches!(
        step(&d, "example_vendor_step", json!({})),
        Err(StepError::BadArgument { name, .. }) if name == "setting"
    ));
    assert_eq!(
        step(&d, "example_vendor_step", json!({"setting": "turbo=off"}))?["applied"],
        json!("turbo=off")
    );
    Ok(())
}

#[test]
fn vendor_manager_drops_out_on_other_hardware() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let disk = sparse(dir.path(), "disk.img", 4 << 20)?;
    let cfg = ManagerConfig {
        devices: Some(vec![disk]),
        ..ManagerConfig::default()
    };
    let dmi = vendor_dmi(dir.path(), "Some Other Vendor");
    let vendor = Arc::new(ExampleVendorManager::with_dmi(
        &cfg,
        &dmi,
        "Rivet Example Corp",
    ));
    let d = Dispatcher::new(vec![
        vendor.clone() as Arc<dyn HardwareManager>,
        Arc::new(GenericManager::new(&cfg)),
    ]);
    assert_eq!(d.managers().count(), 1);
    assert!(d.step("example_vendor_step").is_none());
    let r = step(&d, "erase_devices_metadata", json!({}))?;
    assert!(r.get("manager").is_none());
    assert_eq!(vendor.metadata_runs(), 0);
    // Missing DMI file: same.
    let v2 = ExampleVendorManager::with_dmi(&cfg, dir.path().join("nope"), "Rivet Example Corp");
    assert_eq!(v2.evaluate_support(), SupportLevel::None);
    Ok(())
}

#[test]
fn example_plugin_runs_its_step_and_reports_progress() -> anyhow::Result<()> {
    let cfg = ManagerConfig::default();
    let p = ExecPlugin::load(&example_plugin(), &cfg)?;
    assert_eq!(p.name(), "example-firmware");
    assert_eq!(p.evaluate_support(), SupportLevel::Mainline);
    let cfg = ManagerConfig {
        devices: Some(vec![]),
        ..ManagerConfig::default()
    };
    let d = Dispatcher::new(vec![Arc::new(GenericManager::new(&cfg)), Arc::new(p)]);
    let s = d.step("update_firmware").expect("offered by the plugin");
    assert!(!s.abortable);
    assert!(s.argsinfo["version"].required);
    assert!(matches!(
        step(&d, "update_firmware", json!({})),
        Err(StepError::BadArgument { .. })
    ));
    // Watch the progress while it runs.
    let ctx = StepContext::new();
    let seen = std::sync::Mutex::new(Vec::new());
    let done = std::sync::atomic::AtomicBool::new(false);
    let r = std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                if let Some(p) = ctx.progress() {
                    let mut v = seen.lock().expect("lock");
                    if v.last() != Some(&(p.done, p.total)) {
                        v.push((p.done, p.total));
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        let r = d.execute("update_firmware", &args(json!({"version": "2.1"})), &ctx);
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = watcher.join();
        r
    })?;
    assert_eq!(r, json!({"updated_to": "2.1"}));
    let seen = seen.into_inner().expect("lock");
    assert_eq!(
        seen,
        vec![(1, 3), (2, 3), (3, 3)],
        "progress lines became ctx progress"
    );
    assert_eq!(ctx.progress().map(|p| p.message), Some("verifying".into()));
    Ok(())
}

#[test]
fn crashing_plugin_is_a_clear_failure() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = plugin_with_execute(
        dir.path(),
        "crasher",
        true,
        "echo 'flux capacitor overheated' >&2; kill -SEGV $$",
    );
    let p = ExecPlugin::load(&path, &fast_cfg())?;
    let e = p
        .execute("crasher_step", &args(json!({})), &StepContext::new())
        .expect_err("crash");
    let msg = e.to_string();
    assert!(matches!(e, StepError::Failed(_)), "{e:?}");
    assert!(
        msg.contains("crasher") && msg.contains("signal 11"),
        "{msg}"
    );
    assert!(msg.contains("flux capacitor overheated"), "{msg}");
    // Non-zero exit: the stderr tail is the error.
    let path = plugin_with_execute(dir.path(), "exiter", true, "echo 'no such BMC' >&2; exit 3");
    let e = ExecPlugin::load(&path, &fast_cfg())?
        .execute("exiter_step", &args(json!({})), &StepContext::new())
        .expect_err("exit 3");
    assert!(
        e.to_string().contains("exit status 3") && e.to_string().contains("no such BMC"),
        "{e}"
    );
    Ok(())
}

#[test]
fn garbage_printing_plugin_is_a_clear_failure() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // Garbage at describe: load fails, naming the plugin and quoting what it printed.
    let junk = "<html>Internal Server Error</html> ".repeat(20);
    let path = write_plugin(dir.path(), "junk", &format!("echo '{junk}'"));
    let e = ExecPlugin::load(&path, &fast_cfg()).expect_err("garbage describe");
    assert!(matches!(e, PluginError::BadOutput { .. }), "{e:?}");
    let msg = StepError::from(e).to_string();
    assert!(
        msg.contains("junk") && msg.contains("<html>Internal Server Error"),
        "{msg}"
    );
    assert!(msg.len() < 600, "quotes at most 200 chars: {msg}");
    // Garbage at execute.
    let path = plugin_with_execute(dir.path(), "babbler", true, "echo 'OK!! done :)'");
    let e = ExecPlugin::load(&path, &fast_cfg())?
        .execute("babbler_step", &args(json!({})), &StepContext::new())
        .expect_err("garbage result");
    assert!(
        e.to_string().contains("babbler") && e.to_string().contains("OK!! done :)"),
        "{e}"
    );
    // Bad steps JSON.
    let path = write_plugin(
        dir.path(),
        "badsteps",
        r#"case "$1" in describe) echo '{"name":"badsteps","support_level":1}';; steps) echo '[{"step": 5}]';; esac"#,
    );
    let e = ExecPlugin::load(&path, &fast_cfg()).expect_err("bad steps");
    assert!(
        e.to_string().contains("badsteps") && e.to_string().contains("steps"),
        "{e}"
    );
    Ok(())
}

#[test]
fn hanging_plugin_times_out_at_describe() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = write_plugin(dir.path(), "sleeper", "echo 'warming up' >&2; sleep 30");
    let t = Instant::now();
    let e = ExecPlugin::load(&path, &fast_cfg()).expect_err("hang");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert!(matches!(e, PluginError::Timeout { .. }), "{e:?}");
    assert!(
        e.to_string().contains("sleeper") && e.to_string().contains("warming up"),
        "{e}"
    );
    Ok(())
}

#[test]
fn default_managers_load_good_plugins_and_skip_bad_ones() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::copy(example_plugin(), dir.path().join("10-example-firmware"))?;
    write_plugin(dir.path(), "20-garbage", "echo nope");
    write_plugin(dir.path(), "30-hang", "sleep 30");
    write_plugin(dir.path(), "40-crash", "kill -SEGV $$");
    std::fs::write(dir.path().join("README"), "not executable")?;
    let cfg = ManagerConfig {
        plugin_dir: dir.path().to_path_buf(),
        devices: Some(vec![]),
        ..fast_cfg()
    };
    let names: Vec<String> = default_managers(&cfg)
        .iter()
        .map(|m| m.name().to_string())
        .collect();
    assert_eq!(names, vec!["generic_hardware_manager", "example-firmware"]);
    assert_eq!(load_dir(&dir.path().join("missing"), &cfg).len(), 0);
    Ok(())
}

#[test]
fn abort_kills_an_abortable_plugin_but_not_a_firmware_flash() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = fast_cfg();
    // Abortable: SIGTERM to the group; `sleep` dies with it.
    let path = plugin_with_execute(
        dir.path(),
        "slow",
        true,
        "echo 'progress 0/1 waiting' >&2; sleep 30",
    );
    let p = ExecPlugin::load(&path, &cfg)?;
    let ctx = StepContext::new();
    let c2 = ctx.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        c2.cancel();
        Instant::now()
    });
    let r = p.execute("slow_step", &args(json!({})), &ctx);
    let back = Instant::now();
    let cancelled = t.join().expect("thread");
    assert!(matches!(r, Err(StepError::Aborted)), "{r:?}");
    assert!(back.saturating_duration_since(cancelled) < Duration::from_secs(1));
    // A plugin that ignores SIGTERM is SIGKILLed after the grace period.
    let path = plugin_with_execute(
        dir.path(),
        "stubborn",
        true,
        "trap '' TERM; sleep 30 & wait; sleep 30",
    );
    let p = ExecPlugin::load(&path, &cfg)?;
    let ctx = StepContext::new();
    ctx.cancel();
    let t0 = Instant::now();
    assert!(matches!(
        p.execute("stubborn_step", &args(json!({})), &ctx),
        Err(StepError::Aborted)
    ));
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    // Not abortable: the cancel is ignored and the step completes.
    let path = plugin_with_execute(
        dir.path(),
        "flash",
        false,
        "sleep 0.5; echo '{\"flashed\": true}'",
    );
    let p = ExecPlugin::load(&path, &cfg)?;
    let ctx = StepContext::new();
    ctx.cancel();
    assert_eq!(
        p.execute("flash_step", &args(json!({})), &ctx)?,
        json!({"flashed": true})
    );
    // The execute time limit (timeout_s arg) still applies to it.
    let e = p
        .execute(
            "flash_step",
            &args(json!({"timeout_s": 0.2})),
            &StepContext::new(),
        )
        .expect_err("timeout");
    assert!(e.to_string().contains("timed out"), "{e}");
    Ok(())
}

/// Hardware RAID through a vendor manager: `raid.create_configuration` goes to the manager
/// with the highest support level that offers it, which builds its own controller's
/// volumes, hands `software` ones to the software RAID manager and refuses others by name.
#[test]
fn vendor_manager_takes_raid_steps_for_its_controller() -> anyhow::Result<()> {
    use rivet_hardware_managers::example_vendor::EXAMPLE_CONTROLLER;
    use rivet_hardware_managers::raid::SoftwareRaidManager;
    let dir = tempfile::tempdir()?;
    let disk = sparse(dir.path(), "disk.img", 4 << 20)?;
    let cfg = ManagerConfig {
        devices: Some(vec![disk]),
        ..ManagerConfig::default()
    };
    let dmi = vendor_dmi(dir.path(), "Rivet Example Corp");
    let software = Arc::new(SoftwareRaidManager::new(Arc::new(Vec::new)));
    let vendor = Arc::new(
        ExampleVendorManager::with_dmi(&cfg, &dmi, "Rivet Example Corp")
            .with_software_raid(software.clone()),
    );
    let d = Dispatcher::new(vec![
        Arc::new(GenericManager::new(&cfg)),
        software.clone() as Arc<dyn HardwareManager>,
        vendor.clone() as Arc<dyn HardwareManager>,
    ]);
    let s = d
        .step("create_configuration")
        .expect("the vendor offers it");
    assert_eq!(s.interface, "raid");
    let r = step(
        &d,
        "create_configuration",
        json!({"target_raid_config": {"logical_disks": [
            {"size_gb": 100, "raid_level": "5", "controller": EXAMPLE_CONTROLLER}]}}),
    )?;
    assert_eq!(r["manager"], json!("example_vendor_hardware_manager"));
    assert_eq!(
        r["raid_config"]["logical_disks"][0]["volume_name"],
        json!("example-0")
    );
    assert_eq!(vendor.raid_volumes().len(), 1);
    let e = step(
        &d,
        "create_configuration",
        json!({"target_raid_config": {"logical_disks": [
            {"size_gb": 100, "raid_level": "1", "controller": "RAID.Integrated.1-1"}]}}),
    )
    .expect_err("unknown controller");
    assert!(e.to_string().contains("RAID.Integrated.1-1"), "{e}");
    // A software volume is the software manager's; with no disks it says why it cannot build.
    let e = step(
        &d,
        "create_configuration",
        json!({"target_raid_config": {"logical_disks": [
            {"size_gb": "MAX", "raid_level": "1", "controller": "software"}]}}),
    )
    .expect_err("no disks");
    assert!(e.to_string().contains("at least 2 disks"), "{e}");
    step(&d, "delete_configuration", json!({}))?;
    assert!(vendor.raid_volumes().is_empty());
    Ok(())
}
