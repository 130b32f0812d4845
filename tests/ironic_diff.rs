//! Differential test against a real OpenStack Ironic: the same HTTP requests go to rivetd and
//! to Ironic 39.0.0 (`tests/ironic_peer.rs`: one process, no auth, fake-hardware, SQLite), in
//! the same order, after the same setup; the answers are compared.
//!
//! For every route rivetd serves, [`routes`] names a request that works on it; each is sent as
//! several variants ([`Variant`]): at `latest`, at the oldest microversion the route exists in,
//! one below it, on a missing resource, on a malformed identifier, by name instead of UUID, and
//! with a body that has an unknown field. Objects are named in the table (`{node:n1}`); each
//! server's UUID for a name is captured when the setup creates it and substituted per server.
//!
//! Compared: the status code; for a JSON body its set of top-level keys, and the keys of the
//! first element of each top-level list of objects (list collections); for an error only the
//! code and that both bodies carry `error_message`. After each state change the provision
//! state both reach is compared too. A difference fails the test unless [`ALLOWED`] names it
//! with the reason it is legitimate. Every difference, allowed or not, is printed grouped by
//! kind (and written to `$RIVET_IRONIC_DIFF_REPORT` when that is set).
//!
//! Prerequisite: `scripts/setup-ironic.sh` (skipped without it, failed under
//! `RIVET_REQUIRE_PEERS=1`) and `cargo build --workspace --bins`.

use anyhow::{Context, Result};
use rivet_tests::ironic_peer::{self, Ironic};
use rivet_tests::Rivetd;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

mod edges;

/// A UUID no object has.
const MISSING: &str = "0e4f6b8a-0000-4000-8000-00000000dead";
/// An identifier that is neither a UUID nor a valid name (`!` is not an unreserved character).
const MALFORMED: &str = "bad!id";
/// The conductor hostname both servers use (rivetd's `--conductor-id` from the harness).
const CONDUCTOR: &str = "test-conductor";

/// Legitimate differences: (method, path template of the route as in the table — `*` for
/// any —, text the difference's description must contain — `""` for any —, why). Everything
/// else that differs fails the test. Current Rivet bugs do not belong here.
const ALLOWED: &[(&str, &str, &str, &str)] = &[
    // Rivet's own routes: Ironic has none of them.
    (
        "GET",
        "/v1/audit",
        "",
        "Rivet's audit trail; Ironic has none",
    ),
    (
        "GET",
        "/v1/openapi.json",
        "",
        "Rivet serves its OpenAPI document; Ironic does not",
    ),
    (
        "GET",
        "/metrics",
        "",
        "Rivet's Prometheus exposition; Ironic has no such route",
    ),
    (
        "POST",
        "/agent/v1/lookup",
        "",
        "Rivet's own agent API (docs/api-versions.md 1.22)",
    ),
    (
        "POST",
        "/agent/v1/heartbeat/{node:n1}",
        "",
        "Rivet's own agent API (docs/api-versions.md 1.22)",
    ),
    (
        "POST",
        "/agent/v1/discover",
        "",
        "Rivet's own agent API: discovery of unknown machines",
    ),
    (
        "GET",
        "/boot/ipxe",
        "",
        "Rivet's boot file server; Ironic leaves that to an external HTTP server",
    ),
    (
        "GET",
        "/boot/ipxe/{node:n1}",
        "",
        "Rivet's boot file server; Ironic leaves that to an external HTTP server",
    ),
    (
        "GET",
        "/boot/iso/none.iso",
        "",
        "Rivet's boot file server; Ironic leaves that to an external HTTP server",
    ),
    (
        "GET",
        "/boot/none.efi",
        "",
        "Rivet's boot file server; Ironic leaves that to an external HTTP server",
    ),
    (
        "GET",
        "/v1/nodes/{node:n1}/logs",
        "",
        "Rivet keeps the agent's logs per node; Ironic has no such route",
    ),
    (
        "GET",
        "/v1/nodes/{node:n1}/logs/1",
        "",
        "Rivet keeps the agent's logs per node; Ironic has no such route",
    ),
    (
        "GET",
        "/v1/nodes/{node:n1}/clean_steps",
        "",
        "Rivet lists a node's cached clean steps; Ironic has no such route",
    ),
    // IPA's ramdisk API, deliberately not served.
    (
        "GET",
        "/v1/lookup",
        "",
        concat!(
            "IPA's ramdisk API: Rivet answers 404 naming its own agent API (docs/api-versions.md ",
            "1.22, n/a)",
        ),
    ),
    (
        "GET",
        "/v1/lookup?addresses=52:54:00:00:01:01",
        "",
        concat!(
            "IPA's ramdisk API: Rivet answers 404 naming its own agent API (docs/api-versions.md ",
            "1.22, n/a)",
        ),
    ),
    (
        "POST",
        "/v1/heartbeat/{node:n1}",
        "",
        concat!(
            "IPA's ramdisk API: Rivet answers 404 naming its own agent API (docs/api-versions.md ",
            "1.22, n/a)",
        ),
    ),
    (
        "POST",
        "/v1/continue_inspection",
        "",
        "IPA's inspection callback: Rivet answers 404 (docs/api-versions.md 1.84, n/a)",
    ),
    // Differences kept on purpose (docs/ironic-compatibility.md says why).
    (
        "PUT",
        "/v1/nodes/{node:nhist}/states/provision",
        "no_such_step",
        "Rivet refuses a manual clean naming a step the node does not offer before it starts \
         (400, the node stays manageable); Ironic accepts it and fails the cleaning",
    ),
    (
        "GET",
        "/v1/nodes/{node:nhist}/history/{event:h1}",
        "target_provision_state",
        "the same refused clean: Ironic's event is the failed cleaning, Rivet's an earlier one",
    ),
    (
        "GET",
        "/v1/nodes/nhist/history/{event:h1}",
        "target_provision_state",
        "the same refused clean: Ironic's event is the failed cleaning, Rivet's an earlier one",
    ),
    (
        "SETTLE",
        "nhist",
        "clean failed",
        "the same refused clean: the node never left manageable in Rivet",
    ),
    (
        "GET",
        "/v1",
        "continue_inspection",
        "the v1 document links no IPA ramdisk endpoint: rivetd does not serve them",
    ),
    (
        "GET",
        "/v1/",
        "continue_inspection",
        "the v1 document links no IPA ramdisk endpoint: rivetd does not serve them",
    ),
    (
        "*",
        "/v1/deploy_templates",
        "only Rivet: [\"description\"]",
        "Rivet keeps and shows a deploy template's description, which Ironic 39's schema \
         accepts but its object drops",
    ),
    (
        "*",
        "/v1/deploy_templates/{dt:CUSTOM_DT1}",
        "only Rivet: [\"description\"]",
        "Rivet keeps and shows a deploy template's description, which Ironic 39's schema \
         accepts but its object drops",
    ),
    (
        "*",
        "/v1/deploy_templates/CUSTOM_DT1",
        "only Rivet: [\"description\"]",
        "Rivet keeps and shows a deploy template's description, which Ironic 39's schema \
         accepts but its object drops",
    ),
    (
        "*",
        "/v1/deploy_templates/CUSTOM_DT1.json",
        "only Rivet: [\"description\"]",
        "Rivet keeps and shows a deploy template's description, which Ironic 39's schema \
         accepts but its object drops",
    ),
    (
        "GET",
        "/v1/nodes/n1/states.json",
        "Field states.json is not a valid field",
        "a path under a node that names no sub-resource: Ironic's pecan routing hands the \
         segment to the node's show as `fields` (400); Rivet answers 404, as for any path \
         that names nothing (docs/ironic-compatibility.md)",
    ),
    // Documented choices of Rivet's drivers (docs/api-versions.md).
    (
        "GET",
        "/v1/nodes/{node:n1}/vendor_passthru/methods",
        "",
        concat!(
            "docs 1.1: vendor passthru answers as Ironic's no-vendor interface on every node ",
            "(Ironic's fake vendor has demo methods)",
        ),
    ),
    (
        "GET",
        "/v1/drivers/fake-hardware/properties",
        "",
        concat!(
            "the driver_info keys are each driver's own: Rivet's fake-hardware reads fake_* keys, ",
            "Ironic's reads A1..B2",
        ),
    ),
    (
        "PUT",
        "/v1/nodes/{node:nact}/management/inject_nmi",
        "does not support inject_nmi",
        concat!(
            "docs 1.29: Rivet's fake-hardware injects an NMI; Ironic's fake management does not ",
            "implement it",
        ),
    ),
    (
        "PUT",
        "/v1/nodes/{node:nact}/management/indicators/led@system",
        "does not support set_indicator_state",
        concat!(
            "docs 1.63: Rivet's fake-hardware keeps indicators in memory; ",
            "Ironic's fake management ",
            "cannot set them",
        ),
    ),
    (
        "GET",
        "/v1/nodes/{node:nact}/vmedia",
        "does not support get_virtual_media",
        "Rivet's fake BMC lists the medium it was given; Ironic's fake management accepts \
         attach and detach but cannot list",
    ),
    (
        "GET",
        "/v1/nodes/nact/vmedia",
        "does not support get_virtual_media",
        "Rivet's fake BMC lists the medium it was given; Ironic's fake management accepts \
         attach and detach but cannot list",
    ),
    (
        "GET",
        "/v1/nodes/{node:nact}/vifs",
        "vifs[0] (Ironic's list is empty)",
        concat!(
            "docs 1.28: Rivet records a VIF on a free port as Ironic's VIFPortIDMixin does; ",
            "Ironic's noop network interface records nothing",
        ),
    ),
    // Ironic's own failures: a 500 is a bug in Ironic, not a contract.
    (
        "*",
        "*",
        "Ironic 500 (",
        "Ironic 39 fails with 500 here (a bug in Ironic, not a contract)",
    ),
    // Ironic bugs where Rivet follows Ironic's API reference.
    (
        "*",
        "*",
        "Portgroup None could not be found",
        concat!(
            "Ironic 39 bug: a node's ports/portgroups by node name look up a portgroup None ",
            "(api-ref: node_ident is a UUID or name)",
        ),
    ),
    (
        "GET",
        "/v1/portgroups/{portgroup:pg1}/ports",
        "Portgroup pg1 could not be found",
        concat!(
            "Ironic 39 bug: a portgroup's ports by portgroup name 404 ",
            "(api-ref: portgroup_ident is ",
            "a UUID or name)",
        ),
    ),
    (
        "GET",
        "/v1/portgroups/{portgroup:pg1}/ports/detail",
        "Portgroup pg1 could not be found",
        concat!(
            "Ironic 39 bug: a portgroup's ports by portgroup name 404 ",
            "(api-ref: portgroup_ident is ",
            "a UUID or name)",
        ),
    ),
    (
        "GET",
        "/v1/nodes/{node:n1}/volume/connectors",
        "Node n1 could not be found",
        concat!(
            "Ironic 39 bug: a node's volume connectors by node name 404 (api-ref: node_ident is a ",
            "UUID or name)",
        ),
    ),
    (
        "GET",
        "/v1/nodes/{node:n1}/volume/targets",
        "Node n1 could not be found",
        concat!(
            "Ironic 39 bug: a node's volume targets by node name 404 (api-ref: node_ident is a ",
            "UUID or name)",
        ),
    ),
    (
        "GET",
        "/v1/nodes/{node:n1}/volume",
        "Ironic 200",
        "Ironic 39 bug: /v1/nodes/{missing}/volume answers 200 without looking the node up",
    ),
    (
        "GET",
        "/v1/nodes/{node:nact}/management/indicators",
        "@1.62",
        "Ironic 39 bug: indicators answer below 1.63, the version the api-ref gives",
    ),
    (
        "GET",
        "/v1/nodes/{node:nact}/management/indicators/led@system",
        "@1.62",
        "Ironic 39 bug: indicators answer below 1.63, the version the api-ref gives",
    ),
    (
        "PUT",
        "/v1/nodes/{node:nact}/management/indicators/led@system",
        "@1.62",
        "Ironic 39 bug: indicators answer below 1.63, the version the api-ref gives",
    ),
    (
        "GET",
        "/v1/nodes/{node:n1}/portgroups/detail",
        "@1.24",
        concat!(
            "Ironic 39 bug: portgroup /detail lists show fields of 1.26+ at older versions (its ",
            "show of one portgroup hides them)",
        ),
    ),
    (
        "GET",
        "/v1/portgroups/detail",
        "@1.23",
        concat!(
            "Ironic 39 bug: portgroup /detail lists show fields of 1.26+ at older versions (its ",
            "show of one portgroup hides them)",
        ),
    ),
];

