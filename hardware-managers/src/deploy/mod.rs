//! Deploying an image: IPA's `write_image` deploy step, in bounded memory.
//!
//! The image streams from its URL straight to the chosen disk: the download (the agent's
//! [`ImageFetcher`], resumed with HTTP Range when cut), the digest (a thread of its own,
//! over the bytes exactly as served) and decompression + writing (the step's thread)
//! overlap, so the disk sees large sequential writes while the network keeps going.
//!
//! The order is what makes `active` a promise about the disk's bytes:
//! 1. the configdrive is fetched and decoded ([`configdrive`]) before anything else;
//! 2. the image is identified by its own bytes ([`format`]): gzip (every member) and zstd
//!    (every frame, [`zstd_frames`]) are decoded; raw, ISO and qcow2 ([`qcow2`], one
//!    sequential pass) are written; anything else, or a format other than the declared or
//!    permitted one, or an image that states a size larger than the disk, is refused before
//!    the disk is opened;
//! 3. the disk's old metadata is destroyed (IPA's `destroy_disk_metadata`, the same
//!    windows as `erase_devices_metadata`);
//! 4. the image is written with its first MiB held back ([`writer`]); only once the digest
//!    matched and the rest is flushed does the head reach the disk. Any failure after the
//!    disk was opened wipes both of its ends, so nothing bootable is left;
//! 5. the GPT's backup header moves to the end of the disk and the configdrive goes into a
//!    `config-2` partition at its end ([`gpt`]); everything is flushed before success;
//! 6. on a `uefi` node, the image's EFI System Partition and loader become the firmware's
//!    first boot entry ([`uefi`]); a ramdisk that booted BIOS is refused before the disk is
//!    touched, an image without an ESP or loader fails like any other late failure (both
//!    disk ends wiped).
//!
//! The ramdisk never holds the image in memory: at most a few MiB of it are in flight.
//! Networking belongs to the agent crate; this module sees only the [`ImageFetcher`] trait.

pub mod configdrive;
pub mod format;
pub mod gpt;
pub mod qcow2;
pub mod uefi;
pub mod writer;
pub mod zstd_frames;

use crate::erase::device::{self, Target};
use crate::{HardwareManager, StepContext, StepError, SupportLevel};
use rivet_protocol::deploy::{
    algo_for_len, checksum_from_file, configdrive_is_url, redact_url, url_file_name, BootMode,
    WriteImageArgs, WriteImageResult, WRITE_IMAGE, WRITE_IMAGE_PRIORITY,
};
use rivet_protocol::inventory::Disk;
use rivet_protocol::steps::{ArgInfo, StepDescriptor};
use serde_json::{Map, Value};
use sha2::Digest;
use std::collections::BTreeMap;
use std::io::{Cursor, Read};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};
use writer::{AlignedBuf, DiskWriter};

/// An opened download.
pub struct Fetched {
    /// The body, streamed.
    pub reader: Box<dyn Read + Send>,
    /// `Content-Length`, when the server sent one.
    pub len: Option<u64>,
}

/// How the deploy manager reaches image and configdrive URLs (the agent provides it).
pub trait ImageFetcher: Send + Sync {
    /// Open `url` for a streaming read, trusting `ca_pem` besides the usual roots. A body
    /// cut mid-way is resumed (HTTP Range) or restarted, skipping what was already read, up
    /// to `retries` times, so the reader yields every byte of the file exactly once or an
    /// error.
    fn open(&self, url: &str, ca_pem: Option<&str>, retries: u32) -> Result<Fetched, String>;
}

pub use crate::DiskLister;

/// The manager offering `write_image`.
pub struct DeployManager {
    fetcher: Arc<dyn ImageFetcher>,
    disks: DiskLister,
    /// Where UEFI boot entries go; `None`: this agent stands in for a ramdisk on disks named
    /// to it, and the only firmware it could reach is its host's, which it never touches.
    efivars: Option<PathBuf>,
}

/// Name under which the deploy manager registers.
pub const NAME: &str = "deploy_hardware_manager";

impl DeployManager {
    /// A deploy manager downloading through `fetcher` onto one of `disks`.
    pub fn new(fetcher: Arc<dyn ImageFetcher>, disks: DiskLister) -> DeployManager {
        DeployManager {
            fetcher,
            disks,
            efivars: Some(PathBuf::from(uefi::DEFAULT_EFIVARS)),
        }
    }

