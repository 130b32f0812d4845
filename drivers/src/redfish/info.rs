//! A Redfish node's `driver_info`, parsed and checked without I/O.
//!
//! Keys are Ironic's: `redfish_address`, `redfish_system_id`, `redfish_username`,
//! `redfish_password`, `redfish_verify_ca`, `redfish_auth_type`; plus `boot_mode`
//! (`uefi` or `bios`) for the boot override.

use crate::DriverError;
use reqwest::Url;
use serde_json::{Map, Value};
use std::fmt;
use std::path::PathBuf;

/// A password: never printed, not even by `{:?}`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(pub(crate) String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("******")
    }
}

/// How TLS certificates are checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verify {
    /// Against the built-in web PKI roots (the default).
    Roots,
    /// Not at all (`redfish_verify_ca = false`).
    Off,
    /// Against this CA bundle only.
    CaFile(PathBuf),
}

/// How the driver authenticates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AuthType {
    /// HTTP basic on every request.
    Basic,
    /// A Redfish session (`X-Auth-Token`), created through the SessionService.
    Session,
    /// A session when the BMC offers one, else basic (Ironic's default).
    Auto,
}

/// One-time boot override mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BootMode {
    /// `BootSourceOverrideMode: UEFI`.
    Uefi,
    /// `BootSourceOverrideMode: Legacy`.
    Legacy,
}

impl BootMode {
    pub(crate) fn redfish(self) -> &'static str {
        match self {
            BootMode::Uefi => "UEFI",
            BootMode::Legacy => "Legacy",
        }
    }
}

/// Everything the Redfish driver needs from `driver_info`.
#[derive(Debug, Clone)]
pub(crate) struct RedfishInfo {
    /// `scheme://host[:port]` (a path prefix is kept).
    pub(crate) address: Url,
    /// `/redfish/v1/Systems/ID` (or `None`: the BMC's only system).
    pub(crate) system_path: Option<String>,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<Secret>,
    pub(crate) verify: Verify,
    pub(crate) auth: AuthType,
    pub(crate) boot_mode: Option<BootMode>,
}

impl RedfishInfo {
    /// The password, for [`crate::redact`].
    pub(crate) fn secret(&self) -> Option<&str> {
        self.password.as_ref().map(|s| s.0.as_str())
    }
}

/// The `driver_info` keys [`parse`] reads (`GET /v1/drivers/redfish/properties`), worded as
/// Ironic's redfish driver words them where the meaning is the same.
pub const PROPERTIES: &[(&str, &str)] = &[
    (
        "redfish_address",
        "The URL address to the Redfish controller. It must include the authority portion of the URL. If the scheme is missing, https is assumed. For example: https://mgmt.vendor.com. If a path is added, it is kept as the API root prefix. Required.",
    ),
    (
        "redfish_system_id",
        "The ComputerSystem the driver manages: its canonical path (for example /redfish/v1/Systems/1) or its bare id. Only needed if the BMC manages more than one ComputerSystem; otherwise the only one is used. Optional.",
    ),
    (
        "redfish_username",
        "User account with admin/server-profile access privilege; required when redfish_password is set. Optional.",
    ),
    ("redfish_password", "User account password. Optional."),
    (
        "redfish_verify_ca",
        "Either a Boolean value or the path of a CA bundle file. If true the BMC's certificate is verified against the built-in roots; if false it is not verified; if a path, it is verified against that bundle only. Defaults to true. Optional.",
    ),
    (
        "redfish_auth_type",
        "Redfish HTTP client authentication method: \"basic\", \"session\" or \"auto\" (a session when the BMC offers one, else basic). Defaults to auto. Optional.",
    ),
    (
        "boot_mode",
        "Boot mode sent with every boot device override (BootSourceOverrideMode): \"uefi\" or \"bios\"; if not set, none is sent and the BMC keeps its own. Optional.",
    ),
];

fn bad(field: &str, reason: impl Into<String>) -> DriverError {
    DriverError::BadDriverInfo {
        field: field.to_string(),
        reason: reason.into(),
    }
}

