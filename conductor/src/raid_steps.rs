//! The agent RAID interface's side of the RAID steps (Ironic's `AgentRAID`): what the agent is
//! sent, and what a finished step changes on the node.
//!
//! The agent offers `raid.create_configuration` and `raid.delete_configuration` (clean) and
//! `raid.apply_configuration` (deploy) when its ramdisk can build software RAID; a node takes
//! them only when its `raid_interface` is `agent` (`rivet_model::steps::takes_agent_step`).
//!
//! - `create_configuration`: the node's `target_raid_config`, filtered by the step's
//!   `create_root_volume` / `create_nonroot_volumes` (Ironic's `filter_target_raid_config`),
//!   goes to the agent as the `target_raid_config` argument; no target, or nothing left, fails
//!   the step before the agent is asked.
//! - `apply_configuration`: its `raid_config` argument is checked against Ironic's RAID schema
//!   (the one `PUT …/states/raid` uses), stored as the node's target, and sent as
//!   `target_raid_config`.
//! - A building step's result (`{"raid_config": {...}}`) becomes the node's `raid_config`
//!   with `last_updated`, and updates `local_gb`, `root_device` and the `raid_level`
//!   capability from the root volume (Ironic's `update_raid_info`); `delete_configuration`
//!   leaves `raid_config` `{}` and drops `root_device`. A failed step changes neither.

use super::steps::{PlannedStep, Source};
use super::{Conductor, ConductorError};
use chrono::Utc;
use rivet_model::interfaces::Iface;
use rivet_model::node::Node;
use rivet_model::raid::{self, APPLY_CONFIGURATION, CREATE_CONFIGURATION, DELETE_CONFIGURATION};
use serde_json::{Map, Value};

/// The node's RAID interface.
pub(crate) fn raid_interface(node: &Node) -> String {
    node.interfaces.get(&node.driver, Iface::Raid)
}

/// Whether `step` is one of the agent RAID interface's steps.
fn agent_raid(node: &Node, step: &PlannedStep) -> bool {
    step.source == Source::Agent && step.step.interface == "raid" && raid_interface(node) == "agent"
}

impl Conductor {
    /// The arguments to send the agent for `step`: its own, plus `target_raid_config` for the
    /// RAID steps that build arrays. `first` is the decision that sends the step (it stores
    /// `apply_configuration`'s configuration as the node's target); later decisions only
    /// rebuild the command in case it must be queued again. `Ok(Err(msg))`: the step fails
    /// with `msg` before the agent is asked.
    pub(crate) async fn raid_step_args(
        &self,
        node: &Node,
        step: &PlannedStep,
        first: bool,
    ) -> Result<Result<Map<String, Value>, String>, ConductorError> {
        if !agent_raid(node, step) {
            return Ok(Ok(step.args.clone()));
        }
        match step.step.step.as_str() {
            CREATE_CONFIGURATION => {
                let target = self
                    .store
                    .node_management(&node.uuid)
                    .await?
                    .target_raid_config;
                Ok(raid::create_configuration_args(
                    &node.uuid, &target, &step.args,
                ))
            }
            APPLY_CONFIGURATION => {
                let cfg = match raid::apply_configuration_target(&step.args) {
                    Ok(c) => c,
                    Err(e) => return Ok(Err(e)),
                };
                if first {
                    // As Ironic's RAIDInterface.apply_configuration: the applied
                    // configuration is the node's target from now on.
                    self.store.set_target_raid_config(&node.uuid, &cfg).await?;
                    tracing::info!(node = %node.uuid, "raid.apply_configuration: target_raid_config set from the step's raid_config");
                }
                let mut args = step.args.clone();
                args.insert(raid::TARGET_ARG.into(), Value::Object(cfg));
                Ok(Ok(args))
            }
            _ => Ok(Ok(step.args.clone())),
        }
    }

    /// After `step` succeeded on the agent with `result`: record what a RAID step built
    /// (`raid_config`; `node.properties` changed here, written by the caller with the step's
    /// end). `Ok(Err(msg))`: the result cannot be recorded, and the step fails with `msg`
    /// (Ironic's post step hook failure); nothing was changed then.
    pub(crate) async fn record_raid_result(
        &self,
        node: &mut Node,
        step: &PlannedStep,
        operation: &str,
        result: &Value,
    ) -> Result<Result<(), String>, ConductorError> {
        if !agent_raid(node, step) {
            return Ok(Ok(()));
        }
        let (current, hook) = match step.step.step.as_str() {
            CREATE_CONFIGURATION | APPLY_CONFIGURATION => {
                let mut properties = node.properties.clone();
                let built = raid::built_config(&node.uuid, result)
                    .and_then(|built| raid::update_raid_info(&mut properties, &built, Utc::now()));
                match built {
                    Ok(current) => {
                        node.properties = properties;
                        (current, "_create_configuration_final")
                    }
                    Err(e) => {
                        return Ok(Err(format!(
                            "For node {}, post {operation} step hook _create_configuration_final \
                             failed for {operation} step raid.{}: {e}",
                            node.uuid, step.step.step
                        )))
                    }
                }
            }
            DELETE_CONFIGURATION => (
                raid::delete_configuration_final(&mut node.properties),
                "_delete_configuration_final",
            ),
            _ => return Ok(Ok(())),
        };
        self.store.set_raid_config(&node.uuid, &current).await?;
        let volumes = current
            .get("logical_disks")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        tracing::info!(node = %node.uuid, step = %step.step.step, hook, volumes, "raid_config recorded");
        Ok(Ok(()))
    }
}
