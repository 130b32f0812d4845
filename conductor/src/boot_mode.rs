//! The node's boot mode and Secure Boot on its BMC, as Ironic's `boot_mode_utils` handles
//! them: before every ramdisk boot and before the instance boots, the BMC is put in the
//! node's effective mode ([`rivet_model::boot_mode::resolve`]) and read back; the instance
//! gets Secure Boot when it asks for it, and undeploy turns off what Rivet turned on. Every
//! change is followed by a read of the BMC into the node's `boot_mode`/`secure_boot` fields.
//!
//! A driver that cannot read the mode (ipmi) is left alone, as Ironic leaves it: its boot
//! device override carries the mode instead (IPMI's EFI boot flag).

use super::Conductor;
use rivet_drivers::{Bmc, BootMode, DriverError};
use rivet_model::boot_mode::{resolve, Effective};
use rivet_model::internal_info;
use rivet_model::node::Node;

/// `uefi`, `bios`, or what a BMC that does not say reads as.
fn shown(mode: Option<BootMode>) -> &'static str {
    mode.map_or("no boot mode", BootMode::as_str)
}

impl Conductor {
    /// The node's effective mode from its settings, the BMC's report standing in at its level.
    fn effective(&self, node: &Node, bmc_mode: Option<BootMode>) -> Result<Effective, DriverError> {
        resolve(
            &node.instance_info,
            &node.properties,
            &node.driver_info,
            bmc_mode,
            self.config.deploy.default_boot_mode,
        )
        .map_err(|e| DriverError::NodeSettings(format!("node {}: {e}", node.ident())))
    }

    /// The mode a boot device override names: resolved with the mode the BMC last reported
    /// (the node's `boot_mode` field), so an override costs no extra BMC read. Settings that
    /// do not resolve send no mode (logged): a reboot or teardown must not fail on them; the
    /// ramdisk and instance boots check them ([`Self::apply_boot_mode`]).
    pub async fn override_mode(&self, node: &Node) -> Option<BootMode> {
        let cached = match self.store.node_management(&node.uuid).await {
            Ok(m) => m.boot_mode.as_deref().and_then(BootMode::parse),
            Err(e) => {
                tracing::warn!(node = %node.uuid, error = %e, "cached boot mode not read");
                None
            }
        };
        match self.effective(node, cached) {
            Ok(e) => Some(e.mode),
            Err(e) => {
                tracing::warn!(node = %node.uuid, error = %e, "boot device override sent without a boot mode");
                None
            }
        }
    }

    /// Store what the BMC reports now as the node's `boot_mode` and `secure_boot`.
    async fn record_boot_state(&self, node: &Node, bmc: &dyn Bmc) {
        if let Err(e) = super::bmc_caches::refresh_boot_state(
            self.store.as_ref(),
            bmc,
            &node.uuid,
            &node.driver_info,
        )
        .await
        {
            tracing::warn!(node = %node.uuid, error = %e, "boot mode reading not stored");
        }
    }

    /// Put the BMC in the node's effective boot mode if it reports another, and check it
    /// took. Returns the effective mode (for the boot device override and the agent).
    pub(crate) async fn apply_boot_mode(
        &self,
        node: &Node,
        bmc: &dyn Bmc,
    ) -> Result<Effective, DriverError> {
        // `None`: the driver cannot read the mode; `Some(None)`: the BMC does not say.
        let reported = match bmc.boot_mode(&node.uuid, &node.driver_info).await {
            Ok((mode, secure)) => {
                // The node's fields show this reading; overrides resolve against it.
                let parsed = mode.as_deref().and_then(BootMode::parse);
                if let Err(e) = self.store.set_boot_state(&node.uuid, mode, secure).await {
                    tracing::warn!(node = %node.uuid, error = %e, "boot mode reading not stored");
                }
                Some(parsed)
            }
            Err(DriverError::Unsupported { .. }) => None,
            Err(e) => return Err(e),
        };
        let eff = self.effective(node, reported.flatten())?;
        let current = match reported {
            None => {
                tracing::debug!(node = %node.uuid, mode = eff.mode.as_str(), "driver reads no boot mode; the boot override carries it");
                return Ok(eff);
            }
            Some(current) if current == Some(eff.mode) => return Ok(eff),
            Some(current) => current,
        };
        tracing::info!(node = %node.uuid, from = shown(current), to = eff.mode.as_str(), source = eff.source.as_str(), "setting the boot mode");
        match bmc
            .set_boot_mode(&node.uuid, &node.driver_info, eff.mode.as_str())
            .await
        {
            Ok(()) => {}
            // The BMC does not say and cannot be told: assume it boots as asked (Ironic does).
            Err(DriverError::Unsupported { .. }) if current.is_none() => return Ok(eff),
            Err(DriverError::Unsupported { driver, .. }) => {
                return Err(DriverError::NodeSettings(format!(
                    "node {}: the BMC reports boot mode {} but {} asks for {}, and driver {driver} cannot change it; set the boot mode in the machine's firmware setup or change {}, then retry",
                    node.ident(),
                    shown(current),
                    eff.source.as_str(),
                    eff.mode.as_str(),
                    eff.source.as_str()
                )))
            }
            Err(e) => return Err(e),
        }
        let after = bmc
            .boot_mode(&node.uuid, &node.driver_info)
            .await?
            .0
            .as_deref()
            .and_then(BootMode::parse);
        self.record_boot_state(node, bmc).await;
        match after {
            Some(m) if m == eff.mode => Ok(eff),
            // A BMC that reports no mode cannot be checked; it was told.
            None => Ok(eff),
            Some(_) => Err(DriverError::Bmc(format!(
                "node {}: Rivet set boot mode {} ({}) but the BMC still reports {}; set the boot mode in the machine's firmware setup (or PUT /v1/nodes/{}/states/boot_mode) or change {}, then retry",
                node.ident(),
                eff.mode.as_str(),
                eff.source.as_str(),
                shown(after),
                node.ident(),
                eff.source.as_str()
            ))),
        }
    }

