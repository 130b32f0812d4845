//! The node console (API 1.1): `GET|PUT /v1/nodes/{node}/states/console`. Rivet serves no
//! serial or graphical console, so every node answers as Ironic answers for a node whose
//! console interface is `no-console`: the console is never enabled (`console_enabled`
//! false, `console_info` null), and asking to enable or disable it is a 400 naming the
//! unsupported extension.

use super::json_body;
use crate::api::{ApiError, ApiResult, AppState};
use crate::interfaces::Iface;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::Json;
use serde_json::{json, Value};

/// `GET …/states/console`.
pub(super) async fn console_get(
    State(state): State<AppState>,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
    state.conductor.store.get_node(&ident).await?;
    Ok(Json(
        json!({ "console_enabled": false, "console_info": null }),
    ))
}

/// `PUT …/states/console` `{"enabled": bool}`: checked as Ironic checks it, then refused
/// as its `no-console` interface refuses it.
pub(super) async fn console_set(
    State(state): State<AppState>,
    Path(ident): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let enabled = json_body(&body)?.and_then(|b| b.get("enabled").cloned());
    match enabled {
        Some(Value::Bool(_)) => {}
        Some(Value::String(s))
            if ["true", "false", "1", "0", "yes", "no", "on", "off"]
                .contains(&s.to_ascii_lowercase().as_str()) => {}
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "Invalid value for enabled: {other} is not a boolean"
            )))
        }
        None => return Err(ApiError::bad_request("Missing argument: \"enabled\"")),
    }
    let node = state.conductor.store.get_node(&ident).await?;
    let iface = node.interfaces.get(&node.driver, Iface::Console);
    Err(ApiError::bad_request(format!(
        "Driver {} does not support console (disabled or not implemented). Node {} has console_interface {iface:?}; Rivet serves no console.",
        node.driver,
        node.ident()
    )))
}
