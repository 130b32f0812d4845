//! Node sub-resources and management calls on a real rivetd, through both stock clients
//! (python-ironicclient's `baremetal`, openstacksdk) where they have the call, raw HTTP for
//! gates and codes: volume connectors and targets (1.32), BIOS settings (1.40/1.74) and
//! firmware components (1.86) cached from a Redfish BMC (the in-tree mock) at `manage`,
//! child nodes (1.83), indicators (1.63), inject NMI (1.29), boot mode and secure boot
//! (1.76), RAID (1.12), the console and vendor passthru (1.1); then the same management calls
//! against sushy-tools, checked in the emulator.

use anyhow::{ensure, Context, Result};
use rivet_tests::clients::{self, baremetal, baremetal_failing, baremetal_json, sdk};
use rivet_tests::peers::{have_sushy, FakeSystem, MockState, RedfishMock, Sushy, SushyOptions};
use rivet_tests::{prerequisite, Rivetd};
use serde_json::{json, Value};
use std::time::Duration;

struct Answer {
    status: u16,
    body: Value,
}

impl Answer {
    fn fault(&self) -> String {
        let raw = self.body["error_message"].as_str().unwrap_or_default();
        serde_json::from_str::<Value>(raw)
            .ok()
            .and_then(|v| v["faultstring"].as_str().map(str::to_string))
            .unwrap_or_else(|| raw.to_string())
    }
}

/// A request at `version` with an optional JSON body.
fn at(d: &Rivetd, version: &str, method: &str, path: &str, body: Option<Value>) -> Result<Answer> {
    let m = reqwest::Method::from_bytes(method.as_bytes())?;
    let mut req = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()?
        .request(m, format!("{}{path}", d.url))
        .header("X-OpenStack-Ironic-API-Version", version);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().with_context(|| format!("{method} {path}"))?;
    let status = resp.status().as_u16();
    let text = resp.text()?;
    Ok(Answer {
        status,
        body: serde_json::from_str(&text).unwrap_or(Value::Null),
    })
}

fn ok(a: Answer, status: u16, what: &str) -> Result<Value> {
    ensure!(
        a.status == status,
        "{what}: expected {status}, got {} {}",
        a.status,
        a.body
    );
    Ok(a.body)
}

fn refused(a: Answer, status: u16, needle: &str, what: &str) -> Result<()> {
    let msg = a.fault();
    ensure!(
        a.status == status && msg.contains(needle),
        "{what}: expected {status} with {needle:?}, got {} {msg:?}",
        a.status
    );
    Ok(())
}

fn latest(d: &Rivetd, method: &str, path: &str, body: Option<Value>) -> Result<Answer> {
    at(d, "latest", method, path, body)
}

fn create_node(d: &Rivetd, body: Value) -> Result<String> {
    let v = ok(
        latest(d, "POST", "/v1/nodes", Some(body))?,
        201,
        "create node",
    )?;
    Ok(v["uuid"].as_str().unwrap_or_default().to_string())
}

fn power(d: &Rivetd, node: &str, target: &str) -> Result<()> {
    ok(
        latest(
            d,
            "PUT",
            &format!("/v1/nodes/{node}/states/power"),
            Some(json!({ "target": target })),
        )?,
        202,
        "power",
    )?;
    d.wait_node(node, Duration::from_secs(30), |v| {
        v["power_state"] == target && v["target_power_state"].is_null()
    })?;
    Ok(())
}

fn verb(d: &Rivetd, node: &str, target: &str, until: &str) -> Result<Value> {
    ok(
        latest(
            d,
            "PUT",
            &format!("/v1/nodes/{node}/states/provision"),
            Some(json!({ "target": target })),
        )?,
        202,
        target,
    )?;
    d.wait_node(node, Duration::from_secs(60), |v| {
        v["provision_state"] == until && v["target_provision_state"].is_null()
    })
}

fn start() -> Result<(tempfile::TempDir, Rivetd)> {
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start(&dir.path().join("rivet.db"), 0, &[])?;
    Ok((dir, d))
}

