//! Partition tables after a whole-disk image: move a GPT's backup header to the end of the
//! disk, and add the `config-2` partition (GPT or MBR) at its end, as IPA does.
//!
//! Hand-written on purpose: the work is a few dozen fields at fixed offsets plus CRC32
//! (flate2's, already linked), done on the raw device with positioned I/O so it also works
//! on regular files and on loop devices without partition scanning. The maintained crates
//! (gptman, mbrman) want to own a whole table model and re-write it, which is more than
//! moving one header and appending one entry, and they add ~40 KiB to a static agent.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// What went wrong with a partition table.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// I/O on the device.
    #[error("{device}: {op}: {source}")]
    Io {
        /// Device.
        device: String,
        /// What was being done.
        op: &'static str,
        /// OS error.
        source: std::io::Error,
    },
    /// The table does not allow what was asked.
    #[error("{device}: {reason}")]
    Refused {
        /// Device.
        device: String,
        /// Why.
        reason: String,
    },
}

const SIG: &[u8; 8] = b"EFI PART";
/// Linux filesystem data (the type sgdisk gives a new partition by default).
const LINUX_FS_TYPE: [u8; 16] = guid_bytes(
    0x0FC6_3DAF,
    0x8483,
    0x4772,
    [0x8E, 0x79, 0x3D, 0x69, 0xD8, 0x47, 0x7D, 0xE4],
);

/// A GUID in its on-disk (mixed-endian) byte order.
const fn guid_bytes(a: u32, b: u16, c: u16, d: [u8; 8]) -> [u8; 16] {
    let a = a.to_le_bytes();
    let b = b.to_le_bytes();
    let c = c.to_le_bytes();
    [
        a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], d[0], d[1], d[2], d[3], d[4], d[5], d[6],
        d[7],
    ]
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[o..o + 4]);
    u32::from_le_bytes(x)
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(x)
}

fn put_u32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}

fn crc32(data: &[u8]) -> u32 {
    let mut c = flate2::Crc::new();
    c.update(data);
    c.sum()
}

/// The device a table lives on: positioned I/O with errors that name it.
pub struct Device<'a> {
    file: &'a File,
    name: String,
    /// Logical sector size.
    pub sector: u64,
    /// Size in bytes.
    pub size: u64,
}

impl<'a> Device<'a> {
    /// `file` of `size` bytes with `sector`-byte logical sectors, called `name` in errors.
    pub fn new(file: &'a File, name: &str, sector: u64, size: u64) -> Device<'a> {
        Device {
            file,
            name: name.to_string(),
            sector: sector.max(512),
            size,
        }
    }

    fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, TableError> {
        let mut b = vec![0u8; len];
        self.file
            .read_exact_at(&mut b, offset)
            .map_err(|source| self.io("read", source))?;
        Ok(b)
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), TableError> {
        self.file
            .write_all_at(data, offset)
            .map_err(|source| self.io("write", source))
    }

    fn io(&self, op: &'static str, source: std::io::Error) -> TableError {
        TableError::Io {
            device: self.name.clone(),
            op,
            source,
        }
    }

    fn refused(&self, reason: impl Into<String>) -> TableError {
        TableError::Refused {
            device: self.name.clone(),
            reason: reason.into(),
        }
    }

    fn last_lba(&self) -> u64 {
        self.size / self.sector - 1
    }
}

/// The partition table kind found at the start of a disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableKind {
    /// GUID partition table.
    Gpt,
    /// DOS/MBR table.
    Mbr,
    /// Neither.
    None,
}

/// Which table the disk holds.
pub fn table_kind(dev: &Device<'_>) -> Result<TableKind, TableError> {
    if dev.size < 2 * dev.sector {
        return Ok(TableKind::None);
    }
    let hdr = dev.read(dev.sector, 8)?;
    if hdr == SIG {
        return Ok(TableKind::Gpt);
    }
    let mbr = dev.read(0, 512)?;
    if mbr[510] == 0x55 && mbr[511] == 0xAA && (0..4).any(|i| mbr[446 + i * 16 + 4] != 0) {
        return Ok(TableKind::Mbr);
    }
    Ok(TableKind::None)
}

/// A GPT as read from its primary header.
struct Gpt {
    header: Vec<u8>,
    entries: Vec<u8>,
}

