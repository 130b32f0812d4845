//! `/v1/volume`: Ironic's volume connectors and targets (API 1.32), at the top level and
//! under `/v1/nodes/{node}/volume`. They are stored, validated and shown as Ironic does;
//! booting from a volume is not done (every node's `storage_interface` is `noop`).
//!
//! As in Ironic's conductor, a connector or target may only change while its node is powered
//! off, and only be deleted while the node is powered off or in `manageable`, `enroll` or
//! `adopt failed` (400 otherwise); a node held by another operation answers 409.

use super::nodes::{ver, Version};
use super::render::{base_url, created, links, parse_fields, select, time};
use super::{listing, patch, ApiError, ApiResult, AppState, JsonBody};
use crate::store::{
    Node, SortDir, StoreError, VolumeConnector, VolumeQuery, VolumeTarget, CONNECTOR_SORT_KEYS,
    TARGET_SORT_KEYS,
};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use chrono::Utc;
use rivet_protocol::api::PatchOp;
use rivet_protocol::states::{PowerState, ProvisionState};
use serde_json::{json, Map, Value};
use std::collections::HashMap;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/volume", get(root))
        .route("/v1/volume/", get(root))
        .route(
            "/v1/volume/connectors",
            get(connectors_list).post(connector_create),
        )
        .route(
            "/v1/volume/connectors/{uuid}",
            get(connector_show)
                .patch(connector_update)
                .delete(connector_delete),
        )
        .route("/v1/volume/targets", get(targets_list).post(target_create))
        .route("/v1/volume/targets/", get(targets_list).post(target_create))
        .route(
            "/v1/volume/connectors/",
            get(connectors_list).post(connector_create),
        )
        .route(
            "/v1/volume/targets/{uuid}",
            get(target_show).patch(target_update).delete(target_delete),
        )
        .route("/v1/nodes/{ident}/volume", get(node_root))
        .route(
            "/v1/nodes/{ident}/volume/connectors",
            get(node_connectors).post(malformed),
        )
        .route(
            "/v1/nodes/{ident}/volume/targets",
            get(node_targets).post(malformed),
        )
}

/// `MINOR_32_VOLUME`.
pub const VOLUME_VERSION: (u32, u32) = (1, 32);

/// Connector types Ironic documents (`api-ref`: iqn, ip, mac, wwnn, wwpn) and the port kinds
/// its storage interfaces read.
pub const CONNECTOR_TYPES: &[&str] = &["iqn", "ip", "mac", "wwnn", "wwpn", "port", "portgroup"];

const CONNECTOR_FIELDS: &[&str] = &["uuid", "node_uuid", "type", "connector_id"];
const TARGET_FIELDS: &[&str] = &[
    "uuid",
    "node_uuid",
    "volume_type",
    "boot_index",
    "volume_id",
];

/// Below 1.32 the volume API does not exist (Ironic: 404).
fn gate(version: &Version) -> Result<(), ApiError> {
    let v = ver(version);
    if v >= VOLUME_VERSION {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::NOT_FOUND,
        format!(
            "the volume API needs API version 1.32 or later; this request asked for {}.{}",
            v.0, v.1
        ),
    ))
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Connector,
    Target,
}

impl Kind {
    fn plural(self) -> &'static str {
        match self {
            Kind::Connector => "connectors",
            Kind::Target => "targets",
        }
    }
    fn name(self) -> &'static str {
        match self {
            Kind::Connector => "Volume connector",
            Kind::Target => "Volume target",
        }
    }
}

fn uuid_arg(what: &str, v: &str) -> Result<String, ApiError> {
    uuid::Uuid::parse_str(v)
        .map(|u| u.to_string())
        .map_err(|_| ApiError::bad_request(format!("Expected UUID for {what}: {v}")))
}

fn not_found(kind: Kind, uuid: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("{} {uuid} could not be found.", kind.name()),
    )
}

