//! Harness for the cross-crate scenarios: start the real `rivetd` binary on a loopback port
//! and a SQLite file, talk to it over HTTP, kill it hard, and decide when a missing peer tool
//! skips a test (developer machines) or fails it (CI sets `RIVET_REQUIRE_PEERS=1`).

pub mod agentproc;
pub mod clients;
pub mod faultproxy;
pub mod fileserver;
pub mod imagelab;
pub mod ironic_peer;
pub mod peers;
pub mod qemu;
pub mod simagent;
pub mod webdriver;
pub mod workcheck;

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The workspace's target directory.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

/// Path of a workspace binary built by `cargo build --workspace --bins`.
pub fn bin(name: &str) -> PathBuf {
    target_dir().join("debug").join(name)
}

/// Held by a test for as long as it drives the host's libvirtd (the lab's guests, or a domain of
/// its own): the scenarios share one process, and two of them starting, using and stopping
/// libvirtd at once would pull it from under each other. A panicking holder poisons nothing.
pub fn libvirt_lock() -> std::sync::MutexGuard<'static, ()> {
    static LIBVIRT: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LIBVIRT.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether a test may run; prints why not. With `RIVET_REQUIRE_PEERS=1` a missing
/// prerequisite is a failure, so CI can never go green by skipping.
pub fn prerequisite(ok: bool, what: &str) -> bool {
    if ok {
        return true;
    }
    if std::env::var("RIVET_REQUIRE_PEERS").as_deref() == Ok("1") {
        panic!("missing prerequisite: {what} (RIVET_REQUIRE_PEERS=1; run scripts/setup.sh)");
    }
    eprintln!("skipping: {what} (run scripts/setup.sh to install it)");
    false
}

/// The message of an Ironic error body (`error_message` holds JSON with the `faultstring`);
/// the raw text when it is not that shape.
pub fn fault(v: &Value) -> String {
    let raw = v["error_message"].as_str().unwrap_or_default();
    serde_json::from_str::<Value>(raw)
        .ok()
        .and_then(|v| v["faultstring"].as_str().map(str::to_string))
        .unwrap_or_else(|| raw.to_string())
}

/// rivetd's settings for the deploy scenarios: quick long polls and scans, and automated
/// cleaning without the full erase (the metadata erase still runs).
pub const DEPLOY_TEST_CONFIG: &str =
    "[agent]\nlong_poll_s = 2\n[conductor]\ncheck_interval_s = 1\n\
     [cleaning]\npriority_overrides = {\"deploy.erase_devices\" = 0}\n";

/// [`DEPLOY_TEST_CONFIG`] with more settings: `agent` lines go into its `[agent]` table (a
/// TOML table cannot be opened twice), `tables` (whole tables: `[deploy]`, `[power_sync]`…)
/// after it.
pub fn deploy_test_config_with(agent: &str, tables: &str) -> String {
    let mut config = DEPLOY_TEST_CONFIG.replacen("[agent]\n", &format!("[agent]\n{agent}\n"), 1);
    config.push_str(tables);
    config.push('\n');
    config
}

