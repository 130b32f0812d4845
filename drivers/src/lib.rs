//! Out-of-band drivers: one [`Bmc`] trait, implementations side by side.
//!
//! `fake-hardware` (in memory), `redfish` (HTTP, tested against sushy-tools) and `ipmi`
//! (ipmitool lanplus, tested against OpenIPMI's ipmi_sim); [`for_node`] picks one by name.
//!
//! A layer of rivetd beside the store, above `rivet-model` and `rivet-support`: drivers talk
//! to BMCs and know nothing of the database (the conductor stores what they read).
#![warn(missing_docs)]

pub use rivet_model::config::DriversConfig;

pub mod fake;
pub mod ipmi;
pub mod management;
pub mod redfish;
pub mod sol;

use async_trait::async_trait;
pub use rivet_protocol::deploy::BootMode;
use rivet_protocol::states::PowerState;
use rivet_protocol::steps::StepDescriptor;
use serde_json::{Map, Value};

/// Driver failures, worded for `last_error`.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// `driver_info` lacks a field or has a bad value.
    #[error("driver_info is missing or has a bad {field}: {reason}")]
    BadDriverInfo {
        /// The field.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The BMC could not be reached or refused.
    #[error("BMC error: {0}")]
    Bmc(String),
    /// An out-of-band step's arguments are missing or wrong.
    #[error("step {step}: {reason}")]
    BadStepArgs {
        /// `interface.step`.
        step: String,
        /// What is wrong.
        reason: String,
    },
    /// The node's own settings (capabilities, instance_info) ask for something impossible or
    /// contradict each other; the text names the field and what to write instead.
    #[error("{0}")]
    NodeSettings(String),
    /// The driver does not support the operation.
    #[error("driver {driver} does not support {operation}")]
    Unsupported {
        /// Driver name.
        driver: String,
        /// The operation.
        operation: String,
    },
}

/// Boot devices for a one-time override.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootDevice {
    /// Network boot.
    Pxe,
    /// Local disk.
    Disk,
    /// Virtual CD.
    Cdrom,
    /// The firmware's setup screen.
    Bios,
    /// Local disk in safe mode (IPMI only).
    Safe,
    /// UEFI HTTP boot (Redfish only).
    UefiHttp,
}

impl BootDevice {
    /// Every device, in Ironic's order (`ironic.common.boot_devices`).
    pub const ALL: &'static [BootDevice] = &[
        BootDevice::Pxe,
        BootDevice::Disk,
        BootDevice::Cdrom,
        BootDevice::Bios,
        BootDevice::Safe,
        BootDevice::UefiHttp,
    ];

    /// Ironic's name (`pxe`, `disk`, `cdrom`, `bios`, `safe`, `uefihttp`).
    pub fn as_str(self) -> &'static str {
        match self {
            BootDevice::Pxe => "pxe",
            BootDevice::Disk => "disk",
            BootDevice::Cdrom => "cdrom",
            BootDevice::Bios => "bios",
            BootDevice::Safe => "safe",
            BootDevice::UefiHttp => "uefihttp",
        }
    }

    /// The device Ironic calls `name`.
    pub fn from_name(name: &str) -> Option<BootDevice> {
        Self::ALL.iter().copied().find(|d| d.as_str() == name)
    }
}

/// The boot device a BMC reports: `None` where it does not say (Ironic shows null).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BootDeviceState {
    /// The device the next boot(s) use.
    pub boot_device: Option<BootDevice>,
    /// Whether it applies to every boot (false: the next one only).
    pub persistent: Option<bool>,
}

/// One virtual media device as the BMC reports it (Ironic's `GET /v1/nodes/{id}/vmedia`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct VirtualMedia {
    /// Redfish `MediaTypes` (`CD`, `DVD`, `Floppy`, `USBStick`).
    pub media_types: Vec<String>,
    /// Whether an image is inserted.
    pub inserted: Option<bool>,
    /// The image's URL.
    pub image: Option<String>,
}

/// Overall hardware health as the BMC reports it, in Ironic's values (`health_states`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Functioning normally.
    Ok,
    /// Non-critical issues that may need attention.
    Warning,
    /// Critical issues that need attention now.
    Critical,
}

