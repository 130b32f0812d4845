//! Making a written image bootable by UEFI firmware: IPA's `manage_uefi`, without mounting
//! anything and without efibootmgr.
//!
//! After the image is on the disk and verified, for a node whose `boot_mode` is `uefi`:
//! 1. the disk's table (GPT, or MBR with a 0xEF partition) names the EFI System Partition;
//!    its FAT is read in userspace and the loader chosen ([`esp`]);
//! 2. a `Boot####` load option `HD(partition, start, size, signature)/File(loader)` is
//!    written at the first free number and put first in `BootOrder`, the other entries kept
//!    in their order ([`load_option`], [`efivars`]);
//! 3. entries this agent wrote on earlier deploys, and entries that point at the same loader
//!    on the same partition or carry the same label (IPA removes same-label entries), are
//!    removed once the new one is in place.
//!
//! Which entries are Rivet's: the variable `RivetBootEntries-<RIVET_GUID>` (Rivet's own
//! vendor namespace) lists the numbers the agent wrote with a SHA-256 of each entry's bytes;
//! an entry counts as Rivet's only while its bytes still match, so a number another tool
//! reused is never touched. A marker inside the entry itself was avoided on purpose:
//! OptionalData reaches the loader as its load options (shim reads them as a second-stage
//! path) and the description is the label operators know from IPA.
//!
//! Order of writes: new entry, then `BootOrder`, then deletions: at every moment the
//! firmware has a bootable order. A failure after the new entry was written deletes it
//! again, so a failed deploy leaves no entry pointing at a disk about to be wiped.

pub mod efivars;
pub mod esp;
pub mod load_option;

use crate::deploy::gpt::{self, PartitionId, TableError};
use efivars::Efivars;
use load_option::{HardDrive, HdSignature};
use rivet_protocol::deploy::UefiBootEntry;
use sha2::Digest;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Where efivarfs is mounted on a UEFI-booted Linux.
pub const DEFAULT_EFIVARS: &str = "/sys/firmware/efi/efivars";
/// Rivet's vendor GUID for its own variables.
pub const RIVET_GUID: &str = "f1ce8995-60de-42c9-ad7f-98d6214dbc10";
/// Name of the variable listing the entries Rivet wrote.
pub const RECORD_NAME: &str = "RivetBootEntries";

