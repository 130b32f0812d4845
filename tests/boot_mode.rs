//! Boot mode and Secure Boot through rivetd against the sushy-tools emulator (fake driver),
//! with a simulated ramdisk (tests/simagent.rs) standing in for the agent, so no VM boots:
//!
//! - a deploy that asks for `boot_mode:uefi` and `secure_boot:true` leaves the emulated BMC
//!   in UEFI with Secure Boot on, the node's `boot_mode`/`secure_boot` fields saying so and
//!   `write_image` told `uefi`; a rebuild whose instance no longer asks for it boots with
//!   Secure Boot off (Rivet turned it on), and undeploy turns it off again;
//! - a node declared `boot_mode:bios` (properties capabilities) on a UEFI system: the deploy
//!   ramdisk's boot puts the system in Legacy and its boot override says Legacy;
//! - a capability that is not a boot mode fails the deploy naming the field, before the BMC
//!   is touched.
//!
//! Needs `.venv-sushy` (scripts/setup-peers.sh); skipped without it unless
//! RIVET_REQUIRE_PEERS=1.

use anyhow::{ensure, Context, Result};
use rivet_protocol::agent::{Command, CommandKind};
use rivet_protocol::deploy::{WRITE_IMAGE, WRITE_IMAGE_PRIORITY};
use rivet_protocol::steps::StepDescriptor;
use rivet_tests::peers::{have_sushy, FakeSystem, Sushy, SushyOptions};
use rivet_tests::simagent::{SimAgent, Steps};
use rivet_tests::{prerequisite, Rivetd, DEPLOY_TEST_CONFIG};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const USER: &str = "admin";
const PASSWORD: &str = "boot-Mode-pw1";

fn sushy_ok() -> bool {
    prerequisite(
        have_sushy(),
        "sushy-emulator in .venv-sushy (scripts/setup-peers.sh installs sushy-tools)",
    )
}

fn rivetd(dir: &Path) -> Result<Rivetd> {
    let conf = dir.join("rivetd.toml");
    std::fs::write(
        &conf,
        format!("{DEPLOY_TEST_CONFIG}[drivers]\npoll_interval_ms = 200\n"),
    )?;
    let conf = conf.to_string_lossy().to_string();
    Rivetd::start(&dir.join("rivet.db"), 0, &["--config", &conf])
}

/// The simulated ramdisk's steps: `write_image` answers at once and keeps its arguments.
struct Deployer {
    write_args: Arc<Mutex<Option<Value>>>,
}

impl Steps for Deployer {
    async fn execute(&mut self, _node: &str, cmd: &Command) -> Value {
        match &cmd.kind {
            CommandKind::GetDeploySteps => json!({
                "deploy_steps": [StepDescriptor::in_band(WRITE_IMAGE, WRITE_IMAGE_PRIORITY)],
                "hardware_manager_versions": {"boot-mode-test": "1"}
            }),
            CommandKind::ExecuteStep { step, args, .. } if step == WRITE_IMAGE => {
                if let Ok(mut w) = self.write_args.lock() {
                    *w = Some(Value::Object(args.clone()));
                }
                json!({"written_by": "boot-mode-test"})
            }
            _ => json!({}),
        }
    }

    fn unexpected(&mut self, node: &str, what: &str, status: u16, body: &str) -> Result<()> {
        anyhow::bail!("node {node}: {what} answered {status}: {body}")
    }
}

fn provision(d: &Rivetd, node: &str, target: &str) -> Result<()> {
    let (s, v) = d.call(
        "PUT",
        &format!("/v1/nodes/{node}/states/provision"),
        Some(json!({ "target": target })),
    )?;
    ensure!(s == 202, "{target} {node}: {s} {v}");
    Ok(())
}

/// Wait for one of `states`; a stable state once nothing is targeted any more (`wait
/// call-back` keeps its target).
fn wait_state(d: &Rivetd, node: &str, states: &[&str], secs: u64) -> Result<Value> {
    d.wait_node(node, Duration::from_secs(secs), |n| {
        states.iter().any(|s| n["provision_state"] == *s)
            && (n["target_provision_state"].is_null() || n["provision_state"] == "wait call-back")
    })
}

