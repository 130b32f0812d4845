//! The demo's disk contents, written in Rust so the demo needs no disk tools (sgdisk, mkfs,
//! wipefs): a fresh GPT (protective MBR, primary and backup headers and partition arrays,
//! CRC32s) and an ext4 superblock, the signature filesystem probes (blkid, wipefs) look for.
//!
//! The agent reads these with its own code (`rivet_hardware_managers::deploy::gpt` when a
//! configdrive partition is added after the image, `erase::table` when cleaning finds the
//! partitions on a disk file); the tests below check both accept them.

use anyhow::{bail, Context, Result};
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Logical sector size of the demo's disk files.
pub const SECTOR: u64 = 512;
/// Partition entries in the array (the spec's minimum, what sgdisk writes), 128 bytes each.
const ENTRIES: u64 = 128;
const ENTRY_SIZE: u64 = 128;
/// Sectors of the partition array.
const ARRAY_SECTORS: u64 = ENTRIES * ENTRY_SIZE / SECTOR;
/// Linux filesystem data, 0FC63DAF-8483-4772-8E79-3D69D8477DE4, in its on-disk byte order.
const LINUX_FS_TYPE: [u8; 16] = [
    0xAF, 0x3D, 0xC6, 0x0F, 0x83, 0x84, 0x72, 0x47, 0x8E, 0x79, 0x3D, 0x69, 0xD8, 0x47, 0x7D, 0xE4,
];

/// One partition of a new GPT: sectors `first..=last`, Linux filesystem type.
#[derive(Debug, Clone, Copy)]
pub struct Part<'a> {
    pub first: u64,
    pub last: u64,
    /// GPT name (at most 36 UTF-16 units).
    pub name: &'a str,
}

/// A fresh GPT for a disk: `head` goes at offset 0 (protective MBR, primary header, array),
/// `tail` at `tail_offset` (backup array, backup header in the last sector).
pub struct NewGpt {
    pub head: Vec<u8>,
    pub tail: Vec<u8>,
    pub tail_offset: u64,
}

impl NewGpt {
    /// Write both copies to the file at `path`.
    pub fn write_to(&self, path: &Path) -> Result<()> {
        let f = OpenOptions::new()
            .write(true)
            .open(path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        f.write_all_at(&self.head, 0)
            .and_then(|_| f.write_all_at(&self.tail, self.tail_offset))
            .with_context(|| format!("cannot write the GPT to {}", path.display()))
    }
}

/// The first and last sectors partitions may use on a disk of `size` bytes.
pub fn usable(size: u64) -> (u64, u64) {
    let last = (size / SECTOR).saturating_sub(1);
    (2 + ARRAY_SECTORS, last.saturating_sub(ARRAY_SECTORS + 1))
}

fn put_u16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_le_bytes());
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

