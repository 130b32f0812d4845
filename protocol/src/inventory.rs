//! The hardware inventory, in IPA's `list_hardware_info` shape so tools that read Ironic
//! inventories read ours. Sizes are bytes unless the field name says otherwise.

use serde::{Deserialize, Serialize};

/// Whole-machine inventory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    /// Processors.
    pub cpu: Cpu,
    /// Memory.
    pub memory: Memory,
    /// Block devices (whole disks).
    pub disks: Vec<Disk>,
    /// Network interfaces (loopback excluded).
    pub interfaces: Vec<Interface>,
    /// DMI system information.
    pub system_vendor: SystemVendor,
    /// How the machine booted.
    pub boot: Boot,
    /// BMC IPv4 address, "0.0.0.0" when unknown.
    #[serde(default)]
    pub bmc_address: Option<String>,
    /// BMC IPv6 address, "::/0" when unknown.
    #[serde(default)]
    pub bmc_v6address: Option<String>,
    /// BMC MAC address.
    #[serde(default)]
    pub bmc_mac: Option<String>,
    /// Host name.
    #[serde(default)]
    pub hostname: String,
}

/// CPU summary.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Cpu {
    /// Model name.
    pub model_name: String,
    /// Max frequency in MHz, as a string (IPA reports lscpu's text).
    pub frequency: String,
    /// Logical CPUs.
    pub count: u32,
    /// Architecture, e.g. `x86_64`.
    pub architecture: String,
    /// CPU flags.
    #[serde(default)]
    pub flags: Vec<String>,
    /// Physical sockets.
    #[serde(default)]
    pub socket_count: u32,
}

/// Memory summary.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    /// Kernel-visible memory in bytes.
    pub total: u64,
    /// Installed memory in MiB (DMI banks when readable, else rounded from `total`).
    pub physical_mb: u64,
}

/// A whole disk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Disk {
    /// Device path, e.g. `/dev/sda`.
    pub name: String,
    /// Model.
    #[serde(default)]
    pub model: String,
    /// Size in bytes.
    pub size: u64,
    /// Spinning disk.
    pub rotational: bool,
    /// World-wide name.
    #[serde(default)]
    pub wwn: Option<String>,
    /// Serial number.
    #[serde(default)]
    pub serial: Option<String>,
    /// Vendor.
    #[serde(default)]
    pub vendor: Option<String>,
    /// SCSI host:channel:target:lun.
    #[serde(default)]
    pub hctl: Option<String>,
    /// `/dev/disk/by-path/...` link.
    #[serde(default)]
    pub by_path: Option<String>,
    /// Logical sector size in bytes.
    #[serde(default)]
    pub logical_sectors: Option<u64>,
    /// Physical sector size in bytes.
    #[serde(default)]
    pub physical_sectors: Option<u64>,
    /// Transport (sata, nvme, virtio…).
    #[serde(default)]
    pub tran: Option<String>,
    /// For a software RAID device (`/dev/mdN`): its member devices, which IPA calls its
    /// holder disks. Absent for other disks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<String>,
    /// For a software RAID device: its md level (`raid1`, `raid0`, `raid10`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raid_level: Option<String>,
}

/// A network interface.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Interface {
    /// Kernel name.
    pub name: String,
    /// MAC address, lower case.
    pub mac_address: String,
    /// First IPv4 address.
    #[serde(default)]
    pub ipv4_address: Option<String>,
    /// First IPv6 address.
    #[serde(default)]
    pub ipv6_address: Option<String>,
    /// Link detected.
    #[serde(default)]
    pub has_carrier: bool,
    /// PCI vendor id.
    #[serde(default)]
    pub vendor: Option<String>,
    /// PCI product id.
    #[serde(default)]
    pub product: Option<String>,
    /// Link speed in Mbit/s.
    #[serde(default)]
    pub speed_mbps: Option<u64>,
    /// Kernel driver.
    #[serde(default)]
    pub driver: Option<String>,
    /// PCI address.
    #[serde(default)]
    pub pci_address: Option<String>,
    /// LLDP TLVs (not collected yet).
    #[serde(default)]
    pub lldp: Option<Vec<(u8, String)>>,
}

/// DMI system information.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SystemVendor {
    /// Product name.
    #[serde(default)]
    pub product_name: String,
    /// Serial number.
    #[serde(default)]
    pub serial_number: String,
    /// Manufacturer.
    #[serde(default)]
    pub manufacturer: String,
    /// System UUID (Rivet addition: used for lookup).
    #[serde(default)]
    pub uuid: Option<String>,
    /// Firmware.
    #[serde(default)]
    pub firmware: Firmware,
}

/// System firmware.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Firmware {
    /// Vendor.
    #[serde(default)]
    pub vendor: String,
    /// Version.
    #[serde(default)]
    pub version: String,
    /// Build date.
    #[serde(default)]
    pub build_date: String,
}

/// Boot information.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Boot {
    /// `uefi` or `bios`.
    pub current_boot_mode: String,
    /// MAC of the interface the machine booted from (BOOTIF), if known.
    #[serde(default)]
    pub pxe_interface: Option<String>,
}
