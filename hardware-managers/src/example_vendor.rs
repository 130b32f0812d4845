//! An example vendor manager, compiled in: the pattern a vendor crate follows.
//!
//! It claims [`SupportLevel::Vendor`] only on its own hardware (DMI `sys_vendor` equal to the
//! configured vendor), overrides `erase_devices_metadata` (records that it ran, then
//! delegates to the generic implementation — a real vendor would first, say, clear a RAID
//! controller's foreign configuration) and adds `example_vendor_step`. On other machines it
//! reports [`SupportLevel::None`] and the dispatcher drops it.

use crate::erase::Mode;
use crate::generic::GenericManager;
use crate::{HardwareManager, ManagerConfig, StepContext, StepError, SupportLevel};
use rivet_protocol::steps::{ArgInfo, StepDescriptor};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Vendor string the example matches by default.
pub const DEFAULT_VENDOR: &str = "Rivet Example Corp";

/// The example vendor manager.
#[derive(Debug, Clone)]
pub struct ExampleVendorManager {
    dmi_root: PathBuf,
    vendor: String,
    generic: GenericManager,
    metadata_runs: Arc<AtomicUsize>,
}

impl ExampleVendorManager {
    /// Matches [`DEFAULT_VENDOR`] in `/sys/class/dmi/id`.
    pub fn new(cfg: &ManagerConfig) -> Self {
        Self::with_dmi(cfg, "/sys/class/dmi/id", DEFAULT_VENDOR)
    }

    /// Matches `vendor` in `dmi_root/sys_vendor` (tests point `dmi_root` at a temp dir).
    pub fn with_dmi(cfg: &ManagerConfig, dmi_root: impl Into<PathBuf>, vendor: &str) -> Self {
        ExampleVendorManager {
            dmi_root: dmi_root.into(),
            vendor: vendor.into(),
            generic: GenericManager::new(cfg),
            metadata_runs: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// How many times this manager's `erase_devices_metadata` ran.
    pub fn metadata_runs(&self) -> usize {
        self.metadata_runs.load(Ordering::SeqCst)
    }
}

impl HardwareManager for ExampleVendorManager {
    fn name(&self) -> &str {
        "example_vendor_hardware_manager"
    }

    fn evaluate_support(&self) -> SupportLevel {
        match std::fs::read_to_string(self.dmi_root.join("sys_vendor")) {
            Ok(v) if v.trim() == self.vendor => SupportLevel::Vendor,
            _ => SupportLevel::None,
        }
    }

    fn steps(&self) -> Vec<StepDescriptor> {
        let mut meta = self
            .generic
            .steps()
            .into_iter()
            .find(|s| s.step == "erase_devices_metadata")
            .into_iter()
            .collect::<Vec<_>>();
        let mut args = BTreeMap::new();
        args.insert(
            "setting".into(),
            ArgInfo {
                description: "the (example) BIOS setting to apply".into(),
                required: true,
            },
        );
        meta.push(StepDescriptor {
            argsinfo: args,
            ..StepDescriptor::in_band("example_vendor_step", 0)
        });
        meta
    }

    fn execute(
        &self,
        step: &str,
        args: &Map<String, Value>,
        ctx: &StepContext,
    ) -> Result<Value, StepError> {
        match step {
            "erase_devices_metadata" => {
                self.metadata_runs.fetch_add(1, Ordering::SeqCst);
                let mut r = self.generic.erase(Mode::Metadata, args, ctx)?;
                r["manager"] = json!(self.name());
                Ok(r)
            }
            "example_vendor_step" => {
                let setting = args.get("setting").and_then(Value::as_str).ok_or_else(|| {
                    StepError::BadArgument {
                        name: "setting".into(),
                        reason: "expected a string".into(),
                    }
                })?;
                ctx.check()?;
                ctx.set_progress(1, 1, format!("applied {setting}"));
                Ok(json!({"applied": setting, "manager": self.name()}))
            }
            other => Err(StepError::UnknownStep(other.into())),
        }
    }
}
