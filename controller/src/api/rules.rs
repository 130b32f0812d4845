//! `/v1/inspection_rules` (API 1.96) in Ironic's shape: create, list (`detail`, `fields`,
//! `limit`, `marker`, `sort_key`, `sort_dir`, `phase`), show, JSON-patch, delete. A rule that
//! does not validate is a 400 naming the operation and argument; a sensitive rule's
//! conditions and actions are never shown. Below 1.96 reads are 404 and writes 405, as Ironic.

use super::render::{base_url, links, parse_fields, select};
use super::{body, listing, ApiError, ApiResult, ApiVersion, AppState, JsonBody};
use crate::conductor::inspection_rules::load_rules;
use crate::inspection::rules::{validate, Rule};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use chrono::{SecondsFormat, Utc};
use rivet_protocol::api::PatchOp;
use serde_json::{json, Map, Value};
use std::collections::HashMap;

/// The microversion that adds inspection rules.
pub const SINCE: (u32, u32) = (1, 96);

/// Fields a listing shows without `detail` (Ironic's DEFAULT_RETURN_FIELDS, and links).
const LIST_FIELDS: &[&str] = &["uuid", "priority", "phase", "description", "links"];

/// Largest page.
const MAX_LIMIT: usize = 1000;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/inspection_rules",
            get(list).post(create).delete(remove_all),
        )
        .route(
            "/v1/inspection_rules/",
            get(list).post(create).delete(remove_all),
        )
        .route(
            "/v1/inspection_rules/{uuid}",
            get(show).patch(update).delete(remove),
        )
}

fn gate(version: (u32, u32), write: bool) -> Result<(), ApiError> {
    if version >= SINCE {
        return Ok(());
    }
    let msg = format!(
        "The API version does not allow inspection rules: they need API version 1.96 or later \
         (this request asked for {}.{}; send X-OpenStack-Ironic-API-Version: 1.96)",
        version.0, version.1
    );
    Err(if write {
        ApiError::new(StatusCode::METHOD_NOT_ALLOWED, msg)
    } else {
        ApiError::new(StatusCode::NOT_FOUND, msg)
    })
}

fn not_found(uuid: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("Inspection rule {uuid} could not be found."),
    )
}

/// A stored rule with its timestamps.
struct Stored {
    rule: Rule,
    created_at: Value,
    updated_at: Value,
}

async fn all(state: &AppState) -> ApiResult<Vec<Stored>> {
    // Converts rules stored in the former schema once, then reads the bodies for timestamps.
    let rules = load_rules(state.conductor.store.as_ref()).await?;
    let docs = state.conductor.store.list_rules().await?;
    Ok(rules
        .into_iter()
        .map(|rule| {
            let doc = docs
                .iter()
                .find(|d| d.get("uuid").and_then(Value::as_str) == rule.uuid.as_deref());
            let ts = |k: &str| doc.and_then(|d| d.get(k)).cloned().unwrap_or(Value::Null);
            Stored {
                created_at: ts("created_at"),
                updated_at: ts("updated_at"),
                rule,
            }
        })
        .collect())
}

async fn fetch(state: &AppState, uuid: &str) -> ApiResult<Stored> {
    all(state)
        .await?
        .into_iter()
        .find(|s| s.rule.uuid.as_deref() == Some(uuid))
        .ok_or_else(|| not_found(uuid))
}

/// The API document of a rule (Ironic's `convert_with_links` and `rules_sanitize`).
fn render(s: &Stored, base: &str) -> Map<String, Value> {
    let r = &s.rule;
    let uuid = r.uuid.clone().unwrap_or_default();
    let ops = |list: &[crate::inspection::rules::Operation], with_multiple: bool| {
        Value::Array(
            list.iter()
                .map(|o| {
                    let mut m = Map::new();
                    m.insert("op".into(), Value::from(o.op.clone()));
                    m.insert("args".into(), o.args.clone());
                    if let Some(l) = o.loop_items.as_ref().filter(|l| !is_empty(l)) {
                        m.insert("loop".into(), l.clone());
                        if with_multiple {
                            let mult = o.multiple.clone().unwrap_or_else(|| "any".into());
                            m.insert("multiple".into(), Value::from(mult));
                        }
                    }
                    Value::Object(m)
                })
                .collect(),
        )
    };
    let (conditions, actions) = if r.sensitive {
        (Value::Null, Value::Null)
    } else {
        (ops(&r.conditions, true), ops(&r.actions, false))
    };
    let v = json!({
        "uuid": uuid,
        "description": r.description,
        "priority": r.priority,
        "sensitive": r.sensitive,
        "phase": r.phase,
        "conditions": conditions,
        "actions": actions,
        "created_at": s.created_at,
        "updated_at": s.updated_at,
        "links": links(base, "inspection_rules", &uuid),
    });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Array(a) => a.is_empty(),
        Value::Object(m) => m.is_empty(),
        Value::Null => true,
        _ => false,
    }
}

