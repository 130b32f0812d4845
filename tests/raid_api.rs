//! RAID on a real rivetd: `raid_interface` per hardware type (`agent` everywhere, as Metal3
//! and gophercloud create nodes; `fake` on fake-hardware only), `PUT …/states/raid` against
//! every rule of Ironic's RAID schema (each bad case a 400 naming the field that leaves the
//! stored target alone), the 1.12 gate, unknown nodes, `no-raid`; a manual cleaning that asks
//! for the agent's RAID steps on a node with no agent (refused); and the clients —
//! `baremetal node set --target-raid-config`, openstacksdk, `rivet node raid set|show`.
//!
//! The agent RAID steps end to end, with a simulated ramdisk (tests/simagent.rs) that offers
//! them as the agent does when it can build md arrays and records what it is sent:
//! `raid.delete_configuration` + `raid.create_configuration` in a manual clean (the agent gets
//! the node's target as `target_raid_config`, filtered by `create_nonroot_volumes`; what it
//! reports becomes `raid_config` with `last_updated`, and `local_gb` and the `raid_level`
//! capability follow the root volume, as Ironic's `update_raid_info`); a create with no target
//! fails with Ironic's message before the agent is asked; `no-raid` takes none of the agent's
//! RAID steps; `raid.apply_configuration` from a deploy template stores its configuration as
//! the target and the result as `raid_config`, and a bad one fails the deploy naming the field.

