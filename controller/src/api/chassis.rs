//! `/v1/chassis`: Ironic's grouping of nodes (API 1.1), and the nodes of a chassis.

use super::nodes::{self, Version};
use super::render::{base_url, links, parse_fields, select, time};
use super::{listing, patch, ApiError, ApiResult, AppState, JsonBody};
use crate::store::{Chassis, ChassisQuery, StoreError, CHASSIS_SORT_KEYS};
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
        .route("/v1/chassis", get(list).post(create))
        .route("/v1/chassis/", get(list).post(create))
        .route("/v1/chassis/detail", get(list_detail))
        .route("/v1/chassis/{uuid}", get(show).patch(update).delete(remove))
        .route(
            "/v1/chassis/{uuid}/nodes",
            get(chassis_nodes).delete(no_nodes_delete),
        )
        .route("/v1/chassis/{uuid}/nodes/detail", get(chassis_nodes_detail))
}

/// Fields a chassis listing shows without `detail` (Ironic's DEFAULT_RETURN_FIELDS, and links).
const LIST_FIELDS: &[&str] = &["uuid", "description", "links"];

/// Longest description Ironic accepts.
const MAX_DESCRIPTION: usize = 255;

/// The chassis document.
fn chassis_full(c: &Chassis, base: &str) -> Map<String, Value> {
    let nodes = format!("{}/nodes", c.uuid);
    let v = json!({
        "uuid": c.uuid,
        "description": c.description,
        "extra": c.extra,
        "created_at": time(&Some(c.created_at)),
        "updated_at": time(&c.updated_at),
        "links": links(base, "chassis", &c.uuid),
        "nodes": links(base, "chassis", &nodes),
    });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// A chassis UUID in a path or query: anything else is a 400, as Ironic's `args.uuid`.
fn check_uuid(what: &str, v: &str) -> Result<String, ApiError> {
    uuid::Uuid::parse_str(v)
        .map(|u| u.to_string())
        .map_err(|_| ApiError::bad_request(format!("Expected UUID for {what}: {v}")))
}

fn not_found(uuid: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("Chassis {uuid} could not be found."),
    )
}

/// A store lookup of a chassis, its NotFound in Ironic's words.
async fn fetch(state: &AppState, uuid: &str) -> ApiResult<Chassis> {
    let uuid = check_uuid("chassis_uuid", uuid)?;
    match state.conductor.store.get_chassis(&uuid).await {
        Err(StoreError::NotFound { .. }) => Err(not_found(&uuid)),
        r => Ok(r?),
    }
}

/// `description` and `extra` of a body or patched document, checked as Ironic's
/// CHASSIS_SCHEMA checks them.
fn fields_of(doc: &Map<String, Value>) -> Result<(Option<String>, Map<String, Value>), ApiError> {
    let description = match doc.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.chars().count() > MAX_DESCRIPTION => {
            return Err(ApiError::bad_request(format!(
                "'{s}' is too long: description is {} characters; at most {MAX_DESCRIPTION} are allowed",
                s.chars().count()
            )))
        }
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "{other} is not of type 'string', 'null'"
            )))
        }
    };
    let extra = match doc.get("extra") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "{other} is not of type 'object', 'null'"
            )))
        }
    };
    Ok((description, extra))
}

async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> ApiResult<Response> {
    let Value::Object(doc) = body else {
        return Err(ApiError::bad_request("a chassis must be a JSON object"));
    };
    if let Some(bad) = doc
        .keys()
        .find(|k| !["uuid", "description", "extra"].contains(&k.as_str()))
    {
        return Err(ApiError::bad_request(format!(
            "Additional properties are not allowed ('{bad}' was unexpected)"
        )));
    }
    let uuid = match doc.get("uuid") {
        None | Some(Value::Null) => uuid::Uuid::new_v4().to_string(),
        Some(Value::String(u)) => check_uuid("uuid", u)?,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "{other} is not of type 'string', 'null'"
            )))
        }
    };
    let (description, extra) = fields_of(&doc)?;
    let chassis = Chassis {
        uuid,
        description,
        extra,
        created_at: Utc::now(),
        updated_at: None,
        version: 0,
    };
    let chassis = state.conductor.store.create_chassis(&chassis).await?;
    let base = base_url(&headers);
    Ok(super::render::created(
        chassis_full(&chassis, &base),
        &base,
        "chassis",
        &chassis.uuid,
    ))
}

const LIST_PARAMS: &[&str] = &[
    "limit", "marker", "sort_key", "sort_dir", "fields", "detail",
];

