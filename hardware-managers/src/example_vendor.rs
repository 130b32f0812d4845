//! An example vendor manager, compiled in: the pattern a vendor crate follows.
//!
//! It claims [`SupportLevel::Vendor`] only on its own hardware (DMI `sys_vendor` equal to the
//! configured vendor), overrides `erase_devices_metadata` (records that it ran, then
//! delegates to the generic implementation — a real vendor would first, say, clear a RAID
//! controller's foreign configuration) and adds `example_vendor_step`. On other machines it
//! reports [`SupportLevel::None`] and the dispatcher drops it.
//!
//! It also shows hardware RAID: it offers `raid.create_configuration` and
//! `raid.delete_configuration` at `Vendor` level, so on its machines it runs them instead of
//! the software RAID manager. It builds the logical disks whose `controller` is
//! [`EXAMPLE_CONTROLLER`] (pretend: a real vendor calls its controller's tool here), hands
//! `controller: software` ones to the [`SoftwareRaidManager`] it was given, and refuses any
//! other controller by name.

use crate::erase::Mode;
use crate::generic::GenericManager;
use crate::raid::SoftwareRaidManager;
use crate::{HardwareManager, ManagerConfig, StepContext, StepError, SupportLevel};
use rivet_protocol::steps::{ArgInfo, StepDescriptor};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The (pretend) hardware RAID controller the example builds volumes on.
pub const EXAMPLE_CONTROLLER: &str = "example-raid-0";

/// Vendor string the example matches by default.
pub const DEFAULT_VENDOR: &str = "Rivet Example Corp";

/// The example vendor manager.
#[derive(Debug, Clone)]
pub struct ExampleVendorManager {
    dmi_root: PathBuf,
    vendor: String,
    generic: GenericManager,
    metadata_runs: Arc<AtomicUsize>,
    software: Option<Arc<SoftwareRaidManager>>,
    /// Logical disks "on the controller".
    volumes: Arc<Mutex<Vec<Value>>>,
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
            software: None,
            volumes: Arc::default(),
        }
    }

    /// Hand `controller: software` logical disks to `m`.
    pub fn with_software_raid(mut self, m: Arc<SoftwareRaidManager>) -> Self {
        self.software = Some(m);
        self
    }

    /// `raid.create_configuration`: this controller's volumes here, software ones delegated.
    fn create_raid(
        &self,
        args: &Map<String, Value>,
        ctx: &StepContext,
    ) -> Result<Value, StepError> {
        let disks = args
            .get("target_raid_config")
            .and_then(|c| c.get("logical_disks"))
            .and_then(Value::as_array)
            .ok_or_else(|| StepError::BadArgument {
                name: "target_raid_config".into(),
                reason: "expected {\"logical_disks\": [...]}".into(),
            })?;
        let (mut mine, mut software) = (Vec::new(), Vec::new());
        for (i, d) in disks.iter().enumerate() {
            match d.get("controller").and_then(Value::as_str) {
                Some(EXAMPLE_CONTROLLER) => mine.push(d.clone()),
                Some("software") => software.push(d.clone()),
                other => {
                    return Err(StepError::Failed(format!(
                        "logical disk {i}: controller {other:?} is neither {EXAMPLE_CONTROLLER:?} \
                         nor \"software\""
                    )))
                }
            }
        }
        let mut built = Vec::new();
        if !software.is_empty() {
            let m = self.software.as_ref().ok_or_else(|| {
                StepError::Failed(
                    "software RAID was asked for, but this build has no software RAID manager"
                        .into(),
                )
            })?;
            let r =
                m.create_configuration(&json!({"logical_disks": software}), true, true, true, ctx)?;
            if let Some(v) = r["raid_config"]["logical_disks"].as_array() {
                built.extend(v.iter().cloned());
            }
        }
        ctx.check()?;
        let mut volumes = self.volumes.lock().unwrap_or_else(|p| p.into_inner());
        volumes.clear();
        for (i, mut d) in mine.into_iter().enumerate() {
            d["volume_name"] = d
                .get("volume_name")
                .cloned()
                .unwrap_or_else(|| json!(format!("example-{i}")));
            volumes.push(d.clone());
            built.push(d);
        }
        Ok(json!({"raid_config": {"logical_disks": built}, "manager": self.name()}))
    }

    /// The logical disks on the pretend controller.
    pub fn raid_volumes(&self) -> Vec<Value> {
        self.volumes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
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
        for step in ["create_configuration", "delete_configuration"] {
            meta.push(StepDescriptor {
                interface: "raid".into(),
                abortable: false,
                ..StepDescriptor::in_band(step, 0)
            });
        }
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
            "create_configuration" => self.create_raid(args, ctx),
            "delete_configuration" => {
                self.volumes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clear();
                if let Some(m) = &self.software {
                    if !m.steps().is_empty() {
                        m.delete_configuration(ctx)?;
                    }
                }
                Ok(json!({"raid_config": {}, "manager": self.name()}))
            }
            other => Err(StepError::UnknownStep(other.into())),
        }
    }
}
