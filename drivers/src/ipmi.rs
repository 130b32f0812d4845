//! The `ipmi` driver: power and boot device through `ipmitool -I lanplus` (IPMI v2.0).
//!
//! The password never appears on a command line (where `ps` shows it): ipmitool reads it
//! from the `IPMI_PASSWORD` environment variable (`-E`). Every call passes `-C 3` (cipher
//! suite 3; without it ipmitool probes for ~10 s), is bounded by `ipmi_timeout_s` (the child
//! is killed after it), and its stderr is turned into an error that says what went wrong.
//! Tested against OpenIPMI's `ipmi_sim`.

use super::{Bmc, BootDevice, DriverError, DriversConfig};
use async_trait::async_trait;
use rivet_protocol::states::PowerState;
use serde_json::{Map, Value};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The IPMI driver (a cheap value; each call runs one ipmitool).
#[derive(Debug, Clone, Default)]
pub struct IpmiBmc {
    cfg: DriversConfig,
}

/// What the driver needs from `driver_info`.
#[derive(Clone)]
pub(crate) struct IpmiInfo {
    pub(crate) address: String,
    pub(crate) port: u16,
    pub(crate) username: Option<String>,
    pub(crate) password: String,
    uefi: bool,
}

/// The `driver_info` keys this driver reads (`GET /v1/drivers/ipmi/properties`), worded as
/// Ironic's ipmitool driver words them where the meaning is the same.
pub const PROPERTIES: &[(&str, &str)] = &[
    ("ipmi_address", "IP address or hostname of the node. Required."),
    ("ipmi_username", "username; default is NULL user. Optional."),
    ("ipmi_password", "password. Optional."),
    ("ipmi_port", "remote IPMI RMCP port; default is 623. Optional."),
    (
        "boot_mode",
        "boot mode the boot device is set for: \"uefi\" (ipmitool's efiboot option) or \"bios\"; default is bios. Optional.",
    ),
];

fn bad(field: &str, reason: impl Into<String>) -> DriverError {
    DriverError::BadDriverInfo {
        field: field.to_string(),
        reason: reason.into(),
    }
}

/// A value ipmitool takes as an option argument: no leading `-` (it would read as an option),
/// no whitespace or control characters.
fn plain_arg(field: &str, v: &Value) -> Result<Option<String>, DriverError> {
    let s = match v {
        Value::Null => return Ok(None),
        Value::String(s) if s.trim().is_empty() => return Ok(None),
        Value::String(s) => s.trim().to_string(),
        _ => return Err(bad(field, "must be a string")),
    };
    if s.starts_with('-') || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad(field, "must not start with '-' or contain spaces"));
    }
    Ok(Some(s))
}

fn parse_port(v: Option<&Value>) -> Result<u16, DriverError> {
    const F: &str = "ipmi_port";
    let n = match v {
        None | Some(Value::Null) => return Ok(623),
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(s)) => s.trim().parse::<u64>().ok(),
        Some(_) => None,
    };
    match n {
        Some(p @ 1..=65535) => Ok(p as u16),
        _ => Err(bad(F, "must be a port number between 1 and 65535")),
    }
}

pub(crate) fn parse(info: &Map<String, Value>) -> Result<IpmiInfo, DriverError> {
    let null = Value::Null;
    let address = plain_arg("ipmi_address", info.get("ipmi_address").unwrap_or(&null))?
        .ok_or_else(|| bad("ipmi_address", "is required (the BMC's host name or IP)"))?;
    let username = plain_arg("ipmi_username", info.get("ipmi_username").unwrap_or(&null))?;
    let password = match info.get("ipmi_password") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(bad("ipmi_password", "must be a string")),
    };
    let uefi = match info.get("boot_mode").and_then(Value::as_str) {
        None => false,
        Some(m) if m.eq_ignore_ascii_case("uefi") => true,
        Some(m) if m.eq_ignore_ascii_case("bios") || m.eq_ignore_ascii_case("legacy") => false,
        Some(other) => {
            return Err(bad(
                "boot_mode",
                format!("{other:?} is not one of uefi, bios"),
            ))
        }
    };
    Ok(IpmiInfo {
        address,
        port: parse_port(info.get("ipmi_port"))?,
        username,
        password,
        uefi,
    })
}