/// What went wrong making the image UEFI-bootable.
#[derive(Debug, thiserror::Error)]
pub enum UefiError {
    /// The ramdisk was not started by UEFI firmware.
    #[error("the node's boot_mode is uefi but this ramdisk booted in BIOS (legacy) mode ({} does not exist), so no UEFI boot entry can be written: set the node's firmware/BMC boot mode to UEFI (and its PXE/virtual media boot to UEFI), or set the node's boot_mode to bios, then deploy again", .firmware.display())]
    RamdiskNotUefi {
        /// The firmware directory that is missing (`/sys/firmware/efi`).
        firmware: PathBuf,
    },
    /// UEFI firmware, but efivarfs is not reachable.
    #[error("the ramdisk booted in UEFI mode but its UEFI variables are not reachable at {} ({reason}): efivarfs must be mounted there (`mount -t efivarfs efivarfs {}`; the Rivet ramdisk's init does it)", .efivars.display(), .efivars.display())]
    NoEfivars {
        /// The efivars directory.
        efivars: PathBuf,
        /// Why.
        reason: String,
    },
    /// The image has no ESP.
    #[error("node boots uefi but the image written to {device} has no EFI System Partition: use a UEFI-capable image or set boot_mode bios")]
    NoEsp {
        /// The disk.
        device: String,
    },
    /// The ESP holds no loader.
    #[error("node boots uefi but the image written to {device} has no loader in it ({detail}): use a UEFI-capable image or set boot_mode bios")]
    NoLoader {
        /// The disk.
        device: String,
        /// What was found on each ESP.
        detail: String,
    },
    /// The partition table could not be read.
    #[error("finding the EFI System Partition: {0}")]
    Table(#[from] TableError),
    /// A UEFI variable could not be read or written.
    #[error("{op} the UEFI variable {}: {source}", .path.display())]
    Var {
        /// The variable's file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// OS error.
        source: std::io::Error,
    },
}

/// Before anything is written for a uefi node: the ramdisk must have booted UEFI and reach
/// its variables. `efivars` is normally [`DEFAULT_EFIVARS`]; its parent is the firmware
/// directory whose absence means a BIOS boot.
pub fn preflight(efivars: &Path) -> Result<(), UefiError> {
    let firmware = efivars.parent().unwrap_or(efivars);
    if !firmware.is_dir() {
        return Err(UefiError::RamdiskNotUefi {
            firmware: firmware.to_path_buf(),
        });
    }
    match std::fs::read_dir(efivars) {
        Ok(mut rd) => {
            // A mounted efivarfs always lists variables (at least the firmware's own); an
            // empty directory is the unmounted mount point.
            if rd.next().is_none() {
                return Err(UefiError::NoEfivars {
                    efivars: efivars.to_path_buf(),
                    reason: "the directory is empty: efivarfs is not mounted".into(),
                });
            }
            Ok(())
        }
        Err(e) => Err(UefiError::NoEfivars {
            efivars: efivars.to_path_buf(),
            reason: e.to_string(),
        }),
    }
}

fn guid_string(g: &[u8; 16]) -> String {
    format!(
        "{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
        g[3], g[2], g[1], g[0], g[5], g[4], g[7], g[6], g[8], g[9], g[10], g[11], g[12], g[13], g[14], g[15]
    )
}

fn sha256_hex(b: &[u8]) -> String {
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn record_var() -> String {
    format!("{RECORD_NAME}-{RIVET_GUID}")
}

/// `"0003 <sha256>\n"` lines → (number, digest).
fn parse_record(b: &[u8]) -> Vec<(u16, String)> {
    String::from_utf8_lossy(b)
        .lines()
        .filter_map(|l| {
            let (n, h) = l.trim().split_once(' ')?;
            Some((u16::from_str_radix(n, 16).ok()?, h.to_string()))
        })
        .collect()
}

/// Find the ESP and loader of the image on `file` (the disk `device`, `sector`-byte logical
/// sectors, `size` bytes) and make it the firmware's first boot entry through `efivars`.
pub fn install(
    file: &File,
    device: &str,
    sector: u64,
    size: u64,
    efivars_root: &Path,
) -> Result<UefiBootEntry, UefiError> {
    let dev = gpt::Device::new(file, device, sector, size);
    let esps = esp::esps(&dev)?;
    if esps.is_empty() {
        return Err(UefiError::NoEsp {
            device: device.into(),
        });
    }
    let mut seen = Vec::new();
    let mut found = None;
    for p in &esps {
        let start = p.first_lba.saturating_mul(dev.sector);
        let len = p.sectors.saturating_mul(dev.sector);
        if start.saturating_add(len) > size {
            seen.push(format!(
                "partition {} extends past the end of the disk",
                p.number
            ));
            continue;
        }
        match esp::choose_loader(file, start, len) {
            Ok(Some(l)) => {
                found = Some((*p, l));
                break;
            }
            Ok(None) => seen.push(format!(
                "partition {} has no EFI/<vendor>/BOOTX64.CSV, shimx64.efi or grubx64.efi, nor EFI/BOOT/BOOTX64.EFI",
                p.number
            )),
            Err(e) => seen.push(format!(
                "partition {} is marked EFI System but its FAT filesystem is unreadable: {e}",
                p.number
            )),
        }
    }
    let Some((part, loader)) = found else {
        return Err(UefiError::NoLoader {
            device: device.into(),
            detail: seen.join("; "),
        });
    };
    let (signature, partition_id) = match part.id {
        PartitionId::Gpt { unique_guid, .. } => {
            (HdSignature::Gpt(unique_guid), guid_string(&unique_guid))
        }
        PartitionId::Mbr { disk_signature, .. } => (
            HdSignature::Mbr(disk_signature),
            format!("mbr:{disk_signature:08x}"),
        ),
    };
    let hd = HardDrive {
        partition: part.number,
        start_lba: part.first_lba,
        size_lba: part.sectors,
        signature,
    };
    let path = load_option::device_path(&hd, &loader.path);
    let option = load_option::encode(load_option::LOAD_OPTION_ACTIVE, &loader.label, &path, &[]);

    let vars = Efivars::open(efivars_root)?;
    let existing = vars.boot_numbers()?;
    let ours: Vec<(u16, String)> = match vars.read(&record_var())? {
        Some((_, b)) => parse_record(&b),
        None => Vec::new(),
    };
    let mut stale = Vec::new();
    for &n in &existing {
        let Some((_, data)) = vars.read(&efivars::boot_var(n))? else {
            continue;
        };
        let mine = ours.iter().any(|(m, h)| *m == n && *h == sha256_hex(&data));
        let same = load_option::decode(&data)
            .is_some_and(|o| o.file_path_list == path || o.description == loader.label);
        if mine || same {
            stale.push(n);
        }
    }
    let Some(number) = (0..=u16::MAX).find(|n| !existing.contains(n)) else {
        return Err(UefiError::Var {
            path: efivars_root.to_path_buf(),
            op: "choosing a number for",
            source: std::io::Error::other("all 65536 Boot#### entries are in use"),
        });
    };
    let var = efivars::boot_var(number);
    vars.write(&var, &option)?;
    let order = (|| -> Result<(), UefiError> {
        let old = match vars.read(&efivars::boot_order_var())? {
            Some((_, b)) => efivars::parse_boot_order(&b),
            None => Vec::new(),
        };
        let mut order = vec![number];
        order.extend(
            old.into_iter()
                .filter(|n| *n != number && !stale.contains(n)),
        );
        vars.write(
            &efivars::boot_order_var(),
            &efivars::encode_boot_order(&order),
        )
    })();
    if let Err(e) = order {
        // No entry may point at a disk the caller is about to wipe.
        if let Err(d) = vars.delete(&var) {
            tracing::error!(entry = %var, error = %d, "could not remove the new boot entry after BootOrder failed");
        }
        return Err(e);
    }
    let mut removed = Vec::new();
    for n in stale {
        match vars.delete(&efivars::boot_var(n)) {
            Ok(_) => removed.push(format!("Boot{n:04X}")),
            // Out of BootOrder already: a leftover entry the firmware will not try.
            Err(e) => tracing::warn!(entry = n, error = %e, "could not remove a stale boot entry"),
        }
    }
    let record = format!("{number:04X} {}\n", sha256_hex(&option));
    if let Err(e) = vars.write(&record_var(), record.as_bytes()) {
        // The entry and order are in place; only the next deploy's cleanup loses its hint.
        tracing::warn!(error = %e, "could not record Rivet's boot entry");
    }
    let entry = UefiBootEntry {
        number: format!("Boot{number:04X}"),
        label: loader.label,
        loader: loader.path,
        partition: part.number,
        partition_id,
        removed,
    };
    tracing::info!(device = %device, entry = %entry.number, label = %entry.label, loader = %entry.loader, partition = entry.partition, removed = ?entry.removed, "UEFI boot entry written, first in BootOrder");
    Ok(entry)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn guid_text_is_mixed_endian() {
        let g = [
            0x28, 0x73, 0x2A, 0xC1, 0x1F, 0xF8, 0xD2, 0x11, 0xBA, 0x4B, 0x00, 0xA0, 0xC9, 0x3E,
            0xC9, 0x3B,
        ];
        assert_eq!(guid_string(&g), "c12a7328-f81f-11d2-ba4b-00a0c93ec93b");
    }

    #[test]
    fn record_lines() {
        assert_eq!(
            parse_record(b"0003 ab\nzz q\n001A cd\n"),
            vec![(3, "ab".into()), (0x1A, "cd".into())]
        );
    }

    #[test]
    fn preflight_tells_bios_from_unmounted() {
        let d = tempfile::tempdir().unwrap();
        let e = preflight(&d.path().join("efi/efivars")).unwrap_err();
        assert!(matches!(e, UefiError::RamdiskNotUefi { .. }), "{e}");
        assert!(e.to_string().contains("booted in BIOS"), "{e}");
        std::fs::create_dir_all(d.path().join("efi/efivars")).unwrap();
        let e = preflight(&d.path().join("efi/efivars")).unwrap_err();
        assert!(matches!(e, UefiError::NoEfivars { .. }), "{e}");
        std::fs::write(d.path().join("efi/efivars/x"), b"").unwrap();
        preflight(&d.path().join("efi/efivars")).unwrap();
    }
}
