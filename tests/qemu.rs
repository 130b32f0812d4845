//! QEMU runner for the boot scenarios: a real Debian kernel and the ramdisk image-build makes,
//! booted directly (`-kernel/-initrd`), from the ISO (SeaBIOS, or OVMF for UEFI) or by
//! PXE → iPXE → rivetd, with raw-file virtio disks and user networking that reaches only
//! rivetd on loopback.
//!
//! Networking: `-netdev user,restrict=on` keeps the guest off every host and network; one
//! `guestfwd` maps `10.0.2.100:6385` in the guest to rivetd's loopback port through a
//! `socat - TCP:127.0.0.1:PORT` relay (the `-tcp:` form of guestfwd never delivers the close,
//! so HTTP would hang). The guest-side URL is fixed, so one ramdisk build serves every test.
//!
//! Acceleration: KVM when `RIVET_QEMU_KVM=1`, TCG when `=0`, else KVM only if a probe boot
//! (kernel to panic, 10 s limit) finishes under it — on nested VMs /dev/kvm exists but guests
//! hang.

use crate::{prerequisite, target_dir};
use anyhow::{bail, Context, Result};
use rivet_image_build as ib;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The controller's address as the guest sees it (forwarded to rivetd by guestfwd).
pub const GUEST_CONTROLLER_IP: &str = "10.0.2.100";
/// The controller's port as the guest sees it.
pub const GUEST_CONTROLLER_PORT: u16 = 6385;

/// `http://10.0.2.100:6385`.
pub fn guest_controller_url() -> String {
    format!("http://{GUEST_CONTROLLER_IP}:{GUEST_CONTROLLER_PORT}")
}

/// Kernel arguments of the test boots (before `rivet.controller=`): serial console only, so
/// everything lands in the log, and an early console so the kernel's first line reaches the
/// log when the kernel starts (the boot benchmark times from it).
pub const TEST_KERNEL_ARGS: &str =
    "earlycon=uart8250,io,0x3f8,115200n8 console=ttyS0,115200n8 rivet.log=info";

/// Where the guest finds the image server (forwarded by guestfwd to [`Config::image_port`]).
pub const GUEST_IMAGE_IP: &str = "10.0.2.101";

/// The URL of `file` on the image server as the guest sees it.
pub fn guest_image_url(file: &str) -> String {
    format!("http://{GUEST_IMAGE_IP}/{file}")
}

/// The full command line of a direct kernel boot.
pub fn test_cmdline() -> String {
    format!(
        "{TEST_KERNEL_ARGS} rivet.controller={}",
        guest_controller_url()
    )
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn which(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
                .any(|d| d.join(tool).is_file())
        })
        .unwrap_or(false)
}

/// The kernel package: `$RIVET_KERNEL_PACKAGE`, or the newest .deb in `$RIVET_KERNEL_CACHE`
/// or `target/kernel-cache/` (scripts/setup-qemu.sh fills it).
pub fn kernel_package() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("RIVET_KERNEL_PACKAGE") {
        return Some(PathBuf::from(p));
    }
    let cache = std::env::var_os("RIVET_KERNEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("kernel-cache"));
    ib::newest_kernel_package(&cache)
}

/// What is missing to boot a ramdisk under QEMU (empty: all there).
pub fn missing_prerequisites() -> Vec<String> {
    let mut missing: Vec<String> = [
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("socat", "socat"),
        ("sgdisk", "gdisk"),
        ("mkfs.ext4", "e2fsprogs"),
        ("mkswap", "util-linux"),
        ("blkid", "util-linux"),
        ("wipefs", "util-linux"),
        ("dpkg-deb", "dpkg"),
        ("musl-gcc", "musl-tools"),
    ]
    .iter()
    .filter(|(tool, _)| !which(tool))
    .map(|(tool, pkg)| format!("{tool} (Debian {pkg})"))
    .collect();
    match std::fs::read("/bin/busybox") {
        Ok(d) if ib::elf::needs_interpreter(&d) == Ok(false) => {}
        _ => missing.push("a static /bin/busybox (Debian busybox-static)".into()),
    }
    if kernel_package().is_none() {
        missing.push("a linux-image-*.deb in target/kernel-cache".into());
    }
    missing
}

