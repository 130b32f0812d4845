//! The command executor: one command at a time on a blocking thread, results kept until the
//! controller acks them.
//!
//! Rules (see DESIGN.md, data flow 4):
//! - a command id seen before (running, finished, or acked) is ignored, so a controller that
//!   re-sends after a restart or a lost answer causes no second run;
//! - `abort` is handled at once and never queues: it cancels the running command if that is
//!   abortable (the cancelled command then ends `ABORTED`);
//! - any other command while one runs fails at once with "busy" (like IPA's 409);
//! - every command has a timeout; on expiry it is cancelled and fails with a message;
//! - failed results carry the tail of the agent's own log.

use crate::inventory::{self, InventoryOptions, Root};
use crate::logring::LogRing;
use crate::pid1;
use rivet_hardware_managers::{Dispatcher, StepContext, StepError};
use rivet_protocol::agent::{
    CleanStepsResult, Command, CommandKind, CommandResult, CommandStatus, DeployStepsResult,
    InventoryResult, RunningCommand,
};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;

/// What `reboot` and `power_off` really do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerMode {
    /// The agent owns the machine (PID 1 or started by our init): sync and reboot(2).
    Real,
    /// A normal process (tests, a developer's laptop): log and succeed without doing it.
    LogOnly,
}

/// Executor settings.
#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    /// Limit for `execute_step`.
    pub step_timeout: Duration,
    /// Limit for every other command.
    pub command_timeout: Duration,
    /// After a timeout, how long to wait for the step to notice the cancellation before the
    /// failure is reported anyway.
    pub cancel_grace: Duration,
    /// What reboot/power_off do.
    pub power: PowerMode,
    /// Delay between reporting a reboot/power_off result and doing it, so the heartbeat can
    /// carry the result to the controller first.
    pub power_delay: Duration,
    /// How to collect the inventory.
    pub inventory: InventoryOptions,
    /// Lines of log attached to a failed result.
    pub log_tail_lines: usize,
    /// Where `finalize_rescue` writes the rescue login (see [`crate::rescue`]).
    pub rescue_root: crate::rescue::RescueRoot,
}

impl Default for ExecutorOptions {
    fn default() -> Self {
        ExecutorOptions {
            step_timeout: Duration::from_secs(6 * 3600),
            command_timeout: Duration::from_secs(60),
            cancel_grace: Duration::from_secs(30),
            power: PowerMode::LogOnly,
            power_delay: Duration::from_secs(3),
            inventory: InventoryOptions::default(),
            log_tail_lines: crate::logring::DEFAULT_LINES,
            rescue_root: crate::rescue::RescueRoot::Refuse,
        }
    }
}

/// Why a command failed (becomes the result's `error`).
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// The step failed or was aborted.
    #[error(transparent)]
    Step(#[from] StepError),
    /// Another command is running.
    #[error(
        "agent is busy running command {id} ({name}); send one command at a time, or abort it"
    )]
    Busy {
        /// Running command id.
        id: String,
        /// Its name.
        name: String,
    },
    /// The command ran past its limit.
    #[error("{name} timed out after {secs} s and was cancelled{extra}")]
    TimedOut {
        /// Command name.
        name: String,
        /// The limit.
        secs: u64,
        /// Note when the step ignored the cancellation.
        extra: String,
    },
    /// The step is offered on another interface.
    #[error("step {step:?} is offered on interface {offered:?}, not {asked:?}")]
    WrongInterface {
        /// Step name.
        step: String,
        /// Interface the manager declares.
        offered: String,
        /// Interface the controller asked for.
        asked: String,
    },
    /// `abort` for a command that is not abortable or unknown.
    #[error("{0}")]
    Abort(String),
    /// `finalize_rescue` could not set the rescue login.
    #[error("finalize_rescue failed: {0}")]
    Rescue(String),
    /// The blocking thread panicked.
    #[error("command crashed: {0}")]
    Crashed(String),
    /// Result could not be encoded.
    #[error("cannot encode result: {0}")]
    Encode(#[from] serde_json::Error),
}

struct Running {
    id: String,
    name: String,
    step: Option<String>,
    ctx: StepContext,
    abortable: bool,
    /// Set when an `abort` (not a timeout) cancelled it.
    aborted: bool,
}

