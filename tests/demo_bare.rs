//! The README's first command, `bash scripts/demo.sh`, on a machine with nothing but the Rust
//! toolchain: the script runs with a PATH holding only symlinks to cargo, rustc, the C
//! compiler/linker they use and a few coreutils, inside a private mount namespace where
//! /usr/sbin (and /sbin, /usr/local/sbin) are empty — so no sgdisk, gdisk, mkfs.*, wipefs,
//! blkid, parted or losetup, even by absolute path. The demo must still deploy its image with
//! a configdrive and check the disk. Root (a mount namespace); skipped otherwise unless
//! `RIVET_REQUIRE_PEERS=1`. The script's build is scripts/test.sh's, so after that it is a
//! no-op; the demo itself takes ~15 s.

use rivet_tests::agentproc::is_root;
use rivet_tests::prerequisite;
use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// What the script and the demo may run besides cargo and rustc: the shell, coreutils-level
/// programs, and the C toolchain rustc links with (and build scripts compile C with).
const TOOLS: &[&str] = &[
    "bash", "sh", "env", "dirname", "basename", "cat", "ls", "mkdir", "rm", "cp", "mv", "ln",
    "uname", "true", "false", "id", "cc", "gcc", "ld", "as", "ar",
];

/// What the demo must not need; none may be reachable.
const FORBIDDEN: &[&str] = &[
    "sgdisk",
    "gdisk",
    "cgdisk",
    "fixparts",
    "sfdisk",
    "fdisk",
    "parted",
    "partprobe",
    "mkfs",
    "mkfs.ext4",
    "mke2fs",
    "mkfs.vfat",
    "mkfs.xfs",
    "wipefs",
    "blkid",
    "losetup",
];

/// Directories hidden under an empty tmpfs (where the disk tools live on Debian).
const HIDDEN: &[&str] = &["/usr/sbin", "/sbin", "/usr/local/sbin"];

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A directory of symlinks: cargo and rustc of the toolchain running this test, and [`TOOLS`].
fn bare_path(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir(&bin).expect("mkdir bin");
    // Cargo tells a test which cargo runs it; rustc is next to it in a toolchain.
    let cargo = std::env::var_os("CARGO")
        .map(PathBuf::from)
        .or_else(|| on_path("cargo"))
        .expect("no cargo: neither $CARGO nor on PATH");
    let rustc = cargo
        .parent()
        .map(|d| d.join("rustc"))
        .filter(|p| p.is_file())
        .or_else(|| on_path("rustc"))
        .expect("no rustc next to cargo nor on PATH");
    let mut links = vec![("cargo".to_string(), cargo), ("rustc".to_string(), rustc)];
    for t in TOOLS {
        if let Some(p) = on_path(t) {
            links.push((t.to_string(), p));
        }
    }
    for (name, target) in links {
        std::os::unix::fs::symlink(&target, bin.join(&name))
            .unwrap_or_else(|e| panic!("symlink {name} -> {}: {e}", target.display()));
    }
    bin
}