    /// Secure Boot state as the BMC reports it; a driver without it is an error naming what
    /// the operator can do (the instance asked for it: booting without it would be silent).
    async fn secure_boot_state(
        &self,
        node: &Node,
        bmc: &dyn Bmc,
    ) -> Result<Option<bool>, DriverError> {
        match bmc.boot_mode(&node.uuid, &node.driver_info).await {
            Ok((_, sb)) => Ok(sb),
            Err(DriverError::Unsupported { driver, .. }) => Err(DriverError::NodeSettings(format!(
                "node {}: the instance asks for Secure Boot (instance_info capabilities secure_boot:true) but driver {driver} cannot manage it; use a driver that can (redfish) or remove secure_boot from the capabilities",
                node.ident()
            ))),
            Err(e) => Err(e),
        }
    }

    /// Turn Secure Boot on for an instance that asks for it (`eff` from
    /// [`Self::apply_boot_mode`]), check it took, and record that Rivet turned it on.
    pub(crate) async fn apply_secure_boot(
        &self,
        node: &mut Node,
        bmc: &dyn Bmc,
        eff: &Effective,
    ) -> Result<(), DriverError> {
        if !eff.secure_boot {
            // An instance that does not ask for Secure Boot after one Rivet turned it on for
            // (a rebuild with a new instance_info): off before it boots, as undeploy would
            // have left the machine. Ironic leaves it on here (its clean-up reads only the
            // new instance_info). A machine that had it on by itself keeps it.
            if internal_info::secure_boot_enabled_by_rivet(&node.driver_internal_info) {
                self.undo_secure_boot(node, bmc).await?;
                internal_info::set_secure_boot_enabled_by_rivet(
                    &mut node.driver_internal_info,
                    false,
                );
            }
            return Ok(());
        }
        if eff.mode != BootMode::Uefi {
            return Err(DriverError::NodeSettings(format!(
                "node {}: Secure Boot needs uefi but the boot mode is {} ({}); ask for uefi",
                node.ident(),
                eff.mode.as_str(),
                eff.source.as_str()
            )));
        }
        if self.secure_boot_state(node, bmc).await? == Some(true) {
            tracing::info!(node = %node.uuid, "Secure Boot already on");
            return Ok(());
        }
        match bmc.set_secure_boot(&node.uuid, &node.driver_info, true).await {
            Err(DriverError::Unsupported { driver, .. }) => {
                return Err(DriverError::NodeSettings(format!(
                    "node {}: the instance asks for Secure Boot but driver {driver} cannot turn it on; use a driver that can (redfish) or remove secure_boot from instance_info capabilities",
                    node.ident()
                )))
            }
            r => r?,
        }
        let after = self.secure_boot_state(node, bmc).await?;
        self.record_boot_state(node, bmc).await;
        if after != Some(true) {
            return Err(DriverError::Bmc(format!(
                "node {}: Rivet turned Secure Boot on but the BMC reports it {}; turn it on in the machine's firmware setup (some BMCs apply it only at the next boot) or remove secure_boot from instance_info capabilities, then retry",
                node.ident(),
                if after == Some(false) { "off" } else { "unknown" }
            )));
        }
        internal_info::set_secure_boot_enabled_by_rivet(&mut node.driver_internal_info, true);
        tracing::info!(node = %node.uuid, "Secure Boot turned on for the instance");
        Ok(())
    }

    /// At undeploy, or before an instance that does not ask for it boots: turn Secure Boot
    /// off again if Rivet turned it on (Ironic's `clean_up_instance`), and check it took. The
    /// caller forgets the mark once that is stored.
    pub(crate) async fn undo_secure_boot(
        &self,
        node: &Node,
        bmc: &dyn Bmc,
    ) -> Result<(), DriverError> {
        if !internal_info::secure_boot_enabled_by_rivet(&node.driver_internal_info) {
            return Ok(());
        }
        bmc.set_secure_boot(&node.uuid, &node.driver_info, false)
            .await?;
        let after = bmc.boot_mode(&node.uuid, &node.driver_info).await?.1;
        self.record_boot_state(node, bmc).await;
        if after == Some(true) {
            return Err(DriverError::Bmc(format!(
                "node {}: Rivet turned Secure Boot off (it had turned it on for the instance) but the BMC still reports it on; turn it off in the machine's firmware setup or with PUT /v1/nodes/{}/states/secure_boot, then retry (send `deleted` or the rebuild again)",
                node.ident(),
                node.ident()
            )));
        }
        tracing::info!(node = %node.uuid, "Secure Boot turned off after the instance");
        Ok(())
    }
}
