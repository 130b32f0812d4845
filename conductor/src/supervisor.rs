//! Supervision of the conductor's background work.
//!
//! - Node tasks run on a [`TaskTracker`] so shutdown can wait for them. A panic inside one is
//!   caught, logged with its node, and becomes that node's failure (`clean failed`, `deploy
//!   failed`… with a `last_error` that says so) instead of a node wedged until restart.
//! - The controller-wide loops (periodic scan, power sync, membership heartbeat, notices,
//!   and those rivetd adds, such as its metrics listener) are critical: when one ends or
//!   panics the controller stops taking work and rivetd exits non-zero, so a service
//!   manager restarts it. Serving on without them would mean driving
//!   nodes whose leases other controllers already consider expired.
//! - Shutdown (SIGTERM) cancels one [`CancellationToken`]: no new node task starts, held
//!   agent long polls answer at once, and once the running tasks have ended the node leases
//!   are handed back so other controllers can take them without waiting for expiry.

use super::{Conductor, ConductorError};
use rivet_store::StoreError;
use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
pub use tokio_util::sync::CancellationToken;
pub use tokio_util::task::TaskTracker;

/// How a controller-wide loop ended.
#[derive(Debug, PartialEq, Eq)]
pub enum LoopEnd {
    /// It has nothing to do in this configuration (power sync off, a store without
    /// notices): ending is fine.
    NotNeeded,
    /// It stopped working; the controller must not go on.
    Failed(String),
}

/// A named controller-wide loop.
pub type CriticalLoop = (&'static str, Pin<Box<dyn Future<Output = LoopEnd> + Send>>);

/// Runs `loops` until one fails, ends when it should not, or panics; returns why, naming it.
/// Loops that report [`LoopEnd::NotNeeded`] are let go.
pub async fn supervise(loops: Vec<CriticalLoop>) -> String {
    let mut set = JoinSet::new();
    let mut names = std::collections::HashMap::new();
    for (name, fut) in loops {
        let handle = set.spawn(fut);
        names.insert(handle.id(), name);
    }
    while let Some(done) = set.join_next_with_id().await {
        match done {
            Ok((_, LoopEnd::NotNeeded)) => {}
            Ok((id, LoopEnd::Failed(why))) => {
                return format!("{} stopped: {why}", names.get(&id).unwrap_or(&"a loop"));
            }
            Err(e) => {
                let name = names.get(&e.id()).unwrap_or(&"a loop");
                return match e.try_into_panic() {
                    Ok(payload) => format!("{name} panicked: {}", panic_message(&*payload)),
                    Err(e) => format!("{name} was cancelled: {e}"),
                };
            }
        }
    }
    "every controller-wide loop ended".into()
}

/// The text of a panic payload.
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".into()
    }
}

/// How long shutdown waits for running node tasks before handing leases back anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

impl Conductor {
    /// The batched agent liveness writer ([`super::liveness`]); never ends by itself.
    async fn run_liveness(self: Arc<Self>) -> LoopEnd {
        self.liveness.clone().run().await;
        LoopEnd::Failed("the liveness writer ended".into())
    }

    /// The controller-wide loops, supervised together with `others` (rivetd's own, such as
    /// its `[metrics] listen` listener): returns only when one of them stopped (why).
    pub async fn run_background(self: Arc<Self>, others: Vec<CriticalLoop>) -> String {
        let mut loops: Vec<CriticalLoop> = vec![
            ("periodic scan", Box::pin(self.clone().run_periodic())),
            ("power sync", Box::pin(self.clone().run_power_sync())),
            (
                "membership heartbeat",
                Box::pin(self.clone().run_membership()),
            ),
            ("controller notices", Box::pin(self.clone().run_notices())),
            ("allocations", Box::pin(self.clone().run_allocations())),
            (
                "agent liveness writer",
                Box::pin(self.clone().run_liveness()),
            ),
        ];
        loops.extend(others);
        supervise(loops).await
    }

    /// After a panic in node `uuid`'s task: fail its operation with a message that says so,
    /// so the operator sees it and can retry (the panic itself is in the log).
    pub(super) async fn fail_after_panic(&self, uuid: &str, what: &str) {
        for _ in 0..5 {
            let node = match self.store.get_node(uuid).await {
                Ok(n) => n,
                Err(e) => {
                    tracing::error!(node = %uuid, error = %e, "cannot record the panic on the node");
                    return;
                }
            };
            let state = node.provision_state;
            if !state.is_conductor_busy() && !state.is_wait() {
                return;
            }
            let msg = format!(
                "internal error in rivetd while driving node {} in \"{state}\": {what}; \
                 the operation was stopped (rivetd's log has the details) — retry it, and \
                 report the error if it comes back",
                node.ident()
            );
            match self.fail(node, &msg).await {
                Ok(_) => return,
                Err(ConductorError::Store(StoreError::Conflict { .. })) => continue,
                Err(e) => {
                    tracing::error!(node = %uuid, error = %e, "cannot record the panic on the node");
                    return;
                }
            }
        }
    }

    /// Stop taking work and hand the node leases back: called once on SIGTERM/SIGINT (after
    /// the listener closed) or when a critical loop stopped. Waits up to 30 s for running
    /// node tasks; leases of tasks still running then are left to expire.
    pub async fn shut_down(&self) {
        self.shutdown.cancel();
        self.tasks.close();
        let ended = tokio::time::timeout(SHUTDOWN_GRACE, self.tasks.wait())
            .await
            .is_ok();
        // The heartbeats this controller took in are written before its nodes go to others,
        // which would otherwise see them late and may time a node out.
        if let Err(e) = self.liveness.flush().await {
            tracing::warn!(error = %e, "cannot write the last agent liveness before stopping");
        }
        if !ended {
            tracing::warn!(
                running = self.tasks.len(),
                "node tasks still running after the shutdown grace period; their leases expire with this controller"
            );
            return;
        }
        match self.store.release_reservations(self.id()).await {
            Ok(n) if n > 0 => tracing::info!(count = n, "node leases handed back"),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot hand the node leases back; they expire with this controller");
                return;
            }
        }
        // Every lease is back: say this controller is gone, so that a restart under its id
        // (and, on PostgreSQL, the other controllers' ring) need not wait `dead_after_s`.
        let mut stopped = self.registration.lock().await;
        *stopped = true;
        if let Err(e) = self.store.conductor_stopped(self.id()).await {
            tracing::warn!(error = %e, "cannot mark this controller offline; it counts as dead once its heartbeat is dead_after_s old");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forever() -> Pin<Box<dyn Future<Output = LoopEnd> + Send>> {
        Box::pin(async {
            std::future::pending::<()>().await;
            LoopEnd::NotNeeded
        })
    }

    #[tokio::test]
    async fn a_panicking_loop_is_named() {
        let why = supervise(vec![
            ("steady", forever()),
            ("off", Box::pin(async { LoopEnd::NotNeeded })),
            (
                "membership heartbeat",
                Box::pin(async {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    panic!("boom");
                }),
            ),
        ])
        .await;
        assert_eq!(why, "membership heartbeat panicked: boom");
    }

    #[tokio::test]
    async fn a_failed_loop_is_named_and_not_needed_ones_are_let_go() {
        let why = supervise(vec![
            ("off", Box::pin(async { LoopEnd::NotNeeded })),
            ("steady", forever()),
            (
                "notices",
                Box::pin(async {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    LoopEnd::Failed("channel closed".into())
                }),
            ),
        ])
        .await;
        assert_eq!(why, "notices stopped: channel closed");
    }
}
