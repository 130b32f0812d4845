//! The EFI System Partition of a written image, and the loader on it the firmware should
//! start, chosen as IPA's `manage_uefi` does.
//!
//! The FAT filesystem is read in userspace ([`fatfs`]) through a read-only window of the
//! disk: the ramdisk kernel may lack `vfat`, nothing gets mounted (so nothing can be left
//! mounted on a failure), and the same code runs in host tests on plain files.
//!
//! The loader: a vendor directory's `BOOTX64.CSV` (shim's list: UTF-16, `loader,label,
//! options,comment`) is authoritative, as in IPA; else a vendor's `shimx64.efi` (it chains to
//! the vendor's GRUB and keeps Secure Boot working), else its `grubx64.efi`; else the
//! removable-media path `EFI/BOOT/BOOTX64.EFI`. Vendor directories are taken in name order
//! so the choice does not depend on directory order. FAT names compare case-insensitively.

use super::UefiError;
use crate::deploy::gpt::{self, PartitionId};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;

/// GPT type of an EFI System Partition, C12A7328-F81F-11D2-BA4B-00A0C93EC93B, on-disk order.
pub const ESP_TYPE: [u8; 16] = [
    0x28, 0x73, 0x2A, 0xC1, 0x1F, 0xF8, 0xD2, 0x11, 0xBA, 0x4B, 0x00, 0xA0, 0xC9, 0x3E, 0xC9, 0x3B,
];
/// MBR type byte of an EFI System Partition.
pub const ESP_MBR_TYPE: u8 = 0xEF;
/// IPA's label for a loader found without a CSV.
pub const DEFAULT_LABEL: &str = "ironic1";
/// Largest CSV read (shim's are a few dozen bytes).
const MAX_CSV: u64 = 64 << 10;

/// The loader chosen on the ESP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loader {
    /// Firmware spelling, `\EFI\debian\shimx64.efi` (names as the FAT stores them).
    pub path: String,
    /// The entry's label.
    pub label: String,
}

/// A byte range of the disk as a read-only `Read + Seek` (what [`fatfs`] mounts). Writes
/// are refused: nothing here changes the image.
struct Window<'a> {
    file: &'a File,
    start: u64,
    len: u64,
    pos: u64,
}

impl Read for Window<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.len.saturating_sub(self.pos);
        let n = (buf.len() as u64).min(left) as usize;
        if n == 0 {
            return Ok(0);
        }
        let got = self.file.read_at(&mut buf[..n], self.start + self.pos)?;
        self.pos += got as u64;
        Ok(got)
    }
}

impl Seek for Window<'_> {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let at = match to {
            SeekFrom::Start(o) => Some(o),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        match at {
            Some(a) => {
                self.pos = a;
                Ok(a)
            }
            None => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "seek before the start of the partition",
            )),
        }
    }
}

impl Write for Window<'_> {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "the ESP is read only while its loader is looked up",
        ))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The ESPs of the disk's table (GPT type C12A7328-…, or MBR type 0xEF), in table order.
pub fn esps(dev: &gpt::Device<'_>) -> Result<Vec<gpt::Partition>, UefiError> {
    Ok(gpt::partitions(dev)?
        .into_iter()
        .filter(|p| match p.id {
            PartitionId::Gpt { type_guid, .. } => type_guid == ESP_TYPE,
            PartitionId::Mbr { type_byte, .. } => type_byte == ESP_MBR_TYPE,
        })
        .collect())
}

type Fs<'a> = fatfs::FileSystem<Window<'a>>;
type Dir<'a, 'b> = fatfs::Dir<'b, Window<'a>>;

/// The entry of `dir` called `name` (case-insensitively): (its name as stored, is a dir).
fn find<'a, 'b>(
    dir: &Dir<'a, 'b>,
    name: &str,
) -> std::io::Result<Option<fatfs::DirEntry<'b, Window<'a>>>> {
    for e in dir.iter() {
        let e = e?;
        if e.file_name().eq_ignore_ascii_case(name) {
            return Ok(Some(e));
        }
    }
    Ok(None)
}

/// A CSV's text: UTF-16 by its BOM, little-endian without one (what shim ships).
fn decode_csv(b: &[u8]) -> String {
    let (be, body) = match b {
        [0xFF, 0xFE, rest @ ..] => (false, rest),
        [0xFE, 0xFF, rest @ ..] => (true, rest),
        _ => (false, b),
    };
    let units: Vec<u16> = body
        .chunks_exact(2)
        .map(|c| {
            if be {
                u16::from_be_bytes([c[0], c[1]])
            } else {
                u16::from_le_bytes([c[0], c[1]])
            }
        })
        .collect();
    String::from_utf16_lossy(&units)
}

/// Loader file name and label from the CSV's first line that names one.
pub fn parse_csv(b: &[u8]) -> Option<(String, String)> {
    let text = decode_csv(b);
    text.lines().find_map(|line| {
        let mut f = line.trim_matches(['\u{feff}', '\r', ' ']).splitn(4, ',');
        let loader = f.next()?.trim();
        let label = f.next().unwrap_or("").trim();
        (!loader.is_empty()).then(|| (loader.to_string(), label.to_string()))
    })
}

