//! Inventory → node properties, as Ironic's inspection hooks derive them.

use rivet_protocol::inventory::{Disk, Inventory};
use serde_json::{Map, Value};

const GIB: u64 = 1 << 30;

/// What inspection learned.
#[derive(Debug, Clone, PartialEq)]
pub struct Derived {
    /// Logical CPUs.
    pub cpus: u64,
    /// Architecture.
    pub cpu_arch: String,
    /// Installed memory, MiB.
    pub memory_mb: u64,
    /// Root disk size in GiB, minus one for partitioning (Ironic's `disk_partitioning_spacing`).
    pub local_gb: u64,
    /// The chosen root disk.
    pub root_disk: Option<Disk>,
    /// `uefi` or `bios`.
    pub boot_mode: String,
    /// NICs: (MAC, booted from it).
    pub ports: Vec<(String, bool)>,
}

/// Pick the root disk by Ironic's root device hints (`rivet_protocol::hints`, shared with the
/// agent's `write_image`); without hints the smallest disk of at least 4 GiB, as IPA does.
pub fn root_disk<'a>(
    disks: &'a [Disk],
    hints: Option<&Map<String, Value>>,
) -> Result<Option<&'a Disk>, String> {
    let found = rivet_protocol::hints::root_disk(disks, hints).map_err(|e| e.to_string())?;
    match (found, hints.filter(|h| !h.is_empty())) {
        (None, Some(h)) => Err(format!(
            "no disk matches the root device hints {}",
            Value::Object(h.clone())
        )),
        (found, _) => Ok(found),
    }
}

/// Derive everything inspection sets from an inventory.
pub fn derive(inv: &Inventory, hints: Option<&Map<String, Value>>) -> Result<Derived, String> {
    let root = root_disk(&inv.disks, hints)?.cloned();
    let local_gb = root
        .as_ref()
        .map(|d| (d.size / GIB).saturating_sub(1))
        .unwrap_or(0);
    let memory_mb = if inv.memory.physical_mb > 0 {
        inv.memory.physical_mb
    } else {
        inv.memory.total / (1 << 20)
    };
    let pxe = inv
        .boot
        .pxe_interface
        .as_deref()
        .map(str::to_ascii_lowercase);
    let ports = inv
        .interfaces
        .iter()
        .filter(|i| !i.mac_address.is_empty() && i.mac_address != "00:00:00:00:00:00")
        .map(|i| {
            let mac = i.mac_address.to_ascii_lowercase();
            let booted = pxe.as_deref() == Some(mac.as_str());
            (mac, booted)
        })
        .collect();
    Ok(Derived {
        cpus: u64::from(inv.cpu.count),
        cpu_arch: inv.cpu.architecture.clone(),
        memory_mb,
        local_gb,
        root_disk: root,
        boot_mode: if inv.boot.current_boot_mode.is_empty() {
            "bios".into()
        } else {
            inv.boot.current_boot_mode.clone()
        },
        ports,
    })
}

/// Fill `{memory_mb}`, `{cpus}`, `{cpu_arch}`, `{local_gb}` in a resource class template.
pub fn resource_class(template: &str, d: &Derived) -> String {
    template
        .replace("{memory_mb}", &d.memory_mb.to_string())
        .replace("{cpus}", &d.cpus.to_string())
        .replace("{cpu_arch}", &d.cpu_arch)
        .replace("{local_gb}", &d.local_gb.to_string())
}

