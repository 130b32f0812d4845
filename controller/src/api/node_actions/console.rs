//! The node console (API 1.1): `GET|PUT /v1/nodes/{node}/states/console`.
//!
//! Rivet serves no serial or graphical console yet. A node whose console interface is
//! `fake` (fake-hardware) is enabled and disabled as Ironic's fake console is: 202, the
//! node's `console_enabled` follows, and `console_info` is the fake interface's empty
//! document. Every other node answers as Ironic answers for `no-console`: the console reads
//! disabled (`console_info` null), and asking to change it is a 400 naming the unsupported
//! extension.

use super::json_body;
use crate::api::render::base_url;
use crate::api::{ApiError, ApiResult, AppState};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use rivet_model::interfaces::Iface;
use serde_json::{json, Value};

/// `GET …/states/console`.
pub(super) async fn console_get(
    State(state): State<AppState>,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
    let node = state.conductor.store.get_node(&ident).await?;
    let kept = state.conductor.store.node_management(&node.uuid).await?;
    // Ironic asks the interface for its connection only while the console is enabled; the
    // fake interface's is an empty document.
    let info = if kept.console_enabled {
        json!({})
    } else {
        Value::Null
    };
    Ok(Json(
        json!({ "console_enabled": kept.console_enabled, "console_info": info }),
    ))
}

/// `PUT …/states/console` `{"enabled": bool}`: checked as Ironic checks it, then refused
/// as its `no-console` interface refuses it.
pub(super) async fn console_set(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(ident): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    super::only_args(&body, &["enabled"])?;
    let enabled = json_body(&body)?.and_then(|b| b.get("enabled").cloned());
    let on = match enabled {
        Some(Value::Bool(b)) => b,
        Some(Value::String(s)) if rivet_protocol::api::parse_bool_str(&s).is_some() => {
            rivet_protocol::api::parse_bool_str(&s).unwrap_or(false)
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "Invalid value for enabled: {other} is not a boolean"
            )))
        }
        None => return Err(ApiError::bad_request("Missing argument: \"enabled\"")),
    };
    let node = state.conductor.store.get_node(&ident).await?;
    let iface = node.interfaces.get(&node.driver, Iface::Console);
    if iface == "fake" {
        state
            .conductor
            .store
            .set_console_enabled(&node.uuid, on)
            .await?;
        tracing::info!(node = %node.uuid, enabled = on, "console set (fake console interface)");
        let mut resp = StatusCode::ACCEPTED.into_response();
        if let Ok(loc) = HeaderValue::from_str(&format!(
            "{}/v1/nodes/{ident}/states/console",
            base_url(&headers)
        )) {
            resp.headers_mut().insert(header::LOCATION, loc);
        }
        return Ok(resp);
    }
    Err(ApiError::bad_request(format!(
        "Driver {} does not support console (disabled or not implemented). Node {} has console_interface {iface:?}; Rivet serves no console.",
        node.driver,
        node.ident()
    )))
}
