//! RAID on a real rivetd: `raid_interface` per hardware type (`agent` everywhere, as Metal3
//! and gophercloud create nodes; `fake` on fake-hardware only), `PUT …/states/raid` against
//! every rule of Ironic's RAID schema (each bad case a 400 naming the field that leaves the
//! stored target alone), the 1.12 gate, unknown nodes, `no-raid`; a manual cleaning that asks
//! for the agent's RAID steps (refused: this ramdisk offers none); and the clients —
//! `baremetal node set --target-raid-config`, openstacksdk, `rivet node raid set|show`.

use anyhow::{ensure, Context, Result};
use rivet_tests::clients::{self, baremetal, baremetal_json, sdk};
use rivet_tests::Rivetd;
use serde_json::{json, Value};
use std::time::Duration;

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
                && msg.contains("the agent of this ramdisk offers no RAID steps"),
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
