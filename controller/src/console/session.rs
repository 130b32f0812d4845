//! One node's console session: the one SOL child (`ipmitool … sol activate`), its output
//! fanned out to every viewer and appended to the capture, keystrokes of the pen's holder
//! forwarded to it.
//!
//! [`Session`] is what viewers share (output and event channels, the pen, the input queue);
//! [`run`] is the task that owns the child. Before each activation it sends `sol deactivate`
//! (a session left by a rivetd that died, or by anyone else, would make the BMC refuse). When
//! the child exits — the BMC dropped the session, the network went away — the loss is written
//! into the console stream, the capture and the node's history, and the session is opened
//! again after a back-off (1 s doubling to [`MAX_BACKOFF`]). Only the first activation of an
//! operator's `enable` is not retried: its failure is the answer (`last_error`), as Ironic's.

use super::pen::{Pen, Typed, ViewerId};
use super::record::Recorder;
use axum::body::Bytes;
use rivet_drivers::sol::SolTarget;
use rivet_drivers::DriversConfig;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// Longest wait between two activations.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// A session up this long counts as healthy: the next loss starts the back-off again.
const HEALTHY_AFTER: Duration = Duration::from_secs(60);
/// Output chunks a viewer may fall behind before it skips (and is told how many).
const VIEWER_BACKLOG: usize = 1024;
/// Keystroke messages queued for the child.
const INPUT_QUEUE: usize = 256;
/// ipmitool's stderr kept to explain an exit.
const STDERR_KEPT: usize = 4096;

/// What the viewers of one console share.
pub struct Session {
    /// The node.
    pub node_uuid: String,
    /// The TCP port of its raw console.
    pub port: u16,
    output: broadcast::Sender<Bytes>,
    events: broadcast::Sender<Arc<str>>,
    input: mpsc::Sender<Bytes>,
    pen: Mutex<Pen>,
    next_viewer: AtomicU64,
    /// Cancelled when the console is disabled or rivetd stops.
    pub cancel: CancellationToken,
    /// Audit rows for viewers.
    pub recorder: Recorder,
}

/// The receiving ends a viewer reads.
pub struct Attached {
    /// Its id.
    pub id: ViewerId,
    /// Console output.
    pub output: broadcast::Receiver<Bytes>,
    /// Events as JSON text (`{"event": "pen", …}`).
    pub events: broadcast::Receiver<Arc<str>>,
}

impl Session {
    /// A session for `node_uuid` on `port`; the receiver is the child's input queue, for
    /// [`run`].
    pub fn new(
        node_uuid: &str,
        port: u16,
        cancel: CancellationToken,
        recorder: Recorder,
    ) -> (Arc<Session>, mpsc::Receiver<Bytes>) {
        let (input, input_rx) = mpsc::channel(INPUT_QUEUE);
        let s = Session {
            node_uuid: node_uuid.to_string(),
            port,
            output: broadcast::channel(VIEWER_BACKLOG).0,
            events: broadcast::channel(64).0,
            input,
            pen: Mutex::new(Pen::default()),
            next_viewer: AtomicU64::new(1),
            cancel,
            recorder,
        };
        (Arc::new(s), input_rx)
    }

    fn pen(&self) -> std::sync::MutexGuard<'_, Pen> {
        self.pen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Who holds the pen.
    pub fn holder(&self) -> Option<String> {
        self.pen().holder().map(str::to_string)
    }

    /// A new viewer.
    pub fn attach(&self) -> Attached {
        Attached {
            id: self.next_viewer.fetch_add(1, Ordering::Relaxed),
            output: self.output.subscribe(),
            events: self.events.subscribe(),
        }
    }

    /// A new viewer named `actor` (from `source`), its attach in the audit trail.
    pub async fn attach_recorded(
        &self,
        actor: &str,
        source: Option<String>,
        detail: String,
    ) -> Attached {
        let attached = self.attach();
        self.recorder
            .viewer(&self.node_uuid, actor, source, "attach", detail)
            .await;
        attached
    }

    fn pen_event(&self) {
        let holder = self.holder();
        let _ = self.events.send(
            serde_json::json!({"event": "pen", "holder": holder})
                .to_string()
                .into(),
        );
    }

    /// `viewer` typed `bytes`: forwarded when it holds (or just took) the pen.
    pub fn typed(&self, viewer: ViewerId, name: &str, can_write: bool, bytes: Bytes) -> Typed {
        let t = self.pen().typed(viewer, name, can_write, Instant::now());
        if let Typed::Forward(took) = t {
            if took {
                self.pen_event();
            }
            // A full queue means the BMC takes keystrokes slower than they come: drop them
            // rather than stall every viewer.
            let _ = self.input.try_send(bytes);
        }
        t
    }

