//! rivet-image-build: turns a Debian kernel package, busybox-static and the static
//! `rivet-agent` into the artefacts a server boots: `vmlinuz`, `rivet.initramfs` (a
//! reproducible gzip-compressed newc cpio), `rivet.iso` (virtual media) and `boot.ipxe`.
//!
//! What it owns: the ramdisk's layout and `/init`, choosing and ordering kernel modules from
//! their `.modinfo`, the cpio writer, and driving `grub-mkrescue`. Everything in the ramdisk
//! is static except mdadm (software RAID), which comes with its loader and shared libraries. What it must not do: run
//! anything as root, touch the host's `/lib/modules` or devices, or need network access; and
//! it never embeds secrets (the agent token is handed out at lookup, not baked in).
//!
//! Reproducibility: the same inputs give a byte-identical initramfs (sorted entries, mtime 0,
//! uid/gid 0, inode numbers by position, a gzip header without time or name). The ISO is
//! made by external tools and is not promised byte-identical.

#![warn(missing_docs)]

pub mod cpio;
pub mod elf;
pub mod init;
pub mod ipxe;
pub mod iso;
pub mod modules;
pub mod testimage;

use cpio::{Archive, Content};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The artefact file names (kept stable: BMCs, rivetd and docs refer to them).
pub mod names {
    /// The kernel.
    pub const VMLINUZ: &str = "vmlinuz";
    /// The ramdisk.
    pub const INITRAMFS: &str = "rivet.initramfs";
    /// The virtual-media ISO.
    pub const ISO: &str = "rivet.iso";
    /// The iPXE script.
    pub const IPXE: &str = "boot.ipxe";
}

/// Controller URL used when none is given: a DNS name operators can point at rivetd.
pub const DEFAULT_CONTROLLER: &str = "http://rivet-controller:6385";

/// Kernel arguments every boot path gets: console on screen and on the first serial port
/// (the last `console=` is `/dev/console`, where `/init` and the agent log).
pub const DEFAULT_CONSOLE: &str = "console=tty0 console=ttyS0,115200n8";

/// Where [`default_mdadm`] looks for mdadm, first found wins: the binary scripts/setup-qemu.sh
/// unpacks from Debian's package (not installed: its postinst would start a monitor daemon
/// and scan the host's disks), then an installed one.
pub const MDADM_CANDIDATES: &[&str] = &[
    "/usr/local/lib/rivet/mdadm/mdadm",
    "/sbin/mdadm",
    "/usr/sbin/mdadm",
];

/// Where shared libraries are looked for, in order, on the build host; the ramdisk keeps
/// them at the same paths (glibc's loader searches these without an `ld.so.cache`).
pub const LIBRARY_DIRS: &[&str] = &[
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
];

