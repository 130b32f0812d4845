//! Discovery (`POST /agent/v1/discover`): a ramdisk whose lookup matched no node sends its
//! inventory; a controller with `[discovery] enabled = true` enrols a node for it (or names
//! the node that already has one of its MACs) and says what the ramdisk does next.

use crate::inventory::Inventory;
use crate::limits::{Limited, Limits};
use serde::{Deserialize, Serialize};

/// Where the agent posts its inventory.
pub const DISCOVER_PATH: &str = "/agent/v1/discover";

/// What the ramdisk sends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DiscoverRequest {
    /// The whole inventory; its interfaces' MACs become the node's ports.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub inventory: Inventory,
    /// Agent version.
    #[serde(default)]
    pub agent_version: String,
    /// The ramdisk's boot id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
}

// An inventory is what a heartbeat carries back from `get_inventory`: the same limits.
impl Limited for DiscoverRequest {
    fn limits() -> &'static Limits {
        &Limits::AGENT_HEARTBEAT
    }
}

/// What the ramdisk does once its node exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum DiscoveryEnd {
    /// Power the machine off.
    #[default]
    Poweroff,
    /// Keep looking up (the operator takes it from `enroll`).
    Wait,
}

/// The controller's answer (201 when it created the node, 200 when one already had a MAC).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DiscoverResponse {
    /// The node for this machine.
    pub node_uuid: String,
    /// Whether this request created it.
    pub created: bool,
    /// What to do now.
    pub end: DiscoveryEnd,
}
