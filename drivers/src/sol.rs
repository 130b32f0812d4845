//! Serial-over-LAN for the `ipmitool-socat` console interface: what a node's `driver_info`
//! must hold (checked as Ironic's `IPMIConsole.validate` checks it), and the ipmitool
//! command lines that open (`sol activate`) and drop (`sol deactivate`) a node's session.
//!
//! Why ipmitool as a child process rather than a Rust SOL implementation: SOL rides on an
//! IPMI v2.0 RMCP+ session (RAKP key exchange, cipher suites, integrity and confidentiality
//! algorithms, per-vendor quirks in payload activation, retransmits and ACK/NACK of
//! character data). No maintained Rust crate implements it, ipmitool is what Ironic runs
//! (`IPMISocatConsole`), what the power and boot-device driver already runs
//! (`ipmi.rs`), and what operators already trust against their BMCs; a home-grown RMCP+
//! stack would be security-sensitive code tested against one simulator. The child is owned
//! by rivetd's console hub, which reads its stdout and feeds its stdin.
//!
//! The password never appears on a command line: ipmitool reads it from `IPMI_PASSWORD`
//! (`-E`), as in `ipmi.rs`.

use super::ipmi::{ipmi_error, parse, IpmiInfo};
use super::{DriverError, DriversConfig};
use serde_json::{Map, Value};
use std::process::Stdio;
use std::time::Duration;

/// The `driver_info` keys the console reads beside the ipmi driver's.
pub const PROPERTIES: &[(&str, &str)] = &[(
    "ipmi_terminal_port",
    "node's UDP port to connect to. Only required for console access.",
)];

/// A node's SOL endpoint, read from its `driver_info`.
#[derive(Clone)]
pub struct SolTarget {
    info: IpmiInfo,
    /// `driver_info.ipmi_terminal_port`: the console's TCP port on rivetd's host, when the
    /// node names one (else one is taken from `[console] port_range`).
    pub terminal_port: Option<u16>,
}

impl std::fmt::Debug for SolTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("SolTarget")
            .field("address", &self.info.address)
            .field("port", &self.info.port)
            .field("terminal_port", &self.terminal_port)
            .finish()
    }
}

fn invalid(msg: String) -> DriverError {
    DriverError::NodeSettings(msg)
}

impl SolTarget {
    /// Read and check `driver_info`, with Ironic's messages: a missing `ipmi_address` is
    /// "Missing the following IPMI credentials…", a protocol other than 2.0 is refused (SOL
    /// needs IPMI v2.0).
    pub fn from_driver_info(driver_info: &Map<String, Value>) -> Result<SolTarget, DriverError> {
        let present = |k: &str| match driver_info.get(k) {
            None | Some(Value::Null) => false,
            Some(Value::String(s)) => !s.trim().is_empty(),
            Some(_) => true,
        };
        if !present("ipmi_address") {
            return Err(invalid(
                "Missing the following IPMI credentials in node's driver_info: ['ipmi_address']."
                    .into(),
            ));
        }
        if let Some(v) = driver_info.get("ipmi_protocol_version") {
            let s = match v {
                Value::String(s) => s.trim().to_string(),
                other => other.to_string(),
            };
            if s != "2.0" && s != "2" {
                return Err(invalid(
                    "Serial over lan only works with IPMI protocol version 2.0. Check the \
                     'ipmi_protocol_version' parameter in node's driver_info"
                        .into(),
                ));
            }
        }
        let info = parse(driver_info)?;
        let terminal_port = match driver_info.get("ipmi_terminal_port") {
            None | Some(Value::Null) => None,
            Some(v) => {
                let n = match v {
                    Value::Number(n) => n.as_u64(),
                    Value::String(s) => s.trim().parse::<u64>().ok(),
                    _ => None,
                };
                match n {
                    Some(p @ 1..=65535) => Some(p as u16),
                    _ => {
                        return Err(DriverError::BadDriverInfo {
                            field: "ipmi_terminal_port".into(),
                            reason: "must be a port number between 1 and 65535".into(),
                        })
                    }
                }
            }
        };
        Ok(SolTarget {
            info,
            terminal_port,
        })
    }

    /// The BMC as `ADDRESS:PORT`, for messages.
    pub fn bmc(&self) -> String {
        format!("{}:{}", self.info.address, self.info.port)
    }

    /// The password, to take out of anything shown (`redact`).
    pub fn password(&self) -> &str {
        &self.info.password
    }

