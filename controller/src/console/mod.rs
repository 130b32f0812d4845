//! The console hub: rivetd holds the one Serial-over-LAN session of each node whose
//! `ipmitool-socat` console is enabled, and fans its output out to every viewer — the raw TCP
//! listener of `console_info.url` and the WebSocket (`api/console_ws.rs`) — while capturing
//! all of it to a bounded per-node file.
//!
//! - `session.rs`: the SOL child, reconnects, fan-out, the input queue;
//! - `tcp.rs`: the raw TCP viewers; `pen.rs`: who may type; `tickets.rs`: WebSocket tickets;
//! - `capture.rs`: the bounded log on disk; `ports.rs`: the TCP port of each console;
//! - `record.rs`: history, `last_error` and audit rows.
//!
//! Each session runs as a supervised task: a panic in it is logged, written to the node's
//! history and the session is started again after [`RESTART_AFTER_PANIC`]; a session whose
//! node is gone or whose flag another rivetd turned off is stopped by the same watch. Enabled
//! consoles are opened again when rivetd starts ([`ConsoleHub::reopen_enabled`]).

pub mod capture;
pub mod pen;
pub mod ports;
pub mod record;
pub mod session;
pub mod ssh;
pub mod tcp;
pub mod tickets;

use axum::body::Bytes;
use capture::{CapturePaths, CaptureWriter};
use record::Recorder;
use rivet_conductor::console_tail::ConsoleTail;
use rivet_conductor::Conductor;
use rivet_drivers::sol::SolTarget;
use rivet_model::node::Node;
use session::{RunSpec, Session};
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// The console interface the hub serves.
pub const SOCAT: &str = "ipmitool-socat";
/// Wait before a session task that panicked is started again.
pub const RESTART_AFTER_PANIC: Duration = Duration::from_secs(5);
/// How often a session checks that the store still wants it.
const WATCH_EVERY: Duration = Duration::from_secs(15);
/// Chunks queued for the capture writer.
const CAPTURE_QUEUE: usize = 1024;
/// Most chunks one blocking write of the capture takes.
const CAPTURE_BATCH: usize = 64;

/// A running console.
struct Running {
    session: Arc<Session>,
    /// Ends when the session task (and its `sol deactivate`) has ended.
    done: tokio::sync::watch::Receiver<bool>,
}

/// Every console this rivetd holds.
pub struct ConsoleHub {
    conductor: Arc<Conductor>,
    running: Mutex<HashMap<String, Running>>,
    ports: ports::PortBook,
    /// WebSocket tickets.
    pub tickets: tickets::Tickets,
    dir: PathBuf,
    recorder: Recorder,
    /// Cancelled at shutdown: every session ends (the store keeps their flags).
    stopping: CancellationToken,
}

