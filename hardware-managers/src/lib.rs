//! Hardware managers: the in-band side of steps and inventory.
//!
//! This crate owns the [`HardwareManager`] trait, the dispatch rules (for a step the manager
//! with the highest [`SupportLevel`] that offers it runs it; for inventory every manager
//! contributes, lowest level first), the generic manager and the exec-plugin adapter. It must
//! not talk to the controller: the agent crate owns the network.
//!
//! Modules: [`generic`] (IPA's erase steps), [`deploy`] (`write_image`: streaming an image
//! and its configdrive to a disk; the network reaches it only through the agent's
//! `ImageFetcher`), [`raid`] (software RAID with md: `raid.create_configuration`,
//! `raid.delete_configuration`, `raid.apply_configuration`), [`erase`] (the erase engine: device safety,
//! metadata wipe, NVMe/ATA secure erase, zeroing, verification; ioctls in `erase::ioctl`),
//! [`plugin`] (exec plugins, protocol in `PLUGINS.md`), [`example_vendor`] (a compiled-in
//! vendor manager to copy). Everything here blocks: the agent calls it on a blocking thread.
#![warn(missing_docs)]

use rivet_protocol::agent::Progress;
use rivet_protocol::inventory::Inventory;
use rivet_protocol::steps::StepDescriptor;
use serde_json::{Map, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Lists the machine's disks (the agent's inventory code, or the `--devices` list): what
/// the managers that pick disks ([`deploy`], [`raid`]) are built with.
pub type DiskLister = Arc<dyn Fn() -> Vec<rivet_protocol::inventory::Disk> + Send + Sync>;

/// How well a manager supports this machine (IPA's HardwareSupport 0–3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SupportLevel {
    /// Not at all: the manager is dropped.
    None = 0,
    /// Works on any Linux machine.
    Generic = 1,
    /// Knows this class of hardware.
    Mainline = 2,
    /// Vendor or service-provider specific.
    Vendor = 3,
}

/// Errors a step can end with.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The step was cancelled by an abort.
    #[error("step aborted")]
    Aborted,
    /// A required argument is missing or has the wrong type.
    #[error("bad argument {name:?}: {reason}")]
    BadArgument {
        /// Argument name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No manager offers the step.
    #[error("no hardware manager offers step {0:?}")]
    UnknownStep(String),
    /// The step ran and failed.
    #[error("{0}")]
    Failed(String),
}

/// Cancellation and progress handed to a running step. Cloneable; blocking work checks
/// [`StepContext::is_cancelled`] between chunks.
#[derive(Debug, Clone, Default)]
pub struct StepContext {
    cancelled: Arc<AtomicBool>,
    progress: Arc<Mutex<Option<Progress>>>,
}

impl StepContext {
    /// A fresh context.
    pub fn new() -> Self {
        Self::default()
    }

    /// Ask the step to stop.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
    }

    /// Whether an abort was requested.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    /// `Err(Aborted)` once cancelled: `ctx.check()?` between chunks.
    pub fn check(&self) -> Result<(), StepError> {
        if self.is_cancelled() {
            Err(StepError::Aborted)
        } else {
            Ok(())
        }
    }

    /// Report progress.
    pub fn set_progress(&self, done: u64, total: u64, message: impl Into<String>) {
        self.set_progress_rate(done, total, None, message);
    }

    /// Report progress with the current rate (units per second).
    pub fn set_progress_rate(
        &self,
        done: u64,
        total: u64,
        rate: Option<u64>,
        message: impl Into<String>,
    ) {
        if let Ok(mut p) = self.progress.lock() {
            *p = Some(Progress {
                done,
                total,
                message: message.into(),
                rate,
            });
        }
    }

    /// Last reported progress.
    pub fn progress(&self) -> Option<Progress> {
        self.progress.lock().ok().and_then(|p| p.clone())
    }
}

