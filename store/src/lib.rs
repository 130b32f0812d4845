//! The store: node and port records behind one trait, with two backends side by side:
//! [`sqlite`] (one file, the embedded default) and [`postgres`] (shared by several
//! controllers). Both keep the same numbered migrations, apply them at open and refuse a
//! schema newer than the build; `rivetd db upgrade` applies them without serving.
//!
//! Every write is optimistic: an update names the `version` it read and fails with
//! [`StoreError::Conflict`] when someone wrote in between. The version is the node's ETag.
//!
//! A layer of rivetd beside the drivers, above `rivet-model` and `rivet-support`: it never
//! talks to a BMC or decides anything about a node's life (the conductor does).
#![warn(missing_docs)]

pub mod allocations;
pub mod counts;
pub mod decode;
pub mod migrations;
pub mod node_logs;
pub mod node_resources;
pub mod ports;
pub mod postgres;
pub mod queries;
pub mod records;
pub mod sealing;
pub mod sql;
pub mod sqlite;

pub use allocations::{
    Allocation, AllocationQuery, StepTemplate, TemplateKind, TemplateQuery, ALLOCATION_SORT_KEYS,
    TEMPLATE_SORT_KEYS,
};
pub use node_logs::{NodeLog, NODE_LOGS_KEPT};
pub use node_resources::{
    BiosSetting, FirmwareComponent, FirmwareReading, NodeManagement, VolumeConnector, VolumeQuery,
    VolumeTarget, CONNECTOR_SORT_KEYS, TARGET_SORT_KEYS,
};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rivet_model::node::{Chassis, Liveness, Node, NodeSummary};
use rivet_model::port::{Port, Portgroup};
use rivet_protocol::agent::{Command, CommandResult};
use rivet_protocol::states::ProvisionState;
use serde_json::{Map, Value};

/// Store failures.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No record with that identifier.
    #[error("{kind} {ident} could not be found")]
    NotFound {
        /// "node" or "port".
        kind: &'static str,
        /// What was looked up.
        ident: String,
    },
    /// A unique field (name, MAC, UUID) is taken.
    #[error("{0}")]
    Duplicate(String),
    /// The record changed since it was read.
    #[error("{kind} {ident} was changed by another request (version {expected} is stale); reload it and retry")]
    Conflict {
        /// "node" or "port".
        kind: &'static str,
        /// Its UUID.
        ident: String,
        /// The version the caller had.
        expected: i64,
    },
    /// The database failed.
    #[error("database error: {0}")]
    Backend(String),
    /// The database cannot take requests for now (its disk is full, its server restarts or
    /// is out of reach): nothing was written, the same request may succeed later, and
    /// rivetd recovers by itself once the cause is gone. The message names the cause.
    #[error("{0}")]
    Unavailable(String),
    /// A sealed driver_info secret could not be opened (wrong key, altered value).
    #[error(transparent)]
    Secrets(#[from] rivet_support::secrets::SecretsError),
    /// A stored field of the node does not decode: the record is shown, never rewritten.
    #[error("{message}")]
    Corrupt {
        /// The node's UUID.
        node: String,
        /// The column that does not decode.
        field: &'static str,
        /// What to tell the operator.
        message: String,
    },
}

/// The store's handling of a [`Node`] record that is not plain data.
pub trait NodeExt {
    /// `Err(StoreError::Corrupt)` when this copy was read from a record with a field that
    /// does not decode: writing it back would replace the stored bytes with empty values.
    fn writable(&self) -> Result<(), StoreError>;
}

impl NodeExt for Node {
    fn writable(&self) -> Result<(), StoreError> {
        match &self.corrupt {
            None => Ok(()),
            Some(c) => Err(StoreError::Corrupt {
                node: self.uuid.clone(),
                field: c.field,
                message: c.message(self.ident()),
            }),
        }
    }
}

pub use ports::{PortgroupQuery, PORTGROUP_SORT_KEYS, PORT_SORT_KEYS};

/// Columns a chassis listing may sort by (besides `id`).
pub const CHASSIS_SORT_KEYS: &[&str] = &["id", "uuid", "description", "created_at"];

