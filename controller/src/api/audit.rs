//! The audit trail at the HTTP edge. [`record`] writes one row for every state-changing
//! request under `/v1` (POST, PUT, PATCH, DELETE), whatever its answer, and for every read
//! refused with 401 or 403: when, who, from where, what, which node, the status and a short
//! detail. `GET /v1/audit` (admin only) reads the trail. Answers 429 (a source over
//! `[api] failed_auth_per_minute`) are not recorded: that flood is logged once a minute.
//!
//! Request bodies are never stored: a provision or power request contributes its target, a
//! patch the operations and paths it touches, never the values (driver_info holds BMC
//! passwords). Agent endpoints (`/agent/v1`) are not admin requests and are not recorded.

use super::auth::{self, Caller};
use super::render::base_url;
use super::{listing, ApiError, ApiResult, AppState};
use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use chrono::{SecondsFormat, Utc};
use rivet_protocol::api::ErrorBody;
use rivet_store::{AuditEntry, AuditQuery, SortDir, StoreError};
use rivet_support::http::PeerAddr;
use serde_json::{json, Value};
use std::collections::HashMap;

/// Longest detail kept (characters); error messages can quote long agent output.
const DETAIL_MAX: usize = 500;

/// Responses read to find a created record's UUID or an error's message are small; anything
/// larger is passed through unread.
const RESPONSE_READ_MAX: usize = 256 * 1024;

pub fn routes() -> Router<AppState> {
    Router::new().route("/v1/audit", get(list))
}

/// What a request is, worked out before the handler runs (the node may be gone after).
struct Subject {
    action: String,
    node: Option<String>,
    detail: Option<String>,
}

/// Middleware on the whole router: records admin requests as described in the module doc.
pub async fn record(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    if path != "/v1" && !path.starts_with("/v1/") {
        return next.run(req).await;
    }
    let method = req.method().clone();
    let changes = matches!(
        method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    let source = req.extensions().get::<PeerAddr>().map(|p| p.0.to_string());
    if !changes {
        let credential = credential_kind(req.headers());
        let resp = next.run(req).await;
        let status = resp.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            let caller = resp.extensions().get::<Caller>().cloned();
            let (resp, message) = error_message(resp).await;
            let actor = match caller {
                Some(c) => actor_of(&state, &c),
                None => format!("unauthenticated ({credential})"),
            };
            let subject = Subject {
                action: format!("read:{}", resource(&path)),
                node: None,
                detail: message,
            };
            append(&state, actor, source, &method, &path, subject, status).await;
            return resp;
        }
        return resp;
    }

    let headers = req.headers().clone();
    let (req, mut subject) = match describe(&state, req, &method, &path).await {
        Ok(v) => v,
        Err(refusal) => {
            // The body could not be read (too large, or the client went away): answer as
            // the handler would have, and record that.
            let actor = actor_without_caller(&state, &headers, refusal.status);
            let subject = Subject {
                action: action_name(&method, &path, None),
                node: None,
                detail: Some(refusal.message.clone()),
            };
            append(
                &state,
                actor,
                source,
                &method,
                &path,
                subject,
                refusal.status,
            )
            .await;
            return axum::response::IntoResponse::into_response(refusal);
        }
    };
    let resp = next.run(req).await;
    let status = resp.status();
    let caller = resp.extensions().get::<Caller>().cloned();
    let actor = match caller {
        Some(c) => actor_of(&state, &c),
        None => actor_without_caller(&state, &headers, status),
    };
    let resp = if status.is_client_error() || status.is_server_error() {
        let (resp, message) = error_message(resp).await;
        subject.detail = message;
        resp
    } else if method == Method::POST && status.is_success() {
        let (resp, created) = read_json(resp).await;
        if let Some(doc) = created {
            describe_created(&mut subject, &path, &doc);
        }
        resp
    } else {
        resp
    };
    append(&state, actor, source, &method, &path, subject, status).await;
    resp
}

/// `NAME (role ROLE)`, or `anonymous (--no-auth)` when authentication is off.
pub(super) fn actor_of(state: &AppState, c: &Caller) -> String {
    if state.conductor.config.no_auth {
        "anonymous (--no-auth)".into()
    } else {
        format!("{} (role {})", c.name, c.role.as_str())
    }
}

/// The actor of a request that never reached the role check (a 404 on an unknown path, a
/// 406 for the API version, an unreadable body): the credential is checked here so the row
/// still names who it was.
fn actor_without_caller(state: &AppState, headers: &HeaderMap, status: StatusCode) -> String {
    if state.conductor.config.no_auth {
        return "anonymous (--no-auth)".into();
    }
    if status != StatusCode::UNAUTHORIZED {
        if let Some(c) = auth::check(state, headers) {
            return actor_of(state, &c);
        }
    }
    format!("unauthenticated ({})", credential_kind(headers))
}

