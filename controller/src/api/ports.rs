//! `/v1/ports`: a node's NICs, found by MAC at lookup, with every port field of Ironic's
//! `port.py` and its microversion gate (internal_info 1.18 … available_for_dynamic_portgroup
//! 1.111), the listings under `/v1/nodes/{node}/ports` and `/v1/portgroups/{pg}/ports`
//! (1.24), and the helpers the port group API shares (gates, Ironic's body checks).

use super::nodes::{ver, Version};
use super::render::{base_url, links, parse_fields, select, time};
use super::{listing, patch, ApiError, ApiResult, AppState, JsonBody};
use crate::store::{normalize_mac, Node, Port, PortAttrs, PortQuery, StoreError, PORT_SORT_KEYS};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use chrono::Utc;
use rivet_protocol::api::PatchOp;
use serde_json::{json, Map, Value};
use std::collections::HashMap;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/ports", get(list).post(create))
        .route("/v1/ports/", get(list).post(create))
        .route("/v1/ports/detail", get(list_detail))
        .route("/v1/ports/{ident}", get(show).patch(update).delete(remove))
        .route("/v1/nodes/{ident}/ports/detail", get(node_ports_detail))
        .route(
            "/v1/portgroups/{ident}/ports",
            get(portgroup_ports).post(no_sub_write),
        )
        .route(
            "/v1/portgroups/{ident}/ports/detail",
            get(portgroup_ports_detail),
        )
}

/// Port fields that appeared after 1.1, with the microversion that added each.
const PORT_FIELD_VERSIONS: &[(&str, (u32, u32))] = &[
    ("internal_info", (1, 18)),
    ("pxe_enabled", (1, 19)),
    ("local_link_connection", (1, 19)),
    ("portgroup_uuid", (1, 24)),
    ("physical_network", (1, 34)),
    ("is_smartnic", (1, 53)),
    ("name", (1, 88)),
    ("description", (1, 97)),
    ("vendor", (1, 100)),
    ("category", (1, 101)),
    ("available_for_dynamic_portgroup", (1, 111)),
];

/// Fields of a non-detailed port listing (Ironic's `_DEFAULT_RETURN_FIELDS`, and links).
const LIST_FIELDS: &[&str] = &["uuid", "address", "links"];

/// `local_link_connection.network_type` (`MINOR_64_LOCAL_LINK_CONNECTION_NETWORK_TYPE`).
const NETWORK_TYPE_VERSION: (u32, u32) = (1, 64);
/// The OVN VTEP keys are accepted from 1.90 (`MINOR_90_OVN_VTEP`) …
const OVN_VTEP_VERSION: (u32, u32) = (1, 90);
/// … until 1.105 removed them (`MINOR_105_REMOVE_OVN_VTEP`).
const OVN_VTEP_REMOVED: (u32, u32) = (1, 105);
const OVN_KEYS: &[&str] = &["vtep-logical-switch", "vtep-physical-switch"];
/// Creating a port with `node_ident` (`MINOR_94_PORT_NODENAME`).
const NODE_IDENT_VERSION: (u32, u32) = (1, 94);
/// Port group sub-resources and filters (`MINOR_24_PORTGROUPS_SUBCONTROLLERS`).
pub(super) const PORTGROUP_SUB_VERSION: (u32, u32) = (1, 24);
/// Filtering by shard (`MINOR_82_NODE_SHARD`).
pub(super) const SHARD_VERSION: (u32, u32) = (1, 82);

/// Keys a port body may have (Ironic's `PORT_SCHEMA`).
const BODY_KEYS: &[&str] = &[
    "address",
    "extra",
    "is_smartnic",
    "local_link_connection",
    "node_ident",
    "node_uuid",
    "physical_network",
    "portgroup_uuid",
    "pxe_enabled",
    "uuid",
    "name",
    "description",
    "vendor",
    "category",
    "available_for_dynamic_portgroup",
];

/// What a PATCH may touch (Ironic's `PATCH_ALLOWED_FIELDS`).
const PATCHABLE: &[&str] = &[
    "address",
    "extra",
    "is_smartnic",
    "local_link_connection",
    "node_uuid",
    "physical_network",
    "portgroup_uuid",
    "pxe_enabled",
    "name",
    "description",
    "vendor",
    "category",
    "available_for_dynamic_portgroup",
];

pub(super) fn vstr(v: (u32, u32)) -> String {
    format!("{}.{}", v.0, v.1)
}

/// Ironic's NotAcceptable (406) for a field the client's microversion does not have.
pub(super) fn not_acceptable(what: &str, need: (u32, u32)) -> ApiError {
    ApiError::new(
        StatusCode::NOT_ACCEPTABLE,
        format!(
            "Request not acceptable: {what} requires API version {} or later; send the \
             X-OpenStack-Ironic-API-Version header",
            vstr(need)
        ),
    )
}