fn now() -> Value {
    Value::from(Utc::now().to_rfc3339_opts(SecondsFormat::Secs, false))
}

/// Validate and store; the stored body is the rule plus its timestamps.
async fn save(
    state: &AppState,
    rule: &Rule,
    created_at: Value,
    updated_at: Value,
) -> ApiResult<()> {
    validate(rule).map_err(|e| {
        ApiError::bad_request(format!("Validation failed for inspection rule: {e}"))
    })?;
    let uuid = rule.uuid.clone().unwrap_or_default();
    let mut doc = serde_json::to_value(rule).map_err(|e| ApiError::bad_request(e.to_string()))?;
    if let Value::Object(m) = &mut doc {
        m.insert("created_at".into(), created_at);
        m.insert("updated_at".into(), updated_at);
    }
    state
        .conductor
        .store
        .put_rule(&uuid, rule.priority, &doc)
        .await?;
    Ok(())
}

async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    Extension(ApiVersion(version)): Extension<ApiVersion>,
    JsonBody(mut rule): JsonBody<Rule>,
) -> ApiResult<Response> {
    gate(version, true)?;
    let uuid = match rule.uuid.take().filter(|u| !u.is_empty()) {
        Some(u) => uuid::Uuid::parse_str(&u)
            .map_err(|_| ApiError::bad_request(format!("uuid: {u:?} is not a valid UUID")))?
            .to_string(),
        None => uuid::Uuid::new_v4().to_string(),
    };
    if fetch(&state, &uuid).await.is_ok() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("Inspection rule with UUID {uuid} already exists."),
        ));
    }
    rule.uuid = Some(uuid.clone());
    let created = now();
    save(&state, &rule, created.clone(), Value::Null).await?;
    let base = base_url(&headers);
    let doc = render(
        &Stored {
            rule,
            created_at: created,
            updated_at: Value::Null,
        },
        &base,
    );
    let mut resp = (StatusCode::CREATED, Json(Value::Object(doc))).into_response();
    if let Ok(loc) = HeaderValue::from_str(&format!("{base}/v1/inspection_rules/{uuid}")) {
        resp.headers_mut().insert(header::LOCATION, loc);
    }
    Ok(resp)
}

fn flag(params: &HashMap<String, String>, k: &str) -> Result<bool, ApiError> {
    match params.get(k).map(|v| v.to_ascii_lowercase()) {
        None => Ok(false),
        Some(v) if ["true", "1", "yes", "on", "y", "t"].contains(&v.as_str()) => Ok(true),
        Some(v) if ["false", "0", "no", "off", "n", "f"].contains(&v.as_str()) => Ok(false),
        Some(v) => Err(ApiError::bad_request(format!("{k}={v:?} is not a boolean"))),
    }
}

