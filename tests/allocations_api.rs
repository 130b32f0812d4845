//! Allocations (1.52/1.57/1.58/1.60) on a real rivetd with fake-hardware nodes: the
//! conductor picks an available node by resource class, traits and candidates, a failing
//! allocation says why, two allocations racing for one node never share it, backfill of a
//! deployed node, release on delete and refusal while deployed; through raw HTTP with
//! Ironic's codes and gates, and through both stock clients (python-ironicclient's
//! `baremetal allocation …` and openstacksdk's `conn.baremetal.*_allocation`).

use anyhow::{ensure, Context, Result};
use rivet_tests::clients::{self, baremetal, baremetal_failing, baremetal_json, sdk};
use rivet_tests::{fault, Rivetd};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn provision(d: &Rivetd, node: &str, target: &str) -> Result<()> {
    let (s, v) = d.call(
        "PUT",
        &format!("/v1/nodes/{node}/states/provision"),
        Some(json!({"target": target})),
    )?;
    ensure!(s == 202, "{target} {node}: {s} {v}");
    Ok(())
}

fn state_is(want: &'static str) -> impl Fn(&Value) -> bool {
    move |v| v["provision_state"] == want
}

/// An available fake-hardware node (power state known) of `rc` with `traits`.
fn available_node(d: &Rivetd, name: &str, rc: &str, traits: &[&str]) -> Result<String> {
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(
            json!({"driver": "fake-hardware", "name": name, "resource_class": rc,
                    "automated_clean": false}),
        ),
    )?;
    ensure!(s == 201, "create {name}: {s} {v}");
    if !traits.is_empty() {
        let (s, v) = d.call(
            "PUT",
            &format!("/v1/nodes/{name}/traits"),
            Some(json!({ "traits": traits })),
        )?;
        ensure!(s == 204, "traits of {name}: {s} {v}");
    }
    provision(d, name, "manage")?;
    d.wait_node(name, Duration::from_secs(30), state_is("manageable"))?;
    provision(d, name, "provide")?;
    let n = d.wait_node(name, Duration::from_secs(30), |v| {
        v["provision_state"] == "available" && v["power_state"].is_string()
    })?;
    Ok(n["uuid"].as_str().unwrap_or_default().to_string())
}

/// Wait until allocation `ident` is no longer `allocating`.
fn settled(d: &Rivetd, ident: &str) -> Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (s, v) = d.call("GET", &format!("/v1/allocations/{ident}"), None)?;
        ensure!(s == 200, "allocation {ident}: {s} {v}");
        if v["state"] != "allocating" {
            return Ok(v);
        }
        ensure!(
            Instant::now() < deadline,
            "allocation {ident} still allocating: {v}\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn create(d: &Rivetd, body: Value) -> Result<Value> {
    let (s, v) = d.call("POST", "/v1/allocations", Some(body.clone()))?;
    ensure!(s == 201, "create allocation {body}: {s} {v}");
    Ok(v)
}