fn mapped<T>(kind: Kind, uuid: &str, r: Result<T, StoreError>) -> ApiResult<T> {
    match r {
        Err(StoreError::NotFound { .. }) => Err(not_found(kind, uuid)),
        r => Ok(r?),
    }
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn connector_doc(c: &VolumeConnector, base: &str) -> Map<String, Value> {
    obj(json!({
        "uuid": c.uuid,
        "node_uuid": c.node_uuid,
        "type": c.kind,
        "connector_id": c.connector_id,
        "extra": c.extra,
        "created_at": time(&Some(c.created_at)),
        "updated_at": time(&c.updated_at),
        "links": links(base, "volume/connectors", &c.uuid),
    }))
}

fn target_doc(t: &VolumeTarget, base: &str) -> Map<String, Value> {
    obj(json!({
        "uuid": t.uuid,
        "node_uuid": t.node_uuid,
        "volume_type": t.volume_type,
        "properties": t.properties,
        "boot_index": t.boot_index,
        "volume_id": t.volume_id,
        "extra": t.extra,
        "created_at": time(&Some(t.created_at)),
        "updated_at": time(&t.updated_at),
        "links": links(base, "volume/targets", &t.uuid),
    }))
}

fn volume_links(base: &str, prefix: &str) -> Value {
    let l = |rel: &str| {
        json!([
            {"href": format!("{base}/v1/{prefix}{rel}"), "rel": "self"},
            {"href": format!("{base}/{prefix}{rel}"), "rel": "bookmark"},
        ])
    };
    json!({
        "links": l(""),
        "connectors": l("connectors"),
        "targets": l("targets"),
    })
}

async fn root(version: Version, headers: HeaderMap) -> ApiResult<Json<Value>> {
    gate(&version)?;
    Ok(Json(volume_links(&base_url(&headers), "volume/")))
}

async fn node_root(
    State(state): State<AppState>,
    version: Version,
    headers: HeaderMap,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
    gate(&version)?;
    state.conductor.store.get_node(&ident).await?;
    Ok(Json(volume_links(
        &base_url(&headers),
        &format!("nodes/{ident}/volume/"),
    )))
}

async fn malformed(version: Version) -> ApiError {
    if let Err(e) = gate(&version) {
        return e;
    }
    ApiError::bad_request(
        "Malformed request URI. Create volume connectors and targets with POST /v1/volume/connectors or /v1/volume/targets.",
    )
}

// ------------------------------------------------------------------ listing

const LIST_PARAMS: &[&str] = &[
    "node", "limit", "marker", "sort_key", "sort_dir", "fields", "detail",
];

async fn list(
    state: &AppState,
    headers: &HeaderMap,
    kind: Kind,
    parent: Option<String>,
    params: HashMap<String, String>,
) -> ApiResult<Json<Value>> {
    if let Some(bad) = params.keys().find(|k| !LIST_PARAMS.contains(&k.as_str())) {
        return Err(ApiError::bad_request(format!(
            "unknown query parameter {bad:?}; supported: {}",
            LIST_PARAMS.join(", ")
        )));
    }
    let detail = listing::bool_param(&params, "detail")?.unwrap_or(false);
    if detail && params.contains_key("fields") {
        return Err(ApiError::bad_request(
            "Can't fetch a subset of fields with 'detail' set",
        ));
    }
    let node_ident = parent.or_else(|| params.get("node").cloned());
    let node_uuid = match &node_ident {
        Some(n) => Some(state.conductor.store.get_node(n).await?.uuid),
        None => None,
    };
    let sort_key = params
        .get("sort_key")
        .cloned()
        .unwrap_or_else(|| "id".into());
    let keys = match kind {
        Kind::Connector => CONNECTOR_SORT_KEYS,
        Kind::Target => TARGET_SORT_KEYS,
    };
    if ["extra", "properties"].contains(&sort_key.as_str()) {
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
    let sort_dir = listing::sort_dir_param(&params)?.unwrap_or(SortDir::Asc);
    let marker = params
        .get("marker")
        .map(|m| uuid_arg("marker", m))
        .transpose()?;
    let q = VolumeQuery {
        node_uuid,
        limit: listing::page_limit(&params, state.conductor.config.api.max_limit)?,
        marker: marker.clone(),
        sort_key,
        sort_dir,
    };
    let base = base_url(headers);
    let store = &state.conductor.store;
    let (docs, last): (Vec<Map<String, Value>>, Option<String>) = match kind {
        Kind::Connector => {
            let found = match store.list_volume_connectors(&q).await {
                Err(StoreError::NotFound { ident, .. }) => return Err(not_found(kind, &ident)),
                r => r?,
            };
            let last = (found.len() == q.limit)
                .then(|| found.last().map(|c| c.uuid.clone()))
                .flatten();
            (
                found.iter().map(|c| connector_doc(c, &base)).collect(),
                last,
            )
        }
        Kind::Target => {
            let found = match store.list_volume_targets(&q).await {
                Err(StoreError::NotFound { ident, .. }) => return Err(not_found(kind, &ident)),
                r => r?,
            };
            let last = (found.len() == q.limit)
                .then(|| found.last().map(|t| t.uuid.clone()))
                .flatten();
            (found.iter().map(|t| target_doc(t, &base)).collect(), last)
        }
    };
    let template = match kind {
        Kind::Connector => connector_doc(&blank_connector(), &base),
        Kind::Target => target_doc(&blank_target(), &base),
    };
    let fields = parse_fields(params.get("fields").map(String::as_str), &template)?;
    let default: &[&str] = match kind {
        Kind::Connector => CONNECTOR_FIELDS,
        Kind::Target => TARGET_FIELDS,
    };
    let items: Vec<Value> = docs
        .into_iter()
        .map(|d| match (&fields, detail) {
            (Some(f), _) => with_links(d, f),
            (None, true) => Value::Object(d),
            (None, false) => with_links(d, default),
        })
        .collect();
    let mut body = json!({ kind.plural(): items });
    if let Some(last) = last {
        let mut next = format!("{base}/v1/volume/{}?limit={}", kind.plural(), q.limit);
        for k in ["node", "sort_key", "sort_dir", "fields", "detail"] {
            if let Some(v) = params.get(k) {
                next.push_str(&format!("&{k}={v}"));
            }
        }
        next.push_str(&format!("&marker={last}"));
        body["next"] = Value::from(next);
    }
    Ok(Json(body))
}

/// Ironic's `sanitize_dict`: the requested fields, and always the links.
fn with_links(doc: Map<String, Value>, keep: &[impl AsRef<str>]) -> Value {
    let mut keep: Vec<&str> = keep.iter().map(AsRef::as_ref).collect();
    keep.push("links");
    select(doc, &keep)
}

fn blank_connector() -> VolumeConnector {
    VolumeConnector {
        uuid: String::new(),
        node_uuid: String::new(),
        kind: String::new(),
        connector_id: String::new(),
        extra: Map::new(),
        created_at: Utc::now(),
        updated_at: None,
    }
}

fn blank_target() -> VolumeTarget {
    VolumeTarget {
        uuid: String::new(),
        node_uuid: String::new(),
        volume_type: String::new(),
        properties: Map::new(),
        boot_index: 0,
        volume_id: String::new(),
        extra: Map::new(),
        created_at: Utc::now(),
        updated_at: None,
    }
}

async fn connectors_list(
    State(state): State<AppState>,
    version: Version,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    gate(&version)?;
    list(&state, &headers, Kind::Connector, None, params).await
}

async fn targets_list(
    State(state): State<AppState>,
    version: Version,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    gate(&version)?;
    list(&state, &headers, Kind::Target, None, params).await
}

async fn node_connectors(
    State(state): State<AppState>,
    version: Version,
    headers: HeaderMap,
    Path(ident): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    gate(&version)?;
    list(&state, &headers, Kind::Connector, Some(ident), params).await
}

async fn node_targets(
    State(state): State<AppState>,
    version: Version,
    headers: HeaderMap,
    Path(ident): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    gate(&version)?;
    list(&state, &headers, Kind::Target, Some(ident), params).await
}

// ------------------------------------------------------------------ validation

fn schema_error(msg: String) -> ApiError {
    ApiError::bad_request(format!("Invalid input: {msg}"))
}

/// The body of a create, or the document after a patch, checked as Ironic's
/// CONNECTOR_SCHEMA / TARGET_SCHEMA (and `args.uuid` on `node_uuid` and `uuid`).
fn check_doc(kind: Kind, doc: &Map<String, Value>) -> Result<(), ApiError> {
    let (allowed, required): (&[&str], &[&str]) = match kind {
        Kind::Connector => (
            &["connector_id", "extra", "node_uuid", "type", "uuid"],
            &["connector_id", "node_uuid", "type"],
        ),
        Kind::Target => (
            &[
                "boot_index",
                "extra",
                "node_uuid",
                "properties",
                "volume_id",
                "volume_type",
                "uuid",
            ],
            &["boot_index", "node_uuid", "volume_id", "volume_type"],
        ),
    };
    let mut extras: Vec<&String> = doc
        .keys()
        .filter(|k| !allowed.contains(&k.as_str()))
        .collect();
    if !extras.is_empty() {
        extras.sort();
        let names: Vec<String> = extras.iter().map(|k| format!("'{k}'")).collect();
        let verb = if names.len() == 1 { "was" } else { "were" };
        return Err(schema_error(format!(
            "Additional properties are not allowed ({} {verb} unexpected)",
            names.join(", ")
        )));
    }
    for r in required {
        if doc.get(*r).is_none_or(Value::is_null) {
            return Err(schema_error(format!("'{r}' is a required property")));
        }
    }
    for (k, v) in doc {
        let ok = match k.as_str() {
            "extra" | "properties" => v.is_object() || v.is_null(),
            "uuid" => v.is_string() || v.is_null(),
            "boot_index" => v.is_i64() || v.is_u64(),
            _ => v.is_string(),
        };
        if !ok {
            let ty = match k.as_str() {
                "extra" | "properties" => "'object', 'null'",
                "uuid" => "'string', 'null'",
                "boot_index" => "'integer'",
                _ => "'string'",
            };
            return Err(schema_error(format!("{v} is not of type {ty} ({k})")));
        }
    }
    for k in ["node_uuid", "uuid"] {
        if let Some(Value::String(s)) = doc.get(k) {
            uuid_arg(k, s)?;
        }
    }
    if kind == Kind::Connector {
        let t = doc.get("type").and_then(Value::as_str).unwrap_or_default();
        if !CONNECTOR_TYPES.contains(&t) {
            return Err(ApiError::bad_request(format!(
                "volume connector type {t:?} is not supported; use one of {}",
                CONNECTOR_TYPES.join(", ")
            )));
        }
        if doc
            .get("connector_id")
            .and_then(Value::as_str)
            .is_some_and(str::is_empty)
        {
            return Err(ApiError::bad_request("connector_id must not be empty"));
        }
    }
    if kind == Kind::Target {
        if doc
            .get("boot_index")
            .and_then(Value::as_i64)
            .is_none_or(|i| i < 0)
        {
            return Err(ApiError::bad_request(
                "boot_index must be a non-negative integer",
            ));
        }
        for k in ["volume_id", "volume_type"] {
            if doc
                .get(k)
                .and_then(Value::as_str)
                .is_some_and(str::is_empty)
            {
                return Err(ApiError::bad_request(format!("{k} must not be empty")));
            }
        }
    }
    Ok(())
}

/// The node a body names: a missing node is the body's fault (Ironic's InvalidInput, 400).
async fn node_named(state: &AppState, uuid: &str) -> ApiResult<Node> {
    match state.conductor.store.get_node(uuid).await {
        Err(StoreError::NotFound { .. }) => Err(ApiError::bad_request(format!(
            "Invalid input for field/attribute node_uuid. Value: {uuid}. No node {uuid} exists."
        ))),
        r => Ok(r?),
    }
}

/// Ironic's conductor refusals: the node's lock (409), then its power state (400).
fn check_node_allows(node: &Node, action: &str, delete: bool) -> Result<(), ApiError> {
    if let Some(by) = &node.reservation {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "Node {} is locked by host {by}, please retry after the current operation is completed.",
                node.uuid
            ),
        ));
    }
    let off = node.power_state == Some(PowerState::Off);
    let idle = matches!(
        node.provision_state,
        ProvisionState::Manageable | ProvisionState::Enroll | ProvisionState::AdoptFailed
    );
    if off || (delete && idle) {
        return Ok(());
    }
    let state = node.power_state.map_or("None", |p| p.as_str());
    Err(ApiError::bad_request(format!(
        "The requested action \"{action}\" can not be performed on node \"{}\" while it is in state \"{state}\". Power the node off first.",
        node.uuid
    )))
}

