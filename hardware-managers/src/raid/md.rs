//! Linux md arrays: what sysfs says about them, and the few mdadm calls the RAID steps make
//! (`--create`, `--stop`, `--examine`, `--zero-superblock`). mdadm writes the superblocks
//! and drives the kernel's md ioctls: the format is mdadm's, and the instance's own mdadm
//! must read the same arrays, so Rivet does not write superblocks itself.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// What sysfs shows of one array (`/sys/block/mdN`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Array {
    /// Kernel name, `md127`.
    pub name: String,
    /// `raid1`, `raid0`, `raid10`… (empty for an inactive array).
    pub level: String,
    /// `1.0`, `1.2`… (`md/metadata_version`, without the `1.` prefix words).
    pub metadata: String,
    /// `md/array_state`: `clean`, `active`, `inactive`…
    pub state: String,
    /// Member devices' kernel names (`slaves/`), in name order.
    pub members: Vec<String>,
    /// Size in bytes.
    pub size: u64,
}

impl Array {
    /// `/dev/mdN`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/dev").join(&self.name)
    }

    /// Started and usable (not `inactive` or `clear`).
    pub fn running(&self) -> bool {
        !matches!(self.state.as_str(), "" | "inactive" | "clear")
    }

    /// A mirror firmware can read from any one member as a plain disk: RAID-1 with the
    /// superblock at the end (metadata 1.0, or 0.90) over whole disks. This is the layout
    /// the root volume is built with; `write_image` deploys onto it without a hint.
    pub fn is_bootable_mirror(&self, sys_block: &Path) -> bool {
        self.running()
            && self.level == "raid1"
            && (self.metadata == "1.0" || self.metadata == "0.90")
            && !self.members.is_empty()
            && self.members.iter().all(|m| sys_block.join(m).is_dir())
    }
}

fn read(p: &Path) -> String {
    fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Every md array under `sys_block` (normally `/sys/block`), in name order.
pub fn arrays(sys_block: &Path) -> Vec<Array> {
    let Ok(rd) = fs::read_dir(sys_block) else {
        return Vec::new();
    };
    let mut names: Vec<String> = rd
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("md") && sys_block.join(n).join("md").is_dir())
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let dir = sys_block.join(&name);
            let mut members: Vec<String> = fs::read_dir(dir.join("slaves"))
                .map(|rd| {
                    rd.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
            members.sort();
            let metadata = read(&dir.join("md/metadata_version"));
            Array {
                level: read(&dir.join("md/level")),
                metadata: metadata.trim_start_matches("external:").to_string(),
                state: read(&dir.join("md/array_state")),
                members,
                size: read(&dir.join("size")).parse::<u64>().unwrap_or(0) * 512,
                name,
            }
        })
        .collect()
}

/// The one bootable root mirror, if exactly one runs.
pub fn root_mirror(sys_block: &Path) -> Option<Array> {
    let mut found: Vec<Array> = arrays(sys_block)
        .into_iter()
        .filter(|a| a.is_bootable_mirror(sys_block))
        .collect();
    (found.len() == 1).then(|| found.remove(0))
}

/// The first unused `/dev/mdN` number.
pub fn free_number(sys_block: &Path) -> u32 {
    (0..)
        .find(|n| !sys_block.join(format!("md{n}")).exists())
        .unwrap_or(0)
}

/// Whether this machine can build software RAID: mdadm on PATH and md in the kernel.
pub fn available() -> bool {
    Path::new("/proc/mdstat").exists() && mdadm_path().is_some()
}

fn mdadm_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("mdadm"))
        .find(|p| p.is_file())
}

/// Run mdadm with `args`; `Err` carries its stderr (or why it did not run).
pub fn mdadm(args: &[String]) -> Result<String, String> {
    let out = Command::new("mdadm")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run mdadm: {e}"))?;
    let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
    if out.status.success() {
        Ok(text(&out.stderr))
    } else {
        Err(format!(
            "mdadm {} failed ({}): {}",
            args.join(" "),
            out.status,
            text(&out.stderr)
        ))
    }
}

