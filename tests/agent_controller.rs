//! The real agent library against the real rivetd binary on loopback: lookup and the one-time
//! token, refused heartbeats, a controller that is down when the agent starts, and a
//! controller killed with -9 mid-command (result delivered once, step not run twice).
//! A repeated command id is covered at the agent level by agent/tests/http_agent.rs.

use rivet_agent::{
    Agent, AgentOptions, BackoffConfig, Executor, ExecutorOptions, HttpTransport, LogRing,
};
use rivet_hardware_managers::{Dispatcher, HardwareManager, StepContext, StepError, SupportLevel};
use rivet_protocol::agent::CommandStatus;
use rivet_protocol::steps::StepDescriptor;
use rivet_store::sqlite::SqliteStore;
use rivet_store::Store;
use rivet_tests::{free_port, Rivetd};
use serde_json::{json, Map, Value};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A manager whose one step sleeps and counts its runs, so a test can see a step run twice.
struct CountingManager {
    runs: Arc<AtomicUsize>,
    started: Arc<AtomicUsize>,
}

impl HardwareManager for CountingManager {
    fn name(&self) -> &str {
        "counting"
    }
    fn evaluate_support(&self) -> SupportLevel {
        SupportLevel::Generic
    }
    fn steps(&self) -> Vec<StepDescriptor> {
        vec![StepDescriptor::in_band("slow_count", 0)]
    }
    fn execute(
        &self,
        _step: &str,
        args: &Map<String, Value>,
        ctx: &StepContext,
    ) -> Result<Value, StepError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(2000);
        let end = Instant::now() + Duration::from_millis(ms);
        while Instant::now() < end {
            ctx.check()?;
            std::thread::sleep(Duration::from_millis(20));
        }
        let n = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(json!({"runs": n}))
    }
}

struct Harness {
    runs: Arc<AtomicUsize>,
    started: Arc<AtomicUsize>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Harness {
    fn start(rt: &tokio::runtime::Runtime, controller: &str, node: &str) -> Harness {
        let runs = Arc::new(AtomicUsize::new(0));
        let started = Arc::new(AtomicUsize::new(0));
        let managers: Vec<Arc<dyn HardwareManager>> = vec![Arc::new(CountingManager {
            runs: runs.clone(),
            started: started.clone(),
        })];
        let dispatcher = Arc::new(Dispatcher::new(managers));
        let inventory = rivet_agent::inventory::InventoryOptions {
            devices: Some(vec![]),
            skip_bmc: true,
            ..Default::default()
        };
        let opts = AgentOptions {
            controllers: vec![controller.to_string()],
            node: Some(node.to_string()),
            backoff: BackoffConfig {
                base: Duration::from_millis(100),
                cap: Duration::from_millis(500),
            },
            progress_interval: Duration::from_millis(200),
            min_interval: Duration::from_millis(100),
            inventory: inventory.clone(),
            ..Default::default()
        };
        let eopts = ExecutorOptions {
            inventory,
            ..Default::default()
        };
        let executor = Executor::new(dispatcher.clone(), eopts, LogRing::new(50, false));
        let transport = HttpTransport::new(None).expect("transport");
        let agent = Agent::new(opts, transport, dispatcher, executor);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = rt.spawn(async move {
            let _ = agent
                .run(async move {
                    let _ = rx.await;
                })
                .await;
        });
        Harness {
            runs,
            started,
            stop: Some(tx),
            task: Some(task),
        }
    }

    fn stop(mut self, rt: &tokio::runtime::Runtime) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = rt.block_on(async { tokio::time::timeout(Duration::from_secs(5), t).await });
        }
    }
}

fn write_config(dir: &Path) -> String {
    let path = dir.join("rivetd.toml");
    std::fs::write(
        &path,
        "[agent]\nlong_poll_s = 1\nheartbeat_timeout_s = 60\n[conductor]\ncheck_interval_s = 1\n",
    )
    .expect("config");
    path.display().to_string()
}

/// Create a node and move it to "clean wait", where a ramdisk is expected.
fn node_waiting_for_ramdisk(d: &Rivetd, name: &str) -> anyhow::Result<String> {
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(json!({"driver": "fake-hardware", "deploy_interface": "direct", "name": name})),
    )?;
    anyhow::ensure!(s == 201, "{v}");
    d.call(
        "PUT",
        &format!("/v1/nodes/{name}/states/provision"),
        Some(json!({"target": "manage"})),
    )?;
    d.wait_node(name, Duration::from_secs(10), |v| {
        v["provision_state"] == "manageable"
    })?;
    d.call(
        "PUT",
        &format!("/v1/nodes/{name}/states/provision"),
        Some(json!({"target": "provide"})),
    )?;
    let v = d.wait_node(name, Duration::from_secs(10), |v| {
        v["provision_state"] == "clean wait"
    })?;
    Ok(v["uuid"].as_str().unwrap_or_default().to_string())
}