/// What kind of credential a refused request carried; never any part of it.
fn credential_kind(headers: &HeaderMap) -> &'static str {
    let auth = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if auth.starts_with("Bearer ") || headers.contains_key("x-auth-token") {
        "bad or unknown token"
    } else if auth.starts_with("Basic ") {
        "bad basic credentials"
    } else if !auth.is_empty() {
        "unsupported Authorization scheme"
    } else {
        "no credentials"
    }
}

/// The first path segment after `/v1/` (`nodes`, `ports`, `audit`…).
fn resource(path: &str) -> &str {
    path.trim_start_matches("/v1")
        .trim_start_matches('/')
        .split('/')
        .next()
        .filter(|s| !s.is_empty())
        .unwrap_or("version")
}

/// `node:create`, `provision:provide`, `port:delete`… `target` is the `target` field of a
/// provision or power body.
fn action_name(method: &Method, path: &str, target: Option<&str>) -> String {
    let segs: Vec<&str> = path
        .trim_start_matches("/v1/")
        .trim_end_matches('/')
        .split('/')
        .collect();
    let verb = match *method {
        Method::POST => "create",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "update",
    };
    let kind = match segs.first().copied() {
        Some("nodes") => "node",
        Some("ports") => "port",
        Some("inspection_rules") => "inspection_rule",
        Some(other) => other,
        None => "v1",
    };
    match (kind, segs.get(2).copied(), segs.get(3).copied()) {
        ("node", Some("states"), Some(which @ ("provision" | "power"))) => {
            format!("{which}:{}", target.unwrap_or("?"))
        }
        ("node", Some("provision"), None) if *method == Method::DELETE => "provision:abort".into(),
        ("node", Some("maintenance"), None) if *method == Method::DELETE => {
            "maintenance:unset".into()
        }
        ("node", Some("maintenance"), None) => "maintenance:set".into(),
        ("node", Some("states"), Some("console")) => match target {
            Some("true") => "console:enable".into(),
            Some("false") => "console:disable".into(),
            _ => "console:set".into(),
        },
        ("node", Some("console"), Some("ticket")) => "console:ticket".into(),
        _ => format!("{kind}:{verb}"),
    }
}

/// Read what the row needs from the request before the handler consumes it: the node it
/// concerns, and from a provision, power or patch body the target or the paths touched.
async fn describe(
    state: &AppState,
    req: Request,
    method: &Method,
    path: &str,
) -> Result<(Request, Subject), ApiError> {
    let segs: Vec<&str> = path.trim_start_matches("/v1/").split('/').collect();
    let node = match (segs.first().copied(), segs.get(1).copied()) {
        (Some("nodes"), Some(ident)) if !ident.is_empty() => Some(resolve_node(state, ident).await),
        (Some("ports"), Some(uuid)) if !uuid.is_empty() => state
            .conductor
            .store
            .get_port(uuid)
            .await
            .ok()
            .map(|p| p.node_uuid),
        _ => None,
    };
    let wants_body = *method == Method::PATCH
        || (*method == Method::PUT
            && (path.ends_with("/states/provision")
                || path.ends_with("/states/power")
                || path.ends_with("/states/console")));
    if !wants_body {
        let action = action_name(method, path, None);
        return Ok((
            req,
            Subject {
                action,
                node,
                detail: None,
            },
        ));
    }
    let (parts, body) = req.into_parts();
    let max = state.conductor.config.api.max_body_bytes;
    let bytes = match axum::body::to_bytes(body, max).await {
        Ok(b) => b,
        Err(e) => {
            // axum reports the limit only as an error in the chain ("length limit exceeded").
            let mut too_large = false;
            let mut cause: Option<&dyn std::error::Error> = Some(&e);
            while let Some(c) = cause {
                too_large |= c.to_string().contains("length limit");
                cause = c.source();
            }
            return Err(if too_large {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "request body is larger than this server accepts (api.max_body_bytes)",
                )
            } else {
                ApiError::bad_request(format!("cannot read request body: {e}"))
            });
        }
    };
    let parsed: Option<Value> = serde_json::from_slice(&bytes).ok();
    let (action, detail) = if *method == Method::PATCH {
        (
            action_name(method, path, None),
            parsed.as_ref().and_then(patch_paths),
        )
    } else {
        let target = parsed
            .as_ref()
            .and_then(|v| v.get("target"))
            .and_then(Value::as_str)
            .map(clean_word)
            .or_else(|| {
                // The console's body is {"enabled": bool}.
                match parsed.as_ref()?.get("enabled")? {
                    Value::Bool(b) => Some(b.to_string()),
                    _ => None,
                }
            });
        (action_name(method, path, target.as_deref()), None)
    };
    let req = Request::from_parts(parts, Body::from(bytes));
    Ok((
        req,
        Subject {
            action,
            node,
            detail,
        },
    ))
}

