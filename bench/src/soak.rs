//! `rivet-bench soak`: N fake-hardware nodes, each with a simulated agent speaking the real
//! agent protocol, cycle through the public API for `--minutes` (provide → available →
//! deploy → active → undeploy → cleaning → available, again and again) while a seeded RNG
//! injects faults: agents that vanish mid-step and come back as a fresh agent process would
//! (new lookup, no token, results lost), and rivetd restarts (SIGTERM, sometimes SIGKILL,
//! then the same binary started again on the same SQLite file and port).
//!
//! Afterwards the chaos stops, every node finishes its operation (bounded by `--settle-s`),
//! and the soak checks, prints a summary table and exits non-zero on any violation:
//! - every node rests (`available`, `active`, `manageable`), or is failed with a last_error
//!   an injected fault explains — counted apart; any other failure, during the run or at
//!   the end, is a violation. Two faults explain a heartbeat timeout: its agent was crashed
//!   during the operation, or rivetd went down while answering the agent's lookup (the
//!   answer carried the boot's only token, so no agent can go on; the node can only time
//!   out and be retried, as in Ironic);
//! - no command id was executed twice (a ledger on the agent side, shared by every agent
//!   incarnation, so a command re-sent to a rebooted or restarted agent shows);
//! - rivetd's RSS did not grow by more than `--rss-limit-pct` within one controller lifetime
//!   after `--rss-warmup-s` (sampled every 5 s; the median of the first three samples against
//!   the median of the last three, so one sample in a burst does not decide; no restart comes in the last
//!   warm-up + 60 s of the run, so the last lifetime is always long enough to judge).
//!
//! The seed fixes the chaos schedule (restart times and kinds, crash times, step durations);
//! which agent a crash hits depends on what is running at that moment, so two runs with one
//! seed are alike, not identical. All traffic stays on loopback; rivetd is killed at the end.

use crate::rivetd::{for_each_concurrent, locate, Admin, Rivetd, Settings};
use crate::sim::inventory;
use crate::stats::mib;
use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rivet_protocol::agent::{
    Command, CommandKind, CommandResult, CommandStatus, HeartbeatRequest, HeartbeatResponse,
    LookupRequest, LookupResponse, Progress, RunningCommand, HEARTBEAT_PATH, LOOKUP_PATH,
};
use rivet_protocol::deploy::{WriteImageResult, WRITE_IMAGE, WRITE_IMAGE_PRIORITY};
use rivet_protocol::steps::StepDescriptor;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Options of `rivet-bench soak`.
#[derive(Debug, Clone)]
pub struct SoakOpts {
    /// Minutes of chaos (the settle phase comes on top).
    pub minutes: f64,
    /// Nodes, one simulated agent each.
    pub agents: usize,
    /// RNG seed (default: from the clock; printed either way).
    pub seed: Option<u64>,
    /// rivetd binary (default: next to this one).
    pub rivetd: Option<PathBuf>,
    /// Keep the temporary directory (rivetd logs, rivet.db).
    pub keep: bool,
    /// Admin requests in flight during enrollment.
    pub concurrency: usize,
    /// Mean agent crashes per minute, fleet-wide.
    pub crashes_per_min: f64,
    /// Seconds between controller restarts, drawn uniformly from this range.
    pub restart_every_s: (u64, u64),
    /// Share of restarts that are SIGKILL (the rest SIGTERM), percent.
    pub sigkill_percent: u32,
    /// Duration of one agent step, milliseconds, drawn uniformly from this range.
    pub step_ms: (u64, u64),
    /// Seconds a node rests between operations, drawn uniformly from this range.
    pub idle_s: (u64, u64),
    /// Seconds after each rivetd start before its RSS counts as steady.
    pub rss_warmup_s: u64,
    /// Allowed RSS growth within one lifetime after the warm-up, percent.
    pub rss_limit_pct: f64,
    /// Upper bound of the settle phase, seconds.
    pub settle_s: u64,
    /// rivetd's `[agent] heartbeat_timeout_s`: how soon a crashed agent's node fails.
    pub heartbeat_timeout_s: u64,
}

/// Seconds a lifetime must be sampled after its warm-up to be judged.
const RSS_MIN_WINDOW_S: f64 = 60.0;
/// rivetd's long poll in the soak: short, so heartbeats are frequent.
const LONG_POLL_S: u64 = 5;
/// How long rivetd gets to exit after SIGTERM before it is killed.
const TERM_GRACE: Duration = Duration::from_secs(15);

/// What a simulated agent is doing, for the crash picker.
const IDLE: u8 = 0;
const TALKING: u8 = 1;
const RUNNING: u8 = 2;

/// One node as the soak sees it.
struct NodeCell {
    uuid: String,
    /// IDLE / TALKING / RUNNING.
    status: AtomicU8,
    /// The chaos asks this node's agent to crash at its next chance.
    crash: AtomicBool,
    /// An injected crash hit this node's agent since the last verb sent to it.
    crashed_in_op: AtomicBool,
    /// A lookup of this node's agent got no answer because rivetd went down while it was
    /// in flight, and the next lookup got no token (the lost answer carried it).
    lookup_lost_in_op: AtomicBool,
}

/// Counters of the run.
#[derive(Default)]
struct Stats {
    verbs: AtomicU64,
    deploys: AtomicU64,
    undeploys: AtomicU64,
    provides: AtomicU64,
    reached_active: AtomicU64,
    reached_available: AtomicU64,
    recoveries: AtomicU64,
    crashes: AtomicU64,
    commands: AtomicU64,
    steps: AtomicU64,
    duplicates: AtomicU64,
    redelivered: AtomicU64,
    explained_failures: AtomicU64,
    lost_token_failures: AtomicU64,
    lost_lookups: AtomicU64,
    api_5xx: AtomicU64,
    agent_5xx: AtomicU64,
    refused_verbs: AtomicU64,
}

/// One rivetd process's life and its RSS samples (seconds since the soak began, KiB).
struct Lifetime {
    pid: u32,
    started: Instant,
    ended_by: String,
    samples: Vec<(f64, u64)>,
}

/// The controller under test and its restarts.
struct Controller {
    exe: PathBuf,
    dir: PathBuf,
    db_url: String,
    port: u16,
    settings: Settings,
    proc: tokio::sync::Mutex<Option<Rivetd>>,
    /// The running rivetd's pid, 0 while it is down.
    pid: AtomicU32,
    lifetimes: Mutex<Vec<Lifetime>>,
    starts: AtomicU32,
}