impl Health {
    /// Ironic's spelling, stored in `node.health`.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Ok => "OK",
            Health::Warning => "Warning",
            Health::Critical => "Critical",
        }
    }

    /// A Redfish `Status.Health` value; anything else (absent, vendor text) is no health.
    pub fn from_redfish(value: Option<&str>) -> Option<Health> {
        match value? {
            "OK" => Some(Health::Ok),
            "Warning" => Some(Health::Warning),
            "Critical" => Some(Health::Critical),
            _ => None,
        }
    }
}

/// A node's baseboard management controller, as the conductor uses it.
#[async_trait]
pub trait Bmc: Send + Sync {
    /// Check `driver_info` has what the driver needs (no I/O).
    fn validate(&self, driver_info: &Map<String, Value>) -> Result<(), DriverError>;
    /// Read the power state.
    async fn get_power(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
    ) -> Result<PowerState, DriverError>;
    /// The power state and, when the BMC reports it, the hardware health, in one read:
    /// power sync keeps `node.health` (1.109) from it without a second request per node.
    /// Drivers that report no health answer `None` (the node's health stays null).
    async fn get_power_and_health(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
    ) -> Result<(PowerState, Option<Health>), DriverError> {
        Ok((self.get_power(node, driver_info).await?, None))
    }
    /// Set the power state (`power on`, `power off`, `rebooting`, soft variants).
    async fn set_power(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
        target: PowerState,
    ) -> Result<(), DriverError>;
    /// One-time boot device override. `mode` is the node's effective boot mode: the override
    /// carries it (Redfish `BootSourceOverrideMode`, IPMI's EFI boot flag), because some BMCs
    /// fall back to their default mode on an override that does not say. `None` (a caller
    /// that has not resolved it) leaves the driver to its `driver_info.boot_mode`, if any.
    async fn set_boot_device(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
        device: BootDevice,
        mode: Option<BootMode>,
    ) -> Result<(), DriverError>;
    /// Boot device for every boot from now on (a deployed instance boots from its disk);
    /// `mode` as for [`Bmc::set_boot_device`].
    async fn set_boot_device_persistent(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
        device: BootDevice,
        mode: Option<BootMode>,
    ) -> Result<(), DriverError>;

