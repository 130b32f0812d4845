//! NVMe and SATA under QEMU: the real ramdisk (image-build, Debian kernel) boots with a
//! `-device nvme` namespace (sparse raw file, serial set), a SATA disk on an AHCI controller
//! (`ide-hd`) and a virtio disk, all holding non-zero data; rivetd's stored inventory must
//! list the NVMe namespace (model, serial, size, an `nvme` by-path) and the SATA disk, and
//! automated cleaning must erase the namespace with Format NVM (what QEMU 7.2's controller
//! advertises: OACS Format, no SANICAP) and the SATA disk by zeroing (QEMU's IDE emulation
//! has no ATA security feature set). The node history (raw API and `baremetal node history
//! list`) records which method each device got; every backing file reads back as zeroes.
//!
//! Bounded: one guest boot under TCG: the inventory ~15-20 s after QEMU starts, `available`
//! ~1-2 s later (the disks are 64 + 64 + 16 MiB); ~40 s for the test, plus the ramdisk build
//! (`qemu::shared_artefacts`, 1-2 min on a busy 2-core machine). Limits: 180 s for the
//! inventory, 300 s for cleaning; the durations are printed. Needs
//! scripts/setup-qemu.sh and `cargo build --workspace --bins`; skips locally without them,
//! fails in CI (RIVET_REQUIRE_PEERS=1).

use anyhow::{bail, ensure, Context, Result};
use rivet_tests::qemu::{self, Boot, Config, Drive, Qemu};
use rivet_tests::{clients, prerequisite, Rivetd};
use serde_json::Value;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const NVME_SERIAL: &str = "RIVETNVME01";
const SATA_SERIAL: &str = "RIVETSATA01";
const SATA_MODEL: &str = "RIVET-SATA-DISK";

fn ready() -> bool {
    if !qemu::require() {
        return false;
    }
    prerequisite(
        rivet_tests::bin("rivetd").exists(),
        "rivetd is not built: cargo build --workspace --bins",
    ) && clients::available()
}

/// A sparse file of `size_mib` MiB with 1 MiB of `byte` at every 8th MiB and in the last
/// MiB: non-zero data where an erase must reach, holes elsewhere (the file stays small).
fn sparse_with_data(path: &Path, size_mib: u64, byte: u8) -> Result<()> {
    let mut f = std::fs::File::create(path)?;
    f.set_len(size_mib * MIB)?;
    let chunk = vec![byte; MIB as usize];
    let mut at: Vec<u64> = (0..size_mib).step_by(8).collect();
    at.push(size_mib - 1);
    for mib in at {
        f.seek(SeekFrom::Start(mib * MIB))?;
        f.write_all(&chunk)?;
    }
    f.sync_all()?;
    let m = f.metadata()?;
    ensure!(
        m.blocks() * 512 < m.len(),
        "{} is not sparse ({} blocks for {} bytes)",
        path.display(),
        m.blocks(),
        m.len()
    );
    Ok(())
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The inventory disk called `name` (`/dev/X` or `X`).
fn disk<'a>(inv: &'a Value, name: &str) -> Result<&'a Value> {
    inv["inventory"]["disks"]
        .as_array()
        .context("inventory.disks")?
        .iter()
        .find(|d| d["name"].as_str().map(|n| n.trim_start_matches("/dev/")) == Some(name))
        .with_context(|| {
            format!(
                "no disk {name} in the inventory: {}",
                inv["inventory"]["disks"]
            )
        })
}