impl Controller {
    /// Start rivetd (again) on the soak's port and database; each life logs to its own file.
    async fn start(&self) -> Result<()> {
        let n = self.starts.fetch_add(1, Ordering::SeqCst) + 1;
        let log = self.dir.join(format!("rivetd-{n:03}.log"));
        let mut last = None;
        for _ in 0..5 {
            match Rivetd::start_at(
                &self.exe,
                &self.dir,
                &self.db_url,
                None,
                self.port,
                &log,
                &self.settings,
            )
            .await
            {
                Ok(d) => {
                    let pid = d.pid();
                    *self.proc.lock().await = Some(d);
                    self.pid.store(pid, Ordering::SeqCst);
                    lock(&self.lifetimes).push(Lifetime {
                        pid,
                        started: Instant::now(),
                        ended_by: "still running at the end".into(),
                        samples: Vec::new(),
                    });
                    return Ok(());
                }
                Err(e) => {
                    // The old socket may linger for a moment after SIGKILL.
                    eprintln!("rivetd start #{n} failed, retrying: {e:#}");
                    last = Some(e);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("rivetd did not start")))
    }

    /// Stop the running rivetd: SIGKILL, or SIGTERM (SIGKILL after TERM_GRACE). What was done.
    async fn stop(&self, kill: bool) -> String {
        let mut guard = self.proc.lock().await;
        let Some(mut d) = guard.take() else {
            return "not running".into();
        };
        let pid = d.pid();
        self.pid.store(0, Ordering::SeqCst);
        let how = if kill {
            d.stop();
            "SIGKILL".to_string()
        } else {
            let t = Instant::now();
            if d.terminate(TERM_GRACE).await {
                format!("SIGTERM (exited in {:.1} s)", t.elapsed().as_secs_f64())
            } else {
                format!("SIGTERM, still running after {TERM_GRACE:?}: SIGKILL")
            }
        };
        if let Some(l) = lock(&self.lifetimes)
            .iter_mut()
            .rev()
            .find(|l| l.pid == pid)
        {
            l.ended_by = format!("ended by {how}");
        }
        how
    }

    /// One RSS sample of the running rivetd, once it is past its warm-up.
    fn sample(&self, t0: Instant, warmup: Duration) {
        let pid = self.pid.load(Ordering::SeqCst);
        if pid == 0 {
            return;
        }
        let Some(kib) = crate::procstat::vm_kib(pid, "VmRSS") else {
            return;
        };
        let mut lives = lock(&self.lifetimes);
        if let Some(l) = lives.last_mut().filter(|l| l.pid == pid) {
            if l.started.elapsed() >= warmup {
                l.samples.push((t0.elapsed().as_secs_f64(), kib));
            }
        }
    }
}

/// A std mutex's guard, poisoned or not (a panicking task must not hide the results).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Everything the tasks share.
struct World {
    url: String,
    agent_http: reqwest::Client,
    admin_http: reqwest::Client,
    nodes: Vec<NodeCell>,
    /// Chaos over: drivers start no new operation.
    stopping: AtomicBool,
    /// Settle deadline passed: every loop ends.
    halted: AtomicBool,
    /// Command id → (node, command name, executions), across every agent incarnation.
    ledger: Mutex<HashMap<String, (usize, &'static str, u32)>>,
    /// Violations seen during the run (unexplained failures, double executions).
    violations: Mutex<Vec<String>>,
    stats: Stats,
    opts: SoakOpts,
}

impl World {
    fn violation(&self, what: String) {
        eprintln!("VIOLATION: {what}");
        lock(&self.violations).push(what);
    }

