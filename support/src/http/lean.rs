//! A lean HTTP/1.1 server for rivetd's plain-TCP connections.
//!
//! Why not hyper here: a whole fleet of agents holds long polls (`POST /agent/v1/heartbeat`
//! with `wait: true`, up to `long_poll_s`). hyper's http1 connection keeps a read buffer
//! (8 KiB, then ~16 KiB once its mid-message EOF probe reserves a fresh one) and an 8 KiB write
//! buffer for as long as a request is in flight: ≥ 16 KiB per held poll, ≥ 160 MiB for 10,000
//! agents. Here an idle connection owns only its socket; a request's head is read into a small
//! buffer that is dropped before the app runs (the body is copied into its own exact-size
//! `Bytes`); the peer's EOF is watched with a 1-byte `peek`, and the answer is written from a
//! buffer that lives only while it is written.
//!
//! It only does the common case — `Content-Length` bodies up to [`MAX_LEAN_BODY`], keep-alive,
//! HTTP/1.0 and 1.1 — and hands everything else (`Transfer-Encoding` or `Expect` on a request,
//! `Upgrade`, `CONNECT`, larger bodies, anything it cannot parse, pipelined requests after the
//! first) to hyper for the rest of the connection, with the bytes already read replayed first
//! ([`Rewind`]). TLS connections always use hyper: rustls keeps its own per-connection buffers
//! anyway, so this would save little there.

use super::deferred::{self, CallerResolves};
use super::PeerAddr;
use axum::body::{Body, Bytes, HttpBody};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response};
use axum::http::{StatusCode, Uri, Version};
use futures_util::{FutureExt, StreamExt};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Largest request head; beyond it the answer is 431 and the connection closes.
const MAX_HEAD: usize = 64 * 1024;
/// Most header fields in a head (hyper's default too); more is a 431.
const MAX_HEADERS: usize = 100;
/// Largest body read here. Larger ones go to hyper, which streams them under the router's
/// `api.max_body_bytes` limit as before; agents' requests are far smaller.
pub const MAX_LEAN_BODY: usize = 64 * 1024;
/// First read of a head: a heartbeat's head and body fit.
const FIRST_READ: usize = 2048;
/// Body bytes up to this much are copied next to the answer's head and sent in one write.
const COALESCE: usize = 16 * 1024;

/// How many requests are read and worked on at once, across every plain-TCP connection
/// (`[api] max_requests_in_progress`). A connection waits for its turn before it reads a
/// request, so a waiting request costs nothing but its bytes in the kernel's socket buffer;
/// the turn ends when the app answers — or parks the answer ([`super::deferred`]'s deferred
/// answers: a held long poll).
#[derive(Clone)]
pub struct Admission(Option<Arc<Semaphore>>);

impl Admission {
    /// At most `limit` at once; 0 = no limit.
    pub fn new(limit: usize) -> Admission {
        Admission((limit > 0).then(|| Arc::new(Semaphore::new(limit))))
    }

    /// A turn (`None` without a limit).
    async fn turn(&self) -> Option<OwnedSemaphorePermit> {
        // The semaphore is never closed, so acquiring fails never; if it did, go unlimited.
        self.0.clone()?.acquire_owned().await.ok()
    }
}

/// The per-connection limits of [`serve`].
pub struct Limits {
    /// From the moment the server waits for a request until its head is complete (hyper's
    /// `header_read_timeout` starts at that moment too, so it also bounds idle keep-alive).
    pub header_timeout: Duration,
    /// `Connection: close` on the `max_requests`-th answer (0 = no limit).
    pub max_requests: u64,
    /// The turn to take before reading each request.
    pub admission: Admission,
}

