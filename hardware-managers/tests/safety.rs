//! What the erase steps must never touch: skip-listed, read-only and mounted devices.

use crate::common;
use common::*;
use serde_json::json;

const MIB: u64 = 1 << 20;

#[test]
fn skip_list_by_name_leaves_the_device_alone() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let keep = sparse(dir.path(), "keep.img", 4 * MIB)?;
    let wipe = sparse(dir.path(), "wipe.img", 4 * MIB)?;
    for f in [&keep, &wipe] {
        write_at(f, 0, &pattern(4096, 7))?;
        write_at(f, 2 * MIB, &pattern(4096, 8))?;
    }
    let (d, _) = generic_over(vec![keep.clone(), wipe.clone()]);
    let r = step(&d, "erase_devices", json!({"skip": ["keep.img"]}))?;
    assert_eq!(r["skipped"][0]["device"], json!(keep.to_str()));
    assert_eq!(r["devices"].as_array().map(Vec::len), Some(1));
    assert_eq!(read_at(&keep, 0, 4096)?, pattern(4096, 7));
    assert_eq!(first_nonzero(&wipe)?, None);
    Ok(())
}

#[test]
fn skip_list_from_config_and_loop_device_name() -> anyhow::Result<()> {
    if !require(true, &["losetup"]) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let file = sparse(dir.path(), "disk.img", 8 * MIB)?;
    let disk = LoopDev::attach(&file)?;
    write_at(&disk.path, 0, &pattern(4096, 3))?;
    let cfg = rivet_hardware_managers::ManagerConfig {
        devices: Some(vec![disk.path.clone()]),
        skip: vec![disk.name()],
        ..Default::default()
    };
    let g = rivet_hardware_managers::GenericManager::new(&cfg);
    let d = rivet_hardware_managers::Dispatcher::new(vec![std::sync::Arc::new(g)]);
    let r = step(&d, "erase_devices_metadata", json!({}))?;
    assert!(
        r["skipped"][0]["reason"]
            .as_str()
            .unwrap_or("")
            .contains("skip list"),
        "{r}"
    );
    assert_eq!(read_at(&file, 0, 4096)?, pattern(4096, 3));
    Ok(())
}

#[test]
fn read_only_loop_device_is_skipped() -> anyhow::Result<()> {
    if !require(true, &["losetup"]) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let file = sparse(dir.path(), "ro.img", 8 * MIB)?;
    write_at(&file, 0, &pattern(4096, 4))?;
    let disk = LoopDev::attach_ro(&file)?;
    let (d, _) = generic_over(vec![disk.path.clone()]);
    let r = step(&d, "erase_devices", json!({}))?;
    assert_eq!(r["skipped"][0]["reason"], json!("read-only device"), "{r}");
    assert_eq!(read_at(&file, 0, 4096)?, pattern(4096, 4));
    Ok(())
}

#[test]
fn mounted_device_is_refused_naming_device_and_mountpoint() -> anyhow::Result<()> {
    if !require(true, &["losetup", "mkfs.ext4", "mount", "umount", "blkid"]) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let file = sparse(dir.path(), "fs.img", 64 * MIB)?;
    let disk = LoopDev::attach(&file)?;
    run("mkfs.ext4", &["-q", "-F", disk.as_str()])?;
    let mnt = dir.path().join("mnt");
    let guard = MountGuard::mount(disk.as_str(), &mnt)?;
    let (d, _) = generic_over(vec![disk.path.clone()]);
    for s in [
        "erase_devices_metadata",
        "erase_devices",
        "erase_devices_express",
    ] {
        let e = step(&d, s, json!({})).expect_err("mounted device must be refused");
        let msg = e.to_string();
        assert!(msg.contains(disk.as_str()), "{msg}");
        assert!(msg.contains(&*mnt.to_string_lossy()), "{msg}");
        assert!(msg.contains("force"), "says how to override: {msg}");
    }
    assert!(
        blkid_probe(disk.as_str(), None)?.is_some(),
        "filesystem untouched"
    );
    // force overrides the refusal (the filesystem is then unmounted by the guard).
    let r = step(&d, "erase_devices_metadata", json!({"force": true}))?;
    assert_eq!(r["devices"][0]["device"], json!(disk.as_str()));
    drop(guard);
    Ok(())
}

/// A partition view (another loop device over the same file) is mounted: the whole disk is
/// in use even though its own device number appears nowhere in the mount table.
#[test]
fn mounted_alias_of_a_loop_device_is_refused() -> anyhow::Result<()> {
    if !require(true, &["losetup", "mkfs.ext4", "mount", "umount"]) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let file = sparse(dir.path(), "disk.img", 64 * MIB)?;
    let disk = LoopDev::attach(&file)?;
    let part = LoopDev::attach_range(&file, MIB, 32 * MIB)?;
    run("mkfs.ext4", &["-q", "-F", part.as_str()])?;
    let mnt = dir.path().join("mnt");
    let _guard = MountGuard::mount(part.as_str(), &mnt)?;
    let (d, _) = generic_over(vec![disk.path.clone()]);
    let e = step(&d, "erase_devices", json!({})).expect_err("refused");
    assert!(e.to_string().contains(part.as_str()), "{e}");
    Ok(())
}

#[test]
fn non_disk_paths_are_refused() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (d, _) = generic_over(vec![dir.path().to_path_buf()]);
    let e = step(&d, "erase_devices", json!({})).expect_err("a directory is not a disk");
    assert!(e.to_string().contains("not a block device"), "{e}");
    Ok(())
}
