//! The agent loop: lookup, then heartbeat until the controller forgets us, then lookup again.
//!
//! Heartbeat timing:
//! - **idle**: `wait: true`, the controller holds the request up to `long_poll_s`; the next
//!   one goes out as soon as the answer arrives (never faster than `min_interval` when the
//!   controller answers empty at once, so a controller that ignores `wait` is not hammered);
//! - **while a command runs**: `wait: false` every `progress_interval` (1 s), carrying the
//!   progress and letting an `abort` in; a finishing command wakes the loop at once, so its
//!   result reaches the controller one round trip after it ends.
//!
//! A long poll is therefore never in flight while something runs, and no in-flight request
//! is ever dropped (which could lose a command the controller just handed out).

use crate::backoff::{Backoff, BackoffConfig};
use crate::client::Transport;
use crate::executor::Executor;
use crate::inventory::{self, InventoryOptions, Root};
use rivet_hardware_managers::Dispatcher;
use rivet_protocol::agent::{HeartbeatRequest, LookupRequest, LookupResponse};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Settings of the agent loop.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// Controller base URLs, tried in turn.
    pub controllers: Vec<String>,
    /// Node UUID hint for lookup.
    pub node: Option<String>,
    /// Retry bounds for lookup and failed heartbeats.
    pub backoff: BackoffConfig,
    /// Heartbeat interval while a command runs.
    pub progress_interval: Duration,
    /// Shortest interval between idle heartbeats answered empty.
    pub min_interval: Duration,
    /// Added to `long_poll_s` for the request timeout.
    pub request_margin: Duration,
    /// Inventory settings (MACs and DMI ids for lookup).
    pub inventory: InventoryOptions,
    /// This boot's id, sent at lookup and with every heartbeat (the controller ties the token
    /// to it). `None`: read `/proc/sys/kernel/random/boot_id`.
    pub boot_id: Option<String>,
}

impl Default for AgentOptions {
    fn default() -> Self {
        AgentOptions {
            controllers: Vec::new(),
            node: None,
            backoff: BackoffConfig::default(),
            progress_interval: Duration::from_secs(1),
            min_interval: Duration::from_secs(1),
            request_margin: Duration::from_secs(10),
            inventory: InventoryOptions::default(),
            boot_id: None,
        }
    }
}

/// The in-band agent. Build with [`Agent::new`], drive with [`Agent::run`].
pub struct Agent<T: Transport> {
    opts: AgentOptions,
    transport: T,
    executor: Executor,
    dispatcher: Arc<Dispatcher>,
    /// Handed out once per boot by the first lookup; kept for the life of the process.
    token: Option<String>,
    /// Index of the controller that answered last.
    current: usize,
    /// This boot's id (see [`AgentOptions::boot_id`]); `None` when the kernel has none.
    boot_id: Option<String>,
}

/// Where Linux keeps the id of the current boot (a random UUID per boot).
const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// The kernel's boot id, or `None` (not Linux, no procfs): the controller then accepts the
/// token without a boot id, as for older agents.
pub fn read_boot_id() -> Option<String> {
    std::fs::read_to_string(BOOT_ID_PATH)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty() && s.len() <= rivet_protocol::agent::MAX_BOOT_ID_LEN)
}

/// Why the heartbeat phase ended.
enum Phase {
    /// Controller forgot the node or the token: look up again.
    Relookup,
    /// Shutdown requested.
    Stop,
}

impl<T: Transport> Agent<T> {
    /// An agent talking through `transport`, running commands on `executor`.
    pub fn new(
        opts: AgentOptions,
        transport: T,
        dispatcher: Arc<Dispatcher>,
        executor: Executor,
    ) -> Self {
        let boot_id = opts.boot_id.clone().or_else(read_boot_id);
        Agent {
            opts,
            transport,
            executor,
            dispatcher,
            token: None,
            current: 0,
            boot_id,
        }
    }