use anyhow::{bail, ensure, Context, Result};
use rivet_protocol::agent::{Command, CommandKind};
use rivet_protocol::deploy::{WRITE_IMAGE, WRITE_IMAGE_PRIORITY};
use rivet_protocol::steps::StepDescriptor;
use rivet_tests::clients::{self, baremetal, baremetal_json, sdk};
use rivet_tests::simagent::{SimAgent, Steps};
use rivet_tests::Rivetd;
use serde_json::{json, Map, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn start() -> Result<(tempfile::TempDir, Rivetd)> {
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start(&dir.path().join("rivet.db"), 0, &[])?;
    Ok((dir, d))
}

/// The fault string of an error answer (Ironic's `error_message` holds JSON).
fn fault(body: &Value) -> String {
    let raw = body["error_message"].as_str().unwrap_or_default();
    serde_json::from_str::<Value>(raw)
        .ok()
        .and_then(|v| v["faultstring"].as_str().map(str::to_string))
        .unwrap_or_else(|| raw.to_string())
}

fn put_raid(d: &Rivetd, node: &str, cfg: &Value) -> Result<(u16, Value)> {
    d.call(
        "PUT",
        &format!("/v1/nodes/{node}/states/raid"),
        Some(cfg.clone()),
    )
}

fn target(d: &Rivetd, node: &str) -> Result<Value> {
    Ok(d.node(node)?["target_raid_config"].clone())
}

fn disk(extra: Value) -> Value {
    let mut d = json!({"raid_level": "1", "size_gb": 10});
    if let (Some(d), Some(e)) = (d.as_object_mut(), extra.as_object()) {
        d.extend(e.clone());
    }
    json!({ "logical_disks": [d] })
}

#[test]
fn raid_interface_per_hardware_type() -> Result<()> {
    let (_dir, d) = start()?;
    // (driver, raid_interface, accepted); None = the hardware type's default.
    let cases = [
        ("fake-hardware", None, Some("fake")),
        ("fake-hardware", Some("agent"), Some("agent")),
        ("fake-hardware", Some("no-raid"), Some("no-raid")),
        ("ipmi", None, Some("no-raid")),
        ("ipmi", Some("agent"), Some("agent")),
        ("ipmi", Some("fake"), None),
        ("redfish", None, Some("no-raid")),
        ("redfish", Some("agent"), Some("agent")),
        ("redfish", Some("fake"), None),
        // Ironic's redfish RAID interface is not implemented: refused, not pretended.
        ("redfish", Some("redfish"), None),
        ("ipmi", Some("software"), None),
    ];
    for (i, (driver, iface, want)) in cases.iter().enumerate() {
        let mut body = json!({"driver": driver, "name": format!("n{i}")});
        if let Some(v) = iface {
            body["raid_interface"] = json!(v);
        }
        let (s, v) = d.call("POST", "/v1/nodes", Some(body.clone()))?;
        match want {
            Some(w) => {
                ensure!(s == 201, "{body}: {s} {v}");
                ensure!(v["raid_interface"] == *w, "{body}: {v}");
            }
            None => {
                let msg = fault(&v);
                ensure!(
                    s == 400 && msg.contains("raid_interface"),
                    "{body}: {s} {msg}"
                );
            }
        }
    }
    // PATCH: agent onto an ipmi node, then an interface the type does not enable.
    let patch = |node: &str, value: &str| {
        d.call(
            "PATCH",
            &format!("/v1/nodes/{node}"),
            Some(json!([{"op": "replace", "path": "/raid_interface", "value": value}])),
        )
    };
    let (s, v) = patch("n3", "agent")?;
    ensure!(s == 200 && v["raid_interface"] == "agent", "{s} {v}");
    let (s, v) = patch("n3", "fake")?;
    ensure!(s == 400 && fault(&v).contains("raid_interface"), "{s} {v}");
    ensure!(d.node("n3")?["raid_interface"] == "agent", "unchanged");
    // The agent RAID interface validates (only the stored target, checked when stored).
    let (s, v) = d.call("GET", "/v1/nodes/n1/validate", None)?;
    ensure!(s == 200 && v["raid"]["result"] == true, "{s} {v}");
    let (_, v) = d.call("GET", "/v1/nodes/n2/validate", None)?;
    ensure!(v["raid"]["result"] == false, "no-raid: {v}");
    Ok(())
}

#[test]
fn target_raid_config_follows_ironics_schema() -> Result<()> {
    let (_dir, d) = start()?;
    for (name, iface) in [("a", "agent"), ("f", "fake"), ("x", "no-raid")] {
        let (s, v) = d.call(
            "POST",
            "/v1/nodes",
            Some(json!({"driver": "fake-hardware", "name": name, "raid_interface": iface})),
        )?;
        ensure!(s == 201, "{v}");
    }
    let good = json!({"logical_disks": [
        {"raid_level": "1", "size_gb": 100, "is_root_volume": true, "volume_name": "root",
         "share_physical_disks": true, "disk_type": "ssd", "interface_type": "sata",
         "number_of_physical_disks": 2, "controller": "software",
         "physical_disks": [{"name": "/dev/sda"}, {"name": "/dev/sdb"}]},
        {"raid_level": "0", "size_gb": "MAX", "controller": "RAID.Integrated.1-1",
         "physical_disks": ["Disk.Bay.0", "Disk.Bay.1"]},
        {"raid_level": "JBOD", "size_gb": 0}
    ]});
    for node in ["a", "f"] {
        let (s, v) = put_raid(&d, node, &good)?;
        ensure!(s == 204, "{node}: {s} {v}");
        ensure!(target(&d, node)? == good, "{node} stored");
    }
    // Each bad case: 400 naming the field, the stored target unchanged.
    let bad = [
        (json!({"logical_disks": []}), "logical_disks"),
        (json!({"logical_disks": "all"}), "logical_disks"),
        (json!({"disks": []}), "disks"),
        (json!({"logical_disks": [1]}), "logical_disks[0]"),
        (json!({"logical_disks": [{"size_gb": 1}]}), "raid_level"),
        (json!({"logical_disks": [{"raid_level": "1"}]}), "size_gb"),
        (disk(json!({"raid_level": "3"})), "raid_level"),
        (disk(json!({"raid_level": 1})), "raid_level"),
        (disk(json!({"size_gb": -1})), "size_gb"),
        (disk(json!({"size_gb": "max"})), "size_gb"),
        (disk(json!({"size_gb": 2.5})), "size_gb"),
        (disk(json!({"volume_name": 7})), "volume_name"),
        (disk(json!({"is_root_volume": "true"})), "is_root_volume"),
        (
            disk(json!({"share_physical_disks": "no"})),
            "share_physical_disks",
        ),
        (disk(json!({"disk_type": "nvme"})), "disk_type"),
        (disk(json!({"interface_type": "pcie"})), "interface_type"),
        (
            disk(json!({"number_of_physical_disks": 0})),
            "number_of_physical_disks",
        ),
        (disk(json!({"controller": ["c"]})), "controller"),
        (
            disk(json!({"physical_disks": ["sda", "sdb"]})),
            "controller",
        ),
        (
            disk(json!({"controller": "software", "physical_disks": [{"name": "sda"}]})),
            "physical_disks",
        ),
        (
            disk(json!({"controller": "c", "physical_disks": "sda"})),
            "physical_disks",
        ),
        (disk(json!({"colour": "blue"})), "colour"),
        (
            json!({"logical_disks": [
                {"raid_level": "1", "size_gb": 10, "is_root_volume": true},
                {"raid_level": "1", "size_gb": 20, "is_root_volume": true}]}),
            "is_root_volume",
        ),
    ];
    for (cfg, field) in &bad {
        let (s, v) = put_raid(&d, "a", cfg)?;
        let msg = fault(&v);
        ensure!(s == 400 && msg.contains(field), "{cfg}: {s} {msg}");
        ensure!(target(&d, "a")? == good, "{cfg} changed the stored target");
    }
    // Not an object: 400.
    let (s, v) = put_raid(&d, "a", &json!(["logical_disks"]))?;
    ensure!(s == 400, "{s} {v}");
    // no-raid: a configuration is Ironic's 404 "does not support raid"; `{}` is stored.
    let (s, v) = put_raid(&d, "x", &good)?;
    ensure!(
        s == 404 && fault(&v).contains("does not support raid"),
        "{s} {v}"
    );
    let (s, v) = put_raid(&d, "x", &json!({}))?;
    ensure!(s == 204, "{s} {v}");
    // `{}` clears a target.
    let (s, _) = put_raid(&d, "f", &json!({}))?;
    ensure!(s == 204 && target(&d, "f")? == json!({}), "cleared");
    // Unknown node 404; below 1.12 406 (Ironic's NotAcceptable) and nothing stored.
    let (s, _) = put_raid(&d, "0e4f6b8a-0000-4000-8000-00000000dead", &good)?;
    ensure!(s == 404, "unknown node: {s}");
    let (s, v) = d.call_at(
        Some("1.11"),
        "PUT",
        "/v1/nodes/f/states/raid",
        Some(good.clone()),
    )?;
    ensure!(s == 406, "1.11: {s} {v}");
    ensure!(target(&d, "f")? == json!({}), "nothing stored at 1.11");
    // Shown from 1.12 on, on the node and its states; never built.
    let (_, v) = d.call_at(Some("1.12"), "GET", "/v1/nodes/a/states", None)?;
    ensure!(
        v["target_raid_config"] == good && v["raid_config"] == json!({}),
        "{v}"
    );
    let (_, v) = d.call_at(Some("1.11"), "GET", "/v1/nodes/a", None)?;
    ensure!(v.get("target_raid_config").is_none(), "{v}");
    Ok(())
}

/// A node whose deploy interface is `fake` runs no agent, so nothing offers the agent RAID
/// steps: asking for one is refused before anything starts, saying why.
#[test]
fn raid_clean_steps_are_not_pretended() -> Result<()> {
    let (_dir, d) = start()?;
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(json!({"driver": "fake-hardware", "name": "m", "raid_interface": "agent"})),
    )?;
    ensure!(s == 201, "{v}");
    let (s, v) = put_raid(&d, "m", &disk(json!({"is_root_volume": true})))?;
    ensure!(s == 204, "{v}");
    let provision = |body: Value| d.call("PUT", "/v1/nodes/m/states/provision", Some(body));
    let (s, v) = provision(json!({"target": "manage"}))?;
    ensure!(s == 202, "{v}");
    d.wait_node("m", Duration::from_secs(30), |v| {
        v["provision_state"] == "manageable"
    })?;
    for step in ["create_configuration", "delete_configuration"] {
        let (s, v) = provision(json!({"target": "clean",
            "clean_steps": [{"interface": "raid", "step": step}]}))?;
        let msg = fault(&v);
        ensure!(
            s == 400
                && msg.contains("node does not support this clean step")
                && msg.contains(&format!("raid.{step}"))
                && msg.contains("this node's agent offered no RAID steps")
                && msg.contains("deploy_interface is fake"),
            "{step}: {s} {msg}"
        );
        let n = d.node("m")?;
        ensure!(
            n["provision_state"] == "manageable" && n["target_provision_state"].is_null(),
            "nothing started: {n}"
        );
    }
    // Nor are they among the node's steps.
    let (_, steps) = d.call("GET", "/v1/nodes/m/clean_steps", None)?;
    ensure!(
        !steps.to_string().contains("create_configuration"),
        "{steps}"
    );
    Ok(())
}

