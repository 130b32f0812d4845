//! Live node changes for watchers in this process (rivetd's web UI): every node record the
//! conductor writes ([`crate::Conductor::update_node`]) is published, as a small summary, on a
//! tokio broadcast channel, and so is each new step progress an agent reports (written
//! outside the node's version, so no node write carries it). The conductor knows nothing of who listens; the controller
//! subscribes and turns the stream into server-sent events.
//!
//! A bounded channel: a watcher that falls behind gets `Lagged` and must re-read the fleet
//! (it has missed changes), the conductor never waits for it. Changes written by another
//! controller sharing a PostgreSQL store are not seen here.

use chrono::{DateTime, Utc};
use rivet_model::node::Node;
use serde::Serialize;
use serde_json::Value;
use std::sync::Arc;
use tokio::sync::broadcast;

/// Changes buffered per watcher before it lags: a whole fleet changing at once (10,000 nodes
/// entering cleaning) fits, so a watcher re-reads everything only when truly swamped.
const CAPACITY: usize = 16_384;

/// What a fleet view shows of a node, as it was just written (no `driver_info`, no secrets:
/// every role that may read nodes may see all of it).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NodeChange {
    /// Node UUID.
    pub uuid: String,
    /// Node name.
    pub name: Option<String>,
    /// Provision state.
    pub provision_state: String,
    /// Where the current operation is heading.
    pub target_provision_state: Option<String>,
    /// Power state.
    pub power_state: Option<String>,
    /// A power action in progress.
    pub target_power_state: Option<String>,
    /// Maintenance flag.
    pub maintenance: bool,
    /// Why it is in maintenance.
    pub maintenance_reason: Option<String>,
    /// The fault that put it in maintenance (Ironic's `fault`).
    pub fault: Option<String>,
    /// The last error.
    pub last_error: Option<String>,
    /// Owner.
    pub owner: Option<String>,
    /// Resource class.
    pub resource_class: Option<String>,
    /// The clean step running now.
    pub clean_step: Option<Value>,
    /// The deploy step running now.
    pub deploy_step: Option<Value>,
    /// When the provision state last changed.
    pub provision_updated_at: Option<DateTime<Utc>>,
    /// The node was deleted (the other fields are then empty).
    pub removed: bool,
}

impl NodeChange {
    /// The summary of `node`.
    pub fn of(node: &Node) -> NodeChange {
        NodeChange {
            uuid: node.uuid.clone(),
            name: node.name.clone(),
            provision_state: node.provision_state.to_string(),
            target_provision_state: node.target_provision_state.map(|s| s.to_string()),
            power_state: node.power_state.map(|s| s.to_string()),
            target_power_state: node.target_power_state.map(|s| s.to_string()),
            maintenance: node.maintenance,
            maintenance_reason: node.maintenance_reason.clone(),
            fault: node.fault.clone(),
            last_error: node.last_error.clone(),
            owner: node.attrs.owner.clone(),
            resource_class: node.resource_class.clone(),
            clean_step: node.step_with_progress(&node.clean_step),
            deploy_step: node.step_with_progress(&node.deploy_step),
            provision_updated_at: node.provision_updated_at,
            removed: false,
        }
    }

    /// A deleted node.
    pub fn removed(uuid: &str) -> NodeChange {
        NodeChange {
            uuid: uuid.to_string(),
            name: None,
            provision_state: String::new(),
            target_provision_state: None,
            power_state: None,
            target_power_state: None,
            maintenance: false,
            maintenance_reason: None,
            fault: None,
            last_error: None,
            owner: None,
            resource_class: None,
            clean_step: None,
            deploy_step: None,
            provision_updated_at: None,
            removed: true,
        }
    }
}

/// The progress an agent just reported for the step it runs (`progress`: `{"done", "total",
/// "message", "rate"}`, as the node's `clean_step.progress` shows it).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StepProgress {
    /// Node UUID.
    pub uuid: String,
    /// The agent command running the step.
    pub command_id: Option<String>,
    /// The step's name, as the agent reported it.
    pub step: Option<String>,
    /// The progress.
    pub progress: Value,
}

/// One event for watchers.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeEvent {
    /// A node was written (or deleted).
    Change(Box<NodeChange>),
    /// A running step's progress moved.
    Progress(StepProgress),
}

/// The broadcast of node changes.
#[derive(Debug)]
pub struct NodeEvents {
    tx: broadcast::Sender<Arc<NodeEvent>>,
}

impl Default for NodeEvents {
    fn default() -> Self {
        NodeEvents {
            tx: broadcast::channel(CAPACITY).0,
        }
    }
}

impl NodeEvents {
    /// A new watcher: it sees changes published from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<NodeEvent>> {
        self.tx.subscribe()
    }

    /// Publish `node` as just written. Free when nobody watches (the summary is not built).
    pub fn publish(&self, node: &Node) {
        if self.tx.receiver_count() > 0 {
            // An error only means the last watcher left meanwhile.
            let _ = self
                .tx
                .send(Arc::new(NodeEvent::Change(Box::new(NodeChange::of(node)))));
        }
    }

    /// Publish a step's new progress on node `uuid` (`liveness_progress`: the node's
    /// `liveness.progress`, `{"command_id", "step", "progress"}`).
    pub fn publish_progress(&self, uuid: &str, liveness_progress: &Value) {
        if self.tx.receiver_count() > 0 {
            let Some(progress) = liveness_progress.get("progress") else {
                return;
            };
            let text = |k: &str| {
                liveness_progress
                    .get(k)
                    .and_then(Value::as_str)
                    .map(str::to_string)
            };
            let _ = self.tx.send(Arc::new(NodeEvent::Progress(StepProgress {
                uuid: uuid.to_string(),
                command_id: text("command_id"),
                step: text("step"),
                progress: progress.clone(),
            })));
        }
    }

    /// Publish that node `uuid` was deleted.
    pub fn publish_removed(&self, uuid: &str) {
        if self.tx.receiver_count() > 0 {
            let _ = self
                .tx
                .send(Arc::new(NodeEvent::Change(Box::new(NodeChange::removed(
                    uuid,
                )))));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watcher_sees_what_is_published_after_it_subscribed() {
        let events = NodeEvents::default();
        let node = Node::new("u1".into(), "fake-hardware".into());
        events.publish(&node); // nobody listens: dropped
        let mut rx = events.subscribe();
        events.publish(&node);
        events.publish_removed("u1");
        let change = |e: Arc<NodeEvent>| match &*e {
            NodeEvent::Change(c) => c.clone(),
            NodeEvent::Progress(p) => panic!("not a change: {p:?}"),
        };
        let first = change(rx.recv().await.expect("first change"));
        assert_eq!(first.uuid, "u1");
        assert!(!first.removed);
        assert!(change(rx.recv().await.expect("removal")).removed);
        events.publish_progress(
            "u1",
            &serde_json::json!({"command_id": "c1", "step": "erase_devices", "progress": {"done": 1, "total": 4}}),
        );
        match &*rx.recv().await.expect("progress") {
            NodeEvent::Progress(p) => {
                assert_eq!(p.command_id.as_deref(), Some("c1"));
                assert_eq!(p.progress["total"], 4);
            }
            NodeEvent::Change(c) => panic!("not progress: {c:?}"),
        }
        assert!(rx.try_recv().is_err(), "nothing before the subscription");
    }
}