impl ConsoleHub {
    /// The hub of `conductor`'s rivetd; also installs itself as the conductor's console
    /// tail (failure events quote the console).
    pub fn new(conductor: Arc<Conductor>) -> Arc<ConsoleHub> {
        let dir = conductor.config.console.log_dir_for(&conductor.config.db);
        let hub = Arc::new(ConsoleHub {
            recorder: Recorder::new(conductor.store.clone(), conductor.id()),
            stopping: conductor.shutdown.child_token(),
            conductor: conductor.clone(),
            running: Mutex::new(HashMap::new()),
            ports: ports::PortBook::default(),
            tickets: tickets::Tickets::default(),
            dir,
        });
        conductor.set_console_tail(Arc::new(TailReader {
            hub: Arc::downgrade(&hub),
        }));
        hub
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<String, Running>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The session of `node_uuid`, while its console is open here.
    pub fn session(&self, node_uuid: &str) -> Option<Arc<Session>> {
        self.running().get(node_uuid).map(|r| r.session.clone())
    }

    /// The capture of `node_uuid`.
    pub fn capture(&self, node_uuid: &str) -> CapturePaths {
        CapturePaths::new(&self.dir, node_uuid)
    }

    /// `console_info.url` of `node_uuid`'s console: `tcp://ADDR:PORT` (IPv6 in brackets).
    pub fn url(&self, node_uuid: &str) -> Option<String> {
        let port = match self.session(node_uuid) {
            Some(s) => s.port,
            None => self.saved_port(node_uuid)?,
        };
        let addr = &self.conductor.config.console.socat_address;
        Some(match addr.parse::<IpAddr>() {
            Ok(IpAddr::V6(a)) => format!("tcp://[{a}]:{port}"),
            _ => format!("tcp://{addr}:{port}"),
        })
    }

    fn port_file(&self, node_uuid: &str) -> PathBuf {
        self.dir.join(format!("{node_uuid}.port"))
    }

    /// The port the node's console had (so its URL survives a restart).
    fn saved_port(&self, node_uuid: &str) -> Option<u16> {
        std::fs::read_to_string(self.port_file(node_uuid))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Check that `node` can have an `ipmitool-socat` console (Ironic's validate): the
    /// error is the 400's message.
    pub fn validate(node: &Node) -> Result<SolTarget, String> {
        SolTarget::from_driver_info(&node.driver_info).map_err(|e| e.to_string())
    }

    /// `PUT …/states/console {"enabled": true}` after validation: open the session in the
    /// background; when the first activation fails the console stays disabled and the
    /// node's `last_error` says why.
    pub async fn enable(self: &Arc<Self>, node: &Node, target: SolTarget) {
        if self.session(&node.uuid).is_some() {
            return;
        }
        self.recorder.last_error(&node.uuid, None).await;
        let (tx, rx) = oneshot::channel();
        let uuid = node.uuid.clone();
        let started = self.start(&uuid, target, Some(tx));
        let hub = self.clone();
        // Tracked by the conductor like its node tasks: shutdown waits for it (bounded).
        self.conductor.tasks.spawn(async move {
            let outcome = match started {
                Err(e) => Err(e),
                Ok(()) => rx
                    .await
                    .unwrap_or_else(|_| Err("the console session ended".into())),
            };
            match outcome {
                Ok(()) => {
                    hub.recorder.enabled(&uuid, true).await;
                    hub.recorder.history(&uuid, "console enabled", false).await;
                }
                Err(why) => {
                    hub.stop(&uuid).await;
                    let msg = format!("Error enabling the console on node {uuid}. Reason: {why}");
                    tracing::error!(node = %uuid, "{msg}");
                    hub.recorder.history(&uuid, &msg, true).await;
                    hub.recorder.last_error(&uuid, Some(msg)).await;
                }
            }
        });
    }

    /// `PUT …/states/console {"enabled": false}`: end the session (and the BMC's), record
    /// the flag.
    pub async fn disable(&self, node_uuid: &str) {
        self.stop(node_uuid).await;
        self.recorder.enabled(node_uuid, false).await;
        self.recorder.last_error(node_uuid, None).await;
        self.recorder
            .history(node_uuid, "console disabled", false)
            .await;
    }

    /// End `node_uuid`'s session here and wait for it (a bounded time).
    async fn stop(&self, node_uuid: &str) {
        let Some(r) = self.running().remove(node_uuid) else {
            return;
        };
        r.session.cancel.cancel();
        let mut done = r.done;
        let limit = Duration::from_secs(self.conductor.config.drivers.ipmi_timeout_s.max(1) + 5);
        let _ = tokio::time::timeout(limit, done.wait_for(|d| *d)).await;
        self.ports.release(r.session.port);
    }

    /// Open the console of every node the store says is enabled and this rivetd owns; a
    /// console that cannot open keeps retrying (its operator asked for it).
    pub async fn reopen_enabled(self: &Arc<Self>) {
        let nodes = match self.conductor.store.console_enabled_nodes().await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list enabled consoles; none re-opened");
                return;
            }
        };
        for uuid in nodes {
            if !self.conductor.owns(&uuid) {
                continue;
            }
            let Ok(node) = self.conductor.store.get_node(&uuid).await else {
                continue;
            };
            if node
                .interfaces
                .get(&node.driver, rivet_model::interfaces::Iface::Console)
                != SOCAT
            {
                continue;
            }
            match Self::validate(&node) {
                Ok(target) => {
                    if let Err(e) = self.start(&uuid, target, None) {
                        tracing::warn!(node = %uuid, error = %e, "cannot re-open the console");
                        self.recorder
                            .history(&uuid, &format!("cannot re-open the console: {e}"), true)
                            .await;
                    } else {
                        tracing::info!(node = %uuid, "console re-opened");
                    }
                }
                Err(e) => {
                    tracing::warn!(node = %uuid, error = %e, "console enabled but its driver_info no longer allows it")
                }
            }
        }
    }

    /// Bind the port, open the capture, start the supervised session task.
    fn start(
        self: &Arc<Self>,
        uuid: &str,
        target: SolTarget,
        first: Option<oneshot::Sender<Result<(), String>>>,
    ) -> Result<(), String> {
        let cfg = &self.conductor.config.console;
        let addr: IpAddr = cfg.socat_address.parse().map_err(|_| {
            format!(
                "[console] socat_address {:?} is not an IP address",
                cfg.socat_address
            )
        })?;
        let ranges = cfg.ports()?;
        let bound = self
            .ports
            .bind(addr, target.terminal_port, self.saved_port(uuid), &ranges)?;
        let port = bound.port;
        let capture = match self.open_capture(uuid, port) {
            Ok(c) => c,
            Err(e) => {
                self.ports.release(port);
                return Err(e);
            }
        };
        let cancel = self.stopping.child_token();
        let (session, input) = Session::new(uuid, port, cancel, self.recorder.clone());
        let (done_tx, done_rx) = tokio::sync::watch::channel(false);
        {
            let mut running = self.running();
            if running.contains_key(uuid) {
                self.ports.release(port);
                return Ok(());
            }
            running.insert(
                uuid.to_string(),
                Running {
                    session: session.clone(),
                    done: done_rx,
                },
            );
        }
        let idle = match cfg.terminal_timeout {
            0 => None,
            s => Some(Duration::from_secs(s)),
        };
        // The listener and the session's supervisor end when the session is cancelled (at
        // the latest at shutdown, whose grace period waits for their `sol deactivate`).
        let tasks = &self.conductor.tasks;
        tasks.spawn(tcp::serve(session.clone(), bound.listener, idle));
        let spec = RunSpec {
            target,
            drivers: self.conductor.config.drivers.clone(),
            subprocess_timeout: Duration::from_secs(cfg.subprocess_timeout.max(1)),
            capture,
            first,
        };
        tasks.spawn(self.clone().supervise(session, spec, input, done_tx));
        Ok(())
    }

    /// The capture writer: a blocking thread appending what the session sends.
    fn open_capture(&self, uuid: &str, port: u16) -> Result<mpsc::Sender<Bytes>, String> {
        let max = self.conductor.config.console.log_max_bytes;
        let paths = self.capture(uuid);
        let writer = CaptureWriter::open(paths, max).map_err(|e| {
            format!(
                "cannot write the console capture in {}: {e}",
                self.dir.display()
            )
        })?;
        if let Err(e) = std::fs::write(self.port_file(uuid), port.to_string()) {
            tracing::warn!(node = %uuid, error = %e, "cannot remember the console port");
        }
        let (tx, mut rx) = mpsc::channel::<Bytes>(CAPTURE_QUEUE);
        let node = uuid.to_string();
        // An async task that hands each batch of queued chunks to the blocking pool, rather
        // than a blocking thread per console: tokio's pool has 512 threads, so with more
        // consoles than that the later ones' writers never started (their capture stayed
        // empty) and every other `spawn_blocking` in rivetd queued behind them
        // (docs/numbers.md, "Serial consoles"). The task ends when the session drops its
        // sender; the conductor tracks it, so shutdown lets the last batch reach the disk.
        self.conductor.tasks.spawn(async move {
            let mut warned = false;
            let mut writer = Some(writer);
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                while batch.len() < CAPTURE_BATCH {
                    match rx.try_recv() {
                        Ok(b) => batch.push(b),
                        Err(_) => break,
                    }
                }
                let Some(mut w) = writer.take() else { break };
                let wrote = tokio::task::spawn_blocking(move || {
                    let mut failed = None;
                    for b in &batch {
                        if let Err(e) = w.append(b) {
                            failed.get_or_insert(e);
                        }
                    }
                    (w, failed)
                })
                .await;
                let Ok((w, failed)) = wrote else { break };
                writer = Some(w);
                if let Some(e) = failed {
                    if !warned {
                        tracing::warn!(node = %node, error = %e, "console capture write failed");
                        warned = true;
                    }
                }
            }
        });
        Ok(tx)
    }

