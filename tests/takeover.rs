//! Several rivetd on one PostgreSQL: three controllers share 30 nodes being cleaned by 30
//! simulated agents; one controller is killed with SIGKILL half-way. The others must notice it
//! died, take its nodes over through the hash ring and expired leases, and finish every
//! cleaning — with no step executed twice (counted on the agent side, by command id).
//!
//! The agents speak the real agent protocol (lookup, long-poll heartbeat, results kept until
//! acknowledged) and, like the real agent given several `rivet.controller` URLs, move to the
//! next controller when theirs stops answering.

use anyhow::{bail, Context, Result};
use rivet_protocol::agent::{Command, CommandKind};
use rivet_protocol::steps::StepDescriptor;
use rivet_store::postgres::ScratchDatabase;
use rivet_tests::simagent::{SimAgent, Steps};
use rivet_tests::{prerequisite, Rivetd};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NODES: usize = 30;
const STEPS: &[(&str, i64)] = &[("wipe_a", 90), ("wipe_b", 80), ("wipe_c", 70)];
const STEP_TIME: Duration = Duration::from_millis(1500);
const DEAD_AFTER_S: u64 = 3;

/// Executions per (node, step), and per command id, as the agents saw them.
#[derive(Default)]
struct Ledger {
    runs: HashMap<(String, String), u32>,
    started: usize,
}

/// The takeover agents' steps: the clean steps of [`STEPS`], each counted in the ledger and
/// taking [`STEP_TIME`]. Any unexpected answer fails the test.
struct Cleaner {
    ledger: Arc<Mutex<Ledger>>,
}

impl Steps for Cleaner {
    async fn execute(&mut self, node: &str, cmd: &Command) -> Value {
        match &cmd.kind {
            CommandKind::GetCleanSteps => {
                let steps: Vec<StepDescriptor> = STEPS
                    .iter()
                    .map(|(n, p)| StepDescriptor::in_band(*n, *p))
                    .collect();
                json!({"clean_steps": steps, "hardware_manager_versions": {"takeover": "1"}})
            }
            CommandKind::ExecuteStep { step, .. } => {
                if let Ok(mut l) = self.ledger.lock() {
                    *l.runs.entry((node.to_string(), step.clone())).or_default() += 1;
                    l.started += 1;
                }
                // One step at a time, as the agent runs them; the controller sees no
                // heartbeat meanwhile, well within heartbeat_timeout_s.
                tokio::time::sleep(STEP_TIME).await;
                json!({})
            }
            _ => json!({}),
        }
    }

    fn unexpected(&mut self, node: &str, what: &str, status: u16, body: &str) -> Result<()> {
        bail!("{what} of {node}: {status} {body}")
    }
}

fn states(d: &Rivetd) -> Result<Vec<Value>> {
    let (s, v) = d.call(
        "GET",
        "/v1/nodes?fields=uuid,provision_state,reservation,conductor,last_error&limit=1000",
        None,
    )?;
    if s != 200 {
        bail!("listing nodes: {s} {v}");
    }
    Ok(v["nodes"].as_array().cloned().unwrap_or_default())
}

