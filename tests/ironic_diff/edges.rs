//! Requests beyond one per route: the microversion edges and the patch semantics where Rivet
//! once answered otherwise than Ironic (issue 48), each kept here so the difference fails the
//! test if it comes back.
//!
//! - a `.json` suffix is taken off only below 1.91, and only when the request names its
//!   version (Ironic's `JsonExtensionMiddleware`); from 1.91 it is part of the identifier;
//! - a method a route does not have, below the route's microversion, is the route missing
//!   (404), not 405; a node created with a field newer than the request is 406;
//! - the provision walks of Ironic's tempest `TestNodeStatesV1_*` at their old versions;
//! - `add`/`replace`/`remove` on a volume connector's fields, with the values compared.

use super::{fixed, Step};
use serde_json::{json, Value};

/// The version below which a `.json` suffix is taken off (`MINOR_91_DOT_JSON`).
const BEFORE_DOT_JSON: &str = "1.90";
const DOT_JSON: &str = "1.91";

/// Objects only these requests use.
pub(super) fn setup() -> Vec<Step> {
    let mut s = Vec::new();
    let node = |name: &str| {
        Step::Create(
            format!("node:{name}"),
            "/v1/nodes",
            json!({"driver": "fake-hardware", "name": name}),
        )
    };
    // Deleted through a `.json` path; a node whose name ends in `.json`.
    s.push(node("njdel"));
    s.push(node("nj.json"));
    s.push(Step::Create(
        "port:pjdel".into(),
        "/v1/ports",
        json!({"node_uuid": "{node:n1}", "address": "52:54:00:00:0b:01", "name": "pjdel"}),
    ));
    s.push(Step::Create(
        "portgroup:pgjdel".into(),
        "/v1/portgroups",
        json!({"node_uuid": "{node:n1}", "name": "pgjdel"}),
    ));
    s.push(Step::Create(
        "dt:CUSTOM_DTJDEL".into(),
        "/v1/deploy_templates",
        json!({"name": "CUSTOM_DTJDEL", "steps": super::dt_steps()}),
    ));
    s.push(Step::Create(
        "alloc:ajdel".into(),
        "/v1/allocations",
        json!({"name": "ajdel", "resource_class": "rc-none"}),
    ));
    // Connectors whose fields are patched, on a node powered off (both refuse a connector
    // change on a node that is not); vc3 holds a (type, connector_id) pair to collide with.
    s.push(node("nvol"));
    s.push(Step::Call(
        "PUT",
        "/v1/nodes/{node:nvol}/states/power".into(),
        Some(json!({"target": "power off"})),
    ));
    s.push(Step::WaitPower("nvol", "power off"));
    s.push(Step::Settle("nvol"));
    for n in ["vc2", "vc3"] {
        s.push(Step::Create(
            format!("vc:{n}"),
            "/v1/volume/connectors",
            json!({"node_uuid": "{node:nvol}", "type": "iqn",
                   "connector_id": format!("iqn.2026-01.org.test:{n}")}),
        ));
    }
    s
}

/// The requests, in order.
pub(super) fn requests() -> Vec<Step> {
    let mut t = Vec::new();
    t.extend(dot_json());
    t.extend(versions());
    t.extend(old_walks());
    t.extend(connector_patches());
    t
}

fn at(
    method: &'static str,
    path: &str,
    version: Option<&'static str>,
    body: Option<Value>,
) -> Step {
    Step::Fixed(method, path.to_string(), version, body)
}

fn extra(key: &str) -> Value {
    json!([{"op": "add", "path": format!("/extra/{key}"), "value": "x"}])
}

