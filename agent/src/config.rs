//! Agent configuration: kernel command line, then environment, then flags (last one wins).
//!
//! The ramdisk has no config file: the boot loader passes `rivet.controller=URL[,URL…]`,
//! `rivet.ca=PATH`, `rivet.node=UUID`, `rivet.log=LEVEL` and PXE's `BOOTIF=01-aa-bb-…` on the
//! kernel command line. Tests and manual runs use `RIVET_*` variables or flags instead.
//!
//! IPA mode (a stock Ironic drives the agent, see [`crate::ipa`]) is chosen by the parameters
//! ironic-python-agent reads: `ipa-api-url=URL` (or `--ironic URL`), with
//! `ipa-listen-port=`, `ipa-advertise-host=`, `ipa-advertise-port=` and
//! `ipa-inspection-callback-url=`.
//! [`resolve`] is pure so every precedence rule is unit-tested.

use std::path::PathBuf;

/// Errors in the agent's configuration.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// No controller URL anywhere.
    #[error(
        "no controller URL: pass --controller URL, set RIVET_CONTROLLER, or boot with \
         rivet.controller=URL on the kernel command line"
    )]
    NoController,
    /// A controller URL that is not http(s).
    #[error("controller URL {0:?} must start with http:// or https://")]
    BadController(String),
}

/// What the kernel command line says (every field optional).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BootParams {
    /// `rivet.controller=` (comma separated, may repeat).
    pub controllers: Vec<String>,
    /// `rivet.ca=`.
    pub ca: Option<PathBuf>,
    /// `rivet.node=`.
    pub node: Option<String>,
    /// `rivet.log=`.
    pub log: Option<String>,
    /// `rivet.log_json=1` (or `true`/`yes`/`on`; `0`… turns it off).
    pub log_json: Option<bool>,
    /// MAC from `BOOTIF=01-aa-bb-cc-dd-ee-ff`, as `aa:bb:cc:dd:ee:ff`.
    pub pxe_mac: Option<String>,
    /// `ipa-api-url=`: Ironic's API, which selects IPA mode.
    pub ipa_api_url: Option<String>,
    /// `ipa-listen-port=` (IPA's default 9999).
    pub ipa_listen_port: Option<u16>,
    /// `ipa-advertise-host=`: the address Ironic calls back (else the lookup interface's).
    pub ipa_advertise_host: Option<String>,
    /// `ipa-advertise-port=` (else the listen port).
    pub ipa_advertise_port: Option<u16>,
    /// `ipa-inspection-callback-url=`: where the inventory is posted for in-band inspection.
    pub ipa_inspection_callback: Option<String>,
    /// `ipa-enable-auto-tls=`: serve IPA's API over TLS with a self-signed certificate
    /// (IPA's default, on).
    pub ipa_auto_tls: Option<bool>,
}

/// Parse `/proc/cmdline`. Unknown tokens are ignored; quotes around values are stripped.
pub fn parse_cmdline(cmdline: &str) -> BootParams {
    let mut p = BootParams::default();
    for token in cmdline.split_whitespace() {
        let Some((key, value)) = token.split_once('=') else {
            continue;
        };
        let value = value.trim_matches('"');
        match key {
            "rivet.controller" => p.controllers.extend(split_list(value)),
            "rivet.ca" if !value.is_empty() => p.ca = Some(PathBuf::from(value)),
            "rivet.node" if !value.is_empty() => p.node = Some(value.to_string()),
            "rivet.log" if !value.is_empty() => p.log = Some(value.to_string()),
            "rivet.log_json" => p.log_json = flag(value),
            "BOOTIF" => p.pxe_mac = parse_bootif(value),
            "ipa-api-url" if !value.is_empty() => p.ipa_api_url = Some(value.to_string()),
            "ipa-listen-port" => p.ipa_listen_port = value.parse().ok(),
            "ipa-advertise-host" if !value.is_empty() => {
                p.ipa_advertise_host = Some(value.to_string())
            }
            "ipa-advertise-port" => p.ipa_advertise_port = value.parse().ok(),
            "ipa-inspection-callback-url" if !value.is_empty() => {
                p.ipa_inspection_callback = Some(value.to_string())
            }
            "ipa-enable-auto-tls" => p.ipa_auto_tls = flag(value),
            _ => {}
        }
    }
    p
}