    /// `viewer` takes the pen; false when it may only watch.
    pub fn take_over(&self, viewer: ViewerId, name: &str, can_write: bool) -> bool {
        let ok = self
            .pen()
            .take_over(viewer, name, can_write, Instant::now());
        if ok {
            self.pen_event();
        }
        ok
    }

    /// `viewer` gives the pen back or leaves.
    pub fn release(&self, viewer: ViewerId) {
        if self.pen().release(viewer) {
            self.pen_event();
        }
    }

    /// Send output to every viewer (nobody watching is fine).
    fn broadcast(&self, bytes: Bytes) {
        let _ = self.output.send(bytes);
    }

    fn state_event(&self, state: &str) {
        let _ = self.events.send(
            serde_json::json!({"event": "session", "state": state})
                .to_string()
                .into(),
        );
    }
}

/// What [`run`] needs besides the session.
pub struct RunSpec {
    /// The node's SOL endpoint.
    pub target: SolTarget,
    /// ipmitool and its timeouts.
    pub drivers: DriversConfig,
    /// How long the child may take to show its session up.
    pub subprocess_timeout: Duration,
    /// Where output is captured (a blocking writer reads this).
    pub capture: mpsc::Sender<Bytes>,
    /// Told the outcome of the first activation; `Some` for an operator's `enable`, whose
    /// first failure ends the session instead of being retried.
    pub first: Option<oneshot::Sender<Result<(), String>>>,
}

impl RunSpec {
    /// The same spec without the first activation's waiter (a restart after a panic).
    pub fn again(&self) -> RunSpec {
        RunSpec {
            target: self.target.clone(),
            drivers: self.drivers.clone(),
            subprocess_timeout: self.subprocess_timeout,
            capture: self.capture.clone(),
            first: None,
        }
    }
}

/// How one child ended.
enum Ended {
    /// The console was disabled (or rivetd stops).
    Cancelled,
    /// The child exited or could not start; the text says why.
    Lost { why: String, was_up: bool },
}

