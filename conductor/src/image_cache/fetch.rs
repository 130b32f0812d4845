//! The origin side: one GET (conditional when the image is cached), the body streamed to a
//! partial file while its digest is computed, and checksums files. Errors name the origin's
//! answer, for the `last_error` of every deploy waiting on it.

use super::disk::{EntryMeta, Hasher, ImageDigest};
use rivet_protocol::deploy::redact_url;
use std::path::Path;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// Attempts of a request the origin failed with a 5xx or a connection error (IPA's
/// retries); a 4xx is final.
const ATTEMPTS: u32 = 3;
const RETRY_PAUSE: Duration = Duration::from_secs(2);
/// Largest checksums file read.
const MAX_CHECKSUMS: usize = 1 << 20;

/// What the origin answered.
pub enum Answer {
    /// 304: the cached copy is current.
    NotModified,
    /// 200 and its body, still to read.
    Body(reqwest::Response),
}

/// GET `url`, conditional on `cached`'s validators when given.
pub async fn get(
    client: &reqwest::Client,
    url: &str,
    cached: Option<&EntryMeta>,
) -> Result<Answer, String> {
    let shown = redact_url(url);
    let mut last = String::new();
    for attempt in 1..=ATTEMPTS {
        let mut req = client.get(url);
        if let Some(c) = cached {
            if let Some(etag) = &c.etag {
                req = req.header(reqwest::header::IF_NONE_MATCH, etag.as_str());
            }
            if let Some(lm) = &c.last_modified {
                req = req.header(reqwest::header::IF_MODIFIED_SINCE, lm.as_str());
            }
        }
        match req.send().await {
            Ok(r) if r.status() == reqwest::StatusCode::NOT_MODIFIED && cached.is_some() => {
                return Ok(Answer::NotModified)
            }
            Ok(r) if r.status() == reqwest::StatusCode::OK => return Ok(Answer::Body(r)),
            Ok(r) if r.status().is_server_error() => {
                last = format!("the image origin {shown} answered {}", r.status());
            }
            Ok(r) => {
                return Err(format!("the image origin {shown} answered {}", r.status()));
            }
            Err(e) => last = format!("the image origin {shown}: {}", chain(&e)),
        }
        if attempt < ATTEMPTS {
            tracing::warn!(url = %shown, attempt, error = %last, "image cache: origin request failed; retrying");
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }
    Err(last)
}

/// What a saved body was.
pub struct Saved {
    /// Bytes written.
    pub bytes: u64,
    /// The origin's `ETag`.
    pub etag: Option<String>,
    /// The origin's `Last-Modified`.
    pub last_modified: Option<String>,
}

/// Stream `resp`'s body into `partial`, hashing it; refuse more than `max_bytes` and a
/// digest other than `want` (the partial file is removed on every failure).
pub async fn save(
    resp: reqwest::Response,
    url: &str,
    partial: &Path,
    want: &ImageDigest,
    max_bytes: u64,
) -> Result<Saved, String> {
    let r = save_inner(resp, url, partial, want, max_bytes).await;
    if r.is_err() {
        let _ = tokio::fs::remove_file(partial).await;
    }
    r
}

async fn save_inner(
    mut resp: reqwest::Response,
    url: &str,
    partial: &Path,
    want: &ImageDigest,
    max_bytes: u64,
) -> Result<Saved, String> {
    let shown = redact_url(url);
    let header = |name: reqwest::header::HeaderName| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let etag = header(reqwest::header::ETAG);
    let last_modified = header(reqwest::header::LAST_MODIFIED);
    // Read now: reqwest's content_length() follows the body's remaining size hint.
    let announced = resp.content_length();
    if let Some(len) = announced {
        if len > max_bytes {
            return Err(format!(
                "the image {shown} is {len} bytes, more than the image cache may hold ([image_cache] max_bytes = {max_bytes})"
            ));
        }
    }
    let mut file = tokio::fs::File::create(partial)
        .await
        .map_err(|e| format!("image cache: creating {}: {e}", partial.display()))?;
    let mut hasher = Hasher::new(want.algo);
    let mut bytes = 0u64;
    loop {
        let chunk = match resp.chunk().await {
            Ok(Some(c)) => c,
            Ok(None) => break,
            Err(e) => {
                return Err(format!(
                    "the image origin {shown}: download cut after {bytes} bytes: {}",
                    chain(&e)
                ))
            }
        };
        bytes += chunk.len() as u64;
        rivet_support::metrics::image_cache_origin_bytes(chunk.len() as u64);
        if bytes > max_bytes {
            return Err(format!(
                "the image {shown} is more than the image cache may hold ([image_cache] max_bytes = {max_bytes})"
            ));
        }
        hasher.update(&chunk);
        file.write_all(&chunk)
            .await
            .map_err(|e| format!("image cache: writing {}: {e}", partial.display()))?;
    }
    if let Some(len) = announced {
        if len != bytes {
            return Err(format!(
                "the image origin {shown} sent {bytes} of {len} bytes"
            ));
        }
    }
    file.sync_all()
        .await
        .map_err(|e| format!("image cache: flushing {}: {e}", partial.display()))?;
    let got = hasher.hex();
    if got != want.hex {
        return Err(format!(
            "image {shown} failed its checksum: expected {} {}, got {got}",
            want.algo, want.hex
        ));
    }
    Ok(Saved {
        bytes,
        etag,
        last_modified,
    })
}

/// The digest a checksums file at `checksums_url` gives for `image_url`'s file.
pub async fn checksum_from_url(
    client: &reqwest::Client,
    checksums_url: &str,
    image_url: &str,
) -> Result<ImageDigest, String> {
    let shown = redact_url(checksums_url);
    let Answer::Body(mut resp) = get(client, checksums_url, None).await? else {
        return Err(format!("the checksums file {shown} answered 304"));
    };
    let mut text = Vec::new();
    while let Some(c) = resp
        .chunk()
        .await
        .map_err(|e| format!("the checksums file {shown}: {}", chain(&e)))?
    {
        text.extend_from_slice(&c);
        if text.len() > MAX_CHECKSUMS {
            return Err(format!("the checksums file {shown} is larger than 1 MiB"));
        }
    }
    let text = String::from_utf8_lossy(&text);
    let file = rivet_protocol::deploy::url_file_name(image_url);
    let hex = rivet_protocol::deploy::checksum_from_file(&text, &file)
        .ok_or_else(|| format!("the checksums file {shown} has no line for {file}"))?;
    let algo = rivet_protocol::deploy::algo_for_len(hex.len()).ok_or_else(|| {
        format!("the checksum for {file} in {shown} is not a sha256 or sha512 digest")
    })?;
    ImageDigest::new(algo, &hex)
}

/// An error with its causes (reqwest's Display omits them).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}
