//! The image cache over HTTP: `GET /image-cache/{name}` serves a cached image to the agent
//! of a deploying node (Basic auth: the node's UUID and the download token its `write_image`
//! URL carries; `Range` requests resume a cut download), and `GET`/`DELETE /v1/image_cache`
//! (admin) list and purge the cache.
//!
//! Downloads are not throttled by the API's limits: the lean server's admission turn ends
//! when the handler answers, before the body streams, and the route is outside `/v1` (no
//! audit row, whose path would not carry the token anyway: it travels in a header). Tokens
//! are never logged.

use super::{file_body, ApiError, ApiResult, AppState};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use base64::Engine as _;
use futures_util::StreamExt;
use rivet_conductor::ImageRefusal;
use serde_json::{json, Value};
use std::io::{Seek, SeekFrom};

/// Bytes read from the cached file per body chunk.
const CHUNK: usize = 1 << 20;

pub fn admin_routes() -> Router<AppState> {
    Router::new().route("/v1/image_cache", get(list).delete(purge))
}

pub fn download_routes() -> Router<AppState> {
    Router::new().route("/image-cache/{name}", get(download))
}

/// The cache with its index read from disk (the first call after a start reads it).
async fn loaded(state: &AppState) -> ApiResult<&rivet_conductor::image_cache::ImageCache> {
    let cache = &state.conductor.image_cache;
    cache
        .load()
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e))?;
    Ok(cache)
}

async fn list(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    let cache = loaded(&state).await?;
    let (images, stats) = cache.list();
    let c = &state.conductor.config.image_cache;
    Ok(Json(json!({
        "dir": cache.dir().display().to_string(),
        "max_bytes": c.max_bytes,
        "ttl_s": c.ttl_s,
        "bytes": images.iter().map(|i| i.bytes).sum::<u64>(),
        "images": images,
        "stats": stats,
    })))
}

async fn purge(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    let cache = loaded(&state).await?;
    let (removed, kept) = cache.purge();
    tracing::info!(
        removed = removed.len(),
        kept = kept.len(),
        "image cache purged"
    );
    Ok(Json(json!({"removed": removed, "kept_in_use": kept})))
}

/// The node and token of a Basic `Authorization` header.
fn basic(headers: &HeaderMap) -> Option<(String, String)> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let b64 = v
        .strip_prefix("Basic ")
        .or_else(|| v.strip_prefix("basic "))?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (user, pass) = text.split_once(':')?;
    Some((user.to_string(), pass.to_string()))
}

/// A single `bytes=` range of a `len`-byte file: `Ok(None)` for none (or several: the
/// whole file is sent, as RFC 9110 allows), `Err(())` when unsatisfiable.
fn range(headers: &HeaderMap, len: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(v) = headers.get(header::RANGE).and_then(|v| v.to_str().ok()) else {
        return Ok(None);
    };
    let Some(spec) = v.trim().strip_prefix("bytes=") else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((a, b)) = spec.split_once('-') else {
        return Ok(None);
    };
    let (a, b) = (a.trim(), b.trim());
    let (start, end) = if a.is_empty() {
        // The last b bytes.
        let n: u64 = b.parse().map_err(|_| ())?;
        if n == 0 {
            return Err(());
        }
        (len.saturating_sub(n), len.saturating_sub(1))
    } else {
        let start: u64 = a.parse().map_err(|_| ())?;
        let end = if b.is_empty() {
            len.saturating_sub(1)
        } else {
            b.parse::<u64>().map_err(|_| ())?.min(len.saturating_sub(1))
        };
        (start, end)
    };
    if len == 0 || start >= len || end < start {
        return Err(());
    }
    Ok(Some((start, end)))
}

async fn download(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Some((node, token)) = basic(&headers) else {
        let mut r = ApiError::new(
            StatusCode::UNAUTHORIZED,
            "a cached image needs the node's UUID and download token (Basic auth), as in the URL of its write_image command",
        )
        .into_response();
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"rivet image cache\""),
        );
        return Ok(r);
    };
    let (mut file, len, guard) = match state
        .conductor
        .open_cached_image(&node, &token, &name)
        .await
    {
        Ok(x) => x,
        Err(ImageRefusal::NotFound(m)) => return Err(ApiError::new(StatusCode::NOT_FOUND, m)),
        Err(ImageRefusal::Forbidden(m)) => {
            tracing::warn!(node = %node, image = %name, "image cache: download refused (token)");
            return Err(ApiError::new(StatusCode::FORBIDDEN, m));
        }
        Err(ImageRefusal::Unavailable(m)) => return Err(ApiError::unavailable(m, 5)),
    };
    let (status, start, count) = match range(&headers, len) {
        Ok(None) => (StatusCode::OK, 0, len),
        Ok(Some((a, b))) => (StatusCode::PARTIAL_CONTENT, a, b - a + 1),
        Err(()) => {
            let mut r = ApiError::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                format!("the range asked for is outside the image's {len} bytes"),
            )
            .into_response();
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{len}")) {
                r.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return Ok(r);
        }
    };
    if start > 0 {
        file.seek(SeekFrom::Start(start))
            .map_err(|e| ApiError::unavailable(format!("reading the cached image: {e}"), 5))?;
    }
    tracing::info!(node = %node, image = %name, from = start, bytes = count, "image cache: serving an image");
    // The guard rides in the stream: the image is in use until the body is done or dropped.
    let stream = file_body::stream(file, count, CHUNK, guard).inspect(|chunk| {
        if let Ok(c) = chunk {
            rivet_support::metrics::image_cache_served_bytes(c.len() as u64);
        }
    });
    let mut resp = file_body::octet_stream(Body::from_stream(stream), count);
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if status == StatusCode::PARTIAL_CONTENT {
        if let Ok(v) = HeaderValue::from_str(&format!("bytes {start}-{}/{len}", start + count - 1))
        {
            h.insert(header::CONTENT_RANGE, v);
        }
    }
    if let Ok(v) = HeaderValue::from_str(&format!("\"{name}\"")) {
        h.insert(header::ETAG, v);
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(v: &str) -> HeaderMap {
        let mut m = HeaderMap::new();
        m.insert(header::RANGE, HeaderValue::from_str(v).expect("header"));
        m
    }

    #[test]
    fn ranges() {
        assert_eq!(range(&HeaderMap::new(), 10), Ok(None));
        assert_eq!(range(&h("bytes=0-"), 10), Ok(Some((0, 9))));
        assert_eq!(range(&h("bytes=4-"), 10), Ok(Some((4, 9))));
        assert_eq!(range(&h("bytes=2-5"), 10), Ok(Some((2, 5))));
        assert_eq!(range(&h("bytes=2-50"), 10), Ok(Some((2, 9))));
        assert_eq!(range(&h("bytes=-3"), 10), Ok(Some((7, 9))));
        assert_eq!(range(&h("bytes=10-"), 10), Err(()));
        assert_eq!(range(&h("bytes=5-2"), 10), Err(()));
        assert_eq!(range(&h("bytes=0-1,4-5"), 10), Ok(None));
        assert_eq!(range(&h("items=0-1"), 10), Ok(None));
    }

    #[test]
    fn basic_auth() {
        let mut m = HeaderMap::new();
        let v = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("n1:tok")
        );
        m.insert(header::AUTHORIZATION, HeaderValue::from_str(&v).expect("h"));
        assert_eq!(basic(&m), Some(("n1".into(), "tok".into())));
        assert_eq!(basic(&HeaderMap::new()), None);
    }
}