    /// Run the session task; restart it after a panic; stop it when the store no longer
    /// wants it. Marks `done` when it has ended for good.
    async fn supervise(
        self: Arc<Self>,
        session: Arc<Session>,
        spec: RunSpec,
        input: mpsc::Receiver<Bytes>,
        done: tokio::sync::watch::Sender<bool>,
    ) {
        let uuid = session.node_uuid.clone();
        // The input queue outlives a panicked attempt (the session keeps its sender): each
        // attempt borrows it through a tokio mutex, whose guard a panic releases.
        let input = Arc::new(tokio::sync::Mutex::new(input));
        let respawn = spec.again();
        let mut spec = Some(spec);
        loop {
            let this_spec = spec.take().unwrap_or_else(|| respawn.again());
            let s = session.clone();
            let q = input.clone();
            let task = tokio::spawn(async move {
                let mut guard = q.lock().await;
                session::run(s, this_spec, &mut guard).await;
            });
            let watch = self.watch(&uuid, &session);
            tokio::pin!(task);
            let ended = tokio::select! {
                r = &mut task => r,
                () = watch => {
                    session.cancel.cancel();
                    (&mut task).await
                }
            };
            match ended {
                Ok(()) => break,
                Err(e) if e.is_panic() => {
                    let why = rivet_conductor::supervisor::panic_message(&*e.into_panic());
                    tracing::error!(node = %uuid, panic = %why, "console session panicked; restarting it");
                    self.recorder
                        .history(
                            &uuid,
                            &format!("console session failed ({why}); restarting it"),
                            true,
                        )
                        .await;
                    tokio::select! {
                        _ = tokio::time::sleep(RESTART_AFTER_PANIC) => {}
                        _ = session.cancel.cancelled() => break,
                    }
                }
                Err(_) => break,
            }
        }
        // Ended for good: if it was not stopped through the hub (first activation failed,
        // node gone), take it out here.
        let removed = {
            let mut running = self.running();
            match running.get(&uuid) {
                Some(r) if Arc::ptr_eq(&r.session, &session) => running.remove(&uuid).is_some(),
                _ => false,
            }
        };
        if removed {
            self.ports.release(session.port);
        }
        session.cancel.cancel();
        let _ = done.send(true);
    }

