//! `GET /v1/conductors[/{hostname}]`: the controllers sharing this database, Ironic-shaped
//! (`hostname` is the conductor id, `alive` whether it heartbeat within `dead_after_s`).

use super::render::base_url;
use super::{ApiError, ApiResult, AppState};
use crate::store::ConductorRecord;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::HashMap;

/// The routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/conductors", get(list))
        .route("/v1/conductors/{hostname}", get(show))
}

/// The query a conductor listing takes, as Ironic's.
const LIST_PARAMS: &[&str] = &[
    "limit", "marker", "sort_key", "sort_dir", "fields", "detail",
];

/// Whole documents asked for (`detail`, a boolean as Ironic parses one: `True` from Python
/// clients too); 400 for a parameter Ironic does not take.
fn list_params(params: &HashMap<String, String>) -> ApiResult<bool> {
    if let Some(bad) = params.keys().find(|k| !LIST_PARAMS.contains(&k.as_str())) {
        return Err(ApiError::bad_request(format!(
            "unknown query parameter {bad:?}; supported: {}",
            LIST_PARAMS.join(", ")
        )));
    }
    super::listing::page_limit(params, usize::MAX)?;
    super::listing::sort_dir_param(params)?;
    Ok(super::listing::bool_param(params, "detail")?.unwrap_or(false))
}

fn render(c: &ConductorRecord, detail: bool, base: &str) -> Value {
    let mut v = json!({
        "hostname": c.id,
        "conductor_group": "",
        "alive": c.alive,
        "links": [
            {"href": format!("{base}/v1/conductors/{}", c.id), "rel": "self"},
            {"href": format!("{base}/conductors/{}", c.id), "rel": "bookmark"},
        ],
    });
    if detail {
        v["drivers"] = json!(["fake-hardware", "ipmi", "redfish"]);
        v["created_at"] = json!(super::render::timestamp(&c.started_at));
        v["updated_at"] = json!(super::render::timestamp(&c.last_seen));
    }
    v
}

/// Ironic's `/v1/conductors` (1.49): not found for older clients.
fn gate(version: &super::version::Version) -> ApiResult<()> {
    if super::version::ver(version) < (1, 49) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "the conductors endpoint needs API version 1.49 or later",
        ));
    }
    Ok(())
}

async fn conductors(state: &AppState) -> ApiResult<Vec<ConductorRecord>> {
    Ok(state
        .conductor
        .store
        .list_conductors(state.conductor.config.conductor.dead_after_s.max(1))
        .await?)
}

async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    version: super::version::Version,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    gate(&version)?;
    let detail = list_params(&params)?;
    let base = base_url(&headers);
    let all = conductors(&state).await?;
    Ok(Json(json!({
        "conductors": all.iter().map(|c| render(c, detail, &base)).collect::<Vec<_>>()
    })))
}

async fn show(
    State(state): State<AppState>,
    headers: HeaderMap,
    version: super::version::Version,
    Path(hostname): Path<String>,
) -> ApiResult<Json<Value>> {
    gate(&version)?;
    let base = base_url(&headers);
    let all = conductors(&state).await?;
    let c = all.iter().find(|c| c.id == hostname).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "conductor {hostname} could not be found; registered: {}",
                all.iter()
                    .map(|c| c.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    })?;
    Ok(Json(render(c, true, &base)))
}
