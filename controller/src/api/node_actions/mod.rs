//! Node sub-resources Ironic's clients call in everyday flows, with the shapes, codes and
//! microversion gates of Ironic's `node.py` and its unit tests, one module each:
//!
//! - `traits` (1.37): `GET|PUT|DELETE /v1/nodes/{node}/traits`, `PUT|DELETE …/traits/{trait}`;
//!   standard os-traits names or `CUSTOM_[A-Z0-9_]+`, at most 255 characters, 50 per node;
//! - `validate`: `GET /v1/nodes/{node}/validate`, `{"result": bool, "reason": …}` per interface;
//! - `boot_device`: `GET|PUT …/management/boot_device`, `GET …/boot_device/supported`;
//! - `vmedia`: `POST|DELETE /v1/nodes/{node}/vmedia` (1.89), `GET` (1.93).
//!
//! Whatever changes the node or talks to its BMC is refused with 409 while another operation
//! holds the node (its reservation; for BMC calls also a power action in flight), as Ironic
//! refuses a node locked by another task. Reads Ironic serves under a shared lock (traits,
//! validate, supported devices, the vmedia list) are not refused. A record that does not
//! decode is never acted on (409, as for every write of it).
//!
//! The microversion of each route (404, or Ironic's 406/405 for traits and RAID) is its row's,
//! checked by `api::gates` before a handler runs. This module holds their routes and what they
//! share: the refusals and Ironic's wording of schema errors.

mod bios;
mod boot_device;
mod children;
mod console;
mod management;
pub(super) mod node_fields;
mod passthru;
mod raid;
pub(super) mod traits;
mod validate;
mod vifs;
mod vmedia;

use super::{ApiError, AppState};
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::routing::{any, delete, get, put};
use axum::Router;
use rivet_conductor::ConductorError;
use rivet_drivers::{Bmc, DriverError};
use rivet_model::node::Node;
use rivet_protocol::limits::{parse_strict, Limits};
use rivet_store::NodeExt;
use serde_json::Value;
use std::sync::Arc;

pub fn routes() -> Router<AppState> {
    Router::new()
        .merge(resource_routes())
        .route(
            "/v1/nodes/{ident}/traits",
            get(traits::traits_list)
                .put(traits::traits_set)
                .delete(traits::traits_clear),
        )
        .route(
            "/v1/nodes/{ident}/traits/{trait}",
            put(traits::trait_add).delete(traits::trait_remove),
        )
        .route("/v1/nodes/{ident}/validate", get(validate::validate))
        .route(
            "/v1/nodes/{ident}/management/boot_device",
            get(boot_device::boot_device_get).put(boot_device::boot_device_set),
        )
        .route(
            "/v1/nodes/{ident}/management/boot_device/supported",
            get(boot_device::boot_device_supported),
        )
        .route(
            "/v1/nodes/{ident}/vmedia",
            get(vmedia::vmedia_get)
                .post(vmedia::vmedia_attach)
                .delete(vmedia::vmedia_detach),
        )
        .route(
            "/v1/nodes/{ident}/vmedia/{device_type}",
            delete(vmedia::vmedia_detach_one),
        )
        .route(
            "/v1/nodes/{ident}/vifs",
            get(vifs::vif_list).post(vifs::vif_attach),
        )
        .route("/v1/nodes/{ident}/vifs/{vif}", delete(vifs::vif_detach))
}

/// BIOS, firmware, children, indicators, NMI, boot mode, RAID, console and vendor passthru.
fn resource_routes() -> Router<AppState> {
    Router::new()
        .route("/v1/nodes/{ident}/bios", get(bios::bios_list))
        .route("/v1/nodes/{ident}/bios/{setting}", get(bios::bios_show))
        .route("/v1/nodes/{ident}/firmware", get(bios::firmware_list))
        .route("/v1/nodes/{ident}/children", get(children::children))
        .route(
            "/v1/nodes/{ident}/management/indicators",
            get(management::indicators_list),
        )
        .route(
            "/v1/nodes/{ident}/management/indicators/{indicator}",
            get(management::indicator_get).put(management::indicator_set),
        )
        .route(
            "/v1/nodes/{ident}/management/inject_nmi",
            put(management::inject_nmi),
        )
        .route(
            "/v1/nodes/{ident}/states/boot_mode",
            put(management::boot_mode_set),
        )
        .route(
            "/v1/nodes/{ident}/states/secure_boot",
            put(management::secure_boot_set),
        )
        .route("/v1/nodes/{ident}/states/raid", put(raid::raid_set))
        .route(
            "/v1/drivers/{name}/raid/logical_disk_properties",
            get(raid::logical_disk_properties),
        )
        .route(
            "/v1/nodes/{ident}/states/console",
            get(console::console_get).put(console::console_set),
        )
        // Ironic's router answers the console under /v1/nodes/states/ too.
        .route(
            "/v1/nodes/states/console/{ident}",
            get(console::console_get_by_states_path),
        )
        .route(
            "/v1/nodes/{ident}/vendor_passthru/methods",
            get(passthru::node_methods),
        )
        .route(
            "/v1/nodes/{ident}/vendor_passthru",
            any(passthru::node_call),
        )
        .route(
            "/v1/drivers/{name}/vendor_passthru/methods",
            get(passthru::driver_methods),
        )
        .route(
            "/v1/drivers/{name}/vendor_passthru",
            any(passthru::driver_call),
        )
        .route(
            "/v1/nodes/{ident}/vendor_passthru/{method}",
            any(passthru::node_call_named),
        )
        .route(
            "/v1/drivers/{name}/vendor_passthru/{method}",
            any(passthru::driver_call_named),
        )
}