/// A redfish node on `sys`, made `available` (no automated cleaning); its uuid.
fn available_node(d: &Rivetd, sushy: &Sushy, sys: &FakeSystem, extra: Value) -> Result<String> {
    let mut body = json!({
        "name": sys.name, "driver": "redfish", "deploy_interface": "direct",
        "automated_clean": false,
        "driver_info": sushy.driver_info(&sys.uuid, USER, PASSWORD),
        "instance_info": {
            "image_source": "http://127.0.0.1:9/boot-mode.img",
            "image_os_hash_algo": "sha256",
            "image_os_hash_value": "ab".repeat(32),
        },
    });
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            match (b.get_mut(k), v) {
                (Some(Value::Object(have)), Value::Object(add)) => {
                    have.extend(add.clone());
                }
                _ => {
                    b.insert(k.clone(), v.clone());
                }
            }
        }
    }
    let (s, v) = d.call("POST", "/v1/nodes", Some(body))?;
    ensure!(s == 201, "create: {s} {v}");
    let uuid = v["uuid"].as_str().context("uuid")?.to_string();
    provision(d, &uuid, "manage")?;
    wait_state(d, &uuid, &["manageable"], 60)?;
    provision(d, &uuid, "provide")?;
    wait_state(d, &uuid, &["available"], 60)?;
    Ok(uuid)
}

fn secure_boot_on(sushy: &Sushy, uuid: &str) -> Result<Option<bool>> {
    Ok(sushy.get(&format!("/redfish/v1/Systems/{uuid}/SecureBoot"))?["SecureBootEnable"].as_bool())
}

#[test]
fn uefi_with_secure_boot_deploys_and_a_rebuild_or_undeploy_turns_it_off() -> Result<()> {
    if !sushy_ok() {
        return Ok(());
    }
    let sys = FakeSystem::new("sb-node", "52:54:00:5b:00:01");
    let sushy = Sushy::start(SushyOptions {
        systems: vec![sys.clone()],
        auth: Some((USER.into(), PASSWORD.into())),
        tls: None,
    })?;
    let dir = tempfile::tempdir()?;
    let d = rivetd(dir.path())?;
    let uuid = available_node(
        &d,
        &sushy,
        &sys,
        json!({"instance_info": {"capabilities": {"boot_mode": "uefi", "secure_boot": "true"}}}),
    )?;
    ensure!(
        secure_boot_on(&sushy, &sys.uuid)? == Some(false),
        "starts off"
    );

    let write_args = Arc::new(Mutex::new(None));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    // A ramdisk per deploy: the simulated one ends when its operation does.
    let agent = || -> Result<_> {
        let agent = SimAgent::new(
            &uuid,
            vec![d.url.clone()],
            "boot-mode-test",
            reqwest::Client::builder()
                .timeout(Duration::from_secs(15))
                .build()?,
            Deployer {
                write_args: write_args.clone(),
            },
        );
        Ok(rt.spawn(agent.run(Instant::now() + Duration::from_secs(150))))
    };
    let mut task = agent()?;
    provision(&d, &uuid, "active")?;
    let n = wait_state(&d, &uuid, &["active", "deploy failed"], 150)?;
    ensure!(n["provision_state"] == "active", "deploy: {n}");

    let sysdoc = sushy.system(&sys.uuid)?;
    assert_eq!(sysdoc["Boot"]["BootSourceOverrideMode"], "UEFI", "{sysdoc}");
    assert_eq!(
        sysdoc["Boot"]["BootSourceOverrideTarget"], "Hdd",
        "{sysdoc}"
    );
    assert_eq!(secure_boot_on(&sushy, &sys.uuid)?, Some(true));
    assert_eq!(n["boot_mode"], "uefi", "{n}");
    assert_eq!(n["secure_boot"], true, "{n}");
    assert_eq!(
        n["driver_internal_info"]["secure_boot_enabled_by_rivet"], true,
        "{n}"
    );
    let args = write_args.lock().ok().and_then(|w| w.clone());
    assert_eq!(
        args.as_ref().map(|a| a["boot_mode"].clone()),
        Some(json!("uefi")),
        "{args:?}"
    );

    // A rebuild whose instance no longer asks for Secure Boot boots without it: Rivet turned
    // it on, so Rivet turns it off (Ironic would leave it on), and forgets that it did.
    let (s, v) = d.call(
        "PATCH",
        &format!("/v1/nodes/{uuid}"),
        Some(
            json!([{"op": "replace", "path": "/instance_info/capabilities",
                     "value": {"boot_mode": "uefi", "secure_boot": "false"}}]),
        ),
    )?;
    ensure!(s == 200, "patch: {s} {v}");
    task.abort();
    task = agent()?;
    provision(&d, &uuid, "rebuild")?;
    let n = wait_state(&d, &uuid, &["active", "deploy failed"], 150)?;
    ensure!(n["provision_state"] == "active", "rebuild: {n}");
    assert_eq!(secure_boot_on(&sushy, &sys.uuid)?, Some(false));
    assert_eq!(n["secure_boot"], false, "{n}");
    assert!(
        n["driver_internal_info"]
            .get("secure_boot_enabled_by_rivet")
            .is_none_or(|v| v == false),
        "{n}"
    );

    // Asked for again: on again, and off at undeploy.
    let (s, v) = d.call(
        "PATCH",
        &format!("/v1/nodes/{uuid}"),
        Some(
            json!([{"op": "replace", "path": "/instance_info/capabilities",
                     "value": {"boot_mode": "uefi", "secure_boot": "true"}}]),
        ),
    )?;
    ensure!(s == 200, "patch: {s} {v}");
    task.abort();
    task = agent()?;
    provision(&d, &uuid, "rebuild")?;
    let n = wait_state(&d, &uuid, &["active", "deploy failed"], 150)?;
    ensure!(n["provision_state"] == "active", "rebuild: {n}");
    assert_eq!(secure_boot_on(&sushy, &sys.uuid)?, Some(true));

    provision(&d, &uuid, "deleted")?;
    let n = wait_state(&d, &uuid, &["available", "error", "clean failed"], 120)?;
    ensure!(n["provision_state"] == "available", "undeploy: {n}");
    assert_eq!(secure_boot_on(&sushy, &sys.uuid)?, Some(false));
    assert_eq!(n["secure_boot"], false, "{n}");
    assert!(
        n["driver_internal_info"]
            .get("secure_boot_enabled_by_rivet")
            .is_none(),
        "{n}"
    );
    task.abort();
    Ok(())
}

