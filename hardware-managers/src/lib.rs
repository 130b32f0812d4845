//! Hardware managers: the in-band side of steps and inventory.
//!
//! This crate owns the [`HardwareManager`] trait, the dispatch rules (for a step the manager
//! with the highest [`SupportLevel`] that offers it runs it; for inventory every manager
//! contributes, lowest level first), the generic manager and the exec-plugin adapter. It must
//! not talk to the controller: the agent crate owns the network.
#![warn(missing_docs)]

use rivet_protocol::agent::Progress;
use rivet_protocol::inventory::Inventory;
use rivet_protocol::steps::StepDescriptor;
use serde_json::{Map, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

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
        if let Ok(mut p) = self.progress.lock() {
            *p = Some(Progress {
                done,
                total,
                message: message.into(),
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
    /// Steps offered.
    fn steps(&self) -> Vec<StepDescriptor> {
        Vec::new()
    }
    /// Run one of [`HardwareManager::steps`].
    fn execute(
        &self,
        step: &str,
        args: &Map<String, Value>,
        ctx: &StepContext,
    ) -> Result<Value, StepError>;
}

mod dispatch;
pub use dispatch::Dispatcher;

/// What the agent tells the managers about the machine and the operator's wishes.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// Explicit device list (`--devices`): replaces disk discovery for erase and inventory.
    /// Block devices or regular files. Tests, benchmarks and the demo always set it.
    pub devices: Option<Vec<std::path::PathBuf>>,
    /// Directory of exec plugins.
    pub plugin_dir: std::path::PathBuf,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        ManagerConfig {
            devices: None,
            plugin_dir: std::path::PathBuf::from("/usr/lib/rivet/managers.d"),
        }
    }
}

/// The managers a stock agent runs: the generic manager plus every exec plugin found in
/// `cfg.plugin_dir`. Vendor agents append their own before building a [`Dispatcher`].
pub fn default_managers(_cfg: &ManagerConfig) -> Vec<Arc<dyn HardwareManager>> {
    Vec::new()
}
