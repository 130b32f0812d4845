//! Log-in, log-out and "who am I" for the web UI. The log-in form checks `[auth] users`
//! (the same argon2 hashes as the API's basic credentials) and starts a session
//! (`api::sessions`); failed attempts count against the API's own failed-authentication limit
//! (`[api] failed_auth_per_minute`), and a source over it is refused before its password is
//! even checked. Log-ins (accepted and refused, as the API's refusals are: not the flood over
//! the limit) and log-outs are rows of the audit trail (`ui:login`, `ui:logout`). Nothing
//! secret ever goes into a URL, the log or the trail.

use super::viewer;
use crate::api::{auth, sessions, AppState};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form, Json};
use rivet_model::config::Role;
use rivet_support::http::PeerAddr;
use serde::Deserialize;
use serde_json::json;

/// The log-in form's fields.
#[derive(Deserialize)]
pub struct LoginForm {
    username: String,
    password: String,
}

/// The log-in page, with `error` (fixed text, never user input) above the form.
fn page(status: StatusCode, error: Option<&str>) -> Response {
    let error = error
        .map(|e| format!("<p class=\"error\" role=\"alert\" id=\"login-error\">{e}</p>"))
        .unwrap_or_default();
    let body = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Rivet — log in</title>\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <link rel=\"stylesheet\" href=\"/ui/assets/style.css\"></head>\
         <body class=\"login\"><main><h1>Rivet</h1>{error}\
         <form method=\"post\" action=\"/ui/login\">\
         <label>User <input name=\"username\" autocomplete=\"username\" required autofocus></label>\
         <label>Password <input name=\"password\" type=\"password\" autocomplete=\"current-password\" required></label>\
         <button type=\"submit\">Log in</button></form></main></body></html>\n"
    );
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        body,
    )
        .into_response()
}

/// Append an audit row for a log-in or log-out; a failure is logged, never shown to the user.
async fn audit(
    state: &AppState,
    actor: String,
    source: Option<std::net::IpAddr>,
    action: &str,
    status: StatusCode,
) {
    let entry = rivet_store::AuditEntry {
        seq: 0,
        created_at: chrono::Utc::now(),
        actor,
        source: source.map(|ip| ip.to_string()),
        method: Some("POST".into()),
        path: Some(format!("/{}", action.replace(':', "/"))),
        node_uuid: None,
        action: action.into(),
        status: Some(status.as_u16()),
        detail: None,
    };
    if let Err(e) = state.conductor.store.append_audit(&entry).await {
        tracing::warn!(error = %e, action, "could not record a web UI log-in or log-out in the audit log");
    }
}

/// Whether a browser's `Origin` (when it sends one) is this server: a log-in posted from
/// another site's page is refused (it would log the victim into the attacker's account).
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, rest)| rest);
    matches!((origin_host, host), (Some(o), Some(h)) if o.eq_ignore_ascii_case(h))
}

fn secure(state: &AppState) -> bool {
    state.conductor.config.tls_cert.is_some()
}

/// `GET /ui/login`.
pub async fn form(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if state.conductor.config.no_auth || viewer::of(&state, &headers).is_some() {
        return Redirect::to("/ui/").into_response();
    }
    page(StatusCode::OK, None)
}

