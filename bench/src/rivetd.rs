//! The rivetd under test: a release binary started as a child on a free loopback port with a
//! SQLite file in a temporary directory (or, for the multi-controller fleet, a PostgreSQL URL
//! shared by several), killed when the guard drops. Plus a small admin client for the `/v1`
//! calls the benches need.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// rivetd settings the benches vary; everything else is rivetd's default.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `[agent] long_poll_s`.
    pub long_poll_s: u64,
    /// `[agent] heartbeat_timeout_s`.
    pub heartbeat_timeout_s: u64,
    /// `[conductor] check_interval_s`.
    pub check_interval_s: u64,
    /// `[power_sync] interval_s` (0 = off).
    pub power_sync_interval_s: u64,
    /// `[secrets] key_file`: controllers sharing a PostgreSQL database share its key.
    pub secrets_key_file: Option<PathBuf>,
    /// `[store] sqlite_readers` (None: rivetd's default).
    pub sqlite_readers: Option<usize>,
    /// More TOML sections appended as they are (the console bench's `[drivers]`, `[console]`).
    pub extra: String,
}

impl Default for Settings {
    /// rivetd's own defaults (`rivetd --print-config`).
    fn default() -> Self {
        Settings {
            long_poll_s: 30,
            heartbeat_timeout_s: 300,
            check_interval_s: 10,
            power_sync_interval_s: 60,
            secrets_key_file: None,
            sqlite_readers: None,
            extra: String::new(),
        }
    }
}

impl Settings {
    fn toml(&self) -> String {
        // Every simulated agent speaks from 127.0.0.1, so the per-source agent limits (sized
        // for real sources) are off: the benchmark measures throughput, not the limiter.
        let mut t = format!(
            "[agent]\nlong_poll_s = {}\nheartbeat_timeout_s = {}\nlookup_per_minute = 0\nfailed_auth_per_minute = 0\n\n[conductor]\ncheck_interval_s = {}\n\n[power_sync]\ninterval_s = {}\n",
            self.long_poll_s, self.heartbeat_timeout_s, self.check_interval_s, self.power_sync_interval_s
        );
        if let Some(r) = self.sqlite_readers {
            t.push_str(&format!("\n[store]\nsqlite_readers = {r}\n"));
        }
        if let Some(k) = &self.secrets_key_file {
            // Debug quoting of a path is a valid TOML basic string for the paths tempdir makes.
            t.push_str(&format!(
                "\n[secrets]\nkey_file = {:?}\n",
                k.display().to_string()
            ));
        }
        t.push_str(&self.extra);
        t
    }
}

/// Where the release rivetd is: `--rivetd`, else next to this binary (target/release).
pub fn locate(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    let me = std::env::current_exe().context("locating rivet-bench")?;
    let exe = me.with_file_name("rivetd");
    if !exe.is_file() {
        bail!(
            "{} not found: build it with `cargo build --release -p rivet-controller` or pass --rivetd PATH",
            exe.display()
        );
    }
    Ok(exe)
}

/// A free TCP port on 127.0.0.1 (bound and released; rivetd binds it right after).
fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("binding a probe port")?;
    Ok(l.local_addr()?.port())
}

/// The running rivetd child; killed on drop.
pub struct Rivetd {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Its log (stderr).
    pub log: PathBuf,
}

impl Rivetd {
    /// Start rivetd on `db` (a SQLite file path) with `settings`; waits until `/v1` answers.
    pub async fn start(exe: &Path, dir: &Path, db: &Path, settings: &Settings) -> Result<Rivetd> {
        let url = format!("sqlite:{}", db.display());
        Self::start_on(exe, dir, &url, None, settings).await
    }

    /// Start rivetd on the database `db_url` (`sqlite:PATH` or `postgres://…`), as controller
    /// `conductor_id` when given (its log is then `rivetd-ID.log`); waits until `/v1` answers.
    pub async fn start_on(
        exe: &Path,
        dir: &Path,
        db_url: &str,
        conductor_id: Option<&str>,
        settings: &Settings,
    ) -> Result<Rivetd> {
        let port = free_port()?;
        let log = match conductor_id {
            Some(id) => dir.join(format!("rivetd-{id}.log")),
            None => dir.join("rivetd.log"),
        };
        Self::start_at(exe, dir, db_url, conductor_id, port, &log, settings).await
    }