    /// The boot devices [`Bmc::set_boot_device`] accepts (Ironic's
    /// `get_supported_boot_devices`).
    fn supported_boot_devices(&self) -> &'static [BootDevice] {
        &[BootDevice::Pxe, BootDevice::Disk, BootDevice::Cdrom]
    }

    /// The boot device the BMC reports for the next boot.
    async fn get_boot_device(
        &self,
        _node: &str,
        _driver_info: &Map<String, Value>,
    ) -> Result<BootDeviceState, DriverError> {
        Err(DriverError::Unsupported {
            driver: "this driver".into(),
            operation: "reading the boot device".into(),
        })
    }

    /// Out-of-band steps this driver offers for the node (BIOS, firmware…). The conductor
    /// merges them with the agent's in-band steps by priority.
    async fn steps(&self, _node: &str, _driver_info: &Map<String, Value>) -> Vec<StepDescriptor> {
        Vec::new()
    }

    /// Run one out-of-band step to completion (long ones poll their BMC task inside). The
    /// returned value is stored as the step's result.
    async fn execute_step(
        &self,
        _node: &str,
        driver_info: &Map<String, Value>,
        step: &StepDescriptor,
        _args: &Map<String, Value>,
    ) -> Result<Value, DriverError> {
        let _ = driver_info;
        Err(DriverError::Unsupported {
            driver: "this driver".into(),
            operation: format!("out-of-band step {}.{}", step.interface, step.step),
        })
    }

    /// Check an out-of-band step's effect once the reboot it requested (`reboot_requested`)
    /// is done, e.g. that staged BIOS settings now read back; `result` is what
    /// [`Bmc::execute_step`] returned. Nothing to check by default.
    async fn verify_step(
        &self,
        _node: &str,
        _driver_info: &Map<String, Value>,
        _step: &StepDescriptor,
        _args: &Map<String, Value>,
        _result: &Value,
    ) -> Result<(), DriverError> {
        Ok(())
    }

    /// Insert a virtual-media ISO by URL.
    async fn insert_virtual_media(
        &self,
        _node: &str,
        _driver_info: &Map<String, Value>,
        _url: &str,
    ) -> Result<(), DriverError> {
        Err(DriverError::Unsupported {
            driver: "this driver".into(),
            operation: "virtual media".into(),
        })
    }

    /// Eject any virtual media.
    async fn eject_virtual_media(
        &self,
        _node: &str,
        _driver_info: &Map<String, Value>,
    ) -> Result<(), DriverError> {
        Err(DriverError::Unsupported {
            driver: "this driver".into(),
            operation: "virtual media".into(),
        })
    }

    /// The virtual media devices the BMC has and what they hold.
    async fn get_virtual_media(
        &self,
        _node: &str,
        _driver_info: &Map<String, Value>,
    ) -> Result<Vec<VirtualMedia>, DriverError> {
        Err(DriverError::Unsupported {
            driver: "this driver".into(),
            operation: "virtual media".into(),
        })
    }

    /// Out-of-band inspection: what the BMC knows of CPUs, memory and NICs.
    async fn inspect(
        &self,
        _node: &str,
        _driver_info: &Map<String, Value>,
    ) -> Result<OobInventory, DriverError> {
        Err(DriverError::Unsupported {
            driver: "this driver".into(),
            operation: "out-of-band inspection".into(),
        })
    }

    /// The BIOS settings the BMC reports (the node's BIOS cache); none by default.
    async fn bios_settings(
        &self,
        _node: &str,
        _driver_info: &Map<String, Value>,
    ) -> Result<Vec<management::BiosReading>, DriverError> {
        Ok(Vec::new())
    }

    /// Firmware components, their versions and identities; none by default.
    async fn firmware_versions(
        &self,
        _node: &str,
        _driver_info: &Map<String, Value>,
    ) -> Result<Vec<rivet_model::records::FirmwareReading>, DriverError> {
        Ok(Vec::new())
    }

    /// Inject a non-maskable interrupt.
    async fn inject_nmi(
        &self,
        _node: &str,
        _driver_info: &Map<String, Value>,
    ) -> Result<(), DriverError> {
        Err(management::unsupported("this driver", "injecting an NMI"))
    }

    /// The indicators the BMC offers.
    async fn indicators(
        &self,
        _node: &str,
        _driver_info: &Map<String, Value>,
    ) -> Result<Vec<management::Indicator>, DriverError> {
        Err(management::unsupported("this driver", "indicators"))
    }

    /// An indicator's state (`ON`, `OFF`, `BLINKING`, `UNKNOWN`).
    async fn indicator_state(
        &self,
        _node: &str,
        _driver_info: &Map<String, Value>,
        _component: &str,
        _name: &str,
    ) -> Result<String, DriverError> {
        Err(management::unsupported("this driver", "indicators"))
    }

    /// Set an indicator's state.
    async fn set_indicator_state(
        &self,
        _node: &str,
        _driver_info: &Map<String, Value>,
        _component: &str,
        _name: &str,
        _state: &str,
    ) -> Result<(), DriverError> {
        Err(management::unsupported("this driver", "indicators"))
    }

    /// The boot mode (`bios` or `uefi`) and secure boot flag the BMC reports.
    async fn boot_mode(
        &self,
        _node: &str,
        _driver_info: &Map<String, Value>,
    ) -> Result<(Option<String>, Option<bool>), DriverError> {
        Err(management::unsupported(
            "this driver",
            "reading the boot mode",
        ))
    }

    /// Set the boot mode (`bios` or `uefi`).
    async fn set_boot_mode(
        &self,
        _node: &str,
        _driver_info: &Map<String, Value>,
        _mode: &str,
    ) -> Result<(), DriverError> {
        Err(management::unsupported(
            "this driver",
            "setting the boot mode",
        ))
    }

    /// Turn UEFI secure boot on or off.
    async fn set_secure_boot(
        &self,
        _node: &str,
        _driver_info: &Map<String, Value>,
        _on: bool,
    ) -> Result<(), DriverError> {
        Err(management::unsupported("this driver", "secure boot"))
    }
}

/// What out-of-band inspection finds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OobInventory {
    /// Logical CPUs.
    pub cpus: Option<u64>,
    /// CPU architecture (x86_64…).
    pub cpu_arch: Option<String>,
    /// Memory in MiB.
    pub memory_mb: Option<u64>,
    /// NIC MAC addresses, lower case.
    pub macs: Vec<String>,
}

/// Driver names an operator may enroll with.
pub const DRIVERS: &[&str] = &["fake-hardware", "redfish", "ipmi"];

/// The `driver_info` keys hardware type `name` reads, with what each means (Ironic's driver
/// properties); `None` for a name that is not one of [`DRIVERS`].
pub fn properties(name: &str) -> Option<&'static [(&'static str, &'static str)]> {
    match name {
        "fake-hardware" => Some(fake::PROPERTIES),
        "redfish" => Some(redfish::PROPERTIES),
        "ipmi" => Some(ipmi::PROPERTIES),
        _ => None,
    }
}

