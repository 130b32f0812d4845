//! The node's boot interface: how the ramdisk is booted and how it is put away again.
//!
//! - `ipxe` / `pxe` (and `fake`, whose BMC is in memory): a one-time network boot override and
//!   a reboot; dnsmasq chains the machine to rivetd's per-node iPXE script (`api::boot`).
//! - `redfish-virtual-media`: the BMC downloads the node's ISO from rivetd (`bootiso`), boots
//!   it from its virtual CD once, and the CD is ejected when the ramdisk's work is over
//!   (before the instance boots, and when cleaning or inspection ends), so the instance never
//!   sees it and the next boot is not the ramdisk by accident.
//!
//! Everything the BMC needs is checked before it is asked, so a missing ISO or URL fails the
//! node with a message that says which setting to fix.

use super::Conductor;
use rivet_drivers::{Bmc, BootDevice, BootMode, DriverError};
use rivet_model::interfaces::Iface;
use rivet_model::node::Node;
use rivet_protocol::states::PowerState;

/// Ironic's name for booting the ramdisk from the BMC's virtual CD.
pub const VIRTUAL_MEDIA: &str = "redfish-virtual-media";

/// How a node's ramdisk reaches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BootMethod {
    /// PXE/iPXE from the network.
    Network,
    /// The BMC's virtual CD.
    VirtualMedia,
}

impl BootMethod {
    /// The node's boot interface as a method.
    pub(crate) fn of(node: &Node) -> BootMethod {
        match node.interfaces.get(&node.driver, Iface::Boot).as_str() {
            VIRTUAL_MEDIA => BootMethod::VirtualMedia,
            _ => BootMethod::Network,
        }
    }

    /// The one-time boot device that starts the ramdisk.
    pub(crate) fn ramdisk_device(self) -> BootDevice {
        match self {
            BootMethod::Network => BootDevice::Pxe,
            BootMethod::VirtualMedia => BootDevice::Cdrom,
        }
    }
}

impl Conductor {
    /// Boot the node into the ramdisk, the BMC first put in the node's effective boot mode
    /// (returned). A new boot means a new agent token, so the old one is forgotten here.
    pub(crate) async fn boot_ramdisk(
        &self,
        node: &mut Node,
        bmc: &dyn Bmc,
    ) -> Result<BootMode, DriverError> {
        // Before anything else: settings that do not resolve fail here, before the BMC
        // is asked for anything.
        let mode = self.apply_boot_mode(node, bmc).await?.mode;
        let method = BootMethod::of(node);
        if method == BootMethod::VirtualMedia {
            let url =
                rivet_support::bootiso::check(&self.config.boot, &node.uuid).map_err(|e| {
                    DriverError::Unsupported {
                        driver: VIRTUAL_MEDIA.into(),
                        operation: format!("booting node {} from virtual media: {e}", node.ident()),
                    }
                })?;
            // Insert first: a BMC that swaps the CD's image may drop the CD from its boot
            // order, so the override comes after.
            bmc.insert_virtual_media(&node.uuid, &node.driver_info, &url)
                .await?;
        }
        bmc.set_boot_device(
            &node.uuid,
            &node.driver_info,
            method.ramdisk_device(),
            Some(mode),
        )
        .await?;
        bmc.set_power(&node.uuid, &node.driver_info, PowerState::Rebooting)
            .await?;
        node.power_state = Some(PowerState::On);
        super::agent::forget_agent_token(node);
        Ok(mode)
    }

    /// Put the ramdisk's boot medium away: eject the virtual CD. Network boot leaves nothing
    /// behind (its override was used up by the boot).
    pub(crate) async fn clean_up_ramdisk(
        &self,
        node: &Node,
        bmc: &dyn Bmc,
    ) -> Result<(), DriverError> {
        match BootMethod::of(node) {
            BootMethod::Network => Ok(()),
            BootMethod::VirtualMedia => {
                bmc.eject_virtual_media(&node.uuid, &node.driver_info).await
            }
        }
    }

    /// [`Self::clean_up_ramdisk`] where a failure must not fail the node (the run is over and
    /// the machine is off): it is logged with what to do.
    pub(crate) async fn clean_up_ramdisk_logged(&self, node: &Node, bmc: &dyn Bmc) {
        if let Err(e) = self.clean_up_ramdisk(node, bmc).await {
            tracing::warn!(node = %node.uuid, error = %e, "could not eject the ramdisk's virtual media; the next boot of this node may start the ramdisk again until it is ejected");
        }
    }

    /// The end of a ramdisk `operation` (`cleaning`, `inspection`) that fast track does not
    /// keep running: power off (disable_power_off: a reboot instead, see power_policy), the
    /// boot medium put away, and the agent's token forgotten, its boot being over. `Err`:
    /// the message to fail the node with.
    pub(crate) async fn end_ramdisk(
        &self,
        node: &mut Node,
        bmc: &dyn Bmc,
        operation: &str,
    ) -> Result<(), String> {
        if let Err(e) = self.power_off_unless_kept_on(node, bmc).await {
            return Err(format!(
                "failed to power off node {} after {operation}: {e}",
                node.ident()
            ));
        }
        node.power_state = Some(super::power_policy::state_after_off(node));
        self.clean_up_ramdisk_logged(node, bmc).await;
        if let Err(e) = self.reboot_if_kept_on(node, bmc).await {
            return Err(format!(
                "failed to reboot node {} after {operation} (it has disable_power_off): {e}",
                node.ident()
            ));
        }
        super::agent::forget_agent_token(node);
        Ok(())
    }
}
