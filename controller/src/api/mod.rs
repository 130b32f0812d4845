//! The HTTP API: Ironic-shaped admin endpoints under `/v1`, agent endpoints under `/agent/v1`.
//!
//! Every response carries the microversion headers; every error is Ironic's
//! `{"error_message": "<json with faultstring>"}` with a message that names the node, its
//! state and what to do. Request bodies are size-limited and strictly typed.

mod agent;
mod allocations;
mod audit;
pub(crate) mod auth;
mod body;
mod boot;
mod chassis;
mod conductors;
mod console_ws;
mod metrics_route;
pub(crate) use rivet_support::http::deferred;
mod deploy_templates;
mod discovery;
mod drivers;
mod events;
mod file_body;
pub mod gates;
mod history;
mod image_cache;
mod ipa;
mod listing;
mod network_data;
mod node_actions;
mod node_json;
mod node_logs;
mod nodes;
pub mod openapi;
mod patch;
mod paths;
mod port_common;
mod portgroups;
mod ports;
pub mod ratelimit;
mod render;
mod resource;
mod rules;
mod runbooks;
pub mod sessions;
mod shards;
mod step_templates;
mod version;
mod volume;

pub use body::JsonBody;
pub use version::ApiVersion;

use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{middleware, Json, Router};
use rivet_conductor::{Conductor, ConductorError};
use rivet_protocol::api::ErrorBody;
use rivet_store::StoreError;
use std::sync::Arc;

/// Shared state of every handler.
#[derive(Clone)]
pub struct AppState {
    /// The conductor (and through it the store and config).
    pub conductor: Arc<Conductor>,
    /// Failed admin authentications per source address (`[api] failed_auth_per_minute`);
    /// the web UI's failed log-ins count here too.
    pub admin_auth_failures: Arc<ratelimit::RateLimiter>,
    /// The web UI's sessions (a credential the auth layer accepts).
    pub sessions: Arc<sessions::Sessions>,
    /// The serial consoles this rivetd holds.
    pub console: Arc<crate::console::ConsoleHub>,
}

impl AppState {
    /// The state for `conductor`, limits from its config.
    pub fn new(conductor: Arc<Conductor>) -> AppState {
        let per_minute = conductor.config.api.failed_auth_per_minute;
        AppState {
            console: crate::console::ConsoleHub::new(conductor.clone()),
            conductor,
            admin_auth_failures: Arc::new(ratelimit::RateLimiter::new(per_minute)),
            sessions: Arc::default(),
        }
    }
}

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human message.
    pub message: String,
    /// Seconds for a `Retry-After` header (a 503 the client should simply retry).
    retry_after: Option<u32>,
}

