//! `POST /agent/v1/discover`: a ramdisk that no node expects sends its inventory to be
//! enrolled ([`rivet_conductor::discovery`]). Open like the other agent endpoints, so it is
//! refused with 403 unless `[discovery] enabled = true`, and rate-limited per source address
//! (`[discovery] per_minute`) before any work is done.

use super::ratelimit::RateLimiter;
use super::{ApiError, AppState, JsonBody};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use rivet_conductor::discovery::{DiscoveryConfig, DiscoveryError};
use rivet_protocol::discovery::{DiscoverRequest, DISCOVER_PATH};
use rivet_support::http::PeerAddr;
use std::sync::Arc;

/// The per-source limit of discovery requests.
struct DiscoveryLimit(RateLimiter);

pub fn routes(cfg: &DiscoveryConfig) -> Router<AppState> {
    let limit = Arc::new(DiscoveryLimit(RateLimiter::new(cfg.per_minute)));
    Router::new()
        .route(DISCOVER_PATH, post(discover))
        .layer(Extension(limit))
}

impl From<DiscoveryError> for ApiError {
    fn from(e: DiscoveryError) -> Self {
        match e {
            DiscoveryError::Disabled => ApiError::new(StatusCode::FORBIDDEN, e.to_string()),
            DiscoveryError::BadRequest(m) => ApiError::bad_request(m),
            DiscoveryError::Store(s) => s.into(),
        }
    }
}

async fn discover(
    State(state): State<AppState>,
    Extension(limit): Extension<Arc<DiscoveryLimit>>,
    peer: Option<Extension<PeerAddr>>,
    JsonBody(req): JsonBody<DiscoverRequest>,
) -> Response {
    if let Some(refused) = limit.0.refuse(
        peer.as_ref(),
        "[discovery] per_minute",
        "discovery requests",
    ) {
        return refused;
    }
    match state.conductor.discover(&req).await {
        Ok(resp) => {
            let status = if resp.created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            (status, Json(resp)).into_response()
        }
        Err(e) => ApiError::from(e).into_response(),
    }
}
