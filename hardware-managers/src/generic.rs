//! The generic hardware manager: IPA's GenericHardwareManager disk-cleaning steps on any
//! Linux machine. Steps and default priorities are IPA's, all under the `deploy` interface:
//! `erase_devices_metadata` (99), `erase_devices` (10), `erase_devices_express` (0).

use crate::erase::{self, EraseOptions, Mode};
use crate::{HardwareManager, ManagerConfig, StepContext, StepError, SupportLevel};
use rivet_protocol::steps::{ArgInfo, StepDescriptor};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Erase steps for every machine.
#[derive(Debug, Clone)]
pub struct GenericManager {
    devices: Option<Vec<PathBuf>>,
    defaults: EraseOptions,
}

/// Name under which the generic manager registers.
pub const NAME: &str = "generic_hardware_manager";

fn arg(description: &str) -> ArgInfo {
    ArgInfo {
        description: description.into(),
        required: false,
    }
}

/// Arguments every erase step accepts.
fn erase_args(full: bool) -> BTreeMap<String, ArgInfo> {
    let mut m = BTreeMap::new();
    m.insert(
        "skip".into(),
        arg(
            "devices to leave alone: list of names (sda, /dev/sda), serials or WWNs, or of \
             {name|serial|wwn: value} hints",
        ),
    );
    m.insert(
        "force".into(),
        arg("erase devices even if they or their partitions are mounted or held (default false)"),
    );
    m.insert(
        "concurrency".into(),
        arg("devices erased in parallel (default 4)"),
    );
    if full {
        m.insert(
            "random_passes".into(),
            arg("pseudo-random overwrite passes before zeroing (default 0)"),
        );
        m.insert(
            "verify_samples".into(),
            arg("random 1 MiB ranges read back besides the first and last MiB (default 16)"),
        );
        m.insert(
            "secure_erase".into(),
            arg("try NVMe format/sanitize or ATA security erase first (default true)"),
        );
        m.insert(
            "continue_if_secure_erase_failed".into(),
            arg("zero the device when its secure erase fails instead of failing (default false)"),
        );
    }
    m
}

fn descriptor(step: &str, priority: i64, args: BTreeMap<String, ArgInfo>) -> StepDescriptor {
    StepDescriptor {
        argsinfo: args,
        ..StepDescriptor::in_band(step, priority)
    }
}

fn bad(name: &str, reason: &str) -> StepError {
    StepError::BadArgument {
        name: name.into(),
        reason: reason.into(),
    }
}

fn get_bool(args: &Map<String, Value>, name: &str, default: bool) -> Result<bool, StepError> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad(name, "expected true or false")),
    }
}

fn get_uint(
    args: &Map<String, Value>,
    name: &str,
    default: u64,
    range: std::ops::RangeInclusive<u64>,
) -> Result<u64, StepError> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => match v.as_u64() {
            Some(n) if range.contains(&n) => Ok(n),
            _ => Err(bad(
                name,
                &format!(
                    "expected an integer from {} to {}",
                    range.start(),
                    range.end()
                ),
            )),
        },
    }
}

/// `skip`: strings, or IPA-style hint objects (`{"name": "/dev/sda"}`, `{"serial": "…"}`).
fn get_skip(args: &Map<String, Value>) -> Result<Vec<String>, StepError> {
    let reason = "expected a list of device names, serials or WWNs";
    match args.get("skip") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) => {
            let mut out = Vec::new();
            for it in items {
                match it {
                    Value::String(s) => out.push(s.clone()),
                    Value::Object(o) => {
                        for k in ["name", "serial", "wwn"] {
                            if let Some(v) = o.get(k).and_then(Value::as_str) {
                                out.push(v.to_string());
                            }
                        }
                    }
                    _ => return Err(bad("skip", reason)),
                }
            }
            Ok(out)
        }
        Some(_) => Err(bad("skip", reason)),
    }
}

