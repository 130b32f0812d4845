//! Rivet's console endpoints beyond Ironic's `states/console`: watching and typing over a
//! WebSocket, browser tickets, and the captured log.
//!
//! - `GET /v1/nodes/{node}/console/ws`: the node's live console. Credentials as every admin
//!   request (bearer, `X-Auth-Token`, basic) or, for a browser that cannot set headers, a
//!   ticket: `?ticket=` from `POST /v1/nodes/{node}/console/ticket` (single use, 30 s).
//! - `GET /v1/nodes/{node}/console/log[?tail=BYTES]`: the capture, `text/plain`, newest last.
//!
//! The WebSocket protocol (docs/console.md):
//! - server → client: **binary** frames are console output, byte for byte (not necessarily
//!   UTF-8); **text** frames are JSON events: `{"event":"hello","node":…,"can_write":…,
//!   "holder":…}` first, then `{"event":"pen","holder":NAME|null}` when the writer changes,
//!   `{"event":"session","state":"up"|"lost"}`, `{"event":"refused","reason":…}` when
//!   keystrokes were not forwarded, `{"event":"lagged","skipped":N}` for a slow viewer.
//! - client → server: **binary** frames are keystrokes; **text** frames are JSON commands:
//!   `{"input":"text"}` (keystrokes as a string), `{"takeover":true}` (take the pen from
//!   whoever holds it), `{"release":true}` (give it back).
//!
//! Admin and operator viewers may type (one at a time, see `console/pen.rs`); readers watch.
//! Attaching, detaching and taking over are written to the audit trail; keystrokes never are.

use super::auth::{self, Caller};
use super::{ApiError, ApiResult, AppState};
use crate::console::pen::Typed;
use crate::console::session::Session;
use crate::console::tickets::{TicketHolder, TICKET_TTL};
use axum::body::Bytes;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use rivet_model::config::Role;
use rivet_support::http::PeerAddr;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::broadcast::error::RecvError;

/// Routes behind the admin credential check.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/nodes/{ident}/console/ticket", post(ticket))
        .route("/v1/nodes/{ident}/console/log", get(log))
}

/// The WebSocket route: it checks credentials itself (headers or a ticket).
pub fn ws_routes() -> Router<AppState> {
    Router::new().route("/v1/nodes/{ident}/console/ws", get(ws))
}

/// `POST …/console/ticket`: a single-use ticket for the WebSocket, for the caller's role.
async fn ticket(
    State(state): State<AppState>,
    Path(ident): Path<String>,
    caller: Option<Extension<Caller>>,
) -> ApiResult<Response> {
    let node = state.conductor.store.get_node(&ident).await?;
    let caller = caller.map(|Extension(c)| c).unwrap_or(Caller {
        name: "anonymous".into(),
        role: Role::Admin,
    });
    let ticket = state.console.tickets.issue(TicketHolder {
        node_uuid: node.uuid.clone(),
        name: caller.name,
        role: caller.role,
    });
    let body = json!({
        "node_uuid": node.uuid,
        "ticket": ticket,
        "expires_in": TICKET_TTL.as_secs(),
        "url": format!("/v1/nodes/{}/console/ws?ticket={ticket}", node.uuid),
    });
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// `GET …/console/log[?tail=BYTES]`.
async fn log(
    State(state): State<AppState>,
    Path(ident): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult<Response> {
    if let Some(k) = q.keys().find(|k| k.as_str() != "tail") {
        return Err(ApiError::bad_request(format!(
            "unknown query parameter {k:?}: the console log takes only tail=BYTES"
        )));
    }
    let max = state.conductor.config.console.log_max_bytes;
    let tail = match q.get("tail") {
        None => max,
        Some(t) => match t.parse::<u64>() {
            Ok(n) if n > 0 => n.min(max),
            _ => {
                return Err(ApiError::bad_request(format!(
                    "tail={t:?} is not a positive number of bytes"
                )))
            }
        },
    };
    let node = state.conductor.store.get_node(&ident).await?;
    let paths = state.console.capture(&node.uuid);
    let read = tokio::task::spawn_blocking(move || paths.tail(tail))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot read the console capture: {e}"),
            )
        })?;
    let Some(bytes) = read else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "node {} has no captured console: enable its console (console_interface ipmitool-socat) first",
                node.ident()
            ),
        ));
    };
    let mut resp = Bytes::from(bytes).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    Ok(resp)
}

/// `GET …/console/ws` query.
#[derive(Deserialize)]
struct WsQuery {
    ticket: Option<String>,
}