/// Item 1: `.json` below 1.91 (stripped, as pecan's content type once was), at 1.91 (part of
/// the identifier: 404 for one that does not end in it) and without a version header (never
/// stripped: Ironic's middleware reads the header itself).
fn dot_json() -> Vec<Step> {
    let mut t = Vec::new();
    let gets = [
        "/v1/nodes.json",
        "/v1/nodes/{node:n1}.json",
        "/v1/nodes/n1.json",
        "/v1/nodes/n1/states.json",
        "/v1/nodes/{node:nj.json}",
        "/v1/ports/{port:p1}.json",
        "/v1/portgroups/pg1.json",
        "/v1/portgroups/{portgroup:pg1}.json",
        "/v1/deploy_templates/CUSTOM_DT1.json",
        "/v1/allocations/a1.json",
        "/v1/chassis/{chassis:c1}.json",
    ];
    for version in [Some(BEFORE_DOT_JSON), Some(DOT_JSON), None] {
        for path in gets {
            t.push(at("GET", path, version, None));
        }
    }
    // By name (1.5 on): the name without its suffix below 1.91, the whole name from 1.91.
    for version in [BEFORE_DOT_JSON, DOT_JSON] {
        t.push(at("GET", "/v1/nodes/nj.json", Some(version), None));
    }
    let patches = [
        ("/v1/nodes/n1.json", "json_n"),
        ("/v1/nodes/nj.json", "json_nj"),
        ("/v1/ports/{port:p1}.json", "json_p"),
        ("/v1/portgroups/pg1.json", "json_pg"),
        ("/v1/deploy_templates/CUSTOM_DT1.json", "json_dt"),
        ("/v1/allocations/a1.json", "json_a"),
    ];
    for version in [DOT_JSON, BEFORE_DOT_JSON] {
        for (path, key) in patches {
            t.push(at("PATCH", path, Some(version), Some(extra(key))));
        }
    }
    // Deletes: refused (404) at 1.91 first, then done below it.
    let deletes = [
        "/v1/nodes/njdel.json",
        "/v1/ports/{port:pjdel}.json",
        "/v1/portgroups/pgjdel.json",
        "/v1/deploy_templates/CUSTOM_DTJDEL.json",
        "/v1/allocations/ajdel.json",
    ];
    for version in [DOT_JSON, BEFORE_DOT_JSON] {
        for path in deletes {
            t.push(at("DELETE", path, Some(version), None));
        }
    }
    t
}

/// Item 2: a method a node sub-resource does not have, below the sub-resource's version, is
/// 404 (Ironic's `_lookup` refuses the path before it looks at the method), 405 from it on;
/// a node created with a field newer than the request is 406.
fn versions() -> Vec<Step> {
    let mut t = Vec::new();
    for (path, below) in [
        ("/v1/nodes/{node:nact}/vmedia", "1.88"),
        ("/v1/nodes/{node:nhist}/history", "1.77"),
        ("/v1/nodes/{node:n1}/firmware", "1.85"),
        ("/v1/nodes/{node:n1}/bios", "1.39"),
        ("/v1/nodes/{node:nact}/vifs", "1.27"),
    ] {
        for version in [below, "latest"] {
            t.push(at("PUT", path, Some(version), Some(json!({}))));
        }
    }
    let node = |extra: Value| {
        let mut body = json!({"driver": "fake-hardware"});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        Some(body)
    };
    for (version, extra) in [
        ("1.20", json!({"resource_class": "rc-old"})),
        ("1.21", json!({"resource_class": "rc-new"})),
        ("1.4", json!({"name": "too-early"})),
        ("1.4", json!({"name": null})),
        ("1.19", json!({"network_interface": "noop"})),
        ("1.30", json!({"boot_interface": "fake"})),
        ("1.32", json!({"storage_interface": "noop"})),
        ("1.45", json!({"conductor_group": "g"})),
        ("1.45", json!({"conductor_group": ""})),
        ("1.46", json!({"automated_clean": false})),
        ("1.49", json!({"owner": "o"})),
        ("1.50", json!({"description": "d"})),
        ("1.60", json!({"retired": false})),
        ("1.64", json!({"lessee": "l"})),
        ("1.65", json!({"network_data": {}})),
        ("1.81", json!({"shard": "s"})),
        ("1.82", json!({"parent_node": "n1"})),
        ("1.94", json!({"disable_power_off": false})),
        ("1.103", json!({"instance_name": "i"})),
    ] {
        t.push(at("POST", "/v1/nodes", Some(version), node(extra)));
    }
    t
}

