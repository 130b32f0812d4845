//! Hardware types and their interfaces, as Ironic models them.
//!
//! A node has a hardware type (its `driver`: fake-hardware, redfish, ipmi) and one
//! implementation per interface (boot, deploy, power, …). Each hardware type lists the
//! implementations it enables; the first is its default. The conductor asks the node's
//! interface whether it can do a verb before the state changes ([`Interfaces::check_verb`]),
//! so a verb nobody can carry out is a 400, never a state reached without its work. Only the
//! `fake` implementations, enabled on `fake-hardware` alone, finish without doing anything.
//!
//! Pure data and functions: no I/O.

use rivet_protocol::states::Verb;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The interfaces a node has (Ironic's `*_interface` fields, `inspect` excepted: Rivet keeps
/// `inspect_interface` in its own column with its own values, see `api::nodes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Iface {
    /// How the node boots the ramdisk and the instance.
    Boot,
    /// How the image reaches the disk.
    Deploy,
    /// Power control.
    Power,
    /// Boot device and other BMC management.
    Management,
    /// Rescue of a deployed instance.
    Rescue,
    /// BIOS settings.
    Bios,
    /// Serial console.
    Console,
    /// Firmware updates.
    Firmware,
    /// Network plumbing.
    Network,
    /// RAID configuration.
    Raid,
    /// Remote storage.
    Storage,
    /// Vendor passthru.
    Vendor,
}

impl Iface {
    /// Every interface, in the order the API shows them.
    pub const ALL: &'static [Iface] = &[
        Iface::Boot,
        Iface::Deploy,
        Iface::Power,
        Iface::Management,
        Iface::Rescue,
        Iface::Bios,
        Iface::Console,
        Iface::Firmware,
        Iface::Network,
        Iface::Raid,
        Iface::Storage,
        Iface::Vendor,
    ];

    /// Short name (`boot`).
    pub fn as_str(self) -> &'static str {
        match self {
            Iface::Boot => "boot",
            Iface::Deploy => "deploy",
            Iface::Power => "power",
            Iface::Management => "management",
            Iface::Rescue => "rescue",
            Iface::Bios => "bios",
            Iface::Console => "console",
            Iface::Firmware => "firmware",
            Iface::Network => "network",
            Iface::Raid => "raid",
            Iface::Storage => "storage",
            Iface::Vendor => "vendor",
        }
    }

    /// The node field (`boot_interface`).
    pub fn field(self) -> String {
        format!("{}_interface", self.as_str())
    }
}

impl fmt::Display for Iface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A hardware type: its name and, per interface, the enabled implementations (default
/// first).
pub struct HardwareType {
    /// `fake-hardware`, `redfish`, `ipmi`.
    pub name: &'static str,
    enabled: &'static [(Iface, &'static [&'static str])],
}

const FAKE: HardwareType = HardwareType {
    name: "fake-hardware",
    enabled: &[
        (Iface::Boot, &["fake", "ipxe", "pxe"]),
        (Iface::Deploy, &["fake", "direct"]),
        (Iface::Power, &["fake"]),
        (Iface::Management, &["fake"]),
        (Iface::Rescue, &["fake", "no-rescue", "agent"]),
        (Iface::Bios, &["fake", "no-bios"]),
        (Iface::Console, &["fake", "no-console"]),
        (Iface::Firmware, &["fake", "no-firmware"]),
        (Iface::Network, &["noop"]),
        (Iface::Raid, &["fake", "no-raid", "agent"]),
        (Iface::Storage, &["noop"]),
        (Iface::Vendor, &["fake", "no-vendor"]),
    ],
};

const REDFISH: HardwareType = HardwareType {
    name: "redfish",
    enabled: &[
        (Iface::Boot, &["ipxe", "pxe", "redfish-virtual-media"]),
        (Iface::Deploy, &["direct"]),
        (Iface::Power, &["redfish"]),
        (Iface::Management, &["redfish"]),
        (Iface::Rescue, &["no-rescue", "agent"]),
        (Iface::Bios, &["redfish", "no-bios"]),
        // Many Redfish BMCs also speak IPMI for Serial-over-LAN; the node's driver_info then
        // carries the ipmi_* fields beside the redfish_* ones.
        (Iface::Console, &["no-console", "ipmitool-socat"]),
        (Iface::Firmware, &["redfish", "no-firmware"]),
        (Iface::Network, &["noop"]),
        (Iface::Raid, &["no-raid", "agent"]),
        (Iface::Storage, &["noop"]),
        (Iface::Vendor, &["redfish", "no-vendor"]),
    ],
};

const IPMI: HardwareType = HardwareType {
    name: "ipmi",
    enabled: &[
        (Iface::Boot, &["ipxe", "pxe"]),
        (Iface::Deploy, &["direct"]),
        (Iface::Power, &["ipmitool"]),
        (Iface::Management, &["ipmitool"]),
        (Iface::Rescue, &["no-rescue", "agent"]),
        (Iface::Bios, &["no-bios"]),
        (Iface::Console, &["no-console", "ipmitool-socat"]),
        (Iface::Firmware, &["no-firmware"]),
        (Iface::Network, &["noop"]),
        (Iface::Raid, &["no-raid", "agent"]),
        (Iface::Storage, &["noop"]),
        (Iface::Vendor, &["ipmitool", "no-vendor"]),
    ],
};

/// Every hardware type.
pub const HARDWARE_TYPES: &[&HardwareType] = &[&FAKE, &REDFISH, &IPMI];

/// The hardware type behind a `driver` name (`fake` and `ipmitool` are accepted aliases).
pub fn hardware_type(driver: &str) -> Option<&'static HardwareType> {
    let name = match driver {
        "fake" => "fake-hardware",
        "ipmitool" => "ipmi",
        d => d,
    };
    HARDWARE_TYPES.iter().copied().find(|h| h.name == name)
}

impl HardwareType {
    /// Enabled implementations of `iface`, default first.
    pub fn enabled(&self, iface: Iface) -> &'static [&'static str] {
        self.enabled
            .iter()
            .find(|(i, _)| *i == iface)
            .map(|(_, v)| *v)
            .unwrap_or(&[])
    }

    /// The default implementation of `iface`.
    pub fn default_of(&self, iface: Iface) -> &'static str {
        self.enabled(iface).first().copied().unwrap_or("")
    }
}