    /// The executor (to inspect pending results in tests).
    pub fn executor(&self) -> &Executor {
        &self.executor
    }

    /// Run until `shutdown` completes. Never fails: every error is logged and retried.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut backoff = Backoff::new(self.opts.backoff);
        let mut discovery = crate::discovery::Discovery {
            state: crate::discovery::DiscoveryState::Pending,
            inventory: self.opts.inventory.clone(),
            dispatcher: self.dispatcher.clone(),
            boot_id: self.boot_id.clone(),
            owns_machine: crate::pid1::owns_machine(),
        };
        loop {
            let req = self.lookup_request().await;
            let found = tokio::select! {
                found = crate::discovery::lookup_or_discover(
                    &self.transport, &self.opts.controllers, self.current, &req, &mut backoff,
                    &mut discovery,
                ) => found,
                _ = &mut shutdown => return,
            };
            let (idx, resp) = found;
            self.current = idx;
            if !self.accept_lookup(&resp) {
                tokio::select! {
                    _ = tokio::time::sleep(backoff.next_delay()) => continue,
                    _ = &mut shutdown => return,
                }
            }
            tracing::info!(
                node = %resp.node_uuid,
                controller = %self.opts.controllers[self.current],
                long_poll_s = resp.config.long_poll_s,
                "lookup done; heartbeating"
            );
            match self.heartbeat_phase(&resp, &mut shutdown).await {
                Phase::Relookup => continue,
                Phase::Stop => return,
            }
        }
    }

    /// Keep a new token; refuse to go on without any.
    fn accept_lookup(&mut self, resp: &LookupResponse) -> bool {
        match (&resp.agent_token, &self.token) {
            (Some(t), _) => {
                self.token = Some(t.clone());
                true
            }
            (None, Some(_)) => true,
            (None, None) => {
                tracing::error!(
                    node = %resp.node_uuid,
                    "the controller knows this node but sent no agent token, and this agent \
                     holds none: the token is handed out once per ramdisk boot, so this agent \
                     was probably restarted outside the controller. Reboot the node through \
                     the controller (or clear its token) to recover; retrying lookup"
                );
                false
            }
        }
    }

    async fn lookup_request(&self) -> LookupRequest {
        let inv_opts = InventoryOptions {
            skip_bmc: true,
            ..self.opts.inventory.clone()
        };
        let dispatcher = self.dispatcher.clone();
        let inv = tokio::task::spawn_blocking(move || {
            let mut inv = inventory::collect(&Root::default(), &inv_opts);
            dispatcher.inventory(&mut inv);
            inv
        })
        .await
        .unwrap_or_default();
        LookupRequest {
            macs: inv
                .interfaces
                .iter()
                .map(|i| i.mac_address.clone())
                .filter(|m| m.len() == 17 && m != "00:00:00:00:00:00")
                .collect(),
            system_uuid: inv.system_vendor.uuid.filter(|u| !u.is_empty()),
            system_serial: Some(inv.system_vendor.serial_number).filter(|s| !s.is_empty()),
            node_uuid: self.opts.node.clone(),
            agent_version: rivet_protocol::VERSION.to_string(),
            boot_id: self.boot_id.clone(),
        }
    }

    async fn heartbeat_phase(
        &mut self,
        lookup: &LookupResponse,
        shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Phase {
        let node = lookup.node_uuid.clone();
        let long_poll = Duration::from_secs(lookup.config.long_poll_s);
        let mut backoff = Backoff::new(self.opts.backoff);
        let finished = self.executor.finished();
        let token = self.token.clone().unwrap_or_default();
        loop {
            let running = self.executor.running();
            let wait = running.is_none();
            let req = HeartbeatRequest {
                agent_version: rivet_protocol::VERSION.to_string(),
                running,
                results: self.executor.pending_results(),
                wait,
                boot_id: self.boot_id.clone(),
            };
            let timeout = if wait { long_poll } else { Duration::ZERO } + self.opts.request_margin;
            let base = &self.opts.controllers[self.current];
            let started = Instant::now();
            let answer = tokio::select! {
                a = self.transport.heartbeat(base, &node, &token, &req, timeout) => a,
                _ = &mut *shutdown => return Phase::Stop,
            };
            let pause = match answer {
                Ok(resp) => {
                    if backoff.attempts() > 0 {
                        tracing::info!(
                            node = %node, controller = %base, failed = backoff.attempts(),
                            "heartbeat answered again after failures"
                        );
                    }
                    backoff.reset();
                    self.executor.ack(&resp.acks);
                    let quiet = resp.command.is_none() && resp.acks.is_empty();
                    if let Some(cmd) = resp.command {
                        self.executor.submit(cmd);
                    }
                    if self.executor.is_busy() {
                        self.opts.progress_interval
                    } else if !self.executor.pending_results().is_empty() {
                        Duration::ZERO // deliver results at once
                    } else if quiet {
                        self.opts.min_interval.saturating_sub(started.elapsed())
                    } else {
                        Duration::ZERO
                    }
                }
                Err(e) if e.retry_after().is_some() => {
                    // Rate-limited: the controller is up and said how long to stay away;
                    // another controller would not help, so stay with this one.
                    let asked = e.retry_after().unwrap_or_default();
                    tracing::warn!(
                        node = %node, controller = %base, error = %e,
                        "controller is rate-limiting this address; waiting as asked"
                    );
                    backoff.next_delay().max(asked)
                }
                Err(e)
                    if matches!(e.status(), Some(401) | Some(404))
                        && crate::rescue::in_rescue() =>
                {
                    // Rescue finalized: the controller revoked the token as Ironic's does, and
                    // nothing more is expected from this agent (unrescue reboots the machine).
                    tracing::info!(
                        node = %node, error = %e,
                        "rescue finalized; no more heartbeats, the ramdisk stays up for the rescue user"
                    );
                    shutdown.as_mut().await;
                    return Phase::Stop;
                }
                Err(e) if matches!(e.status(), Some(401) | Some(404)) => {
                    tracing::warn!(
                        node = %node, error = %e,
                        "controller no longer accepts this node or token; looking up again"
                    );
                    return Phase::Relookup;
                }
                Err(e) => {
                    // The delay doubles up to the cap (`BackoffConfig`, 30 s by default), so
                    // an agent cut off for minutes is back within one cap of the link
                    // returning; a running step goes on meanwhile and its result is kept.
                    let delay = backoff.next_delay();
                    tracing::warn!(
                        node = %node, controller = %base, error = %e,
                        attempt = backoff.attempts(), retry_in_ms = delay.as_millis() as u64,
                        busy = self.executor.is_busy(), "heartbeat failed"
                    );
                    // The next attempt goes to the next controller URL.
                    self.current = (self.current + 1) % self.opts.controllers.len();
                    delay
                }
            };
            if pause.is_zero() {
                continue;
            }
            // A finishing command cuts the pause short.
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = finished.notified() => {}
                _ = &mut *shutdown => return Phase::Stop,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::TransportError;
    use crate::executor::ExecutorOptions;
    use crate::logring::LogRing;
    use rivet_hardware_managers::{HardwareManager, StepContext, StepError, SupportLevel};
    use rivet_protocol::agent::{
        AgentConfig, Command, CommandKind, CommandStatus, HeartbeatResponse,
    };
    use rivet_protocol::steps::StepDescriptor;
    use serde_json::{Map, Value};
    use std::collections::VecDeque;
    use std::sync::Mutex;

    /// Scripted controller: a queue of lookup answers and of heartbeat answers; records every
    /// request. An empty heartbeat queue answers `{}` after a short "long poll".
    #[derive(Default)]
    struct Fake {
        lookups: Mutex<VecDeque<Result<LookupResponse, TransportError>>>,
        beats: Mutex<VecDeque<Result<HeartbeatResponse, TransportError>>>,
        seen_lookups: Mutex<Vec<(String, LookupRequest)>>,
        seen_beats: Mutex<Vec<(String, String, HeartbeatRequest)>>,
    }

    #[derive(Clone, Default)]
    struct FakeTransport(Arc<Fake>);

    impl Transport for FakeTransport {
        async fn lookup(
            &self,
            base: &str,
            req: &LookupRequest,
        ) -> Result<LookupResponse, TransportError> {
            self.0
                .seen_lookups
                .lock()
                .unwrap()
                .push((base.to_string(), req.clone()));
            let next = self.0.lookups.lock().unwrap().pop_front();
            next.unwrap_or(Err(TransportError::Connect("script ended".into())))
        }

        async fn heartbeat(
            &self,
            base: &str,
            _node: &str,
            token: &str,
            req: &HeartbeatRequest,
            _timeout: Duration,
        ) -> Result<HeartbeatResponse, TransportError> {
            self.0.seen_beats.lock().unwrap().push((
                base.to_string(),
                token.to_string(),
                req.clone(),
            ));
            let next = self.0.beats.lock().unwrap().pop_front();
            match next {
                Some(a) => a,
                None => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    Ok(HeartbeatResponse::default())
                }
            }
        }
    }

    struct Sleepy;
    impl HardwareManager for Sleepy {
        fn name(&self) -> &str {
            "sleepy"
        }
        fn evaluate_support(&self) -> SupportLevel {
            SupportLevel::Generic
        }
        fn steps(&self) -> Vec<StepDescriptor> {
            vec![StepDescriptor::in_band("nap", 0)]
        }
        fn execute(
            &self,
            _: &str,
            _: &Map<String, Value>,
            ctx: &StepContext,
        ) -> Result<Value, StepError> {
            ctx.set_progress(1, 2, "half");
            std::thread::sleep(Duration::from_millis(60));
            Ok(Value::from("rested"))
        }
    }

    fn found(token: Option<&str>) -> Result<LookupResponse, TransportError> {
        Ok(LookupResponse {
            node_uuid: "n1".into(),
            node_name: None,
            agent_token: token.map(str::to_string),
            config: AgentConfig {
                long_poll_s: 1,
                heartbeat_timeout_s: 300,
            },
        })
    }

    fn status(code: u16) -> TransportError {
        TransportError::Status {
            status: code,
            body: String::new(),
        }
    }

    fn agent(t: &FakeTransport, controllers: &[&str]) -> Agent<FakeTransport> {
        let d = Arc::new(Dispatcher::new(vec![Arc::new(Sleepy)]));
        let ex = Executor::new(
            d.clone(),
            ExecutorOptions::default(),
            LogRing::new(5, false),
        );
        let opts = AgentOptions {
            controllers: controllers.iter().map(|s| s.to_string()).collect(),
            backoff: BackoffConfig {
                base: Duration::from_millis(1),
                cap: Duration::from_millis(4),
            },
            progress_interval: Duration::from_millis(10),
            min_interval: Duration::from_millis(5),
            inventory: InventoryOptions {
                skip_bmc: true,
                ..Default::default()
            },
            ..Default::default()
        };
        Agent::new(opts, t.clone(), d, ex)
    }

    /// Run the agent until `done` says the recorded requests are enough (or 5 s pass).
    async fn run_until(a: Agent<FakeTransport>, t: &FakeTransport, done: impl Fn(&Fake) -> bool) {
        let fake = t.0.clone();
        let stop = async move {
            for _ in 0..1000 {
                if done(&fake) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            panic!("scenario did not complete");
        };
        a.run(stop).await;
    }

    #[tokio::test]
    async fn lookup_retries_404_and_other_controllers_then_keeps_token() {
        let t = FakeTransport::default();
        {
            let mut l = t.0.lookups.lock().unwrap();
            l.push_back(Err(status(404)));
            l.push_back(Err(TransportError::Connect("refused".into())));
            l.push_back(found(Some("tok-1")));
            // After the controller forgets the node: no token this time, ours is kept.
            l.push_back(found(None));
        }
        t.0.beats.lock().unwrap().push_back(Err(status(401)));
        let a = agent(&t, &["http://c1", "http://c2"]);
        run_until(a, &t, |f| f.seen_beats.lock().unwrap().len() >= 3).await;

        let lookups = t.0.seen_lookups.lock().unwrap();
        let urls: Vec<&str> = lookups.iter().map(|(u, _)| u.as_str()).collect();
        assert_eq!(
            urls,
            vec!["http://c1", "http://c2", "http://c1", "http://c1"]
        );
        assert_eq!(lookups[0].1.agent_version, rivet_protocol::VERSION);
        let beats = t.0.seen_beats.lock().unwrap();
        assert!(beats.iter().all(|(_, tok, _)| tok == "tok-1"));
        assert!(beats.iter().all(|(_, _, r)| r.wait && r.running.is_none()));
    }

    #[tokio::test]
    async fn no_token_anywhere_keeps_looking_up() {
        let t = FakeTransport::default();
        {
            let mut l = t.0.lookups.lock().unwrap();
            l.push_back(found(None));
            l.push_back(found(None));
            l.push_back(found(Some("late")));
        }
        let a = agent(&t, &["http://c1"]);
        run_until(a, &t, |f| !f.seen_beats.lock().unwrap().is_empty()).await;
        assert_eq!(t.0.seen_lookups.lock().unwrap().len(), 3);
        assert_eq!(t.0.seen_beats.lock().unwrap()[0].1, "late");
    }

    #[tokio::test]
    async fn command_progress_result_ack_and_duplicate() {
        let t = FakeTransport::default();
        t.0.lookups.lock().unwrap().push_back(found(Some("tok")));
        let nap = Command {
            id: "c1".into(),
            kind: CommandKind::ExecuteStep {
                interface: "deploy".into(),
                step: "nap".into(),
                args: Map::new(),
            },
        };
        t.0.beats.lock().unwrap().push_back(Ok(HeartbeatResponse {
            command: Some(nap.clone()),
            acks: vec![],
        }));
        let a = agent(&t, &["http://c1"]);
        // Run until the result has been sent at least twice (not acked yet: the fake's
        // default answer has no acks).
        run_until(a, &t, |f| {
            f.seen_beats
                .lock()
                .unwrap()
                .iter()
                .filter(|(_, _, r)| !r.results.is_empty())
                .count()
                >= 2
        })
        .await;
        let beats = t.0.seen_beats.lock().unwrap();
        let running: Vec<_> = beats
            .iter()
            .filter_map(|(_, _, r)| r.running.as_ref())
            .collect();
        assert!(
            !running.is_empty(),
            "progress heartbeats while the step runs"
        );
        assert!(running.iter().all(|r| r.id == "c1"));
        assert_eq!(
            running[0].progress.as_ref().map(|p| p.message.as_str()),
            Some("half")
        );
        // While running, the agent never long-polls.
        assert!(beats
            .iter()
            .filter(|(_, _, r)| r.running.is_some())
            .all(|(_, _, r)| !r.wait));
        let with_result = beats
            .iter()
            .find(|(_, _, r)| !r.results.is_empty())
            .expect("result sent");
        assert_eq!(with_result.2.results[0].id, "c1");
        assert_eq!(with_result.2.results[0].status, CommandStatus::Succeeded);
    }

    #[tokio::test]
    async fn acked_results_are_dropped_and_repeats_ignored() {
        let t = FakeTransport::default();
        t.0.lookups.lock().unwrap().push_back(found(Some("tok")));
        let inv = Command {
            id: "g1".into(),
            kind: CommandKind::GetCleanSteps,
        };
        {
            let mut b = t.0.beats.lock().unwrap();
            b.push_back(Ok(HeartbeatResponse {
                command: Some(inv.clone()),
                acks: vec![],
            }));
        }
        let a = agent(&t, &["http://c1"]);
        let ex = a.executor().clone();
        let t2 = t.clone();
        // Once the result went out, ack it and re-send the same command id.
        let script = tokio::spawn(async move {
            loop {
                let sent =
                    t2.0.seen_beats
                        .lock()
                        .unwrap()
                        .iter()
                        .any(|(_, _, r)| !r.results.is_empty());
                if sent {
                    let mut b = t2.0.beats.lock().unwrap();
                    b.push_back(Ok(HeartbeatResponse {
                        command: Some(inv.clone()),
                        acks: vec!["g1".into()],
                    }));
                    return;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        run_until(a, &t, move |f| {
            let n = f.seen_beats.lock().unwrap().len();
            n >= 8 && ex.pending_results().is_empty()
        })
        .await;
        script.await.unwrap();
        let beats = t.0.seen_beats.lock().unwrap();
        // After the ack no heartbeat carries g1 again, and the repeated id did not run.
        let last_with = beats
            .iter()
            .rposition(|(_, _, r)| !r.results.is_empty())
            .unwrap();
        assert!(
            last_with + 1 < beats.len(),
            "heartbeats continued after the ack"
        );
        assert!(beats[last_with + 1..]
            .iter()
            .all(|(_, _, r)| r.results.is_empty() && r.running.is_none()));
    }

    fn limited(ms: u64) -> TransportError {
        TransportError::RateLimited {
            retry_after: Duration::from_millis(ms),
            body: "too many agent lookups from this address".into(),
        }
    }

    #[tokio::test]
    async fn lookup_429_waits_retry_after_not_just_backoff() {
        let t = FakeTransport::default();
        {
            let mut l = t.0.lookups.lock().unwrap();
            l.push_back(Err(limited(300)));
            l.push_back(found(Some("tok")));
        }
        let a = agent(&t, &["http://c1"]);
        let started = Instant::now();
        run_until(a, &t, |f| !f.seen_beats.lock().unwrap().is_empty()).await;
        // Backoff alone is 1–4 ms here.
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(t.0.seen_lookups.lock().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn heartbeat_429_waits_retry_after_and_keeps_controller_and_boot_id() {
        let t = FakeTransport::default();
        t.0.lookups.lock().unwrap().push_back(found(Some("tok")));
        t.0.beats.lock().unwrap().push_back(Err(limited(300)));
        let mut a = agent(&t, &["http://c1", "http://c2"]);
        a.boot_id = Some("boot-a".into());
        let started = Instant::now();
        run_until(a, &t, |f| f.seen_beats.lock().unwrap().len() >= 2).await;
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "{:?}",
            started.elapsed()
        );
        let beats = t.0.seen_beats.lock().unwrap();
        assert_eq!(beats[0].0, "http://c1");
        assert_eq!(beats[1].0, "http://c1", "a 429 is not a dead controller");
        assert!(beats
            .iter()
            .all(|(_, _, r)| r.boot_id.as_deref() == Some("boot-a")));
        let lookups = t.0.seen_lookups.lock().unwrap();
        assert_eq!(lookups[0].1.boot_id.as_deref(), Some("boot-a"));
    }

    #[tokio::test]
    async fn heartbeat_connection_errors_rotate_controllers() {
        let t = FakeTransport::default();
        t.0.lookups.lock().unwrap().push_back(found(Some("tok")));
        {
            let mut b = t.0.beats.lock().unwrap();
            b.push_back(Err(TransportError::Connect("reset".into())));
            b.push_back(Err(TransportError::Connect("reset".into())));
        }
        let a = agent(&t, &["http://c1", "http://c2"]);
        run_until(a, &t, |f| f.seen_beats.lock().unwrap().len() >= 3).await;
        let beats = t.0.seen_beats.lock().unwrap();
        let urls: Vec<&str> = beats.iter().take(3).map(|(u, _, _)| u.as_str()).collect();
        assert_eq!(urls, vec!["http://c1", "http://c2", "http://c1"]);
    }
}
