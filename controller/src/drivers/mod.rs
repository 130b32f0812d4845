//! Out-of-band drivers: one [`Bmc`] trait, implementations side by side.
//!
//! Only `fake-hardware` exists so far; `redfish` and `ipmi` follow in the drivers issue and
//! slot in through [`for_node`].

pub mod fake;

use async_trait::async_trait;
use rivet_protocol::states::PowerState;
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
    /// Set the power state (`power on`, `power off`, `rebooting`, soft variants).
    async fn set_power(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
        target: PowerState,
    ) -> Result<(), DriverError>;
    /// One-time boot device override.
    async fn set_boot_device(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
        device: BootDevice,
    ) -> Result<(), DriverError>;
}

/// Driver names an operator may enroll with.
pub const DRIVERS: &[&str] = &["fake-hardware"];

/// The driver for a node's `driver` field.
pub fn for_node(
    driver: &str,
    fake: &std::sync::Arc<fake::FakeBmc>,
) -> Result<std::sync::Arc<dyn Bmc>, DriverError> {
    match driver {
        "fake-hardware" | "fake" => Ok(fake.clone()),
        other => Err(DriverError::Unsupported {
            driver: other.to_string(),
            operation: "anything (unknown driver)".into(),
        }),
    }
}

/// Keys of `driver_info` whose values are secrets: masked in every output and log line.
pub fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "password",
        "passwd",
        "secret",
        "token",
        "private_key",
        "credential",
    ]
    .iter()
    .any(|s| k.contains(s))
}

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
}