/// 406 for every name in `names` that `table` gates above `version`.
pub(super) fn check_gated<'a>(
    table: &[(&str, (u32, u32))],
    names: impl IntoIterator<Item = &'a str>,
    version: (u32, u32),
) -> Result<(), ApiError> {
    for n in names {
        if let Some((f, since)) = table.iter().find(|(f, _)| *f == n) {
            if version < *since {
                return Err(not_acceptable(f, *since));
            }
        }
    }
    Ok(())
}

/// A UUID in a path, query or body: anything else is a 400, as Ironic's `args.uuid`.
pub(super) fn check_uuid(what: &str, v: &str) -> Result<String, ApiError> {
    uuid::Uuid::parse_str(v)
        .map(|u| u.to_string())
        .map_err(|_| ApiError::bad_request(format!("Expected UUID for {what}: {v}")))
}

/// A MAC as Ironic's `args.mac_address` takes it (lower-cased).
pub(super) fn mac(address: &str) -> Result<String, ApiError> {
    normalize_mac(address).ok_or_else(|| {
        ApiError::bad_request(format!("Expected a MAC address but received {address}."))
    })
}

/// Ironic's `args.boolean`: a JSON boolean or one of its strings.
pub(super) fn boolean(name: &str, v: &Value) -> Result<bool, ApiError> {
    match v {
        Value::Bool(b) => Ok(*b),
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "true" | "1" | "t" | "yes" | "y" | "on" => Ok(true),
            "false" | "0" | "f" | "no" | "n" | "off" => Ok(false),
            _ => Err(ApiError::bad_request(format!(
                "Invalid {name}: unrecognized value '{s}', acceptable values are: '0', '1', \
                 'f', 'false', 'n', 'no', 'off', 'on', 't', 'true', 'y', 'yes'"
            ))),
        },
        other => Err(ApiError::bad_request(format!(
            "{other} is not of type 'string', 'boolean', 'null'"
        ))),
    }
}

/// An optional string field of at most `max` characters (`None` for absent or null).
pub(super) fn opt_string(
    doc: &Map<String, Value>,
    key: &str,
    max: Option<usize>,
) -> Result<Option<String>, ApiError> {
    match doc.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => {
            if let Some(max) = max {
                if s.chars().count() > max {
                    return Err(ApiError::bad_request(format!(
                        "'{s}' is too long: {key} is {} characters; at most {max} are allowed",
                        s.chars().count()
                    )));
                }
            }
            Ok(Some(s.clone()))
        }
        Some(other) => Err(ApiError::bad_request(format!(
            "{other} is not of type 'string', 'null' ({key})"
        ))),
    }
}

/// An object field (`{}` for absent or null).
pub(super) fn opt_object(
    doc: &Map<String, Value>,
    key: &str,
) -> Result<Map<String, Value>, ApiError> {
    match doc.get(key) {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(m)) => Ok(m.clone()),
        Some(other) => Err(ApiError::bad_request(format!(
            "{other} is not of type 'object', 'null' ({key})"
        ))),
    }
}

/// Ironic's `is_valid_logical_name`: RFC 3986 unreserved characters, at most 255.
pub(super) fn check_logical_name(kind: &str, name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._~".contains(c));
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "Cannot use invalid name '{name}' for a {kind}: use 1-255 characters from \
             A-Z a-z 0-9 - . _ ~"
        )))
    }
}

