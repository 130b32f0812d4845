//! What the console writes to the store besides its flag: node-history rows (enabled,
//! disabled, session lost and back), the node's `last_error` when enabling fails (as Ironic),
//! and audit rows for viewers attaching, detaching and taking over (who and when, never what
//! they typed). Every write is best effort: a failed one is logged and never stops a console.

use chrono::Utc;
use rivet_store::{AuditEntry, Store, StoreError};
use std::sync::Arc;

/// Node-history action of console events (Ironic's `console` event type).
pub const CONSOLE_ACTION: &str = "console";
/// Node-history action of console failures (severity ERROR).
pub const CONSOLE_ERROR_ACTION: &str = "console_error";

/// Writes console events to the store.
#[derive(Clone)]
pub struct Recorder {
    store: Arc<dyn Store>,
    conductor: String,
}

impl Recorder {
    /// A recorder writing as `conductor:ID`.
    pub fn new(store: Arc<dyn Store>, conductor_id: &str) -> Recorder {
        Recorder {
            store,
            conductor: format!("conductor:{conductor_id}"),
        }
    }

    /// A node-history row: `EVENT; state: STATE` (the history's within-state shape).
    pub async fn history(&self, node_uuid: &str, event: &str, error: bool) {
        let state = match self.store.get_node(node_uuid).await {
            Ok(n) => n.provision_state.to_string(),
            Err(_) => return,
        };
        let entry = AuditEntry {
            seq: 0,
            created_at: Utc::now(),
            actor: self.conductor.clone(),
            source: None,
            method: None,
            path: None,
            node_uuid: Some(node_uuid.to_string()),
            action: if error {
                CONSOLE_ERROR_ACTION
            } else {
                CONSOLE_ACTION
            }
            .into(),
            status: None,
            detail: Some(format!("{}; state: {state}", truncate(event, 1000))),
        };
        if let Err(e) = self.store.append_audit(&entry).await {
            tracing::warn!(node = %node_uuid, error = %e, "could not record a console event in the node history");
        }
    }

    /// An audit row about a viewer: `console:attach`, `console:detach`, `console:takeover`.
    pub async fn viewer(
        &self,
        node_uuid: &str,
        actor: &str,
        source: Option<String>,
        action: &str,
        detail: String,
    ) {
        let entry = AuditEntry {
            seq: 0,
            created_at: Utc::now(),
            actor: actor.to_string(),
            source,
            method: None,
            path: None,
            node_uuid: Some(node_uuid.to_string()),
            action: format!("console:{action}"),
            status: None,
            detail: Some(truncate(&detail, 500)),
        };
        if let Err(e) = self.store.append_audit(&entry).await {
            tracing::warn!(node = %node_uuid, error = %e, "could not record a console viewer in the audit trail");
        }
    }

    /// Set (or clear) the node's `last_error`, retrying when a concurrent write changed the
    /// node in between.
    pub async fn last_error(&self, node_uuid: &str, error: Option<String>) {
        for _ in 0..5 {
            let mut node = match self.store.get_node(node_uuid).await {
                Ok(n) => n,
                Err(_) => return,
            };
            if node.last_error == error {
                return;
            }
            node.last_error = error.clone();
            match self.store.update_node(&node).await {
                Ok(_) => return,
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => {
                    tracing::warn!(node = %node_uuid, error = %e, "could not record the console's last_error");
                    return;
                }
            }
        }
    }

    /// Record the console flag.
    pub async fn enabled(&self, node_uuid: &str, on: bool) {
        if let Err(e) = self.store.set_console_enabled(node_uuid, on).await {
            tracing::warn!(node = %node_uuid, error = %e, "could not record console_enabled");
        }
    }

    /// Whether the store still wants `node_uuid`'s console (the node exists, flag on).
    pub async fn still_wanted(&self, node_uuid: &str) -> Option<bool> {
        match self.store.get_node(node_uuid).await {
            Ok(_) => {}
            Err(StoreError::NotFound { .. }) => return Some(false),
            Err(_) => return None,
        }
        self.store
            .node_management(node_uuid)
            .await
            .ok()
            .map(|m| m.console_enabled)
    }
}

fn truncate(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}
