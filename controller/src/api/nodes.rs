//! `/v1/nodes`: create, list, show, patch, delete, states, maintenance.

use super::node_json::{JsonBytes, NodeShape};
use super::render::{base_url, node_full, parse_fields};
use super::{listing, patch, ApiError, ApiResult, ApiVersion, AppState, JsonBody};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Extension, Json, Router};
use rivet_drivers::DRIVERS;
use rivet_model::interfaces::{Iface, Interfaces};
use rivet_model::node::Node;
use rivet_protocol::api::{
    MaintenanceRequest, NodeCreate, PatchOp, PowerRequest, ProvisionRequest,
};
use rivet_protocol::patch::NODE_PATCHABLE;
use rivet_store::NodeExt;
use rivet_store::{NodeQuery, NODE_SORT_KEYS};
use serde_json::{json, Map, Value};
use std::collections::HashMap;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/nodes", get(list::<false>).post(create))
        .route("/v1/nodes/", get(list::<false>).post(create))
        .route("/v1/nodes/detail", get(list::<true>))
        .route("/v1/nodes/{ident}", get(show).patch(update).delete(remove))
        .route("/v1/nodes/{ident}/states", get(states))
        .route("/v1/nodes/{ident}/states/provision", put(provision))
        // Abort the running provision task (the seed's spelling of `abort`).
        .route(
            "/v1/nodes/{ident}/provision",
            axum::routing::delete(abort_provision),
        )
        .route("/v1/nodes/{ident}/states/power", put(power))
        .route(
            "/v1/nodes/{ident}/maintenance",
            put(maintenance_on).delete(maintenance_off),
        )
        .route(
            "/v1/nodes/{ident}/ports",
            get(super::resource::list::<super::ports::Api, super::resource::OfNode, false>)
                .post(super::ports::no_sub_write),
        )
        .route("/v1/nodes/{ident}/inventory", get(inventory))
        .route("/v1/nodes/{ident}/clean_steps", get(clean_steps))
}

const LIST_PARAMS: &[&str] = &[
    "limit",
    "marker",
    "sort_key",
    "sort_dir",
    "provision_state",
    "maintenance",
    "driver",
    "resource_class",
    "fields",
    "detail",
    "owner",
    "lessee",
    "conductor_group",
    "shard",
    "retired",
    "associated",
    "instance_uuid",
    "fault",
    "chassis_uuid",
    "instance_name",
    "sharded",
    "project",
    "description_contains",
    "conductor",
    "include_children",
    "parent_node",
];

/// Node list filters Ironic refuses (406) below the microversion that added them.
const FILTER_VERSIONS: &[(&str, (u32, u32))] = &[
    ("driver", (1, 16)),
    ("resource_class", (1, 21)),
    ("fault", (1, 42)),
    ("conductor_group", (1, 46)),
    ("conductor", (1, 49)),
    ("owner", (1, 50)),
    ("lessee", (1, 65)),
    ("shard", (1, 82)),
    ("sharded", (1, 82)),
    ("instance_name", (1, 104)),
    ("include_children", (1, 83)),
    ("parent_node", (1, 83)),
];

/// Ironic's node faults (`ironic.common.faults`): a `fault` filter must name one.
const FAULTS: &[&str] = &[
    "power failure",
    "clean failure",
    "rescue abort failure",
    "service failure",
];

fn node_query(
    params: &HashMap<String, String>,
    max_limit: usize,
    version: (u32, u32),
) -> Result<NodeQuery, ApiError> {
    listing::only_params(params.keys(), LIST_PARAMS)?;
    for (name, since) in FILTER_VERSIONS {
        if params.contains_key(*name) && version < *since {
            return Err(ApiError::new(
                StatusCode::NOT_ACCEPTABLE,
                format!(
                    "filtering nodes by {name} needs API version {}.{} or later",
                    since.0, since.1
                ),
            ));
        }
    }
    let mut q = NodeQuery {
        limit: listing::page_limit(params, max_limit)?,
        ..Default::default()
    };
    q.marker = params.get("marker").cloned();
    if let Some(k) = params.get("sort_key") {
        if !NODE_SORT_KEYS.contains(&k.as_str()) {
            return Err(ApiError::bad_request(format!(
                "sort_key {k:?} is not supported; use one of {}",
                NODE_SORT_KEYS.join(", ")
            )));
        }
        q.sort_key = k.clone();
    }
    if let Some(d) = params.get("sort_dir") {
        q.sort_dir = listing::sort_dir(d)
            .ok_or_else(|| ApiError::bad_request(format!("sort_dir {d:?} must be asc or desc")))?;
    }
    if let Some(s) = params.get("provision_state") {
        q.provision_state = Some(s.parse().map_err(|_| {
            ApiError::bad_request(format!("provision_state {s:?} is not a known state"))
        })?);
    }
    q.maintenance = listing::bool_param(params, "maintenance")?;
    q.driver = params.get("driver").cloned();
    q.resource_class = params.get("resource_class").cloned();
    q.owner = params.get("owner").cloned();
    q.lessee = params.get("lessee").cloned();
    q.conductor_group = params.get("conductor_group").map(|g| g.to_lowercase());
    if let Some(s) = params.get("shard") {
        q.shards = listing::split_list(s);
    }
    q.sharded = listing::bool_param(params, "sharded")?;
    q.instance_name = params.get("instance_name").cloned();
    q.project = params.get("project").cloned();
    q.description_contains = params.get("description_contains").cloned();
    q.instance_uuid = params.get("instance_uuid").cloned();
    q.fault = params.get("fault").cloned();
    if let Some(f) = &q.fault {
        if !FAULTS.contains(&f.as_str()) {
            return Err(ApiError::bad_request(format!(
                "Unrecognized fault {f:?} is specified, allowed faults are {}",
                FAULTS.join(", ")
            )));
        }
    }
    q.chassis_uuid = params.get("chassis_uuid").cloned();
    q.retired = listing::bool_param(params, "retired")?;
    q.associated = listing::bool_param(params, "associated")?;
    // Ironic lists child nodes only when asked: `include_children` (then `parent_node` is
    // not read) or `parent_node`.
    let include_children = match params.get("include_children") {
        Some(v) => super::listing::bool_value("include_children", v)?,
        None => false,
    };
    q.hide_children = !include_children;
    if !include_children {
        q.parent_node = params.get("parent_node").cloned();
    }
    Ok(q)
}