/// Check the prerequisites: skip (return false) on a developer machine, fail in CI.
pub fn require() -> bool {
    let missing = missing_prerequisites();
    prerequisite(
        missing.is_empty(),
        &format!("QEMU boot tests need {}", missing.join(", ")),
    )
}

/// The kernel package extracted once into `target/kernel-cache/NAME.d` (dpkg-deb's xz
/// decompression of the whole package is ~85 s of CPU; every later build reuses the tree).
/// `NAME.lock` is held while extracting, the lock scripts/lab.sh takes too: a second test or
/// the lab waits for the first extraction instead of paying for its own.
pub fn extracted_kernel(deb: &Path) -> Result<PathBuf> {
    if deb.is_dir() {
        return Ok(deb.to_path_buf());
    }
    let name = deb
        .file_name()
        .context("kernel package path has no file name")?
        .to_string_lossy()
        .into_owned();
    let dir = deb.with_file_name(format!("{name}.d"));
    if dir.join("boot").is_dir() {
        return Ok(dir);
    }
    let lock_path = deb.with_file_name(format!("{name}.lock"));
    let lock = std::fs::File::create(&lock_path)
        .with_context(|| format!("creating {}", lock_path.display()))?;
    lock.lock()
        .with_context(|| format!("locking {}", lock_path.display()))?;
    if dir.join("boot").is_dir() {
        return Ok(dir);
    }
    let tmp = deb.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let st = Command::new("dpkg-deb")
        .arg("-x")
        .arg(deb)
        .arg(&tmp)
        .status()
        .context("running dpkg-deb")?;
    if !st.success() {
        bail!("dpkg-deb -x {} failed: {st}", deb.display());
    }
    match std::fs::rename(&tmp, &dir) {
        Ok(()) => {}
        // Another process won the race: use its tree.
        Err(_) if dir.join("boot").is_dir() => {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        Err(e) => return Err(e).context(format!("renaming into {}", dir.display())),
    }
    Ok(dir)
}

/// The static agent, built once per process by scripts/build-agent.sh (a no-op when fresh).
pub fn agent_binary() -> Result<PathBuf> {
    static AGENT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    AGENT
        .get_or_init(|| {
            ib::build_agent(&workspace_root().join("scripts/build-agent.sh"))
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(anyhow::Error::msg)
}

/// Build the artefacts for the test guests into `out` (ISO included when `iso`).
pub fn build_artefacts(out: &Path, iso: bool) -> Result<ib::Report> {
    let deb = kernel_package().context("no kernel package: run scripts/setup-qemu.sh")?;
    let kernel = extracted_kernel(&deb)?;
    let mut opts = ib::Options::new(out.to_path_buf(), kernel, agent_binary()?);
    opts.controller = guest_controller_url();
    opts.cmdline = TEST_KERNEL_ARGS.into();
    opts.iso = iso;
    Ok(ib::build(&opts)?)
}

/// The bootable whole-disk test image (image-build's `testimage`: syslinux and GRUB, the same kernel,
/// an init that prints the configdrive's uuid), built once per process into
/// `target/qemu-e2e/testimage.raw`.
pub fn test_image() -> Result<PathBuf> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let build = || -> Result<PathBuf> {
                let deb =
                    kernel_package().context("no kernel package: run scripts/setup-qemu.sh")?;
                let dir = extracted_kernel(&deb)?;
                let kernel = ib::KernelPackage::open(&dir, &target_dir())?;
                let out = target_dir().join("qemu-e2e/testimage.raw");
                std::fs::create_dir_all(target_dir().join("qemu-e2e"))?;
                // Removable: it boots under SeaBIOS or OVMF with no boot entry.
                Ok(ib::testimage::build(
                    &kernel,
                    Path::new("/bin/busybox"),
                    &out,
                    ib::testimage::EfiLayout::Removable,
                )?)
            };
            build().map_err(|e| format!("{e:#}"))
        })
        .clone()
        .map_err(anyhow::Error::msg)
}

