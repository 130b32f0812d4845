//! `GET /v1/nodes/{node}/history[/{uuid}]` (1.78): Ironic's node history, read from the
//! audit trail's provision transitions (`action = transition`, written by the conductor).
//! Each row becomes one entry: a UUID derived from the node and the row's `seq`, severity
//! ERROR for a failure (a `fail` event or a failed state) else INFO, the event type named
//! after the activity as Ironic names it (cleaning, deploying, verifying, introspection…),
//! the conductor that wrote it and the user whose verb started the operation (entries within
//! a state, such as a finished clean step or the power off after a deploy failure, carry the
//! user of the operation they belong to). `project`
//! (1.113) is always null (Rivet has no projects); `state`, `target_provision_state` and
//! `duration_seconds` (time spent in the previous state) come at 1.115.

use super::render::base_url;
use super::{listing, ApiError, ApiResult, ApiVersion, AppState};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use rivet_store::{AuditEntry, AuditQuery, SortDir};
use serde_json::{json, Map, Value};
use std::collections::HashMap;

const PROJECT_SINCE: (u32, u32) = (1, 113);
const FIELDS_SINCE: (u32, u32) = (1, 115);
/// Longest `event` in a listing without `detail` (Ironic cuts to 251 characters + `...`).
const EVENT_LIST_MAX: usize = 255;
const LIST_PARAMS: &[&str] = &["detail", "marker", "limit", "sort_key", "sort_dir"];

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/nodes/{ident}/history", get(list))
        .route("/v1/nodes/{ident}/history/{event}", get(show))
}

/// One history entry.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    uuid: String,
    created_at: DateTime<Utc>,
    severity: &'static str,
    event_type: &'static str,
    event: String,
    conductor: Option<String>,
    user: Option<String>,
    state: String,
    target: Option<String>,
    duration_seconds: Option<i64>,
    /// Recorded inside a provision state (health change, finished step): durations of
    /// later entries still run from the last transition.
    within_state: bool,
}

/// The stable UUID of audit row `seq` of `node` (version 8: SHA-256 of both, namespaced).
fn entry_uuid(node: &str, seq: i64) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"rivet node history\0");
    h.update(node.as_bytes());
    h.update([0u8]);
    h.update(seq.to_be_bytes());
    let digest = h.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_custom_bytes(bytes)
        .into_uuid()
        .to_string()
}

/// Ironic's event type for the activity a provision state belongs to.
fn activity(state: &str) -> Option<&'static str> {
    Some(match state {
        "verifying" => "verifying",
        "cleaning" | "clean wait" | "clean failed" | "clean hold" => "cleaning",
        "deploying" | "wait call-back" | "deploy failed" | "deploy hold" => "deploying",
        "inspecting" | "inspect wait" | "inspect failed" => "introspection",
        "deleting" => "unprovision",
        "rescuing" | "rescue wait" | "rescue failed" | "unrescuing" | "unrescue failed" => "rescue",
        "adopting" | "adopt failed" => "adoption",
        _ => return None,
    })
}

/// The user part of an actor: `NAME (role R)` → `NAME`, `anonymous (--no-auth)` → `anonymous`.
fn user_of(actor: &str) -> String {
    actor
        .split_once(" (")
        .map_or(actor, |(name, _)| name)
        .to_string()
}

