//! Admin authentication: a bearer token (`Authorization: Bearer` or Keystone's
//! `X-Auth-Token`) or HTTP basic credentials, checked against hashes in the config.

use super::{ApiError, AppState};
use crate::config::verify_secret;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;

/// Who made the request.
#[derive(Debug, Clone)]
pub struct Caller(pub String);

fn check(state: &AppState, headers: &HeaderMap) -> Option<String> {
    let auth = &state.conductor.config.auth;
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let token = header("authorization")
        .and_then(|v| v.strip_prefix("Bearer ").map(str::trim))
        .or_else(|| header("x-auth-token").map(str::trim));
    if let Some(token) = token {
        return auth
            .tokens
            .iter()
            .find(|t| verify_secret(token, &t.hash))
            .map(|t| t.name.clone());
    }
    let basic = header("authorization").and_then(|v| v.strip_prefix("Basic "))?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(basic.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    auth.users
        .iter()
        .find(|u| u.name == user && verify_secret(password, &u.hash))
        .map(|u| u.name.clone())
}

/// Middleware on admin routes.
pub async fn require_admin(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    if state.conductor.config.no_auth {
        req.extensions_mut().insert(Caller("anonymous".into()));
        return next.run(req).await;
    }
    match check(&state, req.headers()) {
        Some(who) => {
            req.extensions_mut().insert(Caller(who));
            next.run(req).await
        }
        None => {
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
            resp
        }
    }
}