fn opt_str<'a>(info: &'a Map<String, Value>, field: &str) -> Result<Option<&'a str>, DriverError> {
    match info.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.trim())),
        Some(_) => Err(bad(field, "must be a string")),
    }
}

/// Parse and check `driver_info` (no I/O).
pub(crate) fn parse(info: &Map<String, Value>) -> Result<RedfishInfo, DriverError> {
    let address = parse_address(info)?;
    let system_path = opt_str(info, "redfish_system_id")?.map(system_path);
    let username = opt_str(info, "redfish_username")?.map(str::to_string);
    // A password is taken as given (spaces may be part of it), and never echoed back.
    let password = match info.get("redfish_password") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(Secret(s.clone())),
        Some(_) => return Err(bad("redfish_password", "must be a string")),
    };
    if password.is_some() && username.is_none() {
        return Err(bad(
            "redfish_username",
            "is required when redfish_password is set",
        ));
    }
    Ok(RedfishInfo {
        address,
        system_path,
        username,
        password,
        verify: parse_verify(info)?,
        auth: parse_auth(info)?,
        boot_mode: parse_boot_mode(info)?,
    })
}

fn parse_address(info: &Map<String, Value>) -> Result<Url, DriverError> {
    const F: &str = "redfish_address";
    let raw = opt_str(info, F)?.ok_or_else(|| bad(F, "is required (e.g. https://10.0.0.5)"))?;
    // Ironic accepts a bare host and means https.
    let text = if raw.contains("://") {
        raw.to_string()
    } else {
        format!("https://{raw}")
    };
    let url = Url::parse(&text).map_err(|e| {
        // Never echo an address that may carry user:password@.
        let shown = if raw.contains('@') { "the value" } else { raw };
        bad(F, format!("{shown:?} is not a URL: {e}"))
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad(
            F,
            format!("scheme must be http or https, not {}", url.scheme()),
        ));
    }
    if url.host_str().unwrap_or("").is_empty() {
        return Err(bad(F, "has no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad(
            F,
            "must not carry credentials; use redfish_username and redfish_password",
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad(F, "must not have a query or fragment"));
    }
    Ok(url)
}

/// `/redfish/v1/Systems/ID` from either a path or a bare id.
fn system_path(id: &str) -> String {
    if id.starts_with('/') {
        id.trim_end_matches('/').to_string()
    } else {
        format!("/redfish/v1/Systems/{id}")
    }
}

fn parse_verify(info: &Map<String, Value>) -> Result<Verify, DriverError> {
    const F: &str = "redfish_verify_ca";
    match info.get(F) {
        None | Some(Value::Null) | Some(Value::Bool(true)) => Ok(Verify::Roots),
        Some(Value::Bool(false)) => Ok(Verify::Off),
        Some(Value::String(s)) => match s.trim().to_ascii_lowercase().as_str() {
            "" | "true" | "yes" | "1" | "on" => Ok(Verify::Roots),
            "false" | "no" | "0" | "off" => Ok(Verify::Off),
            _ => Ok(Verify::CaFile(PathBuf::from(s.trim()))),
        },
        Some(_) => Err(bad(F, "must be true, false or the path of a CA bundle")),
    }
}

fn parse_auth(info: &Map<String, Value>) -> Result<AuthType, DriverError> {
    const F: &str = "redfish_auth_type";
    match opt_str(info, F)?.map(str::to_ascii_lowercase).as_deref() {
        None | Some("auto") => Ok(AuthType::Auto),
        Some("basic") => Ok(AuthType::Basic),
        Some("session") => Ok(AuthType::Session),
        Some(other) => Err(bad(
            F,
            format!("{other:?} is not one of basic, session, auto"),
        )),
    }
}

fn parse_boot_mode(info: &Map<String, Value>) -> Result<Option<BootMode>, DriverError> {
    const F: &str = "boot_mode";
    match opt_str(info, F)?.map(str::to_ascii_lowercase).as_deref() {
        None => Ok(None),
        Some("uefi") => Ok(Some(BootMode::Uefi)),
        Some("bios") | Some("legacy") => Ok(Some(BootMode::Legacy)),
        Some(other) => Err(bad(F, format!("{other:?} is not one of uefi, bios"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn info(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn full_info_parses() {
        let i = parse(&info(json!({
            "redfish_address": "http://127.0.0.1:8000",
            "redfish_system_id": "abc",
            "redfish_username": "admin",
            "redfish_password": "hunter2",
            "redfish_verify_ca": "/etc/ca.pem",
            "redfish_auth_type": "Session",
            "boot_mode": "uefi",
        })))
        .expect("valid");
        assert_eq!(i.address.as_str(), "http://127.0.0.1:8000/");
        assert_eq!(i.system_path.as_deref(), Some("/redfish/v1/Systems/abc"));
        assert_eq!(i.verify, Verify::CaFile("/etc/ca.pem".into()));
        assert_eq!(i.auth, AuthType::Session);
        assert_eq!(i.boot_mode, Some(BootMode::Uefi));
        assert!(!format!("{i:?}").contains("hunter2"));
    }

    #[test]
    fn bare_host_means_https_and_path_ids_are_kept() {
        let i = parse(&info(json!({
            "redfish_address": "bmc.example",
            "redfish_system_id": "/redfish/v1/Systems/1/",
            "redfish_verify_ca": false,
        })))
        .expect("valid");
        assert_eq!(i.address.scheme(), "https");
        assert_eq!(i.system_path.as_deref(), Some("/redfish/v1/Systems/1"));
        assert_eq!(i.verify, Verify::Off);
        assert_eq!(i.auth, AuthType::Auto);
    }

    #[test]
    fn bad_info_names_the_field() {
        let cases = [
            (json!({}), "redfish_address"),
            (json!({"redfish_address": "ftp://x"}), "redfish_address"),
            (
                json!({"redfish_address": "http://u:secretpw@x"}),
                "redfish_address",
            ),
            (
                json!({"redfish_address": "http://x", "redfish_password": "p"}),
                "redfish_username",
            ),
            (
                json!({"redfish_address": "http://x", "redfish_auth_type": "kerberos"}),
                "redfish_auth_type",
            ),
            (
                json!({"redfish_address": "http://x", "redfish_verify_ca": 3}),
                "redfish_verify_ca",
            ),
            (
                json!({"redfish_address": "http://x", "boot_mode": "efi"}),
                "boot_mode",
            ),
        ];
        for (v, field) in cases {
            match parse(&info(v.clone())) {
                Err(DriverError::BadDriverInfo { field: f, reason }) => {
                    assert_eq!(f, field, "{v}");
                    assert!(!reason.contains("secretpw"), "{reason}");
                }
                other => panic!("{v}: expected bad {field}, got {other:?}"),
            }
        }
    }

    /// `PROPERTIES` is what `parse` reads: every listed key is checked (a bad value is refused
    /// naming it), and exactly the keys described as "Required." are required.
    #[test]
    fn properties_are_the_keys_parse_reads() {
        let full = json!({"redfish_address": "http://x", "redfish_system_id": "1",
            "redfish_username": "u", "redfish_password": "p", "redfish_verify_ca": false,
            "redfish_auth_type": "basic", "boot_mode": "uefi"});
        let i = parse(&info(full.clone())).expect("valid");
        assert_eq!(
            (i.auth, i.boot_mode),
            (AuthType::Basic, Some(BootMode::Uefi))
        );
        let bad = json!({"redfish_address": "ftp://x", "redfish_system_id": 1,
            "redfish_username": 1, "redfish_password": 1, "redfish_verify_ca": 1,
            "redfish_auth_type": "kerberos", "boot_mode": "efi"});
        crate::check_properties(PROPERTIES, &full, &bad, parse, &["redfish_address"]);
    }
}
