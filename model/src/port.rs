//! A node's ports (its NICs) and port groups (bonds of them), as the API, the conductor and
//! the store exchange them. Plain data: reading and writing them is `rivet-store`'s.

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

/// A port (a NIC of a node).
#[derive(Debug, Clone, PartialEq)]
pub struct Port {
    /// UUID.
    pub uuid: String,
    /// Owning node UUID.
    pub node_uuid: String,
    /// MAC address, lower case.
    pub address: String,
    /// Whether the node PXE-boots from it.
    pub pxe_enabled: bool,
    /// Operator data.
    pub extra: Map<String, Value>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last write.
    pub updated_at: Option<DateTime<Utc>>,
    /// Version.
    pub version: i64,
    /// Ironic's later port fields.
    pub attrs: PortAttrs,
}

/// The port fields Ironic added after the MAC (API 1.18 onwards).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PortAttrs {
    /// Unique name (1.88).
    pub name: Option<String>,
    /// The port group it belongs to (1.24).
    pub portgroup_uuid: Option<String>,
    /// Physical network (1.34).
    pub physical_network: Option<String>,
    /// Ironic's own data: the attached VIF as `tenant_vif_port_id` (1.18, read-only).
    pub internal_info: Map<String, Value>,
    /// Switch port the NIC is cabled to (1.19).
    pub local_link_connection: Map<String, Value>,
    /// A Smart NIC (1.53).
    pub is_smartnic: bool,
    /// Free text (1.97).
    pub description: Option<String>,
    /// NIC vendor (1.100).
    pub vendor: Option<String>,
    /// Category (1.101).
    pub category: Option<String>,
    /// May join a dynamic port group (1.111).
    pub available_for_dynamic_portgroup: bool,
}

/// A port group (a bond of a node's ports).
#[derive(Debug, Clone, PartialEq)]
pub struct Portgroup {
    /// UUID.
    pub uuid: String,
    /// Unique name.
    pub name: Option<String>,
    /// Owning node UUID.
    pub node_uuid: String,
    /// MAC address, lower case.
    pub address: Option<String>,
    /// Operator data.
    pub extra: Map<String, Value>,
    /// Ironic's own data (the attached VIF).
    pub internal_info: Map<String, Value>,
    /// Bonding mode (1.26).
    pub mode: Option<String>,
    /// Bonding properties (1.26).
    pub properties: Map<String, Value>,
    /// Whether its ports may be used on their own.
    pub standalone_ports_supported: bool,
    /// Physical network (1.102).
    pub physical_network: Option<String>,
    /// Category (1.103).
    pub category: Option<String>,
    /// Created for a VIF, removed when it is detached (1.111).
    pub dynamic_portgroup: bool,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last write.
    pub updated_at: Option<DateTime<Utc>>,
    /// Version.
    pub version: i64,
}