/// The driver for a node's `driver` field. Redfish and IPMI drivers are cheap values over
/// `config`; the Redfish HTTP clients and sessions they use are shared process-wide.
pub fn for_node(
    driver: &str,
    fake: &std::sync::Arc<fake::FakeBmc>,
    config: &DriversConfig,
) -> Result<std::sync::Arc<dyn Bmc>, DriverError> {
    match driver {
        "fake-hardware" | "fake" => Ok(fake.clone()),
        "redfish" => Ok(std::sync::Arc::new(redfish::RedfishBmc::new(
            config.clone(),
        ))),
        "ipmi" | "ipmitool" => Ok(std::sync::Arc::new(ipmi::IpmiBmc::new(config.clone()))),
        other => Err(DriverError::Unsupported {
            driver: other.to_string(),
            operation: "anything (unknown driver)".into(),
        }),
    }
}

/// Replace every occurrence of `secret` in `text` by `******` (last line of defence: no
/// error text that reaches `last_error` or a log may carry a password).
pub fn redact(text: &str, secret: Option<&str>) -> String {
    match secret {
        Some(s) if !s.is_empty() => text.replace(s, "******"),
        _ => text.to_string(),
    }
}

pub use rivet_support::secrets::is_secret_key;

/// A copy of `info` with secret values replaced by `******` (nested maps too).
pub fn mask_secrets(info: &Map<String, Value>) -> Map<String, Value> {
    info.iter()
        .map(|(k, v)| {
            let v = if is_secret_key(k) && !v.is_null() {
                Value::from("******")
            } else if let Value::Object(m) = v {
                Value::Object(mask_secrets(m))
            } else {
                v.clone()
            };
            (k.clone(), v)
        })
        .collect()
}

/// For each driver's tests: its `PROPERTIES` are exactly what its `parse` reads. `full` sets
/// every key (and parses); `bad` has a refused value for each key, which must be refused
/// naming that key; the keys described "Required." are `required`, and they alone parse.
#[cfg(test)]
pub(crate) fn check_properties<T>(
    properties: &[(&str, &str)],
    full: &Value,
    bad: &Value,
    parse: impl Fn(&Map<String, Value>) -> Result<T, DriverError>,
    required: &[&str],
) {
    let full = full.as_object().cloned().unwrap_or_default();
    assert_eq!(full.len(), properties.len(), "full sets every property");
    for (key, _) in properties {
        let mut v = full.clone();
        v.insert(key.to_string(), bad[*key].clone());
        match parse(&v) {
            Err(DriverError::BadDriverInfo { field, .. }) => assert_eq!(field, *key),
            other => panic!("{key}: bad value accepted: {:?}", other.map(|_| ())),
        }
    }
    let described: Vec<&str> = properties
        .iter()
        .filter(|(_, d)| d.ends_with("Required."))
        .map(|(k, _)| *k)
        .collect();
    assert_eq!(described, required);
    let mut minimal = full;
    minimal.retain(|k, _| required.contains(&k.as_str()));
    assert!(parse(&minimal).is_ok(), "the required keys alone parse");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_nested_secrets() {
        let info: Map<String, Value> = serde_json::from_str(
            r#"{"redfish_password":"hunter2","ipmi_username":"admin","nested":{"api_token":"t"}}"#,
        )
        .expect("json");
        let m = mask_secrets(&info);
        assert_eq!(m["redfish_password"], "******");
        assert_eq!(m["ipmi_username"], "admin");
        assert_eq!(m["nested"]["api_token"], "******");
        assert!(!Value::Object(m).to_string().contains("hunter2"));
    }

    #[test]
    fn every_driver_describes_its_driver_info() {
        for d in DRIVERS {
            let props = properties(d).unwrap_or_else(|| panic!("{d} has no properties"));
            assert!(!props.is_empty(), "{d}");
            let mut keys: Vec<&str> = props.iter().map(|(k, _)| *k).collect();
            keys.sort_unstable();
            keys.dedup();
            assert_eq!(keys.len(), props.len(), "{d}: a key is listed twice");
            for (k, desc) in props {
                assert!(
                    desc.ends_with("Required.") || desc.ends_with("Optional."),
                    "{d}.{k}: {desc}"
                );
            }
        }
        assert!(properties("agent_ipmitool").is_none());
    }
}
