//! Inspection rules in Ironic's schema (API 1.96) against the real rivetd: CRUD, PATCH,
//! sensitive rules, validation errors naming the op and argument, the microversion gate,
//! rules stored in Rivet's former schema converted on upgrade, round trips through both
//! stock clients (python-ironicclient's `baremetal inspection rule …`, openstacksdk's
//! `conn.baremetal.*inspection_rule*`), and rules applied by a real in-band inspection
//! with the real agent.

use anyhow::{ensure, Result};
use rivet_tests::agentproc::AgentProcess;
use rivet_tests::clients::{self, baremetal, baremetal_failing, baremetal_json, sdk};
use rivet_tests::Rivetd;
use serde_json::{json, Value};
use std::time::Duration;

fn message(v: &Value) -> String {
    serde_json::from_value::<rivet_protocol::api::ErrorBody>(v.clone())
        .map(|b| b.message())
        .unwrap_or_default()
}

fn start(dir: &tempfile::TempDir, extra: &str) -> Result<Rivetd> {
    Rivetd::start_in(
        dir.path(),
        &format!("[agent]\nlong_poll_s = 2\n[conductor]\ncheck_interval_s = 1\n{extra}"),
    )
}

/// A request at an explicit microversion.
fn at_version(
    d: &Rivetd,
    version: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Result<u16> {
    let c = reqwest::blocking::Client::new();
    let mut r = c
        .request(
            reqwest::Method::from_bytes(method.as_bytes())?,
            format!("{}{path}", d.url),
        )
        .header("X-OpenStack-Ironic-API-Version", version);
    if let Some(b) = body {
        r = r.json(&b);
    }
    Ok(r.send()?.status().as_u16())
}

#[test]
fn crud_patch_sensitive_validation_and_version_gate() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start(&dir, "")?;
    let body = json!({
        "description": "BMC from the inventory",
        "priority": 50,
        "conditions": [
            {"op": "!is-empty", "args": {"value": "{inventory[bmc_address]}"}},
            {"op": "eq", "args": ["{item}", "{item}"], "loop": [1, 2], "multiple": "all"}
        ],
        "actions": [
            {"op": "set-attribute", "args": {"path": "driver", "value": "ipmi"}},
            {"op": "set-attribute", "args": {"path": "driver_info/ipmi_address", "value": "{inventory[bmc_address]}"}}
        ]
    });
    let (s, created) = d.call("POST", "/v1/inspection_rules", Some(body.clone()))?;
    ensure!(s == 201, "{created}");
    let uuid = created["uuid"].as_str().unwrap_or_default().to_string();
    assert_eq!(uuid.len(), 36, "{created}");
    assert_eq!(created["phase"], "main");
    assert_eq!(created["sensitive"], false);
    assert_eq!(created["priority"], 50);
    assert_eq!(created["actions"], body["actions"]);
    assert_eq!(created["conditions"][1]["multiple"], "all");
    assert_eq!(created["conditions"][0]["op"], "!is-empty");
    assert!(created["created_at"].is_string() && created["updated_at"].is_null());
    assert!(created["links"][0]["href"]
        .as_str()
        .unwrap_or_default()
        .ends_with(&format!("/v1/inspection_rules/{uuid}")));

    // Listing: Ironic's default fields, all of them with detail.
    let (_, list) = d.call("GET", "/v1/inspection_rules", None)?;
    let row = &list["inspection_rules"][0];
    assert_eq!(row["uuid"], uuid.as_str());
    assert!(
        row.get("actions").is_none() && row.get("priority").is_some(),
        "{row}"
    );
    let (_, list) = d.call("GET", "/v1/inspection_rules?detail=true", None)?;
    assert_eq!(list["inspection_rules"][0]["actions"], body["actions"]);
    let (_, list) = d.call("GET", "/v1/inspection_rules?fields=uuid,priority", None)?;
    // The fields asked for, and `links` (Ironic's `sanitize_dict` always keeps them).
    let mut row = list["inspection_rules"][0].clone();
    assert!(row["links"].is_array(), "{row}");
    row.as_object_mut().map(|m| m.remove("links"));
    assert_eq!(row, json!({"uuid": uuid, "priority": 50}));
    let (s, _) = d.call("GET", "/v1/inspection_rules?phase=other", None)?;
    assert_eq!(s, 200);

    // PATCH.
    let (s, v) = d.call(
        "PATCH",
        &format!("/v1/inspection_rules/{uuid}"),
        Some(json!([{"op": "replace", "path": "/priority", "value": 7},
                    {"op": "add", "path": "/actions/-", "value": {"op": "add-trait", "args": {"name": "CUSTOM_BMC"}}},
                    {"op": "replace", "path": "/conditions/1/multiple", "value": "any"}])),
    )?;
    ensure!(s == 200, "{v}");
    assert_eq!(v["priority"], 7);
    assert_eq!(v["actions"][2]["op"], "add-trait");
    assert_eq!(v["conditions"][1]["multiple"], "any", "{v}");
    assert!(v["updated_at"].is_string());
    let (s, v) = d.call(
        "PATCH",
        &format!("/v1/inspection_rules/{uuid}"),
        Some(json!([{"op": "remove", "path": "/actions/9"}])),
    )?;
    assert_eq!(s, 400, "{v}");
    assert!(message(&v).contains("out of range"), "{v}");
    // A bad patch changes nothing.
    let (s, v) = d.call(
        "PATCH",
        &format!("/v1/inspection_rules/{uuid}"),
        Some(json!([{"op": "replace", "path": "/actions/0/op", "value": "set-atribute"}])),
    )?;
    assert_eq!(s, 400, "{v}");
    assert!(message(&v).contains("set-atribute"), "{v}");
    let (_, shown) = d.call("GET", &format!("/v1/inspection_rules/{uuid}"), None)?;
    assert_eq!(shown["actions"][0]["op"], "set-attribute");
    assert_eq!(shown["priority"], 7);

    // Sensitive: conditions and actions hidden; the flag cannot be unset.
    let (s, v) = d.call(
        "PATCH",
        &format!("/v1/inspection_rules/{uuid}"),
        Some(json!([{"op": "replace", "path": "/sensitive", "value": true}])),
    )?;
    ensure!(s == 200, "{v}");
    assert!(v["actions"].is_null() && v["conditions"].is_null(), "{v}");
    let (_, list) = d.call("GET", "/v1/inspection_rules?detail=true", None)?;
    assert!(list["inspection_rules"][0]["actions"].is_null());
    let (s, v) = d.call(
        "PATCH",
        &format!("/v1/inspection_rules/{uuid}"),
        Some(json!([{"op": "replace", "path": "/sensitive", "value": false}])),
    )?;
    assert_eq!(s, 400, "{v}");
    assert!(message(&v).contains("sensitive"), "{v}");

    // Validation errors name the op and the argument; nothing is stored.
    let cases = [
        (
            json!({"actions": [{"op": "set-attribute", "args": {"path": "driver"}}]}),
            "missing required argument(s): value",
        ),
        (
            json!({"actions": [{"op": "add-trait", "args": {"name": "X", "bogus": 1}}]}),
            "unexpected argument(s): bogus",
        ),
        (
            json!({"conditions": [{"op": "is-bigger", "args": {"value": 1}}], "actions": [{"op": "log", "args": {"msg": "m"}}]}),
            "is-bigger",
        ),
        (
            json!({"conditions": [{"op": "matches", "args": {"value": "x", "regex": "("}}], "actions": [{"op": "log", "args": {"msg": "m"}}]}),
            "args.regex",
        ),
        (
            json!({"phase": "late", "actions": [{"op": "log", "args": {"msg": "m"}}]}),
            "Invalid phase",
        ),
        (
            json!({"priority": 10000, "actions": [{"op": "log", "args": {"msg": "m"}}]}),
            "Priority",
        ),
        (json!({"actions": []}), "actions"),
        (
            json!({"actions": [{"op": "set-attribute", "args": {"path": "provision_state", "value": "active"}}]}),
            "provision_state",
        ),
    ];
    for (rule, what) in cases {
        let (s, v) = d.call("POST", "/v1/inspection_rules", Some(rule))?;
        assert_eq!(s, 400, "{v}");
        assert!(message(&v).contains(what), "error should name {what}: {v}");
    }
    let (_, list) = d.call("GET", "/v1/inspection_rules", None)?;
    assert_eq!(list["inspection_rules"].as_array().map(Vec::len), Some(1));

    // Duplicate UUID: 409; unknown: 404.
    let (s, _) = d.call(
        "POST",
        "/v1/inspection_rules",
        Some(json!({"uuid": uuid, "actions": [{"op": "log", "args": {"msg": "m"}}]})),
    )?;
    assert_eq!(s, 409);
    let missing = "3f0b7c1e-0000-4000-8000-000000000000";
    for m in ["GET", "DELETE"] {
        let (s, _) = d.call(m, &format!("/v1/inspection_rules/{missing}"), None)?;
        assert_eq!(s, 404, "{m}");
    }
    let (s, _) = d.call(
        "PATCH",
        &format!("/v1/inspection_rules/{missing}"),
        Some(json!([{"op": "replace", "path": "/priority", "value": 1}])),
    )?;
    assert_eq!(s, 404);

    // The microversion gate: 404 to read and 405 to write below 1.96.
    assert_eq!(
        at_version(&d, "1.95", "GET", "/v1/inspection_rules", None)?,
        404
    );
    assert_eq!(
        at_version(
            &d,
            "1.95",
            "POST",
            "/v1/inspection_rules",
            Some(json!({"actions": [{"op": "log", "args": {"msg": "m"}}]}))
        )?,
        405
    );
    assert_eq!(
        at_version(&d, "1.96", "GET", "/v1/inspection_rules", None)?,
        200
    );

    let (s, _) = d.call("DELETE", &format!("/v1/inspection_rules/{uuid}"), None)?;
    assert_eq!(s, 204);
    let (_, list) = d.call("GET", "/v1/inspection_rules", None)?;
    assert_eq!(list["inspection_rules"], json!([]));
    // Delete all.
    for p in [1, 2] {
        let (s, v) = d.call(
            "POST",
            "/v1/inspection_rules",
            Some(json!({"priority": p, "actions": [{"op": "log", "args": {"msg": "m"}}]})),
        )?;
        ensure!(s == 201, "{v}");
    }
    let (s, _) = d.call("DELETE", "/v1/inspection_rules", None)?;
    assert_eq!(s, 204);
    let (_, list) = d.call("GET", "/v1/inspection_rules", None)?;
    assert_eq!(list["inspection_rules"], json!([]));
    Ok(())
}

