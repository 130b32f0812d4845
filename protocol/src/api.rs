//! Admin API request bodies and common response shapes (Ironic-compatible where they overlap).
//!
//! Request bodies reject unknown fields so a typo is a 400 naming the field, not a silent no-op.

use crate::states::{PowerState, Verb};
use crate::steps::{RequestedDeployStep, RequestedStep};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Lowest API microversion served.
pub const MIN_VERSION: (u32, u32) = (1, 1);
/// Highest API microversion served.
pub const MAX_VERSION: (u32, u32) = (1, 115);
/// Header carrying the requested/used microversion.
pub const VERSION_HEADER: &str = "X-OpenStack-Ironic-API-Version";
/// Header carrying the minimum version.
pub const MIN_VERSION_HEADER: &str = "X-OpenStack-Ironic-API-Minimum-Version";
/// Header carrying the maximum version.
pub const MAX_VERSION_HEADER: &str = "X-OpenStack-Ironic-API-Maximum-Version";

/// `POST /v1/nodes`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeCreate {
    /// Optional UUID (generated when absent).
    #[serde(default)]
    pub uuid: Option<String>,
    /// Unique name.
    #[serde(default)]
    pub name: Option<String>,
    /// Driver: `fake-hardware`, `redfish`, `ipmi`.
    pub driver: String,
    /// BMC address and credentials (Ironic's keys).
    #[serde(default)]
    pub driver_info: Map<String, Value>,
    /// Hardware properties.
    #[serde(default)]
    pub properties: Map<String, Value>,
    /// Deployment settings.
    #[serde(default)]
    pub instance_info: Map<String, Value>,
    /// Free-form operator data.
    #[serde(default)]
    pub extra: Map<String, Value>,
    /// Resource class.
    #[serde(default)]
    pub resource_class: Option<String>,
    /// Per-node automated cleaning switch (null = global default).
    #[serde(default, deserialize_with = "lenient_bool")]
    pub automated_clean: Option<bool>,
    /// Owning project (1.50).
    #[serde(default)]
    pub owner: Option<String>,
    /// Project the node is leased to (1.65).
    #[serde(default)]
    pub lessee: Option<String>,
    /// Free text (1.51).
    #[serde(default)]
    pub description: Option<String>,
    /// Conductor group (1.46).
    #[serde(default)]
    pub conductor_group: Option<String>,
    /// Shard (1.82).
    #[serde(default)]
    pub shard: Option<String>,
    /// Instance network configuration for the configdrive (1.66).
    #[serde(default)]
    pub network_data: Option<Map<String, Value>>,
    /// Name of the instance (1.104).
    #[serde(default)]
    pub instance_name: Option<String>,
    /// Parent node UUID or name (1.83).
    #[serde(default)]
    pub parent_node: Option<String>,
    /// Never power the node off (1.95).
    #[serde(default, deserialize_with = "lenient_bool")]
    pub disable_power_off: Option<bool>,
    /// The chassis the node is in.
    #[serde(default)]
    pub chassis_uuid: Option<String>,
    /// `boot_interface`: one of the hardware type's enabled implementations (its default
    /// when absent).
    #[serde(default)]
    pub boot_interface: Option<String>,
    /// `deploy_interface`: one of the hardware type's enabled implementations (its default
    /// when absent).
    #[serde(default)]
    pub deploy_interface: Option<String>,
    /// `power_interface`: one of the hardware type's enabled implementations (its default
    /// when absent).
    #[serde(default)]
    pub power_interface: Option<String>,
    /// `management_interface`: one of the hardware type's enabled implementations (its default
    /// when absent).
    #[serde(default)]
    pub management_interface: Option<String>,
    /// `rescue_interface`: one of the hardware type's enabled implementations (its default
    /// when absent).
    #[serde(default)]
    pub rescue_interface: Option<String>,
    /// `bios_interface`: one of the hardware type's enabled implementations (its default
    /// when absent).
    #[serde(default)]
    pub bios_interface: Option<String>,
    /// `console_interface`: one of the hardware type's enabled implementations (its default
    /// when absent).
    #[serde(default)]
    pub console_interface: Option<String>,
    /// `firmware_interface`: one of the hardware type's enabled implementations (its default
    /// when absent).
    #[serde(default)]
    pub firmware_interface: Option<String>,
    /// `network_interface`: one of the hardware type's enabled implementations (its default
    /// when absent).
    #[serde(default)]
    pub network_interface: Option<String>,
    /// `raid_interface`: one of the hardware type's enabled implementations (its default
    /// when absent).
    #[serde(default)]
    pub raid_interface: Option<String>,
    /// `storage_interface`: one of the hardware type's enabled implementations (its default
    /// when absent).
    #[serde(default)]
    pub storage_interface: Option<String>,
    /// `vendor_interface`: one of the hardware type's enabled implementations (its default
    /// when absent).
    #[serde(default)]
    pub vendor_interface: Option<String>,
    /// `agent` (in-band, the default) or the driver's name (`redfish`, `fake`) for
    /// out-of-band inspection.
    #[serde(default)]
    pub inspect_interface: Option<String>,
    /// Retired from the start (1.61; Ironic's create schema takes it).
    #[serde(default, deserialize_with = "lenient_bool")]
    pub retired: Option<bool>,
    /// Why it is retired (only with `retired`).
    #[serde(default)]
    pub retired_reason: Option<String>,
    /// The instance the node is associated with.
    #[serde(default)]
    pub instance_uuid: Option<String>,
    /// Created in maintenance.
    #[serde(default, deserialize_with = "lenient_bool")]
    pub maintenance: Option<bool>,
}

