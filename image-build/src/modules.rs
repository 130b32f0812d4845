//! Kernel modules from an extracted Debian `linux-image` package: find them, read each one's
//! `depends=` from its `.modinfo` section (Debian ships no `modules.dep` in the package), and
//! order the wanted set so every module comes after what it depends on — the order the
//! ramdisk's `/init` runs `insmod` in.

use crate::elf;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules the ramdisk ships when present in the package: storage and NICs of the machines
/// Rivet cleans (virtual and real). Missing ones are skipped quietly: a kernel flavour may
/// build some in or leave them out.
pub const DEFAULT_MODULES: &[&str] = &[
    // virtio (QEMU/KVM guests, and the first thing the tests boot)
    "virtio_pci",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_blk",
    "virtio_net",
    "virtio_scsi",
    // disks: SCSI/SATA/SAS/NVMe
    "sd_mod",
    "ahci",
    "libahci",
    "libata",
    "nvme",
    "nvme_core",
    "megaraid_sas",
    "mpt3sas",
    "smartpqi",
    "hpsa",
    // software RAID (mdadm): the md core and the levels the agent builds (RAID-0/1/10)
    "md_mod",
    "raid0",
    "raid1",
    "raid10",
    // NICs
    "failover",
    "net_failover",
    "e1000",
    "e1000e",
    "igb",
    "ixgbe",
    "i40e",
    "ice",
    "tg3",
    "mlx5_core",
    "bnxt_en",
];

/// Modules shipped for a UEFI boot only, and loaded by `/init` only when the firmware is
/// UEFI (`/sys/firmware/efi` exists): `efivarfs`, through which the agent writes the
/// instance's boot entry (Debian builds it as a module; on a BIOS boot it refuses to load).
pub const UEFI_MODULES: &[&str] = &["efivarfs"];

/// Errors reading the module tree.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    /// No `lib/modules/VERSION/` in the package.
    #[error("{0}: no lib/modules/VERSION directory (is this a linux-image package?)")]
    NoModules(PathBuf),
    /// More than one kernel version in the package.
    #[error("{root}: several kernel versions ({versions}); pass a package with one kernel")]
    SeveralVersions {
        /// The extracted package.
        root: PathBuf,
        /// The versions found.
        versions: String,
    },
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A module file is not a valid ELF object.
    #[error("module {path}: {source}")]
    Elf {
        /// The module file.
        path: PathBuf,
        /// Why.
        source: elf::ElfError,
    },
    /// Modules that depend on each other in a circle.
    #[error("module dependency cycle through {0}")]
    Cycle(String),
}

/// One module file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Module {
    /// Module name, `-` spelled `_` (`nvme_core`).
    pub name: String,
    /// Path below `lib/modules/VERSION/` (`kernel/drivers/nvme/host/nvme-core.ko`).
    pub rel: String,
    /// Path on the build host.
    pub path: PathBuf,
}

/// What [`ModuleTree::resolve`] chose.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Modules in load order (dependencies first).
    pub order: Vec<Module>,
    /// Wanted modules the package does not have.
    pub missing: Vec<String>,
    /// Wanted modules left out, with the reason (a dependency the package lacks).
    pub skipped: Vec<(String, String)>,
}

/// The modules of one kernel version.
#[derive(Debug)]
pub struct ModuleTree {
    /// Kernel version (`6.1.0-26-amd64`).
    pub version: String,
    /// `…/lib/modules/VERSION`.
    pub dir: PathBuf,
    modules: BTreeMap<String, Module>,
}

