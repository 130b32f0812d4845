//! `/v1/ports`: a node's NICs, found by MAC at lookup.

use super::render::{base_url, port_full, select};
use super::{patch, ApiError, ApiResult, AppState, JsonBody};
use crate::store::{normalize_mac, Port, PortQuery};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use chrono::Utc;
use rivet_protocol::api::{PatchOp, PortCreate};
use serde_json::{json, Value};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/ports", get(list).post(create))
        .route("/v1/ports/", get(list).post(create))
        .route("/v1/ports/detail", get(list_detail))
        .route("/v1/ports/{uuid}", get(show).patch(update).delete(remove))
}

fn mac(address: &str) -> Result<String, ApiError> {
    normalize_mac(address).ok_or_else(|| {
        ApiError::bad_request(format!(
            "address {address:?} is not a valid MAC address (expected aa:bb:cc:dd:ee:ff)"
        ))
    })
}

async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(req): JsonBody<PortCreate>,
) -> ApiResult<Response> {
    let address = mac(&req.address)?;
    let node = state
        .conductor
        .store
        .get_node(&req.node_uuid)
        .await
        .map_err(|_| ApiError::bad_request(format!("node {} could not be found", req.node_uuid)))?;
    let uuid = match &req.uuid {
        Some(u) => uuid::Uuid::parse_str(u)
            .map_err(|_| ApiError::bad_request(format!("uuid {u:?} is not a valid UUID")))?
            .to_string(),
        None => uuid::Uuid::new_v4().to_string(),
    };
    let port = Port {
        uuid,
        node_uuid: node.uuid,
        address,
        pxe_enabled: req.pxe_enabled,
        extra: req.extra,
        created_at: Utc::now(),
        updated_at: None,
        version: 0,
    };
    let port = state.conductor.store.create_port(&port).await?;
    let base = base_url(&headers);
    Ok(super::render::created(
        port_full(&port, &base),
        &base,
        "ports",
        &port.uuid,
    ))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ListParams {
    node: Option<String>,
    node_uuid: Option<String>,
    address: Option<String>,
    limit: Option<usize>,
    marker: Option<String>,
    fields: Option<String>,
    detail: Option<bool>,
}

async fn list_inner(
    state: &AppState,
    headers: &HeaderMap,
    p: ListParams,
    detail: bool,
) -> ApiResult<Json<Value>> {
    let node_uuid = match p.node.or(p.node_uuid) {
        Some(n) => Some(state.conductor.store.get_node(&n).await?.uuid),
        None => None,
    };
    let address = p.address.as_deref().map(mac).transpose()?;
    let max = state.conductor.config.api.max_limit;
    let q = PortQuery {
        node_uuid,
        address,
        limit: p.limit.unwrap_or(max).clamp(1, max),
        marker: p.marker,
    };
    let ports = state.conductor.store.list_ports(&q).await?;
    let base = base_url(headers);
    let detail = detail || p.detail.unwrap_or(false);
    let fields: Option<Vec<String>> = p
        .fields
        .map(|f| f.split(',').map(|s| s.trim().to_string()).collect());
    let docs: Vec<Value> = ports
        .iter()
        .map(|port| {
            let full = port_full(port, &base);
            match (&fields, detail) {
                (Some(f), _) => select(full, f),
                (None, true) => Value::Object(full),
                (None, false) => select(full, &["uuid", "address", "links"]),
            }
        })
        .collect();
    Ok(Json(json!({ "ports": docs })))
}

async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(p): Query<ListParams>,
) -> ApiResult<Json<Value>> {
    list_inner(&state, &headers, p, false).await
}

async fn list_detail(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(p): Query<ListParams>,
) -> ApiResult<Json<Value>> {
    list_inner(&state, &headers, p, true).await
}

async fn show(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(uuid): Path<String>,
) -> ApiResult<Json<Value>> {
    let port = state.conductor.store.get_port(&uuid).await?;
    Ok(Json(Value::Object(port_full(&port, &base_url(&headers)))))
}

async fn update(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(uuid): Path<String>,
    JsonBody(ops): JsonBody<Vec<PatchOp>>,
) -> ApiResult<Json<Value>> {
    let port = state.conductor.store.get_port(&uuid).await?;
    let mut doc = json!({
        "address": port.address,
        "node_uuid": port.node_uuid,
        "pxe_enabled": port.pxe_enabled,
        "extra": port.extra,
    });
    patch::apply(
        &mut doc,
        &ops,
        &["address", "node_uuid", "pxe_enabled", "extra"],
    )?;
    let mut new = port.clone();
    new.address = mac(doc["address"]
        .as_str()
        .ok_or_else(|| ApiError::bad_request("address must be a string"))?)?;
    let node_ref = doc["node_uuid"]
        .as_str()
        .ok_or_else(|| ApiError::bad_request("node_uuid must be a string"))?;
    new.node_uuid = state
        .conductor
        .store
        .get_node(node_ref)
        .await
        .map_err(|_| ApiError::bad_request(format!("node {node_ref} could not be found")))?
        .uuid;
    new.pxe_enabled = doc["pxe_enabled"]
        .as_bool()
        .ok_or_else(|| ApiError::bad_request("pxe_enabled must be true or false"))?;
    new.extra = match doc["extra"].take() {
        Value::Object(m) => m,
        Value::Null => Default::default(),
        _ => return Err(ApiError::bad_request("extra must be an object")),
    };
    let saved = state.conductor.store.update_port(&new).await?;
    Ok(Json(Value::Object(port_full(&saved, &base_url(&headers)))))
}

async fn remove(State(state): State<AppState>, Path(uuid): Path<String>) -> ApiResult<StatusCode> {
    state.conductor.store.delete_port(&uuid).await?;
    Ok(StatusCode::NO_CONTENT)
}