#[test]
fn nvme_namespace_and_sata_disk_inventoried_and_erased() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let art = qemu::shared_artefacts()?;
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start(&dir.path().join("rivet.db"), 0, &[])?;

    let nvme = dir.path().join("nvme.raw");
    let sata = dir.path().join("sata.raw");
    let virtio = dir.path().join("virtio.raw");
    sparse_with_data(&nvme, 64, 0x5A)?;
    sparse_with_data(&sata, 64, 0xC3)?;
    qemu::make_disk(&virtio, 16, &[("ext4", 0)])?;
    for f in [&nvme, &sata, &virtio] {
        ensure!(
            qemu::first_nonzero(f)?.is_some(),
            "{} is all zero",
            f.display()
        );
    }

    let mac = "52:54:00:e2:e0:31";
    let uuid = qemu::node_in_clean_wait(&d, "qemu-nvme", mac)?;

    let mut vm = Qemu::start_with(
        &Config {
            boot: Boot::Kernel {
                vmlinuz: art.vmlinuz.clone(),
                initramfs: art.initramfs.clone(),
                cmdline: qemu::test_cmdline(),
            },
            disks: vec![virtio.clone()],
            mac: mac.into(),
            rivetd_port: d.port,
            memory_mib: 512,
            log_dir: dir.path().join("vm"),
            accel: qemu::accel(&art.vmlinuz),
            image_port: None,
        },
        &[
            Drive::Nvme {
                file: nvme.clone(),
                serial: NVME_SERIAL.into(),
            },
            Drive::Sata {
                file: sata.clone(),
                serial: SATA_SERIAL.into(),
                model: SATA_MODEL.into(),
            },
        ],
    )?;

    // The inventory as rivetd stores it.
    let deadline = Instant::now() + Duration::from_secs(180);
    let inv = loop {
        let (s, v) = d.call("GET", &format!("/v1/nodes/{uuid}/inventory"), None)?;
        if s == 200 {
            break v;
        }
        if let Some(st) = vm.exited() {
            bail!(
                "QEMU exited ({st}) before the inventory\n{}",
                vm.diagnostics(60)
            );
        }
        if Instant::now() > deadline {
            bail!(
                "no inventory after 180 s ({s} {v})\n{}\n--- rivetd log tail:\n{}",
                vm.diagnostics(60),
                tail(&d.log_text(), 30)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let inventory_at = vm.started.elapsed();
    let n = disk(&inv, "nvme0n1")?;
    ensure!(
        n["model"].as_str().is_some_and(|m| m.contains("QEMU NVMe")),
        "NVMe model: {n}"
    );
    ensure!(n["serial"] == NVME_SERIAL, "NVMe serial: {n}");
    ensure!(n["size"] == 64 * MIB, "NVMe size: {n}");
    ensure!(
        n["by_path"]
            .as_str()
            .is_some_and(|p| p.starts_with("/dev/disk/by-path/pci-") && p.contains("-nvme-1")),
        "NVMe by_path: {n}"
    );
    let s = disk(&inv, "sda")?;
    ensure!(s["size"] == 64 * MIB, "SATA size: {s}");
    ensure!(s["serial"] == SATA_SERIAL, "SATA serial: {s}");
    ensure!(
        s["model"]
            .as_str()
            .is_some_and(|m| SATA_MODEL.starts_with(m) && !m.is_empty()),
        "SATA model: {s}"
    );
    ensure!(s["vendor"] == "ATA", "SATA vendor: {s}");
    ensure!(
        s["by_path"].as_str().is_some_and(|p| p.contains("-ata-")),
        "SATA by_path: {s}"
    );
    let v = disk(&inv, "vda")?;
    ensure!(v["size"] == 16 * MIB, "virtio disk: {v}");

    // Automated cleaning: metadata erase, then erase_devices.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let node = d.node(&uuid)?;
        let state = node["provision_state"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if state == "available" {
            break;
        }
        if state == "clean failed" || Instant::now() > deadline {
            bail!(
                "cleaning did not finish: node is {state:?}: {}\n{}\n--- rivetd log tail:\n{}",
                node["last_error"],
                vm.diagnostics(80),
                tail(&d.log_text(), 40)
            );
        }
        if let Some(st) = vm.exited() {
            bail!("QEMU exited ({st}) while cleaning\n{}", vm.diagnostics(60));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let cleaned_at = vm.started.elapsed();
    let console = vm.console_text();
    vm.kill();
    // The agent starts cleaning right after it sent the inventory: the two overlap.
    eprintln!(
        "qemu_nvme: inventory stored {inventory_at:.1?} after QEMU start, node available at \
         {cleaned_at:.1?}"
    );

    // The node history says which method each device got.
    let (st, h) = d.call(
        "GET",
        &format!("/v1/nodes/{uuid}/history?detail=true"),
        None,
    )?;
    ensure!(st == 200, "history: {st} {h}");
    let events: Vec<String> = h["history"]
        .as_array()
        .context("history list")?
        .iter()
        .filter_map(|e| e["event"].as_str().map(str::to_string))
        .collect();
    let report = events
        .iter()
        .find(|e| e.starts_with("clean step erase_devices erased:"))
        .with_context(|| format!("no erase_devices report in the history: {events:#?}"))?;
    eprintln!("qemu_nvme: {report}");
    let method_of = |dev: &str| -> Option<String> {
        report
            .split_once("erased: ")?
            .1
            .split("; ")
            .find_map(|p| p.strip_prefix(&format!("/dev/{dev}: ")))
            .map(str::to_string)
    };
    let nvme_method = method_of("nvme0n1").context("nvme0n1 missing from the report")?;
    ensure!(
        nvme_method.starts_with("nvme format"),
        "the NVMe namespace was not erased with Format NVM: {nvme_method:?}"
    );
    let sata_method = method_of("sda").context("sda missing from the report")?;
    ensure!(
        ["blkzeroout", "zero overwrite"].contains(&sata_method.as_str()),
        "the SATA disk did not take the zeroing path: {sata_method:?}"
    );
    ensure!(
        method_of("vda").is_some(),
        "vda missing from the report: {report}"
    );
    // What QEMU's controller advertised, as the agent logged it (OACS, SANICAP, FNA).
    let identify = console
        .lines()
        .find(|l| l.contains("NVMe Identify Controller"))
        .with_context(|| {
            format!(
                "no Identify Controller line on the console\n{}",
                tail(&console, 60)
            )
        })?;
    eprintln!("qemu_nvme: agent: {}", identify.trim());
    // QEMU's IDE disk has no ATA security feature set (IDENTIFY word 128 is 0), so the
    // agent must not have tried a security erase on it.
    let ata = console
        .lines()
        .find(|l| l.contains("ATA IDENTIFY DEVICE") && l.contains("/dev/sda"))
        .with_context(|| format!("no ATA IDENTIFY line for sda\n{}", tail(&console, 60)))?;
    eprintln!("qemu_nvme: agent: {}", ata.trim());
    ensure!(
        ata.contains("supported: false"),
        "QEMU's SATA disk claims the ATA security feature set: {ata}"
    );
    ensure!(
        console.contains("NvmeFormat"),
        "the agent's log on the console does not show the Format NVM plan\n{}",
        tail(&console, 40)
    );

    // The stock client shows the same entry (python-ironicclient's `node history list`).
    let rows = clients::baremetal_json(&d, &["node", "history", "list", "qemu-nvme", "--long"])?;
    let shown = rows
        .as_array()
        .context("history rows")?
        .iter()
        .any(|r| r["event"].as_str() == Some(report.as_str()) && r["event_type"] == "cleaning");
    ensure!(
        shown,
        "baremetal node history list lacks the erase report: {rows}"
    );

    for f in [&nvme, &sata, &virtio] {
        if let Some(off) = qemu::first_nonzero(f)? {
            bail!("{}: byte {off} is not zero after cleaning", f.display());
        }
    }
    Ok(())
}