impl ApiError {
    /// An error with a status.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 503 with `Retry-After: secs`: a passing fault (the database is unavailable), not
    /// a problem with the request.
    pub fn unavailable(message: impl Into<String>, secs: u32) -> Self {
        ApiError {
            retry_after: Some(secs),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
        }
    }

    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let client = self.status.is_client_error();
        if !client {
            tracing::error!(status = %self.status, error = %self.message, "request failed");
        }
        let mut resp = (self.status, Json(ErrorBody::new(&self.message, client))).into_response();
        resp.headers_mut().insert(
            axum::http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// `Retry-After` of a 503 for an unavailable database: a PostgreSQL restart takes seconds;
/// a full disk needs an operator, and clients retrying every few seconds cost little.
const STORE_RETRY_AFTER_S: u32 = 5;

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        if let StoreError::Unavailable(why) = &e {
            return ApiError::unavailable(why.clone(), STORE_RETRY_AFTER_S);
        }
        let status = match &e {
            StoreError::NotFound { .. } => StatusCode::NOT_FOUND,
            StoreError::Duplicate(_) | StoreError::Conflict { .. } | StoreError::Corrupt { .. } => {
                StatusCode::CONFLICT
            }
            StoreError::Backend(_) | StoreError::Secrets(_) | StoreError::Unavailable(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        ApiError::new(status, e.to_string())
    }
}

impl From<ConductorError> for ApiError {
    fn from(e: ConductorError) -> Self {
        match e {
            ConductorError::Store(s) => s.into(),
            ConductorError::InvalidState { .. } | ConductorError::BadRequest(_) => {
                ApiError::bad_request(e.to_string())
            }
            ConductorError::Locked { .. } | ConductorError::NotAbortable { .. } => {
                ApiError::new(StatusCode::CONFLICT, e.to_string())
            }
            ConductorError::Protected { .. } => ApiError::new(StatusCode::FORBIDDEN, e.to_string()),
            ConductorError::NotAcceptable(_) => {
                ApiError::new(StatusCode::NOT_ACCEPTABLE, e.to_string())
            }
            ConductorError::Driver { .. } => ApiError::bad_request(e.to_string()),
            // Ironic's ConcurrentActionLimit is a TemporaryFailure: 503.
            ConductorError::ConcurrentActionLimit { .. } => {
                ApiError::unavailable(e.to_string(), STORE_RETRY_AFTER_S)
            }
        }
    }
}

/// Result of a handler.
pub type ApiResult<T> = Result<T, ApiError>;

/// Build the whole router: [`routes`] behind the path rewriting of [`paths::normalize`].
pub fn router(state: AppState) -> Router {
    let routes = routes(state.clone());
    // In front of routing (a layer on `routes` would run after it): the paths Ironic also
    // answers are rewritten to the canonical ones.
    let normalized = tower_layer::Layer::layer(
        &middleware::from_fn_with_state(state, paths::normalize),
        routes,
    );
    Router::new().fallback_service(normalized)
}

/// The routes and their layers. Every route needs its row in [`openapi::OPERATIONS`] (the
/// OpenAPI document; tests/openapi.rs walks this router and fails on a route without one).
pub fn routes(state: AppState) -> Router {
    let max_body = state.conductor.config.api.max_body_bytes;
    let admin = Router::new()
        .merge(nodes::routes())
        .merge(node_actions::routes())
        .merge(ports::routes())
        .merge(portgroups::routes())
        .merge(chassis::routes())
        .merge(rules::routes())
        .merge(conductors::routes())
        .merge(drivers::routes())
        .merge(audit::routes())
        .merge(history::routes())
        .merge(node_logs::routes())
        .merge(shards::routes())
        .merge(events::routes())
        .merge(allocations::routes())
        .merge(deploy_templates::routes())
        .merge(runbooks::routes())
        .merge(volume::routes())
        .merge(console_ws::routes())
        .merge(image_cache::admin_routes())
        .route("/metrics", get(metrics_route::scrape))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_admin,
        ));
    Router::new()
        .route("/", get(version::root))
        .route("/v1", get(version::v1))
        .route("/v1/", get(version::v1))
        .route("/v1/openapi.json", get(openapi::serve))
        .merge(admin)
        // Its own credential check: headers, or a browser's single-use ticket.
        .merge(console_ws::ws_routes())
        .merge(agent::routes(&state.conductor.config.agent))
        .merge(ipa::routes())
        .merge(discovery::routes(&state.conductor.config.discovery))
        .merge(boot::routes())
        .merge(image_cache::download_routes())
        // Every matched route's microversion, from its row in openapi::OPERATIONS.
        .route_layer(middleware::from_fn(gates::require))
        // After every route: it is set on the routes there are.
        .method_not_allowed_fallback(gates::method_not_allowed)
        .fallback(not_found)
        .layer(middleware::from_fn(version::negotiate))
        .layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn_with_state(state.clone(), audit::record))
        .layer(middleware::from_fn(rivet_support::metrics::http))
        // Outermost: a held long poll waits here, after every layer above has let go.
        .layer(middleware::from_fn(deferred::resolve))
        .with_state(state)
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("the resource {} could not be found", uri.path()),
    )
}
