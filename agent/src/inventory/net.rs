//! Network interfaces from /sys/class/net, addresses from getifaddrs(3).

use super::{link_name, read_trimmed, Root};
use rivet_protocol::inventory::Interface;
use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

/// Every interface except loopback, sorted by name.
pub fn collect_interfaces(root: &Root) -> Vec<Interface> {
    let Ok(entries) = std::fs::read_dir(root.path("/sys/class/net")) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        // `bonding_masters` and friends are plain files, interfaces are directories.
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "lo")
        .collect();
    names.sort();
    let addrs = if root.is_live() {
        live_addresses()
    } else {
        HashMap::new()
    };
    names
        .into_iter()
        .map(|name| {
            let dir = root.path("/sys/class/net").join(&name);
            let pci = pci_dir(&dir.join("device"));
            let (v4, v6) = addrs.get(&name).cloned().unwrap_or_default();
            Interface {
                mac_address: read_trimmed(&dir.join("address"))
                    .unwrap_or_default()
                    .to_ascii_lowercase(),
                ipv4_address: v4.map(|a| a.to_string()),
                ipv6_address: v6.map(|a| a.to_string()),
                // Reading carrier fails (EINVAL) while the interface is down: no link.
                has_carrier: read_trimmed(&dir.join("carrier")).as_deref() == Some("1"),
                vendor: pci.as_ref().and_then(|p| read_trimmed(&p.join("vendor"))),
                product: pci.as_ref().and_then(|p| read_trimmed(&p.join("device"))),
                speed_mbps: read_trimmed(&dir.join("speed"))
                    .and_then(|s| s.parse::<i64>().ok())
                    .filter(|s| *s > 0)
                    .map(|s| s as u64),
                driver: link_name(&dir.join("device/driver")),
                pci_address: pci
                    .as_ref()
                    .and_then(|p| p.file_name())
                    .map(|n| n.to_string_lossy().into_owned()),
                lldp: None,
                name,
            }
        })
        .collect()
}

/// The PCI function behind a `device` link: the link itself, or for virtio the parent.
fn pci_dir(device: &Path) -> Option<PathBuf> {
    let mut p = std::fs::canonicalize(device).ok()?;
    for _ in 0..3 {
        if p.file_name()
            .map(|n| is_pci_address(&n.to_string_lossy()))
            .unwrap_or(false)
        {
            return Some(p);
        }
        p = p.parent()?.to_path_buf();
    }
    None
}

/// `0000:00:1f.6`.
fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && s.chars()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

type Addrs = (Option<Ipv4Addr>, Option<Ipv6Addr>);

/// First IPv4 and the best IPv6 (global before link-local) address per interface.
fn live_addresses() -> HashMap<String, Addrs> {
    let mut out: HashMap<String, Addrs> = HashMap::new();
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return out;
    };
    for ifa in addrs {
        let Some(addr) = ifa.address else { continue };
        let entry = out.entry(ifa.interface_name.clone()).or_default();
        if let Some(v4) = addr.as_sockaddr_in() {
            entry.0.get_or_insert(v4.ip());
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            let ip = v6.ip();
            let link_local = (ip.segments()[0] & 0xffc0) == 0xfe80;
            match entry.1 {
                None => entry.1 = Some(ip),
                Some(old) if (old.segments()[0] & 0xffc0) == 0xfe80 && !link_local => {
                    entry.1 = Some(ip)
                }
                Some(_) => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::testutil::TempTree;
    use super::*;

    #[test]
    fn virtio_nic_and_down_nic() {
        let t = TempTree::new("net");
        let pci = "sys/devices/pci0000:00/0000:00:03.0";
        t.file(&format!("{pci}/vendor"), "0x1af4\n")
            .file(&format!("{pci}/device"), "0x1000\n")
            .dir(&format!("{pci}/virtio0"))
            .dir("sys/bus/virtio/drivers/virtio_net")
            .link(
                &format!("{pci}/virtio0/driver"),
                &t.path()
                    .join("sys/bus/virtio/drivers/virtio_net")
                    .to_string_lossy(),
            )
            .file("sys/class/net/eth0/address", "52:54:00:AB:CD:EF\n")
            .file("sys/class/net/eth0/carrier", "1\n")
            .file("sys/class/net/eth0/speed", "-1\n")
            .link(
                "sys/class/net/eth0/device",
                &t.path().join(format!("{pci}/virtio0")).to_string_lossy(),
            )
            .file("sys/class/net/dummy0/address", "aa:bb:cc:dd:ee:ff\n")
            .file("sys/class/net/lo/address", "00:00:00:00:00:00\n")
            .file("sys/class/net/bonding_masters", "\n");
        let ifs = collect_interfaces(&Root::new(t.path()));
        assert_eq!(ifs.len(), 2);
        let (dummy, eth0) = (&ifs[0], &ifs[1]);
        assert_eq!(dummy.name, "dummy0");
        assert!(!dummy.has_carrier);
        assert_eq!(dummy.pci_address, None);
        assert_eq!(eth0.mac_address, "52:54:00:ab:cd:ef");
        assert!(eth0.has_carrier);
        assert_eq!(eth0.speed_mbps, None);
        assert_eq!(eth0.vendor.as_deref(), Some("0x1af4"));
        assert_eq!(eth0.product.as_deref(), Some("0x1000"));
        assert_eq!(eth0.pci_address.as_deref(), Some("0000:00:03.0"));
        assert_eq!(eth0.driver.as_deref(), Some("virtio_net"));
    }

    #[test]
    fn pci_addresses() {
        assert!(is_pci_address("0000:00:1f.6"));
        assert!(!is_pci_address("virtio0"));
        assert!(!is_pci_address("0000:00:1f:6"));
    }
}
