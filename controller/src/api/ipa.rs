//! ironic-python-agent's ramdisk endpoints (`/v1/lookup`, `/v1/heartbeat/{node}`,
//! `/v1/continue_inspection`), which Rivet deliberately does not serve: its own agent speaks
//! `/agent/v1` (lookup, long-poll heartbeat, typed commands). An IPA ramdisk pointed at rivetd
//! gets a 404 that says so, instead of the router's bare "could not be found", so whoever
//! reads the ramdisk's log learns what to boot instead. No admin credential is needed: IPA
//! sends none, and nothing here reads or changes anything.

use super::{ApiError, AppState};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;

/// The answer to every IPA ramdisk endpoint.
async fn not_served(uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!(
            "{} is ironic-python-agent's ramdisk API, which rivetd does not serve: boot Rivet's \
             ramdisk (image-build), whose agent speaks /agent/v1 (see docs/api-versions.md, rows \
             1.22 and 1.84)",
            uri.path()
        ),
    )
}

/// The routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/lookup", get(not_served))
        .route("/v1/heartbeat/{node}", post(not_served))
        .route("/v1/continue_inspection", post(not_served))
}