/// Ironic's conductor group rule: letters, digits, `_`, `-`, `.`, at most 255, stored lower
/// case.
fn check_conductor_group(g: &str) -> Result<String, ApiError> {
    if g.len() > 255
        || !g
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
    {
        return Err(ApiError::bad_request(format!(
            "conductor_group {g:?} is invalid: use at most 255 letters, digits, '_', '-' or '.'"
        )));
    }
    Ok(g.to_lowercase())
}

/// An optional UUID field (`instance_uuid`): canonical form, or a 400 naming the field.
fn check_uuid(field: &str, v: Option<String>) -> Result<Option<String>, ApiError> {
    v.map(|u| {
        uuid::Uuid::parse_str(&u)
            .map(|u| u.to_string())
            .map_err(|_| ApiError::bad_request(format!("{field} {u:?} is not a valid UUID")))
    })
    .transpose()
}

/// A free-text field of at most `max` characters.
fn check_len(field: &str, v: &Option<String>, max: usize) -> Result<(), ApiError> {
    match v {
        Some(s) if s.chars().count() > max => Err(ApiError::bad_request(format!(
            "{field} is {} characters long; at most {max} are allowed",
            s.chars().count()
        ))),
        _ => Ok(()),
    }
}

/// `parent_node` names an existing other node; stored as its UUID.
async fn resolve_parent(
    state: &AppState,
    node: &Node,
    parent: Option<String>,
) -> Result<Option<String>, ApiError> {
    let Some(p) = parent else { return Ok(None) };
    match state.conductor.store.get_node(&p).await {
        Ok(n) if n.uuid == node.uuid => Err(ApiError::bad_request(format!(
            "node {} cannot be its own parent_node",
            node.ident()
        ))),
        Ok(n) => Ok(Some(n.uuid)),
        Err(rivet_store::StoreError::NotFound { .. }) => Err(ApiError::bad_request(format!(
            "parent_node {p:?} is not a node"
        ))),
        Err(e) => Err(e.into()),
    }
}

/// `chassis_uuid` names an existing chassis; a missing one is a 400 on a node request (as
/// Ironic).
async fn resolve_chassis(state: &AppState, c: Option<String>) -> Result<Option<String>, ApiError> {
    let Some(c) = c else { return Ok(None) };
    match state.conductor.store.get_chassis(&c).await {
        Ok(ch) => Ok(Some(ch.uuid)),
        Err(rivet_store::StoreError::NotFound { .. }) => Err(ApiError::bad_request(format!(
            "Chassis {c} could not be found."
        ))),
        Err(e) => Err(e.into()),
    }
}

/// Ironic's rules for `protected` and `retired` (conductor `update_node`): protection only
/// in `active` or `rescue` (409), a reason only with the flag set (400), retiring not in
/// `available` (409); clearing the flag clears the reason.
fn check_lifecycle_flags(old: &Node, new: &mut Node) -> Result<(), ApiError> {
    use rivet_protocol::states::ProvisionState::{Active, Available, Rescue};
    let a = &mut new.attrs;
    if a.protected != old.attrs.protected {
        if !a.protected {
            a.protected_reason = None;
        } else if !matches!(new.provision_state, Active | Rescue) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "Node {} can only be made protected in provision states 'active' or 'rescue', the current state is '{}'",
                    old.uuid, new.provision_state
                ),
            ));
        }
    }
    if a.protected_reason.is_some() && !a.protected {
        return Err(ApiError::bad_request(
            "The protected_reason field can only be set when protected is True",
        ));
    }
    if a.retired != old.attrs.retired {
        if !a.retired {
            a.retired_reason = None;
        } else if new.provision_state == Available {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "Node {} can not have 'retired' set in provision state 'available', the current state is 'available'",
                    old.uuid
                ),
            ));
        }
    }
    if a.retired_reason.is_some() && !a.retired {
        return Err(ApiError::bad_request(
            "The retired_reason field can only be set when retired is True",
        ));
    }
    Ok(())
}

/// A boolean node field; a string form (`"True"`) is taken as Ironic takes it.
fn opt_bool(doc: &mut Map<String, Value>, key: &str) -> Result<bool, ApiError> {
    Ok(nullable_bool(doc, key)?.unwrap_or(false))
}

fn nullable_bool(doc: &mut Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    match doc.remove(key) {
        Some(Value::Bool(b)) => Ok(Some(b)),
        Some(Value::String(s)) if rivet_protocol::api::parse_bool_str(&s).is_some() => {
            Ok(rivet_protocol::api::parse_bool_str(&s))
        }
        Some(Value::Null) | None => Ok(None),
        Some(other) => Err(ApiError::bad_request(format!(
            "field {key} must be true, false or null, not {other}"
        ))),
    }
}

