//! Admin authentication and roles: a bearer token (`Authorization: Bearer` or Keystone's
//! `X-Auth-Token`) or HTTP basic credentials, checked against hashes in the config, or the web
//! UI's session cookie (with its CSRF header on changes; [`super::sessions`]). Each
//! credential carries a role (admin, operator, reader, metrics); a request the role does not cover is
//! a 403 naming the role and what it lacks. For non-admin roles `driver_info` is removed from
//! every node document on the way out — one filter here rather than a rule in each handler.

use super::{ApiError, AppState};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use rivet_model::config::Role;
use rivet_support::credentials::verify_secret;
use serde_json::Value;

/// Who made the request.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Credential name.
    pub name: String,
    /// Its role.
    pub role: Role,
}

/// Credentials that verified, remembered so a client pays argon2's cost once, not on every
/// request: the SHA-256 of (stored hash, presented secret). Only successes are kept (a flood
/// of wrong guesses cannot fill it, and the failed-auth limit slows those); bounded, and
/// emptied when full.
static VERIFIED: std::sync::Mutex<Option<std::collections::HashSet<[u8; 32]>>> =
    std::sync::Mutex::new(None);
const VERIFIED_MAX: usize = 4096;
/// Verifications that ran the hash (tests check the cache spares them).
#[cfg(test)]
static SLOW_CHECKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

pub(crate) fn verified(secret: &str, hash: &str) -> bool {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(hash.as_bytes());
    h.update([0u8]);
    h.update(secret.as_bytes());
    let key: [u8; 32] = h.finalize().into();
    let seen = |k: &[u8; 32]| {
        let cache = VERIFIED.lock().unwrap_or_else(|p| p.into_inner());
        cache.as_ref().is_some_and(|c| c.contains(k))
    };
    if seen(&key) {
        return true;
    }
    #[cfg(test)]
    SLOW_CHECKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if !verify_secret(secret, hash) {
        return false;
    }
    let mut cache = VERIFIED.lock().unwrap_or_else(|p| p.into_inner());
    let set = cache.get_or_insert_with(Default::default);
    if set.len() >= VERIFIED_MAX {
        set.clear();
    }
    set.insert(key);
    true
}

/// The caller a request's credentials name, if any (also used by the audit trail).
pub(crate) fn check(state: &AppState, headers: &HeaderMap) -> Option<Caller> {
    let auth = &state.conductor.config.auth;
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let token = header("authorization")
        .and_then(|v| v.strip_prefix("Bearer ").map(str::trim))
        .or_else(|| header("x-auth-token").map(str::trim));
    if let Some(token) = token {
        return auth
            .tokens
            .iter()
            .find(|t| verified(token, &t.hash))
            .map(|t| Caller {
                name: t.name.clone(),
                role: t.role,
            });
    }
    let basic = header("authorization").and_then(|v| v.strip_prefix("Basic "))?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(basic.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    auth.users
        .iter()
        .find(|u| u.name == user && verified(password, &u.hash))
        .map(|u| Caller {
            name: u.name.clone(),
            role: u.role,
        })
}

/// What a role lacks for a request, if anything.
pub fn denied(role: Role, method: &Method, path: &str) -> Option<&'static str> {
    let read = method == Method::GET || method == Method::HEAD;
    match role {
        Role::Admin => None,
        Role::Metrics if read && path == "/metrics" => None,
        Role::Metrics => Some("anything but GET /metrics (it may only read metrics)"),
        _ if path == "/metrics" => Some("reading metrics (needs the metrics or admin role)"),
        _ if path == "/v1/audit" || path.starts_with("/v1/audit/") => {
            Some("reading the audit log (needs admin)")
        }
        _ if path == "/v1/image_cache" || path.starts_with("/v1/image_cache/") => {
            Some("the image cache (needs admin)")
        }
        _ if read => None,
        // A ticket to watch a console is not a change: readers watch too.
        _ if method == Method::POST && path.ends_with("/console/ticket") => None,
        Role::Reader => Some("any change (it is read-only)"),
        Role::Operator => {
            let verb = (method == Method::PUT
                && (path.ends_with("/states/provision")
                    || path.ends_with("/states/power")
                    || path.ends_with("/states/console")))
                || (method == Method::DELETE && path.ends_with("/provision"));
            let maintenance = path.ends_with("/maintenance");
            if verb || maintenance {
                None
            } else if path.starts_with("/v1/inspection_rules") {
                Some("changing inspection rules (needs admin)")
            } else if method == Method::POST {
                Some("creating nodes or ports (needs admin)")
            } else if method == Method::DELETE {
                Some("deleting nodes or ports (needs admin)")
            } else {
                Some("changing node or port records (needs admin)")
            }
        }
    }
}