impl Gpt {
    fn read(dev: &Device<'_>) -> Result<Gpt, TableError> {
        let header = dev.read(dev.sector, dev.sector as usize)?;
        if &header[..8] != SIG {
            return Err(dev.refused("no GPT header at LBA 1"));
        }
        let hsize = u32_at(&header, 12) as usize;
        if !(92..=dev.sector as usize).contains(&hsize) {
            return Err(dev.refused(format!("GPT header size {hsize} is invalid")));
        }
        let mut check = header[..hsize].to_vec();
        put_u32(&mut check, 16, 0);
        if crc32(&check) != u32_at(&header, 16) {
            return Err(dev.refused("the primary GPT header's CRC is wrong; the image is damaged"));
        }
        let count = u32_at(&header, 80) as usize;
        let esize = u32_at(&header, 84) as usize;
        if esize < 128 || count == 0 || count * esize > 1 << 20 {
            return Err(dev.refused(format!(
                "GPT with {count} entries of {esize} bytes is not supported"
            )));
        }
        let at = u64_at(&header, 72)
            .checked_mul(dev.sector)
            .ok_or_else(|| dev.refused("the GPT partition array's sector is out of range"))?;
        let entries = dev.read(at, count * esize)?;
        if crc32(&entries) != u32_at(&header, 88) {
            return Err(dev.refused("the GPT partition array's CRC is wrong; the image is damaged"));
        }
        Ok(Gpt { header, entries })
    }

    fn entry_size(&self) -> usize {
        u32_at(&self.header, 84) as usize
    }

    fn entry(&self, i: usize) -> &[u8] {
        let s = self.entry_size();
        &self.entries[i * s..(i + 1) * s]
    }

    fn used(&self) -> impl Iterator<Item = (usize, &[u8])> {
        let n = self.entries.len() / self.entry_size();
        (0..n)
            .map(|i| (i, self.entry(i)))
            .filter(|(_, e)| e[..16].iter().any(|b| *b != 0))
    }

    fn entry_sectors(&self, sector: u64) -> u64 {
        (self.entries.len() as u64).div_ceil(sector)
    }

    /// Where the backup partition array goes on this disk (just before its last sector), and
    /// the last sector partitions may then use; refused when the disk cannot hold them.
    fn tail(&self, dev: &Device<'_>) -> Result<(u64, u64), TableError> {
        match dev.last_lba().checked_sub(self.entry_sectors(dev.sector)) {
            Some(backup_entries) if backup_entries > 2 => Ok((backup_entries, backup_entries - 1)),
            _ => Err(dev.refused(format!(
                "the disk ({} bytes) is too small for its GPT's {}-byte partition array",
                dev.size,
                self.entries.len()
            ))),
        }
    }

    /// Write the primary and backup copies with the backup at the end of the disk.
    fn write_both(&mut self, dev: &Device<'_>, last_usable: u64) -> Result<(), TableError> {
        let last = dev.last_lba();
        let (backup_entries, _) = self.tail(dev)?;
        let hsize = u32_at(&self.header, 12) as usize;
        let entries_crc = crc32(&self.entries);
        put_u32(&mut self.header, 88, entries_crc);
        put_u64(&mut self.header, 32, last);
        put_u64(&mut self.header, 48, last_usable);
        let mut primary = self.header.clone();
        put_u32(&mut primary, 16, 0);
        let crc = crc32(&primary[..hsize]);
        put_u32(&mut primary, 16, crc);
        let mut backup = self.header.clone();
        put_u64(&mut backup, 24, last);
        put_u64(&mut backup, 32, 1);
        put_u64(&mut backup, 72, backup_entries);
        put_u32(&mut backup, 16, 0);
        let crc = crc32(&backup[..hsize]);
        put_u32(&mut backup, 16, crc);
        // Backup first: if the primary write is lost, the old primary still describes a
        // consistent disk.
        dev.write(backup_entries * dev.sector, &self.entries)?;
        dev.write(last * dev.sector, &backup)?;
        dev.write(u64_at(&self.header, 72) * dev.sector, &self.entries)?;
        dev.write(dev.sector, &primary)?;
        self.header = primary;
        Ok(())
    }
}

