//! The product on a real kernel: image-build's ramdisk booted under QEMU (a Debian kernel, two
//! virtio disks prepared with GPT and file systems, user networking that reaches only rivetd)
//! looks the node up, reports its inventory and is cleaned by rivetd; afterwards the disk files
//! read as erased. Also booted from the ISO and through PXE → iPXE → rivetd's /boot scripts.
//!
//! Needs scripts/setup-qemu.sh (QEMU, busybox-static, socat, GRUB/xorriso, a kernel package)
//! and `cargo build --workspace --bins`. Skips locally without them; fails in CI.
//! TCG by default here (see tests/qemu.rs for KVM): a boot is ~10 s to the agent, the whole
//! file runs in a few minutes. Guests run one at a time so the timings stay sane on 2 cores.

use anyhow::{bail, ensure, Context, Result};
use rivet_tests::qemu::{self, Boot, Config, Qemu};
use rivet_tests::{prerequisite, Rivetd};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One guest at a time.
static GUEST: Mutex<()> = Mutex::new(());

fn one_guest() -> std::sync::MutexGuard<'static, ()> {
    GUEST.lock().unwrap_or_else(|p| p.into_inner())
}

fn ready() -> bool {
    if !qemu::require() {
        return false;
    }
    prerequisite(
        rivet_tests::bin("rivetd").exists(),
        "rivetd is not built: cargo build --workspace --bins",
    )
}