/// `local_link_connection` checked as Ironic's `LOCAL_LINK_CONN_SCHEMA` (any of: switch_id and
/// port_id; port_id and hostname (Smart NIC); network_type unmanaged; port_id and both OVN
/// VTEP keys; empty), its switch_id normalized (a MAC or an OpenFlow datapath ID), and the keys
/// a microversion does not have refused with 406.
fn check_llc(
    llc: &Map<String, Value>,
    version: (u32, u32),
) -> Result<Map<String, Value>, ApiError> {
    const KEYS: &[&str] = &[
        "port_id",
        "switch_id",
        "hostname",
        "switch_info",
        "network_type",
        "vtep-logical-switch",
        "vtep-physical-switch",
    ];
    if let Some(bad) = llc.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(ApiError::bad_request(format!(
            "Invalid local_link_connection: additional properties are not allowed ('{bad}' \
             was unexpected); allowed: {}",
            KEYS.join(", ")
        )));
    }
    if llc.contains_key("network_type") && version < NETWORK_TYPE_VERSION {
        return Err(not_acceptable(
            "local_link_connection/network_type",
            NETWORK_TYPE_VERSION,
        ));
    }
    if OVN_KEYS.iter().any(|k| llc.contains_key(*k))
        && !(OVN_VTEP_VERSION..OVN_VTEP_REMOVED).contains(&version)
    {
        return Err(ApiError::new(
            StatusCode::NOT_ACCEPTABLE,
            format!(
                "Request not acceptable: local_link_connection/vtep-logical-switch and \
                 vtep-physical-switch are accepted from API version {} until {} (removed)",
                vstr(OVN_VTEP_VERSION),
                vstr(OVN_VTEP_REMOVED)
            ),
        ));
    }
    for (k, v) in llc {
        if !v.is_string() {
            return Err(ApiError::bad_request(format!(
                "Invalid local_link_connection: {v} is not of type 'string' ({k})"
            )));
        }
    }
    let has = |k: &str| llc.contains_key(k);
    if has("vtep-logical-switch") != has("vtep-physical-switch") {
        return Err(ApiError::bad_request(
            "Invalid local_link_connection: vtep-logical-switch and vtep-physical-switch \
             must be given together",
        ));
    }
    let nt = llc.get("network_type").and_then(Value::as_str);
    if let Some(t) = nt {
        if t != "managed" && t != "unmanaged" {
            return Err(ApiError::bad_request(format!(
                "Invalid local_link_connection: '{t}' is not one of ['managed', 'unmanaged'] \
                 (network_type)"
            )));
        }
    }
    let valid = llc.is_empty()
        || (has("port_id") && has("switch_id"))
        || (has("port_id") && has("hostname"))
        || nt == Some("unmanaged")
        || (has("port_id") && has("vtep-logical-switch"));
    if !valid {
        return Err(ApiError::bad_request(format!(
            "Invalid local_link_connection {}: give port_id and switch_id (or port_id and \
             hostname for a Smart NIC, or network_type \"unmanaged\")",
            Value::Object(llc.clone())
        )));
    }
    let mut out = llc.clone();
    if let Some(sw) = llc.get("switch_id").and_then(Value::as_str) {
        let norm = normalize_mac(sw)
            .or_else(|| datapath_id(sw))
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "Expected a MAC address or OpenFlow datapath ID but received {sw}."
                ))
            })?;
        out.insert("switch_id".into(), Value::from(norm));
    }
    Ok(out)
}

/// An OpenFlow datapath ID (16 hex digits, colons optional), lower-cased.
fn datapath_id(s: &str) -> Option<String> {
    let hex: String = s.chars().filter(|c| *c != ':').collect();
    (hex.len() == 16 && hex.chars().all(|c| c.is_ascii_hexdigit())).then(|| {
        if s.contains(':') {
            s.to_ascii_lowercase()
        } else {
            hex.to_ascii_lowercase()
        }
    })
}

/// The whole port document (before gating).
fn port_full(p: &Port, base: &str) -> Map<String, Value> {
    let a = &p.attrs;
    let v = json!({
        "uuid": p.uuid,
        "address": p.address,
        "node_uuid": p.node_uuid,
        "portgroup_uuid": a.portgroup_uuid,
        "pxe_enabled": p.pxe_enabled,
        "extra": p.extra,
        "internal_info": a.internal_info,
        "local_link_connection": a.local_link_connection,
        "physical_network": a.physical_network,
        "is_smartnic": a.is_smartnic,
        "name": a.name,
        "description": a.description,
        "vendor": a.vendor,
        "category": a.category,
        "available_for_dynamic_portgroup": a.available_for_dynamic_portgroup,
        "created_at": time(&Some(p.created_at)),
        "updated_at": time(&p.updated_at),
        "links": links(base, "ports", &p.uuid),
    });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// A port's document as a client at `version` sees it (Ironic's
/// `hide_fields_in_newer_versions`).
pub(super) fn port_doc(p: &Port, base: &str, version: (u32, u32)) -> Map<String, Value> {
    let mut doc = port_full(p, base);
    for (field, since) in PORT_FIELD_VERSIONS {
        if version < *since {
            doc.remove(*field);
        }
    }
    let ovn_shown = (OVN_VTEP_VERSION..OVN_VTEP_REMOVED).contains(&version);
    if let Some(Value::Object(llc)) = doc.get("local_link_connection") {
        if !ovn_shown && OVN_KEYS.iter().any(|k| llc.contains_key(*k)) {
            doc.insert("local_link_connection".into(), json!({}));
        }
    }
    doc
}

fn port_not_found(ident: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("Port {ident} could not be found."),
    )
}

/// A port by UUID or name, its NotFound in Ironic's words.
async fn fetch(state: &AppState, ident: &str) -> ApiResult<Port> {
    match state.conductor.store.get_port(ident).await {
        Err(StoreError::NotFound { .. }) => Err(port_not_found(ident)),
        r => Ok(r?),
    }
}

/// The node a body names (400 when there is none: a POST's reference, not its resource).
async fn node_ref(state: &AppState, ident: &str) -> ApiResult<crate::store::Node> {
    match state.conductor.store.get_node(ident).await {
        Err(StoreError::NotFound { .. }) => Err(ApiError::bad_request(format!(
            "Node {ident} could not be found."
        ))),
        r => Ok(r?),
    }
}