/// Remove `driver_info` from node documents (a node, or a `nodes` list).
fn strip_driver_info(v: &mut Value) {
    if let Some(obj) = v.as_object_mut() {
        obj.remove("driver_info");
        if let Some(Value::Array(nodes)) = obj.get_mut("nodes") {
            for n in nodes {
                if let Some(o) = n.as_object_mut() {
                    o.remove("driver_info");
                }
            }
        }
    }
}

/// Whether a request carries API credentials (a token or basic); those take precedence over
/// a session cookie, so a wrong token is never rescued by a cookie the browser also sent.
fn has_api_credentials(headers: &HeaderMap) -> bool {
    headers.contains_key(axum::http::header::AUTHORIZATION) || headers.contains_key("x-auth-token")
}

/// The caller of a request authenticated by the web UI's session cookie: `Ok(None)` without a
/// live session; a 403 for a change without the session's CSRF header.
fn session_caller(state: &AppState, req: &Request) -> Result<Option<Caller>, ApiError> {
    use super::sessions;
    let Some(id) = sessions::cookie_value(req.headers()) else {
        return Ok(None);
    };
    let Some(user) = state.sessions.get(id) else {
        return Ok(None);
    };
    let safe = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    let csrf = req
        .headers()
        .get(sessions::CSRF_HEADER)
        .and_then(|v| v.to_str().ok());
    if !safe && !csrf.is_some_and(|c| sessions::same_secret(c, &user.csrf)) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "a change authenticated by the web UI's session cookie needs the session's {} header \
                 (the web UI sends it; another site's page cannot)",
                sessions::CSRF_HEADER
            ),
        ));
    }
    Ok(Some(Caller {
        name: user.name,
        role: user.role,
    }))
}

/// A 429 when the request's source has failed to authenticate too often (a router driven
/// in-process has no peer address and is not limited).
fn too_many_failures(state: &AppState, req: &Request) -> Option<Response> {
    use super::ratelimit::{Decision, SourceKey};
    let ip = req
        .extensions()
        .get::<rivet_support::http::PeerAddr>()?
        .0
        .ip();
    let limiter = &state.admin_auth_failures;
    let Decision::Limited { retry_after, warn } = limiter.take(ip) else {
        return None;
    };
    let per_minute = limiter.per_minute();
    if warn {
        tracing::warn!(source = %SourceKey::of(ip), per_minute,
            "failed admin authentications from this source are over the limit; answering 429 \
             without an audit row each (logged once a minute per source)");
    }
    let secs = retry_after.as_secs().max(1);
    let mut resp = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        format!(
            "too many failed authentications from this address: the limit is {per_minute} per minute \
             ([api] failed_auth_per_minute); retry after {secs} s"
        ),
    )
    .into_response();
    resp.headers_mut().insert(
        axum::http::header::RETRY_AFTER,
        axum::http::HeaderValue::from(secs),
    );
    Some(resp)
}