/// Wait for the node's inventory (the agent looked up and answered get_inventory).
fn wait_inventory(d: &Rivetd, vm: &mut Qemu, uuid: &str, timeout: Duration) -> Result<Value> {
    let deadline = Instant::now() + timeout;
    loop {
        let (s, v) = d.call("GET", &format!("/v1/nodes/{uuid}/inventory"), None)?;
        if s == 200 {
            return Ok(v);
        }
        if let Some(st) = vm.exited() {
            bail!(
                "QEMU exited ({st}) before the inventory arrived\n{}",
                vm.diagnostics(60)
            );
        }
        if Instant::now() > deadline {
            bail!(
                "no inventory for node {uuid} after {timeout:?} (last answer {s} {v})\n{}\n--- rivetd log tail:\n{}",
                vm.diagnostics(60),
                tail(&d.log_text(), 30)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The inventory has the NIC QEMU was given, and (when `disks` is non-empty) those virtio
/// disks with their sizes.
fn check_inventory(inv: &Value, mac: &str, disks: &[(&str, u64)]) -> Result<()> {
    let inv = &inv["inventory"];
    let macs: Vec<&str> = inv["interfaces"]
        .as_array()
        .context("inventory.interfaces")?
        .iter()
        .filter_map(|i| i["mac_address"].as_str())
        .collect();
    ensure!(
        macs.contains(&mac),
        "inventory interfaces {macs:?} lack the QEMU NIC {mac}"
    );
    let found: Vec<(String, u64)> = inv["disks"]
        .as_array()
        .context("inventory.disks")?
        .iter()
        .map(|d| {
            (
                d["name"].as_str().unwrap_or_default().to_string(),
                d["size"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    for (name, size) in disks {
        ensure!(
            found
                .iter()
                .any(|(n, s)| n.trim_start_matches("/dev/") == *name && s == size),
            "inventory disks {found:?} lack {name} of {size} bytes"
        );
    }
    Ok(())
}

const MIB: u64 = 1 << 20;

#[test]
fn direct_boot_looks_up_reports_inventory_and_cleans_both_disks() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let art = qemu::shared_artefacts()?;
    let _guest = one_guest();
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start(&dir.path().join("rivet.db"), 0, &[])?;

    // Two disks: GPT + ext4 + swap, and GPT + ext4; every byte not written by mkfs is 0xA5.
    let disk_a = dir.path().join("disk-a.raw");
    let disk_b = dir.path().join("disk-b.raw");
    let parts_a = qemu::make_disk(&disk_a, 64, &[("ext4", 24), ("swap", 0)])?;
    let parts_b = qemu::make_disk(&disk_b, 64, &[("ext4", 0)])?;
    let mut all_parts: Vec<(PathBuf, qemu::Partition)> = Vec::new();
    all_parts.extend(parts_a.iter().map(|p| (disk_a.clone(), p.clone())));
    all_parts.extend(parts_b.iter().map(|p| (disk_b.clone(), p.clone())));
    for img in [&disk_a, &disk_b] {
        ensure!(
            qemu::blkid_at(img, 0)?.contains("gpt"),
            "no GPT on {}",
            img.display()
        );
        ensure!(qemu::file_contains(img, qemu::MARKER.as_bytes())?);
    }
    for (img, p) in &all_parts {
        let sig = qemu::blkid_at(img, p.offset)?;
        ensure!(
            sig.contains(&p.fs),
            "{} at {}: {sig:?}",
            img.display(),
            p.offset
        );
    }

    let mac = "52:54:00:e2:e0:01";
    let uuid = qemu::node_in_clean_wait(&d, "qemu-direct", mac)?;
    let mut vm = Qemu::start(&Config {
        boot: Boot::Kernel {
            vmlinuz: art.vmlinuz.clone(),
            initramfs: art.initramfs.clone(),
            cmdline: qemu::test_cmdline(),
        },
        disks: vec![disk_a.clone(), disk_b.clone()],
        mac: mac.into(),
        rivetd_port: d.port,
        memory_mib: 512,
        log_dir: dir.path().join("vm"),
        accel: qemu::accel(&art.vmlinuz),
        image_port: None,
    })?;

    let inv = wait_inventory(&d, &mut vm, &uuid, Duration::from_secs(180))?;
    check_inventory(&inv, mac, &[("vda", 64 * MIB), ("vdb", 64 * MIB)])?;
    let booted = vm.line_time("rivet-init").map(|t| t.0);
    eprintln!(
        "guest: first /init line at {booted:?}, inventory at {:?}",
        vm.started.elapsed()
    );

    // Automated cleaning: metadata erase, then the full erase, then available.
    let deadline = Instant::now() + Duration::from_secs(600);
    let node = loop {
        let n = d.node(&uuid)?;
        let state = n["provision_state"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if state == "available" {
            break n;
        }
        if state == "clean failed" || Instant::now() > deadline {
            bail!(
                "cleaning did not finish: node is {state:?}: {}\n{}\n--- rivetd log tail:\n{}",
                n["last_error"],
                vm.diagnostics(60),
                tail(&d.log_text(), 40)
            );
        }
        if let Some(st) = vm.exited() {
            bail!("QEMU exited ({st}) while cleaning\n{}", vm.diagnostics(60));
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    eprintln!(
        "cleaned in {:?} since QEMU start; last_error {}",
        vm.started.elapsed(),
        node["last_error"]
    );
    vm.kill();

    for img in [&disk_a, &disk_b] {
        ensure!(
            qemu::blkid_at(img, 0)?.is_empty(),
            "{}: signatures left at 0",
            img.display()
        );
        let w = qemu::wipefs_list(img)?;
        ensure!(w.is_empty(), "{}: wipefs still sees {w}", img.display());
        ensure!(
            !qemu::file_contains(img, qemu::MARKER.as_bytes())?,
            "{}: file contents survived",
            img.display()
        );
        if let Some(off) = qemu::first_nonzero(img)? {
            bail!(
                "{}: not all zeroes after the full erase: byte {off} is not 0",
                img.display()
            );
        }
    }
    for (img, p) in &all_parts {
        let sig = qemu::blkid_at(img, p.offset)?;
        ensure!(
            sig.is_empty(),
            "{} at {}: {sig} survived",
            img.display(),
            p.offset
        );
    }
    Ok(())
}

#[test]
fn iso_boot_bios_looks_up_and_reports_inventory() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    iso_boot(IsoFirmware::Bios, "52:54:00:e2:e0:02")
}

#[test]
fn iso_boot_uefi_looks_up_and_reports_inventory() -> Result<()> {
    if !ready()
        || !prerequisite(
            qemu::ovmf_code().is_some(),
            "OVMF UEFI firmware (Debian ovmf)",
        )
    {
        return Ok(());
    }
    iso_boot(IsoFirmware::Uefi, "52:54:00:e2:e0:05")
}

/// Secure Boot enforcing (OVMF with Microsoft's keys): the ISO's signed chain (shim → GRUB →
/// Debian's kernel) boots, the kernel says Secure Boot is on and locks down, and the agent
/// (its modules loaded under lockdown) still reports its inventory.
#[test]
fn iso_boot_secure_boot_looks_up_and_reports_inventory() -> Result<()> {
    if !ready()
        || !prerequisite(
            qemu::ovmf_secure_boot().is_some(),
            "OVMF's Secure Boot build (Debian ovmf)",
        )
    {
        return Ok(());
    }
    iso_boot(IsoFirmware::SecureBoot, "52:54:00:e2:e0:06")
}

/// The firmware an ISO boot test runs under.
#[derive(Clone, Copy, PartialEq)]
enum IsoFirmware {
    Bios,
    Uefi,
    SecureBoot,
}

/// Boot the ISO from a CD drive (SeaBIOS or OVMF): GRUB → kernel → agent → inventory.
fn iso_boot(fw: IsoFirmware, mac: &str) -> Result<()> {
    let uefi = fw != IsoFirmware::Bios;
    let art = qemu::shared_artefacts()?;
    let Some((iso, boot)) = art.iso.clone() else {
        bail!("image-build made no ISO");
    };
    ensure!(boot.bios, "the ISO has no BIOS El Torito image");
    if uefi {
        ensure!(boot.uefi, "the ISO has no UEFI El Torito image");
    }
    if fw == IsoFirmware::SecureBoot {
        ensure!(
            boot.secure_boot,
            "the ISO's UEFI image is not a signed chain: install shim-signed and grub-efi-amd64-signed"
        );
    }
    if let Some(report) = rivet_image_build::iso::el_torito(&iso) {
        ensure!(
            (report.bios, report.uefi) == (boot.bios, boot.uefi),
            "xorriso reports {report:?}, image-build said {boot:?}"
        );
    }
    let _guest = one_guest();
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start(&dir.path().join("rivet.db"), 0, &[])?;
    let disk = dir.path().join("disk.raw");
    qemu::make_disk(&disk, 16, &[("ext4", 0)])?;
    let uuid = qemu::node_in_clean_wait(
        &d,
        match fw {
            IsoFirmware::Bios => "qemu-iso-bios",
            IsoFirmware::Uefi => "qemu-iso-uefi",
            IsoFirmware::SecureBoot => "qemu-iso-secure-boot",
        },
        mac,
    )?;
    let mut vm = Qemu::start(&Config {
        boot: match fw {
            IsoFirmware::Bios => Boot::Cdrom(iso),
            IsoFirmware::Uefi => Boot::CdromUefi(iso),
            IsoFirmware::SecureBoot => Boot::CdromSecureBoot(iso),
        },
        disks: vec![disk],
        mac: mac.into(),
        rivetd_port: d.port,
        memory_mib: 512,
        log_dir: dir.path().join("vm"),
        accel: qemu::accel(&art.vmlinuz),
        image_port: None,
    })?;
    let inv = wait_inventory(&d, &mut vm, &uuid, Duration::from_secs(300))?;
    check_inventory(&inv, mac, &[("vda", 16 * MIB)])?;
    // The kernel command line came from the ISO's grub.cfg.
    let text = vm.console_text();
    ensure!(
        text.contains(&format!(
            "rivet.controller={}",
            qemu::guest_controller_url()
        )),
        "the console does not show the ISO's kernel command line\n{}",
        vm.diagnostics(40)
    );
    if uefi {
        // The EFI stub reports how it was entered; BIOS boots never print it.
        ensure!(
            text.contains("efi: EFI v") || text.contains("EFI v2"),
            "no sign of a UEFI boot on the console\n{}",
            vm.diagnostics(60)
        );
    }
    // The kernel's own word, from the firmware's SecureBoot variable.
    let secure = text.contains("secureboot: Secure boot enabled");
    ensure!(
        secure == (fw == IsoFirmware::SecureBoot),
        "Secure Boot {} on the console, expected {}\n{}",
        if secure { "enabled" } else { "not enabled" },
        fw == IsoFirmware::SecureBoot,
        vm.diagnostics(60)
    );
    Ok(())
}

/// Whether QEMU has an iPXE option ROM for virtio-net (Debian ipxe-qemu).
fn have_ipxe_rom() -> bool {
    [
        "/usr/lib/ipxe/qemu/efi-virtio.rom",
        "/usr/share/qemu/efi-virtio.rom",
        "/usr/share/qemu/pxe-virtio.rom",
    ]
    .iter()
    .any(|p| Path::new(p).exists())
}

#[test]
fn pxe_chain_through_rivetd_boot_endpoints() -> Result<()> {
    if !ready() || !prerequisite(have_ipxe_rom(), "QEMU's iPXE ROM (Debian ipxe-qemu)") {
        return Ok(());
    }
    let art = qemu::shared_artefacts()?;
    let _guest = one_guest();
    let dir = tempfile::tempdir()?;
    let artefact_dir = art.vmlinuz.parent().context("artefact dir")?;
    let cfg = qemu::boot_config(dir.path(), artefact_dir)?;
    let cfg = cfg.display().to_string();
    let d = Rivetd::start(&dir.path().join("rivet.db"), 0, &["--config", &cfg])?;
    let mac = "52:54:00:e2:e0:03";
    let uuid = qemu::node_in_clean_wait(&d, "qemu-pxe", mac)?;

    // The DHCP boot file is rivetd's per-node script; iPXE fetches it, then the kernel and
    // the initramfs, all through the guestfwd relay.
    let url = format!("{}/boot/ipxe/{uuid}", qemu::guest_controller_url());
    let mut vm = Qemu::start(&Config {
        boot: Boot::Pxe(url),
        disks: vec![],
        mac: mac.into(),
        rivetd_port: d.port,
        memory_mib: 512,
        log_dir: dir.path().join("vm"),
        accel: qemu::accel(&art.vmlinuz),
        image_port: None,
    })?;
    let inv = wait_inventory(&d, &mut vm, &uuid, Duration::from_secs(300))?;
    check_inventory(&inv, mac, &[])?;
    let text = vm.console_text();
    ensure!(
        text.contains(&format!("rivet.node={uuid}"))
            && text.contains(&format!("BOOTIF=01-{}", mac.replace(':', "-"))),
        "the kernel did not get rivet.node= and BOOTIF= from the iPXE script\n{}",
        vm.diagnostics(40)
    );
    Ok(())
}

/// The HTTP side of /boot without a guest: only the three artefacts, streamed intact; scripts
/// for known nodes only; nothing about unknown ones.
#[test]
fn boot_endpoints_serve_artefacts_and_per_node_scripts() -> Result<()> {
    if !prerequisite(
        rivet_tests::bin("rivetd").exists(),
        "rivetd is not built: cargo build --workspace --bins",
    ) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let art = dir.path().join("artefacts");
    std::fs::create_dir_all(&art)?;
    // 3 MiB + 7 bytes of a pattern: several body chunks, an odd tail.
    let kernel: Vec<u8> = (0..3 * MIB as usize + 7).map(|i| (i % 251) as u8).collect();
    std::fs::write(art.join("vmlinuz"), &kernel)?;
    std::fs::write(art.join("rivet.initramfs"), b"initramfs")?;
    std::fs::write(art.join("secret.txt"), b"not for you")?;
    let cfg = qemu::boot_config(dir.path(), &art)?;
    let cfg = cfg.display().to_string();
    let d = Rivetd::start(&dir.path().join("rivet.db"), 0, &["--config", &cfg])?;
    let http = reqwest::blocking::Client::new();
    let get = |path: &str| -> Result<(u16, Vec<u8>)> {
        let r = http.get(format!("{}{path}", d.url)).send()?;
        Ok((r.status().as_u16(), r.bytes()?.to_vec()))
    };

    let (s, body) = get("/boot/vmlinuz")?;
    ensure!(
        s == 200 && body == kernel,
        "vmlinuz: {s}, {} bytes",
        body.len()
    );
    ensure!(get("/boot/rivet.initramfs")? == (200, b"initramfs".to_vec()));
    for path in [
        "/boot/secret.txt",
        "/boot/rivet.iso",
        "/boot/..%2Fsecret.txt",
        "/boot/boot.ipxe",
        "/boot/ipxe/00000000-0000-0000-0000-000000000000",
        "/boot/ipxe/no-such-node",
        "/boot/ipxe?mac=52:54:00:99:99:99",
        "/boot/ipxe?mac=garbage",
        "/boot/ipxe",
    ] {
        let (s, body) = get(path)?;
        ensure!(s == 404, "{path}: {s} {}", String::from_utf8_lossy(&body));
        let text = String::from_utf8_lossy(&body);
        ensure!(
            !text.contains("not for you") && !text.contains("no-such-node"),
            "{path}: {text}"
        );
    }

    let mac = "52:54:00:e2:e0:04";
    let uuid = qemu::node_in_clean_wait(&d, "pxe-http", mac)?;
    let base = qemu::guest_controller_url();
    for path in [
        format!("/boot/ipxe/{uuid}"),
        "/boot/ipxe/pxe-http".to_string(),
        format!("/boot/ipxe?mac={mac}"),
        format!("/boot/ipxe?mac={}", mac.to_uppercase().replace(':', "-")),
    ] {
        let (s, body) = get(&path)?;
        let text = String::from_utf8_lossy(&body);
        ensure!(s == 200, "{path}: {s} {text}");
        ensure!(text.starts_with("#!ipxe\n"), "{path}: {text}");
        ensure!(
            text.contains(&format!("kernel {base}/boot/vmlinuz ")),
            "{path}: {text}"
        );
        ensure!(
            text.contains(&format!("rivet.controller={base} rivet.node={uuid}")),
            "{path}: {text}"
        );
        ensure!(
            text.contains(&format!("{base}/boot/rivet.initramfs")),
            "{path}: {text}"
        );
        ensure!(text.contains(qemu::TEST_KERNEL_ARGS), "{path}: {text}");
    }

    // A node that expects no ramdisk is sent to its next boot device.
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(json!({"driver": "fake-hardware", "deploy_interface": "direct", "name": "idle"})),
    )?;
    ensure!(s == 201, "{v}");
    let (s, body) = get("/boot/ipxe/idle")?;
    let text = String::from_utf8_lossy(&body);
    ensure!(
        s == 200 && text.contains("\nexit\n") && !text.contains("kernel "),
        "{text}"
    );
    Ok(())
}

/// Same inputs, same bytes: a second build of the ramdisk equals the shared one, and stays
/// under the 20 MiB budget.
#[test]
fn initramfs_build_is_reproducible_and_small() -> Result<()> {
    if !qemu::require() {
        return Ok(());
    }
    let art = qemu::shared_artefacts()?;
    let dir = tempfile::tempdir()?;
    let again = qemu::build_artefacts(dir.path(), false)?;
    let a = std::fs::read(&art.initramfs)?;
    let b = std::fs::read(&again.initramfs)?;
    ensure!(
        a == b,
        "two builds of the initramfs differ ({} vs {} bytes)",
        a.len(),
        b.len()
    );
    ensure!(
        art.initramfs_bytes < 20 * MIB,
        "initramfs is {} bytes; the budget is 20 MiB",
        art.initramfs_bytes
    );
    for m in [
        "virtio_blk",
        "virtio_net",
        "virtio_pci",
        "nvme",
        "ahci",
        "e1000e",
        "sd_mod",
    ] {
        ensure!(
            art.modules.iter().any(|x| x == m),
            "module {m} not shipped: {:?}",
            art.modules
        );
    }
    ensure!(std::fs::read(&art.vmlinuz)? == std::fs::read(&again.vmlinuz)?);
    ensure!(std::fs::read_to_string(&again.ipxe)?.starts_with("#!ipxe\n"));
    Ok(())
}