    /// Write UEFI boot entries through efivarfs at `efivars` (default
    /// [`uefi::DEFAULT_EFIVARS`]; [`crate::ManagerConfig::efivars`]).
    pub fn with_efivars(mut self, efivars: PathBuf) -> DeployManager {
        self.efivars = Some(efivars);
        self
    }

    /// No firmware to write to: the agent runs outside a ramdisk, on disks named to it
    /// (`--devices`), so the efivarfs it could see is its host's. A UEFI deploy then fails
    /// before anything is written, saying so.
    pub fn without_firmware(mut self) -> DeployManager {
        self.efivars = None;
        self
    }
}

fn arg(description: &str, required: bool) -> ArgInfo {
    ArgInfo {
        description: description.into(),
        required,
    }
}

impl HardwareManager for DeployManager {
    fn name(&self) -> &str {
        NAME
    }

    fn evaluate_support(&self) -> SupportLevel {
        SupportLevel::Generic
    }

    fn deploy_steps(&self) -> Vec<StepDescriptor> {
        let mut args = BTreeMap::new();
        args.insert("image_source".into(), arg("http(s) URL of the image", true));
        args.insert(
            "disk_format".into(),
            arg("declared format: raw, qcow2, iso", false),
        );
        args.insert("os_hash_algo".into(), arg("sha256 or sha512", false));
        args.insert(
            "os_hash_value".into(),
            arg("hex digest of the image as served", false),
        );
        args.insert(
            "checksum".into(),
            arg("legacy digest or checksums-file URL", false),
        );
        args.insert("root_device".into(), arg("root device hints", false));
        args.insert(
            "configdrive".into(),
            arg("gzip+base64 ISO or its URL", false),
        );
        args.insert("permitted_formats".into(), arg("formats allowed", false));
        args.insert("ca_pem".into(), arg("extra CA for the URLs", false));
        vec![StepDescriptor {
            argsinfo: args,
            ..StepDescriptor::in_band(WRITE_IMAGE, WRITE_IMAGE_PRIORITY)
        }]
    }

    fn execute(
        &self,
        step: &str,
        args: &Map<String, Value>,
        ctx: &StepContext,
    ) -> Result<Value, StepError> {
        if step != WRITE_IMAGE {
            return Err(StepError::UnknownStep(step.into()));
        }
        let a = WriteImageArgs::from_args(args).map_err(|e| StepError::BadArgument {
            name: "args".into(),
            reason: e,
        })?;
        let result = self.write_image(&a, ctx)?;
        serde_json::to_value(result).map_err(|e| StepError::Failed(e.to_string()))
    }
}

fn failed(m: impl Into<String>) -> StepError {
    StepError::Failed(m.into())
}

/// The digest to verify: algorithm and lower-case hex.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Expected {
    algo: &'static str,
    hex: String,
}

/// Read until `buf` is full or the stream ends; bytes read.
fn fill(r: &mut dyn Read, buf: &mut [u8]) -> Result<usize, std::io::Error> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// The bytes as served pass through here: counted, and handed to the digest thread.
struct Tee {
    inner: Box<dyn Read + Send>,
    hash: Option<SyncSender<Vec<u8>>>,
    /// Buffers the digest thread is done with, reused: the ramdisk's allocator (musl) maps and
    /// unmaps each large allocation, which would cost page faults for every MiB.
    spent: Receiver<Vec<u8>>,
    count: Arc<std::sync::atomic::AtomicU64>,
}

impl Read for Tee {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // At most 1 MiB a read: the digest channel then holds at most 16 MiB.
        let cap = buf.len().min(1 << 20);
        let n = self.inner.read(&mut buf[..cap])?;
        if n > 0 {
            if let Some(tx) = &self.hash {
                let mut copy = self.spent.try_recv().unwrap_or_default();
                copy.clear();
                copy.extend_from_slice(&buf[..n]);
                if tx.send(copy).is_err() {
                    return Err(std::io::Error::other("the digest thread stopped"));
                }
            }
            self.count
                .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(n)
    }
}