/// Ironic's boolean node fields take a string too (`"True"`, `"0"`: oslo's strict
/// `bool_from_string`), which python-ironicclient sends.
pub fn parse_bool_str(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "y" | "on" | "t" => Some(true),
        "false" | "0" | "no" | "n" | "off" | "f" => Some(false),
        _ => None,
    }
}

fn lenient_bool<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    use serde::de::Error;
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(b)),
        Some(Value::String(s)) => parse_bool_str(&s)
            .map(Some)
            .ok_or_else(|| D::Error::custom(format!("{s:?} is not a boolean"))),
        Some(other) => Err(D::Error::custom(format!(
            "expected true or false, not {other}"
        ))),
    }
}

/// `PUT /v1/nodes/{id}/states/provision`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProvisionRequest {
    /// The verb.
    pub target: Verb,
    /// Steps for manual cleaning (`clean` only).
    #[serde(default)]
    pub clean_steps: Option<Vec<RequestedStep>>,
    /// Config drive (`active`/`rebuild` only): gzip+base64 ISO, its URL, or (1.56+) a
    /// `{meta_data, user_data, network_data, vendor_data}` object rivetd builds into one.
    #[serde(default)]
    pub configdrive: Option<Value>,
    /// Deploy steps to run besides the default ones (`active`/`rebuild`, 1.69+).
    #[serde(default)]
    pub deploy_steps: Option<Vec<RequestedDeployStep>>,
    /// Password for the rescue user (`rescue` only, non-empty). Never stored in clear,
    /// never logged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rescue_password: Option<String>,
    /// Skip booting the ramdisk (only when every step is out-of-band).
    #[serde(default)]
    pub disable_ramdisk: Option<bool>,
    /// Steps for servicing (`service` only, 1.87).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_steps: Option<Vec<crate::steps::RequestedStep>>,
    /// A runbook (UUID or name, 1.92) whose steps are the `clean` or `service` steps;
    /// resolved by the API before the verb runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runbook: Option<String>,
}

/// `PUT /v1/nodes/{id}/states/power`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PowerRequest {
    /// `power on`, `power off`, `rebooting`, `soft rebooting`, `soft power off`.
    pub target: PowerState,
    /// Timeout in seconds for soft actions.
    #[serde(default)]
    pub timeout: Option<u64>,
}

/// `PUT /v1/nodes/{id}/maintenance`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaintenanceRequest {
    /// Why the node is in maintenance.
    #[serde(default)]
    pub reason: Option<String>,
}

