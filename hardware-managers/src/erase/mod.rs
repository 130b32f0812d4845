//! The erase engine behind `erase_devices`, `erase_devices_express` and
//! `erase_devices_metadata`.
//!
//! Flow for one step: open every target, decide for each whether it is skipped (skip list,
//! read-only, boot media) or refused (mounted, swap, held by dm/md — unless `force`), and
//! only then start writing, so a refusal never leaves a half-erased machine. Devices run in
//! parallel (`concurrency`, default 4); each reports bytes into one aggregate progress.
//!
//! Method per device (full erase), in order of preference:
//! 1. NVMe Format NVM with secure erase (crypto if FNA says so), else NVMe Sanitize.
//! 2. ATA security erase (enhanced when supported) on libata disks.
//! 3. `random_passes` pseudo-random overwrites, then zeroing:
//!    * discard (BLKSECDISCARD, else BLKDISCARD) only when the kernel reports
//!      `queue/discard_zeroes_data` = 1. Linux ≥ 4.12 always reports 0 there: a plain
//!      discard gives no zeroing guarantee, so we do not rely on it;
//!    * otherwise BLKZEROOUT, which the kernel turns into WRITE ZEROES / WRITE SAME (an
//!      unmapping zeroing offload: `queue/write_zeroes_max_bytes` > 0) or, failing that,
//!      its own zero-page writes — zeroes are guaranteed either way;
//!    * plain zero overwrite if BLKZEROOUT is refused. Regular files are overwritten.
//! 4. Verify: the first and last MiB and `verify_samples` random MiB must read zero. A
//!    secure erase whose result does not read zero (crypto erase may leave noise) is
//!    followed by the zeroing of step 3 and verified again.
//!
//! Express keeps only the fast, guaranteed paths: NVMe format/sanitize, discard with
//! `discard_zeroes_data`, BLKZEROOUT when the device both discards and offloads write-zeroes
//! (`discard_max_bytes` > 0 and `write_zeroes_max_bytes` > 0: the kernel unmaps instead of
//! writing), hole punching for files; anything else fails the step.

pub mod ata;
pub mod device;
pub mod ioctl;
pub mod metadata;
pub mod nvme;
pub mod table;
pub mod zero;

use crate::StepContext;
use device::{Target, TargetKind};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Why an erase failed.
#[derive(Debug, thiserror::Error)]
pub enum EraseError {
    /// The step was cancelled.
    #[error("erase aborted")]
    Aborted,
    /// An I/O call failed.
    #[error("{device}: {op} failed: {source}")]
    Io {
        /// Device path.
        device: String,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// Neither a block device nor a regular file.
    #[error("{device}: not a block device or regular file; refusing to erase it")]
    NotADisk {
        /// Path.
        device: String,
    },
    /// It or one of its partitions is mounted (or is active swap).
    #[error(
        "{device} is in use: {source_dev} is mounted on {mountpoint}; unmount it or pass \
         \"force\": true to erase it anyway"
    )]
    Mounted {
        /// Device path.
        device: String,
        /// The mounted device (the disk itself or a partition).
        source_dev: String,
        /// Mount point (`[swap]` for swap).
        mountpoint: String,
    },
    /// Another block device is stacked on it.
    #[error(
        "{device} is in use by {holder} (device-mapper/md on top of it); stop that device or \
         pass \"force\": true"
    )]
    Held {
        /// Device path.
        device: String,
        /// Holder name (e.g. `dm-0`).
        holder: String,
    },
    /// A non-zero byte was read back after the erase.
    #[error("{device}: verification failed: non-zero data at offset {offset} after erase")]
    Verify {
        /// Device path.
        device: String,
        /// First non-zero byte found.
        offset: u64,
    },
    /// NVMe or ATA secure erase failed or is impossible.
    #[error("{device}: secure erase failed: {reason}")]
    SecureErase {
        /// Device path.
        device: String,
        /// What went wrong.
        reason: String,
    },
    /// No method allowed in this mode works on the device.
    #[error("{device}: {reason}")]
    Unsupported {
        /// Device path.
        device: String,
        /// Why.
        reason: String,
    },
    /// Several devices failed; all of them are listed.
    #[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Devices(Vec<EraseError>),
}