#[test]
fn allocations_pick_release_fail_race_and_backfill() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start_in(dir.path(), "")?;
    let gold = available_node(&d, "gold-1", "gold", &["CUSTOM_FAST"])?;
    let plain = available_node(&d, "gold-2", "gold", &[])?;

    // Microversion gates: 404 for reads and 405 for writes below 1.52, PATCH from 1.57,
    // owner from 1.60.
    let (s, _) = d.call_at(Some("1.51"), "GET", "/v1/allocations", None)?;
    assert_eq!(s, 404);
    let (s, _) = d.call_at(
        Some("1.51"),
        "POST",
        "/v1/allocations",
        Some(json!({"resource_class": "gold"})),
    )?;
    assert_eq!(s, 405);
    let (s, v) = d.call_at(
        Some("1.59"),
        "POST",
        "/v1/allocations",
        Some(json!({"resource_class": "gold", "owner": "p"})),
    )?;
    assert_eq!(s, 406, "{v}");
    let (s, v) = d.call_at(
        Some("1.57"),
        "POST",
        "/v1/allocations",
        Some(json!({"node": "gold-1"})),
    )?;
    assert_eq!(s, 400, "{v}");
    assert!(fault(&v).contains("Cannot set node"), "{v}");
    let (s, n) = d.call_at(Some("1.51"), "GET", "/v1/nodes/gold-1", None)?;
    assert!(s == 200 && n.get("allocation_uuid").is_none(), "{n}");

    // Bad input: 400 and nothing stored.
    for (body, want) in [
        (json!({}), "resource_class field is mandatory"),
        (
            json!({"resource_class": "gold", "name": "bad name"}),
            "invalid name",
        ),
        (json!({"resource_class": "gold", "colour": 1}), "colour"),
        (
            json!({"resource_class": "gold", "traits": ["fast"]}),
            "fast",
        ),
        (
            json!({"resource_class": "gold", "candidate_nodes": ["no-such-node"]}),
            "no-such-node",
        ),
    ] {
        let (s, v) = d.call("POST", "/v1/allocations", Some(body.clone()))?;
        assert_eq!(s, 400, "{body}: {v}");
        assert!(fault(&v).contains(want), "{body}: {v}");
    }
    let (_, all) = d.call("GET", "/v1/allocations", None)?;
    assert_eq!(all["allocations"], json!([]), "{all}");

    // Traits pick the node; the node shows the allocation (1.52) and the instance.
    let a = create(
        &d,
        json!({"resource_class": "gold", "traits": ["CUSTOM_FAST"], "name": "fast-one",
               "extra": {"k": "v"}}),
    )?;
    assert_eq!(
        a["links"][0]["href"]
            .as_str()
            .map(|h| h.ends_with(a["uuid"].as_str().unwrap_or("?"))),
        Some(true),
        "{a}"
    );
    let a = settled(&d, "fast-one")?;
    assert_eq!(a["state"], "active", "{a}");
    assert_eq!(a["node_uuid"], gold.as_str(), "{a}");
    assert!(a["last_error"].is_null(), "{a}");
    let node = d.node("gold-1")?;
    assert_eq!(node["allocation_uuid"], a["uuid"], "{node}");
    assert_eq!(node["instance_uuid"], a["uuid"], "{node}");
    let (s, by_node) = d.call("GET", "/v1/nodes/gold-1/allocation", None)?;
    assert!(s == 200 && by_node["uuid"] == a["uuid"], "{by_node}");

    // Failures say why, naming the resource class or the traits.
    let bronze = settled(
        &d,
        create(&d, json!({"resource_class": "bronze"}))?["uuid"]
            .as_str()
            .context("uuid")?,
    )?;
    assert_eq!(bronze["state"], "error");
    assert!(bronze["node_uuid"].is_null(), "{bronze}");
    let msg = bronze["last_error"].as_str().unwrap_or_default();
    assert!(
        msg.contains("no available nodes match the resource class bronze"),
        "{bronze}"
    );
    let shiny = settled(
        &d,
        create(
            &d,
            json!({"resource_class": "gold", "traits": ["CUSTOM_SHINY"]}),
        )?["uuid"]
            .as_str()
            .context("uuid")?,
    )?;
    assert_eq!(shiny["state"], "error");
    assert!(
        shiny["last_error"]
            .as_str()
            .is_some_and(|m| m.contains("requested traits CUSTOM_SHINY")),
        "{shiny}"
    );
    // The only gold node left is taken only once: the allocated one is never picked again.
    let taken = settled(
        &d,
        create(
            &d,
            json!({"resource_class": "gold", "candidate_nodes": ["gold-1"]}),
        )?["uuid"]
            .as_str()
            .context("uuid")?,
    )?;
    assert_eq!(taken["state"], "error", "{taken}");
    assert!(
        taken["last_error"]
            .as_str()
            .is_some_and(|m| m.contains("none of the requested nodes")),
        "{taken}"
    );

    // Lookups, filters, paging, sorting, 404 and 409.
    let (s, v) = d.call("GET", "/v1/allocations?state=error", None)?;
    assert!(
        s == 200 && v["allocations"].as_array().map(Vec::len) == Some(3),
        "{v}"
    );
    let (s, v) = d.call("GET", "/v1/allocations?node=gold-1", None)?;
    assert!(s == 200 && v["allocations"][0]["name"] == "fast-one", "{v}");
    let (s, v) = d.call(
        "GET",
        "/v1/allocations?resource_class=bronze&fields=uuid,state",
        None,
    )?;
    assert!(
        // The two fields and `links`, which Ironic's `sanitize_dict` always keeps.
        s == 200
            && v["allocations"][0].as_object().map(|o| o.len()) == Some(3)
            && v["allocations"][0]["links"].is_array(),
        "{v}"
    );
    let (s, v) = d.call("GET", "/v1/allocations?limit=2", None)?;
    assert!(
        s == 200 && v["next"].as_str().is_some_and(|n| n.contains("marker=")),
        "{v}"
    );
    let (s, v) = d.call("GET", "/v1/allocations?sort_key=traits", None)?;
    assert_eq!(s, 400, "{v}");
    let (s, v) = d.call("GET", "/v1/allocations?node=nope", None)?;
    assert_eq!(s, 400, "{v}");
    let (s, v) = d.call("GET", "/v1/allocations/nope", None)?;
    assert!(s == 404 && fault(&v).contains("nope"), "{v}");
    let (s, v) = d.call("GET", "/v1/nodes/gold-2/allocation", None)?;
    assert!(s == 404 && fault(&v).contains("gold-2"), "{v}");
    let (s, v) = d.call(
        "POST",
        "/v1/allocations",
        Some(json!({"resource_class": "gold", "name": "fast-one"})),
    )?;
    assert_eq!(s, 409, "{v}");
    let (s, v) = d.call_at(Some("1.59"), "GET", "/v1/allocations/fast-one", None)?;
    assert!(s == 200 && v.get("owner").is_none(), "{v}");
    let (s, v) = d.call_at(Some("1.59"), "GET", "/v1/allocations?fields=owner", None)?;
    assert_eq!(s, 406, "{v}");

    // PATCH (1.57): name and extra only.
    let (s, v) = d.call_at(
        Some("1.56"),
        "PATCH",
        "/v1/allocations/fast-one",
        Some(json!([{"op": "replace", "path": "/name", "value": "x"}])),
    )?;
    assert_eq!(s, 405, "{v}");
    let (s, v) = d.call("PATCH", "/v1/allocations/fast-one", Some(json!([{"op": "replace", "path": "/name", "value": "renamed"}, {"op": "remove", "path": "/extra/k"}])))?;
    assert!(
        s == 200 && v["name"] == "renamed" && v["extra"] == json!({}),
        "{v}"
    );
    let (s, v) = d.call(
        "PATCH",
        "/v1/allocations/renamed",
        Some(json!([{"op": "replace", "path": "/resource_class", "value": "x"}])),
    )?;
    assert_eq!(s, 400, "{v}");

    // Deleting releases the node (through the node's allocation path).
    let (s, v) = d.call("DELETE", "/v1/nodes/gold-1/allocation", None)?;
    assert_eq!(s, 204, "{v}");
    let node = d.node("gold-1")?;
    assert!(
        node["allocation_uuid"].is_null() && node["instance_uuid"].is_null(),
        "{node}"
    );
    let (s, _) = d.call("GET", "/v1/allocations/renamed", None)?;
    assert_eq!(s, 404);

    // Two allocations race for the one node they may have: exactly one gets it.
    let racers: Vec<Value> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|i| {
                let d = &d;
                let gold = gold.as_str();
                s.spawn(move || {
                    create(
                        d,
                        json!({"resource_class": "gold", "name": format!("racer-{i}"),
                                     "candidate_nodes": [gold]}),
                    )
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().map_err(|_| anyhow::anyhow!("racer panicked"))?)
            .collect::<Result<Vec<_>>>()
    })?;
    let settled_racers: Vec<Value> = racers
        .iter()
        .map(|r| settled(&d, r["uuid"].as_str().unwrap_or_default()))
        .collect::<Result<_>>()?;
    let winners: Vec<&Value> = settled_racers
        .iter()
        .filter(|r| r["state"] == "active")
        .collect();
    assert_eq!(winners.len(), 1, "{settled_racers:?}");
    assert_eq!(winners[0]["node_uuid"], gold.as_str());
    let loser = settled_racers
        .iter()
        .find(|r| r["state"] == "error")
        .context("a loser")?;
    assert!(
        loser["last_error"]
            .as_str()
            .is_some_and(|m| m.contains("gold")),
        "{loser}"
    );
    assert_eq!(d.node("gold-1")?["instance_uuid"], winners[0]["uuid"]);
    let winner = winners[0]["uuid"].as_str().context("uuid")?.to_string();
    // Removing the instance of an available node deletes its allocation (Ironic's rule).
    let (s, v) = d.call(
        "PATCH",
        "/v1/nodes/gold-1",
        Some(json!([{"op": "remove", "path": "/instance_uuid"}])),
    )?;
    assert!(s == 200 && v["allocation_uuid"].is_null(), "{v}");
    let (s, _) = d.call("GET", &format!("/v1/allocations/{winner}"), None)?;
    assert_eq!(s, 404);

    // Backfill (1.58): a deployed node gets an allocation named after its instance.
    let (s, v) = d.call("PATCH", "/v1/nodes/gold-2", Some(json!([{"op": "add", "path": "/instance_info/image_source", "value": "http://127.0.0.1:1/img"}])))?;
    ensure!(s == 200, "{v}");
    provision(&d, "gold-2", "active")?;
    d.wait_node("gold-2", Duration::from_secs(30), state_is("active"))?;
    let (s, v) = d.call(
        "POST",
        "/v1/allocations",
        Some(json!({"node": "gold-2", "resource_class": "silver"})),
    )?;
    assert_eq!(s, 400, "{v}");
    assert!(
        fault(&v).contains("Resource class gold does not match"),
        "{v}"
    );
    let bf = create(&d, json!({"node": "gold-2", "name": "backfilled"}))?;
    assert_eq!(bf["state"], "active", "{bf}");
    assert_eq!(bf["node_uuid"], plain.as_str(), "{bf}");
    assert_eq!(bf["resource_class"], "gold", "{bf}");
    let node = d.node("gold-2")?;
    assert!(
        node["allocation_uuid"] == bf["uuid"] && node["instance_uuid"] == bf["uuid"],
        "{node}"
    );
    // An active node keeps its allocation: 409, as Ironic's InvalidState.
    let (s, v) = d.call("DELETE", "/v1/allocations/backfilled", None)?;
    assert_eq!(s, 409, "{v}");
    assert!(fault(&v).contains("because the node is active"), "{v}");
    let (s, v) = d.call(
        "PATCH",
        "/v1/nodes/gold-2",
        Some(json!([{"op": "remove", "path": "/instance_uuid"}])),
    )?;
    assert!(s == 409 && fault(&v).contains("with an allocation"), "{v}");
    // Undeploying the node deletes its allocation (as Ironic's tear down does).
    provision(&d, "gold-2", "deleted")?;
    d.wait_node("gold-2", Duration::from_secs(30), state_is("available"))?;
    let (s, _) = d.call("GET", "/v1/allocations/backfilled", None)?;
    assert_eq!(s, 404);
    assert!(d.node("gold-2")?["allocation_uuid"].is_null());
    Ok(())
}