    /// Resolves when the store no longer wants this console here (node deleted, flag turned
    /// off by another rivetd). Never before the first activation has been recorded.
    async fn watch(&self, uuid: &str, session: &Session) {
        let mut seen_on = false;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(WATCH_EVERY) => {}
                _ = session.cancel.cancelled() => return std::future::pending().await,
            }
            match self.recorder.still_wanted(uuid).await {
                Some(true) => seen_on = true,
                // Off after having been on, or the node is gone.
                Some(false) if seen_on => return,
                // Never on yet (the first activation is pending): only a deleted node ends it.
                Some(false) if self.conductor.store.get_node(uuid).await.is_err() => return,
                Some(false) | None => {}
            }
        }
    }
}

/// Reads captures for the conductor's failure events: only of consoles open here (an old
/// capture of a console disabled since would quote another time).
struct TailReader {
    hub: std::sync::Weak<ConsoleHub>,
}

#[async_trait::async_trait]
impl ConsoleTail for TailReader {
    async fn tail(&self, node_uuid: &str, max: usize) -> Option<Vec<u8>> {
        let hub = self.hub.upgrade()?;
        hub.session(node_uuid)?;
        let paths = hub.capture(node_uuid);
        tokio::task::spawn_blocking(move || paths.tail(max as u64).ok().flatten())
            .await
            .ok()
            .flatten()
            .filter(|b| !b.is_empty())
    }
}
