//! The HTML pages: one shell for the fleet and for a node (the ES modules pick the view from
//! the path). Not logged in: a redirect to the log-in form.

use super::{assets, viewer};
use crate::api::AppState;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Redirect, Response};

fn shell(state: &AppState, headers: &HeaderMap) -> Response {
    match viewer::of(state, headers) {
        Some(_) => assets::html(assets::APP_HTML),
        None => Redirect::to("/ui/login").into_response(),
    }
}

/// `GET /ui/`: the fleet.
pub async fn fleet(State(state): State<AppState>, headers: HeaderMap) -> Response {
    shell(&state, &headers)
}

/// `GET /ui/nodes/{ident}`: one node (the identifier is read by the page, never echoed into
/// the HTML).
pub async fn node(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let mut resp = shell(&state, &headers);
    resp.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(super::CSP_NODE_PAGE),
    );
    resp
}
