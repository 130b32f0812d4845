//! `/v1/inspection_rules`: create, list, show, patch, delete. A rule that does not validate
//! is a 400 naming the field.

use super::{body, patch, ApiError, ApiResult, AppState, JsonBody};
use crate::inspection::rules::{validate, Rule};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use rivet_protocol::api::PatchOp;
use serde_json::{json, Value};

// Rules are admin bodies: admin limits.
impl rivet_protocol::limits::Limited for Rule {}

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/inspection_rules", get(list).post(create))
        .route(
            "/v1/inspection_rules/{uuid}",
            get(show).patch(update).delete(remove),
        )
}

async fn save(state: &AppState, mut rule: Rule) -> ApiResult<Rule> {
    validate(&rule).map_err(|e| ApiError::bad_request(format!("invalid inspection rule: {e}")))?;
    let uuid = match rule.uuid.take() {
        Some(u) => uuid::Uuid::parse_str(&u)
            .map_err(|_| ApiError::bad_request(format!("uuid: {u:?} is not a valid UUID")))?
            .to_string(),
        None => uuid::Uuid::new_v4().to_string(),
    };
    rule.uuid = Some(uuid.clone());
    let doc = serde_json::to_value(&rule).map_err(|e| ApiError::bad_request(e.to_string()))?;
    state
        .conductor
        .store
        .put_rule(&uuid, rule.priority, &doc)
        .await?;
    Ok(rule)
}

async fn find(state: &AppState, uuid: &str) -> ApiResult<Rule> {
    state
        .conductor
        .store
        .list_rules()
        .await?
        .into_iter()
        .filter_map(|v| serde_json::from_value::<Rule>(v).ok())
        .find(|r| r.uuid.as_deref() == Some(uuid))
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("inspection rule {uuid} could not be found"),
            )
        })
}

async fn create(
    State(state): State<AppState>,
    JsonBody(rule): JsonBody<Rule>,
) -> ApiResult<Response> {
    if let Some(u) = &rule.uuid {
        if find(&state, u).await.is_ok() {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("inspection rule {u} already exists"),
            ));
        }
    }
    let rule = save(&state, rule).await?;
    Ok((StatusCode::CREATED, Json(rule)).into_response())
}

async fn list(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    Ok(Json(
        json!({ "inspection_rules": state.conductor.store.list_rules().await? }),
    ))
}

async fn show(State(state): State<AppState>, Path(uuid): Path<String>) -> ApiResult<Json<Rule>> {
    Ok(Json(find(&state, &uuid).await?))
}

async fn update(
    State(state): State<AppState>,
    Path(uuid): Path<String>,
    JsonBody(ops): JsonBody<Vec<PatchOp>>,
) -> ApiResult<Json<Rule>> {
    let current = find(&state, &uuid).await?;
    let mut doc =
        serde_json::to_value(&current).map_err(|e| ApiError::bad_request(e.to_string()))?;
    patch::apply(
        &mut doc,
        &ops,
        &["description", "priority", "conditions", "actions"],
    )?;
    let rule: Rule = body::parse(doc.to_string().as_bytes())?;
    Ok(Json(save(&state, rule).await?))
}

async fn remove(State(state): State<AppState>, Path(uuid): Path<String>) -> ApiResult<StatusCode> {
    state.conductor.store.delete_rule(&uuid).await?;
    Ok(StatusCode::NO_CONTENT)
}