/// A chassis listing request.
#[derive(Debug, Clone)]
pub struct ChassisQuery {
    /// Page size.
    pub limit: usize,
    /// UUID of the last chassis of the previous page.
    pub marker: Option<String>,
    /// One of [`CHASSIS_SORT_KEYS`].
    pub sort_key: String,
    /// Direction.
    pub sort_dir: SortDir,
}

/// Sort order of a listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortDir {
    /// Ascending.
    Asc,
    /// Descending.
    Desc,
}

/// Columns a node listing may sort by.
pub const NODE_SORT_KEYS: &[&str] = &[
    "uuid",
    "name",
    "created_at",
    "updated_at",
    "provision_state",
    "provision_updated_at",
    "driver",
    "resource_class",
    "power_state",
    "maintenance",
];

/// A node listing request.
#[derive(Debug, Clone)]
pub struct NodeQuery {
    /// Page size.
    pub limit: usize,
    /// UUID of the last node of the previous page.
    pub marker: Option<String>,
    /// One of [`NODE_SORT_KEYS`].
    pub sort_key: String,
    /// Direction.
    pub sort_dir: SortDir,
    /// Filter.
    pub provision_state: Option<ProvisionState>,
    /// Filter.
    pub maintenance: Option<bool>,
    /// Filter.
    pub driver: Option<String>,
    /// Filter.
    pub resource_class: Option<String>,
    /// Filter.
    pub owner: Option<String>,
    /// Filter.
    pub lessee: Option<String>,
    /// Filter.
    pub conductor_group: Option<String>,
    /// Filter.
    pub shard: Option<String>,
    /// Filter.
    pub retired: Option<bool>,
    /// Filter: nodes with (true) or without (false) an instance.
    pub associated: Option<bool>,
    /// Filter.
    pub instance_uuid: Option<String>,
    /// Filter.
    pub fault: Option<String>,
    /// Filter: nodes in this chassis.
    pub chassis_uuid: Option<String>,
    /// Filter: nodes in any of these shards (Ironic's `shard=a,b`).
    pub shards: Vec<String>,
    /// Filter: nodes with (true) or without (false) a shard.
    pub sharded: Option<bool>,
    /// Filter.
    pub instance_name: Option<String>,
    /// Filter: nodes owned by or leased to this project.
    pub project: Option<String>,
    /// Filter: nodes whose description contains this text.
    pub description_contains: Option<String>,
    /// Filter: the children of this node (its UUID in their `parent_node`).
    pub parent_node: Option<String>,
    /// Leave out child nodes (those with a `parent_node`) unless `parent_node` asks for
    /// them: the API's default listing, as Ironic's. Internal listings see every node.
    pub hide_children: bool,
}

impl Default for NodeQuery {
    fn default() -> Self {
        NodeQuery {
            limit: 1000,
            marker: None,
            sort_key: "id".into(),
            sort_dir: SortDir::Asc,
            provision_state: None,
            maintenance: None,
            driver: None,
            resource_class: None,
            owner: None,
            lessee: None,
            conductor_group: None,
            shard: None,
            retired: None,
            associated: None,
            instance_uuid: None,
            fault: None,
            chassis_uuid: None,
            shards: Vec::new(),
            sharded: None,
            instance_name: None,
            project: None,
            description_contains: None,
            parent_node: None,
            hide_children: false,
        }
    }
}

/// A port listing request.
#[derive(Debug, Clone, Default)]
pub struct PortQuery {
    /// Only this node's ports.
    pub node_uuid: Option<String>,
    /// Only this MAC.
    pub address: Option<String>,
    /// Page size.
    pub limit: usize,
    /// UUID of the last port of the previous page.
    pub marker: Option<String>,
    /// Only this port group's ports.
    pub portgroup_uuid: Option<String>,
    /// Only ports of nodes in these shards.
    pub shards: Vec<String>,
    /// Only ports of nodes in these conductor groups.
    pub conductor_groups: Vec<String>,
    /// Only ports whose description contains this.
    pub description_contains: Option<String>,
    /// One of [`PORT_SORT_KEYS`]; empty means `id`.
    pub sort_key: String,
    /// Direction (ascending when absent).
    pub sort_dir: Option<SortDir>,
}