/// Set a capability in Ironic's `properties.capabilities` string (`k1:v1,k2:v2`).
pub fn set_capability(properties: &mut Map<String, Value>, key: &str, value: &str) {
    let current = properties
        .get("capabilities")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let mut caps: Vec<(String, String)> = current
        .split(',')
        .filter(|c| !c.is_empty())
        .filter_map(|c| {
            c.split_once(':')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .filter(|(k, _)| k != key)
        .collect();
    caps.push((key.to_string(), value.to_string()));
    let text = caps
        .iter()
        .map(|(k, v)| format!("{k}:{v}"))
        .collect::<Vec<_>>()
        .join(",");
    properties.insert("capabilities".into(), Value::from(text));
}

#[cfg(test)]
mod tests {
    use super::*;
    use rivet_protocol::inventory::Interface;

    fn disk(name: &str, gib: u64, serial: &str, rotational: bool) -> Disk {
        Disk {
            name: name.into(),
            size: gib * GIB,
            serial: Some(serial.into()),
            rotational,
            model: "M".into(),
            ..Default::default()
        }
    }

    #[test]
    fn default_root_is_smallest_of_at_least_4_gib() {
        let disks = vec![
            disk("/dev/sda", 500, "a", true),
            disk("/dev/sdb", 2, "b", false),
            disk("/dev/sdc", 100, "c", false),
        ];
        assert_eq!(
            root_disk(&disks, None)
                .expect("ok")
                .map(|d| d.name.as_str()),
            Some("/dev/sdc")
        );
        assert_eq!(root_disk(&disks[1..2], None).expect("ok"), None);
    }

    #[test]
    fn hints_select_and_fail_clearly() {
        let disks = vec![
            disk("/dev/sda", 500, "a", true),
            disk("/dev/sdb", 100, "b", false),
        ];
        let h = |v: Value| v.as_object().cloned().expect("obj");
        let pick = |v: Value| root_disk(&disks, Some(&h(v))).map(|d| d.map(|d| d.name.clone()));
        assert_eq!(
            pick(serde_json::json!({"serial": "A"}))
                .expect("ok")
                .as_deref(),
            Some("/dev/sda")
        );
        assert_eq!(
            pick(serde_json::json!({"name": "sdb"}))
                .expect("ok")
                .as_deref(),
            Some("/dev/sdb")
        );
        assert_eq!(
            pick(serde_json::json!({"size": ">= 200"}))
                .expect("ok")
                .as_deref(),
            Some("/dev/sda")
        );
        assert_eq!(
            pick(serde_json::json!({"rotational": false, "size": 100}))
                .expect("ok")
                .as_deref(),
            Some("/dev/sdb")
        );
        assert!(pick(serde_json::json!({"serial": "zzz"}))
            .expect_err("none")
            .contains("no disk"));
        assert!(pick(serde_json::json!({"colour": "red"}))
            .expect_err("bad")
            .contains("colour"));
    }

    #[test]
    fn derive_and_template() {
        let mut inv = Inventory::default();
        inv.cpu.count = 8;
        inv.cpu.architecture = "x86_64".into();
        inv.memory.physical_mb = 16384;
        inv.disks = vec![disk("/dev/vda", 20, "s", false)];
        inv.boot.pxe_interface = Some("52:54:00:AA:BB:CC".into());
        inv.interfaces = vec![
            Interface {
                name: "eth0".into(),
                mac_address: "52:54:00:aa:bb:cc".into(),
                ..Default::default()
            },
            Interface {
                name: "eth1".into(),
                mac_address: "52:54:00:aa:bb:cd".into(),
                ..Default::default()
            },
        ];
        let d = derive(&inv, None).expect("derive");
        assert_eq!((d.cpus, d.memory_mb, d.local_gb), (8, 16384, 19));
        assert_eq!(
            d.ports,
            vec![
                ("52:54:00:aa:bb:cc".to_string(), true),
                ("52:54:00:aa:bb:cd".to_string(), false)
            ]
        );
        assert_eq!(d.boot_mode, "bios");
        assert_eq!(
            resource_class("bm-{memory_mb}-{cpus}-{cpu_arch}", &d),
            "bm-16384-8-x86_64"
        );
    }

    #[test]
    fn capabilities_string() {
        let mut p = Map::new();
        set_capability(&mut p, "boot_mode", "uefi");
        set_capability(&mut p, "gpu", "yes");
        set_capability(&mut p, "boot_mode", "bios");
        assert_eq!(p["capabilities"], "gpu:yes,boot_mode:bios");
    }
}