/// `POST /ui/login`.
pub async fn submit(
    State(state): State<AppState>,
    peer: Option<Extension<PeerAddr>>,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    if state.conductor.config.no_auth {
        return Redirect::to("/ui/").into_response();
    }
    if !same_origin(&headers) {
        return page(
            StatusCode::FORBIDDEN,
            Some("This log-in came from another site's page and was refused."),
        );
    }
    let ip = peer.map(|p| p.0 .0.ip());
    let limiter = &state.admin_auth_failures;
    if let Some(wait) = ip.and_then(|ip| limiter.exhausted(ip)) {
        let mut resp = page(
            StatusCode::TOO_MANY_REQUESTS,
            Some("Too many failed log-ins from this address; wait a minute and try again."),
        );
        resp.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(wait.as_secs().max(1)),
        );
        return resp;
    }
    let user = state
        .conductor
        .config
        .auth
        .users
        .iter()
        .find(|u| u.name == f.username && auth::verified(&f.password, &u.hash));
    let Some(user) = user else {
        if let Some(ip) = ip {
            // Counted; the next attempt over the limit is refused above.
            let _ = limiter.take(ip);
        }
        let known = state
            .conductor
            .config
            .auth
            .users
            .iter()
            .any(|u| u.name == f.username);
        // The name only when it is a configured user: a password typed into the user field
        // must not land in the log.
        tracing::warn!(
            source = ?ip,
            user = if known { f.username.as_str() } else { "(unknown)" },
            "web UI log-in refused: wrong user name or password"
        );
        let who = if known {
            f.username.as_str()
        } else {
            "(unknown user)"
        };
        audit(
            &state,
            format!("unauthenticated (web UI log-in as {who})"),
            ip,
            "ui:login",
            StatusCode::UNAUTHORIZED,
        )
        .await;
        return page(
            StatusCode::UNAUTHORIZED,
            Some("Wrong user name or password."),
        );
    };
    if user.role == Role::Metrics {
        return page(
            StatusCode::FORBIDDEN,
            Some("This user has the metrics role: it may only read /metrics, not use the web UI."),
        );
    }
    let id = state.sessions.create(&user.name, user.role);
    tracing::info!(source = ?ip, user = %user.name, role = user.role.as_str(), "web UI log-in");
    audit(
        &state,
        format!("{} (role {})", user.name, user.role.as_str()),
        ip,
        "ui:login",
        StatusCode::SEE_OTHER,
    )
    .await;
    let mut resp = Redirect::to("/ui/").into_response();
    if let Ok(v) = HeaderValue::from_str(&sessions::set_cookie(&id, secure(&state))) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp
}

/// `POST /ui/logout` (with the CSRF header, like every cookie-authenticated change): ends
/// the session here, so the cookie is worthless even if the browser kept it.
pub async fn logout(State(state): State<AppState>, method: Method, headers: HeaderMap) -> Response {
    debug_assert_eq!(method, Method::POST);
    if let Some(id) = sessions::cookie_value(&headers) {
        if let Some(user) = state.sessions.get(id) {
            let csrf = headers
                .get(sessions::CSRF_HEADER)
                .and_then(|v| v.to_str().ok());
            if !csrf.is_some_and(|c| sessions::same_secret(c, &user.csrf)) {
                return (
                    StatusCode::FORBIDDEN,
                    Json(json!({"error": format!("log-out needs the session's {} header", sessions::CSRF_HEADER)})),
                )
                    .into_response();
            }
            state.sessions.remove(id);
            tracing::info!(user = %user.name, "web UI log-out");
            audit(
                &state,
                format!("{} (role {})", user.name, user.role.as_str()),
                None,
                "ui:logout",
                StatusCode::NO_CONTENT,
            )
            .await;
        }
    }
    let mut resp = StatusCode::NO_CONTENT.into_response();
    if let Ok(v) = HeaderValue::from_str(&sessions::clear_cookie(secure(&state))) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp
}

/// `GET /ui/whoami`: the viewer, the CSRF value its changes must carry, and what its role
/// may do (from the API's own role rules, so the UI never offers a control the API refuses).
pub async fn whoami(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let Some(v) = viewer::of(&state, &headers) else {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": "not logged in", "login": "/ui/login"})),
        )
            .into_response();
    };
    let may = |method: Method, path: &str| auth::denied(v.role, &method, path).is_none();
    Json(json!({
        "user": v.name,
        "role": v.role.as_str(),
        "auth": !state.conductor.config.no_auth,
        "csrf": v.csrf,
        "csrf_header": sessions::CSRF_HEADER,
        "may": {
            "provision": may(Method::PUT, "/v1/nodes/x/states/provision"),
            "power": may(Method::PUT, "/v1/nodes/x/states/power"),
            "maintenance": may(Method::PUT, "/v1/nodes/x/maintenance"),
            "update": may(Method::PATCH, "/v1/nodes/x"),
        },
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_must_match_the_host_when_sent() {
        let mut h = HeaderMap::new();
        assert!(same_origin(&h));
        h.insert(header::HOST, HeaderValue::from_static("rivet:6385"));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://rivet:6385"),
        );
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://evil.example"),
        );
        assert!(!same_origin(&h));
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(!same_origin(&h));
    }
}
