//! Virtual media through the node's BMC: `POST /v1/nodes/{node}/vmedia` attaches an image and
//! `DELETE /v1/nodes/{node}/vmedia[/{device_type}]` detaches it (1.89), `GET` lists the devices
//! (1.93); below those versions the paths are 404, as in Ironic. Bodies are checked as Ironic's
//! `VMEDIA_ATTACH_VALIDATOR` checks them; Rivet's drivers attach a cdrom from http(s) only.

use super::{driver_error, extras_message, json_body, node_for_bmc, py_repr, py_str, schema_error};
use crate::api::{ApiError, ApiResult, AppState};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use rivet_model::node::Node;
use serde_json::{json, Value};

/// Ironic's `boot_devices.VMEDIA_DEVICES`.
const VMEDIA_DEVICES: &[&str] = &["disk", "cdrom", "floppy"];
/// Ironic's `image_download_source` values.
const DOWNLOAD_SOURCES: &[&str] = &["http", "local", "swift"];
/// Ironic's `VMEDIA_SUPPORTED_URL_SCHEMES`.
const VMEDIA_URL_SCHEMES: &[&str] = &["http", "https", "nfs", "cifs", "smb"];

/// Ironic refuses virtual media on a node in maintenance for a power failure (503).
fn refuse_power_failure(node: &Node, action: &str) -> Result<(), ApiError> {
    if node.maintenance && node.fault.as_deref() == Some("power failure") {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "Unable to {action} virtual media for node {} due to power failure state",
                node.uuid
            ),
        ));
    }
    Ok(())
}

/// The scheme of a URL as Python's `urlparse` finds it (lower case; empty when none).
fn url_scheme(url: &str) -> String {
    match url.find(':') {
        Some(i) if i > 0 => {
            let head = &url[..i];
            let ok = head.as_bytes()[0].is_ascii_alphabetic()
                && head
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b));
            if ok {
                head.to_ascii_lowercase()
            } else {
                String::new()
            }
        }
        _ => String::new(),
    }
}

/// An attach request: (device_type, image_url, image_download_source).
struct Attach {
    device_type: String,
    image_url: String,
    download_source: String,
}

/// The body of `POST …/vmedia` checked as Ironic's `VMEDIA_ATTACH_VALIDATOR` checks it.
fn attach_body(body: &Bytes) -> Result<Attach, ApiError> {
    let v = json_body(body)?.unwrap_or(Value::Null);
    let Value::Object(m) = v else {
        return Err(schema_error(
            "vmedia",
            format!("{} is not of type 'object'", py_repr(&v)),
        ));
    };
    let known = ["device_type", "image_url", "image_download_source"];
    let extras: Vec<&String> = m.keys().filter(|k| !known.contains(&k.as_str())).collect();
    if !extras.is_empty() {
        return Err(schema_error("vmedia", extras_message(&extras)));
    }
    for required in ["device_type", "image_url"] {
        if !m.contains_key(required) {
            return Err(schema_error(
                "vmedia",
                format!("{} is a required property", py_str(required)),
            ));
        }
    }
    let string = |k: &str, allowed: Option<&[&str]>| -> Result<Option<String>, ApiError> {
        let Some(v) = m.get(k) else { return Ok(None) };
        let Some(s) = v.as_str() else {
            return Err(schema_error(
                "vmedia",
                format!("{} is not of type 'string'", py_repr(v)),
            ));
        };
        if let Some(allowed) = allowed.filter(|a| !a.contains(&s)) {
            let list: Vec<String> = allowed.iter().map(|a| py_str(a)).collect();
            return Err(schema_error(
                "vmedia",
                format!("{} is not one of [{}]", py_str(s), list.join(", ")),
            ));
        }
        Ok(Some(s.to_string()))
    };
    let device_type = string("device_type", Some(VMEDIA_DEVICES))?.unwrap_or_default();
    let image_url = string("image_url", None)?.unwrap_or_default();
    let download_source =
        string("image_download_source", Some(DOWNLOAD_SOURCES))?.unwrap_or_else(|| "local".into());
    let scheme = url_scheme(&image_url);
    if !VMEDIA_URL_SCHEMES.contains(&scheme.as_str()) {
        return Err(ApiError::bad_request(format!(
            "Unsupported or missing URL scheme: {scheme}"
        )));
    }
    Ok(Attach {
        device_type,
        image_url,
        download_source,
    })
}

/// `POST /v1/nodes/{node}/vmedia` (1.89): insert an image (204). Rivet inserts at once and
/// answers with the BMC's verdict, where Ironic answers 204 first and records a failure in
/// `last_error`.
pub(super) async fn vmedia_attach(
    State(state): State<AppState>,
    Path(ident): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let req = attach_body(&body)?;
    let (node, bmc) = node_for_bmc(&state, &ident, true).await?;
    refuse_power_failure(&node, "attach")?;
    if req.device_type != "cdrom" {
        return Err(ApiError::bad_request(format!(
            "device_type {:?} is not supported: Rivet's drivers attach virtual media as a cdrom only",
            req.device_type
        )));
    }
    if req.download_source == "swift" {
        return Err(ApiError::bad_request(
            "image_download_source \"swift\" is not supported: Rivet has no object store; use http (the BMC downloads image_url itself)",
        ));
    }
    if !matches!(url_scheme(&req.image_url).as_str(), "http" | "https") {
        return Err(ApiError::bad_request(format!(
            "image_url {:?}: Rivet's drivers hand the BMC http and https URLs only",
            req.image_url
        )));
    }
    bmc.insert_virtual_media(&node.uuid, &node.driver_info, &req.image_url)
        .await
        .map_err(|e| driver_error(&node, e))?;
    tracing::info!(node = %node.uuid, device_type = %req.device_type, "virtual media attached through the API");
    Ok(StatusCode::NO_CONTENT)
}