impl From<crate::StepError> for EraseError {
    fn from(_: crate::StepError) -> Self {
        // The only StepError the engine sees is ctx.check()'s Aborted.
        EraseError::Aborted
    }
}

impl From<EraseError> for crate::StepError {
    fn from(e: EraseError) -> Self {
        match e {
            EraseError::Aborted => crate::StepError::Aborted,
            other => crate::StepError::Failed(other.to_string()),
        }
    }
}

/// Sort and merge overlapping or touching `(offset, len)` ranges.
pub fn merge_ranges(mut r: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    r.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(r.len());
    for (o, l) in r {
        if let Some(last) = out.last_mut() {
            if o <= last.0 + last.1 {
                last.1 = last.1.max(o + l - last.0);
                continue;
            }
        }
        out.push((o, l));
    }
    out
}

/// Which erase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Partition tables and signatures only.
    Metadata,
    /// Every byte, best method per device.
    Full,
    /// Only fast methods with a zeroing guarantee.
    Express,
}

impl Mode {
    fn step(self) -> &'static str {
        match self {
            Mode::Metadata => "erase_devices_metadata",
            Mode::Full => "erase_devices",
            Mode::Express => "erase_devices_express",
        }
    }
}

/// Knobs for one erase (from ManagerConfig, overridden by step args).
#[derive(Debug, Clone)]
pub struct EraseOptions {
    /// Devices erased at once.
    pub concurrency: usize,
    /// Pseudo-random overwrite passes before zeroing (full erase, zeroing path only).
    pub random_passes: u32,
    /// Random 1 MiB ranges read back, besides the first and last MiB.
    pub verify_samples: u32,
    /// Try NVMe/ATA secure erase first.
    pub secure_erase: bool,
    /// When a secure erase fails, zero the device instead of failing the step.
    pub continue_if_secure_erase_failed: bool,
    /// Erase mounted/held devices anyway.
    pub force: bool,
    /// Names, paths, serials or WWNs to leave alone.
    pub skip: Vec<String>,
}

impl Default for EraseOptions {
    fn default() -> Self {
        EraseOptions {
            concurrency: 4,
            random_passes: 0,
            verify_samples: 16,
            secure_erase: true,
            continue_if_secure_erase_failed: false,
            force: false,
            skip: Vec::new(),
        }
    }
}

/// Secure-erase capability of a device, probed once.
#[derive(Debug, Clone, Copy, Default)]
pub struct Caps {
    /// NVMe namespace with its controller's capabilities.
    pub nvme: Option<nvme::NvmeDevice>,
    /// ATA security state (libata disks only).
    pub ata: Option<ata::AtaSecurity>,
    /// `queue/discard_zeroes_data` = 1 (pre-4.12 kernels only).
    pub discard_zeroes_data: bool,
    /// `queue/discard_max_bytes` > 0.
    pub discard: bool,
    /// `queue/write_zeroes_max_bytes` > 0.
    pub write_zeroes: bool,
    /// A regular file.
    pub file: bool,
}

/// One action of an erase plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// NVMe Format NVM with secure erase.
    NvmeFormat,
    /// NVMe Sanitize.
    NvmeSanitize,
    /// ATA SECURITY ERASE UNIT.
    AtaErase,
    /// One pseudo-random overwrite pass.
    Random,
    /// BLKSECDISCARD (falls back to BLKDISCARD, then BLKZEROOUT).
    Discard,
    /// BLKZEROOUT in bounded ranges (falls back to Zero).
    ZeroOut,
    /// Hole punching (files, express).
    Punch,
    /// Zero overwrite.
    Zero,
}

impl Method {
    fn is_secure(self) -> bool {
        matches!(
            self,
            Method::NvmeFormat | Method::NvmeSanitize | Method::AtaErase
        )
    }
}

/// The zeroing tail of a full erase (after any secure erase or random passes).
fn zeroing(c: &Caps) -> Method {
    if c.file {
        Method::Zero
    } else if c.discard_zeroes_data {
        Method::Discard
    } else {
        Method::ZeroOut
    }
}