#[test]
fn allocations_through_stock_clients() -> Result<()> {
    if !clients::available() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start_in(dir.path(), "")?;
    let n1 = available_node(&d, "cli-1", "baremetal", &["CUSTOM_GPU"])?;
    let n2 = available_node(&d, "cli-2", "baremetal", &[])?;

    // python-ironicclient.
    let a = baremetal_json(
        &d,
        &[
            "allocation",
            "create",
            "--resource-class",
            "baremetal",
            "--trait",
            "CUSTOM_GPU",
            "--name",
            "gpu-box",
            "--extra",
            "team=ml",
            "--wait",
            "20",
        ],
    )?;
    assert_eq!(a["state"], "active", "{a}");
    assert_eq!(a["node_uuid"], n1.as_str(), "{a}");
    let shown = baremetal_json(&d, &["allocation", "show", "gpu-box"])?;
    assert!(
        shown["uuid"] == a["uuid"] && shown["extra"] == json!({"team": "ml"}),
        "{shown}"
    );
    let listed = baremetal_json(&d, &["allocation", "list", "--node", "cli-1"])?;
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    baremetal(
        &d,
        &[
            "allocation",
            "set",
            "gpu-box",
            "--name",
            "gpu-box-2",
            "--extra",
            "x=1",
        ],
    )?;
    baremetal(&d, &["allocation", "unset", "gpu-box-2", "--extra", "team"])?;
    let shown = baremetal_json(&d, &["allocation", "show", "gpu-box-2"])?;
    assert_eq!(shown["extra"], json!({"x": 1}), "{shown}");
    let node = baremetal_json(&d, &["node", "show", "cli-1"])?;
    assert_eq!(node["allocation_uuid"], a["uuid"], "{node}");
    // A failing allocation: --wait fails with the reason.
    let err = baremetal_failing(
        &d,
        &[
            "allocation",
            "create",
            "--resource-class",
            "tiny",
            "--name",
            "nope",
            "--wait",
            "20",
        ],
    )?;
    assert!(
        err.contains("no available nodes match the resource class tiny"),
        "{err}"
    );
    let err = baremetal_failing(&d, &["allocation", "show", "missing"])?;
    assert!(
        err.contains("missing") && err.contains("could not be found"),
        "{err}"
    );
    // A 409 is the answer (a name taken): no retries (ironicclient's are 5, 2 s apart).
    let err = baremetal_failing(
        &d,
        &[
            "--max-retries",
            "0",
            "allocation",
            "create",
            "--resource-class",
            "baremetal",
            "--name",
            "nope",
        ],
    )?;
    assert!(err.contains("already exists"), "{err}");
    baremetal(&d, &["allocation", "delete", "gpu-box-2", "nope"])?;
    assert!(d.node("cli-1")?["instance_uuid"].is_null());

    // openstacksdk.
    let v = sdk(
        &d,
        &format!(
            "a = conn.baremetal.create_allocation(resource_class='baremetal', name='sdk-a', candidate_nodes=['{n2}'])\n\
             a = conn.baremetal.wait_for_allocation(a, timeout=20)\n\
             got = conn.baremetal.get_allocation('sdk-a')\n\
             upd = conn.baremetal.update_allocation(got, extra={{'a': 'b'}})\n\
             names = [x.name for x in conn.baremetal.allocations(node='cli-2')]\n\
             try:\n    conn.baremetal.get_allocation('ghost')\n    missing = 'found'\n\
             except Exception as e:\n    missing = type(e).__name__\n\
             bad = conn.baremetal.create_allocation(resource_class='baremetal', traits=['CUSTOM_NONE'])\n\
             try:\n    conn.baremetal.wait_for_allocation(bad, timeout=20)\n    failure = ''\n\
             except Exception as e:\n    failure = str(e)\n\
             conn.baremetal.delete_allocation(bad)\n\
             conn.baremetal.delete_allocation('sdk-a')\n\
             left = [x.id for x in conn.baremetal.allocations()]\n\
             emit({{'state': a.state, 'node': a.node_id, 'extra': upd.extra, 'names': names,\n\
                   'missing': missing, 'failure': failure, 'left': left}})"
        ),
    )?;
    assert_eq!(v["state"], "active", "{v}");
    assert_eq!(v["node"], n2.as_str(), "{v}");
    assert_eq!(v["extra"], json!({"a": "b"}), "{v}");
    assert_eq!(v["names"], json!(["sdk-a"]), "{v}");
    assert_eq!(v["missing"], "NotFoundException", "{v}");
    assert!(
        v["failure"]
            .as_str()
            .is_some_and(|f| f.contains("CUSTOM_NONE")),
        "{v}"
    );
    assert_eq!(v["left"], json!([]), "{v}");
    assert!(d.node("cli-2")?["allocation_uuid"].is_null());
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
fn allocations_through_the_rivet_cli() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start_in(dir.path(), "")?;
    let n = available_node(&d, "cli-node", "small", &[])?;
    let a: Value = serde_json::from_str(&rivet(
        &d,
        &[
            "--json",
            "allocation",
            "create",
            "--resource-class",
            "small",
            "--name",
            "mine",
            "--wait",
            "20",
        ],
    )?)?;
    assert!(
        a["state"] == "active" && a["node_uuid"] == n.as_str(),
        "{a}"
    );
    let listed = rivet(&d, &["allocation", "list", "--state", "active"])?;
    assert!(listed.contains("mine") && listed.contains(&n), "{listed}");
    let err = std::process::Command::new(rivet_tests::bin("rivet"))
        .args([
            "--url",
            &d.url,
            "allocation",
            "create",
            "--resource-class",
            "huge",
            "--wait",
            "20",
        ])
        .output()?;
    assert!(!err.status.success());
    assert!(
        String::from_utf8_lossy(&err.stderr)
            .contains("no available nodes match the resource class huge"),
        "{}",
        String::from_utf8_lossy(&err.stderr)
    );
    rivet(&d, &["allocation", "delete", "mine"])?;
    assert!(d.node("cli-node")?["instance_uuid"].is_null());
    Ok(())
}