fn str_of(doc: &Map<String, Value>, k: &str) -> String {
    doc.get(k)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn map_of(doc: &Map<String, Value>, k: &str) -> Map<String, Value> {
    doc.get(k)
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

// ------------------------------------------------------------------ CRUD

async fn create(
    state: &AppState,
    headers: &HeaderMap,
    kind: Kind,
    body: Value,
) -> ApiResult<Response> {
    let Value::Object(doc) = body else {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    };
    check_doc(kind, &doc)?;
    let node = node_named(state, &str_of(&doc, "node_uuid")).await?;
    let uuid = match doc.get("uuid").and_then(Value::as_str) {
        Some(u) => uuid_arg("uuid", u)?,
        None => uuid::Uuid::new_v4().to_string(),
    };
    let base = base_url(headers);
    let store = &state.conductor.store;
    let now = Utc::now();
    match kind {
        Kind::Connector => {
            let c = VolumeConnector {
                uuid,
                node_uuid: node.uuid,
                kind: str_of(&doc, "type"),
                connector_id: str_of(&doc, "connector_id"),
                extra: map_of(&doc, "extra"),
                created_at: now,
                updated_at: None,
            };
            let c = store.create_volume_connector(&c).await?;
            Ok(created(
                connector_doc(&c, &base),
                &base,
                "volume/connectors",
                &c.uuid,
            ))
        }
        Kind::Target => {
            let t = VolumeTarget {
                uuid,
                node_uuid: node.uuid,
                volume_type: str_of(&doc, "volume_type"),
                properties: map_of(&doc, "properties"),
                boot_index: doc.get("boot_index").and_then(Value::as_i64).unwrap_or(0),
                volume_id: str_of(&doc, "volume_id"),
                extra: map_of(&doc, "extra"),
                created_at: now,
                updated_at: None,
            };
            let t = store.create_volume_target(&t).await?;
            Ok(created(
                target_doc(&t, &base),
                &base,
                "volume/targets",
                &t.uuid,
            ))
        }
    }
}

async fn connector_create(
    State(state): State<AppState>,
    version: Version,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> ApiResult<Response> {
    gate(&version)?;
    create(&state, &headers, Kind::Connector, body).await
}

async fn target_create(
    State(state): State<AppState>,
    version: Version,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> ApiResult<Response> {
    gate(&version)?;
    create(&state, &headers, Kind::Target, body).await
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ShowParams {
    fields: Option<String>,
    #[allow(dead_code)]
    detail: Option<String>,
}

async fn connector_show(
    State(state): State<AppState>,
    version: Version,
    headers: HeaderMap,
    Path(uuid): Path<String>,
    Query(p): Query<ShowParams>,
) -> ApiResult<Json<Value>> {
    gate(&version)?;
    let uuid = uuid_arg("connector_uuid", &uuid)?;
    let c = mapped(
        Kind::Connector,
        &uuid,
        state.conductor.store.get_volume_connector(&uuid).await,
    )?;
    let full = connector_doc(&c, &base_url(&headers));
    Ok(Json(match parse_fields(p.fields.as_deref(), &full)? {
        Some(f) => with_links(full, &f),
        None => Value::Object(full),
    }))
}

async fn target_show(
    State(state): State<AppState>,
    version: Version,
    headers: HeaderMap,
    Path(uuid): Path<String>,
    Query(p): Query<ShowParams>,
) -> ApiResult<Json<Value>> {
    gate(&version)?;
    let uuid = uuid_arg("target_uuid", &uuid)?;
    let t = mapped(
        Kind::Target,
        &uuid,
        state.conductor.store.get_volume_target(&uuid).await,
    )?;
    let full = target_doc(&t, &base_url(&headers));
    Ok(Json(match parse_fields(p.fields.as_deref(), &full)? {
        Some(f) => with_links(full, &f),
        None => Value::Object(full),
    }))
}

/// Apply `ops` to the patchable part of `doc`, check the result, and refuse it while the
/// node (the new one too, when the patch moves it) is not powered off.
async fn patched(
    state: &AppState,
    kind: Kind,
    mut doc: Map<String, Value>,
    ops: &[PatchOp],
) -> ApiResult<(Map<String, Value>, Node)> {
    let patchable: &[&str] = match kind {
        Kind::Connector => &["connector_id", "extra", "node_uuid", "type"],
        Kind::Target => &[
            "boot_index",
            "extra",
            "node_uuid",
            "properties",
            "volume_id",
            "volume_type",
        ],
    };
    let old_node = str_of(&doc, "node_uuid");
    let uuid = doc.remove("uuid");
    let mut v = Value::Object(doc);
    patch::apply(&mut v, ops, patchable)?;
    let Value::Object(mut doc) = v else {
        return Err(ApiError::bad_request(
            "the patch replaced the whole document",
        ));
    };
    if let Some(u) = uuid {
        doc.insert("uuid".into(), u);
    }
    for k in ["extra", "properties"] {
        if doc.get(k).is_some_and(Value::is_null) {
            doc.insert(k.into(), json!({}));
        }
    }
    if kind == Kind::Connector {
        doc.remove("properties");
    }
    check_doc(kind, &doc)?;
    let action = match kind {
        Kind::Connector => "volume connector update",
        Kind::Target => "volume target update",
    };
    let new_node = str_of(&doc, "node_uuid");
    if new_node != old_node {
        let old = state.conductor.store.get_node(&old_node).await?;
        check_node_allows(&old, action, false)?;
    }
    let node = node_named(state, &new_node).await?;
    check_node_allows(&node, action, false)?;
    Ok((doc, node))
}

async fn connector_update(
    State(state): State<AppState>,
    version: Version,
    headers: HeaderMap,
    Path(uuid): Path<String>,
    JsonBody(ops): JsonBody<Vec<PatchOp>>,
) -> ApiResult<Json<Value>> {
    gate(&version)?;
    let uuid = uuid_arg("connector_uuid", &uuid)?;
    let store = &state.conductor.store;
    let c = mapped(
        Kind::Connector,
        &uuid,
        store.get_volume_connector(&uuid).await,
    )?;
    let mut doc = connector_doc(&c, "");
    for k in ["created_at", "updated_at", "links"] {
        doc.remove(k);
    }
    let (doc, node) = patched(&state, Kind::Connector, doc, &ops).await?;
    let new = VolumeConnector {
        node_uuid: node.uuid,
        kind: str_of(&doc, "type"),
        connector_id: str_of(&doc, "connector_id"),
        extra: map_of(&doc, "extra"),
        ..c
    };
    let saved = mapped(
        Kind::Connector,
        &uuid,
        store.update_volume_connector(&new).await,
    )?;
    Ok(Json(Value::Object(connector_doc(
        &saved,
        &base_url(&headers),
    ))))
}

async fn target_update(
    State(state): State<AppState>,
    version: Version,
    headers: HeaderMap,
    Path(uuid): Path<String>,
    JsonBody(ops): JsonBody<Vec<PatchOp>>,
) -> ApiResult<Json<Value>> {
    gate(&version)?;
    let uuid = uuid_arg("target_uuid", &uuid)?;
    let store = &state.conductor.store;
    let t = mapped(Kind::Target, &uuid, store.get_volume_target(&uuid).await)?;
    let mut doc = target_doc(&t, "");
    for k in ["created_at", "updated_at", "links"] {
        doc.remove(k);
    }
    let (doc, node) = patched(&state, Kind::Target, doc, &ops).await?;
    let new = VolumeTarget {
        node_uuid: node.uuid,
        volume_type: str_of(&doc, "volume_type"),
        properties: map_of(&doc, "properties"),
        boot_index: doc.get("boot_index").and_then(Value::as_i64).unwrap_or(0),
        volume_id: str_of(&doc, "volume_id"),
        extra: map_of(&doc, "extra"),
        ..t
    };
    let saved = mapped(Kind::Target, &uuid, store.update_volume_target(&new).await)?;
    Ok(Json(Value::Object(target_doc(&saved, &base_url(&headers)))))
}

async fn connector_delete(
    State(state): State<AppState>,
    version: Version,
    Path(uuid): Path<String>,
) -> ApiResult<StatusCode> {
    gate(&version)?;
    let uuid = uuid_arg("connector_uuid", &uuid)?;
    let store = &state.conductor.store;
    let c = mapped(
        Kind::Connector,
        &uuid,
        store.get_volume_connector(&uuid).await,
    )?;
    let node = store.get_node(&c.node_uuid).await?;
    check_node_allows(&node, "volume connector deletion", true)?;
    mapped(
        Kind::Connector,
        &uuid,
        store.delete_volume_connector(&uuid).await,
    )?;
    Ok(StatusCode::NO_CONTENT)
}

async fn target_delete(
    State(state): State<AppState>,
    version: Version,
    Path(uuid): Path<String>,
) -> ApiResult<StatusCode> {
    gate(&version)?;
    let uuid = uuid_arg("target_uuid", &uuid)?;
    let store = &state.conductor.store;
    let t = mapped(Kind::Target, &uuid, store.get_volume_target(&uuid).await)?;
    let node = store.get_node(&t.node_uuid).await?;
    check_node_allows(&node, "volume target deletion", true)?;
    mapped(Kind::Target, &uuid, store.delete_volume_target(&uuid).await)?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn doc(v: Value) -> Map<String, Value> {
        obj(v)
    }

    #[test]
    fn connector_schema() {
        let n = "1be26c0b-03f2-4d2e-ae87-c02d7f33c123";
        let ok = doc(json!({"node_uuid": n, "type": "iqn", "connector_id": "iqn.2017-01.a:b"}));
        assert!(check_doc(Kind::Connector, &ok).is_ok());
        let bad_type = doc(json!({"node_uuid": n, "type": "floppy", "connector_id": "x"}));
        assert!(check_doc(Kind::Connector, &bad_type).is_err());
        let missing = doc(json!({"node_uuid": n, "type": "iqn"}));
        let e = check_doc(Kind::Connector, &missing).unwrap_err();
        assert!(e.message.contains("'connector_id' is a required property"));
        let extra = doc(json!({"node_uuid": n, "type": "iqn", "connector_id": "x", "foo": 1}));
        assert!(check_doc(Kind::Connector, &extra)
            .unwrap_err()
            .message
            .contains("'foo' was unexpected"));
        let bad_uuid = doc(json!({"node_uuid": "nope", "type": "iqn", "connector_id": "x"}));
        assert!(check_doc(Kind::Connector, &bad_uuid).is_err());
    }

    #[test]
    fn target_schema() {
        let n = "1be26c0b-03f2-4d2e-ae87-c02d7f33c123";
        let ok =
            doc(json!({"node_uuid": n, "volume_type": "iscsi", "volume_id": "v", "boot_index": 0}));
        assert!(check_doc(Kind::Target, &ok).is_ok());
        let neg = doc(
            json!({"node_uuid": n, "volume_type": "iscsi", "volume_id": "v", "boot_index": -1}),
        );
        assert!(check_doc(Kind::Target, &neg).is_err());
        let s = doc(
            json!({"node_uuid": n, "volume_type": "iscsi", "volume_id": "v", "boot_index": "0"}),
        );
        assert!(check_doc(Kind::Target, &s).is_err());
    }
}
