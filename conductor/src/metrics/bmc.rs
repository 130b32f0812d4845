//! The metered BMC: wraps the driver the conductor picks for a node ([`crate::Conductor::bmc`],
//! the one place the conductor gets a [`Bmc`]) and counts and times every out-of-band
//! operation by driver, operation and outcome. Every trait method is delegated explicitly —
//! a test below fails when the trait gains a method this wrapper does not forward, since a
//! forgotten method would silently fall back to the trait's default ("unsupported").

use async_trait::async_trait;
use rivet_drivers::management::{BiosReading, Indicator};
use rivet_drivers::{
    Bmc, BootDevice, BootDeviceState, BootMode, DriverError, Health, OobInventory, VirtualMedia,
};
use rivet_protocol::states::PowerState;
use rivet_protocol::steps::StepDescriptor;
use serde_json::{Map, Value};
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

/// A driver whose operations are counted and timed.
pub struct Metered {
    driver: &'static str,
    inner: Arc<dyn Bmc>,
}

/// The driver label of a node's `driver` field (aliases folded, anything else `other`, so
/// the label stays bounded whatever is in the database).
fn driver_label(driver: &str) -> &'static str {
    match driver {
        "fake-hardware" | "fake" => "fake-hardware",
        "redfish" => "redfish",
        "ipmi" | "ipmitool" => "ipmi",
        _ => "other",
    }
}

/// `inner`, the driver for nodes with `driver`, metered.
pub fn wrap(driver: &str, inner: Arc<dyn Bmc>) -> Arc<dyn Bmc> {
    Arc::new(Metered {
        driver: driver_label(driver),
        inner,
    })
}

fn outcome<T>(r: &Result<T, DriverError>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(DriverError::Bmc(_)) => "error",
        Err(
            DriverError::BadDriverInfo { .. }
            | DriverError::BadStepArgs { .. }
            | DriverError::NodeSettings(_),
        ) => "invalid",
        Err(DriverError::Unsupported { .. }) => "unsupported",
    }
}

impl Metered {
    async fn timed<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T, DriverError>>,
    ) -> Result<T, DriverError> {
        let start = Instant::now();
        let r = call.await;
        super::bmc_call(self.driver, operation, outcome(&r), start.elapsed());
        r
    }
}

type Info = Map<String, Value>;

#[async_trait]
impl Bmc for Metered {
    fn validate(&self, driver_info: &Info) -> Result<(), DriverError> {
        self.inner.validate(driver_info)
    }

    async fn get_power(&self, node: &str, info: &Info) -> Result<PowerState, DriverError> {
        self.timed("get_power", self.inner.get_power(node, info))
            .await
    }

    // Counted as a power read: it is the same one request, with the health read from it.
    async fn get_power_and_health(
        &self,
        node: &str,
        info: &Info,
    ) -> Result<(PowerState, Option<Health>), DriverError> {
        self.timed("get_power", self.inner.get_power_and_health(node, info))
            .await
    }

    async fn set_power(
        &self,
        node: &str,
        info: &Info,
        target: PowerState,
    ) -> Result<(), DriverError> {
        self.timed("set_power", self.inner.set_power(node, info, target))
            .await
    }

    async fn set_boot_device(
        &self,
        node: &str,
        info: &Info,
        device: BootDevice,
        mode: Option<BootMode>,
    ) -> Result<(), DriverError> {
        self.timed(
            "set_boot_device",
            self.inner.set_boot_device(node, info, device, mode),
        )
        .await
    }

    async fn set_boot_device_persistent(
        &self,
        node: &str,
        info: &Info,
        device: BootDevice,
        mode: Option<BootMode>,
    ) -> Result<(), DriverError> {
        self.timed(
            "set_boot_device",
            self.inner
                .set_boot_device_persistent(node, info, device, mode),
        )
        .await
    }

