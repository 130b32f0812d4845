//! BMC address via `ipmitool lan print`, only when the tool and /dev/ipmi0 exist.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a BMC may take to answer before the inventory goes on without it.
const TIMEOUT: Duration = Duration::from_secs(10);

/// (IPv4 address, MAC) of the BMC's LAN channel, or `(None, None)`.
pub(super) fn probe() -> (Option<String>, Option<String>) {
    if !Path::new("/dev/ipmi0").exists() || !on_path("ipmitool") {
        return (None, None);
    }
    match run_with_timeout(Command::new("ipmitool").args(["lan", "print"]), TIMEOUT) {
        Some(out) => parse_lan_print(&out),
        None => (None, None),
    }
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
}

/// Stdout of a command, or `None` if it fails or outlives `timeout` (then it is killed).
fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> Option<String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(_)) | Err(_) => return None,
            Ok(None) if start.elapsed() > timeout => {
                tracing::warn!("ipmitool lan print timed out; BMC address left empty");
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let out = child.wait_with_output().ok()?;
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn parse_lan_print(text: &str) -> (Option<String>, Option<String>) {
    let field = |name: &str| {
        text.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim() == name)
            .map(|(_, v)| v.trim().to_ascii_lowercase())
            .filter(|v| !v.is_empty() && v != "0.0.0.0" && v != "00:00:00:00:00:00")
    };
    (field("IP Address"), field("MAC Address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lan_print() {
        let text = "Set in Progress         : Set Complete\n\
                    IP Address Source       : Static Address\n\
                    IP Address              : 10.0.0.5\n\
                    Subnet Mask             : 255.255.255.0\n\
                    MAC Address             : 3C:EC:EF:00:11:22\n";
        assert_eq!(
            parse_lan_print(text),
            (Some("10.0.0.5".into()), Some("3c:ec:ef:00:11:22".into()))
        );
        assert_eq!(parse_lan_print("IP Address : 0.0.0.0\n"), (None, None));
    }
}
