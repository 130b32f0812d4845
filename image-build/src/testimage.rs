//! A small bootable whole-disk image for deploy tests and the VM lab.
//!
//! A GPT disk (64 MiB) whose first partition is an EFI System Partition (FAT) holding
//! syslinux, GRUB for UEFI, the same Debian kernel as the ramdisk and a tiny initramfs
//! (busybox + the virtio and ISO 9660 modules). Legacy BIOS boots it (syslinux's `gptmbr.bin`
//! → the partition flagged legacy-bootable); UEFI boots it through the loader its
//! [`EfiLayout`] puts on the ESP. Its `/init` looks for a partition whose ISO 9660 volume label is
//! `config-2`, reads `openstack/latest/meta_data.json` from it and prints
//!
//! ```text
//! rivet-lab-instance booted uuid=<meta_data uuid>   (or uuid=none and why)
//! ```
//!
//! on the serial console, then powers off: proof that a deployed image booted from its disk
//! and saw the configdrive Rivet wrote. Built without mounting anything (mtools writes the
//! FAT filesystem, `syslinux --install` works on the image file): Debian `syslinux`,
//! `syslinux-common`, `dosfstools`, `mtools`, `gdisk`, `grub-efi-amd64-bin`; for
//! [`EfiLayout::Signed`] also `shim-signed` and `grub-efi-amd64-signed`.

use crate::cpio::{Archive, Content};
use crate::{check_static, io, BuildError, KernelPackage};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The line the booted instance prints (followed by `uuid=…`).
pub const MARKER: &str = "rivet-lab-instance booted";
/// The line the booted instance prints just before [`MARKER`]: `firmware=uefi|bios
/// secure_boot=1|0|none` (none: BIOS), read from /sys/firmware/efi and the SecureBoot
/// variable.
pub const FIRMWARE_MARKER: &str = "rivet-lab-instance firmware=";
/// Size of the image.
pub const IMAGE_MIB: u64 = 64;
/// Modules the instance loads to find its disk and read the configdrive.
const MODULES: &[&str] = &["virtio_pci", "virtio_blk", "isofs", "efivarfs"];
/// syslinux's GPT boot code.
const GPTMBR: &str = "/usr/lib/syslinux/mbr/gptmbr.bin";
/// The FAT volume label GRUB finds its partition by.
const LABEL: &str = "RIVETBOOT";
/// Debian's signed shim and GRUB (packages shim-signed, grub-efi-amd64-signed).
const SHIM_SIGNED: &str = "/usr/lib/shim/shimx64.efi.signed";
const GRUB_SIGNED: &str = "/usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed";

/// Where the image keeps its UEFI loader: what a UEFI machine needs in NVRAM to boot it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EfiLayout {
    /// Only `\EFI\rivet\grubx64.efi` (an installed OS's layout): the firmware boots it only
    /// through a boot entry, which is what the agent must write after deploying it.
    Vendor,
    /// The removable-media path `\EFI\BOOT\BOOTX64.EFI` as well: boots with no entry.
    Removable,
    /// Debian's Secure Boot chain: signed shim → signed GRUB → Debian's signed kernel, as
    /// `\EFI\debian\` (with `BOOTX64.CSV`) and the removable path. Boots with Secure Boot
    /// enforcing and Microsoft's keys enrolled.
    Signed,
}

impl EfiLayout {
    /// From the command line's spelling.
    pub fn parse(s: &str) -> Option<EfiLayout> {
        match s {
            "vendor" => Some(EfiLayout::Vendor),
            "removable" => Some(EfiLayout::Removable),
            "signed" => Some(EfiLayout::Signed),
            _ => None,
        }
    }
}