/// Hash chunks off the channel until it closes, handing each buffer back on `spent`; the
/// hex digest.
fn digest_thread(
    algo: &'static str,
    rx: Receiver<Vec<u8>>,
    spent: SyncSender<Vec<u8>>,
) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        fn run<D: Digest>(rx: Receiver<Vec<u8>>, spent: SyncSender<Vec<u8>>) -> String {
            let mut d = D::new();
            for chunk in rx {
                d.update(&chunk);
                let _ = spent.try_send(chunk);
            }
            d.finalize().iter().map(|b| format!("{b:02x}")).collect()
        }
        match algo {
            "sha512" => run::<sha2::Sha512>(rx, spent),
            _ => run::<sha2::Sha256>(rx, spent),
        }
    })
}

/// Progress, every half second: bytes of the image as served, its total and the rate.
struct Meter<'a> {
    ctx: &'a StepContext,
    device: String,
    total: u64,
    count: Arc<std::sync::atomic::AtomicU64>,
    last: Instant,
    last_done: u64,
}

fn human(b: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < 3 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

impl Meter<'_> {
    fn tick(&mut self, force: bool) -> Result<(), String> {
        if self.ctx.is_cancelled() {
            return Err("write_image aborted".into());
        }
        let now = Instant::now();
        if !force && now - self.last < Duration::from_millis(500) {
            return Ok(());
        }
        let done = self.count.load(std::sync::atomic::Ordering::Relaxed);
        let secs = (now - self.last).as_secs_f64().max(1e-3);
        let rate = ((done - self.last_done) as f64 / secs) as u64;
        self.last = now;
        self.last_done = done;
        let of = if self.total > 0 {
            format!(" of {}", human(self.total))
        } else {
            String::new()
        };
        self.ctx.set_progress_rate(
            done,
            self.total,
            Some(rate),
            format!(
                "writing {}: {}{of} at {}/s",
                self.device,
                human(done),
                human(rate)
            ),
        );
        Ok(())
    }
}

struct QcowSink<'a, 'b> {
    disk: &'a mut DiskWriter,
    bounce: &'a mut AlignedBuf,
    meter: &'a mut Meter<'b>,
}

impl qcow2::ClusterSink for QcowSink<'_, '_> {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), String> {
        self.disk.write_copy(offset, data, self.bounce)
    }

    fn progress(&mut self, _consumed: u64) -> Result<(), String> {
        self.meter.tick(false)
    }
}

impl DeployManager {
    fn expected(&self, a: &WriteImageArgs) -> Result<Expected, StepError> {
        match (&a.os_hash_algo, &a.os_hash_value, &a.checksum) {
            (Some(algo), Some(hex), _) => {
                let algo = match algo.as_str() {
                    "sha256" => "sha256",
                    "sha512" => "sha512",
                    other => return Err(failed(format!("os_hash_algo {other:?} is not supported; use sha256 or sha512"))),
                };
                Ok(Expected {
                    algo,
                    hex: hex.trim().to_ascii_lowercase(),
                })
            }
            (_, _, Some(c)) if configdrive_is_url(c) => {
                let fetched = self
                    .fetcher
                    .open(c, a.ca_pem.as_deref(), a.retries())
                    .map_err(|e| failed(format!("fetching the checksums file {c}: {e}")))?;
                let mut text = String::new();
                fetched
                    .reader
                    .take(1 << 20)
                    .read_to_string(&mut text)
                    .map_err(|e| failed(format!("reading the checksums file {c}: {e}")))?;
                let file = url_file_name(&a.image_source);
                let hex = checksum_from_file(&text, &file).ok_or_else(|| {
                    failed(format!("the checksums file {c} has no line for {file}"))
                })?;
                let algo = algo_for_len(hex.len()).ok_or_else(|| {
                    failed(format!("the checksum for {file} in {c} is not a sha256 or sha512 digest"))
                })?;
                Ok(Expected { algo, hex })
            }
            (_, _, Some(c)) => {
                let hex = c.trim().to_ascii_lowercase();
                let algo = algo_for_len(hex.len()).ok_or_else(|| {
                    failed("image_checksum must be a sha256 or sha512 hex digest (md5 is refused)")
                })?;
                Ok(Expected { algo, hex })
            }
            _ => Err(failed("no digest to verify the image with: give os_hash_algo and os_hash_value, or checksum")),
        }
    }