/// Artefacts shared by the tests of one process: built once into `target/qemu-e2e/artefacts`.
pub fn shared_artefacts() -> Result<ib::Report> {
    static BUILT: OnceLock<Result<ib::Report, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let out = target_dir().join("qemu-e2e/artefacts");
            let t = Instant::now();
            let r = build_artefacts(&out, true).map_err(|e| format!("{e:#}"));
            if let Ok(r) = &r {
                eprintln!(
                    "qemu: built {} ({} bytes, {} modules) in {:.1?}",
                    r.initramfs.display(),
                    r.initramfs_bytes,
                    r.modules.len(),
                    t.elapsed()
                );
            }
            r
        })
        .clone()
        .map_err(anyhow::Error::msg)
}

/// How QEMU runs the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualisation.
    Kvm,
    /// Software emulation.
    Tcg,
}

impl Accel {
    /// `kvm` / `tcg`.
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// KVM if `RIVET_QEMU_KVM=1` or (unset and) the probe boots under it; TCG otherwise.
pub fn accel(vmlinuz: &Path) -> Accel {
    static PROBED: OnceLock<Accel> = OnceLock::new();
    match std::env::var("RIVET_QEMU_KVM").as_deref() {
        Ok("1") => return Accel::Kvm,
        Ok("0") => return Accel::Tcg,
        _ => {}
    }
    *PROBED.get_or_init(|| {
        let ok = kvm_probe(vmlinuz, Duration::from_secs(10));
        eprintln!(
            "qemu: KVM probe {}",
            if ok {
                "booted: using KVM"
            } else {
                "failed or hung: using TCG"
            }
        );
        if ok {
            Accel::Kvm
        } else {
            Accel::Tcg
        }
    })
}

/// Boot the kernel without a root file system under KVM: it must reach its panic (and QEMU
/// exit, `-no-reboot`) within `limit`.
pub fn kvm_probe(vmlinuz: &Path, limit: Duration) -> bool {
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        return false;
    }
    let Ok(dir) = tempfile::tempdir() else {
        return false;
    };
    let log = dir.path().join("probe.log");
    let Ok(mut child) = Command::new("qemu-system-x86_64")
        .args([
            "-nodefaults",
            "-display",
            "none",
            "-accel",
            "kvm",
            "-m",
            "256",
        ])
        .args(["-no-reboot", "-kernel"])
        .arg(vmlinuz)
        .args(["-append", "console=ttyS0 panic=-1"])
        .arg("-serial")
        .arg(format!("file:{}", log.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    else {
        return false;
    };
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            return text.contains("Kernel panic");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    false
}

/// How the guest boots.
#[derive(Debug, Clone)]
pub enum Boot {
    /// `-kernel/-initrd/-append`.
    Kernel {
        /// The kernel.
        vmlinuz: PathBuf,
        /// The ramdisk.
        initramfs: PathBuf,
        /// Kernel command line.
        cmdline: String,
    },
    /// `-cdrom` (SeaBIOS → GRUB from the ISO's BIOS El Torito image).
    Cdrom(PathBuf),
    /// The ISO on a q35 machine with OVMF firmware (UEFI → the ISO's EFI El Torito image).
    CdromUefi(PathBuf),
    /// The ISO on q35 + SMM with OVMF's Secure Boot build and Microsoft's keys enrolled:
    /// Secure Boot enforcing, as servers ship.
    CdromSecureBoot(PathBuf),
    /// Network boot: QEMU's iPXE option ROM fetches this URL (the DHCP boot file name).
    Pxe(String),
    /// SeaBIOS boots the first disk (a deployed instance), no kernel given.
    Disk,
    /// OVMF (q35, a fresh variable store) boots from the disks, no kernel given: with no boot
    /// entry of its own it finds a disk's removable-media loader (`\EFI\BOOT\BOOTX64.EFI`).
    DiskUefi,
}

/// One guest.
#[derive(Debug, Clone)]
pub struct Config {
    /// Boot path.
    pub boot: Boot,
    /// Raw disk images, attached as virtio disks in order (vda, vdb…).
    pub disks: Vec<PathBuf>,
    /// MAC of the virtio NIC.
    pub mac: String,
    /// rivetd's loopback port (the guest reaches it at 10.0.2.100:6385).
    pub rivetd_port: u16,
    /// Guest memory.
    pub memory_mib: u32,
    /// Directory for the console log and QEMU's own output.
    pub log_dir: PathBuf,
    /// Acceleration.
    pub accel: Accel,
    /// A loopback image server the guest reaches at `http://10.0.2.101/` (port 80).
    pub image_port: Option<u16>,
}

/// A drive beside the virtio disks of [`Config::disks`], for [`Qemu::start_with`].
#[derive(Debug, Clone)]
pub enum Drive {
    /// `-device nvme` with one namespace backed by a raw file.
    Nvme {
        /// Backing file.
        file: PathBuf,
        /// Controller serial (Identify Controller SN; sysfs `device/serial`).
        serial: String,
    },
    /// `-device ide-hd` on an AHCI controller (a SATA disk to libata) backed by a raw file.
    Sata {
        /// Backing file.
        file: PathBuf,
        /// Drive serial (IDENTIFY DEVICE words 10-19).
        serial: String,
        /// Drive model (IDENTIFY DEVICE words 27-46).
        model: String,
    },
}

impl Drive {
    /// QEMU arguments for drive number `i` (ids stay unique across drives).
    fn args(&self, i: usize) -> Vec<String> {
        match self {
            Drive::Nvme { file, serial } => vec![
                "-drive".into(),
                format!(
                    "file={},format=raw,if=none,id=xnvme{i},cache=writeback",
                    file.display()
                ),
                "-device".into(),
                format!("nvme,drive=xnvme{i},serial={serial}"),
            ],
            Drive::Sata {
                file,
                serial,
                model,
            } => vec![
                "-device".into(),
                format!("ahci,id=xahci{i}"),
                "-drive".into(),
                format!(
                    "file={},format=raw,if=none,id=xsata{i},cache=writeback",
                    file.display()
                ),
                "-device".into(),
                format!("ide-hd,drive=xsata{i},bus=xahci{i}.0,serial={serial},model={model}"),
            ],
        }
    }
}

/// OVMF's firmware code image (Debian `ovmf`), if installed.
pub fn ovmf_code() -> Option<PathBuf> {
    [
        "/usr/share/OVMF/OVMF_CODE_4M.fd",
        "/usr/share/OVMF/OVMF_CODE.fd",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.is_file() && p.with_file_name(ovmf_vars_name(p)).is_file())
}

/// OVMF's Secure Boot build and the variable store with Microsoft's keys enrolled (Debian
/// `ovmf`), if installed.
pub fn ovmf_secure_boot() -> Option<(PathBuf, PathBuf)> {
    let code = PathBuf::from("/usr/share/OVMF/OVMF_CODE_4M.secboot.fd");
    let vars = PathBuf::from("/usr/share/OVMF/OVMF_VARS_4M.ms.fd");
    (code.is_file() && vars.is_file()).then_some((code, vars))
}

/// The variable-store template that goes with a code image.
fn ovmf_vars_name(code: &Path) -> String {
    code.file_name()
        .map(|n| n.to_string_lossy().replace("_CODE", "_VARS"))
        .unwrap_or_default()
}

/// Console lines with the host time they arrived.
type Lines = Arc<Mutex<Vec<(Duration, String)>>>;

/// A running QEMU, killed on drop. A thread tails the serial log and timestamps each line.
pub struct Qemu {
    child: Option<Child>,
    /// Serial console log.
    pub console: PathBuf,
    /// QEMU's stderr.
    pub stderr: PathBuf,
    /// When QEMU was started.
    pub started: Instant,
    lines: Lines,
    stop: Arc<AtomicBool>,
    tail: Option<std::thread::JoinHandle<()>>,
}

impl Qemu {
    /// Start the guest.
    pub fn start(cfg: &Config) -> Result<Qemu> {
        Qemu::start_with(cfg, &[])
    }

    /// Start the guest with `drives` attached after the virtio disks (a separate argument
    /// rather than a `Config` field, so existing `Config { .. }` literals keep compiling).
    pub fn start_with(cfg: &Config, drives: &[Drive]) -> Result<Qemu> {
        std::fs::create_dir_all(&cfg.log_dir)?;
        let console = cfg.log_dir.join("console.log");
        let stderr = cfg.log_dir.join("qemu.stderr");
        std::fs::write(&console, b"")?;
        let mut cmd = Command::new("qemu-system-x86_64");
        cmd.args(["-nodefaults", "-display", "none", "-monitor", "none"])
            .args([
                "-accel",
                cfg.accel.as_str(),
                "-m",
                &cfg.memory_mib.to_string(),
            ])
            .args(["-smp", "1", "-no-reboot"])
            .arg("-serial")
            .arg(format!("file:{}", console.display()));
        let mut bootindex_nic = None;
        match &cfg.boot {
            Boot::Kernel {
                vmlinuz,
                initramfs,
                cmdline,
            } => {
                cmd.arg("-kernel")
                    .arg(vmlinuz)
                    .arg("-initrd")
                    .arg(initramfs)
                    .arg("-append")
                    .arg(cmdline);
            }
            Boot::Cdrom(iso) => {
                cmd.arg("-drive")
                    .arg(format!(
                        "file={},format=raw,media=cdrom,readonly=on,if=ide,index=2",
                        iso.display()
                    ))
                    .args(["-boot", "order=d"]);
            }
            Boot::DiskUefi => {
                let code = ovmf_code().context("no OVMF firmware: install Debian ovmf")?;
                let vars = cfg.log_dir.join("OVMF_VARS.fd");
                std::fs::copy(code.with_file_name(ovmf_vars_name(&code)), &vars)
                    .context("copying the OVMF variable store")?;
                cmd.args(["-machine", "q35"])
                    .arg("-drive")
                    .arg(format!(
                        "if=pflash,format=raw,readonly=on,file={}",
                        code.display()
                    ))
                    .arg("-drive")
                    .arg(format!("if=pflash,format=raw,file={}", vars.display()));
            }
            Boot::CdromUefi(iso) | Boot::CdromSecureBoot(iso) => {
                let secure = matches!(cfg.boot, Boot::CdromSecureBoot(_));
                let (code, template) = if secure {
                    let (c, v) = ovmf_secure_boot()
                        .context("no OVMF Secure Boot firmware: install Debian ovmf")?;
                    (c, v)
                } else {
                    let c = ovmf_code().context("no OVMF firmware: install Debian ovmf")?;
                    let v = c.with_file_name(ovmf_vars_name(&c));
                    (c, v)
                };
                let vars = cfg.log_dir.join("OVMF_VARS.fd");
                std::fs::copy(&template, &vars).context("copying the OVMF variable store")?;
                if secure {
                    // The Secure Boot build keeps its variables behind SMM.
                    cmd.args(["-machine", "q35,smm=on"])
                        .args(["-global", "driver=cfi.pflash01,property=secure,value=on"]);
                } else {
                    cmd.args(["-machine", "q35"]);
                }
                cmd.arg("-drive")
                    .arg(format!(
                        "if=pflash,format=raw,readonly=on,file={}",
                        code.display()
                    ))
                    .arg("-drive")
                    .arg(format!("if=pflash,format=raw,file={}", vars.display()))
                    .arg("-drive")
                    .arg(format!(
                        "file={},format=raw,media=cdrom,readonly=on,if=none,id=cd0",
                        iso.display()
                    ))
                    .args(["-device", "ide-cd,drive=cd0,bootindex=1"]);
            }
            Boot::Pxe(_) => bootindex_nic = Some(1),
            Boot::Disk => {
                cmd.args(["-boot", "order=c"]);
            }
        }
        for d in &cfg.disks {
            cmd.arg("-drive").arg(format!(
                "file={},format=raw,if=virtio,cache=writeback",
                d.display()
            ));
        }
        for (i, d) in drives.iter().enumerate() {
            cmd.args(d.args(i));
        }
        let mut netdev = format!(
            "user,id=n0,restrict=on,guestfwd=tcp:{GUEST_CONTROLLER_IP}:{GUEST_CONTROLLER_PORT}-cmd:socat - TCP:127.0.0.1:{}",
            cfg.rivetd_port
        );
        if let Boot::Pxe(url) = &cfg.boot {
            netdev.push_str(&format!(",bootfile={url}"));
        }
        if let Some(port) = cfg.image_port {
            netdev.push_str(&format!(
                ",guestfwd=tcp:{GUEST_IMAGE_IP}:80-cmd:socat - TCP:127.0.0.1:{port}"
            ));
        }
        let mut nic = format!("virtio-net-pci,netdev=n0,mac={}", cfg.mac);
        if let Some(i) = bootindex_nic {
            nic.push_str(&format!(",bootindex={i}"));
        } else {
            // No option ROM: a direct or CD boot must not try the network first.
            nic.push_str(",romfile=");
        }
        cmd.arg("-netdev").arg(netdev).arg("-device").arg(nic);
        let errf = std::fs::File::create(&stderr)?;
        let started = Instant::now();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(errf)
            .spawn()
            .context("spawning qemu-system-x86_64")?;
        let lines: Lines = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let tail = {
            let (path, lines, stop) = (console.clone(), lines.clone(), stop.clone());
            std::thread::spawn(move || tail_lines(&path, started, &lines, &stop))
        };
        Ok(Qemu {
            child: Some(child),
            console,
            stderr,
            started,
            lines,
            stop,
            tail: Some(tail),
        })
    }

    /// The console so far.
    pub fn console_text(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.console).unwrap_or_default()).into_owned()
    }