/// A transition row (`from -> to (how[; target: T]; cause: CAUSE)`) as an entry; None for
/// a row that is not one.
fn entry_of(node: &str, row: &AuditEntry, previous: Option<DateTime<Utc>>) -> Option<Entry> {
    if row.action == rivet_conductor::health::HEALTH_ACTION {
        return health_entry_of(node, row, previous);
    }
    // Erase reports (conductor/step_report.rs) have the same shape as finished steps.
    if row.action == rivet_conductor::step_record::CLEAN_STEP_ACTION
        || row.action == rivet_conductor::step_report::STEP_REPORT_ACTION
        || row.action == rivet_conductor::FAILURE_POWER_ACTION
        || row.action == rivet_conductor::FAST_TRACK_ACTION
    {
        return step_entry_of(node, row, previous, "INFO");
    }
    // What a failed deploy did with the power: an ERROR when the power off failed.
    if row.action == rivet_conductor::FAILURE_POWER_ERROR_ACTION {
        return step_entry_of(node, row, previous, "ERROR");
    }
    // The serial console: enabled, disabled, its SOL session lost and back (Ironic's
    // `console` event type).
    if row.action == crate::console::record::CONSOLE_ACTION
        || row.action == crate::console::record::CONSOLE_ERROR_ACTION
    {
        let severity = if row.action == crate::console::record::CONSOLE_ERROR_ACTION {
            "ERROR"
        } else {
            "INFO"
        };
        let (event, state) = row.detail.as_deref()?.rsplit_once("; state: ")?;
        return Some(within_state_entry(
            node,
            row,
            previous,
            (severity, "console"),
            event,
            state,
        ));
    }
    if row.action != "transition" {
        return None;
    }
    let detail = row.detail.as_deref()?;
    let (from, rest) = detail.split_once(" -> ")?;
    let (to, rest) = rest.split_once(" (")?;
    let (head, cause) = rest.split_once("; cause: ").unwrap_or((rest, ""));
    let cause = cause.strip_suffix(')').unwrap_or(cause);
    let (how, target) = match head.split_once("; target: ") {
        Some((h, t)) => (h, Some(t.to_string())),
        None => (head.strip_suffix(')').unwrap_or(head), None),
    };
    let failed = how == "event: fail" || to.ends_with(" failed") || to == "error";
    // The cause is `ERROR; during ORIGIN`, `ERROR`, `ORIGIN` or `conductor`, ORIGIN being
    // `VERB by ACTOR`.
    let (error, origin) = match cause.rsplit_once("; during ") {
        Some((e, o)) => (Some(e), Some(o)),
        None if failed && !cause.contains(" by ") && cause != "conductor" => (Some(cause), None),
        None if cause == "conductor" || cause.is_empty() => (None, None),
        None => (None, Some(cause)),
    };
    let user = origin
        .and_then(|o| o.split_once(" by "))
        .map(|(_, actor)| user_of(actor));
    let event = match error {
        Some(e) if failed => e.to_string(),
        _ => format!("{from} -> {to} ({how})"),
    };
    Some(Entry {
        uuid: entry_uuid(node, row.seq),
        created_at: row.created_at,
        severity: if failed { "ERROR" } else { "INFO" },
        event_type: activity(to)
            .or_else(|| activity(from))
            .unwrap_or("provisioning"),
        event,
        conductor: row.actor.strip_prefix("conductor:").map(str::to_string),
        user,
        state: to.to_string(),
        target,
        duration_seconds: previous.map(|p| (row.created_at - p).num_seconds().max(0)),
        within_state: false,
    })
}

/// A health change row (`EVENT; state: STATE`, written by power sync) as Ironic's
/// `monitoring` entry; its duration is the time in the provision state so far.
fn health_entry_of(node: &str, row: &AuditEntry, previous: Option<DateTime<Utc>>) -> Option<Entry> {
    let (event, state) = row.detail.as_deref()?.rsplit_once("; state: ")?;
    Some(within_state_entry(
        node,
        row,
        previous,
        ("INFO", "monitoring"),
        event,
        state,
    ))
}

/// An entry the conductor wrote within provision state `state` (no user, no target):
/// the pair is its severity and event type; its duration is the time in the state so far.
fn within_state_entry(
    node: &str,
    row: &AuditEntry,
    previous: Option<DateTime<Utc>>,
    (severity, event_type): (&'static str, &'static str),
    event: &str,
    state: &str,
) -> Entry {
    Entry {
        uuid: entry_uuid(node, row.seq),
        created_at: row.created_at,
        severity,
        event_type,
        event: event.to_string(),
        conductor: row.actor.strip_prefix("conductor:").map(str::to_string),
        user: None,
        state: state.to_string(),
        target: None,
        duration_seconds: previous.map(|p| (row.created_at - p).num_seconds().max(0)),
        within_state: true,
    }
}

/// A finished clean step, a step report or the power off after a deploy failure
/// (`EVENT; state: STATE`, written by the conductor) as an entry of the activity it ran in
/// (`cleaning`, `deploying`, `servicing`…); its duration is the time in the provision state
/// so far.
fn step_entry_of(
    node: &str,
    row: &AuditEntry,
    previous: Option<DateTime<Utc>>,
    severity: &'static str,
) -> Option<Entry> {
    let (event, state) = rivet_conductor::step_record::parse_detail(row.detail.as_deref()?)?;
    let kind = (severity, activity(state).unwrap_or("cleaning"));
    Some(within_state_entry(node, row, previous, kind, event, state))
}

