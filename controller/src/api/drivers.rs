//! `/v1/drivers`: Ironic's drivers API, served from Rivet's own hardware types
//! ([`rivet_model::interfaces::HARDWARE_TYPES`]: fake-hardware, redfish, ipmi, all of them
//! *dynamic*: Rivet has no classic drivers) and the live controllers (every controller serves
//! every hardware type, so a type's `hosts` are the controllers alive in the store, this one
//! included, as the conductors API and the hash ring count them).
//!
//! - `GET /v1/drivers[?type=classic|dynamic&detail=BOOL&fields=A,B]`: the hardware types.
//! - `GET /v1/drivers/{name}[?fields=A,B]`: one, with its interfaces.
//! - `GET /v1/drivers/{name}/properties`: the `driver_info` keys the driver reads, as
//!   `{key: description}` (from the driver modules, [`rivet_drivers::properties`]).
//!
//! Microversions as in Ironic: `properties` links from 1.14; `type`, the `type` and `detail`
//! parameters (406 before) and the interface fields from 1.30 (storage 1.33, rescue 1.38,
//! bios 1.40, firmware 1.86); `fields` from 1.77 (406 before). RAID logical disk properties
//! live with the node's RAID routes (`node_actions::raid`); driver vendor passthru has no
//! methods (Rivet's drivers offer none).

use super::render::{base_url, links};
use super::{ApiError, ApiResult, ApiVersion, AppState};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::{Json, Router};
use rivet_model::interfaces::{HardwareType, Iface, HARDWARE_TYPES};
use serde_json::{json, Map, Value};
use std::collections::HashMap;

/// The routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/drivers", get(list))
        .route("/v1/drivers/", get(list))
        .route("/v1/drivers/{name}", get(show))
        .route("/v1/drivers/{name}/properties", get(properties))
}

/// `properties` links (Ironic's MINOR_14_LINKS_NODESTATES_DRIVERPROPERTIES).
const LINKS_SINCE: (u32, u32) = (1, 14);
/// `type`, `detail` and the interface fields (MINOR_30_DYNAMIC_DRIVERS).
const DYNAMIC_SINCE: (u32, u32) = (1, 30);
/// The `fields` selector (MINOR_77_DRIVER_FIELDS_SELECTOR).
const FIELDS_SINCE: (u32, u32) = (1, 77);

/// The version an interface's `default_*`/`enabled_*` fields appear at (Ironic's
/// `hide_fields_in_newer_versions`).
fn interface_since(name: &str) -> (u32, u32) {
    match name {
        "storage" => (1, 33),
        "rescue" => (1, 38),
        "bios" => (1, 40),
        "firmware" => (1, 86),
        _ => DYNAMIC_SINCE,
    }
}

/// Inspection implementations per hardware type, default first. Inspection is not part of
/// [`HardwareType`] (a node keeps `inspect_interface` in its own column, see `api::nodes`):
/// `agent` (in-band) and `no-inspect` work on every type; out-of-band inspection only where
/// the driver implements it (`Bmc::inspect`). fake-hardware's default is `fake`, like its
/// other interfaces and Ironic's `FakeHardware` (its `fake` inspect comes first), so an old
/// client that cannot choose an interface (below 1.31) inspects without an agent, as Ironic's
/// tempest `TestNodeStatesV1_6` expects.
pub(super) fn inspect_interfaces(hw: &HardwareType) -> &'static [&'static str] {
    match hw.name {
        "fake-hardware" => &["fake", "agent", "no-inspect"],
        "redfish" => &["agent", "redfish", "no-inspect"],
        _ => &["agent", "no-inspect"],
    }
}