/// `?device_types=cdrom,disk` (comma separated and/or repeated), checked against Ironic's
/// list.
fn device_types(query: &[(String, String)]) -> Result<Option<Vec<String>>, ApiError> {
    crate::api::listing::only_params(query.iter().map(|(k, _)| k), &["device_types"])?;
    let types: Vec<String> = query
        .iter()
        .flat_map(|(_, v)| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect();
    check_device_types(types)
}

fn check_device_types(types: Vec<String>) -> Result<Option<Vec<String>>, ApiError> {
    if types.is_empty() {
        return Ok(None);
    }
    let invalid: Vec<&str> = types
        .iter()
        .map(String::as_str)
        .filter(|t| !VMEDIA_DEVICES.contains(t))
        .collect();
    if !invalid.is_empty() {
        return Err(ApiError::bad_request(format!(
            "Invalid device type(s) {} (valid are {})",
            invalid.join(", "),
            VMEDIA_DEVICES.join(", ")
        )));
    }
    Ok(Some(types))
}

async fn detach(
    state: &AppState,
    ident: &str,
    types: Result<Option<Vec<String>>, ApiError>,
) -> ApiResult<StatusCode> {
    let types = types?;
    let (node, bmc) = node_for_bmc(state, ident, true).await?;
    refuse_power_failure(&node, "detach")?;
    if let Some(t) = types.as_ref().filter(|t| !t.iter().any(|t| t == "cdrom")) {
        return Err(ApiError::bad_request(format!(
            "device_types {} cannot be detached: Rivet's drivers attach and detach virtual media as a cdrom only",
            t.join(", ")
        )));
    }
    bmc.eject_virtual_media(&node.uuid, &node.driver_info)
        .await
        .map_err(|e| driver_error(&node, e))?;
    tracing::info!(node = %node.uuid, "virtual media detached through the API");
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /v1/nodes/{node}/vmedia[?device_types=…]` (1.89): eject (204).
pub(super) async fn vmedia_detach(
    State(state): State<AppState>,
    Path(ident): Path<String>,
    Query(query): Query<Vec<(String, String)>>,
) -> ApiResult<StatusCode> {
    detach(&state, &ident, device_types(&query)).await
}

/// `DELETE /v1/nodes/{node}/vmedia/{device_type}` (1.89).
pub(super) async fn vmedia_detach_one(
    State(state): State<AppState>,
    Path((ident, device_type)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    detach(&state, &ident, check_device_types(vec![device_type])).await
}

/// `GET /v1/nodes/{node}/vmedia` (1.93): the BMC's virtual media devices, a bare list as
/// Ironic answers it.
pub(super) async fn vmedia_get(
    State(state): State<AppState>,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
    let (node, bmc) = node_for_bmc(&state, &ident, false).await?;
    let media = bmc
        .get_virtual_media(&node.uuid, &node.driver_info)
        .await
        .map_err(|e| driver_error(&node, e))?;
    Ok(Json(json!(media)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn attach_bodies() {
        let a = |s: &str| attach_body(&Bytes::from(s.to_string()));
        let ok = a(r#"{"device_type": "cdrom", "image_url": "HTTP://x/y.iso"}"#).unwrap();
        assert_eq!(
            (ok.device_type.as_str(), ok.download_source.as_str()),
            ("cdrom", "local")
        );
        let msg = |s: &str| a(s).err().map(|e| e.message).unwrap_or_default();
        assert_eq!(
            msg(r#"{"image_url": "http://image"}"#),
            "Schema error for vmedia: 'device_type' is a required property"
        );
        assert_eq!(
            msg(r#"{"device_type": "cat", "image_url": "http://image"}"#),
            "Schema error for vmedia: 'cat' is not one of ['disk', 'cdrom', 'floppy']"
        );
        assert_eq!(
            msg(r#"{"device_type": "cdrom", "image_url": "abcd"}"#),
            "Unsupported or missing URL scheme: "
        );
        assert_eq!(
            msg(r#"{"device_type": "cdrom", "image_url": "ftp://h/x"}"#),
            "Unsupported or missing URL scheme: ftp"
        );
        assert!(msg(
            r#"{"device_type": "cdrom", "image_url": "http://h", "image_download_source": "ftp"}"#
        )
        .contains("'ftp' is not one of ['http', 'local', 'swift']"));
        assert!(
            msg(r#"{"device_type": "cdrom", "image_url": "http://h", "x": 1}"#)
                .contains("('x' was unexpected)")
        );
    }

    #[test]
    fn url_schemes_as_python_reads_them() {
        assert_eq!(url_scheme("https://h/x"), "https");
        assert_eq!(url_scheme("NFS://h/x"), "nfs");
        assert_eq!(url_scheme("abcd"), "");
        assert_eq!(url_scheme("1http://h"), "");
        assert_eq!(url_scheme(":x"), "");
    }

    #[test]
    fn detach_device_types() {
        let q = |v: &[(&str, &str)]| {
            device_types(
                &v.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<Vec<_>>(),
            )
        };
        assert_eq!(q(&[]).unwrap(), None);
        assert_eq!(
            q(&[("device_types", "cdrom,disk"), ("device_types", "floppy")]).unwrap(),
            Some(vec!["cdrom".into(), "disk".into(), "floppy".into()])
        );
        assert_eq!(
            q(&[("device_types", "cdrom,cat")]).unwrap_err().message,
            "Invalid device type(s) cat (valid are disk, cdrom, floppy)"
        );
        assert!(q(&[("types", "cdrom")]).is_err());
    }
}
