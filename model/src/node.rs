//! The node record and what it carries, as the API, the conductor and the store exchange it:
//! [`Node`] with its [`Attributes`] and [`Liveness`], the [`NodeSummary`] the periodic scans
//! read, the [`Corrupt`] mark of a stored field that does not decode, and the [`Chassis`]
//! nodes are grouped in. Plain data: reading and writing them is `rivet-store`'s.

use chrono::{DateTime, Utc};
use rivet_protocol::states::{PowerState, ProvisionState};
use serde_json::{Map, Value};

/// A node record. Field names are Ironic's.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// UUID.
    pub uuid: String,
    /// Unique name.
    pub name: Option<String>,
    /// Driver name.
    pub driver: String,
    /// BMC address and credentials (masked on output).
    pub driver_info: Map<String, Value>,
    /// Conductor bookkeeping (agent token hash, cached steps…).
    pub driver_internal_info: Map<String, Value>,
    /// Hardware properties.
    pub properties: Map<String, Value>,
    /// Deployment settings.
    pub instance_info: Map<String, Value>,
    /// Instance bound to the node.
    pub instance_uuid: Option<String>,
    /// Operator data.
    pub extra: Map<String, Value>,
    /// Provision state.
    pub provision_state: ProvisionState,
    /// Where the current operation leads.
    pub target_provision_state: Option<ProvisionState>,
    /// Last provision state change.
    pub provision_updated_at: Option<DateTime<Utc>>,
    /// Power state (None until read).
    pub power_state: Option<PowerState>,
    /// Power state being set.
    pub target_power_state: Option<PowerState>,
    /// Maintenance flag.
    pub maintenance: bool,
    /// Why.
    pub maintenance_reason: Option<String>,
    /// Fault that put the node in maintenance (e.g. "clean failure").
    pub fault: Option<String>,
    /// Last error.
    pub last_error: Option<String>,
    /// Running clean step.
    pub clean_step: Option<Value>,
    /// Running deploy step.
    pub deploy_step: Option<Value>,
    /// Conductor holding the node.
    pub reservation: Option<String>,
    /// Conductor that owns the node.
    pub conductor: Option<String>,
    /// Per-node automated cleaning switch.
    pub automated_clean: Option<bool>,
    /// Resource class.
    pub resource_class: Option<String>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last write.
    pub updated_at: Option<DateTime<Utc>>,
    /// Version (ETag); bumped by every write.
    pub version: i64,
    /// `agent` (in-band, default) or the driver's name for out-of-band inspection.
    pub inspect_interface: Option<String>,
    /// When the last inspection started.
    pub inspection_started_at: Option<DateTime<Utc>>,
    /// When the last inspection finished.
    pub inspection_finished_at: Option<DateTime<Utc>>,
    /// Traits (e.g. from inspection rules).
    pub traits: Vec<String>,
    /// The node's interface implementations (`boot_interface`, `deploy_interface`, …).
    pub interfaces: crate::interfaces::Interfaces,
    /// The conductor's bookkeeping of the running operation (its own column, typed).
    pub runs: crate::runs::Runs,
    /// Ironic's ownership and lifecycle fields (owner, lessee, retired, protected…).
    pub attrs: Attributes,
    /// Set when a stored field did not decode: the node is shown with that error and every
    /// write of it is refused (the store's `NodeExt::writable`).
    pub corrupt: Option<Corrupt>,
    /// What the node's agent last said of itself. Read with the node, written only by the
    /// store's `record_liveness`: never by a node update, and it never moves the version.
    pub liveness: Liveness,
    /// The chassis the node is in (Ironic's `chassis_uuid`).
    pub chassis_uuid: Option<String>,
    /// Hardware health the BMC last reported (`OK`, `Warning`, `Critical`; 1.109), kept by
    /// power sync (the conductor's power sync); `None` when the driver reports none.
    pub health: Option<String>,
    /// The allocation holding the node (1.52): read from the allocations, never written
    /// with the node.
    pub allocation_uuid: Option<String>,
}

/// Ironic's descriptive, ownership and lifecycle fields of a node, each in its own column.
/// Most are stored and shown only; `protected` and `retired` change what may happen to the
/// node, as in Ironic (see `api::nodes` and the conductor's verbs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Attributes {
    /// Project that owns the node (1.50).
    pub owner: Option<String>,
    /// Project the node is leased to (1.65).
    pub lessee: Option<String>,
    /// Free text (1.51).
    pub description: Option<String>,
    /// Conductor group (1.46); empty is the default group.
    pub conductor_group: String,
    /// Shard (1.82).
    pub shard: Option<String>,
    /// Name of the instance on the node (1.104).
    pub instance_name: Option<String>,
    /// UUID of the parent node (1.83).
    pub parent_node: Option<String>,
    /// Network configuration for the instance's configdrive (1.66).
    pub network_data: Map<String, Value>,
    /// Retired: no new deployments; cleaning ends in manageable (1.61).
    pub retired: bool,
    /// Why it is retired.
    pub retired_reason: Option<String>,
    /// Protected: undeploy, rebuild and delete are refused (1.48).
    pub protected: bool,
    /// Why it is protected.
    pub protected_reason: Option<String>,
    /// Never power the node off (1.95).
    pub disable_power_off: bool,
}