#[test]
fn volume_connectors_and_targets() -> Result<()> {
    if !clients::available() {
        return Ok(());
    }
    let (_dir, d) = start()?;
    let node = create_node(
        &d,
        json!({"driver": "fake-hardware", "name": "vol-node", "automated_clean": false}),
    )?;
    let other = create_node(&d, json!({"driver": "fake-hardware", "name": "vol-other"}))?;
    power(&d, "vol-node", "power off")?;

    // The gate: 404 below 1.32; the root lists its links.
    refused(
        at(&d, "1.31", "GET", "/v1/volume", None)?,
        404,
        "1.32",
        "volume at 1.31",
    )?;
    refused(
        at(&d, "1.31", "GET", "/v1/volume/connectors", None)?,
        404,
        "1.32",
        "connectors at 1.31",
    )?;
    let root = ok(
        at(&d, "1.32", "GET", "/v1/volume", None)?,
        200,
        "volume root",
    )?;
    ensure!(
        root["connectors"][0]["href"]
            .as_str()
            .is_some_and(|h| h.ends_with("/v1/volume/connectors")),
        "{root}"
    );
    let nroot = ok(
        latest(&d, "GET", "/v1/nodes/vol-node/volume", None)?,
        200,
        "node volume",
    )?;
    ensure!(
        nroot["targets"][0]["href"]
            .as_str()
            .is_some_and(|h| h.ends_with("/v1/nodes/vol-node/volume/targets")),
        "{nroot}"
    );

    // Connectors through the CLI: create, show, list, set, unset.
    let c = baremetal_json(
        &d,
        &[
            "volume",
            "connector",
            "create",
            "--node",
            &node,
            "--type",
            "iqn",
            "--connector-id",
            "iqn.2010-10.org.openstack:vol-node",
            "--extra",
            "rack=a1",
        ],
    )?;
    let cuuid = c["uuid"].as_str().unwrap_or_default().to_string();
    ensure!(c["type"] == "iqn" && c["node_uuid"] == node.as_str(), "{c}");
    ensure!(c["extra"]["rack"] == "a1", "{c}");
    let shown = baremetal_json(&d, &["volume", "connector", "show", &cuuid])?;
    ensure!(
        shown["connector_id"] == "iqn.2010-10.org.openstack:vol-node",
        "{shown}"
    );
    let listed = baremetal_json(&d, &["volume", "connector", "list", "--node", "vol-node"])?;
    ensure!(
        listed
            .as_array()
            .is_some_and(|a| a.len() == 1 && a[0]["uuid"] == cuuid.as_str()),
        "{listed}"
    );
    baremetal(
        &d,
        &["volume", "connector", "set", &cuuid, "--extra", "row=7"],
    )?;
    baremetal(
        &d,
        &["volume", "connector", "unset", &cuuid, "--extra", "rack"],
    )?;
    let shown = baremetal_json(&d, &["volume", "connector", "show", &cuuid])?;
    // The client reads `7` as JSON.
    ensure!(shown["extra"] == json!({"row": 7}), "{shown}");
    ensure!(!shown["updated_at"].is_null(), "{shown}");

    // Refusals: duplicate (type, id) 409; unknown type, missing node, bad node 400.
    // 409s are answers here: no retries (ironicclient's are 5, 2 s apart).
    let e = baremetal_failing(
        &d,
        &[
            "--max-retries",
            "0",
            "volume",
            "connector",
            "create",
            "--node",
            &other,
            "--type",
            "iqn",
            "--connector-id",
            "iqn.2010-10.org.openstack:vol-node",
        ],
    )?;
    ensure!(e.contains("409") || e.contains("already exists"), "{e}");
    refused(
        latest(
            &d,
            "POST",
            "/v1/volume/connectors",
            Some(json!({"node_uuid": node, "type": 5, "connector_id": "x"})),
        )?,
        400,
        "is not of type",
        "a connector type that is not a string (any string is one, as in Ironic's schema)",
    )?;
    refused(
        latest(
            &d,
            "POST",
            "/v1/volume/connectors",
            Some(
                json!({"node_uuid": "9bd4a0c8-41a4-4a52-8f10-4e9a4b3c2d1e", "type": "ip", "connector_id": "192.0.2.9"}),
            ),
        )?,
        400,
        "node_uuid",
        "missing node",
    )?;
    refused(
        latest(
            &d,
            "POST",
            "/v1/volume/connectors",
            Some(json!({"node_uuid": node, "type": "ip"})),
        )?,
        400,
        "'connector_id' is a required property",
        "no connector_id",
    )?;
    refused(
        latest(
            &d,
            "POST",
            "/v1/nodes/vol-node/volume/connectors",
            Some(json!({"node_uuid": node, "type": "ip", "connector_id": "192.0.2.9"})),
        )?,
        400,
        "Malformed request URI",
        "create under the node",
    )?;
    refused(
        latest(
            &d,
            "GET",
            "/v1/volume/connectors/8c9e2a43-7d35-4f57-9b3e-6b1f1a2c3d4e",
            None,
        )?,
        404,
        "could not be found",
        "missing connector",
    )?;
    refused(
        latest(&d, "GET", "/v1/volume/connectors/not-a-uuid", None)?,
        400,
        "Expected UUID",
        "bad uuid",
    )?;

    // Connectors through the SDK: create, get, list by node, update, delete.
    let v = sdk(
        &d,
        &format!(
            "c = conn.baremetal.create_volume_connector(node_id={node:?}, type='wwpn', connector_id='500143802426baf4')\n\
             got = conn.baremetal.get_volume_connector(c.id)\n\
             mine = [x.id for x in conn.baremetal.volume_connectors(node={node:?})]\n\
             up = conn.baremetal.update_volume_connector(c.id, extra={{'sdk': 'yes'}})\n\
             emit({{'id': c.id, 'type': got.type, 'mine': mine, 'extra': up.extra}})"
        ),
    )?;
    let sdk_id = v["id"].as_str().unwrap_or_default().to_string();
    ensure!(v["type"] == "wwpn" && v["extra"]["sdk"] == "yes", "{v}");
    ensure!(
        v["mine"].as_array().is_some_and(|a| a.len() == 2),
        "both connectors of the node: {v}"
    );
    sdk(
        &d,
        &format!("conn.baremetal.delete_volume_connector({sdk_id:?})\nemit(True)"),
    )?;
    refused(
        latest(&d, "GET", &format!("/v1/volume/connectors/{sdk_id}"), None)?,
        404,
        "could not be found",
        "deleted connector",
    )?;

    // Listing: default fields, detail, fields, paging.
    latest(
        &d,
        "POST",
        "/v1/volume/connectors",
        Some(json!({"node_uuid": other, "type": "mac", "connector_id": "52:54:00:12:34:56"})),
    )
    .and_then(|a| ok(a, 201, "third connector"))?;
    let page = ok(
        latest(&d, "GET", "/v1/volume/connectors?limit=1", None)?,
        200,
        "page",
    )?;
    ensure!(
        page["connectors"].as_array().is_some_and(|a| a.len() == 1)
            && page["next"].as_str().is_some_and(|n| n.contains("marker=")),
        "{page}"
    );
    ensure!(
        page["connectors"][0].get("extra").is_none(),
        "default fields: {page}"
    );
    let detail = ok(
        latest(&d, "GET", "/v1/volume/connectors?detail=true", None)?,
        200,
        "detail",
    )?;
    ensure!(
        detail["connectors"]
            .as_array()
            .is_some_and(|a| a.len() == 2 && a[0].get("extra").is_some()),
        "{detail}"
    );
    let fields = ok(
        latest(&d, "GET", "/v1/volume/connectors?fields=uuid,type", None)?,
        200,
        "fields",
    )?;
    ensure!(
        fields["connectors"][0]
            .as_object()
            .is_some_and(|m| m.len() == 3 && m.contains_key("links")),
        "{fields}"
    );
    refused(
        latest(
            &d,
            "GET",
            "/v1/volume/connectors?detail=true&fields=uuid",
            None,
        )?,
        400,
        "detail",
        "detail and fields",
    )?;
    let of_node = ok(
        latest(&d, "GET", "/v1/nodes/vol-other/volume/connectors", None)?,
        200,
        "node connectors",
    )?;
    ensure!(
        of_node["connectors"]
            .as_array()
            .is_some_and(|a| a.len() == 1),
        "{of_node}"
    );

    // Targets through the CLI; boot_index unique per node (409).
    let t = baremetal_json(
        &d,
        &[
            "volume",
            "target",
            "create",
            "--node",
            &node,
            "--type",
            "iscsi",
            "--boot-index",
            "0",
            "--volume-id",
            "vol-0",
            "--property",
            "target_lun=0",
        ],
    )?;
    let tuuid = t["uuid"].as_str().unwrap_or_default().to_string();
    ensure!(
        t["boot_index"] == 0 && t["properties"]["target_lun"] == 0,
        "{t}"
    );
    let e = baremetal_failing(
        &d,
        &[
            "--max-retries",
            "0",
            "volume",
            "target",
            "create",
            "--node",
            &node,
            "--type",
            "iscsi",
            "--boot-index",
            "0",
            "--volume-id",
            "vol-dup",
        ],
    )?;
    ensure!(e.contains("boot index") || e.contains("409"), "{e}");
    baremetal(
        &d,
        &["volume", "target", "set", &tuuid, "--volume-id", "vol-0b"],
    )?;
    let listed = baremetal_json(&d, &["volume", "target", "list", "--node", &node, "--long"])?;
    ensure!(
        listed
            .as_array()
            .is_some_and(|a| a.len() == 1 && a[0]["volume_id"] == "vol-0b"),
        "{listed}"
    );
    refused(
        latest(
            &d,
            "POST",
            "/v1/volume/targets",
            Some(
                json!({"node_uuid": node, "volume_type": "iscsi", "volume_id": "v", "boot_index": "first"}),
            ),
        )?,
        400,
        "integer",
        "boot_index type",
    )?;

    // Targets through the SDK.
    let v = sdk(
        &d,
        &format!(
            "t = conn.baremetal.create_volume_target(node_id={node:?}, volume_type='fibre_channel', boot_index=1, volume_id='vol-1')\n\
             got = conn.baremetal.get_volume_target(t.id)\n\
             ts = [x.id for x in conn.baremetal.volume_targets(node={node:?})]\n\
             up = conn.baremetal.update_volume_target(t.id, properties={{'lun': 3}})\n\
             emit({{'id': t.id, 'type': got.volume_type, 'n': len(ts), 'props': up.properties}})"
        ),
    )?;
    let t1 = v["id"].as_str().unwrap_or_default().to_string();
    ensure!(
        v["type"] == "fibre_channel" && v["n"] == 2 && v["props"]["lun"] == 3,
        "{v}"
    );

    // Changes need the node powered off (400); deletion too, outside manageable/enroll.
    verb(&d, "vol-node", "manage", "manageable")?;
    verb(&d, "vol-node", "provide", "available")?;
    power(&d, "vol-node", "power on")?;
    refused(
        latest(
            &d,
            "PATCH",
            &format!("/v1/volume/targets/{t1}"),
            Some(json!([{"op": "replace", "path": "/volume_id", "value": "x"}])),
        )?,
        400,
        "power on",
        "update while powered on",
    )?;
    let e = baremetal_failing(&d, &["volume", "connector", "delete", &cuuid])?;
    ensure!(e.contains("power on") || e.contains("400"), "{e}");
    refused(
        latest(&d, "DELETE", &format!("/v1/volume/targets/{t1}"), None)?,
        400,
        "can not be performed",
        "delete while powered on",
    )?;
    power(&d, "vol-node", "power off")?;
    baremetal(&d, &["volume", "target", "delete", &tuuid])?;
    sdk(
        &d,
        &format!("conn.baremetal.delete_volume_target({t1:?})\nemit(True)"),
    )?;
    baremetal(&d, &["volume", "connector", "delete", &cuuid])?;
    let left = ok(
        latest(&d, "GET", &format!("/v1/volume/targets?node={node}"), None)?,
        200,
        "left",
    )?;
    ensure!(
        left["targets"].as_array().is_some_and(Vec::is_empty),
        "{left}"
    );

    // Everything goes with its node.
    ok(
        latest(&d, "DELETE", "/v1/nodes/vol-other", None)?,
        204,
        "delete node",
    )?;
    let all = ok(
        latest(&d, "GET", "/v1/volume/connectors", None)?,
        200,
        "all",
    )?;
    ensure!(
        all["connectors"].as_array().is_some_and(Vec::is_empty),
        "{all}"
    );
    Ok(())
}