/// Decide the methods for a device. Pure: unit-tested over capability combinations.
pub fn choose(c: &Caps, mode: Mode, o: &EraseOptions) -> Result<Vec<Method>, String> {
    let secure = if o.secure_erase {
        match (&c.nvme, &c.ata) {
            (Some(n), _) if n.caps.format => Some(Method::NvmeFormat),
            (Some(n), _) if n.caps.sanitize_block || n.caps.sanitize_crypto => {
                Some(Method::NvmeSanitize)
            }
            (None, Some(a)) if a.supported => Some(Method::AtaErase),
            _ => None,
        }
    } else {
        None
    };
    match mode {
        Mode::Metadata => Ok(vec![]),
        Mode::Full => Ok(match secure {
            Some(m) => vec![m],
            None => {
                let mut v = vec![Method::Random; o.random_passes as usize];
                v.push(zeroing(c));
                v
            }
        }),
        Mode::Express => match secure {
            Some(m @ (Method::NvmeFormat | Method::NvmeSanitize)) => Ok(vec![m]),
            _ if c.file => Ok(vec![Method::Punch]),
            _ if c.discard_zeroes_data => Ok(vec![Method::Discard]),
            _ if c.discard && c.write_zeroes => Ok(vec![Method::ZeroOut]),
            _ => Err(
                "no express erase method: not NVMe with secure format/sanitize, and neither \
                 discard_zeroes_data nor an unmapping write-zeroes offload \
                 (queue/discard_max_bytes and queue/write_zeroes_max_bytes); use erase_devices"
                    .into(),
            ),
        },
    }
}

/// Probe what the device can do. Secure-erase probes only run when they may be used.
fn probe(t: &Target, secure_erase: bool) -> Caps {
    let mut c = Caps {
        file: matches!(t.kind, TargetKind::File),
        discard_zeroes_data: t.queue_attr("discard_zeroes_data") == 1,
        discard: t.queue_attr("discard_max_bytes") > 0,
        write_zeroes: t.queue_attr("write_zeroes_max_bytes") > 0,
        ..Caps::default()
    };
    if secure_erase && t.is_whole_disk() {
        let name = t.name();
        if let Ok(f) = std::fs::File::open(&t.path) {
            if name.starts_with("nvme") {
                c.nvme = nvme::probe(&f);
            } else if t.device_vendor().is_some_and(|v| v.starts_with("ATA")) {
                c.ata = ata::probe(&f, &t.display());
            }
        }
    }
    c
}

/// Aggregated per-device byte progress.
struct Meter<'a> {
    ctx: &'a StepContext,
    step: &'static str,
    names: Vec<String>,
    done: Vec<AtomicU64>,
    totals: Vec<u64>,
}

impl Meter<'_> {
    fn add(&self, i: usize, n: u64) {
        self.done[i].fetch_add(n, Ordering::Relaxed);
        self.report();
    }
    fn set(&self, i: usize, n: u64) {
        self.done[i].store(n, Ordering::Relaxed);
        self.report();
    }
    fn report(&self) {
        let done: Vec<u64> = self
            .done
            .iter()
            .map(|d| d.load(Ordering::Relaxed))
            .collect();
        let sum = done.iter().sum::<u64>();
        let total = self.totals.iter().sum::<u64>();
        let per: Vec<String> = self
            .names
            .iter()
            .zip(done.iter().zip(&self.totals))
            .take(8)
            .map(|(n, (d, t))| format!("{n} {}%", if *t == 0 { 100 } else { d * 100 / t }))
            .collect();
        self.ctx.set_progress(
            sum.min(total),
            total,
            format!("{}: {}", self.step, per.join(", ")),
        );
    }
}

