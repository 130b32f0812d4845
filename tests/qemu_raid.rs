//! Software RAID on a real kernel: image-build's ramdisk boots under QEMU with four virtio
//! disks; a manual clean runs `raid.delete_configuration` then `raid.create_configuration`
//! for a RAID-1 root mirror on vda+vdb and a RAID-0 volume on vdc+vdd, built by the agent
//! with mdadm. Automated cleaning then erases through the arrays and keeps them (as in
//! Ironic); the deploy writes a bootable image with a configdrive onto the mirror, chosen
//! without any root device hint. QEMU then boots the instance from both disks, from vdb
//! alone and from vda alone, and the instance prints the node's uuid from its configdrive
//! each time. Last, undeploy and a manual `raid.delete_configuration` leave no superblock
//! and no partition table on any disk.
//!
//! The md superblocks are checked from the host by their bytes (magic, version, name) in
//! the disk files; the host kernel has no md, which is why the arrays are built in a guest.
//!
//! A second test does the same for UEFI on two disks: the ramdisk boots from its ISO under
//! OVMF, the agent writes the image's boot entry, and OVMF then boots the instance from each
//! disk alone (the image's ESP is on the mirror, so each member has it as a plain partition).
//!
//! Needs scripts/setup-qemu.sh (QEMU, busybox-static, a kernel package, syslinux, mdadm
//! for the ramdisk…) and `cargo build --workspace --bins`. Skips locally without them;
//! fails in CI. TCG: several minutes.

use anyhow::{ensure, Result};
use rivet_tests::qemu::{self, Boot, Config, Qemu};
use rivet_tests::{prerequisite, Rivetd};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const ROOT_DISK_MIB: u64 = 256;
const DATA_DISK_MIB: u64 = 64;
/// md superblock magic, little endian on disk.
const MD_MAGIC: [u8; 4] = [0xfc, 0x4e, 0x2b, 0xa9];

fn ready() -> bool {
    qemu::require()
        && prerequisite(
            rivet_tests::bin("rivetd").exists(),
            "rivetd is not built: cargo build --workspace --bins",
        )
        && prerequisite(
            Path::new("/usr/lib/syslinux/mbr/gptmbr.bin").is_file(),
            "syslinux-common (scripts/setup-qemu.sh installs it)",
        )
}

/// Where md metadata 1.0 puts its superblock on a device of `size` bytes: 8 KiB before the
/// end, rounded down to 4 KiB.
fn sb10_offset(size: u64) -> u64 {
    (size - 8192) & !4095
}

/// The md superblock at `offset` of `disk`: `(major version, set name)`, if its magic is there.
fn superblock(disk: &Path, offset: u64) -> Result<Option<(u32, String)>> {
    let sb = rivet_tests::agentproc::read_at(disk, offset, 256)?;
    if sb[0..4] != MD_MAGIC {
        return Ok(None);
    }
    let major = u32::from_le_bytes([sb[4], sb[5], sb[6], sb[7]]);
    let name = String::from_utf8_lossy(&sb[32..64])
        .trim_end_matches('\0')
        .to_string();
    Ok(Some((major, name)))
}

fn sparse(path: &Path, mib: u64) -> Result<()> {
    std::fs::File::create(path)?.set_len(mib * MIB)?;
    Ok(())
}