pub(super) async fn list_inner(
    state: &AppState,
    headers: &HeaderMap,
    version: (u32, u32),
    params: HashMap<String, String>,
    mut detail: bool,
) -> ApiResult<JsonBytes> {
    let max = state.conductor.config.api.max_limit;
    let mut q = node_query(&params, max, version)?;
    if let Some(d) = params.get("detail") {
        detail |= super::listing::bool_value("detail", d)?;
    }
    let base = base_url(headers);
    let ring = state.conductor.ring();
    let me = state.conductor.id();
    let mut nodes = match params.get("conductor") {
        None => list_page(state, &q).await?,
        // The owner is the hash ring's answer now, not a column: filter page by page.
        Some(c) => {
            let mut kept = Vec::new();
            loop {
                let page = list_page(state, &q).await?;
                let full = page.len() == q.limit;
                q.marker = page.last().map(|n| n.uuid.clone());
                kept.extend(
                    page.into_iter()
                        .filter(|n| ring.owner(&n.uuid).unwrap_or(me) == c.as_str()),
                );
                if kept.len() >= q.limit || !full {
                    break;
                }
            }
            kept.truncate(q.limit);
            kept
        }
    };
    for n in &mut nodes {
        show_owner(&ring, me, n);
    }
    // `fields` names are checked against a document as this version shows it.
    let fields = match params.get("fields") {
        None => None,
        Some(f) => {
            super::render::check_node_fields(f.split(',').map(str::trim), version)?;
            let template = match nodes.first() {
                Some(n) => node_doc(n, &base, version),
                None => node_doc(&Node::new(String::new(), String::new()), &base, version),
            };
            parse_fields(Some(f), &template)?
        }
    };
    let uuids: Vec<String> = nodes.iter().map(|n| n.uuid.clone()).collect();
    let kept = state.conductor.store.node_managements(&uuids).await?;
    let mut next = None;
    if nodes.len() == q.limit {
        if let Some(last) = nodes.last() {
            let path = if detail {
                "/v1/nodes/detail"
            } else {
                "/v1/nodes"
            };
            let link = listing::NextLink::new(&base, path, q.limit)
                .marker(&last.uuid)
                .params_of(&params, LIST_PARAMS)
                .build();
            next = Some(link);
        }
    }
    // Written straight to bytes: the same JSON as the documents of `node_doc` (tested so in
    // node_json), without building them.
    let shape = NodeShape::new(&base, version, fields.as_deref(), detail)?;
    Ok(JsonBytes(shape.listing(&nodes, &kept, next.as_deref())?))
}

/// One page of nodes; a marker that is not a node is the client's error.
async fn list_page(state: &AppState, q: &NodeQuery) -> ApiResult<Vec<Node>> {
    state
        .conductor
        .store
        .list_nodes(q)
        .await
        .map_err(|e| match e {
            rivet_store::StoreError::NotFound { ident, .. } => {
                ApiError::bad_request(format!("marker {ident} is not a node UUID"))
            }
            e => e.into(),
        })
}

/// A node's document as a client at `version` sees it.
fn node_doc(n: &Node, base: &str, version: (u32, u32)) -> Map<String, Value> {
    let mut doc = node_full(n, base);
    super::render::gate_node(&mut doc, version);
    doc
}

/// `GET /v1/nodes` (`DETAIL`: `/v1/nodes/detail`).
async fn list<const DETAIL: bool>(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiVersion(version): ApiVersion,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<JsonBytes> {
    list_inner(&state, &headers, version, params, DETAIL).await
}

/// A node name must be usable in URLs and not look like a UUID.
fn check_name(name: &str) -> Result<(), ApiError> {
    let ok_chars = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-._~".contains(c));
    if name.is_empty() || name.len() > 255 || !ok_chars {
        return Err(ApiError::bad_request(format!(
            "name {name:?} is not valid: use 1-255 characters from A-Z a-z 0-9 - . _ ~"
        )));
    }
    if uuid::Uuid::parse_str(name).is_ok() || name == "detail" {
        return Err(ApiError::bad_request(format!(
            "name {name:?} is not valid: it must not be a UUID or a reserved word"
        )));
    }
    Ok(())
}

fn check_driver(driver: &str) -> Result<(), ApiError> {
    if DRIVERS.contains(&driver) || driver == "fake" {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "driver {driver:?} is not supported; available drivers: {}",
            DRIVERS.join(", ")
        )))
    }
}

/// `conductor` is the controller that owns the node on the hash ring now (Ironic's meaning),
/// not the last one that happened to write it.
fn show_owner(ring: &rivet_support::cluster::HashRing, me: &str, node: &mut Node) {
    node.conductor = Some(ring.owner(&node.uuid).unwrap_or(me).to_string());
}

fn etag(resp: &mut Response, version: i64) {
    if let Ok(v) = HeaderValue::from_str(&format!("\"{version}\"")) {
        resp.headers_mut().insert(header::ETAG, v);
    }
}

fn node_response(
    status: StatusCode,
    node: &Node,
    headers: &HeaderMap,
    version: (u32, u32),
    kept: &rivet_store::NodeManagement,
) -> Response {
    let base = base_url(headers);
    let mut doc = node_doc(node, &base, version);
    super::node_actions::node_fields::apply(&mut doc, kept);
    let mut resp = (status, Json(Value::Object(doc))).into_response();
    etag(&mut resp, node.version);
    resp
}

