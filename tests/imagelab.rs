//! The bench for `write_image` tests: an image server on loopback, loop devices over sparse
//! files, the deploy manager with the agent's real HTTP fetcher, and readers of what landed.
//!
//! Checks read the loop device's *backing file*, not the device: bytes still in the block
//! device's page cache do not show there, so a check that passes proves the writer flushed.

use crate::agentproc::LoopDevice;
use crate::fileserver::FileServer;
use crate::{gpt_one_partition, run_tool, sha256_file};
use anyhow::{ensure, Result};
use rivet_agent::fetch::HttpFetcher;
use rivet_hardware_managers::deploy::{DeployManager, DiskLister};
use rivet_hardware_managers::{HardwareManager, StepContext};
use rivet_protocol::deploy::{WriteImageArgs, WriteImageResult};
use rivet_protocol::inventory::Disk;
use serde_json::json;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// One mebibyte.
pub const MIB: u64 = 1 << 20;

/// A loop device and the sparse file behind it.
pub struct TestDisk {
    /// The device (detached on drop).
    pub dev: LoopDevice,
    /// The backing file.
    pub file: PathBuf,
    /// Size in bytes.
    pub size: u64,
}

impl TestDisk {
    /// `/dev/loopN`.
    pub fn path(&self) -> &Path {
        &self.dev.path
    }

    /// `len` bytes at `offset`, read from the backing file (what reached the device).
    pub fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let f = std::fs::File::open(&self.file)?;
        let mut buf = vec![0u8; len];
        f.read_exact_at(&mut buf, offset)?;
        Ok(buf)
    }

    /// Root device hints naming this disk.
    pub fn hints(&self) -> serde_json::Map<String, serde_json::Value> {
        json!({"name": self.dev.path.display().to_string()})
            .as_object()
            .cloned()
            .unwrap_or_default()
    }

    /// Fails unless nothing on the disk would make a firmware boot it: no MBR boot signature,
    /// no primary GPT header (512- or 4096-byte sectors), no backup GPT header in the last MiB.
    pub fn assert_nothing_bootable(&self, what: &str) -> Result<()> {
        let head = self.read(0, 8192)?;
        ensure!(
            head[510..512] != [0x55, 0xAA],
            "{what}: the disk still has an MBR boot signature"
        );
        ensure!(
            &head[512..520] != b"EFI PART" && &head[4096..4104] != b"EFI PART",
            "{what}: the disk still has a primary GPT header"
        );
        let tail_at = self.size - MIB;
        let tail = self.read(tail_at, MIB as usize)?;
        for (i, s) in tail.chunks(512).enumerate() {
            ensure!(
                &s[..8] != b"EFI PART",
                "{what}: a GPT header remains at byte {} (the disk's last MiB)",
                tail_at + i as u64 * 512
            );
        }
        Ok(())
    }
}

/// The image server, its directory and a reference raw image.
pub struct ImageLab {
    /// Temp dir holding `www/` and the disks' backing files.
    pub dir: tempfile::TempDir,
    /// Serves `www/`.
    pub server: FileServer,
    /// `www/img.raw`: a 24 MiB GPT image (see [`raw_image`]).
    pub raw: PathBuf,
}

/// A 24 MiB GPT image: pseudo-random data in its partition, with a 4 MiB hole of zeroes in
/// the middle (so qcow2 leaves clusters unallocated there).
pub fn raw_image(path: &Path, mib: u64, seed: u64) -> Result<()> {
    std::fs::write(path, pattern(mib * MIB, seed))?;
    gpt_one_partition(path)?;
    Ok(())
}

