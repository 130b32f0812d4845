//! Block devices: the whole disks `lsblk -d` shows, with attributes from sysfs, the udev
//! database and /dev/disk/by-path.
//!
//! The ramdisk runs no udev, so neither its database nor /dev/disk/by-path exist there:
//! `by_path` is then derived from the sysfs path the way udev's `path_id` names it
//! (`pci-0000:00:04.0-nvme-1`, `pci-0000:00:1f.2-ata-1`, `pci-0000:00:05.0`), and a SCSI/SATA
//! disk's serial is read from its VPD page 0x80 (what udev's `ID_SCSI_SERIAL` comes from).

use super::{link_name, read_trimmed, read_u64, Root};
use rivet_protocol::inventory::Disk;
use std::collections::HashMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Every whole disk under /sys/block, as `lsblk -d` lists them, less what IPA leaves out:
/// RAM disks, zram (compressed RAM), loop devices without a backing file and empty slots
/// (size 0, e.g. a card reader without a card) are not disks.
pub fn collect_disks(root: &Root) -> Vec<Disk> {
    let Ok(entries) = std::fs::read_dir(root.path("/sys/block")) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let by_path = by_path_links(root);
    names
        .into_iter()
        .filter(|name| {
            let dir = root.path("/sys/block").join(name);
            let major = read_trimmed(&dir.join("dev"))
                .and_then(|d| d.split(':').next().and_then(|m| m.parse::<u32>().ok()));
            let is_ram = major == Some(1) || name.starts_with("ram") || name.starts_with("zram");
            let unbacked_loop = name.starts_with("loop") && !dir.join("loop/backing_file").exists();
            let empty = read_u64(&dir.join("size")).unwrap_or(0) == 0;
            !is_ram && !unbacked_loop && !empty
        })
        .map(|name| {
            let dir = root.path("/sys/block").join(&name);
            from_sysfs(root, &dir, &name, format!("/dev/{name}"), &by_path)
        })
        .collect()
}

/// The disks for an explicit `--devices` list, in the given order. Block devices get their
/// real attributes; regular files (sparse test images) get their length and `rotational:
/// false`; anything unreadable is still listed, with size 0, so the list stays exact.
pub fn disks_for_paths(root: &Root, paths: &[PathBuf]) -> Vec<Disk> {
    let by_path = by_path_links(root);
    paths
        .iter()
        .map(|path| {
            let name = path.to_string_lossy().into_owned();
            let meta = match std::fs::metadata(path) {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(device = %name, error = %e, "cannot stat device");
                    return Disk {
                        name,
                        ..Default::default()
                    };
                }
            };
            if meta.file_type().is_block_device() {
                let (major, minor) = dev_major_minor(meta.rdev());
                let dir = root.path(format!("/sys/dev/block/{major}:{minor}"));
                let kname = std::fs::canonicalize(&dir)
                    .ok()
                    .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                    .unwrap_or_default();
                from_sysfs(root, &dir, &kname, name, &by_path)
            } else {
                Disk {
                    name,
                    size: meta.len(),
                    rotational: false,
                    ..Default::default()
                }
            }
        })
        .collect()
}

/// Linux `dev_t` → (major, minor), as glibc's `gnu_dev_major/minor`.
fn dev_major_minor(dev: u64) -> (u64, u64) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & 0xffff_f000);
    let minor = (dev & 0xff) | ((dev >> 12) & 0xffff_ff00);
    (major, minor)
}

/// Kernel name → `/dev/disk/by-path/…` link. When several links point at one device the
/// first in name order wins, so the answer is stable across runs.
fn by_path_links(root: &Root) -> HashMap<String, String> {
    let mut map = HashMap::new();
    let Ok(entries) = std::fs::read_dir(root.path("/dev/disk/by-path")) else {
        return map;
    };
    let mut links: Vec<_> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    links.sort();
    for link in links {
        if let (Some(target), Some(file)) = (link_name(&link), link.file_name()) {
            map.entry(target)
                .or_insert_with(|| format!("/dev/disk/by-path/{}", file.to_string_lossy()));
        }
    }
    map
}