#[test]
fn rules_in_the_former_schema_are_converted_on_upgrade() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut d = start(&dir, "")?;
    d.terminate(Duration::from_secs(10))?;
    // A rule as rivetd stored it before 1.96.
    let old = json!({"uuid": "0b1c2d3e-4f50-4617-8899-aabbccddeeff", "description": "old", "priority": 3,
        "conditions": [{"field": "inventory.cpu.count", "op": "gt", "value": 0}],
        "actions": [{"action": "set-extra", "name": "legacy", "value": "yes"},
                    {"action": "add-trait", "name": "CUSTOM_LEGACY"}]});
    let db = rusqlite::Connection::open(dir.path().join("rivet.db"))?;
    db.execute(
        "INSERT INTO inspection_rules (uuid, priority, body, created_at) VALUES (?1, 3, ?2, '2026-01-01T00:00:00+00:00')",
        rusqlite::params!["0b1c2d3e-4f50-4617-8899-aabbccddeeff", old.to_string()],
    )?;
    drop(db);
    let d = start(&dir, "")?;
    let (s, v) = d.call(
        "GET",
        "/v1/inspection_rules/0b1c2d3e-4f50-4617-8899-aabbccddeeff",
        None,
    )?;
    ensure!(s == 200, "{v}");
    assert_eq!(v["conditions"][0]["op"], "gt", "{v}");
    assert_eq!(
        v["conditions"][0]["args"]["values"],
        json!(["{inventory[cpu][count]}", 0])
    );
    assert_eq!(
        v["actions"][0],
        json!({"op": "set-attribute", "args": {"path": "extra/legacy", "value": "yes"}})
    );
    // Stored again in the new shape.
    let db = rusqlite::Connection::open(dir.path().join("rivet.db"))?;
    let body: String = db.query_row(
        "SELECT body FROM inspection_rules WHERE uuid = '0b1c2d3e-4f50-4617-8899-aabbccddeeff'",
        [],
        |r| r.get(0),
    )?;
    assert!(
        body.contains("\"op\":\"set-attribute\"") && !body.contains("\"field\""),
        "{body}"
    );
    Ok(())
}

