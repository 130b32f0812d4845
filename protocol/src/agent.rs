//! The agent protocol: lookup, long-poll heartbeat, commands and their results.
//!
//! The agent only ever makes outbound requests. `POST /agent/v1/lookup` finds the node and (once
//! per ramdisk boot) hands out the agent token; `POST /agent/v1/heartbeat/{node}` carries the
//! token in `Authorization: Bearer`, reports what runs and what finished, and is held open by
//! the controller until a command is ready or `long_poll_s` passes.

use crate::inventory::Inventory;
use crate::steps::StepDescriptor;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Path of the lookup endpoint.
pub const LOOKUP_PATH: &str = "/agent/v1/lookup";
/// Path prefix of the heartbeat endpoint (`{prefix}/{node uuid}`).
pub const HEARTBEAT_PATH: &str = "/agent/v1/heartbeat";

/// `POST /agent/v1/lookup`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LookupRequest {
    /// MAC addresses of every NIC, lower case `aa:bb:cc:dd:ee:ff`.
    #[serde(default)]
    pub macs: Vec<String>,
    /// DMI system UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_uuid: Option<String>,
    /// DMI system serial number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_serial: Option<String>,
    /// Node UUID when the boot told the agent (`rivet.node=`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_uuid: Option<String>,
    /// Agent version.
    #[serde(default)]
    pub agent_version: String,
    /// The ramdisk's boot id (`/proc/sys/kernel/random/boot_id`): the token issued by this
    /// lookup belongs to this boot only. Optional so older agents still look up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
}

/// Longest `boot_id` accepted (the kernel's is a 36-character UUID).
pub const MAX_BOOT_ID_LEN: usize = 64;

/// Timing and behaviour the controller hands the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AgentConfig {
    /// How long the controller holds a heartbeat open when it has nothing to send.
    pub long_poll_s: u64,
    /// The controller fails the node if no heartbeat arrives for this long.
    pub heartbeat_timeout_s: u64,
}

/// Answer to a lookup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LookupResponse {
    /// The node's UUID.
    pub node_uuid: String,
    /// The node's name, if any.
    #[serde(default)]
    pub node_name: Option<String>,
    /// The agent token: present only on the first lookup of a ramdisk boot.
    #[serde(default)]
    pub agent_token: Option<String>,
    /// Timing settings.
    pub config: AgentConfig,
}

/// Progress of a running command.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Progress {
    /// Units done (bytes for erase).
    pub done: u64,
    /// Units in all (0 when unknown).
    pub total: u64,
    /// Short human description.
    #[serde(default)]
    pub message: String,
    /// Current rate in units per second (bytes/s for image writes), when the step knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<u64>,
}

/// What the agent runs right now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunningCommand {
    /// Command id.
    pub id: String,
    /// Command name (`execute_step`, …).
    pub name: String,
    /// The step, for `execute_step`.
    #[serde(default)]
    pub step: Option<String>,
    /// Progress so far.
    #[serde(default)]
    pub progress: Option<Progress>,
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CommandStatus {
    /// Done.
    Succeeded,
    /// Failed; see `error`.
    Failed,
    /// Stopped by an `abort` command.
    Aborted,
}

/// Result of a finished command, kept by the agent until the controller acks it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CommandResult {
    /// Command id.
    pub id: String,
    /// Command name.
    pub name: String,
    /// How it ended.
    pub status: CommandStatus,
    /// The command's output (inventory, steps, step result…).
    #[serde(default)]
    pub result: Value,
    /// Error message on failure.
    #[serde(default)]
    pub error: Option<String>,
    /// Tail of the agent's own log on failure.
    #[serde(default)]
    pub log_tail: Option<String>,
}

/// `POST /agent/v1/heartbeat/{node}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRequest {
    /// Agent version.
    pub agent_version: String,
    /// What runs now.
    #[serde(default)]
    pub running: Option<RunningCommand>,
    /// Finished commands not yet acked.
    #[serde(default)]
    pub results: Vec<CommandResult>,
    /// When false the controller answers at once instead of holding the request.
    #[serde(default = "default_true")]
    pub wait: bool,
    /// The ramdisk's boot id, as sent at lookup; a heartbeat from another boot is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
}

fn default_true() -> bool {
    true
}

/// Answer to a heartbeat.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HeartbeatResponse {
    /// At most one command to run.
    #[serde(default)]
    pub command: Option<Command>,
    /// Ids of results the controller has stored; the agent may forget them.
    #[serde(default)]
    pub acks: Vec<String>,
}

/// A command for the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Command {
    /// Unique id; the agent ignores a repeated one.
    pub id: String,
    /// What to do.
    #[serde(flatten)]
    pub kind: CommandKind,
}

/// The commands an agent understands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "name", content = "params", rename_all = "snake_case")]
pub enum CommandKind {
    /// Collect and return the inventory.
    GetInventory,
    /// Return the clean steps the hardware managers offer.
    GetCleanSteps,
    /// Return the deploy steps the hardware managers offer (`write_image`…).
    GetDeploySteps,
    /// Run one step.
    ExecuteStep {
        /// Interface of the step.
        interface: String,
        /// Step name.
        step: String,
        /// Arguments.
        #[serde(default)]
        #[cfg_attr(feature = "openapi", schema(value_type = Object))]
        args: Map<String, Value>,
    },
    /// Cancel a running command.
    Abort {
        /// The command to cancel.
        command_id: String,
    },
    /// Reboot the machine.
    Reboot,
    /// Power the machine off.
    PowerOff,
    /// Rescue: set the `rescue` user's password in the ramdisk and stop taking commands.
    FinalizeRescue {
        /// SHA-512 crypt (`$6$…`) of the rescue password; the plaintext never leaves rivetd.
        rescue_password_hash: String,
    },
}

impl CommandKind {
    /// The command's name on the wire.
    pub fn name(&self) -> &'static str {
        match self {
            CommandKind::GetInventory => "get_inventory",
            CommandKind::GetCleanSteps => "get_clean_steps",
            CommandKind::GetDeploySteps => "get_deploy_steps",
            CommandKind::ExecuteStep { .. } => "execute_step",
            CommandKind::Abort { .. } => "abort",
            CommandKind::Reboot => "reboot",
            CommandKind::PowerOff => "power_off",
            CommandKind::FinalizeRescue { .. } => "finalize_rescue",
        }
    }
}

/// Result body of `get_inventory`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InventoryResult {
    /// The inventory.
    pub inventory: Inventory,
}

/// Result body of `get_clean_steps`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CleanStepsResult {
    /// Steps after dispatch (one per name: the highest-support manager's).
    pub clean_steps: Vec<StepDescriptor>,
    /// Manager name → version.
    #[serde(default)]
    pub hardware_manager_versions: Map<String, Value>,
}

/// Result body of `get_deploy_steps`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeployStepsResult {
    /// Deploy steps after dispatch (one per name: the highest-support manager's).
    pub deploy_steps: Vec<StepDescriptor>,
    /// Manager name → version.
    #[serde(default)]
    pub hardware_manager_versions: Map<String, Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_wire_shape() {
        let c = Command {
            id: "c1".into(),
            kind: CommandKind::ExecuteStep {
                interface: "deploy".into(),
                step: "erase_devices".into(),
                args: Map::new(),
            },
        };
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["name"], "execute_step");
        assert_eq!(v["params"]["step"], "erase_devices");
        let back: Command = serde_json::from_value(v).unwrap();
        assert_eq!(back, c);
        let g: Command = serde_json::from_str(r#"{"id":"x","name":"get_inventory"}"#).unwrap();
        assert_eq!(g.kind, CommandKind::GetInventory);
    }
}