#[test]
fn raid_through_the_clients() -> Result<()> {
    if !clients::available() {
        return Ok(());
    }
    let (dir, d) = start()?;
    // As Metal3's tooling creates nodes (gophercloud's acceptance tests do the same).
    baremetal(
        &d,
        &[
            "node",
            "create",
            "--driver",
            "ipmi",
            "--name",
            "m3",
            "--boot-interface",
            "ipxe",
            "--raid-interface",
            "agent",
        ],
    )?;
    let cfg =
        json!({"logical_disks": [{"raid_level": "1", "size_gb": "MAX", "is_root_volume": true}]});
    baremetal(
        &d,
        &[
            "node",
            "set",
            "m3",
            "--target-raid-config",
            &cfg.to_string(),
        ],
    )?;
    let shown = baremetal_json(&d, &["node", "show", "m3"])?;
    ensure!(
        shown["raid_interface"] == "agent" && shown["target_raid_config"] == cfg,
        "{shown}"
    );
    // openstacksdk: this release has no RAID helper, so the PUT goes through its session
    // at 1.12 as Ironic documents it; get_node reads the stored target back.
    let v = sdk(
        &d,
        "n = conn.baremetal.get_node('m3')\n\
         cfg = {'logical_disks': [{'raid_level': '5', 'size_gb': 50, 'disk_type': 'ssd'}]}\n\
         r = conn.baremetal.put('/nodes/%s/states/raid' % n.id, json=cfg, microversion='1.12')\n\
         assert r.status_code == 204, r.text\n\
         bad = conn.baremetal.put('/nodes/%s/states/raid' % n.id,\n\
             json={'logical_disks': [{'raid_level': '4', 'size_gb': 1}]}, microversion='1.12')\n\
         n = conn.baremetal.get_node('m3')\n\
         emit({'target': n.target_raid_config, 'iface': n.raid_interface,\n\
               'bad': bad.status_code, 'msg': bad.text})",
    )?;
    ensure!(
        v["target"]
            == json!({"logical_disks": [{"raid_level": "5", "size_gb": 50, "disk_type": "ssd"}]})
            && v["iface"] == "agent"
            && v["bad"] == 400
            && v["msg"].as_str().is_some_and(|m| m.contains("raid_level")),
        "{v}"
    );
    // rivet node raid set (argument and --file) and show.
    let rivet = |args: &[&str]| -> Result<String> {
        let out = std::process::Command::new(rivet_tests::bin("rivet"))
            .args(["--url", &d.url])
            .args(args)
            .output()?;
        ensure!(
            out.status.success(),
            "rivet {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).to_string())
    };
    let file = dir.path().join("raid.json");
    let from_file = json!({"logical_disks": [{"raid_level": "1+0", "size_gb": 200}]});
    std::fs::write(&file, from_file.to_string())?;
    let path = file.to_string_lossy().to_string();
    rivet(&["node", "raid", "set", "m3", "--file", &path])?;
    let shown: Value = serde_json::from_str(&rivet(&["--json", "node", "raid", "show", "m3"])?)
        .context("rivet node raid show --json")?;
    ensure!(
        shown["target_raid_config"] == from_file && shown["raid_config"] == json!({}),
        "{shown}"
    );
    rivet(&["node", "raid", "set", "m3", "{}"])?;
    ensure!(target(&d, "m3")? == json!({}), "cleared");
    // A bad configuration: the CLI fails with rivetd's message; not JSON: the CLI's own.
    let out = std::process::Command::new(rivet_tests::bin("rivet"))
        .args(["--url", &d.url, "node", "raid", "set", "m3"])
        .arg(r#"{"logical_disks": [{"raid_level": "1", "size_gb": 1, "disk_type": "tape"}]}"#)
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success() && err.contains("disk_type"), "{err}");
    let out = std::process::Command::new(rivet_tests::bin("rivet"))
        .args(["--url", &d.url, "node", "raid", "set", "m3", "{not json"])
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success() && err.contains("not JSON"), "{err}");
    Ok(())
}

