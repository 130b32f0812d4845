//! What an erase target is and whether it may be touched: block-device identity from sysfs,
//! the mount table, swap, holders, boot media, skip list, and whole-disk discovery.
//!
//! Safety is decided for every device before the first byte is written, so a refusal never
//! leaves some disks erased and others not.

use super::{ioctl, EraseError};
use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A (major, minor) device number.
pub type DevNo = (u32, u32);

/// Block device or regular file.
#[derive(Debug, Clone)]
pub enum TargetKind {
    /// A block device, with its sysfs directory (`/sys/dev/block/M:m` resolved).
    Block {
        /// Kernel name, e.g. `loop3`, `nvme0n1`, `sda1`.
        name: String,
        /// Device number.
        dev: DevNo,
        /// Its sysfs directory.
        sysfs: PathBuf,
        /// Whether it is itself a partition.
        is_partition: bool,
    },
    /// A regular file standing in for a disk (tests, benchmarks, the demo).
    File,
}

/// One device to erase.
#[derive(Debug, Clone)]
pub struct Target {
    /// Path as given or discovered (`/dev/loop3`, `/tmp/disk.img`).
    pub path: PathBuf,
    /// Kind and identity.
    pub kind: TargetKind,
    /// Size in bytes.
    pub size: u64,
    /// Logical sector size in bytes (512 for files).
    pub sector: u64,
}

/// A partition found on a target, as a byte range of the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// Kernel name (`loop3p1`) or `<file>#N` for a partition parsed from a file's table.
    pub name: String,
    /// Offset in bytes from the start of the target.
    pub start: u64,
    /// Length in bytes.
    pub size: u64,
    /// Device number, when the kernel knows the partition.
    pub dev: Option<DevNo>,
}

fn read_trim(p: impl AsRef<Path>) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

fn read_u64(p: impl AsRef<Path>) -> Option<u64> {
    read_trim(p).and_then(|s| s.parse().ok())
}

