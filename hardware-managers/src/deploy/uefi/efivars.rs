//! UEFI variables through efivarfs: one file per variable, `Name-vendor-guid`, holding four
//! bytes of little-endian attributes and then the data.
//!
//! Two efivarfs rules shape this: every variable file is created immutable
//! (`FS_IMMUTABLE_FL`), so the flag is cleared before a variable is rewritten or deleted;
//! and one `write(2)` is one `SetVariable()`, so a variable is written in a single call.
//! The root is a plain directory in tests: there the flag ioctls answer ENOTTY/EOPNOTSUPP
//! (tolerated) and a rewrite is truncated to its new length (efivarfs replaces the whole
//! variable itself).

use super::UefiError;
use crate::erase::ioctl;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

/// EFI_GLOBAL_VARIABLE: `Boot####`, `BootOrder`.
pub const GLOBAL: &str = "8be4df61-93ca-11d2-aa0d-00e098032b8c";
/// NON_VOLATILE | BOOTSERVICE_ACCESS | RUNTIME_ACCESS.
pub const NV_BS_RT: u32 = 0x7;
/// `FS_IMMUTABLE_FL` of `FS_IOC_GETFLAGS`.
const FS_IMMUTABLE_FL: libc::c_int = 0x10;
/// statfs magic of efivarfs.
const EFIVARFS_MAGIC: i64 = 0xde5e_81e4;

/// The variable store under a directory (normally `/sys/firmware/efi/efivars`).
#[derive(Debug, Clone)]
pub struct Efivars {
    root: PathBuf,
    efivarfs: bool,
}

fn io(root: &Path, name: &str, op: &'static str) -> impl FnOnce(std::io::Error) -> UefiError {
    let path = root.join(name);
    move |source| UefiError::Var { path, op, source }
}

impl Efivars {
    /// The store at `root`. The caller checked that the firmware is UEFI; here the directory
    /// must be readable.
    pub fn open(root: &Path) -> Result<Efivars, UefiError> {
        std::fs::read_dir(root).map_err(|source| UefiError::Var {
            path: root.to_path_buf(),
            op: "listing",
            source,
        })?;
        // f_type is i64 here but 32-bit on other targets: hence the cast.
        #[allow(clippy::unnecessary_cast)]
        let efivarfs = nix::sys::statfs::statfs(root)
            .map(|s| s.filesystem_type().0 as i64 == EFIVARFS_MAGIC)
            .unwrap_or(false);
        Ok(Efivars {
            root: root.to_path_buf(),
            efivarfs,
        })
    }

    /// Where the variables live.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Attributes and data of `name` (`Boot0001-<guid>`), or `None` when it does not exist.
    pub fn read(&self, name: &str) -> Result<Option<(u32, Vec<u8>)>, UefiError> {
        match std::fs::read(self.root.join(name)) {
            Ok(b) if b.len() >= 4 => {
                let attrs = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                Ok(Some((attrs, b[4..].to_vec())))
            }
            Ok(_) => Err(UefiError::Var {
                path: self.root.join(name),
                op: "reading",
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "shorter than its 4-byte attributes",
                ),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&self.root, name, "reading")(e)),
        }
    }

    /// Clear the immutable flag of an existing variable file. A directory that is not
    /// efivarfs (tests) does not support the flag: that is fine.
    fn make_mutable(&self, name: &str) -> Result<(), UefiError> {
        let path = self.root.join(name);
        let f = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io(&self.root, name, "opening")(e)),
        };
        let flags = match ioctl::inode_flags(&f) {
            Ok(flags) => flags,
            Err(nix::errno::Errno::ENOTTY | nix::errno::Errno::EOPNOTSUPP) => return Ok(()),
            Err(e) => {
                return Err(io(&self.root, name, "reading the flags of")(
                    std::io::Error::from(e),
                ))
            }
        };
        if flags & FS_IMMUTABLE_FL == 0 {
            return Ok(());
        }
        match ioctl::set_inode_flags(&f, flags & !FS_IMMUTABLE_FL) {
            Ok(_) => Ok(()),
            Err(nix::errno::Errno::ENOTTY | nix::errno::Errno::EOPNOTSUPP) => Ok(()),
            Err(e) => Err(io(&self.root, name, "clearing the immutable flag of")(
                std::io::Error::from(e),
            )),
        }
    }

    /// Create or replace `name` with `data` (attributes NV|BS|RT).
    pub fn write(&self, name: &str, data: &[u8]) -> Result<(), UefiError> {
        self.make_mutable(name)?;
        let mut buf = Vec::with_capacity(4 + data.len());
        buf.extend_from_slice(&NV_BS_RT.to_le_bytes());
        buf.extend_from_slice(data);
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(!self.efivarfs)
            .open(self.root.join(name))
            .map_err(io(&self.root, name, "opening for writing"))?;
        // One write: efivarfs turns each write(2) into one SetVariable() call.
        let n = f.write(&buf).map_err(io(&self.root, name, "writing"))?;
        if n != buf.len() {
            return Err(UefiError::Var {
                path: self.root.join(name),
                op: "writing",
                source: std::io::Error::new(
                    std::io::ErrorKind::WriteZero,
                    format!("the firmware took {n} of {} bytes", buf.len()),
                ),
            });
        }
        Ok(())
    }

    /// Delete `name`; `Ok(false)` when it did not exist.
    pub fn delete(&self, name: &str) -> Result<bool, UefiError> {
        self.make_mutable(name)?;
        match std::fs::remove_file(self.root.join(name)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io(&self.root, name, "deleting")(e)),
        }
    }

    /// The `Boot####` numbers present, ascending.
    pub fn boot_numbers(&self) -> Result<Vec<u16>, UefiError> {
        let rd = std::fs::read_dir(&self.root).map_err(|source| UefiError::Var {
            path: self.root.clone(),
            op: "listing",
            source,
        })?;
        let mut out: Vec<u16> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| parse_boot_name(&e.file_name().to_string_lossy()))
            .collect();
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }
}