/// One row of the audit trail: a state-changing (or refused) admin request, or a provision
/// state transition and its cause. Append-only; never holds request bodies or secrets.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditEntry {
    /// Position in the trail, assigned by the store (ignored on append).
    pub seq: i64,
    /// When it happened.
    pub created_at: DateTime<Utc>,
    /// Who: `NAME (role ROLE)`, `anonymous (--no-auth)`, `unauthenticated (…)` or
    /// `conductor:ID`.
    pub actor: String,
    /// Peer address of the request, when known.
    pub source: Option<String>,
    /// HTTP method of the request (None for transitions).
    pub method: Option<String>,
    /// Request path (None for transitions).
    pub path: Option<String>,
    /// Node concerned: its UUID, or the identifier as given when it did not resolve.
    pub node_uuid: Option<String>,
    /// What: `node:create`, `provision:provide`, `transition`…
    pub action: String,
    /// HTTP status of the answer (None for transitions).
    pub status: Option<u16>,
    /// Short detail: an error message, the paths a patch changed, `from -> to (cause)`.
    pub detail: Option<String>,
}

/// An audit listing request.
#[derive(Debug, Clone)]
pub struct AuditQuery {
    /// Only rows about this node UUID (or identifier as recorded).
    pub node_uuid: Option<String>,
    /// Page size.
    pub limit: usize,
    /// `seq` of the last row of the previous page.
    pub marker: Option<i64>,
    /// `Desc` (newest first) or `Asc` (oldest first).
    pub sort_dir: SortDir,
}

impl Default for AuditQuery {
    fn default() -> Self {
        AuditQuery {
            node_uuid: None,
            limit: 1000,
            marker: None,
            sort_dir: SortDir::Desc,
        }
    }
}

/// `WHERE a AND b …` for a listing's conditions, or nothing when there are none (both
/// backends build their listings this way).
pub(crate) fn where_clause<S: AsRef<str>>(conditions: &[S]) -> String {
    if conditions.is_empty() {
        return String::new();
    }
    let parts: Vec<&str> = conditions.iter().map(AsRef::as_ref).collect();
    format!("WHERE {}", parts.join(" AND "))
}

/// The outcome of a statement that writes node `uuid`'s own row: one row, or `NotFound`.
pub fn one_node_row(rows: u64, uuid: &str) -> Result<(), StoreError> {
    if rows == 1 {
        Ok(())
    } else {
        Err(StoreError::NotFound {
            kind: "node",
            ident: uuid.to_string(),
        })
    }
}

/// A listing's page size: 0 means the default page of 1,000.
pub(crate) fn page_limit(limit: usize) -> usize {
    if limit == 0 {
        1000
    } else {
        limit
    }
}