/// Merge step args over configured defaults.
pub fn options(
    defaults: &EraseOptions,
    args: &Map<String, Value>,
) -> Result<EraseOptions, StepError> {
    let mut o = defaults.clone();
    o.force = get_bool(args, "force", o.force)?;
    o.concurrency = get_uint(args, "concurrency", o.concurrency as u64, 1..=64)? as usize;
    o.random_passes = get_uint(args, "random_passes", u64::from(o.random_passes), 0..=16)? as u32;
    o.verify_samples = get_uint(
        args,
        "verify_samples",
        u64::from(o.verify_samples),
        0..=4096,
    )? as u32;
    o.secure_erase = get_bool(args, "secure_erase", o.secure_erase)?;
    o.continue_if_secure_erase_failed = get_bool(
        args,
        "continue_if_secure_erase_failed",
        o.continue_if_secure_erase_failed,
    )?;
    o.skip.extend(get_skip(args)?);
    Ok(o)
}

impl GenericManager {
    /// Built from the agent's configuration.
    pub fn new(cfg: &ManagerConfig) -> Self {
        GenericManager {
            devices: cfg.devices.clone(),
            defaults: EraseOptions {
                concurrency: cfg.erase_concurrency.max(1),
                random_passes: cfg.random_passes,
                verify_samples: cfg.verify_samples,
                secure_erase: cfg.secure_erase,
                continue_if_secure_erase_failed: cfg.continue_if_secure_erase_failed,
                force: false,
                skip: cfg.skip.clone(),
            },
        }
    }

    /// Run an erase in `mode` with `args` (the body of the three steps; vendor managers that
    /// override a step can delegate here).
    pub fn erase(
        &self,
        mode: Mode,
        args: &Map<String, Value>,
        ctx: &StepContext,
    ) -> Result<Value, StepError> {
        let opts = options(&self.defaults, args)?;
        let targets = erase::targets(self.devices.as_deref());
        Ok(erase::run(&targets, mode, &opts, ctx)?)
    }
}

impl HardwareManager for GenericManager {
    fn name(&self) -> &str {
        NAME
    }

    fn version(&self) -> &str {
        "1.0"
    }

    fn evaluate_support(&self) -> SupportLevel {
        SupportLevel::Generic
    }

    fn steps(&self) -> Vec<StepDescriptor> {
        vec![
            descriptor("erase_devices_metadata", 99, erase_args(false)),
            descriptor("erase_devices", 10, erase_args(true)),
            descriptor("erase_devices_express", 0, erase_args(false)),
        ]
    }

    fn execute(
        &self,
        step: &str,
        args: &Map<String, Value>,
        ctx: &StepContext,
    ) -> Result<Value, StepError> {
        match step {
            "erase_devices_metadata" => self.erase(Mode::Metadata, args, ctx),
            "erase_devices" => self.erase(Mode::Full, args, ctx),
            "erase_devices_express" => self.erase(Mode::Express, args, ctx),
            other => Err(StepError::UnknownStep(other.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn args_override_defaults_and_are_validated() {
        let d = EraseOptions::default();
        let o = options(
            &d,
            &args(json!({"force": true, "concurrency": 2, "random_passes": 1,
                          "skip": ["sda", {"serial": "S1"}]})),
        )
        .expect("valid");
        assert!(o.force);
        assert_eq!((o.concurrency, o.random_passes), (2, 1));
        assert_eq!(o.skip, vec!["sda".to_string(), "S1".to_string()]);
        for bad in [
            json!({"force": "yes"}),
            json!({"concurrency": 0}),
            json!({"random_passes": -1}),
            json!({"skip": 3}),
        ] {
            assert!(
                matches!(
                    options(&d, &args(bad.clone())),
                    Err(StepError::BadArgument { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn ipa_names_and_priorities() {
        let m = GenericManager::new(&ManagerConfig::default());
        let s: Vec<(String, i64, bool, String)> = m
            .steps()
            .into_iter()
            .map(|d| (d.step, d.priority, d.abortable, d.interface))
            .collect();
        assert_eq!(
            s,
            vec![
                ("erase_devices_metadata".into(), 99, true, "deploy".into()),
                ("erase_devices".into(), 10, true, "deploy".into()),
                ("erase_devices_express".into(), 0, true, "deploy".into()),
            ]
        );
        assert!(!m.steps().iter().any(|d| d.step == "update_firmware"));
    }
}