#[derive(Default)]
struct State {
    running: Option<Running>,
    /// Finished, not yet acked, in finishing order.
    results: Vec<CommandResult>,
    /// Every id ever accepted in this boot. Small: a ramdisk session sees few commands.
    seen: HashSet<String>,
}

/// Runs commands; shared between the heartbeat loop and the command tasks.
#[derive(Clone)]
pub struct Executor {
    dispatcher: Arc<Dispatcher>,
    opts: Arc<ExecutorOptions>,
    log: LogRing,
    state: Arc<Mutex<State>>,
    finished: Arc<Notify>,
}

impl Executor {
    /// A new executor over `dispatcher`; `log` supplies the tail for failed results.
    pub fn new(dispatcher: Arc<Dispatcher>, opts: ExecutorOptions, log: LogRing) -> Self {
        Executor {
            dispatcher,
            opts: Arc::new(opts),
            log,
            state: Arc::default(),
            finished: Arc::new(Notify::new()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave State inconsistent (plain data), so a
        // poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notified whenever a result is added (command finished or answered at once).
    pub fn finished(&self) -> Arc<Notify> {
        self.finished.clone()
    }

    /// What runs now, with its latest progress.
    pub fn running(&self) -> Option<RunningCommand> {
        self.state().running.as_ref().map(|r| RunningCommand {
            id: r.id.clone(),
            name: r.name.clone(),
            step: r.step.clone(),
            progress: r.ctx.progress(),
        })
    }

    /// Whether a command runs.
    pub fn is_busy(&self) -> bool {
        self.state().running.is_some()
    }

    /// Finished results the controller has not acked yet.
    pub fn pending_results(&self) -> Vec<CommandResult> {
        self.state().results.clone()
    }

    /// Forget results the controller stored.
    pub fn ack(&self, ids: &[String]) {
        if ids.is_empty() {
            return;
        }
        self.state().results.retain(|r| !ids.contains(&r.id));
    }

    /// Accept a command from the controller. Must be called inside a Tokio runtime.
    pub fn submit(&self, cmd: Command) {
        let name = cmd.kind.name();
        let mut st = self.state();
        if !st.seen.insert(cmd.id.clone()) {
            tracing::info!(command = %cmd.id, name, "ignoring repeated command id");
            return;
        }
        tracing::info!(command = %cmd.id, name, "command received");
        match cmd.kind {
            CommandKind::Abort { command_id } => {
                let outcome = abort(&mut st, &command_id);
                self.finish(st, &cmd.id, name, outcome, false);
            }
            kind => {
                if let Some(r) = &st.running {
                    let err = CommandError::Busy {
                        id: r.id.clone(),
                        name: r.name.clone(),
                    };
                    self.finish(st, &cmd.id, name, Err(err), false);
                    return;
                }
                let (step, abortable) = match &kind {
                    CommandKind::ExecuteStep { step, .. } => (
                        Some(step.clone()),
                        self.dispatcher
                            .step(step)
                            .map(|d| d.abortable)
                            .unwrap_or(true),
                    ),
                    _ => (None, true),
                };
                let ctx = StepContext::new();
                st.running = Some(Running {
                    id: cmd.id.clone(),
                    name: name.to_string(),
                    step,
                    ctx: ctx.clone(),
                    abortable,
                    aborted: false,
                });
                drop(st);
                let this = self.clone();
                tokio::spawn(async move { this.run(cmd.id, kind, ctx).await });
            }
        }
    }

    /// Run one command to its end and record the result; its log lines (and the step's own,
    /// on the blocking thread) carry the command id and the step name.
    async fn run(self, id: String, kind: CommandKind, ctx: StepContext) {
        let step = match &kind {
            CommandKind::ExecuteStep { step, .. } => Some(step.clone()),
            _ => None,
        };
        let span = tracing::info_span!("command", command = %id, step = step.as_deref());
        tracing::Instrument::instrument(self.run_in(id, kind, ctx, span.clone()), span).await
    }

    async fn run_in(self, id: String, kind: CommandKind, ctx: StepContext, span: tracing::Span) {
        let name = kind.name();
        let limit = match kind {
            CommandKind::ExecuteStep { .. } => self.opts.step_timeout,
            _ => self.opts.command_timeout,
        };
        let power = match kind {
            CommandKind::Reboot => Some(false),
            CommandKind::PowerOff => Some(true),
            _ => None,
        };
        let work = {
            let (dispatcher, opts, ctx) = (self.dispatcher.clone(), self.opts.clone(), ctx.clone());
            tokio::task::spawn_blocking(move || {
                span.in_scope(|| execute(&dispatcher, &opts, kind, &ctx))
            })
        };
        tokio::pin!(work);
        let mut timed_out = false;
        let outcome = match tokio::time::timeout(limit, &mut work).await {
            Ok(joined) => joined.unwrap_or_else(|e| Err(CommandError::Crashed(e.to_string()))),
            Err(_) => {
                timed_out = true;
                tracing::error!(command = %id, name, ?limit, "command timed out; cancelling");
                ctx.cancel();
                let extra = match tokio::time::timeout(self.opts.cancel_grace, &mut work).await {
                    Ok(_) => String::new(),
                    Err(_) => format!(
                        " (it did not stop within {} s and may still be running)",
                        self.opts.cancel_grace.as_secs()
                    ),
                };
                Err(CommandError::TimedOut {
                    name: name.to_string(),
                    secs: limit.as_secs(),
                    extra,
                })
            }
        };
        let succeeded = outcome.is_ok();
        {
            // Scoped: the guard must not live across the await below.
            let st = self.state();
            let aborted = !timed_out
                && outcome.is_err()
                && st.running.as_ref().map(|r| r.aborted).unwrap_or(false);
            self.finish(st, &id, name, outcome, aborted);
        }
        if let (Some(off), true) = (power, succeeded) {
            self.power_action(off).await;
        }
    }

    /// Record a result, clear `running` if it is this command, wake the heartbeat loop.
    fn finish(
        &self,
        mut st: MutexGuard<'_, State>,
        id: &str,
        name: &str,
        outcome: Result<Value, CommandError>,
        aborted: bool,
    ) {
        if st.running.as_ref().map(|r| r.id == id).unwrap_or(false) {
            st.running = None;
        }
        let result = match outcome {
            Ok(result) => {
                tracing::info!(command = %id, name, "command succeeded");
                CommandResult {
                    id: id.to_string(),
                    name: name.to_string(),
                    status: CommandStatus::Succeeded,
                    result,
                    error: None,
                    log_tail: None,
                }
            }
            Err(e) => {
                let status = if aborted {
                    tracing::warn!(command = %id, name, "command aborted");
                    CommandStatus::Aborted
                } else {
                    tracing::error!(command = %id, name, error = %e, "command failed");
                    CommandStatus::Failed
                };
                CommandResult {
                    id: id.to_string(),
                    name: name.to_string(),
                    status,
                    result: Value::Null,
                    error: Some(e.to_string()),
                    log_tail: Some(tail_lines(&self.log.tail(), self.opts.log_tail_lines)),
                }
            }
        };
        st.results.push(result);
        drop(st);
        // Everyone waiting now (IPA mode has a heartbeat loop and `wait=true` requests), and
        // a permit for a loop that is between two waits (rivetd mode's heartbeat).
        self.finished.notify_waiters();
        self.finished.notify_one();
    }

    async fn power_action(&self, off: bool) {
        let what = if off { "power off" } else { "reboot" };
        match self.opts.power {
            PowerMode::LogOnly => {}
            PowerMode::Real => {
                tracing::warn!(delay = ?self.opts.power_delay, "{what} after reporting the result");
                tokio::time::sleep(self.opts.power_delay).await;
                let r = tokio::task::spawn_blocking(move || pid1::power(off)).await;
                // Reaching here means reboot(2) failed.
                tracing::error!(result = ?r, "{what} failed");
            }
        }
    }
}

fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Handle `abort {command_id}` against the current state.
fn abort(st: &mut State, target: &str) -> Result<Value, CommandError> {
    match st.running.as_mut() {
        Some(r) if r.id == target => {
            if !r.abortable {
                return Err(CommandError::Abort(format!(
                    "command {target} ({}) is not abortable; it runs to completion",
                    r.step.as_deref().unwrap_or(&r.name)
                )));
            }
            r.aborted = true;
            r.ctx.cancel();
            tracing::warn!(command = %target, "abort requested; cancelling");
            Ok(json!({"aborted": true}))
        }
        _ if st.seen.contains(target) => Ok(json!({
            "aborted": false,
            "message": format!("command {target} is not running (already finished)"),
        })),
        _ => Err(CommandError::Abort(format!(
            "no command {target} on this agent"
        ))),
    }
}

/// The blocking part of a command.
fn execute(
    dispatcher: &Dispatcher,
    opts: &ExecutorOptions,
    kind: CommandKind,
    ctx: &StepContext,
) -> Result<Value, CommandError> {
    match kind {
        CommandKind::GetInventory => {
            let mut inv = inventory::collect(&Root::default(), &opts.inventory);
            dispatcher.inventory(&mut inv);
            Ok(serde_json::to_value(InventoryResult { inventory: inv })?)
        }
        CommandKind::GetCleanSteps => Ok(serde_json::to_value(CleanStepsResult {
            clean_steps: dispatcher.steps(),
            hardware_manager_versions: dispatcher.versions(),
        })?),
        CommandKind::GetDeploySteps => Ok(serde_json::to_value(DeployStepsResult {
            deploy_steps: dispatcher.deploy_steps(),
            hardware_manager_versions: dispatcher.versions(),
        })?),
        CommandKind::ExecuteStep {
            interface,
            step,
            args,
        } => {
            if let Some(desc) = dispatcher.step(&step) {
                if desc.interface != interface {
                    return Err(CommandError::WrongInterface {
                        step,
                        offered: desc.interface,
                        asked: interface,
                    });
                }
            }
            Ok(dispatcher.execute(&step, &args, ctx)?)
        }
        CommandKind::Reboot | CommandKind::PowerOff => {
            let what = if kind == CommandKind::Reboot {
                "reboot"
            } else {
                "power off"
            };
            if opts.power == PowerMode::LogOnly {
                tracing::warn!("not PID 1 (not the ramdisk's init): {what} requested but not done");
                Ok(json!({"done": false, "message": format!("{what} skipped: agent is not PID 1")}))
            } else {
                Ok(json!({"done": true, "message": format!("{what} in progress")}))
            }
        }
        CommandKind::FinalizeRescue {
            rescue_password_hash,
        } => {
            let written = crate::rescue::finalize(&opts.rescue_root, &rescue_password_hash)
                .map_err(|e| CommandError::Rescue(e.to_string()))?;
            tracing::info!(files = ?written, "rescue login set for user {}", crate::rescue::RESCUE_USER);
            // Only the ramdisk's own init offers console logins; a local agent never does.
            let logins = match (&opts.rescue_root, opts.power) {
                (crate::rescue::RescueRoot::Dir(d), PowerMode::Real)
                    if d == std::path::Path::new("/") =>
                {
                    crate::rescue::start_logins(d)
                }
                _ => Vec::new(),
            };
            Ok(json!({
                "user": crate::rescue::RESCUE_USER,
                "files": written.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
                "console_logins": logins,
            }))
        }
        // Handled in submit(); never spawned.
        CommandKind::Abort { .. } => Ok(Value::Null),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rivet_hardware_managers::{HardwareManager, SupportLevel};
    use rivet_protocol::steps::StepDescriptor;
    use serde_json::Map;

    /// Steps: `quick` (returns args), `slow` (loops until cancelled, reports progress),
    /// `stubborn` (not abortable, ignores cancellation for 300 ms), `boom` (fails), `panic`.
    struct TestManager;

    impl HardwareManager for TestManager {
        fn name(&self) -> &str {
            "test"
        }
        fn evaluate_support(&self) -> SupportLevel {
            SupportLevel::Generic
        }
        fn steps(&self) -> Vec<StepDescriptor> {
            ["quick", "slow", "stubborn", "boom", "panic"]
                .iter()
                .map(|s| StepDescriptor {
                    abortable: *s != "stubborn",
                    ..StepDescriptor::in_band(*s, 0)
                })
                .collect()
        }
        fn execute(
            &self,
            step: &str,
            args: &Map<String, Value>,
            ctx: &StepContext,
        ) -> Result<Value, StepError> {
            match step {
                "quick" => Ok(Value::Object(args.clone())),
                "slow" => {
                    for i in 0.. {
                        ctx.set_progress(i, 0, "working");
                        ctx.check()?;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Ok(Value::Null)
                }
                "stubborn" => {
                    std::thread::sleep(Duration::from_millis(300));
                    Ok(json!("done"))
                }
                "boom" => {
                    tracing::error!("disk on fire");
                    Err(StepError::Failed("it broke".into()))
                }
                _ => panic!("test panic"),
            }
        }
    }

    fn executor(opts: ExecutorOptions) -> Executor {
        let d = Dispatcher::new(vec![Arc::new(TestManager)]);
        Executor::new(Arc::new(d), opts, LogRing::new(10, false))
    }

    fn step(id: &str, name: &str) -> Command {
        Command {
            id: id.into(),
            kind: CommandKind::ExecuteStep {
                interface: "deploy".into(),
                step: name.into(),
                args: Map::new(),
            },
        }
    }

    fn cmd(id: &str, kind: CommandKind) -> Command {
        Command {
            id: id.into(),
            kind,
        }
    }

    /// Wait until `id` has a result.
    async fn result_of(ex: &Executor, id: &str) -> CommandResult {
        for _ in 0..500 {
            if let Some(r) = ex.pending_results().into_iter().find(|r| r.id == id) {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no result for {id}");
    }

    #[tokio::test]
    async fn runs_a_step_and_keeps_result_until_acked() {
        let ex = executor(ExecutorOptions::default());
        let mut args = Map::new();
        args.insert("x".into(), json!(1));
        ex.submit(cmd(
            "c1",
            CommandKind::ExecuteStep {
                interface: "deploy".into(),
                step: "quick".into(),
                args,
            },
        ));
        let r = result_of(&ex, "c1").await;
        assert_eq!(r.status, CommandStatus::Succeeded);
        assert_eq!(r.result, json!({"x": 1}));
        assert!(!ex.is_busy());
        // Still there on the next heartbeat, gone once acked.
        assert_eq!(ex.pending_results().len(), 1);
        ex.ack(&["other".into()]);
        assert_eq!(ex.pending_results().len(), 1);
        ex.ack(&["c1".into()]);
        assert!(ex.pending_results().is_empty());
        // The same id again (controller re-sent after a restart) does not run twice.
        ex.submit(step("c1", "quick"));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(ex.pending_results().is_empty());
    }

    #[tokio::test]
    async fn abort_cancels_and_reports_progress() {
        let ex = executor(ExecutorOptions::default());
        ex.submit(step("s1", "slow"));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let running = ex.running().expect("running");
        assert_eq!(running.id, "s1");
        assert_eq!(running.step.as_deref(), Some("slow"));
        assert!(running.progress.expect("progress").done > 0);
        // A second command while busy fails at once.
        ex.submit(step("s2", "quick"));
        let busy = result_of(&ex, "s2").await;
        assert_eq!(busy.status, CommandStatus::Failed);
        assert!(busy.error.unwrap_or_default().contains("busy"));
        // Duplicate of the running id is ignored, not "busy".
        ex.submit(step("s1", "slow"));
        ex.submit(cmd(
            "a1",
            CommandKind::Abort {
                command_id: "s1".into(),
            },
        ));
        let a = result_of(&ex, "a1").await;
        assert_eq!(a.status, CommandStatus::Succeeded);
        let s1 = result_of(&ex, "s1").await;
        assert_eq!(s1.status, CommandStatus::Aborted);
        assert_eq!(ex.pending_results().len(), 3);
        // Aborting a finished command is harmless, an unknown one fails.
        ex.submit(cmd(
            "a2",
            CommandKind::Abort {
                command_id: "s1".into(),
            },
        ));
        assert_eq!(result_of(&ex, "a2").await.result["aborted"], json!(false));
        ex.submit(cmd(
            "a3",
            CommandKind::Abort {
                command_id: "nope".into(),
            },
        ));
        assert_eq!(result_of(&ex, "a3").await.status, CommandStatus::Failed);
    }

    #[tokio::test]
    async fn non_abortable_step_runs_to_completion() {
        let ex = executor(ExecutorOptions::default());
        ex.submit(step("f1", "stubborn"));
        tokio::time::sleep(Duration::from_millis(20)).await;
        ex.submit(cmd(
            "a1",
            CommandKind::Abort {
                command_id: "f1".into(),
            },
        ));
        let a = result_of(&ex, "a1").await;
        assert_eq!(a.status, CommandStatus::Failed);
        assert!(a.error.unwrap_or_default().contains("not abortable"));
        let f = result_of(&ex, "f1").await;
        assert_eq!(f.status, CommandStatus::Succeeded);
    }

    #[tokio::test]
    async fn timeout_cancels_and_fails() {
        let ex = executor(ExecutorOptions {
            step_timeout: Duration::from_millis(50),
            ..Default::default()
        });
        ex.submit(step("t1", "slow"));
        let r = result_of(&ex, "t1").await;
        assert_eq!(r.status, CommandStatus::Failed);
        assert!(r.error.unwrap_or_default().contains("timed out"));
        assert!(!ex.is_busy());

        // A step that ignores the cancellation is reported after the grace period.
        let ex = executor(ExecutorOptions {
            step_timeout: Duration::from_millis(20),
            cancel_grace: Duration::from_millis(20),
            ..Default::default()
        });
        ex.submit(step("t2", "stubborn"));
        let r = result_of(&ex, "t2").await;
        assert!(r.error.unwrap_or_default().contains("may still be running"));
    }

    #[tokio::test]
    async fn failures_carry_error_and_log_tail() {
        let ring = LogRing::new(10, false);
        let d = Dispatcher::new(vec![Arc::new(TestManager)]);
        let ex = Executor::new(Arc::new(d), ExecutorOptions::default(), ring.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(ring)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        ex.submit(step("b1", "boom"));
        let r = result_of(&ex, "b1").await;
        assert_eq!(r.status, CommandStatus::Failed);
        assert_eq!(r.error.as_deref(), Some("it broke"));
        // The tail is captured from this thread's subscriber only when the step logs on it;
        // the executor's own "command failed" line always is.
        assert!(r.log_tail.unwrap_or_default().contains("command failed"));

        ex.submit(step("p1", "panic"));
        let r = result_of(&ex, "p1").await;
        assert!(r.error.unwrap_or_default().contains("crashed"));

        ex.submit(step("u1", "no_such_step"));
        let r = result_of(&ex, "u1").await;
        assert!(r.error.unwrap_or_default().contains("no_such_step"));

        ex.submit(cmd(
            "w1",
            CommandKind::ExecuteStep {
                interface: "raid".into(),
                step: "quick".into(),
                args: Map::new(),
            },
        ));
        let r = result_of(&ex, "w1").await;
        assert!(r.error.unwrap_or_default().contains("interface"));
    }

    #[tokio::test]
    async fn clean_steps_inventory_and_power() {
        let ex = executor(ExecutorOptions {
            inventory: InventoryOptions {
                skip_bmc: true,
                ..Default::default()
            },
            ..Default::default()
        });
        ex.submit(cmd("g1", CommandKind::GetCleanSteps));
        let r = result_of(&ex, "g1").await;
        let steps: CleanStepsResult = serde_json::from_value(r.result).unwrap();
        assert_eq!(steps.clean_steps.len(), 5);
        assert_eq!(steps.hardware_manager_versions["test"], json!("1.0"));

        ex.submit(cmd("i1", CommandKind::GetInventory));
        let r = result_of(&ex, "i1").await;
        let inv: InventoryResult = serde_json::from_value(r.result).unwrap();
        assert!(inv.inventory.memory.total > 0);

        ex.submit(cmd("r1", CommandKind::Reboot));
        let r = result_of(&ex, "r1").await;
        assert_eq!(r.status, CommandStatus::Succeeded);
        assert_eq!(r.result["done"], json!(false));
    }
}
