//! `/agent/v1`: the ramdisk's endpoints. No admin credentials; the heartbeat needs the node's
//! agent token (`Authorization: Bearer`).

use super::{ApiError, AppState, JsonBody};
use crate::conductor::agent::AgentError;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use rivet_protocol::agent::{HeartbeatRequest, HeartbeatResponse, LookupRequest, LookupResponse};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/agent/v1/lookup", post(lookup))
        .route("/agent/v1/heartbeat/{node}", post(heartbeat))
}

impl From<AgentError> for ApiError {
    fn from(e: AgentError) -> Self {
        match e {
            AgentError::NotFound => ApiError::new(StatusCode::NOT_FOUND, e.to_string()),
            AgentError::Unauthorized => ApiError::new(StatusCode::UNAUTHORIZED, e.to_string()),
            AgentError::BadRequest(m) => ApiError::bad_request(m),
            AgentError::Conductor(c) => c.into(),
        }
    }
}

async fn lookup(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<LookupRequest>,
) -> Result<Json<LookupResponse>, ApiError> {
    Ok(Json(state.conductor.lookup(&req).await?))
}

async fn heartbeat(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(node): Path<String>,
    JsonBody(req): JsonBody<HeartbeatRequest>,
) -> Result<Json<HeartbeatResponse>, ApiError> {
    let token = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    Ok(Json(state.conductor.heartbeat(&node, token, req).await?))
}