/// Move a GPT's backup header and partition array to the end of the disk (a whole-disk image
/// smaller than the disk leaves them in the middle) and let partitions use the space up to
/// it. `Ok(false)` when there is no GPT or it is already in place.
pub fn relocate_backup(dev: &Device<'_>) -> Result<bool, TableError> {
    if table_kind(dev)? != TableKind::Gpt {
        return Ok(false);
    }
    let mut gpt = Gpt::read(dev)?;
    let old_alt = u64_at(&gpt.header, 32);
    let last = dev.last_lba();
    if old_alt == last {
        return Ok(false);
    }
    if old_alt > last {
        return Err(dev.refused(format!(
            "the image's GPT ends at sector {old_alt}, past the end of this disk (sector {last}): the disk is smaller than the image"
        )));
    }
    let (_, last_usable) = gpt.tail(dev)?;
    gpt.write_both(dev, last_usable)?;
    // The old backup header in the middle of the disk would confuse tools: wipe it.
    if old_alt > 1 {
        dev.write(old_alt * dev.sector, &vec![0u8; dev.sector as usize])?;
    }
    Ok(true)
}

/// A partition: where it starts and its 1-based number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    /// Partition number (1-based).
    pub number: u32,
    /// Byte offset on the disk.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// Reused an existing `config-2` partition.
    pub reused: bool,
}

fn gpt_name(entry: &[u8]) -> String {
    let units: Vec<u16> = entry[56..128]
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .take_while(|u| *u != 0)
        .collect();
    String::from_utf16_lossy(&units)
}