/// The port group a port body names (400 when there is none), which must be of `node`.
async fn portgroup_ref(
    state: &AppState,
    ident: &str,
    node: &str,
) -> ApiResult<crate::store::Portgroup> {
    let pg = match state.conductor.store.get_portgroup(ident).await {
        Err(StoreError::NotFound { .. }) => {
            return Err(ApiError::bad_request(format!(
                "Portgroup {ident} could not be found."
            )))
        }
        r => r?,
    };
    if pg.node_uuid != node {
        return Err(ApiError::bad_request(
            "Port can not be added to a portgroup belonging to a different node.",
        ));
    }
    Ok(pg)
}

/// The port fields of a body or patched document, checked as Ironic checks them.
fn attrs_of(
    doc: &Map<String, Value>,
    version: (u32, u32),
    internal_info: Map<String, Value>,
) -> Result<(bool, Map<String, Value>, PortAttrs), ApiError> {
    let pxe = match doc.get("pxe_enabled") {
        None | Some(Value::Null) => true,
        Some(v) => boolean("pxe_enabled", v)?,
    };
    let extra = opt_object(doc, "extra")?;
    let llc = check_llc(&opt_object(doc, "local_link_connection")?, version)?;
    let is_smartnic = match doc.get("is_smartnic") {
        None | Some(Value::Null) => false,
        Some(v) => boolean("is_smartnic", v)?,
    };
    if is_smartnic && !(llc.contains_key("port_id") && llc.contains_key("hostname")) {
        return Err(ApiError::bad_request(
            "Smart NIC port must have port_id and hostname in local_link_connection",
        ));
    }
    let physical_network = opt_string(doc, "physical_network", Some(64))?;
    if physical_network.as_deref() == Some("") {
        return Err(ApiError::bad_request(
            "A non-empty value is required when setting physical_network",
        ));
    }
    let available = match doc.get("available_for_dynamic_portgroup") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "{other} is not of type 'boolean' (available_for_dynamic_portgroup)"
            )))
        }
    };
    let name = opt_string(doc, "name", Some(255))?;
    if let Some(n) = &name {
        check_logical_name("port", n)?;
    }
    let portgroup_uuid = opt_string(doc, "portgroup_uuid", None)?;
    Ok((
        pxe,
        extra,
        PortAttrs {
            name,
            portgroup_uuid,
            physical_network,
            internal_info,
            local_link_connection: llc,
            is_smartnic,
            description: opt_string(doc, "description", Some(255))?,
            vendor: opt_string(doc, "vendor", Some(32))?,
            category: opt_string(doc, "category", Some(80))?,
            available_for_dynamic_portgroup: available,
        },
    ))
}

/// 409 when a PXE-enabled port joins a group that does not support standalone ports.
fn check_standalone(pg: &crate::store::Portgroup, pxe: bool) -> Result<(), ApiError> {
    if pxe && !pg.standalone_ports_supported {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "Port group {} doesn't support standalone ports. This port cannot be a \
                 member of that portgroup as the port's 'pxe_enabled' field is True.",
                pg.uuid
            ),
        ));
    }
    Ok(())
}

/// 409 while another operation holds the node (Ironic's NodeLocked: port and port group
/// writes take the node's lock).
pub(super) fn refuse_locked(node: &Node) -> Result<(), ApiError> {
    match &node.reservation {
        Some(by) => Err(crate::conductor::ConductorError::Locked {
            node: node.ident().to_string(),
            by: by.clone(),
            state: node.provision_state,
        }
        .into()),
        None => Ok(()),
    }
}

/// States in which a port's connectivity or a group's node may change (or in maintenance).
pub(super) fn connectivity_editable(node: &Node) -> bool {
    use rivet_protocol::states::ProvisionState as S;
    node.maintenance
        || matches!(
            node.provision_state,
            S::Enroll | S::Inspecting | S::InspectWait | S::Manageable
        )
}

/// Ironic's `validate_port_physnet`: a port in a group has the physical network of the
/// group's other ports (or, with none, the group's own).
async fn check_physnet(
    state: &AppState,
    port_uuid: &str,
    pg: &crate::store::Portgroup,
    physnet: &Option<String>,
) -> Result<(), ApiError> {
    let others = state
        .conductor
        .store
        .list_ports(&PortQuery {
            portgroup_uuid: Some(pg.uuid.clone()),
            ..Default::default()
        })
        .await?;
    let theirs = others
        .iter()
        .find(|p| p.uuid != port_uuid)
        .map(|p| p.attrs.physical_network.clone())
        .or_else(|| pg.physical_network.clone().map(Some));
    match theirs {
        Some(net) if &net != physnet => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "Port with physical network {} cannot become a member of port group {} which \
                 has ports in physical network {}.",
                physnet.as_deref().unwrap_or("None"),
                pg.uuid,
                net.as_deref().unwrap_or("None")
            ),
        )),
        _ => Ok(()),
    }
}