async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiVersion(version): ApiVersion,
    JsonBody(req): JsonBody<NodeCreate>,
) -> ApiResult<Response> {
    super::render::check_node_fields(given_fields(&req), version)?;
    check_driver(&req.driver)?;
    if let Some(n) = &req.name {
        check_name(n)?;
    }
    let uuid = match &req.uuid {
        Some(u) => uuid::Uuid::parse_str(u)
            .map_err(|_| ApiError::bad_request(format!("uuid {u:?} is not a valid UUID")))?
            .to_string(),
        None => uuid::Uuid::new_v4().to_string(),
    };
    // driver_info is checked by `manage` (verifying), as in Ironic: operators often create a
    // node first and fill in the BMC details afterwards.
    let mut node = Node::new(uuid, req.driver.clone());
    node.name = req.name.clone();
    node.driver_info = req.driver_info.clone();
    node.properties = req.properties.clone();
    node.instance_info = req.instance_info.clone();
    node.extra = req.extra.clone();
    node.resource_class = req.resource_class.clone();
    node.automated_clean = req.automated_clean;
    for (field, v, max) in [
        ("resource_class", &req.resource_class, 80),
        ("owner", &req.owner, 255),
        ("lessee", &req.lessee, 255),
        ("description", &req.description, 4096),
        ("shard", &req.shard, 255),
        ("instance_name", &req.instance_name, 255),
    ] {
        check_len(field, v, max)?;
    }
    node.attrs.owner = req.owner.clone();
    node.attrs.lessee = req.lessee.clone();
    node.attrs.description = req.description.clone();
    node.attrs.shard = req.shard.clone();
    node.attrs.instance_name = req.instance_name.clone();
    node.attrs.conductor_group =
        check_conductor_group(req.conductor_group.as_deref().unwrap_or(""))?;
    node.attrs.network_data = req.network_data.clone().unwrap_or_default();
    super::network_data::check(&node.attrs.network_data)?;
    node.attrs.disable_power_off = req.disable_power_off.unwrap_or(false);
    node.attrs.retired = req.retired.unwrap_or(false);
    node.attrs.retired_reason = req.retired_reason.clone();
    if node.attrs.retired_reason.is_some() && !node.attrs.retired {
        return Err(ApiError::bad_request(
            "The retired_reason field can only be set when retired is True",
        ));
    }
    node.instance_uuid = check_uuid("instance_uuid", req.instance_uuid.clone())?;
    node.maintenance = req.maintenance.unwrap_or(false);
    node.attrs.parent_node = resolve_parent(&state, &node, req.parent_node.clone()).await?;
    node.chassis_uuid = resolve_chassis(&state, req.chassis_uuid.clone()).await?;
    // Stored resolved, as the other interfaces: the hardware type's default when not given.
    node.inspect_interface = match check_inspect_interface(req.inspect_interface.clone())? {
        Some(i) => Some(i),
        None => default_inspect(&node.driver),
    };
    check_inspect_for_driver(
        node.name.as_deref().unwrap_or(""),
        &node.driver,
        node.inspect_interface.as_deref(),
    )?;
    node.interfaces = interfaces_from_create(&req, &node.driver)?;
    node.provision_updated_at = Some(node.created_at);
    // Ironic's contract with clients older than 1.11 (which know no `enroll`): their nodes
    // are created `available`, unverified and uncleaned, as Ironic creates them.
    if version < (1, 11) {
        node.provision_state = rivet_protocol::states::ProvisionState::Available;
    }
    let mut node = state.conductor.store.create_node(&node).await?;
    state.conductor.events.publish(&node);
    tracing::info!(node = %node.uuid, name = node.name.as_deref().unwrap_or(""), "node created");
    show_owner(&state.conductor.ring(), state.conductor.id(), &mut node);
    let mut resp = node_response(
        StatusCode::CREATED,
        &node,
        &headers,
        version,
        &Default::default(),
    );
    if let Ok(loc) =
        HeaderValue::from_str(&format!("{}/v1/nodes/{}", base_url(&headers), node.uuid))
    {
        resp.headers_mut().insert(header::LOCATION, loc);
    }
    Ok(resp)
}

async fn show(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiVersion(version): ApiVersion,
    Path(ident): Path<String>,
    Query(p): Query<super::listing::ShowParams>,
) -> ApiResult<Response> {
    let mut node = state.conductor.store.get_node(&ident).await?;
    show_owner(&state.conductor.ring(), state.conductor.id(), &mut node);
    if let Some(f) = &p.fields {
        super::render::check_node_fields(f.split(',').map(str::trim), version)?;
    }
    let mut full = node_doc(&node, &base_url(&headers), version);
    let kept = state.conductor.store.node_management(&node.uuid).await?;
    super::node_actions::node_fields::apply(&mut full, &kept);
    let mut resp = match parse_fields(p.fields.as_deref(), &full)? {
        Some(f) => Json(super::render::sanitized(full, &f)).into_response(),
        None => Json(Value::Object(full)).into_response(),
    };
    etag(&mut resp, node.version);
    Ok(resp)
}

/// The versioned fields a create body gives a value (Ironic's
/// `reject_fields_in_newer_versions`: a field newer than the request is 406 unless it is
/// null, or `""` for `conductor_group`).
fn given_fields(req: &NodeCreate) -> Vec<&'static str> {
    let group = req.conductor_group.as_deref().filter(|g| !g.is_empty());
    let given = [
        ("name", req.name.is_some()),
        ("resource_class", req.resource_class.is_some()),
        ("automated_clean", req.automated_clean.is_some()),
        ("owner", req.owner.is_some()),
        ("lessee", req.lessee.is_some()),
        ("description", req.description.is_some()),
        ("conductor_group", group.is_some()),
        ("shard", req.shard.is_some()),
        ("network_data", req.network_data.is_some()),
        ("instance_name", req.instance_name.is_some()),
        ("parent_node", req.parent_node.is_some()),
        ("disable_power_off", req.disable_power_off.is_some()),
        ("retired", req.retired.is_some()),
        ("retired_reason", req.retired_reason.is_some()),
        ("boot_interface", req.boot_interface.is_some()),
        ("deploy_interface", req.deploy_interface.is_some()),
        ("power_interface", req.power_interface.is_some()),
        ("management_interface", req.management_interface.is_some()),
        ("rescue_interface", req.rescue_interface.is_some()),
        ("bios_interface", req.bios_interface.is_some()),
        ("console_interface", req.console_interface.is_some()),
        ("firmware_interface", req.firmware_interface.is_some()),
        ("network_interface", req.network_interface.is_some()),
        ("raid_interface", req.raid_interface.is_some()),
        ("storage_interface", req.storage_interface.is_some()),
        ("vendor_interface", req.vendor_interface.is_some()),
        ("inspect_interface", req.inspect_interface.is_some()),
    ];
    given
        .into_iter()
        .filter_map(|(field, set)| set.then_some(field))
        .collect()
}