/// A version-4 GUID (in the GPT's mixed-endian layout) drawn from `state` (splitmix64).
fn guid(state: &mut u64) -> [u8; 16] {
    let mut next = || {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut g = [0u8; 16];
    g[..8].copy_from_slice(&next().to_le_bytes());
    g[8..].copy_from_slice(&next().to_le_bytes());
    g[7] = (g[7] & 0x0f) | 0x40;
    g[8] = (g[8] & 0x3f) | 0x80;
    g
}

/// A fresh GPT with `parts` (in order) for a disk of `size` bytes, as `sgdisk -o -n …` writes
/// it: 128 entries, Linux filesystem partitions; GUIDs derived from `seed`.
pub fn new_gpt(size: u64, parts: &[Part<'_>], seed: u64) -> Result<NewGpt> {
    let (first_usable, last_usable) = usable(size);
    if size / SECTOR * SECTOR != size || first_usable >= last_usable {
        bail!("a GPT needs a disk of whole sectors and more than 34 KiB, not {size} bytes");
    }
    if parts.len() as u64 > ENTRIES {
        bail!("a GPT holds at most {ENTRIES} partitions");
    }
    let last_lba = size / SECTOR - 1;
    let mut state = seed;
    let mut array = vec![0u8; (ENTRIES * ENTRY_SIZE) as usize];
    let mut prev_last = first_usable - 1;
    for (i, p) in parts.iter().enumerate() {
        if p.first <= prev_last || p.last < p.first || p.last > last_usable {
            bail!(
                "partition {} (sectors {}-{}) overlaps another or leaves the usable sectors {first_usable}-{last_usable}",
                i + 1,
                p.first,
                p.last
            );
        }
        prev_last = p.last;
        let name: Vec<u16> = p.name.encode_utf16().collect();
        if name.len() > 36 {
            bail!("partition name {:?} is longer than 36 UTF-16 units", p.name);
        }
        let e = &mut array[i * ENTRY_SIZE as usize..(i + 1) * ENTRY_SIZE as usize];
        e[..16].copy_from_slice(&LINUX_FS_TYPE);
        e[16..32].copy_from_slice(&guid(&mut state));
        put_u64(e, 32, p.first);
        put_u64(e, 40, p.last);
        for (j, u) in name.iter().enumerate() {
            put_u16(e, 56 + 2 * j, *u);
        }
    }
    let disk_guid = guid(&mut state);
    let array_crc = crc32(&array);
    // Primary at LBA 1 with its array at LBA 2; backup in the last sector, its array before.
    let header = |current: u64, backup: u64, array_lba: u64| {
        let mut h = vec![0u8; SECTOR as usize];
        h[..8].copy_from_slice(b"EFI PART");
        put_u32(&mut h, 8, 0x0001_0000);
        put_u32(&mut h, 12, 92);
        put_u64(&mut h, 24, current);
        put_u64(&mut h, 32, backup);
        put_u64(&mut h, 40, first_usable);
        put_u64(&mut h, 48, last_usable);
        h[56..72].copy_from_slice(&disk_guid);
        put_u64(&mut h, 72, array_lba);
        put_u32(&mut h, 80, ENTRIES as u32);
        put_u32(&mut h, 84, ENTRY_SIZE as u32);
        put_u32(&mut h, 88, array_crc);
        let crc = crc32(&h[..92]);
        put_u32(&mut h, 16, crc);
        h
    };
    // Protective MBR: one 0xEE partition over the whole disk (capped at 2^32 - 1 sectors).
    let mut mbr = vec![0u8; SECTOR as usize];
    mbr[446 + 1..446 + 4].copy_from_slice(&[0x00, 0x02, 0x00]);
    mbr[446 + 4] = 0xEE;
    mbr[446 + 5..446 + 8].copy_from_slice(&[0xFF, 0xFF, 0xFF]);
    put_u32(&mut mbr, 446 + 8, 1);
    put_u32(&mut mbr, 446 + 12, last_lba.min(u64::from(u32::MAX)) as u32);
    mbr[510] = 0x55;
    mbr[511] = 0xAA;
    let mut head = mbr;
    head.extend(header(1, last_lba, 2));
    head.extend(&array);
    let backup_array = last_lba - ARRAY_SECTORS;
    let mut tail = array;
    tail.extend(header(last_lba, 1, backup_array));
    Ok(NewGpt {
        head,
        tail,
        tail_offset: backup_array * SECTOR,
    })
}

/// An ext4 superblock (4 KiB blocks, extents, label `label`) for a filesystem of `size` bytes
/// at `offset` of the file: what blkid and wipefs recognise as ext4 (magic 0xEF53 at 1024 +
/// 56). Only the superblock: the demo's disks need something real to erase, not to mount.
pub fn write_ext4_superblock(path: &Path, offset: u64, size: u64, label: &str) -> Result<()> {
    let blocks = size / 4096;
    let groups = blocks.div_ceil(32768).max(1);
    let inodes_per_group = 8192u32;
    let mut sb = vec![0u8; 1024];
    put_u32(
        &mut sb,
        0x00,
        (groups as u32).saturating_mul(inodes_per_group),
    ); // s_inodes_count
    put_u32(&mut sb, 0x04, blocks as u32); // s_blocks_count_lo
    put_u32(&mut sb, 0x0C, (blocks as u32).saturating_sub(1024)); // s_free_blocks_count_lo
    put_u32(
        &mut sb,
        0x10,
        (groups as u32 * inodes_per_group).saturating_sub(11),
    ); // free inodes
    put_u32(&mut sb, 0x18, 2); // s_log_block_size: 1024 << 2
    put_u32(&mut sb, 0x1C, 2); // s_log_cluster_size
    put_u32(&mut sb, 0x20, 32768); // s_blocks_per_group
    put_u32(&mut sb, 0x24, 32768); // s_clusters_per_group
    put_u32(&mut sb, 0x28, inodes_per_group); // s_inodes_per_group
    put_u16(&mut sb, 0x36, 0xFFFF); // s_max_mnt_count: -1
    put_u16(&mut sb, 0x38, 0xEF53); // s_magic
    put_u16(&mut sb, 0x3A, 1); // s_state: clean
    put_u16(&mut sb, 0x3C, 1); // s_errors: continue
    put_u32(&mut sb, 0x4C, 1); // s_rev_level: dynamic
    put_u32(&mut sb, 0x54, 11); // s_first_ino
    put_u16(&mut sb, 0x58, 256); // s_inode_size
    put_u32(&mut sb, 0x5C, 0x0038); // compat: ext_attr, resize_inode, dir_index
    put_u32(&mut sb, 0x60, 0x0002 | 0x0040); // incompat: filetype, extents
    put_u32(&mut sb, 0x64, 0x0001 | 0x0002); // ro_compat: sparse_super, large_file
    let mut state = offset ^ size.rotate_left(17) ^ 0x6578_7434; // "ext4"
    sb[0x68..0x78].copy_from_slice(&guid(&mut state)); // s_uuid
    let name = label.as_bytes();
    let n = name.len().min(16);
    sb[0x78..0x78 + n].copy_from_slice(&name[..n]); // s_volume_name
    put_u16(&mut sb, 0x15C, 32); // s_min_extra_isize
    put_u16(&mut sb, 0x15E, 32); // s_want_extra_isize
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    f.write_all_at(&sb, offset + 1024)
        .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rivet_hardware_managers::deploy::gpt;
    use rivet_hardware_managers::erase::table;
    use std::fs::File;

    const MIB: u64 = 1 << 20;

    fn sparse(dir: &Path, name: &str, size: u64) -> std::path::PathBuf {
        let p = dir.join(name);
        File::create(&p).unwrap().set_len(size).unwrap();
        p
    }

    /// The layout `sgdisk -o -n 1:2048:0` gives: same usable range, same array place.
    #[test]
    fn layout_matches_sgdisk() {
        assert_eq!(usable(32 * MIB), (34, 32 * MIB / 512 - 34));
        let g = new_gpt(
            32 * MIB,
            &[Part {
                first: 2048,
                last: 65502,
                name: "x",
            }],
            1,
        )
        .unwrap();
        assert_eq!(g.head.len(), 34 * 512);
        assert_eq!(g.tail.len(), 33 * 512);
        assert_eq!(g.tail_offset + g.tail.len() as u64, 32 * MIB);
        assert_eq!(&g.head[512..520], b"EFI PART");
        assert_eq!(&g.tail[32 * 512..32 * 512 + 8], b"EFI PART");
        assert!(new_gpt(
            32 * MIB,
            &[Part {
                first: 2048,
                last: 65503,
                name: ""
            }],
            1
        )
        .is_err());
        let overlap = [
            Part {
                first: 2048,
                last: 4095,
                name: "",
            },
            Part {
                first: 4095,
                last: 8191,
                name: "",
            },
        ];
        assert!(new_gpt(32 * MIB, &overlap, 1).is_err());
        assert!(new_gpt(16 * 1024, &[], 1).is_err());
    }

    /// The agent's deploy code takes the table: it moves the backup to the end of a bigger
    /// disk and adds a config-2 partition after the image's (CRCs checked on the way).
    #[test]
    fn the_agent_adds_a_configdrive_partition() {
        let dir = tempfile::tempdir().unwrap();
        let p = sparse(dir.path(), "image.raw", 4 * MIB);
        let (_, last) = usable(4 * MIB);
        new_gpt(
            4 * MIB,
            &[Part {
                first: 2048,
                last,
                name: "demo-root",
            }],
            7,
        )
        .unwrap()
        .write_to(&p)
        .unwrap();
        let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
        f.set_len(16 * MIB).unwrap();
        let dev = gpt::Device::new(&f, "image.raw", 512, 16 * MIB);
        assert_eq!(gpt::table_kind(&dev).unwrap(), gpt::TableKind::Gpt);
        assert!(gpt::relocate_backup(&dev).unwrap());
        let placed = gpt::config_partition(&dev, MIB, MIB, &|_| false).unwrap();
        assert_eq!((placed.number, placed.reused), (2, false));
        assert_eq!(placed.offset + placed.len, 16 * MIB - 33 * 512);
    }

    /// The agent's cleaning finds both partitions of a seeded disk.
    #[test]
    fn cleaning_finds_the_partitions() {
        let dir = tempfile::tempdir().unwrap();
        let p = sparse(dir.path(), "disk0.img", 64 * MIB);
        let (_, last) = usable(64 * MIB);
        let parts = [
            Part {
                first: 2048,
                last: 2048 + 16 * 2048 - 1,
                name: "demo-root",
            },
            Part {
                first: 2048 + 16 * 2048,
                last,
                name: "",
            },
        ];
        new_gpt(64 * MIB, &parts, 3).unwrap().write_to(&p).unwrap();
        write_ext4_superblock(&p, MIB, 16 * MIB, "demo-root").unwrap();
        let found = table::parse(&File::open(&p).unwrap(), 64 * MIB, 512, "disk0.img");
        let spans: Vec<(u64, u64)> = found.iter().map(|q| (q.start, q.size)).collect();
        assert_eq!(
            spans,
            vec![(MIB, 16 * MIB), (17 * MIB, (last + 1) * 512 - 17 * MIB)]
        );
        let sb = std::fs::read(&p).unwrap();
        assert_eq!(&sb[MIB as usize + 1024 + 0x38..][..2], &[0x53, 0xEF]);
    }

    /// Where the disk tools are installed, they agree (skipped without them).
    #[test]
    fn sgdisk_and_blkid_agree() {
        let run = |tool: &str, args: &[&str], p: &Path| {
            std::process::Command::new(tool)
                .args(args)
                .arg(p)
                .output()
                .ok()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        };
        let dir = tempfile::tempdir().unwrap();
        let p = sparse(dir.path(), "d.img", 64 * MIB);
        let (_, last) = usable(64 * MIB);
        let parts = [
            Part {
                first: 2048,
                last: 34815,
                name: "demo-root",
            },
            Part {
                first: 34816,
                last,
                name: "",
            },
        ];
        new_gpt(64 * MIB, &parts, 5).unwrap().write_to(&p).unwrap();
        match run("sgdisk", &["-v"], &p) {
            Some(v) => assert!(v.contains("No problems found"), "{v}"),
            None => eprintln!("skipped sgdisk -v: not installed"),
        }
        if let Some(list) = run("sgdisk", &["-p"], &p) {
            assert!(list.contains("demo-root"), "{list}");
        }
        let q = sparse(dir.path(), "fs.img", 64 * MIB);
        write_ext4_superblock(&q, 0, 64 * MIB, "demo-data").unwrap();
        match run("blkid", &["-p", "-o", "export"], &q) {
            Some(b) => {
                assert!(b.contains("TYPE=ext4"), "{b}");
                assert!(b.contains("LABEL=demo-data"), "{b}");
            }
            None => eprintln!("skipped blkid: not installed"),
        }
    }
}