/// Agent liveness and step progress: written on every few heartbeats, so kept outside the
/// node's version. Heartbeats neither invalidate ETags nor make API writes conflict, and an
/// API write cannot roll them back (node updates do not write these columns).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Liveness {
    /// Last lookup or heartbeat of the node's agent.
    pub last_heartbeat: Option<DateTime<Utc>>,
    /// Version the agent reported.
    pub agent_version: Option<String>,
    /// Progress of the running command: `{"command_id", "step", "progress"}`.
    pub progress: Option<Value>,
}

impl Node {
    /// `step` (the node's `clean_step` or `deploy_step`) as shown: with the progress its agent
    /// last reported for the command running it (`{"done", "total", "message", "rate"}`);
    /// an earlier command's progress is not shown. None and `{}` stay as they are.
    pub fn step_with_progress(&self, step: &Option<Value>) -> Option<Value> {
        let mut step = step.clone()?;
        let running = self.runs.running_command();
        let progress = self
            .liveness
            .progress
            .as_ref()
            .filter(|p| running.is_some() && p.get("command_id").and_then(Value::as_str) == running)
            .and_then(|p| p.get("progress"));
        if let (Some(p), Some(obj)) = (progress, step.as_object_mut()) {
            if !obj.is_empty() {
                obj.insert("progress".into(), p.clone());
            }
        }
        Some(step)
    }

    /// A new node in `enroll`.
    pub fn new(uuid: String, driver: String) -> Node {
        Node {
            uuid,
            name: None,
            driver,
            driver_info: Map::new(),
            driver_internal_info: Map::new(),
            properties: Map::new(),
            instance_info: Map::new(),
            instance_uuid: None,
            extra: Map::new(),
            provision_state: ProvisionState::Enroll,
            target_provision_state: None,
            provision_updated_at: None,
            power_state: None,
            target_power_state: None,
            maintenance: false,
            maintenance_reason: None,
            fault: None,
            last_error: None,
            clean_step: None,
            deploy_step: None,
            reservation: None,
            conductor: None,
            automated_clean: None,
            resource_class: None,
            created_at: Utc::now(),
            updated_at: None,
            version: 0,
            inspect_interface: None,
            inspection_started_at: None,
            inspection_finished_at: None,
            traits: Vec::new(),
            interfaces: crate::interfaces::Interfaces::default(),
            runs: crate::runs::Runs::default(),
            attrs: Attributes::default(),
            corrupt: None,
            liveness: Liveness::default(),
            chassis_uuid: None,
            health: None,
            allocation_uuid: None,
        }
    }

    /// Name if set, else UUID: what messages call the node.
    pub fn ident(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.uuid)
    }
}

/// What the conductor's scans and the agent's heartbeats read of a node: the fields timeouts,
/// hand-over and the agent session need, without the JSON documents (and the sealed secrets)
/// a full read decodes. Whoever decides to write the node reads it whole first.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSummary {
    /// UUID.
    pub uuid: String,
    /// Unique name.
    pub name: Option<String>,
    /// Provision state.
    pub provision_state: ProvisionState,
    /// Maintenance flag.
    pub maintenance: bool,
    /// Controller holding the node's lease.
    pub reservation: Option<String>,
    /// Last provision state change.
    pub provision_updated_at: Option<DateTime<Utc>>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Running clean step.
    pub clean_step: Option<Value>,
    /// Running deploy step.
    pub deploy_step: Option<Value>,
    /// The conductor's run state.
    pub runs: crate::runs::Runs,
    /// What the node's agent last said of itself.
    pub liveness: Liveness,
    /// One of the fields read does not decode (the full read says which).
    pub corrupt: bool,
}

impl NodeSummary {
    /// The summary of a node read whole.
    pub fn of(n: &Node) -> NodeSummary {
        NodeSummary {
            uuid: n.uuid.clone(),
            name: n.name.clone(),
            provision_state: n.provision_state,
            maintenance: n.maintenance,
            reservation: n.reservation.clone(),
            provision_updated_at: n.provision_updated_at,
            created_at: n.created_at,
            clean_step: n.clean_step.clone(),
            deploy_step: n.deploy_step.clone(),
            runs: n.runs.clone(),
            liveness: n.liveness.clone(),
            corrupt: n.corrupt.is_some(),
        }
    }

    /// Name if set, else UUID: what messages call the node.
    pub fn ident(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.uuid)
    }
}

/// The first stored field of a node that did not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corrupt {
    /// Column name (`driver_internal_info`, `provision_state`…).
    pub field: &'static str,
    /// What the decoder said, shortened.
    pub error: String,
}

impl Corrupt {
    /// What an operator reads on the node and in refusals.
    pub fn message(&self, node: &str) -> String {
        format!(
            "node {node}: the stored {} does not decode ({}); the record is kept as stored and \
             refused for writes — repair that column in the database (sqlite3/psql), then retry",
            self.field, self.error
        )
    }
}

/// A chassis (Ironic's grouping of nodes).
#[derive(Debug, Clone, PartialEq)]
pub struct Chassis {
    /// UUID.
    pub uuid: String,
    /// Free text.
    pub description: Option<String>,
    /// Operator data.
    pub extra: Map<String, Value>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last write.
    pub updated_at: Option<DateTime<Utc>>,
    /// Version.
    pub version: i64,
}