/// The interfaces of a node being created: those given, the hardware type's defaults for the
/// rest (stored resolved, as Ironic does), each checked against the hardware type.
fn interfaces_from_create(req: &NodeCreate, driver: &str) -> Result<Interfaces, ApiError> {
    let mut i = Interfaces::default();
    for iface in Iface::ALL {
        let given = match iface {
            Iface::Boot => &req.boot_interface,
            Iface::Deploy => &req.deploy_interface,
            Iface::Power => &req.power_interface,
            Iface::Management => &req.management_interface,
            Iface::Rescue => &req.rescue_interface,
            Iface::Bios => &req.bios_interface,
            Iface::Console => &req.console_interface,
            Iface::Firmware => &req.firmware_interface,
            Iface::Network => &req.network_interface,
            Iface::Raid => &req.raid_interface,
            Iface::Storage => &req.storage_interface,
            Iface::Vendor => &req.vendor_interface,
        };
        i.set(*iface, given.clone());
    }
    let name = req.name.clone().unwrap_or_default();
    i.validate(&name, driver)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok(i.with_defaults(driver))
}

/// Inspection interfaces: in-band through the agent, or out-of-band through a driver.
const INSPECT_INTERFACES: &[&str] = &["agent", "fake", "redfish", "no-inspect"];

fn check_inspect_interface(v: Option<String>) -> Result<Option<String>, ApiError> {
    match v {
        Some(i) if !INSPECT_INTERFACES.contains(&i.as_str()) => {
            Err(ApiError::bad_request(format!(
                "inspect_interface {i:?} is not supported; use one of {}",
                INSPECT_INTERFACES.join(", ")
            )))
        }
        v => Ok(v),
    }
}

/// The inspect interface a node of `driver` gets when none is chosen (`None`: an unknown
/// driver, refused elsewhere; a node stored so reads as `agent`).
fn default_inspect(driver: &str) -> Option<String> {
    let hw = rivet_model::interfaces::hardware_type(driver)?;
    super::drivers::inspect_interfaces(hw)
        .first()
        .map(|i| i.to_string())
}

/// A node's inspect interface must be one its hardware type enables (checked when the
/// driver changes: the interface was chosen for the old one).
fn check_inspect_for_driver(
    node: &str,
    driver: &str,
    inspect: Option<&str>,
) -> Result<(), ApiError> {
    let (Some(value), Some(hw)) = (inspect, rivet_model::interfaces::hardware_type(driver)) else {
        return Ok(());
    };
    let enabled = super::drivers::inspect_interfaces(hw);
    if enabled.contains(&value) {
        return Ok(());
    }
    Err(ApiError::bad_request(format!(
        "node {node}: inspect_interface {value:?} is not enabled for hardware type {}; use \
         one of {} (pass reset_interfaces=true to reset the interfaces to the new driver's \
         defaults)",
        hw.name,
        enabled.join(", ")
    )))
}

fn check_if_match(headers: &HeaderMap, node: &Node) -> Result<(), ApiError> {
    if let Some(want) = headers.get(header::IF_MATCH).and_then(|v| v.to_str().ok()) {
        let want = want.trim().trim_start_matches("W/").trim_matches('"');
        if want != "*" && want != node.version.to_string() {
            return Err(ApiError::new(
                StatusCode::PRECONDITION_FAILED,
                format!(
                    "node {} has changed: If-Match \"{want}\" does not match its current ETag \"{}\"; reload it and retry",
                    node.ident(),
                    node.version
                ),
            ));
        }
    }
    Ok(())
}

/// Ironic changes a node's interfaces only in enroll, inspecting, inspect wait, manageable
/// or available, or in maintenance (409 otherwise).
fn check_interface_change_allowed(node: &Node, field: &str) -> Result<(), ApiError> {
    use rivet_protocol::states::ProvisionState::{
        Available, Enroll, InspectWait, Inspecting, Manageable,
    };
    if node.maintenance
        || matches!(
            node.provision_state,
            Enroll | Inspecting | InspectWait | Manageable | Available
        )
    {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        format!(
            "Node {} can not have {field} updated unless it is in one of allowed (enroll, inspecting, inspect wait, manageable, available) states or in maintenance mode. Current state is '{}'.",
            node.uuid, node.provision_state
        ),
    ))
}

fn map_field(doc: &mut Map<String, Value>, key: &str) -> Result<Map<String, Value>, ApiError> {
    match doc.remove(key) {
        Some(Value::Object(m)) => Ok(m),
        Some(Value::Null) | None => Ok(Map::new()),
        Some(other) => Err(ApiError::bad_request(format!(
            "field {key} must be an object, not {other}"
        ))),
    }
}

fn opt_string(doc: &mut Map<String, Value>, key: &str) -> Result<Option<String>, ApiError> {
    match doc.remove(key) {
        Some(Value::String(s)) => Ok(Some(s)),
        Some(Value::Null) | None => Ok(None),
        Some(other) => Err(ApiError::bad_request(format!(
            "field {key} must be a string or null, not {other}"
        ))),
    }
}