/// `nvme-core` → `nvme_core`, as the kernel names modules.
pub fn normalize(name: &str) -> String {
    name.replace('-', "_")
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ModuleError + '_ {
    move |source| ModuleError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl ModuleTree {
    /// Find `lib/modules/VERSION` (or `usr/lib/modules/VERSION`) under an extracted package.
    pub fn open(root: &Path) -> Result<ModuleTree, ModuleError> {
        let mut versions = Vec::new();
        for base in ["lib/modules", "usr/lib/modules"] {
            let base = root.join(base);
            let Ok(rd) = std::fs::read_dir(&base) else {
                continue;
            };
            for e in rd {
                let e = e.map_err(io_err(&base))?;
                if e.path().join("kernel").is_dir() {
                    versions.push(e.path());
                }
            }
        }
        versions.sort();
        let dir = match versions.as_slice() {
            [] => return Err(ModuleError::NoModules(root.to_path_buf())),
            [one] => one.clone(),
            many => {
                return Err(ModuleError::SeveralVersions {
                    root: root.to_path_buf(),
                    versions: many
                        .iter()
                        .filter_map(|p| p.file_name())
                        .map(|n| n.to_string_lossy().into_owned())
                        .collect::<Vec<_>>()
                        .join(", "),
                })
            }
        };
        let version = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut modules = BTreeMap::new();
        let mut stack = vec![dir.join("kernel")];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).map_err(io_err(&d))? {
                let e = e.map_err(io_err(&d))?;
                let path = e.path();
                let ft = e.file_type().map_err(io_err(&path))?;
                if ft.is_dir() {
                    stack.push(path);
                    continue;
                }
                let fname = e.file_name().to_string_lossy().into_owned();
                let Some(stem) = fname.strip_suffix(".ko") else {
                    continue;
                };
                let rel = path
                    .strip_prefix(&dir)
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let name = normalize(stem);
                // Two files with one module name cannot both load; keep the first by path.
                let m = Module {
                    name: name.clone(),
                    rel,
                    path,
                };
                match modules.get(&name) {
                    Some(Module { rel, .. }) if *rel <= m.rel => {}
                    _ => {
                        modules.insert(name, m);
                    }
                }
            }
        }
        Ok(ModuleTree {
            version,
            dir,
            modules,
        })
    }

    /// Number of module files found.
    pub fn len(&self) -> usize {
        self.modules.len()
    }

    /// Whether the tree has no modules.
    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }

    /// The module called `name` (either spelling).
    pub fn get(&self, name: &str) -> Option<&Module> {
        self.modules.get(&normalize(name))
    }

    /// A module's `depends=` list.
    pub fn depends(&self, m: &Module) -> Result<Vec<String>, ModuleError> {
        let data = std::fs::read(&m.path).map_err(io_err(&m.path))?;
        let info = elf::modinfo(&data).map_err(|source| ModuleError::Elf {
            path: m.path.clone(),
            source,
        })?;
        Ok(info
            .into_iter()
            .filter(|(k, _)| k == "depends")
            .flat_map(|(_, v)| {
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(normalize)
                    .collect::<Vec<_>>()
            })
            .collect())
    }

    /// The wanted modules and everything they depend on, dependencies first. Deterministic:
    /// the wanted list's order, then each module's `depends=` order, decide ties.
    pub fn resolve<S: AsRef<str>>(&self, wanted: &[S]) -> Result<Selection, ModuleError> {
        let mut sel = Selection::default();
        let mut done: BTreeSet<String> = BTreeSet::new();
        for w in wanted {
            let name = normalize(w.as_ref());
            if done.contains(&name) {
                continue;
            }
            if !self.modules.contains_key(&name) {
                sel.missing.push(name);
                continue;
            }
            let mut order = Vec::new();
            let mut seen = done.clone();
            match self.visit(&name, &mut Vec::new(), &mut seen, &mut order)? {
                None => {
                    done = seen;
                    sel.order.extend(order);
                }
                Some(lacking) => sel.skipped.push((
                    name,
                    format!("depends on {lacking}, which the package lacks"),
                )),
            }
        }
        Ok(sel)
    }

    /// Depth-first post-order. `Ok(Some(dep))` when a dependency is missing.
    fn visit(
        &self,
        name: &str,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        order: &mut Vec<Module>,
    ) -> Result<Option<String>, ModuleError> {
        if done.contains(name) {
            return Ok(None);
        }
        if stack.iter().any(|s| s == name) {
            return Err(ModuleError::Cycle(name.to_string()));
        }
        let Some(m) = self.modules.get(name) else {
            return Ok(Some(name.to_string()));
        };
        stack.push(name.to_string());
        for dep in self.depends(m)? {
            if let Some(lacking) = self.visit(&dep, stack, done, order)? {
                stack.pop();
                return Ok(Some(lacking));
            }
        }
        stack.pop();
        done.insert(name.to_string());
        order.push(m.clone());
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::tests::fake_module;

    fn tree(mods: &[(&str, &str)]) -> (tempfile::TempDir, ModuleTree) {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root
            .path()
            .join("lib/modules/6.1.0-test-amd64/kernel/drivers");
        std::fs::create_dir_all(&dir).expect("mkdir");
        for (file, deps) in mods {
            std::fs::write(
                dir.join(format!("{file}.ko")),
                fake_module(&format!(
                    "license=GPL;depends={deps};name={}",
                    normalize(file)
                )),
            )
            .expect("write");
        }
        let t = ModuleTree::open(root.path()).expect("open");
        (root, t)
    }

    fn names(s: &Selection) -> Vec<&str> {
        s.order.iter().map(|m| m.name.as_str()).collect()
    }

    #[test]
    fn orders_dependencies_first() {
        let (_root, t) = tree(&[
            ("virtio_ring", ""),
            ("virtio", "virtio_ring"),
            ("virtio_pci_modern_dev", ""),
            ("virtio_pci_legacy_dev", ""),
            (
                "virtio_pci",
                "virtio_ring,virtio_pci_modern_dev,virtio_pci_legacy_dev,virtio",
            ),
            ("virtio_blk", "virtio,virtio_ring"),
            ("failover", ""),
            ("net_failover", "failover"),
            ("virtio_net", "virtio_ring,virtio,net_failover"),
            ("nvme-core", ""),
            ("nvme", "nvme-core"),
        ]);
        assert_eq!(t.version, "6.1.0-test-amd64");
        assert_eq!(t.len(), 11);
        let s = t
            .resolve(&[
                "virtio_pci",
                "virtio_blk",
                "virtio_net",
                "nvme",
                "nvme_core",
                "absent",
            ])
            .expect("resolve");
        assert_eq!(
            names(&s),
            [
                "virtio_ring",
                "virtio_pci_modern_dev",
                "virtio_pci_legacy_dev",
                "virtio",
                "virtio_pci",
                "virtio_blk",
                "failover",
                "net_failover",
                "virtio_net",
                "nvme_core",
                "nvme",
            ]
        );
        assert_eq!(s.missing, ["absent"]);
        assert!(s.skipped.is_empty());
        assert_eq!(
            t.get("nvme-core").map(|m| m.rel.as_str()),
            Some("kernel/drivers/nvme-core.ko")
        );
    }

    #[test]
    fn missing_dependency_skips_the_module_only() {
        let (_root, t) = tree(&[("a", "b,gone"), ("b", ""), ("c", "b")]);
        let s = t.resolve(&["a", "c"]).expect("resolve");
        assert_eq!(names(&s), ["b", "c"]);
        assert_eq!(s.skipped.len(), 1);
        assert!(s.skipped[0].1.contains("gone"), "{:?}", s.skipped);
    }

    #[test]
    fn cycle_is_an_error() {
        let (_root, t) = tree(&[("a", "b"), ("b", "a")]);
        assert!(matches!(t.resolve(&["a"]), Err(ModuleError::Cycle(_))));
    }

    #[test]
    fn no_modules_dir() {
        let root = tempfile::tempdir().expect("tempdir");
        assert!(matches!(
            ModuleTree::open(root.path()),
            Err(ModuleError::NoModules(_))
        ));
    }
}