/// Every history entry of node `uuid`, oldest first.
async fn entries(state: &AppState, uuid: &str) -> ApiResult<Vec<Entry>> {
    let mut out: Vec<Entry> = Vec::new();
    let mut q = AuditQuery {
        node_uuid: Some(uuid.to_string()),
        sort_dir: SortDir::Asc,
        ..Default::default()
    };
    loop {
        let rows = state.conductor.store.list_audit(&q).await?;
        let Some(last) = rows.last() else { break };
        q.marker = Some(last.seq);
        for row in &rows {
            // Durations run from the last provision transition: a health entry between
            // two does not cut the time spent in the state.
            let previous = out
                .iter()
                .rev()
                .find(|e| !e.within_state)
                .map(|e| e.created_at);
            let mut entry = entry_of(uuid, row, previous);
            // A finished step belongs to the operation; a health change (monitoring) does not.
            if let Some(e) = entry
                .as_mut()
                .filter(|e| e.within_state && e.user.is_none() && e.event_type != "monitoring")
            {
                e.user = operation_user(&out);
            }
            out.extend(entry);
        }
    }
    Ok(out)
}

/// The user of the operation an entry within a state belongs to: the nearest earlier
/// transition that names one (the verb that started it; the conductor's own transitions in
/// between name none). Step rows are written by the conductor, which does not know who
/// asked.
fn operation_user(before: &[Entry]) -> Option<String> {
    before
        .iter()
        .rev()
        .filter(|e| !e.within_state)
        .find_map(|e| e.user.clone())
}

fn render(e: &Entry, node: &str, detail: bool, version: (u32, u32), base: &str) -> Value {
    let mut v = Map::new();
    v.insert("uuid".into(), json!(e.uuid));
    v.insert(
        "created_at".into(),
        json!(super::render::timestamp(&e.created_at)),
    );
    v.insert("severity".into(), json!(e.severity));
    if detail {
        v.insert("event_type".into(), json!(e.event_type));
        v.insert("event".into(), json!(e.event));
        v.insert("conductor".into(), json!(e.conductor));
        v.insert("user".into(), json!(e.user));
        if version >= PROJECT_SINCE {
            v.insert("project".into(), Value::Null);
        }
        if version >= FIELDS_SINCE {
            v.insert("state".into(), json!(e.state));
            v.insert("target_provision_state".into(), json!(e.target));
            v.insert("duration_seconds".into(), json!(e.duration_seconds));
        }
    } else {
        let event = if e.event.chars().count() > EVENT_LIST_MAX {
            format!("{}...", e.event.chars().take(251).collect::<String>())
        } else {
            e.event.clone()
        };
        v.insert("event".into(), json!(event));
    }
    v.insert(
        "links".into(),
        json!([{
            "href": format!("{base}/v1/nodes/{node}/history/{}", e.uuid),
            "rel": "self",
        }]),
    );
    Value::Object(v)
}

fn not_found(node: &str, event: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("Node history record {event} could not be found (node {node})."),
    )
}

/// `GET /v1/nodes/{node}/history?detail=&marker=&limit=&sort_dir=`: oldest first.
async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiVersion(version): ApiVersion,
    Path(ident): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    listing::only_params(params.keys(), LIST_PARAMS)?;
    let detail = match params.get("detail").map(String::as_str) {
        None => false,
        Some(d) => match d.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" | "t" | "y" => true,
            "false" | "0" | "no" | "off" | "f" | "n" => false,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "Invalid input for field/attribute detail. Value: '{d}'. Unrecognized value '{d}', acceptable values are: '0', '1', 'f', 'false', 'n', 'no', 'off', 'on', 't', 'true', 'y', 'yes'"
                )))
            }
        },
    };
    if let Some(k) = params.get("sort_key") {
        if k != "created_at" {
            return Err(ApiError::bad_request(format!(
                "sort_key {k:?} is not supported; node history sorts by created_at"
            )));
        }
    }
    let dir = listing::sort_dir_param(&params)?.unwrap_or(SortDir::Asc);
    let limit = listing::page_limit(&params, state.conductor.config.api.max_limit)?;
    let node = state.conductor.store.get_node(&ident).await?;
    let mut all = entries(&state, &node.uuid).await?;
    if dir == SortDir::Desc {
        all.reverse();
    }
    let start = match params.get("marker") {
        None => 0,
        Some(m) => {
            if uuid::Uuid::parse_str(m).is_err() {
                return Err(ApiError::bad_request(format!(
                    "Expected a UUID but received {m}."
                )));
            }
            all.iter()
                .position(|e| &e.uuid == m)
                .ok_or_else(|| not_found(&node.uuid, m))?
                + 1
        }
    };
    let page: Vec<&Entry> = all.iter().skip(start).take(limit).collect();
    let base = base_url(&headers);
    let mut body = json!({
        "history": page
            .iter()
            .map(|e| render(e, &node.uuid, detail, version, &base))
            .collect::<Vec<_>>(),
    });
    if page.len() == limit {
        if let Some(last) = page.last() {
            let next = listing::NextLink::new(&base, &format!("/v1/nodes/{ident}/history"), limit)
                .marker(&last.uuid)
                .param_if("detail", detail.then_some("True"))
                .param_if("sort_dir", (dir == SortDir::Desc).then_some("desc"))
                .build();
            body["next"] = Value::from(next);
        }
    }
    Ok(Json(body))
}

