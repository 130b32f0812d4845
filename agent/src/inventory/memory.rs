//! Memory: kernel-visible total from /proc/meminfo, installed size from SMBIOS type 17.

use super::{dmi, Root};
use rivet_protocol::inventory::Memory;

pub(super) fn collect(root: &Root) -> Memory {
    let total = root
        .read("/proc/meminfo")
        .and_then(|m| mem_total_bytes(&m))
        .unwrap_or(0);
    let physical_mb = dmi::installed_memory_mb(root).unwrap_or_else(|| round_physical_mb(total));
    Memory { total, physical_mb }
}

/// `MemTotal:  16318412 kB` → bytes.
fn mem_total_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line
        .trim_start_matches("MemTotal:")
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    kb.checked_mul(1024)
}

/// Estimate installed MiB from the kernel-visible total when DMI is unreadable. The kernel
/// keeps a few percent for itself, so round up to the next 1 GiB (or 128 MiB on small VMs).
fn round_physical_mb(total_bytes: u64) -> u64 {
    let mib = total_bytes.div_ceil(1024 * 1024);
    let step = if mib >= 4096 { 1024 } else { 128 };
    mib.div_ceil(step) * step
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo() {
        assert_eq!(
            mem_total_bytes("MemTotal:       16318412 kB\nMemFree: 1 kB\n"),
            Some(16318412 * 1024)
        );
        assert_eq!(mem_total_bytes("MemFree: 1 kB\n"), None);
        assert_eq!(mem_total_bytes("MemTotal: lots\n"), None);
    }

    #[test]
    fn rounding() {
        // 16 GiB machine showing 15.56 GiB.
        assert_eq!(round_physical_mb(16318412 * 1024), 16384);
        // 512 MiB VM showing 480 MiB.
        assert_eq!(round_physical_mb(480 * 1024 * 1024), 512);
        assert_eq!(round_physical_mb(0), 0);
    }
}
