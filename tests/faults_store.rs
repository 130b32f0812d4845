//! Storage faults with the real rivetd (issue 22, item 3):
//!
//! - `sqlite_disk_full_refuses_writes_and_recovers`: the SQLite file on a 4 MiB tmpfs that
//!   fills up. Writes answer 503 (`Retry-After`, a message naming the full disk and where),
//!   reads go on, nothing stored is lost (`PRAGMA integrity_check`, every node read back),
//!   and writes succeed again once space is freed, without a restart. Needs root (mount).
//! - `postgres_controller_killed_mid_deploy`: two rivetd on one PostgreSQL database; the
//!   controller owning a node is killed with SIGKILL while its agent writes the image. The
//!   other takes the node over and the deploy ends `active`, `write_image` run exactly once.
//! - `postgres_restart_under_load`: a throwaway PostgreSQL (initdb/pg_ctl in a temp dir, on
//!   its own loopback port, so the shared test server is untouched) restarted while client
//!   threads read and patch nodes and two simulated agents deploy. Nothing answers 500,
//!   503s only while the server is down (plus a short grace), every node and every
//!   acknowledged write is still there, and both deploys end `active`.
//!
//! The agents are simulated: they speak the real agent protocol (lookup, long-poll
//! heartbeat, results held until acknowledged, the next controller when theirs stops
//! answering, a retry on 503) and count the `write_image` executions by command.
//!
//! Time: each test is bounded under 60 s (measured on the shared 2-core VM: about 4 s,
//! 6-9 s and 17-21 s, initdb included); every wait has a deadline that fails the test.

use anyhow::{bail, ensure, Context, Result};
use rivet_protocol::agent::{Command, CommandKind};
use rivet_protocol::deploy::{WRITE_IMAGE, WRITE_IMAGE_PRIORITY};
use rivet_protocol::steps::StepDescriptor;
use rivet_store::postgres::ScratchDatabase;
use rivet_tests::agentproc::{have, is_root};
use rivet_tests::simagent::{SimAgent, Steps};
use rivet_tests::{fault, free_port, prerequisite, run_tool, Rivetd};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command as Cmd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the simulated agent "writes" the image.
const WRITE_TIME: Duration = Duration::from_millis(2500);

// ---------------------------------------------------------------- disk full (SQLite)

/// A tmpfs mounted on a directory, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Result<Tmpfs> {
        std::fs::create_dir_all(dir)?;
        run_tool(
            Cmd::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700")])
                .arg("tmpfs")
                .arg(dir),
        )?;
        Ok(Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if Cmd::new("umount")
            .arg(&self.0)
            .status()
            .map_or(true, |s| !s.success())
        {
            // Still busy (a rivetd not yet reaped): detach it now, freed when unused.
            let _ = Cmd::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

/// Write zeros to `path` until the filesystem refuses; the bytes written.
fn fill(path: &Path) -> Result<u64> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    let chunk = vec![0u8; 16 << 10];
    let mut written = 0u64;
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
            Err(e) => return Err(e).context("filling the tmpfs"),
        }
    }
    // What is left below a chunk.
    loop {
        match f.write(&[0u8; 512]) {
            Ok(n) if n > 0 => written += n as u64,
            _ => break,
        }
    }
    Ok(written)
}

/// `PRAGMA integrity_check` and the node count of a copy of the database (file and WAL) in
/// `scratch`, made while no write can succeed.
fn check_copy(db: &Path, scratch: &Path) -> Result<(String, i64)> {
    std::fs::create_dir_all(scratch)?;
    let copy = scratch.join("copy.db");
    std::fs::copy(db, &copy)?;
    let wal = PathBuf::from(format!("{}-wal", db.display()));
    if wal.exists() {
        std::fs::copy(&wal, scratch.join("copy.db-wal"))?;
    }
    check_file(&copy)
}

fn check_file(db: &Path) -> Result<(String, i64)> {
    let c = rusqlite::Connection::open(db)?;
    let ok: String = c.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
    let n: i64 = c.query_row("SELECT COUNT(*) FROM nodes", [], |r| r.get(0))?;
    Ok((ok, n))
}