    /// The last `n` console lines, and QEMU's stderr, for failure messages.
    pub fn diagnostics(&self, n: usize) -> String {
        let text = self.console_text();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(n)..].join("\n");
        let err = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        format!(
            "--- console ({}), last {n} lines:\n{tail}\n--- qemu stderr:\n{err}",
            self.console.display()
        )
    }

    /// When (since QEMU started) the first console line containing `needle` arrived.
    pub fn line_time(&self, needle: &str) -> Option<(Duration, String)> {
        let lines = self.lines.lock().ok()?;
        lines.iter().find(|(_, l)| l.contains(needle)).cloned()
    }

    /// Wait for a console line containing `needle`.
    pub fn wait_console(&mut self, needle: &str, timeout: Duration) -> Result<Duration> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some((t, _)) = self.line_time(needle) {
                return Ok(t);
            }
            if let Some(st) = self.exited() {
                bail!(
                    "QEMU exited ({st}) before {needle:?}\n{}",
                    self.diagnostics(40)
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "no {needle:?} on the console in {timeout:?}\n{}",
                    self.diagnostics(40)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// QEMU's exit status if it has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Kill QEMU (and let the tail thread finish).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.tail.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        self.kill();
    }
}

fn tail_lines(path: &Path, started: Instant, lines: &Lines, stop: &AtomicBool) {
    let Ok(mut f) = std::fs::File::open(path) else {
        return;
    };
    let mut partial = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = f.read(&mut buf).unwrap_or(0);
        if n == 0 {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        let now = started.elapsed();
        partial.extend_from_slice(&buf[..n]);
        while let Some(i) = partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = partial.drain(..=i).collect();
            let text = String::from_utf8_lossy(&line).trim_end().to_string();
            if let Ok(mut l) = lines.lock() {
                l.push((now, text));
            }
        }
    }
}

