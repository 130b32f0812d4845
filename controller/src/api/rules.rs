//! `/v1/inspection_rules` (API 1.96) in Ironic's shape: create, list (`detail`, `fields`,
//! `limit`, `marker`, `sort_key`, `sort_dir`, `phase`), show, JSON-patch, delete. A rule that
//! does not validate is a 400 naming the operation and argument; a sensitive rule's
//! conditions and actions are never shown. Below 1.96 reads are 404 and writes 405, as Ironic.

use super::render::links;
use super::resource::{self, found, Access, Listing, Page, Patched, Resource};
use super::{body, ApiError, ApiResult, ApiVersion, AppState};
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::delete;
use axum::Router;
use chrono::Utc;
use rivet_conductor::inspection_rules::load_rules;
use rivet_model::inspection::rules::{validate, Rule};
use rivet_model::microversions as mv;
use rivet_protocol::api::PatchOp;
use rivet_store::{SortDir, StoreError};
use serde_json::{json, Map, Value};
use std::collections::HashMap;

/// Fields a listing shows without `detail` (Ironic's DEFAULT_RETURN_FIELDS, and links).
const LIST_FIELDS: &[&str] = &["uuid", "priority", "phase", "description", "links"];

/// Largest page.
const MAX_LIMIT: usize = 1000;

pub fn routes() -> Router<AppState> {
    // Ironic's `DELETE /v1/inspection_rules` (every rule) beside the collection's methods.
    resource::routes::<Api>()
        .route("/v1/inspection_rules", delete(remove_all))
        .route("/v1/inspection_rules/", delete(remove_all))
}

/// A stored rule with its timestamps.
pub(super) struct Stored {
    rule: Rule,
    created_at: Value,
    updated_at: Value,
}