// ------------------------------------------------------------ the agent RAID steps, simulated

/// What the simulated ramdisk was sent: `get_clean_steps`, `raid.create_configuration`… with
/// the step's arguments.
type Ledger = Arc<Mutex<Vec<(String, Map<String, Value>)>>>;

/// The target of the agent tests: a RAID-1 root mirror on two named disks and a RAID-0
/// scratch volume.
fn target_cfg() -> Value {
    json!({"logical_disks": [
        {"raid_level": "1", "size_gb": 10, "is_root_volume": true, "controller": "software",
         "physical_disks": [{"name": "/dev/vda"}, {"name": "/dev/vdb"}]},
        {"raid_level": "0", "size_gb": "MAX", "volume_name": "scratch"}
    ]})
}

/// What the simulated agent reports it built (sizes as built, not as asked: the root mirror
/// is 9 GiB, so `local_gb` must come from here).
fn built_cfg() -> Value {
    json!({"logical_disks": [
        {"raid_level": "1", "size_gb": 9, "controller": "software", "is_root_volume": true,
         "volume_name": "md0", "physical_disks": [{"name": "/dev/vda"}, {"name": "/dev/vdb"}]},
        {"raid_level": "0", "size_gb": 40, "controller": "software", "volume_name": "scratch",
         "physical_disks": [{"name": "/dev/vdc"}, {"name": "/dev/vdd"}]}
    ]})
}

fn step_json(v: Value) -> StepDescriptor {
    serde_json::from_value(v).unwrap_or_else(|e| panic!("step descriptor: {e}"))
}

/// A ramdisk that can build software RAID: it offers the agent RAID steps as the contract
/// says (priority 0, `raid` interface) beside an ordinary erase step and `write_image`,
/// answers a building step with [`built_cfg`], and records every command.
struct RaidAgent {
    ledger: Ledger,
}