/// The printk timestamp of a kernel console line (`[    2.699282] Run /init…` → 2.699282 s).
pub fn printk_time(line: &str) -> Option<f64> {
    let rest = line.trim_start().strip_prefix('[')?;
    let (t, _) = rest.split_once(']')?;
    t.trim().parse().ok()
}

/// A partition of a test disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// Byte offset in the image.
    pub offset: u64,
    /// Size in bytes.
    pub size: u64,
    /// What was made on it (`ext4`, `swap`).
    pub fs: String,
}

/// Byte every test disk is filled with before partitioning, so that "all zeroes" afterwards
/// proves the whole disk was written, not just that it was sparse.
pub const FILL: u8 = 0xA5;
/// A string written into a file on every ext4 test file system; it must be gone after erase.
pub const MARKER: &str = "RIVET-QEMU-SECRET-7d2f";

/// Make a raw disk image of `size_mib` MiB: filled with [`FILL`], a GPT, and one partition
/// per entry of `layout` (`("ext4", MiB)`, `("swap", MiB)`; size 0 = rest of the disk), each
/// with its file system (ext4 ones hold a file containing [`MARKER`]).
pub fn make_disk(path: &Path, size_mib: u64, layout: &[(&str, u64)]) -> Result<Vec<Partition>> {
    {
        let mut f = std::fs::File::create(path)?;
        let chunk = vec![FILL; 1 << 20];
        for _ in 0..size_mib {
            f.write_all(&chunk)?;
        }
        f.sync_all()?;
    }
    let mut sg = Command::new("sgdisk");
    sg.arg("-o");
    for (i, (fs, mib)) in layout.iter().enumerate() {
        let n = i + 1;
        let end = if *mib == 0 {
            "0".to_string()
        } else {
            format!("+{mib}M")
        };
        let code = if *fs == "swap" { "8200" } else { "8300" };
        sg.arg(format!("-n{n}:0:{end}"))
            .arg(format!("-t{n}:{code}"))
            .arg(format!("-c{n}:rivet-{n}"));
    }
    run(sg.arg(path))?;
    let mut parts = Vec::new();
    let scratch = tempfile::tempdir()?;
    let content = scratch.path().join("content");
    std::fs::create_dir_all(&content)?;
    std::fs::write(content.join("secret.txt"), format!("{MARKER}\n"))?;
    for (i, (fs, _)) in layout.iter().enumerate() {
        let info = run(Command::new("sgdisk").arg(format!("-i{}", i + 1)).arg(path))?;
        let sector = |key: &str| -> Result<u64> {
            info.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("sgdisk -i: no {key:?} in {info}"))
        };
        let (first, last) = (sector("First sector: ")?, sector("Last sector: ")?);
        let p = Partition {
            offset: first * 512,
            size: (last - first + 1) * 512,
            fs: fs.to_string(),
        };
        // Make the file system in a copy of the partition's bytes (keeps the fill in the
        // space it leaves alone), then put it back.
        let img = scratch.path().join(format!("p{}", i + 1));
        copy_range(path, p.offset, p.size, &img, 0)?;
        match *fs {
            "ext4" => run(Command::new("mkfs.ext4")
                .args(["-q", "-F", "-E", "nodiscard", "-L"])
                .arg(format!("rivet-{}", i + 1))
                .arg("-d")
                .arg(&content)
                .arg(&img))?,
            "swap" => run(Command::new("mkswap").arg("-L").arg("rivet-swap").arg(&img))?,
            other => bail!("make_disk: unknown file system {other}"),
        };
        copy_range(&img, 0, p.size, path, p.offset)?;
        parts.push(p);
    }
    Ok(parts)
}