/// The store interface.
#[async_trait]
pub trait Store: Send + Sync {
    /// Insert a node (version starts at 1).
    async fn create_node(&self, node: &Node) -> Result<Node, StoreError>;
    /// A node by UUID or name.
    async fn get_node(&self, ident: &str) -> Result<Node, StoreError>;
    /// A page of nodes.
    async fn list_nodes(&self, query: &NodeQuery) -> Result<Vec<Node>, StoreError>;
    /// Nodes in any of `states` (start-up recovery).
    async fn nodes_in_states(&self, states: &[ProvisionState]) -> Result<Vec<Node>, StoreError>;
    /// The [`NodeSummary`] of a node by UUID or name.
    async fn node_summary(&self, ident: &str) -> Result<NodeSummary, StoreError>;
    /// [`Store::node_summary`] and [`Store::pending_commands`] of one node in one statement
    /// (one snapshot, one round trip): what an agent heartbeat reads.
    async fn node_summary_and_pending(
        &self,
        ident: &str,
    ) -> Result<(NodeSummary, Vec<Command>), StoreError>;
    /// [`NodeSummary`]s of the nodes in any of `states`, oldest first (the periodic scans).
    async fn node_summaries(
        &self,
        states: &[ProvisionState],
    ) -> Result<Vec<NodeSummary>, StoreError>;
    /// One page of [`Store::node_summaries`]: up to `limit` of the nodes in any of `states`
    /// whose UUID sorts after `after` (from the first without), by UUID. A scan over a whole
    /// fleet reads it page by page, so that it never holds every node's summary at once.
    async fn node_summaries_page(
        &self,
        states: &[ProvisionState],
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<NodeSummary>, StoreError>;
    /// Write `node` if its version is still `node.version`; returns the stored node with the
    /// new version and `updated_at`.
    async fn update_node(&self, node: &Node) -> Result<Node, StoreError>;
    /// Write node `uuid`'s [`Liveness`]: one narrow statement, no version check, the
    /// version and `updated_at` untouched. `NotFound` when there is no such node. (The
    /// one-node case of [`Store::record_liveness_many`], so the statement exists once.)
    async fn record_liveness(&self, uuid: &str, liveness: &Liveness) -> Result<(), StoreError> {
        let n = self
            .record_liveness_many(&[(uuid.to_string(), liveness.clone())])
            .await?;
        one_node_row(n, uuid)
    }
    /// [`Store::record_liveness`] for many nodes in one statement (one transaction, one
    /// round trip); nodes that no longer exist are skipped. Each UUID at most once. Returns
    /// how many nodes were written.
    async fn record_liveness_many(&self, records: &[(String, Liveness)])
        -> Result<u64, StoreError>;
    /// Delete a node (and its ports) if its version is still `version`.
    async fn delete_node(&self, uuid: &str, version: i64) -> Result<(), StoreError>;
    /// Clear reservations held by `conductor` (a restart drops its old claims).
    async fn release_reservations(&self, conductor: &str) -> Result<u64, StoreError>;

    /// Register or refresh controller `id` (its registration heartbeat; `starting` resets
    /// `started_at`). Its node reservations live as long as these heartbeats do: times come
    /// from the database's clock where it has one, so controllers with skewed clocks still
    /// agree on who is alive.
    async fn conductor_heartbeat(
        &self,
        id: &str,
        hostname: &str,
        starting: bool,
    ) -> Result<(), StoreError>;
    /// Controller `id` stopped cleanly (its leases are handed back): it counts as dead at
    /// once instead of after `dead_after_s`. Its next registration heartbeat undoes this.
    async fn conductor_stopped(&self, id: &str) -> Result<(), StoreError>;
    /// Every registered controller; `alive` when it is online and heartbeat within
    /// `dead_after_s`.
    async fn list_conductors(&self, dead_after_s: u64) -> Result<Vec<ConductorRecord>, StoreError>;
    /// Take the reservation lease of node `uuid` for controller `id`, in one statement: only
    /// when the node is free, already `id`'s, or reserved by a controller that has not
    /// heartbeat within `dead_after_s` (a lease expires with its holder's heartbeat, so
    /// holding 10,000 nodes costs one row write per interval, not 10,000). The version moves
    /// when the holder changes, so a task working from an older copy cannot write.
    /// `Ok(false)` when another live controller holds it.
    async fn acquire_lease(
        &self,
        uuid: &str,
        id: &str,
        dead_after_s: u64,
    ) -> Result<bool, StoreError>;
    /// Give up `id`'s reservation of node `uuid` (the ring moved it to another controller).
    async fn release_lease(&self, uuid: &str, id: &str) -> Result<bool, StoreError>;
    /// Whether several controllers may share this store (PostgreSQL); SQLite is for one.
    fn is_shared(&self) -> bool {
        false
    }
    /// Tell every controller sharing this store. A single-process backend has nobody to
    /// tell.
    async fn publish(&self, _notice: &Notice) -> Result<(), StoreError> {
        Ok(())
    }
    /// Notices published by any controller (this one's included), when the backend carries
    /// them across processes. After a lost connection the stream yields [`Notice::Resync`],
    /// since notices may have been missed.
    fn subscribe(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<Notice>> {
        None
    }

    /// Insert a port.
    async fn create_port(&self, port: &Port) -> Result<Port, StoreError>;
    /// A port by UUID or name.
    async fn get_port(&self, uuid: &str) -> Result<Port, StoreError>;
    /// A page of ports.
    async fn list_ports(&self, query: &PortQuery) -> Result<Vec<Port>, StoreError>;
    /// Write a port if its version is unchanged.
    async fn update_port(&self, port: &Port) -> Result<Port, StoreError>;
    /// Delete a port.
    async fn delete_port(&self, uuid: &str) -> Result<(), StoreError>;
    /// Insert a port group.
    async fn create_portgroup(&self, pg: &Portgroup) -> Result<Portgroup, StoreError>;
    /// A port group by UUID or name.
    async fn get_portgroup(&self, ident: &str) -> Result<Portgroup, StoreError>;
    /// A page of port groups.
    async fn list_portgroups(&self, query: &PortgroupQuery) -> Result<Vec<Portgroup>, StoreError>;
    /// Write a port group if its version is unchanged.
    async fn update_portgroup(&self, pg: &Portgroup) -> Result<Portgroup, StoreError>;
    /// Delete a port group no port names: `Ok(false)` (nothing deleted) when ports are in it.
    async fn delete_portgroup(&self, uuid: &str) -> Result<bool, StoreError>;

    /// Insert a chassis.
    async fn create_chassis(&self, chassis: &Chassis) -> Result<Chassis, StoreError>;
    /// A chassis by UUID.
    async fn get_chassis(&self, uuid: &str) -> Result<Chassis, StoreError>;
    /// A page of chassis.
    async fn list_chassis(&self, query: &ChassisQuery) -> Result<Vec<Chassis>, StoreError>;
    /// Write a chassis if its version is unchanged.
    async fn update_chassis(&self, chassis: &Chassis) -> Result<Chassis, StoreError>;
    /// Delete a chassis that holds no node: `Ok(false)` (nothing deleted) when nodes name it.
    async fn delete_chassis(&self, uuid: &str) -> Result<bool, StoreError>;
    /// Insert a volume connector.
    async fn create_volume_connector(
        &self,
        c: &VolumeConnector,
    ) -> Result<VolumeConnector, StoreError>;
    /// A volume connector by UUID.
    async fn get_volume_connector(&self, uuid: &str) -> Result<VolumeConnector, StoreError>;
    /// A page of volume connectors.
    async fn list_volume_connectors(
        &self,
        q: &VolumeQuery,
    ) -> Result<Vec<VolumeConnector>, StoreError>;
    /// Write a volume connector.
    async fn update_volume_connector(
        &self,
        c: &VolumeConnector,
    ) -> Result<VolumeConnector, StoreError>;
    /// Delete a volume connector.
    async fn delete_volume_connector(&self, uuid: &str) -> Result<(), StoreError>;
    /// Insert a volume target.
    async fn create_volume_target(&self, t: &VolumeTarget) -> Result<VolumeTarget, StoreError>;
    /// A volume target by UUID.
    async fn get_volume_target(&self, uuid: &str) -> Result<VolumeTarget, StoreError>;
    /// A page of volume targets.
    async fn list_volume_targets(&self, q: &VolumeQuery) -> Result<Vec<VolumeTarget>, StoreError>;
    /// Write a volume target.
    async fn update_volume_target(&self, t: &VolumeTarget) -> Result<VolumeTarget, StoreError>;
    /// Delete a volume target.
    async fn delete_volume_target(&self, uuid: &str) -> Result<(), StoreError>;
    /// Replace a node's cached BIOS settings.
    async fn set_bios_settings(
        &self,
        node_uuid: &str,
        settings: &[BiosSetting],
    ) -> Result<(), StoreError>;
    /// A node's cached BIOS settings, by name.
    async fn list_bios_settings(&self, node_uuid: &str) -> Result<Vec<BiosSetting>, StoreError>;
    /// Record a node's firmware components as its BMC reports them.
    async fn set_firmware_components(
        &self,
        node_uuid: &str,
        components: &[FirmwareReading],
    ) -> Result<(), StoreError>;
    /// A node's cached firmware components, by name.
    async fn list_firmware_components(
        &self,
        node_uuid: &str,
    ) -> Result<Vec<FirmwareComponent>, StoreError>;
    /// A node's RAID configurations and boot state; defaults when never set.
    async fn node_management(&self, node_uuid: &str) -> Result<NodeManagement, StoreError>;
    /// [`NodeManagement`] of each of `uuids` that has one.
    async fn node_managements(
        &self,
        uuids: &[String],
    ) -> Result<std::collections::HashMap<String, NodeManagement>, StoreError>;
    /// Record the boot mode and secure boot state a node's BMC reports.
    async fn set_boot_state(
        &self,
        node_uuid: &str,
        boot_mode: Option<String>,
        secure_boot: Option<bool>,
    ) -> Result<(), StoreError>;
    /// Record whether a node's console is enabled.
    async fn set_console_enabled(&self, node_uuid: &str, enabled: bool) -> Result<(), StoreError>;
    /// UUIDs of the nodes whose console is enabled (re-opened when rivetd starts).
    async fn console_enabled_nodes(&self) -> Result<Vec<String>, StoreError>;
    /// Set a node's `target_raid_config`.
    async fn set_target_raid_config(
        &self,
        node_uuid: &str,
        target: &Map<String, Value>,
    ) -> Result<(), StoreError>;
    /// Set a node's `raid_config`: what its RAID steps built (`{}` after a delete).
    async fn set_raid_config(
        &self,
        node_uuid: &str,
        current: &Map<String, Value>,
    ) -> Result<(), StoreError>;
    /// UUIDs of the child nodes of `parent` (their `parent_node`).
    async fn child_nodes(&self, parent: &str) -> Result<Vec<String>, StoreError>;
    /// Node UUID owning any of these MACs (lookup).
    async fn node_by_macs(&self, macs: &[String]) -> Result<Option<String>, StoreError>;
    /// Node UUID whose `properties.system_uuid` or `properties.system_serial` matches.
    async fn node_by_system(
        &self,
        system_uuid: Option<&str>,
        serial: Option<&str>,
    ) -> Result<Option<String>, StoreError>;

    /// Queue a command for a node's agent.
    async fn enqueue_command(&self, node_uuid: &str, command: &Command) -> Result<(), StoreError>;
    /// A node's commands without a result, oldest first.
    async fn pending_commands(&self, node_uuid: &str) -> Result<Vec<Command>, StoreError>;
    /// Store a command's result. `Ok(true)` when it is new, `Ok(false)` when it was already
    /// stored (a re-delivery), `NotFound` when no such command was queued for the node.
    async fn record_result(
        &self,
        node_uuid: &str,
        result: &CommandResult,
    ) -> Result<bool, StoreError>;
    /// A command and its result, if any.
    async fn command(&self, node_uuid: &str, id: &str) -> Result<StoredCommand, StoreError>;
    /// Drop a node's queued commands that have no result (a new ramdisk boot starts afresh).
    async fn cancel_pending(&self, node_uuid: &str) -> Result<u64, StoreError>;
    /// Keep the agent log of a failed step with its node (the newest [`NODE_LOGS_KEPT`]).
    async fn add_node_log(&self, log: &NodeLog) -> Result<NodeLog, StoreError>;
    /// A node's kept agent logs, newest first.
    async fn list_node_logs(&self, node_uuid: &str) -> Result<Vec<NodeLog>, StoreError>;
    /// One of a node's kept agent logs.
    async fn get_node_log(&self, node_uuid: &str, id: i64) -> Result<NodeLog, StoreError>;

    /// Create or replace an inspection rule (its JSON document).
    async fn put_rule(&self, uuid: &str, priority: i64, body: &Value) -> Result<(), StoreError>;
    /// Every rule, highest priority first, then oldest first.
    async fn list_rules(&self) -> Result<Vec<Value>, StoreError>;
    /// Delete a rule.
    async fn delete_rule(&self, uuid: &str) -> Result<(), StoreError>;

    /// Store the inventory the agent reported.
    async fn save_inventory(&self, node_uuid: &str, inventory: &Value) -> Result<(), StoreError>;
    /// The last inventory and when it was collected.
    async fn get_inventory(&self, node_uuid: &str) -> Result<(Value, DateTime<Utc>), StoreError>;

    /// Append a row to the audit trail.
    async fn append_audit(&self, entry: &AuditEntry) -> Result<(), StoreError>;
    /// A page of the audit trail in `query.sort_dir` order of `seq`.
    async fn list_audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError>;

    /// Nodes per shard (`GET /v1/shards`): `(shard, count)`, the most populated first; the
    /// nodes without a shard count under `None`.
    async fn shard_counts(&self) -> Result<Vec<(Option<String>, i64)>, StoreError>;
    /// Node counts by provision state, power state, maintenance and lease holder (the
    /// `/metrics` scrape).
    async fn node_counts(&self) -> Result<Vec<counts::NodeCount>, StoreError>;

    /// Insert an allocation (version starts at 1); `Duplicate` for a taken UUID, name or node.
    async fn create_allocation(&self, a: &Allocation) -> Result<Allocation, StoreError>;
    /// An allocation by UUID or name.
    async fn get_allocation(&self, ident: &str) -> Result<Allocation, StoreError>;
    /// The allocation holding node `node_uuid`, if any.
    async fn allocation_of_node(&self, node_uuid: &str) -> Result<Option<Allocation>, StoreError>;
    /// A page of allocations.
    async fn list_allocations(&self, q: &AllocationQuery) -> Result<Vec<Allocation>, StoreError>;
    /// Write an allocation if its version is unchanged; `Duplicate` when its node is held by
    /// another allocation.
    async fn update_allocation(&self, a: &Allocation) -> Result<Allocation, StoreError>;
    /// Delete an allocation.
    async fn delete_allocation(&self, uuid: &str) -> Result<(), StoreError>;
    /// Insert a deploy template or runbook.
    async fn create_template(&self, t: &StepTemplate) -> Result<StepTemplate, StoreError>;
    /// A deploy template or runbook by UUID or name.
    async fn get_template(
        &self,
        kind: TemplateKind,
        ident: &str,
    ) -> Result<StepTemplate, StoreError>;
    /// A page of deploy templates or runbooks.
    async fn list_templates(&self, q: &TemplateQuery) -> Result<Vec<StepTemplate>, StoreError>;
    /// Write a template if its version is unchanged.
    async fn update_template(&self, t: &StepTemplate) -> Result<StepTemplate, StoreError>;
    /// Delete a template.
    async fn delete_template(&self, kind: TemplateKind, uuid: &str) -> Result<(), StoreError>;
}

/// A controller registered in the store.
#[derive(Debug, Clone, PartialEq)]
pub struct ConductorRecord {
    /// Its conductor id (Ironic shows it as `hostname`).
    pub id: String,
    /// The host it runs on.
    pub hostname: String,
    /// When it (last) started.
    pub started_at: DateTime<Utc>,
    /// Its last registration heartbeat.
    pub last_seen: DateTime<Utc>,
    /// Whether it heartbeat recently enough to own nodes.
    pub alive: bool,
}

/// A message between controllers sharing one store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// Node work is ready: its owner should drive it.
    Kick {
        /// Controller that sent it.
        from: String,
        /// Node UUID.
        node: String,
    },
    /// Something for a node's agent: wake its long poll wherever it is held.
    Wake {
        /// Controller that sent it.
        from: String,
        /// Node UUID.
        node: String,
    },
    /// Notices may have been lost (the listening connection dropped): look again.
    Resync,
}

impl Notice {
    /// The text carried by the database (`k|node|from`, `w|node|from`; the node UUID has
    /// no `|`, the controller id may).
    pub fn encode(&self) -> String {
        match self {
            Notice::Kick { from, node } => format!("k|{node}|{from}"),
            Notice::Wake { from, node } => format!("w|{node}|{from}"),
            Notice::Resync => "r".into(),
        }
    }