fn wait_all(d: &Rivetd, state: &str, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let nodes = states(d)?;
        let behind: Vec<&Value> = nodes
            .iter()
            .filter(|n| n["provision_state"] != state)
            .collect();
        if behind.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{} nodes did not reach {state:?} in {timeout:?}, e.g. {}",
                behind.len(),
                behind[0]
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn alive(d: &Rivetd) -> Result<HashMap<String, bool>> {
    let (s, v) = d.call("GET", "/v1/conductors", None)?;
    if s != 200 {
        bail!("GET /v1/conductors: {s} {v}");
    }
    Ok(v["conductors"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|c| Some((c["hostname"].as_str()?.to_string(), c["alive"].as_bool()?)))
        .collect())
}

#[test]
fn killed_controller_is_taken_over_and_no_step_runs_twice() -> Result<()> {
    let base = std::env::var("RIVET_TEST_POSTGRES").unwrap_or_default();
    if !prerequisite(
        !base.is_empty(),
        "RIVET_TEST_POSTGRES (a PostgreSQL server; scripts/setup-postgres.sh starts one)",
    ) {
        return Ok(());
    }
    let db = ScratchDatabase::create(&base, "rivet_takeover").context("scratch database")?;
    let dir = tempfile::tempdir()?;
    // Controllers sharing a database share its secrets key.
    let key = dir.path().join("secrets.key");
    let made = std::process::Command::new(rivet_tests::bin("rivetd"))
        .args(["secrets", "init-key"])
        .arg(&key)
        .output()?;
    if !made.status.success() {
        bail!(
            "rivetd secrets init-key: {}",
            String::from_utf8_lossy(&made.stderr)
        );
    }
    let cfg = dir.path().join("rivetd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[secrets]\nkey_file = {:?}\n\
             [conductor]\ncheck_interval_s = 1\nheartbeat_interval_s = 1\ndead_after_s = {DEAD_AFTER_S}\n\
             [agent]\nlong_poll_s = 2\nheartbeat_timeout_s = 120\n\
             [power_sync]\ninterval_s = 0\n",
            key.display().to_string()
        ),
    )?;
    let cfg = cfg.display().to_string();
    let ids = ["c1", "c2", "c3"];
    let mut ctl: Vec<Option<Rivetd>> = Vec::new();
    for id in ids {
        ctl.push(Some(Rivetd::start_url(
            db.url(),
            dir.path(),
            id,
            0,
            &["--config", &cfg],
        )?));
    }
    let first = |ctl: &[Option<Rivetd>]| -> Result<usize> {
        ctl.iter()
            .position(Option::is_some)
            .context("no controller left")
    };

    // All three see each other.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let a = alive(ctl[0].as_ref().context("c1")?)?;
        if ids.iter().all(|id| a.get(*id) == Some(&true)) {
            break;
        }
        if Instant::now() > deadline {
            bail!("controllers did not all register: {a:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    // Enrol through different controllers: any of them serves the API.
    let mut uuids = Vec::new();
    for i in 0..NODES {
        let d = ctl[i % 3].as_ref().context("controller")?;
        let (s, v) = d.call(
            "POST",
            "/v1/nodes",
            Some(json!({"name": format!("tk-{i}"), "driver": "fake-hardware", "deploy_interface": "direct"})),
        )?;
        if s != 201 {
            bail!("create node {i}: {s} {v}");
        }
        let uuid = v["uuid"].as_str().context("uuid")?.to_string();
        let (s, v) = d.call(
            "PUT",
            &format!("/v1/nodes/{uuid}/states/provision"),
            Some(json!({"target": "manage"})),
        )?;
        if s != 202 {
            bail!("manage {uuid}: {s} {v}");
        }
        uuids.push(uuid);
    }
    let d0 = ctl[0].as_ref().context("c1")?;
    wait_all(d0, "manageable", Duration::from_secs(60))?;

    // The ring spreads the nodes: every controller owns some. A controller rebuilds its ring
    // on its next membership heartbeat (1 s here), which may come after the others
    // registered.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let owners: Vec<String> = states(d0)?
            .iter()
            .filter_map(|n| n["conductor"].as_str().map(str::to_string))
            .collect();
        let idle: Vec<&str> = ids
            .iter()
            .copied()
            .filter(|id| !owners.iter().any(|o| o == id))
            .collect();
        if idle.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "controllers {idle:?} own no node of {NODES}: {owners:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let urls: Vec<String> = ctl.iter().flatten().map(|d| d.url.clone()).collect();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    for (i, uuid) in uuids.iter().enumerate() {
        let d = ctl[(i + 1) % 3].as_ref().context("controller")?;
        let (s, v) = d.call(
            "PUT",
            &format!("/v1/nodes/{uuid}/states/provision"),
            Some(json!({"target": "provide"})),
        )?;
        if s != 202 {
            bail!("provide {uuid}: {s} {v}");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(150);
    let mut agents = Vec::new();
    for (i, uuid) in uuids.iter().enumerate() {
        let mut order = urls.clone();
        order.rotate_left(i % 3);
        let agent = SimAgent::new(
            uuid,
            order,
            "takeover-test",
            http.clone(),
            Cleaner {
                ledger: ledger.clone(),
            },
        );
        agents.push(rt.spawn(agent.run(deadline)));
    }

    // Half-way: a third of the steps have started.
    let total = NODES * STEPS.len();
    loop {
        let started = ledger.lock().map(|l| l.started).unwrap_or(0);
        if started >= total / 3 {
            break;
        }
        if Instant::now() > deadline {
            bail!("cleaning did not get going: {started} steps started");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Kill the controller holding the most leases right now.
    let nodes = states(ctl[0].as_ref().context("c1")?)?;
    let held = |id: &str| nodes.iter().filter(|n| n["reservation"] == id).count();
    let victim = (0..3).max_by_key(|i| held(ids[*i])).unwrap_or(1);
    let victim_id = ids[victim];
    let victim_nodes: Vec<String> = nodes
        .iter()
        .filter(|n| n["reservation"] == victim_id)
        .filter_map(|n| n["uuid"].as_str().map(str::to_string))
        .collect();
    assert!(
        !victim_nodes.is_empty(),
        "no controller holds a lease mid-cleaning: {nodes:?}"
    );
    let killed_at = Instant::now();
    let mut dead = ctl[victim].take().context("victim")?;
    dead.kill9();
    let survivor = ctl[first(&ctl)?].as_ref().context("survivor")?;

    // Detection: the survivors mark it dead.
    let detected = loop {
        if alive(survivor)?.get(victim_id) == Some(&false) {
            break killed_at.elapsed();
        }
        if killed_at.elapsed() > Duration::from_secs(30) {
            bail!("{victim_id} was never declared dead");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Takeover: none of the victim's nodes is held by it any more.
    let taken = loop {
        let now = states(survivor)?;
        let still = now.iter().filter(|n| n["reservation"] == victim_id).count();
        if still == 0 {
            break killed_at.elapsed();
        }
        if killed_at.elapsed() > Duration::from_secs(60) {
            bail!("{still} nodes still reserved by the dead {victim_id}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };

    wait_all(survivor, "available", Duration::from_secs(120)).inspect_err(|_| {
        for d in ctl.iter().flatten().chain([&dead]) {
            eprintln!("--- log of {}:\n{}", d.url, d.log_text());
        }
    })?;
    for a in agents {
        rt.block_on(a).context("agent task")??;
    }

    // No step ran twice, and every node ran every step.
    let ledger = ledger
        .lock()
        .map_err(|_| anyhow::anyhow!("ledger poisoned"))?;
    for uuid in &uuids {
        for (name, _) in STEPS {
            let runs = ledger
                .runs
                .get(&(uuid.clone(), name.to_string()))
                .copied()
                .unwrap_or(0);
            assert_eq!(runs, 1, "step {name} ran {runs} times on node {uuid}");
        }
    }
    // The survivors own everything now, and say so.
    for n in states(survivor)? {
        assert_ne!(
            n["conductor"], victim_id,
            "node still shown on the dead controller: {n}"
        );
        assert!(n["last_error"].is_null(), "node failed: {n}");
    }
    println!(
        "takeover: killed {victim_id} holding {} of {NODES} leases; declared dead after {:.1} s, \
         its nodes re-leased after {:.1} s (dead_after_s = {DEAD_AFTER_S}); all {NODES} available, \
         {} step executions, none repeated",
        victim_nodes.len(),
        detected.as_secs_f64(),
        taken.as_secs_f64(),
        ledger.started
    );
    Ok(())
}

/// SQLite is for one controller: a second rivetd on the same file is refused at start with a
/// message that says why and what to do, and the first keeps serving.
#[test]
fn second_controller_on_sqlite_is_refused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite:{}", dir.path().join("rivet.db").display());
    let first = Rivetd::start_url(&url, dir.path(), "one", 0, &[])?;
    let second = Rivetd::start_url(&url, dir.path(), "two", 0, &[]);
    let err = match second {
        Ok(_) => bail!("a second controller started on the same SQLite file"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("controller(s) one heartbeat on this SQLite database")
            && err.contains("PostgreSQL"),
        "{err}"
    );
    assert_eq!(alive(&first)?.get("one"), Some(&true));
    assert_eq!(first.call("GET", "/v1/nodes", None)?.0, 200);
    Ok(())
}