/// Find a partition whose GPT name or filesystem label is `config-2` (case-insensitive), or
/// make one of `len` bytes at the end of the disk: GPT gets a new entry (a fresh unique GUID,
/// named `config-2`), MBR a primary partition (refused when four exist); on a disk over
/// 2 TiB an MBR partition is placed just below the 2 TiB limit.
///
/// The new partition is `want` bytes (IPA's 64 MiB) when the disk has room, else whatever is
/// free after the last partition, as long as `need` bytes (the ISO) fit.
pub fn config_partition(
    dev: &Device<'_>,
    want: u64,
    need: u64,
    label_at: &dyn Fn(u64) -> bool,
) -> Result<Placed, TableError> {
    let align = (1u64 << 20) / dev.sector; // 1 MiB
    let want = want.max(need).div_ceil(dev.sector).div_ceil(align) * align;
    let need_sectors = need.div_ceil(dev.sector);
    // The start for a partition ending at `end` (inclusive) after `used_end`: `want` before
    // the end if it fits, else the first aligned sector after the last partition.
    // `end` is on the disk; `used_end` is whatever the image's table says.
    let start_for = |end: u64, used_end: u64| -> Option<u64> {
        let preferred = (end + 1).saturating_sub(want) / align * align;
        let start = if preferred > used_end {
            preferred
        } else {
            used_end.checked_add(1)?.checked_next_multiple_of(align)?
        };
        (start <= end && end + 1 - start >= need_sectors).then_some(start)
    };
    // Sectors `first..=last` as bytes, when they are a partition on this disk: an entry
    // past its end (or ending before it starts) is no place for the configdrive.
    let on_disk = |first: u64, last: u64| -> Option<(u64, u64)> {
        (first <= last && last <= dev.last_lba())
            .then(|| (first * dev.sector, (last - first + 1) * dev.sector))
    };
    match table_kind(dev)? {
        TableKind::Gpt => {
            relocate_backup(dev)?;
            let mut gpt = Gpt::read(dev)?;
            for (i, e) in gpt.used() {
                let Some((offset, len)) = on_disk(u64_at(e, 32), u64_at(e, 40)) else {
                    continue;
                };
                if gpt_name(e).eq_ignore_ascii_case("config-2") || label_at(offset) {
                    return Ok(Placed {
                        number: i as u32 + 1,
                        offset,
                        len,
                        reused: true,
                    });
                }
            }
            // The image's own claim, but never into the backup table at the disk's end.
            let last_usable = u64_at(&gpt.header, 48).min(gpt.tail(dev)?.1);
            let used_end = gpt
                .used()
                .map(|(_, e)| u64_at(e, 40))
                .max()
                .unwrap_or(0)
                .max(u64_at(&gpt.header, 40).saturating_sub(1));
            let Some(start) = start_for(last_usable, used_end) else {
                return Err(dev.refused(format!(
                    "no room for the configdrive ({} KiB) after the image's last partition",
                    need >> 10
                )));
            };
            let n = gpt.entries.len() / gpt.entry_size();
            let slot = (0..n)
                .find(|i| gpt.entry(*i)[..16].iter().all(|b| *b == 0))
                .ok_or_else(|| dev.refused("the GPT has no free partition entry"))?;
            let es = gpt.entry_size();
            let e = &mut gpt.entries[slot * es..(slot + 1) * es];
            e.fill(0);
            e[..16].copy_from_slice(&LINUX_FS_TYPE);
            let mut unique = [0u8; 16];
            fill_random(&mut unique);
            // RFC 4122 version 4, variant 1 (in the mixed-endian layout).
            unique[7] = (unique[7] & 0x0f) | 0x40;
            unique[8] = (unique[8] & 0x3f) | 0x80;
            e[16..32].copy_from_slice(&unique);
            put_u64(e, 32, start);
            put_u64(e, 40, last_usable);
            for (i, u) in "config-2".encode_utf16().enumerate() {
                e[56 + 2 * i..58 + 2 * i].copy_from_slice(&u.to_le_bytes());
            }
            gpt.write_both(dev, last_usable)?;
            Ok(Placed {
                number: slot as u32 + 1,
                offset: start * dev.sector,
                len: (last_usable - start + 1) * dev.sector,
                reused: false,
            })
        }
        TableKind::Mbr => {
            let mut mbr = dev.read(0, 512)?;
            let entries: Vec<(usize, u8, u64, u64)> = (0..4)
                .map(|i| {
                    let o = 446 + i * 16;
                    (
                        i,
                        mbr[o + 4],
                        u64::from(u32_at(&mbr, o + 8)),
                        u64::from(u32_at(&mbr, o + 12)),
                    )
                })
                .collect();
            for (i, t, first, count) in &entries {
                if *t == 0 || *count == 0 {
                    continue;
                }
                let Some((offset, len)) = on_disk(*first, first + count - 1) else {
                    continue;
                };
                if label_at(offset) {
                    return Ok(Placed {
                        number: *i as u32 + 1,
                        offset,
                        len,
                        reused: true,
                    });
                }
            }
            let Some((slot, ..)) = entries.iter().find(|e| e.1 == 0) else {
                return Err(dev.refused(
                    "the disk's MBR already has 4 primary partitions: no room for a config-2 partition (use a GPT image)",
                ));
            };
            // MBR addresses at most 2^32 sectors (2 TiB with 512-byte sectors).
            let limit = dev.last_lba().min(u64::from(u32::MAX) - 1);
            let used_end = entries
                .iter()
                .filter(|e| e.1 != 0)
                .map(|e| e.2 + e.3)
                .max()
                .unwrap_or(1);
            let Some(start) = start_for(limit, used_end.saturating_sub(1)) else {
                return Err(dev.refused(format!(
                    "no room for the configdrive ({} KiB) after the image's partitions",
                    need >> 10
                )));
            };
            let count = limit + 1 - start;
            let o = 446 + slot * 16;
            mbr[o..o + 16].fill(0);
            // CHS fields set to the "beyond CHS" marker, as modern tools do.
            mbr[o + 1..o + 4].copy_from_slice(&[0xFE, 0xFF, 0xFF]);
            mbr[o + 4] = 0x83;
            mbr[o + 5..o + 8].copy_from_slice(&[0xFE, 0xFF, 0xFF]);
            put_u32(&mut mbr, o + 8, start as u32);
            put_u32(&mut mbr, o + 12, count as u32);
            dev.write(446, &mbr[446..512])?;
            Ok(Placed {
                number: *slot as u32 + 1,
                offset: start * dev.sector,
                len: count * dev.sector,
                reused: false,
            })
        }
        TableKind::None => Err(dev.refused(
            "the image left no partition table on the disk: a configdrive needs a GPT or MBR image",
        )),
    }
}

fn fill_random(b: &mut [u8]) {
    use std::io::Read;
    if let Ok(mut f) = File::open("/dev/urandom") {
        if f.read_exact(b).is_ok() {
            return;
        }
    }
    // No /dev/urandom (a broken ramdisk): time and address still make it unique enough for
    // one machine's partition table.
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    for (i, x) in b.iter_mut().enumerate() {
        *x = (t >> ((i % 16) * 8)) as u8 ^ (i as u8).wrapping_mul(151);
    }
}