    /// The disk to write: root device hints over the safe candidates, else the smallest of
    /// at least 4 GiB. Mounted disks, swap, disks holding the running ramdisk, read-only
    /// devices, zram/ram and empty devices are never candidates.
    fn choose_target(&self, a: &WriteImageArgs) -> Result<(Target, String), StepError> {
        let mounts = device::mounts();
        let boot = device::boot_media(&mounts);
        let swaps = device::swap_devnos();
        let mut left_out = Vec::new();
        let mut safe: Vec<(Disk, Target)> = Vec::new();
        for d in (self.disks)() {
            let base = d.name.rsplit('/').next().unwrap_or_default();
            if d.size == 0 || base.starts_with("zram") || base.starts_with("ram") {
                left_out.push(format!("{} (not a disk)", d.name));
                continue;
            }
            let t = match Target::open(&PathBuf::from(&d.name)) {
                Ok(t) => t,
                Err(e) => {
                    left_out.push(format!("{} ({e})", d.name));
                    continue;
                }
            };
            match device::check(&t, &[], false, &mounts, &boot, &swaps) {
                Ok(None) => safe.push((d, t)),
                Ok(Some(skip)) => left_out.push(format!("{} ({skip})", d.name)),
                Err(e) => left_out.push(format!("{} ({e})", d.name)),
            }
        }
        let disks: Vec<Disk> = safe.iter().map(|(d, _)| d.clone()).collect();
        let hints = a.root_device.as_ref().filter(|h| !h.is_empty());
        // Without hints, a software RAID root mirror is the deploy target whatever its size
        // (its members are held by it, so they are not candidates): see crate::raid.
        if hints.is_none() {
            if let Some(mirror) = crate::raid::md::root_mirror(Path::new("/sys/block")) {
                let path = mirror.path().display().to_string();
                if let Some(i) = safe.iter().position(|(d, _)| d.name == path) {
                    let (_, t) = safe.swap_remove(i);
                    let why = format!(
                        "the software RAID root mirror (RAID-1 over {})",
                        mirror.members.join(", ")
                    );
                    return Ok((t, why));
                }
            }
        }
        let chosen =
            rivet_protocol::hints::root_disk(&disks, hints).map_err(|e| failed(e.to_string()))?;
        let Some(chosen) = chosen else {
            let wanted = match hints {
                Some(h) => format!(
                    "no disk matches the root device hints {}",
                    Value::Object(h.clone())
                ),
                None => "no disk of at least 4 GiB".into(),
            };
            let candidates: Vec<String> = disks
                .iter()
                .map(|d| format!("{} ({})", d.name, human(d.size)))
                .collect();
            return Err(failed(format!(
                "{wanted}; candidates: [{}]; left out: [{}]",
                candidates.join(", "),
                left_out.join(", ")
            )));
        };
        let why = match hints {
            Some(h) => format!("root device hints {}", Value::Object(h.clone())),
            None => "smallest disk of at least 4 GiB".into(),
        };
        let target = safe
            .into_iter()
            .find(|(d, _)| d.name == chosen.name)
            .map(|(_, t)| t)
            .ok_or_else(|| failed("chosen disk vanished"))?;
        Ok((target, why))
    }

    /// The configdrive ISO's bytes, from the inline string or fetched from its URL, in any
    /// of the forms [`configdrive::decode`] takes.
    fn configdrive(&self, a: &WriteImageArgs, cd: &str) -> Result<Vec<u8>, StepError> {
        let iso = if configdrive_is_url(cd) {
            let url = cd.trim();
            // A URL may carry credentials (rivetd's cache puts the node's token in it).
            let shown = redact_url(url);
            let f = self
                .fetcher
                .open(url, a.ca_pem.as_deref(), a.retries())
                .map_err(|e| failed(format!("fetching the configdrive {shown}: {e}")))?;
            let mut body = Vec::new();
            f.reader
                .take(configdrive::MAX_ENCODED_BYTES + 1)
                .read_to_end(&mut body)
                .map_err(|e| failed(format!("reading the configdrive {shown}: {e}")))?;
            configdrive::decode(&body).map_err(|e| failed(format!("configdrive {shown}: {e}")))?
        } else {
            configdrive::decode(cd.as_bytes()).map_err(failed)?
        };
        Ok(iso)
    }