#[test]
fn stock_clients_round_trip_inspection_rules() -> Result<()> {
    if !clients::available() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let d = start(&dir, "")?;
    // python-ironicclient: baremetal inspection rule create/show/list/set/unset/delete.
    let actions = r#"[{"op": "add-trait", "args": {"name": "CUSTOM_CLI"}}]"#;
    let conditions = r#"[{"op": "gt", "args": {"values": ["{inventory[cpu][count]}", 0]}}]"#;
    let created = baremetal_json(
        &d,
        &[
            "inspection",
            "rule",
            "create",
            "--description",
            "from the CLI",
            "--priority",
            "20",
            "--actions",
            actions,
            "--conditions",
            conditions,
        ],
    )?;
    let uuid = created["uuid"].as_str().unwrap_or_default().to_string();
    assert_eq!(created["priority"], 20, "{created}");
    assert_eq!(created["actions"][0]["op"], "add-trait", "{created}");
    let shown = baremetal_json(&d, &["inspection", "rule", "show", &uuid])?;
    assert_eq!(shown["description"], "from the CLI");
    assert_eq!(shown["conditions"][0]["args"]["values"][1], 0);
    let listed = baremetal_json(&d, &["inspection", "rule", "list"])?;
    assert!(
        listed
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r["uuid"] == uuid.as_str()),
        "{listed}"
    );
    let long = baremetal_json(&d, &["inspection", "rule", "list", "--long"])?;
    assert_eq!(long[0]["priority"], 20, "{long}");
    baremetal(
        &d,
        &[
            "inspection",
            "rule",
            "set",
            &uuid,
            "--priority",
            "30",
            "--description",
            "changed",
        ],
    )?;
    let shown = baremetal_json(&d, &["inspection", "rule", "show", &uuid])?;
    assert_eq!(
        (shown["priority"].clone(), shown["description"].clone()),
        (json!(30), json!("changed"))
    );
    baremetal(&d, &["inspection", "rule", "unset", &uuid, "--description"])?;
    let shown = baremetal_json(&d, &["inspection", "rule", "show", &uuid])?;
    assert!(shown["description"].is_null(), "{shown}");
    let err = baremetal_failing(
        &d,
        &[
            "inspection",
            "rule",
            "create",
            "--actions",
            r#"[{"op": "explode", "args": {}}]"#,
        ],
    )?;
    assert!(err.contains("explode") && err.contains("400"), "{err}");
    baremetal(&d, &["inspection", "rule", "delete", &uuid])?;
    let err = baremetal_failing(&d, &["inspection", "rule", "show", &uuid])?;
    assert!(
        err.contains("404") || err.contains("could not be found"),
        "{err}"
    );

    // openstacksdk.
    let v = sdk(
        &d,
        r#"
r = conn.baremetal.create_inspection_rule(description='sdk', priority=5,
    actions=[{'op': 'set-attribute', 'args': {'path': 'extra/sdk', 'value': '{inventory[cpu][count]}'}}],
    conditions=[])
got = conn.baremetal.get_inspection_rule(r.id)
listed = [x.id for x in conn.baremetal.inspection_rules()]
detailed = [x.priority for x in conn.baremetal.inspection_rules(detail=True)]
upd = conn.baremetal.update_inspection_rule(r.id, priority=9)
after = conn.baremetal.get_inspection_rule(r.id)
conn.baremetal.delete_inspection_rule(r.id)
missing = None
try:
    conn.baremetal.get_inspection_rule(r.id)
except Exception as e:
    missing = type(e).__name__
bad = None
try:
    conn.baremetal.create_inspection_rule(actions=[{'op': 'set-attribute', 'args': {'path': 'driver'}}])
except Exception as e:
    bad = str(e)
emit({'id': r.id, 'got': got.description, 'listed': listed, 'detailed': detailed,
      'actions': got.actions, 'after': after.priority, 'missing': missing, 'bad': bad})
"#,
    )?;
    let id = v["id"].as_str().unwrap_or_default();
    assert_eq!(v["got"], "sdk", "{v}");
    assert!(
        v["listed"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|x| x == id),
        "{v}"
    );
    assert_eq!(v["detailed"], json!([5]), "{v}");
    assert_eq!(v["actions"][0]["args"]["path"], "extra/sdk", "{v}");
    assert_eq!(v["after"], 9, "{v}");
    assert_eq!(v["missing"], "NotFoundException", "{v}");
    assert!(
        v["bad"]
            .as_str()
            .unwrap_or_default()
            .contains("missing required argument(s): value"),
        "{v}"
    );
    Ok(())
}

