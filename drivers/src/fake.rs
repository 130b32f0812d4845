//! The `fake-hardware` driver: power kept in memory, for tests and the demo.
//!
//! `driver_info.fake_delay_ms` slows every call down (tests use it to catch a node mid-task);
//! `driver_info.fake_fail` makes every call fail with that message (to exercise error paths);
//! `driver_info.fake_steps` (a list of step descriptors, each optionally with `sleep_ms`) makes
//! the driver offer out-of-band steps, so step merging and out-of-band execution are testable.

use super::{Bmc, BootDevice, BootMode, DriverError};
use async_trait::async_trait;
use rivet_protocol::states::PowerState;
use rivet_protocol::steps::StepDescriptor;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// The `driver_info` keys this driver reads (`GET /v1/drivers/fake-hardware/properties`).
pub const PROPERTIES: &[(&str, &str)] = &[
    (
        "fake_delay_ms",
        "Milliseconds every power, boot device, inspection and step call waits first (at most 600000). Optional.",
    ),
    (
        "fake_fail",
        "A message every power, boot device, inspection and step call then fails with. Optional.",
    ),
    (
        "fake_steps",
        "Out-of-band steps the driver offers: a list of step descriptors (interface, step, priority, ...), each optionally with sleep_ms. Optional.",
    ),
    (
        "fake_inventory",
        "What out-of-band inspection finds: {\"cpus\", \"cpu_arch\", \"memory_mb\", \"macs\"}. Optional.",
    ),
];

/// In-memory BMCs keyed by node UUID.
#[derive(Default)]
pub struct FakeBmc {
    power: Mutex<HashMap<String, PowerState>>,
    /// Last boot device set, and whether persistently.
    boot: Mutex<HashMap<String, (BootDevice, bool)>>,
    /// Indicator states by `(node, "name@component")`, boot mode and secure boot by node.
    mgmt: Mutex<HashMap<String, String>>,
}

/// The fake indicators, as Ironic's fake management interface offers them.
const FAKE_INDICATORS: &[(&str, &str, bool, &[&str])] = &[
    ("chassis", "led-0", true, &["OFF", "ON"]),
    ("system", "led", false, &["BLINKING", "OFF", "ON"]),
];

impl FakeBmc {
    async fn behave(&self, info: &Map<String, Value>) -> Result<(), DriverError> {
        if let Some(ms) = info.get("fake_delay_ms").and_then(Value::as_u64) {
            tokio::time::sleep(Duration::from_millis(ms.min(600_000))).await;
        }
        if let Some(msg) = info.get("fake_fail").and_then(Value::as_str) {
            return Err(DriverError::Bmc(msg.to_string()));
        }
        Ok(())
    }

    fn mgmt_get(&self, key: &str) -> Result<Option<String>, DriverError> {
        Ok(self
            .mgmt
            .lock()
            .map_err(|_| DriverError::Bmc("fake BMC poisoned".into()))?
            .get(key)
            .cloned())
    }

    fn mgmt_set(&self, key: String, value: &str) -> Result<(), DriverError> {
        self.mgmt
            .lock()
            .map_err(|_| DriverError::Bmc("fake BMC poisoned".into()))?
            .insert(key, value.to_string());
        Ok(())
    }

    /// Last boot device set for a node (tests).
    pub fn boot_device(&self, node: &str) -> Option<BootDevice> {
        self.boot.lock().ok().and_then(|b| b.get(node).map(|d| d.0))
    }

    async fn set_boot(
        &self,
        node: &str,
        info: &Map<String, Value>,
        device: BootDevice,
        persistent: bool,
        mode: Option<BootMode>,
    ) -> Result<(), DriverError> {
        self.behave(info).await?;
        self.boot
            .lock()
            .map_err(|_| DriverError::Bmc("fake BMC poisoned".into()))?
            .insert(node.to_string(), (device, persistent));
        // As a Redfish BootSourceOverrideMode does, the override's mode becomes the
        // machine's, so the mode read back afterwards is the one the override named.
        if let Some(mode) = mode {
            self.mgmt_set(format!("{node}/boot_mode"), mode.as_str())?;
        }
        Ok(())
    }

    /// The boot mode of a node's fake machine (`uefi` until set otherwise).
    fn mode_of(&self, node: &str) -> Result<String, DriverError> {
        Ok(self
            .mgmt_get(&format!("{node}/boot_mode"))?
            .unwrap_or_else(|| "uefi".into()))
    }
}

#[async_trait]
impl Bmc for FakeBmc {
    fn validate(&self, info: &Map<String, Value>) -> Result<(), DriverError> {
        if let Some(v) = info.get("fake_delay_ms") {
            if v.as_u64().is_none() {
                return Err(DriverError::BadDriverInfo {
                    field: "fake_delay_ms".into(),
                    reason: "must be a non-negative integer".into(),
                });
            }
        }
        Ok(())
    }

