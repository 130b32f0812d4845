//! Files as response bodies (boot artefacts, cached images): read a chunk at a time on the
//! blocking pool, so a slow client holds no worker thread and at most one chunk of memory.

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use std::io::Read;

/// `count` bytes of `f` from its current offset, `chunk` bytes per read. `keep` rides in the
/// stream and is dropped when the body is done or abandoned (the image cache's in-use guard).
/// A file that ends before `count` bytes ends the body with an error, so a client told a
/// `Content-Length` never takes a short body for a whole one.
pub(crate) fn stream<K: Send + 'static>(
    f: std::fs::File,
    count: u64,
    chunk: usize,
    keep: K,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    futures_util::stream::unfold(
        (Some(f), count, keep),
        move |(file, left, keep)| async move {
            let mut f = file?;
            if left == 0 {
                return None;
            }
            let want = left.min(chunk as u64) as usize;
            let read = tokio::task::spawn_blocking(move || {
                let mut buf = vec![0u8; want];
                let r = f.read(&mut buf).map(|n| {
                    buf.truncate(n);
                    buf
                });
                (f, r)
            })
            .await;
            match read {
                Ok((_, Ok(buf))) if buf.is_empty() => Some((
                    Err(std::io::Error::other("the file ended early")),
                    (None, 0, keep),
                )),
                Ok((f, Ok(buf))) => {
                    let n = buf.len() as u64;
                    Some((Ok(Bytes::from(buf)), (Some(f), left - n, keep)))
                }
                Ok((_, Err(e))) => Some((Err(e), (None, 0, keep))),
                Err(e) => Some((Err(std::io::Error::other(e)), (None, 0, keep))),
            }
        },
    )
}

/// A binary download of `len` bytes.
pub(crate) fn octet_stream(body: Body, len: u64) -> Response {
    let mut resp = body.into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    resp
}
