//! Small records that several layers exchange without going through the store: what a BMC
//! reports of a firmware component (drivers read it, the store caches it), and the one
//! spelling of a MAC address.

/// One firmware component as a BMC reports it: the version now and, where the BMC names
/// them, its vendor, model and serial number (Ironic's `cache_firmware_components` dicts).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FirmwareReading {
    /// `bios`, `bmc`, or `nic:<serial or id>`.
    pub component: String,
    /// The version it reports.
    pub version: String,
    /// Its maker.
    pub vendor: Option<String>,
    /// Its model.
    pub model: Option<String>,
    /// Its serial number.
    pub serial_number: Option<String>,
}

impl FirmwareReading {
    /// A component with only a version.
    pub fn new(component: &str, version: &str) -> FirmwareReading {
        FirmwareReading {
            component: component.to_string(),
            version: version.to_string(),
            ..Default::default()
        }
    }
}

/// Lower-case a MAC and check its shape (`aa:bb:cc:dd:ee:ff`).
pub fn normalize_mac(mac: &str) -> Option<String> {
    let m = mac.trim().to_ascii_lowercase().replace('-', ":");
    let parts: Vec<&str> = m.split(':').collect();
    if parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
    {
        Some(m)
    } else {
        None
    }
}