/// The first of [`MDADM_CANDIDATES`] that exists, if any.
pub fn default_mdadm() -> Option<PathBuf> {
    MDADM_CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// Errors while building.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A file could not be read or written.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A tool could not be run or failed.
    #[error("{tool}: {message}")]
    Tool {
        /// The command.
        tool: String,
        /// What went wrong, with its output.
        message: String,
    },
    /// An input is unusable.
    #[error("{0}")]
    Input(String),
    /// Two ramdisk entries collide, or a path is bad.
    #[error(transparent)]
    Cpio(#[from] cpio::CpioError),
    /// Module discovery failed.
    #[error(transparent)]
    Modules(#[from] modules::ModuleError),
    /// The ISO could not be made.
    #[error(transparent)]
    Iso(#[from] iso::IsoError),
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BuildError {
    let path = path.to_path_buf();
    move |source| BuildError::Io { what, path, source }
}

/// A host file or directory copied into the ramdisk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extra {
    /// Host path (file, directory or symlink).
    pub src: PathBuf,
    /// Absolute path in the ramdisk.
    pub dest: String,
}

impl std::str::FromStr for Extra {
    type Err = String;
    /// `SRC:DEST`, DEST absolute. Split at the last `:` so SRC may contain one.
    fn from_str(s: &str) -> Result<Extra, String> {
        let (src, dest) = s
            .rsplit_once(':')
            .ok_or_else(|| format!("--extra {s:?}: expected SRC:DEST"))?;
        if src.is_empty() || !dest.starts_with('/') || dest == "/" {
            return Err(format!(
                "--extra {s:?}: expected SRC:DEST with DEST an absolute path in the ramdisk"
            ));
        }
        Ok(Extra {
            src: PathBuf::from(src),
            dest: dest.to_string(),
        })
    }
}

/// What to build.
#[derive(Debug, Clone)]
pub struct Options {
    /// Output directory (created if missing).
    pub out: PathBuf,
    /// A Debian `linux-image-*` .deb, or a directory it was extracted into.
    pub kernel_package: PathBuf,
    /// The static agent binary.
    pub agent: PathBuf,
    /// A static busybox (Debian `busybox-static`: `/bin/busybox`).
    pub busybox: PathBuf,
    /// Modules to ship (with their dependencies); missing ones are skipped.
    pub modules: Vec<String>,
    /// Exec plugins: every file of this directory goes to `/usr/lib/rivet/managers.d/`.
    pub plugins: Option<PathBuf>,
    /// More files for the ramdisk.
    pub extra: Vec<Extra>,
    /// `rivet.controller=` for the ISO and boot.ipxe (comma-separated list allowed).
    pub controller: String,
    /// Kernel arguments for the ISO and boot.ipxe, before the controller (console, log…).
    pub cmdline: String,
    /// Make the ISO (needs grub-mkrescue and xorriso).
    pub iso: bool,
    /// gzip level 0–9.
    pub compression: u32,
    /// mdadm, shipped at `/usr/sbin/mdadm` with its loader and shared libraries (software
    /// RAID). `None`: the ramdisk has no mdadm and the agent offers no software RAID steps.
    pub mdadm: Option<PathBuf>,
}

impl Options {
    /// Defaults for everything but the output, kernel package and agent.
    pub fn new(out: PathBuf, kernel_package: PathBuf, agent: PathBuf) -> Options {
        Options {
            out,
            kernel_package,
            agent,
            busybox: PathBuf::from("/bin/busybox"),
            modules: modules::DEFAULT_MODULES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            plugins: None,
            extra: Vec::new(),
            controller: DEFAULT_CONTROLLER.to_string(),
            cmdline: DEFAULT_CONSOLE.to_string(),
            iso: true,
            compression: 9,
            mdadm: default_mdadm(),
        }
    }

    /// The kernel command line the ISO and boot.ipxe carry.
    pub fn kernel_cmdline(&self) -> String {
        let mut s = self.cmdline.trim().to_string();
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str("rivet.controller=");
        s.push_str(&self.controller);
        s
    }

    /// The kernel command line of the ISO: the console arguments, then the per-node parameter
    /// region (see `rivet_protocol::bootparams`) holding `rivet.controller=`, which rivetd
    /// rewrites for each node it boots by virtual media.
    pub fn iso_cmdline(&self) -> Result<String, BuildError> {
        let region =
            rivet_protocol::bootparams::region(&format!("rivet.controller={}", self.controller))
                .map_err(|e| BuildError::Input(format!("--controller: {e}")))?;
        let mut s = self.cmdline.trim().to_string();
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(&region);
        Ok(s)
    }
}

/// What was built.
#[derive(Debug, Clone)]
pub struct Report {
    /// Kernel version of the package.
    pub kernel_version: String,
    /// Modules shipped, in load order.
    pub modules: Vec<String>,
    /// Wanted modules the package lacks.
    pub missing_modules: Vec<String>,
    /// Modules left out with the reason.
    pub skipped_modules: Vec<(String, String)>,
    /// Paths of the artefacts.
    pub vmlinuz: PathBuf,
    /// The ramdisk.
    pub initramfs: PathBuf,
    /// Its compressed size.
    pub initramfs_bytes: u64,
    /// Its uncompressed (cpio) size.
    pub initramfs_cpio_bytes: u64,
    /// The ISO, if made, and what it boots.
    pub iso: Option<(PathBuf, iso::IsoBoot)>,
    /// The iPXE script.
    pub ipxe: PathBuf,
    /// The mdadm shipped (host path), if any.
    pub mdadm: Option<PathBuf>,
    /// The loader and libraries shipped for it, as ramdisk paths.
    pub mdadm_libraries: Vec<String>,
}

/// An extracted kernel package (a temp dir removed on drop, or the caller's directory).
pub struct KernelPackage {
    _tmp: Option<tempfile::TempDir>,
    /// Root of the extracted tree.
    pub root: PathBuf,
    /// `boot/vmlinuz-VERSION`.
    pub vmlinuz: PathBuf,
    /// Its modules.
    pub modules: modules::ModuleTree,
}

impl KernelPackage {
    /// Extract a `.deb` with `dpkg-deb -x` into a temp dir under `scratch`, or use a directory
    /// as it is.
    pub fn open(package: &Path, scratch: &Path) -> Result<KernelPackage, BuildError> {
        let (tmp, root) = if package.is_dir() {
            (None, package.to_path_buf())
        } else {
            if !package.is_file() {
                return Err(BuildError::Input(format!(
                    "kernel package {} does not exist (scripts/setup-qemu.sh downloads one into \
                     target/kernel-cache/)",
                    package.display()
                )));
            }
            let tmp = tempfile::Builder::new()
                .prefix("kernel-")
                .tempdir_in(scratch)
                .map_err(io("creating a temp dir in", scratch))?;
            let out = Command::new("dpkg-deb")
                .arg("-x")
                .arg(package)
                .arg(tmp.path())
                .output()
                .map_err(|e| BuildError::Tool {
                    tool: "dpkg-deb".into(),
                    message: format!("cannot run it: {e}"),
                })?;
            if !out.status.success() {
                return Err(BuildError::Tool {
                    tool: format!("dpkg-deb -x {}", package.display()),
                    message: String::from_utf8_lossy(&out.stderr).into_owned(),
                });
            }
            let root = tmp.path().to_path_buf();
            (Some(tmp), root)
        };
        let modules = modules::ModuleTree::open(&root)?;
        let vmlinuz = root
            .join("boot")
            .join(format!("vmlinuz-{}", modules.version));
        if !vmlinuz.is_file() {
            return Err(BuildError::Input(format!(
                "{}: no boot/vmlinuz-{} in the kernel package",
                package.display(),
                modules.version
            )));
        }
        Ok(KernelPackage {
            _tmp: tmp,
            root,
            vmlinuz,
            modules,
        })
    }
}

/// Check that `path` is a static x86_64 executable (no dynamic loader needed).
pub fn check_static(path: &Path, what: &str) -> Result<(), BuildError> {
    let data = std::fs::read(path).map_err(io("reading", path))?;
    match elf::needs_interpreter(&data) {
        Ok(false) => Ok(()),
        Ok(true) => Err(BuildError::Input(format!(
            "{what} {} is dynamically linked; the ramdisk has no shared libraries for it{}",
            path.display(),
            if what == "busybox" {
                " (install busybox-static)"
            } else {
                " (build it with scripts/build-agent.sh)"
            }
        ))),
        Err(e) => Err(BuildError::Input(format!("{what} {}: {e}", path.display()))),
    }
}

/// A shared object a dynamically linked program needs: where it goes in the ramdisk (the
/// path the loader asks for) and what goes there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedObject {
    /// Absolute path in the ramdisk, the same as on the host.
    pub dest: String,
    /// The real file's content ([`Content::File`], host symlinks followed), or a
    /// [`Content::Symlink`] to another entry when two names lead to one host file (glibc's
    /// libraries name the loader, `ld-linux-x86-64.so.2`, which `PT_INTERP` already ships).
    pub content: Content,
}

/// The loader (`PT_INTERP`) and every shared library `exe` needs (`DT_NEEDED`, and theirs
/// in turn), found in `dirs` in order, loader first, then breadth first. A static `exe`
/// needs none. A library found nowhere is an error naming it and who needs it.
pub fn shared_objects(exe: &Path, dirs: &[&str]) -> Result<Vec<SharedObject>, BuildError> {
    let read = |path: &Path| -> Result<elf::Dynamic, BuildError> {
        let data = std::fs::read(path).map_err(io("reading", path))?;
        elf::dynamic(&data).map_err(|e| BuildError::Input(format!("{}: {e}", path.display())))
    };
    let top = read(exe)?;
    let mut out: Vec<SharedObject> = Vec::new();
    // Host file (canonical) → the ramdisk path it was shipped at first.
    let mut shipped: std::collections::BTreeMap<PathBuf, String> = Default::default();
    let mut queue: std::collections::VecDeque<(String, String)> = Default::default();
    let mut seen: std::collections::BTreeSet<String> = Default::default();
    // Ship `found` (a host path, also the ramdisk path) unless its file is there already.
    let mut ship =
        |found: &Path, out: &mut Vec<SharedObject>| -> Result<Option<PathBuf>, BuildError> {
            let real = std::fs::canonicalize(found).map_err(io("resolving", found))?;
            let dest = found.to_string_lossy().into_owned();
            match shipped.get(&real) {
                Some(first) if *first == dest => Ok(None),
                Some(first) => {
                    out.push(SharedObject {
                        dest,
                        content: Content::Symlink(first.clone()),
                    });
                    Ok(None)
                }
                None => {
                    shipped.insert(real.clone(), dest.clone());
                    out.push(SharedObject {
                        dest,
                        content: Content::File(real.clone()),
                    });
                    Ok(Some(real))
                }
            }
        };
    let who = exe.display().to_string();
    if let Some(interp) = &top.interpreter {
        let path = Path::new(interp);
        if !path.is_absolute() || !path.is_file() {
            return Err(BuildError::Input(format!(
                "{who} needs the dynamic loader {interp}, which is not on this host"
            )));
        }
        ship(path, &mut out)?;
    }
    queue.extend(top.needed.iter().map(|n| (n.clone(), who.clone())));
    while let Some((name, by)) = queue.pop_front() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let found = if name.contains('/') {
            Some(PathBuf::from(&name)).filter(|p| p.is_absolute() && p.is_file())
        } else {
            dirs.iter()
                .map(|d| Path::new(d).join(&name))
                .find(|p| p.is_file())
        };
        let Some(found) = found else {
            return Err(BuildError::Input(format!(
                "{by} needs the shared library {name}, which is in none of {}",
                dirs.join(", ")
            )));
        };
        if let Some(real) = ship(&found, &mut out)? {
            let by = found.display().to_string();
            queue.extend(read(&real)?.needed.into_iter().map(|n| (n, by.clone())));
        }
    }
    Ok(out)
}

/// Add mdadm at [`init::MDADM_PATH`] with its loader, its libraries and
/// [`init::MDADM_CONF`]; returns the loader's and libraries' ramdisk paths.
pub fn add_mdadm(a: &mut Archive, mdadm: &Path) -> Result<Vec<String>, BuildError> {
    if !mdadm.is_file() {
        return Err(BuildError::Input(format!(
            "--mdadm {}: no such file (scripts/setup-qemu.sh unpacks one to {})",
            mdadm.display(),
            MDADM_CANDIDATES[0]
        )));
    }
    let libs = shared_objects(mdadm, LIBRARY_DIRS)?;
    a.file(init::MDADM_PATH, 0o755, mdadm)?;
    for so in &libs {
        a.add(&so.dest, 0o755, so.content.clone())?;
    }
    a.bytes(init::MDADM_CONF, 0o644, init::mdadm_conf())?;
    Ok(libs.into_iter().map(|so| so.dest).collect())
}

/// busybox's applets as paths (`bin/sh`, `sbin/ip`…), from `busybox --list-full`.
pub fn busybox_applets(busybox: &Path) -> Result<Vec<String>, BuildError> {
    let out = Command::new(busybox)
        .arg("--list-full")
        .output()
        .map_err(|e| BuildError::Tool {
            tool: busybox.display().to_string(),
            message: format!("cannot run it: {e}"),
        })?;
    if !out.status.success() {
        return Err(BuildError::Tool {
            tool: format!("{} --list-full", busybox.display()),
            message: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let mut applets: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().trim_start_matches('/').to_string())
        .filter(|l| !l.is_empty() && l.contains('/'))
        .collect();
    applets.sort();
    applets.dedup();
    for needed in [
        "bin/sh",
        "sbin/insmod",
        "sbin/udhcpc",
        "sbin/ip",
        "bin/mount",
    ] {
        let name = needed.rsplit('/').next().unwrap_or(needed);
        if !applets.iter().any(|a| a.rsplit('/').next() == Some(name)) {
            return Err(BuildError::Input(format!(
                "{} has no {name} applet; /init needs it",
                busybox.display()
            )));
        }
    }
    Ok(applets)
}

/// Add a host file, directory tree or symlink at `dest`, keeping permission bits.
fn add_host_path(a: &mut Archive, src: &Path, dest: &str) -> Result<(), BuildError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::symlink_metadata(src).map_err(io("reading", src))?;
    let perm = meta.permissions().mode() & 0o7777;
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(src).map_err(io("reading link", src))?;
        a.symlink(dest, &target.to_string_lossy())?;
    } else if meta.is_dir() {
        a.dir(dest, perm)?;
        let mut names: Vec<_> = std::fs::read_dir(src)
            .map_err(io("listing", src))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(io("listing", src))?;
        names.sort();
        for n in names {
            let child = format!("{}/{}", dest.trim_end_matches('/'), n.to_string_lossy());
            add_host_path(a, &src.join(&n), &child)?;
        }
    } else if meta.is_file() {
        a.file(dest, perm, src)?;
    } else {
        return Err(BuildError::Input(format!(
            "{}: only files, directories and symlinks can go into the ramdisk",
            src.display()
        )));
    }
    Ok(())
}

/// Assemble the ramdisk's entries (no compression yet).
pub fn ramdisk(
    opts: &Options,
    kernel: &KernelPackage,
    selection: &modules::Selection,
) -> Result<Archive, BuildError> {
    let mut a = Archive::new();
    for d in [
        "bin", "sbin", "usr/bin", "usr/sbin", "etc", "root", "proc", "sys", "dev", "run", "mnt",
        "var",
    ] {
        a.dir(d, 0o755)?;
    }
    a.dir("root", 0o700)?;
    a.dir("tmp", 0o1777)?;
    a.dir("var/tmp", 0o1777)?;
    a.add("dev/console", 0o600, Content::CharDev(5, 1))?;
    a.add("dev/null", 0o666, Content::CharDev(1, 3))?;
    a.symlink("var/run", "/run")?;
    a.bytes("etc/passwd", 0o644, "root:x:0:0:root:/root:/bin/sh\n")?;
    a.bytes("etc/group", 0o644, "root:x:0:\n")?;
    a.bytes("etc/hostname", 0o644, "rivet-ramdisk\n")?;
    a.bytes(
        "etc/rivet-release",
        0o644,
        format!(
            "RIVET_RAMDISK=1\nKERNEL={}\nMODULES={}\n",
            kernel.modules.version,
            selection.order.len()
        ),
    )?;

    check_static(&opts.busybox, "busybox")?;
    a.file("bin/busybox", 0o755, &opts.busybox)?;
    for applet in busybox_applets(&opts.busybox)? {
        if applet == "bin/busybox" || applet == "linuxrc" {
            continue;
        }
        a.symlink(&applet, "/bin/busybox")?;
    }

    a.bytes("init", 0o755, init::init_script(&kernel.modules.version))?;
    a.bytes(init::DHCP_SCRIPT, 0o755, init::dhcp_script())?;

    check_static(&opts.agent, "agent")?;
    a.file(init::AGENT_PATH, 0o755, &opts.agent)?;

    let moddir = format!("lib/modules/{}", kernel.modules.version);
    let mut load = String::new();
    for m in &selection.order {
        a.file(&format!("{moddir}/{}", m.rel), 0o644, &m.path)?;
        load.push_str(&m.rel);
        load.push('\n');
    }
    a.bytes(&format!("{moddir}/{}", init::LOAD_LIST), 0o644, load)?;
    // UEFI-only modules (efivarfs): shipped, but loaded by /init only on a UEFI boot. Built
    // into the kernel, or missing, the list is just shorter.
    let uefi = kernel.modules.resolve(modules::UEFI_MODULES)?;
    let mut uefi_load = String::new();
    for m in &uefi.order {
        if !selection.order.iter().any(|s| s.rel == m.rel) {
            a.file(&format!("{moddir}/{}", m.rel), 0o644, &m.path)?;
        }
        uefi_load.push_str(&m.rel);
        uefi_load.push('\n');
    }
    a.bytes(
        &format!("{moddir}/{}", init::UEFI_LOAD_LIST),
        0o644,
        uefi_load,
    )?;

    a.dir(init::PLUGIN_DIR, 0o755)?;
    if let Some(dir) = &opts.plugins {
        if !dir.is_dir() {
            return Err(BuildError::Input(format!(
                "--plugins {}: not a directory",
                dir.display()
            )));
        }
        add_host_path(&mut a, dir, init::PLUGIN_DIR)?;
    }
    if let Some(mdadm) = &opts.mdadm {
        add_mdadm(&mut a, mdadm)?;
    }
    for e in &opts.extra {
        add_host_path(&mut a, &e.src, &e.dest)?;
    }
    Ok(a)
}

/// Write `a` gzip-compressed to `path`; returns (compressed, uncompressed) sizes.
pub fn write_initramfs(a: &Archive, path: &Path, level: u32) -> Result<(u64, u64), BuildError> {
    struct Count<W> {
        inner: W,
        n: u64,
    }
    impl<W: Write> Write for Count<W> {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let k = self.inner.write(b)?;
            self.n += k as u64;
            Ok(k)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            self.inner.flush()
        }
    }
    let f = std::fs::File::create(path).map_err(io("creating", path))?;
    // No file name and mtime 0 in the gzip header: reproducible.
    let gz = flate2::GzBuilder::new().mtime(0).write(
        std::io::BufWriter::new(f),
        flate2::Compression::new(level.min(9)),
    );
    let mut w = Count { inner: gz, n: 0 };
    a.write_to(&mut w).map_err(io("writing", path))?;
    let raw = w.n;
    let buf = w.inner.finish().map_err(io("writing", path))?;
    let f = buf.into_inner().map_err(|e| BuildError::Io {
        what: "writing",
        path: path.to_path_buf(),
        source: e.into_error(),
    })?;
    f.sync_all().map_err(io("writing", path))?;
    let size = f.metadata().map_err(io("reading", path))?.len();
    Ok((size, raw))
}

