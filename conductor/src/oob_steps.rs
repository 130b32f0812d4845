//! The end of an out-of-band step that asked for a reboot (`reboot_requested`, e.g. Redfish
//! `bios.apply_configuration`): reboot so the BMC applies what the step staged, let the
//! driver check the effect ([`Bmc::verify_step`]), and refresh the node's BIOS/firmware
//! caches so `GET /v1/nodes/{node}/bios` shows the new values. Cleaning reboots in its own
//! `step_done` and calls [`verify_and_refresh`]; servicing calls [`reboot_verify_refresh`].

use rivet_drivers::{Bmc, BootDevice, DriverError};
use rivet_model::node::Node;
use rivet_protocol::states::PowerState;
use rivet_store::Store;
use serde_json::Value;

use super::steps::PlannedStep;

/// Whether the step's own result still asks for the reboot: a driver that found nothing to
/// change says `"reboot_required": false` and the reboot is skipped (as Ironic does).
pub(crate) fn reboot_needed(step: &PlannedStep, result: &Value) -> bool {
    step.step.reboot_requested && result["reboot_required"] != false
}

/// After the step's reboot: the driver's check, then the caches (refreshed even when the
/// check fails, so the API shows what the BMC really has).
pub(crate) async fn verify_and_refresh(
    store: &dyn Store,
    bmc: &dyn Bmc,
    node: &Node,
    step: &PlannedStep,
    result: &Value,
) -> Result<(), DriverError> {
    let verified = bmc
        .verify_step(
            &node.uuid,
            &node.driver_info,
            &step.step,
            &step.args,
            result,
        )
        .await;
    crate::bmc_caches::refresh_caches_logged(store, bmc, &node.uuid, &node.driver_info).await;
    verified
}

/// Reboot (into `ramdisk` when the run booted one, since each boot consumes the one-time
/// override; in the boot mode given with it), then [`verify_and_refresh`]. Without a reboot only the caches are refreshed.
pub(crate) async fn reboot_verify_refresh(
    store: &dyn Store,
    bmc: &dyn Bmc,
    node: &Node,
    step: &PlannedStep,
    result: &Value,
    ramdisk: Option<(BootDevice, Option<rivet_drivers::BootMode>)>,
) -> Result<(), DriverError> {
    if !reboot_needed(step, result) {
        crate::bmc_caches::refresh_caches_logged(store, bmc, &node.uuid, &node.driver_info).await;
        return Ok(());
    }
    if let Some((device, mode)) = ramdisk {
        bmc.set_boot_device(&node.uuid, &node.driver_info, device, mode)
            .await?;
    }
    bmc.set_power(&node.uuid, &node.driver_info, PowerState::Rebooting)
        .await
        .map_err(|e| DriverError::Bmc(format!("reboot to apply the step failed: {e}")))?;
    verify_and_refresh(store, bmc, node, step, result).await
}

/// Record the driver's steps in `cached_clean_steps` (`GET /v1/nodes/{node}/clean_steps`)
/// when a manual cleaning runs without the ramdisk: the agent's steps of an earlier run stay,
/// the driver's are replaced by what it offers now.
pub(crate) fn cache_driver_steps(
    node: &mut Node,
    driver_steps: &[rivet_protocol::steps::StepDescriptor],
) {
    let agent: Vec<_> = rivet_model::internal_info::cached_clean_steps(&node.driver_internal_info)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.source == super::steps::Source::Agent)
        .map(|p| p.step)
        .collect();
    let available = super::steps::available(&agent, driver_steps);
    rivet_model::internal_info::set_cached_clean_steps(
        &mut node.driver_internal_info,
        &available,
        chrono::Utc::now(),
    );
}
