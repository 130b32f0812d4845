//! The node's BIOS settings (API 1.40; registry fields, `detail` and `fields` 1.74) and
//! firmware components (1.86; vendor, model and serial number 1.114): read-only caches of
//! what the BMC reported when the node was last managed, inspected or cleaned
//! ([`rivet_conductor::bmc_caches::refresh_caches`]). Drivers with nothing to read
//! (fake-hardware, ipmi) leave them empty.
//!
//! `GET /v1/nodes/{node}/bios`, `GET …/bios/{name}`, `GET /v1/nodes/{node}/firmware`.

use crate::api::render::{base_url, links, time};
use crate::api::{ApiError, ApiResult, ApiVersion, AppState};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use chrono::{DateTime, Utc};
use rivet_model::microversions as mv;
use rivet_store::{BiosSetting, FirmwareComponent};
use serde_json::{json, Map, Value};
use std::collections::HashMap;

/// `MINOR_74_BIOS_REGISTRY`: registry fields, `detail` and `fields`.
const BIOS_REGISTRY_VERSION: (u32, u32) = (1, 74);
/// `MINOR_114_FIRMWARE_IDENTITY`.
const FIRMWARE_IDENTITY_VERSION: (u32, u32) = (1, 114);

/// Ironic's registry fields of a BIOS setting.
const REGISTRY_FIELDS: &[&str] = &[
    "attribute_type",
    "allowable_values",
    "lower_bound",
    "max_length",
    "min_length",
    "read_only",
    "reset_required",
    "unique",
    "upper_bound",
];

/// `fields` and `detail` as Ironic's `get_request_return_fields` reads them: unknown
/// parameters, both at once, or either below `since` are 400s. `None`: the defaults.
fn return_fields(
    params: &HashMap<String, String>,
    version: (u32, u32),
    since: (u32, u32),
    valid: &[&str],
) -> Result<(Option<Vec<String>>, bool), ApiError> {
    crate::api::listing::only_params(params.keys(), &["fields", "detail"])?;
    let detail = match params.get("detail") {
        Some(d) if version < since => {
            return Err(ApiError::bad_request(format!(
                "Invalid query parameter ?detail={d} received."
            )))
        }
        Some(d) => crate::api::listing::bool_value("detail", d)?,
        None => false,
    };
    let fields = match params.get("fields") {
        Some(f) if version < since => {
            return Err(ApiError::bad_request(format!(
                "Invalid query parameter ?fields={f} received."
            )))
        }
        Some(f) => {
            let names: Vec<String> = f
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
            if let Some(bad) = names.iter().find(|n| !valid.contains(&n.as_str())) {
                return Err(ApiError::bad_request(format!(
                    "Field(s) \"{bad}\" are not valid; valid fields: {}",
                    valid.join(", ")
                )));
            }
            Some(names)
        }
        None => None,
    };
    if detail && fields.is_some() {
        return Err(ApiError::bad_request(
            "Can not specify ?detail=True and fields in the same request.",
        ));
    }
    Ok((fields, detail))
}

/// A BIOS setting as Ironic's `object_to_dict` builds it: the times, the fields, the links.
fn bios_doc(s: &BiosSetting, node: &str, base: &str, fields: &[&str]) -> Value {
    let mut m = timestamped_doc(s.created_at, s.updated_at, fields, |f| match f {
        "name" => json!(s.name),
        "value" => json!(s.value),
        other => s.registry.get(other).cloned().unwrap_or(Value::Null),
    });
    let path = format!("{node}/bios/{}", s.name);
    m.insert("links".into(), links(base, "nodes", &path));
    Value::Object(m)
}

/// A node sub-record's document as Ironic's `object_to_dict` builds it: its times and the
/// `fields` asked for, each as `value` gives it.
fn timestamped_doc(
    created_at: DateTime<Utc>,
    updated_at: Option<DateTime<Utc>>,
    fields: &[&str],
    value: impl Fn(&str) -> Value,
) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("created_at".into(), time(&Some(created_at)));
    m.insert("updated_at".into(), time(&updated_at));
    for f in fields {
        m.insert((*f).to_string(), value(f));
    }
    m
}

fn registry_fields() -> Vec<&'static str> {
    let mut all = vec!["name", "value"];
    all.extend_from_slice(REGISTRY_FIELDS);
    all
}