    /// Start rivetd on `127.0.0.1:port` (the soak restarts it where its agents expect it),
    /// logging to `log`; waits until `/v1` answers.
    pub async fn start_at(
        exe: &Path,
        dir: &Path,
        db_url: &str,
        conductor_id: Option<&str>,
        port: u16,
        log: &Path,
        settings: &Settings,
    ) -> Result<Rivetd> {
        let config = dir.join("rivetd.toml");
        std::fs::write(&config, settings.toml())?;
        let log = log.to_path_buf();
        let mut cmd = Command::new(exe);
        if let Some(id) = conductor_id {
            cmd.arg("--conductor-id").arg(id);
        }
        let child = cmd
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--db")
            .arg(db_url)
            .arg("--no-auth")
            .arg("--config")
            .arg(&config)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let mut d = Rivetd {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
        };
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = http.get(format!("{}/v1", d.url)).send().await {
                if r.status().is_success() {
                    return Ok(d);
                }
            }
            if let Ok(Some(status)) = d.child.try_wait() {
                bail!("rivetd exited ({status}) at start; see {}", d.log.display());
            }
            if Instant::now() > deadline {
                bail!("rivetd did not answer within 30 s; see {}", d.log.display());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Current resident memory (KiB).
    pub fn rss_kib(&self) -> u64 {
        crate::procstat::vm_kib(self.pid(), "VmRSS").unwrap_or(0)
    }

    /// Peak resident memory so far (KiB).
    pub fn hwm_kib(&self) -> u64 {
        crate::procstat::vm_kib(self.pid(), "VmHWM").unwrap_or(0)
    }

    /// SIGTERM, then wait up to `grace` for it to exit; SIGKILL after that. Whether it
    /// exited by itself within `grace`.
    pub async fn terminate(&mut self, grace: Duration) -> bool {
        if let Ok(Some(_)) = self.child.try_wait() {
            return true;
        }
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) on our own unreaped child's pid; it cannot have been reused.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.stop();
        false
    }

    /// Stop it now (SIGKILL) and reap it.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Rivetd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An admin client (`--no-auth`, microversion "latest").
#[derive(Clone)]
pub struct Admin {
    http: reqwest::Client,
    url: String,
}

impl Admin {
    /// A client for `url`.
    pub fn new(url: &str) -> Result<Admin> {
        Ok(Admin {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .pool_max_idle_per_host(256)
                .build()?,
            url: url.to_string(),
        })
    }

    /// One call; the JSON answer, or an error naming the status and body.
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value> {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.url))
            .header("X-OpenStack-Ironic-API-Version", "latest");
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("{method} {path}"))?;
        let status = resp.status();
        let text = resp.text().await?;
        if !status.is_success() {
            bail!("{method} {path}: {status} {text}");
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// Create a fake-hardware node; its UUID.
    pub async fn create_node(&self, name: &str) -> Result<String> {
        let v = self
            .call(
                reqwest::Method::POST,
                "/v1/nodes",
                Some(
                    json!({"driver": "fake-hardware", "deploy_interface": "direct", "name": name}),
                ),
            )
            .await?;
        v["uuid"]
            .as_str()
            .map(str::to_string)
            .context("node create answered without a uuid")
    }

    /// `PUT /v1/nodes/{uuid}/states/provision` with `{"target": verb}`.
    pub async fn provision(&self, uuid: &str, verb: &str) -> Result<()> {
        let path = format!("/v1/nodes/{uuid}/states/provision");
        self.call(reqwest::Method::PUT, &path, Some(json!({ "target": verb })))
            .await
            .map(|_| ())
    }

    /// The node's provision state and last_error.
    pub async fn state(&self, uuid: &str) -> Result<(String, String)> {
        let v = self
            .call(
                reqwest::Method::GET,
                &format!("/v1/nodes/{uuid}?fields=provision_state,last_error"),
                None,
            )
            .await?;
        Ok((
            v["provision_state"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            v["last_error"].as_str().unwrap_or_default().to_string(),
        ))
    }

    /// Poll every `every` until the node is in `want` (error on a failed state or after
    /// `limit`).
    pub async fn wait_state(
        &self,
        uuid: &str,
        want: &str,
        every: Duration,
        limit: Duration,
    ) -> Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let (s, err) = self.state(uuid).await?;
            if s == want {
                return Ok(());
            }
            if s.ends_with("failed") || s == "error" {
                bail!("node {uuid} is in {s:?} while waiting for {want:?}: {err}");
            }
            if Instant::now() > deadline {
                bail!("node {uuid} still in {s:?} after {limit:?} waiting for {want:?}");
            }
            tokio::time::sleep(every).await;
        }
    }

