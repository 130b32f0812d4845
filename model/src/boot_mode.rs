//! A node's effective boot mode and whether Secure Boot is requested, decided from its
//! settings as Ironic's `boot_mode_utils.get_boot_mode` / `is_secure_boot_requested` decide
//! them. Pure: the conductor reads the BMC and the configuration and passes them in.
//!
//! Precedence, first that says something wins:
//! 1. `instance_info.capabilities.secure_boot: true` means `uefi` (Secure Boot is UEFI's);
//! 2. `instance_info.capabilities.boot_mode`, then the deprecated `instance_info.deploy_boot_mode`;
//! 3. `properties.capabilities.boot_mode` (what inspection records);
//! 4. `driver_info.boot_mode` (the older Redfish/IPMI driver field, still honoured);
//! 5. the mode the BMC reports (Ironic keeps the machine's own mode rather than change it);
//! 6. `[deploy] default_boot_mode`.
//!
//! As in Ironic, an instance that asks for a mode other than the node's
//! `properties.capabilities.boot_mode` is refused (the hardware was declared for one mode).
//! Stricter than Ironic: an instance that asks for Secure Boot *and* `bios` is refused rather
//! than silently switched to UEFI, and a value that is not `uefi`/`bios` is an error, not
//! ignored. Secure Boot is requested by `instance_info` only, as in Ironic: in
//! `properties.capabilities`, `secure_boot:true` says the hardware *can* (a scheduling hint).

use rivet_protocol::deploy::BootMode;
use serde_json::{Map, Value};

/// Where the effective boot mode came from (for logs and error messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeSource {
    /// `instance_info.capabilities` `secure_boot: true`.
    SecureBoot,
    /// `instance_info.capabilities` `boot_mode`.
    InstanceCapabilities,
    /// `instance_info.deploy_boot_mode` (deprecated in Ironic).
    InstanceDeployBootMode,
    /// `properties.capabilities` `boot_mode`.
    Properties,
    /// `driver_info.boot_mode`.
    DriverInfo,
    /// What the BMC reports.
    Bmc,
    /// `[deploy] default_boot_mode`.
    Default,
}

impl ModeSource {
    /// The setting's name as an operator writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            ModeSource::SecureBoot => "instance_info capabilities secure_boot:true",
            ModeSource::InstanceCapabilities => "instance_info capabilities boot_mode",
            ModeSource::InstanceDeployBootMode => "instance_info deploy_boot_mode",
            ModeSource::Properties => "properties capabilities boot_mode",
            ModeSource::DriverInfo => "driver_info boot_mode",
            ModeSource::Bmc => "the mode the BMC reports",
            ModeSource::Default => "[deploy] default_boot_mode",
        }
    }
}

/// The boot mode a node is deployed and booted in, and whether Secure Boot is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Effective {
    /// The mode.
    pub mode: BootMode,
    /// Which setting decided it.
    pub source: ModeSource,
    /// `instance_info.capabilities` has `secure_boot: true`.
    pub secure_boot: bool,
}

/// A node's settings contradict each other or hold a value that is not a boot mode; the
/// text names the field, the value and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BootModeError(pub String);

/// The `capabilities` of `instance_info` or `properties`, as key → value text. Ironic's forms:
/// a `"k:v,k2:v2"` string (properties), a JSON object or a string holding one
/// (instance_info); both forms are read from either place. Entries of a `k:v` string that
/// are not `key:value` are skipped, as Ironic's `get_node_capability` skips them.
pub fn capabilities(
    value: Option<&Value>,
    field: &str,
) -> Result<Map<String, Value>, BootModeError> {
    let text = match value {
        None | Some(Value::Null) => return Ok(Map::new()),
        Some(Value::Object(m)) => return Ok(m.clone()),
        Some(Value::String(s)) => s.trim(),
        Some(other) => {
            return Err(BootModeError(format!(
            "{field} is {other}: write it as a JSON object or a \"key:value,key2:value2\" string"
        )))
        }
    };
    if text.starts_with('{') {
        return match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(m)) => Ok(m),
            _ => Err(BootModeError(format!(
                "{field} {text:?} starts like JSON but is not a JSON object: fix it or write \"key:value,key2:value2\""
            ))),
        };
    }
    Ok(text
        .split(',')
        .filter_map(|entry| {
            let (k, v) = entry.split_once(':')?;
            let (k, v) = (k.trim(), v.trim());
            (!k.is_empty() && !v.is_empty() && !v.contains(':'))
                .then(|| (k.to_string(), Value::from(v)))
        })
        .collect())
}