/// Serve one plain-TCP connection until the peer closes, an answer closes it, or `stopping`
/// finds it idle. Same contract as [`super::hyper_conn`]'s hyper path: the `PeerAddr` extension,
/// the header timeout and `Connection: close` on the last answer (see [`Limits`]).
pub async fn serve(
    mut tcp: TcpStream,
    peer: SocketAddr,
    app: axum::Router,
    limits: Limits,
    stopping: CancellationToken,
) {
    use tower_service::Service;
    let Limits {
        header_timeout,
        max_requests,
        admission,
    } = limits;
    let mut served = 0u64;
    loop {
        let deadline = Instant::now() + header_timeout;
        let (buf, head, turn) = match read_head(&mut tcp, deadline, &admission, &stopping).await {
            Ok(Some(h)) => h,
            Ok(None) => return,
            Err(e) => {
                return tracing::debug!(%peer, error = %e, "connection ended while reading a request")
            }
        };
        let lean = match head {
            Head::Lean(lean) => lean,
            Head::TooLarge => {
                let _ = tcp.write_all(TOO_LARGE).await;
                return;
            }
            Head::HandOff => {
                drop(turn);
                let rest = if max_requests == 0 {
                    0
                } else {
                    max_requests - served
                };
                let fut = hand_off(
                    tcp,
                    Bytes::from(buf),
                    peer,
                    app,
                    header_timeout,
                    rest,
                    stopping,
                );
                return Box::pin(fut).await;
            }
        };
        // In a block, so that nothing of the request's head — the 2 KiB head buffer above
        // all — is kept in this future past the call (a binding lives to the end of its
        // scope, and this loop's scope spans a held poll's whole wait).
        let (mut fut, pipelined, is_head, v10, mut close) = {
            let Lean {
                req,
                head_len,
                body_len,
                close,
            } = *lean;
            let end = head_len + body_len;
            // The body in its own exact-size allocation, and the head buffer gone before the
            // app runs.
            let (body, pipelined) = if buf.len() >= end {
                let pipelined = (buf.len() > end).then(|| Bytes::copy_from_slice(&buf[end..]));
                let body = Bytes::copy_from_slice(&buf[head_len..end]);
                drop(buf);
                (body, pipelined)
            } else {
                let mut body = vec![0u8; body_len];
                body[..buf.len() - head_len].copy_from_slice(&buf[head_len..]);
                let got = buf.len() - head_len;
                drop(buf);
                if let Err(e) = tcp.read_exact(&mut body[got..]).await {
                    return tracing::debug!(%peer, error = %e, "connection ended inside a request body");
                }
                (Bytes::from(body), None)
            };
            let is_head = req.method() == Method::HEAD;
            let v10 = req.version() == Version::HTTP_10;
            let mut req = req.map(|()| {
                if body.is_empty() {
                    Body::empty()
                } else {
                    Body::from(body)
                }
            });
            req.extensions_mut().insert(PeerAddr(peer));
            // A deferred answer (a held poll) comes back as its placeholder, so that the turn
            // ends when it is parked rather than when it is answered.
            req.extensions_mut().insert(CallerResolves);
            served += 1;
            // Both boxed: the router's future (~1.3 KiB) lives only until the app answers or
            // parks its answer, and this one — small once the router's future is out of it —
            // only while a request is in progress, so that neither sizes every connection's
            // task nor stays allocated for a held poll's whole wait.
            let call = Box::pin(app.clone().call(req));
            let fut = Box::pin(async move {
                let Ok(resp) = call.await;
                drop(turn);
                deferred::finish(resp).await
            });
            (fut, pipelined, is_head, v10, close)
        };
        let last = max_requests > 0 && served >= max_requests;
        let resp = if pipelined.is_some() {
            fut.await
        } else {
            // Watch for the peer going away without a buffer: a dead agent's held poll is
            // dropped (as hyper's EOF probe does). Bytes instead of EOF are a pipelined
            // request: stop watching, it is read after this answer.
            let mut probe = [0u8; 1];
            tokio::select! {
                answer = &mut fut => answer,
                seen = tcp.peek(&mut probe) => match seen {
                    Ok(0) | Err(_) => return tracing::debug!(%peer, "client closed the connection; dropping its pending request"),
                    Ok(_) => fut.await,
                },
            }
        };
        if last && max_requests == served {
            tracing::debug!(%peer, requests = served, "request limit of this connection reached; closing it after this answer");
        }
        close |= last || stopping.is_cancelled();
        match write_response(&mut tcp, resp, is_head, v10, close).await {
            Ok(false) => {}
            Ok(true) => {
                let _ = tcp.shutdown().await;
                return;
            }
            Err(e) => return tracing::debug!(%peer, error = %e, "cannot write the answer"),
        }
        if let Some(rest) = pipelined {
            let left = if max_requests == 0 {
                0
            } else {
                max_requests - served
            };
            let fut = hand_off(tcp, rest, peer, app, header_timeout, left, stopping);
            return Box::pin(fut).await;
        }
    }
}

/// What a complete head asks of this server.
enum Head {
    Lean(Box<Lean>),
    /// Beyond [`MAX_HEAD`] or [`MAX_HEADERS`].
    TooLarge,
    /// For hyper to serve (see the module doc).
    HandOff,
}

/// A request this module serves itself.
struct Lean {
    req: Request<()>,
    head_len: usize,
    body_len: usize,
    /// The client asked to close after the answer (or is HTTP/1.0 without keep-alive).
    close: bool,
}

const TOO_LARGE: &[u8] =
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