/// The query `PATCH /v1/nodes/{node}` takes.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchParams {
    /// 1.45: reset the interfaces the patch does not set to the new driver's defaults.
    reset_interfaces: Option<String>,
}

/// The top-level field a patch path names, JSON pointer escapes (`~1`, `~0`) decoded.
fn patched_field(path: &str) -> String {
    let top = path.trim_start_matches('/').split('/').next().unwrap_or("");
    top.replace("~1", "/").replace("~0", "~")
}

async fn update(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiVersion(version): ApiVersion,
    Path(ident): Path<String>,
    Query(params): Query<PatchParams>,
    JsonBody(ops): JsonBody<Vec<PatchOp>>,
) -> ApiResult<Response> {
    let reset_interfaces = match &params.reset_interfaces {
        Some(_) if version < (1, 45) => {
            return Err(ApiError::new(
                StatusCode::NOT_ACCEPTABLE,
                "reset_interfaces needs API version 1.45 or later",
            ))
        }
        Some(r) => super::listing::bool_value("reset_interfaces", r)?,
        None => false,
    };
    if reset_interfaces && !ops.iter().any(|op| patched_field(&op.path) == "driver") {
        return Err(ApiError::bad_request(
            "The reset_interfaces parameter can only be used when changing the node's driver.",
        ));
    }
    // Ironic's `reject_patch_in_newer_versions`: a value set on a patchable field newer than
    // the request (a removal, or a path inside the field, is not looked at).
    let newer: Vec<String> = ops
        .iter()
        .filter(|op| op.op != "remove" && !op.path.trim_start_matches('/').contains('/'))
        .map(|op| patched_field(&op.path))
        .filter(|f| NODE_PATCHABLE.contains(&f.as_str()))
        .collect();
    super::render::check_node_fields(newer.iter().map(String::as_str), version)?;
    if ops.iter().any(|op| patched_field(&op.path) == "traits") {
        return Err(ApiError::bad_request(
            "Cannot update node traits via node patch. Node traits should be updated via the node traits API.",
        ));
    }
    let node = state.conductor.store.get_node(&ident).await?;
    check_if_match(&headers, &node)?;
    if let Some(by) = &node.reservation {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "node {} is locked by conductor {by} while it is in \"{}\"; retry when the operation ends",
                node.ident(),
                node.provision_state
            ),
        ));
    }
    let mut doc = json!({
        "name": node.name,
        "driver": node.driver,
        "driver_info": node.driver_info,
        "properties": node.properties,
        "instance_info": node.instance_info,
        "instance_uuid": node.instance_uuid,
        "extra": node.extra,
        "resource_class": node.resource_class,
        "automated_clean": node.automated_clean,
        "inspect_interface": node.inspect_interface,
    });
    let a = &node.attrs;
    for (k, v) in [
        ("owner", json!(a.owner)),
        ("lessee", json!(a.lessee)),
        ("description", json!(a.description)),
        ("conductor_group", json!(a.conductor_group)),
        ("shard", json!(a.shard)),
        ("network_data", json!(a.network_data)),
        ("instance_name", json!(a.instance_name)),
        ("parent_node", json!(a.parent_node)),
        ("chassis_uuid", json!(node.chassis_uuid)),
        ("disable_power_off", json!(a.disable_power_off)),
        ("retired", json!(a.retired)),
        ("retired_reason", json!(a.retired_reason)),
        ("protected", json!(a.protected)),
        ("protected_reason", json!(a.protected_reason)),
        ("maintenance", json!(node.maintenance)),
    ] {
        doc[k] = v;
    }
    for (iface, value) in node.interfaces.resolved(&node.driver) {
        doc[iface.field()] = Value::from(value);
    }
    patch::apply(&mut doc, &ops, NODE_PATCHABLE)?;
    let Value::Object(mut doc) = doc else {
        return Err(ApiError::bad_request("patch replaced the whole node"));
    };
    let mut new = node.clone();
    new.name = opt_string(&mut doc, "name")?;
    if let Some(n) = &new.name {
        check_name(n)?;
    }
    new.driver = opt_string(&mut doc, "driver")?
        .ok_or_else(|| ApiError::bad_request("field driver cannot be removed"))?;
    check_driver(&new.driver)?;
    // As Ironic: with `reset_interfaces` a changed driver resets every interface the same
    // patch does not set to the new hardware type's default; without it the node keeps its
    // interfaces, which must then suit the new driver. A removed one goes back to the default.
    let driver_changed = new.driver != node.driver;
    let mut interfaces = Interfaces::default();
    let mut changed_iface = None;
    for iface in Iface::ALL {
        let field = iface.field();
        let patched = ops.iter().any(|op| patched_field(&op.path) == field);
        let value = opt_string(&mut doc, &field)?;
        let before = Some(node.interfaces.get(&node.driver, *iface));
        if patched && value != before {
            changed_iface = Some(field);
        }
        if patched || !(driver_changed && reset_interfaces) {
            interfaces.set(*iface, value);
        }
    }
    if let Some(field) = changed_iface {
        check_interface_change_allowed(&node, &field)?;
    }
    interfaces.validate(new.ident(), &new.driver).map_err(|e| {
        let hint = if driver_changed && !reset_interfaces {
            " (pass reset_interfaces=true to reset the interfaces to the new driver's defaults)"
        } else {
            ""
        };
        ApiError::bad_request(format!("{e}{hint}"))
    })?;
    new.interfaces = interfaces.with_defaults(&new.driver);
    // Inspection is an interface like the others for a driver change (Ironic resets every
    // one in ALL_INTERFACES), though Rivet keeps it in its own column.
    let inspect = opt_string(&mut doc, "inspect_interface")?;
    let inspect_patched = ops
        .iter()
        .any(|op| patched_field(&op.path) == "inspect_interface");
    new.inspect_interface = if driver_changed && reset_interfaces && !inspect_patched {
        default_inspect(&new.driver)
    } else {
        check_inspect_interface(inspect)?
    };
    if driver_changed {
        check_inspect_for_driver(new.ident(), &new.driver, new.inspect_interface.as_deref())?;
    }
    new.driver_info = map_field(&mut doc, "driver_info")?;
    new.properties = map_field(&mut doc, "properties")?;
    new.instance_info = map_field(&mut doc, "instance_info")?;
    new.extra = map_field(&mut doc, "extra")?;
    new.instance_uuid = check_uuid("instance_uuid", opt_string(&mut doc, "instance_uuid")?)?;
    new.resource_class = opt_string(&mut doc, "resource_class")?;
    new.automated_clean = nullable_bool(&mut doc, "automated_clean")?;
    new.attrs.owner = opt_string(&mut doc, "owner")?;
    new.attrs.lessee = opt_string(&mut doc, "lessee")?;
    new.attrs.description = opt_string(&mut doc, "description")?;
    new.attrs.shard = opt_string(&mut doc, "shard")?;
    new.attrs.instance_name = opt_string(&mut doc, "instance_name")?;
    // As Ironic: a changed instance_info whose `display_name` is set names the instance
    // when nothing else does (nova writes display_name; clients read instance_name).
    if new.instance_info != node.instance_info && new.attrs.instance_name.is_none() {
        new.attrs.instance_name = new
            .instance_info
            .get("display_name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .map(str::to_string);
    }
    for (field, v, max) in [
        ("resource_class", &new.resource_class, 80),
        ("owner", &new.attrs.owner, 255),
        ("lessee", &new.attrs.lessee, 255),
        ("description", &new.attrs.description, 4096),
        ("shard", &new.attrs.shard, 255),
        ("instance_name", &new.attrs.instance_name, 255),
    ] {
        check_len(field, v, max)?;
    }
    new.attrs.conductor_group =
        check_conductor_group(&opt_string(&mut doc, "conductor_group")?.unwrap_or_default())?;
    new.attrs.network_data = map_field(&mut doc, "network_data")?;
    // Only a changed document: one stored before the check came must not block other edits.
    if new.attrs.network_data != node.attrs.network_data {
        super::network_data::check(&new.attrs.network_data)?;
    }
    let parent = opt_string(&mut doc, "parent_node")?;
    new.attrs.parent_node = if parent == node.attrs.parent_node {
        parent
    } else {
        resolve_parent(&state, &node, parent).await?
    };
    let chassis = opt_string(&mut doc, "chassis_uuid")?;
    if node.chassis_uuid.is_some() && chassis.is_none() && version < (1, 25) {
        return Err(ApiError::new(
            StatusCode::NOT_ACCEPTABLE,
            "removing chassis_uuid needs API version 1.25 or later",
        ));
    }
    new.chassis_uuid = if chassis == node.chassis_uuid {
        chassis
    } else {
        resolve_chassis(&state, chassis).await?
    };
    new.attrs.disable_power_off = opt_bool(&mut doc, "disable_power_off")?;
    new.attrs.retired = opt_bool(&mut doc, "retired")?;
    new.attrs.retired_reason = opt_string(&mut doc, "retired_reason")?;
    new.attrs.protected = opt_bool(&mut doc, "protected")?;
    new.attrs.protected_reason = opt_string(&mut doc, "protected_reason")?;
    // `maintenance` by PATCH, as Ironic takes it from tools that do not use the maintenance
    // endpoint: leaving it clears the reason and the fault, as the endpoint does.
    new.maintenance = opt_bool(&mut doc, "maintenance")?;
    if node.maintenance && !new.maintenance {
        new.maintenance_reason = None;
        new.fault = None;
    }
    check_lifecycle_flags(&node, &mut new)?;
    super::allocations::follow_instance_removal(&state, &node, &mut new).await?;
    let mut saved = state.conductor.update_node(&new).await?;
    if node.maintenance && !saved.maintenance && saved.provision_state.is_conductor_busy() {
        state.conductor.kick(&saved.uuid);
    }
    show_owner(&state.conductor.ring(), state.conductor.id(), &mut saved);
    let kept = state.conductor.store.node_management(&saved.uuid).await?;
    Ok(node_response(
        StatusCode::OK,
        &saved,
        &headers,
        version,
        &kept,
    ))
}

