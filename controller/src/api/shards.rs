//! `GET /v1/shards` (1.82): how many nodes each shard holds, as Ironic counts them — every
//! distinct `node.shard`, nodes without one under the name `"None"`, most populated first.

use super::{ApiError, ApiResult, AppState};
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/shards", get(list))
        .route("/v1/shards/{name}", get(show))
}

async fn list(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    let counts = state.conductor.store.shard_counts().await?;
    let shards: Vec<Value> = counts
        .into_iter()
        .map(|(name, count)| {
            // Ironic answers str(shard): a NULL shard is "None".
            json!({"name": name.unwrap_or_else(|| "None".into()), "count": count})
        })
        .collect();
    Ok(Json(json!({ "shards": shards })))
}

/// Ironic does not serve one shard: 404 at any version.
async fn show() -> ApiResult<Json<Value>> {
    Err(ApiError::new(
        StatusCode::NOT_FOUND,
        "a single shard cannot be shown; list them with GET /v1/shards",
    ))
}