    fn write_image(
        &self,
        a: &WriteImageArgs,
        ctx: &StepContext,
    ) -> Result<WriteImageResult, StepError> {
        let started = Instant::now();
        if !(a.image_source.starts_with("http://") || a.image_source.starts_with("https://")) {
            return Err(failed(format!(
                "image_source {:?} is not an http(s) URL",
                a.image_source
            )));
        }
        let expected = self.expected(a)?;
        let uefi = a.boot_mode == Some(BootMode::Uefi);
        // Knowable now: a BIOS-booted ramdisk cannot write a UEFI entry, so it fails before
        // the image is downloaded, with the node's old disk untouched.
        if uefi {
            let Some(efivars) = &self.efivars else {
                return Err(failed(
                    "the node's boot_mode is uefi, but this agent stands in for a ramdisk on \
                     the disks named by --devices (or RIVET_DEVICES): the only firmware it \
                     could change is this host's, which it never touches, so it cannot write \
                     the UEFI boot entry; give the node boot_mode bios \
                     (properties.capabilities boot_mode:bios), or set RIVET_EFIVARS to a \
                     directory that stands in for the node's NVRAM"
                        .to_string(),
                ));
            };
            uefi::preflight(efivars).map_err(|e| failed(e.to_string()))?;
        }
        let (target, chosen_by) = self.choose_target(a)?;
        let device = target.display();
        tracing::info!(device = %device, chosen_by = %chosen_by, image = %redact_url(&a.image_source), "write_image: target chosen");
        // The configdrive is fetched and checked first: a bad one fails in seconds, with the
        // disk untouched, not after the whole image was written.
        let iso = match a.configdrive.as_deref().filter(|c| !c.trim().is_empty()) {
            Some(cd) => Some(self.configdrive(a, cd)?),
            None => None,
        };
        let fetched = self
            .fetcher
            .open(&a.image_source, a.ca_pem.as_deref(), a.retries())
            .map_err(|e| failed(format!("downloading {}: {e}", redact_url(&a.image_source))))?;
        let (tx, rx) = sync_channel::<Vec<u8>>(16);
        let (spent_tx, spent_rx) = sync_channel::<Vec<u8>>(18);
        let hasher = digest_thread(expected.algo, rx, spent_tx);
        let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut tee = Tee {
            inner: fetched.reader,
            hash: Some(tx),
            spent: spent_rx,
            count: count.clone(),
        };
        let mut meter = Meter {
            ctx,
            device: device.clone(),
            total: fetched.len.unwrap_or(0),
            count: count.clone(),
            last: started,
            last_done: 0,
        };
        let plan = Plan {
            served_len: fetched.len,
            configdrive_len: iso.as_ref().map(|i| i.len() as u64),
        };
        let outcome = self.stream(a, &plan, &mut tee, &target, &mut meter);
        // Drain what the decoder did not need (padding, trailing refcounts), for the digest.
        let drained = outcome.as_ref().ok().map(|_| {
            let mut sink = std::io::sink();
            std::io::copy(&mut tee, &mut sink)
        });
        drop(tee);
        let actual = hasher
            .join()
            .map_err(|_| failed("the digest thread panicked"));
        // Refused before the disk was opened, or failed after it was wiped: either way
        // nothing bootable is on it (the stream wipes the ends itself on its failures).
        let mut written = outcome?;
        let finish = (|| -> Result<WriteImageResult, StepError> {
            let actual = actual?;
            if let Some(Err(e)) = drained {
                return Err(failed(format!(
                    "reading the end of {}: {e}",
                    redact_url(&a.image_source)
                )));
            }
            if actual != expected.hex {
                return Err(failed(format!(
                    "image {} failed verification: {} expected {}, computed {}; nothing bootable was left on {device}",
                    redact_url(&a.image_source), expected.algo, expected.hex, actual
                )));
            }
            meter.tick(true).map_err(meter_error)?;
            let disk = &mut written.disk;
            // The body first, then the head: the image becomes bootable only once all of it
            // is verified and on stable storage.
            disk.flush().map_err(failed)?;
            disk.commit_head().map_err(failed)?;
            let dev = gpt::Device::new(disk.file(), &device, target.sector, target.size);
            gpt::relocate_backup(&dev).map_err(|e| failed(e.to_string()))?;
            let mut configdrive_partition = None;
            if let Some(iso) = &iso {
                let placed = {
                    let label_at = |offset: u64| {
                        iso_label_at(disk.file(), offset).as_deref() == Some("config-2")
                    };
                    gpt::config_partition(&dev, 64 << 20, iso.len() as u64, &label_at)
                        .map_err(|e| failed(e.to_string()))?
                };
                if iso.len() as u64 > placed.len {
                    return Err(failed(format!(
                        "the configdrive ({} bytes) does not fit its partition ({} bytes) on {device}",
                        iso.len(),
                        placed.len
                    )));
                }
                // Clear the start of the partition (a stale filesystem signature) before the ISO.
                use std::os::unix::fs::FileExt;
                let head = vec![0u8; (placed.len.min(1 << 20)) as usize];
                disk.file()
                    .write_all_at(&head, placed.offset)
                    .and_then(|_| disk.file().write_all_at(iso, placed.offset))
                    .map_err(|e| failed(format!("{device}: writing the configdrive: {e}")))?;
                configdrive_partition = Some(partition_path(&device, placed.number));
                tracing::info!(device = %device, partition = placed.number, reused = placed.reused, "configdrive written");
            }
            // Durable before success is reported: the GPT fix-up and the configdrive too.
            disk.flush().map_err(failed)?;
            // Last: the entry points at a disk that is complete. On failure the caller wipes
            // the disk's ends (install leaves no entry behind).
            let uefi_boot_entry = match (&self.efivars, uefi) {
                (Some(efivars), true) => Some(
                    uefi::install(disk.file(), &device, target.sector, target.size, efivars)
                        .map_err(|e| failed(e.to_string()))?,
                ),
                // Refused before the download when there is no firmware to write to.
                _ => None,
            };
            if let Err(e) = disk.reread() {
                tracing::warn!(error = %e, "the kernel did not re-read the partition table; the table on the disk is right");
            }
            Ok(WriteImageResult {
                device: device.clone(),
                chosen_by: chosen_by.clone(),
                format: written.format.name().to_string(),
                compression: written.compression.map(|c| c.name().to_string()),
                image_bytes: count.load(std::sync::atomic::Ordering::Relaxed),
                virtual_size: written.virtual_size,
                hash_algo: expected.algo.to_string(),
                hash_value: actual,
                configdrive_partition,
                seconds: started.elapsed().as_secs_f64(),
                uefi_boot_entry,
            })
        })();
        finish.inspect_err(|e| wipe_after_failure(&written.disk, e))
    }