/// `cmd` with a clean environment (PATH = `bin` only) in a private mount namespace where the
/// [`HIDDEN`] directories are empty.
fn bare(cmd: &mut Command, bin: &Path) {
    cmd.env_clear().env("PATH", bin);
    for var in [
        "HOME",
        "CARGO_HOME",
        "RUSTUP_HOME",
        "RUSTUP_TOOLCHAIN",
        "CARGO_TARGET_DIR",
        "TMPDIR",
        // scripts/test.sh builds with clippy-driver as the workspace's compiler; the same two
        // variables here keep the script's build a no-op on those artefacts instead of a
        // rebuild of every workspace crate. Both are unset outside test.sh.
        "RUSTC_WORKSPACE_WRAPPER",
        "CLIPPY_ARGS",
    ] {
        if let Some(v) = std::env::var_os(var) {
            cmd.env(var, v);
        }
    }
    let hidden: Vec<CString> = HIDDEN
        .iter()
        .filter(|d| std::fs::symlink_metadata(d).is_ok_and(|m| m.is_dir()))
        .map(|d| CString::new(*d).expect("no NUL"))
        .collect();
    let run = move || -> std::io::Result<()> {
        let check = |rc: libc::c_int| {
            if rc == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        };
        // SAFETY: plain syscalls on C strings that outlive them, in the forked child.
        unsafe {
            check(libc::unshare(libc::CLONE_NEWNS))?;
            // Nothing mounted here propagates back to the host's namespace.
            check(libc::mount(
                c"none".as_ptr(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            for d in &hidden {
                check(libc::mount(
                    c"tmpfs".as_ptr(),
                    d.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
                    c"size=4k,mode=755".as_ptr().cast(),
                ))?;
            }
        }
        Ok(())
    };
    // SAFETY: the closure only makes syscalls (no allocation, no locks) between fork and exec.
    unsafe {
        cmd.pre_exec(run);
    }
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn demo_sh_needs_only_the_rust_toolchain() {
    if !prerequisite(
        is_root(),
        "root (the bare demo runs in a private mount namespace that hides /usr/sbin)",
    ) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = bare_path(dir.path());

    // The test's own setting first: none of the disk tools is reachable, by name or path.
    let mut probe = Command::new("/bin/bash");
    probe.arg("-c").arg(
        "for t in \"$@\"; do command -v \"$t\" && exit 1; \
         for d in /usr/sbin /sbin /usr/local/sbin /usr/bin /bin; do \
         [ -e \"$d/$t\" ] && echo \"$d/$t\" && exit 1; done; done; exit 0",
    );
    probe.arg("probe").args(FORBIDDEN);
    bare(&mut probe, &bin);
    let out = match probe.output() {
        Ok(out) => out,
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            prerequisite(
                false,
                &format!("a private mount namespace (CAP_SYS_ADMIN): {e}"),
            );
            return;
        }
        Err(e) => panic!("cannot run bash in a bare mount namespace: {e}"),
    };
    let (o, e) = text(&out);
    assert!(
        out.status.success(),
        "a disk tool is still reachable in the bare setting: {o}{e}"
    );

    let mut demo = Command::new("/bin/bash");
    demo.arg(workspace().join("scripts/demo.sh"))
        .args(["--timeout", "120"])
        .current_dir(dir.path());
    bare(&mut demo, &bin);
    let started = std::time::Instant::now();
    let out = demo.output().expect("running scripts/demo.sh");
    let (stdout, stderr) = text(&out);
    let tail = |s: &str| {
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    };
    assert!(
        out.status.success(),
        "bash scripts/demo.sh failed ({}) without disk tools:\n-- stdout:\n{}\n-- stderr:\n{}",
        out.status,
        tail(&stdout),
        tail(&stderr)
    );
    eprintln!("{stdout}");
    eprintln!(
        "demo.sh took {:.1} s with PATH={}",
        started.elapsed().as_secs_f64(),
        bin.display()
    );
    let want = [
        // It went through the script.
        "== building rivetd, rivet and rivet-agent",
        // The seeds are a partition table and a filesystem signature, written in Rust.
        "disk0.img: GPT (2 partitions) + ext4 superblock",
        "disk1.img: ext4 superblock",
        // The image has a partition table, so the configdrive deploy works...
        "whole-disk image (GPT, one partition)",
        "verified sha256, configdrive on ",
        // ...and the demo read the deployed disk back: the image and the config-2 ISO.
        "disk0.img: the image's 32 MiB are on the disk; config-2 ISO at",
        "disk0.img: partition table and configdrive erased",
        "== summary",
    ];
    for w in want {
        assert!(
            stdout.contains(w),
            "the demo's output lacks {w:?}:\n{stdout}"
        );
    }
    assert!(
        !stdout.contains("not installed"),
        "the demo fell back for a missing tool:\n{stdout}"
    );
}