fn copy_range(src: &Path, from: u64, len: u64, dst: &Path, to: u64) -> Result<()> {
    let mut s = std::fs::File::open(src)?;
    let mut d = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dst)?;
    s.seek(SeekFrom::Start(from))?;
    d.seek(SeekFrom::Start(to))?;
    let n = std::io::copy(&mut s.take(len), &mut d)?;
    if n != len {
        bail!("copied {n} of {len} bytes from {}", src.display());
    }
    d.sync_all()?;
    Ok(())
}

fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Signatures `blkid -p` finds at `offset` of an image (`TYPE="ext4"`, `PTTYPE="gpt"`…);
/// empty when there are none.
pub fn blkid_at(image: &Path, offset: u64) -> Result<String> {
    let out = Command::new("blkid")
        .args(["-p", "-o", "export", "-O"])
        .arg(offset.to_string())
        .arg(image)
        .output()?;
    // Exit status 2: nothing found.
    match out.status.code() {
        Some(0) => Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("TYPE=") || l.starts_with("PTTYPE="))
            .collect::<Vec<_>>()
            .join(" ")),
        Some(2) => Ok(String::new()),
        _ => bail!(
            "blkid -p -O {offset} {}: {}",
            image.display(),
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// What `wipefs` (no options: list only) reports for an image; empty when nothing.
pub fn wipefs_list(image: &Path) -> Result<String> {
    run(Command::new("wipefs").arg("--noheadings").arg(image)).map(|s| s.trim().to_string())
}

/// Offset of the first non-zero byte of a file, or None if it is all zeroes.
pub fn first_nonzero(path: &Path) -> Result<Option<u64>> {
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(None);
        }
        if let Some(i) = buf[..n].iter().position(|&b| b != 0) {
            return Ok(Some(pos + i as u64));
        }
        pos += n as u64;
    }
}

