//! `POST /v1/events` (1.54): external events for the Bare Metal service (Neutron's port
//! bind/unbind/delete notifications). The body is checked against Ironic's schema and each
//! event is logged; nothing else acts on them yet. 204 on success, 400 for a body the
//! schema refuses, 404 below 1.54.

use super::{ApiError, ApiResult, AppState};
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use serde_json::Value;

const EVENT_TYPES: &[&str] = &[
    "network.bind_port",
    "network.unbind_port",
    "network.delete_port",
];
const FIELDS: &[&str] = &[
    "event",
    "port_id",
    "mac_address",
    "status",
    "device_id",
    "binding:host_id",
    "binding:vnic_type",
];
const REQUIRED: &[&str] = &["event", "port_id", "mac_address", "status"];

pub fn routes() -> Router<AppState> {
    Router::new().route("/v1/events", post(create))
}

/// Lower-case `xx:xx:xx:xx:xx:xx` after lower-casing (Ironic's `mac-address` format).
fn is_mac(s: &str) -> bool {
    let parts: Vec<&str> = s.split(':').collect();
    parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
}

fn is_uuid(s: &str) -> bool {
    uuid::Uuid::parse_str(s).is_ok()
}

/// Ironic's `create_request_body` schema; the error names the first violation.
fn validate(body: &Value) -> Result<&Vec<Value>, String> {
    let obj = body
        .as_object()
        .ok_or_else(|| format!("{body} is not of type 'object'"))?;
    if let Some(k) = obj.keys().find(|k| k.as_str() != "events") {
        return Err(format!(
            "Additional properties are not allowed ('{k}' was unexpected)"
        ));
    }
    let events = obj.get("events").ok_or("'events' is a required property")?;
    let events = events
        .as_array()
        .ok_or_else(|| format!("{events} is not of type 'array'"))?;
    if events.is_empty() {
        return Err("[] should be non-empty".into());
    }
    for e in events {
        let item = e
            .as_object()
            .ok_or_else(|| format!("{e} is not of type 'object'"))?;
        if let Some(k) = item.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(format!(
                "Additional properties are not allowed ('{k}' was unexpected)"
            ));
        }
        if let Some(k) = REQUIRED.iter().find(|k| !item.contains_key(**k)) {
            return Err(format!("'{k}' is a required property"));
        }
        for (k, v) in item {
            let nullable = matches!(
                k.as_str(),
                "device_id" | "binding:host_id" | "binding:vnic_type"
            );
            let Some(s) = v.as_str() else {
                if nullable && v.is_null() {
                    continue;
                }
                let ty = if nullable {
                    "['string', 'null']"
                } else {
                    "'string'"
                };
                return Err(format!("{v} is not of type {ty} (field {k})"));
            };
            let ok = match k.as_str() {
                "event" => EVENT_TYPES.contains(&s),
                "port_id" | "device_id" | "binding:host_id" => is_uuid(s),
                "mac_address" => is_mac(s),
                _ => true,
            };
            if !ok {
                return Err(if k == "event" {
                    format!("'{s}' is not one of {EVENT_TYPES:?}")
                } else {
                    format!(
                        "'{s}' is not a '{}' (field {k})",
                        if k == "mac_address" {
                            "mac-address"
                        } else {
                            "uuid"
                        }
                    )
                });
            }
        }
    }
    Ok(events)
}

async fn create(bytes: Bytes) -> ApiResult<StatusCode> {
    let body: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the request body is not JSON: {e}")))?;
    let events = validate(&body).map_err(ApiError::bad_request)?;
    for e in events {
        tracing::info!(event = %e, "received external event");
    }
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schema() {
        let ok = json!({"events": [{"event": "network.bind_port",
            "port_id": "11111111-aaaa-bbbb-cccc-555555555555",
            "mac_address": "de:ad:be:ef:00:01", "status": "ACTIVE",
            "device_id": null, "binding:vnic_type": "baremetal"}]});
        assert!(validate(&ok).is_ok());
        assert!(validate(&json!({})).is_err());
        assert!(validate(&json!({"events": []})).is_err());
        let mut bad = ok.clone();
        bad["events"][0]["event"] = json!("network.other");
        assert!(validate(&bad).is_err());
        let mut bad = ok.clone();
        bad["events"][0]["mac_address"] = json!("nope");
        assert!(validate(&bad).is_err());
        let mut bad = ok.clone();
        bad["events"][0]["extra"] = json!(1);
        assert!(validate(&bad).is_err());
        let mut bad = ok;
        bad["events"][0]["status"] = json!(1);
        assert!(validate(&bad).is_err());
    }
}
