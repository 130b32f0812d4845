//! `/agent/v1`: the ramdisk's endpoints. No admin credentials; the heartbeat needs the node's
//! agent token (`Authorization: Bearer`).
//!
//! Both are open to anyone on the provisioning network, so: a lookup that finds nothing and a
//! lookup for a node that expects no ramdisk get the same 404; a heartbeat for an unknown node
//! gets the same 401 as a wrong token; and lookups and failed token checks are rate-limited
//! per source address ([`super::ratelimit`], `[agent] lookup_per_minute`,
//! `failed_auth_per_minute`). The limits apply only when the request carries its TCP peer
//! ([`PeerAddr`], set by the server for every connection); a router driven in-process (tests)
//! has no peer and is not limited.

use super::ratelimit::RateLimiter;
use super::{ApiError, AppState, JsonBody};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use rivet_conductor::agent::{AgentError, Heartbeat};
use rivet_model::config::AgentSettings;
use rivet_protocol::agent::{HeartbeatRequest, LookupRequest};
use rivet_support::http::PeerAddr;
use std::sync::Arc;

/// The per-source limits of the agent endpoints.
struct AgentLimits {
    lookup: RateLimiter,
    failed_auth: RateLimiter,
}

pub fn routes(settings: &AgentSettings) -> Router<AppState> {
    let limits = Arc::new(AgentLimits {
        lookup: RateLimiter::new(settings.lookup_per_minute),
        failed_auth: RateLimiter::new(settings.failed_auth_per_minute),
    });
    Router::new()
        .route("/agent/v1/lookup", post(lookup))
        .route("/agent/v1/heartbeat/{node}", post(heartbeat))
        .layer(Extension(limits))
}

impl From<AgentError> for ApiError {
    fn from(e: AgentError) -> Self {
        match e {
            AgentError::NotFound => ApiError::new(StatusCode::NOT_FOUND, e.to_string()),
            AgentError::Unauthorized | AgentError::OtherBoot => {
                ApiError::new(StatusCode::UNAUTHORIZED, e.to_string())
            }
            AgentError::BadRequest(m) => ApiError::bad_request(m),
            AgentError::Conductor(c) => c.into(),
        }
    }
}

async fn lookup(
    State(state): State<AppState>,
    Extension(limits): Extension<Arc<AgentLimits>>,
    peer: Option<Extension<PeerAddr>>,
    JsonBody(req): JsonBody<LookupRequest>,
) -> Response {
    if let Some(refused) =
        limits
            .lookup
            .refuse(peer.as_ref(), "[agent] lookup_per_minute", "agent lookups")
    {
        return refused;
    }
    match state.conductor.lookup(&req).await {
        Ok(resp) => Json(resp).into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

async fn heartbeat(
    State(state): State<AppState>,
    Extension(limits): Extension<Arc<AgentLimits>>,
    peer: Option<Extension<PeerAddr>>,
    headers: HeaderMap,
    Path(node): Path<String>,
    JsonBody(req): JsonBody<HeartbeatRequest>,
) -> Response {
    // Owned, so that the header map is freed now rather than held for the long poll.
    let token = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| t.trim().to_owned());
    drop(headers);
    let err = match state
        .conductor
        .heartbeat(&node, token.as_deref(), req)
        .await
    {
        Ok(Heartbeat::Now(resp)) => return Json(resp).into_response(),
        // Everything of this request is dropped now; the poll waits in the outermost layer.
        Ok(Heartbeat::Held(held)) => {
            return super::deferred::response(async move {
                match held.answer().await {
                    Ok(resp) => Json(resp).into_response(),
                    // The token was good when the poll was held; losing it since means the
                    // operation ended, which is not a failed check to charge to the source.
                    Err(AgentError::NotFound) => {
                        ApiError::from(AgentError::Unauthorized).into_response()
                    }
                    Err(e) => ApiError::from(e).into_response(),
                }
            });
        }
        Err(e) => e,
    };
    // A failed token check is charged to its source; only once the source is over its limit
    // does the answer change (to 429), so an honest agent still hears 401 and looks up again.
    let err = match err {
        // Unknown node: the same answer as a wrong token, so heartbeats cannot probe which
        // node names or UUIDs exist.
        AgentError::NotFound => AgentError::Unauthorized,
        e => e,
    };
    if matches!(err, AgentError::Unauthorized | AgentError::OtherBoot) {
        if let Some(refused) = limits.failed_auth.refuse(
            peer.as_ref(),
            "[agent] failed_auth_per_minute",
            "failed agent token checks",
        ) {
            return refused;
        }
    }
    ApiError::from(err).into_response()
}