/// Wait for a request, for its turn, and read its head. `None`: the peer closed, `stopping`
/// found the connection idle, or `deadline` passed (closing, like hyper's header timeout).
async fn read_head(
    tcp: &mut TcpStream,
    deadline: Instant,
    admission: &Admission,
    stopping: &CancellationToken,
) -> io::Result<Option<(Vec<u8>, Head, Option<OwnedSemaphorePermit>)>> {
    // Idle: no buffer until the socket has something to read.
    let mut turn = None;
    let mut buf = loop {
        // Biased to the socket: a request that arrived as the deadline passed (or as
        // shutdown began) is served, not cut off with a reset.
        tokio::select! {
            biased;
            ready = tcp.readable() => ready?,
            _ = stopping.cancelled() => return Ok(None),
            _ = tokio::time::sleep_until(deadline) => return Ok(None),
        }
        if turn.is_none() {
            // Waiting for a turn is the server's doing, not the client's: no deadline here
            // (the head's deadline applies again once reading starts).
            tokio::select! {
                t = admission.turn() => turn = Some(t),
                _ = stopping.cancelled() => return Ok(None),
            }
        }
        let mut buf = Vec::with_capacity(FIRST_READ);
        match tcp.try_read_buf(&mut buf) {
            Ok(0) => return Ok(None),
            Ok(_) => break buf,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    };
    let turn = turn.flatten();
    loop {
        if let Some(head) = parse(&buf) {
            return Ok(Some((buf, head, turn)));
        }
        if buf.len() >= MAX_HEAD {
            return Ok(Some((buf, Head::TooLarge, turn)));
        }
        if buf.len() == buf.capacity() {
            buf.reserve(buf.len());
        }
        match tokio::time::timeout_at(deadline, tcp.read_buf(&mut buf)).await {
            Ok(Ok(0)) | Err(_) => return Ok(None),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e),
        }
    }
}

/// Parse a head; `None` while it is incomplete. Synchronous, so that the header array never
/// lives in a connection's future.
fn parse(buf: &[u8]) -> Option<Head> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut fields);
    let head_len = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return None,
        Err(httparse::Error::TooManyHeaders) => return Some(Head::TooLarge),
        // hyper answers malformed requests (400, 505…) as it always did.
        Err(_) => return Some(Head::HandOff),
    };
    Some(lean(&parsed, head_len).map_or(Head::HandOff, |l| Head::Lean(Box::new(l))))
}

/// The request, when it is one this module serves; `None` hands it to hyper.
fn lean(parsed: &httparse::Request<'_, '_>, head_len: usize) -> Option<Lean> {
    let version = match parsed.version? {
        0 => Version::HTTP_10,
        1 => Version::HTTP_11,
        _ => return None,
    };
    let method = Method::from_bytes(parsed.method?.as_bytes()).ok()?;
    if method == Method::CONNECT {
        return None;
    }
    let uri = Uri::try_from(parsed.path?).ok()?;
    let mut headers = HeaderMap::with_capacity(parsed.headers.len());
    let mut body_len = None;
    let (mut close, mut keep_alive) = (false, false);
    for field in parsed.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes()).ok()?;
        let value = HeaderValue::from_bytes(field.value).ok()?;
        if [header::TRANSFER_ENCODING, header::EXPECT, header::UPGRADE].contains(&name) {
            return None;
        }
        if name == header::CONTENT_LENGTH {
            let digits = value.to_str().ok()?.trim();
            if body_len.is_some()
                || digits.is_empty()
                || !digits.bytes().all(|b| b.is_ascii_digit())
            {
                return None;
            }
            body_len = Some(
                digits
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n <= MAX_LEAN_BODY)?,
            );
        }
        if name == header::CONNECTION {
            for token in value.to_str().ok()?.split(',').map(str::trim) {
                close |= token.eq_ignore_ascii_case("close");
                keep_alive |= token.eq_ignore_ascii_case("keep-alive");
                if token.eq_ignore_ascii_case("upgrade") {
                    return None;
                }
            }
        }
        headers.append(name, value);
    }
    let mut req = Request::new(());
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.version_mut() = version;
    *req.headers_mut() = headers;
    let close = close || (version == Version::HTTP_10 && !keep_alive);
    Some(Lean {
        req,
        head_len,
        body_len: body_len.unwrap_or(0),
        close,
    })
}

/// How an answer's body is delimited.
enum Framing {
    /// No body on the wire (HEAD, 1xx, 204, 304).
    None,
    Length(u64),
    Chunked,
    /// HTTP/1.0 without a known length: the end of the connection ends the body.
    UntilClose,
}