/// Middleware on admin routes.
pub async fn require_admin(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    let caller = if state.conductor.config.no_auth {
        Caller {
            name: "anonymous".into(),
            role: Role::Admin,
        }
    } else {
        let found = if has_api_credentials(req.headers()) {
            check(&state, req.headers())
        } else {
            match session_caller(&state, &req) {
                Ok(c) => c,
                Err(refused) => return refused.into_response(),
            }
        };
        match found {
            Some(c) => c,
            None => {
                if let Some(refused) = too_many_failures(&state, &req) {
                    return refused;
                }
                let mut resp = ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "authentication required: send Authorization: Bearer TOKEN (or X-Auth-Token), or HTTP basic credentials from rivetd's [auth] config",
                )
                .into_response();
                resp.headers_mut().insert(
                    axum::http::header::WWW_AUTHENTICATE,
                    axum::http::HeaderValue::from_static(
                        "Bearer realm=\"rivet\", Basic realm=\"rivet\"",
                    ),
                );
                return resp;
            }
        }
    };
    let path = req.uri().path().to_string();
    if let Some(lacks) = denied(caller.role, req.method(), &path) {
        let mut resp = ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "{} (role {}) may not {} {}: the role does not allow {lacks}",
                caller.name,
                caller.role.as_str(),
                req.method(),
                path
            ),
        )
        .into_response();
        // The audit trail names who was refused.
        resp.extensions_mut().insert(caller);
        return resp;
    }
    let role = caller.role;
    req.extensions_mut().insert(caller.clone());
    let mut resp = next.run(req).await;
    // The audit trail (an outer layer) names the caller from the response.
    resp.extensions_mut().insert(caller);
    if role == Role::Admin || !path.starts_with("/v1/nodes") {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "failed to read response")
            .into_response();
    };
    let body = match serde_json::from_slice::<Value>(&bytes) {
        Ok(mut v) => {
            strip_driver_info(&mut v);
            Body::from(v.to_string())
        }
        Err(_) => Body::from(bytes),
    };
    let mut parts = parts;
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(parts, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argon2_verifications_are_cached_only_when_they_succeed() {
        let hash = rivet_support::credentials::hash_secret("tok-cache-test").expect("hash");
        let cached = || {
            VERIFIED
                .lock()
                .map(|c| c.as_ref().map_or(0, |s| s.len()))
                .unwrap_or(0)
        };
        let before = cached();
        assert!(!verified("wrong", &hash));
        assert_eq!(cached(), before, "a failure is not remembered");
        assert!(verified("tok-cache-test", &hash));
        assert!(cached() > before || before >= VERIFIED_MAX - 1);
        // The second check is a lookup, not another argon2 run.
        let slow = SLOW_CHECKS.load(std::sync::atomic::Ordering::Relaxed);
        assert!(verified("tok-cache-test", &hash));
        assert_eq!(SLOW_CHECKS.load(std::sync::atomic::Ordering::Relaxed), slow);
        assert!(!verified(
            "tok-cache-test",
            "$argon2id$v=19$m=19456,t=2,p=1$bm9wZQ$bm9wZQ"
        ));
    }

    #[test]
    fn role_matrix() {
        use Role::*;
        let p = "/v1/nodes/n1/states/provision";
        assert_eq!(denied(Admin, &Method::DELETE, "/v1/nodes/n1"), None);
        assert_eq!(denied(Operator, &Method::PUT, p), None);
        assert_eq!(
            denied(Operator, &Method::PUT, "/v1/nodes/n1/states/power"),
            None
        );
        assert_eq!(
            denied(Operator, &Method::PUT, "/v1/nodes/n1/maintenance"),
            None
        );
        assert_eq!(denied(Operator, &Method::GET, "/v1/nodes"), None);
        assert!(denied(Operator, &Method::POST, "/v1/nodes").is_some());
        assert!(denied(Operator, &Method::DELETE, "/v1/nodes/n1").is_some());
        assert!(denied(Operator, &Method::PATCH, "/v1/nodes/n1").is_some());
        assert!(denied(Operator, &Method::POST, "/v1/inspection_rules").is_some());
        assert_eq!(denied(Reader, &Method::GET, "/v1/nodes/n1"), None);
        assert!(denied(Reader, &Method::PUT, p).is_some());
        assert_eq!(denied(Admin, &Method::GET, "/v1/audit"), None);
        assert!(denied(Operator, &Method::GET, "/v1/audit").is_some());
        assert!(denied(Reader, &Method::GET, "/v1/audit").is_some());
        assert_eq!(denied(Metrics, &Method::GET, "/metrics"), None);
        assert_eq!(denied(Admin, &Method::GET, "/metrics"), None);
        assert!(denied(Metrics, &Method::GET, "/v1/nodes").is_some());
        assert!(denied(Metrics, &Method::POST, "/metrics").is_some());
        assert!(denied(Reader, &Method::GET, "/metrics").is_some());
    }
}