#[test]
fn rules_apply_in_a_real_inspection() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start(&dir, "")?;
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(json!({"driver": "fake-hardware", "name": "r1", "inspect_interface": "agent"})),
    )?;
    ensure!(s == 201, "{v}");
    let uuid = v["uuid"].as_str().unwrap_or_default().to_string();
    d.call(
        "PUT",
        "/v1/nodes/r1/states/provision",
        Some(json!({"target": "manage"})),
    )?;
    d.wait_node("r1", Duration::from_secs(10), |v| {
        v["provision_state"] == "manageable"
    })?;

    let rules = [
        json!({"priority": 90, "description": "facts from the inventory",
            "conditions": [{"op": "gt", "args": {"values": ["{inventory[cpu][count]}", 0]}},
                           {"op": "!is-empty", "args": {"value": "{inventory[interfaces]}"}}],
            "actions": [
                {"op": "set-attribute", "args": {"path": "extra/arch", "value": "{inventory[cpu][architecture]}"}},
                {"op": "set-attribute", "args": {"path": "extra/cpus_seen", "value": "{inventory[cpu][count]}"}},
                {"op": "extend-attribute", "args": {"path": "extra/nics", "value": "{item[name]}", "unique": true},
                 "loop": [{"name": "a"}, {"name": "b"}, {"name": "a"}]},
                {"op": "set-capability", "args": {"name": "rules", "value": "ran"}},
                {"op": "add-trait", "args": {"name": "CUSTOM_INSPECTED"}},
                {"op": "set-plugin-data", "args": {"path": "seen", "value": "yes"}},
                {"op": "log", "args": {"msg": "rule saw {inventory[cpu][count]} cpus", "level": "info"}}]}),
        json!({"priority": 10, "description": "reads what the earlier rule wrote",
            "conditions": [{"op": "eq", "args": {"values": ["{plugin_data[seen]}", "yes"]}},
                           {"op": "one-of", "args": {"value": "{node[driver]}", "values": ["fake-hardware", "ipmi"]}}],
            "actions": [{"op": "set-attribute", "args": {"path": "resource_class", "value": "ruled"}},
                        {"op": "remove-trait", "args": {"name": "CUSTOM_INSPECTED"}},
                        {"op": "add-trait", "args": {"name": "CUSTOM_SECOND"}}]}),
        json!({"priority": 50, "description": "never applies",
            "conditions": [{"op": "matches", "args": {"value": "{inventory[cpu][architecture]}", "regex": "sparc.*"}}],
            "actions": [{"op": "fail", "args": {"msg": "sparc"}}]}),
    ];
    for r in rules {
        let (s, v) = d.call("POST", "/v1/inspection_rules", Some(r))?;
        ensure!(s == 201, "{v}");
    }
    let disk = dir.path().join("disk.img");
    std::fs::File::create(&disk)?.set_len(10 << 30)?;
    let (s, v) = d.call(
        "PUT",
        "/v1/nodes/r1/states/provision",
        Some(json!({"target": "inspect"})),
    )?;
    ensure!(s == 202, "{v}");
    d.wait_node("r1", Duration::from_secs(10), |v| {
        v["provision_state"] == "inspect wait"
    })?;
    let _agent = AgentProcess::start(
        &d.url,
        &uuid,
        &[&disk],
        None,
        &dir.path().join("agent.log"),
        &[],
    )?;
    let n = d
        .wait_node("r1", Duration::from_secs(60), |v| {
            v["provision_state"] == "manageable"
        })
        .map_err(|e| anyhow::anyhow!("{e}\n{}", d.log_text()))?;
    assert!(n["last_error"].is_null(), "{n}");
    assert_eq!(n["extra"]["arch"], std::env::consts::ARCH, "{n}");
    assert_eq!(
        n["extra"]["cpus_seen"], n["properties"]["cpus"],
        "a whole placeholder keeps the number: {n}"
    );
    assert_eq!(n["extra"]["nics"], json!(["a", "b"]));
    assert!(
        n["properties"]["capabilities"]
            .as_str()
            .unwrap_or_default()
            .contains("rules:ran"),
        "{n}"
    );
    assert_eq!(n["resource_class"], "ruled");
    assert_eq!(n["traits"], json!(["CUSTOM_SECOND"]), "{n}");
    assert!(d.log_text().contains("rule saw"), "the log action logs");
    Ok(())
}