    /// One admin call; `None` when rivetd did not answer (it may be restarting).
    async fn api(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Option<(u16, Value)> {
        let mut req = self
            .admin_http
            .request(method, format!("{}{path}", self.url))
            .header("X-OpenStack-Ironic-API-Version", "latest");
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.ok()?;
        let status = resp.status().as_u16();
        let text = resp.text().await.ok()?;
        if status >= 500 {
            // 503 while shutting down is expected; anything else is worth a look.
            if status != 503 && self.stats.api_5xx.fetch_add(1, Ordering::Relaxed) < 5 {
                eprintln!("admin API answered {status} to {path}: {text}");
            }
            return None;
        }
        Some((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    /// The node's provision state and last_error, retried while rivetd is down; `None` once
    /// the soak is halted.
    async fn state(&self, uuid: &str) -> Option<(String, String)> {
        let path = format!("/v1/nodes/{uuid}?fields=provision_state,last_error");
        loop {
            if self.halted.load(Ordering::SeqCst) {
                return None;
            }
            if let Some((200, v)) = self.api(reqwest::Method::GET, &path, None).await {
                return Some((
                    v["provision_state"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    v["last_error"].as_str().unwrap_or_default().to_string(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// States where a node rests and the driver may act.
fn resting(state: &str) -> bool {
    matches!(state, "available" | "active" | "manageable" | "enroll")
}

fn failed(state: &str) -> bool {
    state.ends_with("failed") || state == "error"
}

/// The text rivetd's periodic scan writes when an agent stops heartbeating.
const HEARTBEAT_TIMEOUT_TEXT: &str = "no heartbeat from the agent";

/// States in which the machine runs the ramdisk (the fake driver "boots" it).
fn expects_ramdisk(state: &str) -> bool {
    matches!(
        state,
        "cleaning" | "clean wait" | "deploying" | "wait call-back"
    )
}

/// An injected fault that explains a failed node.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// Its agent was crashed during the operation.
    AgentCrash,
    /// rivetd was stopped while answering the agent's lookup: the one token of the boot went
    /// with the answer, so no agent can take part and the heartbeat timeout must end it.
    LookupLost,
}

/// Which injected fault explains this failure, if one does.
fn explanation(cell: &NodeCell, last_error: &str) -> Option<Fault> {
    if !last_error.contains(HEARTBEAT_TIMEOUT_TEXT) {
        return None;
    }
    if cell.crashed_in_op.load(Ordering::SeqCst) {
        Some(Fault::AgentCrash)
    } else if cell.lookup_lost_in_op.load(Ordering::SeqCst) {
        Some(Fault::LookupLost)
    } else {
        None
    }
}

/// How one ramdisk boot's conversation ended.
enum End {
    /// The agent powered the machine off (deploy's tear_down_agent).
    PoweredOff,
    /// 401/404: the controller no longer accepts this token; look up again.
    Gone,
    /// The machine rebooted (a `reboot` command): a fresh ramdisk boot.
    Rebooted,
    /// The chaos crashed this agent process.
    Crashed,
    /// The soak is over.
    Halted,
}

/// What a lookup got.
enum Looked {
    /// 200 with this boot's token.
    Token(String),
    /// 200 without a token (it was handed out before).
    NoToken,
    /// 404: the node expects no ramdisk.
    NotExpected,
    /// Not handled (refused connection, or an error status): retry.
    Unreachable,
    /// Sent but unanswered: rivetd may have handled it before going down.
    Lost,
}

/// A step the agent is running.
struct Running {
    cmd: Command,
    done_at: Instant,
    started: Instant,
}

/// One agent process on one node (state lost when it crashes or the machine reboots).
struct Agent {
    index: usize,
    token: Option<String>,
    results: Vec<CommandResult>,
    seen: HashSet<String>,
    running: Option<Running>,
    /// A power_off was answered: the machine goes off once the result is delivered.
    powering_off: Option<String>,
    /// A reboot was answered: the machine reboots once the result is delivered.
    rebooting: Option<String>,
}

impl Agent {
    fn fresh(index: usize) -> Agent {
        Agent {
            index,
            token: None,
            results: Vec::new(),
            seen: HashSet::new(),
            running: None,
            powering_off: None,
            rebooting: None,
        }
    }

    /// `POST /agent/v1/lookup` by node UUID.
    async fn lookup(&self, w: &World) -> Looked {
        let req = LookupRequest {
            node_uuid: Some(w.nodes[self.index].uuid.clone()),
            agent_version: crate::sim::VERSION.into(),
            ..Default::default()
        };
        let resp = match w
            .agent_http
            .post(format!("{}{LOOKUP_PATH}", w.url))
            .timeout(Duration::from_secs(30))
            .json(&req)
            .send()
            .await
        {
            Ok(r) => r,
            // Refused: rivetd is down, nothing reached it.
            Err(e) if e.is_connect() => return Looked::Unreachable,
            // A hung rivetd is no injected fault: retry without explaining anything by it.
            Err(e) if e.is_timeout() => return Looked::Unreachable,
            // Sent, but no answer: rivetd may have handled it and died before answering.
            Err(_) => return Looked::Lost,
        };
        match resp.status().as_u16() {
            200 => match resp.json::<LookupResponse>().await {
                Ok(r) => match r.agent_token {
                    Some(t) => Looked::Token(t),
                    None => Looked::NoToken,
                },
                Err(_) => Looked::Lost,
            },
            404 => Looked::NotExpected,
            s => {
                if s >= 500 && s != 503 {
                    w.stats.agent_5xx.fetch_add(1, Ordering::Relaxed);
                }
                Looked::Unreachable
            }
        }
    }

    fn finish(&mut self, cmd: &Command, status: CommandStatus, result: Value) {
        self.results.push(CommandResult {
            id: cmd.id.clone(),
            name: cmd.kind.name().into(),
            status,
            result,
            error: None,
            log_tail: None,
        });
    }

    /// Take a command: skip a repeated id (as the real agent does), record an execution in
    /// the ledger, answer at once or start the step.
    fn handle(&mut self, w: &World, cmd: Command, rng: &mut StdRng) {
        if !self.seen.insert(cmd.id.clone()) {
            w.stats.redelivered.fetch_add(1, Ordering::Relaxed);
            return;
        }
        w.stats.commands.fetch_add(1, Ordering::Relaxed);
        let executions = {
            let mut l = lock(&w.ledger);
            let e = l
                .entry(cmd.id.clone())
                .or_insert((self.index, cmd.kind.name(), 0));
            e.2 += 1;
            e.2
        };
        if executions > 1 {
            w.stats.duplicates.fetch_add(1, Ordering::Relaxed);
            w.violation(format!(
                "command {} ({}) executed {executions} times on node {}",
                cmd.id,
                cmd.kind.name(),
                w.nodes[self.index].uuid
            ));
        }
        match &cmd.kind {
            CommandKind::GetInventory => {
                let inv = serde_json::to_value(inventory(self.index)).unwrap_or(Value::Null);
                self.finish(&cmd, CommandStatus::Succeeded, json!({ "inventory": inv }));
            }
            CommandKind::GetCleanSteps => {
                let steps = [
                    StepDescriptor::in_band("soak_wipe_a", 90),
                    StepDescriptor::in_band("soak_wipe_b", 80),
                ];
                self.finish(
                    &cmd,
                    CommandStatus::Succeeded,
                    json!({"clean_steps": steps, "hardware_manager_versions": {"soak": "1.0"}}),
                );
            }
            CommandKind::GetDeploySteps => {
                let steps = [StepDescriptor::in_band(WRITE_IMAGE, WRITE_IMAGE_PRIORITY)];
                self.finish(
                    &cmd,
                    CommandStatus::Succeeded,
                    json!({"deploy_steps": steps, "hardware_manager_versions": {"soak": "1.0"}}),
                );
            }
            CommandKind::ExecuteStep { .. } => {
                w.stats.steps.fetch_add(1, Ordering::Relaxed);
                let (lo, hi) = w.opts.step_ms;
                let ms = rng.gen_range(lo..=hi.max(lo));
                let now = Instant::now();
                self.running = Some(Running {
                    cmd,
                    done_at: now + Duration::from_millis(ms),
                    started: now,
                });
                w.nodes[self.index].status.store(RUNNING, Ordering::SeqCst);
            }
            CommandKind::Abort { command_id } => {
                if let Some(r) = self.running.take_if(|r| &r.cmd.id == command_id) {
                    self.results.push(CommandResult {
                        id: r.cmd.id.clone(),
                        name: r.cmd.kind.name().into(),
                        status: CommandStatus::Aborted,
                        result: Value::Null,
                        error: Some("aborted".into()),
                        log_tail: None,
                    });
                    w.nodes[self.index].status.store(TALKING, Ordering::SeqCst);
                }
                self.finish(&cmd, CommandStatus::Succeeded, json!({}));
            }
            CommandKind::PowerOff => {
                self.powering_off = Some(cmd.id.clone());
                self.finish(
                    &cmd,
                    CommandStatus::Succeeded,
                    json!({"done": true, "message": "power off in progress"}),
                );
            }
            CommandKind::Reboot => {
                self.rebooting = Some(cmd.id.clone());
                self.finish(
                    &cmd,
                    CommandStatus::Succeeded,
                    json!({"done": true, "message": "reboot in progress"}),
                );
            }
            CommandKind::FinalizeRescue { .. } => {
                self.finish(&cmd, CommandStatus::Succeeded, json!({}));
            }
        }
    }

    /// The running step finished: its result.
    fn complete_step(&mut self, w: &World) {
        let Some(r) = self.running.take() else { return };
        let result = match &r.cmd.kind {
            CommandKind::ExecuteStep { step, .. } if step == WRITE_IMAGE => {
                serde_json::to_value(WriteImageResult {
                    device: "/dev/nvme0n1".into(),
                    chosen_by: "smallest disk of at least 4 GiB".into(),
                    format: "raw".into(),
                    compression: None,
                    image_bytes: 1 << 30,
                    virtual_size: 1 << 30,
                    hash_algo: "sha256".into(),
                    hash_value: SOAK_IMAGE_SHA256.into(),
                    configdrive_partition: None,
                    seconds: r.started.elapsed().as_secs_f64(),
                    uefi_boot_entry: None,
                })
                .unwrap_or(Value::Null)
            }
            _ => json!({}),
        };
        self.finish(&r.cmd, CommandStatus::Succeeded, result);
        w.nodes[self.index].status.store(TALKING, Ordering::SeqCst);
    }

    /// Heartbeat until the conversation ends. Idle: long polls; running a step: a short
    /// heartbeat every second with the step reported as running, the result sent as soon
    /// as the step is done.
    async fn converse(&mut self, w: &World, rng: &mut StdRng) -> End {
        let cell = &w.nodes[self.index];
        let mut delivered_off = 0u32;
        loop {
            if w.halted.load(Ordering::SeqCst) {
                return End::Halted;
            }
            if cell.crash.swap(false, Ordering::SeqCst) && !w.stopping.load(Ordering::SeqCst) {
                return End::Crashed;
            }
            if self
                .running
                .as_ref()
                .is_some_and(|r| Instant::now() >= r.done_at)
            {
                self.complete_step(w);
            }
            let running = self.running.as_ref().map(|r| RunningCommand {
                id: r.cmd.id.clone(),
                name: r.cmd.kind.name().into(),
                step: match &r.cmd.kind {
                    CommandKind::ExecuteStep { step, .. } => Some(step.clone()),
                    _ => None,
                },
                progress: Some(Progress {
                    done: r.started.elapsed().as_millis() as u64,
                    total: r
                        .done_at
                        .saturating_duration_since(r.started)
                        .as_millis()
                        .max(1) as u64,
                    message: "soak step".into(),
                    rate: None,
                }),
            });
            let wait = running.is_none() && self.results.is_empty();
            let req = HeartbeatRequest {
                agent_version: crate::sim::VERSION.into(),
                running,
                results: self.results.clone(),
                wait,
                boot_id: None,
            };
            let timeout = Duration::from_secs(if wait { LONG_POLL_S + 15 } else { 15 });
            let sent = w
                .agent_http
                .post(format!("{}{HEARTBEAT_PATH}/{}", w.url, cell.uuid))
                .bearer_auth(self.token.as_deref().unwrap_or_default())
                .timeout(timeout)
                .json(&req)
                .send()
                .await;
            let resp = match sent {
                Ok(r) => r,
                Err(_) => {
                    // rivetd is down (restarting): retry, as the real agent does.
                    tokio::time::sleep(Duration::from_millis(rng.gen_range(500..1500))).await;
                    continue;
                }
            };
            match resp.status().as_u16() {
                200 => {}
                401 | 404 => {
                    if self.powering_off.is_some() {
                        return End::PoweredOff;
                    }
                    return End::Gone;
                }
                s => {
                    if s >= 500 && s != 503 {
                        w.stats.agent_5xx.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            }
            let answer: HeartbeatResponse = match resp.json().await {
                Ok(a) => a,
                Err(_) => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            self.results.retain(|r| !answer.acks.contains(&r.id));
            if let Some(id) = &self.powering_off {
                // The machine goes off once the controller has the answer (or soon anyway:
                // the real ramdisk does not wait for ever).
                delivered_off += 1;
                if answer.acks.contains(id) || delivered_off > 5 {
                    return End::PoweredOff;
                }
            }
            if let Some(id) = &self.rebooting {
                if answer.acks.contains(id) {
                    return End::Rebooted;
                }
            }
            if let Some(cmd) = answer.command {
                self.handle(w, cmd, rng);
            }
            if let Some(r) = &self.running {
                let left = r.done_at.saturating_duration_since(Instant::now());
                tokio::time::sleep(left.min(Duration::from_secs(1))).await;
            }
        }
    }
}

/// Digest the soak's instance_info declares (the image is never downloaded).
const SOAK_IMAGE_SHA256: &str = "5e0f4a1c6a9cf1a4d1b0a3d6a9f0b7c2e8d1f3a5b7c9d0e2f4a6b8c0d2e4f6a8";

/// The real agent's lookup backoff (1 s doubling to 30 s, equal jitter).
fn backoff(attempt: u32, rng: &mut StdRng) -> Duration {
    let nominal = (1u64 << attempt.min(5)).min(30) as f64;
    Duration::from_secs_f64(nominal * rng.gen_range(0.5..1.0))
}

/// How a node's ramdisk boots ended.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ramdisk {
    /// The agent powered the machine off (the deploy's tear_down_agent): no ramdisk until
    /// the next operation.
    PoweredOff,
    /// The node no longer expects a ramdisk, or the soak is over.
    Done,
}

/// One ramdisk boot on node `i` (and the boots after it: a crash restarts the agent process,
/// a reboot the machine) until the node expects no ramdisk any more.
async fn ramdisk(w: &World, i: usize, rng: &mut StdRng) -> Ramdisk {
    let cell = &w.nodes[i];
    tokio::time::sleep(Duration::from_millis(rng.gen_range(200..1500))).await;
    let mut agent = Agent::fresh(i);
    let (mut had_token, mut restarted, mut lost) = (false, false, false);
    let (mut not_found, mut no_token) = (0u32, 0u32);
    let mut how = Ramdisk::Done;
    loop {
        if w.halted.load(Ordering::SeqCst) {
            break;
        }
        match agent.lookup(w).await {
            Looked::Unreachable => {
                tokio::time::sleep(Duration::from_millis(rng.gen_range(500..1500))).await;
                continue;
            }
            Looked::Lost => {
                lost = true;
                tokio::time::sleep(Duration::from_millis(rng.gen_range(500..1500))).await;
                continue;
            }
            Looked::NotExpected => {
                // Not expected (yet, or any more).
                if had_token || restarted {
                    break;
                }
                not_found += 1;
                if not_found.is_multiple_of(5) {
                    match w.state(&cell.uuid).await {
                        Some((s, _)) if !expects_ramdisk(&s) => break,
                        None => break,
                        _ => {}
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Looked::Token(t) => {
                agent.token = Some(t);
                had_token = true;
                no_token = 0;
            }
            Looked::NoToken if agent.token.is_some() => {}
            Looked::NoToken => {
                if lost && !restarted && no_token == 0 {
                    // The answer rivetd never sent carried this boot's only token.
                    w.stats.lost_lookups.fetch_add(1, Ordering::Relaxed);
                    cell.lookup_lost_in_op.store(true, Ordering::SeqCst);
                }
                // No token and none to be had (one per boot): the real agent retries its
                // lookup with backoff until the controller lets the node go.
                tokio::time::sleep(backoff(no_token, rng)).await;
                no_token += 1;
                continue;
            }
        }
        cell.status.store(TALKING, Ordering::SeqCst);
        let end = agent.converse(w, rng).await;
        cell.status.store(IDLE, Ordering::SeqCst);
        match end {
            End::PoweredOff => {
                how = Ramdisk::PoweredOff;
                break;
            }
            End::Halted => break,
            End::Gone => tokio::time::sleep(Duration::from_millis(500)).await,
            End::Rebooted => {
                agent = Agent::fresh(i);
                tokio::time::sleep(Duration::from_millis(rng.gen_range(200..1500))).await;
            }
            End::Crashed => {
                w.stats.crashes.fetch_add(1, Ordering::Relaxed);
                cell.crashed_in_op.store(true, Ordering::SeqCst);
                // Gone with its results and token; a new process starts a little later.
                agent = Agent::fresh(i);
                restarted = true;
                tokio::time::sleep(Duration::from_millis(rng.gen_range(1000..3000))).await;
            }
        }
    }
    cell.status.store(IDLE, Ordering::SeqCst);
    how
}

/// The message of an Ironic error body (its `error_message` holds JSON with `faultstring`).
fn fault_text(v: &Value) -> String {
    let raw = v["error_message"].as_str().unwrap_or_default();
    serde_json::from_str::<Value>(raw)
        .ok()
        .and_then(|v| v["faultstring"].as_str().map(str::to_string))
        .unwrap_or_else(|| raw.to_string())
}

/// PUT a provision verb. `true` when accepted.
async fn verb(w: &World, uuid: &str, target: &str) -> bool {
    let path = format!("/v1/nodes/{uuid}/states/provision");
    match w
        .api(
            reqwest::Method::PUT,
            &path,
            Some(json!({ "target": target })),
        )
        .await
    {
        Some((202, _)) => true,
        Some((s, v)) => {
            if w.stats.refused_verbs.fetch_add(1, Ordering::Relaxed) < 5 {
                eprintln!("{target} on {uuid} refused ({s}): {}", fault_text(&v));
            }
            false
        }
        None => false,
    }
}

/// The operator and machine of node `i`: act on its resting state, boot the ramdisk when
/// the verb needs one, wait for the operation to end; until the chaos is over.
async fn drive(w: Arc<World>, i: usize, mut rng: StdRng) {
    let cell = &w.nodes[i];
    let uuid = cell.uuid.clone();
    let (lo, hi) = w.opts.idle_s;
    tokio::time::sleep(Duration::from_secs_f64(
        rng.gen_range(0.0..=hi.max(1) as f64),
    ))
    .await;
    let mut last_failure: Option<String> = None;
    // An operation was started (or may have been: a verb whose answer was lost).
    let mut in_op = false;
    // The ramdisk powered the machine off (deploy): the rest of the deploy needs none.
    let mut powered_off = false;
    loop {
        let Some((state, last_error)) = w.state(&uuid).await else {
            return;
        };
        if expects_ramdisk(&state) && !powered_off {
            // Whoever started it (this driver, or a verb whose answer a restart lost, or a
            // restarted rivetd resuming the operation), the machine boots the ramdisk.
            in_op = true;
            powered_off = ramdisk(&w, i, &mut rng).await == Ramdisk::PoweredOff;
            continue;
        }
        if !(resting(&state) || failed(&state)) {
            tokio::time::sleep(Duration::from_millis(rng.gen_range(500..1500))).await;
            continue;
        }
        if in_op {
            in_op = false;
            match state.as_str() {
                "active" => w.stats.reached_active.fetch_add(1, Ordering::Relaxed),
                "available" => w.stats.reached_available.fetch_add(1, Ordering::Relaxed),
                _ => 0,
            };
            if resting(&state) && !w.stopping.load(Ordering::SeqCst) {
                let idle = rng.gen_range(lo as f64..=hi.max(lo) as f64);
                tokio::time::sleep(Duration::from_secs_f64(idle)).await;
                continue;
            }
        }
        let stopping = w.stopping.load(Ordering::SeqCst);
        let target = match state.as_str() {
            "available" if !stopping => "active",
            "active" if !stopping => "deleted",
            "manageable" if !stopping => "provide",
            "enroll" => "manage",
            s if failed(s) => {
                let key = format!("{s}: {last_error}");
                if last_failure.as_deref() != Some(key.as_str()) {
                    match explanation(cell, &last_error) {
                        Some(_) if stopping => {}
                        Some(Fault::AgentCrash) => {
                            w.stats.explained_failures.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(Fault::LookupLost) => {
                            w.stats.lost_token_failures.fetch_add(1, Ordering::Relaxed);
                        }
                        None => w.violation(format!(
                            "node {uuid} in {s} without an injected fault to explain it: {last_error}"
                        )),
                    }
                    last_failure = Some(key);
                }
                if stopping {
                    return;
                }
                match s {
                    "clean failed" => "manage",
                    "deploy failed" => "deleted",
                    _ => return,
                }
            }
            _ => return,
        };
        if target == "active" {
            let body = json!([
                {"op": "add", "path": "/instance_info/image_source", "value": "http://127.0.0.1:9/soak.img"},
                {"op": "add", "path": "/instance_info/image_os_hash_algo", "value": "sha256"},
                {"op": "add", "path": "/instance_info/image_os_hash_value", "value": SOAK_IMAGE_SHA256},
            ]);
            match w
                .api(
                    reqwest::Method::PATCH,
                    &format!("/v1/nodes/{uuid}"),
                    Some(body),
                )
                .await
            {
                Some((200, _)) => {}
                _ => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            }
        }
        cell.crashed_in_op.store(false, Ordering::SeqCst);
        cell.lookup_lost_in_op.store(false, Ordering::SeqCst);
        in_op = true;
        powered_off = false;
        if !verb(&w, &uuid, target).await {
            tokio::time::sleep(Duration::from_millis(rng.gen_range(500..1500))).await;
            continue;
        }
        w.stats.verbs.fetch_add(1, Ordering::Relaxed);
        match (state.as_str(), target) {
            (_, "active") => &w.stats.deploys,
            ("active", "deleted") => &w.stats.undeploys,
            ("manageable", "provide") => &w.stats.provides,
            _ => &w.stats.recoveries,
        }
        .fetch_add(1, Ordering::Relaxed);
    }
}

/// Crash an agent at random moments (exponential gaps), preferring one running a step.
async fn crash_agents(w: Arc<World>, mut rng: StdRng, until: Instant) {
    if w.opts.crashes_per_min <= 0.0 {
        return;
    }
    let mean = 60.0 / w.opts.crashes_per_min;
    loop {
        let gap = -mean * (1.0 - rng.gen::<f64>()).ln();
        let at = Instant::now() + Duration::from_secs_f64(gap);
        if at >= until {
            return;
        }
        tokio::time::sleep_until(at.into()).await;
        let pick = |want: u8| -> Vec<usize> {
            w.nodes
                .iter()
                .enumerate()
                .filter(|(_, n)| {
                    n.status.load(Ordering::SeqCst) == want && !n.crash.load(Ordering::SeqCst)
                })
                .map(|(i, _)| i)
                .collect()
        };
        let mut candidates = pick(RUNNING);
        if candidates.is_empty() {
            candidates = pick(TALKING);
        }
        if !candidates.is_empty() {
            let i = candidates[rng.gen_range(0..candidates.len())];
            w.nodes[i].crash.store(true, Ordering::SeqCst);
        }
    }
}

/// Restart rivetd at random intervals until `until`; the restarts done.
async fn restart_controller(
    c: Arc<Controller>,
    opts: SoakOpts,
    mut rng: StdRng,
    until: Instant,
) -> Result<Vec<String>> {
    let mut done = Vec::new();
    let (lo, hi) = opts.restart_every_s;
    if hi == 0 {
        return Ok(done);
    }
    loop {
        let gap = Duration::from_secs(rng.gen_range(lo.max(1)..=hi.max(lo.max(1))));
        let at = Instant::now() + gap;
        if at >= until {
            return Ok(done);
        }
        tokio::time::sleep_until(at.into()).await;
        let kill = rng.gen_range(0..100) < opts.sigkill_percent;
        let how = c.stop(kill).await;
        let down = Duration::from_millis(rng.gen_range(300..3000));
        tokio::time::sleep(down).await;
        let t = Instant::now();
        c.start().await?;
        let line = format!(
            "{how}; down {:.1} s, new rivetd answering {:.1} s after start",
            down.as_secs_f64(),
            t.elapsed().as_secs_f64()
        );
        eprintln!("restart {}: {line}", done.len() + 1);
        done.push(line);
    }
}

/// Every node's uuid, state and last_error (paged listing).
async fn all_nodes(w: &World) -> Result<Vec<(String, String, String)>> {
    let mut out = Vec::new();
    let mut marker = String::new();
    for _ in 0..10_000 {
        let mut path = "/v1/nodes?fields=uuid,provision_state,last_error&limit=1000".to_string();
        if !marker.is_empty() {
            path.push_str(&format!("&marker={marker}"));
        }
        let Some((200, v)) = w.api(reqwest::Method::GET, &path, None).await else {
            bail!("node listing failed at the end");
        };
        let page = v["nodes"].as_array().cloned().unwrap_or_default();
        for n in &page {
            let s = |k: &str| n[k].as_str().unwrap_or_default().to_string();
            out.push((s("uuid"), s("provision_state"), s("last_error")));
        }
        match page.last().and_then(|p| p["uuid"].as_str()) {
            Some(u) if page.len() == 1000 => marker = u.to_string(),
            _ => return Ok(out),
        }
    }
    bail!("node listing did not end")
}

/// One RSS sample: seconds since the soak began, KiB.
type Sample = (f64, u64);

/// Samples on each side of a lifetime's window whose median stands for that side.
const RSS_SIDE_SAMPLES: usize = 3;

/// The median of up to [`RSS_SIDE_SAMPLES`] samples by RSS (the middle one's time). One sample
/// taken in a burst (a settle phase that re-sends every command at once) is allocator
/// high-water, not a leak; a leak lifts all three.
fn side_median(side: &[Sample]) -> Option<Sample> {
    let mut v = side.to_vec();
    v.sort_by_key(|s| s.1);
    v.get(v.len() / 2).copied()
}

/// Per lifetime: (steady start, end, judged). Start and end are the medians of the first and
/// last [`RSS_SIDE_SAMPLES`] samples after the warm-up; judged when they are at least
/// [`RSS_MIN_WINDOW_S`] apart.
fn rss_verdicts(lives: &[Lifetime]) -> Vec<(Option<Sample>, Option<Sample>, bool)> {
    lives
        .iter()
        .map(|l| {
            let n = l.samples.len();
            let k = RSS_SIDE_SAMPLES.min(n / 2).max(1);
            let first = side_median(&l.samples[..k.min(n)]);
            let last = side_median(&l.samples[n.saturating_sub(k)..]);
            let judged =
                matches!((first, last), (Some(a), Some(b)) if b.0 - a.0 >= RSS_MIN_WINDOW_S);
            (first, last, judged)
        })
        .collect()
}

/// `rivet-bench soak`.
pub async fn run(o: SoakOpts) -> Result<Vec<String>> {
    let seed = o.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    eprintln!(
        "soak: seed {seed} (rerun with --seed {seed}), {} agents, {} min of chaos",
        o.agents, o.minutes
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let exe = locate(o.rivetd.as_deref())?;
    let dir = tempfile::Builder::new().prefix("rivet-soak-").tempdir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("probing a free port")?
        .port();
    let settings = Settings {
        long_poll_s: LONG_POLL_S,
        heartbeat_timeout_s: o.heartbeat_timeout_s,
        check_interval_s: 2,
        ..Default::default()
    };
    let c = Arc::new(Controller {
        exe,
        dir: dir.path().to_path_buf(),
        db_url: format!("sqlite:{}", dir.path().join("rivet.db").display()),
        port,
        settings,
        proc: tokio::sync::Mutex::new(None),
        pid: AtomicU32::new(0),
        lifetimes: Mutex::new(Vec::new()),
        starts: AtomicU32::new(0),
    });
    let result = soak(&o, seed, &mut rng, c.clone(), dir.path()).await;
    c.stop(true).await;
    if o.keep {
        eprintln!(
            "kept {} (rivetd-NNN.log per start, rivet.db)",
            dir.keep().display()
        );
    }
    result
}

async fn soak(
    o: &SoakOpts,
    seed: u64,
    rng: &mut StdRng,
    c: Arc<Controller>,
    dir: &Path,
) -> Result<Vec<String>> {
    let load_start = crate::procstat::loadavg();
    c.start().await?;
    let url = format!("http://127.0.0.1:{}", c.port);
    let admin = Admin::new(&url)?;
    let t = Instant::now();
    let a = admin.clone();
    let uuids = for_each_concurrent(o.agents, o.concurrency, move |i| {
        let a = a.clone();
        async move {
            let u = a.create_node(&format!("soak-{i:06}")).await?;
            a.provision(&u, "manage").await?;
            a.wait_state(
                &u,
                "manageable",
                Duration::from_millis(50),
                Duration::from_secs(600),
            )
            .await?;
            Ok(u)
        }
    })
    .await?;
    eprintln!(
        "enrolled {} nodes to manageable in {:.1} s",
        uuids.len(),
        t.elapsed().as_secs_f64()
    );
    let w = Arc::new(World {
        url: url.clone(),
        agent_http: reqwest::Client::builder()
            .pool_max_idle_per_host(usize::MAX)
            .tcp_nodelay(true)
            .build()?,
        admin_http: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(256)
            .build()?,
        nodes: uuids
            .into_iter()
            .map(|uuid| NodeCell {
                uuid,
                status: AtomicU8::new(IDLE),
                crash: AtomicBool::new(false),
                crashed_in_op: AtomicBool::new(false),
                lookup_lost_in_op: AtomicBool::new(false),
            })
            .collect(),
        stopping: AtomicBool::new(false),
        halted: AtomicBool::new(false),
        ledger: Mutex::new(HashMap::new()),
        violations: Mutex::new(Vec::new()),
        stats: Stats::default(),
        opts: o.clone(),
    });

    // The loop starts now: the first lifetime's warm-up counts from here, not from before
    // the enrollment.
    let t0 = Instant::now();
    if let Some(l) = lock(&c.lifetimes).last_mut() {
        l.started = t0;
    }
    let chaos_end = t0 + Duration::from_secs_f64(o.minutes * 60.0);
    // The last restart leaves the final lifetime its warm-up and a judged window.
    let restarts_until = chaos_end
        .checked_sub(
            Duration::from_secs(o.rss_warmup_s) + Duration::from_secs_f64(RSS_MIN_WINDOW_S),
        )
        .unwrap_or(t0);
    let mut drivers = tokio::task::JoinSet::new();
    for i in 0..w.nodes.len() {
        drivers.spawn(drive(
            w.clone(),
            i,
            StdRng::seed_from_u64(seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        ));
    }
    let crasher = tokio::spawn(crash_agents(
        w.clone(),
        StdRng::seed_from_u64(rng.gen()),
        chaos_end,
    ));
    let restarter = tokio::spawn(restart_controller(
        c.clone(),
        o.clone(),
        StdRng::seed_from_u64(rng.gen()),
        restarts_until,
    ));
    let warmup = Duration::from_secs(o.rss_warmup_s);
    let sampler = {
        let (c, w) = (c.clone(), w.clone());
        tokio::spawn(async move {
            let mut tick = 0u64;
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                c.sample(t0, warmup);
                tick += 1;
                if tick.is_multiple_of(6) {
                    let s = &w.stats;
                    eprintln!(
                        "  {:>5.0} s: {} operations ({} deploys, {} undeploys), {} steps, {} agent crashes, {} rivetd starts, RSS {}",
                        t0.elapsed().as_secs_f64(),
                        s.verbs.load(Ordering::Relaxed),
                        s.deploys.load(Ordering::Relaxed),
                        s.undeploys.load(Ordering::Relaxed),
                        s.steps.load(Ordering::Relaxed),
                        s.crashes.load(Ordering::Relaxed),
                        c.starts.load(Ordering::Relaxed),
                        mib(crate::procstat::vm_kib(c.pid.load(Ordering::SeqCst), "VmRSS").unwrap_or(0)),
                    );
                }
            }
        })
    };

    tokio::time::sleep_until(chaos_end.into()).await;
    let _ = crasher.await;
    let restarts = match restarter.await {
        Ok(r) => r?,
        Err(e) => bail!("restart task: {e}"),
    };
    w.stopping.store(true, Ordering::SeqCst);
    for n in &w.nodes {
        n.crash.store(false, Ordering::SeqCst);
    }
    eprintln!(
        "chaos over after {:.0} s; settling (at most {} s)",
        t0.elapsed().as_secs_f64(),
        o.settle_s
    );
    let settle_t = Instant::now();
    let settle_deadline = settle_t + Duration::from_secs(o.settle_s);
    let mut busy = drivers.len();
    while busy > 0 {
        match tokio::time::timeout_at(settle_deadline.into(), drivers.join_next()).await {
            Ok(Some(_)) => busy -= 1,
            Ok(None) => break,
            Err(_) => break,
        }
    }
    w.halted.store(true, Ordering::SeqCst);
    drivers.abort_all();
    let settled_in = settle_t.elapsed();
    c.sample(t0, warmup);
    sampler.abort();

    // The checks.
    let nodes = all_nodes(&w).await?;
    let mut by_state: BTreeMap<String, usize> = BTreeMap::new();
    let mut failed_explained = 0usize;
    let mut failed_lost_token = 0usize;
    let mut bad: Vec<String> = Vec::new();
    let index: HashMap<&str, &NodeCell> = w.nodes.iter().map(|n| (n.uuid.as_str(), n)).collect();
    for (uuid, state, err) in &nodes {
        *by_state.entry(state.clone()).or_default() += 1;
        if matches!(state.as_str(), "available" | "active" | "manageable") {
            continue;
        }
        match index.get(uuid.as_str()).and_then(|c| explanation(c, err)) {
            Some(Fault::AgentCrash) if failed(state) => {
                failed_explained += 1;
                continue;
            }
            Some(Fault::LookupLost) if failed(state) => {
                failed_lost_token += 1;
                continue;
            }
            _ => {}
        }
        bad.push(format!("node {uuid} in {state}: {err}"));
    }
    let run_violations = lock(&w.violations).clone();
    let lives = lock(&c.lifetimes);
    let verdicts = rss_verdicts(&lives);
    let mut rss_bad = Vec::new();
    let mut rss_rows = Vec::new();
    let mut worst: Option<f64> = None;
    for (k, (l, (first, last, judged))) in lives.iter().zip(&verdicts).enumerate() {
        let growth = match (first, last) {
            (Some(a), Some(b)) if a.1 > 0 => Some((b.1 as f64 / a.1 as f64 - 1.0) * 100.0),
            _ => None,
        };
        let text = match (first, last, growth) {
            (Some(a), Some(b), Some(g)) => format!(
                "{} at {:.0} s → {} at {:.0} s ({g:+.1} %){}",
                mib(a.1),
                a.0,
                mib(b.1),
                b.0,
                if *judged {
                    ""
                } else {
                    ", window too short to judge"
                }
            ),
            _ => "no sample after the warm-up (restarted before)".into(),
        };
        if *judged {
            if let Some(g) = growth {
                worst = Some(worst.map_or(g, |w: f64| w.max(g)));
                if g > o.rss_limit_pct {
                    let series: Vec<String> = l
                        .samples
                        .iter()
                        .map(|(t, kib)| format!("{t:.0} s {}", mib(*kib)))
                        .collect();
                    rss_bad.push(format!(
                        "rivetd life {} grew {g:.1} % (limit {} %); its samples: {}",
                        k + 1,
                        o.rss_limit_pct,
                        series.join(", ")
                    ));
                }
            }
        }
        rss_rows.push(format!(
            "| rivetd life {} (pid {}) | {text}; {} |",
            k + 1,
            l.pid,
            l.ended_by
        ));
    }
    if !verdicts.iter().any(|v| v.2) {
        rss_bad.push(format!(
            "no rivetd lifetime was sampled for {RSS_MIN_WINDOW_S} s after its {} s warm-up: RSS growth not checked",
            o.rss_warmup_s
        ));
    }
    drop(lives);

    let s = &w.stats;
    let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let kills = restarts.iter().filter(|r| r.starts_with("SIGKILL")).count();
    let escalated = restarts.iter().filter(|r| r.contains(": SIGKILL")).count();
    let resting_text = ["available", "active", "manageable"]
        .iter()
        .map(|k| format!("{} {k}", by_state.get(*k).copied().unwrap_or(0)))
        .collect::<Vec<_>>()
        .join(", ");
    let ledger_len = lock(&w.ledger).len();
    println!("| Soak check | Result |");
    println!("|---|---|");
    println!("| seed | {seed} |");
    println!(
        "| machine | load average {load_start:.2} at the start, {:.2} at the end; {} CPUs |",
        crate::procstat::loadavg(),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    println!(
        "| run | {} agents, {:.1} min of chaos, settled in {:.0} s (limit {} s) |",
        nodes.len(),
        o.minutes,
        settled_in.as_secs_f64(),
        o.settle_s
    );
    println!(
        "| operations | {} verbs: {} provides, {} deploys ({} reached active), {} undeploys, {} recoveries of failed nodes; {} reached available |",
        g(&s.verbs), g(&s.provides), g(&s.deploys), g(&s.reached_active), g(&s.undeploys), g(&s.recoveries), g(&s.reached_available)
    );
    println!(
        "| faults injected | {} agent crashes; {} rivetd restarts ({} SIGKILL, {} SIGTERM of which {} needed SIGKILL after {:?}) |",
        g(&s.crashes), restarts.len(), kills, restarts.len() - kills, escalated, TERM_GRACE
    );
    println!(
        "| nodes at the end | {resting_text}; {failed_explained} failed by an injected agent crash, {failed_lost_token} by a lookup answer lost to a rivetd stop; {} not resting or unexplained {} |",
        bad.len(),
        if bad.is_empty() { "✓" } else { "✗" }
    );
    println!(
        "| failures during the run | {} after an injected agent crash, {} after a lookup answer lost to a rivetd stop ({} lookups lost), all recovered; {} unexplained {} |",
        g(&s.explained_failures),
        g(&s.lost_token_failures),
        g(&s.lost_lookups),
        run_violations.iter().filter(|v| v.contains("without an injected")).count(),
        if run_violations.is_empty() { "✓" } else { "✗" }
    );
    println!(
        "| agent ledger | {} commands executed ({} steps, {} distinct ids); {} executed twice {}; {} re-deliveries of a seen id skipped by the agent |",
        g(&s.commands), g(&s.steps), ledger_len, g(&s.duplicates),
        if g(&s.duplicates) == 0 { "✓" } else { "✗" },
        g(&s.redelivered)
    );
    for r in &rss_rows {
        println!("{r}");
    }
    println!(
        "| rivetd RSS | worst growth within a judged lifetime {} (limit {} % after {} s warm-up) {} |",
        worst.map(|g| format!("{g:+.1} %")).unwrap_or_else(|| "n/a".into()),
        o.rss_limit_pct,
        o.rss_warmup_s,
        if rss_bad.is_empty() { "✓" } else { "✗" }
    );
    println!(
        "| other | {} admin API 5xx (not 503), {} agent API 5xx, {} verbs refused (node busy or changed; retried) |",
        g(&s.api_5xx), g(&s.agent_5xx), g(&s.refused_verbs)
    );
    let all_bad: Vec<String> = run_violations
        .into_iter()
        .chain(bad)
        .chain(rss_bad)
        .collect();
    if !all_bad.is_empty() {
        eprintln!("{} violations (first 20):", all_bad.len());
        for v in all_bad.iter().take(20) {
            eprintln!("  {v}");
        }
        bail!(
            "soak failed: {} violations (seed {seed}); rivetd logs in {}{}",
            all_bad.len(),
            dir.display(),
            if o.keep {
                ""
            } else {
                " (pass --keep to keep them)"
            }
        );
    }
    let row = format!(
        "| soak: {} agents cycling clean → deploy → undeploy for {:.0} min with {} agent crashes and {} rivetd restarts ({} SIGKILL) | {} operations, {} steps, 0 executed twice; all nodes resting at the end ({resting_text}, {failed_explained} failed by an injected agent crash, {failed_lost_token} by a lookup answer lost to a rivetd stop); rivetd RSS worst growth {} within a lifetime after {} s warm-up | `rivet-bench soak --minutes {} --agents {} --seed {seed} --crashes-per-min {} --restart-every-s {},{} --sigkill-percent {}` |",
        nodes.len(),
        o.minutes,
        g(&s.crashes),
        restarts.len(),
        kills,
        g(&s.verbs),
        g(&s.steps),
        worst.map(|g| format!("{g:+.1} %")).unwrap_or_else(|| "n/a".into()),
        o.rss_warmup_s,
        o.minutes,
        nodes.len(),
        o.crashes_per_min,
        o.restart_every_s.0,
        o.restart_every_s.1,
        o.sigkill_percent,
    );
    Ok(vec![row])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn life(samples: &[(f64, u64)]) -> Lifetime {
        Lifetime {
            pid: 1,
            started: Instant::now(),
            ended_by: String::new(),
            samples: samples.to_vec(),
        }
    }

    fn growth(samples: &[(f64, u64)]) -> (f64, bool) {
        let v = rss_verdicts(&[life(samples)]);
        let (a, b, judged) = v[0];
        let (a, b) = (a.expect("start"), b.expect("end"));
        ((b.1 as f64 / a.1 as f64 - 1.0) * 100.0, judged)
    }

    #[test]
    fn one_sample_in_a_burst_does_not_decide() {
        let mut s: Vec<(f64, u64)> = (0..18).map(|i| (60.0 + 5.0 * i as f64, 63_000)).collect();
        s.push((150.0, 76_000));
        let (g, judged) = growth(&s);
        assert!(judged);
        assert!(g.abs() < 1.0, "{g}");
    }

    #[test]
    fn a_steady_leak_shows() {
        let s: Vec<(f64, u64)> = (0..18)
            .map(|i| (60.0 + 5.0 * i as f64, 60_000 + 1_000 * i))
            .collect();
        let (g, judged) = growth(&s);
        assert!(judged);
        assert!(g > 20.0, "{g}");
    }

    #[test]
    fn a_short_window_is_not_judged() {
        let s = [(60.0, 60_000), (65.0, 61_000), (70.0, 90_000)];
        assert!(!growth(&s).1);
        assert_eq!(rss_verdicts(&[life(&[])])[0], (None, None, false));
    }
}