/// What identifies a partition to the firmware (the UEFI hard-drive device path's signature).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionId {
    /// A GPT entry: its type and unique GUIDs, in their on-disk (mixed-endian) byte order.
    Gpt {
        /// Partition type GUID.
        type_guid: [u8; 16],
        /// Unique partition GUID.
        unique_guid: [u8; 16],
    },
    /// A primary MBR partition: its type byte and the disk's 32-bit signature (offset 440).
    Mbr {
        /// Partition type (`0xEF` for an ESP).
        type_byte: u8,
        /// The disk signature.
        disk_signature: u32,
    },
}

/// One partition of the disk's table, in logical sectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    /// Partition number (1-based), as the kernel and the firmware count them.
    pub number: u32,
    /// First sector.
    pub first_lba: u64,
    /// Length in sectors.
    pub sectors: u64,
    /// Type and identity.
    pub id: PartitionId,
}

/// The partitions of the disk's table: every used GPT entry (a damaged GPT is an error), or
/// the four primary MBR slots that are in use (logical partitions are not listed: no
/// firmware boots from one). No table: none.
pub fn partitions(dev: &Device<'_>) -> Result<Vec<Partition>, TableError> {
    match table_kind(dev)? {
        TableKind::None => Ok(Vec::new()),
        TableKind::Gpt => {
            let gpt = Gpt::read(dev)?;
            let mut out = Vec::new();
            for (i, e) in gpt.used() {
                let first = u64_at(e, 32);
                let last = u64_at(e, 40);
                if last < first {
                    return Err(dev.refused(format!(
                        "GPT partition {} ends (sector {last}) before it starts (sector {first}); the image is damaged",
                        i + 1
                    )));
                }
                let mut type_guid = [0u8; 16];
                type_guid.copy_from_slice(&e[..16]);
                let mut unique_guid = [0u8; 16];
                unique_guid.copy_from_slice(&e[16..32]);
                out.push(Partition {
                    number: i as u32 + 1,
                    first_lba: first,
                    sectors: last - first + 1,
                    id: PartitionId::Gpt {
                        type_guid,
                        unique_guid,
                    },
                });
            }
            Ok(out)
        }
        TableKind::Mbr => {
            let mbr = dev.read(0, 512)?;
            let disk_signature = u32_at(&mbr, 440);
            Ok((0..4)
                .filter_map(|i| {
                    let o = 446 + i * 16;
                    let type_byte = mbr[o + 4];
                    let first = u64::from(u32_at(&mbr, o + 8));
                    let sectors = u64::from(u32_at(&mbr, o + 12));
                    (type_byte != 0 && sectors > 0).then_some(Partition {
                        number: i as u32 + 1,
                        first_lba: first,
                        sectors,
                        id: PartitionId::Mbr {
                            type_byte,
                            disk_signature,
                        },
                    })
                })
                .collect())
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn have(tool: &str) -> bool {
        std::process::Command::new(tool)
            .arg("--version")
            .output()
            .is_ok()
    }

    #[test]
    fn guid_layout() {
        // 0FC63DAF-8483-4772-8E79-3D69D8477DE4 as sgdisk writes it.
        assert_eq!(
            LINUX_FS_TYPE,
            [
                0xAF, 0x3D, 0xC6, 0x0F, 0x83, 0x84, 0x72, 0x47, 0x8E, 0x79, 0x3D, 0x69, 0xD8, 0x47,
                0x7D, 0xE4
            ]
        );
    }

    /// A small GPT image (sgdisk) copied onto a bigger file: the backup moves to the end,
    /// sgdisk then finds no problem, and a config-2 partition lands at the very end.
    #[test]
    fn relocate_and_add_on_a_file() {
        if !have("sgdisk") {
            eprintln!("skipped: sgdisk (gdisk) not installed");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.img");
        let f = File::create(&p).unwrap();
        f.set_len(16 << 20).unwrap();
        drop(f);
        let ok = std::process::Command::new("sgdisk")
            .args(["-o", "-n", "1:2048:+4M"])
            .arg(&p)
            .output()
            .unwrap();
        assert!(ok.status.success());
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        f.set_len(128 << 20).unwrap();
        let dev = Device::new(&f, "d.img", 512, 128 << 20);
        assert!(relocate_backup(&dev).unwrap());
        assert!(!relocate_backup(&dev).unwrap(), "second call is a no-op");
        let e = config_partition(&dev, 64 << 20, 200 << 20, &|_| false).unwrap_err();
        assert!(e.to_string().contains("no room for the configdrive"), "{e}");
        let placed = config_partition(&dev, 1 << 20, 1 << 20, &|_| false).unwrap();
        assert_eq!(placed.number, 2);
        assert!(!placed.reused);
        assert_eq!(placed.offset + placed.len, (128 << 20) - 33 * 512);
        let again = config_partition(&dev, 1 << 20, 1 << 20, &|_| false).unwrap();
        assert!(again.reused && again.offset == placed.offset);
        drop(f);
        let v = std::process::Command::new("sgdisk")
            .arg("-v")
            .arg(&p)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&v.stdout);
        assert!(text.contains("No problems found"), "{text}");
        let list = std::process::Command::new("sgdisk")
            .arg("-p")
            .arg(&p)
            .output()
            .unwrap();
        assert!(String::from_utf8_lossy(&list.stdout).contains("config-2"));
    }

    /// Fuzzing found a `config-2` entry ending before it starts panicking on its length; an
    /// entry that is not on the disk (that, or one past its end) is never reused.
    #[test]
    fn entries_off_the_disk_are_not_reused() {
        let f = tempfile::tempfile().unwrap();
        let size = 8u64 << 20;
        f.set_len(size).unwrap();
        let last = size / 512 - 1;
        let mut entries = vec![0u8; 128 * 128];
        for (i, (first, end)) in [(3000u64, 2048u64), (4096, 1 << 40)]
            .into_iter()
            .enumerate()
        {
            let e = &mut entries[i * 128..(i + 1) * 128];
            e[..16].copy_from_slice(&LINUX_FS_TYPE);
            put_u64(e, 32, first);
            put_u64(e, 40, end);
            for (k, u) in "config-2".encode_utf16().enumerate() {
                e[56 + 2 * k..58 + 2 * k].copy_from_slice(&u.to_le_bytes());
            }
        }
        let mut h = vec![0u8; 512];
        h[..8].copy_from_slice(SIG);
        put_u32(&mut h, 8, 0x0001_0000);
        put_u32(&mut h, 12, 92);
        put_u64(&mut h, 24, 1);
        put_u64(&mut h, 32, last);
        put_u64(&mut h, 40, 34);
        put_u64(&mut h, 48, last - 33);
        put_u64(&mut h, 72, 2);
        put_u32(&mut h, 80, 128);
        put_u32(&mut h, 84, 128);
        put_u32(&mut h, 88, crc32(&entries));
        let crc = crc32(&h[..92]);
        put_u32(&mut h, 16, crc);
        f.write_all_at(&h, 512).unwrap();
        f.write_all_at(&entries, 1024).unwrap();
        let dev = Device::new(&f, "d.img", 512, size);
        let e = config_partition(&dev, 1 << 20, 1 << 20, &|_| true).unwrap_err();
        assert!(e.to_string().contains("no room"), "{e}");
    }

    #[test]
    fn mbr_with_four_primaries_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.img");
        let mut mbr = vec![0u8; 512];
        for i in 0..4 {
            let o = 446 + i * 16;
            mbr[o + 4] = 0x83;
            put_u32(&mut mbr, o + 8, 2048 * (i as u32 + 1));
            put_u32(&mut mbr, o + 12, 2048);
        }
        mbr[510] = 0x55;
        mbr[511] = 0xAA;
        std::fs::write(&p, &mbr).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        f.set_len(64 << 20).unwrap();
        let dev = Device::new(&f, "m.img", 512, 64 << 20);
        assert_eq!(table_kind(&dev).unwrap(), TableKind::Mbr);
        let e = config_partition(&dev, 1 << 20, 1 << 20, &|_| false).unwrap_err();
        assert!(e.to_string().contains("4 primary partitions"), "{e}");
        // With three, the fourth goes at the end.
        mbr[446 + 3 * 16 + 4] = 0;
        f.write_all_at(&mbr, 0).unwrap();
        let placed = config_partition(&dev, 1 << 20, 1 << 20, &|_| false).unwrap();
        assert_eq!(placed.number, 4);
        assert_eq!(placed.offset + placed.len, 64 << 20);
    }
}