fn parse_devno(s: &str) -> Option<DevNo> {
    let (a, b) = s.trim().split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

fn rdev_to_devno(rdev: u64) -> DevNo {
    (
        libc::major(rdev as libc::dev_t),
        libc::minor(rdev as libc::dev_t),
    )
}

impl Target {
    /// Identify `path`: a block device (through sysfs) or a regular file.
    pub fn open(path: &Path) -> Result<Target, EraseError> {
        let io = |op: &'static str| {
            let device = path.display().to_string();
            move |source| EraseError::Io { device, op, source }
        };
        let meta = fs::metadata(path).map_err(io("stat"))?;
        if meta.file_type().is_block_device() {
            let dev = rdev_to_devno(meta.rdev());
            let link = PathBuf::from(format!("/sys/dev/block/{}:{}", dev.0, dev.1));
            let sysfs = fs::canonicalize(&link).map_err(io("resolve sysfs entry"))?;
            let name = sysfs
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let is_partition = sysfs.join("partition").exists();
            let f = File::open(path).map_err(io("open"))?;
            let size = ioctl::block_size_bytes(&f)
                .map_err(|e| io("BLKGETSIZE64")(std::io::Error::from(e)))?;
            let sector = ioctl::logical_sector_size(&f).unwrap_or(512).max(512);
            Ok(Target {
                path: path.to_path_buf(),
                kind: TargetKind::Block {
                    name,
                    dev,
                    sysfs,
                    is_partition,
                },
                size,
                sector,
            })
        } else if meta.file_type().is_file() {
            Ok(Target {
                path: path.to_path_buf(),
                kind: TargetKind::File,
                size: meta.len(),
                sector: 512,
            })
        } else {
            Err(EraseError::NotADisk {
                device: path.display().to_string(),
            })
        }
    }

    /// Display name for messages: the path.
    pub fn display(&self) -> String {
        self.path.display().to_string()
    }

    /// Kernel name for block devices, file name for files.
    pub fn name(&self) -> String {
        match &self.kind {
            TargetKind::Block { name, .. } => name.clone(),
            TargetKind::File => self
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        }
    }

    /// Whether this is a whole block device (not a partition, not a file).
    pub fn is_whole_disk(&self) -> bool {
        matches!(
            self.kind,
            TargetKind::Block {
                is_partition: false,
                ..
            }
        )
    }

    /// sysfs directory holding `queue/` (the parent disk for a partition).
    fn queue_dir(&self) -> Option<PathBuf> {
        match &self.kind {
            TargetKind::Block {
                sysfs,
                is_partition,
                ..
            } => {
                if *is_partition {
                    sysfs.parent().map(|p| p.join("queue"))
                } else {
                    Some(sysfs.join("queue"))
                }
            }
            TargetKind::File => None,
        }
    }

    /// A `queue/` attribute as a number (0 when absent).
    pub fn queue_attr(&self, attr: &str) -> u64 {
        self.queue_dir()
            .and_then(|d| read_u64(d.join(attr)))
            .unwrap_or(0)
    }

    /// `/sys/block/X/ro`.
    pub fn read_only(&self) -> bool {
        match &self.kind {
            TargetKind::Block { sysfs, .. } => read_u64(sysfs.join("ro")) == Some(1),
            TargetKind::File => false,
        }
    }

    /// Serial number from sysfs, if the driver exposes one.
    pub fn serial(&self) -> Option<String> {
        let TargetKind::Block { sysfs, .. } = &self.kind else {
            return None;
        };
        ["device/serial", "serial", "device/vpd_pg80"]
            .iter()
            .find_map(|f| read_trim(sysfs.join(f)))
            .map(|s| {
                s.trim_matches(|c: char| c.is_control() || c.is_whitespace())
                    .to_string()
            })
            .filter(|s| !s.is_empty())
    }

    /// World-wide name from sysfs (`wwid`), if any.
    pub fn wwn(&self) -> Option<String> {
        let TargetKind::Block { sysfs, .. } = &self.kind else {
            return None;
        };
        ["wwid", "device/wwid"]
            .iter()
            .find_map(|f| read_trim(sysfs.join(f)))
            .filter(|s| !s.is_empty())
    }

    /// `device/vendor` (libata reports `ATA`).
    pub fn device_vendor(&self) -> Option<String> {
        let TargetKind::Block { sysfs, .. } = &self.kind else {
            return None;
        };
        read_trim(sysfs.join("device/vendor"))
    }

    /// Names of devices stacked on this one (`holders/`: dm, md, bcache…).
    pub fn holders(&self) -> Vec<String> {
        let TargetKind::Block { sysfs, .. } = &self.kind else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut dirs = vec![sysfs.join("holders")];
        for p in self.sysfs_partitions() {
            dirs.push(sysfs.join(&p.name).join("holders"));
        }
        for d in dirs {
            if let Ok(rd) = fs::read_dir(d) {
                out.extend(
                    rd.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned()),
                );
            }
        }
        out
    }

    /// Partitions the kernel knows (`/sys/block/X/X*/partition`), in name order.
    pub fn sysfs_partitions(&self) -> Vec<Partition> {
        let TargetKind::Block {
            sysfs,
            name,
            is_partition: false,
            ..
        } = &self.kind
        else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let Ok(rd) = fs::read_dir(sysfs) else {
            return out;
        };
        for e in rd.flatten() {
            let pname = e.file_name().to_string_lossy().into_owned();
            let dir = e.path();
            if !pname.starts_with(name.as_str()) || !dir.join("partition").exists() {
                continue;
            }
            // sysfs `start` and `size` are always in 512-byte units, whatever the sector size.
            let (Some(start), Some(size)) =
                (read_u64(dir.join("start")), read_u64(dir.join("size")))
            else {
                continue;
            };
            out.push(Partition {
                name: pname,
                start: start * 512,
                size: size * 512,
                dev: read_trim(dir.join("dev")).as_deref().and_then(parse_devno),
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Device numbers of this target and its partitions.
    pub fn devnos(&self) -> Vec<DevNo> {
        let mut v = Vec::new();
        if let TargetKind::Block { dev, .. } = &self.kind {
            v.push(*dev);
            v.extend(self.sysfs_partitions().into_iter().filter_map(|p| p.dev));
        }
        v
    }

    /// Other loop devices over the same backing file (a partition view made with
    /// `losetup --offset`, a second attach): mounting one of them is mounting this disk.
    pub fn loop_aliases(&self) -> Vec<DevNo> {
        let TargetKind::Block { name, .. } = &self.kind else {
            return Vec::new();
        };
        let backing = |n: &str| read_trim(format!("/sys/block/{n}/loop/backing_file"));
        let Some(mine) = backing(name).filter(|b| !b.is_empty()) else {
            return Vec::new();
        };
        let Ok(rd) = fs::read_dir("/sys/block") else {
            return Vec::new();
        };
        rd.flatten()
            .filter_map(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                (n.starts_with("loop")
                    && n != *name
                    && backing(&n).as_deref() == Some(mine.as_str()))
                .then(|| {
                    read_trim(e.path().join("dev"))
                        .as_deref()
                        .and_then(parse_devno)
                })
                .flatten()
            })
            .collect()
    }

    /// Device number of the whole disk this target lives on (itself if it is one).
    pub fn disk_devno(&self) -> Option<DevNo> {
        match &self.kind {
            TargetKind::Block {
                dev,
                sysfs,
                is_partition,
                ..
            } => {
                if *is_partition {
                    sysfs
                        .parent()
                        .and_then(|p| read_trim(p.join("dev")))
                        .as_deref()
                        .and_then(parse_devno)
                } else {
                    Some(*dev)
                }
            }
            TargetKind::File => None,
        }
    }

    /// Open for writing. Block devices get O_DIRECT (bypass and invalidate the page cache,
    /// bounded latency per chunk) when the device accepts it; files are buffered because
    /// tmpfs and some filesystems reject O_DIRECT.
    pub fn open_write(&self, direct: bool) -> Result<(File, bool), EraseError> {
        let mut o = OpenOptions::new();
        o.read(true).write(true);
        if direct && !matches!(self.kind, TargetKind::File) {
            let mut od = o.clone();
            od.custom_flags(libc::O_DIRECT);
            if let Ok(f) = od.open(&self.path) {
                return Ok((f, true));
            }
        }
        let f = o.open(&self.path).map_err(|source| EraseError::Io {
            device: self.display(),
            op: "open for writing",
            source,
        })?;
        Ok((f, false))
    }
}

/// One line of /proc/self/mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Device number of the mounted filesystem.
    pub dev: DevNo,
    /// Where it is mounted.
    pub mountpoint: String,
    /// Filesystem type.
    pub fstype: String,
    /// Mount source (e.g. `/dev/loop3p1`).
    pub source: String,
}

/// Undo mountinfo's octal escapes (`\040` = space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' {
            if let Some(v) = s
                .get(i + 1..i + 4)
                .and_then(|o| u8::from_str_radix(o, 8).ok())
            {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parse /proc/self/mountinfo text.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let l: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            Some(Mount {
                dev: parse_devno(l.get(2)?)?,
                mountpoint: unescape(l.get(4)?),
                fstype: r.first()?.to_string(),
                source: unescape(r.get(1).copied().unwrap_or("")),
            })
        })
        .collect()
}