fn tool(cmd: &mut Command, what: &str) -> Result<(), BuildError> {
    let out = cmd.output().map_err(|e| BuildError::Tool {
        tool: what.into(),
        message: format!(
            "cannot run it ({e}); install syslinux, syslinux-common, dosfstools, mtools and gdisk"
        ),
    })?;
    if !out.status.success() {
        return Err(BuildError::Tool {
            tool: what.into(),
            message: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(())
}

/// The instance's `/init`.
fn init_script(version: &str) -> String {
    format!(
        r#"#!/bin/sh
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
/bin/busybox mount -t devtmpfs devtmpfs /dev
for m in $(cat /lib/modules/{version}/load.list); do
  # efivarfs only where there is UEFI firmware to show.
  case $m in *efivarfs*) [ -d /sys/firmware/efi ] || continue ;; esac
  insmod /lib/modules/{version}/$m
done
uuid=none
why="no partition labelled config-2"
i=0
while [ $i -lt 20 ] && [ "$uuid" = none ]; do
  for p in $(ls /sys/class/block); do
    [ -e /sys/class/block/$p/partition ] || continue
    label=$(dd if=/dev/$p bs=1 skip=32808 count=8 2>/dev/null)
    [ "$label" = "config-2" ] || continue
    mkdir -p /mnt/cd
    if mount -t iso9660 -o ro /dev/$p /mnt/cd; then
      u=$(sed -n 's/.*"uuid" *: *"\([^"]*\)".*/\1/p' /mnt/cd/openstack/latest/meta_data.json)
      [ -n "$u" ] && uuid=$u || why="meta_data.json has no uuid"
      umount /mnt/cd
    else
      why="config-2 on /dev/$p does not mount"
    fi
  done
  [ "$uuid" = none ] && sleep 0.5
  i=$((i + 1))
done
fw=bios
sb=none
if [ -d /sys/firmware/efi ]; then
  fw=uefi
  sb=0
  mount -t efivarfs efivarfs /sys/firmware/efi/efivars
  v=$(dd if=/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c bs=1 skip=4 count=1 2>/dev/null | od -An -tu1 | sed 's/ //g')
  [ "$v" = 1 ] && sb=1
fi
echo "{firmware}$fw secure_boot=$sb" > /dev/console
if [ "$uuid" = none ]; then
  echo "{marker} uuid=none ($why)" > /dev/console
else
  echo "{marker} uuid=$uuid" > /dev/console
fi
sync
poweroff -f
"#,
        marker = MARKER,
        firmware = FIRMWARE_MARKER,
    )
}

/// GRUB's configuration: the kernel and initramfs from the ESP, the serial console.
fn grub_cfg() -> String {
    format!(
        "set timeout=0\nsearch --no-floppy --label {LABEL} --set=root\n\
         linux /vmlinuz console=ttyS0,115200 panic=-1 quiet\ninitrd /initrd\nboot\n"
    )
}

/// A self-contained GRUB EFI binary with its configuration inside (grub-mkstandalone).
fn grub_standalone(dir: &Path) -> Result<PathBuf, BuildError> {
    let cfg = dir.join("grub-embedded.cfg");
    std::fs::write(&cfg, grub_cfg()).map_err(io("writing", &cfg))?;
    let out = dir.join("grubx64.efi");
    tool(
        Command::new("grub-mkstandalone")
            .args(["-O", "x86_64-efi", "--locales=", "--fonts=", "--themes="])
            .arg("--install-modules=part_gpt fat search search_label linux normal echo configfile")
            .arg("--modules=part_gpt fat search_label linux normal")
            .arg("-o")
            .arg(&out)
            .arg(format!("boot/grub/grub.cfg={}", cfg.display())),
        "grub-mkstandalone (install grub-efi-amd64-bin)",
    )?;
    Ok(out)
}

/// Put the UEFI loader(s) of `layout` on the FAT image `part`.
fn install_efi(part: &Path, dir: &Path, layout: EfiLayout) -> Result<(), BuildError> {
    let mcopy = |from: &Path, to: &str| {
        tool(
            Command::new("mcopy").arg("-i").arg(part).arg(from).arg(to),
            "mcopy",
        )
    };
    let mmd = |d: &str| tool(Command::new("mmd").arg("-i").arg(part).arg(d), "mmd");
    mmd("::EFI")?;
    match layout {
        EfiLayout::Vendor | EfiLayout::Removable => {
            let grub = grub_standalone(dir)?;
            mmd("::EFI/rivet")?;
            mcopy(&grub, "::EFI/rivet/grubx64.efi")?;
            if layout == EfiLayout::Removable {
                mmd("::EFI/BOOT")?;
                mcopy(&grub, "::EFI/BOOT/BOOTX64.EFI")?;
            }
        }
        EfiLayout::Signed => {
            for f in [SHIM_SIGNED, GRUB_SIGNED] {
                if !Path::new(f).is_file() {
                    return Err(BuildError::Tool {
                        tool: "signed boot chain".into(),
                        message: format!(
                            "{f} is missing: install shim-signed and grub-efi-amd64-signed"
                        ),
                    });
                }
            }
            // Debian's signed GRUB reads grub.cfg from its own directory (its prefix is
            // /EFI/debian); shim loads grubx64.efi from the directory it was started from.
            let cfg = dir.join("grub.cfg");
            std::fs::write(&cfg, grub_cfg()).map_err(io("writing", &cfg))?;
            // BOOTX64.CSV: UTF-16LE with a BOM, as shim's fallback reads it.
            let csv = dir.join("BOOTX64.CSV");
            let mut bytes = vec![0xff, 0xfe];
            for u in "shimx64.efi,rivet,,Rivet test image\n".encode_utf16() {
                bytes.extend_from_slice(&u.to_le_bytes());
            }
            std::fs::write(&csv, bytes).map_err(io("writing", &csv))?;
            for d in ["::EFI/debian", "::EFI/BOOT"] {
                mmd(d)?;
            }
            mcopy(Path::new(SHIM_SIGNED), "::EFI/debian/shimx64.efi")?;
            mcopy(Path::new(GRUB_SIGNED), "::EFI/debian/grubx64.efi")?;
            mcopy(&cfg, "::EFI/debian/grub.cfg")?;
            mcopy(&csv, "::EFI/debian/BOOTX64.CSV")?;
            mcopy(Path::new(SHIM_SIGNED), "::EFI/BOOT/BOOTX64.EFI")?;
            mcopy(Path::new(GRUB_SIGNED), "::EFI/BOOT/grubx64.efi")?;
            mcopy(&cfg, "::EFI/BOOT/grub.cfg")?;
        }
    }
    Ok(())
}

/// Build the image at `out` from an opened kernel package and a static busybox.
pub fn build(
    kernel: &KernelPackage,
    busybox: &Path,
    out: &Path,
    layout: EfiLayout,
) -> Result<PathBuf, BuildError> {
    check_static(busybox, "busybox")?;
    let scratch = tempfile::tempdir().map_err(io("creating a temp dir", Path::new("/tmp")))?;
    let dir = scratch.path();

    // The initramfs.
    let sel = kernel.modules.resolve(MODULES)?;
    if !sel.missing.is_empty() {
        return Err(BuildError::Input(format!(
            "the kernel package lacks modules {:?}",
            sel.missing
        )));
    }
    let mut a = Archive::new();
    for d in ["bin", "sbin", "proc", "sys", "dev", "mnt", "tmp"] {
        a.dir(d, 0o755)?;
    }
    a.add("dev/console", 0o600, Content::CharDev(5, 1))?;
    a.file("bin/busybox", 0o755, busybox)?;
    for applet in [
        "sh", "mount", "umount", "insmod", "cat", "ls", "dd", "mkdir", "sed", "sleep", "sync",
        "poweroff", "echo", "od",
    ] {
        a.symlink(&format!("bin/{applet}"), "/bin/busybox")?;
    }
    a.bytes("init", 0o755, init_script(&kernel.modules.version))?;
    let moddir = format!("lib/modules/{}", kernel.modules.version);
    let mut load = String::new();
    for m in &sel.order {
        a.file(&format!("{moddir}/{}", m.rel), 0o644, &m.path)?;
        load.push_str(&m.rel);
        load.push('\n');
    }
    a.bytes(&format!("{moddir}/load.list"), 0o644, load)?;
    let initrd = dir.join("initrd");
    crate::write_initramfs(&a, &initrd, 6)?;

    // The FAT partition: kernel, initrd, syslinux.
    let part = dir.join("part.img");
    let part_mib = IMAGE_MIB - 2;
    tool(
        Command::new("mkfs.vfat")
            .args(["-n", LABEL, "-C"])
            .arg(&part)
            .arg((part_mib * 1024).to_string()),
        "mkfs.vfat",
    )?;
    let cfg = dir.join("syslinux.cfg");
    std::fs::write(
        &cfg,
        "DEFAULT instance\nPROMPT 0\nTIMEOUT 1\nLABEL instance\n  KERNEL vmlinuz\n  INITRD initrd\n  APPEND console=ttyS0,115200 panic=-1 quiet\n",
    )
    .map_err(io("writing", &cfg))?;
    for (file, name) in [
        (&kernel.vmlinuz, "::vmlinuz"),
        (&initrd, "::initrd"),
        (&cfg, "::syslinux.cfg"),
    ] {
        tool(
            Command::new("mcopy")
                .arg("-i")
                .arg(&part)
                .arg(file)
                .arg(name),
            "mcopy",
        )?;
    }
    tool(
        Command::new("syslinux").arg("--install").arg(&part),
        "syslinux --install",
    )?;
    install_efi(&part, dir, layout)?;

    // The disk: GPT, partition 1 an EFI System Partition and legacy-bootable, syslinux's GPT
    // MBR code.
    let tmp = out.with_extension("tmp");
    let f = std::fs::File::create(&tmp).map_err(io("creating", &tmp))?;
    f.set_len(IMAGE_MIB << 20).map_err(io("sizing", &tmp))?;
    drop(f);
    tool(
        Command::new("sgdisk")
            .args([
                "-o",
                "-n",
                &format!("1:2048:+{part_mib}M"),
                "-t",
                "1:ef00",
                "-A",
                "1:set:2",
                "-c",
                "1:rivet-boot",
            ])
            .arg(&tmp),
        "sgdisk",
    )?;
    let fat = std::fs::read(&part).map_err(io("reading", &part))?;
    let mbr = std::fs::read(GPTMBR)
        .map_err(io("reading (install syslinux-common)", Path::new(GPTMBR)))?;
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&tmp)
            .map_err(io("opening", &tmp))?;
        f.write_all_at(&fat, 1 << 20).map_err(io("writing", &tmp))?;
        f.write_all_at(&mbr[..mbr.len().min(440)], 0)
            .map_err(io("writing", &tmp))?;
        f.sync_all().map_err(io("writing", &tmp))?;
    }
    std::fs::rename(&tmp, out).map_err(io("renaming", out))?;
    Ok(out.to_path_buf())
}
