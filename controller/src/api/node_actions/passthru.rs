//! Vendor passthru (API 1.1) for nodes and drivers: Rivet's drivers offer no vendor
//! methods, so the method lists are `{}` and a call answers as Ironic's conductor answers
//! for a method no handler has (400), or for a call without `method` (400).
//!
//! `GET /v1/nodes/{node}/vendor_passthru/methods`, `* /v1/nodes/{node}/vendor_passthru?method=`,
//! `GET /v1/drivers/{driver}/vendor_passthru/methods`, `* /v1/drivers/{driver}/vendor_passthru?method=`;
//! the method may also be the last path segment (`…/vendor_passthru/{method}`), as
//! python-ironicclient sends it.

use crate::api::{ApiError, ApiResult, AppState};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};
use std::collections::HashMap;

fn known_driver(name: &str) -> Result<(), ApiError> {
    if rivet_model::interfaces::hardware_type(name).is_none() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("Could not find the following driver(s) or hardware type(s): {name}."),
        ));
    }
    Ok(())
}

fn no_handler(params: &HashMap<String, String>) -> ApiError {
    match params.get("method").filter(|m| !m.is_empty()) {
        None => ApiError::bad_request("Method not specified"),
        Some(m) => ApiError::bad_request(format!(
            "No handler for method {m}: Rivet's drivers offer no vendor passthru methods"
        )),
    }
}

/// `GET /v1/nodes/{node}/vendor_passthru/methods`.
pub(super) async fn node_methods(
    State(state): State<AppState>,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
    state.conductor.store.get_node(&ident).await?;
    Ok(Json(json!({})))
}

/// Any call of `/v1/nodes/{node}/vendor_passthru`.
pub(super) async fn node_call(
    State(state): State<AppState>,
    Path(ident): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiError {
    if let Err(e) = state.conductor.store.get_node(&ident).await {
        return e.into();
    }
    no_handler(&params)
}

/// `GET /v1/drivers/{driver}/vendor_passthru/methods`.
pub(super) async fn driver_methods(Path(name): Path<String>) -> ApiResult<Json<Value>> {
    known_driver(&name)?;
    Ok(Json(json!({})))
}

/// A call of `/v1/nodes/{node}/vendor_passthru/{method}` (python-ironicclient's form).
pub(super) async fn node_call_named(
    State(state): State<AppState>,
    Path((ident, method)): Path<(String, String)>,
) -> ApiError {
    if let Err(e) = state.conductor.store.get_node(&ident).await {
        return e.into();
    }
    no_handler(&HashMap::from([("method".to_string(), method)]))
}

/// A call of `/v1/drivers/{driver}/vendor_passthru/{method}`.
pub(super) async fn driver_call_named(Path((name, method)): Path<(String, String)>) -> ApiError {
    if let Err(e) = known_driver(&name) {
        return e;
    }
    no_handler(&HashMap::from([("method".to_string(), method)]))
}

/// Any call of `/v1/drivers/{driver}/vendor_passthru`.
pub(super) async fn driver_call(
    Path(name): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiError {
    if let Err(e) = known_driver(&name) {
        return e;
    }
    no_handler(&params)
}