    /// Decompress, identify, check, clear the disk, write. The disk is opened only once the
    /// image is known to be one Rivet writes and to fit; from then on every failure wipes
    /// both ends of the disk before it is returned.
    fn stream(
        &self,
        a: &WriteImageArgs,
        plan: &Plan,
        tee: &mut Tee,
        target: &Target,
        meter: &mut Meter<'_>,
    ) -> Result<Written, StepError> {
        let src = &redact_url(&a.image_source);
        let declared = a.disk_format.as_deref().unwrap_or("raw");
        let mut head = vec![0u8; 512];
        let n = fill(tee, &mut head).map_err(|e| failed(format!("downloading {src}: {e}")))?;
        head.truncate(n);
        let compression = format::sniff_compression(&head).map_err(|name| {
            failed(format!(
                "image {src} is {name}-compressed but instance_info declares {declared}: Rivet decodes gzip and zstd only (recompress it, or serve it uncompressed); refused before writing"
            ))
        })?;
        let raw_in = Cursor::new(head).chain(tee);
        let mut body: Box<dyn Read + '_> = match compression {
            Some(format::Compression::Gzip) => Box::new(flate2::read::MultiGzDecoder::new(raw_in)),
            Some(format::Compression::Zstd) => {
                Box::new(zstd_frames::MultiFrameDecoder::new(raw_in))
            }
            None => Box::new(raw_in),
        };
        // Enough to recognise every format (ISO 9660's descriptor sits at 32 KiB) and a whole
        // qcow2 header cluster of up to 64 KiB (bigger clusters are read by the decoder).
        let mut first = vec![0u8; 128 << 10];
        let n = fill(&mut *body, &mut first)
            .map_err(|e| failed(format!("reading {src}{}: {e}", compressed_as(compression))))?;
        first.truncate(n);
        let content = format::detect(&first);
        if let format::Content::Refused(what) = content {
            return Err(failed(format!(
                "image {src} is {what}{} but instance_info declares {declared}: Rivet writes raw, qcow2 and iso images (convert it with `qemu-img convert -O raw` or `-O qcow2`); refused before writing",
                compressed_as(compression)
            )));
        }
        if a.disk_format.is_some() && !format::declared_matches(declared, content) {
            return Err(failed(format!(
                "image {src} is {}{} but instance_info declares {declared}: refused before writing",
                content.name(),
                compressed_as(compression)
            )));
        }
        let permitted = a.permitted();
        if !permitted.iter().any(|p| p == content.name()) {
            return Err(failed(format!(
                "image format {} is not permitted (permitted: {}): refused before writing",
                content.name(),
                permitted.join(", ")
            )));
        }
        // Size before the first byte: what the image states about itself.
        let (needed, why) = match content {
            format::Content::Qcow2 => {
                let h = qcow2::parse_header(&first).map_err(|e| failed(e.to_string()))?;
                (Some(h.size), "its qcow2 virtual size")
            }
            _ => match (compression, plan.served_len) {
                (None, Some(len)) => (Some(len), "its Content-Length"),
                _ => (
                    format::stated_raw_size(&first),
                    "the size its partition table or ISO header states",
                ),
            },
        };
        // The config-2 partition shrinks below its usual 64 MiB on a small disk as long as the
        // ISO fits (gpt::config_partition): what must fit is the ISO, MiB-aligned, plus a MiB
        // for the partition's alignment and the backup GPT behind it.
        const MIB: u64 = 1 << 20;
        let cd = plan
            .configdrive_len
            .map(|l| l.div_ceil(MIB) * MIB + MIB)
            .unwrap_or(0);
        if let Some(needed) = needed {
            if needed.saturating_add(cd) > target.size {
                let with = if cd > 0 {
                    format!(" plus {} for the configdrive", human(cd))
                } else {
                    String::new()
                };
                return Err(failed(format!(
                    "image {src} needs {} bytes ({why}){with}, more than {} holds ({} bytes): refused with the disk untouched",
                    needed,
                    target.display(),
                    target.size
                )));
            }
        }
        meter.ctx.check()?;
        let mut disk = DiskWriter::open(target).map_err(failed)?;
        let wrote = self.clear_and_write(&mut disk, content, first, &mut *body, target, meter);
        match wrote {
            Ok(virtual_size) => Ok(Written {
                disk,
                format: content,
                compression,
                virtual_size,
            }),
            Err(e) => {
                wipe_after_failure(&disk, &e);
                Err(e)
            }
        }
    }

    /// Destroy the disk's old metadata, then write the image (its head held back).
    fn clear_and_write(
        &self,
        disk: &mut DiskWriter,
        content: format::Content,
        first: Vec<u8>,
        body: &mut dyn Read,
        target: &Target,
        meter: &mut Meter<'_>,
    ) -> Result<u64, StepError> {
        // A clean slate, as IPA's destroy_disk_metadata: every signature a probe would find
        // on the disk or its old partitions (both GPT headers, MBR, filesystems, LVM, md at
        // either end) goes before the first byte of the image. The disk's head is then zero
        // until the verified image's head is committed.
        let plan = crate::erase::metadata::plan(target).map_err(|e| failed(e.to_string()))?;
        crate::erase::metadata::erase(target, &plan, meter.ctx, &mut |_| {}).map_err(
            |e| match e {
                crate::erase::EraseError::Aborted => StepError::Aborted,
                e => failed(format!(
                    "clearing the old metadata of {}: {e}",
                    target.display()
                )),
            },
        )?;
        tracing::info!(device = %target.display(), partitions = plan.partitions.len(), bytes = plan.bytes(), "old disk metadata destroyed");
        let mut bounce = AlignedBuf::new(8 << 20);
        let src = "the image";
        if content == format::Content::Qcow2 {
            let decoded = {
                let mut sink = QcowSink {
                    disk: &mut *disk,
                    bounce: &mut bounce,
                    meter: &mut *meter,
                };
                qcow2::decode(first, &mut *body, &mut sink)
            };
            let (header, _) = decoded.map_err(|e| match e {
                qcow2::Qcow2Error::Sink(m) if m.contains("aborted") => StepError::Aborted,
                e => failed(e.to_string()),
            })?;
            let check = || {
                if meter_cancelled(meter) {
                    Err("write_image aborted".to_string())
                } else {
                    Ok(())
                }
            };
            disk.zero_gaps(header.size, &check).map_err(meter_error)?;
            return Ok(header.size);
        }
        // Raw (and ISO): sequential, aligned, 8 MiB at a time.
        let mut offset = 0u64;
        let head_len = first.len();
        bounce.buf_mut()[..head_len].copy_from_slice(&first);
        let mut have = head_len;
        loop {
            let cap = bounce.buf_mut().len();
            let n = fill(&mut *body, &mut bounce.buf_mut()[have..cap])
                .map_err(|e| failed(format!("reading {src}: {e}")))?;
            have += n;
            if have == 0 {
                break;
            }
            disk.write_at(offset, bounce.slice(have)).map_err(failed)?;
            offset += have as u64;
            meter.tick(false).map_err(meter_error)?;
            if n == 0 || have < cap {
                break;
            }
            have = 0;
        }
        Ok(offset)
    }
}

