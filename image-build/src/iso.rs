//! The virtual-media ISO around the kernel and the initramfs, with a BIOS El Torito image
//! (GRUB for i386-pc) and a UEFI one. The kernel command line is baked into grub.cfg.
//!
//! Two ways to build it, best first:
//! - **Signed** (Debian `shim-signed` and `grub-efi-amd64-signed` installed): the UEFI image is
//!   Microsoft-signed shim → Debian-signed GRUB (`gcdx64.efi`, the CD build, which finds the
//!   ISO by `/.disk/info` and reads `/boot/grub/grub.cfg`) → Debian's signed kernel, so the
//!   ramdisk boots on a machine with Secure Boot enforcing and Microsoft's keys enrolled,
//!   as servers ship. The initramfs is not signed: shim and GRUB verify the kernel only, and
//!   the kernel then locks down (it loads only Debian's signed modules, which are what the
//!   initramfs carries). The FAT image is made with mtools, the ISO with xorriso.
//! - **grub-mkrescue** otherwise: unsigned GRUB for UEFI (when grub-efi-amd64-bin and mtools
//!   are installed), which boots with Secure Boot off only.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Errors making the ISO.
#[derive(Debug, thiserror::Error)]
pub enum IsoError {
    /// A tool is not installed.
    #[error("{tool} not found: install {package} (scripts/setup-qemu.sh does), or pass --no-iso")]
    Missing {
        /// The program.
        tool: &'static str,
        /// The Debian package that has it.
        package: &'static str,
    },
    /// Staging files failed.
    #[error("preparing the ISO tree in {path}: {source}")]
    Io {
        /// Where.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// grub-mkrescue failed.
    #[error("grub-mkrescue failed ({status}): {stderr}")]
    Tool {
        /// Exit status.
        status: String,
        /// Its error output.
        stderr: String,
    },
}

/// What the ISO can boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IsoBoot {
    /// BIOS El Torito image present.
    pub bios: bool,
    /// UEFI El Torito image present.
    pub uefi: bool,
    /// The UEFI image is a signed chain (shim → GRUB → kernel): boots with Secure Boot on.
    pub secure_boot: bool,
}

impl IsoBoot {
    /// For the build report: `BIOS + UEFI (Secure Boot)`.
    pub fn describe(&self) -> String {
        let mut s = String::from(if self.bios { "BIOS" } else { "" });
        if self.uefi {
            if !s.is_empty() {
                s.push_str(" + ");
            }
            s.push_str("UEFI");
            if self.secure_boot {
                s.push_str(" (Secure Boot: signed shim → GRUB → kernel)");
            }
        }
        s
    }
}

/// Debian's Microsoft-signed shim (shim-signed).
pub const SHIM_SIGNED: &str = "/usr/lib/shim/shimx64.efi.signed";
/// Debian's signed GRUB for CDs (grub-efi-amd64-signed).
pub const GRUB_CD_SIGNED: &str = "/usr/lib/grub/x86_64-efi-signed/gcdx64.efi.signed";
/// GRUB modules of the BIOS El Torito image.
const BIOS_MODULES: &[&str] = &[
    "biosdisk",
    "iso9660",
    "normal",
    "linux",
    "configfile",
    "search",
    "serial",
    "terminal",
    "echo",
    "test",
];

fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// GRUB platforms installed for grub-mkrescue.
fn grub_platform(name: &str) -> bool {
    Path::new("/usr/lib/grub").join(name).is_dir()
}

/// grub.cfg: boot at once, console on both screen and first serial port.
pub fn grub_cfg(cmdline: &str) -> String {
    format!(
        "set timeout=0\n\
         set default=0\n\
         serial --unit=0 --speed=115200\n\
         terminal_input console serial\n\
         terminal_output console serial\n\
         menuentry \"Rivet ramdisk\" {{\n\
         \x20   linux /boot/vmlinuz {cmdline}\n\
         \x20   initrd /boot/rivet.initramfs\n\
         }}\n"
    )
}

