//! gzip for the JSON rivetd's own pages read: the fleet page lists every node through `/v1`
//! (10,000 nodes are ~5 MiB of JSON, ~10× less gzipped). Only a browser's same-origin
//! `fetch` is compressed (`Sec-Fetch-Site: same-origin`, which browsers send and scripts on
//! other sites cannot forge): the API's other clients get what they always got, byte for byte.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::io::Write as _;

/// Smaller bodies are sent as they are: gzip's header and a round trip cost more than it saves.
const MIN_BYTES: usize = 4096;
/// Larger ones are sent as they are too (nothing the API answers comes near).
const MAX_BYTES: usize = 256 << 20;

/// Whether `Accept-Encoding` takes gzip (and does not refuse it with `q=0`).
pub fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';').map(str::trim);
            let name = parts.next().unwrap_or_default();
            let refused = parts.any(|p| p.replace(' ', "") == "q=0");
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
        })
}

fn from_our_pages(req: &Request) -> bool {
    req.method() == Method::GET
        && req.uri().path().starts_with("/v1/")
        && req
            .headers()
            .get("sec-fetch-site")
            .is_some_and(|v| v.as_bytes() == b"same-origin")
        && accepts_gzip(req.headers())
}

/// The middleware (on the whole router; a no-op for every other request).
pub async fn for_pages(req: Request, next: Next) -> Response {
    if !from_our_pages(&req) {
        return next.run(req).await;
    }
    let resp = next.run(req).await;
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if resp.status() != StatusCode::OK
        || !json
        || resp.headers().contains_key(header::CONTENT_ENCODING)
    {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_BYTES).await {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(error = %e, "could not read an API answer to compress it");
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
    };
    parts
        .headers
        .append(header::VARY, HeaderValue::from_static("accept-encoding"));
    if bytes.len() < MIN_BYTES {
        return Response::from_parts(parts, Body::from(bytes));
    }
    // The fast level: ~3× quicker than the default and nearly as small on JSON.
    let mut gz = flate2::write::GzEncoder::new(
        Vec::with_capacity(bytes.len() / 8),
        flate2::Compression::fast(),
    );
    let packed = gz.write_all(&bytes).and_then(|()| gz.finish());
    match packed {
        Ok(packed) => {
            parts.headers.remove(header::CONTENT_LENGTH);
            parts
                .headers
                .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            Response::from_parts(parts, Body::from(packed))
        }
        Err(_) => Response::from_parts(parts, Body::from(bytes)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_only_when_accepted() {
        let mut h = HeaderMap::new();
        assert!(!accepts_gzip(&h));
        h.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("gzip, deflate, br, zstd"),
        );
        assert!(accepts_gzip(&h));
        h.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("br, gzip;q=0"),
        );
        assert!(!accepts_gzip(&h));
    }
}