    async fn get_power(
        &self,
        node: &str,
        info: &Map<String, Value>,
    ) -> Result<PowerState, DriverError> {
        self.behave(info).await?;
        let p = self
            .power
            .lock()
            .map_err(|_| DriverError::Bmc("fake BMC poisoned".into()))?;
        Ok(p.get(node).copied().unwrap_or(PowerState::Off))
    }

    async fn set_power(
        &self,
        node: &str,
        info: &Map<String, Value>,
        target: PowerState,
    ) -> Result<(), DriverError> {
        self.behave(info).await?;
        let state = match target {
            PowerState::On | PowerState::Rebooting | PowerState::SoftRebooting => PowerState::On,
            PowerState::Off | PowerState::SoftOff => PowerState::Off,
            PowerState::Error => {
                return Err(DriverError::Bmc("cannot set power state \"error\"".into()))
            }
        };
        self.power
            .lock()
            .map_err(|_| DriverError::Bmc("fake BMC poisoned".into()))?
            .insert(node.to_string(), state);
        Ok(())
    }

    async fn set_boot_device(
        &self,
        node: &str,
        info: &Map<String, Value>,
        device: BootDevice,
        mode: Option<BootMode>,
    ) -> Result<(), DriverError> {
        self.set_boot(node, info, device, false, mode).await
    }

    async fn set_boot_device_persistent(
        &self,
        node: &str,
        info: &Map<String, Value>,
        device: BootDevice,
        mode: Option<BootMode>,
    ) -> Result<(), DriverError> {
        self.set_boot(node, info, device, true, mode).await
    }

    /// The last device set; a node never set boots from the network once, as Ironic's fake
    /// management interface reports.
    async fn get_boot_device(
        &self,
        node: &str,
        info: &Map<String, Value>,
    ) -> Result<super::BootDeviceState, DriverError> {
        self.behave(info).await?;
        let (device, persistent) = self
            .boot
            .lock()
            .map_err(|_| DriverError::Bmc("fake BMC poisoned".into()))?
            .get(node)
            .copied()
            .unwrap_or((BootDevice::Pxe, false));
        Ok(super::BootDeviceState {
            boot_device: Some(device),
            persistent: Some(persistent),
        })
    }

    async fn inject_nmi(&self, _node: &str, info: &Map<String, Value>) -> Result<(), DriverError> {
        self.behave(info).await
    }

    async fn indicators(
        &self,
        _node: &str,
        info: &Map<String, Value>,
    ) -> Result<Vec<super::management::Indicator>, DriverError> {
        self.behave(info).await?;
        Ok(FAKE_INDICATORS
            .iter()
            .map(|(c, n, ro, states)| super::management::Indicator {
                component: c.to_string(),
                name: n.to_string(),
                readonly: *ro,
                states: states.iter().map(|s| s.to_string()).collect(),
            })
            .collect())
    }

    async fn indicator_state(
        &self,
        node: &str,
        info: &Map<String, Value>,
        component: &str,
        name: &str,
    ) -> Result<String, DriverError> {
        self.behave(info).await?;
        fake_indicator(component, name)?;
        let key = format!("{node}/indicator/{name}@{component}");
        Ok(self.mgmt_get(&key)?.unwrap_or_else(|| "OFF".into()))
    }

    async fn set_indicator_state(
        &self,
        node: &str,
        info: &Map<String, Value>,
        component: &str,
        name: &str,
        state: &str,
    ) -> Result<(), DriverError> {
        self.behave(info).await?;
        let (readonly, states) = fake_indicator(component, name)?;
        if readonly || !states.contains(&state) {
            return Err(DriverError::Unsupported {
                driver: "fake-hardware".into(),
                operation: format!(
                    "setting indicator {name}@{component} to {state} (it is {}; states {})",
                    if readonly { "read-only" } else { "writable" },
                    states.join(", ")
                ),
            });
        }
        self.mgmt_set(format!("{node}/indicator/{name}@{component}"), state)
    }

    /// Virtual media kept in memory, as the fake BMC keeps indicators: an inserted CD is
    /// listed until it is ejected (Ironic's fake-hardware accepts both calls).
    async fn insert_virtual_media(
        &self,
        node: &str,
        info: &Map<String, Value>,
        url: &str,
    ) -> Result<(), DriverError> {
        self.behave(info).await?;
        self.mgmt_set(format!("{node}/vmedia/cd"), url)
    }

    async fn eject_virtual_media(
        &self,
        node: &str,
        info: &Map<String, Value>,
    ) -> Result<(), DriverError> {
        self.behave(info).await?;
        self.mgmt_set(format!("{node}/vmedia/cd"), "")
    }