async fn list_inner(
    state: &AppState,
    headers: &HeaderMap,
    params: HashMap<String, String>,
    from_detail: bool,
) -> ApiResult<Json<Value>> {
    // /detail takes neither `fields` nor `detail` (Ironic's detail_request_query).
    let allowed = if from_detail {
        &LIST_PARAMS[..4]
    } else {
        LIST_PARAMS
    };
    if let Some(bad) = params.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(ApiError::bad_request(format!(
            "unknown query parameter {bad:?}; supported: {}",
            allowed.join(", ")
        )));
    }
    let max = state.conductor.config.api.max_limit;
    let limit = listing::page_limit(&params, max)?;
    let marker = params
        .get("marker")
        .map(|m| check_uuid("marker", m))
        .transpose()?;
    let sort_key = params
        .get("sort_key")
        .cloned()
        .unwrap_or_else(|| "id".into());
    if sort_key == "extra" {
        return Err(ApiError::bad_request(format!(
            "The sort_key value {sort_key} is an invalid field for sorting"
        )));
    }
    if !CHASSIS_SORT_KEYS.contains(&sort_key.as_str()) {
        return Err(ApiError::bad_request(format!(
            "sort_key {sort_key:?} is not supported; use one of {}",
            CHASSIS_SORT_KEYS.join(", ")
        )));
    }
    let sort_dir = listing::sort_dir_param(&params)?.unwrap_or(crate::store::SortDir::Asc);
    let detail = listing::detail_param(&params, from_detail)?;
    let q = ChassisQuery {
        limit,
        marker,
        sort_key,
        sort_dir,
    };
    let found = match state.conductor.store.list_chassis(&q).await {
        Err(StoreError::NotFound { ident, .. }) => return Err(not_found(&ident)),
        r => r?,
    };
    let base = base_url(headers);
    let template = chassis_full(
        &Chassis {
            uuid: String::new(),
            description: None,
            extra: Map::new(),
            created_at: Utc::now(),
            updated_at: None,
            version: 0,
        },
        &base,
    );
    let fields = parse_fields(params.get("fields").map(String::as_str), &template)?;
    let docs: Vec<Value> = found
        .iter()
        .map(|c| {
            listing::shape(
                chassis_full(c, &base),
                fields.as_deref(),
                detail,
                LIST_FIELDS,
            )
        })
        .collect();
    let mut body = json!({ "chassis": docs });
    if found.len() == q.limit {
        if let Some(last) = found.last() {
            let path = if from_detail {
                "/v1/chassis/detail"
            } else {
                "/v1/chassis"
            };
            let mut next = format!("{base}{path}?limit={}", q.limit);
            for k in ["sort_key", "sort_dir", "fields", "detail"] {
                if let Some(v) = params.get(k) {
                    next.push_str(&format!("&{k}={v}"));
                }
            }
            next.push_str(&format!("&marker={}", last.uuid));
            body["next"] = Value::from(next);
        }
    }
    Ok(Json(body))
}

async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    list_inner(&state, &headers, params, false).await
}

async fn list_detail(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    list_inner(&state, &headers, params, true).await
}

async fn show(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(uuid): Path<String>,
    Query(p): Query<super::listing::ShowParams>,
) -> ApiResult<Json<Value>> {
    let chassis = fetch(&state, &uuid).await?;
    let full = chassis_full(&chassis, &base_url(&headers));
    Ok(Json(match parse_fields(p.fields.as_deref(), &full)? {
        Some(f) => select(full, &f),
        None => Value::Object(full),
    }))
}

async fn update(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(uuid): Path<String>,
    JsonBody(ops): JsonBody<Vec<PatchOp>>,
) -> ApiResult<Json<Value>> {
    let chassis = fetch(&state, &uuid).await?;
    let mut doc = json!({
        "description": chassis.description,
        "extra": chassis.extra,
    });
    patch::apply(&mut doc, &ops, &["description", "extra"])?;
    let Value::Object(doc) = doc else {
        return Err(ApiError::bad_request("patch replaced the whole chassis"));
    };
    let (description, extra) = fields_of(&doc)?;
    let new = Chassis {
        description,
        extra,
        ..chassis
    };
    let saved = state.conductor.store.update_chassis(&new).await?;
    Ok(Json(Value::Object(chassis_full(
        &saved,
        &base_url(&headers),
    ))))
}

async fn remove(State(state): State<AppState>, Path(uuid): Path<String>) -> ApiResult<StatusCode> {
    let uuid = check_uuid("chassis_uuid", &uuid)?;
    match state.conductor.store.delete_chassis(&uuid).await {
        Ok(true) => Ok(StatusCode::NO_CONTENT),
        // Ironic's ChassisNotEmpty is an Invalid: 400.
        Ok(false) => Err(ApiError::bad_request(format!(
            "Cannot complete the requested action because chassis {uuid} contains nodes."
        ))),
        Err(StoreError::NotFound { .. }) => Err(not_found(&uuid)),
        Err(e) => Err(e.into()),
    }
}

/// The node listing of `/v1/nodes` limited to the chassis (404 when there is none).
async fn nodes_of(
    state: AppState,
    headers: HeaderMap,
    version: Version,
    uuid: String,
    mut params: HashMap<String, String>,
    detail: bool,
) -> ApiResult<super::node_json::JsonBytes> {
    let chassis = fetch(&state, &uuid).await?;
    if params.contains_key("chassis_uuid") {
        return Err(ApiError::bad_request(
            "chassis_uuid cannot be given when listing the nodes of a chassis",
        ));
    }
    params.insert("chassis_uuid".into(), chassis.uuid);
    nodes::list_inner(&state, &headers, nodes::ver(&version), params, detail).await
}

async fn chassis_nodes(
    State(state): State<AppState>,
    headers: HeaderMap,
    version: Version,
    Path(uuid): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<super::node_json::JsonBytes> {
    nodes_of(state, headers, version, uuid, params, false).await
}

async fn chassis_nodes_detail(
    State(state): State<AppState>,
    headers: HeaderMap,
    version: Version,
    Path(uuid): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<super::node_json::JsonBytes> {
    nodes_of(state, headers, version, uuid, params, true).await
}

/// Nodes are not deleted through their chassis (Ironic: 400).
async fn no_nodes_delete() -> ApiError {
    ApiError::bad_request("nodes cannot be deleted through /v1/chassis/{uuid}/nodes")
}
