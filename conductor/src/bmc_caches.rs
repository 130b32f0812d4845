//! The node's cached copies of what its BMC reports — BIOS settings, firmware versions, boot
//! mode and secure boot — refreshed after the operations that may change them (inspection,
//! cleaning, servicing, BIOS and firmware steps) and on request.

use chrono::Utc;
use rivet_drivers::{Bmc, DriverError};
use rivet_store::{BiosSetting, Store, StoreError};
use serde_json::{Map, Value};

/// Read the node's BIOS settings and firmware versions from its BMC and replace the cached
/// copies. A BMC that cannot be read leaves the caches as they were (logged, not fatal: the
/// operation that refreshes them has its own result).
pub async fn refresh_caches(
    store: &dyn Store,
    bmc: &dyn Bmc,
    node: &str,
    driver_info: &Map<String, Value>,
) -> Result<(), StoreError> {
    match bmc.bios_settings(node, driver_info).await {
        Ok(readings) => {
            let now = Utc::now();
            let settings: Vec<BiosSetting> = readings
                .into_iter()
                .map(|r| BiosSetting {
                    name: r.name,
                    value: r.value,
                    registry: r.registry,
                    created_at: now,
                    updated_at: None,
                })
                .collect();
            store.set_bios_settings(node, &settings).await?;
        }
        Err(e) => tracing::warn!(node = %node, error = %e, "BIOS settings not refreshed"),
    }
    match bmc.firmware_versions(node, driver_info).await {
        Ok(components) => store.set_firmware_components(node, &components).await?,
        Err(e) => tracing::warn!(node = %node, error = %e, "firmware versions not refreshed"),
    }
    refresh_boot_state(store, bmc, node, driver_info).await
}

/// Record the boot mode and secure boot state the BMC reports (nothing for a driver that
/// cannot read them).
pub async fn refresh_boot_state(
    store: &dyn Store,
    bmc: &dyn Bmc,
    node: &str,
    driver_info: &Map<String, Value>,
) -> Result<(), StoreError> {
    match bmc.boot_mode(node, driver_info).await {
        Ok((mode, secure)) => store.set_boot_state(node, mode, secure).await,
        Err(DriverError::Unsupported { .. }) => Ok(()),
        Err(e) => {
            tracing::warn!(node = %node, error = %e, "boot mode not refreshed");
            Ok(())
        }
    }
}

/// [`refresh_caches`] as the conductor calls it after an operation: failures are logged.
pub async fn refresh_caches_logged(
    store: &dyn Store,
    bmc: &dyn Bmc,
    node: &str,
    driver_info: &Map<String, Value>,
) {
    if let Err(e) = refresh_caches(store, bmc, node, driver_info).await {
        tracing::warn!(node = %node, error = %e, "BIOS and firmware caches not stored");
    }
}