/// Write `resp`; `Ok(true)` when the connection must close after it. Mirrors hyper's
/// server encoding: `date`, `content-length` from the app's header or an exact size hint,
/// otherwise chunked (1.1) or close-delimited (1.0); HTTP/1.0 keep-alive is said explicitly.
async fn write_response(
    tcp: &mut TcpStream,
    resp: Response<Body>,
    is_head: bool,
    v10: bool,
    mut close: bool,
) -> io::Result<bool> {
    let (mut parts, body) = resp.into_parts();
    let h = &mut parts.headers;
    let status = parts.status;
    close |= has_token(h, "close");
    let can_length = !(status.is_informational()
        || matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED));
    let can_body = can_length && !is_head;
    let app_length = h
        .get(header::CONTENT_LENGTH)
        .map(|v| v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()));
    let framing = if !can_length {
        h.remove(header::CONTENT_LENGTH);
        h.remove(header::TRANSFER_ENCODING);
        Framing::None
    } else if let Some(Some(n)) = app_length {
        if can_body {
            Framing::Length(n)
        } else {
            Framing::None
        }
    } else {
        h.remove(header::CONTENT_LENGTH);
        h.remove(header::TRANSFER_ENCODING);
        match body.size_hint().exact() {
            Some(n) => {
                if !is_head || n != 0 {
                    h.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
                }
                if can_body {
                    Framing::Length(n)
                } else {
                    Framing::None
                }
            }
            None if !can_body => Framing::None,
            None if !v10 => {
                h.insert(
                    header::TRANSFER_ENCODING,
                    HeaderValue::from_static("chunked"),
                );
                Framing::Chunked
            }
            None => {
                close = true;
                Framing::UntilClose
            }
        }
    };
    if v10 && !close && !has_token(h, "keep-alive") {
        h.append(header::CONNECTION, HeaderValue::from_static("keep-alive"));
    } else if !v10 && close && !has_token(h, "close") {
        h.append(header::CONNECTION, HeaderValue::from_static("close"));
    }
    if !h.contains_key(header::DATE) {
        let now = httpdate::fmt_http_date(std::time::SystemTime::now());
        if let Ok(v) = HeaderValue::from_str(&now) {
            h.insert(header::DATE, v);
        }
    }
    let small = match framing {
        Framing::Length(n) => (n as usize).min(COALESCE),
        _ => 0,
    };
    let mut out = Vec::with_capacity(64 + h.len() * 40 + small);
    out.extend_from_slice(if v10 { b"HTTP/1.0 " } else { b"HTTP/1.1 " });
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in h.iter() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    drop(parts);
    if matches!(framing, Framing::None) {
        tcp.write_all(&out).await?;
        return Ok(close);
    }
    let mut sent = 0u64;
    let mut data = body.into_data_stream();
    loop {
        // Send what is buffered before waiting on a body that is not ready (a slow stream
        // must not hold the head back).
        let next = match data.next().now_or_never() {
            Some(next) => next,
            None => {
                tcp.write_all(&out).await?;
                out.clear();
                data.next().await
            }
        };
        let Some(chunk) = next else { break };
        let chunk = chunk.map_err(io::Error::other)?;
        if chunk.is_empty() {
            continue;
        }
        sent += chunk.len() as u64;
        if let Framing::Length(n) = framing {
            if sent > n {
                return Err(io::Error::other(
                    "the app's body is longer than its content-length",
                ));
            }
        }
        if let Framing::Chunked = framing {
            out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        }
        if out.len() + chunk.len() <= COALESCE {
            out.extend_from_slice(&chunk);
        } else {
            tcp.write_all(&out).await?;
            out.clear();
            tcp.write_all(&chunk).await?;
        }
        if let Framing::Chunked = framing {
            out.extend_from_slice(b"\r\n");
        }
    }
    match framing {
        Framing::Chunked => out.extend_from_slice(b"0\r\n\r\n"),
        Framing::Length(n) if sent != n => {
            tcp.write_all(&out).await?;
            return Err(io::Error::other(
                "the app's body is shorter than its content-length",
            ));
        }
        _ => {}
    }
    tcp.write_all(&out).await?;
    Ok(close)
}