async fn remove(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(ident): Path<String>,
) -> ApiResult<StatusCode> {
    let node = state.conductor.store.get_node(&ident).await?;
    // A damaged record stays as it is until repaired: deleting it would lose what is left.
    node.writable()?;
    check_if_match(&headers, &node)?;
    // Ironic answers a node in a state it may not be deleted in with InvalidState: 409.
    state
        .conductor
        .check_deletable(&node)
        .map_err(|e| match e {
            rivet_conductor::ConductorError::BadRequest(m) => {
                ApiError::new(StatusCode::CONFLICT, m)
            }
            e => e.into(),
        })?;
    state
        .conductor
        .store
        .delete_node(&node.uuid, node.version)
        .await?;
    state.conductor.events.publish_removed(&node.uuid);
    tracing::info!(node = %node.uuid, "node deleted");
    Ok(StatusCode::NO_CONTENT)
}

async fn states(
    State(state): State<AppState>,
    ApiVersion(version): ApiVersion,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
    let n = state.conductor.store.get_node(&ident).await?;
    let kept = state.conductor.store.node_management(&n.uuid).await?;
    let mut doc = json!({
        "console_enabled": false,
        "last_error": n.last_error,
        "power_state": n.power_state,
        "provision_state": super::render::provision_state_at(n.provision_state, version),
        "target_power_state": n.target_power_state,
        "target_provision_state": n.target_provision_state,
        "provision_updated_at": super::render::time(&n.provision_updated_at),
    });
    if let Value::Object(m) = &mut doc {
        super::node_actions::node_fields::states(m, &kept, version);
    }
    Ok(Json(doc))
}

