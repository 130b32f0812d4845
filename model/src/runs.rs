//! A node's run state: the conductor's bookkeeping of the operation it is driving (the
//! agent session of the current ramdisk boot, and the cleaning, deploy, inspection, servicing
//! or rescue run),
//! as Rust types kept in the node's own `run_state` column, not as loose keys in
//! `driver_internal_info`.
//!
//! The store decodes the column with the rest of the node: a document that does not decode
//! (a field of the wrong type, an unknown field, a newer version) marks the node corrupt
//! naming `run_state`, so a damaged run is shown and refused, never silently restarted.
//! Records written before this column existed carry the same bookkeeping as
//! `driver_internal_info` keys; [`Runs::take_legacy`] moves them over when such a node is
//! read, so an upgrade in the middle of a cleaning resumes it where it was.

use crate::steps::PlannedStep;
use chrono::{DateTime, Utc};
use rivet_protocol::steps::{RequestedDeployStep, RequestedStep};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The version of the `run_state` document this build writes and reads.
pub const RUNS_VERSION: u32 = 1;

fn current_version() -> u32 {
    RUNS_VERSION
}

/// Everything the conductor keeps about a node's running operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Runs {
    /// Document version ([`RUNS_VERSION`]); a newer one does not decode.
    #[serde(default = "current_version", deserialize_with = "known_version")]
    pub v: u32,
    /// The ramdisk boot that holds the agent token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentSession>,
    /// The cleaning run (automated or manual).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clean: Option<CleanRun>,
    /// `deploy_steps` of the deploy request, until the run is planned from them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deploy_request: Option<Vec<RequestedDeployStep>>,
    /// The deploy run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deploy: Option<DeployRun>,
    /// The in-band inspection run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inspect: Option<InspectRun>,
    /// The servicing run (1.87).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceRun>,
    /// The rescue run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rescue: Option<RescueRun>,
    /// Set in the same write that enters `deploy failed`, cleared once the agent was stopped
    /// and the power decided (`[deploy] power_off_after_deploy_failure`): a controller that
    /// dies in between does that work when it starts again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub failure_power_pending: bool,
}

impl Default for Runs {
    fn default() -> Runs {
        Runs {
            v: RUNS_VERSION,
            agent: None,
            clean: None,
            deploy_request: None,
            deploy: None,
            inspect: None,
            service: None,
            rescue: None,
            failure_power_pending: false,
        }
    }
}

fn known_version<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let v = u32::deserialize(d)?;
    if v > RUNS_VERSION {
        return Err(serde::de::Error::custom(format!(
            "run_state version {v} was written by a newer rivetd (this one reads up to {RUNS_VERSION})"
        )));
    }
    Ok(v)
}

/// The agent of the current ramdisk boot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSession {
    /// SHA-256 of the token issued at lookup (the token itself is never stored).
    pub token_hash: String,
    /// The kernel boot id the token was issued to (None: an agent that sent none).
    #[serde(default)]
    pub boot_id: Option<String>,
}

/// How a cleaning run uses the ramdisk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RamdiskUse {
    /// The ramdisk was booted for this run.
    Booted,
    /// The run needs none (out-of-band steps only, or no agent on this deploy interface).
    NotNeeded,
}

/// The bookkeeping of one cleaning run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CleanRun {
    /// A manual clean's requested steps (None: automated cleaning).
    #[serde(default)]
    pub requested: Option<Vec<RequestedStep>>,
    /// Set once the ramdisk was booted, or found not needed.
    #[serde(default)]
    pub ramdisk: Option<RamdiskUse>,
    /// Id of the `get_clean_steps` command.
    #[serde(default)]
    pub steps_command: Option<String>,
    /// The steps in order, once gathered.
    #[serde(default)]
    pub plan: Option<Vec<PlannedStep>>,
    /// The step to run next.
    #[serde(default)]
    pub step_index: usize,
    /// Id of the agent command running the current step.
    #[serde(default)]
    pub command: Option<String>,
    /// When the current agent step was sent.
    #[serde(default)]
    pub step_started_at: Option<DateTime<Utc>>,
}