impl IpmiBmc {
    /// A driver with these timeouts.
    pub fn new(cfg: DriversConfig) -> IpmiBmc {
        IpmiBmc { cfg }
    }

    /// The fixed part of every command line (no password: it goes through the environment).
    fn base_args(&self, info: &IpmiInfo) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "-I".into(),
            "lanplus".into(),
            "-H".into(),
            info.address.clone(),
            "-p".into(),
            info.port.to_string(),
            "-C".into(),
            "3".into(),
            "-N".into(),
            self.cfg.ipmi_retry_timeout_s.max(1).to_string(),
            "-R".into(),
            self.cfg.ipmi_retries.to_string(),
            // Verbose: stderr then tells a wrong password from an unreachable BMC.
            "-v".into(),
        ];
        if let Some(u) = &info.username {
            args.push("-U".into());
            args.push(u.clone());
        }
        args.push("-E".into());
        args
    }

    /// Run one ipmitool command; its stdout on success.
    async fn ipmitool(&self, info: &IpmiInfo, cmd: &[&str]) -> Result<String, DriverError> {
        let limit = Duration::from_secs(self.cfg.ipmi_timeout_s.max(1));
        let child = tokio::process::Command::new(&self.cfg.ipmitool)
            .args(self.base_args(info))
            .args(cmd)
            .env("IPMI_PASSWORD", &info.password)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                DriverError::Bmc(format!(
                    "cannot run {}: {e}; install ipmitool (Debian package ipmitool)",
                    self.cfg.ipmitool
                ))
            })?;
        // On timeout the future (and the child with it) is dropped: kill_on_drop kills it.
        let out = tokio::time::timeout(limit, child.wait_with_output())
            .await
            .map_err(|_| {
                DriverError::Bmc(format!(
                    "ipmitool {} against {}:{} did not finish in {} s (killed); is the BMC reachable?",
                    cmd.join(" "),
                    info.address,
                    info.port,
                    limit.as_secs()
                ))
            })?
            .map_err(|e| DriverError::Bmc(format!("ipmitool failed to run: {e}")))?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        Err(ipmi_error(info, cmd, &stderr))
    }

    async fn read_power(&self, info: &IpmiInfo) -> Result<PowerState, DriverError> {
        let out = self.ipmitool(info, &["chassis", "power", "status"]).await?;
        parse_power(&out).ok_or_else(|| {
            DriverError::Bmc(format!(
                "unexpected answer to `chassis power status` from {}:{}: {:?}",
                info.address,
                info.port,
                out.trim()
            ))
        })
    }

    async fn wait_power(&self, info: &IpmiInfo, want: PowerState) -> Result<(), DriverError> {
        let limit = Duration::from_secs(self.cfg.power_wait_s.max(1));
        let deadline = Instant::now() + limit;
        loop {
            let now = self.read_power(info).await?;
            if now == want {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(DriverError::Bmc(format!(
                    "IPMI BMC {}:{} still reports \"{now}\" after {} s; expected \"{want}\"",
                    info.address,
                    info.port,
                    limit.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(self.cfg.poll_interval_ms.max(10))).await;
        }
    }

    async fn power(&self, info: &IpmiInfo, target: PowerState) -> Result<(), DriverError> {
        use PowerState::*;
        let current = self.read_power(info).await?;
        let (cmd, want) = match (target, current) {
            (On, On) | (Off, Off) | (SoftOff, Off) => return Ok(()),
            (On, _) | (Rebooting, Off) | (SoftRebooting, Off) => ("on", On),
            (Off, _) => ("off", Off),
            (SoftOff, _) => ("soft", Off),
            (Rebooting, _) => ("reset", On),
            (SoftRebooting, _) => {
                // ACPI shutdown, wait for it, power on.
                self.ipmitool(info, &["chassis", "power", "soft"]).await?;
                self.wait_power(info, Off).await?;
                ("on", On)
            }
            (Error, _) => {
                return Err(DriverError::Bmc(
                    "cannot set power state \"error\"".to_string(),
                ))
            }
        };
        self.ipmitool(info, &["chassis", "power", cmd]).await?;
        self.wait_power(info, want).await
    }
}

/// `Chassis Power is on|off`.
fn parse_power(out: &str) -> Option<PowerState> {
    let l = out.to_ascii_lowercase();
    if l.contains("chassis power is on") {
        Some(PowerState::On)
    } else if l.contains("chassis power is off") {
        Some(PowerState::Off)
    } else {
        None
    }
}

/// ipmitool's stderr, read for what an operator needs to know.
pub(crate) fn ipmi_error(info: &IpmiInfo, cmd: &[&str], stderr: &str) -> DriverError {
    let at = format!("{}:{}", info.address, info.port);
    let user = info.username.as_deref().unwrap_or("");
    let msg = if stderr.contains("RAKP 2 HMAC is invalid") {
        format!("IPMI BMC {at} rejected the password of user {user:?} (RAKP 2 HMAC is invalid); check ipmi_password")
    } else if stderr.contains("unauthorized name") {
        format!("IPMI BMC {at} does not know user {user:?} (RAKP 2: unauthorized name); check ipmi_username")
    } else if stderr.contains("Get Auth Capabilities error")
        || stderr.contains("Get Channel Authentication Capabilities")
    {
        format!("no answer from the IPMI BMC at {at} (UDP): check ipmi_address, ipmi_port and that IPMI over LAN is enabled")
    } else if stderr.contains("Insufficient privilege") {
        format!(
            "IPMI user {user:?} on {at} lacks the privilege for `{}`",
            cmd.join(" ")
        )
    } else {
        let lines: Vec<&str> = stderr
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("Loading IANA"))
            .collect();
        format!(
            "ipmitool {} against {at} failed: {}",
            cmd.join(" "),
            if lines.is_empty() {
                "no message".to_string()
            } else {
                lines.join("; ")
            }
        )
    };
    DriverError::Bmc(super::redact(&msg, Some(&info.password)))
}

#[async_trait]
impl Bmc for IpmiBmc {
    fn validate(&self, driver_info: &Map<String, Value>) -> Result<(), DriverError> {
        parse(driver_info).map(|_| ())
    }

    async fn get_power(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
    ) -> Result<PowerState, DriverError> {
        let info = parse(driver_info)?;
        tracing::debug!(node = %node, "ipmi: reading power state");
        self.read_power(&info).await
    }

    async fn set_power(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
        target: PowerState,
    ) -> Result<(), DriverError> {
        let info = parse(driver_info)?;
        tracing::info!(node = %node, target = %target, "ipmi: setting power");
        self.power(&info, target).await
    }

    async fn set_boot_device(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
        device: BootDevice,
        mode: Option<super::BootMode>,
    ) -> Result<(), DriverError> {
        self.bootdev(node, driver_info, device, false, mode).await
    }

    async fn set_boot_device_persistent(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
        device: BootDevice,
        mode: Option<super::BootMode>,
    ) -> Result<(), DriverError> {
        self.bootdev(node, driver_info, device, true, mode).await
    }

    fn supported_boot_devices(&self) -> &'static [BootDevice] {
        SUPPORTED_BOOT_DEVICES
    }

    /// `chassis power diag`, as Ironic's ipmitool management interface injects an NMI.
    async fn inject_nmi(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
    ) -> Result<(), DriverError> {
        let info = parse(driver_info)?;
        tracing::info!(node = %node, "ipmi: injecting an NMI");
        self.ipmitool(&info, &["chassis", "power", "diag"]).await?;
        Ok(())
    }

    /// `chassis bootparam get 5`, read as Ironic's ipmitool driver reads it.
    async fn get_boot_device(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
    ) -> Result<super::BootDeviceState, DriverError> {
        let info = parse(driver_info)?;
        tracing::debug!(node = %node, "ipmi: reading the boot device");
        let out = self
            .ipmitool(&info, &["chassis", "bootparam", "get", "5"])
            .await?;
        Ok(parse_bootparam(&out))
    }
}