/// Where Ironic keeps a port's or group's VIFs (`NetType` keys).
pub(super) const VIF_KEYS: &[&str] = &[
    "tenant_vif_port_id",
    "cleaning_vif_port_id",
    "provisioning_vif_port_id",
    "rescuing_vif_port_id",
    "servicing_vif_port_id",
    "inspection_vif_port_id",
];

async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    version: Version,
    JsonBody(body): JsonBody<Value>,
) -> ApiResult<Response> {
    let version = ver(&version);
    let Value::Object(mut doc) = body else {
        return Err(ApiError::bad_request("a port must be a JSON object"));
    };
    if let Some(bad) = doc.keys().find(|k| !BODY_KEYS.contains(&k.as_str())) {
        return Err(ApiError::bad_request(format!(
            "Additional properties are not allowed ('{bad}' was unexpected)"
        )));
    }
    let address = match doc.get("address") {
        Some(Value::String(a)) => mac(a)?,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "{other} is not of type 'string' (address)"
            )))
        }
        None => return Err(ApiError::bad_request("'address' is a required property")),
    };
    let node_ident = match (doc.remove("node_uuid"), doc.remove("node_ident")) {
        (Some(_), Some(_)) | (None, None) => {
            return Err(ApiError::bad_request(
                "Give exactly one of node_uuid and node_ident (is valid under each of \
                 {'required': ['node_ident']}, {'required': ['node_uuid']})",
            ))
        }
        // Rivet has always taken a name here too (Ironic wants a UUID, or node_ident).
        (Some(Value::String(u)), None) => u,
        (None, Some(Value::String(n))) => {
            if version < NODE_IDENT_VERSION {
                return Err(not_acceptable("node_ident", NODE_IDENT_VERSION));
            }
            n
        }
        (Some(other), None) | (None, Some(other)) => {
            return Err(ApiError::bad_request(format!(
                "{other} is not of type 'string' (node)"
            )))
        }
    };
    check_gated(PORT_FIELD_VERSIONS, doc.keys().map(String::as_str), version)?;
    let uuid = match doc.get("uuid") {
        None | Some(Value::Null) => uuid::Uuid::new_v4().to_string(),
        Some(Value::String(u)) => check_uuid("uuid", u)?,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "{other} is not of type 'string', 'null' (uuid)"
            )))
        }
    };
    let node = node_ref(&state, &node_ident).await?;
    refuse_locked(&node)?;
    let (pxe, extra, mut attrs) = attrs_of(&doc, version, Map::new())?;
    if let Some(pg_ident) = attrs.portgroup_uuid.clone() {
        let pg = portgroup_ref(&state, &pg_ident, &node.uuid).await?;
        check_standalone(&pg, pxe)?;
        check_physnet(&state, &uuid, &pg, &attrs.physical_network).await?;
        attrs.portgroup_uuid = Some(pg.uuid);
    }
    let port = Port {
        uuid,
        node_uuid: node.uuid,
        address,
        pxe_enabled: pxe,
        extra,
        created_at: Utc::now(),
        updated_at: None,
        version: 0,
        attrs,
    };
    let port = state.conductor.store.create_port(&port).await?;
    let base = base_url(&headers);
    Ok(super::render::created(
        port_doc(&port, &base, version),
        &base,
        "ports",
        &port.uuid,
    ))
}

/// Where a listing comes from.
enum Parent {
    None,
    Node(String),
    Portgroup(String),
}

const LIST_PARAMS: &[&str] = &[
    "node",
    "node_uuid",
    "address",
    "portgroup",
    "shard",
    "conductor_groups",
    "description_contains",
    "limit",
    "marker",
    "sort_key",
    "sort_dir",
    "fields",
    "detail",
];

