//! The stock Ironic clients from the repo's `.venv` (installed by `scripts/setup.sh`):
//! python-ironicclient's `baremetal` CLI and openstacksdk's baremetal proxy, pointed at a
//! test rivetd with no auth. Tests use them to prove that what Rivet serves is what the
//! clients users already have expect, not just what our own HTTP calls expect.

use crate::{prerequisite, Rivetd};
use anyhow::{ensure, Context, Result};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;

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

/// What one `baremetal` command did.
pub struct CliRun {
    /// Its exit code.
    pub code: i64,
    /// What it printed on stdout.
    pub stdout: String,
    /// What it printed on stderr.
    pub stderr: String,
}

/// A `baremetal` CLI process that runs one command per request (`tests/py/baremetal_server.py`):
/// the CLI's Python imports are paid once per test thread, not once per command.
struct CliServer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl CliServer {
    fn start() -> Result<CliServer> {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/py/baremetal_server.py");
        let mut child = Command::new(venv().join("bin/python"))
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {script}"))?;
        let stdin = child.stdin.take().context("piped stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("piped stdout")?);
        Ok(CliServer {
            child,
            stdin,
            stdout,
        })
    }

    fn run(&mut self, argv: &[String]) -> Result<CliRun> {
        let mut line = serde_json::to_string(argv)?;
        line.push('\n');
        self.stdin.write_all(line.as_bytes())?;
        self.stdin.flush()?;
        let mut reply = String::new();
        let n = self.stdout.read_line(&mut reply)?;
        ensure!(
            n > 0,
            "the baremetal CLI process ended without answering {argv:?}"
        );
        let v: Value = serde_json::from_str(&reply).with_context(|| format!("reply {reply}"))?;
        let text = |k: &str| v[k].as_str().unwrap_or_default().to_string();
        Ok(CliRun {
            code: v["rc"].as_i64().context("reply without rc")?,
            stdout: text("stdout"),
            stderr: text("stderr"),
        })
    }
}

impl Drop for CliServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Idle CLI processes; a test thread takes one (or starts one) for each command.
static IDLE: Mutex<Vec<CliServer>> = Mutex::new(Vec::new());

/// Run `baremetal ARGS` against `d` (no auth): exit code and output, as the CLI would print
/// them when run on its own.
pub fn baremetal_run(d: &Rivetd, args: &[&str]) -> Result<CliRun> {
    let mut argv: Vec<String> = ["--os-endpoint", &d.url, "--os-auth-type", "none"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    argv.extend(args.iter().map(|s| s.to_string()));
    let idle = IDLE.lock().unwrap_or_else(|p| p.into_inner()).pop();
    let mut server = match idle {
        Some(s) => s,
        None => CliServer::start()?,
    };
    // A server whose command failed to come back is dropped (killed), not reused.
    let run = server.run(&argv)?;
    IDLE.lock().unwrap_or_else(|p| p.into_inner()).push(server);
    Ok(run)
}

/// Run `baremetal ARGS` (add `--os-baremetal-api-version X` to pin one); its stdout.
pub fn baremetal(d: &Rivetd, args: &[&str]) -> Result<String> {
    let out = baremetal_run(d, args)?;
    ensure!(
        out.code == 0,
        "baremetal {args:?} failed: exit code {}\nstdout: {}\nstderr: {}\nrivetd log:\n{}",
        out.code,
        out.stdout,
        out.stderr,
        d.log_text()
    );
    Ok(out.stdout)
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
    let out = baremetal_run(d, args)?;
    ensure!(
        out.code != 0,
        "baremetal {args:?} succeeded but should have failed: {}",
        out.stdout
    );
    Ok(out.stderr)
}

/// `baremetal node VERB NODE`, then `baremetal node show` until the node is in `state`
/// (a `* failed` state or 60 s fail). The CLI's own `--wait` polls every 10 s, which made
/// these round trips mostly waiting; `tests/ironicclient.rs` keeps covering `--wait`.
pub fn baremetal_verb(d: &Rivetd, verb: &str, node: &str, state: &str) -> Result<Value> {
    baremetal(d, &["node", verb, node])?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let n = baremetal_json(d, &["node", "show", node])?;
        let now = n["provision_state"].as_str().unwrap_or_default();
        if now == state {
            return Ok(n);
        }
        ensure!(
            !now.ends_with("failed") && std::time::Instant::now() < deadline,
            "after `baremetal node {verb} {node}` the node is {now}, not {state}: {n}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
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