/// A node's interface choices. `None` = the hardware type's default (rows written before
/// interfaces existed read this way).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Interfaces {
    #[serde(skip_serializing_if = "Option::is_none")]
    boot: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deploy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    power: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    management: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rescue: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bios: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    console: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    firmware: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    network: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    raid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    storage: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vendor: Option<String>,
}

/// An interface value that the node's hardware type does not enable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InterfaceError {
    /// The driver is not a known hardware type.
    #[error("driver {0:?} is not a known hardware type; use one of fake-hardware, redfish, ipmi")]
    UnknownDriver(String),
    /// The value is not enabled for the hardware type.
    #[error("node {node}: {field} {value:?} is not enabled for hardware type {driver}; use one of {allowed}")]
    NotEnabled {
        /// The node (name or UUID; empty before it exists).
        node: String,
        /// `boot_interface`.
        field: String,
        /// The value asked for.
        value: String,
        /// The hardware type.
        driver: String,
        /// Comma-separated enabled values.
        allowed: String,
    },
    /// The interface cannot do the verb.
    #[error("node {node}: {field} {value:?} cannot {verb}{why}")]
    CannotDo {
        /// The node.
        node: String,
        /// `deploy_interface`.
        field: String,
        /// Its value.
        value: String,
        /// The verb refused.
        verb: String,
        /// What to do instead.
        why: String,
    },
}

impl Interfaces {
    fn slot(&mut self, iface: Iface) -> &mut Option<String> {
        match iface {
            Iface::Boot => &mut self.boot,
            Iface::Deploy => &mut self.deploy,
            Iface::Power => &mut self.power,
            Iface::Management => &mut self.management,
            Iface::Rescue => &mut self.rescue,
            Iface::Bios => &mut self.bios,
            Iface::Console => &mut self.console,
            Iface::Firmware => &mut self.firmware,
            Iface::Network => &mut self.network,
            Iface::Raid => &mut self.raid,
            Iface::Storage => &mut self.storage,
            Iface::Vendor => &mut self.vendor,
        }
    }

    fn get_raw(&self, iface: Iface) -> Option<&str> {
        match iface {
            Iface::Boot => self.boot.as_deref(),
            Iface::Deploy => self.deploy.as_deref(),
            Iface::Power => self.power.as_deref(),
            Iface::Management => self.management.as_deref(),
            Iface::Rescue => self.rescue.as_deref(),
            Iface::Bios => self.bios.as_deref(),
            Iface::Console => self.console.as_deref(),
            Iface::Firmware => self.firmware.as_deref(),
            Iface::Network => self.network.as_deref(),
            Iface::Raid => self.raid.as_deref(),
            Iface::Storage => self.storage.as_deref(),
            Iface::Vendor => self.vendor.as_deref(),
        }
    }

    /// The implementation of `iface` for a node of hardware type `driver`: its own choice, or
    /// the type's default.
    pub fn get(&self, driver: &str, iface: Iface) -> String {
        match self.get_raw(iface) {
            Some(v) => v.to_string(),
            None => hardware_type(driver)
                .map(|h| h.default_of(iface).to_string())
                .unwrap_or_default(),
        }
    }

    /// Set (Some) or reset to the default (None) one interface, unchecked.
    pub fn set(&mut self, iface: Iface, value: Option<String>) {
        *self.slot(iface) = value;
    }

    /// Every interface resolved for `driver`, as the API shows them.
    pub fn resolved(&self, driver: &str) -> Vec<(Iface, String)> {
        Iface::ALL
            .iter()
            .map(|i| (*i, self.get(driver, *i)))
            .collect()
    }