/// `01-aa-bb-cc-dd-ee-ff` (hardware type 01 = Ethernet, then the MAC) → `aa:bb:cc:dd:ee:ff`.
/// A bare MAC with `-` or `:` separators is accepted too.
pub fn parse_bootif(value: &str) -> Option<String> {
    let parts: Vec<&str> = value.split(['-', ':']).collect();
    let mac = match parts.len() {
        7 => &parts[1..],
        6 => &parts[..],
        _ => return None,
    };
    if mac
        .iter()
        .all(|b| b.len() == 2 && b.chars().all(|c| c.is_ascii_hexdigit()))
    {
        Some(mac.join(":").to_ascii_lowercase())
    } else {
        None
    }
}

/// Split a comma-separated list, dropping empty items.
pub fn split_list(value: &str) -> impl Iterator<Item = String> + '_ {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// Settings given on the command line (highest precedence).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--controller`.
    pub controllers: Vec<String>,
    /// `--devices`.
    pub devices: Vec<PathBuf>,
    /// `--node`.
    pub node: Option<String>,
    /// `--ca`.
    pub ca: Option<PathBuf>,
    /// `--log`.
    pub log: Option<String>,
    /// `--log-json` (only ever turns JSON on).
    pub log_json: bool,
}

/// The resolved configuration of a running agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Controller base URLs, tried in turn.
    pub controllers: Vec<String>,
    /// Explicit device list, if any.
    pub devices: Option<Vec<PathBuf>>,
    /// Node UUID hint for lookup.
    pub node: Option<String>,
    /// Extra CA certificate (PEM) to trust.
    pub ca: Option<PathBuf>,
    /// Log filter (`info`, `rivet_agent=debug`, …).
    pub log: String,
    /// Log JSON lines on stderr (`--log-json`, `RIVET_LOG_JSON=1`, `rivet.log_json=1`).
    pub log_json: bool,
    /// MAC of the PXE interface.
    pub pxe_mac: Option<String>,
}

/// Merge command line < environment < flags. `env` looks a variable up (`std::env::var` in
/// production, a map in tests). Controller URLs are required only if `need_controller`.
pub fn resolve(
    cmdline: &str,
    env: &dyn Fn(&str) -> Option<String>,
    flags: &Overrides,
    need_controller: bool,
) -> Result<Settings, ConfigError> {
    let boot = parse_cmdline(cmdline);
    let env_list = |name: &str| -> Vec<String> {
        env(name)
            .map(|v| split_list(&v).collect())
            .unwrap_or_default()
    };
    let env_one = |name: &str| env(name).filter(|v| !v.trim().is_empty());

    let controllers = first_non_empty([
        flags.controllers.clone(),
        env_list("RIVET_CONTROLLER"),
        boot.controllers,
    ]);
    // Trailing slashes would double up with the endpoint paths.
    let controllers: Vec<String> = controllers
        .into_iter()
        .map(|c| c.trim_end_matches('/').to_string())
        .collect();
    for c in &controllers {
        if !(c.starts_with("http://") || c.starts_with("https://")) {
            return Err(ConfigError::BadController(c.clone()));
        }
    }
    if need_controller && controllers.is_empty() {
        return Err(ConfigError::NoController);
    }

    let devices: Vec<PathBuf> = if flags.devices.is_empty() {
        env_list("RIVET_DEVICES")
            .into_iter()
            .map(PathBuf::from)
            .collect()
    } else {
        flags.devices.clone()
    };

    Ok(Settings {
        controllers,
        devices: (!devices.is_empty()).then_some(devices),
        node: flags.node.clone().or(env_one("RIVET_NODE")).or(boot.node),
        ca: flags
            .ca
            .clone()
            .or(env_one("RIVET_CA").map(PathBuf::from))
            .or(boot.ca),
        log: flags
            .log
            .clone()
            .or(env_one("RIVET_LOG"))
            .or(boot.log)
            .unwrap_or_else(|| "info".to_string()),
        log_json: flags.log_json
            || env_one("RIVET_LOG_JSON")
                .and_then(|v| flag(&v))
                .or(boot.log_json)
                .unwrap_or(false),
        pxe_mac: boot.pxe_mac,
    })
}