/// `GET /v1/nodes/{node}/history/{uuid}`: one entry, with every field.
async fn show(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiVersion(version): ApiVersion,
    Path((ident, event)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let node = state.conductor.store.get_node(&ident).await?;
    let all = entries(&state, &node.uuid).await?;
    let e = all
        .iter()
        .find(|e| e.uuid == event)
        .ok_or_else(|| not_found(&node.uuid, &event))?;
    Ok(Json(render(
        e,
        &node.uuid,
        true,
        version,
        &base_url(&headers),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: i64, detail: &str) -> AuditEntry {
        AuditEntry {
            seq,
            created_at: Utc::now(),
            actor: "conductor:c1".into(),
            source: None,
            method: None,
            path: None,
            node_uuid: Some("n".into()),
            action: "transition".into(),
            status: None,
            detail: Some(detail.into()),
        }
    }

    /// The history entry of audit row `seq` of node `n`.
    fn entry(seq: i64, detail: &str) -> Entry {
        entry_of("n", &row(seq, detail), None).expect("entry")
    }

    #[test]
    fn transitions_become_entries() {
        let e = entry(3, "enroll -> verifying (verb: manage; target: manageable; cause: manage by admin (role admin))");
        assert_eq!(e.severity, "INFO");
        assert_eq!(e.event_type, "verifying");
        assert_eq!(e.event, "enroll -> verifying (verb: manage)");
        assert_eq!(e.user.as_deref(), Some("admin"));
        assert_eq!(e.conductor.as_deref(), Some("c1"));
        assert_eq!(e.target.as_deref(), Some("manageable"));
        assert_eq!(e.uuid, entry_uuid("n", 3));
        assert_ne!(e.uuid, entry_uuid("n", 4));

        let e = entry(4, "verifying -> enroll (event: fail; cause: BMC unreachable; x; during manage by anonymous (--no-auth))");
        assert_eq!(e.severity, "ERROR");
        assert_eq!(e.event, "BMC unreachable; x");
        assert_eq!(e.user.as_deref(), Some("anonymous"));
        assert_eq!(e.target, None);

        let e = entry(5, "cleaning -> available (event: done; cause: conductor)");
        assert_eq!((e.event_type, e.user), ("cleaning", None));
        let mut other = row(6, "x");
        other.action = "node:create".into();
        assert_eq!(entry_of("n", &other, None), None);
    }

    #[test]
    fn entries_within_a_state_carry_the_user_of_their_operation() {
        let started = entry(1, "manageable -> cleaning (verb: clean; target: manageable; cause: clean by alice (role admin))");
        let waiting = entry(2, "cleaning -> clean wait (event: wait; cause: conductor)");
        assert_eq!(operation_user(&[]), None);
        assert_eq!(
            operation_user(std::slice::from_ref(&started)).as_deref(),
            Some("alice")
        );
        assert_eq!(
            operation_user(&[started.clone(), waiting.clone()]).as_deref(),
            Some("alice")
        );
        let mut within = waiting.clone();
        within.within_state = true;
        within.user = Some("bob".into());
        // Only transitions speak for the operation.
        assert_eq!(
            operation_user(&[started, waiting, within]).as_deref(),
            Some("alice")
        );
    }

    #[test]
    fn health_changes_become_monitoring_entries() {
        let mut r = row(
            7,
            "Node health status changed: health='Warning' (previously 'OK'); state: available",
        );
        r.action = rivet_conductor::health::HEALTH_ACTION.into();
        let e = entry_of("n", &r, None).expect("entry");
        assert_eq!((e.severity, e.event_type), ("INFO", "monitoring"));
        assert_eq!(
            e.event,
            "Node health status changed: health='Warning' (previously 'OK')"
        );
        assert_eq!(e.state, "available");
        assert_eq!(e.conductor.as_deref(), Some("c1"));
        r.detail = Some("no state".into());
        assert_eq!(entry_of("n", &r, None), None);
    }
}
