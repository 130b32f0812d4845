//! Step descriptors: what a hardware manager or a driver offers, and what an operator asks for.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// Description of one argument a step takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArgInfo {
    /// Human description.
    #[serde(default)]
    pub description: String,
    /// Whether the step refuses to run without it.
    #[serde(default)]
    pub required: bool,
}

/// A step as advertised (Ironic's step dict, without runtime args).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepDescriptor {
    /// Interface the step belongs to: deploy, management, bios, raid, firmware, power, vendor.
    pub interface: String,
    /// Step name, e.g. `erase_devices_metadata`.
    pub step: String,
    /// 0 = manual only; higher runs earlier in automated cleaning.
    #[serde(default)]
    pub priority: i64,
    /// Whether `abort` may interrupt it.
    #[serde(default)]
    pub abortable: bool,
    /// Arguments it takes.
    #[serde(default)]
    pub argsinfo: BTreeMap<String, ArgInfo>,
    /// The conductor reboots the node after the step succeeds.
    #[serde(default)]
    pub reboot_requested: bool,
    /// Whether the step needs the ramdisk running.
    #[serde(default = "default_true")]
    pub requires_ramdisk: bool,
}

fn default_true() -> bool {
    true
}

impl StepDescriptor {
    /// An in-band step, run by the agent in the ramdisk: on the deploy interface, abortable,
    /// taking no arguments and asking for no reboot (set those fields where a step differs).
    pub fn in_band(step: impl Into<String>, priority: i64) -> StepDescriptor {
        StepDescriptor {
            interface: "deploy".into(),
            step: step.into(),
            priority,
            abortable: true,
            argsinfo: BTreeMap::new(),
            reboot_requested: false,
            requires_ramdisk: true,
        }
    }
}

/// One step an operator asks for in manual cleaning (`clean_steps` of a provision request).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestedStep {
    /// Interface of the step.
    pub interface: String,
    /// Step name.
    pub step: String,
    /// Arguments.
    #[serde(default)]
    pub args: Map<String, Value>,
    /// Optional explicit order (accepted for Ironic compatibility; list order wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<i64>,
}

/// One deploy step an operator asks for (`deploy_steps` of an `active`/`rebuild` request, or a
/// deploy template's step): Ironic requires a priority, which places it among the default
/// deploy steps (0 disables a step of that name).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestedDeployStep {
    /// Interface of the step.
    pub interface: String,
    /// Step name.
    pub step: String,
    /// Arguments.
    #[serde(default)]
    pub args: Map<String, Value>,
    /// Where it runs among the other deploy steps (higher first); 0 = do not run.
    pub priority: i64,
}
