//! Query parameters that every listing reads the same way (nodes, ports, portgroups, chassis,
//! allocations, templates, volume, history, the audit trail…), and the one rule for a full
//! page's `next` link.

use super::version::not_acceptable;
use super::ApiError;
use rivet_store::SortDir;

use std::collections::HashMap;

/// The page size asked for by `limit`: at most `max`; absent or 0 means `max` (as Ironic).
pub fn page_limit(params: &HashMap<String, String>, max: usize) -> Result<usize, ApiError> {
    let Some(l) = params.get("limit") else {
        return Ok(max);
    };
    let l: usize = l
        .parse()
        .map_err(|_| ApiError::bad_request(format!("limit={l:?} is not a non-negative integer")))?;
    Ok(if l == 0 { max } else { l.min(max) })
}

/// `asc` or `desc`; None for anything else (each listing says what its directions mean).
pub fn sort_dir(value: &str) -> Option<SortDir> {
    match value {
        "asc" => Some(SortDir::Asc),
        "desc" => Some(SortDir::Desc),
        _ => None,
    }
}

/// The query a single-resource GET takes (`?fields=a,b`), for nodes and chassis alike.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShowParams {
    /// Comma-separated fields to keep.
    pub fields: Option<String>,
}

/// The query of a single-resource GET that Ironic lets take `detail` too, and ignores it
/// (the volume API).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShowParamsDetail {
    /// Comma-separated fields to keep.
    pub fields: Option<String>,
    #[allow(dead_code)]
    detail: Option<String>,
}

/// A boolean query value as Ironic reads one (oslo's strict `bool_from_string`): `1 t true
/// on y yes` and `0 f false off n no`, any case; anything else is a 400 naming `name`.
pub fn bool_value(name: &str, v: &str) -> Result<bool, ApiError> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "t" | "true" | "on" | "y" | "yes" => Ok(true),
        "0" | "f" | "false" | "off" | "n" | "no" => Ok(false),
        _ => Err(ApiError::bad_request(format!(
            "Invalid value for {name}: {v:?} is not a boolean (true or false)"
        ))),
    }
}

/// The boolean query parameter `name`, when given.
pub fn bool_param(params: &HashMap<String, String>, name: &str) -> Result<Option<bool>, ApiError> {
    params.get(name).map(|v| bool_value(name, v)).transpose()
}

/// `sort_dir`, when given, with Ironic's message for anything but `asc`/`desc`.
pub fn sort_dir_param(params: &HashMap<String, String>) -> Result<Option<SortDir>, ApiError> {
    params
        .get("sort_dir")
        .map(|d| {
            sort_dir(d).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "Invalid sort direction: {d}. Acceptable values are 'asc' or 'desc'"
                ))
            })
        })
        .transpose()
}

/// Whether a listing shows whole documents: its `/detail` path, or `?detail=true` (which
/// Ironic refuses together with `fields`).
pub fn detail_param(params: &HashMap<String, String>, from_detail: bool) -> Result<bool, ApiError> {
    let asked = bool_param(params, "detail")?.unwrap_or(false);
    if asked && !from_detail && params.contains_key("fields") {
        return Err(ApiError::bad_request(
            "Can not specify ?detail=True and fields in the same request.",
        ));
    }
    Ok(from_detail || asked)
}

/// A comma-separated list parameter.
pub fn list_param(params: &HashMap<String, String>, key: &str) -> Vec<String> {
    params
        .get(key)
        .map(|v| {
            v.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// `fields` (1.8, 406 below) and `detail` (1.43, 400 below) as Ironic gates them.
pub fn check_query_versions(
    params: &HashMap<String, String>,
    version: (u32, u32),
) -> Result<(), ApiError> {
    if params.contains_key("fields") && version < (1, 8) {
        return Err(not_acceptable("fields", (1, 8)));
    }
    if let Some(d) = params.get("detail") {
        if version < (1, 43) {
            return Err(ApiError::bad_request(format!(
                "Invalid query parameter ?detail={d} received."
            )));
        }
    }
    Ok(())
}

/// The `next` link of a full page.
pub fn next_link(
    base: &str,
    path: &str,
    params: &HashMap<String, String>,
    limit: usize,
    last: &str,
) -> String {
    let mut next = format!("{base}{path}?limit={limit}");
    let mut keys: Vec<&String> = params
        .keys()
        .filter(|k| *k != "limit" && *k != "marker")
        .collect();
    keys.sort();
    for k in keys {
        if let Some(v) = params.get(k) {
            next.push_str(&format!("&{k}={v}"));
        }
    }
    next.push_str(&format!("&marker={last}"));
    next
}