/// Whether a `Connection` header of `h` lists `token`.
fn has_token(h: &HeaderMap, token: &str) -> bool {
    h.get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// Serve the rest of the connection with hyper, `read` (bytes already taken from the socket)
/// first.
async fn hand_off(
    tcp: TcpStream,
    read: Bytes,
    peer: SocketAddr,
    app: axum::Router,
    header_timeout: Duration,
    max_requests: u64,
    stopping: CancellationToken,
) {
    let io = Rewind { read, tcp };
    super::serve_connection(io, peer, app, header_timeout, max_requests, stopping).await
}

/// A socket whose reads first return bytes that were already read from it.
struct Rewind {
    read: Bytes,
    tcp: TcpStream,
}

impl AsyncRead for Rewind {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.read.is_empty() {
            return Pin::new(&mut self.tcp).poll_read(cx, buf);
        }
        let n = self.read.len().min(buf.remaining());
        let first = self.read.split_to(n);
        buf.put_slice(&first);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::response::IntoResponse;
    use axum::routing::{get, post};
    use axum::Router;
    use tokio::net::TcpListener;

    /// Sends `()` when dropped: shows that a pending handler was cancelled.
    struct DropGuard(Option<tokio::sync::oneshot::Sender<()>>);
    impl Drop for DropGuard {
        fn drop(&mut self) {
            if let Some(tx) = self.0.take() {
                let _ = tx.send(());
            }
        }
    }

    type Slot = Arc<std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>>;
    use std::sync::Arc;

    fn app(dropped: Slot) -> Router {
        Router::new()
            .route("/hello", get(|| async { "hello" }))
            .route("/echo", post(|body: Bytes| async move { body }))
            .route("/nocontent", get(|| async { StatusCode::NO_CONTENT }))
            .route(
                "/peer",
                get(
                    |axum::Extension(PeerAddr(p)): axum::Extension<PeerAddr>| async move {
                        p.to_string()
                    },
                ),
            )
            .route(
                "/stream",
                get(|| async {
                    let parts =
                        ["one ", "two ", "three"].map(|s| Ok::<_, io::Error>(Bytes::from(s)));
                    Body::from_stream(futures_util::stream::iter(parts))
                }),
            )
            .route(
                "/pending",
                get(move || {
                    let guard = DropGuard(dropped.lock().ok().and_then(|mut s| s.take()));
                    async move {
                        let _guard = guard;
                        std::future::pending::<()>().await;
                        "never"
                    }
                }),
            )
    }

    /// A served loopback listener; returns its address.
    async fn server(
        timeout: Duration,
        max_requests: u64,
        stop: CancellationToken,
        dropped: Slot,
    ) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let app = app(dropped);
        tokio::spawn(async move {
            while let Ok((tcp, peer)) = listener.accept().await {
                let limits = Limits {
                    header_timeout: timeout,
                    max_requests,
                    admission: Admission::new(0),
                };
                tokio::spawn(serve(tcp, peer, app.clone(), limits, stop.clone()));
            }
        });
        addr
    }

    async fn plain() -> SocketAddr {
        server(
            Duration::from_secs(5),
            0,
            CancellationToken::new(),
            Slot::default(),
        )
        .await
    }

    struct Answer {
        status: u16,
        version: u8,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    }

    impl Answer {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        }
    }

    /// A raw HTTP/1.1 client that keeps unread bytes between answers (pipelining).
    struct Client {
        tcp: TcpStream,
        buf: Vec<u8>,
    }

    impl Client {
        async fn new(addr: SocketAddr) -> Client {
            Client {
                tcp: TcpStream::connect(addr).await.expect("connect"),
                buf: Vec::new(),
            }
        }

        async fn send(&mut self, raw: &[u8]) {
            self.tcp.write_all(raw).await.expect("write");
        }

        /// Read more bytes; false on EOF.
        async fn fill(&mut self) -> bool {
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(5), self.tcp.read(&mut chunk))
                .await
                .expect("answer within 5 s")
                .unwrap_or(0);
            self.buf.extend_from_slice(&chunk[..n]);
            n > 0
        }

        async fn take(&mut self, n: usize) -> Vec<u8> {
            while self.buf.len() < n {
                assert!(self.fill().await, "EOF inside a body");
            }
            self.buf.drain(..n).collect()
        }

        async fn line(&mut self) -> String {
            loop {
                if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                    let line = self.take(i + 2).await;
                    return String::from_utf8_lossy(&line[..i]).into_owned();
                }
                assert!(self.fill().await, "EOF inside a line");
            }
        }

        async fn answer(&mut self, head_request: bool) -> Answer {
            let (status, version, headers, head_len) = loop {
                let mut fields = [httparse::EMPTY_HEADER; 32];
                let mut resp = httparse::Response::new(&mut fields);
                if let Ok(httparse::Status::Complete(n)) = resp.parse(&self.buf) {
                    let headers = resp
                        .headers
                        .iter()
                        .map(|h| {
                            (
                                h.name.to_string(),
                                String::from_utf8_lossy(h.value).into_owned(),
                            )
                        })
                        .collect::<Vec<_>>();
                    break (
                        resp.code.unwrap_or(0),
                        resp.version.unwrap_or(9),
                        headers,
                        n,
                    );
                }
                assert!(self.fill().await, "EOF before an answer");
            };
            self.buf.drain(..head_len);
            let mut a = Answer {
                status,
                version,
                headers,
                body: Vec::new(),
            };
            if head_request || status == 204 || status == 304 || status < 200 {
                return a;
            }
            if let Some(n) = a.header("content-length") {
                let n = n.parse().expect("content-length");
                a.body = self.take(n).await;
            } else if a.header("transfer-encoding") == Some("chunked") {
                loop {
                    let size = usize::from_str_radix(&self.line().await, 16).expect("chunk size");
                    let data = self.take(size).await;
                    assert_eq!(self.line().await, "", "chunk not followed by CRLF");
                    if size == 0 {
                        break;
                    }
                    a.body.extend_from_slice(&data);
                }
            } else {
                while self.fill().await {}
                a.body = std::mem::take(&mut self.buf);
            }
            a
        }

        /// The server closed the connection (nothing more arrives).
        async fn closed(&mut self) -> bool {
            !self.fill().await && self.buf.is_empty()
        }
    }

    const HELLO: &[u8] = b"GET /hello HTTP/1.1\r\nhost: x\r\n\r\n";

    #[tokio::test]
    async fn keep_alive_serves_three_requests_on_one_connection() {
        let mut c = Client::new(plain().await).await;
        for _ in 0..3 {
            c.send(HELLO).await;
            let a = c.answer(false).await;
            assert_eq!(
                (a.status, a.version, a.body.as_slice()),
                (200, 1, &b"hello"[..])
            );
            assert_eq!(a.header("content-length"), Some("5"));
            assert!(
                a.header("date").is_some(),
                "hyper sent a date header; so must this"
            );
            assert_eq!(a.header("connection"), None);
        }
    }

    #[tokio::test]
    async fn peer_address_reaches_the_app() {
        let mut c = Client::new(plain().await).await;
        let local = c.tcp.local_addr().expect("local addr");
        c.send(b"GET /peer HTTP/1.1\r\n\r\n").await;
        assert_eq!(c.answer(false).await.body, local.to_string().into_bytes());
    }

    #[tokio::test]
    async fn http10_closes_unless_keep_alive() {
        let addr = plain().await;
        let mut c = Client::new(addr).await;
        c.send(b"GET /hello HTTP/1.0\r\n\r\n").await;
        let a = c.answer(false).await;
        assert_eq!(
            (a.status, a.version, a.body.as_slice()),
            (200, 0, &b"hello"[..])
        );
        assert!(c.closed().await, "HTTP/1.0 without keep-alive must close");

        let mut c = Client::new(addr).await;
        c.send(b"GET /stream HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .await;
        let a = c.answer(false).await;
        // No chunked encoding in 1.0: the end of the connection ends the body.
        assert_eq!((a.version, a.header("connection")), (0, None));
        assert_eq!(a.body, b"one two three");
        let mut c = Client::new(addr).await;
        for _ in 0..2 {
            c.send(b"GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
                .await;
            let a = c.answer(false).await;
            assert_eq!(
                (a.header("connection"), a.body.as_slice()),
                (Some("keep-alive"), &b"hello"[..])
            );
        }
    }

    #[tokio::test]
    async fn connection_close_closes_after_the_answer() {
        let mut c = Client::new(plain().await).await;
        c.send(b"GET /hello HTTP/1.1\r\nConnection: close\r\n\r\n")
            .await;
        let a = c.answer(false).await;
        assert_eq!((a.status, a.header("connection")), (200, Some("close")));
        assert!(c.closed().await);
    }

    #[tokio::test]
    async fn head_and_204_send_no_body() {
        let mut c = Client::new(plain().await).await;
        c.send(b"HEAD /hello HTTP/1.1\r\n\r\n").await;
        let a = c.answer(true).await;
        assert_eq!((a.status, a.header("content-length")), (200, Some("5")));
        c.send(b"GET /nocontent HTTP/1.1\r\n\r\n").await;
        let a = c.answer(false).await;
        assert_eq!(
            (
                a.status,
                a.header("content-length"),
                a.header("transfer-encoding")
            ),
            (204, None, None)
        );
        // Any stray body byte would corrupt this answer.
        c.send(HELLO).await;
        let a = c.answer(false).await;
        assert_eq!((a.status, a.body.as_slice()), (200, &b"hello"[..]));
    }

    #[tokio::test]
    async fn unknown_size_is_chunked() {
        let mut c = Client::new(plain().await).await;
        c.send(b"GET /stream HTTP/1.1\r\n\r\n").await;
        let a = c.answer(false).await;
        assert_eq!(a.header("transfer-encoding"), Some("chunked"));
        assert_eq!(a.body, b"one two three");
        c.send(HELLO).await;
        assert_eq!(c.answer(false).await.body, b"hello");
    }

    #[tokio::test]
    async fn bodies_small_large_and_huge() {
        let mut c = Client::new(plain().await).await;
        // In the first read, beyond it, and beyond MAX_LEAN_BODY (handed to hyper).
        for len in [3, 10_000, MAX_LEAN_BODY + 1000] {
            let body: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let head = format!("POST /echo HTTP/1.1\r\ncontent-length: {len}\r\n\r\n");
            c.send(head.as_bytes()).await;
            c.send(&body).await;
            let a = c.answer(false).await;
            assert_eq!((a.status, a.body.len()), (200, len));
            assert!(a.body == body, "echo of {len} bytes differs");
        }
    }

    #[tokio::test]
    async fn too_large_head_is_431() {
        let mut c = Client::new(plain().await).await;
        let big = format!(
            "GET /hello HTTP/1.1\r\nx-big: {}\r\n\r\n",
            "a".repeat(MAX_HEAD)
        );
        c.send(big.as_bytes()).await;
        assert_eq!(c.answer(false).await.status, 431);
        let mut c = Client::new(plain().await).await;
        let many: String = (0..MAX_HEADERS + 1)
            .map(|i| format!("x-{i}: 1\r\n"))
            .collect();
        c.send(format!("GET /hello HTTP/1.1\r\n{many}\r\n").as_bytes())
            .await;
        assert_eq!(c.answer(false).await.status, 431);
    }

    #[tokio::test]
    async fn slow_or_idle_clients_are_closed_after_the_header_timeout() {
        let timeout = Duration::from_millis(300);
        let addr = server(timeout, 0, CancellationToken::new(), Slot::default()).await;
        let mut slow = Client::new(addr).await;
        slow.send(b"GET /hello HTTP/1.1\r\n").await;
        let mut idle = Client::new(addr).await;
        let started = std::time::Instant::now();
        assert!(slow.closed().await, "a half-sent head must be closed");
        assert!(idle.closed().await, "an idle connection must be closed");
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    #[tokio::test]
    async fn chunked_and_expect_requests_go_to_hyper() {
        let mut c = Client::new(plain().await).await;
        c.send(b"POST /echo HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
            .await;
        let a = c.answer(false).await;
        assert_eq!((a.status, a.body.as_slice()), (200, &b"hello"[..]));
        let mut c = Client::new(plain().await).await;
        c.send(b"POST /echo HTTP/1.1\r\nexpect: 100-continue\r\ncontent-length: 3\r\n\r\n")
            .await;
        assert_eq!(c.answer(false).await.status, 100);
        c.send(b"abc").await;
        let a = c.answer(false).await;
        assert_eq!((a.status, a.body.as_slice()), (200, &b"abc"[..]));
        // hyper keeps serving the connection afterwards.
        c.send(HELLO).await;
        assert_eq!(c.answer(false).await.body, b"hello");
    }

    #[tokio::test]
    async fn a_pending_request_is_dropped_when_the_client_closes() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let slot: Slot = Arc::new(std::sync::Mutex::new(Some(tx)));
        let addr = server(
            Duration::from_secs(5),
            0,
            CancellationToken::new(),
            slot.clone(),
        )
        .await;
        let mut c = Client::new(addr).await;
        c.send(b"GET /pending HTTP/1.1\r\n\r\n").await;
        // The handler took the sender once it started.
        while slot.lock().map(|s| s.is_some()).unwrap_or(false) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(c);
        tokio::time::timeout(Duration::from_secs(3), rx)
            .await
            .expect("the pending handler must be dropped when its client goes away")
            .expect("guard");
    }

    /// A server with a turn limit of 1 and two waiting routes: `/parked` answers through a
    /// deferred answer, `/gate` holds its handler; both end when `release` is notified.
    async fn one_at_a_time(release: Arc<tokio::sync::Notify>) -> SocketAddr {
        let (parked, gate) = (release.clone(), release);
        let app = app(Slot::default())
            .route(
                "/parked",
                get(move || {
                    let release = parked.clone();
                    async move {
                        deferred::response(async move {
                            release.notified().await;
                            "parked answer".into_response()
                        })
                    }
                }),
            )
            .route(
                "/gate",
                get(move || {
                    let release = gate.clone();
                    async move {
                        release.notified().await;
                        "gate"
                    }
                }),
            );
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let admission = Admission::new(1);
        tokio::spawn(async move {
            while let Ok((tcp, peer)) = listener.accept().await {
                let limits = Limits {
                    header_timeout: Duration::from_secs(5),
                    max_requests: 0,
                    admission: admission.clone(),
                };
                tokio::spawn(serve(
                    tcp,
                    peer,
                    app.clone(),
                    limits,
                    CancellationToken::new(),
                ));
            }
        });
        addr
    }

    /// Whether an answer starts arriving within `wait`.
    async fn answers_within(c: &mut Client, wait: Duration) -> bool {
        let mut byte = [0u8; 1];
        matches!(
            tokio::time::timeout(wait, c.tcp.peek(&mut byte)).await,
            Ok(Ok(n)) if n > 0
        )
    }

    #[tokio::test]
    async fn a_request_waits_for_its_turn_while_the_limit_is_busy() {
        let release = Arc::new(tokio::sync::Notify::new());
        let addr = one_at_a_time(release.clone()).await;
        let mut busy = Client::new(addr).await;
        busy.send(b"GET /gate HTTP/1.1\r\n\r\n").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut waiting = Client::new(addr).await;
        waiting.send(HELLO).await;
        assert!(
            !answers_within(&mut waiting, Duration::from_millis(300)).await,
            "with a limit of 1 and one request in progress, the second must wait"
        );
        release.notify_waiters();
        assert_eq!(busy.answer(false).await.body, b"gate");
        assert_eq!(waiting.answer(false).await.body, b"hello");
    }

    #[tokio::test]
    async fn a_parked_answer_gives_its_turn_back_and_is_answered_later() {
        let release = Arc::new(tokio::sync::Notify::new());
        let addr = one_at_a_time(release.clone()).await;
        let mut held = Client::new(addr).await;
        held.send(b"GET /parked HTTP/1.1\r\n\r\n").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut other = Client::new(addr).await;
        for _ in 0..3 {
            other.send(HELLO).await;
            assert_eq!(other.answer(false).await.body, b"hello");
        }
        assert!(!answers_within(&mut held, Duration::from_millis(100)).await);
        release.notify_waiters();
        let a = held.answer(false).await;
        assert_eq!((a.status, a.body.as_slice()), (200, &b"parked answer"[..]));
        // The connection goes on, one turn at a time as before.
        held.send(HELLO).await;
        assert_eq!(held.answer(false).await.body, b"hello");
    }

    #[tokio::test]
    async fn max_requests_closes_the_connection() {
        let addr = server(
            Duration::from_secs(5),
            2,
            CancellationToken::new(),
            Slot::default(),
        )
        .await;
        let mut c = Client::new(addr).await;
        c.send(HELLO).await;
        assert_eq!(c.answer(false).await.header("connection"), None);
        c.send(HELLO).await;
        assert_eq!(c.answer(false).await.header("connection"), Some("close"));
        assert!(c.closed().await);
    }

    #[tokio::test]
    async fn pipelined_requests_are_answered_in_order() {
        let mut c = Client::new(plain().await).await;
        c.send(b"GET /hello HTTP/1.1\r\n\r\nPOST /echo HTTP/1.1\r\ncontent-length: 3\r\n\r\nabcGET /peer HTTP/1.1\r\n\r\n")
            .await;
        assert_eq!(c.answer(false).await.body, b"hello");
        assert_eq!(c.answer(false).await.body, b"abc");
        assert_eq!(c.answer(false).await.status, 200);
    }

    #[tokio::test]
    async fn shutdown_closes_idle_connections() {
        let stop = CancellationToken::new();
        let addr = server(Duration::from_secs(30), 0, stop.clone(), Slot::default()).await;
        let mut c = Client::new(addr).await;
        c.send(HELLO).await;
        assert_eq!(c.answer(false).await.header("connection"), None);
        stop.cancel();
        assert!(c.closed().await, "an idle connection closes on shutdown");
    }

    #[tokio::test]
    async fn a_pooled_client_reuses_one_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (app, count) = (app(Slot::default()), accepted.clone());
        tokio::spawn(async move {
            while let Ok((tcp, peer)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let token = CancellationToken::new();
                let limits = Limits {
                    header_timeout: Duration::from_secs(5),
                    max_requests: 0,
                    admission: Admission::new(0),
                };
                tokio::spawn(serve(tcp, peer, app.clone(), limits, token));
            }
        });
        let client = reqwest::Client::new();
        for i in 0..20 {
            let (path, body) = match i % 4 {
                0 => ("hello", None),
                1 => ("stream", None),
                2 => ("nocontent", None),
                _ => ("echo", Some(format!("{{\"n\": {i}}}"))),
            };
            let url = format!("http://{addr}/{path}");
            let req = match body {
                Some(b) => client.post(url).body(b),
                None => client.get(url),
            };
            let resp = req.send().await.expect("request");
            assert!(resp.status().is_success(), "{path}: {}", resp.status());
            resp.bytes().await.expect("body");
        }
        assert_eq!(
            accepted.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "keep-alive must let the client reuse its connection"
        );
    }

    /// A burst of concurrent connections (like a fleet booting): every one is answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_of_connections_is_all_answered() {
        let addr = plain().await;
        let client = reqwest::Client::new();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..300u32 {
            let (client, url) = (client.clone(), format!("http://{addr}/echo"));
            tasks.spawn(async move {
                for j in 0..3u32 {
                    let body = format!("{{\"agent\": {i}, \"n\": {j}}}");
                    let resp = client.post(&url).body(body.clone()).send().await?;
                    let got = resp.bytes().await?;
                    assert_eq!(got, body.as_bytes());
                }
                Ok::<_, reqwest::Error>(())
            });
        }
        let all = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(done) = tasks.join_next().await {
                done.expect("task").expect("request");
            }
        });
        all.await
            .expect("every request of the burst answered within 60 s");
    }

    #[tokio::test]
    async fn malformed_requests_get_hyper_s_answer() {
        let mut c = Client::new(plain().await).await;
        c.send(b"GET /hello HTTP/1.1\r\nbad header\r\n\r\n").await;
        assert_eq!(c.answer(false).await.status, 400);
    }
}