/// Item 4: Ironic's tempest `TestNodeStatesV1_1/_2/_4/_6/_11` request by request: the node
/// is created at the class's version (1.11: at 1.31 with fake interfaces), the classes from
/// 1.2 to 1.6 set its deploy and network interfaces at 1.31, and the verbs are sent at the
/// class's version, each followed by the states that version shows.
fn old_walks() -> Vec<Step> {
    let mut t = Vec::new();
    struct Walk {
        key: &'static str,
        version: &'static str,
        created_at: &'static str,
        create: Value,
        swap_interfaces: bool,
        verbs: &'static [&'static str],
    }
    let fake = json!({"driver": "fake-hardware"});
    let walks = [
        Walk {
            key: "nv1",
            version: "1.1",
            created_at: "1.1",
            create: fake.clone(),
            swap_interfaces: false,
            verbs: &["active", "deleted"],
        },
        Walk {
            key: "nv2",
            version: "1.2",
            created_at: "1.2",
            create: fake.clone(),
            swap_interfaces: true,
            verbs: &["active", "deleted"],
        },
        Walk {
            key: "nv4",
            version: "1.4",
            created_at: "1.4",
            create: fake.clone(),
            swap_interfaces: true,
            verbs: &["manage", "provide", "active", "deleted"],
        },
        Walk {
            key: "nv6",
            version: "1.6",
            created_at: "1.6",
            create: fake,
            swap_interfaces: true,
            verbs: &["manage", "inspect", "provide", "active", "deleted"],
        },
        Walk {
            key: "nv11",
            version: "1.11",
            created_at: "1.31",
            create: json!({"driver": "fake-hardware", "deploy_interface": "fake",
                           "network_interface": "noop", "inspect_interface": "fake"}),
            swap_interfaces: false,
            verbs: &["manage", "inspect", "provide", "active", "deleted"],
        },
    ];
    for w in walks {
        let path = format!("/v1/nodes/{{node:{}}}", w.key);
        t.push(Step::CreateAt(
            format!("node:{}", w.key),
            "/v1/nodes",
            w.created_at,
            w.create,
        ));
        if w.swap_interfaces {
            t.push(at(
                "PATCH",
                &path,
                Some("1.31"),
                Some(json!([
                    {"path": "/deploy_interface", "op": "replace", "value": "fake"},
                    {"path": "/network_interface", "op": "replace", "value": "noop"}
                ])),
            ));
        }
        t.push(at("GET", &path, Some(w.version), None));
        for verb in w.verbs {
            t.push(at(
                "PUT",
                &format!("{path}/states/provision"),
                Some(w.version),
                Some(json!({"target": verb})),
            ));
            t.push(Step::Settle(w.key));
            t.push(at("GET", &path, Some(w.version), None));
            t.push(at("GET", &format!("{path}/states"), Some(w.version), None));
        }
    }
    t
}

/// Item 5: a connector's fields by `add`, `replace` and `remove`, each answer compared, and
/// the connector's values after each.
fn connector_patches() -> Vec<Step> {
    let mut t = Vec::new();
    let vc = "/v1/volume/connectors/{vc:vc2}";
    let op = |op: &str, path: &str, value: Value| json!([{"op": op, "path": path, "value": value}]);
    let patches = [
        op(
            "replace",
            "/connector_id",
            json!("iqn.2026-01.org.test:vc2-r"),
        ),
        op("add", "/connector_id", json!("iqn.2026-01.org.test:vc2-a")),
        op("replace", "/type", json!("wwpn")),
        op("add", "/type", json!("ip")),
        op("replace", "/type", json!("not-a-known-type")),
        op("replace", "/type", json!("iqn")),
        op(
            "replace",
            "/connector_id",
            json!("iqn.2026-01.org.test:vc3"),
        ),
        op("replace", "/connector_id", json!("")),
        op("replace", "/connector_id", json!(5)),
        op("replace", "/connector_id", Value::Null),
        op("add", "/extra/k", json!("v")),
        op("replace", "/extra/k", json!("w")),
        op("replace", "/extra/nope", json!("x")),
        op("replace", "/extra", json!({"a": "b"})),
        op("add", "/extra", json!({"c": 1})),
        op("add", "/extra", Value::Null),
        op("replace", "/extra", json!("not an object")),
        json!([{"op": "remove", "path": "/extra"}]),
        json!([{"op": "remove", "path": "/connector_id"}]),
        json!([{"op": "remove", "path": "/type"}]),
        op("add", "/uuid", json!(super::MISSING)),
        op("add", "/properties", json!({})),
        json!([
            {"op": "replace", "path": "/type", "value": "mac"},
            {"op": "add", "path": "/connector_id", "value": "52:54:00:00:0c:01"},
            {"op": "add", "path": "/extra/both", "value": true}
        ]),
    ];
    for body in patches {
        t.push(fixed("PATCH", vc, Some(body)));
        t.push(Step::Same(vc.into(), &["connector_id", "type", "extra"]));
    }
    // A create takes what a patch does: any string as the type and the id, nothing else.
    for (kind, id) in [(json!("floppy"), json!("")), (json!(5), json!("x"))] {
        t.push(fixed(
            "POST",
            "/v1/volume/connectors",
            Some(json!({"node_uuid": "{node:nvol}", "type": kind, "connector_id": id})),
        ));
    }
    t
}