fn wait_for<F: Fn() -> bool>(what: &str, timeout: Duration, f: F) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn lookup_token_once_and_bad_tokens_change_nothing() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = write_config(dir.path());
    let d = Rivetd::start(&dir.path().join("r.db"), 0, &["--config", &cfg])?;
    let (s, _) = d.call(
        "POST",
        "/agent/v1/lookup",
        Some(json!({"node_uuid": "nope", "agent_version": "t"})),
    )?;
    assert_eq!(s, 404, "unknown hardware");
    let uuid = node_waiting_for_ramdisk(&d, "n1")?;
    let (s, first) = d.call(
        "POST",
        "/agent/v1/lookup",
        Some(json!({"node_uuid": uuid, "agent_version": "t"})),
    )?;
    assert_eq!(s, 200, "{first}");
    let token = first["agent_token"]
        .as_str()
        .expect("token on first lookup")
        .to_string();
    assert!(token.len() >= 32);
    let (_, second) = d.call(
        "POST",
        "/agent/v1/lookup",
        Some(json!({"node_uuid": uuid, "agent_version": "t"})),
    )?;
    assert!(
        second["agent_token"].is_null(),
        "token handed out twice: {second}"
    );
    let node = d.node("n1")?;
    assert!(
        !node.to_string().contains(&token),
        "token leaked through the API"
    );

    let before = d.node("n1")?;
    let http = reqwest::blocking::Client::new();
    let hb = |tok: Option<&str>| -> anyhow::Result<u16> {
        let mut r = http
            .post(format!("{}/agent/v1/heartbeat/{uuid}", d.url))
            .json(&json!({"agent_version": "t", "wait": false, "results": [
                {"id": "forged", "name": "execute_step", "status": "SUCCEEDED", "result": {}}]}));
        if let Some(t) = tok {
            r = r.bearer_auth(t);
        }
        Ok(r.send()?.status().as_u16())
    };
    assert_eq!(hb(None)?, 401);
    assert_eq!(hb(Some("not-the-token"))?, 401);
    assert_eq!(
        d.node("n1")?,
        before,
        "a refused heartbeat changed the node"
    );
    assert_eq!(hb(Some(&token))?, 200);
    let after = d.node("n1")?;
    assert!(after["driver_internal_info"]["agent_last_heartbeat"].is_string());
    Ok(())
}

#[test]
fn agent_retries_until_controller_comes_up_then_reports_inventory() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = write_config(dir.path());
    let db = dir.path().join("r.db");
    // Prepare the node with a first rivetd, then stop it.
    let mut d = Rivetd::start(&db, 0, &["--config", &cfg])?;
    let uuid = node_waiting_for_ramdisk(&d, "n1")?;
    let port = d.port;
    d.kill9();

    let rt = runtime();
    let agent = Harness::start(&rt, &format!("http://127.0.0.1:{port}"), &uuid);
    std::thread::sleep(Duration::from_millis(1500));
    let d = Rivetd::start(&db, port, &["--config", &cfg])?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (s, v) = d.call("GET", "/v1/nodes/n1/inventory", None)?;
        if s == 200 {
            assert!(
                v["inventory"]["cpu"]["count"].as_u64().unwrap_or(0) >= 1,
                "{v}"
            );
            assert!(v["collected_at"].is_string());
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no inventory after the controller came up: {v}\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    agent.stop(&rt);
    Ok(())
}

#[test]
fn controller_killed_mid_command_gets_result_once_and_step_runs_once() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = write_config(dir.path());
    let db = dir.path().join("r.db");
    let mut d = Rivetd::start(&db, 0, &["--config", &cfg])?;
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(json!({"driver": "fake-hardware", "deploy_interface": "direct", "name": "n1"})),
    )?;
    anyhow::ensure!(s == 201, "{v}");
    let uuid = v["uuid"].as_str().unwrap_or_default().to_string();
    d.call(
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "manage"})),
    )?;
    d.wait_node("n1", Duration::from_secs(10), |v| {
        v["provision_state"] == "manageable"
    })?;
    // A manual clean whose one step takes 2 s on the agent.
    let (s, v) = d.call(
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "clean", "clean_steps": [
            {"interface": "deploy", "step": "slow_count", "args": {"ms": 2000}}]})),
    )?;
    anyhow::ensure!(s == 202, "{v}");
    let port = d.port;
    let rt = runtime();
    let agent = Harness::start(&rt, &d.url, &uuid);
    let started = agent.started.clone();
    wait_for("the step to start", Duration::from_secs(20), || {
        started.load(Ordering::SeqCst) == 1
    });

    // Kill the controller while the step runs; bring it back after the step has finished.
    d.kill9();
    std::thread::sleep(Duration::from_millis(2500));
    let d = Rivetd::start(&db, port, &["--config", &cfg])?;
    let node = d
        .wait_node("n1", Duration::from_secs(30), |v| {
            v["provision_state"] == "manageable"
        })
        .map_err(|e| anyhow::anyhow!("{e}\n{}", d.log_text()))?;
    assert!(node["last_error"].is_null(), "{node}");
    assert_eq!(agent.runs.load(Ordering::SeqCst), 1, "step ran twice");
    assert_eq!(
        agent.started.load(Ordering::SeqCst),
        1,
        "step started twice"
    );

    // The result was stored exactly once, as delivered after the restart.
    // Only commands are read back: no secret to open.
    let store = SqliteStore::open(
        &db.display().to_string(),
        rivet_support::secrets::Secrets::ephemeral(),
    )?;
    let c = rusqlite::Connection::open(&db)?;
    let id: String = c.query_row(
        "SELECT id FROM agent_commands WHERE command LIKE '%slow_count%'",
        [],
        |r| r.get(0),
    )?;
    let result = rt
        .block_on(store.command(&uuid, &id))?
        .result
        .ok_or_else(|| anyhow::anyhow!("no result stored"))?;
    assert_eq!(result.status, CommandStatus::Succeeded, "{result:?}");
    assert_eq!(result.result["runs"], 1);
    agent.stop(&rt);
    drop(d);
    Ok(())
}