/// Ironic's ipmitool boot devices (its `BOOT_DEVICE_HEXA_MAP`), in its order.
const SUPPORTED_BOOT_DEVICES: &[BootDevice] = &[
    BootDevice::Pxe,
    BootDevice::Disk,
    BootDevice::Cdrom,
    BootDevice::Bios,
    BootDevice::Safe,
];

/// The `Boot Device Selector` and whether the options apply to all future boots, from
/// `ipmitool chassis bootparam get 5`.
fn parse_bootparam(out: &str) -> super::BootDeviceState {
    let selector = out.lines().find_map(|l| {
        l.split_once("Boot Device Selector :")
            .map(|(_, s)| s.trim())
    });
    let boot_device = selector.and_then(|s| {
        if s.contains("PXE") {
            Some(BootDevice::Pxe)
        } else if s.contains("Hard-Drive") {
            Some(if s.contains("Safe-Mode") {
                BootDevice::Safe
            } else {
                BootDevice::Disk
            })
        } else if s.contains("BIOS") {
            Some(BootDevice::Bios)
        } else if s.contains("CD/DVD") {
            Some(BootDevice::Cdrom)
        } else {
            None
        }
    });
    super::BootDeviceState {
        boot_device,
        persistent: Some(out.contains("Options apply to all future boots")),
    }
}

