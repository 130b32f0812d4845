//! Hardware inventory collected in pure Rust from /proc, /sys, the udev database and DMI.
//!
//! Nothing here shells out except the optional BMC query (`ipmitool`, only when the tool and
//! `/dev/ipmi0` exist). Every reader tolerates missing or odd files: a field it cannot read is
//! left empty rather than failing the whole inventory. All paths are relative to a [`Root`] so
//! tests run against a fake tree.

mod bmc;
mod cpu;
mod disks;
mod dmi;
mod memory;
mod net;

pub use disks::{collect_disks, disks_for_paths};
pub use net::collect_interfaces;

use rivet_protocol::inventory::{Boot, Inventory};
use std::path::{Path, PathBuf};

/// Where the kernel's pseudo file systems are (`/` on a real machine).
#[derive(Debug, Clone)]
pub struct Root {
    base: PathBuf,
}

impl Default for Root {
    fn default() -> Self {
        Root {
            base: PathBuf::from("/"),
        }
    }
}

impl Root {
    /// A root at `base` (tests build a fake `sys/`, `proc/`, `dev/`, `run/` under it).
    pub fn new(base: impl Into<PathBuf>) -> Self {
        Root { base: base.into() }
    }

    /// `rel` (written as an absolute path, e.g. `/sys/block`) under this root.
    pub fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
        let rel = rel.as_ref();
        self.base.join(rel.strip_prefix("/").unwrap_or(rel))
    }

    /// Whether this is the real root (live-only probes like getifaddrs are skipped otherwise).
    pub fn is_live(&self) -> bool {
        self.base == Path::new("/")
    }

    /// File contents, trimmed; `None` when unreadable or empty.
    pub fn read(&self, rel: impl AsRef<Path>) -> Option<String> {
        read_trimmed(&self.path(rel))
    }
}

/// Trimmed contents of a file, `None` when unreadable, not UTF-8 or empty.
pub(crate) fn read_trimmed(path: &Path) -> Option<String> {
    let s = std::fs::read(path).ok()?;
    let s = String::from_utf8_lossy(&s);
    let t = s.trim_matches(|c: char| c.is_whitespace() || c == '\0');
    (!t.is_empty()).then(|| t.to_string())
}

/// Parse a trimmed file as a number.
pub(crate) fn read_u64(path: &Path) -> Option<u64> {
    read_trimmed(path)?.parse().ok()
}

/// Last path component of a symlink's target (`../../bus/pci/drivers/e1000` → `e1000`).
pub(crate) fn link_name(path: &Path) -> Option<String> {
    let target = std::fs::read_link(path).ok()?;
    Some(target.file_name()?.to_string_lossy().into_owned())
}

/// What to collect.
#[derive(Debug, Clone, Default)]
pub struct InventoryOptions {
    /// Explicit disk list (`--devices`): replaces disk discovery.
    pub devices: Option<Vec<PathBuf>>,
    /// MAC of the PXE interface (from BOOTIF).
    pub pxe_mac: Option<String>,
    /// Skip the BMC probe (ipmitool can take seconds on a busy BMC).
    pub skip_bmc: bool,
}

/// Collect the machine's inventory. Never fails: unreadable parts stay empty.
pub fn collect(root: &Root, opts: &InventoryOptions) -> Inventory {
    let disks = match &opts.devices {
        Some(paths) => disks_for_paths(root, paths),
        None => collect_disks(root),
    };
    let (bmc_address, bmc_mac) = if opts.skip_bmc || !root.is_live() {
        (None, None)
    } else {
        bmc::probe()
    };
    Inventory {
        cpu: cpu::collect(root),
        memory: memory::collect(root),
        disks,
        interfaces: collect_interfaces(root),
        system_vendor: dmi::system_vendor(root),
        boot: Boot {
            current_boot_mode: if root.path("/sys/firmware/efi").exists() {
                "uefi".into()
            } else {
                "bios".into()
            },
            pxe_interface: opts.pxe_mac.clone(),
        },
        bmc_address,
        bmc_v6address: None,
        bmc_mac,
        hostname: root.read("/proc/sys/kernel/hostname").unwrap_or_default(),
    }
}

#[cfg(test)]
pub(crate) mod testutil {
    //! A throw-away directory tree for fake /sys and /proc content.
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicUsize, Ordering};

    pub struct TempTree(pub PathBuf);

    impl TempTree {
        pub fn new(tag: &str) -> Self {
            static N: AtomicUsize = AtomicUsize::new(0);
            let dir = std::env::temp_dir().join(format!(
                "rivet-agent-test-{}-{tag}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::SeqCst)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempTree(dir)
        }

        pub fn file(&self, rel: &str, content: impl AsRef<[u8]>) -> &Self {
            let p = self.0.join(rel.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
            self
        }

        pub fn link(&self, rel: &str, target: &str) -> &Self {
            let p = self.0.join(rel.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::os::unix::fs::symlink(target, p).unwrap();
            self
        }

        pub fn dir(&self, rel: &str) -> &Self {
            std::fs::create_dir_all(self.0.join(rel.trim_start_matches('/'))).unwrap();
            self
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempTree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::TempTree;
    use super::*;

    #[test]
    fn empty_root_gives_empty_inventory_without_panicking() {
        let t = TempTree::new("empty");
        let inv = collect(&Root::new(t.path()), &InventoryOptions::default());
        assert_eq!(inv.cpu.count, 0);
        assert!(inv.disks.is_empty());
        assert!(inv.interfaces.is_empty());
        assert_eq!(inv.boot.current_boot_mode, "bios");
        assert_eq!(inv.bmc_address, None);
    }

    #[test]
    fn live_inventory_has_memory_and_cpus() {
        let inv = collect(
            &Root::default(),
            &InventoryOptions {
                skip_bmc: true,
                ..Default::default()
            },
        );
        assert!(inv.memory.total > 0);
        assert!(inv.cpu.count > 0);
        assert!(!inv.cpu.architecture.is_empty());
    }
}
