//! `GET /ui/events`: live node changes as server-sent events, fed by the conductor's own
//! writes (`rivet_conductor::node_events`), not by polling. Events: `node` (a node's summary
//! as just written, JSON; `removed: true` when deleted), `progress` (a running step's new
//! progress: `{uuid, command_id, step, progress}`) and `resync` (this watcher fell behind
//! and missed changes: re-read the fleet). The stream ends when rivetd shuts down or the
//! session ends (log-out, expiry), so the browser reconnects — or is sent to the log-in page.

use super::viewer;
use crate::api::{sessions, AppState};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use rivet_conductor::node_events::NodeEvent;
use rivet_model::config::Role;
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;

/// How often an idle stream sends a comment: proxies keep it open, and a dead session is
/// noticed within this time.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The handler.
pub async fn stream(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let Some(v) = viewer::of(&state, &headers) else {
        return (StatusCode::UNAUTHORIZED, "not logged in").into_response();
    };
    if v.role == Role::Metrics {
        return (StatusCode::FORBIDDEN, "the metrics role may not read nodes").into_response();
    }
    // A session watcher stops when its session does; an API credential or --no-auth has none.
    let session = sessions::cookie_value(&headers)
        .filter(|id| state.sessions.get(id).is_some())
        .map(str::to_string);
    let rx = state.conductor.events.subscribe();
    let stopping = state.conductor.shutdown.clone();
    let sessions = state.sessions.clone();
    let events = stream::unfold(
        (rx, stopping, sessions, session, true),
        |(mut rx, stopping, sessions, session, first)| async move {
            if first {
                let hello = Event::default().event("hello").data("{}");
                return Some((
                    Ok::<_, Infallible>(hello),
                    (rx, stopping, sessions, session, false),
                ));
            }
            loop {
                let alive =
                    |s: &Option<String>| s.as_deref().is_none_or(|id| sessions.get(id).is_some());
                let next = tokio::select! {
                    _ = stopping.cancelled() => return None,
                    r = rx.recv() => r,
                    _ = tokio::time::sleep(KEEP_ALIVE) => {
                        if !alive(&session) {
                            return None;
                        }
                        continue;
                    }
                };
                if !alive(&session) {
                    return None;
                }
                let event = match next {
                    Ok(event) => {
                        let (name, json) = match &*event {
                            NodeEvent::Change(c) => ("node", serde_json::to_string(c)),
                            NodeEvent::Progress(p) => ("progress", serde_json::to_string(p)),
                        };
                        match json {
                            Ok(json) => Event::default().event(name).data(json),
                            Err(_) => continue,
                        }
                    }
                    Err(RecvError::Lagged(_)) => Event::default().event("resync").data("{}"),
                    Err(RecvError::Closed) => return None,
                };
                return Some((Ok(event), (rx, stopping, sessions, session, false)));
            }
        },
    );
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}
