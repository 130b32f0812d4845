//! What the port and port group APIs share, below both: the node lock refusal of their
//! writes, the states in which connectivity may change, and a node's or group's ports.

use super::ApiError;
use super::AppState;
use rivet_model::node::Node;
use rivet_model::port::Port;
use rivet_store::{PortQuery, StoreError};

/// 409 while another operation holds the node (Ironic's NodeLocked: port and port group
/// writes take the node's lock).
pub(super) fn refuse_locked(node: &Node) -> Result<(), ApiError> {
    match &node.reservation {
        Some(by) => Err(rivet_conductor::ConductorError::Locked {
            node: node.ident().to_string(),
            by: by.clone(),
            state: node.provision_state,
        }
        .into()),
        None => Ok(()),
    }
}

/// States in which a port's connectivity or a group's node may change (or in maintenance).
pub(super) fn connectivity_editable(node: &Node) -> bool {
    use rivet_protocol::states::ProvisionState as S;
    node.maintenance
        || matches!(
            node.provision_state,
            S::Enroll | S::Inspecting | S::InspectWait | S::Manageable
        )
}

/// Every port of a node, or of a port group (no page).
pub(super) async fn ports_of(
    state: &AppState,
    node: Option<&str>,
    group: Option<&str>,
) -> Result<Vec<Port>, StoreError> {
    let q = PortQuery {
        node_uuid: node.map(str::to_string),
        portgroup_uuid: group.map(str::to_string),
        ..Default::default()
    };
    state.conductor.store.list_ports(&q).await
}