fn accepted(headers: &HeaderMap, node: &Node) -> Response {
    let mut resp = StatusCode::ACCEPTED.into_response();
    if let Ok(loc) = HeaderValue::from_str(&format!(
        "{}/v1/nodes/{}/states",
        base_url(headers),
        node.uuid
    )) {
        resp.headers_mut().insert(header::LOCATION, loc);
    }
    resp
}

async fn provision(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiVersion(version): ApiVersion,
    Extension(caller): Extension<super::auth::Caller>,
    Path(ident): Path<String>,
    JsonBody(mut req): JsonBody<ProvisionRequest>,
) -> ApiResult<Response> {
    tracing::info!(node = %ident, caller = %caller.name, role = caller.role.as_str(), target = %req.target, "provision request");
    super::runbooks::resolve(&state, &ident, &mut req, version).await?;
    let by = super::audit::actor_of(&state, &caller);
    let node = state
        .conductor
        .provision(&ident, &req, version, &by)
        .await?;
    Ok(accepted(&headers, &node))
}

/// `DELETE /v1/nodes/{id}/provision`: 202 when the running task was aborted, 403 when its
/// running step may not be interrupted, 404 when no provision task runs.
async fn abort_provision(
    State(state): State<AppState>,
    headers: HeaderMap,
    Extension(caller): Extension<super::auth::Caller>,
    Path(ident): Path<String>,
) -> ApiResult<Response> {
    use rivet_conductor::AbortRefusal;
    let by = super::audit::actor_of(&state, &caller);
    match state.conductor.abort_task(&ident, &by).await {
        Ok(node) => Ok(accepted(&headers, &node)),
        Err(e @ AbortRefusal::NoTask { .. }) => {
            Err(ApiError::new(StatusCode::NOT_FOUND, e.to_string()))
        }
        Err(e @ AbortRefusal::NotAbortable { .. }) => {
            Err(ApiError::new(StatusCode::FORBIDDEN, e.to_string()))
        }
        Err(AbortRefusal::Other(e)) => Err(e.into()),
    }
}

async fn power(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiVersion(version): ApiVersion,
    Path(ident): Path<String>,
    JsonBody(req): JsonBody<PowerRequest>,
) -> ApiResult<Response> {
    use rivet_protocol::states::PowerState;
    // Soft power actions and `timeout` came with 1.27 (`MINOR_27_SOFT_POWER_OFF`).
    let soft = matches!(req.target, PowerState::SoftOff | PowerState::SoftRebooting);
    if (soft || req.timeout.is_some()) && version < (1, 27) {
        return Err(ApiError::new(
            StatusCode::NOT_ACCEPTABLE,
            "soft power actions and a power timeout need API version 1.27 or later",
        ));
    }
    if req.timeout == Some(0) {
        return Err(ApiError::bad_request("timeout has to be positive integer"));
    }
    let timeout = req.timeout.map(std::time::Duration::from_secs);
    let node = state
        .conductor
        .set_power_within(&ident, req.target, timeout)
        .await?;
    Ok(accepted(&headers, &node))
}

async fn maintenance_on(
    State(state): State<AppState>,
    Path(ident): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<StatusCode> {
    // Ironic accepts an empty body here.
    let req: MaintenanceRequest = if body.is_empty() {
        MaintenanceRequest::default()
    } else {
        super::body::parse(&body)?
    };
    state
        .conductor
        .set_maintenance(&ident, true, req.reason)
        .await?;
    Ok(StatusCode::ACCEPTED)
}

async fn maintenance_off(
    State(state): State<AppState>,
    Path(ident): Path<String>,
) -> ApiResult<StatusCode> {
    state.conductor.set_maintenance(&ident, false, None).await?;
    Ok(StatusCode::ACCEPTED)
}

async fn inventory(
    State(state): State<AppState>,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
    let node = state.conductor.store.get_node(&ident).await?;
    let (inventory, at) = state.conductor.store.get_inventory(&node.uuid).await.map_err(|e| match e {
        rivet_store::StoreError::NotFound { .. } => ApiError::new(
            StatusCode::NOT_FOUND,
            format!("node {} has no inventory yet: its ramdisk has not reported one (inspect or clean it)", node.ident()),
        ),
        e => e.into(),
    })?;
    Ok(Json(json!({
        "inventory": inventory,
        "plugin_data": {},
        "collected_at": super::render::timestamp(&at),
    })))
}

/// The node's cached steps: merged, with where each comes from, as of its last cleaning;
/// the agent's RAID steps only when its `raid_interface` takes them (the cache keeps all the
/// agent offered).
async fn clean_steps(
    State(state): State<AppState>,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
    let node = state.conductor.store.get_node(&ident).await?;
    let dii = &node.driver_internal_info;
    match rivet_model::internal_info::cached_clean_steps_doc(dii) {
        Some((mut steps, updated_at)) => {
            if let Some(cached) = rivet_model::internal_info::cached_clean_steps(dii) {
                let raid = node.interfaces.get(&node.driver, Iface::Raid);
                let taken = rivet_model::steps::planned_for(cached, &raid);
                steps = serde_json::to_value(taken).unwrap_or(steps);
            }
            Ok(Json(json!({
            "clean_steps": steps,
            "updated_at": updated_at,
            })))
        }
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "node {} has no cached clean steps yet: they are gathered by every cleaning; run `rivet node clean {} --clean-steps '[]'` to gather them only",
                node.ident(),
                node.ident()
            ),
        )),
    }
}
