//! The node's boot device through its BMC (every microversion):
//! `GET|PUT /v1/nodes/{node}/management/boot_device` reads or sets it (once or persistent),
//! `GET …/management/boot_device/supported` lists what the node's driver can set. Reading and
//! setting are refused with 409 while another operation holds the node.

use super::{driver_error, json_body, node_for_bmc, py_repr};
use crate::api::{ApiError, ApiResult, AppState};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use rivet_drivers::BootDevice;
use serde_json::{json, Map, Value};
use std::collections::HashMap;

fn device_list(devices: &[BootDevice]) -> Vec<&'static str> {
    devices.iter().map(|d| d.as_str()).collect()
}

/// `GET …/management/boot_device/supported`: the devices the node's driver can set.
pub(super) async fn boot_device_supported(
    State(state): State<AppState>,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
    let node = state.conductor.store.get_node(&ident).await?;
    let bmc = state.conductor.bmc(&node)?;
    Ok(Json(json!({
        "supported_boot_devices": device_list(bmc.supported_boot_devices()),
    })))
}

/// `GET …/management/boot_device`: `{"boot_device", "persistent"}` as the BMC reports them
/// (null where it does not say).
pub(super) async fn boot_device_get(
    State(state): State<AppState>,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
    let (node, bmc) = node_for_bmc(&state, &ident, true).await?;
    let s = bmc
        .get_boot_device(&node.uuid, &node.driver_info)
        .await
        .map_err(|e| driver_error(&node, e))?;
    Ok(Json(json!({
        "boot_device": s.boot_device.map(BootDevice::as_str),
        "persistent": s.persistent,
    })))
}

/// Ironic's boolean words (oslo `bool_from_string`, strict).
fn parse_bool(name: &str, v: &Value) -> Result<bool, ApiError> {
    let word = match v {
        Value::Bool(b) => return Ok(*b),
        Value::String(s) => s.trim().to_ascii_lowercase(),
        other => other.to_string(),
    };
    match word.as_str() {
        "1" | "t" | "true" | "on" | "y" | "yes" => Ok(true),
        "0" | "f" | "false" | "off" | "n" | "no" => Ok(false),
        _ => Err(ApiError::bad_request(format!(
            "Invalid value for {name}: {} is not a boolean; use true or false",
            py_repr(v)
        ))),
    }
}

const MISSING_BOOT_DEVICE: &str =
    "Missing argument: \"boot_device\" (one of pxe, disk, cdrom, bios, safe, uefihttp)";

/// `{"boot_device": NAME, "persistent": BOOL}` (persistent also as a query parameter, as
/// Ironic takes it).
fn boot_device_request(
    query: &HashMap<String, String>,
    body: &Bytes,
) -> Result<(String, bool), ApiError> {
    crate::api::listing::only_params(query.keys(), &["persistent"])?;
    let m = match json_body(body)? {
        Some(Value::Object(m)) => m,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "the body must be a JSON object {{\"boot_device\": NAME, \"persistent\": BOOL}}, not {other}"
            )))
        }
        None => Map::new(),
    };
    if let Some(k) = m
        .keys()
        .find(|k| !["boot_device", "persistent"].contains(&k.as_str()))
    {
        return Err(ApiError::bad_request(format!(
            "unknown field {k:?} in the body; expected boot_device and persistent"
        )));
    }
    let device = match m.get("boot_device") {
        Some(Value::String(d)) => d.clone(),
        None | Some(Value::Null) => return Err(ApiError::bad_request(MISSING_BOOT_DEVICE)),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "Invalid value for boot_device: {} is not a string",
                py_repr(other)
            )))
        }
    };
    let persistent = match (m.get("persistent"), query.get("persistent")) {
        (Some(v), _) if !v.is_null() => parse_bool("persistent", v)?,
        (_, Some(q)) => parse_bool("persistent", &Value::from(q.as_str()))?,
        _ => false,
    };
    Ok((device, persistent))
}

/// `PUT …/management/boot_device`: 204; 400 for a device the driver does not support; 409
/// while another operation holds the node.
pub(super) async fn boot_device_set(
    State(state): State<AppState>,
    Path(ident): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let (name, persistent) = boot_device_request(&query, &body)?;
    let (node, bmc) = node_for_bmc(&state, &ident, true).await?;
    let supported = bmc.supported_boot_devices();
    let Some(device) = BootDevice::from_name(&name).filter(|d| supported.contains(d)) else {
        return Err(ApiError::bad_request(format!(
            "Invalid boot device {name} specified, supported are {}.",
            device_list(supported).join(", ")
        )));
    };
    // In the node's boot mode, as Ironic's ipmitool driver sets its EFI flag from it.
    let mode = state.conductor.override_mode(&node).await;
    let set = if persistent {
        bmc.set_boot_device_persistent(&node.uuid, &node.driver_info, device, mode)
            .await
    } else {
        bmc.set_boot_device(&node.uuid, &node.driver_info, device, mode)
            .await
    };
    set.map_err(|e| driver_error(&node, e))?;
    tracing::info!(node = %node.uuid, device = device.as_str(), persistent, "boot device set through the API");
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn boot_device_requests() {
        let none = HashMap::new();
        let r = |q: &HashMap<String, String>, b: &str| {
            boot_device_request(q, &Bytes::from(b.to_string()))
        };
        assert_eq!(
            r(&none, r#"{"boot_device": "pxe"}"#).unwrap(),
            ("pxe".into(), false)
        );
        assert_eq!(
            r(&none, r#"{"boot_device": "disk", "persistent": true}"#).unwrap(),
            ("disk".into(), true)
        );
        let q = HashMap::from([("persistent".to_string(), "True".to_string())]);
        assert_eq!(
            r(&q, r#"{"boot_device": "pxe"}"#).unwrap(),
            ("pxe".into(), true)
        );
        let q = HashMap::from([("persistent".to_string(), "blah".to_string())]);
        assert!(r(&q, r#"{"boot_device": "pxe"}"#).is_err());
        assert!(r(&none, "{}").is_err());
        assert!(r(&none, r#"{"boot_device": 5}"#).is_err());
        assert!(r(&none, r#"{"boot_device": "pxe", "colour": 1}"#).is_err());
    }
}