#[test]
fn software_raid_mirror_boots_from_either_disk() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let art = qemu::shared_artefacts()?;
    let image = qemu::test_image()?;
    let dir = tempfile::tempdir()?;
    let served = qemu::serve_image(dir.path(), &image)?;
    let (digest, port) = (served.digest.clone(), served.port);
    let image_bytes = std::fs::read(&image)?;

    let cfg = dir.path().join("rivetd.toml");
    std::fs::write(
        &cfg,
        "[agent]\nlong_poll_s = 2\n[conductor]\ncheck_interval_s = 1\n\
         [cleaning]\npriority_overrides = {\"deploy.erase_devices\" = 0}\n",
    )?;
    let cfg = cfg.display().to_string();
    let d = Rivetd::start(&dir.path().join("rivet.db"), 0, &["--config", &cfg])?;
    let mac = "52:54:00:e2:d0:0a";
    let uuid = d.create_node_with_port(
        json!({"driver": "fake-hardware", "deploy_interface": "direct", "raid_interface": "agent",
               "name": "vm-raid", "automated_clean": true,
               // SeaBIOS guest; no root device hint: the mirror is the deploy target.
               "properties": {"capabilities": "boot_mode:bios"},
               "instance_info": {"image_source": qemu::guest_image_url("instance.raw"),
                                 "image_os_hash_algo": "sha256", "image_os_hash_value": digest}}),
        mac,
    )?;
    let target = json!({"logical_disks": [
        {"size_gb": "MAX", "raid_level": "1", "controller": "software", "is_root_volume": true,
         "physical_disks": [{"name": "/dev/vda"}, {"name": "/dev/vdb"}]},
        {"size_gb": "MAX", "raid_level": "0", "controller": "software", "volume_name": "scratch",
         "physical_disks": [{"name": "/dev/vdc"}, {"name": "/dev/vdd"}]}]});
    let (s, v) = d.call(
        "PUT",
        &format!("/v1/nodes/{uuid}/states/raid"),
        Some(target.clone()),
    )?;
    ensure!(s == 204, "PUT states/raid: {s} {v}");

    // Four disks; stale bytes at the start of each so a wipe that does not happen shows.
    let disks: Vec<PathBuf> = ["vda", "vdb", "vdc", "vdd"]
        .iter()
        .map(|n| dir.path().join(format!("{n}.img")))
        .collect();
    for (i, p) in disks.iter().enumerate() {
        sparse(p, if i < 2 { ROOT_DISK_MIB } else { DATA_DISK_MIB })?;
        use std::os::unix::fs::FileExt;
        std::fs::OpenOptions::new()
            .write(true)
            .open(p)?
            .write_all_at(&vec![0xA5u8; MIB as usize], 0)?;
    }
    let vm_config = |boot: Boot, disks: Vec<PathBuf>, name: &str| Config {
        boot,
        disks,
        mac: mac.into(),
        rivetd_port: d.port,
        memory_mib: 512,
        log_dir: dir.path().join(name),
        accel: qemu::accel(&art.vmlinuz),
        image_port: Some(port),
    };
    let ramdisk = || Boot::Kernel {
        vmlinuz: art.vmlinuz.clone(),
        initramfs: art.initramfs.clone(),
        cmdline: qemu::test_cmdline(),
    };
    let in_ramdisk = |name: &str, want: &str| -> Result<Value> {
        let vm = Qemu::start(&vm_config(ramdisk(), disks.clone(), name))?;
        let n = qemu::wait_state(&d, &uuid, want, 600, Some(&vm));
        drop(vm);
        n
    };
    let root_sb = |p: &Path| superblock(p, sb10_offset(ROOT_DISK_MIB * MIB));
    let data_sb = |p: &Path| superblock(p, 4096);

    // 1. Manual clean builds the arrays.
    qemu::provision(&d, &uuid, json!({"target": "manage"}))?;
    qemu::wait_state(&d, &uuid, "manageable", 30, None)?;
    let t = Instant::now();
    qemu::provision(
        &d,
        &uuid,
        json!({"target": "clean", "clean_steps": [
            {"interface": "raid", "step": "delete_configuration"},
            {"interface": "raid", "step": "create_configuration"}]}),
    )?;
    let n = in_ramdisk("vm-raid-create", "manageable")?;
    eprintln!(
        "raid: arrays built by manual cleaning in {:.1?}",
        t.elapsed()
    );
    let built = n["raid_config"]["logical_disks"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    ensure!(
        built.len() == 2,
        "raid_config after create: {}",
        n["raid_config"]
    );
    ensure!(
        built[0]["physical_disks"] == json!([{"name": "/dev/vda"}, {"name": "/dev/vdb"}])
            && built[0]["is_root_volume"] == json!(true)
            && built[1]["volume_name"] == json!("scratch"),
        "raid_config after create: {}",
        n["raid_config"]
    );
    for p in &disks[..2] {
        let sb = root_sb(p)?;
        ensure!(
            matches!(&sb, Some((1, name)) if name.ends_with("rivet-root")),
            "{}: no md 1.0 superblock named rivet-root at the end: {sb:?}",
            p.display()
        );
    }
    for p in &disks[2..] {
        let sb = data_sb(p)?;
        ensure!(
            matches!(&sb, Some((1, name)) if name.ends_with("scratch")),
            "{}: no md 1.2 superblock named scratch: {sb:?}",
            p.display()
        );
    }

    // 2. Automated cleaning erases through the arrays and keeps them.
    let t = Instant::now();
    qemu::provision(&d, &uuid, json!({"target": "provide"}))?;
    let n = in_ramdisk("vm-raid-provide", "available")?;
    eprintln!("raid: automated cleaning in {:.1?}", t.elapsed());
    ensure!(
        n["raid_config"]["logical_disks"].as_array().map(Vec::len) == Some(2),
        "{n}"
    );
    for p in &disks[..2] {
        ensure!(
            root_sb(p)?.is_some(),
            "cleaning destroyed the mirror on {}",
            p.display()
        );
    }
    for p in &disks[2..] {
        ensure!(
            data_sb(p)?.is_some(),
            "cleaning destroyed the RAID-0 on {}",
            p.display()
        );
    }

    // 3. Deploy onto the mirror, with a configdrive.
    let t = Instant::now();
    qemu::provision(
        &d,
        &uuid,
        json!({"target": "active", "configdrive": {"meta_data": {"hostname": "vm-raid"}}}),
    )?;
    let mut vm = Some(Qemu::start(&vm_config(
        ramdisk(),
        disks.clone(),
        "vm-raid-deploy",
    ))?);
    let active = qemu::wait_state(&d, &uuid, "active", 600, vm.as_ref())?;
    let deployed = &active["driver_internal_info"]["deployed_image"];
    ensure!(
        deployed["device"]
            .as_str()
            .is_some_and(|s| s.starts_with("/dev/md"))
            && deployed["chosen_by"]
                .as_str()
                .is_some_and(|s| s.contains("software RAID root mirror")),
        "not deployed onto the mirror: {deployed}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while vm.as_mut().and_then(|v| v.exited()).is_none() {
        ensure!(
            Instant::now() < deadline,
            "the ramdisk did not power the VM off"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(vm.take());
    eprintln!("raid: deployed onto the mirror in {:.1?}", t.elapsed());
    // Both members hold the image, byte for byte (md metadata 1.0: data from sector 0).
    // The image's first and last 34 sectors are left out: the deploy rewrites the GPT
    // headers to move the backup to the end of the array; the rest must be as served.
    let (from, to) = (34 * 512, image_bytes.len() - 34 * 512);
    for p in &disks[..2] {
        let body = rivet_tests::agentproc::read_at(p, from as u64, to - from)?;
        ensure!(
            body == image_bytes[from..to],
            "{} does not hold the image's bytes",
            p.display()
        );
    }

    // 4. The instance boots from both disks, then from either alone.
    let marker = format!("rivet-lab-instance booted uuid={uuid}");
    for (name, set) in [
        ("both", vec![disks[0].clone(), disks[1].clone()]),
        ("vdb-only", vec![disks[1].clone()]),
        ("vda-only", vec![disks[0].clone()]),
    ] {
        let t = Instant::now();
        let mut instance =
            Qemu::start(&vm_config(Boot::Disk, set, &format!("vm-instance-{name}")))?;
        instance.wait_console(
            rivet_image_build::testimage::MARKER,
            Duration::from_secs(300),
        )?;
        let seen = instance.console_text();
        ensure!(
            seen.contains(&marker),
            "booting from {name}: the instance did not see the configdrive:\n{}",
            instance.diagnostics(30)
        );
        instance.kill();
        eprintln!(
            "raid: the instance booted from {name} in {:.1?}",
            t.elapsed()
        );
    }

    // 5. Undeploy keeps the arrays; raid.delete_configuration removes them.
    qemu::provision(&d, &uuid, json!({"target": "deleted"}))?;
    qemu::wait_state(&d, &uuid, "clean wait", 60, None)?;
    in_ramdisk("vm-raid-undeploy", "available")?;
    ensure!(
        root_sb(&disks[0])?.is_some(),
        "undeploy destroyed the mirror"
    );
    qemu::provision(&d, &uuid, json!({"target": "manage"}))?;
    qemu::wait_state(&d, &uuid, "manageable", 30, None)?;
    qemu::provision(
        &d,
        &uuid,
        json!({"target": "clean", "clean_steps": [{"interface": "raid", "step": "delete_configuration"}]}),
    )?;
    let n = in_ramdisk("vm-raid-delete", "manageable")?;
    ensure!(
        n["raid_config"] == json!({}),
        "raid_config after delete: {}",
        n["raid_config"]
    );
    for (i, p) in disks.iter().enumerate() {
        let sb = if i < 2 { root_sb(p)? } else { data_sb(p)? };
        ensure!(
            sb.is_none(),
            "{}: a superblock survived delete_configuration",
            p.display()
        );
        let head = rivet_tests::agentproc::read_at(p, 0, MIB as usize)?;
        ensure!(
            head.iter().all(|b| *b == 0),
            "{}: its partition table survived",
            p.display()
        );
    }
    Ok(())
}

#[test]
fn software_raid_mirror_boots_uefi_from_either_disk() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let art = qemu::shared_artefacts()?;
    let Some((iso, boot)) = art.iso.clone() else {
        anyhow::bail!("image-build made no ISO");
    };
    ensure!(boot.uefi, "the ISO has no UEFI El Torito image");
    let image = qemu::test_image()?;
    let dir = tempfile::tempdir()?;
    let served = qemu::serve_image(dir.path(), &image)?;
    let (digest, port) = (served.digest.clone(), served.port);
    let cfg = dir.path().join("rivetd.toml");
    std::fs::write(
        &cfg,
        "[agent]\nlong_poll_s = 2\n[conductor]\ncheck_interval_s = 1\n",
    )?;
    let cfg = cfg.display().to_string();
    let d = Rivetd::start(&dir.path().join("rivet.db"), 0, &["--config", &cfg])?;
    let mac = "52:54:00:e2:d0:0b";
    // No boot mode anywhere: rivetd's default, uefi.
    let uuid = d.create_node_with_port(
        json!({"driver": "fake-hardware", "deploy_interface": "direct", "raid_interface": "agent",
               "name": "vm-raid-uefi", "automated_clean": false,
               "instance_info": {"image_source": qemu::guest_image_url("instance.raw"),
                                 "image_os_hash_algo": "sha256", "image_os_hash_value": digest}}),
        mac,
    )?;
    let (s, v) = d.call(
        "PUT",
        &format!("/v1/nodes/{uuid}/states/raid"),
        Some(json!({"logical_disks": [
            {"size_gb": "MAX", "raid_level": "1", "controller": "software", "is_root_volume": true}]})),
    )?;
    ensure!(s == 204, "PUT states/raid: {s} {v}");
    let disks: Vec<PathBuf> = ["vda", "vdb"]
        .iter()
        .map(|n| dir.path().join(format!("{n}.img")))
        .collect();
    for p in &disks {
        sparse(p, ROOT_DISK_MIB)?;
    }
    let vm_config = |boot: Boot, disks: Vec<PathBuf>, name: &str| Config {
        boot,
        disks,
        mac: mac.into(),
        rivetd_port: d.port,
        memory_mib: 512,
        log_dir: dir.path().join(name),
        accel: qemu::accel(&art.vmlinuz),
        image_port: Some(port),
    };
    let in_ramdisk = |name: &str, want: &str| -> Result<Value> {
        let vm = Qemu::start(&vm_config(
            Boot::CdromUefi(iso.clone()),
            disks.clone(),
            name,
        ))?;
        let n = qemu::wait_state(&d, &uuid, want, 600, Some(&vm));
        drop(vm);
        n
    };

    qemu::provision(&d, &uuid, json!({"target": "manage"}))?;
    qemu::wait_state(&d, &uuid, "manageable", 30, None)?;
    let t = Instant::now();
    qemu::provision(
        &d,
        &uuid,
        json!({"target": "clean", "clean_steps": [
            {"interface": "raid", "step": "create_configuration"}]}),
    )?;
    in_ramdisk("vm-uefi-create", "manageable")?;
    eprintln!("raid uefi: mirror built in {:.1?}", t.elapsed());
    for p in &disks {
        ensure!(
            superblock(p, sb10_offset(ROOT_DISK_MIB * MIB))?.is_some(),
            "{}: no md 1.0 superblock",
            p.display()
        );
    }
    qemu::provision(&d, &uuid, json!({"target": "provide"}))?;
    qemu::wait_state(&d, &uuid, "available", 30, None)?;
    let t = Instant::now();
    qemu::provision(
        &d,
        &uuid,
        json!({"target": "active", "configdrive": {"meta_data": {"hostname": "vm-raid-uefi"}}}),
    )?;
    let active = in_ramdisk("vm-uefi-deploy", "active")?;
    let deployed = &active["driver_internal_info"]["deployed_image"];
    ensure!(
        deployed["device"]
            .as_str()
            .is_some_and(|s| s.starts_with("/dev/md"))
            && !deployed["uefi_boot_entry"].is_null(),
        "not deployed onto the mirror with a UEFI boot entry: {deployed}"
    );
    eprintln!("raid uefi: deployed in {:.1?}", t.elapsed());
    let marker = format!("rivet-lab-instance booted uuid={uuid}");
    for (name, set) in [
        ("vdb-only", vec![disks[1].clone()]),
        ("vda-only", vec![disks[0].clone()]),
    ] {
        let t = Instant::now();
        let mut instance = Qemu::start(&vm_config(
            Boot::DiskUefi,
            set,
            &format!("vm-uefi-instance-{name}"),
        ))?;
        instance.wait_console(
            rivet_image_build::testimage::MARKER,
            Duration::from_secs(300),
        )?;
        let seen = instance.console_text();
        ensure!(
            seen.contains(&marker) && seen.contains("firmware=uefi"),
            "UEFI boot from {name}: no marker with the uuid and firmware=uefi:\n{}",
            instance.diagnostics(30)
        );
        instance.kill();
        eprintln!(
            "raid uefi: the instance booted from {name} in {:.1?}",
            t.elapsed()
        );
    }
    Ok(())
}
