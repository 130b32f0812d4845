//! `GET /ui/charts.json`: what the fleet page's charts draw — time per provision state and
//! per step, failures over time, the deploy-duration distribution — from the same
//! observations as rivetd's `/metrics` families (`rivet_support::metrics::charts`), plus the
//! node counts per provision state read from the store now. Numbers only: state and step
//! names come from rivetd's own tables and the agent's step list, and the page draws every
//! one as text.

use super::viewer;
use crate::api::AppState;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use rivet_support::metrics::charts;
use std::collections::BTreeMap;

/// The handler.
pub async fn serve(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if viewer::of(&state, &headers).is_none() {
        return (StatusCode::UNAUTHORIZED, "not logged in").into_response();
    }
    let mut doc = charts::snapshot(chrono::Utc::now().timestamp()).to_json();
    // Nodes per state now: the same aggregate query /metrics reads.
    match state.conductor.store.node_counts().await {
        Ok(counts) => {
            let mut per: BTreeMap<String, i64> = BTreeMap::new();
            for c in counts {
                *per.entry(c.provision_state).or_default() += c.count;
            }
            doc["nodes"] = serde_json::json!(per);
        }
        Err(e) => {
            tracing::warn!(error = %e, "charts: cannot read node counts from the store");
            doc["nodes"] = serde_json::Value::Null;
        }
    }
    Json(doc).into_response()
}