/// The current mount table (empty if /proc is not mounted, which only happens very early in
/// a ramdisk, before anything could be mounted from a disk either).
pub fn mounts() -> Vec<Mount> {
    fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse_mountinfo(&t))
        .unwrap_or_default()
}

/// Device numbers of active swap devices (/proc/swaps).
pub fn swap_devnos() -> Vec<(DevNo, String)> {
    let Ok(text) = fs::read_to_string("/proc/swaps") else {
        return Vec::new();
    };
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let path = unescape(l.split_whitespace().next()?);
            let meta = fs::metadata(&path).ok()?;
            meta.file_type()
                .is_block_device()
                .then(|| (rdev_to_devno(meta.rdev()), path))
        })
        .collect()
}

/// Device numbers of the media the ramdisk booted from: whatever backs `/`, and any
/// iso9660/udf mount or live-media mount point (virtual media, USB stick), plus the whole
/// disks they sit on. These are never erased, `force` or not.
pub fn boot_media(mounts: &[Mount]) -> BTreeSet<DevNo> {
    const LIVE: &[&str] = &[
        "/",
        "/run/initramfs/live",
        "/run/archiso/bootmnt",
        "/lib/live/mount/medium",
        "/run/live/medium",
        "/cdrom",
        "/boot",
        "/boot/efi",
    ];
    let mut set = BTreeSet::new();
    for m in mounts {
        if m.dev.0 == 0 {
            continue; // tmpfs, rootfs, overlay: no block device
        }
        if LIVE.contains(&m.mountpoint.as_str()) || m.fstype == "iso9660" || m.fstype == "udf" {
            set.insert(m.dev);
            let part_parent = format!("/sys/dev/block/{}:{}/../dev", m.dev.0, m.dev.1);
            if Path::new(&format!("/sys/dev/block/{}:{}/partition", m.dev.0, m.dev.1)).exists() {
                if let Some(d) = read_trim(part_parent).as_deref().and_then(parse_devno) {
                    set.insert(d);
                }
            }
        }
    }
    set
}

/// Whole disks to erase when no explicit list is given: every /sys/block entry except
/// loop, ram, zram, optical (sr) and device-mapper devices, inactive md arrays, and empty
/// slots (size 0). Running md arrays are listed (and their members skipped by [`super::run`]).
/// Loop devices are only ever erased when listed explicitly.
pub fn discover_disks() -> Vec<PathBuf> {
    const EXCLUDED: &[&str] = &["loop", "ram", "zram", "sr", "dm-", "nbd", "fd"];
    let Ok(rd) = fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = rd
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            if EXCLUDED.iter().any(|p| name.starts_with(p)) {
                return None;
            }
            if name.starts_with("md") {
                let state = read_trim(e.path().join("md/array_state")).unwrap_or_default();
                if matches!(state.as_str(), "" | "inactive" | "clear") {
                    return None;
                }
            }
            if read_u64(e.path().join("size")).unwrap_or(0) == 0 {
                return None;
            }
            Some(PathBuf::from("/dev").join(name))
        })
        .collect();
    out.sort();
    out
}

