//! DMI: system identity from /sys/class/dmi/id and installed memory from the raw SMBIOS table.

use super::Root;
use rivet_protocol::inventory::{Firmware, SystemVendor};

pub(super) fn system_vendor(root: &Root) -> SystemVendor {
    let id = |f: &str| {
        root.read(format!("/sys/class/dmi/id/{f}"))
            .unwrap_or_default()
    };
    let uuid = id("product_uuid");
    SystemVendor {
        product_name: id("product_name"),
        serial_number: id("product_serial"),
        manufacturer: id("sys_vendor"),
        uuid: (!uuid.is_empty()).then(|| uuid.to_ascii_lowercase()),
        firmware: Firmware {
            vendor: id("bios_vendor"),
            version: id("bios_version"),
            build_date: id("bios_date"),
        },
    }
}

/// Sum of the memory devices (SMBIOS type 17) in MiB; `None` when the table is unreadable
/// (non-root, no DMI) or lists no memory.
pub(super) fn installed_memory_mb(root: &Root) -> Option<u64> {
    let table = std::fs::read(root.path("/sys/firmware/dmi/tables/DMI")).ok()?;
    let mb = sum_memory_devices(&table);
    (mb > 0).then_some(mb)
}

/// Walk the SMBIOS structures: header (type, length, handle), formatted area, then strings
/// ending with a double NUL. Stops quietly at the first malformed structure.
fn sum_memory_devices(table: &[u8]) -> u64 {
    let mut total = 0u64;
    let mut pos = 0usize;
    while pos + 4 <= table.len() {
        let kind = table[pos];
        let len = table[pos + 1] as usize;
        if len < 4 || pos + len > table.len() {
            break;
        }
        let s = &table[pos..pos + len];
        if kind == 17 && len >= 0x0E {
            let size = u16::from_le_bytes([s[0x0C], s[0x0D]]);
            total += match size {
                0 | 0xFFFF => 0,
                // Extended size (MiB) lives at 0x1C when the short field says 0x7FFF.
                0x7FFF if len >= 0x20 => {
                    u32::from_le_bytes([s[0x1C], s[0x1D], s[0x1E], s[0x1F]]) as u64 & 0x7FFF_FFFF
                }
                0x7FFF => 0,
                s if s & 0x8000 != 0 => (s & 0x7FFF) as u64 / 1024, // KiB granularity
                s => s as u64,
            };
        }
        if kind == 127 {
            break; // end-of-table
        }
        // Skip the string set: find the double NUL after the formatted area.
        let mut p = pos + len;
        loop {
            if p + 1 >= table.len() {
                return total;
            }
            if table[p] == 0 && table[p + 1] == 0 {
                break;
            }
            p += 1;
        }
        pos = p + 2;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::super::testutil::TempTree;
    use super::*;

    fn type17(size: u16, ext: u32) -> Vec<u8> {
        let mut s = vec![0u8; 0x28];
        s[0] = 17;
        s[1] = 0x28;
        s[0x0C..0x0E].copy_from_slice(&size.to_le_bytes());
        s[0x1C..0x20].copy_from_slice(&ext.to_le_bytes());
        s.extend_from_slice(b"DIMM 0\0\0");
        s
    }

    #[test]
    fn smbios_memory_devices() {
        let mut t = Vec::new();
        t.extend(type17(8192, 0));
        t.extend(type17(0x7FFF, 65536));
        t.extend(type17(0, 0)); // empty slot
        t.extend(type17(0x8000 | 2048, 0)); // 2048 KiB = 2 MiB
        t.extend([127, 4, 0, 0, 0, 0]);
        assert_eq!(sum_memory_devices(&t), 8192 + 65536 + 2);
        // Truncated tables stop quietly.
        assert_eq!(sum_memory_devices(&t[..10]), 0);
        assert_eq!(sum_memory_devices(&[17, 2, 0]), 0);
    }

    #[test]
    fn dmi_ids() {
        let t = TempTree::new("dmi");
        t.file("/sys/class/dmi/id/sys_vendor", "QEMU\n")
            .file("/sys/class/dmi/id/product_uuid", "ABCD-1\n")
            .file("/sys/class/dmi/id/bios_date", "04/01/2014\n");
        let v = system_vendor(&Root::new(t.path()));
        assert_eq!(v.manufacturer, "QEMU");
        assert_eq!(v.uuid.as_deref(), Some("abcd-1"));
        assert_eq!(v.firmware.build_date, "04/01/2014");
        assert_eq!(v.serial_number, "");
    }
}
