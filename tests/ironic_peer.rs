//! A real OpenStack Ironic (39.0.0, from the venv `.venv-ironic` that `scripts/setup-ironic.sh`
//! makes) as a peer for differential tests: one process (`ironic`, ironic.command.singleprocess:
//! the API and the conductor together), no auth, no message bus (`rpc_transport = none`), no
//! Keystone, a fresh SQLite database, `fake-hardware` with the `fake` and `no-*` interfaces, on
//! a free loopback port. Killed (its whole process group: the launcher forks a worker) on drop.

use crate::prerequisite;
use anyhow::{bail, Context, Result};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The pinned Ironic release (`scripts/setup-ironic.sh`).
pub const IRONIC_VERSION: &str = "39.0.0";

/// The venv holding Ironic (`RIVET_IRONIC_VENV` overrides it).
pub fn venv() -> PathBuf {
    std::env::var_os("RIVET_IRONIC_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv-ironic"))
}

/// Whether Ironic is installed (skips, or fails under `RIVET_REQUIRE_PEERS=1`).
pub fn available() -> bool {
    prerequisite(
        venv().join("bin/ironic").is_file() && venv().join("bin/ironic-dbsync").is_file(),
        "OpenStack Ironic in .venv-ironic (scripts/setup-ironic.sh)",
    )
}

/// `ironic.conf` for one process on `127.0.0.1:port` with its database and locks in `dir`,
/// conductor hostname `host`; `extra` is appended (more sections or options).
pub fn config(dir: &Path, port: u16, host: &str, extra: &str) -> String {
    format!(
        "[DEFAULT]\n\
         auth_strategy = noauth\n\
         rpc_transport = none\n\
         host = {host}\n\
         use_stderr = true\n\
         minimum_memory_warning_only = true\n\
         enabled_hardware_types = fake-hardware\n\
         enabled_bios_interfaces = fake,no-bios\n\
         enabled_boot_interfaces = fake\n\
         enabled_console_interfaces = fake,no-console\n\
         enabled_deploy_interfaces = fake\n\
         enabled_firmware_interfaces = fake,no-firmware\n\
         enabled_inspect_interfaces = fake,no-inspect\n\
         enabled_management_interfaces = fake\n\
         enabled_network_interfaces = noop\n\
         enabled_power_interfaces = fake\n\
         enabled_raid_interfaces = fake,no-raid,agent\n\
         enabled_rescue_interfaces = fake,no-rescue\n\
         enabled_storage_interfaces = noop\n\
         enabled_vendor_interfaces = fake,no-vendor\n\
         [api]\n\
         host_ip = 127.0.0.1\n\
         port = {port}\n\
         [database]\n\
         connection = sqlite:///{db}\n\
         [dhcp]\n\
         dhcp_provider = none\n\
         [conductor]\n\
         automated_clean = false\n\
         [deploy]\n\
         fast_track = false\n\
         [oslo_concurrency]\n\
         lock_path = {locks}\n\
         {extra}\n",
        db = dir.join("ironic.db").display(),
        locks = dir.join("locks").display(),
    )
}

/// A running Ironic.
pub struct Ironic {
    child: Option<Child>,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Its port.
    pub port: u16,
    /// Its log (stdout and stderr of dbsync and the service).
    pub log: PathBuf,
    dir: tempfile::TempDir,
}

impl Ironic {
    /// Start Ironic with conductor hostname `ironic-peer`.
    pub fn start() -> Result<Ironic> {
        Self::start_with("ironic-peer", "")
    }

    /// Start Ironic with conductor hostname `host` and `extra` appended to its config; create
    /// the schema, wait until `/v1` answers (and the conductor has registered, so node
    /// creation works at once). `{url}` in `extra` becomes Ironic's own URL
    /// (`http://127.0.0.1:PORT`, e.g. for `[service_catalog] endpoint_override`); a section
    /// given again (`[DEFAULT]`…) overrides the base's options, the last value wins.
    pub fn start_with(host: &str, extra: &str) -> Result<Ironic> {
        let dir = tempfile::tempdir()?;
        let port = crate::free_port()?;
        let conf = dir.path().join("ironic.conf");
        let extra = extra.replace("{url}", &format!("http://127.0.0.1:{port}"));
        std::fs::write(&conf, config(dir.path(), port, host, &extra))?;
        let log = dir.path().join("ironic.log");
        let logf = std::fs::File::create(&log)?;
        let out = Command::new(venv().join("bin/ironic-dbsync"))
            .arg("--config-file")
            .arg(&conf)
            .arg("create_schema")
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf.try_clone()?)
            .status()
            .context("running ironic-dbsync")?;
        if !out.success() {
            bail!(
                "ironic-dbsync create_schema failed: {out}; log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        let child = Command::new(venv().join("bin/ironic"))
            .arg("--config-file")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf)
            // Its own process group: the launcher forks a worker, and drop kills both.
            .process_group(0)
            .spawn()
            .context("starting ironic")?;
        let mut ironic = Ironic {
            child: Some(child),
            url: format!("http://127.0.0.1:{port}"),
            port,
            log,
            dir,
        };
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            // The conductor is registered once it lists itself.
            let up = http
                .get(format!("{}/v1/conductors", ironic.url))
                .header("X-OpenStack-Ironic-API-Version", "latest")
                .send()
                .ok()
                .filter(|r| r.status().is_success())
                .and_then(|r| r.json::<serde_json::Value>().ok())
                .is_some_and(|v| {
                    v["conductors"]
                        .as_array()
                        .is_some_and(|c| c.iter().any(|c| c["hostname"] == host))
                });
            if up {
                return Ok(ironic);
            }
            if let Some(Ok(Some(status))) = ironic.child.as_mut().map(Child::try_wait) {
                bail!("ironic exited: {status}; log:\n{}", ironic.log_text());
            }
            if Instant::now() > deadline {
                bail!("ironic did not answer in 60 s; log:\n{}", ironic.log_text());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// One API call at the newest microversion (`X-OpenStack-Ironic-API-Version: latest`):
    /// status and JSON body (`null` when empty or not JSON).
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<(u16, serde_json::Value)> {
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()?;
        let mut req = http
            .request(
                reqwest::Method::from_bytes(method.as_bytes())?,
                format!("{}{path}", self.url),
            )
            .header("X-OpenStack-Ironic-API-Version", "latest");
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().with_context(|| format!("{method} {path}"))?;
        let status = resp.status().as_u16();
        let text = resp.text()?;
        Ok((
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
        ))
    }

    /// Its state directory (config, database, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The launcher's process id (also its process group's), while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for Ironic {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SIGKILL to the group this child leads (its forked worker is in it).
            if let Ok(pgid) = i32::try_from(c.id()) {
                // SAFETY: kill(2) with a negative pid signals that process group only.
                unsafe {
                    libc::kill(-pgid, libc::SIGKILL);
                }
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
