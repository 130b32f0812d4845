//! erase_devices_metadata on real partitioned devices made by real tools: signatures gone
//! for wipefs and blkid, data in the middle untouched.

use crate::common;
use common::*;
use serde_json::json;

const MIB: u64 = 1 << 20;

/// GPT with two partitions: p1 ext4, p2 LVM PV (or XFS, or ext4, whichever tool exists).
fn make_filesystems(
    dev: &str,
    disk_file: &std::path::Path,
    parts: &[(u64, u64)],
) -> anyhow::Result<Vec<LoopDev>> {
    // Partition views: the kernel's own (/dev/loopNp1) when it parses tables, else a loop
    // device per partition over the same backing file, which is what the kernel would expose.
    let mut views = Vec::new();
    let mut names = Vec::new();
    for (i, (o, s)) in parts.iter().enumerate() {
        let kernel = format!("{dev}p{}", i + 1);
        if std::path::Path::new(&kernel).exists() {
            names.push(kernel);
        } else {
            let v = LoopDev::attach_range(disk_file, *o, *s)?;
            names.push(v.as_str().to_string());
            views.push(v);
        }
    }
    run("mkfs.ext4", &["-q", "-F", &names[0]])?;
    if tool("pvcreate").is_some() {
        run("pvcreate", &["-q", "-ff", "-y", &names[1]])?;
    } else if tool("mkfs.xfs").is_some() {
        run("mkfs.xfs", &["-q", "-f", &names[1]])?;
    } else {
        run("mkfs.ext4", &["-q", "-F", &names[1]])?;
    }
    for n in &names {
        assert!(
            blkid_probe(n, None)?.is_some(),
            "{n} should carry a signature before the erase"
        );
    }
    Ok(views)
}

#[test]
fn metadata_erase_on_partitioned_loop_device() -> anyhow::Result<()> {
    if !require(
        true,
        &["losetup", "sgdisk", "mkfs.ext4", "wipefs", "blkid", "partx"],
    ) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let file = sparse(dir.path(), "disk.img", 256 * MIB)?;
    let disk = LoopDev::attach(&file)?;
    let dev = disk.as_str();
    run(
        "sgdisk",
        &["-n1:2048:+96M", "-t1:8300", "-n2:0:0", "-t2:8e00", dev],
    )?;
    let _ = run("partx", &["-u", dev]); // refresh kernel partitions where supported
    let parts = partitions(dev)?;
    assert_eq!(parts.len(), 2, "sgdisk made two partitions");
    let views = make_filesystems(dev, &file, &parts)?;
    // Detach the partition views before erasing: the erase must work from the disk alone.
    drop(views);
    assert!(!wipefs_signatures(dev)?.is_empty(), "GPT visible before");

    // Known data in the middle of each partition and of the disk, outside the 1 MiB windows.
    let marks = [
        (parts[0].0 + 40 * MIB, pattern(64 << 10, 1)),
        (parts[1].0 + parts[1].1 / 2, pattern(64 << 10, 2)),
        (parts[0].0 + parts[0].1 - 2 * MIB, pattern(4096, 3)),
    ];
    for (o, p) in &marks {
        write_at(&disk.path, *o, p)?;
    }

    let (d, _) = generic_over(vec![disk.path.clone()]);
    let r = step(&d, "erase_devices_metadata", json!({}))?;
    eprintln!("result: {r}");
    assert_eq!(
        r["devices"][0]["partitions"].as_array().map(Vec::len),
        Some(2)
    );
    // At most 1 MiB at each end of the disk and of each partition.
    let bytes = r["devices"][0]["bytes"].as_u64().unwrap_or(u64::MAX);
    assert!(bytes <= 6 * MIB, "metadata erase wrote {bytes} bytes");

    assert_eq!(
        wipefs_signatures(dev)?,
        Vec::<String>::new(),
        "wipefs on the disk"
    );
    assert_eq!(blkid_probe(dev, None)?, None, "blkid -p on the disk");
    for (o, s) in &parts {
        // Probe where the partitions were, through fresh partition views and by offset.
        let v = LoopDev::attach_range(&file, *o, *s)?;
        assert_eq!(
            wipefs_signatures(v.as_str())?,
            Vec::<String>::new(),
            "wipefs {o}"
        );
        assert_eq!(blkid_probe(v.as_str(), None)?, None, "blkid -p at {o}");
        assert_eq!(blkid_probe(dev, Some((*o, *s)))?, None, "blkid -p -O {o}");
    }
    // No partition table left for a userspace parser either.
    assert!(partitions(dev).map(|p| p.is_empty()).unwrap_or(true));
    for (o, p) in &marks {
        assert_eq!(&read_at(&file, *o, p.len())?, p, "data at {o} must survive");
    }
    Ok(())
}

