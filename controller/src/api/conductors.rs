//! `GET /v1/conductors[/{hostname}]`: the controllers sharing this database, Ironic-shaped
//! (`hostname` is the conductor id, `alive` whether it heartbeat within `dead_after_s`).

use super::render::base_url;
use super::{ApiError, ApiResult, AppState};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::{Json, Router};
use rivet_store::ConductorRecord;
use serde_json::{json, Value};
use std::collections::HashMap;

/// The routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/conductors", get(list))
        .route("/v1/conductors/{hostname}", get(show))
}

/// The query a conductor listing takes, as Ironic's.
const LIST_PARAMS: &[&str] = &[
    "limit", "marker", "sort_key", "sort_dir", "fields", "detail",
];

/// The page a listing asks for, checked as Ironic checks it.
struct ListQuery {
    detail: bool,
    fields: Option<String>,
    limit: usize,
    marker: Option<String>,
    sort_key: String,
    desc: bool,
}

/// Keys a conductor listing sorts by (`id` is the registration order, which is the
/// hostname's here).
const SORT_KEYS: &[&str] = &["id", "hostname", "created_at", "updated_at"];

/// 400 for a parameter Ironic does not take; `detail` is a boolean as Ironic parses one
/// (`True` from Python clients too), not together with `fields`.
fn list_query(params: &HashMap<String, String>, max_limit: usize) -> ApiResult<ListQuery> {
    super::listing::only_params(params.keys(), LIST_PARAMS)?;
    let sort_key = params
        .get("sort_key")
        .cloned()
        .unwrap_or_else(|| "id".into());
    if !SORT_KEYS.contains(&sort_key.as_str()) {
        return Err(ApiError::bad_request(format!(
            "sort_key {sort_key:?} is not supported; use one of {}",
            SORT_KEYS.join(", ")
        )));
    }
    Ok(ListQuery {
        detail: super::listing::detail_param(params, false)?,
        fields: params.get("fields").cloned(),
        limit: super::listing::page_limit(params, max_limit)?,
        marker: params.get("marker").cloned(),
        sort_key,
        desc: super::listing::sort_dir_param(params)? == Some(rivet_store::SortDir::Desc),
    })
}

fn render(c: &ConductorRecord, detail: bool, base: &str) -> Value {
    let mut v = json!({
        "hostname": c.id,
        "conductor_group": "",
        "alive": c.alive,
        "links": [
            {"href": format!("{base}/v1/conductors/{}", c.id), "rel": "self"},
            {"href": format!("{base}/conductors/{}", c.id), "rel": "bookmark"},
        ],
    });
    if detail {
        v["drivers"] = json!(["fake-hardware", "ipmi", "redfish"]);
        v["created_at"] = json!(super::render::timestamp(&c.started_at));
        v["updated_at"] = json!(super::render::timestamp(&c.last_seen));
    }
    v
}

async fn conductors(state: &AppState) -> ApiResult<Vec<ConductorRecord>> {
    Ok(state
        .conductor
        .store
        .list_conductors(state.conductor.config.conductor.dead_after_s.max(1))
        .await?)
}

async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    let q = list_query(&params, state.conductor.config.api.max_limit)?;
    let base = base_url(&headers);
    let mut all = conductors(&state).await?;
    match q.sort_key.as_str() {
        "created_at" => all.sort_by_key(|c| c.started_at),
        "updated_at" => all.sort_by_key(|c| c.last_seen),
        _ => all.sort_by(|a, b| a.id.cmp(&b.id)),
    }
    if q.desc {
        all.reverse();
    }
    if let Some(m) = &q.marker {
        let at = all.iter().position(|c| &c.id == m).ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("Conductor {m} could not be found."),
            )
        })?;
        all.drain(..=at);
    }
    all.truncate(q.limit);
    // A full page links the next one, as every Ironic listing does (even when it is empty).
    let full_page = all.len() == q.limit;
    // `fields` names are checked against a whole document.
    let template = all
        .first()
        .map(|c| render(c, true, &base))
        .and_then(|v| v.as_object().cloned())
        .unwrap_or_default();
    let fields = match &q.fields {
        Some(f) if !all.is_empty() => super::render::parse_fields(Some(f), &template)?,
        _ => None,
    };
    let docs: Vec<Value> = all
        .iter()
        .map(|c| {
            let doc = render(c, q.detail || fields.is_some(), &base);
            match (&fields, doc) {
                (Some(f), Value::Object(m)) => super::render::sanitized(m, f),
                (_, doc) => doc,
            }
        })
        .collect();
    let mut body = json!({ "conductors": docs });
    if let (true, Some(last)) = (full_page, all.last()) {
        body["next"] = json!(super::listing::next_link(
            &base,
            "/v1/conductors",
            &params,
            q.limit,
            &last.id
        ));
    }
    Ok(Json(body))
}

async fn show(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(hostname): Path<String>,
) -> ApiResult<Json<Value>> {
    let base = base_url(&headers);
    let all = conductors(&state).await?;
    let c = all.iter().find(|c| c.id == hostname).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "conductor {hostname} could not be found; registered: {}",
                all.iter()
                    .map(|c| c.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    })?;
    Ok(Json(render(c, true, &base)))
}