/// `POST /v1/ports`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortCreate {
    /// Optional UUID.
    #[serde(default)]
    pub uuid: Option<String>,
    /// MAC address.
    pub address: String,
    /// Owning node's UUID (or name).
    pub node_uuid: String,
    /// Whether the node PXE-boots from this port.
    #[serde(default = "default_true")]
    pub pxe_enabled: bool,
    /// Free-form operator data.
    #[serde(default)]
    pub extra: Map<String, Value>,
}

fn default_true() -> bool {
    true
}

/// One RFC 6902 operation of a PATCH body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PatchOp {
    /// `add`, `replace`, `remove` (and `test`).
    pub op: String,
    /// JSON pointer, e.g. `/driver_info/ipmi_address`.
    pub path: String,
    /// Value for add/replace/test: `Some(Value::Null)` when the body says `"value": null`
    /// (Ironic clears a nullable field that way), `None` only when `value` is absent.
    #[serde(
        default,
        deserialize_with = "present_value",
        skip_serializing_if = "Option::is_none"
    )]
    pub value: Option<Value>,
}

/// A `value` key that is present, `null` included.
fn present_value<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// Ironic's error body: `error_message` holds a JSON string with `faultstring`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// JSON-encoded `{"faultstring", "faultcode", "debuginfo"}`.
    pub error_message: String,
}

impl ErrorBody {
    /// Build the body for a message.
    pub fn new(message: &str, client_fault: bool) -> Self {
        let inner = serde_json::json!({
            "faultstring": message,
            "faultcode": if client_fault { "Client" } else { "Server" },
            "debuginfo": Value::Null,
        });
        ErrorBody {
            error_message: inner.to_string(),
        }
    }

    /// The human message, whether `error_message` is Ironic's JSON string or plain text.
    pub fn message(&self) -> String {
        match serde_json::from_str::<Value>(&self.error_message) {
            Ok(v) => v
                .get("faultstring")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| self.error_message.clone()),
            Err(_) => self.error_message.clone(),
        }
    }
}

/// `PUT /v1/nodes/{id}/traits` (1.37): the node's traits, replacing all it had.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraitsRequest {
    /// Standard os-traits names or `CUSTOM_[A-Z0-9_]+`, at most 50.
    pub traits: Vec<String>,
}

/// `PUT /v1/nodes/{id}/management/boot_device`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootDeviceRequest {
    /// `pxe`, `disk`, `cdrom`, `bios`, `safe` or `uefihttp`, as the node's driver supports.
    pub boot_device: String,
    /// For every boot from now on (false: the next boot only).
    #[serde(default)]
    pub persistent: bool,
}

/// `POST /v1/nodes/{id}/vmedia` (1.89).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmediaAttachRequest {
    /// `cdrom`, `disk` or `floppy` (Rivet's drivers attach a cdrom).
    pub device_type: String,
    /// The image's URL.
    pub image_url: String,
    /// `http` (the BMC fetches `image_url`) or `local`; Ironic's default is `local`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_download_source: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_body_round_trip() {
        let b = ErrorBody::new("node n1 is in \"clean wait\"", true);
        assert_eq!(b.message(), "node n1 is in \"clean wait\"");
        let plain = ErrorBody {
            error_message: "plain".into(),
        };
        assert_eq!(plain.message(), "plain");
    }

    #[test]
    fn unknown_field_named() {
        let e = serde_json::from_str::<NodeCreate>(r#"{"driver":"x","colour":1}"#).unwrap_err();
        assert!(e.to_string().contains("colour"), "{e}");
    }

    #[test]
    fn patch_value_null_is_not_absent() {
        let null: PatchOp =
            serde_json::from_str(r#"{"op":"replace","path":"/x","value":null}"#).unwrap();
        assert_eq!(null.value, Some(Value::Null));
        let absent: PatchOp = serde_json::from_str(r#"{"op":"remove","path":"/x"}"#).unwrap();
        assert_eq!(absent.value, None);
    }
}
