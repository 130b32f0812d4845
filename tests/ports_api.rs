//! Ports, port groups and VIFs against a real rivetd: round trips through both stock clients
//! (python-ironicclient's `baremetal` and openstacksdk) including their 400/404/409 answers,
//! and the microversion gates and Ironic's checks over raw HTTP.

use anyhow::{ensure, Context, Result};
use rivet_tests::clients::{self, baremetal, baremetal_failing, baremetal_json, sdk};
use rivet_tests::Rivetd;
use serde_json::{json, Value};

fn start() -> Result<(tempfile::TempDir, Rivetd)> {
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start(&dir.path().join("rivet.db"), 0, &[])?;
    Ok((dir, d))
}

/// A request at microversion `version`.
fn call_at(
    d: &Rivetd,
    version: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Result<(u16, Value)> {
    let client = reqwest::blocking::Client::new();
    let mut req = client
        .request(
            reqwest::Method::from_bytes(method.as_bytes())?,
            format!("{}{path}", d.url),
        )
        .header("X-OpenStack-Ironic-API-Version", version);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().with_context(|| format!("{method} {path}"))?;
    let status = resp.status().as_u16();
    let text = resp.text()?;
    Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

fn node(d: &Rivetd, name: &str) -> Result<String> {
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(json!({"driver": "fake-hardware", "name": name})),
    )?;
    ensure!(s == 201, "create node {name}: {s} {v}");
    Ok(v["uuid"].as_str().context("node uuid")?.to_string())
}

/// The error text of a refused `baremetal` call, checked to name `code`.
fn fails_with(d: &Rivetd, args: &[&str], code: u16) -> Result<String> {
    let mut all = vec!["--max-retries", "0"];
    all.extend(args);
    let err = baremetal_failing(d, &all)?;
    ensure!(
        err.contains(&format!("HTTP {code}")),
        "baremetal {args:?} should fail with {code}: {err}"
    );
    Ok(err)
}

#[test]
fn baremetal_cli_round_trip() -> Result<()> {
    if !clients::available() {
        return Ok(());
    }
    let (_dir, d) = start()?;
    let n1 = node(&d, "bm-1")?;
    let n2 = node(&d, "bm-2")?;

    // Port group with mode, properties, physical network and category.
    let pg = baremetal_json(
        &d,
        &[
            "port",
            "group",
            "create",
            "--node",
            &n1,
            "--name",
            "bond0",
            "--address",
            "52:54:00:AA:00:01",
            "--mode",
            "802.3ad",
            "--property",
            "miimon=100",
            "--physical-network",
            "physnet1",
            "--category",
            "storage",
        ],
    )?;
    let pg_uuid = pg["uuid"].as_str().context("pg uuid")?.to_string();
    assert_eq!(pg["address"], "52:54:00:aa:00:01");
    assert_eq!(pg["mode"], "802.3ad");
    // The client parses values as YAML.
    assert_eq!(pg["properties"]["miimon"], 100);
    assert_eq!(pg["physical_network"], "physnet1");
    assert_eq!(pg["category"], "storage");
    let shown = baremetal_json(&d, &["port", "group", "show", "bond0"])?;
    assert_eq!(shown["uuid"], pg_uuid);
    let listed = baremetal_json(&d, &["port", "group", "list", "--node", &n1])?;
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(listed[0]["name"], "bond0");
    baremetal(&d, &["port", "group", "set", "bond0", "--extra", "rack=a1"])?;
    let shown = baremetal_json(&d, &["port", "group", "show", &pg_uuid])?;
    assert_eq!(shown["extra"]["rack"], "a1");
    fails_with(
        &d,
        &["port", "group", "create", "--node", &n2, "--name", "bond0"],
        409,
    )?;
    fails_with(&d, &["port", "group", "show", "no-such-group"], 404)?;

    // Ports with every field the client has.
    let p = baremetal_json(
        &d,
        &[
            "port",
            "create",
            "52:54:00:00:00:01",
            "--node",
            &n1,
            "--name",
            "eth0",
            "--port-group",
            "bond0",
            "--local-link-connection",
            "switch_id=00:11:22:33:44:55",
            "--local-link-connection",
            "port_id=Gi0/1",
            "--local-link-connection",
            "switch_info=tor-1",
            "--physical-network",
            "physnet1",
            "--pxe-enabled",
            "false",
            "--description",
            "uplink",
            "--vendor",
            "intel",
            "--category",
            "data",
        ],
    )?;
    let p_uuid = p["uuid"].as_str().context("port uuid")?.to_string();
    assert_eq!(p["portgroup_uuid"], pg_uuid);
    assert_eq!(p["local_link_connection"]["port_id"], "Gi0/1");
    assert_eq!(p["local_link_connection"]["switch_info"], "tor-1");
    assert_eq!(p["pxe_enabled"], false);
    assert_eq!(p["name"], "eth0");
    // `port create` does not print the description; `port show` does.
    let shown = baremetal_json(&d, &["port", "show", &p_uuid])?;
    assert_eq!(shown["description"], "uplink");
    assert_eq!(p["vendor"], "intel");
    assert_eq!(p["category"], "data");
    baremetal(
        &d,
        &[
            "port",
            "create",
            "52:54:00:00:00:02",
            "--node",
            &n1,
            "--name",
            "eth1",
        ],
    )?;
    baremetal(&d, &["port", "create", "52:54:00:00:00:03", "--node", &n2])?;

    let shown = baremetal_json(&d, &["port", "show", "eth0"])?;
    assert_eq!(shown["uuid"], p_uuid);
    let by_node = baremetal_json(&d, &["port", "list", "--node", &n1])?;
    assert_eq!(by_node.as_array().map(Vec::len), Some(2), "{by_node}");
    let by_group = baremetal_json(&d, &["port", "list", "--port-group", "bond0"])?;
    assert_eq!(by_group.as_array().map(Vec::len), Some(1), "{by_group}");
    assert_eq!(by_group[0]["uuid"], p_uuid);
    let by_mac = baremetal_json(&d, &["port", "list", "--address", "52:54:00:00:00:03"])?;
    assert_eq!(by_mac.as_array().map(Vec::len), Some(1), "{by_mac}");
    let long = baremetal_json(&d, &["port", "list", "--long", "--sort", "address:desc"])?;
    assert_eq!(long[0]["address"], "52:54:00:00:00:03", "{long}");
    baremetal(&d, &["port", "group", "unset", "bond0", "--extra", "rack"])?;
    let shown = baremetal_json(&d, &["port", "group", "show", "bond0"])?;
    assert_eq!(shown["extra"], json!({}));

    baremetal(
        &d,
        &[
            "port",
            "set",
            "eth1",
            "--extra",
            "k=v",
            "--vendor",
            "mellanox",
            "--is-smartnic",
            "--local-link-connection",
            "port_id=p1",
            "--local-link-connection",
            "hostname=h1",
        ],
    )?;
    let shown = baremetal_json(&d, &["port", "show", "eth1"])?;
    assert_eq!(shown["extra"]["k"], "v");
    assert_eq!(shown["vendor"], "mellanox");
    assert_eq!(shown["is_smartnic"], true);
    baremetal(&d, &["port", "unset", "eth1", "--extra", "k", "--vendor"])?;
    let shown = baremetal_json(&d, &["port", "show", "eth1"])?;
    assert!(shown["extra"].get("k").is_none(), "{shown}");
    assert_eq!(shown["vendor"], Value::Null);

    // Ironic's refusals.
    let e = fails_with(
        &d,
        &["port", "create", "52:54:00:00:00:01", "--node", &n2],
        409,
    )?;
    assert!(e.contains("52:54:00:00:00:01"), "{e}");
    fails_with(
        &d,
        &[
            "port",
            "create",
            "52:54:00:00:00:09",
            "--node",
            "f0e1d2c3-0000-4000-8000-000000000000",
        ],
        400,
    )?;
    fails_with(&d, &["port", "create", "not-a-mac", "--node", &n1], 400)?;
    fails_with(
        &d,
        &[
            "port",
            "create",
            "52:54:00:00:00:09",
            "--node",
            &n2,
            "--port-group",
            "bond0",
        ],
        400,
    )?;
    fails_with(&d, &["port", "show", "no-such-port"], 404)?;
    let e = fails_with(&d, &["port", "group", "delete", "bond0"], 400)?;
    assert!(e.contains("contains ports"), "{e}");

    // VIFs: attached to the group first (a group with free ports wins), then a PXE port.
    baremetal(&d, &["node", "vif", "attach", "bm-1", "vif-a"])?;
    baremetal(&d, &["node", "vif", "attach", "bm-1", "vif-b"])?;
    let vifs = baremetal_json(&d, &["node", "vif", "list", "bm-1"])?;
    let mut ids: Vec<String> = vifs
        .as_array()
        .context("vif list")?
        .iter()
        .filter_map(|v| v["id"].as_str().map(str::to_string))
        .collect();
    ids.sort();
    assert_eq!(ids, ["vif-a", "vif-b"]);
    let g = baremetal_json(&d, &["port", "group", "show", "bond0"])?;
    assert_eq!(g["internal_info"]["tenant_vif_port_id"], "vif-a");
    let p1 = baremetal_json(&d, &["port", "show", "eth1"])?;
    assert_eq!(p1["internal_info"]["tenant_vif_port_id"], "vif-b");
    let e = fails_with(&d, &["node", "vif", "attach", "bm-1", "vif-c"], 400)?;
    assert!(e.contains("not enough free physical ports"), "{e}");
    fails_with(&d, &["node", "vif", "attach", "bm-1", "vif-a"], 409)?;
    baremetal(&d, &["node", "vif", "detach", "bm-1", "vif-a"])?;
    let e = fails_with(&d, &["node", "vif", "detach", "bm-1", "vif-a"], 400)?;
    assert!(e.contains("not attached"), "{e}");
    // A port in a group is not a free port on its own (Ironic's choice too) …
    let e = fails_with(
        &d,
        &[
            "node",
            "vif",
            "attach",
            "bm-1",
            "vif-c",
            "--port-uuid",
            &p_uuid,
        ],
        400,
    )?;
    assert!(e.contains("not enough free physical ports"), "{e}");
    // … but once out of the group it is.
    baremetal(&d, &["port", "unset", "eth0", "--port-group"])?;
    baremetal(
        &d,
        &[
            "node",
            "vif",
            "attach",
            "bm-1",
            "vif-c",
            "--port-uuid",
            &p_uuid,
        ],
    )?;
    let p0 = baremetal_json(&d, &["port", "show", &p_uuid])?;
    assert_eq!(p0["internal_info"]["tenant_vif_port_id"], "vif-c");

    // A port bound to a VIF is not deleted (409) until the VIF is detached.
    fails_with(&d, &["port", "delete", &p_uuid], 409)?;
    baremetal(&d, &["node", "vif", "detach", "bm-1", "vif-c"])?;
    // The empty group and the port are deleted.
    baremetal(&d, &["port", "group", "delete", "bond0"])?;
    fails_with(&d, &["port", "group", "show", "bond0"], 404)?;
    baremetal(&d, &["port", "delete", &p_uuid])?;
    fails_with(&d, &["port", "delete", &p_uuid], 404)?;
    Ok(())
}

#[test]
fn openstacksdk_round_trip() -> Result<()> {
    if !clients::available() {
        return Ok(());
    }
    let (_dir, d) = start()?;
    let n1 = node(&d, "sdk-1")?;
    let n2 = node(&d, "sdk-2")?;
    let snippet = format!(
        r#"
from openstack import exceptions as exc
bm = conn.baremetal
out = {{}}
pg = bm.create_port_group(node_id={n1:?}, name='bond1', address='52:54:00:bb:00:01',
                          mode='balance-rr', properties={{'miimon': '50'}})
out['pg'] = pg.to_dict()
out['pg_get'] = bm.get_port_group('bond1').id
out['pg_list'] = [g.name for g in bm.port_groups(node={n1:?}, details=True)]
bm.update_port_group(pg, extra={{'a': 'b'}})
out['pg_extra'] = bm.get_port_group(pg.id).extra
p = bm.create_port(node_id={n1:?}, address='52:54:00:00:01:01', port_group_id=pg.id,
                   name='sdk-eth0', physical_network='physnet1',
                   local_link_connection={{'switch_id': '0a:1b:2c:3d:4e:5f', 'port_id': 'xe-0/0/1'}})
out['port'] = p.to_dict()
q = bm.create_port(node_id={n2:?}, address='52:54:00:00:01:02')
out['get'] = bm.get_port('sdk-eth0').id
out['list_node'] = [x.id for x in bm.ports(node={n1:?})]
out['list_group'] = [x.id for x in bm.ports(portgroup='bond1', details=True)]
out['list_addr'] = [x.id for x in bm.ports(address='52:54:00:00:01:02')]
bm.update_port(q, description='spare', extra={{'x': 'y'}})
got = bm.get_port(q.id)
out['updated'] = [got.description, got.extra]
def code(f):
    try:
        f()
    except exc.HttpException as e:
        return e.status_code
    return None
out['dup_mac'] = code(lambda: bm.create_port(node_id={n2:?}, address='52:54:00:00:01:01'))
out['dup_group'] = code(lambda: bm.create_port_group(node_id={n2:?}, name='bond1'))
out['missing'] = code(lambda: bm.get_port('nope'))
out['missing_group'] = code(lambda: bm.get_port_group('nope'))
out['bad_llc'] = code(lambda: bm.create_port(node_id={n2:?}, address='52:54:00:00:01:09',
                                            local_link_connection={{'port_id': 'x'}}))
out['group_not_empty'] = code(lambda: bm.delete_port_group(pg))
bm.attach_vif_to_node({n1:?}, 'sdk-vif-1', retry_on_conflict=False)
out['vifs'] = bm.list_node_vifs({n1:?})
out['vif_again'] = code(lambda: bm.attach_vif_to_node({n1:?}, 'sdk-vif-1', retry_on_conflict=False))
out['vif_full'] = code(lambda: bm.attach_vif_to_node({n1:?}, 'sdk-vif-2', retry_on_conflict=False))
out['vif_target'] = bm.get_port_group(pg.id).internal_info
bm.detach_vif_from_node({n1:?}, 'sdk-vif-1')
out['vifs_after'] = bm.list_node_vifs({n1:?})
bm.attach_vif_to_node({n2:?}, 'sdk-vif-3', retry_on_conflict=False, port_id=q.id)
out['vif_port'] = bm.get_port(q.id).internal_info
out['detach_missing'] = code(lambda: bm.detach_vif_from_node({n1:?}, 'sdk-vif-9', ignore_missing=False))
bm.delete_port(p, ignore_missing=False)
bm.delete_port_group(pg, ignore_missing=False)
out['gone'] = code(lambda: bm.get_port(p.id))
out['gone_group'] = code(lambda: bm.delete_port_group(pg.id, ignore_missing=False))
emit(out)
"#
    );
    let out = sdk(&d, &snippet)?;
    let pg_id = out["pg"]["id"].as_str().context("pg id")?;
    assert_eq!(out["pg"]["mode"], "balance-rr", "{out}");
    assert_eq!(out["pg"]["properties"]["miimon"], "50");
    assert_eq!(out["pg_get"], pg_id);
    assert_eq!(out["pg_list"], json!(["bond1"]));
    assert_eq!(out["pg_extra"], json!({"a": "b"}));
    let port_id = out["port"]["id"].as_str().context("port id")?;
    assert_eq!(out["port"]["port_group_id"], pg_id, "{out}");
    assert_eq!(out["port"]["physical_network"], "physnet1");
    assert_eq!(out["port"]["name"], "sdk-eth0");
    assert_eq!(
        out["port"]["local_link_connection"]["switch_id"],
        "0a:1b:2c:3d:4e:5f"
    );
    assert_eq!(out["get"], port_id);
    assert_eq!(out["list_node"], json!([port_id]));
    assert_eq!(out["list_group"], json!([port_id]));
    assert_eq!(out["list_addr"].as_array().map(Vec::len), Some(1));
    assert_eq!(out["updated"], json!(["spare", {"x": "y"}]));
    assert_eq!(out["dup_mac"], 409);
    assert_eq!(out["dup_group"], 409);
    assert_eq!(out["missing"], 404);
    assert_eq!(out["missing_group"], 404);
    assert_eq!(out["bad_llc"], 400);
    assert_eq!(out["group_not_empty"], 400);
    assert_eq!(out["vifs"], json!(["sdk-vif-1"]));
    assert_eq!(out["vif_again"], 409);
    assert_eq!(out["vif_full"], 400);
    assert_eq!(out["vif_target"]["tenant_vif_port_id"], "sdk-vif-1");
    assert_eq!(out["vifs_after"], json!([]));
    assert_eq!(out["vif_port"]["tenant_vif_port_id"], "sdk-vif-3");
    assert_eq!(out["detach_missing"], 400);
    assert_eq!(out["gone"], 404);
    assert_eq!(out["gone_group"], 404);
    Ok(())
}

#[test]
fn microversions_and_checks() -> Result<()> {
    let (_dir, d) = start()?;
    let n1 = node(&d, "mv-1")?;
    let n2 = node(&d, "mv-2")?;
    let latest = |m: &str, p: &str, b: Option<Value>| call_at(&d, "latest", m, p, b);

    let (s, p) = latest(
        "POST",
        "/v1/ports",
        Some(
            json!({"node_ident": "mv-1", "address": "52:54:00:00:02:01", "name": "mv-eth0",
                    "local_link_connection": {"switch_id": "001122334455AABB", "port_id": "1",
                                              "network_type": "managed"}}),
        ),
    )?;
    assert_eq!(s, 201, "{p}");
    let uuid = p["uuid"].as_str().context("uuid")?.to_string();
    assert_eq!(p["node_uuid"], n1);
    assert_eq!(p["local_link_connection"]["switch_id"], "001122334455aabb");
    assert_eq!(p["internal_info"], json!({}));

    // Fields hidden below their versions, and 406 when asked for.
    let (_, v) = call_at(&d, "1.17", "GET", &format!("/v1/ports/{uuid}"), None)?;
    assert!(
        v.get("internal_info").is_none() && v.get("pxe_enabled").is_none(),
        "{v}"
    );
    let (_, v) = call_at(&d, "1.18", "GET", &format!("/v1/ports/{uuid}"), None)?;
    assert!(
        v.get("internal_info").is_some() && v.get("pxe_enabled").is_none(),
        "{v}"
    );
    let (_, v) = call_at(&d, "1.87", "GET", &format!("/v1/ports/{uuid}"), None)?;
    assert!(
        v.get("name").is_none() && v.get("is_smartnic").is_some(),
        "{v}"
    );
    let (_, v) = call_at(&d, "1.101", "GET", &format!("/v1/ports/{uuid}"), None)?;
    assert!(v.get("category").is_some(), "{v}");
    assert!(v.get("available_for_dynamic_portgroup").is_none(), "{v}");
    let (s, _) = call_at(
        &d,
        "1.87",
        "GET",
        &format!("/v1/ports/{uuid}?fields=name"),
        None,
    )?;
    assert_eq!(s, 406);
    let (s, v) = call_at(
        &d,
        "1.88",
        "GET",
        "/v1/ports/mv-eth0?fields=uuid,name",
        None,
    )?;
    // The fields asked for, and `links` (Ironic's `sanitize_dict` always keeps them).
    assert!(v["links"].is_array(), "{v}");
    let mut v = v;
    v.as_object_mut().map(|m| m.remove("links"));
    assert_eq!((s, v), (200, json!({"uuid": uuid, "name": "mv-eth0"})));
    let (s, _) = call_at(
        &d,
        "1.87",
        "POST",
        "/v1/ports",
        Some(json!({"node_uuid": n1, "address": "52:54:00:00:02:09", "name": "x"})),
    )?;
    assert_eq!(s, 406);
    let (s, _) = call_at(
        &d,
        "1.93",
        "POST",
        "/v1/ports",
        Some(json!({"node_ident": "mv-1", "address": "52:54:00:00:02:09"})),
    )?;
    assert_eq!(s, 406);
    let (s, _) = call_at(
        &d,
        "1.63",
        "POST",
        "/v1/ports",
        Some(json!({"node_uuid": n1, "address": "52:54:00:00:02:09",
                    "local_link_connection": {"network_type": "unmanaged"}})),
    )?;
    assert_eq!(s, 406);

    // OVN VTEP keys: accepted from 1.90, hidden again and refused from 1.105.
    let vtep = json!({"port_id": "p", "vtep-logical-switch": "ls", "vtep-physical-switch": "ps"});
    let (s, v) = call_at(
        &d,
        "1.90",
        "POST",
        "/v1/ports",
        Some(
            json!({"node_uuid": n2, "address": "52:54:00:00:02:02", "local_link_connection": vtep}),
        ),
    )?;
    assert_eq!(s, 201, "{v}");
    let vtep_port = v["uuid"].as_str().context("uuid")?.to_string();
    assert_eq!(v["local_link_connection"]["vtep-logical-switch"], "ls");
    let (_, v) = call_at(&d, "1.105", "GET", &format!("/v1/ports/{vtep_port}"), None)?;
    assert_eq!(v["local_link_connection"], json!({}));
    let (s, _) = call_at(
        &d,
        "1.105",
        "POST",
        "/v1/ports",
        Some(
            json!({"node_uuid": n2, "address": "52:54:00:00:02:03", "local_link_connection": vtep}),
        ),
    )?;
    assert_eq!(s, 406);

    // Body checks.
    for (body, code) in [
        (
            json!({"node_uuid": n2, "address": "52:54:00:00:02:09", "local_link_connection": {"port_id": "x"}}),
            400,
        ),
        (
            json!({"node_uuid": n2, "address": "52:54:00:00:02:09", "local_link_connection": {"port_id": "x", "switch_id": "nope"}}),
            400,
        ),
        (
            json!({"node_uuid": n2, "address": "52:54:00:00:02:09", "local_link_connection": {"port_id": "x", "switch_id": "00:11:22:33:44:55", "bogus": "1"}}),
            400,
        ),
        (
            json!({"node_uuid": n2, "address": "52:54:00:00:02:09", "is_smartnic": true}),
            400,
        ),
        (
            json!({"node_uuid": n2, "address": "52:54:00:00:02:09", "physical_network": ""}),
            400,
        ),
        (
            json!({"node_uuid": n2, "address": "52:54:00:00:02:09", "vendor": "x".repeat(33)}),
            400,
        ),
        (
            json!({"node_uuid": n2, "address": "52:54:00:00:02:09", "bogus": 1}),
            400,
        ),
        (
            json!({"node_uuid": n2, "node_ident": "mv-2", "address": "52:54:00:00:02:09"}),
            400,
        ),
        (
            json!({"node_uuid": n2, "address": "52:54:00:00:02:01"}),
            409,
        ),
        (
            json!({"node_uuid": n2, "address": "52:54:00:00:02:09", "name": "mv-eth0"}),
            409,
        ),
    ] {
        let (s, v) = latest("POST", "/v1/ports", Some(body.clone()))?;
        assert_eq!(s, code, "{body} -> {v}");
    }
    let (s, _) = latest("GET", "/v1/ports?address=52:54:00:00:02:09", None)?;
    assert_eq!(s, 200);
    let (_, v) = latest("GET", "/v1/ports?address=52:54:00:00:02:09", None)?;
    assert_eq!(v["ports"], json!([]), "a refused body created nothing");

    // Port groups: 404 below 1.23, sub-resources at 1.24, gated fields.
    let (s, _) = call_at(&d, "1.22", "GET", "/v1/portgroups", None)?;
    assert_eq!(s, 404);
    let (s, _) = call_at(
        &d,
        "1.25",
        "POST",
        "/v1/portgroups",
        Some(json!({"node_uuid": n1, "mode": "802.3ad"})),
    )?;
    assert_eq!(s, 406);
    let (s, g) = latest(
        "POST",
        "/v1/portgroups",
        Some(
            json!({"node_uuid": n1, "name": "mv-bond", "standalone_ports_supported": false,
                    "physical_network": "net-a"}),
        ),
    )?;
    assert_eq!(s, 201, "{g}");
    assert_eq!(g["mode"], "active-backup");
    let g_uuid = g["uuid"].as_str().context("pg uuid")?.to_string();
    let (_, v) = call_at(&d, "1.25", "GET", "/v1/portgroups/mv-bond", None)?;
    assert!(
        v.get("mode").is_none() && v.get("physical_network").is_none(),
        "{v}"
    );
    let (s, _) = call_at(
        &d,
        "1.23",
        "GET",
        &format!("/v1/nodes/{n1}/portgroups"),
        None,
    )?;
    assert_eq!(s, 404);
    let (s, v) = call_at(
        &d,
        "1.24",
        "GET",
        &format!("/v1/nodes/{n1}/portgroups"),
        None,
    )?;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["portgroups"][0]["uuid"], g_uuid);
    let (s, _) = call_at(&d, "1.105", "GET", "/v1/portgroups?shard=x", None)?;
    assert_eq!(s, 406);
    let (s, v) = call_at(&d, "1.106", "GET", "/v1/portgroups?shard=x", None)?;
    assert_eq!((s, v["portgroups"].clone()), (200, json!([])));
    let (s, _) = latest(
        "PATCH",
        "/v1/portgroups/mv-bond",
        Some(json!([{"op": "remove", "path": "/mode"}])),
    )?;
    assert_eq!(s, 400);
    let (s, _) = latest(
        "POST",
        "/v1/portgroups",
        Some(json!({"node_uuid": n1, "name": "bad name!"})),
    )?;
    assert_eq!(s, 400);

    // A PXE port may not join a group without standalone ports (409); a port on another
    // physical network may not either (409); a non-PXE one on the group's network may.
    let (s, _) = latest(
        "PATCH",
        &format!("/v1/ports/{uuid}"),
        Some(json!([{"op": "add", "path": "/portgroup_uuid", "value": g_uuid}])),
    )?;
    assert_eq!(s, 409);
    let join = json!([{"op": "add", "path": "/portgroup_uuid", "value": "mv-bond"},
                      {"op": "replace", "path": "/pxe_enabled", "value": false}]);
    let (s, v) = latest("PATCH", &format!("/v1/ports/{uuid}"), Some(join.clone()))?;
    assert_eq!(s, 409, "{v}");
    assert!(v.to_string().contains("physical network"), "{v}");
    let (s, v) = latest(
        "PATCH",
        &format!("/v1/ports/{uuid}"),
        Some(json!([{"op": "add", "path": "/physical_network", "value": "net-a"}])),
    )?;
    assert_eq!(s, 200, "{v}");
    let (s, v) = latest("PATCH", &format!("/v1/ports/{uuid}"), Some(join))?;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["portgroup_uuid"], g_uuid);
    // A member's physical network follows its group (and is not changed on its own).
    let (s, _) = latest(
        "PATCH",
        &format!("/v1/ports/{uuid}"),
        Some(json!([{"op": "add", "path": "/physical_network", "value": "net-b"}])),
    )?;
    assert_eq!(s, 400);
    let (s, _) = latest(
        "PATCH",
        "/v1/portgroups/mv-bond",
        Some(json!([{"op": "replace", "path": "/physical_network", "value": "net-c"}])),
    )?;
    assert_eq!(s, 200);
    let (_, v) = latest("GET", &format!("/v1/ports/{uuid}"), None)?;
    assert_eq!(v["physical_network"], "net-c");
    let (s, v) = call_at(
        &d,
        "1.24",
        "GET",
        &format!("/v1/portgroups/{g_uuid}/ports"),
        None,
    )?;
    assert_eq!(s, 200);
    assert_eq!(
        v["ports"],
        json!([{"uuid": uuid, "address": "52:54:00:00:02:01",
        "links": v["ports"][0]["links"].clone()}])
    );
    let (s, _) = latest(
        "PATCH",
        &format!("/v1/ports/{uuid}"),
        Some(json!([{"op": "add", "path": "/internal_info", "value": {}}])),
    )?;
    assert_eq!(s, 400, "internal_info is read-only");

    // Listings: filters, exclusivity, sorting, paging.
    let (s, _) = latest(
        "GET",
        &format!("/v1/ports?node={n1}&portgroup=mv-bond"),
        None,
    )?;
    assert_eq!(s, 403);
    let (s, _) = latest(
        "GET",
        &format!("/v1/ports?node={n1}&conductor_groups=a"),
        None,
    )?;
    assert_eq!(s, 400);
    let (s, _) = latest("GET", "/v1/ports?sort_key=extra", None)?;
    assert_eq!(s, 400);
    let (s, _) = call_at(&d, "1.23", "GET", "/v1/ports?portgroup=mv-bond", None)?;
    assert_eq!(s, 406);
    let (s, _) = call_at(&d, "1.81", "GET", "/v1/ports?shard=a", None)?;
    assert_eq!(s, 406);
    let (s, v) = latest(
        "PATCH",
        &format!("/v1/nodes/{n2}"),
        Some(json!([{"op": "add", "path": "/conductor_group", "value": "cg1"}])),
    )?;
    assert_eq!(s, 200, "{v}");
    let (_, v) = latest("GET", "/v1/ports?conductor_groups=CG1,other", None)?;
    assert_eq!(v["ports"].as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(v["ports"][0]["uuid"], vtep_port);
    let (_, v) = latest("GET", "/v1/portgroups?conductor_groups=cg1", None)?;
    assert_eq!(v["portgroups"], json!([]), "{v}");
    let (_, v) = latest(
        "GET",
        "/v1/ports?sort_key=address&sort_dir=desc&limit=1",
        None,
    )?;
    assert_eq!(v["ports"][0]["address"], "52:54:00:00:02:02", "{v}");
    let next = v["next"].as_str().context("next link")?;
    let path = next.strip_prefix(&d.url).context("next on this server")?;
    let (_, v) = latest("GET", path, None)?;
    assert_eq!(v["ports"][0]["address"], "52:54:00:00:02:01", "{v}");
    let (_, v) = latest("GET", "/v1/nodes/mv-1/ports/detail", None)?;
    assert_eq!(v["ports"][0]["name"], "mv-eth0");
    let (s, _) = latest(
        "GET",
        "/v1/ports?marker=7a1c1b6e-0000-4000-8000-000000000000",
        None,
    )?;
    assert_eq!(s, 404);

    // VIFs: 404 below 1.28; both port_uuid and portgroup_uuid refused at 1.67.
    let (s, _) = call_at(&d, "1.27", "GET", "/v1/nodes/mv-1/vifs", None)?;
    assert_eq!(s, 404);
    let (s, v) = call_at(&d, "1.28", "GET", "/v1/nodes/mv-1/vifs", None)?;
    assert_eq!((s, v), (200, json!({"vifs": []})));
    let (s, _) = latest(
        "POST",
        "/v1/nodes/mv-1/vifs",
        Some(json!({"id": "v1", "port_uuid": uuid, "portgroup_uuid": g_uuid})),
    )?;
    assert_eq!(s, 400);
    let (s, _) = latest(
        "POST",
        "/v1/nodes/mv-1/vifs",
        Some(json!({"id": "v1", "portgroup_uuid": g_uuid})),
    )?;
    assert_eq!(s, 204);
    let (_, v) = latest("GET", "/v1/portgroups/mv-bond", None)?;
    assert_eq!(v["internal_info"]["tenant_vif_port_id"], "v1");
    let (s, _) = latest("POST", "/v1/nodes/mv-1/vifs", Some(json!({"name": "v2"})))?;
    assert_eq!(s, 400);
    let (s, _) = latest("DELETE", "/v1/nodes/mv-1/vifs/v1", None)?;
    assert_eq!(s, 204);
    let (s, _) = latest("POST", "/v1/nodes/nope/vifs", Some(json!({"id": "v1"})))?;
    assert_eq!(s, 404);

    // Sub-resources are read-only (Ironic's MalformedRequestURI).
    for path in ["/v1/nodes/mv-1/ports", "/v1/nodes/mv-1/portgroups"] {
        let (s, v) = latest("POST", path, Some(json!({"address": "52:54:00:00:02:0a"})))?;
        assert_eq!(s, 400, "{path}: {v}");
    }

    // Deleting: a port by UUID only; a group once empty.
    let (s, _) = latest("DELETE", "/v1/ports/mv-eth0", None)?;
    assert_eq!(s, 400);
    let (s, _) = latest("DELETE", &format!("/v1/ports/{uuid}"), None)?;
    assert_eq!(s, 204);
    let (s, _) = latest("DELETE", "/v1/portgroups/mv-bond", None)?;
    assert_eq!(s, 204);
    Ok(())
}