/// Build everything into `opts.out`. Each artefact is written to a temp name and renamed, so
/// a reader never sees half a file.
pub fn build(opts: &Options) -> Result<Report, BuildError> {
    std::fs::create_dir_all(&opts.out).map_err(io("creating", &opts.out))?;
    let scratch = tempfile::Builder::new()
        .prefix(".image-build-")
        .tempdir_in(&opts.out)
        .map_err(io("creating a temp dir in", &opts.out))?;
    let kernel = KernelPackage::open(&opts.kernel_package, scratch.path())?;
    let selection = kernel.modules.resolve(&opts.modules)?;
    let archive = ramdisk(opts, &kernel, &selection)?;
    let mdadm_libraries = match &opts.mdadm {
        Some(m) => shared_objects(m, LIBRARY_DIRS)?
            .into_iter()
            .map(|so| so.dest)
            .collect(),
        None => Vec::new(),
    };

    let tmp_initrd = scratch.path().join(names::INITRAMFS);
    let (initramfs_bytes, initramfs_cpio_bytes) =
        write_initramfs(&archive, &tmp_initrd, opts.compression)?;
    let tmp_kernel = scratch.path().join(names::VMLINUZ);
    std::fs::copy(&kernel.vmlinuz, &tmp_kernel).map_err(io("copying", &kernel.vmlinuz))?;

    let cmdline = opts.kernel_cmdline();
    let iso = if opts.iso {
        let tmp_iso = scratch.path().join(names::ISO);
        let stage = scratch.path().join("iso-stage");
        std::fs::create_dir_all(&stage).map_err(io("creating", &stage))?;
        let boot = iso::make_iso(
            &tmp_kernel,
            &tmp_initrd,
            &opts.iso_cmdline()?,
            &stage,
            &tmp_iso,
        )?;
        Some((tmp_iso, boot))
    } else {
        None
    };
    let tmp_ipxe = scratch.path().join(names::IPXE);
    std::fs::write(
        &tmp_ipxe,
        ipxe::script(names::VMLINUZ, names::INITRAMFS, &cmdline),
    )
    .map_err(io("writing", &tmp_ipxe))?;

    let place = |tmp: &Path, name: &str| -> Result<PathBuf, BuildError> {
        let dest = opts.out.join(name);
        std::fs::rename(tmp, &dest).map_err(io("renaming into", &dest))?;
        Ok(dest)
    };
    let vmlinuz = place(&tmp_kernel, names::VMLINUZ)?;
    let initramfs = place(&tmp_initrd, names::INITRAMFS)?;
    let ipxe_path = place(&tmp_ipxe, names::IPXE)?;
    let iso = match iso {
        Some((tmp, boot)) => Some((place(&tmp, names::ISO)?, boot)),
        None => {
            // A stale ISO from an earlier build would not match the new ramdisk.
            let _ = std::fs::remove_file(opts.out.join(names::ISO));
            None
        }
    };
    Ok(Report {
        kernel_version: kernel.modules.version.clone(),
        modules: selection.order.iter().map(|m| m.name.clone()).collect(),
        missing_modules: selection.missing,
        skipped_modules: selection.skipped,
        vmlinuz,
        initramfs,
        initramfs_bytes,
        initramfs_cpio_bytes,
        iso,
        ipxe: ipxe_path,
        mdadm: opts.mdadm.clone(),
        mdadm_libraries,
    })
}