fn read_small<'a>(e: &fatfs::DirEntry<'_, Window<'a>>) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    e.to_file().take(MAX_CSV).read_to_end(&mut out)?;
    Ok(out)
}

/// What one vendor directory offers.
struct Vendor {
    dir: String,
    csv: Option<(String, String)>,
    shim: Option<String>,
    grub: Option<String>,
}

/// Choose the loader on the FAT filesystem at `start..start+len` of `file`; `Ok(None)` when
/// it is FAT but holds no loader.
pub fn choose_loader(file: &File, start: u64, len: u64) -> Result<Option<Loader>, std::io::Error> {
    let window = Window {
        file,
        start,
        len,
        pos: 0,
    };
    let fs: Fs<'_> = fatfs::FileSystem::new(window, fatfs::FsOptions::new())?;
    let root = fs.root_dir();
    let Some(efi) = find(&root, "EFI")?.filter(|e| e.is_dir()) else {
        return Ok(None);
    };
    let efi_name = efi.file_name();
    let efi = efi.to_dir();
    let mut vendors = Vec::new();
    let mut removable = None;
    for e in efi.iter() {
        let e = e?;
        let name = e.file_name();
        if !e.is_dir() || name == "." || name == ".." {
            continue;
        }
        let dir = e.to_dir();
        if name.eq_ignore_ascii_case("BOOT") {
            if let Some(f) = find(&dir, "BOOTX64.EFI")?.filter(|f| f.is_file()) {
                removable = Some(format!("\\{efi_name}\\{name}\\{}", f.file_name()));
            }
            continue;
        }
        let csv = match find(&dir, "BOOTX64.CSV")?.filter(|f| f.is_file()) {
            Some(f) => match parse_csv(&read_small(&f)?) {
                // The CSV names a file of its own directory; one that is not there is
                // ignored (the vendor's shim or GRUB is still tried).
                Some((loader, label)) => match find(&dir, &loader)?.filter(|f| f.is_file()) {
                    Some(l) => Some((l.file_name(), label)),
                    None => {
                        tracing::warn!(vendor = %name, loader = %loader, "BOOTX64.CSV names a loader its directory does not hold; ignored");
                        None
                    }
                },
                None => None,
            },
            None => None,
        };
        let file_named = |n: &str| -> std::io::Result<Option<String>> {
            Ok(find(&dir, n)?
                .filter(|f| f.is_file())
                .map(|f| f.file_name()))
        };
        vendors.push(Vendor {
            dir: name.clone(),
            csv,
            shim: file_named("shimx64.efi")?,
            grub: file_named("grubx64.efi")?,
        });
    }
    vendors.sort_by_key(|v| v.dir.to_ascii_lowercase());
    let at = |v: &Vendor, f: &str| format!("\\{efi_name}\\{}\\{f}", v.dir);
    let loader = vendors
        .iter()
        .find_map(|v| {
            v.csv.as_ref().map(|(f, label)| Loader {
                path: at(v, f),
                label: if label.is_empty() {
                    DEFAULT_LABEL.to_string()
                } else {
                    label.clone()
                },
            })
        })
        .or_else(|| {
            vendors.iter().find_map(|v| {
                v.shim.as_ref().map(|f| Loader {
                    path: at(v, f),
                    label: DEFAULT_LABEL.into(),
                })
            })
        })
        .or_else(|| {
            vendors.iter().find_map(|v| {
                v.grub.as_ref().map(|f| Loader {
                    path: at(v, f),
                    label: DEFAULT_LABEL.into(),
                })
            })
        })
        .or_else(|| {
            removable.map(|path| Loader {
                path,
                label: DEFAULT_LABEL.into(),
            })
        });
    Ok(loader)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn utf16le(s: &str, bom: bool) -> Vec<u8> {
        let mut b = if bom { vec![0xFF, 0xFE] } else { Vec::new() };
        b.extend(s.encode_utf16().flat_map(u16::to_le_bytes));
        b
    }

    #[test]
    fn csv_with_and_without_bom() {
        let line = "shimx64.efi,debian,,This is the boot entry for debian\r\n";
        for bom in [true, false] {
            assert_eq!(
                parse_csv(&utf16le(line, bom)),
                Some(("shimx64.efi".into(), "debian".into()))
            );
        }
        let mut be = vec![0xFE, 0xFF];
        be.extend(
            "grubx64.efi,Fedora\n"
                .encode_utf16()
                .flat_map(u16::to_be_bytes),
        );
        assert_eq!(
            parse_csv(&be),
            Some(("grubx64.efi".into(), "Fedora".into()))
        );
        assert_eq!(parse_csv(&utf16le("\r\n\r\n", true)), None);
        assert_eq!(
            parse_csv(&utf16le("\nshimx64.efi\n", false)),
            Some(("shimx64.efi".into(), String::new()))
        );
    }
}
