//! `GET /v1/nodes/{node}/logs[/{id}]`: the agent logs kept with a node when a step failed on
//! the ramdisk (store/node_logs.rs). A Rivet extension: Ironic stores these as files under
//! `[agent] deploy_logs_local_path` and has no API for them; Rivet keeps the newest
//! [`NODE_LOGS_KEPT`](rivet_store::NODE_LOGS_KEPT) per node in the database and serves them
//! here, at every microversion. Admin and operator only (a reader may see node records but
//! not what ran on the machine). The agent never logs its token or BMC credentials (those
//! never reach the ramdisk), so the text is shown as sent.

use super::render::base_url;
use super::{ApiError, ApiResult, AppState};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::{Extension, Json, Router};
use rivet_model::config::Role;
use rivet_store::NodeLog;
use serde_json::{json, Value};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/nodes/{ident}/logs", get(list))
        .route("/v1/nodes/{ident}/logs/{id}", get(show))
}

fn allowed(caller: &super::auth::Caller) -> Result<(), ApiError> {
    match caller.role {
        Role::Admin | Role::Operator => Ok(()),
        _ => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "{} (role {}) may not read agent logs: they need the admin or operator role",
                caller.name,
                caller.role.as_str()
            ),
        )),
    }
}

fn render(log: &NodeLog, base: &str) -> Value {
    let href = format!("{base}/v1/nodes/{}/logs/{}", log.node_uuid, log.id);
    json!({
        "id": log.id,
        "node_uuid": log.node_uuid,
        "created_at": super::render::timestamp(&log.created_at),
        "operation": log.operation,
        "step": log.step,
        "command_id": log.command_id,
        "text": log.text,
        "links": [{"href": href, "rel": "self"}],
    })
}

/// `GET /v1/nodes/{node}/logs`: newest first, with their text (at most a few per node).
async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    Extension(caller): Extension<super::auth::Caller>,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
    allowed(&caller)?;
    let node = state.conductor.store.get_node(&ident).await?;
    let logs = state.conductor.store.list_node_logs(&node.uuid).await?;
    let base = base_url(&headers);
    Ok(Json(json!({
        "logs": logs.iter().map(|l| render(l, &base)).collect::<Vec<_>>(),
    })))
}

/// `GET /v1/nodes/{node}/logs/{id}`.
async fn show(
    State(state): State<AppState>,
    headers: HeaderMap,
    Extension(caller): Extension<super::auth::Caller>,
    Path((ident, id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    allowed(&caller)?;
    let node = state.conductor.store.get_node(&ident).await?;
    let not_found = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "Agent log {id} of node {} could not be found; GET /v1/nodes/{}/logs lists the kept ones (the newest {}).",
                node.uuid,
                node.uuid,
                rivet_store::NODE_LOGS_KEPT
            ),
        )
    };
    let Ok(n) = id.parse::<i64>() else {
        return Err(not_found());
    };
    match state.conductor.store.get_node_log(&node.uuid, n).await {
        Ok(log) => Ok(Json(render(&log, &base_url(&headers)))),
        Err(rivet_store::StoreError::NotFound { .. }) => Err(not_found()),
        Err(e) => Err(e.into()),
    }
}