/// The argument list for `mdadm --create`.
pub fn create_args(
    device: &Path,
    name: &str,
    level: &str,
    metadata: &str,
    size_kib: Option<u64>,
    members: &[PathBuf],
) -> Vec<String> {
    let mut a = vec![
        "--create".to_string(),
        device.display().to_string(),
        // No question on stdin when a member looks used (its metadata was wiped just
        // before; a stale signature further in must not stop an unattended step).
        "--run".into(),
        format!("--metadata={metadata}"),
        format!("--level={level}"),
        format!("--raid-devices={}", members.len()),
        format!("--name={name}"),
        // The name is stored as given, with no host prefix: the ramdisk's hostname means
        // nothing to the instance.
        "--homehost=<none>".into(),
    ];
    if let Some(k) = size_kib {
        a.push(format!("--size={k}"));
    }
    a.extend(members.iter().map(|m| m.display().to_string()));
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_array(root: &Path, name: &str, level: &str, meta: &str, state: &str, members: &[&str]) {
        let dir = root.join(name);
        fs::create_dir_all(dir.join("md")).expect("test fixture");
        fs::create_dir_all(dir.join("slaves")).expect("test fixture");
        fs::write(dir.join("md/level"), format!("{level}\n")).expect("test fixture");
        fs::write(dir.join("md/metadata_version"), format!("{meta}\n")).expect("test fixture");
        fs::write(dir.join("md/array_state"), format!("{state}\n")).expect("test fixture");
        fs::write(dir.join("size"), "2048\n").expect("test fixture");
        for m in members {
            fs::create_dir_all(dir.join("slaves").join(m)).expect("test fixture");
        }
    }

    #[test]
    fn reads_arrays_and_finds_the_root_mirror() {
        let t = tempfile::tempdir().expect("test fixture");
        let sys = t.path();
        for d in ["vda", "vdb", "vdc", "vdd"] {
            fs::create_dir_all(sys.join(d)).expect("test fixture");
        }
        fake_array(sys, "md127", "raid1", "1.0", "clean", &["vdb", "vda"]);
        fake_array(sys, "md126", "raid0", "1.2", "active", &["vdc", "vdd"]);
        let a = arrays(sys);
        assert_eq!(a.len(), 2);
        assert_eq!(a[1].members, ["vda", "vdb"]);
        assert_eq!(a[1].size, 1 << 20);
        assert_eq!(root_mirror(sys).map(|a| a.name), Some("md127".into()));
        assert_eq!(free_number(sys), 0);
        // A mirror over partitions (vda1 is not a /sys/block entry) is not firmware-readable.
        fake_array(sys, "md0", "raid1", "1.0", "clean", &["vdc1", "vdd1"]);
        assert_eq!(root_mirror(sys).map(|a| a.name), Some("md127".into()));
        assert_eq!(free_number(sys), 1);
        // Two candidates: no guess.
        fake_array(sys, "md1", "raid1", "1.0", "active", &["vdc", "vdd"]);
        assert!(root_mirror(sys).is_none());
        // Inactive arrays are not candidates.
        fake_array(sys, "md1", "raid1", "1.0", "inactive", &["vdc", "vdd"]);
        assert_eq!(root_mirror(sys).map(|a| a.name), Some("md127".into()));
    }

    #[test]
    fn create_arguments() {
        let a = create_args(
            Path::new("/dev/md0"),
            "rivet-root",
            "1",
            "1.0",
            Some(1024),
            &[PathBuf::from("/dev/vda"), PathBuf::from("/dev/vdb")],
        );
        assert_eq!(
            a.join(" "),
            "--create /dev/md0 --run --metadata=1.0 --level=1 --raid-devices=2 \
             --name=rivet-root --homehost=<none> --size=1024 /dev/vda /dev/vdb"
        );
    }
}
