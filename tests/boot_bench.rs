//! Boot benchmark (not a test): how big the ramdisk is and how long a real kernel takes from
//! its start to the agent's first heartbeat at rivetd, under QEMU (TCG always; KVM too when
//! the probe shows it works, or `RIVET_QEMU_KVM=1`).
//!
//! ```text
//! bash scripts/setup-qemu.sh && cargo build --workspace --bins
//! cargo run --release -p rivet-tests --example boot_bench -- [--runs N] [--boot kernel,iso,pxe]
//! ```
//!
//! "Kernel start" is when the kernel's first line ("Linux version …") reaches the serial log;
//! the test boots pass `earlycon=` so that line is written as the kernel starts, not replayed
//! when the real console driver registers. "init uptime" is the guest's own clock (printk) at
//! `Run /init`.

use anyhow::{bail, Context, Result};
use rivet_tests::qemu::{self, Accel, Boot, Config, Qemu};
use rivet_tests::Rivetd;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

struct Sample {
    kernel_at: f64,
    init_uptime: f64,
    agent_exec: f64,
    lookup: f64,
    heartbeat: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

fn node(d: &Rivetd, name: &str, mac: &str) -> Result<String> {
    let uuid = d.create_node_with_port(
        json!({"driver": "fake-hardware", "deploy_interface": "direct", "name": name}),
        mac,
    )?;
    for (verb, state) in [("manage", "manageable"), ("provide", "clean wait")] {
        d.call(
            "PUT",
            &format!("/v1/nodes/{uuid}/states/provision"),
            Some(json!({"target": verb})),
        )?;
        d.wait_node(&uuid, Duration::from_secs(20), |v| {
            v["provision_state"] == state
        })?;
    }
    Ok(uuid)
}

fn run_once(
    d: &Rivetd,
    art: &rivet_image_build::Report,
    boot: &str,
    accel: Accel,
    i: usize,
    work: &std::path::Path,
) -> Result<Sample> {
    let mac = format!("52:54:00:be:{:02x}:{:02x}", i / 256, i % 256);
    let uuid = node(d, &format!("bench-{boot}-{}-{i}", accel.as_str()), &mac)?;
    let disk = work.join(format!("disk-{i}.raw"));
    std::fs::File::create(&disk)?.set_len(16 << 20)?;
    let boot_cfg = match boot {
        "kernel" => Boot::Kernel {
            vmlinuz: art.vmlinuz.clone(),
            initramfs: art.initramfs.clone(),
            cmdline: qemu::test_cmdline(),
        },
        "iso" => Boot::Cdrom(art.iso.clone().context("no ISO built")?.0),
        "pxe" => Boot::Pxe(format!("{}/boot/ipxe/{uuid}", qemu::guest_controller_url())),
        other => bail!("unknown boot path {other}"),
    };
    let mut vm = Qemu::start(&Config {
        boot: boot_cfg,
        disks: vec![disk],
        mac,
        rivetd_port: d.port,
        memory_mib: 512,
        log_dir: work.join(format!("vm-{i}")),
        accel,
        image_port: None,
    })?;
    let deadline = Instant::now() + Duration::from_secs(300);
    let (mut lookup, mut heartbeat) = (None, None);
    while heartbeat.is_none() {
        if Instant::now() > deadline {
            bail!("no heartbeat in 300 s\n{}", vm.diagnostics(40));
        }
        if let Some(st) = vm.exited() {
            bail!("QEMU exited ({st})\n{}", vm.diagnostics(40));
        }
        let n: Value = d.node(&uuid)?;
        let now = vm.started.elapsed().as_secs_f64();
        let info = &n["driver_internal_info"];
        if lookup.is_none() && info.get("agent_version").is_some() {
            lookup = Some(now);
        }
        if info.get("agent_last_heartbeat").is_some() {
            lookup.get_or_insert(now);
            heartbeat = Some(now);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let text = vm.console_text();
    // Kernel start on the host clock: its first line, printed through the early console.
    let kernel_at = vm
        .line_time("Linux version")
        .map(|(t, _)| t.as_secs_f64())
        .unwrap_or(f64::NAN);
    let init_uptime = text
        .lines()
        .find(|l| l.contains("Run /init as init process"))
        .and_then(qemu::printk_time)
        .unwrap_or(f64::NAN);
    let agent_exec = vm
        .line_time("exec /usr/bin/rivet-agent")
        .map(|(t, _)| t.as_secs_f64())
        .unwrap_or(f64::NAN);
    vm.kill();
    Ok(Sample {
        kernel_at,
        init_uptime,
        agent_exec,
        lookup: lookup.unwrap_or(f64::NAN),
        heartbeat: heartbeat.unwrap_or(f64::NAN),
    })
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut runs = 3usize;
    let mut boots = vec!["kernel".to_string(), "iso".into(), "pxe".into()];
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--runs" => runs = it.next().context("--runs N")?.parse()?,
            "--boot" => {
                boots = it
                    .next()
                    .context("--boot kernel,iso,pxe")?
                    .split(',')
                    .map(str::to_string)
                    .collect()
            }
            other => bail!(
                "unknown argument {other}; usage: boot_bench [--runs N] [--boot kernel,iso,pxe]"
            ),
        }
    }
    let missing = qemu::missing_prerequisites();
    if !missing.is_empty() {
        bail!(
            "missing: {} (run scripts/setup-qemu.sh)",
            missing.join(", ")
        );
    }
    if !rivet_tests::bin("rivetd").exists() {
        bail!("rivetd not built: cargo build --workspace --bins");
    }

    let work = tempfile::tempdir()?;
    let t = Instant::now();
    let art = qemu::build_artefacts(
        &work.path().join("artefacts"),
        boots.iter().any(|b| b == "iso"),
    )?;
    println!(
        "image-build ({:.1} s, this binary's profile)",
        t.elapsed().as_secs_f64()
    );
    println!(
        "  initramfs: {} bytes gzip ({:.2} MiB), {:.2} MiB uncompressed, {} modules, kernel {}",
        art.initramfs_bytes,
        art.initramfs_bytes as f64 / 1048576.0,
        art.initramfs_cpio_bytes as f64 / 1048576.0,
        art.modules.len(),
        art.kernel_version
    );
    println!(
        "  vmlinuz: {} bytes",
        std::fs::metadata(&art.vmlinuz)?.len()
    );
    if let Some((iso, b)) = &art.iso {
        println!(
            "  iso: {} bytes (BIOS {}, UEFI {})",
            std::fs::metadata(iso)?.len(),
            b.bios,
            b.uefi
        );
    }

    let mut accels = vec![Accel::Tcg];
    if qemu::accel(&art.vmlinuz) == Accel::Kvm {
        accels.insert(0, Accel::Kvm);
    } else {
        println!("KVM: not usable here (probe failed or hung); TCG only");
    }

    let cfg = qemu::boot_config(work.path(), art.vmlinuz.parent().context("artefact dir")?)?;
    let cfg = cfg.display().to_string();
    let d = Rivetd::start(&work.path().join("rivet.db"), 0, &["--config", &cfg])?;
    println!();
    println!("times in seconds; 'kernel→' from the kernel's start (host clock), median of runs");
    println!(
        "{:<5} {:<7} {:>4} {:>12} {:>12} {:>14} {:>14} {:>16}",
        "accel",
        "boot",
        "runs",
        "qemu→kernel",
        "init uptime",
        "kernel→agent",
        "kernel→lookup",
        "kernel→heartbeat"
    );
    let mut i = 0;
    for accel in accels {
        for boot in &boots {
            let n = if boot == "kernel" { runs } else { 1 };
            let mut samples = Vec::new();
            for _ in 0..n {
                i += 1;
                samples.push(run_once(&d, &art, boot, accel, i, work.path())?);
            }
            let col = |f: &dyn Fn(&Sample) -> f64| median(samples.iter().map(f).collect());
            println!(
                "{:<5} {:<7} {:>4} {:>12.2} {:>12.2} {:>14.2} {:>14.2} {:>16.2}",
                accel.as_str(),
                boot,
                samples.len(),
                col(&|s| s.kernel_at),
                col(&|s| s.init_uptime),
                col(&|s| s.agent_exec - s.kernel_at),
                col(&|s| s.lookup - s.kernel_at),
                col(&|s| s.heartbeat - s.kernel_at),
            );
        }
    }
    Ok(())
}