#[test]
fn bios_node_boots_legacy_and_a_bad_mode_fails_the_deploy() -> Result<()> {
    if !sushy_ok() {
        return Ok(());
    }
    let bios = FakeSystem::new("bios-node", "52:54:00:5b:00:02");
    let bad = FakeSystem::new("bad-node", "52:54:00:5b:00:03");
    let sushy = Sushy::start(SushyOptions {
        systems: vec![bios.clone(), bad.clone()],
        auth: Some((USER.into(), PASSWORD.into())),
        tls: None,
    })?;
    let dir = tempfile::tempdir()?;
    let d = rivetd(dir.path())?;

    // Declared bios; the emulated system starts in UEFI.
    assert_eq!(
        sushy.system(&bios.uuid)?["Boot"]["BootSourceOverrideMode"],
        "UEFI"
    );
    let b = available_node(
        &d,
        &sushy,
        &bios,
        json!({"properties": {"capabilities": "cpu_vt:true,boot_mode:bios"}}),
    )?;
    provision(&d, &b, "active")?;
    // No agent: the deploy waits for one, its ramdisk boot done.
    let n = wait_state(&d, &b, &["wait call-back", "deploy failed"], 60)?;
    ensure!(n["provision_state"] == "wait call-back", "{n}");
    let boot = sushy.system(&bios.uuid)?["Boot"].clone();
    assert_eq!(boot["BootSourceOverrideMode"], "Legacy", "{boot}");
    assert_eq!(boot["BootSourceOverrideTarget"], "Pxe", "{boot}");
    assert_eq!(n["boot_mode"], "bios", "{n}");

    // Not a boot mode: the deploy fails naming the field; the BMC is left alone.
    let x = available_node(
        &d,
        &sushy,
        &bad,
        json!({"instance_info": {"capabilities": "boot_mode:efi"}}),
    )?;
    provision(&d, &x, "active")?;
    let n = wait_state(&d, &x, &["deploy failed", "wait call-back"], 60)?;
    ensure!(n["provision_state"] == "deploy failed", "{n}");
    let err = n["last_error"].as_str().unwrap_or_default();
    assert!(
        err.contains("instance_info capabilities boot_mode")
            && err.contains("\"efi\"")
            && err.contains("\"uefi\" or \"bios\""),
        "{err}"
    );
    let boot = sushy.system(&bad.uuid)?["Boot"].clone();
    assert_eq!(boot["BootSourceOverrideMode"], "UEFI", "{boot}");
    assert_ne!(boot["BootSourceOverrideTarget"], "Pxe", "{boot}");
    Ok(())
}