/// Whether `needle` occurs anywhere in the file.
pub fn file_contains(path: &Path, needle: &[u8]) -> Result<bool> {
    let data = std::fs::read(path)?;
    Ok(data.windows(needle.len()).any(|w| w == needle))
}

/// A `[boot]` config file for rivetd serving `artefact_dir`, with `public_url` as the guest
/// sees rivetd; returns the file's path.
pub fn boot_config(dir: &Path, artefact_dir: &Path) -> Result<PathBuf> {
    let path = dir.join("rivetd-boot.toml");
    std::fs::write(
        &path,
        format!(
            "[boot]\nartefact_dir = {:?}\npublic_url = {:?}\nkernel_append = {:?}\n",
            artefact_dir.display().to_string(),
            guest_controller_url(),
            TEST_KERNEL_ARGS
        ),
    )?;
    Ok(path)
}

/// A fake-hardware node with a port for `mac`, moved to "clean wait" (a ramdisk is expected;
/// the fake driver powers nothing, the test starts QEMU itself). Returns its UUID.
pub fn node_in_clean_wait(d: &crate::Rivetd, name: &str, mac: &str) -> Result<String> {
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(serde_json::json!({"driver": "fake-hardware", "deploy_interface": "direct", "name": name})),
    )?;
    anyhow::ensure!(s == 201, "create node: {s} {v}");
    let uuid = v["uuid"].as_str().context("node uuid")?.to_string();
    let (s, v) = d.call(
        "POST",
        "/v1/ports",
        Some(serde_json::json!({"node_uuid": uuid, "address": mac})),
    )?;
    anyhow::ensure!(s == 201, "create port: {s} {v}");
    for (verb, state) in [("manage", "manageable"), ("provide", "clean wait")] {
        let (s, v) = d.call(
            "PUT",
            &format!("/v1/nodes/{uuid}/states/provision"),
            Some(serde_json::json!({"target": verb})),
        )?;
        anyhow::ensure!(s == 202, "{verb}: {s} {v}");
        d.wait_node(&uuid, Duration::from_secs(20), |v| {
            v["provision_state"] == state
        })?;
    }
    Ok(uuid)
}

