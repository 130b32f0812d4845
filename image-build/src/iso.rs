//! The virtual-media ISO: `grub-mkrescue` (GRUB + xorriso) around the kernel and the
//! initramfs, with a BIOS El Torito image (grub-pc-bin) and, when grub-efi-amd64-bin and mtools
//! are installed, a UEFI one. The kernel command line is baked into grub.cfg.

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
}

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
    Ok(IsoBoot { bios: true, uefi })
}

/// The El Torito boot images of an ISO, as xorriso reports them (platform ids: `BIOS`, `UEFI`).
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