/// Why a target is left alone (reported in the step result).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// On the skip list.
    Listed(String),
    /// `/sys/block/X/ro` is 1.
    ReadOnly,
    /// Holds the media the ramdisk booted from.
    BootMedia,
    /// A member of a running software RAID array that is erased itself.
    RaidMember(String),
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Skip::Listed(e) => write!(f, "on the skip list ({e})"),
            Skip::ReadOnly => f.write_str("read-only device"),
            Skip::BootMedia => f.write_str("holds the boot media"),
            Skip::RaidMember(md) => write!(
                f,
                "member of software RAID /dev/{md}, erased through the array (never a member \
                 while the array runs); raid.delete_configuration removes the array"
            ),
        }
    }
}

/// Decide whether `t` is skipped, refused or erasable. `Ok(Some(skip))`: leave it alone and
/// report; `Err`: refuse the whole step (mounted, swap or held, unless `force`).
pub fn check(
    t: &Target,
    skip: &[String],
    force: bool,
    mounts: &[Mount],
    boot: &BTreeSet<DevNo>,
    swaps: &[(DevNo, String)],
) -> Result<Option<Skip>, EraseError> {
    let name = t.name();
    let path = t.display();
    let serial = t.serial();
    let wwn = t.wwn();
    for entry in skip {
        let e = entry.trim();
        if e.is_empty() {
            continue;
        }
        let hit = e == name
            || e == path
            || e.strip_prefix("/dev/") == Some(name.as_str())
            || serial.as_deref() == Some(e)
            || wwn.as_deref() == Some(e)
            || wwn.as_deref().map(|w| w.trim_start_matches("0x"))
                == Some(e.trim_start_matches("0x"));
        if hit {
            return Ok(Some(Skip::Listed(e.to_string())));
        }
    }
    if t.read_only() {
        return Ok(Some(Skip::ReadOnly));
    }
    let devs = t.devnos();
    if devs.iter().any(|d| boot.contains(d)) || t.disk_devno().is_some_and(|d| boot.contains(&d)) {
        return Ok(Some(Skip::BootMedia));
    }
    if force {
        return Ok(None);
    }
    let mut devs = devs;
    devs.extend(t.loop_aliases());
    if let Some(m) = mounts.iter().find(|m| devs.contains(&m.dev)) {
        return Err(EraseError::Mounted {
            device: path,
            source_dev: m.source.clone(),
            mountpoint: m.mountpoint.clone(),
        });
    }
    if let Some((_, s)) = swaps.iter().find(|(d, _)| devs.contains(d)) {
        return Err(EraseError::Mounted {
            device: path,
            source_dev: s.clone(),
            mountpoint: "[swap]".into(),
        });
    }
    if let Some(h) = t.holders().first() {
        return Err(EraseError::Held {
            device: path,
            holder: h.clone(),
        });
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_parses_and_unescapes() {
        let text = "36 35 7:3 / /tmp/my\\040mnt rw,relatime shared:1 - ext4 /dev/loop3p1 rw\n\
                    22 1 0:21 / /proc rw - proc proc rw\n\
                    garbage line\n";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].dev, (7, 3));
        assert_eq!(m[0].mountpoint, "/tmp/my mnt");
        assert_eq!(m[0].fstype, "ext4");
        assert_eq!(m[0].source, "/dev/loop3p1");
        assert_eq!(m[1].dev, (0, 21));
    }

    #[test]
    fn boot_media_ignores_virtual_filesystems() {
        let m =
            parse_mountinfo("1 0 0:2 / / rw - rootfs rootfs rw\n2 1 0:5 / /proc rw - proc p rw\n");
        assert!(boot_media(&m).is_empty());
        let m = parse_mountinfo("1 0 11:0 / /run/initramfs/live ro - iso9660 /dev/sr0 ro\n");
        assert!(boot_media(&m).contains(&(11, 0)));
    }

    #[test]
    fn skip_list_matches_file_name_and_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("disk.img");
        std::fs::write(&p, [0u8; 4096]).expect("write");
        let t = Target::open(&p).expect("open");
        let none = BTreeSet::new();
        for e in ["disk.img", p.to_str().expect("utf8")] {
            let r = check(&t, &[e.to_string()], false, &[], &none, &[]).expect("check");
            assert!(matches!(r, Some(Skip::Listed(_))), "{e}");
        }
        assert_eq!(
            check(&t, &["other".into()], false, &[], &none, &[]).expect("check"),
            None
        );
    }
}