#[test]
fn caches_children_raid_console_passthru_and_fake_management() -> Result<()> {
    if !clients::available() {
        return Ok(());
    }
    let (_dir, d) = start()?;
    create_node(&d, json!({"driver": "fake-hardware", "name": "f"}))?;

    // fake-hardware has no BIOS or firmware to read: empty caches; gates 404 below.
    let bios = ok(latest(&d, "GET", "/v1/nodes/f/bios", None)?, 200, "bios")?;
    ensure!(bios == json!({"bios": []}), "{bios}");
    refused(
        at(&d, "1.39", "GET", "/v1/nodes/f/bios", None)?,
        404,
        "1.40",
        "bios at 1.39",
    )?;
    refused(
        at(&d, "1.73", "GET", "/v1/nodes/f/bios?detail=true", None)?,
        400,
        "detail",
        "detail at 1.73",
    )?;
    refused(
        latest(&d, "GET", "/v1/nodes/f/bios/NumLock", None)?,
        404,
        "NumLock",
        "no setting",
    )?;
    refused(
        at(&d, "1.85", "GET", "/v1/nodes/f/firmware", None)?,
        404,
        "1.86",
        "firmware at 1.85",
    )?;

    // A Redfish node: `manage` reads BIOS attributes and firmware versions from the BMC.
    let mock = RedfishMock::start(MockState::default())?;
    let info = mock.driver_info("mock-password");
    create_node(
        &d,
        json!({"driver": "redfish", "name": "r", "driver_info": info, "inspect_interface": "redfish"}),
    )?;
    verb(&d, "r", "manage", "manageable")?;
    let listed = baremetal_json(&d, &["node", "bios", "setting", "list", "r"])?;
    let names: Vec<&str> = listed
        .as_array()
        .map(|a| a.iter().filter_map(|s| s["name"].as_str()).collect())
        .unwrap_or_default();
    ensure!(
        names == ["BootMode", "NumLock", "ProcTurboMode"],
        "{listed}"
    );
    let one = baremetal_json(&d, &["node", "bios", "setting", "show", "r", "NumLock"])?;
    ensure!(
        one["value"] == "True",
        "booleans read as Ironic stores them: {one}"
    );
    let raw = ok(
        latest(&d, "GET", "/v1/nodes/r/bios/ProcTurboMode", None)?,
        200,
        "show",
    )?;
    ensure!(
        raw["ProcTurboMode"]["value"] == "Enabled"
            && raw["ProcTurboMode"].get("attribute_type").is_some()
            && raw["ProcTurboMode"]["links"][0]["href"]
                .as_str()
                .is_some_and(|h| h.ends_with("/bios/ProcTurboMode")),
        "{raw}"
    );
    let old = ok(
        at(&d, "1.40", "GET", "/v1/nodes/r/bios/ProcTurboMode", None)?,
        200,
        "show 1.40",
    )?;
    ensure!(
        old["ProcTurboMode"].get("attribute_type").is_none(),
        "{old}"
    );
    let detail = ok(
        latest(&d, "GET", "/v1/nodes/r/bios?detail=true", None)?,
        200,
        "detail",
    )?;
    ensure!(
        detail["bios"][0]
            .as_object()
            .is_some_and(|m| m.contains_key("reset_required")),
        "{detail}"
    );
    let fw = baremetal_json(&d, &["node", "firmware", "list", "r"])?;
    let row = fw
        .as_array()
        .and_then(|a| a.iter().find(|c| c.to_string().contains("\"bios\"")))
        .cloned()
        .unwrap_or_default();
    ensure!(
        row.to_string().matches("1.2.3").count() == 2,
        "bios component with initial and current version 1.2.3: {fw}"
    );
    let v = sdk(&d, "emit(conn.baremetal.list_node_firmware('r'))")?;
    ensure!(v.to_string().contains("1.2.3"), "sdk firmware: {v}");
    // NMI over Redfish: ComputerSystem.Reset with Nmi reaches the BMC.
    baremetal(&d, &["node", "inject", "nmi", "r"])?;
    ensure!(
        mock.state
            .lock()
            .map_err(|_| anyhow::anyhow!("mock poisoned"))?
            .resets
            .iter()
            .any(|r| r == "Nmi"),
        "no Nmi reset at the BMC"
    );
    // The BMC changes; out-of-band inspection refreshes the cache.
    mock.state
        .lock()
        .map_err(|_| anyhow::anyhow!("mock poisoned"))?
        .bios
        .insert("ProcTurboMode".into(), json!("Disabled"));
    verb(&d, "r", "inspect", "manageable")?;
    let raw = ok(
        latest(&d, "GET", "/v1/nodes/r/bios/ProcTurboMode", None)?,
        200,
        "again",
    )?;
    ensure!(
        raw["ProcTurboMode"]["value"] == "Disabled"
            && !raw["ProcTurboMode"]["updated_at"].is_null(),
        "{raw}"
    );

    // Children (1.83).
    let parent = create_node(&d, json!({"driver": "fake-hardware", "name": "parent"}))?;
    let kid = create_node(
        &d,
        json!({"driver": "fake-hardware", "name": "kid", "parent_node": "parent"}),
    )?;
    let kids = baremetal(&d, &["node", "children", "list", "parent"])?;
    ensure!(kids.contains(&kid), "{kids}");
    let raw = ok(
        latest(&d, "GET", "/v1/nodes/parent/children", None)?,
        200,
        "children",
    )?;
    ensure!(raw["children"] == json!([kid]), "{raw}");
    refused(
        at(&d, "1.82", "GET", "/v1/nodes/parent/children", None)?,
        404,
        "1.83",
        "children 1.82",
    )?;
    let none = ok(
        latest(&d, "GET", &format!("/v1/nodes/{kid}/children"), None)?,
        200,
        "none",
    )?;
    ensure!(none["children"] == json!([]), "{none}");
    // Lists leave child nodes out unless asked (`include_children`, `parent_node`; 1.83).
    let names = |v: &Value| -> Vec<String> {
        v["nodes"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|n| n["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let plain = ok(latest(&d, "GET", "/v1/nodes", None)?, 200, "list")?;
    ensure!(
        names(&plain).contains(&"parent".to_string())
            && !names(&plain).contains(&"kid".to_string()),
        "{plain}"
    );
    let all = ok(
        latest(&d, "GET", "/v1/nodes?include_children=true", None)?,
        200,
        "all",
    )?;
    ensure!(names(&all).contains(&"kid".to_string()), "{all}");
    let of_parent = ok(
        latest(&d, "GET", &format!("/v1/nodes?parent_node={parent}"), None)?,
        200,
        "of parent",
    )?;
    ensure!(names(&of_parent) == ["kid"], "{of_parent}");
    refused(
        at(&d, "1.82", "GET", "/v1/nodes?include_children=true", None)?,
        406,
        "1.83",
        "include_children at 1.82",
    )?;
    let cli = baremetal(&d, &["node", "list"])?;
    ensure!(cli.contains("parent") && !cli.contains("kid"), "{cli}");

    // Console: fake-hardware's `fake` console is enabled and disabled as Ironic's fake
    // one is, and the node shows it; `no-console` refuses as Ironic's refuses.
    let c = baremetal_json(&d, &["node", "console", "show", "f"])?;
    ensure!(
        c["console_enabled"] == false && c["console_info"].is_null(),
        "{c}"
    );
    baremetal(&d, &["node", "console", "enable", "f"])?;
    let c = baremetal_json(&d, &["node", "console", "show", "f"])?;
    ensure!(
        c["console_enabled"] == true && c["console_info"] == json!({}),
        "{c}"
    );
    let n = baremetal_json(&d, &["node", "show", "f", "--fields", "console_enabled"])?;
    ensure!(n["console_enabled"] == true, "{n}");
    let v = sdk(&d, "emit(conn.baremetal.get_node_console('f'))")?;
    ensure!(v["console_enabled"] == true, "{v}");
    baremetal(&d, &["node", "console", "disable", "f"])?;
    let states = at(&d, "latest", "GET", "/v1/nodes/f/states", None)?;
    ensure!(
        states.status == 200 && states.body["console_enabled"] == false,
        "{}",
        states.body
    );
    create_node(
        &d,
        json!({"driver": "fake-hardware", "name": "nocons", "console_interface": "no-console"}),
    )?;
    let e = baremetal_failing(&d, &["node", "console", "enable", "nocons"])?;
    ensure!(e.contains("does not support console"), "{e}");

    // Vendor passthru: no methods; a call is a 400.
    let m = baremetal(&d, &["node", "passthru", "list", "f"])?;
    ensure!(!m.contains("Name"), "no methods: {m}");
    let e = baremetal_failing(&d, &["node", "passthru", "call", "f", "heartbeat"])?;
    ensure!(e.contains("No handler for method heartbeat"), "{e}");
    let v = sdk(&d, "emit(conn.baremetal.list_node_vendor_passthru('f'))")?;
    ensure!(v == json!({}), "{v}");
    let dm = ok(
        latest(
            &d,
            "GET",
            "/v1/drivers/fake-hardware/vendor_passthru/methods",
            None,
        )?,
        200,
        "driver methods",
    )?;
    ensure!(dm == json!({}), "{dm}");
    refused(
        latest(
            &d,
            "POST",
            "/v1/drivers/fake-hardware/vendor_passthru",
            None,
        )?,
        400,
        "Method not specified",
        "driver call without method",
    )?;
    refused(
        latest(&d, "GET", "/v1/drivers/nope/vendor_passthru/methods", None)?,
        404,
        "nope",
        "unknown driver",
    )?;

    // RAID (1.12): fake RAID takes a valid target; no-raid 404; bad config 400.
    let props = baremetal(&d, &["driver", "raid", "property", "list", "fake-hardware"])?;
    ensure!(
        props.contains("raid_level") && props.contains("size_gb"),
        "{props}"
    );
    refused(
        latest(
            &d,
            "GET",
            "/v1/drivers/redfish/raid/logical_disk_properties",
            None,
        )?,
        404,
        "does not support raid",
        "redfish raid properties",
    )?;
    let cfg =
        json!({"logical_disks": [{"raid_level": "1", "size_gb": 100, "is_root_volume": true}]});
    baremetal(
        &d,
        &["node", "set", "f", "--target-raid-config", &cfg.to_string()],
    )?;
    let shown = baremetal_json(&d, &["node", "show", "f"])?;
    ensure!(
        shown["target_raid_config"] == cfg && shown["raid_config"] == json!({}),
        "{shown}"
    );
    let v = sdk(
        &d,
        "n = conn.baremetal.update_node('f', description='raid')\nemit(n.target_raid_config)",
    )?;
    ensure!(v == cfg, "PATCH answers with the stored target: {v}");
    let states = ok(
        latest(&d, "GET", "/v1/nodes/f/states", None)?,
        200,
        "states",
    )?;
    ensure!(states["target_raid_config"] == cfg, "{states}");
    let old = ok(
        at(&d, "1.11", "GET", "/v1/nodes/f", None)?,
        200,
        "node at 1.11",
    )?;
    ensure!(
        old.get("target_raid_config").is_none(),
        "hidden below 1.12: {old}"
    );
    let old = ok(
        at(&d, "1.11", "GET", "/v1/nodes/f/states", None)?,
        200,
        "states 1.11",
    )?;
    ensure!(old.get("target_raid_config").is_none(), "{old}");
    let e = baremetal_failing(
        &d,
        &[
            "node",
            "set",
            "f",
            "--target-raid-config",
            r#"{"logical_disks": [{"raid_level": "7", "size_gb": 1}]}"#,
        ],
    )?;
    ensure!(e.contains("raid_level"), "{e}");
    refused(
        latest(&d, "PUT", "/v1/nodes/r/states/raid", Some(cfg.clone()))?,
        404,
        "does not support raid",
        "redfish raid",
    )?;
    refused(
        at(&d, "1.11", "PUT", "/v1/nodes/f/states/raid", Some(cfg))?,
        406,
        "1.12",
        "raid at 1.11",
    )?;

    // fake-hardware indicators (1.63).
    let inds = ok(
        latest(&d, "GET", "/v1/nodes/f/management/indicators", None)?,
        200,
        "indicators",
    )?;
    let names: Vec<&str> = inds["indicators"]
        .as_array()
        .map(|a| a.iter().filter_map(|i| i["name"].as_str()).collect())
        .unwrap_or_default();
    ensure!(names == ["led-0@chassis", "led@system"], "{inds}");
    ok(
        latest(
            &d,
            "PUT",
            "/v1/nodes/f/management/indicators/led@system",
            Some(json!({"state": "BLINKING"})),
        )?,
        204,
        "set indicator",
    )?;
    let s = ok(
        latest(
            &d,
            "GET",
            "/v1/nodes/f/management/indicators/led@system",
            None,
        )?,
        200,
        "get indicator",
    )?;
    ensure!(s == json!({"state": "BLINKING"}), "{s}");
    refused(
        latest(
            &d,
            "PUT",
            "/v1/nodes/f/management/indicators/led-0@chassis",
            Some(json!({"state": "ON"})),
        )?,
        400,
        "read-only",
        "read-only indicator",
    )?;
    refused(
        latest(&d, "GET", "/v1/nodes/f/management/indicators/led", None)?,
        400,
        "Malformed indicator name",
        "malformed indicator",
    )?;
    refused(
        at(&d, "1.62", "GET", "/v1/nodes/f/management/indicators", None)?,
        404,
        "1.63",
        "indicators at 1.62",
    )?;

    // Inject NMI (1.29), boot mode and secure boot (1.76) on fake-hardware.
    baremetal(&d, &["node", "inject", "nmi", "f"])?;
    sdk(&d, "conn.baremetal.inject_nmi_to_node('f')\nemit(True)")?;
    refused(
        at(
            &d,
            "1.28",
            "PUT",
            "/v1/nodes/f/management/inject_nmi",
            Some(json!({})),
        )?,
        404,
        "1.29",
        "nmi at 1.28",
    )?;
    baremetal(&d, &["node", "boot", "mode", "set", "f", "bios"])?;
    sdk(&d, "conn.baremetal.set_node_boot_mode('f', 'uefi')\nconn.baremetal.set_node_secure_boot('f', True)\nemit(True)")?;
    baremetal(&d, &["node", "secure", "boot", "off", "f"])?;
    let v = sdk(
        &d,
        "n = conn.baremetal.get_node('f')\nemit({'mode': n.boot_mode, 'secure': n.is_secure_boot})",
    )?;
    ensure!(v == json!({"mode": "uefi", "secure": false}), "{v}");
    let listed = ok(
        latest(
            &d,
            "GET",
            "/v1/nodes?detail=true&fields=name,boot_mode,secure_boot",
            None,
        )?,
        200,
        "list with boot fields",
    )?;
    ensure!(
        listed["nodes"].as_array().is_some_and(|a| a
            .iter()
            .any(|n| n["name"] == "f" && n["boot_mode"] == "uefi" && n["secure_boot"] == false)),
        "{listed}"
    );
    let old = ok(
        at(&d, "1.74", "GET", "/v1/nodes/f", None)?,
        200,
        "node at 1.74",
    )?;
    ensure!(
        old.get("boot_mode").is_none() && old.get("secure_boot").is_none(),
        "{old}"
    );
    refused(
        latest(
            &d,
            "PUT",
            "/v1/nodes/f/states/boot_mode",
            Some(json!({"target": "floppy"})),
        )?,
        400,
        "Invalid boot mode",
        "bad boot mode",
    )?;
    refused(
        at(
            &d,
            "1.75",
            "PUT",
            "/v1/nodes/f/states/boot_mode",
            Some(json!({"target": "uefi"})),
        )?,
        404,
        "1.76",
        "boot mode at 1.75",
    )?;
    // A held node is refused (409).
    let held = create_node(
        &d,
        json!({"driver": "fake-hardware", "name": "slow", "driver_info": {"fake_delay_ms": 3000}}),
    )?;
    ok(
        latest(
            &d,
            "PUT",
            "/v1/nodes/slow/states/power",
            Some(json!({"target": "power on"})),
        )?,
        202,
        "slow power",
    )?;
    refused(
        latest(
            &d,
            "PUT",
            "/v1/nodes/slow/management/inject_nmi",
            Some(json!({})),
        )?,
        409,
        "power action",
        "nmi while powering",
    )?;
    let _ = held;
    Ok(())
}

#[test]
fn redfish_management_in_sushy() -> Result<()> {
    if !prerequisite(have_sushy(), "sushy-emulator in .venv-sushy") || !clients::available() {
        return Ok(());
    }
    let sys = FakeSystem::new("mgmt", "52:54:00:AB:CD:31");
    let sushy = Sushy::start(SushyOptions {
        systems: vec![sys.clone()],
        ..SushyOptions::default()
    })?;
    let (_dir, d) = start()?;
    create_node(
        &d,
        json!({"driver": "redfish", "name": "s", "driver_info": sushy.driver_info(&sys.uuid, "sushy-user", "sushy-pass-1")}),
    )?;
    verb(&d, "s", "manage", "manageable")?;

    // Indicators: named by the System's (and Chassis') UUID, as Ironic names them.
    let system = sushy.system(&sys.uuid)?;
    let inds = ok(
        latest(&d, "GET", "/v1/nodes/s/management/indicators", None)?,
        200,
        "list",
    )?;
    let want = format!("{}@system", system["UUID"].as_str().unwrap_or_default());
    ensure!(
        inds["indicators"]
            .as_array()
            .is_some_and(|a| a.iter().any(|i| i["name"] == want.as_str())),
        "{inds} (want {want})"
    );
    let path = format!("/v1/nodes/s/management/indicators/{want}");
    ok(
        latest(&d, "PUT", &path, Some(json!({"state": "BLINKING"})))?,
        204,
        "set",
    )?;
    ensure!(
        sushy.system(&sys.uuid)?["IndicatorLED"] == "Blinking",
        "the emulator's LED: {}",
        sushy.system(&sys.uuid)?
    );
    let s = ok(latest(&d, "GET", &path, None)?, 200, "get")?;
    ensure!(s["state"] == "BLINKING", "{s}");

    // NMI: sushy's fake driver refuses the Nmi reset it advertises; the refusal comes back
    // from the emulator as a server-side failure naming it.
    let before = sushy.reset_requests();
    let e = baremetal_failing(&d, &["node", "inject", "nmi", "s"])?;
    ensure!(e.contains("Nmi") && e.contains("HTTP 500"), "{e}");
    ensure!(
        sushy.reset_requests() > before,
        "no Reset request in the emulator's log"
    );

    // Boot mode through the SDK: the emulator reports it.
    sdk(
        &d,
        "conn.baremetal.set_node_boot_mode('s', 'uefi')\nemit(True)",
    )?;
    let system = sushy.system(&sys.uuid)?;
    ensure!(
        system["Boot"]["BootSourceOverrideMode"] == "UEFI",
        "{system}"
    );
    sdk(
        &d,
        "conn.baremetal.set_node_boot_mode('s', 'bios')\nemit(True)",
    )?;
    let system = sushy.system(&sys.uuid)?;
    ensure!(
        system["Boot"]["BootSourceOverrideMode"] == "Legacy",
        "{system}"
    );
    // Secure boot through the emulator's SecureBoot resource: refused in Legacy mode (as
    // Ironic's redfish management refuses it), done once the mode is UEFI.
    let refused = baremetal(&d, &["node", "secure", "boot", "on", "s"])
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    ensure!(refused.contains("Secure Boot needs UEFI"), "{refused}");
    let sb = sushy.get(&format!("/redfish/v1/Systems/{}/SecureBoot", sys.uuid))?;
    ensure!(sb["SecureBootEnable"] == false, "{sb}");
    baremetal(&d, &["node", "boot", "mode", "set", "s", "uefi"])?;
    baremetal(&d, &["node", "secure", "boot", "on", "s"])?;
    let sb = sushy.get(&format!("/redfish/v1/Systems/{}/SecureBoot", sys.uuid))?;
    ensure!(sb["SecureBootEnable"] == true, "{sb}");
    let node = ok(latest(&d, "GET", "/v1/nodes/s", None)?, 200, "node")?;
    ensure!(
        node["boot_mode"] == "uefi" && node["secure_boot"] == true,
        "the node shows what the BMC reports: {node}"
    );

    // Firmware: whatever the emulator reports as BiosVersion is what the cache holds.
    let fw = ok(
        latest(&d, "GET", "/v1/nodes/s/firmware", None)?,
        200,
        "firmware",
    )?;
    match system["BiosVersion"].as_str() {
        Some(v) => ensure!(
            fw["firmware"].as_array().is_some_and(|a| a
                .iter()
                .any(|c| c["component"] == "bios" && c["current_version"] == v)),
            "{fw}"
        ),
        None => ensure!(
            fw["firmware"]
                .as_array()
                .is_some_and(|a| a.iter().all(|c| c["component"] != "bios")),
            "{fw}"
        ),
    }

    // 1.74: the registry fields come from the emulator's BIOS attribute registry, found
    // through its /redfish/v1/Registries as sushy finds it. sushy-tools' fake driver serves
    // no BIOS resource (NotSupported), so there the cache stays empty; the registry lookup
    // against its Registries layout is covered by the in-tree mock, which copies it.
    let bios_at_bmc = sushy
        .get(&format!("/redfish/v1/Systems/{}/BIOS", sys.uuid))
        .is_ok();
    let registry = sushy.get("/redfish/v1/Systems/Bios/BiosRegistry")?;
    let entries = registry["RegistryEntries"]["Attributes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let bios = ok(
        latest(&d, "GET", "/v1/nodes/s/bios?detail=True", None)?,
        200,
        "bios detail",
    )?;
    let settings = bios["bios"].as_array().cloned().unwrap_or_default();
    let mut checked = 0;
    for s in &settings {
        let Some(e) = entries.iter().find(|e| e["AttributeName"] == s["name"]) else {
            continue;
        };
        ensure!(s["attribute_type"] == e["Type"], "{s} vs {e}");
        if let Some(values) = e["Value"].as_array() {
            let names: Vec<Value> = values
                .iter()
                .filter_map(|v| v["ValueName"].as_str().map(|n| json!(n)))
                .collect();
            ensure!(s["allowable_values"] == json!(names), "{s} vs {e}");
        }
        if let Some(ro) = e["ReadOnly"].as_bool() {
            ensure!(s["read_only"] == ro, "{s} vs {e}");
        }
        checked += 1;
    }
    if bios_at_bmc {
        ensure!(
            checked > 0,
            "no cached setting has a registry entry: {bios} / {registry}"
        );
    } else {
        ensure!(settings.is_empty(), "BIOS cached without a BIOS: {bios}");
    }
    // 1.114: the BMC component carries its Manager's model.
    let fw = ok(
        latest(&d, "GET", "/v1/nodes/s/firmware", None)?,
        200,
        "firmware",
    )?;
    let managers = sushy.get("/redfish/v1/Managers")?;
    let first = managers["Members"][0]["@odata.id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let manager = sushy.get(&first)?;
    if let Some(v) = manager["FirmwareVersion"].as_str() {
        ensure!(
            fw["firmware"]
                .as_array()
                .is_some_and(|a| a.iter().any(|c| c["component"] == "bmc"
                    && c["current_version"] == v
                    && c["model"] == manager["Model"])),
            "{fw} vs {manager}"
        );
    }
    Ok(())
}

#[test]
fn soft_power_and_timeout() -> Result<()> {
    if !clients::available() {
        return Ok(());
    }
    let (_dir, d) = start()?;
    create_node(&d, json!({"driver": "fake-hardware", "name": "p"}))?;
    power(&d, "p", "power on")?;
    // Soft actions and `timeout` came with 1.27.
    refused(
        at(
            &d,
            "1.26",
            "PUT",
            "/v1/nodes/p/states/power",
            Some(json!({"target": "soft power off"})),
        )?,
        406,
        "1.27",
        "soft off at 1.26",
    )?;
    refused(
        at(
            &d,
            "1.26",
            "PUT",
            "/v1/nodes/p/states/power",
            Some(json!({"target": "power off", "timeout": 10})),
        )?,
        406,
        "1.27",
        "timeout at 1.26",
    )?;
    refused(
        latest(
            &d,
            "PUT",
            "/v1/nodes/p/states/power",
            Some(json!({"target": "power off", "timeout": 0})),
        )?,
        400,
        "positive integer",
        "zero timeout",
    )?;
    baremetal(
        &d,
        &[
            "node",
            "power",
            "off",
            "--soft",
            "--power-timeout",
            "30",
            "p",
        ],
    )?;
    d.wait_node("p", Duration::from_secs(30), |v| {
        v["power_state"] == "power off" && v["target_power_state"].is_null()
    })?;
    baremetal(&d, &["node", "reboot", "--soft", "p"])?;
    d.wait_node("p", Duration::from_secs(30), |v| {
        v["power_state"] == "power on" && v["target_power_state"].is_null()
    })?;
    // A BMC slower than the timeout fails the action, in last_error.
    ok(
        latest(
            &d,
            "PATCH",
            "/v1/nodes/p",
            Some(json!([{"op": "add", "path": "/driver_info/fake_delay_ms", "value": 3000}])),
        )?,
        200,
        "slow BMC",
    )?;
    ok(
        latest(
            &d,
            "PUT",
            "/v1/nodes/p/states/power",
            Some(json!({"target": "soft power off", "timeout": 1})),
        )?,
        202,
        "soft off with timeout",
    )?;
    let n = d.wait_node("p", Duration::from_secs(30), |v| {
        v["target_power_state"].is_null()
    })?;
    ensure!(
        n["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("within the requested timeout of 1 s")),
        "{n}"
    );
    ensure!(n["power_state"] == "power on", "{n}");
    Ok(())
}

/// `rivet` with `args` against `d`; its stdout, or an error with its stderr.
fn rivet(d: &Rivetd, args: &[&str]) -> Result<String> {
    let out = std::process::Command::new(rivet_tests::bin("rivet"))
        .args(["--url", &d.url])
        .args(args)
        .output()?;
    ensure!(
        out.status.success(),
        "rivet {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}

#[test]
fn rivet_cli_node_resources() -> Result<()> {
    let (_dir, d) = start()?;
    let node = create_node(&d, json!({"driver": "fake-hardware", "name": "c"}))?;
    create_node(
        &d,
        json!({"driver": "fake-hardware", "name": "c-kid", "parent_node": "c"}),
    )?;
    let c: Value = serde_json::from_str(&rivet(
        &d,
        &[
            "--json",
            "volume",
            "connector",
            "create",
            "--node",
            "c",
            "--type",
            "iqn",
            "--connector-id",
            "iqn.2024-01.org:c",
        ],
    )?)?;
    ensure!(c["node_uuid"] == node.as_str() && c["type"] == "iqn", "{c}");
    let cuuid = c["uuid"].as_str().unwrap_or_default().to_string();
    let t: Value = serde_json::from_str(&rivet(
        &d,
        &[
            "--json",
            "volume",
            "target",
            "create",
            "--node",
            "c",
            "--type",
            "iscsi",
            "--volume-id",
            "v1",
            "--boot-index",
            "0",
            "--property",
            "lun=1",
        ],
    )?)?;
    ensure!(t["properties"]["lun"] == "1", "{t}");
    let listed = rivet(&d, &["volume", "connector", "list", "--node", "c"])?;
    ensure!(
        listed.contains(&cuuid) && listed.contains("iqn.2024-01.org:c"),
        "{listed}"
    );
    rivet(&d, &["volume", "connector", "delete", &cuuid])?;
    ensure!(
        !rivet(&d, &["volume", "connector", "list"])?.contains(&cuuid),
        "deleted"
    );
    let kids = rivet(&d, &["node", "children", "c"])?;
    ensure!(
        kids.trim() == d.node("c-kid")?["uuid"].as_str().unwrap_or("?"),
        "{kids}"
    );
    rivet(
        &d,
        &["node", "indicator", "c", "led@system", "--state", "ON"],
    )?;
    let s = rivet(&d, &["--json", "node", "indicator", "c", "led@system"])?;
    ensure!(s.contains("\"ON\""), "{s}");
    rivet(
        &d,
        &[
            "node",
            "raid",
            "set",
            "c",
            r#"{"logical_disks": [{"raid_level": "0", "size_gb": "MAX"}]}"#,
        ],
    )?;
    let r = rivet(&d, &["--json", "node", "raid", "show", "c"])?;
    ensure!(r.contains("MAX"), "{r}");
    rivet(&d, &["node", "inject-nmi", "c"])?;
    rivet(&d, &["node", "boot-mode", "c", "bios"])?;
    // Secure Boot is UEFI's: the fake BMC refuses it in bios mode, as a Redfish BMC does.
    ensure!(rivet(&d, &["node", "secure-boot", "c", "on"]).is_err());
    rivet(&d, &["node", "boot-mode", "c", "uefi"])?;
    rivet(&d, &["node", "secure-boot", "c", "on"])?;
    ensure!(d.node("c")?["boot_mode"] == "uefi" && d.node("c")?["secure_boot"] == true);
    let console = rivet(&d, &["--json", "node", "console-state", "c"])?;
    ensure!(console.contains("\"console_enabled\": false"), "{console}");
    let bios = rivet(&d, &["--json", "node", "bios", "c"])?;
    ensure!(bios.contains("\"bios\": []"), "{bios}");
    Ok(())
}

/// The registry fields of one cached BIOS setting, at the latest version.
fn bios_setting(d: &Rivetd, name: &str) -> Result<Value> {
    let doc = ok(
        latest(d, "GET", &format!("/v1/nodes/r/bios/{name}"), None)?,
        200,
        name,
    )?;
    Ok(doc[name].clone())
}

/// 1.74 registry fields read from the BMC's BIOS attribute registry (found through
/// `/redfish/v1/Registries` as sushy finds it) and 1.114 vendor, model and serial number of
/// firmware components (the Manager's `Model`, the Chassis' NetworkAdapters), as Ironic's
/// redfish interfaces cache them; both refreshed from the BMC, null without a registry.
#[test]
fn bios_registry_and_firmware_identity_from_redfish() -> Result<()> {
    if !clients::available() {
        return Ok(());
    }
    let (_dir, d) = start()?;
    let mut state = MockState::default();
    state.bios.insert("CoreCount".into(), json!(8));
    state.bios.insert("AssetTag".into(), json!("rack-7"));
    let mock = RedfishMock::start(state)?;
    create_node(
        &d,
        json!({"driver": "redfish", "name": "r", "driver_info": mock.driver_info("mock-password"),
               "inspect_interface": "redfish"}),
    )?;
    verb(&d, "r", "manage", "manageable")?;
    ensure!(
        mock.snapshot()
            .requests
            .iter()
            .any(|r| r == "GET /redfish/v1/Registries/BiosAttributeRegistry.v1_0_0/en"),
        "the attribute registry was not read: {:?}",
        mock.snapshot().requests
    );

    let turbo = bios_setting(&d, "ProcTurboMode")?;
    ensure!(
        turbo["attribute_type"] == "Enumeration"
            && turbo["allowable_values"] == json!(["Enabled", "Disabled"])
            && turbo["read_only"] == false
            && turbo["reset_required"] == true
            && turbo["unique"].is_null()
            && turbo["lower_bound"].is_null()
            && turbo["max_length"].is_null(),
        "{turbo}"
    );
    // An enumeration entry without ValueName is named by its ValueDisplayName.
    let boot = bios_setting(&d, "BootMode")?;
    ensure!(
        boot["allowable_values"] == json!(["Bios", "Uefi"]) && boot["reset_required"].is_null(),
        "{boot}"
    );
    let cores = bios_setting(&d, "CoreCount")?;
    ensure!(
        cores["value"] == "8"
            && cores["attribute_type"] == "Integer"
            && cores["lower_bound"] == 1
            && cores["upper_bound"] == 64
            && cores["allowable_values"].is_null(),
        "{cores}"
    );
    let tag = bios_setting(&d, "AssetTag")?;
    ensure!(
        tag["attribute_type"] == "String"
            && tag["min_length"] == 0
            && tag["max_length"] == 16
            && tag["unique"] == true
            && tag["read_only"] == true,
        "{tag}"
    );
    // No registry entry for NumLock: its registry fields are null, as in Ironic.
    let numlock = bios_setting(&d, "NumLock")?;
    ensure!(
        numlock["value"] == "True"
            && [
                "attribute_type",
                "allowable_values",
                "lower_bound",
                "upper_bound",
                "min_length",
                "max_length",
                "read_only",
                "reset_required",
                "unique"
            ]
            .iter()
            .all(|f| numlock.get(*f) == Some(&Value::Null)),
        "{numlock}"
    );
    let detail = ok(
        latest(&d, "GET", "/v1/nodes/r/bios?detail=True", None)?,
        200,
        "detail",
    )?;
    ensure!(
        detail["bios"].as_array().is_some_and(|a| a
            .iter()
            .any(|s| s["name"] == "CoreCount" && s["upper_bound"] == 64)),
        "{detail}"
    );
    let some = ok(
        latest(
            &d,
            "GET",
            "/v1/nodes/r/bios?fields=name,attribute_type",
            None,
        )?,
        200,
        "fields",
    )?;
    ensure!(
        some["bios"].as_array().is_some_and(|a| a
            .iter()
            .any(|s| s["name"] == "AssetTag" && s["attribute_type"] == "String")),
        "{some}"
    );
    // The stock CLI shows the registry fields of a setting and lists them with --long.
    // (openstacksdk has no BIOS settings call.)
    let shown = baremetal_json(&d, &["node", "bios", "setting", "show", "r", "CoreCount"])?;
    ensure!(
        shown["attribute_type"] == "Integer" && shown["upper_bound"] == 64,
        "CLI show: {shown}"
    );
    let long = baremetal_json(&d, &["node", "bios", "setting", "list", "r", "--long"])?;
    let row = long
        .as_array()
        .and_then(|a| a.iter().find(|s| s.to_string().contains("AssetTag")))
        .cloned()
        .unwrap_or_default();
    ensure!(
        row.to_string().contains("\"String\"") && row.to_string().contains("16"),
        "CLI list --long: {long}"
    );

    // Firmware components with vendor, model and serial number (1.114).
    let fw = ok(
        latest(&d, "GET", "/v1/nodes/r/firmware", None)?,
        200,
        "firmware",
    )?;
    let comp = |name: &str| -> Value {
        fw["firmware"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["component"] == name))
            .cloned()
            .unwrap_or_default()
    };
    let bios_fw = comp("bios");
    ensure!(
        bios_fw["current_version"] == "1.2.3"
            && bios_fw["vendor"].is_null()
            && bios_fw["model"].is_null()
            && bios_fw["serial_number"].is_null(),
        "{fw}"
    );
    let bmc = comp("bmc");
    ensure!(
        bmc["current_version"] == "4.5.6"
            && bmc["model"] == "MockBMC 9000"
            && bmc["vendor"].is_null()
            && bmc["serial_number"].is_null(),
        "the BMC has its Manager's model only, as in Ironic: {fw}"
    );
    let nic = comp("nic:ACME0001");
    ensure!(
        nic["current_version"] == "22.31.6"
            && nic["initial_version"] == "22.31.6"
            && nic["vendor"] == "Acme Networks"
            && nic["model"] == "AN-25G"
            && nic["serial_number"] == "ACME0001",
        "{fw}"
    );
    let embedded = comp("nic:NIC.Embedded.1");
    ensure!(
        embedded["vendor"] == "Other Corp"
            && embedded["model"].is_null()
            && embedded["serial_number"].is_null(),
        "an adapter without serial is named by its Id: {fw}"
    );
    ensure!(
        fw["firmware"].as_array().map(Vec::len) == Some(4),
        "a controller without FirmwarePackageVersion is no component: {fw}"
    );
    let old = ok(
        at(&d, "1.113", "GET", "/v1/nodes/r/firmware", None)?,
        200,
        "firmware 1.113",
    )?;
    ensure!(
        old["firmware"]
            .as_array()
            .is_some_and(|a| a.iter().all(|c| c.get("vendor").is_none())),
        "{old}"
    );
    // Neither stock client shows the 1.114 fields (the CLI's firmware columns stop at
    // last_version_flashed; openstacksdk asks at 1.86); both list the NIC components.
    let cli = baremetal_json(&d, &["node", "firmware", "list", "r"])?;
    ensure!(cli.to_string().contains("nic:ACME0001"), "CLI: {cli}");
    let v = sdk(&d, "emit(conn.baremetal.list_node_firmware('r'))")?;
    ensure!(v.to_string().contains("nic:NIC.Embedded.1"), "sdk: {v}");
    // Rivet's own CLI shows them all.
    let table = rivet(&d, &["node", "firmware", "r"])?;
    ensure!(
        table.contains("Acme Networks")
            && table.contains("ACME0001")
            && table.contains("MockBMC 9000"),
        "rivet node firmware: {table}"
    );
    let shown = rivet(&d, &["node", "bios", "r", "CoreCount"])?;
    ensure!(
        shown.contains("upper_bound") && shown.contains("64") && shown.contains("Integer"),
        "rivet node bios: {shown}"
    );

    // The BMC changes: inspection refreshes registry fields and identities.
    mock.with(|s| {
        if let Some(reg) = s.bios_registry.as_mut() {
            for e in reg.iter_mut() {
                if e["AttributeName"] == "CoreCount" {
                    e["UpperBound"] = json!(128);
                }
            }
        }
        s.network_adapters[0]["Model"] = json!("AN-100G");
    });
    verb(&d, "r", "inspect", "manageable")?;
    let cores = bios_setting(&d, "CoreCount")?;
    ensure!(cores["upper_bound"] == 128, "{cores}");
    let fw = ok(
        latest(&d, "GET", "/v1/nodes/r/firmware", None)?,
        200,
        "firmware",
    )?;
    ensure!(
        fw["firmware"].as_array().is_some_and(|a| a
            .iter()
            .any(|c| c["component"] == "nic:ACME0001" && c["model"] == "AN-100G")),
        "{fw}"
    );
    // A BMC without registries: the fields are null again.
    mock.with(|s| s.bios_registry = None);
    verb(&d, "r", "inspect", "manageable")?;
    let cores = bios_setting(&d, "CoreCount")?;
    ensure!(
        cores["value"] == "8"
            && cores["attribute_type"].is_null()
            && cores["upper_bound"].is_null(),
        "{cores}"
    );
    Ok(())
}
