//! Records → Ironic-shaped JSON. Secrets are masked here, the one place nodes leave the
//! process.

use super::ApiError;
use axum::http::HeaderMap;
use chrono::{DateTime, SecondsFormat, Utc};
use rivet_drivers::mask_secrets;
use rivet_model::node::Node;
use rivet_protocol::states::ProvisionState;
use serde_json::{json, Map, Value};

/// Fields a non-detailed node listing shows.
pub const NODE_LIST_FIELDS: &[&str] = &[
    "uuid",
    "name",
    "instance_uuid",
    "power_state",
    "provision_state",
    "maintenance",
    "links",
];

/// Base URL of this server as the client reached it.
/// A 201 answer with the new resource's document and its `Location` (`{base}/v1/{kind}/{uuid}`).
pub fn created(
    doc: Map<String, Value>,
    base: &str,
    kind: &str,
    uuid: &str,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let mut resp = (
        axum::http::StatusCode::CREATED,
        axum::Json(Value::Object(doc)),
    )
        .into_response();
    if let Ok(loc) = axum::http::HeaderValue::from_str(&format!("{base}/v1/{kind}/{uuid}")) {
        resp.headers_mut().insert(axum::http::header::LOCATION, loc);
    }
    resp
}

pub fn base_url(headers: &HeaderMap) -> String {
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    format!("http://{host}")
}

/// A timestamp the way Ironic writes one (Python's `isoformat()` of an aware UTC time):
/// `2026-11-27T09:54:14.123456+00:00`, the fraction left out only when it is zero. Every
/// Ironic-shaped document writes times through this one function, so a node's
/// `provision_updated_at` reads the same on the node and on its `/states`.
pub(super) fn timestamp(t: &DateTime<Utc>) -> String {
    let format = if t.timestamp_subsec_micros() == 0 {
        SecondsFormat::Secs
    } else {
        SecondsFormat::Micros
    };
    t.to_rfc3339_opts(format, false)
}

pub(super) fn time(t: &Option<DateTime<Utc>>) -> Value {
    t.as_ref()
        .map(|t| Value::from(timestamp(t)))
        .unwrap_or(Value::Null)
}

/// A record's document: its own `fields` (a JSON object), and the timestamps and links every
/// record of the admin API has.
pub(super) fn document(
    fields: Value,
    base: &str,
    kind: &str,
    uuid: &str,
    created_at: DateTime<Utc>,
    updated_at: Option<DateTime<Utc>>,
) -> Map<String, Value> {
    let mut doc = match fields {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    doc.insert("created_at".into(), time(&Some(created_at)));
    doc.insert("updated_at".into(), time(&updated_at));
    doc.insert("links".into(), links(base, kind, uuid));
    doc
}

pub(super) fn links(base: &str, kind: &str, uuid: &str) -> Value {
    json!([
        {"href": format!("{base}/v1/{kind}/{uuid}"), "rel": "self"},
        {"href": format!("{base}/{kind}/{uuid}"), "rel": "bookmark"},
    ])
}

/// The full node document.
/// Node fields that appeared after 1.1, with the microversion that added each (Ironic's
/// `versions.py`): below it a field is not shown, as Ironic hides it.
pub const NODE_FIELD_VERSIONS: &[(&str, (u32, u32))] = &[
    ("driver_internal_info", (1, 3)),
    ("name", (1, 5)),
    ("inspection_started_at", (1, 6)),
    ("inspection_finished_at", (1, 6)),
    ("clean_step", (1, 7)),
    ("states", (1, 14)),
    ("portgroups", (1, 24)),
    ("volume", (1, 32)),
    ("network_interface", (1, 20)),
    ("resource_class", (1, 21)),
    ("boot_interface", (1, 31)),
    ("console_interface", (1, 31)),
    ("deploy_interface", (1, 31)),
    ("inspect_interface", (1, 31)),
    ("management_interface", (1, 31)),
    ("power_interface", (1, 31)),
    ("raid_interface", (1, 31)),
    ("vendor_interface", (1, 31)),
    ("storage_interface", (1, 33)),
    ("traits", (1, 37)),
    ("rescue_interface", (1, 38)),
    ("bios_interface", (1, 40)),
    ("fault", (1, 42)),
    ("deploy_step", (1, 44)),
    ("conductor_group", (1, 46)),
    ("automated_clean", (1, 47)),
    ("protected", (1, 48)),
    ("protected_reason", (1, 48)),
    ("conductor", (1, 49)),
    ("allocation_uuid", (1, 52)),
    ("owner", (1, 50)),
    ("description", (1, 51)),
    ("retired", (1, 61)),
    ("retired_reason", (1, 61)),
    ("lessee", (1, 65)),
    ("network_data", (1, 66)),
    ("shard", (1, 82)),
    ("parent_node", (1, 83)),
    ("firmware_interface", (1, 86)),
    ("service_step", (1, 87)),
    ("disable_power_off", (1, 95)),
    ("target_raid_config", (1, 12)),
    ("raid_config", (1, 12)),
    ("boot_mode", (1, 75)),
    ("secure_boot", (1, 75)),
    ("instance_name", (1, 104)),
    ("health", (1, 109)),
];

/// 406 for a node field newer than `version` named in `fields=` or a PATCH path (Ironic's
/// `check_allowed_fields` and `reject_patch_in_newer_versions` over its VERSIONED_FIELDS).
/// `states`, `portgroups` and `volume` are links, hidden from older clients but not gated
/// by name.
pub fn check_node_fields<'a>(
    names: impl IntoIterator<Item = &'a str>,
    version: (u32, u32),
) -> Result<(), ApiError> {
    let names: Vec<&str> = names
        .into_iter()
        .filter(|n| !["states", "portgroups", "volume"].contains(n))
        .collect();
    super::version::check_gated(NODE_FIELD_VERSIONS, names, version)
}