/// Build `out` from the kernel and initramfs. `scratch` is an empty directory to stage in.
pub fn make_iso(
    vmlinuz: &Path,
    initramfs: &Path,
    cmdline: &str,
    scratch: &Path,
    out: &Path,
) -> Result<IsoBoot, IsoError> {
    let mkrescue = which("grub-mkrescue").ok_or(IsoError::Missing {
        tool: "grub-mkrescue",
        package: "grub-common and grub-pc-bin",
    })?;
    which("xorriso").ok_or(IsoError::Missing {
        tool: "xorriso",
        package: "xorriso",
    })?;
    if !grub_platform("i386-pc") {
        return Err(IsoError::Missing {
            tool: "GRUB's i386-pc (BIOS) modules",
            package: "grub-pc-bin",
        });
    }
    // grub-mkrescue builds the UEFI image with mtools; without them it would fail outright.
    let uefi = grub_platform("x86_64-efi") && which("mformat").is_some();
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| IsoError::Io { path, source }
    };
    let tree = scratch.join("iso");
    let boot = tree.join("boot");
    std::fs::create_dir_all(boot.join("grub")).map_err(io(&boot))?;
    std::fs::copy(vmlinuz, boot.join("vmlinuz")).map_err(io(vmlinuz))?;
    std::fs::copy(initramfs, boot.join("rivet.initramfs")).map_err(io(initramfs))?;
    std::fs::write(boot.join("grub/grub.cfg"), grub_cfg(cmdline)).map_err(io(&boot))?;

    if uefi && Path::new(SHIM_SIGNED).is_file() && Path::new(GRUB_CD_SIGNED).is_file() {
        return signed_iso(&tree, scratch, out);
    }

    let mut cmd = Command::new(mkrescue);
    cmd.arg("-o").arg(out);
    if !uefi {
        // Only BIOS: do not let grub-mkrescue try a half-installed EFI platform.
        cmd.arg("-d").arg("/usr/lib/grub/i386-pc");
    }
    cmd.arg(&tree)
        .arg("--")
        .arg("-volid")
        .arg("RIVET")
        // Fixed dates where xorriso honours them.
        .env("SOURCE_DATE_EPOCH", "0")
        .env("TMPDIR", scratch);
    let output = cmd.output().map_err(io(out))?;
    if !output.status.success() {
        return Err(IsoError::Tool {
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok(IsoBoot {
        bios: true,
        uefi,
        secure_boot: false,
    })
}

/// Run a tool, its failure an [`IsoError::Tool`].
fn run(cmd: &mut Command, what: &Path) -> Result<(), IsoError> {
    let output = cmd
        .env("SOURCE_DATE_EPOCH", "0")
        .output()
        .map_err(|source| IsoError::Io {
            path: what.to_path_buf(),
            source,
        })?;
    if !output.status.success() {
        return Err(IsoError::Tool {
            status: format!("{cmd:?}: {}", output.status),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok(())
}

/// The ISO with a signed UEFI chain, from the staged `tree` (boot/vmlinuz,
/// boot/rivet.initramfs, boot/grub/grub.cfg).
fn signed_iso(tree: &Path, scratch: &Path, out: &Path) -> Result<IsoBoot, IsoError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| IsoError::Io { path, source }
    };
    // The signed CD GRUB finds its ISO by this file.
    let disk = tree.join(".disk");
    std::fs::create_dir_all(&disk).map_err(io(&disk))?;
    std::fs::write(disk.join("info"), "Rivet ramdisk\n").map_err(io(&disk))?;
    // BIOS: GRUB's El Torito core image.
    let bios = tree.join("boot/grub/bios.img");
    run(
        Command::new("grub-mkimage")
            .args(["-O", "i386-pc-eltorito", "-p", "/boot/grub", "-o"])
            .arg(&bios)
            .args(BIOS_MODULES),
        &bios,
    )?;
    // UEFI: a FAT image with the removable-media path: shim, and GRUB next to it (shim
    // starts grubx64.efi from its own directory).
    let efi = tree.join("boot/efi.img");
    let _ = std::fs::remove_file(&efi);
    run(
        Command::new("mkfs.vfat")
            .args(["--invariant", "-n", "RIVETEFI", "-C"])
            .arg(&efi)
            .arg("8192"),
        &efi,
    )?;
    let image = format!("{}", efi.display());
    run(
        Command::new("mmd").args(["-i", &image, "::EFI", "::EFI/BOOT"]),
        &efi,
    )?;
    for (from, to) in [
        (SHIM_SIGNED, "::EFI/BOOT/BOOTX64.EFI"),
        (GRUB_CD_SIGNED, "::EFI/BOOT/grubx64.efi"),
    ] {
        run(Command::new("mcopy").args(["-i", &image, from, to]), &efi)?;
    }
    run(
        Command::new("xorriso")
            .args(["-as", "mkisofs", "-R", "-J", "-V", "RIVET"])
            .args([
                "-b",
                "boot/grub/bios.img",
                "-no-emul-boot",
                "-boot-load-size",
                "4",
            ])
            .args(["-boot-info-table", "-eltorito-alt-boot"])
            .args(["-e", "boot/efi.img", "-no-emul-boot", "-o"])
            .arg(out)
            .arg(tree)
            .env("TMPDIR", scratch),
        out,
    )?;
    Ok(IsoBoot {
        bios: true,
        uefi: true,
        secure_boot: true,
    })
}

/// The El Torito boot images of an ISO, as xorriso reports them (platform ids: `BIOS`, `UEFI`;
/// `secure_boot` is always false: the catalogue does not say).
pub fn el_torito(iso: &Path) -> Option<IsoBoot> {
    let out = Command::new(which("xorriso")?)
        .args(["-indev"])
        .arg(iso)
        .args(["-report_el_torito", "plain"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let img_lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("El Torito boot img"))
        .collect();
    Some(IsoBoot {
        bios: img_lines.iter().any(|l| l.contains("BIOS")),
        uefi: img_lines.iter().any(|l| l.contains("UEFI")),
        // Not visible in the El Torito catalogue.
        secure_boot: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grub_cfg_carries_the_cmdline() {
        let c = grub_cfg("console=ttyS0 rivet.controller=http://10.0.2.100:6385");
        assert!(c.contains(
            "    linux /boot/vmlinuz console=ttyS0 rivet.controller=http://10.0.2.100:6385\n"
        ));
        assert!(c.contains("    initrd /boot/rivet.initramfs\n"));
        assert!(c.starts_with("set timeout=0\n"));
    }
}