/// `GET …/console/ws`: check who it is, then upgrade.
async fn ws(
    State(state): State<AppState>,
    Path(ident): Path<String>,
    Query(q): Query<WsQuery>,
    headers: HeaderMap,
    peer: Option<Extension<PeerAddr>>,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    let (name, role) = if state.conductor.config.no_auth {
        ("anonymous (--no-auth)".to_string(), Role::Admin)
    } else if let Some(t) = &q.ticket {
        let node = state.conductor.store.get_node(&ident).await?;
        let holder = state.console.tickets.redeem(t, &node.uuid).ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                format!(
                    "console ticket unknown, already used, expired or for another node: tickets are \
                     single-use and last {} s; POST /v1/nodes/{{node}}/console/ticket for a new one",
                    TICKET_TTL.as_secs()
                ),
            )
        })?;
        (
            format!("{} (role {})", holder.name, holder.role.as_str()),
            holder.role,
        )
    } else {
        let c = auth::check(&state, &headers).ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication required: send credentials as for any admin request, or ?ticket= \
                 from POST /v1/nodes/{node}/console/ticket",
            )
        })?;
        (format!("{} (role {})", c.name, c.role.as_str()), c.role)
    };
    if role == Role::Metrics {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("{name} may not watch consoles: the metrics role may only read metrics"),
        ));
    }
    let node = state.conductor.store.get_node(&ident).await?;
    let Some(session) = state.console.session(&node.uuid) else {
        return Err(ApiError::bad_request(format!(
            "Console access is not enabled on node {}",
            node.uuid
        )));
    };
    let upgrade = upgrade.map_err(|e| {
        ApiError::bad_request(format!(
            "GET …/console/ws is a WebSocket: send the upgrade headers ({e})"
        ))
    })?;
    let can_write = matches!(role, Role::Admin | Role::Operator);
    let source = peer.map(|Extension(p)| p.0.to_string());
    Ok(upgrade
        .on_upgrade(move |socket| viewer(session, socket, name, can_write, source))
        .into_response())
}

fn event(v: Value) -> Message {
    Message::Text(v.to_string().into())
}

/// One WebSocket viewer until either side goes.
async fn viewer(
    session: Arc<Session>,
    mut socket: WebSocket,
    name: String,
    can_write: bool,
    source: Option<String>,
) {
    let mut attached = session
        .attach_recorded(
            &name,
            source.clone(),
            format!(
                "WebSocket viewer{}",
                if can_write { "" } else { ", read-only" }
            ),
        )
        .await;
    let id = attached.id;
    let uuid = session.node_uuid.clone();
    let hello = event(json!({
        "event": "hello", "node": uuid, "can_write": can_write, "holder": session.holder(),
    }));
    let why = if socket.send(hello).await.is_err() {
        "viewer gone"
    } else {
        loop {
            let sent = tokio::select! {
                _ = session.cancel.cancelled() => break "console disabled",
                out = attached.output.recv() => match out {
                    Ok(b) => socket.send(Message::Binary(b)).await,
                    Err(RecvError::Lagged(n)) => socket.send(event(json!({"event": "lagged", "skipped": n}))).await,
                    Err(RecvError::Closed) => break "console disabled",
                },
                ev = attached.events.recv() => match ev {
                    Ok(text) => socket.send(Message::Text(text.to_string().into())).await,
                    Err(RecvError::Lagged(_)) => Ok(()),
                    Err(RecvError::Closed) => break "console disabled",
                },
                got = socket.recv() => match got {
                    None | Some(Err(_)) | Some(Ok(Message::Close(_))) => break "viewer disconnected",
                    Some(Ok(Message::Binary(b))) => refusal(&session.typed(id, &name, can_write, b), &mut socket).await,
                    Some(Ok(Message::Text(t))) => {
                        command(&session, id, &name, can_write, t.as_str(), &source, &mut socket).await
                    }
                    Some(Ok(_)) => Ok(()),
                },
            };
            if sent.is_err() {
                break "viewer gone";
            }
        }
    };
    session.release(id);
    let _ = socket.send(Message::Close(None)).await;
    session
        .recorder
        .viewer(
            &uuid,
            &name,
            source,
            "detach",
            format!("WebSocket viewer: {why}"),
        )
        .await;
}

/// Tell the viewer its keystrokes were not forwarded.
async fn refusal(t: &Typed, socket: &mut WebSocket) -> Result<(), axum::Error> {
    let reason = match t {
        Typed::Forward(_) => return Ok(()),
        Typed::ReadOnly => "read-only: your role may watch this console, not type".to_string(),
        Typed::HeldBy(h) => {
            format!("{h} holds the console; send {{\"takeover\":true}} to take it over")
        }
    };
    socket
        .send(event(json!({"event": "refused", "reason": reason})))
        .await
}

/// A text frame: a JSON command.
async fn command(
    session: &Session,
    id: u64,
    name: &str,
    can_write: bool,
    text: &str,
    source: &Option<String>,
    socket: &mut WebSocket,
) -> Result<(), axum::Error> {
    let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    if let Some(s) = v.get("input").and_then(Value::as_str) {
        let t = session.typed(id, name, can_write, Bytes::copy_from_slice(s.as_bytes()));
        return refusal(&t, socket).await;
    }
    if v.get("takeover") == Some(&Value::Bool(true)) {
        let from = session.holder();
        if !session.take_over(id, name, can_write) {
            return refusal(&Typed::ReadOnly, socket).await;
        }
        session
            .recorder
            .viewer(
                &session.node_uuid,
                name,
                source.clone(),
                "takeover",
                match from {
                    Some(f) => format!("took the console over from {f}"),
                    None => "took the free console".into(),
                },
            )
            .await;
        return Ok(());
    }
    if v.get("release") == Some(&Value::Bool(true)) {
        session.release(id);
        return Ok(());
    }
    socket
        .send(event(json!({
            "event": "error",
            "reason": "unknown command: send keystrokes as binary frames, or JSON {\"input\":…}, {\"takeover\":true} or {\"release\":true}",
        })))
        .await
}
