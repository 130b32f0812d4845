//! Provision and power state names, spelled as Ironic spells them.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

macro_rules! string_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum $name {
            $($(#[$vmeta])* #[serde(rename = $text)] $variant,)+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The wire spelling.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text,)+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = UnknownName;
            fn from_str(s: &str) -> Result<Self, UnknownName> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(UnknownName(s.to_string())),
                }
            }
        }
    };
}

/// A name that is not one of the known states or verbs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownName(pub String);

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown name {:?}", self.0)
    }
}

impl std::error::Error for UnknownName {}

string_enum! {
    /// A node's provision state (Ironic's `provision_state`).
    ProvisionState {
        /// New node; BMC not validated yet.
        Enroll => "enroll",
        /// Validating the BMC credentials (`manage`).
        Verifying => "verifying",
        /// Under operator control; not offered for deployment.
        Manageable => "manageable",
        /// Inspection running in the conductor.
        Inspecting => "inspecting",
        /// Waiting for the ramdisk to report its inventory.
        InspectWait => "inspect wait",
        /// Inspection failed; `inspect` again or `manage`.
        InspectFailed => "inspect failed",
        /// Cleaning running in the conductor.
        Cleaning => "cleaning",
        /// Waiting for the ramdisk to run a clean step.
        CleanWait => "clean wait",
        /// Cleaning failed; `manage` to leave.
        CleanFailed => "clean failed",
        /// Cleaning paused by a `hold` step; `unhold` or `abort`.
        CleanHold => "clean hold",
        /// Clean and ready to deploy.
        Available => "available",
        /// Deployment running in the conductor.
        Deploying => "deploying",
        /// Waiting for the ramdisk during deployment.
        WaitCallBack => "wait call-back",
        /// Deployment failed.
        DeployFailed => "deploy failed",
        /// Deployment paused by a `hold` step.
        DeployHold => "deploy hold",
        /// Deployed.
        Active => "active",
        /// Tearing down a deployment.
        Deleting => "deleting",
        /// Tear-down failed.
        Error => "error",
        /// Adopting an already-deployed node.
        Adopting => "adopting",
        /// Adoption failed.
        AdoptFailed => "adopt failed",
        /// Booting the rescue ramdisk.
        Rescuing => "rescuing",
        /// Waiting for the rescue ramdisk.
        RescueWait => "rescue wait",
        /// Rescue ramdisk running.
        Rescue => "rescue",
        /// Rescue failed.
        RescueFailed => "rescue failed",
        /// Leaving rescue.
        Unrescuing => "unrescuing",
        /// Leaving rescue failed.
        UnrescueFailed => "unrescue failed",
        /// Service steps running on an active node (1.87).
        Servicing => "servicing",
        /// Waiting for the ramdisk during servicing.
        ServiceWait => "service wait",
        /// Servicing failed; `service` again, `rescue`, or `abort` back to active.
        ServiceFailed => "service failed",
        /// Servicing paused by a `hold` step; `unhold` or `abort`.
        ServiceHold => "service hold",
    }
}

impl ProvisionState {
    /// Stable states: nothing happens until someone asks.
    pub fn is_stable(self) -> bool {
        use ProvisionState::*;
        matches!(
            self,
            Enroll | Manageable | Available | Active | Error | Rescue
        )
    }

    /// States in which the conductor itself is doing work (no agent involved). A controller
    /// that dies leaves a node here; on restart it must resume or fail it.
    pub fn is_conductor_busy(self) -> bool {
        use ProvisionState::*;
        matches!(
            self,
            Verifying
                | Inspecting
                | Cleaning
                | Deploying
                | Deleting
                | Adopting
                | Rescuing
                | Unrescuing
                | Servicing
        )
    }

    /// States that wait for the ramdisk and time out from `provision_updated_at`.
    pub fn is_wait(self) -> bool {
        use ProvisionState::*;
        matches!(
            self,
            InspectWait | CleanWait | WaitCallBack | RescueWait | ServiceWait
        )
    }

    /// Failure states.
    pub fn is_failed(self) -> bool {
        use ProvisionState::*;
        matches!(
            self,
            InspectFailed
                | CleanFailed
                | DeployFailed
                | AdoptFailed
                | RescueFailed
                | UnrescueFailed
                | ServiceFailed
                | Error
        )
    }
}

string_enum! {
    /// A verb an admin sends as `target` to `PUT /v1/nodes/{id}/states/provision`.
    Verb {
        /// enroll → verifying → manageable; also leaves failure states.
        Manage => "manage",
        /// manageable → cleaning (automated) → available.
        Provide => "provide",
        /// Start inspection.
        Inspect => "inspect",
        /// Manual cleaning with `clean_steps`.
        Clean => "clean",
        /// Abort a wait or hold state.
        Abort => "abort",
        /// Deploy (`active`).
        Active => "active",
        /// Alias of `active`.
        Deploy => "deploy",
        /// Tear down (`deleted`).
        Deleted => "deleted",
        /// Alias of `deleted`.
        Undeploy => "undeploy",
        /// Redeploy an active node.
        Rebuild => "rebuild",
        /// Adopt an already-deployed node.
        Adopt => "adopt",
        /// Boot the rescue ramdisk.
        Rescue => "rescue",
        /// Leave rescue.
        Unrescue => "unrescue",
        /// Leave a hold state.
        Unhold => "unhold",
        /// Run service steps on an active node (1.87).
        Service => "service",
    }
}

string_enum! {
    /// A node's power state (`power_state`).
    PowerState {
        /// Powered on.
        On => "power on",
        /// Powered off.
        Off => "power off",
        /// Reboot in progress (target only).
        Rebooting => "rebooting",
        /// Soft (ACPI) reboot (target only).
        SoftRebooting => "soft rebooting",
        /// Soft (ACPI) power off (target only).
        SoftOff => "soft power off",
        /// Power state could not be read.
        Error => "error",
    }
}
