//! The web UI at `/ui/`, on the API's own listener (and so behind the same TLS): a fleet page,
//! a page per node, log-in and log-out. The pages are plain ES modules compiled into the
//! binary ([`assets`]); every datum they show comes from the `/v1` API, called by the browser
//! with the session cookie (checked by the API's auth layer, `api::sessions`). What the UI
//! adds on the server is only what the API cannot say: who is logged in ([`login`]), live node
//! changes as server-sent events ([`events`]), the state machine's verbs
//! ([`state_machine`]) and the charts' figures from rivetd's own metrics ([`charts`]).
//!
//! With `--no-auth` the API is open on loopback, and so is the UI: no log-in, the viewer is
//! an anonymous admin, as for the API.

mod assets;
mod charts;
pub mod compress;
mod events;
mod login;
mod pages;
mod state_machine;
mod viewer;

use crate::api::AppState;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{header, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::{Redirect, Response};
use axum::routing::{get, post};
use axum::Router;

/// The largest request body a UI route reads (a log-in form).
const MAX_BODY: usize = 16 * 1024;

/// The UI's routes, with `state`; merged beside the API's router by `server::build`.
pub fn routes(state: AppState) -> Router {
    Router::new()
        .route("/ui", get(|| async { Redirect::to("/ui/") }))
        .route("/ui/", get(pages::fleet))
        .route("/ui/nodes/{ident}", get(pages::node))
        .route("/ui/charts", get(pages::fleet))
        .route("/ui/login", get(login::form).post(login::submit))
        .route("/ui/logout", post(login::logout))
        .route("/ui/whoami", get(login::whoami))
        .route("/ui/events", get(events::stream))
        .route("/ui/state-machine.json", get(state_machine::serve))
        .route("/ui/charts.json", get(charts::serve))
        .route("/ui/assets/{file}", get(assets::serve))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(middleware::from_fn(security_headers))
        // Counted and timed like the API's requests, by route template (`/ui/nodes/{ident}`).
        .layer(middleware::from_fn(rivet_support::metrics::http))
        .with_state(state)
}

/// The UI's content security policy.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// The node page's: as [`CSP`], but xterm.js (the console panel) sizes and colours its rows
/// with `<style>` elements it creates, which `style-src 'self'` blocks. Styles only: scripts
/// stay `'self'`, so injected markup still cannot run anything.
const CSP_NODE_PAGE: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
                   img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; \
                   form-action 'self'";

/// Headers every UI answer carries: scripts and styles only from rivetd itself (no inline
/// script, so injected markup cannot run), never framed, no referrer leaving the site
/// (`same-origin`, not `no-referrer`: under that a browser posts the log-in form with
/// `Origin: null`, which the log-in's origin check must refuse), and
/// nothing cached that a later user of the browser could read back.
async fn security_headers(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    // A page that needs more (the node page) sets its own.
    h.entry(header::CONTENT_SECURITY_POLICY)
        .or_insert(HeaderValue::from_static(CSP));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    resp
}