/// A disk from its sysfs directory (`/sys/block/X`, or a partition's directory).
fn from_sysfs(
    root: &Root,
    dir: &Path,
    kname: &str,
    name: String,
    by_path: &HashMap<String, String>,
) -> Disk {
    // A partition keeps queue/ and device/ in its parent disk's directory.
    let disk_dir = if dir.join("partition").exists() {
        std::fs::canonicalize(dir)
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .unwrap_or_else(|| dir.to_path_buf())
    } else {
        dir.to_path_buf()
    };
    let device = disk_dir.join("device");
    let udev = read_trimmed(&dir.join("dev"))
        .and_then(|dev| std::fs::read_to_string(root.path(format!("/run/udev/data/b{dev}"))).ok())
        .map(|text| parse_udev(&text))
        .unwrap_or_default();
    let attr = |p: PathBuf| read_trimmed(&p);
    let real = std::fs::canonicalize(&disk_dir)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();

    Disk {
        name,
        model: attr(device.join("model"))
            .or_else(|| udev.get("ID_MODEL").cloned())
            .unwrap_or_default(),
        size: read_u64(&dir.join("size"))
            .and_then(|s| s.checked_mul(512))
            .unwrap_or(0),
        rotational: read_trimmed(&disk_dir.join("queue/rotational")).as_deref() == Some("1"),
        wwn: attr(disk_dir.join("wwid"))
            .or_else(|| attr(device.join("wwid")))
            .or_else(|| udev.get("ID_WWN_WITH_EXTENSION").cloned())
            .or_else(|| udev.get("ID_WWN").cloned()),
        serial: attr(device.join("serial"))
            .or_else(|| udev.get("ID_SERIAL_SHORT").cloned())
            .or_else(|| udev.get("ID_SCSI_SERIAL").cloned())
            .or_else(|| vpd_serial(&device.join("vpd_pg80"))),
        vendor: attr(device.join("vendor")).or_else(|| udev.get("ID_VENDOR").cloned()),
        hctl: link_hctl(&device),
        by_path: by_path
            .get(kname)
            .cloned()
            .or_else(|| path_id(root, &disk_dir, kname, &real)),
        logical_sectors: read_u64(&disk_dir.join("queue/logical_block_size")),
        physical_sectors: read_u64(&disk_dir.join("queue/physical_block_size")),
        tran: transport(kname, &real),
        holders: md_members(dir),
        raid_level: read_trimmed(&dir.join("md/level")).filter(|l| !l.is_empty()),
    }
}