    /// `ipmitool -I lanplus -H ADDR -p PORT -C 3 [-U USER] -E sol SUBCOMMAND`, password in the
    /// environment. `-C 3`: without a cipher suite ipmitool probes for ~10 s (see ipmi.rs).
    fn command(&self, cfg: &DriversConfig, sub: &str) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&cfg.ipmitool);
        cmd.args(["-I", "lanplus", "-H", &self.info.address, "-p"])
            .arg(self.info.port.to_string())
            .args(["-C", "3"]);
        if let Some(u) = &self.info.username {
            cmd.args(["-U", u]);
        }
        cmd.args(["-E", "sol", sub])
            .env("IPMI_PASSWORD", &self.info.password)
            .kill_on_drop(true);
        cmd
    }

    /// The session's command: stdin, stdout and stderr piped (the hub owns all three; a
    /// closed stdin ends ipmitool's session, so the hub keeps it open).
    pub fn activate(&self, cfg: &DriversConfig) -> tokio::process::Command {
        let mut cmd = self.command(cfg, "activate");
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// `sol deactivate`, bounded by `ipmi_timeout_s`: drops a session left open (by a rivetd
    /// that died, or anyone else). Exit 0 and 1 both count as done (1: none was active), as
    /// Ironic's `check_exit_code=[0, 1]`.
    pub async fn deactivate(&self, cfg: &DriversConfig) -> Result<(), DriverError> {
        let limit = Duration::from_secs(cfg.ipmi_timeout_s.max(1));
        let mut cmd = self.command(cfg, "deactivate");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd.spawn().map_err(|e| {
            DriverError::Bmc(format!(
                "cannot run {}: {e}; install ipmitool (Debian package ipmitool)",
                cfg.ipmitool
            ))
        })?;
        let out = tokio::time::timeout(limit, child.wait_with_output())
            .await
            .map_err(|_| {
                DriverError::Bmc(format!(
                    "ipmitool sol deactivate against {} did not finish in {} s (killed)",
                    self.bmc(),
                    limit.as_secs()
                ))
            })?
            .map_err(|e| DriverError::Bmc(format!("ipmitool failed to run: {e}")))?;
        match out.status.code() {
            Some(0 | 1) => Ok(()),
            _ => Err(self.explain("deactivate", &String::from_utf8_lossy(&out.stderr))),
        }
    }

    /// What a failed `sol SUBCOMMAND` said on stderr, worded for `last_error`, password
    /// redacted. A BMC already serving SOL to someone else says so.
    pub fn explain(&self, sub: &str, stderr: &str) -> DriverError {
        if stderr.contains("already active") {
            return DriverError::Bmc(format!(
                "the BMC at {} refused Serial-over-LAN: a SOL session is already active on another \
                 session (someone else holds the console; `ipmitool … sol deactivate` ends it)",
                self.bmc()
            ));
        }
        ipmi_error(&self.info, &["sol", sub], stderr)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn info(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn missing_address_is_named_as_ironic_names_it() {
        let e = SolTarget::from_driver_info(&info(json!({"ipmi_username": "u"})))
            .unwrap_err()
            .to_string();
        assert!(e.contains("['ipmi_address']"), "{e}");
        let e = SolTarget::from_driver_info(&info(
            json!({"ipmi_address": "h", "ipmi_protocol_version": "1.5"}),
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("version 2.0"), "{e}");
        let e = SolTarget::from_driver_info(&info(
            json!({"ipmi_address": "h", "ipmi_terminal_port": "x"}),
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("ipmi_terminal_port"), "{e}");
    }

    #[test]
    fn password_goes_through_the_environment_only() {
        let t = SolTarget::from_driver_info(&info(json!({
            "ipmi_address": "10.0.0.9", "ipmi_port": 6230, "ipmi_username": "admin",
            "ipmi_password": "s3cret", "ipmi_terminal_port": 12000
        })))
        .unwrap();
        assert_eq!(t.terminal_port, Some(12000));
        let cmd = t.activate(&DriversConfig::default());
        let std = cmd.as_std();
        let args: Vec<String> = std
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args.join(" "),
            "-I lanplus -H 10.0.0.9 -p 6230 -C 3 -U admin -E sol activate"
        );
        assert!(std
            .get_envs()
            .any(|(k, v)| k == "IPMI_PASSWORD" && v.is_some_and(|v| v == "s3cret")));
        assert!(!format!("{t:?}").contains("s3cret"));
        let e = t
            .explain(
                "activate",
                "Info: SOL payload already active on another session",
            )
            .to_string();
        assert!(e.contains("already active"), "{e}");
    }
}
