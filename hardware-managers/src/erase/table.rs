//! Partition-table parsing for targets the kernel has not partitioned: regular files and
//! loop devices attached without `--partscan`. GPT (primary header, else the backup at the
//! last sector) and MBR including the logical partitions of an extended partition. The
//! result is only used to find where partition signatures live, so a damaged table simply
//! yields fewer partitions; it never errors.

use super::device::Partition;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// Upper bound on GPT entries read (the spec minimum is 128; nobody uses more than 1024).
const MAX_GPT_ENTRIES: u64 = 1024;
/// Bound on the EBR chain walk, against loops in a corrupted chain.
const MAX_LOGICAL: usize = 128;

fn read_at(f: &File, off: u64, len: usize) -> Option<Vec<u8>> {
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, off).ok()?;
    Some(b)
}

fn le32(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from(u32::from_le_bytes(
        b.get(at..at + 4)?.try_into().ok()?,
    )))
}

fn le64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Partitions of the table at the start of `f` (`size` bytes, logical `sector` bytes).
pub fn parse(f: &File, size: u64, sector: u64, label: &str) -> Vec<Partition> {
    let mut parts = gpt(f, size, label).unwrap_or_default();
    if parts.is_empty() {
        parts = mbr(f, size, sector, label).unwrap_or_default();
    }
    parts
}

fn gpt(f: &File, size: u64, label: &str) -> Option<Vec<Partition>> {
    // Logical sector size of a file is unknown: try 512 then 4096, primary then backup.
    for sector in [512u64, 4096] {
        let candidates = [sector, size.checked_sub(sector)?];
        for hdr_off in candidates {
            let Some(h) = read_at(f, hdr_off, 92) else {
                continue;
            };
            if &h[..8] != b"EFI PART" {
                continue;
            }
            let entries_lba = le64(&h, 72)?;
            let count = le32(&h, 80)?.min(MAX_GPT_ENTRIES);
            let esize = le32(&h, 84)?;
            if !(128..=4096).contains(&esize) {
                continue;
            }
            let Some(table) = read_at(
                f,
                entries_lba.checked_mul(sector)?,
                (count * esize) as usize,
            ) else {
                continue;
            };
            let mut out = Vec::new();
            for (i, e) in table.chunks_exact(esize as usize).enumerate() {
                if e[..16].iter().all(|b| *b == 0) {
                    continue; // unused entry
                }
                let (Some(first), Some(last)) = (le64(e, 32), le64(e, 40)) else {
                    continue;
                };
                let start = first.saturating_mul(sector);
                let end = last.saturating_add(1).saturating_mul(sector).min(size);
                if last < first || start >= size {
                    continue;
                }
                out.push(Partition {
                    name: format!("{label}#{}", i + 1),
                    start,
                    size: end - start,
                    dev: None,
                });
            }
            return Some(out);
        }
    }
    None
}

fn mbr_entries(b: &[u8]) -> Vec<(u8, u64, u64)> {
    (0..4)
        .filter_map(|i| {
            let e = b.get(446 + 16 * i..446 + 16 * (i + 1))?;
            Some((e[4], le32(e, 8)?, le32(e, 12)?))
        })
        .collect()
}

fn is_extended(t: u8) -> bool {
    matches!(t, 0x05 | 0x0F | 0x85)
}

fn mbr(f: &File, size: u64, sector: u64, label: &str) -> Option<Vec<Partition>> {
    let b = read_at(f, 0, 512)?;
    if b[510] != 0x55 || b[511] != 0xAA {
        return None;
    }
    let mut out = Vec::new();
    let mut push = |name: String, lba: u64, count: u64| {
        let start = lba.saturating_mul(sector);
        let end = lba.saturating_add(count).saturating_mul(sector).min(size);
        if count > 0 && start < end {
            out.push(Partition {
                name,
                start,
                size: end - start,
                dev: None,
            });
        }
    };
    let mut extended = None;
    for (i, (t, lba, count)) in mbr_entries(&b).into_iter().enumerate() {
        if t == 0 || t == 0xEE {
            continue; // empty, or protective MBR of a GPT disk whose GPT did not parse
        }
        push(format!("{label}#{}", i + 1), lba, count);
        if is_extended(t) && extended.is_none() {
            extended = Some(lba);
        }
    }
    // Logical partitions: a chain of EBRs, each with the partition (relative to the EBR) and
    // a link to the next EBR (relative to the start of the extended partition).
    if let Some(ext) = extended {
        let mut ebr = ext;
        for n in 0..MAX_LOGICAL {
            let Some(e) = read_at(f, ebr.saturating_mul(sector), 512) else {
                break;
            };
            if e[510] != 0x55 || e[511] != 0xAA {
                break;
            }
            let ents = mbr_entries(&e);
            if let Some(&(t, rel, count)) = ents.first() {
                if t != 0 {
                    push(format!("{label}#{}", 5 + n), ebr + rel, count);
                }
            }
            match ents.get(1) {
                Some(&(t, rel, _)) if is_extended(t) && rel != 0 => ebr = ext + rel,
                _ => break,
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn entry(t: u8, lba: u32, count: u32) -> [u8; 16] {
        let mut e = [0u8; 16];
        e[4] = t;
        e[8..12].copy_from_slice(&lba.to_le_bytes());
        e[12..16].copy_from_slice(&count.to_le_bytes());
        e
    }

    #[test]
    fn mbr_with_logical_partitions() {
        let f = tempfile::tempfile().expect("tmp");
        f.set_len(64 << 20).expect("len");
        let mut mbr = [0u8; 512];
        mbr[446..462].copy_from_slice(&entry(0x83, 2048, 4096));
        mbr[462..478].copy_from_slice(&entry(0x05, 8192, 40960));
        mbr[510] = 0x55;
        mbr[511] = 0xAA;
        f.write_all_at(&mbr, 0).expect("w");
        // First EBR at 8192: logical at +2048, next EBR at ext+20480.
        let mut ebr = [0u8; 512];
        ebr[446..462].copy_from_slice(&entry(0x83, 2048, 4096));
        ebr[462..478].copy_from_slice(&entry(0x05, 20480, 8192));
        ebr[510] = 0x55;
        ebr[511] = 0xAA;
        f.write_all_at(&ebr, 8192 * 512).expect("w");
        let mut ebr2 = [0u8; 512];
        ebr2[446..462].copy_from_slice(&entry(0x83, 2048, 2048));
        ebr2[510] = 0x55;
        ebr2[511] = 0xAA;
        f.write_all_at(&ebr2, (8192 + 20480) * 512).expect("w");
        let p = parse(&f, 64 << 20, 512, "d");
        let starts: Vec<u64> = p.iter().map(|p| p.start / 512).collect();
        assert_eq!(starts, vec![2048, 8192, 10240, 30720]);
    }

    #[test]
    fn garbage_yields_nothing() {
        let f = tempfile::tempfile().expect("tmp");
        f.write_all_at(&[0xAB; 8192], 0).expect("w");
        assert!(parse(&f, 8192, 512, "d").is_empty());
        let empty = tempfile::tempfile().expect("tmp");
        assert!(parse(&empty, 0, 512, "d").is_empty());
    }
}
