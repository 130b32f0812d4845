//! Query parameters that every paged listing reads the same way (nodes, the audit trail).

use super::ApiError;
use crate::store::SortDir;
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