/// Run one erase step over `paths`. Returns the step result JSON.
pub fn run(
    paths: &[PathBuf],
    mode: Mode,
    opts: &EraseOptions,
    ctx: &StepContext,
) -> Result<Value, EraseError> {
    ctx.check()?;
    let mut targets = Vec::new();
    for p in paths {
        targets.push(Target::open(p)?);
    }
    let mounts = device::mounts();
    let boot = device::boot_media(&mounts);
    let swaps = device::swap_devnos();
    let mut skipped = Vec::new();
    let mut work = Vec::new();
    let mut refusals = Vec::new();
    // Software RAID survives cleaning (as in Ironic): an array being erased is erased
    // through md, and its members are left alone while it runs; raid.delete_configuration
    // is what removes an array.
    let arrays: Vec<String> = targets
        .iter()
        .map(|t| t.name())
        .filter(|n| n.starts_with("md"))
        .collect();
    for t in targets {
        let holders = t.holders();
        let member_of: Vec<&String> = holders.iter().filter(|h| arrays.contains(h)).collect();
        if !member_of.is_empty() && member_of.len() == holders.len() {
            let reason = device::Skip::RaidMember(member_of[0].clone());
            tracing::info!(device = %t.display(), %reason, "not erasing device");
            skipped.push(json!({"device": t.display(), "reason": reason.to_string()}));
            continue;
        }
        match device::check(&t, &opts.skip, opts.force, &mounts, &boot, &swaps) {
            Ok(Some(reason)) => {
                tracing::warn!(device = %t.display(), %reason, "not erasing device");
                skipped.push(json!({"device": t.display(), "reason": reason.to_string()}));
            }
            Ok(None) => work.push(t),
            Err(e) => refusals.push(e),
        }
    }
    match refusals.len() {
        0 => {}
        1 => return Err(refusals.remove(0)),
        _ => return Err(EraseError::Devices(refusals)),
    }
    // Plan everything before writing anything (metadata plans read the partition tables).
    let mut meta_plans = Vec::new();
    let mut totals = Vec::new();
    for t in &work {
        if mode == Mode::Metadata {
            let p = metadata::plan(t)?;
            totals.push(p.bytes());
            meta_plans.push(Some(p));
        } else {
            let passes = if mode == Mode::Full {
                u64::from(opts.random_passes) + 1
            } else {
                1
            };
            totals.push(t.size.saturating_mul(passes));
            meta_plans.push(None);
        }
    }
    let meter = Meter {
        ctx,
        step: mode.step(),
        names: work.iter().map(|t| t.name()).collect(),
        done: work.iter().map(|_| AtomicU64::new(0)).collect(),
        totals,
    };
    meter.report();
    let queue = Mutex::new((0..work.len()).collect::<VecDeque<_>>());
    let results: Mutex<Vec<Option<Result<Value, EraseError>>>> =
        Mutex::new((0..work.len()).map(|_| None).collect());
    let workers = opts.concurrency.clamp(1, work.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let next = queue.lock().ok().and_then(|mut q| q.pop_front());
                let Some(i) = next else { break };
                let t = &work[i];
                let started = Instant::now();
                let mut on_chunk = |n: u64| meter.add(i, n);
                let r = match &meta_plans[i] {
                    Some(plan) => metadata::erase(t, plan, ctx, &mut on_chunk),
                    None => erase_one(t, mode, opts, ctx, &meter, i),
                };
                let r = r.map(|mut v| {
                    v["seconds"] =
                        json!((started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0);
                    v
                });
                if let Err(e) = &r {
                    if !matches!(e, EraseError::Aborted) {
                        tracing::error!(device = %t.display(), error = %e, "erase failed");
                    }
                }
                if let Ok(mut res) = results.lock() {
                    res[i] = Some(r);
                }
            });
        }
    });
    if ctx.is_cancelled() {
        return Err(EraseError::Aborted);
    }
    let results = results.into_inner().unwrap_or_default();
    let mut done = Vec::new();
    let mut errors = Vec::new();
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Some(Ok(v)) => done.push(v),
            Some(Err(EraseError::Aborted)) => return Err(EraseError::Aborted),
            Some(Err(e)) => errors.push(e),
            None => errors.push(EraseError::Unsupported {
                device: work[i].display(),
                reason: "erase worker did not report (it panicked)".into(),
            }),
        }
    }
    match errors.len() {
        0 => Ok(json!({"devices": done, "skipped": skipped})),
        1 => Err(errors.remove(0)),
        _ => Err(EraseError::Devices(errors)),
    }
}

