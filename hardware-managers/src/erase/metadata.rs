//! `erase_devices_metadata`: make a disk look blank to every partition-table, filesystem,
//! RAID, LVM and encryption probe, while leaving the data in between alone.
//!
//! Rule: zero the first and the last MiB of the device and of each of its partitions (all of
//! it when the range is 2 MiB or less). Why 1 MiB at both ends rather than a list of magic
//! offsets: every signature blkid/wipefs know sits inside those windows — MBR and protective
//! MBR (0), primary GPT (LBA 1–33, ≤ 136 KiB with 4 KiB sectors), backup GPT (last 33
//! sectors), ext2/3/4 (1024 + 56), XFS (0), btrfs primary superblock (64 KiB), LVM2 label
//! (sectors 0–3), LUKS1/2 headers (0, and the LUKS2 secondary header at 16 KiB), md 0.90
//! (64 KiB-aligned, last 64–128 KiB) and 1.0 (end − 8 KiB), 1.1 (0) and 1.2 (4 KiB), swap
//! (last bytes of the first page), FAT/NTFS boot sectors (0), iso9660 (32 KiB), ZFS labels
//! (L0/L1 in the first 512 KiB, L2/L3 in the last 512 KiB), bcache (4 KiB) — and it keeps
//! working for layouts not listed, at a cost of 2 MiB per device or partition. Backup
//! superblocks deep inside a filesystem (ext4 groups, btrfs at 64 MiB) are not touched, as
//! with IPA's wipefs: probes only trust the primary, and the full erase handles the rest.
//!
//! Writes go through the whole-disk device with O_DIRECT, so neither the disk's nor a stale
//! buffered view can resurrect the old bytes; then fsync, read back, BLKRRPART.

use super::device::{Partition, Target, TargetKind};
use super::zero::{write_zeros, AlignedBuf};
use super::{ioctl, merge_ranges, table, EraseError};
use crate::StepContext;
use serde_json::{json, Value};
use std::fs::File;
use std::os::unix::fs::FileExt;

/// Window zeroed at each end of a device or partition.
pub const WINDOW: u64 = 1 << 20;

/// The byte ranges to zero for a device or partition at `start` of `size` bytes.
pub fn windows(start: u64, size: u64) -> Vec<(u64, u64)> {
    if size <= 2 * WINDOW {
        vec![(start, size)]
    } else {
        vec![(start, WINDOW), (start + size - WINDOW, WINDOW)]
    }
}

/// What will be zeroed on one target.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Partitions found (kernel's, else parsed from the table).
    pub partitions: Vec<Partition>,
    /// Merged byte ranges to zero, clamped to the device.
    pub ranges: Vec<(u64, u64)>,
}

impl Plan {
    /// Bytes to be written.
    pub fn bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.1).sum()
    }
}

/// Find the partitions and compute the ranges. Partitions are both the kernel's (sysfs) and
/// the table's on the target itself, because either can be wrong on its own: files and loop
/// devices without partscan have no kernel view; and the kernel's view goes stale when a
/// table is rewritten without a re-read (a partition added with BLKPG by partx or sfdisk, a
/// re-read refused while a partition was open). A partition only one of them knows still
/// holds a signature a probe may find once the other view is refreshed.
pub fn plan(t: &Target) -> Result<Plan, EraseError> {
    let mut partitions = t.sysfs_partitions();
    let f = File::open(&t.path).map_err(|source| EraseError::Io {
        device: t.display(),
        op: "open to read the partition table",
        source,
    })?;
    for p in table::parse(&f, t.size, t.sector, &t.name()) {
        if !partitions
            .iter()
            .any(|k| k.start == p.start && k.size == p.size)
        {
            partitions.push(p);
        }
    }
    // IPA wipes partitions in reverse name order before the disk; with plain zeroing the
    // order does not matter, the set of ranges does.
    let mut ranges = windows(0, t.size);
    for p in &partitions {
        let size = p.size.min(t.size.saturating_sub(p.start));
        ranges.extend(windows(p.start, size));
    }
    let ranges = merge_ranges(ranges)
        .into_iter()
        .filter(|(o, l)| *l > 0 && o + l <= t.size)
        .collect();
    Ok(Plan { partitions, ranges })
}

/// Zero the planned ranges, flush, read them back, re-read the partition table.
pub fn erase(
    t: &Target,
    plan: &Plan,
    ctx: &StepContext,
    on_chunk: &mut dyn FnMut(u64),
) -> Result<Value, EraseError> {
    let (f, direct) = t.open_write(true)?;
    let buf = AlignedBuf::new(WINDOW as usize);
    for &(off, len) in &plan.ranges {
        // O_DIRECT needs sector-aligned offsets; sysfs partition offsets always are. Fall back
        // to a buffered fd for a range that is not (a hand-made table on a file).
        if direct && (off % t.sector != 0 || len % t.sector != 0) {
            let (bf, _) = t.open_write(false)?;
            write_zeros(t, &bf, &buf, off, len, ctx, on_chunk)?;
            bf.sync_data().map_err(|source| EraseError::Io {
                device: t.display(),
                op: "fsync",
                source,
            })?;
        } else {
            write_zeros(t, &f, &buf, off, len, ctx, on_chunk)?;
        }
    }
    f.sync_all().map_err(|source| EraseError::Io {
        device: t.display(),
        op: "fsync",
        source,
    })?;
    // Read back through a buffered fd (after dropping any cached pages).
    let rf = File::open(&t.path).map_err(|source| EraseError::Io {
        device: t.display(),
        op: "open for verification",
        source,
    })?;
    if matches!(t.kind, TargetKind::Block { .. }) {
        let _ = ioctl::flush_buffers(&rf);
    }
    let mut rb = vec![0u8; WINDOW as usize];
    for &(off, len) in &plan.ranges {
        let mut pos = off;
        while pos < off + len {
            let n = (off + len - pos).min(WINDOW) as usize;
            rf.read_exact_at(&mut rb[..n], pos)
                .map_err(|source| EraseError::Io {
                    device: t.display(),
                    op: "read back",
                    source,
                })?;
            if let Some(i) = rb[..n].iter().position(|b| *b != 0) {
                return Err(EraseError::Verify {
                    device: t.display(),
                    offset: pos + i as u64,
                });
            }
            pos += n as u64;
        }
    }
    let mut note = None;
    if t.is_whole_disk() {
        match ioctl::reread_partitions(&f) {
            Ok(()) => {}
            // Loop devices attached without partscan answer EINVAL: nothing to re-read.
            Err(nix::Error::EINVAL) => {}
            Err(e) => {
                tracing::warn!(device = %t.display(), error = %e, "BLKRRPART failed; the kernel may still list old partitions");
                note = Some(format!("BLKRRPART failed: {e}"));
            }
        }
    }
    Ok(json!({
        "device": t.display(),
        "method": "metadata",
        "partitions": plan.partitions.iter().map(|p| p.name.clone()).collect::<Vec<_>>(),
        "bytes": plan.bytes(),
        "ranges": plan.ranges.iter().map(|(o, l)| json!([o, l])).collect::<Vec<_>>(),
        "note": note,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_at_both_ends() {
        assert_eq!(windows(0, 1000), vec![(0, 1000)]);
        assert_eq!(windows(0, 2 * WINDOW), vec![(0, 2 * WINDOW)]);
        let w = windows(4096, 10 * WINDOW);
        assert_eq!(w, vec![(4096, WINDOW), (4096 + 9 * WINDOW, WINDOW)]);
    }
}
