//! Dispatch benchmark (not a test): how fast rivetd hands an agent its next clean step, and
//! how long automated cleaning of one node takes when every step is a no-op.
//!
//! ```text
//! cargo run --release -p rivet-tests --example dispatch_bench -- [--steps 200] [--auto-runs 5] [--keep]
//! ```
//!
//! It builds and starts a release `rivetd` (target/release) on a temporary SQLite file, and runs
//! the real agent library in this process with one hardware manager whose steps do nothing but
//! record when they start and end. Each cleaning gets a fresh agent, started as soon as the
//! node is in "clean wait", as a ramdisk boot would.
//!
//! - **dispatch latency**: a manual clean of `--steps` × `deploy.noop`; the gap between one
//!   step's end and the next one's start, as the agent sees it (its result goes up, the next
//!   command comes down);
//! - **automated cleaning**: `provide` → `available` with the manager offering `noop_a`
//!   (priority 50) and `noop_b` (priority 40).
//!
//! Prints one markdown row per measurement for docs/numbers.md. `--keep` keeps
//! the temporary directory (rivetd's log has a timestamp on every decision).

use anyhow::{bail, Context, Result};
use rivet_agent::{Agent, AgentOptions, Executor, ExecutorOptions, HttpTransport, LogRing};
use rivet_hardware_managers::{Dispatcher, HardwareManager, StepContext, StepError, SupportLevel};
use rivet_protocol::steps::StepDescriptor;
use rivet_tests::{free_port, target_dir};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CONFIG: &str = "[agent]\nlong_poll_s = 30\n\n[conductor]\ncheck_interval_s = 1\n";

/// One step execution as the agent saw it.
#[derive(Debug, Clone)]
struct Run {
    step: String,
    start: Instant,
    end: Instant,
}

/// Offers `noop` (manual only), `noop_a` (50) and `noop_b` (40); each records its run.
struct NoopManager {
    runs: Arc<Mutex<Vec<Run>>>,
}

impl HardwareManager for NoopManager {
    fn name(&self) -> &str {
        "noop_bench"
    }
    fn evaluate_support(&self) -> SupportLevel {
        SupportLevel::Generic
    }
    fn steps(&self) -> Vec<StepDescriptor> {
        vec![
            StepDescriptor::in_band("noop", 0),
            StepDescriptor::in_band("noop_a", 50),
            StepDescriptor::in_band("noop_b", 40),
        ]
    }
    fn execute(
        &self,
        step: &str,
        _args: &Map<String, Value>,
        _ctx: &StepContext,
    ) -> Result<Value, StepError> {
        let start = Instant::now();
        let end = Instant::now();
        if let Ok(mut runs) = self.runs.lock() {
            runs.push(Run {
                step: step.to_string(),
                start,
                end,
            });
        }
        Ok(Value::Null)
    }
}

/// An in-process agent for one node, stopped on drop.
struct InProcessAgent<'rt> {
    rt: &'rt tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl<'rt> InProcessAgent<'rt> {
    fn start(
        rt: &'rt tokio::runtime::Runtime,
        url: &str,
        node: &str,
        runs: Arc<Mutex<Vec<Run>>>,
    ) -> Result<Self> {
        let managers: Vec<Arc<dyn HardwareManager>> = vec![Arc::new(NoopManager { runs })];
        let dispatcher = Arc::new(Dispatcher::new(managers));
        let inventory = rivet_agent::inventory::InventoryOptions {
            devices: Some(vec![]),
            skip_bmc: true,
            ..Default::default()
        };
        // The production agent's timing (AgentOptions::default), only the addresses differ.
        let opts = AgentOptions {
            controllers: vec![url.to_string()],
            node: Some(node.to_string()),
            inventory: inventory.clone(),
            ..Default::default()
        };
        let eopts = ExecutorOptions {
            inventory,
            ..Default::default()
        };
        let executor = Executor::new(dispatcher.clone(), eopts, LogRing::new(50, false));
        let agent = Agent::new(opts, HttpTransport::new(None)?, dispatcher, executor);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = rt.spawn(agent.run(async move {
            let _ = rx.await;
        }));
        Ok(InProcessAgent {
            rt,
            stop: Some(tx),
            task: Some(task),
        })
    }
}

impl Drop for InProcessAgent<'_> {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = self
                .rt
                .block_on(async { tokio::time::timeout(Duration::from_secs(5), t).await });
        }
    }
}

/// The release rivetd child, killed on drop.
struct Rivetd {
    child: Child,
    url: String,
    log: PathBuf,
    http: reqwest::blocking::Client,
}