/// `len` pseudo-random bytes (xorshift from `seed`), with MiB 10–13 left zero.
pub fn pattern(len: u64, seed: u64) -> Vec<u8> {
    let mut data = vec![0u8; len as usize];
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ seed;
    for (i, chunk) in data.chunks_mut(8).enumerate() {
        let mib = i as u64 * 8 / MIB;
        if (10..14).contains(&mib) {
            continue;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    data
}

impl ImageLab {
    /// A fresh lab with `www/img.raw` (24 MiB, GPT).
    pub fn new() -> Result<ImageLab> {
        let dir = tempfile::tempdir()?;
        let www = dir.path().join("www");
        std::fs::create_dir(&www)?;
        let raw = www.join("img.raw");
        raw_image(&raw, 24, 0)?;
        let server = FileServer::start(&www)?;
        Ok(ImageLab { dir, server, raw })
    }

    /// A file in `www/`.
    pub fn www(&self, name: &str) -> PathBuf {
        self.dir.path().join("www").join(name)
    }

    /// Run `sh -c script` with `$RAW` and `$WWW` set.
    pub fn sh(&self, script: &str) -> Result<String> {
        run_tool(
            Command::new("sh")
                .arg("-c")
                .arg(script)
                .env("RAW", &self.raw)
                .env("WWW", self.dir.path().join("www")),
        )
    }

    /// A loop device over a fresh sparse file of `mib` MiB, filled with 0xAB in its first
    /// 64 MiB so stale data would show.
    pub fn disk(&self, name: &str, mib: u64) -> Result<TestDisk> {
        let f = self.dir.path().join(name);
        let file = std::fs::File::create(&f)?;
        file.set_len(mib * MIB)?;
        file.write_all_at(&vec![0xABu8; (64.min(mib) * MIB) as usize], 0)?;
        drop(file);
        Ok(TestDisk {
            dev: LoopDevice::attach(&f)?,
            file: f,
            size: mib * MIB,
        })
    }

    /// `write_image` arguments for `www/name` on `disk`, with its sha256.
    pub fn args(&self, name: &str, disk: &TestDisk) -> Result<WriteImageArgs> {
        Ok(WriteImageArgs {
            image_source: self.server.url_of(name),
            os_hash_algo: Some("sha256".into()),
            os_hash_value: Some(sha256_file(&self.www(name))?),
            root_device: Some(disk.hints()),
            ..Default::default()
        })
    }
}

/// A deploy manager over `disks`, downloading with the agent's real fetcher.
pub fn manager(disks: Vec<PathBuf>) -> DeployManager {
    let lister: DiskLister = Arc::new(move || {
        disks
            .iter()
            .map(|p| {
                let size = std::fs::File::open(p)
                    .and_then(|f| {
                        use std::io::Seek;
                        let mut f = f;
                        f.seek(std::io::SeekFrom::End(0))
                    })
                    .unwrap_or(0);
                Disk {
                    name: p.display().to_string(),
                    size,
                    ..Default::default()
                }
            })
            .collect()
    });
    DeployManager::new(Arc::new(HttpFetcher::new(None)), lister)
}

/// Run `write_image`; the result or the error's text.
pub fn write(m: &DeployManager, args: &WriteImageArgs) -> Result<WriteImageResult, String> {
    write_with(m, args, &StepContext::new())
}

/// [`write`] with a step context the caller holds (to abort it).
pub fn write_with(
    m: &DeployManager,
    args: &WriteImageArgs,
    ctx: &StepContext,
) -> Result<WriteImageResult, String> {
    m.execute("write_image", &args.to_args(), ctx)
        .map_err(|e| e.to_string())
        .and_then(|v| serde_json::from_value(v).map_err(|e| e.to_string()))
}

/// The device holds the raw image's bytes where its GPT does not change them (the first
/// and last MiB hold the partition tables the writer fixes up).
pub fn check_image(disk: &TestDisk, raw: &Path) -> Result<()> {
    let want = std::fs::read(raw)?;
    let body = (MIB as usize)..(want.len() - MIB as usize);
    let got = disk.read(0, want.len())?;
    ensure!(
        got[body.clone()] == want[body],
        "image bytes differ on {}",
        disk.path().display()
    );
    ensure!(
        got[..440] == want[..440] && got[510..512] == want[510..512],
        "the image's boot sector is not on {}",
        disk.path().display()
    );
    Ok(())
}
