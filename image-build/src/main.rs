//! image-build: parse the command line, find the inputs, build, print what was made.

use anyhow::{bail, Context, Result};
use clap::Parser;
use rivet_image_build::{build, build_agent, newest_kernel_package, Extra, KernelPackage, Options};
use std::path::{Path, PathBuf};

/// Build the Rivet ramdisk: DIR/vmlinuz, DIR/rivet.initramfs, DIR/rivet.iso, DIR/boot.ipxe.
/// With --test-image instead: only the bootable whole-disk test image.
#[derive(Parser)]
#[command(name = "image-build", version)]
struct Cli {
    /// Output directory.
    #[arg(long, required_unless_present = "test_image")]
    out: Option<PathBuf>,
    /// Build only the whole-disk test image (syslinux, the same kernel, an init that reports
    /// the configdrive's uuid on the serial console) into PATH, and nothing else.
    #[arg(long, value_name = "PATH", conflicts_with = "out")]
    test_image: Option<PathBuf>,
    /// The test image's UEFI loader: `vendor` (only \EFI\rivet\grubx64.efi: boots through a
    /// boot entry), `removable` (also \EFI\BOOT\BOOTX64.EFI), `signed` (Debian's signed
    /// shim and GRUB, for Secure Boot).
    #[arg(long, value_name = "LAYOUT", default_value = "vendor", value_parser = parse_layout)]
    test_image_efi: rivet_image_build::testimage::EfiLayout,
    /// Debian linux-image-*.deb (or a directory it was extracted into). Default: the newest in
    /// $RIVET_KERNEL_CACHE or target/kernel-cache/ (scripts/setup-qemu.sh downloads one).
    #[arg(long, env = "RIVET_KERNEL_PACKAGE")]
    kernel_package: Option<PathBuf>,
    /// The static rivet-agent. Default: build it with scripts/build-agent.sh.
    #[arg(long)]
    agent: Option<PathBuf>,
    /// A static busybox.
    #[arg(long, default_value = "/bin/busybox")]
    busybox: PathBuf,
    /// Extra file or directory for the ramdisk, SRC:DEST (repeatable).
    #[arg(long, value_name = "SRC:DEST")]
    extra: Vec<Extra>,
    /// Directory of exec plugins for /usr/lib/rivet/managers.d.
    #[arg(long)]
    plugins: Option<PathBuf>,
    /// Modules to ship (comma separated; dependencies are added). Default: storage and NICs.
    #[arg(long, value_delimiter = ',')]
    modules: Vec<String>,
    /// Controller URL(s) baked into the ISO and boot.ipxe (`rivet.controller=`).
    #[arg(long, default_value = rivet_image_build::DEFAULT_CONTROLLER)]
    controller: String,
    /// Kernel arguments for the ISO and boot.ipxe (before rivet.controller=).
    #[arg(long, default_value = rivet_image_build::DEFAULT_CONSOLE)]
    cmdline: String,
    /// Skip the ISO (no grub-mkrescue/xorriso needed).
    #[arg(long)]
    no_iso: bool,
    /// gzip level of the initramfs (0–9).
    #[arg(long, default_value_t = 9)]
    compression: u32,
    /// mdadm for software RAID, shipped at /usr/sbin/mdadm with its shared libraries.
    /// Default: the first of /usr/local/lib/rivet/mdadm/mdadm (scripts/setup-qemu.sh),
    /// /sbin/mdadm, /usr/sbin/mdadm; none: a ramdisk without software RAID.
    #[arg(long, value_name = "PATH")]
    mdadm: Option<PathBuf>,
}

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Build the test image at `out`, extracting the kernel package next to it (scratch space
/// on the same filesystem, removed afterwards).
fn parse_layout(s: &str) -> Result<rivet_image_build::testimage::EfiLayout, String> {
    rivet_image_build::testimage::EfiLayout::parse(s)
        .ok_or_else(|| format!("{s:?}: use vendor, removable or signed"))
}

fn build_test_image(
    out: &Path,
    kernel_package: &Path,
    busybox: &Path,
    layout: rivet_image_build::testimage::EfiLayout,
) -> Result<()> {
    let dir = match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let kernel = KernelPackage::open(kernel_package, dir)?;
    let path = rivet_image_build::testimage::build(&kernel, busybox, out, layout)
        .context("building the test image failed")?;
    println!("kernel      {}", kernel.modules.version);
    println!(
        "test image  {} ({} MiB)",
        path.display(),
        rivet_image_build::testimage::IMAGE_MIB
    );
    Ok(())
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let kernel_package = match cli.kernel_package {
        Some(p) => p,
        None => {
            let cache = std::env::var_os("RIVET_KERNEL_CACHE")
                .map(PathBuf::from)
                .unwrap_or_else(|| workspace_root().join("target/kernel-cache"));
            match newest_kernel_package(&cache) {
                Some(p) => p,
                None => bail!(
                    "no linux-image-*.deb in {}: run scripts/setup-qemu.sh or pass --kernel-package",
                    cache.display()
                ),
            }
        }
    };
    let out = match (cli.test_image, cli.out) {
        (Some(image), _) => {
            return build_test_image(&image, &kernel_package, &cli.busybox, cli.test_image_efi)
        }
        (None, Some(out)) => out,
        (None, None) => bail!("--out or --test-image is required"),
    };
    let agent = match cli.agent {
        Some(p) => p,
        None => {
            let script = workspace_root().join("scripts/build-agent.sh");
            if !script.is_file() {
                bail!(
                    "no --agent given and {} is not here to build one",
                    script.display()
                );
            }
            build_agent(&script).context("building the static agent")?
        }
    };
    let mut opts = Options::new(out, kernel_package, agent);
    opts.busybox = cli.busybox;
    opts.extra = cli.extra;
    opts.plugins = cli.plugins;
    if !cli.modules.is_empty() {
        opts.modules = cli.modules;
    }
    opts.controller = cli.controller;
    opts.cmdline = cli.cmdline;
    opts.iso = !cli.no_iso;
    opts.compression = cli.compression;
    if cli.mdadm.is_some() {
        opts.mdadm = cli.mdadm;
    }
    if opts.mdadm.is_none() {
        eprintln!(
            "image-build: no mdadm (none of {}; scripts/setup-qemu.sh unpacks one): the \
             ramdisk has no software RAID, and software RAID steps will not be offered",
            rivet_image_build::MDADM_CANDIDATES.join(", ")
        );
    }
    if opts.controller == rivet_image_build::DEFAULT_CONTROLLER {
        eprintln!(
            "image-build: no --controller: the ISO and boot.ipxe use {} (rivetd's \
             /boot/ipxe/{{node}} script carries the real URL)",
            opts.controller
        );
    }

    let r = build(&opts).context("image-build failed")?;
    println!("kernel      {}", r.kernel_version);
    println!(
        "modules     {} shipped: {}",
        r.modules.len(),
        r.modules.join(" ")
    );
    if !r.missing_modules.is_empty() {
        println!(
            "            not in the package: {}",
            r.missing_modules.join(" ")
        );
    }
    for (m, why) in &r.skipped_modules {
        println!("            skipped {m}: {why}");
    }
    if let Some(m) = &r.mdadm {
        println!(
            "mdadm       {} from {} (with {})",
            rivet_image_build::init::MDADM_PATH,
            m.display(),
            r.mdadm_libraries.join(" ")
        );
    }
    println!("vmlinuz     {}", r.vmlinuz.display());
    println!(
        "initramfs   {} ({} bytes gzip, {:.1} MiB; {:.1} MiB uncompressed)",
        r.initramfs.display(),
        r.initramfs_bytes,
        r.initramfs_bytes as f64 / 1048576.0,
        r.initramfs_cpio_bytes as f64 / 1048576.0
    );
    match &r.iso {
        Some((p, boot)) => println!(
            "iso         {} (El Torito: {}{})",
            p.display(),
            boot.describe(),
            if !boot.uefi {
                "; no UEFI: install grub-efi-amd64-bin and mtools"
            } else if !boot.secure_boot {
                "; not for Secure Boot: install shim-signed and grub-efi-amd64-signed"
            } else {
                ""
            }
        ),
        None => println!("iso         skipped (--no-iso)"),
    }
    println!("ipxe        {}", r.ipxe.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_or_test_image() {
        assert!(Cli::try_parse_from(["image-build"]).is_err());
        assert!(Cli::try_parse_from(["image-build", "--out", "d", "--test-image", "t"]).is_err());
        let c = Cli::try_parse_from(["image-build", "--test-image", "t.raw"]).expect("parse");
        assert_eq!(c.test_image, Some(PathBuf::from("t.raw")));
        assert!(c.out.is_none());
        let c = Cli::try_parse_from(["image-build", "--out", "d"]).expect("parse");
        assert_eq!(c.out, Some(PathBuf::from("d")));
        assert_eq!(c.mdadm, None);
        let c = Cli::try_parse_from(["image-build", "--out", "d", "--mdadm", "/opt/mdadm"])
            .expect("parse");
        assert_eq!(c.mdadm, Some(PathBuf::from("/opt/mdadm")));
    }
}
