//! Management calls through the node's BMC, with Ironic's routes, codes and gates:
//!
//! - indicators (1.63): `GET /v1/nodes/{node}/management/indicators`,
//!   `GET|PUT …/indicators/{name@component}` (`{"state": "ON"|"OFF"|"BLINKING"}`);
//! - inject NMI (1.29): `PUT /v1/nodes/{node}/management/inject_nmi` (204);
//! - boot mode and secure boot (1.76): `PUT /v1/nodes/{node}/states/boot_mode`
//!   (`{"target": "bios"|"uefi"}`) and `…/states/secure_boot` (`{"target": bool}`), 202;
//!   refused with 409 while the node is in a transient provision state.
//!
//! A driver without the call answers 400, as Ironic's unsupported driver extension.

use super::{driver_error, json_body, node_for_bmc};
use crate::api::render::base_url;
use crate::api::{ApiError, ApiResult, AppState};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use rivet_drivers::management::{BOOT_MODES, INDICATOR_STATES};
use serde_json::{json, Value};
use std::collections::HashMap;

/// `name@component` (Ironic's `IndicatorAtComponent`).
fn split_indicator(unique: &str) -> Result<(&str, &str), ApiError> {
    unique
        .rsplit_once('@')
        .ok_or_else(|| ApiError::bad_request(format!("Malformed indicator name \"{unique}\"")))
}

/// `GET …/management/indicators`.
pub(super) async fn indicators_list(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
    let (node, bmc) = node_for_bmc(&state, &ident, false).await?;
    let found = bmc
        .indicators(&node.uuid, &node.driver_info)
        .await
        .map_err(|e| driver_error(&node, e))?;
    let base = base_url(&headers);
    let docs: Vec<Value> = found
        .iter()
        .map(|i| {
            let unique = format!("{}@{}", i.name, i.component);
            let path = format!("{ident}/management/indicators/{unique}");
            json!({
                "name": unique,
                "component": i.component,
                "readonly": i.readonly,
                "states": i.states,
                "links": [
                    {"href": format!("{base}/v1/nodes/{path}"), "rel": "self"},
                    {"href": format!("{base}/nodes/{path}"), "rel": "bookmark"},
                ],
            })
        })
        .collect();
    Ok(Json(json!({ "indicators": docs })))
}