/// `GET /v1/nodes/{node}/bios`: `{"bios": [...]}`.
pub(super) async fn bios_list(
    State(state): State<AppState>,
    ApiVersion(version): ApiVersion,
    headers: HeaderMap,
    Path(ident): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    let all = registry_fields();
    let (fields, detail) = return_fields(&params, version, BIOS_REGISTRY_VERSION, &all)?;
    let node = state.conductor.store.get_node(&ident).await?;
    let settings = state.conductor.store.list_bios_settings(&node.uuid).await?;
    let owned: Vec<&str>;
    let shown: &[&str] = match (&fields, detail) {
        (_, true) => &all,
        (Some(f), false) => {
            owned = f.iter().map(String::as_str).collect();
            &owned
        }
        (None, false) => &["name", "value"],
    };
    let base = base_url(&headers);
    let docs: Vec<Value> = settings
        .iter()
        .map(|s| bios_doc(s, &ident, &base, shown))
        .collect();
    Ok(Json(json!({ "bios": docs })))
}

/// `GET /v1/nodes/{node}/bios/{name}`: `{name: {...}}`, registry fields from 1.74.
pub(super) async fn bios_show(
    State(state): State<AppState>,
    ApiVersion(version): ApiVersion,
    headers: HeaderMap,
    Path((ident, name)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let node = state.conductor.store.get_node(&ident).await?;
    let settings = state.conductor.store.list_bios_settings(&node.uuid).await?;
    let Some(s) = settings.iter().find(|s| s.name == name) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "Node {} doesn't have a BIOS setting '{name}'. Its settings are read from the BMC when the node is managed, inspected or cleaned.",
                node.uuid
            ),
        ));
    };
    let all = registry_fields();
    let shown: &[&str] = if version >= BIOS_REGISTRY_VERSION {
        &all
    } else {
        &["name", "value"]
    };
    let doc = bios_doc(s, &node.uuid, &base_url(&headers), shown);
    let mut out = Map::new();
    out.insert(name, doc);
    Ok(Json(Value::Object(out)))
}

const FIRMWARE_FIELDS: &[&str] = &[
    "component",
    "initial_version",
    "current_version",
    "last_version_flashed",
];
const FIRMWARE_IDENTITY: &[&str] = &["vendor", "model", "serial_number"];

fn firmware_doc(c: &FirmwareComponent, fields: &[&str]) -> Value {
    Value::Object(timestamped_doc(
        c.created_at,
        c.updated_at,
        fields,
        |f| match f {
            "component" => json!(c.component),
            "initial_version" => json!(c.initial_version),
            "current_version" => json!(c.current_version),
            "last_version_flashed" => json!(c.last_version_flashed),
            "vendor" => json!(c.vendor),
            "model" => json!(c.model),
            "serial_number" => json!(c.serial_number),
            _ => Value::Null,
        },
    ))
}

/// `GET /v1/nodes/{node}/firmware`: `{"firmware": [...]}`.
pub(super) async fn firmware_list(
    State(state): State<AppState>,
    ApiVersion(version): ApiVersion,
    Path(ident): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    let identity = version >= FIRMWARE_IDENTITY_VERSION;
    let mut valid: Vec<&str> = FIRMWARE_FIELDS.to_vec();
    valid.extend_from_slice(FIRMWARE_IDENTITY);
    if !identity {
        if let Some(f) = params.get("fields") {
            let mut bad: Vec<&str> = f
                .split(',')
                .map(str::trim)
                .filter(|n| FIRMWARE_IDENTITY.contains(n))
                .collect();
            if !bad.is_empty() {
                bad.sort();
                return Err(ApiError::bad_request(format!(
                    "Fields {} are not allowed in this API version. They require at least API version 1.{}.",
                    bad.join(", "),
                    FIRMWARE_IDENTITY_VERSION.1
                )));
            }
        }
    }
    let (fields, _detail) = return_fields(&params, version, mv::FIRMWARE, &valid)?;
    let defaults: Vec<&str> = if identity {
        valid.clone()
    } else {
        FIRMWARE_FIELDS.to_vec()
    };
    let shown: Vec<&str> = match &fields {
        Some(f) => f.iter().map(String::as_str).collect(),
        None => defaults,
    };
    let node = state.conductor.store.get_node(&ident).await?;
    let comps = state
        .conductor
        .store
        .list_firmware_components(&node.uuid)
        .await?;
    let docs: Vec<Value> = comps.iter().map(|c| firmware_doc(c, &shown)).collect();
    Ok(Json(json!({ "firmware": docs })))
}
