//! A connection served by hyper: TLS connections, and plain ones the lean server hands off
//! (upgrades, pipelining, anything it does not handle itself).

use super::PeerAddr;
use std::net::SocketAddr;
use std::time::Duration;

/// One HTTP/1.1 connection: keep-alive, and a deadline for each request's headers. Every
/// request carries the peer address as a [`PeerAddr`] extension (rate limits, audit). The
/// `max_requests`-th answer on the connection carries `Connection: close` (hyper then closes
/// it after that answer), so a client reconnects now and then: one client cannot hold a
/// connection forever, and behind a load balancer its requests spread. 0 = no limit.
pub async fn serve_connection<S>(
    io: S,
    peer: SocketAddr,
    app: axum::Router,
    header_timeout: Duration,
    max_requests: u64,
    stopping: tokio_util::sync::CancellationToken,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use hyper_util::rt::{TokioIo, TokioTimer};
    use std::sync::atomic::{AtomicU64, Ordering};
    use tower_service::Service;
    // hyper calls the service through `&self`, hence an atomic for a per-connection count.
    let served = AtomicU64::new(0);
    let service = hyper::service::service_fn(
        move |mut req: hyper::Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(PeerAddr(peer));
            let mut app = app.clone();
            // HTTP/1.1 answers in order, so counting at arrival numbers the answers too.
            let n = served.fetch_add(1, Ordering::Relaxed) + 1;
            let last = max_requests > 0 && n >= max_requests;
            async move {
                let mut resp = app.call(req).await?;
                if last {
                    resp.headers_mut().insert(
                        axum::http::header::CONNECTION,
                        axum::http::HeaderValue::from_static("close"),
                    );
                    if n == max_requests {
                        tracing::debug!(%peer, requests = n, "request limit of this connection reached; closing it after this answer");
                    }
                }
                Ok::<_, std::convert::Infallible>(resp)
            }
        },
    );
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .keep_alive(true)
        .serve_connection(TokioIo::new(io), service)
        // WebSocket upgrades (the node console) hand the connection to the handler.
        .with_upgrades();
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = stopping.cancelled() => {
            // Finish the request in flight (held long polls answer at once: they watch the
            // same token), then close instead of waiting for the next one.
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}
