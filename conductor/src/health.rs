//! Node health (Ironic's `node.health`, API 1.109): power sync reads it with the power
//! state ([`rivet_drivers::Bmc::get_power_and_health`]) and this module keeps it. A change
//! is written to the node and recorded in the node history as a `monitoring` event, in
//! Ironic's words (`conductor/utils.py` `node_cache_health`); an unchanged reading writes
//! nothing.

use super::Conductor;
use rivet_drivers::Health;

/// The audit action of a health change; `api::history` shows these rows as entries.
pub const HEALTH_ACTION: &str = "health";

/// The history event of a change, as Ironic words it.
pub fn health_event(new: Option<&str>, old: Option<&str>) -> String {
    format!(
        "Node health status changed: health='{}' (previously '{}')",
        new.unwrap_or("None"),
        old.unwrap_or("None")
    )
}

impl Conductor {
    /// Store `health` on node `uuid` when it differs from what the node holds, and record
    /// the change. Failures are logged: health never fails a power sync.
    pub(super) async fn cache_health(&self, uuid: &str, health: Option<Health>) {
        let new = health.map(Health::as_str);
        // What the written copy held (update_fresh's closure is `Fn`, called per attempt).
        let previous = std::sync::Mutex::new(None);
        let written = self
            .update_fresh(uuid, |n| {
                if n.health.as_deref() == new {
                    return false;
                }
                if let Ok(mut p) = previous.lock() {
                    *p = n.health.take();
                }
                n.health = new.map(str::to_string);
                true
            })
            .await;
        let node = match written {
            Ok(Some(n)) => n,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(node = %uuid, error = %e, "power sync: cannot store the node's health");
                return;
            }
        };
        let old = previous.into_inner().unwrap_or_default();
        if matches!(health, Some(Health::Warning | Health::Critical)) {
            tracing::warn!(node = %uuid, health = new, "node health status indicates a problem");
        } else {
            tracing::info!(node = %uuid, health = new, previous = old.as_deref(), "node health status changed");
        }
        let event = health_event(new, old.as_deref());
        self.record_history(&node, HEALTH_ACTION, &event, "a health change")
            .await;
    }
}
