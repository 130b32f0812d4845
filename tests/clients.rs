//! The stock Ironic clients from the repo's `.venv` (installed by `scripts/setup.sh`):
//! python-ironicclient's `baremetal` CLI and openstacksdk's baremetal proxy, pointed at a
//! test rivetd with no auth. Tests use them to prove that what Rivet serves is what the
//! clients users already have expect, not just what our own HTTP calls expect.

use crate::{prerequisite, Rivetd};
use anyhow::{ensure, Context, Result};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

/// The repo's client venv (`RIVET_VENV` overrides it).
pub fn venv() -> PathBuf {
    std::env::var_os("RIVET_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv")))
}

/// Whether the stock clients are installed (skips, or fails under `RIVET_REQUIRE_PEERS=1`).
pub fn available() -> bool {
    prerequisite(
        venv().join("bin/baremetal").exists() && venv().join("bin/python").exists(),
        "python-ironicclient and openstacksdk in .venv",
    )
}

fn baremetal_cmd(d: &Rivetd, args: &[&str]) -> Command {
    let mut cmd = Command::new(venv().join("bin/baremetal"));
    cmd.args(["--os-endpoint", &d.url, "--os-auth-type", "none"])
        .args(args);
    cmd
}

/// Run `baremetal ARGS` (add `--os-baremetal-api-version X` to pin one); its stdout.
pub fn baremetal(d: &Rivetd, args: &[&str]) -> Result<String> {
    let out = baremetal_cmd(d, args).output()?;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    ensure!(
        out.status.success(),
        "baremetal {args:?} failed: {}\nstdout: {stdout}\nstderr: {}\nrivetd log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        d.log_text()
    );
    Ok(stdout)
}

/// Run `baremetal ARGS -f json` and decode its output.
pub fn baremetal_json(d: &Rivetd, args: &[&str]) -> Result<Value> {
    let mut all = args.to_vec();
    all.extend(["-f", "json"]);
    let out = baremetal(d, &all)?;
    serde_json::from_str(&out).with_context(|| format!("baremetal {args:?} printed {out}"))
}

/// Run `baremetal ARGS` expecting it to fail; its stderr (which names the HTTP error).
pub fn baremetal_failing(d: &Rivetd, args: &[&str]) -> Result<String> {
    let out = baremetal_cmd(d, args).output()?;
    ensure!(
        !out.status.success(),
        "baremetal {args:?} succeeded but should have failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    Ok(String::from_utf8_lossy(&out.stderr).to_string())
}

/// Run a Python snippet with `conn` bound to an openstacksdk connection to `d` (no auth,
/// microversion negotiated by the SDK) and `emit(value)` printing a JSON result; the last
/// emitted value is returned. An exception fails with the traceback and rivetd's log.
///
/// ```text
/// let v = sdk(&d, "n = conn.baremetal.create_node(driver='fake-hardware', name='a')\nemit(n.to_dict())")?;
/// ```
pub fn sdk(d: &Rivetd, snippet: &str) -> Result<Value> {
    let prelude = "import json, openstack\n\
        conn = openstack.connection.Connection(auth_type='none', \
        auth={'endpoint': RIVET_URL}, baremetal_endpoint_override=RIVET_URL)\n\
        def emit(v):\n    print('RIVET-SDK-RESULT ' + json.dumps(v, default=str))\n";
    let script = format!("RIVET_URL = {:?}\n{prelude}{snippet}\n", d.url);
    let out = Command::new(venv().join("bin/python"))
        .args(["-c", &script])
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    ensure!(
        out.status.success(),
        "openstacksdk snippet failed: {}\n{snippet}\nstdout: {stdout}\nstderr: {}\nrivetd log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        d.log_text()
    );
    let last = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("RIVET-SDK-RESULT "))
        .unwrap_or("null");
    serde_json::from_str(last).with_context(|| format!("sdk result {last}"))
}