/// A comma-separated list parameter.
pub(super) fn list_param(params: &HashMap<String, String>, key: &str) -> Vec<String> {
    params
        .get(key)
        .map(|v| {
            v.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// `fields` (1.8, 406 below) and `detail` (1.43, 400 below) as Ironic gates them.
pub(super) fn check_query_versions(
    params: &HashMap<String, String>,
    version: (u32, u32),
) -> Result<(), ApiError> {
    if params.contains_key("fields") && version < (1, 8) {
        return Err(not_acceptable("fields", (1, 8)));
    }
    if let Some(d) = params.get("detail") {
        if version < (1, 43) {
            return Err(ApiError::bad_request(format!(
                "Invalid query parameter ?detail={d} received."
            )));
        }
    }
    Ok(())
}

/// The checked `sort_key` and `sort_dir` of a listing.
pub(super) fn sort_params(
    params: &HashMap<String, String>,
    keys: &[&str],
    invalid: &[&str],
    gates: &[(&str, (u32, u32))],
    version: (u32, u32),
) -> Result<(String, Option<crate::store::SortDir>), ApiError> {
    let sort_key = params
        .get("sort_key")
        .cloned()
        .unwrap_or_else(|| "id".into());
    check_gated(gates, [sort_key.as_str()], version)?;
    if invalid.contains(&sort_key.as_str()) {
        return Err(ApiError::bad_request(format!(
            "The sort_key value {sort_key} is an invalid field for sorting"
        )));
    }
    if !keys.contains(&sort_key.as_str()) {
        return Err(ApiError::bad_request(format!(
            "sort_key {sort_key:?} is not supported; use one of {}",
            keys.join(", ")
        )));
    }
    let sort_dir = listing::sort_dir_param(params)?;
    Ok((sort_key, sort_dir))
}

/// The `next` link of a full page.
pub(super) fn next_link(
    base: &str,
    path: &str,
    params: &HashMap<String, String>,
    limit: usize,
    last: &str,
) -> String {
    let mut next = format!("{base}{path}?limit={limit}");
    let mut keys: Vec<&String> = params
        .keys()
        .filter(|k| *k != "limit" && *k != "marker")
        .collect();
    keys.sort();
    for k in keys {
        if let Some(v) = params.get(k) {
            next.push_str(&format!("&{k}={v}"));
        }
    }
    next.push_str(&format!("&marker={last}"));
    next
}

async fn list_inner(
    state: &AppState,
    headers: &HeaderMap,
    version: (u32, u32),
    params: HashMap<String, String>,
    from_detail: bool,
    parent: Parent,
) -> ApiResult<Json<Value>> {
    let allowed = if from_detail {
        &LIST_PARAMS[..11]
    } else {
        LIST_PARAMS
    };
    if let Some(bad) = params.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(ApiError::bad_request(format!(
            "unknown query parameter {bad:?}; supported: {}",
            allowed.join(", ")
        )));
    }
    check_query_versions(&params, version)?;
    if params.contains_key("portgroup") && version < PORTGROUP_SUB_VERSION {
        return Err(not_acceptable("portgroup filter", PORTGROUP_SUB_VERSION));
    }
    if params.contains_key("shard") && version < SHARD_VERSION {
        return Err(not_acceptable("shard filter", SHARD_VERSION));
    }
    let fields_param = params.get("fields").map(String::as_str);
    if let Some(f) = fields_param {
        check_gated(PORT_FIELD_VERSIONS, f.split(',').map(str::trim), version)?;
    }
    let (sort_key, sort_dir) = sort_params(
        &params,
        PORT_SORT_KEYS,
        &["extra", "internal_info", "local_link_connection"],
        PORT_FIELD_VERSIONS,
        version,
    )?;
    let detail = listing::detail_param(&params, from_detail)?;
    let (mut node_ident, mut pg_ident) = (
        params.get("node").or(params.get("node_uuid")).cloned(),
        params.get("portgroup").cloned(),
    );
    let path = match &parent {
        Parent::None => "/v1/ports".to_string(),
        Parent::Node(n) => {
            node_ident = Some(n.clone());
            format!("/v1/nodes/{n}/ports")
        }
        Parent::Portgroup(g) => {
            pg_ident = Some(g.clone());
            format!("/v1/portgroups/{g}/ports")
        }
    };
    let path = if from_detail {
        format!("{path}/detail")
    } else {
        path
    };
    if let Some(u) = params.get("node_uuid") {
        check_uuid("node_uuid", u)?;
    }
    let shards = list_param(&params, "shard");
    let conductor_groups = list_param(&params, "conductor_groups");
    let exclusive = [node_ident.is_some(), pg_ident.is_some(), !shards.is_empty()];
    if exclusive.iter().filter(|b| **b).count() > 1 {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "Operation not permitted: filter ports by only one of node, portgroup and shard.",
        ));
    }
    let address = params.get("address").map(|a| mac(a)).transpose()?;
    if !conductor_groups.is_empty()
        && (node_ident.is_some() || pg_ident.is_some() || address.is_some())
    {
        return Err(ApiError::bad_request(
            "Filtering by conductor_groups cannot be combined with node_ident, \
             portgroup_ident, or node address filters.",
        ));
    }
    let node_uuid = match node_ident {
        Some(n) => Some(super::portgroups::node_of(state, &n).await?.uuid),
        None => None,
    };
    let portgroup_uuid = match pg_ident {
        Some(g) => Some(super::portgroups::fetch(state, &g).await?.uuid),
        None => None,
    };
    let marker = params
        .get("marker")
        .map(|m| check_uuid("marker", m))
        .transpose()?;
    let max = state.conductor.config.api.max_limit;
    let limit = listing::page_limit(&params, max)?;
    let q = PortQuery {
        node_uuid,
        address,
        limit,
        marker,
        portgroup_uuid,
        shards,
        conductor_groups,
        description_contains: params.get("description_contains").cloned(),
        sort_key,
        sort_dir,
    };
    let found = match state.conductor.store.list_ports(&q).await {
        Err(StoreError::NotFound { ident, .. }) => return Err(port_not_found(&ident)),
        r => r?,
    };
    let base = base_url(headers);
    let template = port_doc(
        &Port {
            uuid: String::new(),
            node_uuid: String::new(),
            address: String::new(),
            pxe_enabled: false,
            extra: Map::new(),
            created_at: Utc::now(),
            updated_at: None,
            version: 0,
            attrs: PortAttrs::default(),
        },
        &base,
        version,
    );
    let fields = parse_fields(fields_param, &template)?;
    let docs: Vec<Value> = found
        .iter()
        .map(|p| {
            listing::shape(
                port_doc(p, &base, version),
                fields.as_deref(),
                detail,
                LIST_FIELDS,
            )
        })
        .collect();
    let mut body = json!({ "ports": docs });
    if found.len() == q.limit {
        if let Some(last) = found.last() {
            body["next"] = Value::from(next_link(&base, &path, &params, q.limit, &last.uuid));
        }
    }
    Ok(Json(body))
}