/// `Boot0003-8be4df61-…` → 3. Only the spec's spelling: `Boot` and four upper-case hex
/// digits in the global namespace (`BootOrder`, `BootNext`, … are not entries).
pub fn parse_boot_name(file: &str) -> Option<u16> {
    let rest = file.strip_prefix("Boot")?;
    let (hex, guid) = rest.split_at_checked(4)?;
    if guid.strip_prefix('-')? != GLOBAL
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b))
    {
        return None;
    }
    u16::from_str_radix(hex, 16).ok()
}

/// The efivarfs file name of `Boot####`.
pub fn boot_var(n: u16) -> String {
    format!("Boot{n:04X}-{GLOBAL}")
}

/// The efivarfs file name of `BootOrder`.
pub fn boot_order_var() -> String {
    format!("BootOrder-{GLOBAL}")
}

/// `BootOrder`'s data → numbers (an odd trailing byte is ignored).
pub fn parse_boot_order(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

/// Numbers → `BootOrder`'s data.
pub fn encode_boot_order(order: &[u16]) -> Vec<u8> {
    order.iter().flat_map(|n| n.to_le_bytes()).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_and_order() {
        assert_eq!(parse_boot_name(&boot_var(0x1A)), Some(0x1A));
        assert_eq!(boot_var(0x1A), format!("Boot001A-{GLOBAL}"));
        assert_eq!(parse_boot_name(&boot_order_var()), None);
        assert_eq!(parse_boot_name(&format!("Boot001a-{GLOBAL}")), None);
        assert_eq!(
            parse_boot_name("Boot0001-f1ce8995-60de-42c9-ad7f-98d6214dbc10"),
            None
        );
        assert_eq!(parse_boot_order(&[3, 0, 1, 0, 0x10, 0, 9]), vec![3, 1, 16]);
        assert_eq!(encode_boot_order(&[3, 0x100]), vec![3, 0, 0, 1]);
    }

    #[test]
    fn write_replace_delete_in_a_plain_directory() {
        let d = tempfile::tempdir().unwrap();
        let v = Efivars::open(d.path()).unwrap();
        let name = boot_var(2);
        v.write(&name, b"longer data").unwrap();
        v.write(&name, b"short").unwrap();
        assert_eq!(v.read(&name).unwrap(), Some((NV_BS_RT, b"short".to_vec())));
        assert_eq!(
            std::fs::read(d.path().join(&name)).unwrap(),
            [&[7, 0, 0, 0][..], b"short"].concat()
        );
        assert_eq!(v.boot_numbers().unwrap(), vec![2]);
        assert!(v.delete(&name).unwrap());
        assert!(!v.delete(&name).unwrap());
        assert_eq!(v.read(&name).unwrap(), None);
    }
}