impl Steps for RaidAgent {
    async fn execute(&mut self, _node: &str, cmd: &Command) -> Value {
        let (what, args) = match &cmd.kind {
            CommandKind::ExecuteStep {
                interface,
                step,
                args,
            } => (format!("{interface}.{step}"), args.clone()),
            other => (other.name().to_string(), Map::new()),
        };
        if let Ok(mut l) = self.ledger.lock() {
            l.push((what.clone(), args));
        }
        let arg = |d: &str, required: bool| json!({"description": d, "required": required});
        match what.as_str() {
            "get_clean_steps" => json!({
                "clean_steps": [
                    StepDescriptor::in_band("erase_devices_metadata", 99),
                    step_json(json!({"interface": "raid", "step": "create_configuration",
                        "priority": 0, "abortable": false, "argsinfo": {
                            "create_root_volume": arg("build the root volume", false),
                            "create_nonroot_volumes": arg("build the other volumes", false),
                            "delete_existing": arg("delete existing arrays first", false)}})),
                    step_json(json!({"interface": "raid", "step": "delete_configuration",
                        "priority": 0, "abortable": false})),
                ],
                "hardware_manager_versions": {"raid-test": "1"}
            }),
            "get_deploy_steps" => json!({
                "deploy_steps": [
                    StepDescriptor::in_band(WRITE_IMAGE, WRITE_IMAGE_PRIORITY),
                    step_json(json!({"interface": "raid", "step": "apply_configuration",
                        "priority": 0, "abortable": false, "argsinfo": {
                            "raid_config": arg("The RAID configuration to apply.", true),
                            "delete_existing": arg("delete existing arrays first", false)}})),
                ],
                "hardware_manager_versions": {"raid-test": "1"}
            }),
            "raid.create_configuration" | "raid.apply_configuration" => {
                json!({"raid_config": built_cfg()})
            }
            "raid.delete_configuration" => json!({"raid_config": {}}),
            s if s.ends_with(WRITE_IMAGE) => json!({"written_by": "raid-test"}),
            _ => json!({}),
        }
    }

    fn unexpected(&mut self, node: &str, what: &str, status: u16, body: &str) -> Result<()> {
        bail!("node {node}: {what} answered {status}: {body}")
    }
}

/// rivetd with quick agent timings, and a tokio runtime for the simulated agents.
struct AgentScene {
    d: Rivetd,
    rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

impl AgentScene {
    fn start() -> Result<AgentScene> {
        let dir = tempfile::tempdir()?;
        let d = Rivetd::start_in(
            dir.path(),
            "[agent]\nlong_poll_s = 2\n[conductor]\ncheck_interval_s = 1\n",
        )?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        Ok(AgentScene { d, rt, _dir: dir })
    }

    /// A fake-hardware node that runs the agent (deploy interface `direct`), with
    /// `raid_interface` and `extra` fields, made manageable; its uuid.
    fn node(&self, name: &str, raid_interface: &str, extra: Value) -> Result<String> {
        let mut body = json!({
            "driver": "fake-hardware", "deploy_interface": "direct", "name": name,
            "raid_interface": raid_interface, "automated_clean": false,
            // The simulated agent stands in for a ramdisk on a BIOS host.
            "properties": {"capabilities": "boot_mode:bios", "local_gb": 100},
        });
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        let (s, v) = self.d.call("POST", "/v1/nodes", Some(body))?;
        ensure!(s == 201, "create {name}: {s} {v}");
        let uuid = v["uuid"].as_str().context("uuid")?.to_string();
        self.provision(name, json!({"target": "manage"}))?;
        self.settle(name, 30)?;
        Ok(uuid)
    }

    fn provision(&self, node: &str, body: Value) -> Result<(u16, Value)> {
        let (s, v) = self.d.call(
            "PUT",
            &format!("/v1/nodes/{node}/states/provision"),
            Some(body.clone()),
        )?;
        ensure!(s == 202, "{node} {body}: {s} {v}");
        Ok((s, v))
    }

    /// The node once nothing is targeted any more (a stable or failed state).
    fn settle(&self, node: &str, secs: u64) -> Result<Value> {
        self.d
            .wait_node(node, Duration::from_secs(secs), |n| {
                n["target_provision_state"].is_null()
                    && !matches!(
                        n["provision_state"].as_str(),
                        Some("cleaning" | "clean wait" | "deploying" | "wait call-back")
                    )
            })
            .map_err(|e| anyhow::anyhow!("{e}\n{}", self.d.log_text()))
    }

    /// A simulated ramdisk for `uuid`, recording into a fresh ledger; it ends when the node no
    /// longer expects it.
    fn agent(&self, uuid: &str) -> Result<(Ledger, tokio::task::JoinHandle<Result<()>>)> {
        let ledger: Ledger = Arc::default();
        let agent = SimAgent::new(
            uuid,
            vec![self.d.url.clone()],
            "raid-test",
            reqwest::Client::builder()
                .timeout(Duration::from_secs(15))
                .build()?,
            RaidAgent {
                ledger: ledger.clone(),
            },
        );
        let task = self
            .rt
            .spawn(agent.run(Instant::now() + Duration::from_secs(120)));
        Ok((ledger, task))
    }

    /// Wait for an agent to end (the node let it go) without an unexpected answer.
    fn finished(&self, task: tokio::task::JoinHandle<Result<()>>) -> Result<()> {
        self.rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(60), task).await })
            .context("the simulated agent did not end")?
            .context("the simulated agent panicked")?
    }
}

