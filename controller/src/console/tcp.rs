//! The raw TCP console (`console_info.url`, `tcp://socat_address:port`), as Ironic's socat
//! console serves it: bytes both ways, no credentials — which is why `socat_address`
//! defaults to loopback. Unlike socat, any number of viewers may connect; they share the one
//! SOL session and its pen (see `pen.rs`). A viewer silent in both directions for
//! `[console] terminal_timeout` is disconnected (socat's `-T`).

use super::pen::Typed;
use super::session::Session;
use axum::body::Bytes;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast::error::RecvError;

/// Accept viewers until the session is cancelled.
pub async fn serve(session: Arc<Session>, listener: TcpListener, idle: Option<Duration>) {
    loop {
        tokio::select! {
            _ = session.cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    let _ = tcp.set_nodelay(true);
                    tokio::spawn(viewer(session.clone(), tcp, peer.to_string(), idle));
                }
                Err(e) => {
                    // Out of descriptors and the like: breathe, keep serving.
                    tracing::warn!(node = %session.node_uuid, error = %e, "console accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// A notice to one TCP viewer when its keystrokes are refused, at most this often.
const REFUSAL_EVERY: Duration = Duration::from_secs(10);

async fn viewer(session: Arc<Session>, tcp: TcpStream, peer: String, idle: Option<Duration>) {
    let name = format!("tcp viewer {peer}");
    let actor = "tcp viewer (no credentials)";
    let mut attached = session
        .attach_recorded(
            actor,
            Some(peer.clone()),
            format!("raw TCP console on port {}", session.port),
        )
        .await;
    let id = attached.id;
    let (mut rd, mut wr) = tcp.into_split();
    let mut buf = vec![0u8; 4096];
    let mut last_refusal: Option<tokio::time::Instant> = None;
    let far = Duration::from_secs(365 * 24 * 3600);
    let timer = tokio::time::sleep(idle.unwrap_or(far));
    tokio::pin!(timer);
    let why = loop {
        tokio::select! {
            _ = session.cancel.cancelled() => break "console disabled",
            _ = &mut timer => break "idle for terminal_timeout",
            out = attached.output.recv() => match out {
                Ok(b) => {
                    if wr.write_all(&b).await.is_err() { break "viewer gone"; }
                    timer.as_mut().reset(tokio::time::Instant::now() + idle.unwrap_or(far));
                }
                Err(RecvError::Lagged(n)) => {
                    let msg = format!("\r\n[rivet: this viewer fell behind; {n} chunks skipped — the log has them]\r\n");
                    if wr.write_all(msg.as_bytes()).await.is_err() { break "viewer gone"; }
                }
                Err(RecvError::Closed) => break "console disabled",
            },
            got = rd.read(&mut buf) => match got {
                Ok(0) | Err(_) => break "viewer disconnected",
                Ok(n) => {
                    timer.as_mut().reset(tokio::time::Instant::now() + idle.unwrap_or(far));
                    let t = session.typed(id, &name, true, Bytes::copy_from_slice(&buf[..n]));
                    if let Typed::HeldBy(holder) = t {
                        let now = tokio::time::Instant::now();
                        if last_refusal.is_none_or(|at| now.duration_since(at) >= REFUSAL_EVERY) {
                            last_refusal = Some(now);
                            let msg = format!("\r\n[rivet: read-only: {holder} is typing]\r\n");
                            if wr.write_all(msg.as_bytes()).await.is_err() { break "viewer gone"; }
                        }
                    }
                }
            },
        }
    };
    session.release(id);
    let _ = wr.shutdown().await;
    session
        .recorder
        .viewer(
            &session.node_uuid,
            actor,
            Some(peer),
            "detach",
            format!("raw TCP console: {why}"),
        )
        .await;
}