#[test]
fn free_port_is_bindable() {
    let p = free_port().expect("port");
    assert!(std::net::TcpListener::bind(("127.0.0.1", p)).is_ok());
}

/// SIGTERM, as a service manager stops rivetd: a held agent long poll is answered at once
/// (not after `long_poll_s`), rivetd exits 0, and the node lease it held is handed back in
/// the database so another controller need not wait for it to expire.
#[test]
fn sigterm_answers_held_polls_and_hands_leases_back() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("rivetd.toml");
    std::fs::write(
        &cfg,
        "[agent]\nlong_poll_s = 60\nheartbeat_timeout_s = 120\n[conductor]\ncheck_interval_s = 1\n",
    )?;
    let db = dir.path().join("r.db");
    let mut d = Rivetd::start(&db, 0, &["--config", &cfg.display().to_string()])?;
    let uuid = node_waiting_for_ramdisk(&d, "n1")?;
    let (s, v) = d.call(
        "POST",
        "/agent/v1/lookup",
        Some(json!({"node_uuid": uuid, "agent_version": "t"})),
    )?;
    anyhow::ensure!(s == 200, "{v}");
    let token = v["agent_token"].as_str().unwrap_or_default().to_string();
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(90))
        .build()?;
    let url = format!("{}/agent/v1/heartbeat/{uuid}", d.url);
    // The first poll hands out get_clean_steps; saying it runs leaves nothing to send, so
    // the next poll is held.
    let first: Value = http
        .post(&url)
        .bearer_auth(&token)
        .json(&json!({"agent_version": "t", "wait": true}))
        .send()?
        .json()?;
    let id = first["command"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    anyhow::ensure!(!id.is_empty(), "no command handed out: {first}");
    let held = std::thread::spawn(move || -> anyhow::Result<(u16, Duration)> {
        let started = Instant::now();
        let r = http
            .post(&url)
            .bearer_auth(&token)
            .json(&json!({"agent_version": "t", "wait": true,
                "running": {"id": id, "name": "get_clean_steps"}}))
            .send()?;
        Ok((r.status().as_u16(), started.elapsed()))
    });
    std::thread::sleep(Duration::from_millis(700));
    let reserved: Option<String> = rusqlite::Connection::open(&db)?.query_row(
        "SELECT reservation FROM nodes WHERE uuid = ?1",
        [&uuid],
        |r| r.get(0),
    )?;
    assert_eq!(
        reserved.as_deref(),
        Some("test-conductor"),
        "clean wait holds the lease"
    );

    let status = d.terminate(Duration::from_secs(20))?;
    let (code, took) = held
        .join()
        .map_err(|_| anyhow::anyhow!("heartbeat thread panicked"))??;
    assert_eq!(code, 200, "the held poll was answered");
    assert!(
        took < Duration::from_secs(15),
        "the held poll waited {took:?}"
    );
    let status = status
        .ok_or_else(|| anyhow::anyhow!("rivetd ignored SIGTERM for 20 s:\n{}", d.log_text()))?;
    assert!(
        status.success(),
        "rivetd exited with {status}:\n{}",
        d.log_text()
    );
    let reserved: Option<String> = rusqlite::Connection::open(&db)?.query_row(
        "SELECT reservation FROM nodes WHERE uuid = ?1",
        [&uuid],
        |r| r.get(0),
    )?;
    assert_eq!(reserved, None, "lease not handed back:\n{}", d.log_text());
    assert!(
        d.log_text().contains("node leases handed back"),
        "{}",
        d.log_text()
    );
    Ok(())
}