/// The steps the agent was told to run, in order, with their arguments.
fn executed(ledger: &Ledger) -> Vec<(String, Map<String, Value>)> {
    ledger
        .lock()
        .map(|l| l.iter().filter(|(w, _)| w.contains('.')).cloned().collect())
        .unwrap_or_default()
}

/// `raid_config` as stored: what the agent built plus Ironic's `last_updated`
/// (`str(datetime.utcnow())`: `2026-01-02 03:04:05[.123456]`).
fn check_recorded(raid_config: &Value, built: &Value) -> Result<()> {
    let mut rc = raid_config.clone();
    let stamp = rc
        .as_object_mut()
        .and_then(|m| m.remove("last_updated"))
        .with_context(|| format!("no last_updated in {raid_config}"))?;
    let stamp = stamp.as_str().unwrap_or_default();
    let shape_ok = (stamp.len() == 19 || stamp.len() == 26)
        && stamp.as_bytes()[10] == b' '
        && stamp[..19]
            .bytes()
            .enumerate()
            .all(|(i, b)| matches!(i, 4 | 7 | 10 | 13 | 16) || b.is_ascii_digit());
    ensure!(shape_ok, "last_updated {stamp:?} is not Ironic's format");
    ensure!(
        rc == *built,
        "raid_config {raid_config} is not what was built {built}"
    );
    Ok(())
}

#[test]
fn manual_clean_builds_the_target_and_records_what_was_built() -> Result<()> {
    let sc = AgentScene::start()?;
    let uuid = sc.node("r1", "agent", json!({}))?;
    let (s, v) = put_raid(&sc.d, "r1", &target_cfg())?;
    ensure!(s == 204, "{s} {v}");
    // No cached steps yet: the agent's RAID steps are checked when it lists them, so the
    // request is accepted (the agent RAID interface takes them).
    let (ledger, task) = sc.agent(&uuid)?;
    sc.provision(
        "r1",
        json!({"target": "clean", "clean_steps": [
            {"interface": "raid", "step": "delete_configuration"},
            {"interface": "raid", "step": "create_configuration"}]}),
    )?;
    let n = sc.settle("r1", 60)?;
    ensure!(
        n["provision_state"] == "manageable" && n["last_error"].is_null(),
        "{n}"
    );
    sc.finished(task)?;
    let steps = executed(&ledger);
    let names: Vec<&str> = steps.iter().map(|(w, _)| w.as_str()).collect();
    ensure!(
        names == ["raid.delete_configuration", "raid.create_configuration"],
        "{steps:?}"
    );
    ensure!(
        !steps[0].1.contains_key("target_raid_config"),
        "delete is sent as it is: {:?}",
        steps[0].1
    );
    ensure!(
        steps[1].1.get("target_raid_config") == Some(&target_cfg()),
        "create gets the node's target: {:?}",
        steps[1].1
    );
    // What the agent built, with last_updated; local_gb and the raid_level capability from
    // the root volume (update_raid_info); the target stays.
    check_recorded(&n["raid_config"], &built_cfg())?;
    ensure!(n["target_raid_config"] == target_cfg(), "{n}");
    ensure!(n["properties"]["local_gb"] == 9, "{}", n["properties"]);
    ensure!(
        n["properties"]["capabilities"] == "boot_mode:bios,raid_level:1",
        "{}",
        n["properties"]
    );
    let (_, states) =
        sc.d.call_at(Some("1.12"), "GET", "/v1/nodes/r1/states", None)?;
    ensure!(states["raid_config"] == n["raid_config"], "{states}");
    // The agent RAID steps are among the node's cached steps now.
    let (_, cached) = sc.d.call("GET", "/v1/nodes/r1/clean_steps", None)?;
    ensure!(
        cached.to_string().contains("create_configuration"),
        "{cached}"
    );

    // create_nonroot_volumes false: the agent gets the root volume only (Ironic's
    // filter_target_raid_config); the string form of a boolean is read as Ironic's API does.
    let (ledger, task) = sc.agent(&uuid)?;
    sc.provision(
        "r1",
        json!({"target": "clean", "clean_steps": [
            {"interface": "raid", "step": "create_configuration",
             "args": {"create_nonroot_volumes": "false"}}]}),
    )?;
    let n = sc.settle("r1", 60)?;
    ensure!(
        n["provision_state"] == "manageable" && n["last_error"].is_null(),
        "{n}"
    );
    sc.finished(task)?;
    let steps = executed(&ledger);
    ensure!(steps.len() == 1, "{steps:?}");
    let sent = &steps[0].1;
    ensure!(
        sent["target_raid_config"] == json!({"logical_disks": [target_cfg()["logical_disks"][0]]})
            && sent["create_nonroot_volumes"] == "false",
        "{sent:?}"
    );

    // delete_configuration alone: raid_config {} (Ironic's _delete_configuration_final).
    let (ledger, task) = sc.agent(&uuid)?;
    sc.provision(
        "r1",
        json!({"target": "clean", "clean_steps": [
            {"interface": "raid", "step": "delete_configuration"}]}),
    )?;
    let n = sc.settle("r1", 60)?;
    ensure!(
        n["provision_state"] == "manageable" && n["last_error"].is_null(),
        "{n}"
    );
    sc.finished(task)?;
    ensure!(executed(&ledger).len() == 1, "{:?}", executed(&ledger));
    ensure!(n["raid_config"] == json!({}), "{n}");
    ensure!(n["target_raid_config"] == target_cfg(), "{n}");
    Ok(())
}

