//! `disable_power_off` (API 1.95): where the conductor would power a node off at the end of
//! a task (cleaning finished, inspection finished, instance torn down, deploy switching to
//! the instance), a node with the flag set is never powered off; it is rebooted instead once
//! the task's boot configuration is in place, as Ironic does (`deploy_utils.tear_down_inband_*`,
//! `agent_base.tear_down_agent` / `boot_instance`). The decision lives here so every task
//! calls the same two functions.

use super::Conductor;
use rivet_drivers::{Bmc, DriverError};
use rivet_model::node::Node;
use rivet_protocol::states::PowerState;

/// Whether the conductor keeps this node powered (it reboots it instead of powering it off).
pub(crate) fn kept_on(node: &Node) -> bool {
    node.attrs.disable_power_off
}

/// The power state the node is in after [`Conductor::power_off_unless_kept_on`] and, where
/// the task reboots, [`Conductor::reboot_if_kept_on`].
pub(crate) fn state_after_off(node: &Node) -> PowerState {
    if kept_on(node) {
        PowerState::On
    } else {
        PowerState::Off
    }
}

/// The action that boots the instance at the end of a deploy: power on, or for a node that
/// was never powered off, a reboot (Ironic's `boot_instance`).
pub(crate) fn boot_action(node: &Node) -> PowerState {
    if kept_on(node) {
        PowerState::Rebooting
    } else {
        PowerState::On
    }
}

impl Conductor {
    /// The end-of-task power off, skipped for a node with `disable_power_off`.
    pub(crate) async fn power_off_unless_kept_on(
        &self,
        node: &Node,
        bmc: &dyn Bmc,
    ) -> Result<(), DriverError> {
        if kept_on(node) {
            tracing::info!(node = %node.uuid, "disable_power_off is set: not powering the node off");
            return Ok(());
        }
        bmc.set_power(&node.uuid, &node.driver_info, PowerState::Off)
            .await
    }

    /// For a node with `disable_power_off`, the reboot that replaces the power off, once the
    /// task's boot configuration is gone (so it does not boot the ramdisk or instance again).
    pub(crate) async fn reboot_if_kept_on(
        &self,
        node: &Node,
        bmc: &dyn Bmc,
    ) -> Result<(), DriverError> {
        if !kept_on(node) {
            return Ok(());
        }
        tracing::info!(node = %node.uuid, "disable_power_off is set: rebooting instead of powering off");
        bmc.set_power(&node.uuid, &node.driver_info, PowerState::Rebooting)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_turns_power_off_into_reboot() {
        let mut n = Node::new("u".into(), "fake-hardware".into());
        assert_eq!(state_after_off(&n), PowerState::Off);
        assert_eq!(boot_action(&n), PowerState::On);
        n.attrs.disable_power_off = true;
        assert_eq!(state_after_off(&n), PowerState::On);
        assert_eq!(boot_action(&n), PowerState::Rebooting);
    }
}