/// The last `n` lines of `s`.
pub fn last_lines(s: &str, n: usize) -> String {
    let l: Vec<&str> = s.lines().collect();
    l[l.len().saturating_sub(n)..].join("\n")
}

/// Wait up to `secs` until rivetd shows node `uuid` in provision state `want`. A `…failed`
/// state or the deadline is an error carrying the node's `last_error`, the guest's console
/// tail (when `vm` is given) and rivetd's log tail.
pub fn wait_state(
    d: &crate::Rivetd,
    uuid: &str,
    want: &str,
    secs: u64,
    vm: Option<&Qemu>,
) -> Result<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let n = d.node(uuid)?;
        let state = n["provision_state"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if state == want {
            return Ok(n);
        }
        if state.ends_with("failed") || Instant::now() > deadline {
            let diag = vm.map(|v| v.diagnostics(60)).unwrap_or_default();
            bail!(
                "node is {state:?}, not {want:?}: {}\n{diag}\n--- rivetd log:\n{}",
                n["last_error"],
                last_lines(&d.log_text(), 40)
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// `PUT /v1/nodes/{uuid}/states/provision` with `body`; anything but 202 is an error.
pub fn provision(d: &crate::Rivetd, uuid: &str, body: serde_json::Value) -> Result<()> {
    let (s, v) = d.call(
        "PUT",
        &format!("/v1/nodes/{uuid}/states/provision"),
        Some(body.clone()),
    )?;
    anyhow::ensure!(s == 202, "{body}: {s} {v}");
    Ok(())
}

/// The test image served to guests as `http://10.0.2.101/instance.raw`.
pub struct ServedImage {
    /// The loopback server (stops on drop).
    pub server: crate::fileserver::FileServer,
    /// Its port, for [`Config::image_port`].
    pub port: u16,
    /// sha256 of the file, hex.
    pub digest: String,
}

/// Copy `image` into `dir/www/instance.raw`, digest it and serve it.
pub fn serve_image(dir: &Path, image: &Path) -> Result<ServedImage> {
    let www = dir.join("www");
    std::fs::create_dir_all(&www)?;
    std::fs::copy(image, www.join("instance.raw"))?;
    let out = Command::new("sha256sum")
        .arg(www.join("instance.raw"))
        .output()?;
    let digest = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    anyhow::ensure!(digest.len() == 64, "sha256sum gave no digest");
    let server = crate::fileserver::FileServer::start(&www)?;
    let port: u16 = server
        .url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .context("image server port")?;
    Ok(ServedImage {
        server,
        port,
        digest,
    })
}