#[test]
fn create_without_a_target_fails_before_the_agent_is_asked() -> Result<()> {
    let sc = AgentScene::start()?;
    let uuid = sc.node("r2", "agent", json!({}))?;
    let (ledger, task) = sc.agent(&uuid)?;
    sc.provision(
        "r2",
        json!({"target": "clean", "clean_steps": [
            {"interface": "raid", "step": "create_configuration"}]}),
    )?;
    let n = sc.settle("r2", 60)?;
    ensure!(n["provision_state"] == "clean failed", "{n}");
    let err = n["last_error"].as_str().unwrap_or_default();
    ensure!(
        err.contains(&format!("Node {uuid} has no target RAID configuration."))
            && err.contains("create_configuration"),
        "{err}"
    );
    // A node in clean failed keeps its ramdisk (and its token) for an operator to look at.
    task.abort();
    let asked: Vec<String> = ledger
        .lock()
        .map(|l| l.iter().map(|(w, _)| w.clone()).collect())
        .unwrap_or_default();
    ensure!(
        asked.iter().any(|w| w == "get_clean_steps")
            && !asked.iter().any(|w| w.starts_with("raid.")),
        "the agent must not be asked to build: {asked:?}"
    );
    ensure!(n["raid_config"] == json!({}), "{n}");
    Ok(())
}

#[test]
fn no_raid_takes_none_of_the_agents_raid_steps() -> Result<()> {
    let sc = AgentScene::start()?;
    let uuid = sc.node("r3", "no-raid", json!({}))?;
    // An empty manual clean gathers the agent's steps: it offers the RAID ones.
    let (ledger, task) = sc.agent(&uuid)?;
    sc.provision("r3", json!({"target": "clean", "clean_steps": []}))?;
    let n = sc.settle("r3", 60)?;
    ensure!(n["provision_state"] == "manageable", "{n}");
    sc.finished(task)?;
    ensure!(
        ledger
            .lock()
            .map(|l| l.iter().any(|(w, _)| w == "get_clean_steps"))
            .unwrap_or(false),
        "steps gathered"
    );
    let (s, cached) = sc.d.call("GET", "/v1/nodes/r3/clean_steps", None)?;
    ensure!(
        s == 200
            && cached.to_string().contains("erase_devices_metadata")
            && !cached.to_string().contains("_configuration"),
        "no-raid shows none of the agent's RAID steps: {cached}"
    );
    // Asked for anyway: 400 before anything starts, naming the reason.
    let (s, v) = sc.d.call(
        "PUT",
        "/v1/nodes/r3/states/provision",
        Some(json!({"target": "clean", "clean_steps": [
            {"interface": "raid", "step": "create_configuration"}]})),
    )?;
    let msg = fault(&v);
    ensure!(
        s == 400
            && msg.contains("node does not support this clean step")
            && msg.contains("raid.create_configuration")
            && msg.contains("this node's agent offered no RAID steps")
            && msg.contains("raid_interface is no-raid, not agent"),
        "{s} {msg}"
    );
    let n = sc.d.node("r3")?;
    ensure!(
        n["provision_state"] == "manageable" && n["target_provision_state"].is_null(),
        "nothing started: {n}"
    );
    // The cache kept what the agent offered: through the agent RAID interface they show.
    let (s, v) = sc.d.call(
        "PATCH",
        "/v1/nodes/r3",
        Some(json!([{"op": "replace", "path": "/raid_interface", "value": "agent"}])),
    )?;
    ensure!(s == 200, "{s} {v}");
    let (_, cached) = sc.d.call("GET", "/v1/nodes/r3/clean_steps", None)?;
    ensure!(
        cached.to_string().contains("create_configuration"),
        "{cached}"
    );
    Ok(())
}