/// An in-band hardware manager. Implementations are blocking: the agent runs them on a
/// blocking thread.
pub trait HardwareManager: Send + Sync {
    /// Stable name, shown in step listings and logs.
    fn name(&self) -> &str;
    /// Version string, reported with the steps.
    fn version(&self) -> &str {
        "1.0"
    }
    /// How well this manager supports the machine it runs on.
    fn evaluate_support(&self) -> SupportLevel;
    /// Add or refine inventory fields.
    fn inventory(&self, _inventory: &mut Inventory) {}
    /// Clean steps offered.
    fn steps(&self) -> Vec<StepDescriptor> {
        Vec::new()
    }
    /// Deploy steps offered (IPA's `get_deploy_steps`: `write_image`…). A step name may be
    /// both a clean and a deploy step; `execute` runs either.
    fn deploy_steps(&self) -> Vec<StepDescriptor> {
        Vec::new()
    }
    /// Run one of [`HardwareManager::steps`] or [`HardwareManager::deploy_steps`].
    fn execute(
        &self,
        step: &str,
        args: &Map<String, Value>,
        ctx: &StepContext,
    ) -> Result<Value, StepError>;
}

mod dispatch;
pub use dispatch::Dispatcher;

pub mod deploy;
pub mod erase;
pub mod example_vendor;
pub mod generic;
pub mod plugin;
pub mod raid;

pub use example_vendor::ExampleVendorManager;

/// The vendor guide's code blocks run as doctests, so the guide cannot drift from the trait.
#[cfg(doctest)]
#[doc = include_str!("../../docs/hardware-managers.md")]
pub struct VendorGuide;
pub use generic::GenericManager;
pub use plugin::ExecPlugin;

use std::path::PathBuf;
use std::time::Duration;

/// What the agent tells the managers about the machine and the operator's wishes.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// Explicit device list (`--devices`): replaces disk discovery for erase and inventory.
    /// Block devices or regular files. Tests, benchmarks and the demo always set it.
    pub devices: Option<Vec<PathBuf>>,
    /// Directory of exec plugins.
    pub plugin_dir: PathBuf,
    /// Devices never erased: kernel names (`sda`), paths, serials or WWNs. The `skip` step
    /// argument adds to this list.
    pub skip: Vec<String>,
    /// Devices erased in parallel (IPA's `disk_erasure_concurrency`, Ironic default 4).
    pub erase_concurrency: usize,
    /// Pseudo-random overwrite passes before the zeroing pass of `erase_devices`.
    pub random_passes: u32,
    /// Random 1 MiB ranges read back after a full erase, besides the first and last MiB.
    pub verify_samples: u32,
    /// Try NVMe format/sanitize and ATA security erase before zeroing.
    pub secure_erase: bool,
    /// Zero the device when its secure erase fails instead of failing the step
    /// (Ironic's `continue_if_disk_secure_erase_fails`, default false).
    pub continue_if_secure_erase_failed: bool,
    /// Time limit for a plugin's `describe` and `steps` calls.
    pub plugin_describe_timeout: Duration,
    /// Time limit for a plugin's `execute` call (a `timeout_s` step arg overrides it).
    pub plugin_execute_timeout: Duration,
    /// Time between SIGTERM and SIGKILL when a plugin is aborted or times out.
    pub plugin_kill_grace: Duration,
    /// Where efivarfs is mounted: `write_image` on a `uefi` node writes the firmware's boot
    /// entry there. Its parent missing (`/sys/firmware/efi`) means the ramdisk booted BIOS.
    /// Tests point it at a directory of their own.
    pub efivars: PathBuf,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        ManagerConfig {
            devices: None,
            plugin_dir: PathBuf::from("/usr/lib/rivet/managers.d"),
            skip: Vec::new(),
            erase_concurrency: 4,
            random_passes: 0,
            verify_samples: 16,
            secure_erase: true,
            continue_if_secure_erase_failed: false,
            plugin_describe_timeout: Duration::from_secs(10),
            plugin_execute_timeout: Duration::from_secs(3600),
            plugin_kill_grace: Duration::from_secs(5),
            efivars: PathBuf::from(deploy::uefi::DEFAULT_EFIVARS),
        }
    }
}

/// The managers a stock agent runs: the generic manager plus every exec plugin found in
/// `cfg.plugin_dir` (a plugin that fails to load is skipped with a warning). Vendor agents
/// append their own before building a [`Dispatcher`].
pub fn default_managers(cfg: &ManagerConfig) -> Vec<Arc<dyn HardwareManager>> {
    let mut managers: Vec<Arc<dyn HardwareManager>> = vec![Arc::new(GenericManager::new(cfg))];
    for p in plugin::load_dir(&cfg.plugin_dir, cfg) {
        managers.push(Arc::new(p));
    }
    managers
}