/// The bookkeeping of one deploy run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeployRun {
    /// Steps in order; the agent's join after it called back.
    pub plan: Vec<PlannedStep>,
    /// The step to run next.
    pub index: usize,
    /// Operator's `deploy_steps` (priority overrides and extra agent steps).
    #[serde(default)]
    pub requested: Vec<RequestedDeployStep>,
    /// The agent's deploy steps are in the plan.
    #[serde(default)]
    pub agent_steps_merged: bool,
    /// Id of the `get_deploy_steps` command.
    #[serde(default)]
    pub steps_command: Option<String>,
    /// Id of the agent command running the current step.
    #[serde(default)]
    pub command: Option<String>,
    /// When the current agent step was sent.
    #[serde(default)]
    pub step_started_at: Option<DateTime<Utc>>,
    /// Id of the `power_off` command `tear_down_agent` sent.
    #[serde(default)]
    pub teardown_command: Option<String>,
    /// When `tear_down_agent` asked the agent to power off.
    #[serde(default)]
    pub teardown_since: Option<DateTime<Utc>>,
    /// The effective boot mode the BMC was put in when the deploy ramdisk booted:
    /// `write_image` writes the boot loader for it.
    #[serde(default)]
    pub boot_mode: Option<rivet_protocol::deploy::BootMode>,
    /// `image_download_source = "local"`: the cached image (`sha256-<hex>`) the running
    /// `write_image` reads from rivetd, resolved once when the step was sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_image: Option<String>,
    /// The configdrive that running `write_image` reads from rivetd's cache (`sha256-<hex>`),
    /// when it was too long to send inline (`[image_cache] configdrive_inline_max_bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_configdrive: Option<String>,
}

/// The bookkeeping of one servicing run: steps run on an `active` node in the order given.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceRun {
    /// The steps asked for.
    pub requested: Vec<RequestedStep>,
    /// The plan, once made.
    #[serde(default)]
    pub plan: Option<Vec<PlannedStep>>,
    /// Next step to run.
    #[serde(default)]
    pub index: usize,
    /// Out-of-band only: never boot the ramdisk.
    #[serde(default)]
    pub disable_ramdisk: bool,
    /// The ramdisk was booted (the instance must be booted again at the end).
    #[serde(default)]
    pub ramdisk_booted: bool,
    /// The agent command of the running in-band step.
    #[serde(default)]
    pub command: Option<String>,
    /// The running step (`service_step`).
    #[serde(default)]
    pub current: Option<Value>,
}

/// The bookkeeping of one rescue: the ramdisk boot and the `finalize_rescue` command.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RescueRun {
    /// The rescue ramdisk was booted for this run.
    #[serde(default)]
    pub ramdisk_booted: bool,
    /// Id of this run's `finalize_rescue` command (written before it is queued).
    #[serde(default)]
    pub command: Option<String>,
}

/// The bookkeeping of one in-band inspection run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InspectRun {
    /// The ramdisk was booted for this run.
    #[serde(default)]
    pub booted: bool,
    /// Id of the `get_inventory` command.
    #[serde(default)]
    pub command: Option<String>,
}

impl Runs {
    /// The agent command running a step right now (cleaning or deploy), if any.
    pub fn running_command(&self) -> Option<&str> {
        self.clean
            .as_ref()
            .and_then(|c| c.command.as_deref())
            .or_else(|| self.deploy.as_ref().and_then(|d| d.command.as_deref()))
    }

    /// Whether an agent holds a token for the current boot.
    pub fn has_agent(&self) -> bool {
        self.agent.is_some()
    }