async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    version: Version,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    list_inner(&state, &headers, ver(&version), params, false, Parent::None).await
}

async fn list_detail(
    State(state): State<AppState>,
    headers: HeaderMap,
    version: Version,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    list_inner(&state, &headers, ver(&version), params, true, Parent::None).await
}

/// `GET /v1/nodes/{node}/ports` (routed from `nodes.rs`).
pub(super) async fn node_ports(
    State(state): State<AppState>,
    headers: HeaderMap,
    version: Version,
    Path(ident): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    let p = Parent::Node(ident);
    list_inner(&state, &headers, ver(&version), params, false, p).await
}

async fn node_ports_detail(
    State(state): State<AppState>,
    headers: HeaderMap,
    version: Version,
    Path(ident): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    let p = Parent::Node(ident);
    list_inner(&state, &headers, ver(&version), params, true, p).await
}

/// Port group sub-resources are 1.24 (Ironic answers 404 below).
fn sub_gate(version: (u32, u32), path: &str) -> Result<(), ApiError> {
    if version < PORTGROUP_SUB_VERSION {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "the resource {path} could not be found (it needs API version {} or later)",
                vstr(PORTGROUP_SUB_VERSION)
            ),
        ));
    }
    Ok(())
}

async fn portgroup_ports(
    State(state): State<AppState>,
    headers: HeaderMap,
    version: Version,
    Path(ident): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    let version = ver(&version);
    super::portgroups::gate(version)?;
    sub_gate(version, &format!("/v1/portgroups/{ident}/ports"))?;
    let p = Parent::Portgroup(ident);
    list_inner(&state, &headers, version, params, false, p).await
}

async fn portgroup_ports_detail(
    State(state): State<AppState>,
    headers: HeaderMap,
    version: Version,
    Path(ident): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    let version = ver(&version);
    super::portgroups::gate(version)?;
    sub_gate(version, &format!("/v1/portgroups/{ident}/ports/detail"))?;
    let p = Parent::Portgroup(ident);
    list_inner(&state, &headers, version, params, true, p).await
}

/// Ports are created through `/v1/ports` only (Ironic's MalformedRequestURI: 400).
pub(super) async fn no_sub_write() -> ApiError {
    ApiError::bad_request("Malformed request URI: create ports with POST /v1/ports")
}

async fn show(
    State(state): State<AppState>,
    headers: HeaderMap,
    version: Version,
    Path(ident): Path<String>,
    Query(p): Query<listing::ShowParams>,
) -> ApiResult<Json<Value>> {
    let version = ver(&version);
    if let Some(f) = &p.fields {
        if version < (1, 8) {
            return Err(not_acceptable("fields", (1, 8)));
        }
        check_gated(PORT_FIELD_VERSIONS, f.split(',').map(str::trim), version)?;
    }
    let port = fetch(&state, &ident).await?;
    let doc = port_doc(&port, &base_url(&headers), version);
    Ok(Json(match parse_fields(p.fields.as_deref(), &doc)? {
        Some(f) => select(doc, &f),
        None => Value::Object(doc),
    }))
}

/// The top-level field a patch path names.
pub(super) fn patched_fields(ops: &[PatchOp]) -> Vec<String> {
    ops.iter()
        .filter_map(|o| o.path.trim_start_matches('/').split('/').next())
        .map(str::to_string)
        .collect()
}