/// Full or express erase of one device.
fn erase_one(
    t: &Target,
    mode: Mode,
    opts: &EraseOptions,
    ctx: &StepContext,
    meter: &Meter<'_>,
    i: usize,
) -> Result<Value, EraseError> {
    let caps = probe(t, opts.secure_erase);
    let plan = choose(&caps, mode, opts).map_err(|reason| EraseError::Unsupported {
        device: t.display(),
        reason,
    })?;
    tracing::info!(device = %t.display(), ?plan, "erasing");
    let mut used: Vec<&'static str> = Vec::new();
    let mut rng = zero::Rng::new(i as u64);
    let mut secure_done = false;
    for m in &plan {
        match run_method(t, *m, &caps, ctx, meter, i, &mut rng) {
            Ok(name) => {
                used.push(name);
                secure_done |= m.is_secure();
            }
            Err(e @ EraseError::SecureErase { .. })
                if mode == Mode::Full && opts.continue_if_secure_erase_failed =>
            {
                tracing::warn!(device = %t.display(), error = %e, "secure erase failed; zeroing instead");
                meter.set(i, 0);
                used.push(run_method(
                    t,
                    zeroing(&caps),
                    &caps,
                    ctx,
                    meter,
                    i,
                    &mut rng,
                )?);
            }
            Err(e) => return Err(e),
        }
    }
    let checked = match zero::verify(t, opts.verify_samples, ctx) {
        Ok(n) => n,
        Err(EraseError::Verify { .. }) if secure_done && mode == Mode::Full => {
            // A cryptographic erase leaves unreadable noise, not zeros: zero it as well.
            tracing::info!(device = %t.display(), "secure erase left non-zero data; zeroing");
            meter.set(i, 0);
            used.push(run_method(
                t,
                zeroing(&caps),
                &caps,
                ctx,
                meter,
                i,
                &mut rng,
            )?);
            zero::verify(t, opts.verify_samples, ctx)?
        }
        Err(e) => return Err(e),
    };
    if t.is_whole_disk() {
        // The partition table is gone: drop the kernel's stale partitions. Best effort.
        if let Ok(f) = std::fs::File::open(&t.path) {
            let _ = ioctl::reread_partitions(&f);
        }
    }
    meter.set(i, meter.totals[i]);
    Ok(json!({
        "device": t.display(),
        "size": t.size,
        "method": used.join(" + "),
        "verified_bytes": checked,
    }))
}

fn run_method(
    t: &Target,
    m: Method,
    caps: &Caps,
    ctx: &StepContext,
    meter: &Meter<'_>,
    i: usize,
    rng: &mut zero::Rng,
) -> Result<&'static str, EraseError> {
    ctx.check()?;
    let mut on_chunk = |n: u64| meter.add(i, n);
    match m {
        Method::NvmeFormat | Method::NvmeSanitize | Method::AtaErase => {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&t.path)
                .map_err(|source| EraseError::Io {
                    device: t.display(),
                    op: "open",
                    source,
                })?;
            let d = t.display();
            let name = match (m, caps.nvme, caps.ata) {
                (Method::NvmeFormat, Some(n), _) => nvme::format(&f, &n, &d)?,
                (Method::NvmeSanitize, Some(n), _) => {
                    let total = meter.totals[i];
                    let mut p = |a: u64, b: u64| meter.set(i, total * a / b.max(1));
                    nvme::sanitize(&f, &n, &d, ctx, &mut p)?
                }
                (Method::AtaErase, _, Some(a)) => ata::secure_erase(&f, &d, a)?,
                _ => {
                    return Err(EraseError::Unsupported {
                        device: d,
                        reason: "secure erase chosen without capability".into(),
                    })
                }
            };
            meter.set(i, meter.totals[i]);
            Ok(name)
        }
        Method::Random => {
            let (f, _) = t.open_write(true)?;
            zero::overwrite(t, &f, Some(rng), ctx, &mut on_chunk)?;
            Ok("random overwrite")
        }
        Method::Zero => {
            let (f, _) = t.open_write(true)?;
            zero::overwrite(t, &f, None, ctx, &mut on_chunk)?;
            Ok("zero overwrite")
        }
        Method::Discard | Method::ZeroOut => {
            let (f, _) = t.open_write(false)?;
            if m == Method::Discard {
                for (secure, name) in [(true, "blksecdiscard"), (false, "blkdiscard")] {
                    let before = meter.done[i].load(Ordering::Relaxed);
                    match zero::offload(t, &f, Some(secure), ctx, &mut on_chunk)? {
                        zero::Offload::Done => return Ok(name),
                        zero::Offload::Unsupported(_) => meter.set(i, before),
                    }
                }
            }
            let before = meter.done[i].load(Ordering::Relaxed);
            match zero::offload(t, &f, None, ctx, &mut on_chunk)? {
                zero::Offload::Done => Ok("blkzeroout"),
                zero::Offload::Unsupported(e) => {
                    tracing::info!(device = %t.display(), error = %e, "BLKZEROOUT refused; overwriting");
                    meter.set(i, before);
                    let (f, _) = t.open_write(true)?;
                    zero::overwrite(t, &f, None, ctx, &mut on_chunk)?;
                    Ok("zero overwrite")
                }
            }
        }
        Method::Punch => {
            let (f, _) = t.open_write(false)?;
            match zero::punch(t, &f, ctx, &mut on_chunk)? {
                zero::Offload::Done => Ok("punch hole"),
                zero::Offload::Unsupported(e) => Err(EraseError::Unsupported {
                    device: t.display(),
                    reason: format!("the filesystem cannot punch holes ({e}); use erase_devices"),
                }),
            }
        }
    }
}