async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    Extension(ApiVersion(version)): Extension<ApiVersion>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    gate(version, false)?;
    const KNOWN: &[&str] = &[
        "detail", "fields", "limit", "marker", "sort_key", "sort_dir", "phase",
    ];
    if let Some(k) = params.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(ApiError::bad_request(format!(
            "unknown query parameter {k:?} (use {})",
            KNOWN.join(", ")
        )));
    }
    let detail = flag(&params, "detail")?;
    if detail && params.contains_key("fields") {
        return Err(ApiError::bad_request(
            "Can not specify ?detail=True and fields in the same request.",
        ));
    }
    let limit = listing::page_limit(&params, MAX_LIMIT)?;
    let sort_key = params.get("sort_key").map(String::as_str).unwrap_or("id");
    let desc = match params.get("sort_dir").map(String::as_str) {
        None => false,
        Some(d) => match listing::sort_dir(d) {
            Some(crate::store::SortDir::Desc) => true,
            Some(_) => false,
            None => {
                return Err(ApiError::bad_request(format!(
                    "Invalid sort direction: {d}. Acceptable values are 'asc' or 'desc'"
                )))
            }
        },
    };
    if ["actions", "conditions"].contains(&sort_key) {
        return Err(ApiError::bad_request(format!(
            "The sort_key value {sort_key} is an invalid field for sorting"
        )));
    }
    let base = base_url(&headers);
    let mut rows: Vec<(usize, Map<String, Value>)> = all(&state)
        .await?
        .iter()
        .filter(|s| params.get("phase").is_none_or(|p| &s.rule.phase == p))
        .map(|s| render(s, &base))
        .enumerate()
        .collect();
    let key = |m: &Map<String, Value>| m.get(sort_key).cloned().unwrap_or(Value::Null);
    if sort_key != "id" {
        if !rows.first().is_none_or(|(_, m)| m.contains_key(sort_key)) {
            return Err(ApiError::bad_request(format!(
                "The sort_key value {sort_key} is an invalid field for sorting"
            )));
        }
        rows.sort_by(|(ia, a), (ib, b)| cmp_json(&key(a), &key(b)).then(ia.cmp(ib)));
    } else {
        // Storage order: priority, then creation; `id` is creation order in Ironic.
        rows.sort_by(|(_, a), (_, b)| cmp_json(&key_of(a, "created_at"), &key_of(b, "created_at")));
    }
    if desc {
        rows.reverse();
    }
    let mut docs: Vec<Map<String, Value>> = rows.into_iter().map(|(_, m)| m).collect();
    if let Some(marker) = params.get("marker") {
        let pos = docs
            .iter()
            .position(|d| d.get("uuid").and_then(Value::as_str) == Some(marker.as_str()))
            .ok_or_else(|| not_found(marker))?;
        docs.drain(..=pos);
    }
    let more = docs.len() > limit;
    docs.truncate(limit);
    let fields: Option<Vec<String>> = match params.get("fields") {
        Some(f) => match docs.first() {
            Some(d) => parse_fields(Some(f), d)?,
            None => None,
        },
        None if detail => None,
        None => Some(LIST_FIELDS.iter().map(|s| s.to_string()).collect()),
    };
    let last = docs
        .last()
        .and_then(|d| d.get("uuid"))
        .and_then(Value::as_str)
        .map(String::from);
    let items: Vec<Value> = docs
        .into_iter()
        .map(|d| match &fields {
            Some(f) => select(d, f),
            None => Value::Object(d),
        })
        .collect();
    let mut out = json!({ "inspection_rules": items });
    if let (true, Some(last)) = (more, last) {
        out["next"] = Value::from(format!(
            "{base}/v1/inspection_rules?limit={limit}&marker={last}"
        ));
    }
    Ok(Json(out))
}

/// Fields a PATCH may touch.
const PATCHABLE: &[&str] = &[
    "description",
    "priority",
    "phase",
    "sensitive",
    "conditions",
    "actions",
];

fn unescape(t: &str) -> String {
    t.replace("~1", "/").replace("~0", "~")
}

/// RFC 6902 `add`/`replace`/`remove`/`test` on a rule document, with array indices and `-`
/// (Ironic's jsonpatch: `/actions/-`, `/conditions/0/args`), on [`PATCHABLE`] fields only.
fn apply_patch(doc: &mut Value, ops: &[PatchOp]) -> Result<(), ApiError> {
    for op in ops {
        let bad = |m: &str| ApiError::bad_request(format!("patch {} {}: {m}", op.op, op.path));
        let parts: Vec<String> = op
            .path
            .strip_prefix('/')
            .ok_or_else(|| bad("a path starts with /"))?
            .split('/')
            .map(unescape)
            .collect();
        let top = parts.first().map(String::as_str).unwrap_or_default();
        if !PATCHABLE.contains(&top) {
            return Err(bad(&format!(
                "{top:?} cannot be changed (patchable: {})",
                PATCHABLE.join(", ")
            )));
        }
        let (last, inner) = parts.split_last().ok_or_else(|| bad("empty path"))?;
        let mut parent = &mut *doc;
        for p in inner {
            parent = match parent {
                Value::Object(m) => m.get_mut(p),
                Value::Array(a) => p.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
                _ => None,
            }
            .ok_or_else(|| bad(&format!("{p} does not exist")))?;
        }
        let value = || op.value.clone().ok_or_else(|| bad("a value is needed"));
        match (op.op.as_str(), parent) {
            ("add" | "replace", Value::Object(m)) => {
                if op.op == "replace" && !m.contains_key(last) && inner.is_empty() {
                    // Ironic replaces absent optional top-level fields too.
                } else if op.op == "replace" && !m.contains_key(last) {
                    return Err(bad("nothing to replace"));
                }
                m.insert(last.clone(), value()?);
            }
            ("remove", Value::Object(m)) => {
                if m.remove(last).is_none() {
                    return Err(bad("nothing to remove"));
                }
            }
            ("test", Value::Object(m)) => {
                if m.get(last) != Some(&value()?) {
                    return Err(ApiError::new(
                        StatusCode::CONFLICT,
                        format!("patch test {} failed", op.path),
                    ));
                }
            }
            (verb, Value::Array(a)) => {
                let idx = if last == "-" && verb == "add" {
                    a.len()
                } else {
                    last.parse::<usize>()
                        .ok()
                        .filter(|i| *i < a.len() || (verb == "add" && *i == a.len()))
                        .ok_or_else(|| bad(&format!("index {last} is out of range")))?
                };
                match verb {
                    "add" => a.insert(idx, value()?),
                    "replace" => a[idx] = value()?,
                    "remove" => {
                        a.remove(idx);
                    }
                    "test" if a[idx] == value()? => {}
                    "test" => {
                        return Err(ApiError::new(
                            StatusCode::CONFLICT,
                            format!("patch test {} failed", op.path),
                        ))
                    }
                    _ => return Err(bad("unknown op (use add, replace, remove, test)")),
                }
            }
            (_, Value::Object(_)) => {
                return Err(bad("unknown op (use add, replace, remove, test)"))
            }
            _ => return Err(bad("the parent is neither an object nor a list")),
        }
    }
    rivet_protocol::limits::check_value(doc, &rivet_protocol::limits::Limits::ADMIN)
        .map_err(|e| ApiError::bad_request(format!("after the patch, {e}")))
}