/// Drop the fields a client at `version` does not know.
pub fn gate_node(doc: &mut Map<String, Value>, version: (u32, u32)) {
    super::version::hide_newer(doc, NODE_FIELD_VERSIONS, version);
    if let Some(Value::String(s)) = doc.get("provision_state") {
        if let Ok(state) = s.parse::<ProvisionState>() {
            doc.insert(
                "provision_state".into(),
                json!(provision_state_at(state, version)),
            );
        }
    }
}

/// A node's `provision_state` as a client of `version` knows the states (Ironic's
/// `update_state_in_older_versions`): below 1.2 `available` was NOSTATE (null), below 1.39
/// `inspect wait` reads `inspecting`. Only the current state: the target is shown as stored.
pub fn provision_state_at(state: ProvisionState, version: (u32, u32)) -> Option<ProvisionState> {
    match state {
        ProvisionState::Available if version < (1, 2) => None,
        ProvisionState::InspectWait if version < (1, 39) => Some(ProvisionState::Inspecting),
        s => Some(s),
    }
}

pub fn node_full(n: &Node, base: &str) -> Map<String, Value> {
    let mut internal = mask_secrets(&n.driver_internal_info);
    internal.extend(internal_shown(n));
    let (clean_step, deploy_step) = steps_with_progress(n);
    let v = json!({
        "uuid": n.uuid,
        "name": n.name,
        "driver": n.driver,
        "driver_info": mask_secrets(&n.driver_info),
        "driver_internal_info": internal,
        "properties": n.properties,
        "instance_info": instance_info(&n.instance_info),
        "instance_uuid": n.instance_uuid,
        "extra": n.extra,
        "provision_state": n.provision_state,
        "target_provision_state": n.target_provision_state,
        "provision_updated_at": time(&n.provision_updated_at),
        "power_state": n.power_state,
        "target_power_state": n.target_power_state,
        "maintenance": n.maintenance,
        "maintenance_reason": n.maintenance_reason,
        "fault": n.fault,
        // A record whose stored fields do not decode says so where operators look first.
        "last_error": match &n.corrupt {
            Some(c) => Some(c.message(n.ident())),
            None => n.last_error.clone(),
        },
        "clean_step": clean_step,
        "deploy_step": deploy_step,
        "service_step": rivet_conductor::servicing::service_step(n),
        "reservation": n.reservation,
        "conductor": n.conductor,
        "automated_clean": n.automated_clean,
        "resource_class": n.resource_class,
        "console_enabled": false,
        "traits": n.traits,
        "inspect_interface": n.inspect_interface.as_deref().unwrap_or("agent"),
        "inspection_started_at": time(&n.inspection_started_at),
        "inspection_finished_at": time(&n.inspection_finished_at),
        "created_at": time(&Some(n.created_at)),
        "updated_at": time(&n.updated_at),
        "links": links(base, "nodes", &n.uuid),
        "ports": links(base, "nodes", &format!("{}/ports", n.uuid)),
        "portgroups": links(base, "nodes", &format!("{}/portgroups", n.uuid)),
        "states": links(base, "nodes", &format!("{}/states", n.uuid)),
        "volume": links(base, "nodes", &format!("{}/volume", n.uuid)),
    });
    let mut m = match v {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    let a = &n.attrs;
    for (k, v) in [
        ("protected", json!(a.protected)),
        ("protected_reason", json!(a.protected_reason)),
        ("retired", json!(a.retired)),
        ("retired_reason", json!(a.retired_reason)),
        ("owner", json!(a.owner)),
        ("lessee", json!(a.lessee)),
        ("description", json!(a.description)),
        ("conductor_group", json!(a.conductor_group)),
        ("shard", json!(a.shard)),
        ("instance_name", json!(a.instance_name)),
        ("parent_node", json!(a.parent_node)),
        ("network_data", json!(a.network_data)),
        ("disable_power_off", json!(a.disable_power_off)),
        ("chassis_uuid", json!(n.chassis_uuid)),
        ("allocation_uuid", json!(n.allocation_uuid)),
        ("health", json!(n.health)),
        // Stored beside the node; `node_actions::node_fields` puts in the values.
        ("target_raid_config", json!({})),
        ("raid_config", json!({})),
        ("boot_mode", Value::Null),
        ("secure_boot", Value::Null),
    ] {
        m.insert(k.into(), v);
    }
    for (iface, value) in n.interfaces.resolved(&n.driver) {
        m.insert(iface.field(), Value::from(value));
    }
    m
}

/// What `driver_internal_info` shows besides the stored (masked) document, each key replacing
/// a stored one of that name: the run state, which lives in its own column (the parts Ironic
/// shows there, never the token hash), and the liveness, which lives outside the versioned
/// record.
pub(super) fn internal_shown(n: &Node) -> Map<String, Value> {
    let mut shown = Map::new();
    runs_shown(n, &mut shown);
    if let Some(t) = &n.liveness.last_heartbeat {
        shown.insert("agent_last_heartbeat".into(), time(&Some(*t)));
    }
    if let Some(v) = &n.liveness.agent_version {
        shown.insert("agent_version".into(), Value::from(v.clone()));
    }
    shown
}

/// The run state in `driver_internal_info`: whole under `run_state` (without the agent
/// token's hash), and the parts Ironic keeps there under its names (the plan and index of a
/// cleaning or deploy run); the boot the agent token belongs to as `agent_boot_id`.
fn runs_shown(n: &Node, internal: &mut Map<String, Value>) {
    let mut runs = n.runs.clone();
    if let Some(agent) = runs.agent.take() {
        if let Some(boot) = agent.boot_id {
            internal.insert("agent_boot_id".into(), Value::from(boot));
        }
    }
    if runs != rivet_model::runs::Runs::default() {
        internal.insert("run_state".into(), json!(runs));
    }
    if let Some(clean) = &n.runs.clean {
        if let Some(plan) = &clean.plan {
            internal.insert("clean_steps".into(), json!(plan));
            internal.insert("clean_step_index".into(), json!(clean.step_index));
        }
    }
    if let Some(deploy) = &n.runs.deploy {
        internal.insert("deploy_steps".into(), json!(deploy.plan));
        internal.insert("deploy_step_index".into(), json!(deploy.index));
    }
}

/// `clean_step` and `deploy_step` as shown: the running step with the progress its agent
/// last reported for that very command (an earlier command's progress is not shown).
pub(super) fn steps_with_progress(n: &Node) -> (Value, Value) {
    let show = |step: &Option<Value>| n.step_with_progress(step).unwrap_or_else(|| json!({}));
    (show(&n.clean_step), show(&n.deploy_step))
}

/// `instance_info` as shown: secrets masked, and the configdrive (user data may hold
/// credentials, and it can be megabytes) replaced by `******` as Ironic does.
fn instance_info(info: &Map<String, Value>) -> Map<String, Value> {
    let mut out = mask_secrets(info);
    if let Some(v) = out.get_mut("configdrive") {
        *v = Value::from("******");
    }
    out
}

/// Parse `fields=a,b,c` and check each name.
pub fn parse_fields(
    fields: Option<&str>,
    valid: &Map<String, Value>,
) -> Result<Option<Vec<String>>, ApiError> {
    let Some(f) = fields else { return Ok(None) };
    let (names, bad) = super::listing::field_names(f, |n| valid.contains_key(n));
    if !bad.is_empty() {
        return Err(ApiError::bad_request(format!(
            "field(s) {} are not valid; valid fields: {}",
            bad.join(", "),
            valid.keys().cloned().collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(Some(names))
}

/// Keep only `keep` of a document.
/// The `fields=` selection of a document: the fields asked for and `links`, which Ironic
/// always keeps (its `sanitize_dict`).
pub fn sanitized(doc: Map<String, Value>, fields: &[impl AsRef<str>]) -> Value {
    let mut keep: Vec<&str> = fields.iter().map(AsRef::as_ref).collect();
    if !keep.contains(&"links") {
        keep.push("links");
    }
    select(doc, &keep)
}

pub fn select(mut doc: Map<String, Value>, keep: &[impl AsRef<str>]) -> Value {
    let mut out = Map::new();
    for k in keep {
        if let Some(v) = doc.remove(k.as_ref()) {
            out.insert(k.as_ref().to_string(), v);
        }
    }
    Value::Object(out)
}