    /// Move the run bookkeeping an older rivetd kept in `driver_internal_info` into typed
    /// runs, removing those keys from `dii`. `Err` names the first key whose value does not
    /// decode (the caller marks the node corrupt; nothing is removed then).
    pub fn take_legacy(dii: &mut Map<String, Value>) -> Result<Runs, String> {
        const KEYS: &[&str] = &[
            "agent_token_hash",
            "agent_boot_id",
            "requested_clean_steps",
            "cleaning_booted",
            "cleaning_no_ramdisk",
            "clean_steps_command",
            "clean_plan",
            "clean_step_index",
            "clean_command",
            "clean_step_started_at",
            "requested_deploy_steps",
            "deploy_run",
            "inspect_booted",
            "inspect_command",
        ];
        fn get<T: serde::de::DeserializeOwned>(
            dii: &Map<String, Value>,
            key: &str,
        ) -> Result<Option<T>, String> {
            match dii.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => serde_json::from_value(v.clone())
                    .map(Some)
                    .map_err(|e| format!("driver_internal_info.{key}: {e}")),
            }
        }
        let mut runs = Runs::default();
        if let Some(token_hash) = get::<String>(dii, "agent_token_hash")? {
            runs.agent = Some(AgentSession {
                token_hash,
                boot_id: get(dii, "agent_boot_id")?,
            });
        }
        let clean_keys = &KEYS[2..10];
        if clean_keys.iter().any(|k| dii.contains_key(*k)) {
            let booted: Option<bool> = get(dii, "cleaning_booted")?;
            let no_ramdisk: Option<bool> = get(dii, "cleaning_no_ramdisk")?;
            runs.clean = Some(CleanRun {
                requested: get(dii, "requested_clean_steps")?,
                ramdisk: match (booted, no_ramdisk) {
                    (None, _) => None,
                    (Some(_), Some(true)) | (Some(false), _) => Some(RamdiskUse::NotNeeded),
                    (Some(true), _) => Some(RamdiskUse::Booted),
                },
                steps_command: get(dii, "clean_steps_command")?,
                plan: get(dii, "clean_plan")?,
                step_index: get(dii, "clean_step_index")?.unwrap_or(0),
                command: get(dii, "clean_command")?,
                step_started_at: get(dii, "clean_step_started_at")?,
            });
        }
        runs.deploy_request = get(dii, "requested_deploy_steps")?;
        runs.deploy = get(dii, "deploy_run")?;
        if dii.contains_key("inspect_booted") || dii.contains_key("inspect_command") {
            runs.inspect = Some(InspectRun {
                booted: get(dii, "inspect_booted")?.unwrap_or(false),
                command: get(dii, "inspect_command")?,
            });
        }
        for k in KEYS {
            dii.remove(*k);
        }
        Ok(runs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trip_and_refusals() {
        let r = Runs {
            clean: Some(CleanRun {
                step_index: 2,
                command: Some("c1".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let text = serde_json::to_string(&r).expect("encode");
        assert_eq!(serde_json::from_str::<Runs>(&text).expect("decode"), r);
        let r = Runs {
            service: Some(ServiceRun {
                index: 1,
                ramdisk_booted: true,
                command: Some("s1".into()),
                ..Default::default()
            }),
            rescue: Some(RescueRun {
                ramdisk_booted: true,
                command: Some("r1".into()),
            }),
            ..Default::default()
        };
        let text = serde_json::to_string(&r).expect("encode");
        assert_eq!(serde_json::from_str::<Runs>(&text).expect("decode"), r);
        // Wrong type, unknown field, newer version: errors, never a default.
        for bad in [
            r#"{"v":1,"service":{"requested":[],"index":"one"}}"#,
            r#"{"v":1,"rescue":{"booted":true}}"#,
            r#"{"v":1,"clean":{"step_index":"two"}}"#,
            r#"{"v":1,"clean":{"stepindex":2}}"#,
            r#"{"v":2}"#,
        ] {
            assert!(serde_json::from_str::<Runs>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn legacy_keys_move_over() {
        let mut dii = json!({
            "agent_token_hash": "h", "agent_boot_id": "b",
            "cleaning_booted": true, "clean_plan": [], "clean_step_index": 1,
            "clean_command": "c", "provision_cause": "provide by x"
        })
        .as_object()
        .cloned()
        .expect("object");
        let runs = Runs::take_legacy(&mut dii).expect("decodes");
        assert_eq!(
            runs.agent.as_ref().map(|a| a.token_hash.as_str()),
            Some("h")
        );
        let clean = runs.clean.expect("clean run");
        assert_eq!(clean.ramdisk, Some(RamdiskUse::Booted));
        assert_eq!((clean.step_index, clean.command.as_deref()), (1, Some("c")));
        assert_eq!(dii.keys().collect::<Vec<_>>(), vec!["provision_cause"]);
        let mut bad = json!({"clean_step_index": "x"})
            .as_object()
            .cloned()
            .expect("object");
        let e = Runs::take_legacy(&mut bad).expect_err("refused");
        assert!(e.contains("clean_step_index"), "{e}");
        assert!(
            bad.contains_key("clean_step_index"),
            "nothing removed on error"
        );
    }
}