    /// Parse [`Notice::encode`]'s text; `None` for anything else.
    pub fn decode(text: &str) -> Option<Notice> {
        let mut parts = text.splitn(3, '|');
        let kind = parts.next()?;
        if kind == "r" {
            return Some(Notice::Resync);
        }
        let node = parts.next()?.to_string();
        let from = parts.next()?.to_string();
        match kind {
            "k" => Some(Notice::Kick { from, node }),
            "w" => Some(Notice::Wake { from, node }),
            _ => None,
        }
    }
}

/// A queued agent command and its result.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredCommand {
    /// The command.
    pub command: Command,
    /// Its result once the agent reported it.
    pub result: Option<CommandResult>,
}

/// Open the store named by a `--db` URL (`sqlite:PATH` or `postgres://…`), applying pending
/// migrations. `secrets` seals driver_info secrets on write and opens them on read
/// ([`rivet_support::secrets::Secrets::ephemeral`] for a throwaway store).
pub fn open(
    url: &str,
    secrets: std::sync::Arc<rivet_support::secrets::Secrets>,
) -> Result<std::sync::Arc<dyn Store>, StoreError> {
    open_with(url, secrets, &rivet_model::config::StoreConfig::default())
}

/// [`open`] with the connection settings of `[store]`.
pub fn open_with(
    url: &str,
    secrets: std::sync::Arc<rivet_support::secrets::Secrets>,
    options: &rivet_model::config::StoreConfig,
) -> Result<std::sync::Arc<dyn Store>, StoreError> {
    match backend_of(url)? {
        Backend::Sqlite(path) => Ok(std::sync::Arc::new(sqlite::SqliteStore::open_with(
            path,
            secrets,
            options.sqlite_readers,
        )?)),
        Backend::Postgres => Ok(std::sync::Arc::new(postgres::PostgresStore::open_with(
            url,
            secrets,
            options.postgres_pool,
        )?)),
    }
}

