//! The UI's static files, compiled into rivetd (no build step, nothing fetched at run time):
//! `controller/web/`.

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// The page shell of the fleet and node views.
pub const APP_HTML: &str = include_str!("../../web/app.html");

/// (name, content type, body) of each file under `/ui/assets/`.
const FILES: &[(&str, &str, &str)] = &[
    ("app.js", JS, include_str!("../../web/app.js")),
    ("api.js", JS, include_str!("../../web/api.js")),
    ("dom.js", JS, include_str!("../../web/dom.js")),
    ("fleet.js", JS, include_str!("../../web/fleet.js")),
    ("node.js", JS, include_str!("../../web/node.js")),
    ("verbs.js", JS, include_str!("../../web/verbs.js")),
    ("console.js", JS, include_str!("../../web/console.js")),
    // Vendored, unchanged (web/vendor/xterm/README.md): loaded by console.js only.
    (
        "xterm.js",
        JS,
        include_str!("../../web/vendor/xterm/lib/xterm.js"),
    ),
    (
        "xterm.css",
        "text/css; charset=utf-8",
        include_str!("../../web/vendor/xterm/css/xterm.css"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../../web/style.css"),
    ),
];
const JS: &str = "text/javascript; charset=utf-8";

/// An HTML answer.
pub fn html(body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

/// `GET /ui/assets/{file}`.
pub async fn serve(Path(file): Path<String>) -> Response {
    match FILES.iter().find(|(name, _, _)| *name == file) {
        Some((_, ty, body)) => {
            let mut resp = ([(header::CONTENT_TYPE, *ty)], *body).into_response();
            // Revalidated each time: a rivetd upgrade must not leave old modules in a browser.
            resp.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            resp
        }
        None => (StatusCode::NOT_FOUND, "no such UI file").into_response(),
    }
}
