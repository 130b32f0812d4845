//! Deploy on a real kernel: image-build's ramdisk boots under QEMU, its agent streams a
//! bootable whole-disk image from a loopback image server (through the guest's restricted
//! user network) onto the VM's virtio disk with a configdrive, and powers the VM off; QEMU is
//! then started again from that disk, no `-kernel`, and the booted instance prints the
//! configdrive's uuid — the node's. Then undeploy: the ramdisk boots again, cleaning erases
//! the disk's metadata, the node is available and the disk's first MiB reads as zeroes.
//!
//! Needs scripts/setup-qemu.sh (QEMU, busybox-static, socat, a kernel package, syslinux,
//! dosfstools, mtools, gdisk) and `cargo build --workspace --bins`. Skips locally without
//! them; fails in CI. TCG: a few minutes.

use anyhow::{ensure, Result};
use rivet_tests::qemu::{self, Boot, Config, Qemu};
use rivet_tests::{prerequisite, Rivetd};
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

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

#[test]
fn deploy_boot_from_disk_undeploy() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let art = qemu::shared_artefacts()?;
    let t = Instant::now();
    let image = qemu::test_image()?;
    eprintln!(
        "test image {} built in {:.1?}",
        image.display(),
        t.elapsed()
    );
    let dir = tempfile::tempdir()?;
    let served = qemu::serve_image(dir.path(), &image)?;
    let (digest, port) = (served.digest.clone(), served.port);

    let cfg = dir.path().join("rivetd.toml");
    std::fs::write(
        &cfg,
        "[agent]\nlong_poll_s = 2\n[conductor]\ncheck_interval_s = 1\n\
         [cleaning]\npriority_overrides = {\"deploy.erase_devices\" = 0}\n",
    )?;
    let cfg = cfg.display().to_string();
    let d = Rivetd::start(&dir.path().join("rivet.db"), 0, &["--config", &cfg])?;
    let mac = "52:54:00:e2:d0:01";
    let uuid = d.create_node_with_port(
        json!({"driver": "fake-hardware", "deploy_interface": "direct", "name": "vm-deploy",
                        "automated_clean": false,
                        // SeaBIOS guest.
                        "properties": {"root_device": {"name": "vda"},
                                       "capabilities": "boot_mode:bios"},
                        "instance_info": {"image_source": qemu::guest_image_url("instance.raw"),
                                          "image_os_hash_algo": "sha256", "image_os_hash_value": digest}}),
        mac,
    )?;
    qemu::provision(&d, &uuid, json!({"target": "manage"}))?;
    qemu::wait_state(&d, &uuid, "manageable", 30, None)?;
    qemu::provision(&d, &uuid, json!({"target": "provide"}))?;
    qemu::wait_state(&d, &uuid, "available", 30, None)?;
    // Cleaning from now on (undeploy), metadata erase only.
    let (s, v) = d.call(
        "PATCH",
        &format!("/v1/nodes/{uuid}"),
        Some(json!([{"op": "replace", "path": "/automated_clean", "value": true}])),
    )?;
    ensure!(s == 200, "{v}");

    // The VM's disk: 256 MiB, stale data at the start.
    let disk = dir.path().join("vda.img");
    std::fs::File::create(&disk)?.set_len(256 * MIB)?;
    std::fs::write(&disk, vec![0xA5u8; MIB as usize])?;
    std::fs::File::options()
        .write(true)
        .open(&disk)?
        .set_len(256 * MIB)?;
    let vm_config = |boot: Boot, name: &str| Config {
        boot,
        disks: vec![disk.clone()],
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

    // Deploy, with the configdrive as Ironic's JSON form.
    let t = Instant::now();
    qemu::provision(
        &d,
        &uuid,
        json!({"target": "active", "configdrive": {"meta_data": {"hostname": "vm-deploy"}}}),
    )?;
    let mut vm = Some(Qemu::start(&vm_config(ramdisk(), "vm-deploy"))?);
    let active = qemu::wait_state(&d, &uuid, "active", 600, vm.as_ref())?;
    let deploy_s = t.elapsed();
    ensure!(
        active["driver_internal_info"]["deployed_image"]["hash_value"] == digest.as_str(),
        "{active}"
    );
    // tear_down_agent: the ramdisk powered the VM off itself.
    let deadline = Instant::now() + Duration::from_secs(60);
    while vm.as_mut().and_then(|v| v.exited()).is_none() {
        ensure!(
            Instant::now() < deadline,
            "the ramdisk did not power the VM off"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(vm.take());

    // Boot the instance from its disk.
    let t = Instant::now();
    let mut instance = Qemu::start(&vm_config(Boot::Disk, "vm-instance"))?;
    let marker = format!("rivet-lab-instance booted uuid={uuid}");
    let seen = instance
        .wait_console(
            rivet_image_build::testimage::MARKER,
            Duration::from_secs(300),
        )
        .map(|_| instance.console_text())?;
    ensure!(
        seen.contains(&marker),
        "the instance did not see the configdrive:\n{}",
        instance.diagnostics(30)
    );
    eprintln!(
        "deploy: active after {:.1?}; the instance booted from its disk and printed its uuid after {:.1?}",
        deploy_s,
        t.elapsed()
    );
    instance.kill();

    // Undeploy: cleaning in the ramdisk, available, metadata gone.
    let t = Instant::now();
    qemu::provision(&d, &uuid, json!({"target": "deleted"}))?;
    qemu::wait_state(&d, &uuid, "clean wait", 60, None)?;
    let mut vm = Some(Qemu::start(&vm_config(ramdisk(), "vm-clean"))?);
    let n = qemu::wait_state(&d, &uuid, "available", 600, vm.as_ref())?;
    ensure!(n["instance_info"] == json!({}), "{n}");
    drop(vm.take());
    eprintln!("undeploy + cleaning: available after {:.1?}", t.elapsed());
    let first = rivet_tests::agentproc::read_at(&disk, 0, MIB as usize)?;
    ensure!(
        first.iter().all(|b| *b == 0),
        "the disk's first MiB is not zero after undeploy"
    );
    Ok(())
}