    /// Every interface filled in with its default where unset (what a new node stores, as
    /// Ironic does at creation).
    pub fn with_defaults(&self, driver: &str) -> Interfaces {
        let mut out = Interfaces::default();
        for (i, v) in self.resolved(driver) {
            out.set(i, Some(v));
        }
        out
    }

    /// Check every set value is enabled for `driver`.
    pub fn validate(&self, node: &str, driver: &str) -> Result<(), InterfaceError> {
        let hw =
            hardware_type(driver).ok_or_else(|| InterfaceError::UnknownDriver(driver.into()))?;
        for iface in Iface::ALL {
            if let Some(v) = self.get_raw(*iface) {
                let allowed = hw.enabled(*iface);
                if !allowed.contains(&v) {
                    return Err(InterfaceError::NotEnabled {
                        node: node.to_string(),
                        field: iface.field(),
                        value: v.to_string(),
                        driver: hw.name.to_string(),
                        allowed: allowed.join(", "),
                    });
                }
            }
        }
        Ok(())
    }

    /// Whether the node's interfaces can carry out `verb`. Refused verbs change nothing.
    pub fn check_verb(&self, node: &str, driver: &str, verb: Verb) -> Result<(), InterfaceError> {
        let cannot = |iface: Iface, why: &str| InterfaceError::CannotDo {
            node: node.to_string(),
            field: iface.field(),
            value: self.get(driver, iface),
            verb: verb.to_string(),
            why: why.to_string(),
        };
        match verb {
            Verb::Active | Verb::Deploy | Verb::Rebuild | Verb::Adopt => {
                match self.get(driver, Iface::Deploy).as_str() {
                    "fake" | "direct" => Ok(()),
                    _ => Err(cannot(Iface::Deploy, "; set deploy_interface to direct")),
                }
            }
            Verb::Rescue | Verb::Unrescue => match self.get(driver, Iface::Rescue).as_str() {
                "fake" | "agent" => Ok(()),
                _ => Err(cannot(Iface::Rescue, "; set rescue_interface to agent")),
            },
            _ => Ok(()),
        }
    }

    /// Whether the deploy interface is the agent's (`direct`): cleaning, deploy and
    /// undeploy then boot the ramdisk; with `fake` they run no in-band work at all.
    pub fn uses_agent(&self, driver: &str) -> bool {
        self.get(driver, Iface::Deploy) == "direct"
    }

    /// Whether the boot interface is `fake` (nothing to boot: fake-hardware only).
    pub fn fake_boot(&self, driver: &str) -> bool {
        self.get(driver, Iface::Boot) == "fake"
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn defaults_per_hardware_type() {
        let i = Interfaces::default();
        assert_eq!(i.get("fake-hardware", Iface::Deploy), "fake");
        assert_eq!(i.get("fake-hardware", Iface::Boot), "fake");
        assert_eq!(i.get("redfish", Iface::Boot), "ipxe");
        assert_eq!(i.get("redfish", Iface::Deploy), "direct");
        assert_eq!(i.get("ipmi", Iface::Power), "ipmitool");
        assert_eq!(i.get("ipmitool", Iface::Management), "ipmitool");
        let full = i.with_defaults("redfish");
        assert_eq!(full.boot.as_deref(), Some("ipxe"));
        assert!(full.validate("n", "redfish").is_ok());
    }

    #[test]
    fn fake_only_on_fake_hardware() {
        for driver in ["redfish", "ipmi"] {
            for iface in Iface::ALL {
                let mut i = Interfaces::default();
                i.set(*iface, Some("fake".into()));
                let e = i.validate("n1", driver).unwrap_err();
                assert!(e.to_string().contains(&iface.field()), "{e}");
                assert!(e.to_string().contains("n1"), "{e}");
            }
        }
        let mut i = Interfaces::default();
        i.set(Iface::Deploy, Some("direct".into()));
        assert!(i.validate("n", "fake-hardware").is_ok());
        i.set(Iface::Boot, Some("redfish-virtual-media".into()));
        assert!(i.validate("n", "fake-hardware").is_err());
    }

    #[test]
    fn verbs_checked_against_interfaces() {
        let i = Interfaces::default();
        assert!(i.check_verb("n", "fake-hardware", Verb::Rescue).is_ok());
        let e = i.check_verb("n", "redfish", Verb::Rescue).unwrap_err();
        assert!(
            e.to_string()
                .contains("rescue_interface \"no-rescue\" cannot rescue"),
            "{e}"
        );
        assert!(i.check_verb("n", "redfish", Verb::Active).is_ok());
        assert!(i.uses_agent("redfish") && !i.uses_agent("fake-hardware"));
    }

    #[test]
    fn unknown_fields_refused_when_decoding() {
        assert!(serde_json::from_str::<Interfaces>(r#"{"colour":"x"}"#).is_err());
        let i: Interfaces = serde_json::from_str(r#"{"deploy":"direct"}"#).unwrap();
        assert_eq!(i.get("fake-hardware", Iface::Deploy), "direct");
    }
}
