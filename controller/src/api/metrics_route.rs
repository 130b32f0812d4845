//! `GET /metrics` on the API address: the conductor's exposition behind the admin router's
//! auth (an admin or `metrics`-role credential).

use super::AppState;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;

/// `GET /metrics` on the API address (the admin router's auth runs first).
pub async fn scrape(State(state): State<AppState>, headers: HeaderMap) -> Response {
    crate::metrics_http::render(&state.conductor, &headers).await
}