/// `GET …/management/indicators/{name@component}`: `{"state": …}`.
pub(super) async fn indicator_get(
    State(state): State<AppState>,
    Path((ident, indicator)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let (name, component) = split_indicator(&indicator)?;
    let (node, bmc) = node_for_bmc(&state, &ident, false).await?;
    let s = bmc
        .indicator_state(&node.uuid, &node.driver_info, component, name)
        .await
        .map_err(|e| driver_error(&node, e))?;
    Ok(Json(json!({ "state": s })))
}

/// `PUT …/management/indicators/{name@component}` with `state` in the body or the query.
pub(super) async fn indicator_set(
    State(state): State<AppState>,
    Path((ident, indicator)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let (name, component) = split_indicator(&indicator)?;
    super::only_args(&body, &["state"])?;
    let from_body =
        json_body(&body)?.and_then(|b| b.get("state").and_then(Value::as_str).map(str::to_string));
    let Some(wanted) = from_body.or_else(|| query.get("state").cloned()) else {
        return Err(ApiError::bad_request(
            "Missing argument: \"state\" (one of ON, OFF, BLINKING)",
        ));
    };
    if !INDICATOR_STATES.contains(&wanted.as_str()) || wanted == "UNKNOWN" {
        return Err(ApiError::bad_request(format!(
            "Invalid indicator state \"{wanted}\"; use ON, OFF or BLINKING"
        )));
    }
    let (node, bmc) = node_for_bmc(&state, &ident, true).await?;
    bmc.set_indicator_state(&node.uuid, &node.driver_info, component, name, &wanted)
        .await
        .map_err(|e| driver_error(&node, e))?;
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT …/management/inject_nmi` (an empty body or `{}`).
pub(super) async fn inject_nmi(
    State(state): State<AppState>,
    Path(ident): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    if let Some(b) = json_body(&body)? {
        if b.as_object().is_none_or(|m| !m.is_empty()) {
            return Err(ApiError::bad_request(
                "inject_nmi takes no arguments: send an empty body or {}",
            ));
        }
    }
    let (node, bmc) = node_for_bmc(&state, &ident, true).await?;
    bmc.inject_nmi(&node.uuid, &node.driver_info)
        .await
        .map_err(|e| driver_error(&node, e))?;
    Ok(StatusCode::NO_CONTENT)
}

/// The node may change boot settings: not while it transitions (Ironic's UNSTABLE_STATES).
fn refuse_transient(node: &rivet_model::node::Node, what: &str) -> Result<(), ApiError> {
    let s = node.provision_state;
    if s.is_conductor_busy() || s.is_wait() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "Node {} is in {s} state. Since node is transitioning, the {what} will not be set as this may interfere with ongoing changes and result in erroneous modification. Try again later.",
                node.ident()
            ),
        ));
    }
    Ok(())
}

/// What the BMC reports after a change becomes the node's `boot_mode` and `secure_boot`.
async fn record_boot_state(
    state: &AppState,
    node: &rivet_model::node::Node,
    bmc: &dyn rivet_drivers::Bmc,
) -> Result<(), ApiError> {
    rivet_conductor::bmc_caches::refresh_boot_state(
        state.conductor.store.as_ref(),
        bmc,
        &node.uuid,
        &node.driver_info,
    )
    .await?;
    Ok(())
}

fn target_of(body: &Bytes) -> Result<Value, ApiError> {
    super::only_args(body, &["target"])?;
    json_body(body)?
        .and_then(|b| b.get("target").cloned())
        .ok_or_else(|| ApiError::bad_request("Missing argument: \"target\""))
}

/// `PUT …/states/boot_mode` `{"target": "bios"|"uefi"}`: 202.
pub(super) async fn boot_mode_set(
    State(state): State<AppState>,
    Path(ident): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let target = target_of(&body)?;
    let mode = target.as_str().unwrap_or_default();
    if !BOOT_MODES.contains(&mode) {
        return Err(ApiError::bad_request(format!(
            "Invalid boot mode {} requested for node. Allowed boot modes are: {}",
            target,
            BOOT_MODES.join(", ")
        )));
    }
    let (node, bmc) = node_for_bmc(&state, &ident, true).await?;
    refuse_transient(&node, "boot mode")?;
    bmc.set_boot_mode(&node.uuid, &node.driver_info, mode)
        .await
        .map_err(|e| driver_error(&node, e))?;
    record_boot_state(&state, &node, bmc.as_ref()).await?;
    Ok(StatusCode::ACCEPTED)
}

/// `PUT …/states/secure_boot` `{"target": true|false}`: 202.
pub(super) async fn secure_boot_set(
    State(state): State<AppState>,
    Path(ident): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let target = target_of(&body)?;
    let on = match &target {
        Value::Bool(b) => *b,
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "1" | "t" | "true" | "on" | "y" | "yes" => true,
            "0" | "f" | "false" | "off" | "n" | "no" => false,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "Invalid secure boot target {target}: use true or false"
                )))
            }
        },
        _ => {
            return Err(ApiError::bad_request(format!(
                "Invalid secure boot target {target}: use true or false"
            )))
        }
    };
    let (node, bmc) = node_for_bmc(&state, &ident, true).await?;
    refuse_transient(&node, "secure boot state")?;
    bmc.set_secure_boot(&node.uuid, &node.driver_info, on)
        .await
        .map_err(|e| driver_error(&node, e))?;
    record_boot_state(&state, &node, bmc.as_ref()).await?;
    Ok(StatusCode::ACCEPTED)
}