/// Every interface of `hw` as (name, enabled implementations, default first).
fn interfaces(hw: &HardwareType) -> Vec<(&'static str, &'static [&'static str])> {
    let mut all: Vec<_> = Iface::ALL
        .iter()
        .map(|i| (i.as_str(), hw.enabled(*i)))
        .collect();
    all.push(("inspect", inspect_interfaces(hw)));
    all
}

fn version_text(v: (u32, u32)) -> String {
    format!("{}.{}", v.0, v.1)
}

/// Ironic's NotAcceptable for a parameter newer than the request's version.
fn too_old(what: &str, since: (u32, u32), version: (u32, u32)) -> ApiError {
    ApiError::new(
        StatusCode::NOT_ACCEPTABLE,
        format!(
            "Request not acceptable. The minimal required API version should be {} for {what}; \
             this request asked for {} (send X-OpenStack-Ironic-API-Version: {} or later)",
            version_text(since),
            version_text(version),
            version_text(since)
        ),
    )
}

/// The hosts of every hardware type: the live controllers, this one included (it serves
/// this request; `refresh_membership` counts it alive the same way).
async fn hosts(state: &AppState) -> ApiResult<Vec<String>> {
    let mut hosts: Vec<String> = state
        .conductor
        .store
        .list_conductors(state.conductor.dead_after_s())
        .await?
        .into_iter()
        .filter(|c| c.alive)
        .map(|c| c.id)
        .collect();
    hosts.push(state.conductor.id().to_string());
    hosts.sort();
    hosts.dedup();
    Ok(hosts)
}

/// One driver document as Ironic's `convert_with_links` builds it at `version`.
fn render(
    hw: &HardwareType,
    hosts: &[String],
    detail: bool,
    version: (u32, u32),
    base: &str,
) -> Map<String, Value> {
    let name = hw.name;
    let mut d = Map::new();
    d.insert("name".into(), json!(name));
    d.insert("hosts".into(), json!(hosts));
    d.insert("links".into(), links(base, "drivers", name));
    if version >= LINKS_SINCE {
        let properties = links(base, "drivers", &format!("{name}/properties"));
        d.insert("properties".into(), properties);
    }
    if version >= DYNAMIC_SINCE {
        d.insert("type".into(), json!("dynamic"));
        if detail {
            for (iface, enabled) in interfaces(hw) {
                if version < interface_since(iface) {
                    continue;
                }
                d.insert(
                    format!("default_{iface}_interface"),
                    json!(enabled.first().copied()),
                );
                d.insert(format!("enabled_{iface}_interfaces"), json!(enabled));
            }
        }
    }
    d
}

/// The fields Ironic's request schema accepts in `fields` at `version` (every field a
/// detailed document has then).
fn selectable(version: (u32, u32)) -> Vec<String> {
    // Every hardware type has the same fields; any one shows their names.
    HARDWARE_TYPES
        .first()
        .map(|hw| render(hw, &[], true, version, "").keys().cloned().collect())
        .unwrap_or_default()
}

/// `fields=a,b`: checked against what `version` has (400 naming the bad ones, as Ironic).
fn parse_fields(raw: &str, version: (u32, u32)) -> ApiResult<Vec<String>> {
    let valid = selectable(version);
    let (names, bad) = super::listing::field_names(raw, |n| valid.iter().any(|v| v == n));
    if !bad.is_empty() {
        return Err(ApiError::bad_request(format!(
            "Field(s) \"{}\" are not valid at API version {}; valid fields: {}",
            bad.join(", "),
            version_text(version),
            valid.join(", ")
        )));
    }
    Ok(names)
}

/// Keep `fields` (and `links`, which Ironic always keeps).
fn select(doc: Map<String, Value>, fields: &[String]) -> Map<String, Value> {
    doc.into_iter()
        .filter(|(k, _)| k == "links" || fields.iter().any(|f| f == k))
        .collect()
}

fn check_params(params: &HashMap<String, String>, allowed: &[&str]) -> ApiResult<()> {
    super::listing::only_params(params.keys(), allowed)
}

fn unknown_driver(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!(
            "Could not find the following driver(s) or hardware type(s): {name}. Rivet serves: {}",
            HARDWARE_TYPES
                .iter()
                .map(|h| h.name)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
}

fn hardware_type(name: &str) -> ApiResult<&'static HardwareType> {
    HARDWARE_TYPES
        .iter()
        .copied()
        .find(|h| h.name == name)
        .ok_or_else(|| unknown_driver(name))
}

async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiVersion(version): ApiVersion,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    check_params(&params, &["type", "detail", "fields"])?;
    let detail = params
        .get("detail")
        .map(|d| crate::api::listing::bool_value("detail", d))
        .transpose()?;
    let fields = params.get("fields");
    if fields.is_some() && detail == Some(true) {
        return Err(ApiError::bad_request(
            "Can not specify ?detail=True and fields in the same request.",
        ));
    }
    if detail.is_some() && version < DYNAMIC_SINCE {
        return Err(too_old("the detail parameter", DYNAMIC_SINCE, version));
    }
    let kind = params.get("type").map(String::as_str);
    if kind.is_some() && version < DYNAMIC_SINCE {
        return Err(too_old("the type parameter", DYNAMIC_SINCE, version));
    }
    if fields.is_some() && version < FIELDS_SINCE {
        return Err(too_old("the fields parameter", FIELDS_SINCE, version));
    }
    let fields = fields.map(|f| parse_fields(f, version)).transpose()?;
    let types: &[&HardwareType] = match kind {
        None | Some("dynamic") => HARDWARE_TYPES,
        // Rivet has hardware types only (as Ironic since Rocky): no classic drivers.
        Some("classic") => &[],
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "\"type\" filter must be one of \"classic\" or \"dynamic\", if specified (not {other:?})."
            )))
        }
    };
    let hosts = hosts(&state).await?;
    let base = base_url(&headers);
    // With `fields`, the detailed document is the one selected from: every field the request
    // schema accepts can be asked for (Ironic computes the interface fields only with
    // detail, and then refuses the ones it did not compute).
    let docs: Vec<Value> = types
        .iter()
        .map(|hw| {
            let doc = render(
                hw,
                &hosts,
                detail == Some(true) || fields.is_some(),
                version,
                &base,
            );
            Value::Object(match &fields {
                Some(f) => select(doc, f),
                None => doc,
            })
        })
        .collect();
    Ok(Json(json!({ "drivers": docs })))
}