/// What [`DeployManager::stream`] knows before it starts: the served length and the
/// configdrive's size, for the size check.
struct Plan {
    served_len: Option<u64>,
    configdrive_len: Option<u64>,
}

/// An image written (head still held) and what it was.
struct Written {
    disk: DiskWriter,
    format: format::Content,
    compression: Option<format::Compression>,
    virtual_size: u64,
}

fn compressed_as(c: Option<format::Compression>) -> String {
    c.map(|c| format!(" ({}-compressed)", c.name()))
        .unwrap_or_default()
}

fn meter_error(e: String) -> StepError {
    if e.contains("aborted") {
        StepError::Aborted
    } else {
        failed(e)
    }
}

/// After a failure with the disk open: zero both of its ends so no firmware finds a
/// partition table or boot code (the head was never written, but a GPT fix-up or the
/// configdrive may have failed after it was).
fn wipe_after_failure(disk: &DiskWriter, why: &StepError) {
    match disk.wipe_ends() {
        Ok(()) => {
            tracing::warn!(device = %disk.device, error = %why, "write_image failed; both ends of the disk wiped, nothing bootable left on it")
        }
        Err(e) => {
            tracing::error!(device = %disk.device, error = %why, wipe_error = %e, "write_image failed and wiping the disk's ends failed too: it may hold an unverified image")
        }
    }
}