/// Run `scripts/build-agent.sh` (profile `agent`, static musl) and return the binary's path
/// (the script prints it last on stdout).
pub fn build_agent(script: &Path) -> Result<PathBuf, BuildError> {
    let out = Command::new("bash")
        .arg(script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| BuildError::Tool {
            tool: script.display().to_string(),
            message: format!("cannot run it: {e}"),
        })?;
    if !out.status.success() {
        return Err(BuildError::Tool {
            tool: script.display().to_string(),
            message: format!("failed ({})", out.status),
        });
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| PathBuf::from(l.trim()))
        .ok_or_else(|| BuildError::Tool {
            tool: script.display().to_string(),
            message: "printed no binary path".into(),
        })?;
    if !path.is_file() {
        return Err(BuildError::Tool {
            tool: script.display().to_string(),
            message: format!("printed {}, which does not exist", path.display()),
        });
    }
    Ok(path)
}

/// The newest `linux-image-*.deb` in `dir` (by version-aware name order), if any.
pub fn newest_kernel_package(dir: &Path) -> Option<PathBuf> {
    let mut debs: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with("linux-image-") && n.ends_with(".deb")
            })
        })
        .collect();
    debs.sort_by(|a, b| version_cmp(&a.to_string_lossy(), &b.to_string_lossy()));
    debs.pop()
}

