//! `POST /agent/v1/discover`: a ramdisk that no node expects sends its inventory to be
//! enrolled ([`rivet_conductor::discovery`]). Open like the other agent endpoints, so it is
//! refused with 403 unless `[discovery] enabled = true`, and rate-limited per source address
//! (`[discovery] per_minute`) before any work is done.

use super::ratelimit::{Decision, RateLimiter, SourceKey};
use super::{ApiError, AppState, JsonBody};
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
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
    if let Some(Extension(PeerAddr(addr))) = peer {
        if let Decision::Limited { retry_after, warn } = limit.0.take(addr.ip()) {
            let per_minute = limit.0.per_minute();
            if warn {
                tracing::warn!(source = %SourceKey::of(addr.ip()), per_minute, "discovery requests from this source are over the limit; answering 429");
            }
            let secs = retry_after.as_secs().max(1);
            let mut resp = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "too many discovery requests from this address: the limit is {per_minute} per \
                     minute ([discovery] per_minute); retry after {secs} s"
                ),
            )
            .into_response();
            resp.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, HeaderValue::from(secs));
            return resp;
        }
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