/// A software RAID device's members (`slaves/`), as `/dev` paths in name order.
fn md_members(dir: &Path) -> Vec<String> {
    if !dir.join("md").is_dir() {
        return Vec::new();
    }
    let mut out: Vec<String> = std::fs::read_dir(dir.join("slaves"))
        .map(|rd| {
            rd.flatten()
                .map(|e| format!("/dev/{}", e.file_name().to_string_lossy()))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// The serial number in a SCSI Unit Serial Number VPD page (0x80): a 4-byte header whose
/// bytes 2..4 give the length, then ASCII padded with spaces.
fn vpd_serial(path: &Path) -> Option<String> {
    let page = std::fs::read(path).ok()?;
    if page.len() < 4 || page[1] != 0x80 {
        return None;
    }
    let len = usize::from(u16::from_be_bytes([page[2], page[3]]));
    let raw = page.get(4..4 + len).or_else(|| page.get(4..))?;
    let text = String::from_utf8_lossy(raw);
    let t = text.trim_matches(|c: char| c.is_whitespace() || c == '\0');
    (!t.is_empty() && t.chars().all(|c| c.is_ascii_graphic() || c == ' ')).then(|| t.to_string())
}

/// Whether a sysfs path component is a PCI address (`0000:00:1f.2`).
fn is_pci_address(c: &str) -> bool {
    let b = c.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && c.chars()
            .enumerate()
            .all(|(i, ch)| matches!(i, 4 | 7 | 10) || ch.is_ascii_hexdigit())
}

/// The by-path name udev's `path_id` gives a disk on a PCI controller, from the disk's real
/// sysfs path: NVMe namespaces `pci-ADDR-nvme-NSID`, libata disks `pci-ADDR-ata-PORT` (the
/// compatibility link, first in name order among udev's), virtio disks `pci-ADDR`. Other
/// transports (SCSI HBAs, USB) are left to udev: `None`.
fn path_id(root: &Root, disk_dir: &Path, kname: &str, real: &str) -> Option<String> {
    let parts: Vec<&str> = real.split('/').collect();
    let pci_at = parts.iter().rposition(|c| is_pci_address(c))?;
    let pci = parts[pci_at];
    let below = &parts[pci_at + 1..];
    if kname.starts_with("nvme") && below.first() == Some(&"nvme") {
        let nsid = read_u64(&disk_dir.join("nsid"))
            .or_else(|| kname.rsplit_once('n').and_then(|(_, n)| n.parse().ok()))?;
        return Some(format!("/dev/disk/by-path/pci-{pci}-nvme-{nsid}"));
    }
    if let Some(port) = below.iter().find_map(|c| {
        c.strip_prefix("ata")
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    }) {
        let port_no = read_u64(&root.path(format!("/sys/class/ata_port/ata{port}/port_no")))
            .map_or_else(|| port.to_string(), |n| n.to_string());
        return Some(format!("/dev/disk/by-path/pci-{pci}-ata-{port_no}"));
    }
    if below.first().is_some_and(|c| {
        c.strip_prefix("virtio")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    }) && below.get(1) == Some(&"block")
    {
        return Some(format!("/dev/disk/by-path/pci-{pci}"));
    }
    None
}

/// SCSI address from the `device` link (`…/0:0:1:0`), if it is one.
fn link_hctl(device: &Path) -> Option<String> {
    let name = std::fs::canonicalize(device).ok()?;
    let name = name.file_name()?.to_string_lossy().into_owned();
    let parts: Vec<&str> = name.split(':').collect();
    (parts.len() == 4 && parts.iter().all(|p| p.parse::<u32>().is_ok())).then_some(name)
}

/// Transport guessed from the kernel name and the sysfs device path, as lsblk does.
fn transport(kname: &str, sys_path: &str) -> Option<String> {
    let t = if kname.starts_with("nvme") {
        "nvme"
    } else if sys_path.contains("/usb") {
        "usb"
    } else if sys_path.contains("/virtio") {
        "virtio"
    } else if sys_path.contains("/ata") {
        "sata"
    } else if sys_path.contains("/sas_") || sys_path.contains("/end_device") {
        "sas"
    } else if sys_path.contains("/session") {
        "iscsi"
    } else if sys_path.contains("/host") {
        "scsi"
    } else {
        return None;
    };
    Some(t.to_string())
}

/// `E:KEY=value` properties of a udev database entry.
fn parse_udev(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("E:"))
        .filter_map(|kv| kv.split_once('='))
        .filter(|(_, v)| !v.trim().is_empty())
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::testutil::TempTree;
    use super::*;

    fn fake_disk(t: &TempTree, name: &str, sysdev: &str, dev: &str, sectors: &str) {
        let d = format!("/sys/devices/{sysdev}/block/{name}");
        t.file(&format!("{d}/size"), sectors)
            .file(&format!("{d}/dev"), dev)
            .file(&format!("{d}/queue/rotational"), "1\n")
            .file(&format!("{d}/queue/logical_block_size"), "512\n")
            .file(&format!("{d}/queue/physical_block_size"), "4096\n")
            .link(
                &format!("/sys/block/{name}"),
                &t.path().join(d.trim_start_matches('/')).to_string_lossy(),
            );
    }

    #[test]
    fn sata_disk_with_udev_and_by_path() {
        let t = TempTree::new("disks");
        let host = "pci0000:00/0000:00:1f.2/ata1/host0/target0:0:0/0:0:0:0";
        fake_disk(&t, "sda", host, "8:0\n", "1953525168\n");
        t.file(&format!("/sys/devices/{host}/model"), "ST1000DM003  \n")
            .file(&format!("/sys/devices/{host}/vendor"), "ATA\n")
            .link(
                &format!("/sys/devices/{host}/block/sda/device"),
                &t.path()
                    .join(format!("sys/devices/{host}"))
                    .to_string_lossy(),
            )
            .file(
                "/run/udev/data/b8:0",
                "S:disk/by-id/x\nE:ID_SERIAL_SHORT=Z1D5\nE:ID_WWN=0x5000c500\nE:ID_MODEL=\n",
            )
            .link("/dev/disk/by-path/pci-0000:00:1f.2-ata-1", "../../sda")
            .link(
                "/dev/disk/by-path/pci-0000:00:1f.2-ata-1-part1",
                "../../sda1",
            );
        // Excluded: RAM disk, zram (even with a size), empty slot, unbacked loop.
        // Included: backed loop.
        fake_disk(&t, "ram0", "virtual", "1:0\n", "8192\n");
        fake_disk(&t, "zram0", "virtual", "252:0\n", "8388608\n");
        fake_disk(&t, "sdz", "virtual", "8:240\n", "0\n");
        fake_disk(&t, "loop0", "virtual", "7:0\n", "0\n");
        fake_disk(&t, "loop1", "virtual", "7:1\n", "2048\n");
        t.file(
            "/sys/devices/virtual/block/loop1/loop/backing_file",
            "/tmp/x\n",
        );

        let disks = collect_disks(&Root::new(t.path()));
        let names: Vec<&str> = disks.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, vec!["/dev/loop1", "/dev/sda"]);
        let sda = &disks[1];
        assert_eq!(sda.size, 1953525168 * 512);
        assert!(sda.rotational);
        assert_eq!(sda.model, "ST1000DM003");
        assert_eq!(sda.vendor.as_deref(), Some("ATA"));
        assert_eq!(sda.serial.as_deref(), Some("Z1D5"));
        assert_eq!(sda.wwn.as_deref(), Some("0x5000c500"));
        assert_eq!(sda.hctl.as_deref(), Some("0:0:0:0"));
        assert_eq!(
            sda.by_path.as_deref(),
            Some("/dev/disk/by-path/pci-0000:00:1f.2-ata-1")
        );
        assert_eq!(sda.tran.as_deref(), Some("sata"));
        assert_eq!(sda.logical_sectors, Some(512));
        assert_eq!(sda.physical_sectors, Some(4096));
        assert_eq!(disks[0].tran, None);
    }

    /// The sysfs layout of QEMU's `-device nvme` namespace and an AHCI `ide-hd`, as the
    /// Debian 6.1 kernel shows them, without udev (the ramdisk).
    #[test]
    fn nvme_and_sata_without_udev() {
        let t = TempTree::new("disks-noudev");
        let nvme = "pci0000:00/0000:00:04.0/nvme/nvme0";
        fake_disk(&t, "nvme0n1", nvme, "259:0\n", "131072\n");
        t.file(
            &format!("/sys/devices/{nvme}/model"),
            "QEMU NVMe Ctrl                          \n",
        )
        .file(
            &format!("/sys/devices/{nvme}/serial"),
            "RIVETNVME01         \n",
        )
        .file(&format!("/sys/devices/{nvme}/block/nvme0n1/nsid"), "2\n")
        .link(
            &format!("/sys/devices/{nvme}/block/nvme0n1/device"),
            &t.path()
                .join(format!("sys/devices/{nvme}"))
                .to_string_lossy(),
        );
        let sata = "pci0000:00/0000:00:05.0/ata3/host2/target2:0:0/2:0:0:0";
        fake_disk(&t, "sda", sata, "8:0\n", "131072\n");
        let mut pg80 = vec![0x00, 0x80, 0x00, 0x14];
        pg80.extend_from_slice(b"RIVETSATA01         ");
        t.file(&format!("/sys/devices/{sata}/model"), "RIVET SATA\n")
            .file(&format!("/sys/devices/{sata}/vendor"), "ATA     \n")
            .file(&format!("/sys/devices/{sata}/vpd_pg80"), pg80)
            .file("/sys/class/ata_port/ata3/port_no", "1\n")
            .link(
                &format!("/sys/devices/{sata}/block/sda/device"),
                &t.path()
                    .join(format!("sys/devices/{sata}"))
                    .to_string_lossy(),
            );
        fake_disk(
            &t,
            "vda",
            "pci0000:00/0000:00:06.0/virtio2",
            "254:0\n",
            "32768\n",
        );
        let disks = collect_disks(&Root::new(t.path()));
        let by_name = |n: &str| {
            disks
                .iter()
                .find(|d| d.name == n)
                .unwrap_or_else(|| panic!("{n} missing from {disks:?}"))
        };
        let n = by_name("/dev/nvme0n1");
        assert_eq!(n.model, "QEMU NVMe Ctrl");
        assert_eq!(n.serial.as_deref(), Some("RIVETNVME01"));
        assert_eq!(n.size, 64 << 20);
        assert_eq!(n.tran.as_deref(), Some("nvme"));
        assert_eq!(
            n.by_path.as_deref(),
            Some("/dev/disk/by-path/pci-0000:00:04.0-nvme-2")
        );
        let s = by_name("/dev/sda");
        assert_eq!(s.serial.as_deref(), Some("RIVETSATA01"));
        assert_eq!(s.tran.as_deref(), Some("sata"));
        assert_eq!(
            s.by_path.as_deref(),
            Some("/dev/disk/by-path/pci-0000:00:05.0-ata-1")
        );
        assert_eq!(
            by_name("/dev/vda").by_path.as_deref(),
            Some("/dev/disk/by-path/pci-0000:00:06.0")
        );
    }

    #[test]
    fn vpd_and_pci_parsing() {
        let t = TempTree::new("disks-vpd");
        t.file("/a", vec![0x00, 0x80, 0x00, 0x40, b'S', b'1'])
            .file("/b", vec![0x00, 0x83, 0x00, 0x02, b'S', b'1'])
            .file("/c", vec![0x00, 0x80]);
        assert_eq!(vpd_serial(&t.path().join("a")).as_deref(), Some("S1"));
        assert_eq!(vpd_serial(&t.path().join("b")), None);
        assert_eq!(vpd_serial(&t.path().join("c")), None);
        assert!(is_pci_address("0000:00:1f.2"));
        assert!(!is_pci_address("pci0000:00"));
        assert!(!is_pci_address("0000:00:1g.2"));
    }

    #[test]
    fn odd_sysfs_content_does_not_panic() {
        let t = TempTree::new("disks-odd");
        fake_disk(&t, "vdz", "virtual", "garbage", "-5\n");
        t.file("/sys/block/notadir", "x");
        // An unreadable size is no size: not a disk.
        let disks = collect_disks(&Root::new(t.path()));
        assert!(disks.iter().all(|d| d.name != "/dev/vdz"), "{disks:?}");
    }

    #[test]
    fn explicit_paths_regular_files_and_missing() {
        let t = TempTree::new("disks-paths");
        t.file("/img/a.img", vec![0u8; 4096]);
        let a = t.path().join("img/a.img");
        let missing = t.path().join("img/missing");
        let disks = disks_for_paths(&Root::new(t.path()), &[a.clone(), missing.clone()]);
        assert_eq!(disks.len(), 2);
        assert_eq!(disks[0].name, a.to_string_lossy());
        assert_eq!(disks[0].size, 4096);
        assert!(!disks[0].rotational);
        assert_eq!(disks[1].size, 0);
    }

    #[test]
    fn dev_t_split() {
        // makedev(259, 3) and makedev(8, 17) as glibc encodes them.
        assert_eq!(dev_major_minor((259 << 8) | 3), (259, 3));
        assert_eq!(dev_major_minor((8 << 8) | 17), (8, 17));
        let big = ((0x1234u64 & !0xfff) << 32) | ((0x1234 & 0xfff) << 8) | 0x56;
        assert_eq!(dev_major_minor(big), (0x1234, 0x56));
    }

    #[test]
    fn transports() {
        assert_eq!(transport("nvme0n1", "").as_deref(), Some("nvme"));
        assert_eq!(
            transport(
                "vda",
                "/sys/devices/pci0000:00/0000:00:02.0/virtio1/block/vda"
            )
            .as_deref(),
            Some("virtio")
        );
        assert_eq!(transport("dm-0", "/sys/devices/virtual/block/dm-0"), None);
    }
}