// ------------------------------------------------------------------------------ the table

/// How one route is exercised.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Variant {
    /// The body with an unknown field added.
    Unknown,
    /// The first object of the path is a UUID nothing has.
    Missing,
    /// The first object of the path is neither a UUID nor a name.
    Malformed,
    /// One microversion below the route's oldest.
    Below,
    /// The route's oldest microversion.
    Min,
    /// `latest`.
    Latest,
    /// The first object of the path by its name, at `latest`.
    Name,
    /// An explicit request of the table.
    Fixed,
}

impl Variant {
    fn label(self) -> &'static str {
        match self {
            Variant::Unknown => "unknown",
            Variant::Missing => "missing",
            Variant::Malformed => "malformed",
            Variant::Below => "below",
            Variant::Min => "min",
            Variant::Latest => "latest",
            Variant::Name => "name",
            Variant::Fixed => "fixed",
        }
    }

    /// A small number per variant, for values that must differ between variants.
    fn index(self) -> u32 {
        match self {
            Variant::Below => 1,
            Variant::Min => 2,
            Variant::Latest => 3,
            Variant::Name => 4,
            Variant::Unknown => 5,
            Variant::Missing => 6,
            Variant::Malformed => 7,
            Variant::Fixed => 8,
        }
    }
}

/// The variants whose happy request may change something, one object per variant
/// (`{v}` in a path names the object that variant consumes).
const VICTIMS: &[Variant] = &[Variant::Below, Variant::Min, Variant::Latest, Variant::Name];

/// A route of the table: a request that works on it at `latest`.
#[derive(Clone, Debug)]
struct Route {
    method: &'static str,
    /// Path with `{kind:label}` objects and `{v}`/`{V}`/`{vi}` variant substitutions.
    path: &'static str,
    /// The microversion (1.x) that added it.
    min: u32,
    body: Option<Value>,
    /// Node to wait for (no target state) after each variant.
    settle: Option<&'static str>,
    /// Send only at `latest` (and the other variants are meaningless).
    latest_only: bool,
}

fn r(method: &'static str, path: &'static str, min: u32) -> Route {
    Route {
        method,
        path,
        min,
        body: None,
        settle: None,
        latest_only: false,
    }
}

impl Route {
    fn body(mut self, b: Value) -> Route {
        self.body = Some(b);
        self
    }
    fn settle(mut self, node: &'static str) -> Route {
        self.settle = Some(node);
        self
    }
    fn latest_only(mut self) -> Route {
        self.latest_only = true;
        self
    }
}