/// `rivet ARGS --json` against `d`, decoded.
fn rivet(d: &Rivetd, args: &[&str]) -> Result<Value> {
    let out = rivet_tests::run_tool(
        std::process::Command::new(rivet_tests::bin("rivet"))
            .args(["--url", &d.url, "--json"])
            .args(args),
    )?;
    if out.trim().is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_str(&out).with_context(|| format!("rivet {args:?} printed {out}"))
}

#[test]
fn rivet_cli_round_trip() -> Result<()> {
    let (_dir, d) = start()?;
    let n = node(&d, "cli-1")?;
    let g = rivet(
        &d,
        &[
            "portgroup",
            "create",
            "--node",
            &n,
            "--name",
            "cli-bond",
            "--mode",
            "802.3ad",
            "--property",
            "miimon=100",
            "--extra",
            "a=b",
        ],
    )?;
    assert_eq!(g["mode"], "802.3ad", "{g}");
    assert_eq!(g["properties"]["miimon"], "100");
    let p = rivet(
        &d,
        &[
            "port",
            "create",
            "--node",
            "cli-1",
            "--address",
            "52:54:00:00:03:01",
            "--name",
            "cli-eth0",
            "--portgroup",
            "cli-bond",
            "--pxe-enabled",
            "false",
            "--local-link-connection",
            "switch_id=00:11:22:33:44:55",
            "--local-link-connection",
            "port_id=7",
            "--vendor",
            "intel",
        ],
    )?;
    assert_eq!(p["node_uuid"], n, "{p}");
    assert_eq!(p["portgroup_uuid"], g["uuid"]);
    assert_eq!(p["local_link_connection"]["port_id"], "7");
    let listed = rivet(&d, &["port", "list", "--portgroup", "cli-bond"])?;
    assert_eq!(listed["ports"][0]["name"], "cli-eth0", "{listed}");
    let shown = rivet(&d, &["portgroup", "show", "cli-bond"])?;
    assert_eq!(shown["port_uuids"], json!([p["uuid"]]), "{shown}");
    let set = rivet(
        &d,
        &[
            "port",
            "set",
            "cli-eth0",
            "--description",
            "uplink",
            "--extra",
            "k=v",
        ],
    )?;
    assert_eq!(set["description"], "uplink", "{set}");
    assert_eq!(set["extra"]["k"], "v");
    let unset = rivet(
        &d,
        &[
            "port",
            "unset",
            "cli-eth0",
            "--field",
            "portgroup",
            "--field",
            "extra/k",
        ],
    )?;
    assert_eq!(unset["portgroup_uuid"], Value::Null, "{unset}");
    assert_eq!(unset["extra"], json!({}));

    rivet(&d, &["node", "vif", "attach", "cli-1", "cli-vif"])?;
    let vifs = rivet(&d, &["node", "vif", "list", "cli-1"])?;
    assert_eq!(vifs, json!({"vifs": [{"id": "cli-vif"}]}));
    rivet(&d, &["node", "vif", "detach", "cli-1", "cli-vif"])?;
    assert_eq!(
        rivet(&d, &["node", "vif", "list", "cli-1"])?,
        json!({"vifs": []})
    );

    rivet(&d, &["portgroup", "delete", "cli-bond"])?;
    let err = rivet(&d, &["portgroup", "show", "cli-bond"]).expect_err("deleted");
    assert!(err.to_string().contains("could not be found"), "{err}");
    let port_uuid = p["uuid"].as_str().context("uuid")?;
    rivet(&d, &["port", "delete", port_uuid])?;
    let all = rivet(&d, &["port", "list"])?;
    assert_eq!(all["ports"], json!([]));
    Ok(())
}