/// Status, `Retry-After` and body of a request (the harness's `call` drops the headers).
fn raw(
    http: &reqwest::blocking::Client,
    d: &Rivetd,
    method: &str,
    path: &str,
    body: Value,
) -> Result<(u16, Option<String>, Value)> {
    let resp = http
        .request(
            reqwest::Method::from_bytes(method.as_bytes())?,
            format!("{}{path}", d.url),
        )
        .header("X-OpenStack-Ironic-API-Version", "latest")
        .json(&body)
        .send()?;
    let status = resp.status().as_u16();
    let retry = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let v = serde_json::from_str(&resp.text()?).unwrap_or(Value::Null);
    Ok((status, retry, v))
}

#[test]
fn sqlite_disk_full_refuses_writes_and_recovers() -> Result<()> {
    if !prerequisite(is_root() && have("mount"), "root and mount (a tmpfs)") {
        return Ok(());
    }
    let started = Instant::now();
    let dir = tempfile::tempdir()?;
    let mnt = dir.path().join("db");
    let tmpfs = Tmpfs::mount(&mnt, "4m")?;
    let db = mnt.join("rivet.db");
    let cfg = dir.path().join("rivetd.toml");
    std::fs::write(
        &cfg,
        "[conductor]\ncheck_interval_s = 1\nheartbeat_interval_s = 1\n[power_sync]\ninterval_s = 1\n",
    )?;
    // The log beside, not on the tmpfs: it must not be what fills it, nor fail with it.
    let mut d = Rivetd::start_url(
        &format!("sqlite:{}", db.display()),
        dir.path(),
        "disk-full",
        0,
        &["--config", &cfg.display().to_string()],
    )?;
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;

    let mut stored = Vec::new();
    for i in 0..20 {
        let uuid = d.create_node_with_port(
            json!({"name": format!("full-{i}"), "driver": "fake-hardware",
                   "extra": {"i": i, "pad": "x".repeat(2000)}}),
            &format!("52:54:00:ee:00:{i:02x}"),
        )?;
        stored.push(uuid);
    }
    let filler = mnt.join("filler");
    let filled = fill(&filler)?;

    // Writes that need room: refused with 503, saying why and where.
    // 200 KB in strings of 4,000 bytes (the API's string limit is 4 KiB).
    let big: serde_json::Map<String, Value> = (0..50)
        .map(|k| (format!("k{k}"), Value::from("y".repeat(4000))))
        .collect();
    let mut refused = None;
    for i in 0..50 {
        let (s, retry, v) = raw(
            &http,
            &d,
            "POST",
            "/v1/nodes",
            json!({"name": format!("more-{i}"), "driver": "fake-hardware", "extra": {"pad": big}}),
        )?;
        match s {
            201 => continue,
            503 => {
                refused = Some((retry, v));
                break;
            }
            _ => bail!("POST /v1/nodes on a full disk: {s} {v}\n{}", d.log_text()),
        }
    }
    let (retry, v) = refused.context("no write was refused on a full disk")?;
    let msg = fault(&v);
    ensure!(
        msg.contains("disk is full") && msg.contains(&mnt.display().to_string()),
        "the 503 does not say the database's disk is full and where: {v}"
    );
    ensure!(retry.is_some(), "503 without Retry-After: {v}");
    let (s, retry, v) = raw(
        &http,
        &d,
        "PATCH",
        &format!("/v1/nodes/{}", stored[0]),
        json!([{"op": "add", "path": "/extra/big", "value": big}]),
    )?;
    ensure!(
        s == 503 && retry.is_some() && fault(&v).contains("disk is full"),
        "PATCH on a full disk: {s} {v}"
    );

    // Reads go on, and the background loops (scan, power sync, heartbeat: 1 s) survive
    // failing writes for a few rounds.
    std::thread::sleep(Duration::from_secs(3));
    let (s, v) = d.call("GET", "/v1/nodes?limit=1000", None)?;
    ensure!(s == 200, "listing on a full disk: {s} {v}");
    for (i, uuid) in stored.iter().enumerate() {
        let n = d.node(uuid)?;
        ensure!(
            n["name"] == format!("full-{i}")
                && n["extra"]["i"] == i
                && n["extra"].get("big").is_none(),
            "node {uuid} changed: {n}"
        );
    }
    let (ok, count) = check_copy(&db, &dir.path().join("copy"))?;
    ensure!(ok == "ok", "integrity_check on a full disk: {ok}");
    ensure!(count >= stored.len() as i64, "{count} nodes stored");

    // Space freed: writes succeed again, same process.
    std::fs::remove_file(&filler)?;
    let freed = Instant::now();
    let created = loop {
        let (s, _, v) = raw(
            &http,
            &d,
            "POST",
            "/v1/nodes",
            json!({"name": "after-full", "driver": "fake-hardware", "extra": {"pad": big}}),
        )?;
        if s == 201 {
            break v["uuid"].as_str().context("uuid")?.to_string();
        }
        ensure!(
            freed.elapsed() < Duration::from_secs(10),
            "writes still refused {:?} after space was freed: {s} {v}",
            freed.elapsed()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let (s, v) = d.call(
        "PATCH",
        &format!("/v1/nodes/{}", stored[0]),
        Some(json!([{"op": "add", "path": "/extra/after", "value": true}])),
    )?;
    ensure!(s == 200, "PATCH after space was freed: {s} {v}");
    ensure!(d.node(&created)?["name"] == "after-full");
    for uuid in &stored {
        d.node(uuid)?;
    }
    let log = d.log_text();
    let status = d.terminate(Duration::from_secs(10))?;
    ensure!(
        status.is_some_and(|s| s.success()),
        "rivetd did not survive the full disk (exit {status:?}):\n{log}"
    );
    let (ok, count) = check_file(&db)?;
    ensure!(ok == "ok", "integrity_check after: {ok}");
    ensure!(
        count == stored.len() as i64 + 1 + count_more(&db)?,
        "{count} nodes"
    );
    drop(tmpfs);
    println!(
        "disk full: {filled} bytes filled the tmpfs; writes 503, reads 200, integrity ok; \
         writes back {:.1} s after space was freed; {:.1} s in all",
        freed.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Nodes created by the `more-*` writes before the disk was full.
fn count_more(db: &Path) -> Result<i64> {
    let c = rusqlite::Connection::open(db)?;
    Ok(c.query_row(
        "SELECT COUNT(*) FROM nodes WHERE name LIKE 'more-%'",
        [],
        |r| r.get(0),
    )?)
}

// ---------------------------------------------------------------- simulated deploy agent

/// `write_image` executions per node, as the agents saw them.
#[derive(Default)]
struct Ledger {
    writes: HashMap<String, u32>,
    /// Answers that were neither a success nor a passing fault (status, what).
    bad: Vec<String>,
    /// 503s seen.
    unavailable: u32,
}

/// The deploy agents' steps: `write_image` counted in the ledger and taking [`WRITE_TIME`];
/// a 503 (or any other passing answer) is noted and retried, as the real agent does.
struct Deployer {
    ledger: Arc<Mutex<Ledger>>,
}

impl Steps for Deployer {
    async fn execute(&mut self, node: &str, cmd: &Command) -> Value {
        match &cmd.kind {
            CommandKind::GetDeploySteps => json!({
                "deploy_steps": [StepDescriptor::in_band(WRITE_IMAGE, WRITE_IMAGE_PRIORITY)],
                "hardware_manager_versions": {"faults": "1"}
            }),
            CommandKind::ExecuteStep { step, .. } if step == WRITE_IMAGE => {
                if let Ok(mut l) = self.ledger.lock() {
                    *l.writes.entry(node.to_string()).or_default() += 1;
                }
                tokio::time::sleep(WRITE_TIME).await;
                json!({"written_by": "faults-test", "command": cmd.id})
            }
            _ => json!({}),
        }
    }

    fn unexpected(&mut self, _node: &str, what: &str, status: u16, _body: &str) -> Result<()> {
        if let Ok(mut l) = self.ledger.lock() {
            if status == 503 {
                l.unavailable += 1;
            } else {
                l.bad.push(format!("{what}: {status}"));
            }
        }
        Ok(())
    }
}

/// A simulated deploy agent for `node`, trying `urls` in order.
fn deploy_agent(
    node: &str,
    urls: Vec<String>,
    ledger: Arc<Mutex<Ledger>>,
) -> Result<SimAgent<Deployer>> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()?;
    Ok(SimAgent::new(
        node,
        urls,
        "faults-test",
        http,
        Deployer { ledger },
    ))
}

/// Enrol a fake-hardware node that deploys with the agent, make it `available` (no
/// automated cleaning in these configs) and start its deploy.
fn deploy_node(d: &Rivetd, name: &str) -> Result<String> {
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(json!({
            "name": name, "driver": "fake-hardware", "deploy_interface": "direct",
            // The agent stands in for a ramdisk on this BIOS host: no UEFI.
            "properties": {"capabilities": "boot_mode:bios"},
            "instance_info": {
                "image_source": "http://127.0.0.1:9/faults.img",
                "image_os_hash_algo": "sha256",
                "image_os_hash_value": "ab".repeat(32),
            }
        })),
    )?;
    ensure!(s == 201, "create {name}: {s} {v}");
    let uuid = v["uuid"].as_str().context("uuid")?.to_string();
    for (target, state) in [("manage", "manageable"), ("provide", "available")] {
        provision(d, &uuid, target)?;
        d.wait_node(&uuid, Duration::from_secs(20), |n| {
            n["provision_state"] == state
        })?;
    }
    provision(d, &uuid, "active")?;
    Ok(uuid)
}

/// `PUT …/states/provision`, retried while the answer is a passing 503.
fn provision(d: &Rivetd, uuid: &str, target: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (s, v) = d.call(
            "PUT",
            &format!("/v1/nodes/{uuid}/states/provision"),
            Some(json!({"target": target})),
        )?;
        if s == 202 {
            return Ok(());
        }
        ensure!(
            s == 503 && Instant::now() < deadline,
            "{target} {uuid}: {s} {v}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn shared_key(dir: &Path) -> Result<PathBuf> {
    let key = dir.join("secrets.key");
    run_tool(
        Cmd::new(rivet_tests::bin("rivetd"))
            .args(["secrets", "init-key"])
            .arg(&key),
    )?;
    Ok(key)
}

// ---------------------------------------------------------------- kill -9 mid-deploy

#[test]
fn postgres_controller_killed_mid_deploy() -> Result<()> {
    let base = std::env::var("RIVET_TEST_POSTGRES").unwrap_or_default();
    if !prerequisite(
        !base.is_empty(),
        "RIVET_TEST_POSTGRES (a PostgreSQL server; scripts/setup-postgres.sh starts one)",
    ) {
        return Ok(());
    }
    let started = Instant::now();
    let db = ScratchDatabase::create(&base, "rivet_faults_kill").context("scratch database")?;
    let dir = tempfile::tempdir()?;
    let key = shared_key(dir.path())?;
    let cfg = dir.path().join("rivetd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[secrets]\nkey_file = {:?}\n\
             [conductor]\ncheck_interval_s = 1\nheartbeat_interval_s = 1\ndead_after_s = 3\n\
             automated_clean = false\n\
             [agent]\nlong_poll_s = 2\n[power_sync]\ninterval_s = 0\n",
            key.display().to_string()
        ),
    )?;
    let cfg = cfg.display().to_string();
    let mut ctl = HashMap::new();
    for id in ["k1", "k2"] {
        ctl.insert(
            id,
            Rivetd::start_url(db.url(), dir.path(), id, 0, &["--config", &cfg])?,
        );
    }
    // Both registered: the ring has two members before the node is placed.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, v) = ctl["k1"].call("GET", "/v1/conductors", None)?;
        let alive = v["conductors"]
            .as_array()
            .map_or(0, |c| c.iter().filter(|c| c["alive"] == true).count());
        if alive == 2 {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "controllers did not register: {v}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_millis(1500));

    let uuid = deploy_node(&ctl["k1"], "kill-mid-deploy")?;
    let owner = ctl["k1"].wait_node(&uuid, Duration::from_secs(10), |n| {
        n["conductor"].is_string()
    })?["conductor"]
        .as_str()
        .context("conductor")?
        .to_string();
    let victim = if owner == "k1" { "k1" } else { "k2" };
    let other = if victim == "k1" { "k2" } else { "k1" };
    // The agent talks to the owner first, then to the other, as the real agent given both
    // URLs does.
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let agent = deploy_agent(
        &uuid,
        vec![ctl[victim].url.clone(), ctl[other].url.clone()],
        ledger.clone(),
    )?;
    let deadline = Instant::now() + Duration::from_secs(45);
    let task = rt.spawn(agent.run(deadline));

    // Mid-deploy: the image is being written.
    loop {
        if ledger
            .lock()
            .map(|l| l.writes.contains_key(&uuid))
            .unwrap_or(false)
        {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "write_image never started: {}\n{}",
            ctl[other].node(&uuid)?,
            ctl[victim].log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let killed_at = Instant::now();
    if let Some(d) = ctl.get_mut(victim) {
        d.kill9();
    }
    let survivor = &ctl[other];
    let done = survivor
        .wait_node(&uuid, Duration::from_secs(40), |n| {
            n["provision_state"] == "active" || n["provision_state"] == "deploy failed"
        })
        .inspect_err(|_| {
            for (id, d) in &ctl {
                eprintln!("--- log of {id}:\n{}", d.log_text());
            }
        })?;
    ensure!(
        done["provision_state"] == "active" && done["last_error"].is_null(),
        "deploy did not finish after the kill: {done}\n{}",
        survivor.log_text()
    );
    ensure!(done["conductor"] == other, "node still on {victim}: {done}");
    let image = &done["driver_internal_info"]["deployed_image"];
    ensure!(
        image["written_by"] == "faults-test",
        "the write_image result was not kept: {done}"
    );
    rt.block_on(task).context("agent task")??;
    let l = ledger.lock().map_err(|_| anyhow::anyhow!("ledger"))?;
    ensure!(
        l.writes.get(&uuid) == Some(&1),
        "write_image ran {:?} times",
        l.writes.get(&uuid)
    );
    ensure!(l.bad.is_empty(), "unexpected agent answers: {:?}", l.bad);
    println!(
        "kill -9 mid-deploy: {victim} killed during write_image; active on {other} {:.1} s later \
         (dead_after_s = 3), write_image once; {:.1} s in all",
        killed_at.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

// ---------------------------------------------------------------- PostgreSQL restart

/// A PostgreSQL cluster of the test's own in a temp dir, run as `postgres`, stopped on drop.
struct OwnPostgres {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    _dir: tempfile::TempDir,
}

impl OwnPostgres {
    fn bin_dir() -> Option<PathBuf> {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .flatten()
            .map(|e| e.path().join("bin"))
            .filter(|b| b.join("pg_ctl").exists() && b.join("initdb").exists())
            .collect();
        dirs.sort_by_key(|p| {
            p.parent()
                .and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok())
                .unwrap_or(0)
        });
        dirs.pop()
    }

    fn start() -> Result<OwnPostgres> {
        let bin = Self::bin_dir().context("no PostgreSQL binaries in /usr/lib/postgresql")?;
        let dir = tempfile::tempdir()?;
        run_tool(
            Cmd::new("chown")
                .args(["postgres:postgres"])
                .arg(dir.path()),
        )?;
        let data = dir.path().join("data");
        let port = free_port()?;
        run_tool(
            Cmd::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(bin.join("initdb"))
                .arg("-D")
                .arg(&data)
                .args([
                    "-U",
                    "rivet",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--locale=C.UTF-8",
                ]),
        )?;
        let pg = OwnPostgres {
            bin,
            data,
            port,
            _dir: dir,
        };
        pg.ctl(&["start"])?;
        Ok(pg)
    }

    fn ctl(&self, what: &[&str]) -> Result<String> {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=60",
            self.port,
            self.data.display()
        );
        run_tool(
            Cmd::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(self.bin.join("pg_ctl"))
                .arg("-D")
                .arg(&self.data)
                .arg("-l")
                .arg(self.data.join("server.log"))
                .args(["-o", &opts, "-w", "-t", "30", "-m", "fast"])
                .args(what),
        )
    }

    fn url(&self) -> String {
        format!("postgres://rivet@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = Cmd::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }
}

/// Sets its flag when dropped.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// One answer seen by a client thread: when, and its status (0: no answer).
type Seen = (Instant, u16, String);

#[test]
fn postgres_restart_under_load() -> Result<()> {
    if !prerequisite(
        is_root() && have("runuser") && OwnPostgres::bin_dir().is_some(),
        "root, runuser and the PostgreSQL server binaries (scripts/setup-postgres.sh installs them)",
    ) {
        return Ok(());
    }
    let started = Instant::now();
    let pg = OwnPostgres::start()?;
    let dir = tempfile::tempdir()?;
    let key = shared_key(dir.path())?;
    let cfg = dir.path().join("rivetd.toml");
    // dead_after_s above the restart: a controller whose heartbeat fails longer stops
    // (documented in docs/operations.md).
    std::fs::write(
        &cfg,
        format!(
            "[secrets]\nkey_file = {:?}\n\
             [conductor]\ncheck_interval_s = 1\nheartbeat_interval_s = 1\ndead_after_s = 20\n\
             automated_clean = false\n\
             [agent]\nlong_poll_s = 2\n[power_sync]\ninterval_s = 0\n",
            key.display().to_string()
        ),
    )?;
    let d = Rivetd::start_url(
        &pg.url(),
        dir.path(),
        "pg-restart",
        0,
        &["--config", &cfg.display().to_string()],
    )?;

    // Nodes the clients read and patch (enroll: nothing else writes them).
    let mut plain = Vec::new();
    for i in 0..6 {
        let (s, v) = d.call(
            "POST",
            "/v1/nodes",
            Some(json!({"name": format!("load-{i}"), "driver": "fake-hardware"})),
        )?;
        ensure!(s == 201, "create: {s} {v}");
        plain.push(v["uuid"].as_str().context("uuid")?.to_string());
    }
    let deploys = vec![
        deploy_node(&d, "restart-deploy-0")?,
        deploy_node(&d, "restart-deploy-1")?,
    ];

    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let deadline = Instant::now() + Duration::from_secs(45);
    let agents: Vec<_> = deploys
        .iter()
        .map(|u| deploy_agent(u, vec![d.url.clone()], ledger.clone()))
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .map(|a| rt.spawn(a.run(deadline)))
        .collect();

    // Client threads: each reads every node and patches its own two, counting up.
    let stop = Arc::new(AtomicBool::new(false));
    // On an early return too: the threads end.
    let _stop_clients = StopOnDrop(stop.clone());
    let mut clients = Vec::new();
    for t in 0..3 {
        let (url, stop, plain) = (d.url.clone(), stop.clone(), plain.clone());
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()?;
        clients.push(std::thread::spawn(move || {
            let call = |method: &str, path: &str, body: Option<Value>| -> Result<(u16, Value)> {
                let mut req = http
                    .request(
                        reqwest::Method::from_bytes(method.as_bytes())?,
                        format!("{url}{path}"),
                    )
                    .header("X-OpenStack-Ironic-API-Version", "latest");
                if let Some(b) = body {
                    req = req.json(&b);
                }
                let resp = req.send()?;
                let status = resp.status().as_u16();
                Ok((
                    status,
                    serde_json::from_str(&resp.text()?).unwrap_or(Value::Null),
                ))
            };
            let mut seen: Vec<Seen> = Vec::new();
            let mut acked: HashMap<String, i64> = HashMap::new();
            let mut counter = 0i64;
            let mine = [plain[2 * t].clone(), plain[2 * t + 1].clone()];
            while !stop.load(Ordering::Relaxed) {
                for (i, uuid) in plain.iter().enumerate() {
                    let r = call("GET", &format!("/v1/nodes/{uuid}"), None);
                    seen.push(match r {
                        Ok((s, v)) => (Instant::now(), s, format!("GET {i}: {}", fault(&v))),
                        Err(e) => (Instant::now(), 0, format!("GET: {e}")),
                    });
                }
                for uuid in &mine {
                    counter += 1;
                    let r = call(
                        "PATCH",
                        &format!("/v1/nodes/{uuid}"),
                        Some(json!([{"op": "add", "path": "/extra/count", "value": counter}])),
                    );
                    match r {
                        Ok((s, v)) => {
                            if s == 200 {
                                acked.insert(uuid.clone(), counter);
                            }
                            seen.push((Instant::now(), s, format!("PATCH: {}", fault(&v))));
                        }
                        Err(e) => seen.push((Instant::now(), 0, format!("PATCH: {e}"))),
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            (seen, acked)
        }));
    }

    // Restart once the writes are in progress.
    loop {
        if ledger.lock().map(|l| l.writes.len() == 2).unwrap_or(false) {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the deploys did not reach write_image"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Stop the server as the agents report the written images and the conductor moves on
    // to the next steps: both sides talk to the database during the restart.
    std::thread::sleep(WRITE_TIME);
    let down = Instant::now();
    pg.ctl(&["stop"])?;
    std::thread::sleep(Duration::from_secs(1));
    pg.ctl(&["start"])?;
    let up = Instant::now();
    let grace = Duration::from_secs(5);
    std::thread::sleep(grace + Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);

    let mut all: Vec<Seen> = Vec::new();
    let mut acked: HashMap<String, i64> = HashMap::new();
    for c in clients {
        let (seen, a) = c
            .join()
            .map_err(|_| anyhow::anyhow!("client thread panicked"))?;
        all.extend(seen);
        acked.extend(a);
    }
    let late = up + grace;
    let errors: Vec<String> = all
        .iter()
        .filter(|(at, s, _)| *s == 500 || *s == 0 || (*s >= 300 && (*at < down || *at > late)))
        .map(|(at, s, what)| {
            let secs = if *at >= down {
                at.duration_since(down).as_secs_f64()
            } else {
                -down.duration_since(*at).as_secs_f64()
            };
            format!("{s} at {secs:+.1} s from the stop: {what}")
        })
        .collect();
    let during = all
        .iter()
        .filter(|(at, s, _)| *s == 503 && *at >= down && *at <= late)
        .count();
    let last_503 = all
        .iter()
        .filter(|(_, s, _)| *s == 503)
        .map(|(at, _, _)| *at)
        .max()
        .map_or(0.0, |at| {
            if at > up {
                at.duration_since(up).as_secs_f64()
            } else {
                -up.duration_since(at).as_secs_f64()
            }
        });
    let after_ok = all
        .iter()
        .filter(|(at, s, _)| *at > late && (200..300).contains(s))
        .count();
    ensure!(
        errors.is_empty(),
        "{} bad answers around a {:.1} s restart (first: {:?})\n{}",
        errors.len(),
        up.duration_since(down).as_secs_f64(),
        errors.iter().take(5).collect::<Vec<_>>(),
        d.log_text()
    );
    ensure!(after_ok > 0, "no request answered after the restart");

    // The deploys end, once each; nothing lost, every acknowledged PATCH kept.
    for uuid in &deploys {
        let n = d.wait_node(uuid, Duration::from_secs(30), |n| {
            n["provision_state"] == "active" || n["provision_state"] == "deploy failed"
        })?;
        ensure!(
            n["provision_state"] == "active",
            "deploy across the restart: {n}\n{}",
            d.log_text()
        );
    }
    for a in agents {
        rt.block_on(a).context("agent task")??;
    }
    let l = ledger.lock().map_err(|_| anyhow::anyhow!("ledger"))?;
    for uuid in &deploys {
        ensure!(
            l.writes.get(uuid) == Some(&1),
            "write_image on {uuid} ran {:?} times\n{}",
            l.writes.get(uuid),
            d.log_text()
        );
    }
    ensure!(
        l.bad.is_empty(),
        "agent answers other than 2xx/503: {:?}",
        l.bad
    );
    let (s, v) = d.call("GET", "/v1/nodes?limit=1000", None)?;
    ensure!(s == 200, "{s} {v}");
    ensure!(
        v["nodes"].as_array().map_or(0, Vec::len) == plain.len() + deploys.len(),
        "nodes lost: {v}"
    );
    for (uuid, count) in &acked {
        let n = d.node(uuid)?;
        ensure!(
            n["extra"]["count"] == *count,
            "node {uuid}: last acknowledged count {count}, stored {}",
            n["extra"]["count"]
        );
    }
    println!(
        "PostgreSQL restart: down {:.1} s; {} requests, {during} answered 503 during it \
         (the last {last_503:+.1} s from the server's return; agents saw {} 503s), none 500; \
         both deploys active, write_image once each; {:.1} s in all",
        up.duration_since(down).as_secs_f64(),
        all.len(),
        l.unavailable,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