/// A boolean setting's value; `None` when it is not one.
fn flag(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

fn first_non_empty<const N: usize>(lists: [Vec<String>; N]) -> Vec<String> {
    lists
        .into_iter()
        .find(|l| !l.is_empty())
        .unwrap_or_default()
}

/// Read `/proc/cmdline`; empty when unreadable (e.g. in a container).
pub fn read_cmdline() -> String {
    std::fs::read_to_string("/proc/cmdline").unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn parses_kernel_command_line() {
        let p = parse_cmdline(
            "BOOT_IMAGE=/vmlinuz quiet rivet.controller=http://a:6385,https://b:6385/ \
             rivet.controller=http://c rivet.ca=/etc/rivet/ca.pem rivet.node=n-1 \
             rivet.log=debug BOOTIF=01-AA-bb-cc-dd-ee-ff console=ttyS0,115200",
        );
        assert_eq!(
            p.controllers,
            vec!["http://a:6385", "https://b:6385/", "http://c"]
        );
        assert_eq!(p.ca, Some(PathBuf::from("/etc/rivet/ca.pem")));
        assert_eq!(p.node.as_deref(), Some("n-1"));
        assert_eq!(p.log.as_deref(), Some("debug"));
        assert_eq!(p.pxe_mac.as_deref(), Some("aa:bb:cc:dd:ee:ff"));
    }

    #[test]
    fn odd_tokens_are_ignored() {
        let p = parse_cmdline("rivet.controller= rivet.node= BOOTIF=garbage = ==x rivet.ca");
        assert_eq!(p, BootParams::default());
        assert_eq!(parse_bootif("01-aa-bb-cc-dd"), None);
        assert_eq!(
            parse_bootif("aa-bb-cc-dd-ee-ff").as_deref(),
            Some("aa:bb:cc:dd:ee:ff")
        );
        assert_eq!(parse_bootif("01-zz-bb-cc-dd-ee-ff"), None);
    }

    #[test]
    fn flags_beat_env_beat_cmdline() {
        let cmdline = "rivet.controller=http://boot rivet.node=boot-node rivet.log=warn";
        let s = resolve(cmdline, &env_of(&[]), &Overrides::default(), true).unwrap();
        assert_eq!(s.controllers, vec!["http://boot"]);
        assert_eq!(s.node.as_deref(), Some("boot-node"));
        assert_eq!(s.log, "warn");
        assert_eq!(s.devices, None);

        let env = env_of(&[
            ("RIVET_CONTROLLER", "http://env1, http://env2/"),
            ("RIVET_NODE", "env-node"),
            ("RIVET_DEVICES", "/tmp/a,/tmp/b"),
            ("RIVET_CA", "/env/ca"),
        ]);
        let s = resolve(cmdline, &env, &Overrides::default(), true).unwrap();
        assert_eq!(s.controllers, vec!["http://env1", "http://env2"]);
        assert_eq!(s.node.as_deref(), Some("env-node"));
        assert_eq!(
            s.devices,
            Some(vec![PathBuf::from("/tmp/a"), PathBuf::from("/tmp/b")])
        );
        assert_eq!(s.ca, Some(PathBuf::from("/env/ca")));

        let flags = Overrides {
            controllers: vec!["https://flag".into()],
            devices: vec![PathBuf::from("/dev/loop0")],
            node: Some("flag-node".into()),
            ca: None,
            log: Some("trace".into()),
            log_json: false,
        };
        let s = resolve(cmdline, &env, &flags, true).unwrap();
        assert_eq!(s.controllers, vec!["https://flag"]);
        assert_eq!(s.devices, Some(vec![PathBuf::from("/dev/loop0")]));
        assert_eq!(s.node.as_deref(), Some("flag-node"));
        assert_eq!(s.ca, Some(PathBuf::from("/env/ca")));
        assert_eq!(s.log, "trace");
    }

    #[test]
    fn log_json_from_cmdline_env_or_flag() {
        let none = Overrides::default();
        let s = resolve("rivet.log_json=1", &env_of(&[]), &none, false).unwrap();
        assert!(s.log_json);
        let s = resolve(
            "rivet.log_json=1",
            &env_of(&[("RIVET_LOG_JSON", "0")]),
            &none,
            false,
        )
        .unwrap();
        assert!(!s.log_json, "the environment beats the command line");
        let s = resolve("", &env_of(&[("RIVET_LOG_JSON", "yes")]), &none, false).unwrap();
        assert!(s.log_json);
        let s = resolve("rivet.log_json=bogus", &env_of(&[]), &none, false).unwrap();
        assert!(!s.log_json);
        let flags = Overrides {
            log_json: true,
            ..Overrides::default()
        };
        let s = resolve("rivet.log_json=0", &env_of(&[]), &flags, false).unwrap();
        assert!(s.log_json);
    }

    #[test]
    fn controller_is_required_only_for_run() {
        let none = Overrides::default();
        assert_eq!(
            resolve("", &env_of(&[]), &none, true),
            Err(ConfigError::NoController)
        );
        assert!(resolve("", &env_of(&[]), &none, false).is_ok());
        assert_eq!(
            resolve("rivet.controller=ftp://x", &env_of(&[]), &none, false),
            Err(ConfigError::BadController("ftp://x".into()))
        );
    }
}