async fn show(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiVersion(version): ApiVersion,
    Path(name): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    check_params(&params, &["fields"])?;
    let fields = params.get("fields");
    if fields.is_some() && version < FIELDS_SINCE {
        return Err(too_old("the fields parameter", FIELDS_SINCE, version));
    }
    let fields = fields.map(|f| parse_fields(f, version)).transpose()?;
    let hw = hardware_type(&name)?;
    let hosts = hosts(&state).await?;
    let doc = render(hw, &hosts, true, version, &base_url(&headers));
    Ok(Json(Value::Object(match &fields {
        Some(f) => select(doc, f),
        None => doc,
    })))
}

async fn properties(Path(name): Path<String>) -> ApiResult<Json<Value>> {
    let hw = hardware_type(&name)?;
    let props = rivet_drivers::properties(hw.name).ok_or_else(|| unknown_driver(&name))?;
    Ok(Json(Value::Object(
        props
            .iter()
            .map(|(k, d)| (k.to_string(), Value::from(*d)))
            .collect(),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hw(name: &str) -> &'static HardwareType {
        hardware_type(name).expect("known hardware type")
    }

    fn interface_fields(d: &Map<String, Value>) -> Vec<String> {
        d.keys()
            .filter(|k| k.ends_with("_interface") || k.ends_with("_interfaces"))
            .cloned()
            .collect()
    }

    /// The fields of Ironic's response schema `_driver_response_body_v86`
    /// (ironic/api/schemas/v1/driver.py), the latest.
    const IRONIC_V86_FIELDS: &[&str] = &["hosts", "links", "name", "properties", "type"];
    const IRONIC_V86_INTERFACES: &[&str] = &[
        "boot",
        "console",
        "deploy",
        "inspect",
        "management",
        "network",
        "power",
        "raid",
        "vendor",
        "storage",
        "rescue",
        "bios",
        "firmware",
    ];

    #[test]
    fn fields_are_ironics_at_the_latest_version() {
        let mut want: Vec<String> = IRONIC_V86_FIELDS.iter().map(|s| s.to_string()).collect();
        for i in IRONIC_V86_INTERFACES {
            want.push(format!("default_{i}_interface"));
            want.push(format!("enabled_{i}_interfaces"));
        }
        want.sort();
        let mut got = selectable((1, 86));
        got.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn interface_fields_appear_at_their_microversions() {
        let count = |v| interface_fields(&render(hw("ipmi"), &[], true, v, "")).len();
        assert_eq!(count((1, 29)), 0);
        assert_eq!(count((1, 30)), 18);
        assert_eq!(count((1, 32)), 18);
        assert_eq!(count((1, 33)), 20);
        assert_eq!(count((1, 37)), 20);
        assert_eq!(count((1, 38)), 22);
        assert_eq!(count((1, 39)), 22);
        assert_eq!(count((1, 40)), 24);
        assert_eq!(count((1, 85)), 24);
        assert_eq!(count((1, 86)), 26);
        let at = |v| render(hw("ipmi"), &[], true, v, "");
        assert!(!at((1, 85)).contains_key("default_firmware_interface"));
        assert!(at((1, 86)).contains_key("enabled_firmware_interfaces"));
        assert!(!at((1, 39)).contains_key("default_bios_interface"));
        assert!(!at((1, 37)).contains_key("default_rescue_interface"));
        assert!(!at((1, 32)).contains_key("default_storage_interface"));
        // Not detailed: no interface fields at any version.
        assert!(interface_fields(&render(hw("ipmi"), &[], false, (1, 86), "")).is_empty());
    }

    #[test]
    fn type_and_property_links_are_gated() {
        let d = render(hw("redfish"), &[], true, (1, 13), "http://h");
        assert!(!d.contains_key("properties") && !d.contains_key("type"));
        let d = render(hw("redfish"), &[], true, (1, 14), "http://h");
        assert_eq!(
            d["properties"][0]["href"],
            "http://h/v1/drivers/redfish/properties"
        );
        assert!(!d.contains_key("type"));
        let d = render(hw("redfish"), &[], false, (1, 30), "http://h");
        assert_eq!(d["type"], "dynamic");
    }

    #[test]
    fn interfaces_are_the_hardware_types() {
        let d = render(hw("redfish"), &["c1".into()], true, (1, 86), "");
        assert_eq!(d["hosts"], json!(["c1"]));
        assert_eq!(d["default_boot_interface"], "ipxe");
        assert_eq!(
            d["enabled_boot_interfaces"],
            json!(["ipxe", "pxe", "redfish-virtual-media"])
        );
        assert_eq!(d["default_firmware_interface"], "redfish");
        assert_eq!(d["default_inspect_interface"], "agent");
        assert_eq!(
            d["enabled_inspect_interfaces"],
            json!(["agent", "redfish", "no-inspect"])
        );
        let d = render(hw("fake-hardware"), &[], true, (1, 86), "");
        assert_eq!(d["default_inspect_interface"], "fake");
        let d = render(hw("ipmi"), &[], true, (1, 86), "");
        assert_eq!(d["default_power_interface"], "ipmitool");
        assert_eq!(
            d["enabled_inspect_interfaces"],
            json!(["agent", "no-inspect"])
        );
        // Every default is the first enabled value, and every hardware type has properties.
        for h in HARDWARE_TYPES {
            let d = render(h, &[], true, (1, 86), "");
            for (i, _) in interfaces(h) {
                assert_eq!(
                    d[&format!("default_{i}_interface")],
                    d[&format!("enabled_{i}_interfaces")][0],
                    "{} {i}",
                    h.name
                );
            }
            assert!(rivet_drivers::properties(h.name).is_some(), "{}", h.name);
        }
    }

    #[test]
    fn fields_are_checked_against_the_version() {
        assert_eq!(
            parse_fields("name, hosts", (1, 77)).expect("valid"),
            ["name", "hosts"]
        );
        let e = parse_fields("name,invalid", (1, 77)).expect_err("invalid");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("\"invalid\""), "{}", e.message);
        assert!(parse_fields("default_firmware_interface", (1, 85)).is_err());
        assert!(parse_fields("default_firmware_interface", (1, 86)).is_ok());
        let doc = render(hw("ipmi"), &[], true, (1, 86), "");
        let kept = select(doc, &["name".to_string()]);
        let mut keys: Vec<&String> = kept.keys().collect();
        keys.sort();
        assert_eq!(keys, ["links", "name"]);
    }

    #[test]
    fn booleans_as_ironic_reads_them() {
        for t in ["True", "1", "yes", "on", "t", "Y"] {
            assert!(
                crate::api::listing::bool_value("detail", t).expect("bool"),
                "{t}"
            );
        }
        for f in ["False", "0", "no", "off", "f", "N"] {
            assert!(
                !crate::api::listing::bool_value("detail", f).expect("bool"),
                "{f}"
            );
        }
        assert!(crate::api::listing::bool_value("detail", "maybe").is_err());
    }
}
