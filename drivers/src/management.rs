//! What the management calls of Ironic's API read from and ask of a BMC beyond power and
//! boot devices: BIOS settings and firmware versions (the node's cached copies), indicator
//! LEDs (1.63), NMI (1.29), boot mode and secure boot (1.75/1.76). The [`super::Bmc`] trait
//! has one method per call; a driver that cannot do one answers `Unsupported` (400), except
//! the two readings, which are empty where a driver has nothing to read (fake-hardware, ipmi).
//! The conductor stores what the BMC reports (its `bmc_caches`): BIOS settings, firmware
//! versions, boot mode and secure boot.

use super::DriverError;
use serde_json::{Map, Value};

/// One BIOS setting as a BMC reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct BiosReading {
    /// Attribute name.
    pub name: String,
    /// Its value as text (`null` stays `None`).
    pub value: Option<String>,
    /// Registry fields by Ironic's names (`attribute_type`, `allowable_values`, …), where
    /// the BMC has a registry entry.
    pub registry: Map<String, Value>,
}

/// An indicator of a hardware component (Ironic's `get_supported_indicators`).
#[derive(Debug, Clone, PartialEq)]
pub struct Indicator {
    /// `system`, `chassis`, `drive`…
    pub component: String,
    /// Its name within the component.
    pub name: String,
    /// Whether it can only be read.
    pub readonly: bool,
    /// States it may take: `ON`, `OFF`, `BLINKING`, `UNKNOWN`.
    pub states: Vec<String>,
}

/// Ironic's indicator states.
pub const INDICATOR_STATES: &[&str] = &["ON", "OFF", "BLINKING", "UNKNOWN"];

/// Ironic's boot modes.
pub const BOOT_MODES: &[&str] = &["bios", "uefi"];

/// A BIOS attribute value as the text Ironic stores (`str(value)`; booleans as Python
/// writes them, so a cached `True` reads the same as in Ironic).
pub fn value_text(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        Value::Bool(true) => Some("True".into()),
        Value::Bool(false) => Some("False".into()),
        other => Some(other.to_string()),
    }
}

/// The error of a driver without the call.
pub fn unsupported(driver: &str, operation: &str) -> DriverError {
    DriverError::Unsupported {
        driver: driver.into(),
        operation: operation.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_read_as_ironic_stores_them() {
        assert_eq!(value_text(&json!("Enabled")), Some("Enabled".into()));
        assert_eq!(value_text(&json!(true)), Some("True".into()));
        assert_eq!(value_text(&json!(5)), Some("5".into()));
        assert_eq!(value_text(&Value::Null), None);
    }
}