/// `rivet ARGS --json` against `d`; its JSON output.
fn rivet(d: &Rivetd, args: &[&str]) -> Result<Value> {
    let out = std::process::Command::new(rivet_tests::bin("rivet"))
        .args(["--url", &d.url, "--json"])
        .args(args)
        .output()?;
    ensure!(
        out.status.success(),
        "rivet {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout).unwrap_or(Value::Null))
}

#[test]
fn rivet_cli_manages_inspection_rules() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start(&dir, "")?;
    let created = rivet(
        &d,
        &[
            "inspection-rule",
            "create",
            "--description",
            "cli",
            "--priority",
            "3",
            "--conditions",
            r#"[{"op": "is-true", "args": {"value": true}}]"#,
            "--actions",
            r#"[{"op": "add-trait", "args": {"name": "CUSTOM_RIVET"}}]"#,
        ],
    )?;
    let uuid = created["uuid"].as_str().unwrap_or_default().to_string();
    assert_eq!(created["priority"], 3, "{created}");
    let set = rivet(&d, &["inspection-rule", "set", &uuid, "--priority", "8"])?;
    assert_eq!(set["priority"], 8, "{set}");
    let listed = rivet(&d, &["inspection-rule", "list", "--long"])?;
    assert_eq!(
        listed["inspection_rules"][0]["actions"][0]["args"]["name"],
        "CUSTOM_RIVET"
    );
    let shown = rivet(&d, &["inspection-rule", "show", &uuid])?;
    assert_eq!(shown["description"], "cli");
    // A bad rule: the CLI fails with rivetd's message naming the op.
    let out = std::process::Command::new(rivet_tests::bin("rivet"))
        .args([
            "--url",
            &d.url,
            "inspection-rule",
            "create",
            "--actions",
            r#"[{"op": "nope", "args": {}}]"#,
        ])
        .output()?;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope"));
    rivet(&d, &["inspection-rule", "delete", &uuid])?;
    let (_, list) = d.call("GET", "/v1/inspection_rules", None)?;
    assert_eq!(list["inspection_rules"], json!([]));
    Ok(())
}