    /// `GET /v1/conductors`: each controller's id and whether it is alive.
    pub async fn conductors(&self) -> Result<Vec<(String, bool)>> {
        let v = self
            .call(reqwest::Method::GET, "/v1/conductors", None)
            .await?;
        Ok(v["conductors"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|c| Some((c["hostname"].as_str()?.to_string(), c["alive"].as_bool()?)))
            .collect())
    }

    /// Every node's `conductor` (its owner on the hash ring) and `reservation` (the lease
    /// holder, "" for none), by a paged listing.
    pub async fn owners(&self) -> Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        let mut marker = String::new();
        for _ in 0..10_000 {
            let mut path = "/v1/nodes?fields=uuid,conductor,reservation&limit=1000".to_string();
            if !marker.is_empty() {
                path.push_str(&format!("&marker={marker}"));
            }
            let v = self.call(reqwest::Method::GET, &path, None).await?;
            let page = v["nodes"].as_array().cloned().unwrap_or_default();
            for n in &page {
                out.push((
                    n["conductor"].as_str().unwrap_or_default().to_string(),
                    n["reservation"].as_str().unwrap_or_default().to_string(),
                ));
            }
            match page.last().and_then(|p| p["uuid"].as_str()) {
                Some(u) if page.len() == 1000 => marker = u.to_string(),
                _ => return Ok(out),
            }
        }
        bail!("node listing did not end")
    }

    /// How many nodes are in `state` (paged listing of UUIDs).
    pub async fn count_in_state(&self, state: &str) -> Result<usize> {
        let mut n = 0;
        let mut marker = String::new();
        for _ in 0..10_000 {
            let mut path = format!(
                "/v1/nodes?provision_state={}&fields=uuid&limit=1000",
                state.replace(' ', "%20")
            );
            if !marker.is_empty() {
                path.push_str(&format!("&marker={marker}"));
            }
            let v = self.call(reqwest::Method::GET, &path, None).await?;
            let page = v["nodes"].as_array().cloned().unwrap_or_default();
            n += page.len();
            match page.last().and_then(|p| p["uuid"].as_str()) {
                Some(u) if page.len() == 1000 => marker = u.to_string(),
                _ => return Ok(n),
            }
        }
        bail!("listing of {state:?} nodes did not end")
    }
}

/// Run `f(0..n)` with at most `concurrency` in flight; results in index order. The first
/// error stops handing out new work and is returned.
pub async fn for_each_concurrent<T, F, Fut>(n: usize, concurrency: usize, f: F) -> Result<Vec<T>>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T>> + Send + 'static,
{
    let f = Arc::new(f);
    let next = Arc::new(AtomicUsize::new(0));
    let out: Arc<Mutex<Vec<Option<T>>>> = Arc::new(Mutex::new((0..n).map(|_| None).collect()));
    let failed: Arc<Mutex<Option<anyhow::Error>>> = Arc::new(Mutex::new(None));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..concurrency.clamp(1, n.max(1)) {
        let (f, next, out, failed) = (f.clone(), next.clone(), out.clone(), failed.clone());
        set.spawn(async move {
            loop {
                if failed.lock().map(|g| g.is_some()).unwrap_or(true) {
                    return;
                }
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= n {
                    return;
                }
                match f(i).await {
                    Ok(v) => {
                        if let Ok(mut o) = out.lock() {
                            o[i] = Some(v);
                        }
                    }
                    Err(e) => {
                        if let Ok(mut g) = failed.lock() {
                            g.get_or_insert(e);
                        }
                        return;
                    }
                }
            }
        });
    }
    while set.join_next().await.is_some() {}
    if let Some(e) = failed.lock().ok().and_then(|mut g| g.take()) {
        return Err(e);
    }
    let mut out = out
        .lock()
        .map_err(|_| anyhow::anyhow!("result lock poisoned"))?;
    Ok(std::mem::take(&mut *out).into_iter().flatten().collect())
}