/// One step of the run.
#[derive(Clone, Debug)]
enum Step {
    /// Compared: every variant of a route.
    Route(Route),
    /// Compared: one request as written (method, path, version, body).
    Fixed(&'static str, String, Option<&'static str>, Option<Value>),
    /// Setup, not compared: POST `path` at latest and remember the new object's `uuid` as
    /// `key` (`kind:label`); a failure is reported as a setup difference.
    Create(String, &'static str, Value),
    /// Setup, not compared: a request that must succeed on both.
    Call(&'static str, String, Option<Value>),
    /// Wait until the node has no target state on both servers.
    Settle(&'static str),
    /// Wait until the node's power state is this on both servers.
    WaitPower(&'static str, &'static str),
    /// Wait (at most 30 s) until `GET path` shows `field` = `want` on both servers: work a
    /// server finishes after its answer (Ironic's conductor matches an allocation to a node
    /// in a worker).
    WaitFor(String, &'static str, &'static str),
    /// Remember the `uuid` of the last element of list `list` of `GET path` as `key`.
    Capture(String, String, &'static str),
    /// Setup, not compared: as [`Step::Create`] at a microversion (a node an old client
    /// creates starts elsewhere).
    CreateAt(String, &'static str, &'static str, Value),
    /// Compared: the values of `fields` of `GET path` at `latest` (what a patch made of them).
    Same(String, &'static [&'static str]),
}

impl From<Route> for Step {
    fn from(r: Route) -> Step {
        Step::Route(r)
    }
}

fn fixed(method: &'static str, path: &str, body: Option<Value>) -> Step {
    Step::Fixed(method, path.to_string(), Some("latest"), body)
}

fn provision(node: &'static str, body: Value) -> Vec<Step> {
    vec![
        fixed(
            "PUT",
            &format!("/v1/nodes/{{node:{node}}}/states/provision"),
            Some(body),
        ),
        Step::Settle(node),
    ]
}

/// Names of the victim objects of a kind: `prefix-below`, `prefix-min`, … (lowercase) or
/// `PREFIX_BELOW`, … (uppercase, for trait-like names).
fn victim_names(prefix: &str, upper: bool) -> Vec<String> {
    VICTIMS
        .iter()
        .map(|v| {
            if upper {
                format!("{prefix}_{}", v.label().to_uppercase())
            } else {
                format!("{prefix}-{}", v.label())
            }
        })
        .collect()
}

fn dt_steps() -> Value {
    json!([{"interface": "bios", "step": "apply_configuration",
            "args": {"settings": [{"name": "LogicalProc", "value": "Enabled"}]}, "priority": 150}])
}

fn rb_steps() -> Value {
    json!([{"interface": "bios", "step": "apply_configuration",
            "args": {"settings": [{"name": "LogicalProc", "value": "Enabled"}]}, "order": 1}])
}

fn rule_actions() -> Value {
    json!([{"op": "set-attribute", "args": ["/extra/rule", "yes"]}])
}

/// A rule body (`conditions` given: Ironic 39 answers 500 to a rule without them).
fn rule(description: &str) -> Value {
    json!({"description": description, "conditions": [], "actions": rule_actions()})
}

/// Target RAID configurations both servers must judge alike: the good one last (stored).
fn raid_configs() -> Vec<Value> {
    let disk = |extra: Value| {
        let mut d = json!({"raid_level": "1", "size_gb": 10});
        if let (Some(d), Some(e)) = (d.as_object_mut(), extra.as_object()) {
            d.extend(e.clone());
        }
        json!({"logical_disks": [d]})
    };
    vec![
        json!({"logical_disks": []}),
        json!({"volumes": []}),
        disk(json!({"raid_level": "7"})),
        disk(json!({"size_gb": -1})),
        disk(json!({"size_gb": "max"})),
        disk(json!({"colour": "blue"})),
        disk(json!({"disk_type": "nvme"})),
        disk(json!({"number_of_physical_disks": 0})),
        disk(json!({"physical_disks": ["sda", "sdb"]})),
        json!({"logical_disks": [
            {"raid_level": "1", "size_gb": 10, "is_root_volume": true},
            {"raid_level": "0", "size_gb": "MAX", "is_root_volume": true}
        ]}),
        json!({"logical_disks": [
            {"raid_level": "1", "size_gb": 10, "is_root_volume": true, "controller": "software",
             "physical_disks": [{"size": ">= 10"}, {"size": ">= 10"}]},
            {"raid_level": "0", "size_gb": "MAX"}
        ]}),
    ]
}

/// The objects every route works on, created the same way on both servers.
fn setup() -> Vec<Step> {
    let mut s = vec![Step::Create(
        "chassis:c1".into(),
        "/v1/chassis",
        json!({"description": "c1"}),
    )];
    for n in victim_names("cdel", false) {
        s.push(Step::Create(
            format!("chassis:{n}"),
            "/v1/chassis",
            json!({"description": n}),
        ));
    }
    let node = |name: &str, extra: Value| {
        let mut body = json!({"driver": "fake-hardware", "name": name});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        Step::Create(format!("node:{name}"), "/v1/nodes", body)
    };
    s.push(node(
        "n1",
        json!({"chassis_uuid": "{chassis:c1}", "shard": "s1", "resource_class": "rc-n1",
               "description": "the main node"}),
    ));
    s.push(node("nact", json!({})));
    // RAID: the agent RAID interface (Metal3 creates nodes with it) and no RAID at all.
    s.push(node("nraid", json!({"raid_interface": "agent"})));
    s.push(node("nnoraid", json!({"raid_interface": "no-raid"})));
    s.push(node("nprov", json!({"inspect_interface": "fake"})));
    s.push(node("nhist", json!({})));
    s.push(node("nalloc", json!({"resource_class": "rc-a"})));
    s.push(node("nchild", json!({"parent_node": "n1"})));
    for n in victim_names("ndel", false) {
        s.push(node(&n, json!({})));
    }
    s.push(Step::Create(
        "port:p1".into(),
        "/v1/ports",
        json!({"node_uuid": "{node:n1}", "address": "52:54:00:00:01:01", "name": "p1"}),
    ));
    for (i, n) in victim_names("pdel", false).into_iter().enumerate() {
        s.push(Step::Create(
            format!("port:{n}"),
            "/v1/ports",
            json!({"node_uuid": "{node:n1}", "address": format!("52:54:00:00:02:0{i}"), "name": n}),
        ));
    }
    // nact: a free port for each VIF the table attaches (Rivet records VIFs on ports).
    for i in 1..=5 {
        s.push(Step::Create(
            format!("port:pnact{i}"),
            "/v1/ports",
            json!({"node_uuid": "{node:nact}", "address": format!("52:54:00:00:0a:0{i}"),
                   "name": format!("pnact{i}")}),
        ));
    }
    s.push(Step::Create(
        "portgroup:pg1".into(),
        "/v1/portgroups",
        json!({"node_uuid": "{node:n1}", "address": "52:54:00:00:03:01", "name": "pg1"}),
    ));
    for n in victim_names("pgdel", false) {
        s.push(Step::Create(
            format!("portgroup:{n}"),
            "/v1/portgroups",
            json!({"node_uuid": "{node:n1}", "name": n}),
        ));
    }
    for n in std::iter::once("CUSTOM_DT1".to_string()).chain(victim_names("CUSTOM_DTDEL", true)) {
        s.push(Step::Create(
            format!("dt:{n}"),
            "/v1/deploy_templates",
            json!({"name": n, "steps": dt_steps()}),
        ));
    }
    for n in std::iter::once("CUSTOM_RB1".to_string()).chain(victim_names("CUSTOM_RBDEL", true)) {
        s.push(Step::Create(
            format!("rb:{n}"),
            "/v1/runbooks",
            json!({"name": n, "steps": rb_steps()}),
        ));
    }
    for n in std::iter::once("vc1".to_string()).chain(victim_names("vcdel", false)) {
        s.push(Step::Create(
            format!("vc:{n}"),
            "/v1/volume/connectors",
            json!({"node_uuid": "{node:n1}", "type": "iqn",
                   "connector_id": format!("iqn.2026-01.org.test:{n}")}),
        ));
    }
    for (i, n) in std::iter::once("vt1".to_string())
        .chain(victim_names("vtdel", false))
        .enumerate()
    {
        s.push(Step::Create(
            format!("vt:{n}"),
            "/v1/volume/targets",
            json!({"node_uuid": "{node:n1}", "volume_type": "iscsi", "boot_index": 20 + i,
                   "volume_id": format!("vol-{n}")}),
        ));
    }
    for n in std::iter::once("r1".to_string()).chain(victim_names("rdel", false)) {
        s.push(Step::Create(
            format!("rule:{n}"),
            "/v1/inspection_rules",
            rule(&n),
        ));
    }
    // navail: available, to be deleted there (Ironic's allow_deleting_available_nodes).
    s.push(node("navail", json!({})));
    for target in ["manage", "provide"] {
        s.push(Step::Call(
            "PUT",
            "/v1/nodes/{node:navail}/states/provision".into(),
            Some(json!({"target": target})),
        ));
        s.push(Step::Settle("navail"));
    }
    // nalloc: available with a known power state (Ironic allocates no node whose power
    // state is unknown), then allocated to a1.
    for target in ["manage", "provide"] {
        s.push(Step::Call(
            "PUT",
            "/v1/nodes/{node:nalloc}/states/provision".into(),
            Some(json!({"target": target})),
        ));
        s.push(Step::Settle("nalloc"));
    }
    s.push(Step::Call(
        "PUT",
        "/v1/nodes/{node:nalloc}/states/power".into(),
        Some(json!({"target": "power off"})),
    ));
    // Ironic sets the target power state in its worker, after the 202: wait for the result.
    s.push(Step::WaitPower("nalloc", "power off"));
    s.push(Step::Settle("nalloc"));
    // nhist: a manual cleaning with a step nobody has fails, which both record in the
    // node's history (Ironic records errors only).
    s.push(Step::Call(
        "PUT",
        "/v1/nodes/{node:nhist}/states/provision".into(),
        Some(json!({"target": "manage"})),
    ));
    s.push(Step::Settle("nhist"));
    s.push(fixed(
        "PUT",
        "/v1/nodes/{node:nhist}/states/provision",
        Some(json!({"target": "clean",
                    "clean_steps": [{"interface": "deploy", "step": "no_such_step"}]})),
    ));
    s.push(Step::Settle("nhist"));
    s.push(Step::Create(
        "alloc:a1".into(),
        "/v1/allocations",
        json!({"name": "a1", "resource_class": "rc-a"}),
    ));
    s.push(Step::WaitFor(
        "/v1/allocations/{alloc:a1}".into(),
        "state",
        "active",
    ));
    for n in victim_names("adel", false) {
        s.push(Step::Create(
            format!("alloc:{n}"),
            "/v1/allocations",
            json!({"name": n, "resource_class": "rc-none"}),
        ));
    }
    s.push(Step::Capture(
        "event:h1".into(),
        "/v1/nodes/{node:nhist}/history".into(),
        "history",
    ));
    s.push(Step::Settle("nalloc"));
    s
}

/// Every route rivetd serves, with a request that works on it.
fn routes() -> Vec<Step> {
    let mut t: Vec<Step> = Vec::new();

    // Root and version documents.
    t.push(r("GET", "/", 1).into());
    t.push(r("GET", "/v1", 1).into());
    t.push(r("GET", "/v1/", 1).latest_only().into());

    // Nodes.
    t.push(r("GET", "/v1/nodes", 1).into());
    t.push(r("GET", "/v1/nodes/", 1).latest_only().into());
    t.push(
        r("POST", "/v1/nodes", 1)
            .body(json!({"driver": "fake-hardware"}))
            .into(),
    );
    t.push(r("GET", "/v1/nodes/detail", 1).into());
    t.push(r("GET", "/v1/nodes/{node:n1}", 1).into());
    t.push(
        r("PATCH", "/v1/nodes/{node:n1}", 1)
            .body(json!([{"op": "add", "path": "/extra/k_{v}", "value": "x"}]))
            .into(),
    );
    t.push(r("DELETE", "/v1/nodes/{node:ndel-{v}}", 1).into());
    t.push(r("GET", "/v1/nodes/{node:n1}/states", 1).into());
    t.push(r("GET", "/v1/nodes/{node:n1}/validate", 1).into());
    t.push(
        r("PUT", "/v1/nodes/{node:nact}/states/power", 1)
            .body(json!({"target": "power on"}))
            .settle("nact")
            .into(),
    );
    t.push(r("GET", "/v1/nodes/{node:nact}/states/console", 1).into());
    // The same resource by Ironic's other path (a client library asks for it this way).
    t.push(r("GET", "/v1/nodes/states/console/{node:nact}", 1).into());
    t.push(
        r("PUT", "/v1/nodes/{node:nact}/states/console", 1)
            .body(json!({"enabled": false}))
            .settle("nact")
            .into(),
    );
    t.push(
        r("PUT", "/v1/nodes/{node:nact}/maintenance", 1)
            .body(json!({"reason": "diff"}))
            .into(),
    );
    t.push(r("DELETE", "/v1/nodes/{node:nact}/maintenance", 1).into());
    t.push(r("GET", "/v1/nodes/{node:nact}/management/boot_device", 1).into());
    t.push(
        r("PUT", "/v1/nodes/{node:nact}/management/boot_device", 1)
            .body(json!({"boot_device": "pxe"}))
            .into(),
    );
    t.push(
        r(
            "GET",
            "/v1/nodes/{node:nact}/management/boot_device/supported",
            1,
        )
        .into(),
    );
    t.push(r("GET", "/v1/nodes/{node:n1}/vendor_passthru/methods", 1).into());
    t.push(
        r(
            "POST",
            "/v1/nodes/{node:n1}/vendor_passthru/first_method",
            1,
        )
        .body(json!({"bar": "baz"}))
        .into(),
    );
    t.push(
        r(
            "POST",
            "/v1/nodes/{node:n1}/vendor_passthru?method=first_method",
            1,
        )
        .body(json!({"bar": "baz"}))
        .into(),
    );
    t.push(r("GET", "/v1/nodes/{node:n1}/ports", 1).into());
    t.push(r("GET", "/v1/nodes/{node:n1}/ports/detail", 1).into());
    t.push(
        r("POST", "/v1/nodes/{node:n1}/ports", 1)
            .body(json!({"address": "52:54:00:00:09:0{vi}"}))
            .into(),
    );
    t.push(r("GET", "/v1/nodes/{node:n1}/portgroups", 24).into());
    t.push(r("GET", "/v1/nodes/{node:n1}/portgroups/detail", 24).into());
    t.push(
        r("POST", "/v1/nodes/{node:n1}/portgroups", 24)
            .body(json!({"name": "pgsub-{v}"}))
            .into(),
    );
    t.push(
        r("PUT", "/v1/nodes/{node:nact}/states/raid", 12)
            .body(json!({
                "logical_disks": [{"size_gb": 10, "raid_level": "1", "is_root_volume": true}]
            }))
            .into(),
    );
    t.push(
        r("POST", "/v1/nodes/{node:nact}/vifs", 28)
            .body(json!({"id": "vif-{v}"}))
            .into(),
    );
    t.push(r("GET", "/v1/nodes/{node:nact}/vifs", 28).into());
    t.push(r("DELETE", "/v1/nodes/{node:nact}/vifs/vif-{v}", 28).into());
    t.push(
        r("PUT", "/v1/nodes/{node:nact}/management/inject_nmi", 29)
            .body(json!({}))
            .into(),
    );
    t.push(r("GET", "/v1/nodes/{node:n1}/volume", 32).into());
    t.push(r("GET", "/v1/nodes/{node:n1}/volume/connectors", 32).into());
    t.push(r("GET", "/v1/nodes/{node:n1}/volume/targets", 32).into());
    t.push(
        r("POST", "/v1/nodes/{node:n1}/volume/connectors", 32)
            .body(json!({"type": "iqn", "connector_id": "iqn.2026-01.org.test:sub-{v}"}))
            .into(),
    );
    t.push(
        r("POST", "/v1/nodes/{node:n1}/volume/targets", 32)
            .body(json!({"volume_type": "iscsi", "boot_index": "{vi}", "volume_id": "vol-sub-{v}"}))
            .into(),
    );
    t.push(r("GET", "/v1/nodes/{node:n1}/traits", 37).into());
    t.push(
        r("PUT", "/v1/nodes/{node:nact}/traits", 37)
            .body(json!({"traits": ["CUSTOM_A"]}))
            .into(),
    );
    t.push(r("PUT", "/v1/nodes/{node:nact}/traits/CUSTOM_{V}", 37).into());
    t.push(r("DELETE", "/v1/nodes/{node:nact}/traits/CUSTOM_{V}", 37).into());
    t.push(r("DELETE", "/v1/nodes/{node:nact}/traits", 37).into());
    t.push(r("GET", "/v1/nodes/{node:n1}/bios", 40).into());
    t.push(r("GET", "/v1/nodes/{node:n1}/bios/no_such_setting", 40).into());
    t.push(r("GET", "/v1/nodes/{node:nalloc}/allocation", 52).into());
    t.push(r("GET", "/v1/nodes/{node:nact}/management/indicators", 63).into());
    t.push(
        r(
            "GET",
            "/v1/nodes/{node:nact}/management/indicators/led@system",
            63,
        )
        .into(),
    );
    t.push(
        r(
            "PUT",
            "/v1/nodes/{node:nact}/management/indicators/led@system",
            63,
        )
        .body(json!({"state": "ON"}))
        .into(),
    );
    t.push(
        r("PUT", "/v1/nodes/{node:nact}/states/boot_mode", 76)
            .body(json!({"target": "uefi"}))
            .settle("nact")
            .into(),
    );
    t.push(
        r("PUT", "/v1/nodes/{node:nact}/states/secure_boot", 76)
            .body(json!({"target": true}))
            .settle("nact")
            .into(),
    );
    t.push(r("GET", "/v1/nodes/{node:nhist}/history", 78).into());
    t.push(r("GET", "/v1/nodes/{node:nhist}/history/{event:h1}", 78).into());
    t.push(r("GET", "/v1/nodes/{node:n1}/inventory", 81).into());
    t.push(r("GET", "/v1/nodes/{node:n1}/children", 83).into());
    t.push(r("GET", "/v1/nodes/{node:n1}/firmware", 86).into());
    t.push(
        r("POST", "/v1/nodes/{node:nact}/vmedia", 89)
            .body(json!({"device_type": "cdrom", "image_url": "http://127.0.0.1:9/x.iso"}))
            .into(),
    );
    t.push(r("GET", "/v1/nodes/{node:nact}/vmedia", 93).into());
    t.push(r("DELETE", "/v1/nodes/{node:nact}/vmedia", 89).into());
    t.push(r("DELETE", "/v1/nodes/{node:nact}/vmedia/cdrom", 89).into());
    t.push(r("DELETE", "/v1/nodes/{node:nprov}/provision", 1).into());
    t.push(
        r("GET", "/v1/nodes/{node:n1}/clean_steps", 1)
            .latest_only()
            .into(),
    );
    t.push(r("GET", "/v1/nodes/{node:n1}/logs", 1).latest_only().into());
    t.push(
        r("GET", "/v1/nodes/{node:n1}/logs/1", 1)
            .latest_only()
            .into(),
    );

    // Provisioning: the route's variants (manage), then a walk through the verbs.
    t.push(
        r("PUT", "/v1/nodes/{node:nprov}/states/provision", 1)
            .body(json!({"target": "manage"}))
            .settle("nprov")
            .into(),
    );
    t.extend(provision("nprov", json!({"target": "provide"})));
    t.push(fixed(
        "PATCH",
        "/v1/nodes/{node:nprov}",
        Some(json!([{"op": "add", "path": "/instance_info/image_source",
                     "value": "http://127.0.0.1:9/image.qcow2"}])),
    ));
    t.extend(provision("nprov", json!({"target": "active"})));
    t.extend(provision("nprov", json!({"target": "rebuild"})));
    t.extend(provision(
        "nprov",
        json!({"target": "rescue", "rescue_password": "secret"}),
    ));
    t.extend(provision("nprov", json!({"target": "unrescue"})));
    t.extend(provision("nprov", json!({"target": "deleted"})));
    t.extend(provision("nprov", json!({"target": "manage"})));
    t.extend(provision("nprov", json!({"target": "inspect"})));
    // Adoption needs the image the instance came from (tear-down cleared it).
    t.push(fixed(
        "PATCH",
        "/v1/nodes/{node:nprov}",
        Some(json!([{"op": "add", "path": "/instance_info/image_source",
                     "value": "http://127.0.0.1:9/image.qcow2"}])),
    ));
    t.extend(provision("nprov", json!({"target": "adopt"})));
    t.extend(provision(
        "nprov",
        json!({"target": "service", "service_steps": [{"interface": "power", "step": "power_on"}]}),
    ));
    // Nothing holds (Ironic's fake deploy interface has no `deploy.hold` and drops it, so
    // hold steps are not comparable here): unhold is refused in active and manageable.
    t.extend(provision("nprov", json!({"target": "unhold"})));
    t.extend(provision("nprov", json!({"target": "undeploy"})));
    t.extend(provision("nprov", json!({"target": "manage"})));
    t.extend(provision(
        "nprov",
        json!({"target": "clean", "clean_steps": [{"interface": "power", "step": "power_on"}]}),
    ));
    t.extend(provision("nprov", json!({"target": "unhold"})));
    t.extend(provision("nprov", json!({"target": "provide"})));
    t.extend(provision("nprov", json!({"target": "bogus"})));
    t.extend(provision("nprov", json!({"target": "abort"})));

    // Ports.
    t.push(r("GET", "/v1/ports", 1).into());
    t.push(r("GET", "/v1/ports/", 1).latest_only().into());
    t.push(
        r("POST", "/v1/ports", 1)
            .body(json!({"node_uuid": "{node:n1}", "address": "52:54:00:00:04:0{vi}"}))
            .into(),
    );
    t.push(r("GET", "/v1/ports/detail", 1).into());
    t.push(r("GET", "/v1/ports/{port:p1}", 1).into());
    t.push(
        r("PATCH", "/v1/ports/{port:p1}", 1)
            .body(json!([{"op": "add", "path": "/extra/k_{v}", "value": "x"}]))
            .into(),
    );
    t.push(r("DELETE", "/v1/ports/{port:pdel-{v}}", 1).into());

    // Port groups.
    t.push(r("GET", "/v1/portgroups", 23).into());
    t.push(r("GET", "/v1/portgroups/", 23).latest_only().into());
    t.push(
        r("POST", "/v1/portgroups", 23)
            .body(json!({"node_uuid": "{node:n1}", "name": "pgc-{v}"}))
            .into(),
    );
    t.push(r("GET", "/v1/portgroups/detail", 23).into());
    t.push(r("GET", "/v1/portgroups/{portgroup:pg1}", 23).into());
    t.push(
        r("PATCH", "/v1/portgroups/{portgroup:pg1}", 23)
            .body(json!([{"op": "add", "path": "/extra/k_{v}", "value": "x"}]))
            .into(),
    );
    t.push(r("DELETE", "/v1/portgroups/{portgroup:pgdel-{v}}", 23).into());
    t.push(r("GET", "/v1/portgroups/{portgroup:pg1}/ports", 24).into());
    t.push(r("GET", "/v1/portgroups/{portgroup:pg1}/ports/detail", 24).into());
    t.push(
        r("POST", "/v1/portgroups/{portgroup:pg1}/ports", 24)
            .body(json!({"node_uuid": "{node:n1}", "address": "52:54:00:00:05:0{vi}"}))
            .into(),
    );

    // Chassis.
    t.push(r("GET", "/v1/chassis", 1).into());
    t.push(r("GET", "/v1/chassis/", 1).latest_only().into());
    t.push(
        r("POST", "/v1/chassis", 1)
            .body(json!({"description": "cc-{v}"}))
            .into(),
    );
    t.push(r("GET", "/v1/chassis/detail", 1).into());
    t.push(r("GET", "/v1/chassis/{chassis:c1}", 1).into());
    t.push(
        r("PATCH", "/v1/chassis/{chassis:c1}", 1)
            .body(json!([{"op": "add", "path": "/extra/k_{v}", "value": "x"}]))
            .into(),
    );
    t.push(r("DELETE", "/v1/chassis/{chassis:cdel-{v}}", 1).into());
    t.push(r("GET", "/v1/chassis/{chassis:c1}/nodes", 1).into());
    t.push(r("GET", "/v1/chassis/{chassis:c1}/nodes/detail", 1).into());
    t.push(r("DELETE", "/v1/chassis/{chassis:c1}/nodes", 1).into());

    // Drivers.
    t.push(r("GET", "/v1/drivers", 1).into());
    t.push(r("GET", "/v1/drivers/", 1).latest_only().into());
    t.push(r("GET", "/v1/drivers/fake-hardware", 1).into());
    t.push(r("GET", "/v1/drivers/fake-hardware/properties", 1).into());
    t.push(
        r(
            "GET",
            "/v1/drivers/fake-hardware/vendor_passthru/methods",
            1,
        )
        .into(),
    );
    t.push(
        r(
            "POST",
            "/v1/drivers/fake-hardware/vendor_passthru?method=first_method",
            1,
        )
        .body(json!({"bar": "baz"}))
        .into(),
    );
    t.push(
        r(
            "POST",
            "/v1/drivers/fake-hardware/vendor_passthru/first_method",
            1,
        )
        .body(json!({"bar": "baz"}))
        .into(),
    );
    t.push(
        r(
            "GET",
            "/v1/drivers/fake-hardware/raid/logical_disk_properties",
            12,
        )
        .into(),
    );
    for path in [
        "/v1/drivers/no-such-driver",
        "/v1/drivers/no-such-driver/properties",
        "/v1/drivers/no-such-driver/raid/logical_disk_properties",
    ] {
        t.push(fixed("GET", path, None));
    }

    // Conductors.
    t.push(r("GET", "/v1/conductors", 49).into());
    t.push(r("GET", "/v1/conductors/detail", 49).into());
    t.push(r("GET", "/v1/conductors/test-conductor", 49).into());
    t.push(fixed("GET", "/v1/conductors/no-such-host", None));

    // Allocations.
    t.push(r("GET", "/v1/allocations", 52).into());
    t.push(r("GET", "/v1/allocations/", 52).latest_only().into());
    t.push(
        r("POST", "/v1/allocations", 52)
            .body(json!({"name": "ac-{v}", "resource_class": "rc-none"}))
            .into(),
    );
    t.push(r("GET", "/v1/allocations/{alloc:a1}", 52).into());
    t.push(
        r("PATCH", "/v1/allocations/{alloc:a1}", 57)
            .body(json!([{"op": "add", "path": "/extra/k_{v}", "value": "x"}]))
            .into(),
    );
    t.push(r("DELETE", "/v1/allocations/{alloc:adel-{v}}", 52).into());

    // Events.
    t.push(
        r("POST", "/v1/events", 54)
            .body(json!({"events": [{
        "event": "network.bind_port", "port_id": MISSING,
        "mac_address": "52:54:00:00:01:01", "status": "ACTIVE"}]}))
            .into(),
    );

    // Deploy templates.
    t.push(r("GET", "/v1/deploy_templates", 55).into());
    t.push(r("GET", "/v1/deploy_templates/", 55).latest_only().into());
    t.push(
        r("POST", "/v1/deploy_templates", 55)
            .body(json!({"name": "CUSTOM_DTC_{V}", "steps": dt_steps()}))
            .into(),
    );
    t.push(r("GET", "/v1/deploy_templates/detail", 55).into());
    t.push(r("GET", "/v1/deploy_templates/{dt:CUSTOM_DT1}", 55).into());
    t.push(
        r("PATCH", "/v1/deploy_templates/{dt:CUSTOM_DT1}", 55)
            .body(json!([{"op": "add", "path": "/extra/k_{v}", "value": "x"}]))
            .into(),
    );
    t.push(r("DELETE", "/v1/deploy_templates/{dt:CUSTOM_DTDEL_{V}}", 55).into());

    // Runbooks.
    t.push(r("GET", "/v1/runbooks", 92).into());
    t.push(r("GET", "/v1/runbooks/", 92).latest_only().into());
    t.push(
        r("POST", "/v1/runbooks", 92)
            .body(json!({"name": "CUSTOM_RBC_{V}", "steps": rb_steps()}))
            .into(),
    );
    t.push(r("GET", "/v1/runbooks/detail", 92).into());
    t.push(r("GET", "/v1/runbooks/{rb:CUSTOM_RB1}", 92).into());
    t.push(
        r("PATCH", "/v1/runbooks/{rb:CUSTOM_RB1}", 92)
            .body(json!([{"op": "add", "path": "/extra/k_{v}", "value": "x"}]))
            .into(),
    );
    t.push(r("GET", "/v1/runbooks/{rb:CUSTOM_RB1}/traits", 112).into());
    t.push(
        r("PUT", "/v1/runbooks/{rb:CUSTOM_RB1}/traits", 112)
            .body(json!({"traits": ["CUSTOM_RB1", "CUSTOM_X"]}))
            .into(),
    );
    t.push(r("PUT", "/v1/runbooks/{rb:CUSTOM_RB1}/traits/CUSTOM_{V}", 112).into());
    t.push(
        r(
            "DELETE",
            "/v1/runbooks/{rb:CUSTOM_RB1}/traits/CUSTOM_{V}",
            112,
        )
        .into(),
    );
    t.push(r("DELETE", "/v1/runbooks/{rb:CUSTOM_RB1}/traits", 112).into());
    t.push(r("DELETE", "/v1/runbooks/{rb:CUSTOM_RBDEL_{V}}", 92).into());

    // Volume.
    t.push(r("GET", "/v1/volume", 32).into());
    t.push(r("GET", "/v1/volume/", 32).latest_only().into());
    t.push(r("GET", "/v1/volume/connectors", 32).into());
    t.push(r("GET", "/v1/volume/connectors/", 32).latest_only().into());
    t.push(
        r("POST", "/v1/volume/connectors", 32)
            .body(json!({
        "node_uuid": "{node:n1}", "type": "iqn", "connector_id": "iqn.2026-01.org.test:c-{v}"}))
            .into(),
    );
    t.push(r("GET", "/v1/volume/connectors/{vc:vc1}", 32).into());
    t.push(
        r("PATCH", "/v1/volume/connectors/{vc:vc1}", 32)
            .body(json!([{"op": "add", "path": "/extra/k_{v}", "value": "x"}]))
            .into(),
    );
    t.push(r("DELETE", "/v1/volume/connectors/{vc:vcdel-{v}}", 32).into());
    t.push(r("GET", "/v1/volume/targets", 32).into());
    t.push(r("GET", "/v1/volume/targets/", 32).latest_only().into());
    t.push(
        r("POST", "/v1/volume/targets", 32)
            .body(json!({
        "node_uuid": "{node:n1}", "volume_type": "iscsi", "boot_index": "{vi}",
        "volume_id": "vol-c-{v}"}))
            .into(),
    );
    t.push(r("GET", "/v1/volume/targets/{vt:vt1}", 32).into());
    t.push(
        r("PATCH", "/v1/volume/targets/{vt:vt1}", 32)
            .body(json!([{"op": "add", "path": "/extra/k_{v}", "value": "x"}]))
            .into(),
    );
    t.push(r("DELETE", "/v1/volume/targets/{vt:vtdel-{v}}", 32).into());

    // Shards.
    t.push(r("GET", "/v1/shards", 82).into());
    t.push(r("GET", "/v1/shards/s1", 82).into());

    // Inspection rules.
    t.push(r("GET", "/v1/inspection_rules", 96).into());
    t.push(r("GET", "/v1/inspection_rules/", 96).latest_only().into());
    t.push(
        r("POST", "/v1/inspection_rules", 96)
            .body(rule("rc-{v}"))
            .into(),
    );
    t.push(r("GET", "/v1/inspection_rules/{rule:r1}", 96).into());
    t.push(
        r("PATCH", "/v1/inspection_rules/{rule:r1}", 96)
            .body(json!([
                {"op": "replace", "path": "/description", "value": "r1-{v}"}
            ]))
            .into(),
    );
    t.push(r("DELETE", "/v1/inspection_rules/{rule:rdel-{v}}", 96).into());

    // IPA's ramdisk API (not served by Rivet on purpose) and Rivet's own routes.
    t.push(
        r("GET", "/v1/lookup?addresses=52:54:00:00:01:01", 22)
            .latest_only()
            .into(),
    );
    t.push(r("GET", "/v1/lookup", 22).latest_only().into());
    t.push(
        r("POST", "/v1/heartbeat/{node:n1}", 22)
            .body(json!({"callback_url": "http://127.0.0.1:9"}))
            .latest_only()
            .into(),
    );
    t.push(
        r("POST", "/v1/continue_inspection", 84)
            .body(json!({"inventory": {}}))
            .latest_only()
            .into(),
    );
    t.push(r("GET", "/v1/audit", 1).latest_only().into());
    t.push(r("GET", "/v1/openapi.json", 1).latest_only().into());
    t.push(r("GET", "/metrics", 1).latest_only().into());
    t.push(
        r("POST", "/agent/v1/lookup", 1)
            .body(json!({"addresses": ["52:54:00:00:01:01"]}))
            .latest_only()
            .into(),
    );
    t.push(
        r("POST", "/agent/v1/heartbeat/{node:n1}", 1)
            .body(json!({}))
            .latest_only()
            .into(),
    );
    t.push(
        r("POST", "/agent/v1/discover", 1)
            .body(json!({}))
            .latest_only()
            .into(),
    );
    t.push(r("GET", "/boot/ipxe", 1).latest_only().into());
    t.push(r("GET", "/boot/ipxe/{node:n1}", 1).latest_only().into());
    t.push(r("GET", "/boot/iso/none.iso", 1).latest_only().into());
    t.push(r("GET", "/boot/none.efi", 1).latest_only().into());

    // Lists with query parameters.
    for path in [
        "/v1/nodes?limit=1",
        "/v1/nodes?fields=uuid,name",
        "/v1/nodes?detail=true",
        "/v1/nodes?fields=bogus_field",
        "/v1/nodes?sort_key=bogus",
        "/v1/nodes?limit=-1",
        "/v1/nodes?provision_state=available",
        "/v1/nodes?include_children=true",
        "/v1/ports?limit=1",
        "/v1/ports?fields=uuid,address",
        "/v1/ports?node={node:n1}",
        "/v1/ports?address=52:54:00:00:01:01",
        "/v1/portgroups?node={node:n1}",
        "/v1/portgroups?limit=1",
        "/v1/chassis?limit=1",
        "/v1/allocations?node={node:nalloc}",
        "/v1/allocations?state=active",
        "/v1/allocations?node=0e4f6b8a-0000-4000-8000-00000000dead",
        "/v1/deploy_templates?limit=1",
        "/v1/runbooks?limit=1",
        "/v1/volume/connectors?node={node:n1}",
        "/v1/volume/targets?node={node:n1}",
        "/v1/inspection_rules?limit=1",
        "/v1/drivers?detail=true",
        "/v1/drivers?type=dynamic",
        "/v1/conductors?detail=true",
        "/v1/nodes/{node:n1}?fields=uuid,name",
        "/v1/nodes/no-such-name",
        "/v1/ports/no-such-port",
        "/v1/nonexistent",
    ] {
        t.push(fixed("GET", path, None));
    }
    // Headers and versions.
    t.push(Step::Fixed("GET", "/v1/nodes".into(), None, None));
    t.push(Step::Fixed(
        "GET",
        "/v1/nodes".into(),
        Some("1.latest"),
        None,
    ));
    t.push(Step::Fixed("GET", "/v1/nodes".into(), Some("1.999"), None));
    t.push(Step::Fixed("GET", "/v1/nodes".into(), Some("2.1"), None));
    t.push(Step::Fixed("GET", "/v1/nodes".into(), Some("1.0"), None));
    t.push(Step::Fixed("GET", "/v1/nodes".into(), Some("bogus"), None));
    // Malformed bodies.
    t.push(Step::Fixed(
        "POST",
        "/v1/nodes".into(),
        Some("latest"),
        Some(json!(["not", "an", "object"])),
    ));
    t.push(fixed("POST", "/v1/nodes", Some(json!({}))));
    t.push(fixed(
        "POST",
        "/v1/nodes",
        Some(json!({"driver": "no-such-driver"})),
    ));
    t.push(fixed(
        "POST",
        "/v1/ports",
        Some(json!({"node_uuid": "{node:n1}", "address": "52:54:00:00:01:01"})),
    ));
    t.push(fixed(
        "POST",
        "/v1/ports",
        Some(json!({"node_uuid": MISSING, "address": "52:54:00:00:07:01"})),
    ));
    t.push(fixed(
        "PATCH",
        "/v1/nodes/{node:n1}",
        Some(json!({"not": "a patch"})),
    ));
    t.push(fixed(
        "PATCH",
        "/v1/nodes/{node:n1}",
        Some(json!([{"op": "remove", "path": "/uuid"}])),
    ));

    // What clients written against Ironic trip over (each compared, values included).
    // Paths without /v1 (a .json suffix: edges.rs).
    for path in [
        "/nodes/detail?instance_uuid=0e4f6b8a-0000-4000-8000-00000000dead",
        "/nodes/{node:n1}",
        "/ports",
        // Query booleans as Python clients send them.
        "/v1/conductors?detail=True",
        "/v1/conductors?fields=hostname,alive",
        "/v1/conductors?limit=1",
        "/v1/conductors?sort_key=hostname&sort_dir=desc",
        "/v1/conductors?marker=test-conductor",
        "/v1/conductors?marker=no-such-conductor",
        "/v1/conductors?detail=true&fields=hostname",
        "/v1/nodes?maintenance=True",
        "/v1/nodes?detail=True",
        "/v1/nodes?associated=no",
        "/v1/ports?detail=yes",
        // A port or a port group by MAC: 400.
        "/v1/ports/52:54:00:00:01:01",
        "/v1/portgroups/52:54:00:00:03:01",
    ] {
        t.push(fixed("GET", path, None));
    }
    // Below 1.2 an available node reads NOSTATE; fields, filters and PATCH values newer than
    // the request are 406.
    for (path, version) in [
        ("/v1/nodes/{node:nalloc}", "1.1"),
        ("/v1/nodes/{node:nalloc}/states", "1.1"),
        ("/v1/nodes?fields=uuid,provision_state", "1.8"),
        ("/v1/nodes/{node:n1}?fields=traits", "1.36"),
        ("/v1/nodes/{node:n1}?fields=resource_class", "1.20"),
        ("/v1/nodes?resource_class=rc-n1", "1.20"),
        ("/v1/nodes?fault=power%20failure", "1.41"),
    ] {
        t.push(Step::Fixed("GET", path.into(), Some(version), None));
    }
    t.push(Step::Fixed(
        "PATCH",
        "/v1/nodes/{node:n1}".into(),
        Some("1.47"),
        Some(json!([{"op": "replace", "path": "/protected", "value": true}])),
    ));
    t.push(Step::Fixed(
        "PATCH",
        "/v1/nodes/{node:n1}".into(),
        Some("1.20"),
        Some(json!([{"op": "replace", "path": "/resource_class", "value": "x"}])),
    ));
    // Validation: resource_class at most 80 characters; maintenance by PATCH;
    // reset_interfaces only with a driver change, from 1.45.
    let long_rc = "r".repeat(81);
    t.push(fixed(
        "POST",
        "/v1/nodes",
        Some(json!({"driver": "fake-hardware", "resource_class": long_rc})),
    ));
    t.push(fixed(
        "PATCH",
        "/v1/nodes/{node:n1}",
        Some(json!([{"op": "replace", "path": "/resource_class", "value": long_rc}])),
    ));
    for value in [json!(true), json!("false")] {
        t.push(fixed(
            "PATCH",
            "/v1/nodes/{node:nact}",
            Some(json!([{"op": "replace", "path": "/maintenance", "value": value}])),
        ));
        t.push(fixed("GET", "/v1/nodes/{node:nact}", None));
    }
    t.push(fixed(
        "PATCH",
        "/v1/nodes/{node:n1}?reset_interfaces=true",
        Some(json!([{"op": "replace", "path": "/description", "value": "d"}])),
    ));
    t.push(Step::Fixed(
        "PATCH",
        "/v1/nodes/{node:n1}?reset_interfaces=true".into(),
        Some("1.44"),
        Some(json!([{"op": "replace", "path": "/driver", "value": "fake-hardware"}])),
    ));
    t.push(fixed(
        "PATCH",
        "/v1/nodes/{node:n1}?reset_interfaces=True",
        Some(json!([{"op": "replace", "path": "/driver", "value": "fake-hardware"}])),
    ));
    // Deleting an available node.
    t.push(fixed("DELETE", "/v1/nodes/{node:navail}", None));

    // RAID: Ironic's schema and root-volume rule through the agent RAID interface, `{}` on
    // no-raid (not validated, so stored), a configuration on no-raid (404), and the
    // interface chosen by PATCH.
    for cfg in raid_configs() {
        t.push(fixed(
            "PUT",
            "/v1/nodes/{node:nraid}/states/raid",
            Some(cfg),
        ));
    }
    t.push(fixed("GET", "/v1/nodes/{node:nraid}/states", None));
    t.push(fixed(
        "PUT",
        "/v1/nodes/{node:nnoraid}/states/raid",
        Some(json!({})),
    ));
    t.push(fixed(
        "PUT",
        "/v1/nodes/{node:nnoraid}/states/raid",
        Some(json!({"logical_disks": [{"raid_level": "1", "size_gb": 10}]})),
    ));
    for iface in ["agent", "no-raid", "no-such-raid"] {
        t.push(fixed(
            "PATCH",
            "/v1/nodes/{node:nnoraid}",
            Some(json!([{"op": "replace", "path": "/raid_interface", "value": iface}])),
        ));
    }

    t.extend(edges::requests());

    // Node allocation delete last: it frees nalloc.
    t.push(r("DELETE", "/v1/nodes/{node:nalloc}/allocation", 52).into());
    t.push(r("DELETE", "/v1/inspection_rules", 96).into());
    t
}

// ------------------------------------------------------------------------------ running

/// One server under test.
struct Peer {
    name: &'static str,
    url: String,
    ids: HashMap<String, String>,
    http: reqwest::blocking::Client,
}

/// An answer.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    body: Option<Value>,
    text: String,
}

impl Peer {
    fn new(name: &'static str, url: &str) -> Result<Peer> {
        Ok(Peer {
            name,
            url: url.to_string(),
            ids: HashMap::new(),
            http: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()?,
        })
    }

    /// `{kind:label}` replaced by this server's UUID of the object (an object it does not
    /// have: [`MISSING`]).
    fn resolve(&self, s: &str) -> String {
        let mut out = String::new();
        let mut rest = s;
        while let Some((start, end, key)) = placeholder(rest) {
            out.push_str(&rest[..start]);
            out.push_str(self.ids.get(key).map_or(MISSING, String::as_str));
            rest = &rest[end..];
        }
        out.push_str(rest);
        out
    }

    fn resolve_value(&self, v: &Value) -> Value {
        match v {
            Value::String(s) => Value::String(self.resolve(s)),
            Value::Array(a) => Value::Array(a.iter().map(|x| self.resolve_value(x)).collect()),
            Value::Object(o) => Value::Object(
                o.iter()
                    .map(|(k, x)| (k.clone(), self.resolve_value(x)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    fn send(
        &self,
        method: &str,
        path: &str,
        version: Option<&str>,
        body: Option<&Value>,
    ) -> Result<Answer> {
        let path = self.resolve(path);
        let m = reqwest::Method::from_bytes(method.as_bytes())?;
        let mut req = self.http.request(m, format!("{}{path}", self.url));
        if let Some(v) = version {
            req = req.header("X-OpenStack-Ironic-API-Version", v);
        }
        if let Some(b) = body {
            req = req.json(&self.resolve_value(b));
        }
        // A read is sent again once if the connection closed under it: Ironic's server
        // drops a kept-alive connection after some of its 500s, and the pool may reuse it.
        let retry = (method == "GET").then(|| req.try_clone()).flatten();
        let resp = match (req.send(), retry) {
            (Err(e), Some(again)) if e.is_request() => {
                std::thread::sleep(Duration::from_millis(200));
                again.send()
            }
            (r, _) => r,
        }
        .with_context(|| format!("{} {method} {path}", self.name))?;
        let status = resp.status().as_u16();
        let text = resp.text().unwrap_or_default();
        let body = serde_json::from_str(&text).ok();
        Ok(Answer { status, body, text })
    }

    /// Wait (up to 20 s) until `node`'s power state is `want`.
    fn wait_power(&self, node: &str, want: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let path = format!("/v1/nodes/{{node:{node}}}");
        while Instant::now() < deadline {
            let a = self.send("GET", &path, Some("latest"), None)?;
            if a.body.as_ref().is_some_and(|v| v["power_state"] == want) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("{}: node {node} did not reach {want}", self.name);
        Ok(())
    }

    /// Wait until `node` has no target state and no lock, or rests in a wait state (which
    /// only an agent would leave); its provision state then (`None`: still moving after 20 s).
    fn settle(&self, node: &str) -> Result<Option<String>> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let transitional = [
            "cleaning",
            "deploying",
            "deleting",
            "inspecting",
            "rescuing",
            "unrescuing",
            "verifying",
            "adopting",
            "rebuilding",
            "servicing",
            "unholding",
        ];
        loop {
            let a = self.send(
                "GET",
                &format!("/v1/nodes/{{node:{node}}}"),
                Some("latest"),
                None,
            )?;
            let v = a.body.unwrap_or(Value::Null);
            let state = v["provision_state"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            // Rests there until an agent or a user acts (Ironic keeps a target in some).
            let waiting = state.ends_with(" wait")
                || state.ends_with(" failed")
                || state.ends_with(" hold")
                || state == "wait call-back"
                || state == "error";
            let still = !v["target_provision_state"].is_null()
                || !v["target_power_state"].is_null()
                || !v["reservation"].is_null()
                || transitional.contains(&state.as_str());
            if waiting || !still {
                return Ok(Some(state));
            }
            if Instant::now() > deadline {
                eprintln!("{}: node {node} did not settle: {v}", self.name);
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The first `{kind:label}` in `s` (labels may not contain braces): start, end, key.
fn placeholder(s: &str) -> Option<(usize, usize, &str)> {
    let mut from = 0;
    while let Some(i) = s[from..].find('{') {
        let start = from + i;
        let end = start + s[start..].find('}')?;
        let key = &s[start + 1..end];
        if key.contains(':') && !key.contains('{') {
            return Some((start, end + 1, key));
        }
        from = start + 1;
    }
    None
}

/// `{v}`, `{V}` and `{vi}` of a variant substituted in `s`.
fn subst_variant(s: &str, v: Variant) -> String {
    s.replace("{v}", v.label())
        .replace("{V}", &v.label().to_uppercase())
        .replace("{vi}", &v.index().to_string())
}

fn subst_variant_value(value: &Value, v: Variant) -> Value {
    match value {
        // A whole-string `{vi}` is a number.
        Value::String(s) if s == "{vi}" => json!(v.index()),
        Value::String(s) => Value::String(subst_variant(s, v)),
        Value::Array(a) => Value::Array(a.iter().map(|x| subst_variant_value(x, v)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| (k.clone(), subst_variant_value(x, v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Kinds of object that have names (found by name as by UUID).
const NAMED: &[&str] = &["node", "port", "portgroup", "dt", "rb", "alloc"];

/// One concrete request.
#[derive(Debug, Clone)]
struct Request {
    route: String,
    variant: Variant,
    method: &'static str,
    path: String,
    version: Option<String>,
    body: Option<Value>,
}

impl Request {
    fn label(&self) -> String {
        format!(
            "{} {} @{} [{}]",
            self.method,
            self.path,
            self.version.as_deref().unwrap_or("(none)"),
            self.variant.label()
        )
    }
}

/// The variants of a route, in the order they are sent: the ones that should change nothing
/// first, then the happy ones.
fn expand(route: &Route) -> Vec<Request> {
    let key = format!("{} {}", route.method, route.path);
    let mut out = Vec::new();
    let mut push = |variant: Variant, version: String, path: String, body: Option<Value>| {
        out.push(Request {
            route: key.clone(),
            variant,
            method: route.method,
            path,
            version: Some(version),
            body,
        })
    };
    let body_for = |v: Variant| route.body.as_ref().map(|b| subst_variant_value(b, v));
    if route.latest_only {
        push(
            Variant::Latest,
            "latest".into(),
            subst_variant(route.path, Variant::Latest),
            body_for(Variant::Latest),
        );
        return out;
    }
    let has_body = matches!(route.method, "POST" | "PUT" | "PATCH") && route.body.is_some();
    if has_body {
        let v = Variant::Unknown;
        let body = match body_for(v) {
            Some(Value::Object(mut o)) => {
                o.insert("rivet_diff_unknown".into(), json!("x"));
                Some(Value::Object(o))
            }
            // A JSON patch: a field nobody has.
            Some(Value::Array(_)) => Some(json!([
                {"op": "add", "path": "/rivet_diff_unknown", "value": "x"}
            ])),
            other => other,
        };
        push(v, "latest".into(), subst_variant(route.path, v), body);
    }
    // The first object of the path, with the variant's own substitution.
    let replace_first = |v: Variant, with: Option<&str>| -> Option<String> {
        let path = subst_variant(route.path, v);
        let (s, e, k) = placeholder(&path)?;
        let ident = match with {
            Some(ident) => ident.to_string(),
            None => {
                let (kind, label) = k.split_once(':')?;
                if !NAMED.contains(&kind) {
                    return None;
                }
                label.to_string()
            }
        };
        Some(format!("{}{ident}{}", &path[..s], &path[e..]))
    };
    for (v, ident) in [(Variant::Missing, MISSING), (Variant::Malformed, MALFORMED)] {
        if let Some(path) = replace_first(v, Some(ident)) {
            push(v, "latest".into(), path, body_for(v));
        }
    }
    if route.min > 1 {
        let v = Variant::Below;
        push(
            v,
            format!("1.{}", route.min - 1),
            subst_variant(route.path, v),
            body_for(v),
        );
    }
    push(
        Variant::Min,
        format!("1.{}", route.min),
        subst_variant(route.path, Variant::Min),
        body_for(Variant::Min),
    );
    push(
        Variant::Latest,
        "latest".into(),
        subst_variant(route.path, Variant::Latest),
        body_for(Variant::Latest),
    );
    if let Some(path) = replace_first(Variant::Name, None) {
        push(
            Variant::Name,
            "latest".into(),
            path,
            body_for(Variant::Name),
        );
    }
    out
}

// ------------------------------------------------------------------------------ comparing

/// What kind of difference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Setup,
    State,
    Status,
    ErrorBody,
    BodyShape,
    Keys,
    Values,
}

impl Kind {
    fn title(self) -> &'static str {
        match self {
            Kind::Setup => "setup requests that did not succeed on both",
            Kind::State => "provision state reached differs",
            Kind::Status => "status code differs",
            Kind::ErrorBody => "error body without error_message",
            Kind::BodyShape => "body shape differs (JSON vs empty/other)",
            Kind::Keys => "JSON keys differ",
            Kind::Values => "values differ (states, flags, timestamp formats)",
        }
    }
}

#[derive(Debug, Clone)]
struct Diff {
    kind: Kind,
    route: String,
    request: String,
    detail: String,
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

/// The error's text for the report (`faultstring` inside `error_message`, or the raw body).
fn error_text(a: &Answer) -> String {
    let f = a.body.as_ref().map(rivet_tests::fault).unwrap_or_default();
    let s = if f.is_empty() { a.text.clone() } else { f };
    s.chars().take(160).collect::<String>().replace('\n', " ")
}

fn compare(req: &Request, ironic: &Answer, rivet: &Answer) -> Vec<Diff> {
    let mut diffs = Vec::new();
    let mut push = |kind: Kind, detail: String| {
        diffs.push(Diff {
            kind,
            route: req.route.clone(),
            request: req.label(),
            detail,
        })
    };
    if ironic.status != rivet.status {
        let side = |a: &Answer| {
            if a.status >= 400 {
                format!("{} ({})", a.status, error_text(a))
            } else {
                format!(
                    "{} {:?}",
                    a.status,
                    keys(a.body.as_ref().unwrap_or(&Value::Null))
                )
            }
        };
        push(
            Kind::Status,
            format!("Ironic {} | Rivet {}", side(ironic), side(rivet)),
        );
        return diffs;
    }
    if ironic.status >= 400 {
        let has = |a: &Answer| {
            a.body
                .as_ref()
                .is_some_and(|b| b.get("error_message").is_some())
        };
        if has(ironic) && !has(rivet) {
            push(
                Kind::ErrorBody,
                format!(
                    "{}: Rivet's body has no error_message: {}",
                    rivet.status,
                    rivet.text.chars().take(160).collect::<String>()
                ),
            );
        }
        return diffs;
    }
    match (&ironic.body, &rivet.body) {
        (Some(i), Some(rv)) => {
            if i.is_object() != rv.is_object() {
                push(
                    Kind::BodyShape,
                    format!("Ironic {} | Rivet {}", shape(i), shape(rv)),
                );
                return diffs;
            }
            let mut only_i = Vec::new();
            let mut only_r = Vec::new();
            diff_keys("", i, rv, &mut only_i, &mut only_r);
            if let (Some(io), Some(ro)) = (i.as_object(), rv.as_object()) {
                for (k, iv) in io {
                    let (Some(ia), Some(ra)) = (iv.as_array(), ro.get(k).and_then(Value::as_array))
                    else {
                        continue;
                    };
                    match (ia.first(), ra.first()) {
                        (Some(ie), Some(re)) if ie.is_object() && re.is_object() => {
                            diff_keys(&format!("{k}[0]."), ie, re, &mut only_i, &mut only_r);
                        }
                        (Some(ie), None) if ie.is_object() => {
                            only_i.push(format!("{k}[0] (Rivet's list is empty)"));
                        }
                        (None, Some(re)) if re.is_object() => {
                            only_r.push(format!("{k}[0] (Ironic's list is empty)"));
                        }
                        _ => {}
                    }
                }
            }
            if !only_i.is_empty() || !only_r.is_empty() {
                push(
                    Kind::Keys,
                    format!("only Ironic: {only_i:?} | only Rivet: {only_r:?}"),
                );
            }
            // Values both servers must agree on, in the document or its first list item.
            let mut values = Vec::new();
            diff_values("", i, rv, &mut values);
            if let (Some(io), Some(ro)) = (i.as_object(), rv.as_object()) {
                for (k, iv) in io {
                    if let (Some(ie), Some(re)) = (
                        iv.as_array().and_then(|a| a.first()),
                        ro.get(k).and_then(Value::as_array).and_then(|a| a.first()),
                    ) {
                        diff_values(&format!("{k}[0]."), ie, re, &mut values);
                    }
                }
            }
            if !values.is_empty() {
                push(Kind::Values, values.join("; "));
            }
        }
        (None, None) => {
            // Both not JSON (204, text): the status is the comparison.
        }
        (i, rv) => push(
            Kind::BodyShape,
            format!(
                "Ironic {} | Rivet {}",
                i.as_ref().map_or(describe_text(&ironic.text), shape),
                rv.as_ref().map_or(describe_text(&rivet.text), shape)
            ),
        ),
    }
    diffs
}

fn shape(v: &Value) -> String {
    match v {
        Value::Object(o) => format!("object {:?}", o.keys().collect::<Vec<_>>()),
        Value::Array(a) => format!("array of {}", a.len()),
        other => format!("{other}"),
    }
}

fn describe_text(t: &str) -> String {
    if t.is_empty() {
        "empty body".into()
    } else {
        format!("text {:?}", t.chars().take(60).collect::<String>())
    }
}

fn diff_keys(
    prefix: &str,
    i: &Value,
    r: &Value,
    only_i: &mut Vec<String>,
    only_r: &mut Vec<String>,
) {
    let (ki, kr) = (keys(i), keys(r));
    only_i.extend(ki.difference(&kr).map(|k| format!("{prefix}{k}")));
    only_r.extend(kr.difference(&ki).map(|k| format!("{prefix}{k}")));
}

/// Fields whose values are the same on both servers after the same requests: the states a
/// client reads (NOSTATE below 1.2 included) and the flags it set.
const SAME_VALUE: &[&str] = &[
    "provision_state",
    "target_provision_state",
    "maintenance",
    "maintenance_reason",
    "console_enabled",
    "resource_class",
    "retired",
    "protected",
];

/// A timestamp's shape: digits as `d` (`dddd-dd-ddTdd:dd:dd.dddddd+dd:dd`), so that the
/// format, not the time, is compared.
fn time_shape(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_digit() { 'd' } else { c })
        .collect()
}

/// Differences of [`SAME_VALUE`] fields and of timestamp formats (`*_at`) between two
/// documents, one line each.
fn diff_values(prefix: &str, i: &Value, r: &Value, out: &mut Vec<String>) {
    let (Some(io), Some(ro)) = (i.as_object(), r.as_object()) else {
        return;
    };
    for (k, iv) in io {
        let Some(rv) = ro.get(k) else { continue };
        if SAME_VALUE.contains(&k.as_str()) && iv != rv {
            out.push(format!("{prefix}{k}: Ironic {iv} | Rivet {rv}"));
        }
        if let (true, Some(it), Some(rt)) = (k.ends_with("_at"), iv.as_str(), rv.as_str()) {
            // A zero fraction is left out by both (isoformat): compare only when both have one
            // or neither.
            if it.contains('.') == rt.contains('.') && time_shape(it) != time_shape(rt) {
                out.push(format!("{prefix}{k} format: Ironic {it} | Rivet {rt}"));
            }
        }
    }
}

fn allowed(d: &Diff) -> Option<&'static str> {
    let (method, path) = d.route.split_once(' ').unwrap_or_default();
    let text = format!("{} {}", d.request, d.detail);
    ALLOWED
        .iter()
        .find(|(m, p, want, _)| {
            (*m == "*" || *m == method) && (*p == "*" || *p == path) && text.contains(want)
        })
        .map(|(_, _, _, why)| *why)
}

// ------------------------------------------------------------------------------ the test

#[test]
fn rivet_answers_as_ironic_does() -> Result<()> {
    if !ironic_peer::available() {
        return Ok(());
    }
    let started = Instant::now();
    let ironic = Ironic::start_with(CONDUCTOR, "")?;
    let dir = tempfile::tempdir()?;
    let rivetd = Rivetd::start_in(
        dir.path(),
        "[conductor]\ncheck_interval_s = 1\nautomated_clean = false\n",
    )?;
    eprintln!(
        "ironic {} at {} and rivetd at {} up in {:?}",
        ironic_peer::IRONIC_VERSION,
        ironic.url,
        rivetd.url,
        started.elapsed()
    );
    let mut peers = [
        Peer::new("ironic", &ironic.url)?,
        Peer::new("rivet", &rivetd.url)?,
    ];
    let mut diffs: Vec<Diff> = Vec::new();
    let mut sent = 0usize;
    let steps: Vec<Step> = setup()
        .into_iter()
        .chain(edges::setup())
        .chain(routes())
        .collect();
    for step in &steps {
        match step {
            Step::Create(key, path, body) | Step::CreateAt(key, path, _, body) => {
                let version = match step {
                    Step::CreateAt(_, _, v, _) => v,
                    _ => "latest",
                };
                let mut answers = Vec::new();
                for p in peers.iter_mut() {
                    let a = p.send("POST", path, Some(version), Some(body))?;
                    if let Some(uuid) = a.body.as_ref().and_then(|b| b["uuid"].as_str()) {
                        p.ids.insert(key.clone(), uuid.to_string());
                    }
                    answers.push(a);
                }
                setup_diff(&mut diffs, "POST", path, &answers);
            }
            Step::Call(method, path, body) => {
                let answers = peers
                    .iter()
                    .map(|p| p.send(method, path, Some("latest"), body.as_ref()))
                    .collect::<Result<Vec<_>>>()?;
                setup_diff(&mut diffs, method, path, &answers);
            }
            Step::Settle(node) => {
                let states = peers
                    .iter()
                    .map(|p| p.settle(node))
                    .collect::<Result<Vec<_>>>()?;
                if states[0] != states[1] {
                    diffs.push(Diff {
                        kind: Kind::State,
                        route: format!("SETTLE {node}"),
                        request: format!("node {node} after the request before"),
                        detail: format!(
                            "Ironic {:?} | Rivet {:?}",
                            states[0].as_deref().unwrap_or("(still moving)"),
                            states[1].as_deref().unwrap_or("(still moving)")
                        ),
                    });
                }
            }
            Step::WaitPower(node, want) => {
                for p in &peers {
                    p.wait_power(node, want)?;
                }
            }
            Step::WaitFor(path, field, want) => {
                for p in &peers {
                    let deadline = Instant::now() + Duration::from_secs(30);
                    loop {
                        let a = p.send("GET", path, Some("latest"), None)?;
                        let seen = a.body.as_ref().map(|b| b[*field].clone());
                        if seen.as_ref().and_then(Value::as_str) == Some(*want) {
                            break;
                        }
                        if Instant::now() > deadline {
                            // The comparison that follows shows the difference.
                            eprintln!(
                                "{}: {path} {field} is {seen:?} after 30 s, not {want:?}",
                                p.name
                            );
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
            Step::Capture(key, path, list) => {
                for p in peers.iter_mut() {
                    let a = p.send("GET", path, Some("latest"), None)?;
                    let last = a.body.as_ref().and_then(|b| b[*list].as_array()?.last());
                    match last.and_then(|e| e["uuid"].as_str()) {
                        Some(v) => {
                            p.ids.insert(key.clone(), v.to_string());
                        }
                        None => eprintln!("{}: no {list} in {path}: {}", p.name, a.text),
                    }
                }
            }
            Step::Same(path, fields) => {
                let answers = peers
                    .iter()
                    .map(|p| p.send("GET", path, Some("latest"), None))
                    .collect::<Result<Vec<_>>>()?;
                if let Some(d) = same_values(path, fields, &answers[0], &answers[1]) {
                    diffs.push(d);
                }
            }
            Step::Fixed(method, path, version, body) => {
                let req = Request {
                    route: format!("{method} {path}"),
                    variant: Variant::Fixed,
                    method,
                    path: path.clone(),
                    version: version.map(str::to_string),
                    body: body.clone(),
                };
                diffs.extend(run(&peers, &req, None)?);
                sent += 1;
            }
            Step::Route(route) => {
                for req in expand(route) {
                    diffs.extend(run(&peers, &req, route.settle)?);
                    sent += 1;
                }
            }
        }
    }
    let elapsed = started.elapsed();

    // The report: every difference grouped by kind, then by route.
    let mut failing = 0;
    let mut by_kind: BTreeMap<Kind, Vec<&Diff>> = BTreeMap::new();
    for d in &diffs {
        by_kind.entry(d.kind).or_default().push(d);
    }
    let mut report = String::new();
    for (kind, list) in &by_kind {
        report.push_str(&format!("\n== {} ({})\n", kind.title(), list.len()));
        for d in list {
            match allowed(d) {
                Some(why) => report.push_str(&format!(
                    "  allowed  {}\n           {}\n           ({why})\n",
                    d.request, d.detail
                )),
                None => {
                    failing += 1;
                    report.push_str(&format!(
                        "  DIFF     {}\n           {}\n",
                        d.request, d.detail
                    ));
                }
            }
        }
    }
    eprintln!("{report}");
    eprintln!(
        "ironic_diff: {sent} requests to each server, {} differences ({failing} not allowed) \
         in {elapsed:?}",
        diffs.len()
    );
    if let Ok(path) = std::env::var("RIVET_IRONIC_DIFF_REPORT") {
        std::fs::write(&path, &report)?;
    }
    anyhow::ensure!(
        failing == 0,
        "{failing} differences between Rivet and Ironic {} are not in the allow-list (see above)",
        ironic_peer::IRONIC_VERSION
    );
    Ok(())
}

/// Send `req` to both (Ironic first), wait for `settle` if given, compare.
fn run(peers: &[Peer; 2], req: &Request, settle: Option<&str>) -> Result<Vec<Diff>> {
    let mut answers = Vec::new();
    for p in peers {
        answers.push(p.send(
            req.method,
            &req.path,
            req.version.as_deref(),
            req.body.as_ref(),
        )?);
        if let Some(node) = settle {
            p.settle(node)?;
        }
    }
    Ok(compare(req, &answers[0], &answers[1]))
}

/// A difference of the values of `fields` between the two answers to `GET path`.
fn same_values(path: &str, fields: &[&str], ironic: &Answer, rivet: &Answer) -> Option<Diff> {
    let null = Value::Null;
    let value = |a: &Answer, f: &str| a.body.as_ref().map_or(&null, |b| &b[f]).clone();
    let differ: Vec<String> = fields
        .iter()
        .filter(|f| value(ironic, f) != value(rivet, f))
        .map(|f| {
            format!(
                "{f}: Ironic {} | Rivet {}",
                value(ironic, f),
                value(rivet, f)
            )
        })
        .collect();
    (!differ.is_empty()).then(|| Diff {
        kind: Kind::Values,
        route: format!("GET {path}"),
        request: format!("GET {path} @latest [values]"),
        detail: differ.join("; "),
    })
}

fn setup_diff(diffs: &mut Vec<Diff>, method: &str, path: &str, answers: &[Answer]) {
    let ok = |a: &Answer| (200..300).contains(&a.status);
    if answers.iter().all(ok) {
        return;
    }
    let side = |a: &Answer| {
        if ok(a) {
            a.status.to_string()
        } else {
            format!("{} ({})", a.status, error_text(a))
        }
    };
    diffs.push(Diff {
        kind: Kind::Setup,
        route: format!("{method} {path}"),
        request: format!("{method} {path} @latest [setup]"),
        detail: format!("Ironic {} | Rivet {}", side(&answers[0]), side(&answers[1])),
    });
}

// ------------------------------------------------------------------------------ the checker

fn answer(status: u16, body: Value) -> Answer {
    Answer {
        status,
        text: body.to_string(),
        body: Some(body),
    }
}

#[test]
fn the_comparison_finds_what_differs() {
    let route = r("GET", "/v1/nodes/{node:n1}", 1);
    let reqs = expand(&route);
    let labels: Vec<&str> = reqs.iter().map(|q| q.variant.label()).collect();
    assert_eq!(labels, ["missing", "malformed", "min", "latest", "name"]);
    assert_eq!(reqs[4].path, "/v1/nodes/n1");
    let req = &reqs[3];
    let node = json!({"uuid": "u", "links": [], "nodes": [{"a": 1}]});
    assert!(compare(req, &answer(200, node.clone()), &answer(200, node.clone())).is_empty());
    // A key more, a key less, a list element's key, a status, an error without
    // error_message: each is a difference, and none of them is allowed.
    let more = json!({"uuid": "u", "links": [], "nodes": [{"a": 1}], "version": 1});
    let less = json!({"uuid": "u", "nodes": [{"a": 1}]});
    let inner = json!({"uuid": "u", "links": [], "nodes": [{"b": 1}]});
    let err = json!({"error_message": "{}"});
    for (i, rv) in [
        (answer(200, node.clone()), answer(200, more)),
        (answer(200, node.clone()), answer(200, less)),
        (answer(200, node.clone()), answer(200, inner)),
        (answer(200, node.clone()), answer(404, err.clone())),
        (answer(404, err), answer(404, json!({"message": "no"}))),
    ] {
        let d = compare(req, &i, &rv);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(allowed(&d[0]), None, "{d:?}");
    }
    // A body with an unknown field, one below the oldest version.
    let put = r("PUT", "/v1/nodes/{node:nact}/states/raid", 12).body(json!({"a": "{v}"}));
    let reqs = expand(&put);
    assert_eq!(
        reqs[0].body,
        Some(json!({"a": "unknown", "rivet_diff_unknown": "x"}))
    );
    assert!(reqs
        .iter()
        .any(|q| q.variant == Variant::Below && q.version.as_deref() == Some("1.11")));
}