    async fn get_virtual_media(
        &self,
        node: &str,
        info: &Map<String, Value>,
    ) -> Result<Vec<super::VirtualMedia>, DriverError> {
        self.behave(info).await?;
        let image = self
            .mgmt_get(&format!("{node}/vmedia/cd"))?
            .filter(|u| !u.is_empty());
        Ok(vec![super::VirtualMedia {
            media_types: vec!["CD".into(), "DVD".into()],
            inserted: Some(image.is_some()),
            image,
        }])
    }

    async fn boot_mode(
        &self,
        node: &str,
        info: &Map<String, Value>,
    ) -> Result<(Option<String>, Option<bool>), DriverError> {
        self.behave(info).await?;
        let mode = self.mode_of(node)?;
        let secure = self.mgmt_get(&format!("{node}/secure_boot"))?.as_deref() == Some("true");
        Ok((Some(mode), Some(secure)))
    }

    async fn set_boot_mode(
        &self,
        node: &str,
        info: &Map<String, Value>,
        mode: &str,
    ) -> Result<(), DriverError> {
        self.behave(info).await?;
        self.mgmt_set(format!("{node}/boot_mode"), mode)
    }

    async fn set_secure_boot(
        &self,
        node: &str,
        info: &Map<String, Value>,
        on: bool,
    ) -> Result<(), DriverError> {
        self.behave(info).await?;
        // As Ironic's redfish management refuses it: Secure Boot is a UEFI feature.
        let mode = self.mode_of(node)?;
        if on && mode != "uefi" {
            return Err(DriverError::Bmc(format!(
                "fake BMC of node {node} is in {mode} boot mode: Secure Boot needs uefi"
            )));
        }
        self.mgmt_set(
            format!("{node}/secure_boot"),
            if on { "true" } else { "false" },
        )
    }

    async fn inspect(
        &self,
        _node: &str,
        info: &Map<String, Value>,
    ) -> Result<super::OobInventory, DriverError> {
        self.behave(info).await?;
        Ok(fake_inventory(info))
    }

    async fn steps(&self, _node: &str, info: &Map<String, Value>) -> Vec<StepDescriptor> {
        fake_steps(info)
            .into_iter()
            .filter_map(|v| {
                let mut v = v;
                if let Some(o) = v.as_object_mut() {
                    o.remove("sleep_ms");
                }
                serde_json::from_value(v).ok()
            })
            .collect()
    }

    async fn execute_step(
        &self,
        _node: &str,
        info: &Map<String, Value>,
        step: &StepDescriptor,
        args: &Map<String, Value>,
    ) -> Result<Value, DriverError> {
        self.behave(info).await?;
        let spec = fake_steps(info)
            .into_iter()
            .find(|v| v.get("step").and_then(Value::as_str) == Some(step.step.as_str()))
            .ok_or_else(|| DriverError::Unsupported {
                driver: "fake-hardware".into(),
                operation: format!("step {}", step.step),
            })?;
        if let Some(ms) = spec.get("sleep_ms").and_then(Value::as_u64) {
            tokio::time::sleep(Duration::from_millis(ms.min(600_000))).await;
        }
        Ok(serde_json::json!({"fake_step": step.step, "args": args}))
    }
}

/// Out-of-band inspection of a fake node: `driver_info.fake_inventory`
/// (`{"cpus", "cpu_arch", "memory_mb", "macs"}`), after `fake_delay_ms`.
/// A fake indicator's `(readonly, states)`; an unknown one is the caller's mistake.
fn fake_indicator(
    component: &str,
    name: &str,
) -> Result<(bool, &'static [&'static str]), DriverError> {
    FAKE_INDICATORS
        .iter()
        .find(|(c, n, _, _)| *c == component && *n == name)
        .map(|(_, _, ro, states)| (*ro, *states))
        .ok_or_else(|| DriverError::BadDriverInfo {
            field: "indicator".into(),
            reason: format!("fake-hardware has no indicator {name}@{component}"),
        })
}

pub(crate) fn fake_inventory(info: &Map<String, Value>) -> super::OobInventory {
    let inv = info.get("fake_inventory").cloned().unwrap_or(Value::Null);
    super::OobInventory {
        cpus: inv.get("cpus").and_then(Value::as_u64),
        cpu_arch: inv
            .get("cpu_arch")
            .and_then(Value::as_str)
            .map(str::to_string),
        memory_mb: inv.get("memory_mb").and_then(Value::as_u64),
        macs: inv
            .get("macs")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_ascii_lowercase)
                    .collect()
            })
            .unwrap_or_default(),
    }
}

fn fake_steps(info: &Map<String, Value>) -> Vec<Value> {
    info.get("fake_steps")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}