/// Targets for a step: the explicit list, else discovered whole disks.
pub fn targets(explicit: Option<&[PathBuf]>) -> Vec<PathBuf> {
    match explicit {
        Some(list) => list.to_vec(),
        None => device::discover_disks(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge() {
        assert_eq!(
            merge_ranges(vec![(10, 5), (0, 10), (30, 1)]),
            vec![(0, 15), (30, 1)]
        );
        assert_eq!(merge_ranges(vec![(0, 100), (10, 5)]), vec![(0, 100)]);
    }

    fn nvme(format: bool, sanitize: bool) -> Option<nvme::NvmeDevice> {
        Some(nvme::NvmeDevice {
            nsid: 1,
            lbaf: 0,
            caps: nvme::NvmeCaps {
                format,
                sanitize_block: sanitize,
                ..Default::default()
            },
        })
    }

    #[test]
    fn method_choice() {
        let o = EraseOptions::default();
        let plain = Caps::default();
        assert_eq!(choose(&plain, Mode::Full, &o), Ok(vec![Method::ZeroOut]));
        let o2 = EraseOptions {
            random_passes: 2,
            ..EraseOptions::default()
        };
        assert_eq!(
            choose(&plain, Mode::Full, &o2),
            Ok(vec![Method::Random, Method::Random, Method::ZeroOut])
        );
        let n = Caps {
            nvme: nvme(true, true),
            ..Caps::default()
        };
        assert_eq!(choose(&n, Mode::Full, &o), Ok(vec![Method::NvmeFormat]));
        assert_eq!(choose(&n, Mode::Express, &o), Ok(vec![Method::NvmeFormat]));
        let s = Caps {
            nvme: nvme(false, true),
            ..Caps::default()
        };
        assert_eq!(choose(&s, Mode::Full, &o), Ok(vec![Method::NvmeSanitize]));
        let no_secure = EraseOptions {
            secure_erase: false,
            ..EraseOptions::default()
        };
        assert_eq!(
            choose(&n, Mode::Full, &no_secure),
            Ok(vec![Method::ZeroOut])
        );
        let a = Caps {
            ata: Some(ata::AtaSecurity {
                supported: true,
                ..Default::default()
            }),
            ..Caps::default()
        };
        assert_eq!(choose(&a, Mode::Full, &o), Ok(vec![Method::AtaErase]));
        assert!(choose(&a, Mode::Express, &o).is_err());
        let dz = Caps {
            discard_zeroes_data: true,
            ..Caps::default()
        };
        assert_eq!(choose(&dz, Mode::Full, &o), Ok(vec![Method::Discard]));
        assert_eq!(choose(&dz, Mode::Express, &o), Ok(vec![Method::Discard]));
        let wz = Caps {
            discard: true,
            write_zeroes: true,
            ..Caps::default()
        };
        assert_eq!(choose(&wz, Mode::Express, &o), Ok(vec![Method::ZeroOut]));
        let f = Caps {
            file: true,
            ..Caps::default()
        };
        assert_eq!(choose(&f, Mode::Full, &o), Ok(vec![Method::Zero]));
        assert_eq!(choose(&f, Mode::Express, &o), Ok(vec![Method::Punch]));
    }
}
