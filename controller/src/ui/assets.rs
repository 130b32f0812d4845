//! The UI's static files, compiled into rivetd (no build step, nothing fetched at run time):
//! `controller/web/`. Each is gzipped once, on its first request, and served so to browsers
//! that accept it (every one does): xterm.js alone is 477 KiB, 120 KiB gzipped.

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use std::io::Write as _;
use std::sync::LazyLock;

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
    ("charts.js", JS, include_str!("../../web/charts.js")),
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

/// Each file of [`FILES`] gzipped (best compression: done once per process).
static GZIPPED: LazyLock<Vec<Option<Vec<u8>>>> = LazyLock::new(|| {
    FILES
        .iter()
        .map(|(_, _, body)| {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            gz.write_all(body.as_bytes()).ok()?;
            gz.finish().ok()
        })
        .collect()
});

/// `GET /ui/assets/{file}`.
pub async fn serve(Path(file): Path<String>, headers: HeaderMap) -> Response {
    let Some(i) = FILES.iter().position(|(name, _, _)| *name == file) else {
        return (StatusCode::NOT_FOUND, "no such UI file").into_response();
    };
    let (_, ty, body) = FILES[i];
    let gzipped = super::compress::accepts_gzip(&headers)
        .then(|| GZIPPED.get(i).and_then(Option::as_ref))
        .flatten();
    let mut resp = match gzipped {
        Some(gz) => (
            [
                (header::CONTENT_TYPE, ty),
                (header::CONTENT_ENCODING, "gzip"),
            ],
            gz.clone(),
        )
            .into_response(),
        None => ([(header::CONTENT_TYPE, ty)], body).into_response(),
    };
    let h = resp.headers_mut();
    h.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    // Revalidated each time: a rivetd upgrade must not leave old modules in a browser.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzipped_files_decode_to_the_files() {
        let i = FILES
            .iter()
            .position(|f| f.0 == "xterm.js")
            .expect("xterm.js");
        let gz = GZIPPED[i].as_ref().expect("gzipped");
        let mut out = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&gz[..]), &mut out)
            .expect("gunzip");
        assert_eq!(out, FILES[i].2);
        assert!(gz.len() * 3 < out.len(), "{} of {}", gz.len(), out.len());
    }
}