fn meter_cancelled(m: &Meter<'_>) -> bool {
    m.ctx.is_cancelled()
}

/// `/dev/vda` + 3 → `/dev/vda3`; `/dev/nvme0n1`, `/dev/loop3` → `…p3`; a file → `file#3`.
fn partition_path(device: &str, n: u32) -> String {
    if !device.starts_with("/dev/") {
        return format!("{device}#{n}");
    }
    if device.ends_with(|c: char| c.is_ascii_digit()) {
        format!("{device}p{n}")
    } else {
        format!("{device}{n}")
    }
}

/// The ISO 9660 volume label at a byte offset of the disk, if an ISO starts there.
fn iso_label_at(f: &std::fs::File, offset: u64) -> Option<String> {
    use std::os::unix::fs::FileExt;
    let mut pvd = [0u8; 72];
    f.read_exact_at(&mut pvd, offset + 0x8000).ok()?;
    if &pvd[1..6] != b"CD001" {
        return None;
    }
    Some(String::from_utf8_lossy(&pvd[40..72]).trim().to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn checksums_file_lines() {
        let text = "abc123  other.img\nDEAD  image.raw\nSHA256 (bsd.img) = BEEF\n";
        assert_eq!(
            checksum_from_file(text, "image.raw").as_deref(),
            Some("dead")
        );
        assert_eq!(checksum_from_file(text, "bsd.img").as_deref(), Some("beef"));
        assert_eq!(checksum_from_file(text, "nope"), None);
        assert_eq!(url_file_name("http://h/a/b/img.qcow2?x=1"), "img.qcow2");
    }

    #[test]
    fn partition_paths() {
        assert_eq!(partition_path("/dev/vda", 3), "/dev/vda3");
        assert_eq!(partition_path("/dev/nvme0n1", 2), "/dev/nvme0n1p2");
        assert_eq!(partition_path("/tmp/d.img", 2), "/tmp/d.img#2");
    }
}