/// A verb as the client sent it, fit for the action column: short, printable, never a
/// free-form value.
fn clean_word(s: &str) -> String {
    let w: String = s
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .take(32)
        .collect();
    if w.is_empty() {
        "?".into()
    } else {
        w
    }
}

/// `replace /driver_info/ipmi_password, add /extra/a`: the operations of a JSON patch and
/// their paths, never their values.
fn patch_paths(v: &Value) -> Option<String> {
    let ops = v.as_array()?;
    let listed: Vec<String> = ops
        .iter()
        .map(|op| {
            let name = op.get("op").and_then(Value::as_str).map(clean_word);
            let path = op.get("path").and_then(Value::as_str).unwrap_or("?");
            format!("{} {}", name.as_deref().unwrap_or("?"), path)
        })
        .collect();
    Some(truncate(&format!("patch: {}", listed.join(", "))))
}

/// A node identifier in a path → its UUID, or the identifier as given when it does not
/// resolve (a typo, or a node being created or gone).
async fn resolve_node(state: &AppState, ident: &str) -> String {
    if uuid::Uuid::parse_str(ident).is_ok() {
        return ident.to_string();
    }
    match state.conductor.store.get_node(ident).await {
        Ok(n) => n.uuid,
        Err(_) => ident.to_string(),
    }
}

/// The record a successful POST created: its node and a short description.
fn describe_created(subject: &mut Subject, path: &str, doc: &Value) {
    let text = |k: &str| doc.get(k).and_then(Value::as_str).map(str::to_string);
    match resource(path) {
        // A node created (not a POST under one, such as a console ticket, whose secret
        // must not reach the trail).
        "nodes" if path.trim_end_matches('/') == "/v1/nodes" => {
            subject.node = text("uuid");
            subject.detail = text("name").map(|n| format!("name {n}"));
        }
        "ports" => {
            subject.node = text("node_uuid");
            subject.detail = match (text("uuid"), text("address")) {
                (Some(u), Some(a)) => Some(format!("port {u} address {a}")),
                _ => None,
            };
        }
        "inspection_rules" => subject.detail = text("uuid").map(|u| format!("rule {u}")),
        _ => {}
    }
}

/// Read a small JSON response and rebuild it unchanged.
async fn read_json(resp: Response) -> (Response, Option<Value>) {
    let (parts, body) = resp.into_parts();
    match axum::body::to_bytes(body, RESPONSE_READ_MAX).await {
        Ok(bytes) => {
            let v = serde_json::from_slice(&bytes).ok();
            (Response::from_parts(parts, Body::from(bytes)), v)
        }
        // Too large or failed mid-way: the client gets an error body rather than a torn one.
        Err(_) => (
            axum::response::IntoResponse::into_response(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "failed to read the response",
            )),
            None,
        ),
    }
}

/// The human message of an error answer.
async fn error_message(resp: Response) -> (Response, Option<String>) {
    let (resp, v) = read_json(resp).await;
    let msg = v
        .and_then(|v| serde_json::from_value::<ErrorBody>(v).ok())
        .map(|b| truncate(&b.message()));
    (resp, msg)
}

/// No control characters, at most [`DETAIL_MAX`] characters.
fn truncate(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(DETAIL_MAX)
        .collect();
    if s.chars().count() > DETAIL_MAX {
        out.push('…');
    }
    out
}

/// Write the row; a failure is logged, never turned into a failed request.
async fn append(
    state: &AppState,
    actor: String,
    source: Option<String>,
    method: &Method,
    path: &str,
    subject: Subject,
    status: StatusCode,
) {
    // A 429 comes from the failed-authentication limit: the first refusals of the minute are
    // recorded, the flood after them only logged, so a stranger cannot fill the trail.
    if status == StatusCode::TOO_MANY_REQUESTS {
        return;
    }
    let entry = AuditEntry {
        seq: 0,
        created_at: Utc::now(),
        actor,
        source,
        method: Some(method.to_string()),
        path: Some(truncate(path)),
        node_uuid: subject.node,
        action: subject.action,
        status: Some(status.as_u16()),
        detail: subject.detail,
    };
    if let Err(e) = state.conductor.store.append_audit(&entry).await {
        tracing::warn!(error = %e, method = %method, path, "could not record the request in the audit log");
    }
}

const LIST_PARAMS: &[&str] = &["node", "limit", "marker", "sort_dir"];