// ------------------------------------------------------------------ refusals

/// 409 while another operation holds the node: its reservation (a provision operation, the
/// conductor's lease) and, with `power_too`, a power action still running (Ironic's power
/// action holds the node's lock as long).
fn refuse_locked(node: &Node, power_too: bool) -> Result<(), ApiError> {
    if let Some(by) = &node.reservation {
        return Err(ConductorError::Locked {
            node: node.ident().to_string(),
            by: by.clone(),
            state: node.provision_state,
        }
        .into());
    }
    if let (true, Some(t)) = (power_too, node.target_power_state) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "node {} has a power action in progress (target \"{t}\"); retry when it ends",
                node.ident()
            ),
        ));
    }
    Ok(())
}

/// A driver failure as Ironic answers it: an operation the driver lacks or bad driver_info
/// is the caller's to fix (400); a BMC that fails is a server-side failure (500).
fn driver_error(node: &Node, e: DriverError) -> ApiError {
    match e {
        DriverError::Unsupported { operation, .. } => ApiError::bad_request(format!(
            "Driver {} does not support {operation} (disabled or not implemented).",
            node.driver
        )),
        e @ (DriverError::BadDriverInfo { .. }
        | DriverError::BadStepArgs { .. }
        | DriverError::NodeSettings(_)) => {
            ApiError::bad_request(format!("node {}: {e}", node.ident()))
        }
        e @ DriverError::Bmc(_) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("node {}: {e}", node.ident()),
        ),
    }
}

/// The node to act on through its BMC: readable, not held by another operation, its driver
/// and driver_info usable (Ironic validates the management interface first).
async fn node_for_bmc(
    state: &AppState,
    ident: &str,
    exclusive: bool,
) -> Result<(Node, Arc<dyn Bmc>), ApiError> {
    let node = state.conductor.store.get_node(ident).await?;
    node.writable()?;
    if exclusive {
        refuse_locked(&node, true)?;
    }
    let bmc = state.conductor.bmc(&node)?;
    bmc.validate(&node.driver_info)
        .map_err(|e| driver_error(&node, e))?;
    Ok((node, bmc))
}

/// A request body as JSON under the admin limits; `None` when empty or `null`.
fn json_body(body: &Bytes) -> Result<Option<Value>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let v: Value =
        parse_strict(body, &Limits::ADMIN).map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok(if v.is_null() { None } else { Some(v) })
}

/// A body's arguments beyond `allowed` are Ironic's 400 (its `args.validate` of an
/// action's keyword arguments): "Unexpected arguments: a, b".
fn only_args(body: &Bytes, allowed: &[&str]) -> Result<(), ApiError> {
    if let Some(Value::Object(m)) = json_body(body)? {
        let mut extra: Vec<&str> = m
            .keys()
            .map(String::as_str)
            .filter(|k| !allowed.contains(k))
            .collect();
        if !extra.is_empty() {
            extra.sort_unstable();
            return Err(ApiError::bad_request(format!(
                "Unexpected arguments: {}",
                extra.join(", ")
            )));
        }
    }
    Ok(())
}

// ------------------------------------------------------------------ Ironic's schema errors

/// A string as Python's `repr` writes it (Ironic's schema errors quote values that way).
fn py_str(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

/// A JSON value as Python's `repr` of its decoded form.
fn py_repr(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => py_str(s),
        Value::Array(a) => format!("[{}]", a.iter().map(py_repr).collect::<Vec<_>>().join(", ")),
        Value::Object(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, v)| format!("{}: {}", py_str(k), py_repr(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn schema_error(name: &str, message: String) -> ApiError {
    ApiError::bad_request(format!("Schema error for {name}: {message}"))
}

/// jsonschema's message for properties a schema does not allow.
fn extras_message(extras: &[&String]) -> String {
    let mut names: Vec<String> = extras.iter().map(|k| py_str(k)).collect();
    names.sort();
    let verb = if names.len() == 1 { "was" } else { "were" };
    format!(
        "Additional properties are not allowed ({} {verb} unexpected)",
        names.join(", ")
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn python_reprs() {
        assert_eq!(py_str("it's"), "\"it's\"");
        assert_eq!(py_str("a'b\"c"), "'a\\'b\"c'");
        assert_eq!(py_str("x\ny"), "'x\\ny'");
        assert_eq!(
            py_repr(&json!({"a": [true, null, 1]})),
            "{'a': [True, None, 1]}"
        );
        let a = "a".to_string();
        let b = "b".to_string();
        assert_eq!(
            extras_message(&[&b, &a]),
            "Additional properties are not allowed ('a', 'b' were unexpected)"
        );
    }
}