/// Own the SOL child of `session` until it is cancelled (or its first activation, when
/// `spec.first` waits for it, fails).
pub async fn run(session: Arc<Session>, mut spec: RunSpec, input: &mut mpsc::Receiver<Bytes>) {
    let mut backoff = Duration::from_secs(1);
    // Lost and not back yet: the next activation says it is back.
    let mut lost = false;
    loop {
        if session.cancel.is_cancelled() {
            break;
        }
        if let Err(e) = spec.target.deactivate(&spec.drivers).await {
            tracing::debug!(node = %session.node_uuid, error = %e, "sol deactivate before activating failed");
        }
        let started = Instant::now();
        match one_child(&session, &mut spec, input, &mut lost).await {
            Ended::Cancelled => break,
            Ended::Lost { why, was_up } => {
                if let Some(first) = spec.first.take() {
                    if !was_up {
                        let _ = first.send(Err(why));
                        return;
                    }
                    let _ = first.send(Ok(()));
                }
                if started.elapsed() >= HEALTHY_AFTER {
                    backoff = Duration::from_secs(1);
                }
                let text = format!(
                    "SOL session lost ({why}); reconnecting in {} s",
                    backoff.as_secs()
                );
                tracing::warn!(node = %session.node_uuid, "console: {text}");
                note(&session, &spec, &text).await;
                session.state_event("lost");
                // The history hears of the first loss of a run of failures, not every retry.
                if !lost {
                    session
                        .recorder
                        .history(&session.node_uuid, &format!("console: {text}"), true)
                        .await;
                }
                lost = true;
                // Keystrokes typed while no session is open go nowhere.
                let wait = tokio::time::sleep(backoff);
                tokio::pin!(wait);
                loop {
                    tokio::select! {
                        _ = &mut wait => break,
                        _ = session.cancel.cancelled() => break,
                        got = input.recv() => if got.is_none() { break },
                    }
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        }
    }
    // Disabled: drop the BMC's session so the next user (or rivetd) gets it at once.
    if let Err(e) = spec.target.deactivate(&spec.drivers).await {
        tracing::debug!(node = %session.node_uuid, error = %e, "sol deactivate after disabling failed");
    }
}

/// A line in the console stream and the capture: `[rivet: TEXT]`.
async fn note(session: &Session, spec: &RunSpec, text: &str) {
    let line = Bytes::from(format!("\r\n[rivet: {text}]\r\n"));
    let _ = spec.capture.send(line.clone()).await;
    session.broadcast(line);
}

/// One activation: start the child, pump until it ends or the session is cancelled.
async fn one_child(
    session: &Arc<Session>,
    spec: &mut RunSpec,
    input: &mut mpsc::Receiver<Bytes>,
    lost: &mut bool,
) -> Ended {
    let mut child = match spec.target.activate(&spec.drivers).spawn() {
        Ok(c) => c,
        Err(e) => {
            return Ended::Lost {
                why: format!("cannot run {}: {e}", spec.drivers.ipmitool),
                was_up: false,
            }
        }
    };
    let (Some(mut stdout), Some(mut stderr), Some(mut stdin)) =
        (child.stdout.take(), child.stderr.take(), child.stdin.take())
    else {
        return Ended::Lost {
            why: "the SOL child has no pipes".into(),
            was_up: false,
        };
    };
    // Keystrokes go through their own task: a BMC slow to take them must not stall output.
    let (to_child, mut for_child) = mpsc::channel::<Bytes>(INPUT_QUEUE);
    let writer = tokio::spawn(async move {
        while let Some(b) = for_child.recv().await {
            if stdin.write_all(&b).await.is_err() || stdin.flush().await.is_err() {
                break;
            }
        }
        // Dropping stdin here would end ipmitool's session: keep it until the child goes.
        std::future::pending::<()>().await;
    });
    let mut up = false;
    let mut err_text: Vec<u8> = Vec::new();
    let mut stderr_open = true;
    let mut buf = vec![0u8; 16 * 1024];
    let mut ebuf = vec![0u8; 1024];
    let settle = tokio::time::sleep(spec.subprocess_timeout);
    tokio::pin!(settle);
    let cancelled = loop {
        tokio::select! {
            _ = session.cancel.cancelled() => break true,
            r = stdout.read(&mut buf) => match r {
                Ok(0) | Err(_) => break false,
                Ok(n) => {
                    if !up {
                        up = true;
                        became_up(session, spec, lost).await;
                    }
                    let chunk = Bytes::copy_from_slice(&buf[..n]);
                    // Captured first, and waited for: the capture loses nothing.
                    let _ = spec.capture.send(chunk.clone()).await;
                    session.broadcast(chunk);
                }
            },
            r = stderr.read(&mut ebuf), if stderr_open => match r {
                Ok(0) | Err(_) => stderr_open = false,
                Ok(n) => {
                    err_text.extend_from_slice(&ebuf[..n]);
                    if err_text.len() > STDERR_KEPT {
                        err_text.drain(..err_text.len() - STDERR_KEPT);
                    }
                }
            },
            got = input.recv() => match got {
                Some(b) => { let _ = to_child.try_send(b); }
                None => break true,
            },
            _ = &mut settle, if !up => {
                // Alive and silent for subprocess_timeout: a quiet console is still a session.
                up = true;
                became_up(session, spec, lost).await;
            }
        }
    };
    writer.abort();
    if cancelled {
        let _ = child.kill().await;
        return Ended::Cancelled;
    }
    // stdout closed: the child is ending; give it a moment, then make sure.
    let status = match tokio::time::timeout(Duration::from_secs(2), child.wait()).await {
        Ok(Ok(s)) => format!("{s}"),
        _ => {
            let _ = child.kill().await;
            "killed".into()
        }
    };
    // What is left on stderr says why.
    let _ = tokio::time::timeout(
        Duration::from_millis(200),
        stderr.read_to_end(&mut err_text),
    )
    .await;
    let stderr_text = String::from_utf8_lossy(&err_text);
    let why = if stderr_text
        .lines()
        .any(|l| l.contains("already active") || l.starts_with("Error") || l.contains("RAKP"))
    {
        spec.target.explain("activate", &stderr_text).to_string()
    } else {
        format!(
            "ipmitool sol activate against {} ended, {status}",
            spec.target.bmc()
        )
    };
    let why = rivet_drivers::redact(&why, Some(spec.target.password()));
    Ended::Lost { why, was_up: up }
}

/// The session is up: tell the operator's `enable` and the viewers, and after a loss the
/// capture and the node's history too.
async fn became_up(session: &Session, spec: &mut RunSpec, lost: &mut bool) {
    if let Some(first) = spec.first.take() {
        let _ = first.send(Ok(()));
    }
    session.state_event("up");
    if std::mem::take(lost) {
        let text = "SOL session re-established";
        tracing::info!(node = %session.node_uuid, "console: {text}");
        note(session, spec, text).await;
        session
            .recorder
            .history(&session.node_uuid, &format!("console: {text}"), false)
            .await;
    }
}