/// Compare strings treating digit runs as numbers (`6.1.0-9` < `6.1.0-26`).
pub fn version_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn chunks(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let (ca, cb) = (chunks(a), chunks(b));
    for (x, y) in ca.iter().zip(&cb) {
        let o = if x.0 && y.0 {
            let (xt, yt) = (x.1.trim_start_matches('0'), y.1.trim_start_matches('0'));
            xt.len().cmp(&yt.len()).then_with(|| xt.cmp(yt))
        } else {
            x.1.cmp(y.1)
        };
        if o != std::cmp::Ordering::Equal {
            return o;
        }
    }
    ca.len().cmp(&cb.len())
}

/// Whether a test may run; prints why not. With `RIVET_REQUIRE_PEERS=1` (CI) a missing
/// prerequisite is a failure, so CI can never go green by skipping (the workspace tests'
/// `harness::prerequisite` convention).
#[cfg(test)]
pub(crate) fn prerequisite(ok: bool, what: &str) -> bool {
    if ok {
        return true;
    }
    if std::env::var("RIVET_REQUIRE_PEERS").as_deref() == Ok("1") {
        panic!("missing prerequisite: {what} (RIVET_REQUIRE_PEERS=1; run scripts/setup.sh)");
    }
    eprintln!("skipping: {what} (run scripts/setup.sh to install it)");
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_parses() {
        let e: Extra = "/host/a:b:/etc/x".parse().expect("parse");
        assert_eq!(e.src, PathBuf::from("/host/a:b"));
        assert_eq!(e.dest, "/etc/x");
        assert!("nocolon".parse::<Extra>().is_err());
        assert!("a:relative".parse::<Extra>().is_err());
        assert!("a:/".parse::<Extra>().is_err());
    }

    #[test]
    fn versions_sort_numerically() {
        let mut v = [
            "linux-image-6.1.0-26-amd64_6.1.112-1_amd64.deb",
            "linux-image-6.1.0-9-amd64_6.1.27-1_amd64.deb",
            "linux-image-6.1.0-56-amd64_6.1.192-2_amd64.deb",
        ];
        v.sort_by(|a, b| version_cmp(a, b));
        assert_eq!(v[2], "linux-image-6.1.0-56-amd64_6.1.192-2_amd64.deb");
        assert_eq!(v[0], "linux-image-6.1.0-9-amd64_6.1.27-1_amd64.deb");
    }

    /// Read back a gzip newc archive: (path, mode, data) per entry.
    fn unpack(path: &Path) -> Vec<(String, u32, Vec<u8>)> {
        use std::io::Read;
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(std::fs::File::open(path).expect("open"))
            .read_to_end(&mut raw)
            .expect("gunzip");
        let mut out = Vec::new();
        let mut pos = 0;
        loop {
            let h = std::str::from_utf8(&raw[pos..pos + 110]).expect("header");
            let f = |i: usize| u32::from_str_radix(&h[6 + i * 8..14 + i * 8], 16).expect("hex");
            let (mode, size, namesize) = (f(1), f(6) as usize, f(11) as usize);
            let name =
                String::from_utf8_lossy(&raw[pos + 110..pos + 110 + namesize - 1]).into_owned();
            let data_at = (pos + 110 + namesize).div_ceil(4) * 4;
            let data = raw[data_at..data_at + size].to_vec();
            pos = (data_at + size).div_ceil(4) * 4;
            if name == "TRAILER!!!" {
                return out;
            }
            out.push((name, mode, data));
        }
    }

    /// A static busybox, when the host has one (Debian busybox-static).
    fn static_busybox() -> Option<&'static Path> {
        let busybox = Path::new("/bin/busybox");
        let usable = std::fs::read(busybox).is_ok_and(|d| elf::needs_interpreter(&d) == Ok(false));
        if !usable {
            eprintln!("skipping: no static /bin/busybox (Debian busybox-static)");
        }
        usable.then_some(busybox)
    }

    /// A fake kernel package under `dir`: boot/vmlinuz-6.1.0-t-amd64, three virtio modules and
    /// efivarfs.
    fn fake_kernel(dir: &Path) -> PathBuf {
        let pkg = dir.join("pkg");
        let kdir = pkg.join("lib/modules/6.1.0-t-amd64/kernel/drivers");
        std::fs::create_dir_all(&kdir).expect("mkdir");
        std::fs::create_dir_all(pkg.join("boot")).expect("mkdir");
        std::fs::write(pkg.join("boot/vmlinuz-6.1.0-t-amd64"), b"kernel").expect("write");
        for (m, deps) in [
            ("virtio_ring", ""),
            ("virtio", "virtio_ring"),
            ("virtio_blk", "virtio,virtio_ring"),
            ("efivarfs", ""),
        ] {
            std::fs::write(
                kdir.join(format!("{m}.ko")),
                elf::tests::fake_module(&format!("depends={deps};name={m}")),
            )
            .expect("write");
        }
        pkg
    }

    /// Build a ramdisk from the fake kernel with `mdadm` and check that it holds mdadm, its
    /// loader and every library at the host's paths with the real files' bytes, and the conf.
    fn check_ramdisk_ships(mdadm: &Path) {
        let Some(busybox) = static_busybox() else {
            return;
        };
        let tmp = tempfile::tempdir().expect("tempdir");
        let pkg = fake_kernel(tmp.path());
        // busybox stands in for the (static) agent.
        let mut o = Options::new(tmp.path().join("out"), pkg, busybox.to_path_buf());
        o.iso = false;
        o.modules = vec!["virtio_blk".into()];
        o.mdadm = Some(mdadm.to_path_buf());
        let r = build(&o).expect("build");
        assert_eq!(r.mdadm.as_deref(), Some(mdadm));
        let entries = unpack(&r.initramfs);
        let get = |p: &str| {
            entries
                .iter()
                .find(|e| e.0 == p)
                .unwrap_or_else(|| panic!("{p} missing"))
        };
        let bin = get("usr/sbin/mdadm");
        assert_eq!(bin.1, 0o100755);
        assert_eq!(bin.2, std::fs::read(mdadm).expect("read"));
        let info = elf::dynamic(&bin.2).expect("elf");
        let interp = info.interpreter.expect("dynamically linked");
        assert_eq!(r.mdadm_libraries[0], interp, "the loader first");
        let loader = get(interp.trim_start_matches('/'));
        assert_eq!(loader.1, 0o100755, "{interp} is the real file, not a link");
        assert_eq!(loader.2, std::fs::read(&interp).expect("read loader"));
        // Every library anything shipped needs is there, found the way the loader looks.
        let mut todo = info.needed.clone();
        let mut done = std::collections::BTreeSet::new();
        while let Some(name) = todo.pop() {
            if !done.insert(name.clone()) {
                continue;
            }
            let path = LIBRARY_DIRS
                .iter()
                .map(|d| format!("{d}/{name}"))
                .find(|p| entries.iter().any(|e| e.0 == p.trim_start_matches('/')))
                .unwrap_or_else(|| panic!("{name} is in none of {LIBRARY_DIRS:?} in the ramdisk"));
            assert!(r.mdadm_libraries.contains(&path), "{path}");
            let e = get(path.trim_start_matches('/'));
            let bytes = if e.1 & 0o170000 == 0o120000 {
                // Only a second name for a file shipped under another path.
                let target = String::from_utf8_lossy(&e.2).into_owned();
                get(target.trim_start_matches('/')).2.clone()
            } else {
                e.2.clone()
            };
            assert_eq!(bytes, std::fs::read(&path).expect("host file"), "{path}");
            todo.extend(elf::dynamic(&bytes).expect("library").needed);
        }
        let conf = String::from_utf8_lossy(&get("etc/mdadm/mdadm.conf").2).into_owned();
        assert!(conf.contains("\nHOMEHOST <ignore> any\n"), "{conf}");
        let init = String::from_utf8_lossy(&get("init").2).into_owned();
        assert!(init.contains("/usr/sbin/mdadm --assemble --scan --run"));
    }

    #[test]
    fn ramdisk_ships_a_dynamic_program_with_its_libraries() {
        // /bin/ls (dynamic, glibc) stands in for mdadm: the same machinery on any host.
        if Path::new("/bin/ls").is_file() {
            check_ramdisk_ships(Path::new("/bin/ls"));
        }
    }

    #[test]
    fn ramdisk_ships_mdadm_with_its_libraries() {
        let found = default_mdadm();
        if !prerequisite(
            found.is_some(),
            "mdadm (scripts/setup-qemu.sh unpacks Debian's to /usr/local/lib/rivet/mdadm/mdadm)",
        ) {
            return;
        }
        let mdadm = found.expect("checked");
        let info = elf::dynamic(&std::fs::read(&mdadm).expect("read")).expect("elf");
        // Debian 12's mdadm 4.2: libudev and glibc.
        if info.interpreter.is_some() {
            assert!(info.needed.iter().any(|n| n == "libc.so.6"), "{info:?}");
            let libs = shared_objects(&mdadm, LIBRARY_DIRS).expect("libraries");
            for want in ["libudev.so.1", "libc.so.6"] {
                if info.needed.iter().any(|n| n == want) {
                    assert!(
                        libs.iter().any(|so| so.dest.ends_with(&format!("/{want}"))),
                        "{want}: {libs:?}"
                    );
                }
            }
        }
        check_ramdisk_ships(&mdadm);
    }

    #[test]
    fn shared_objects_follows_needed_and_links_and_names_what_is_missing() {
        use std::os::unix::fs::symlink;
        let tmp = tempfile::tempdir().expect("tempdir");
        let d = |p: &str| tmp.path().join(p);
        for dir in ["lib", "lib64", "usr"] {
            std::fs::create_dir_all(d(dir)).expect("mkdir");
        }
        // The loader lives in lib/ and is reached through lib64/, like Debian's.
        std::fs::write(
            d("lib/ld.so.2"),
            elf::tests::fake_dynamic(None, &[], Some("ld.so.2")),
        )
        .expect("write");
        symlink(d("lib/ld.so.2"), d("lib64/ld.so.2")).expect("symlink");
        let interp = d("lib64/ld.so.2").display().to_string();
        // liba.so.1 -> liba.so.1.2.3 needs libb (found in the second directory) and the
        // loader by its soname, as glibc's libraries do.
        std::fs::write(
            d("lib/liba.so.1.2.3"),
            elf::tests::fake_dynamic(None, &["libb.so.2", "ld.so.2"], Some("liba.so.1")),
        )
        .expect("write");
        symlink("liba.so.1.2.3", d("lib/liba.so.1")).expect("symlink");
        std::fs::write(
            d("usr/libb.so.2"),
            elf::tests::fake_dynamic(None, &["liba.so.1"], None),
        )
        .expect("write");
        std::fs::write(
            d("exe"),
            elf::tests::fake_dynamic(Some(&interp), &["liba.so.1", "libb.so.2"], None),
        )
        .expect("write");
        let lib = d("lib").display().to_string();
        let usr = d("usr").display().to_string();
        let dirs = [lib.as_str(), usr.as_str()];
        let got = shared_objects(&d("exe"), &dirs).expect("resolve");
        let real = |p: &str| Content::File(std::fs::canonicalize(d(p)).expect("canonical"));
        assert_eq!(
            got,
            vec![
                SharedObject {
                    dest: interp.clone(),
                    content: real("lib/ld.so.2"),
                },
                SharedObject {
                    dest: format!("{lib}/liba.so.1"),
                    content: real("lib/liba.so.1.2.3"),
                },
                SharedObject {
                    dest: format!("{usr}/libb.so.2"),
                    content: real("usr/libb.so.2"),
                },
                SharedObject {
                    dest: format!("{lib}/ld.so.2"),
                    content: Content::Symlink(interp.clone()),
                },
            ]
        );
        // A static program needs nothing.
        assert_eq!(
            shared_objects(&d("lib/ld.so.2"), &dirs).expect("static"),
            Vec::new()
        );
        // A library found nowhere is named, with who needs it.
        std::fs::write(
            d("exe2"),
            elf::tests::fake_dynamic(Some(&interp), &["liba.so.1", "libgone.so.7"], None),
        )
        .expect("write");
        let err = shared_objects(&d("exe2"), &dirs)
            .expect_err("missing")
            .to_string();
        assert!(
            err.contains("needs the shared library libgone.so.7"),
            "{err}"
        );
        assert!(err.contains("exe2"), "{err}");
        // So is a loader the host lacks.
        std::fs::write(
            d("exe3"),
            elf::tests::fake_dynamic(Some("/nonexistent/ld.so"), &[], None),
        )
        .expect("write");
        let err = shared_objects(&d("exe3"), &dirs)
            .expect_err("no loader")
            .to_string();
        assert!(err.contains("/nonexistent/ld.so"), "{err}");
        // And building with a --mdadm that is not there is an error, not a silent omission.
        let err = add_mdadm(&mut Archive::new(), &d("nope")).expect_err("absent");
        assert!(err.to_string().contains("--mdadm"), "{err}");
    }

    #[test]
    fn builds_a_reproducible_ramdisk_with_plugins_and_extras() {
        use std::os::unix::fs::PermissionsExt;
        let Some(busybox) = static_busybox() else {
            return;
        };
        let tmp = tempfile::tempdir().expect("tempdir");
        let pkg = fake_kernel(tmp.path());
        let plugins = tmp.path().join("plugins");
        std::fs::create_dir_all(&plugins).expect("mkdir");
        std::fs::write(plugins.join("vendor-x"), b"#!/bin/sh\necho {}\n").expect("write");
        std::fs::set_permissions(
            plugins.join("vendor-x"),
            std::fs::Permissions::from_mode(0o755),
        )
        .expect("chmod");
        let extra = tmp.path().join("motd");
        std::fs::write(&extra, b"hello\n").expect("write");

        let build_into = |name: &str| {
            // busybox stands in for the (static) agent.
            let mut o = Options::new(tmp.path().join(name), pkg.clone(), busybox.to_path_buf());
            o.iso = false;
            o.plugins = Some(plugins.clone());
            o.extra = vec![format!("{}:/etc/motd", extra.display())
                .parse()
                .expect("extra")];
            o.modules = vec!["virtio_blk".into(), "nvme".into()];
            o.controller = "http://c:6385".into();
            o.mdadm = None;
            build(&o).expect("build")
        };
        let a = build_into("a");
        let b = build_into("b");
        assert_eq!(
            std::fs::read(&a.initramfs).expect("read"),
            std::fs::read(&b.initramfs).expect("read"),
            "same inputs, same bytes"
        );
        assert_eq!(a.modules, ["virtio_ring", "virtio", "virtio_blk"]);
        assert_eq!(a.missing_modules, ["nvme"]);
        assert!(a.iso.is_none());
        assert_eq!(std::fs::read(&a.vmlinuz).expect("read"), b"kernel");
        let ipxe = std::fs::read_to_string(&a.ipxe).expect("read");
        assert!(
            ipxe.contains("kernel vmlinuz initrd=rivet.initramfs"),
            "{ipxe}"
        );
        assert!(ipxe.contains("rivet.controller=http://c:6385\n"), "{ipxe}");

        let entries = unpack(&a.initramfs);
        let get = |p: &str| {
            entries
                .iter()
                .find(|e| e.0 == p)
                .unwrap_or_else(|| panic!("{p} missing"))
        };
        assert_eq!(get("init").1, 0o100755);
        assert!(String::from_utf8_lossy(&get("init").2).contains("exec /usr/bin/rivet-agent run"));
        assert_eq!(get("usr/bin/rivet-agent").1, 0o100755);
        assert_eq!(get("bin/sh").1 & 0o170000, 0o120000);
        assert_eq!(get("bin/sh").2, b"/bin/busybox");
        assert_eq!(get("dev/console").1, 0o020600);
        assert_eq!(get("usr/lib/rivet/managers.d/vendor-x").1, 0o100755);
        assert_eq!(get("etc/motd").2, b"hello\n");
        assert_eq!(
            String::from_utf8_lossy(&get("lib/modules/6.1.0-t-amd64/rivet.load").2),
            "kernel/drivers/virtio_ring.ko\nkernel/drivers/virtio.ko\nkernel/drivers/virtio_blk.ko\n"
        );
        // efivarfs is shipped for a UEFI boot, outside the list every boot loads.
        assert_eq!(
            String::from_utf8_lossy(&get("lib/modules/6.1.0-t-amd64/rivet.uefi.load").2),
            "kernel/drivers/efivarfs.ko\n"
        );
        get("lib/modules/6.1.0-t-amd64/kernel/drivers/efivarfs.ko");
        // Without mdadm: no mdadm, no libraries, no conf (/init skips the RAID block).
        assert!(a.mdadm.is_none() && a.mdadm_libraries.is_empty());
        assert!(!entries
            .iter()
            .any(|e| e.0.contains("mdadm") || e.0.starts_with("lib64")));
        let names: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted, "entries are in path order");
        // A dynamically linked agent is refused.
        let mut o = Options::new(tmp.path().join("c"), pkg.clone(), PathBuf::from("/bin/sh"));
        o.iso = false;
        let err = build(&o).expect_err("dynamic agent");
        assert!(err.to_string().contains("dynamically linked"), "{err}");
    }

    #[test]
    fn cmdline_ends_with_the_controller() {
        let mut o = Options::new("o".into(), "k".into(), "a".into());
        o.controller = "http://10.0.2.100:6385".into();
        assert_eq!(
            o.kernel_cmdline(),
            "console=tty0 console=ttyS0,115200n8 rivet.controller=http://10.0.2.100:6385"
        );
        o.cmdline = String::new();
        assert_eq!(
            o.kernel_cmdline(),
            "rivet.controller=http://10.0.2.100:6385"
        );
    }

    #[test]
    fn iso_cmdline_carries_a_region_rivetd_can_rewrite() {
        use rivet_protocol::bootparams::{find_regions, MARKER, WIDTH};
        let mut o = Options::new("o".into(), "k".into(), "a".into());
        o.controller = "http://10.0.2.100:6385".into();
        let cfg = iso::grub_cfg(&o.iso_cmdline().expect("fits"));
        let at = find_regions(cfg.as_bytes());
        assert_eq!(at.len(), 1, "{cfg}");
        let region = &cfg[at[0]..at[0] + WIDTH];
        assert_eq!(
            region.trim_end(),
            format!("{MARKER}rivet.controller=http://10.0.2.100:6385")
        );
        assert!(cfg
            .contains("linux /boot/vmlinuz console=tty0 console=ttyS0,115200n8 rivet.params=v1 "));
        o.controller = "http://a/$x".into();
        assert!(o.iso_cmdline().is_err());
    }
}