#[test]
fn deploy_step_apply_configuration_from_a_template() -> Result<()> {
    let sc = AgentScene::start()?;
    let instance = |traits: Value| {
        json!({
            "image_source": "http://127.0.0.1:9/raid.img",
            "image_os_hash_algo": "sha256",
            "image_os_hash_value": "ab".repeat(32),
            "traits": traits,
        })
    };
    let (s, v) = sc.d.call(
        "POST",
        "/v1/deploy_templates",
        Some(json!({"name": "CUSTOM_RAID", "steps": [
            {"interface": "raid", "step": "apply_configuration", "priority": 90,
             "args": {"raid_config": target_cfg(), "delete_existing": true}}]})),
    )?;
    ensure!(s == 201, "{s} {v}");
    let deploy = |name: &str, body: Value| -> Result<(Ledger, Value)> {
        let uuid = sc.d.node(name)?["uuid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        sc.provision(name, json!({"target": "provide"}))?;
        sc.settle(name, 30)?;
        let (ledger, task) = sc.agent(&uuid)?;
        sc.provision(name, body)?;
        let n = sc.settle(name, 90)?;
        if n["provision_state"] == "active" {
            sc.finished(task)?;
        } else {
            // A failed node keeps its ramdisk (and its token) for an operator to look at.
            task.abort();
        }
        Ok((ledger, n))
    };

    // The template's step runs before write_image; its configuration becomes the target,
    // the agent gets it as target_raid_config, and what it built is raid_config.
    sc.node(
        "d1",
        "agent",
        json!({"instance_info": instance(json!(["CUSTOM_RAID"]))}),
    )?;
    let (ledger, n) = deploy("d1", json!({"target": "active"}))?;
    ensure!(
        n["provision_state"] == "active" && n["last_error"].is_null(),
        "{n}"
    );
    let steps = executed(&ledger);
    let names: Vec<&str> = steps.iter().map(|(w, _)| w.as_str()).collect();
    ensure!(
        names.first() == Some(&"raid.apply_configuration") && names.contains(&"deploy.write_image"),
        "{names:?}"
    );
    let sent = &steps[0].1;
    ensure!(
        sent.get("target_raid_config") == Some(&target_cfg())
            && sent.get("raid_config") == Some(&target_cfg())
            && sent.get("delete_existing") == Some(&json!(true)),
        "{sent:?}"
    );
    ensure!(n["target_raid_config"] == target_cfg(), "{n}");
    check_recorded(&n["raid_config"], &built_cfg())?;
    ensure!(
        n["properties"]["local_gb"] == 9
            && n["properties"]["capabilities"] == "boot_mode:bios,raid_level:1",
        "{}",
        n["properties"]
    );

    // A bad raid_config in the request's deploy_steps: the deploy fails naming the field,
    // the agent is never asked, the target and raid_config stay as they were.
    sc.node("d2", "agent", json!({"instance_info": instance(json!([]))}))?;
    let (s, v) = put_raid(&sc.d, "d2", &disk(json!({})))?;
    ensure!(s == 204, "{s} {v}");
    let (ledger, n) = deploy(
        "d2",
        json!({"target": "active", "deploy_steps": [
            {"interface": "raid", "step": "apply_configuration", "priority": 90,
             "args": {"raid_config": {"logical_disks": [{"raid_level": "4", "size_gb": 10}]}}}]}),
    )?;
    ensure!(n["provision_state"] == "deploy failed", "{n}");
    let err = n["last_error"].as_str().unwrap_or_default();
    ensure!(
        err.contains("apply_configuration")
            && err.contains("RAID config validation error")
            && err.contains("raid_level"),
        "{err}"
    );
    ensure!(
        !executed(&ledger)
            .iter()
            .any(|(w, _)| w.starts_with("raid.")),
        "{:?}",
        executed(&ledger)
    );
    ensure!(
        n["target_raid_config"] == disk(json!({})) && n["raid_config"] == json!({}),
        "{n}"
    );

    // Without its required raid_config: Ironic's missing-argument refusal.
    sc.node("d3", "agent", json!({"instance_info": instance(json!([]))}))?;
    let (ledger, n) = deploy(
        "d3",
        json!({"target": "active", "deploy_steps": [
            {"interface": "raid", "step": "apply_configuration", "priority": 90, "args": {}}]}),
    )?;
    let err = n["last_error"].as_str().unwrap_or_default();
    ensure!(
        n["provision_state"] == "deploy failed"
            && err.contains("missing these required arguments: raid_config"),
        "{n}"
    );
    ensure!(
        !executed(&ledger)
            .iter()
            .any(|(w, _)| w.starts_with("raid.")),
        "{:?}",
        executed(&ledger)
    );

    // no-raid: the agent offers the step, the node does not take it.
    sc.node(
        "d4",
        "no-raid",
        json!({"instance_info": instance(json!(["CUSTOM_RAID"]))}),
    )?;
    let (ledger, n) = deploy("d4", json!({"target": "active"}))?;
    let err = n["last_error"].as_str().unwrap_or_default();
    ensure!(
        n["provision_state"] == "deploy failed"
            && err.contains("raid.apply_configuration")
            && err.contains("raid_interface is no-raid, not agent"),
        "{n}"
    );
    ensure!(
        !executed(&ledger)
            .iter()
            .any(|(w, _)| w.starts_with("raid.")),
        "{:?}",
        executed(&ledger)
    );
    ensure!(
        sc.d.node("d4")?["target_raid_config"] == json!({}),
        "untouched"
    );
    Ok(())
}