impl Rivetd {
    fn start(exe: &Path, dir: &Path) -> Result<Rivetd> {
        let port = free_port()?;
        let config = dir.join("rivetd.toml");
        std::fs::write(&config, CONFIG)?;
        let log = dir.join("rivetd.log");
        let child = Command::new(exe)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--db")
            .arg(format!("sqlite:{}", dir.join("rivet.db").display()))
            .arg("--no-auth")
            .arg("--config")
            .arg(&config)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let d = Rivetd {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
            http: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()?,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while d.http.get(format!("{}/v1", d.url)).send().is_err() {
            if Instant::now() > deadline {
                bail!("rivetd did not start; see {}", d.log.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(d)
    }

    fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value> {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.url))
            .header("X-OpenStack-Ironic-API-Version", "latest");
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().with_context(|| format!("{method} {path}"))?;
        let status = resp.status();
        let text = resp.text()?;
        if !status.is_success() {
            bail!("{method} {path}: {status} {text}");
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    fn provision(&self, node: &str, body: Value) -> Result<()> {
        let path = format!("/v1/nodes/{node}/states/provision");
        self.call(reqwest::Method::PUT, &path, Some(body))
            .map(|_| ())
    }

    /// Poll every `every` until the node is in `state`; the time it was first seen there.
    fn wait_state(&self, node: &str, state: &str, every: Duration) -> Result<Instant> {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            // Only the fields needed: a node with a long plan is a big document to render.
            let path = format!("/v1/nodes/{node}?fields=provision_state,last_error");
            let v = self.call(reqwest::Method::GET, &path, None)?;
            let now = Instant::now();
            let s = v["provision_state"].as_str().unwrap_or_default();
            if s == state {
                return Ok(now);
            }
            if s.ends_with("failed") || s == "error" || now > deadline {
                bail!(
                    "node {node} is in {s:?} while waiting for {state:?}: {}",
                    v["last_error"]
                );
            }
            std::thread::sleep(every);
        }
    }

    /// A new fake-hardware node in manageable.
    fn manageable_node(&self, name: &str) -> Result<String> {
        let v = self.call(
            reqwest::Method::POST,
            "/v1/nodes",
            Some(json!({"driver": "fake-hardware", "deploy_interface": "direct", "name": name})),
        )?;
        let uuid = v["uuid"].as_str().unwrap_or_default().to_string();
        self.provision(&uuid, json!({"target": "manage"}))?;
        self.wait_state(&uuid, "manageable", Duration::from_millis(10))?;
        Ok(uuid)
    }
}

impl Drop for Rivetd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Build (if needed) and locate the release rivetd.
fn release_rivetd() -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "--release",
            "-q",
            "-p",
            "rivet-controller",
            "--bin",
            "rivetd",
        ])
        .status()
        .context("running cargo build --release -p rivet-controller")?;
    if !status.success() {
        bail!("cargo build --release -p rivet-controller failed");
    }
    let exe = target_dir().join("release").join("rivetd");
    if !exe.is_file() {
        bail!("{} missing after the build", exe.display());
    }
    Ok(exe)
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn take_runs(runs: &Arc<Mutex<Vec<Run>>>) -> Vec<Run> {
    runs.lock()
        .map(|mut r| std::mem::take(&mut *r))
        .unwrap_or_default()
}

/// (a) Manual clean of `n` no-op steps: gaps between consecutive steps.
fn dispatch_latency(rt: &tokio::runtime::Runtime, d: &Rivetd, n: usize) -> Result<String> {
    let node = d.manageable_node("bench-manual")?;
    let runs = Arc::new(Mutex::new(Vec::new()));
    let steps: Vec<Value> = (0..n)
        .map(|_| json!({"interface": "deploy", "step": "noop"}))
        .collect();
    let t0 = Instant::now();
    d.provision(&node, json!({"target": "clean", "clean_steps": steps}))?;
    d.wait_state(&node, "clean wait", Duration::from_millis(5))?;
    let agent = InProcessAgent::start(rt, &d.url, &node, runs.clone())?;
    // Polled slowly, not to compete with the run; the step times come from the agent.
    let done = d.wait_state(&node, "manageable", Duration::from_millis(200))?;
    drop(agent);
    let runs = take_runs(&runs);
    if runs.len() != n {
        bail!("{} steps ran, expected {n}", runs.len());
    }
    let mut gaps: Vec<Duration> = runs
        .windows(2)
        .map(|w| w[1].start.saturating_duration_since(w[0].end))
        .collect();
    // Does a step cost more the further the run is? (Something growing with the plan or the
    // command history would show here.)
    let tenth = gaps.len().div_ceil(10);
    let by_tenth: Vec<String> = gaps
        .chunks(tenth)
        .map(|c| {
            let mut c = c.to_vec();
            c.sort();
            format!("{:.1}", percentile(&c, 50.0).as_secs_f64() * 1000.0)
        })
        .collect();
    eprintln!(
        "dispatch: gap p50 per tenth of the run (ms): {}",
        by_tenth.join(" ")
    );
    gaps.sort();
    let (p50, p99, max) = (
        percentile(&gaps, 50.0),
        percentile(&gaps, 99.0),
        gaps.last().copied().unwrap_or_default(),
    );
    let span = runs[n - 1].end - runs[0].start;
    let over_1s = gaps
        .iter()
        .filter(|g| **g >= Duration::from_millis(900))
        .count();
    eprintln!(
        "dispatch: {n} steps; gaps p50 {} p90 {} p99 {} max {}; {over_1s} gaps ≥ 0.9 s; \
         first step start → last step end {:.2} s; clean request → manageable {:.2} s",
        ms(p50),
        ms(percentile(&gaps, 90.0)),
        ms(p99),
        ms(max),
        span.as_secs_f64(),
        (done - t0).as_secs_f64()
    );
    Ok(format!(
        "| Step-to-step dispatch, manual clean of {n} no-op steps (agent in-process, loopback, release rivetd) | p50 {}, p99 {}, max {}; {n} steps in {:.1} s (clean request → manageable {:.1} s) |",
        ms(p50),
        ms(p99),
        ms(max),
        span.as_secs_f64(),
        (done - t0).as_secs_f64()
    ))
}

/// (b) Automated cleaning with two no-op steps, `runs` times: provide → available.
fn automated_cleaning(rt: &tokio::runtime::Runtime, d: &Rivetd, runs_n: usize) -> Result<String> {
    let node = d.manageable_node("bench-auto")?;
    let runs = Arc::new(Mutex::new(Vec::new()));
    let mut walls = Vec::new();
    for i in 0..runs_n {
        if i > 0 {
            d.provision(&node, json!({"target": "manage"}))?;
            d.wait_state(&node, "manageable", Duration::from_millis(10))?;
        }
        let t0 = Instant::now();
        d.provision(&node, json!({"target": "provide"}))?;
        let booted = d.wait_state(&node, "clean wait", Duration::from_millis(2))?;
        let agent = InProcessAgent::start(rt, &d.url, &node, runs.clone())?;
        let done = d.wait_state(&node, "available", Duration::from_millis(5))?;
        drop(agent);
        let steps = take_runs(&runs);
        let names: Vec<&str> = steps.iter().map(|r| r.step.as_str()).collect();
        if names != ["noop_a", "noop_b"] {
            bail!("automated cleaning ran {names:?}, expected noop_a then noop_b");
        }
        eprintln!(
            "automated run {}: provide → clean wait {}, agent start → first step {}, \
             step gap {}, last step → available {}, total {}",
            i + 1,
            ms(booted - t0),
            ms(steps[0].start - booted),
            ms(steps[1].start - steps[0].end),
            ms(done.saturating_duration_since(steps[1].end)),
            ms(done - t0)
        );
        walls.push(done - t0);
    }
    walls.sort();
    Ok(format!(
        "| Automated cleaning of one node, two no-op steps, `provide` → `available` (agent started at clean wait) | median {} (min {}, max {}, {runs_n} runs) |",
        ms(percentile(&walls, 50.0)),
        ms(walls[0]),
        ms(walls[walls.len() - 1])
    ))
}

struct Opts {
    steps: usize,
    auto_runs: usize,
    keep: bool,
}

fn parse_args() -> Result<Opts> {
    let mut o = Opts {
        steps: 200,
        auto_runs: 5,
        keep: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |flag: &str| -> Result<usize> {
            args.next()
                .and_then(|v| v.parse().ok())
                .filter(|n| *n >= 1)
                .with_context(|| format!("{flag} needs a positive number"))
        };
        match a.as_str() {
            "--steps" => o.steps = num("--steps")?.max(2),
            "--auto-runs" => o.auto_runs = num("--auto-runs")?,
            "--keep" => o.keep = true,
            other => bail!("unknown argument {other:?}; use --steps N, --auto-runs N, --keep"),
        }
    }
    Ok(o)
}

fn main() -> Result<()> {
    let o = parse_args()?;
    let exe = release_rivetd()?;
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start(&exe, dir.path())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    eprintln!(
        "rivetd {} at {}, log {}",
        exe.display(),
        d.url,
        d.log.display()
    );
    let auto = automated_cleaning(&rt, &d, o.auto_runs)?;
    let dispatch = dispatch_latency(&rt, &d, o.steps)?;
    println!("| What | Result |");
    println!("|---|---|");
    println!("{dispatch}");
    println!("{auto}");
    drop(d);
    if o.keep {
        let kept = dir.keep();
        eprintln!("kept {}", kept.display());
    }
    Ok(())
}