    fn supported_boot_devices(&self) -> &'static [BootDevice] {
        self.inner.supported_boot_devices()
    }

    async fn get_boot_device(
        &self,
        node: &str,
        info: &Info,
    ) -> Result<BootDeviceState, DriverError> {
        self.timed("get_boot_device", self.inner.get_boot_device(node, info))
            .await
    }

    async fn steps(&self, node: &str, info: &Info) -> Vec<StepDescriptor> {
        let start = Instant::now();
        let steps = self.inner.steps(node, info).await;
        super::bmc_call(self.driver, "steps", "ok", start.elapsed());
        steps
    }

    async fn execute_step(
        &self,
        node: &str,
        info: &Info,
        step: &StepDescriptor,
        args: &Info,
    ) -> Result<Value, DriverError> {
        self.timed(
            "execute_step",
            self.inner.execute_step(node, info, step, args),
        )
        .await
    }

    async fn verify_step(
        &self,
        node: &str,
        info: &Info,
        step: &StepDescriptor,
        args: &Info,
        result: &Value,
    ) -> Result<(), DriverError> {
        self.timed(
            "verify_step",
            self.inner.verify_step(node, info, step, args, result),
        )
        .await
    }

    async fn insert_virtual_media(
        &self,
        node: &str,
        info: &Info,
        url: &str,
    ) -> Result<(), DriverError> {
        self.timed(
            "insert_virtual_media",
            self.inner.insert_virtual_media(node, info, url),
        )
        .await
    }

    async fn eject_virtual_media(&self, node: &str, info: &Info) -> Result<(), DriverError> {
        self.timed(
            "eject_virtual_media",
            self.inner.eject_virtual_media(node, info),
        )
        .await
    }

    async fn get_virtual_media(
        &self,
        node: &str,
        info: &Info,
    ) -> Result<Vec<VirtualMedia>, DriverError> {
        self.timed(
            "get_virtual_media",
            self.inner.get_virtual_media(node, info),
        )
        .await
    }

    async fn inspect(&self, node: &str, info: &Info) -> Result<OobInventory, DriverError> {
        self.timed("inspect", self.inner.inspect(node, info)).await
    }

    async fn bios_settings(
        &self,
        node: &str,
        info: &Info,
    ) -> Result<Vec<BiosReading>, DriverError> {
        self.timed("bios_settings", self.inner.bios_settings(node, info))
            .await
    }

    async fn firmware_versions(
        &self,
        node: &str,
        info: &Info,
    ) -> Result<Vec<rivet_store::FirmwareReading>, DriverError> {
        self.timed(
            "firmware_versions",
            self.inner.firmware_versions(node, info),
        )
        .await
    }

    async fn inject_nmi(&self, node: &str, info: &Info) -> Result<(), DriverError> {
        self.timed("inject_nmi", self.inner.inject_nmi(node, info))
            .await
    }

    async fn indicators(&self, node: &str, info: &Info) -> Result<Vec<Indicator>, DriverError> {
        self.timed("indicators", self.inner.indicators(node, info))
            .await
    }

    async fn indicator_state(
        &self,
        node: &str,
        info: &Info,
        component: &str,
        name: &str,
    ) -> Result<String, DriverError> {
        self.timed(
            "indicator_state",
            self.inner.indicator_state(node, info, component, name),
        )
        .await
    }

    async fn set_indicator_state(
        &self,
        node: &str,
        info: &Info,
        component: &str,
        name: &str,
        state: &str,
    ) -> Result<(), DriverError> {
        self.timed(
            "set_indicator_state",
            self.inner
                .set_indicator_state(node, info, component, name, state),
        )
        .await
    }

    async fn boot_mode(
        &self,
        node: &str,
        info: &Info,
    ) -> Result<(Option<String>, Option<bool>), DriverError> {
        self.timed("boot_mode", self.inner.boot_mode(node, info))
            .await
    }

    async fn set_boot_mode(&self, node: &str, info: &Info, mode: &str) -> Result<(), DriverError> {
        self.timed("set_boot_mode", self.inner.set_boot_mode(node, info, mode))
            .await
    }

    async fn set_secure_boot(&self, node: &str, info: &Info, on: bool) -> Result<(), DriverError> {
        self.timed(
            "set_secure_boot",
            self.inner.set_secure_boot(node, info, on),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names of the methods declared in `pub trait Bmc` in drivers/mod.rs.
    fn trait_methods() -> Vec<String> {
        let src = include_str!("../../../drivers/src/lib.rs");
        let start = src
            .find("pub trait Bmc")
            .expect("trait Bmc in drivers/mod.rs");
        let body = &src[start..];
        // The trait ends at the first line that is exactly "}".
        let end = body.find("\n}\n").expect("end of trait Bmc");
        body[..end]
            .lines()
            .filter_map(|l| {
                let l = l.trim_start();
                let rest = l
                    .strip_prefix("async fn ")
                    .or_else(|| l.strip_prefix("fn "))?;
                Some(rest.split(['(', '<']).next()?.trim().to_string())
            })
            .collect()
    }

    #[test]
    fn every_trait_method_is_forwarded() {
        let methods = trait_methods();
        assert!(methods.len() > 10, "parsed {methods:?}");
        let ours: String = include_str!("bmc.rs")
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        for m in methods {
            assert!(
                ours.contains(&format!("fn{m}(")) && ours.contains(&format!("self.inner.{m}(")),
                "Bmc::{m} is not forwarded by the metered BMC (metrics/bmc.rs): add it"
            );
        }
    }

    #[tokio::test]
    async fn calls_are_counted_by_outcome() {
        let fake = Arc::new(rivet_drivers::fake::FakeBmc::default());
        let bmc = wrap("fake", fake);
        let info = Map::new();
        bmc.set_power("n-metered", &info, PowerState::On)
            .await
            .expect("fake power on");
        let (text, _) = super::super::encode(false).expect("encode");
        let line = "rivet_bmc_requests_total{driver=\"fake-hardware\",operation=\"set_power\",outcome=\"ok\"} ";
        let ok: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix(line))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        assert!(ok >= 1);
    }
}