impl IpmiBmc {
    /// `chassis bootdev DEV [options=persistent,efiboot]`.
    async fn bootdev(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
        device: BootDevice,
        persistent: bool,
        mode: Option<super::BootMode>,
    ) -> Result<(), DriverError> {
        let info = parse(driver_info)?;
        // The mode passed in, else the older `driver_info.boot_mode`.
        let uefi = mode.map_or(info.uefi, |m| m == super::BootMode::Uefi);
        let dev = match device {
            BootDevice::Pxe => "pxe",
            BootDevice::Disk => "disk",
            BootDevice::Cdrom => "cdrom",
            BootDevice::Bios => "bios",
            BootDevice::Safe => "safe",
            BootDevice::UefiHttp => {
                return Err(DriverError::Unsupported {
                    driver: "ipmi".into(),
                    operation: "boot device uefihttp".into(),
                })
            }
        };
        tracing::info!(node = %node, device = dev, persistent, "ipmi: boot device");
        let mut options = Vec::new();
        if persistent {
            options.push("persistent");
        }
        if uefi {
            options.push("efiboot");
        }
        let options = format!("options={}", options.join(","));
        let mut cmd = vec!["chassis", "bootdev", dev];
        if options != "options=" {
            cmd.push(&options);
        }
        self.ipmitool(&info, &cmd).await.map(|_| ())
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
    fn driver_info_is_checked() {
        let ok = parse(&info(
            json!({"ipmi_address": "10.0.0.9", "ipmi_port": "6230",
            "ipmi_username": "admin", "ipmi_password": "pw"}),
        ))
        .expect("valid");
        assert_eq!(ok.port, 6230);
        assert_eq!(
            parse(&info(json!({"ipmi_address": "h"})))
                .expect("valid")
                .port,
            623
        );
        for (v, field) in [
            (json!({}), "ipmi_address"),
            (json!({"ipmi_address": "-P secret"}), "ipmi_address"),
            (json!({"ipmi_address": "h", "ipmi_port": 0}), "ipmi_port"),
            (json!({"ipmi_address": "h", "ipmi_port": "x"}), "ipmi_port"),
            (
                json!({"ipmi_address": "h", "ipmi_username": "-E"}),
                "ipmi_username",
            ),
            (
                json!({"ipmi_address": "h", "ipmi_password": 5}),
                "ipmi_password",
            ),
        ] {
            match parse(&info(v.clone())) {
                Err(DriverError::BadDriverInfo { field: f, .. }) => assert_eq!(f, field, "{v}"),
                other => panic!("{v}: {:?}", other.map(|_| ())),
            }
        }
    }

    #[test]
    fn password_is_never_on_the_command_line() {
        let i = parse(&info(json!({"ipmi_address": "h", "ipmi_username": "u",
            "ipmi_password": "hunter2"})))
        .expect("valid");
        let args = IpmiBmc::default().base_args(&i);
        assert!(!args.iter().any(|a| a.contains("hunter2")));
        assert!(!args.iter().any(|a| a == "-P"));
        assert!(args.windows(2).any(|w| w[0] == "-C" && w[1] == "3"));
        assert!(args.iter().any(|a| a == "-E"));
    }

    #[test]
    fn stderr_is_explained() {
        let i = parse(&info(json!({"ipmi_address": "h", "ipmi_username": "u",
            "ipmi_password": "hunter2"})))
        .expect("valid");
        let e = ipmi_error(
            &i,
            &["chassis", "power", "status"],
            "> RAKP 2 HMAC is invalid\nError: Unable to establish IPMI v2 / RMCP+ session",
        )
        .to_string();
        assert!(e.contains("check ipmi_password"), "{e}");
        let e = ipmi_error(
            &i,
            &["x"],
            "Get Auth Capabilities error\nError: Unable to establish IPMI v2 / RMCP+ session",
        )
        .to_string();
        assert!(e.contains("no answer"), "{e}");
        let e = ipmi_error(
            &i,
            &["x"],
            "Loading IANA PEN Registry...\nweird hunter2 thing",
        )
        .to_string();
        assert!(e.contains("weird") && !e.contains("hunter2"), "{e}");
    }

    #[test]
    fn boot_parameter_parses() {
        let out = "Boot parameter version: 1\nBoot parameter 5 is valid/unlocked\n\
            Boot parameter data: 0004000000\n Boot Flags :\n   - Boot Flag Invalid\n\
               - Options apply to only next boot\n   - BIOS PC Compatible (legacy) boot \n\
               - Boot Device Selector : Force PXE\n   - BIOS verbosity : System Default\n";
        let s = parse_bootparam(out);
        assert_eq!(
            (s.boot_device, s.persistent),
            (Some(BootDevice::Pxe), Some(false))
        );
        let s = parse_bootparam(
            "   - Options apply to all future boots\n   - Boot Device Selector : Force Boot from default Hard-Drive, request Safe-Mode\n",
        );
        assert_eq!(
            (s.boot_device, s.persistent),
            (Some(BootDevice::Safe), Some(true))
        );
        for (sel, want) in [
            ("Force Boot from default Hard-Drive", Some(BootDevice::Disk)),
            ("Force Boot from CD/DVD", Some(BootDevice::Cdrom)),
            ("Force Boot into BIOS Setup", Some(BootDevice::Bios)),
            ("No override", None),
        ] {
            let s = parse_bootparam(&format!(" - Boot Device Selector : {sel}\n"));
            assert_eq!(s.boot_device, want, "{sel}");
        }
    }

    #[test]
    fn power_status_parses() {
        assert_eq!(parse_power("Chassis Power is on\n"), Some(PowerState::On));
        assert_eq!(parse_power("Chassis Power is off"), Some(PowerState::Off));
        assert_eq!(parse_power("?"), None);
    }

    /// `PROPERTIES` is what `parse` reads: every listed key is checked (a bad value is refused
    /// naming it), and exactly the keys described as "Required." are required.
    #[test]
    fn properties_are_the_keys_parse_reads() {
        let full = json!({"ipmi_address": "h", "ipmi_username": "u", "ipmi_password": "p",
            "ipmi_port": 6230, "boot_mode": "uefi"});
        let i = parse(&info(full.clone())).expect("valid");
        assert!(i.uefi && i.port == 6230);
        let bad = json!({"ipmi_address": "-h", "ipmi_username": "-u", "ipmi_password": 1,
            "ipmi_port": "x", "boot_mode": "efi"});
        crate::check_properties(PROPERTIES, &full, &bad, parse, &["ipmi_address"]);
    }
}