/// A capability's value as text (`true` and `"true"` alike).
fn cap_text(caps: &Map<String, Value>, key: &str) -> Option<String> {
    match caps.get(key)? {
        Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A boot mode written in `source`; `legacy` is accepted where the drivers accepted it.
fn parse_mode(text: &str, source: ModeSource) -> Result<BootMode, BootModeError> {
    let lower = text.to_ascii_lowercase();
    match (lower.as_str(), source) {
        ("uefi", _) => Ok(BootMode::Uefi),
        ("bios", _) => Ok(BootMode::Bios),
        ("legacy", ModeSource::DriverInfo) => Ok(BootMode::Bios),
        _ => Err(BootModeError(format!(
            "{} is {text:?}, which is not a boot mode: use \"uefi\" or \"bios\"",
            source.as_str()
        ))),
    }
}

/// Whether the instance asks for Secure Boot (`instance_info.capabilities` `secure_boot`
/// `true`, any case), as Ironic's `is_secure_boot_requested`.
pub fn secure_boot_requested(instance_info: &Map<String, Value>) -> Result<bool, BootModeError> {
    let caps = capabilities(
        instance_info.get("capabilities"),
        "instance_info capabilities",
    )?;
    Ok(cap_text(&caps, "secure_boot").is_some_and(|v| v.eq_ignore_ascii_case("true")))
}

/// The node's effective boot mode. `bmc` is the mode its BMC reports (`None` when it does not
/// say or cannot be read); `default` is `[deploy] default_boot_mode`.
pub fn resolve(
    instance_info: &Map<String, Value>,
    properties: &Map<String, Value>,
    driver_info: &Map<String, Value>,
    bmc: Option<BootMode>,
    default: BootMode,
) -> Result<Effective, BootModeError> {
    let inst = capabilities(
        instance_info.get("capabilities"),
        "instance_info capabilities",
    )?;
    let props = capabilities(properties.get("capabilities"), "properties capabilities")?;
    let secure_boot =
        cap_text(&inst, "secure_boot").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let text = |v: Option<&Value>| {
        v.and_then(Value::as_str)
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let declared = match cap_text(&props, "boot_mode") {
        Some(t) => Some(parse_mode(&t, ModeSource::Properties)?),
        None => None,
    };
    let asked = match (
        cap_text(&inst, "boot_mode"),
        text(instance_info.get("deploy_boot_mode")),
    ) {
        (Some(t), _) => Some((
            parse_mode(&t, ModeSource::InstanceCapabilities)?,
            ModeSource::InstanceCapabilities,
        )),
        (None, Some(t)) => Some((
            parse_mode(&t, ModeSource::InstanceDeployBootMode)?,
            ModeSource::InstanceDeployBootMode,
        )),
        (None, None) => None,
    };
    if let (Some((mode, source)), Some(node_mode)) = (asked, declared) {
        if mode != node_mode {
            return Err(BootModeError(format!(
                "{} asks for {} but the node's properties capabilities boot_mode is {}: deploy with {} or change the node's capabilities",
                source.as_str(),
                mode.as_str(),
                node_mode.as_str(),
                node_mode.as_str()
            )));
        }
    }
    let chosen = asked
        .or(declared.map(|m| (m, ModeSource::Properties)))
        .map(Ok)
        .or_else(|| {
            text(driver_info.get("boot_mode")).map(|t| {
                parse_mode(&t, ModeSource::DriverInfo).map(|m| (m, ModeSource::DriverInfo))
            })
        })
        .transpose()?;
    let (mode, source) = match (secure_boot, chosen) {
        (true, Some((BootMode::Bios, source))) => {
            return Err(BootModeError(format!(
                "instance_info capabilities ask for secure_boot:true but {} is bios; Secure Boot needs uefi: remove secure_boot or ask for uefi",
                source.as_str()
            )))
        }
        (_, Some(chosen)) => chosen,
        (true, None) => (BootMode::Uefi, ModeSource::SecureBoot),
        (false, None) => match bmc {
            Some(m) => (m, ModeSource::Bmc),
            None => (default, ModeSource::Default),
        },
    };
    Ok(Effective {
        mode,
        source,
        secure_boot,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    fn eff(
        ii: Value,
        props: Value,
        di: Value,
        bmc: Option<BootMode>,
    ) -> Result<(BootMode, ModeSource), BootModeError> {
        resolve(&map(ii), &map(props), &map(di), bmc, BootMode::Uefi).map(|e| (e.mode, e.source))
    }

    use BootMode::{Bios, Uefi};

    #[test]
    fn each_level_wins_over_the_ones_below() {
        // instance_info capabilities (object form) beat everything below.
        assert_eq!(
            eff(
                json!({"capabilities": {"boot_mode": "bios"}}),
                json!({}),
                json!({"boot_mode": "uefi"}),
                Some(Uefi)
            ),
            Ok((Bios, ModeSource::InstanceCapabilities))
        );
        // The deprecated instance_info field comes next.
        assert_eq!(
            eff(
                json!({"deploy_boot_mode": "bios"}),
                json!({}),
                json!({"boot_mode": "uefi"}),
                Some(Uefi)
            ),
            Ok((Bios, ModeSource::InstanceDeployBootMode))
        );
        // properties capabilities ("k:v" string form) beat driver_info and the BMC.
        assert_eq!(
            eff(
                json!({}),
                json!({"capabilities": "cpu_vt:true,boot_mode:bios"}),
                json!({"boot_mode": "uefi"}),
                Some(Uefi)
            ),
            Ok((Bios, ModeSource::Properties))
        );
        // driver_info beats the BMC; "legacy" is the older spelling of bios there.
        assert_eq!(
            eff(
                json!({}),
                json!({}),
                json!({"boot_mode": "Legacy"}),
                Some(Uefi)
            ),
            Ok((Bios, ModeSource::DriverInfo))
        );
        // The BMC's own mode beats the configured default.
        assert_eq!(
            eff(json!({}), json!({}), json!({}), Some(Bios)),
            Ok((Bios, ModeSource::Bmc))
        );
        // Nothing says: the default.
        let e =
            resolve(&Map::new(), &Map::new(), &Map::new(), None, Bios).map(|e| (e.mode, e.source));
        assert_eq!(e, Ok((Bios, ModeSource::Default)));
    }

    #[test]
    fn both_capability_forms_parse_from_both_places() {
        for caps in [
            json!({"boot_mode": "bios"}),
            json!("{\"boot_mode\": \"bios\"}"),
            json!("boot_mode:bios"),
            json!(" secure_boot:false , boot_mode : BIOS "),
        ] {
            assert_eq!(
                eff(
                    json!({ "capabilities": caps.clone() }),
                    json!({}),
                    json!({}),
                    Some(Uefi)
                )
                .map(|e| e.0),
                Ok(Bios),
                "instance_info {caps}"
            );
            assert_eq!(
                eff(
                    json!({}),
                    json!({ "capabilities": caps.clone() }),
                    json!({}),
                    Some(Uefi)
                )
                .map(|e| e.0),
                Ok(Bios),
                "properties {caps}"
            );
        }
        // Malformed k:v entries are skipped (Ironic's get_node_capability), not fatal.
        assert_eq!(
            eff(
                json!({}),
                json!({"capabilities": "junk,a:b:c,boot_mode:bios"}),
                json!({}),
                None
            )
            .map(|e| e.0),
            Ok(Bios)
        );
    }

    #[test]
    fn secure_boot_means_uefi_from_instance_info_only() {
        for sb in [
            json!({"secure_boot": "true"}),
            json!({"secure_boot": true}),
            json!("secure_boot:True"),
        ] {
            let ii = map(json!({ "capabilities": sb.clone() }));
            assert_eq!(secure_boot_requested(&ii), Ok(true), "{sb}");
            let e = resolve(&ii, &Map::new(), &Map::new(), Some(Bios), Bios).expect("resolves");
            assert_eq!(
                (e.mode, e.source, e.secure_boot),
                (Uefi, ModeSource::SecureBoot, true),
                "{sb}"
            );
        }
        // In properties, secure_boot:true says the hardware can; it requests nothing.
        let props = map(json!({"capabilities": "secure_boot:true"}));
        let e = resolve(&Map::new(), &props, &Map::new(), Some(Bios), Uefi).expect("resolves");
        assert_eq!((e.mode, e.secure_boot), (Bios, false));
        assert_eq!(
            secure_boot_requested(&map(json!({"capabilities": {"secure_boot": "false"}}))),
            Ok(false)
        );
        assert_eq!(secure_boot_requested(&Map::new()), Ok(false));
    }

    #[test]
    fn bad_values_and_contradictions_are_refused_with_the_field() {
        let err = eff(
            json!({"capabilities": {"boot_mode": "efi"}}),
            json!({}),
            json!({}),
            None,
        )
        .expect_err("efi");
        assert!(
            err.0.contains("instance_info capabilities boot_mode") && err.0.contains("\"efi\""),
            "{err}"
        );
        let err = eff(
            json!({}),
            json!({"capabilities": "boot_mode:legacy"}),
            json!({}),
            None,
        )
        .expect_err("legacy");
        assert!(
            err.0.contains("properties capabilities boot_mode")
                && err.0.contains("\"uefi\" or \"bios\""),
            "{err}"
        );
        let err =
            eff(json!({}), json!({}), json!({"boot_mode": "efi"}), None).expect_err("driver_info");
        assert!(err.0.contains("driver_info boot_mode"), "{err}");
        let err =
            eff(json!({"capabilities": 5}), json!({}), json!({}), None).expect_err("a number");
        assert!(err.0.contains("instance_info capabilities is 5"), "{err}");
        let err = eff(
            json!({"capabilities": "{not json"}),
            json!({}),
            json!({}),
            None,
        )
        .expect_err("bad json");
        assert!(err.0.contains("not a JSON object"), "{err}");
        // The instance asks for another mode than the node is declared for (Ironic refuses).
        let err = eff(
            json!({"capabilities": {"boot_mode": "bios"}}),
            json!({"capabilities": "boot_mode:uefi"}),
            json!({}),
            None,
        )
        .expect_err("contradiction");
        assert!(
            err.0.contains("asks for bios") && err.0.contains("boot_mode is uefi"),
            "{err}"
        );
        // Secure Boot with an explicit bios.
        let err = eff(
            json!({"capabilities": {"boot_mode": "bios", "secure_boot": "true"}}),
            json!({}),
            json!({}),
            None,
        )
        .expect_err("secure boot on bios");
        assert!(err.0.contains("Secure Boot needs uefi"), "{err}");
        let err = eff(
            json!({"capabilities": "secure_boot:true"}),
            json!({}),
            json!({"boot_mode": "bios"}),
            None,
        )
        .expect_err("secure boot on a bios driver_info");
        assert!(err.0.contains("driver_info boot_mode is bios"), "{err}");
    }
}