#[test]
fn rules_apply_after_out_of_band_inspection_and_can_change_ports() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start(&dir, "")?;
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(
            json!({"driver": "fake-hardware", "name": "oob", "inspect_interface": "fake",
            "driver_info": {"fake_inventory": {"cpus": 16, "cpu_arch": "x86_64", "memory_mb": 65536,
                "macs": ["52:54:00:00:0b:01"]}}}),
        ),
    )?;
    ensure!(s == 201, "{v}");
    d.call(
        "PUT",
        "/v1/nodes/oob/states/provision",
        Some(json!({"target": "manage"})),
    )?;
    d.wait_node("oob", Duration::from_secs(10), |v| {
        v["provision_state"] == "manageable"
    })?;
    let (s, v) = d.call(
        "POST",
        "/v1/inspection_rules",
        Some(json!({"conditions": [{"op": "gt", "args": {"values": ["{inventory[memory][physical_mb]}", 32768]}}],
            "actions": [{"op": "set-attribute", "args": {"path": "properties/memory_class", "value": "big"}},
                        {"op": "set-attribute", "args": {"path": "resource_class", "value": "big-{inventory[cpu][count]}"}}]})),
    )?;
    ensure!(s == 201, "{v}");
    d.call(
        "PUT",
        "/v1/nodes/oob/states/provision",
        Some(json!({"target": "inspect"})),
    )?;
    let n = d.wait_node("oob", Duration::from_secs(30), |v| {
        v["provision_state"] == "manageable" && v["inspection_finished_at"].is_string()
    })?;
    assert_eq!(n["properties"]["memory_class"], "big", "{n}");
    assert_eq!(n["resource_class"], "big-16", "{n}");

    // A rule on the port the inspection created, by its UUID.
    let (_, ports) = d.call("GET", "/v1/ports?node=oob", None)?;
    let port = ports["ports"][0]["uuid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    ensure!(!port.is_empty(), "{ports}");
    let (s, v) = d.call(
        "POST",
        "/v1/inspection_rules",
        Some(json!({"actions": [{"op": "set-port-attribute", "args": {"port_id": port, "path": "extra/switch", "value": "sw-{node[name]}"}},
                                {"op": "set-port-attribute", "args": {"port_id": port, "path": "pxe_enabled", "value": false}}]})),
    )?;
    ensure!(s == 201, "{v}");
    d.call(
        "PUT",
        "/v1/nodes/oob/states/provision",
        Some(json!({"target": "inspect"})),
    )?;
    // The rule runs when the second inspection ends: poll the port (bounded).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let p = loop {
        let (_, p) = d.call("GET", &format!("/v1/ports/{port}"), None)?;
        if p["extra"]["switch"] == "sw-oob" || std::time::Instant::now() > deadline {
            break p;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(p["extra"]["switch"], "sw-oob", "{p}\n{}", d.log_text());
    assert_eq!(p["pxe_enabled"], false, "{p}");
    let n = d.wait_node("oob", Duration::from_secs(30), |v| {
        v["provision_state"] == "manageable"
    })?;
    assert!(n["last_error"].is_null(), "{n}");
    Ok(())
}