/// Run a tool; its stdout, or an error with its stderr.
pub fn run_tool(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("{cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The sha256 of a file, by `sha256sum`.
pub fn sha256_file(path: &Path) -> Result<String> {
    let out = run_tool(Command::new("sha256sum").arg(path))?;
    Ok(out
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
}

/// A free loopback port.
/// Give the disk image at `path` a fresh GPT with one partition from sector 2048 to the end.
pub fn gpt_one_partition(path: &Path) -> Result<String> {
    run_tool(
        Command::new("sgdisk")
            .args(["-o", "-n", "1:2048:0"])
            .arg(path),
    )
}

/// `rivetd hash-secret` of `secret`: the hash a config's `[[auth.tokens]]` or
/// `[[auth.users]]` entry takes.
pub fn hash_secret(secret: &str) -> Result<String> {
    use std::io::Write;
    let mut hashing = Command::new(bin("rivetd"))
        .arg("hash-secret")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    hashing
        .stdin
        .take()
        .context("stdin of rivetd hash-secret")?
        .write_all(format!("{secret}\n").as_bytes())?;
    let out = hashing.wait_with_output()?;
    anyhow::ensure!(out.status.success(), "rivetd hash-secret failed");
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// A running rivetd child, killed on drop.
pub struct Rivetd {
    child: Option<Child>,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Port it listens on.
    pub port: u16,
    /// The SQLite file (or, on another database, the directory of its log).
    pub db: PathBuf,
    /// Where its log goes.
    pub log: PathBuf,
    http: reqwest::blocking::Client,
}

impl Rivetd {
    /// Start rivetd in `dir` (its database `rivet.db`) with `config` written to `rivetd.toml`.
    pub fn start_in(dir: &Path, config: &str) -> Result<Rivetd> {
        let cfg = dir.join("rivetd.toml");
        std::fs::write(&cfg, config)?;
        let cfg = cfg.display().to_string();
        Self::start(&dir.join("rivet.db"), 0, &["--config", &cfg])
    }

    /// Start rivetd in `dir` with `config` (which must hold `[auth]` credentials) and
    /// without `--no-auth`; [`Rivetd::call`] then goes unauthenticated.
    pub fn start_in_with_auth(dir: &Path, config: &str) -> Result<Rivetd> {
        let cfg = dir.join("rivetd.toml");
        std::fs::write(&cfg, config)?;
        let cfg = cfg.display().to_string();
        let port = free_port()?;
        let db = dir.join("rivet.db");
        let log = db.with_extension(format!("rivetd-{port}.log"));
        let url = format!("sqlite:{}", db.display());
        Self::spawn_as(
            &url,
            &db,
            log,
            "test-conductor",
            port,
            &["--config", &cfg],
            false,
        )
    }

    /// Start rivetd with `--no-auth` on `db`, on `port` (0 = pick one), and wait until it serves.
    pub fn start(db: &Path, port: u16, extra: &[&str]) -> Result<Rivetd> {
        let port = if port == 0 { free_port()? } else { port };
        let log = db.with_extension(format!("rivetd-{port}.log"));
        let url = format!("sqlite:{}", db.display());
        Self::spawn(&url, db, log, "test-conductor", port, extra)
    }

    /// Like [`Rivetd::start_in`] but with authentication on: `config` must name `[auth]`
    /// credentials, and [`Rivetd::call`] (which sends none) gets 401s; bring your own.
    pub fn start_authed_in(dir: &Path, config: &str) -> Result<Rivetd> {
        let cfg = dir.join("rivetd.toml");
        std::fs::write(&cfg, config)?;
        let cfg = cfg.display().to_string();
        let db = dir.join("rivet.db");
        let port = free_port()?;
        let log = db.with_extension(format!("rivetd-{port}.log"));
        let url = format!("sqlite:{}", db.display());
        Self::spawn_as(
            &url,
            &db,
            log,
            "test-conductor",
            port,
            &["--config", &cfg],
            false,
        )
    }

    /// Start rivetd with `--no-auth` on database `db_url` (PostgreSQL: several may share
    /// it) as controller `conductor`, logging to `dir/rivetd-{conductor}.log`.
    pub fn start_url(
        db_url: &str,
        dir: &Path,
        conductor: &str,
        port: u16,
        extra: &[&str],
    ) -> Result<Rivetd> {
        let port = if port == 0 { free_port()? } else { port };
        let log = dir.join(format!("rivetd-{conductor}.log"));
        Self::spawn(db_url, dir, log, conductor, port, extra)
    }

    fn spawn(
        db_url: &str,
        db: &Path,
        log: PathBuf,
        conductor: &str,
        port: u16,
        extra: &[&str],
    ) -> Result<Rivetd> {
        Self::spawn_as(db_url, db, log, conductor, port, extra, true)
    }

    fn spawn_as(
        db_url: &str,
        db: &Path,
        log: PathBuf,
        conductor: &str,
        port: u16,
        extra: &[&str],
        no_auth: bool,
    ) -> Result<Rivetd> {
        let exe = bin("rivetd");
        if !exe.exists() {
            bail!(
                "{} not built: run `cargo build --workspace --bins`",
                exe.display()
            );
        }
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let child = Command::new(&exe)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--db")
            .arg(db_url)
            .args(no_auth.then_some("--no-auth"))
            .arg("--conductor-id")
            .arg(conductor)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(logf)
            .spawn()
            .with_context(|| format!("spawning {}", exe.display()))?;
        let r = Rivetd {
            child: Some(child),
            url: format!("http://127.0.0.1:{port}"),
            port,
            db: db.to_path_buf(),
            log,
            http: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()?,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if r.http.get(format!("{}/v1", r.url)).send().is_ok() {
                return Ok(r);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("rivetd did not start; log:\n{}", r.log_text())
    }

    /// The child's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Peak resident memory of the child so far (VmHWM), in KiB.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, as a service manager stops it; waits up to `timeout` for the exit and
    /// returns its status (`None`: still running then, and killed).
    pub fn terminate(&mut self, timeout: Duration) -> Result<Option<std::process::ExitStatus>> {
        let Some(mut c) = self.child.take() else {
            bail!("rivetd is not running");
        };
        let ok = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status()?
            .success();
        if !ok {
            bail!("kill -TERM {} failed", c.id());
        }
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = c.try_wait()? {
                return Ok(Some(status));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
        Ok(None)
    }

    /// kill -9, as a crash would.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Send a request at the newest API version and decode the JSON answer.
    pub fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<(u16, Value)> {
        self.call_at(Some("latest"), method, path, body)
    }

    /// Send a request at API `version` (`None`: no version header, which Ironic reads as
    /// 1.1) and decode the JSON answer (`Null` when the body is not JSON).
    pub fn call_at(
        &self,
        version: Option<&str>,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value)> {
        let m = reqwest::Method::from_bytes(method.as_bytes())?;
        let mut req = self.http.request(m, format!("{}{path}", self.url));
        if let Some(v) = version {
            req = req.header("X-OpenStack-Ironic-API-Version", v);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().with_context(|| format!("{method} {path}"))?;
        let status = resp.status().as_u16();
        let text = resp.text()?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    /// Create a node from `body` and give it one port `mac`; returns its UUID.
    pub fn create_node_with_port(&self, body: Value, mac: &str) -> Result<String> {
        let (s, v) = self.call("POST", "/v1/nodes", Some(body))?;
        if s != 201 {
            bail!("POST /v1/nodes: {s} {v}");
        }
        let uuid = v["uuid"]
            .as_str()
            .context("created node has no uuid")?
            .to_string();
        let (s, v) = self.call(
            "POST",
            "/v1/ports",
            Some(serde_json::json!({"node_uuid": uuid, "address": mac})),
        )?;
        if s != 201 {
            bail!("POST /v1/ports for {mac}: {s} {v}");
        }
        Ok(uuid)
    }

    /// A node document.
    pub fn node(&self, ident: &str) -> Result<Value> {
        let (s, v) = self.call("GET", &format!("/v1/nodes/{ident}"), None)?;
        if s != 200 {
            bail!("GET node {ident}: {s} {v}");
        }
        Ok(v)
    }

    /// Wait until `pred` holds for the node, or fail with its last document.
    pub fn wait_node(
        &self,
        ident: &str,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.node(ident)?;
            if pred(&v) {
                return Ok(v);
            }
            if Instant::now() > deadline {
                bail!("node {ident} did not reach the expected state in {timeout:?}: {v}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Rivetd {
    fn drop(&mut self) {
        self.kill9();
    }
}