/// `GET /v1/audit?node=&limit=&marker=&sort_dir=`: newest first by default.
async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    listing::only_params(params.keys(), LIST_PARAMS)?;
    let mut q = AuditQuery {
        limit: listing::page_limit(&params, state.conductor.config.api.max_limit)?,
        ..Default::default()
    };
    if let Some(m) = params.get("marker") {
        q.marker = Some(m.parse().map_err(|_| {
            ApiError::bad_request(format!(
                "marker={m:?} is not an audit seq (the integer seq of the last row of the previous page)"
            ))
        })?);
    }
    if let Some(d) = params.get("sort_dir") {
        q.sort_dir = listing::sort_dir(d).ok_or_else(|| {
            ApiError::bad_request(format!(
                "sort_dir {d:?} must be asc (oldest first) or desc (newest first)"
            ))
        })?;
    }
    if let Some(n) = params.get("node") {
        // A deleted node's rows stay under its UUID; a name that no longer resolves is
        // matched as recorded.
        q.node_uuid = Some(match state.conductor.store.get_node(n).await {
            Ok(node) => node.uuid,
            Err(StoreError::NotFound { .. }) => n.clone(),
            Err(e) => return Err(e.into()),
        });
    }
    let rows = state.conductor.store.list_audit(&q).await?;
    let mut body = json!({
        "audit": rows.iter().map(entry_json).collect::<Vec<_>>(),
    });
    if rows.len() == q.limit {
        if let Some(last) = rows.last() {
            let next = listing::NextLink::new(&base_url(&headers), "/v1/audit", q.limit)
                .marker(&last.seq.to_string())
                .param_if("node", params.get("node").map(String::as_str))
                .param_if("sort_dir", (q.sort_dir == SortDir::Asc).then_some("asc"))
                .build();
            body["next"] = Value::from(next);
        }
    }
    Ok(Json(body))
}

fn entry_json(e: &AuditEntry) -> Value {
    json!({
        "seq": e.seq,
        "created_at": e.created_at.to_rfc3339_opts(SecondsFormat::Millis, true),
        "actor": e.actor,
        "source": e.source,
        "method": e.method,
        "path": e.path,
        "node_uuid": e.node_uuid,
        "action": e.action,
        "status": e.status,
        "detail": e.detail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_are_named_from_method_and_path() {
        let p = |m: Method, path: &str, t: Option<&str>| action_name(&m, path, t);
        assert_eq!(p(Method::POST, "/v1/nodes", None), "node:create");
        assert_eq!(p(Method::POST, "/v1/nodes/", None), "node:create");
        assert_eq!(p(Method::PATCH, "/v1/nodes/n1", None), "node:patch");
        assert_eq!(p(Method::DELETE, "/v1/nodes/n1", None), "node:delete");
        assert_eq!(
            p(
                Method::PUT,
                "/v1/nodes/n1/states/provision",
                Some("provide")
            ),
            "provision:provide"
        );
        assert_eq!(
            p(Method::PUT, "/v1/nodes/n1/states/power", Some("power off")),
            "power:power off"
        );
        assert_eq!(
            p(Method::PUT, "/v1/nodes/n1/maintenance", None),
            "maintenance:set"
        );
        assert_eq!(
            p(Method::DELETE, "/v1/nodes/n1/maintenance", None),
            "maintenance:unset"
        );
        assert_eq!(p(Method::POST, "/v1/ports", None), "port:create");
        assert_eq!(
            p(Method::DELETE, "/v1/inspection_rules/x", None),
            "inspection_rule:delete"
        );
    }

    #[test]
    fn patch_detail_names_paths_never_values() {
        let body: Value = serde_json::from_str(
            r#"[{"op":"replace","path":"/driver_info/ipmi_password","value":"hunter2"},{"op":"add","path":"/extra/a","value":1}]"#,
        )
        .expect("json");
        let d = patch_paths(&body).expect("detail");
        assert_eq!(d, "patch: replace /driver_info/ipmi_password, add /extra/a");
        assert!(!d.contains("hunter2"));
    }

    #[test]
    fn targets_are_cut_to_a_word() {
        assert_eq!(clean_word("power off"), "power off");
        assert_eq!(clean_word("x\n\u{7}y"), "xy");
        assert_eq!(clean_word(""), "?");
        assert_eq!(clean_word(&"a".repeat(100)).len(), 32);
    }

    #[test]
    fn credentials_are_described_not_quoted() {
        let mut h = HeaderMap::new();
        assert_eq!(credential_kind(&h), "no credentials");
        h.insert("authorization", "Basic dXNlcjpwdw==".parse().expect("hv"));
        assert_eq!(credential_kind(&h), "bad basic credentials");
        h.insert("authorization", "Bearer s3cret".parse().expect("hv"));
        assert_eq!(credential_kind(&h), "bad or unknown token");
    }

    #[test]
    fn query_values_are_escaped() {
        assert_eq!(listing::query_escape("n 1&x"), "n%201%26x");
    }
}