async fn update(
    State(state): State<AppState>,
    headers: HeaderMap,
    version: Version,
    Path(ident): Path<String>,
    JsonBody(ops): JsonBody<Vec<PatchOp>>,
) -> ApiResult<Json<Value>> {
    let version = ver(&version);
    let touched = patched_fields(&ops);
    check_gated(
        PORT_FIELD_VERSIONS,
        touched.iter().map(String::as_str),
        version,
    )?;
    if ops
        .iter()
        .any(|o| o.path.starts_with("/local_link_connection/network_type"))
        && version < NETWORK_TYPE_VERSION
    {
        return Err(not_acceptable(
            "local_link_connection/network_type",
            NETWORK_TYPE_VERSION,
        ));
    }
    let port = fetch(&state, &ident).await?;
    let a = &port.attrs;
    let mut doc = json!({
        "address": port.address,
        "node_uuid": port.node_uuid,
        "pxe_enabled": port.pxe_enabled,
        "extra": port.extra,
        "local_link_connection": a.local_link_connection,
        "portgroup_uuid": a.portgroup_uuid,
        "physical_network": a.physical_network,
        "is_smartnic": a.is_smartnic,
        "name": a.name,
        "description": a.description,
        "vendor": a.vendor,
        "category": a.category,
        "available_for_dynamic_portgroup": a.available_for_dynamic_portgroup,
    });
    patch::apply(&mut doc, &ops, PATCHABLE)?;
    let Value::Object(doc) = doc else {
        return Err(ApiError::bad_request("patch replaced the whole port"));
    };
    let address = match doc.get("address") {
        Some(Value::String(a)) => mac(a)?,
        _ => return Err(ApiError::bad_request("'address' is a required property")),
    };
    let node_ident = match doc.get("node_uuid") {
        Some(Value::String(n)) => n.clone(),
        _ => return Err(ApiError::bad_request("'node_uuid' is a required property")),
    };
    let node = node_ref(&state, &node_ident).await?;
    refuse_locked(&node)?;
    if node.provision_state == rivet_protocol::states::ProvisionState::Inspecting {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "Cannot update port \"{}\" on \"{}\" while it is in state \"inspecting\".",
                port.uuid, node.uuid
            ),
        ));
    }
    let (pxe, extra, mut attrs) = attrs_of(&doc, version, a.internal_info.clone())?;
    let mut group = None;
    if let Some(pg_ident) = attrs.portgroup_uuid.clone() {
        let pg = portgroup_ref(&state, &pg_ident, &node.uuid).await?;
        check_standalone(&pg, pxe)?;
        attrs.portgroup_uuid = Some(pg.uuid.clone());
        group = Some(pg);
    }
    if version >= super::portgroups::PHYSNET_VERSION
        && touched.iter().any(|f| f == "physical_network")
        && attrs.portgroup_uuid.is_some()
    {
        return Err(ApiError::bad_request(
            "physical_network cannot be changed while the port belongs to a portgroup.",
        ));
    }
    // Ironic's conductor (update_port): no new MAC for a node in use, connectivity only
    // while the node is not deployed, and a group member on its group's network.
    let in_use = node.provision_state == rivet_protocol::states::ProvisionState::Active
        || node.instance_uuid.is_some();
    if address != port.address && in_use && !node.maintenance {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "Cannot update hardware address for port {} as node {} is active or has \
                 instance UUID assigned; set maintenance first",
                port.uuid, node.uuid
            ),
        ));
    }
    let connectivity = attrs.portgroup_uuid != a.portgroup_uuid
        || pxe != port.pxe_enabled
        || attrs.local_link_connection != a.local_link_connection
        || attrs.physical_network != a.physical_network;
    if connectivity && !connectivity_editable(&node) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "Port {} can not have any connectivity attributes (portgroup_id, \
                 pxe_enabled, local_link_connection, physical_network) updated unless node \
                 {} is in a enroll, inspecting, inspect wait, manageable state or in \
                 maintenance mode. The current state is {}.",
                port.uuid, node.uuid, node.provision_state
            ),
        ));
    }
    if let Some(pg) = &group {
        if attrs.portgroup_uuid != a.portgroup_uuid || attrs.physical_network != a.physical_network
        {
            check_physnet(&state, &port.uuid, pg, &attrs.physical_network).await?;
        }
    }
    let new = Port {
        address,
        node_uuid: node.uuid,
        pxe_enabled: pxe,
        extra,
        attrs,
        ..port
    };
    let saved = state.conductor.store.update_port(&new).await?;
    Ok(Json(Value::Object(port_doc(
        &saved,
        &base_url(&headers),
        version,
    ))))
}

async fn remove(State(state): State<AppState>, Path(ident): Path<String>) -> ApiResult<StatusCode> {
    let uuid = check_uuid("port_uuid", &ident)?;
    let port = fetch(&state, &uuid).await?;
    let node = state.conductor.store.get_node(&port.node_uuid).await?;
    refuse_locked(&node)?;
    let vif = VIF_KEYS
        .iter()
        .find_map(|k| port.attrs.internal_info.get(*k).and_then(Value::as_str));
    if let (Some(vif), false) = (vif, node.maintenance) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "Cannot delete the port {uuid} as it is bound to VIF {vif} for use; detach \
                 it (or set maintenance) first."
            ),
        ));
    }
    match state.conductor.store.delete_port(&uuid).await {
        Err(StoreError::NotFound { .. }) => Err(port_not_found(&uuid)),
        r => {
            r?;
            Ok(StatusCode::NO_CONTENT)
        }
    }
}