/// The kernel's partition list and the disk's table disagree: the kernel still lists a
/// partition from an older table (added with BLKPG, never re-read), and the table on the disk
/// has partitions the kernel does not know. Both sets are old metadata: both are wiped.
#[test]
fn metadata_erase_when_the_kernel_view_is_stale() -> anyhow::Result<()> {
    if !require(
        true,
        &["losetup", "sgdisk", "mkfs.ext4", "wipefs", "blkid", "partx"],
    ) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let file = sparse(dir.path(), "disk.img", 128 * MIB)?;
    let disk = LoopDev::attach_no_partscan(&file)?;
    let dev = disk.as_str();
    // Table A: one partition, made known to the kernel with BLKPG.
    run("sgdisk", &["-n1:2048:+32M", dev])?;
    run("partx", &["-a", dev])?;
    let old = partitions(dev)?;
    assert_eq!(old.len(), 1);
    let kernel_p1 = format!("{dev}p1");
    if !std::path::Path::new(&kernel_p1).exists() {
        eprintln!("skipping: partx -a made no {kernel_p1} (no BLKPG support on loop devices here)");
        return Ok(());
    }
    run("mkfs.ext4", &["-q", "-F", &kernel_p1])?;
    // Table B, written over it; without partscan the kernel keeps listing table A's p1.
    run("sgdisk", &["-Z", dev])?;
    run("sgdisk", &["-n1:48M:+32M", "-n2:96M:0", dev])?;
    let new = partitions(dev)?;
    assert_eq!(new.len(), 2);
    assert!(
        std::path::Path::new(&kernel_p1).exists(),
        "kernel view is stale"
    );
    {
        let v = LoopDev::attach_range(&file, new[0].0, new[0].1)?;
        run("mkfs.ext4", &["-q", "-F", v.as_str()])?;
    }
    for (o, s) in [old[0], new[0]] {
        assert!(blkid_probe(dev, Some((o, s)))?.is_some(), "seeded at {o}");
    }

    let (d, _) = generic_over(vec![disk.path.clone()]);
    let r = step(&d, "erase_devices_metadata", json!({}))?;
    assert_eq!(
        r["devices"][0]["partitions"].as_array().map(Vec::len),
        Some(3),
        "the kernel's one and the table's two: {r}"
    );
    for (o, s) in [old[0], new[0], new[1]] {
        let v = LoopDev::attach_range(&file, o, s)?;
        assert_eq!(blkid_probe(v.as_str(), None)?, None, "blkid -p at {o}");
    }
    assert_eq!(wipefs_signatures(dev)?, Vec::<String>::new());
    Ok(())
}

/// The same on a regular file (no root needed): the partition table is parsed from the file.
#[test]
fn metadata_erase_on_partitioned_file() -> anyhow::Result<()> {
    if !require(false, &["sgdisk", "mkfs.ext4", "wipefs", "blkid", "partx"]) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let file = sparse(dir.path(), "disk.img", 128 * MIB)?;
    let f = file.to_str().unwrap_or_default();
    run("sgdisk", &["-n1:2048:+40M", "-n2:0:0", f])?;
    let parts = partitions(f)?;
    assert_eq!(parts.len(), 2);
    // mkfs at an offset of the file: ext4 in p1, ext4 in p2.
    for (o, s) in &parts {
        run(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-E",
                &format!("offset={o}"),
                f,
                &format!("{}k", s / 1024),
            ],
        )?;
        assert!(blkid_probe(f, Some((*o, *s)))?.is_some());
    }
    let mid = parts[1].0 + 20 * MIB;
    write_at(&file, mid, &pattern(8192, 9))?;

    let (d, _) = generic_over(vec![file.clone()]);
    let r = step(&d, "erase_devices_metadata", json!({}))?;
    assert_eq!(
        r["devices"][0]["partitions"].as_array().map(Vec::len),
        Some(2),
        "{r}"
    );
    assert_eq!(wipefs_signatures(f)?, Vec::<String>::new());
    assert_eq!(blkid_probe(f, None)?, None);
    for (o, s) in &parts {
        assert_eq!(blkid_probe(f, Some((*o, *s)))?, None, "partition at {o}");
    }
    assert_eq!(read_at(&file, mid, 8192)?, pattern(8192, 9));
    Ok(())
}

/// Only the first and last MiB of a bare device are written, and a tiny one is zeroed whole.
#[test]
fn metadata_erase_touches_only_the_ends() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let big = dir.path().join("big.img");
    std::fs::write(&big, vec![0xA5u8; (8 * MIB) as usize])?;
    let small = dir.path().join("small.img");
    std::fs::write(&small, vec![0x5Au8; 300 * 1024])?;
    let (d, _) = generic_over(vec![big.clone(), small.clone()]);
    step(&d, "erase_devices_metadata", json!({}))?;
    let data = std::fs::read(&big)?;
    let m = MIB as usize;
    assert!(data[..m].iter().all(|b| *b == 0));
    assert!(
        data[m..7 * m].iter().all(|b| *b == 0xA5),
        "middle untouched"
    );
    assert!(data[7 * m..].iter().all(|b| *b == 0));
    assert_eq!(first_nonzero(&small)?, None);
    Ok(())
}