async fn all(state: &AppState) -> Result<Vec<Stored>, StoreError> {
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

/// The API document of a rule (Ironic's `convert_with_links` and `rules_sanitize`).
fn render(s: &Stored, base: &str) -> Map<String, Value> {
    let r = &s.rule;
    let uuid = r.uuid.clone().unwrap_or_default();
    let ops = |list: &[rivet_model::inspection::rules::Operation], with_multiple: bool| {
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
    Value::from(super::render::timestamp(&Utc::now()))
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

fn flag(params: &HashMap<String, String>, k: &str) -> Result<bool, ApiError> {
    match params.get(k).map(|v| v.to_ascii_lowercase()) {
        None => Ok(false),
        Some(v) if ["true", "1", "yes", "on", "y", "t"].contains(&v.as_str()) => Ok(true),
        Some(v) if ["false", "0", "no", "off", "n", "f"].contains(&v.as_str()) => Ok(false),
        Some(v) => Err(ApiError::bad_request(format!("{k}={v:?} is not a boolean"))),
    }
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

/// `DELETE /v1/inspection_rules`: every rule (Ironic: all non-built-in rules; Rivet has no
/// built-in ones).
async fn remove_all(
    State(state): State<AppState>,
    ApiVersion(version): ApiVersion,
) -> ApiResult<StatusCode> {
    resource::gate::<Api>(version, Access::Delete)?;
    for s in all(&state).await? {
        if let Some(uuid) = s.rule.uuid {
            match state.conductor.store.delete_rule(&uuid).await {
                Ok(()) | Err(rivet_store::StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(StatusCode::NO_CONTENT)
}

/// The inspection rule collection.
pub(super) struct Api;

impl Resource for Api {
    type Record = Stored;
    const PATH: &'static str = "inspection_rules";
    const NAME: &'static str = "Inspection rule";
    const IDENT: &'static str = "uuid";
    const DETAIL_ROUTE: bool = false;
    const SINCE: (u32, u32) = mv::INSPECTION_RULES;
    const LIST_FIELDS: &'static [&'static str] = LIST_FIELDS;
    const FILTERS: &'static [&'static str] = &["phase"];
    // The fields of a rule's document, and `id` (creation order).
    const SORT_KEYS: &'static [&'static str] = &[
        "id",
        "uuid",
        "description",
        "priority",
        "sensitive",
        "phase",
        "created_at",
        "updated_at",
        "links",
    ];
    const PATCHABLE: &'static [&'static str] = PATCHABLE;
    const UNSORTABLE: &'static [&'static str] = &["actions", "conditions"];
    const MAX_LIMIT: Option<usize> = Some(MAX_LIMIT);

    fn doc(s: &Stored, base: &str, _version: (u32, u32)) -> Map<String, Value> {
        render(s, base)
    }

    fn blank() -> Stored {
        Stored {
            rule: Rule {
                uuid: None,
                description: None,
                priority: 0,
                sensitive: false,
                phase: String::new(),
                conditions: Vec::new(),
                actions: Vec::new(),
            },
            created_at: Value::Null,
            updated_at: Value::Null,
        }
    }

    /// Rules are named by UUID only (Ironic's `args.uuid` / UUID path schema): 400 else.
    fn ident(ident: &str, _access: Access) -> ApiResult<String> {
        super::body::check_uuid("inspection_rule_uuid", ident)
    }

    async fn get(state: &AppState, uuid: &str) -> Result<Stored, StoreError> {
        all(state)
            .await?
            .into_iter()
            .find(|s| s.rule.uuid.as_deref() == Some(uuid))
            .ok_or_else(|| StoreError::NotFound {
                kind: "inspection rule",
                ident: uuid.to_string(),
            })
    }

    /// Below 1.96 reads are 404 and writes 405, as Ironic.
    fn too_old(version: (u32, u32), access: Access) -> ApiError {
        let msg = format!(
            "The API version does not allow inspection rules: they need API version 1.96 or \
             later (this request asked for {}.{}; send X-OpenStack-Ironic-API-Version: 1.96)",
            version.0, version.1
        );
        match access {
            Access::Read => ApiError::new(StatusCode::NOT_FOUND, msg),
            _ => ApiError::new(StatusCode::METHOD_NOT_ALLOWED, msg),
        }
    }

    fn unknown_param(bad: &str, allowed: &[&str]) -> ApiError {
        ApiError::bad_request(format!(
            "unknown query parameter {bad:?} (use {})",
            allowed.join(", ")
        ))
    }

    fn unknown_sort_key(key: &str) -> ApiError {
        ApiError::bad_request(format!(
            "The sort_key value {key} is an invalid field for sorting"
        ))
    }

    fn detail(params: &HashMap<String, String>, _from_detail: bool) -> ApiResult<bool> {
        let detail = flag(params, "detail")?;
        if detail && params.contains_key("fields") {
            return Err(ApiError::bad_request(
                "Can not specify ?detail=True and fields in the same request.",
            ));
        }
        Ok(detail)
    }

    /// A marker is a rule's UUID, looked for in the listing (404 when it is not there).
    async fn marker(_state: &AppState, marker: &str) -> ApiResult<String> {
        Ok(marker.to_string())
    }

    /// Rules are few: sorted, filtered and paged here, not in the store.
    async fn list(state: &AppState, l: &Listing<'_>, page: Page) -> ApiResult<Vec<Stored>> {
        let phase = l.params.get("phase");
        let sort_key = page.sort_key.as_str();
        let mut rows: Vec<(usize, Map<String, Value>, Stored)> = all(state)
            .await?
            .into_iter()
            .filter(|s| phase.is_none_or(|p| &s.rule.phase == p))
            .enumerate()
            .map(|(i, s)| (i, render(&s, ""), s))
            .collect();
        if sort_key != "id" {
            let key = |m: &Map<String, Value>| key_of(m, sort_key);
            rows.sort_by(|(ia, a, _), (ib, b, _)| cmp_json(&key(a), &key(b)).then(ia.cmp(ib)));
        } else {
            // Storage order: priority, then creation; `id` is creation order in Ironic.
            rows.sort_by(|(_, a, _), (_, b, _)| {
                cmp_json(&key_of(a, "created_at"), &key_of(b, "created_at"))
            });
        }
        if page.sort_dir == Some(SortDir::Desc) {
            rows.reverse();
        }
        let mut found: Vec<Stored> = rows.into_iter().map(|(_, _, s)| s).collect();
        if let Some(marker) = &page.marker {
            let pos = found
                .iter()
                .position(|s| s.rule.uuid.as_deref() == Some(marker.as_str()))
                .ok_or_else(|| resource::not_found(Self::NAME, marker))?;
            found.drain(..=pos);
        }
        found.truncate(page.limit);
        Ok(found)
    }

    type Body = Rule;

    async fn create(state: &AppState, mut rule: Rule, _version: (u32, u32)) -> ApiResult<Stored> {
        let uuid = match rule.uuid.take().filter(|u| !u.is_empty()) {
            Some(u) => uuid::Uuid::parse_str(&u)
                .map_err(|_| ApiError::bad_request(format!("uuid: {u:?} is not a valid UUID")))?
                .to_string(),
            None => uuid::Uuid::new_v4().to_string(),
        };
        if Self::get(state, &uuid).await.is_ok() {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("Inspection rule with UUID {uuid} already exists."),
            ));
        }
        rule.uuid = Some(uuid);
        let created = now();
        save(state, &rule, created.clone(), Value::Null).await?;
        Ok(Stored {
            rule,
            created_at: created,
            updated_at: Value::Null,
        })
    }

    fn patch_doc(s: &Stored, _version: (u32, u32)) -> ApiResult<Value> {
        serde_json::to_value(&s.rule).map_err(|e| ApiError::bad_request(e.to_string()))
    }

    /// Rules are patched with array indices and `-` (see [`apply_patch`]).
    fn apply_patch(doc: &mut Value, ops: &[PatchOp], _version: (u32, u32)) -> ApiResult<()> {
        apply_patch(doc, ops)
    }

    async fn patched(state: &AppState, current: Stored, p: Patched<'_>) -> ApiResult<Stored> {
        let doc = p.doc;
        let uuid = current.rule.uuid.as_deref().unwrap_or_default().to_string();
        let rule: Rule = body::parse(Value::Object(doc).to_string().as_bytes())?;
        if current.rule.sensitive && !rule.sensitive {
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
        save(state, &rule, current.created_at.clone(), updated.clone()).await?;
        Ok(Stored {
            rule,
            created_at: current.created_at,
            updated_at: updated,
        })
    }

    async fn delete(state: &AppState, s: Stored) -> ApiResult<()> {
        let uuid = s.rule.uuid.as_deref().unwrap_or_default();
        found::<Self, _>(uuid, state.conductor.store.delete_rule(uuid).await)
    }
}
