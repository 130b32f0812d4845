//! The node console (API 1.1): `GET|PUT /v1/nodes/{node}/states/console` (and
//! `GET /v1/nodes/states/console/{node}`, which Ironic's router answers too).
//!
//! - `ipmitool-socat` (ipmi and redfish hardware types): enabling checks `driver_info` as
//!   Ironic's validate does (a 400 naming what is missing), answers 202, and opens the node's
//!   SOL session in rivetd's console hub (`crate::console`); `console_enabled` turns true once
//!   the session is up, and a failure (the BMC refuses, no free port) leaves it false with
//!   `last_error` saying why, as Ironic. `console_info` is `{"type": "socat", "url":
//!   "tcp://ADDR:PORT"}` while enabled.
//! - `fake` (fake-hardware) is enabled and disabled as Ironic's fake console: the flag
//!   follows, `console_info` is `{}`.
//! - Anything else answers as Ironic's `no-console`: disabled, and changing it is a 400.

use super::json_body;
use crate::api::render::base_url;
use crate::api::{ApiError, ApiResult, AppState};
use crate::console::{ConsoleHub, SOCAT};
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
    // Ironic asks the interface for its connection only while the console is enabled.
    let info = if !kept.console_enabled {
        Value::Null
    } else if node.interfaces.get(&node.driver, Iface::Console) == SOCAT {
        match state.console.url(&node.uuid) {
            Some(url) => json!({"type": "socat", "url": url}),
            None => Value::Null,
        }
    } else {
        // The fake interface's connection is an empty document.
        json!({})
    };
    Ok(Json(
        json!({ "console_enabled": kept.console_enabled, "console_info": info }),
    ))
}

/// `GET /v1/nodes/states/console/{node}`: the same answer; this path reaches Ironic's
/// controller without the node path's identifier check, which its own method then makes
/// (a malformed identifier is a 400 there, not a 404).
pub(super) async fn console_get_by_states_path(
    state: State<AppState>,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
    crate::api::body::check_uuid_or_name("node_ident", &ident)?;
    console_get(state, Path(ident)).await
}

/// `PUT …/states/console` `{"enabled": bool}`: checked as Ironic checks it, then carried out
/// by the node's console interface (in the background: 202).
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
        return Ok(accepted(&headers, &ident));
    }
    if iface == SOCAT {
        let target = ConsoleHub::validate(&node).map_err(ApiError::bad_request)?;
        let hub = state.console.clone();
        let open_here = hub.session(&node.uuid).is_some();
        if on && !open_here {
            hub.enable(&node, target).await;
        } else if !on {
            let kept = state.conductor.store.node_management(&node.uuid).await?;
            if kept.console_enabled || open_here {
                // Ending the session waits for `sol deactivate`: not on the request.
                let uuid = node.uuid.clone();
                state
                    .conductor
                    .tasks
                    .spawn(async move { hub.disable(&uuid).await });
            }
        }
        tracing::info!(node = %node.uuid, enabled = on, "console set (ipmitool-socat)");
        return Ok(accepted(&headers, &ident));
    }
    Err(ApiError::bad_request(format!(
        "Driver {} does not support console (disabled or not implemented). Node {} has console_interface {iface:?}; \
         set console_interface to {SOCAT} (ipmi and redfish nodes with ipmi_* fields in driver_info) for a serial console.",
        node.driver,
        node.ident()
    )))
}

/// 202 with Ironic's Location header.
fn accepted(headers: &HeaderMap, ident: &str) -> Response {
    let mut resp = StatusCode::ACCEPTED.into_response();
    if let Ok(loc) = HeaderValue::from_str(&format!(
        "{}/v1/nodes/{ident}/states/console",
        base_url(headers)
    )) {
        resp.headers_mut().insert(header::LOCATION, loc);
    }
    resp
}