#[test]
fn two_controllers_on_postgresql_never_give_one_node_twice() -> Result<()> {
    let base = std::env::var("RIVET_TEST_POSTGRES").unwrap_or_default();
    if !rivet_tests::prerequisite(
        !base.is_empty(),
        "RIVET_TEST_POSTGRES (a PostgreSQL server; scripts/setup-postgres.sh starts one)",
    ) {
        return Ok(());
    }
    let db = rivet_store::postgres::ScratchDatabase::create(&base, "rivet_allocs")
        .context("scratch database")?;
    let dir = tempfile::tempdir()?;
    let key = dir.path().join("secrets.key");
    let made = std::process::Command::new(rivet_tests::bin("rivetd"))
        .args(["secrets", "init-key"])
        .arg(&key)
        .output()?;
    ensure!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let cfg = dir.path().join("rivetd.toml");
    std::fs::write(
        &cfg,
        format!("[secrets]\nkey_file = {:?}\n", key.display().to_string()),
    )?;
    let cfg = cfg.display().to_string();
    let a = Rivetd::start_url(db.url(), dir.path(), "c1", 0, &["--config", &cfg])?;
    let b = Rivetd::start_url(db.url(), dir.path(), "c2", 0, &["--config", &cfg])?;
    let mut nodes = Vec::new();
    for i in 0..3 {
        nodes.push(available_node(&a, &format!("pg-{i}"), "pg", &[])?);
    }
    // Six allocations for three nodes, half on each controller, all at once.
    let made: Vec<Value> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..6)
            .map(|i| {
                let d = if i % 2 == 0 { &a } else { &b };
                s.spawn(move || create(d, json!({"resource_class": "pg"})))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().map_err(|_| anyhow::anyhow!("creator panicked"))?)
            .collect::<Result<Vec<_>>>()
    })?;
    let done: Vec<Value> = made
        .iter()
        .map(|m| settled(&a, m["uuid"].as_str().unwrap_or_default()))
        .collect::<Result<_>>()?;
    let mut held: Vec<String> = done
        .iter()
        .filter(|x| x["state"] == "active")
        .filter_map(|x| x["node_uuid"].as_str().map(str::to_string))
        .collect();
    held.sort();
    let mut want = nodes.clone();
    want.sort();
    assert_eq!(held, want, "each node exactly once: {done:?}");
    assert_eq!(
        done.iter().filter(|x| x["state"] == "error").count(),
        3,
        "{done:?}"
    );
    for (i, n) in nodes.iter().enumerate() {
        let node = b.node(&format!("pg-{i}"))?;
        let owner = done
            .iter()
            .find(|x| x["node_uuid"] == n.as_str())
            .context("holder")?;
        assert_eq!(node["instance_uuid"], owner["uuid"], "{node}");
        assert_eq!(node["allocation_uuid"], owner["uuid"], "{node}");
    }
    Ok(())
}