fn key_of(m: &Map<String, Value>, k: &str) -> Value {
    m.get(k).cloned().unwrap_or(Value::Null)
}

fn cmp_json(a: &Value, b: &Value) -> std::cmp::Ordering {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x
            .as_f64()
            .partial_cmp(&y.as_f64())
            .unwrap_or(std::cmp::Ordering::Equal),
        (Value::Null, Value::Null) => std::cmp::Ordering::Equal,
        (Value::Null, _) => std::cmp::Ordering::Less,
        (_, Value::Null) => std::cmp::Ordering::Greater,
        _ => a.to_string().cmp(&b.to_string()),
    }
}

async fn show(
    State(state): State<AppState>,
    headers: HeaderMap,
    Extension(ApiVersion(version)): Extension<ApiVersion>,
    Path(uuid): Path<String>,
    Query(p): Query<listing::ShowParams>,
) -> ApiResult<Json<Value>> {
    gate(version, false)?;
    let full = render(&fetch(&state, &uuid).await?, &base_url(&headers));
    Ok(Json(match parse_fields(p.fields.as_deref(), &full)? {
        Some(f) => select(full, &f),
        None => Value::Object(full),
    }))
}

async fn update(
    State(state): State<AppState>,
    headers: HeaderMap,
    Extension(ApiVersion(version)): Extension<ApiVersion>,
    Path(uuid): Path<String>,
    JsonBody(ops): JsonBody<Vec<PatchOp>>,
) -> ApiResult<Json<Value>> {
    gate(version, true)?;
    let current = fetch(&state, &uuid).await?;
    let was_sensitive = current.rule.sensitive;
    let mut doc =
        serde_json::to_value(&current.rule).map_err(|e| ApiError::bad_request(e.to_string()))?;
    apply_patch(&mut doc, &ops)?;
    let rule: Rule = body::parse(doc.to_string().as_bytes())?;
    if was_sensitive && !rule.sensitive {
        return Err(ApiError::bad_request(format!(
            "Inspection rule {uuid}: inspection rules cannot have the sensitive flag unset; \
             create a new rule instead"
        )));
    }
    if rule.uuid.as_deref() != Some(uuid.as_str()) {
        return Err(ApiError::bad_request(
            "the uuid of a rule cannot be changed",
        ));
    }
    let updated = now();
    save(&state, &rule, current.created_at.clone(), updated.clone()).await?;
    Ok(Json(Value::Object(render(
        &Stored {
            rule,
            created_at: current.created_at,
            updated_at: updated,
        },
        &base_url(&headers),
    ))))
}

/// `DELETE /v1/inspection_rules`: every rule (Ironic: all non-built-in rules; Rivet has no
/// built-in ones).
async fn remove_all(
    State(state): State<AppState>,
    Extension(ApiVersion(version)): Extension<ApiVersion>,
) -> ApiResult<StatusCode> {
    gate(version, true)?;
    for s in all(&state).await? {
        if let Some(uuid) = s.rule.uuid {
            match state.conductor.store.delete_rule(&uuid).await {
                Ok(()) | Err(crate::store::StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(StatusCode::NO_CONTENT)
}

async fn remove(
    State(state): State<AppState>,
    Extension(ApiVersion(version)): Extension<ApiVersion>,
    Path(uuid): Path<String>,
) -> ApiResult<StatusCode> {
    gate(version, true)?;
    match state.conductor.store.delete_rule(&uuid).await {
        Ok(()) => Ok(StatusCode::NO_CONTENT),
        Err(crate::store::StoreError::NotFound { .. }) => Err(not_found(&uuid)),
        Err(e) => Err(e.into()),
    }
}