/// Apply pending migrations to the database at `url` and return the schema versions before
/// and after (`rivetd db upgrade`). Refuses a schema newer than this build.
pub fn upgrade(url: &str) -> Result<(i64, i64), StoreError> {
    match backend_of(url)? {
        Backend::Sqlite(path) => sqlite::upgrade(path),
        Backend::Postgres => postgres::PostgresStore::upgrade(url),
    }
}

enum Backend<'a> {
    Sqlite(&'a str),
    Postgres,
}

fn backend_of(url: &str) -> Result<Backend<'_>, StoreError> {
    if let Some(path) = url.strip_prefix("sqlite:") {
        Ok(Backend::Sqlite(path.strip_prefix("//").unwrap_or(path)))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Backend::Postgres)
    } else {
        Err(StoreError::Backend(format!(
            "unsupported database URL {:?}: expected sqlite:PATH or postgres://USER:PASSWORD@HOST:PORT/DB",
            redact_url(url)
        )))
    }
}

/// `url` with any password replaced by `****`, for messages and logs.
pub fn redact_url(url: &str) -> String {
    let mut out = url.to_string();
    // postgres://user:password@host…
    if let Some(start) = out.find("://").map(|i| i + 3) {
        let end = out[start..]
            .find(['/', '?'])
            .map_or(out.len(), |i| start + i);
        if let Some(at) = out[start..end].rfind('@').map(|i| start + i) {
            if let Some(colon) = out[start..at].find(':').map(|i| start + i) {
                out.replace_range(colon + 1..at, "****");
            }
        }
    }
    // …?password=… or key=value form
    if let Some(p) = out.find("password=").map(|i| i + "password=".len()) {
        let end = out[p..].find(['&', ' ']).map_or(out.len(), |i| p + i);
        out.replace_range(p..end, "****");
    }
    out
}

pub use rivet_model::records::normalize_mac;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("postgres://rivet:s3cret@127.0.0.1:5432/rivet"),
            "postgres://rivet:****@127.0.0.1:5432/rivet"
        );
        assert_eq!(
            redact_url("postgres://h/db?user=u&password=x&sslmode=disable"),
            "postgres://h/db?user=u&password=****&sslmode=disable"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("sqlite:/tmp/x.db"), "sqlite:/tmp/x.db");
    }

    #[test]
    fn unknown_scheme_is_refused() {
        let err = open(
            "mysql://u:pw@h/db",
            rivet_support::secrets::Secrets::ephemeral(),
        )
        .err()
        .expect("refused");
        assert!(err.to_string().contains("expected sqlite:PATH"), "{err}");
        assert!(!err.to_string().contains("pw"), "{err}");
    }
}
