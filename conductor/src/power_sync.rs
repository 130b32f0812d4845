//! Power sync: every `power_sync.interval_s`, read the BMC power state of each node nobody
//! else is driving and reconcile it with the recorded `power_state`.
//!
//! Skipped: nodes in `enroll` (their BMC is not validated yet), nodes in states where the
//! conductor or the ramdisk owns the power (cleaning, deploying, inspecting, verifying,
//! deleting… and their waits and holds), reserved nodes, nodes in maintenance, and nodes
//! with a power action in progress. On a mismatch the policy decides: `record` writes what
//! the BMC says; `enforce` sets the BMC back to the recorded state. Writes use the node's
//! optimistic version and are decided again on a fresh copy after a conflict. A BMC that
//! cannot be read (timeout, 5xx, dropped connection — after the driver's own retries) is
//! logged (with the node's UUID) and never changes `power_state`: the last known value is
//! kept, as a failed read says nothing about the server's power. After
//! [`FAILURES_BEFORE_ERROR`] failed passes in a row the failure is recorded in the node's
//! `last_error`, and cleared by the first pass that reads the BMC again.

use super::{Conductor, ConductorError};
use rivet_model::config::PowerSyncPolicy;
use rivet_model::node::Node;
use rivet_protocol::states::{PowerState, ProvisionState};
use rivet_store::StoreError;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// States whose power belongs to the conductor or the ramdisk (or is not known yet).
const NOT_SYNCED: &[ProvisionState] = &[
    ProvisionState::Enroll,
    ProvisionState::Verifying,
    ProvisionState::Cleaning,
    ProvisionState::CleanWait,
    ProvisionState::CleanHold,
    ProvisionState::Deploying,
    ProvisionState::WaitCallBack,
    ProvisionState::DeployHold,
    ProvisionState::Inspecting,
    ProvisionState::InspectWait,
    ProvisionState::Deleting,
    ProvisionState::Adopting,
    ProvisionState::Rescuing,
    ProvisionState::RescueWait,
    ProvisionState::Unrescuing,
];

/// Attempts at a write that keeps meeting a concurrent change.
const WRITE_ATTEMPTS: usize = 5;

/// Failed reads in a row before the failure goes to `last_error` (Ironic's default
/// `power_state_sync_max_retries`). Fewer would turn a single BMC hiccup into an error an
/// operator has to look at.
pub const FAILURES_BEFORE_ERROR: u32 = 3;

/// How the `last_error` this sync writes starts: only such an error is cleared again by it.
const SYNC_ERROR_PREFIX: &str = "power sync cannot read the power state of node ";

/// Failed reads in a row per node UUID, in this process (a restart counts afresh, which
/// only delays the `last_error`). An entry goes when its node's BMC answers again.
fn failures() -> &'static Mutex<HashMap<String, u32>> {
    static F: OnceLock<Mutex<HashMap<String, u32>>> = OnceLock::new();
    F.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Count one more failed read of `uuid`'s BMC; the streak's length.
fn note_failure(uuid: &str) -> u32 {
    let Ok(mut f) = failures().lock() else {
        return 1;
    };
    let n = f.entry(uuid.to_string()).or_insert(0);
    *n = n.saturating_add(1);
    *n
}

/// The BMC answered: the streak is over.
fn forget_failures(uuid: &str) {
    if let Ok(mut f) = failures().lock() {
        f.remove(uuid);
    }
}

fn is_sync_error(node: &Node) -> bool {
    node.last_error
        .as_deref()
        .is_some_and(|e| e.starts_with(SYNC_ERROR_PREFIX))
}

/// What one pass did (for logs and tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PowerSyncStats {
    /// BMCs read.
    pub checked: usize,
    /// Recorded power states changed (`record`, or a first reading).
    pub recorded: usize,
    /// BMCs set back to the recorded state (`enforce`).
    pub enforced: usize,
    /// BMCs that could not be read or set.
    pub failed: usize,
}

impl PowerSyncStats {
    fn count(&mut self, outcome: Outcome) {
        if outcome != Outcome::Skipped {
            self.checked += 1;
        }
        match outcome {
            Outcome::Recorded => self.recorded += 1,
            Outcome::Enforced => self.enforced += 1,
            Outcome::Failed => self.failed += 1,
            Outcome::Unchanged | Outcome::Skipped => {}
        }
    }
}

/// What happened to one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Unchanged,
    Recorded,
    Enforced,
    Skipped,
    Failed,
}

/// Whether the sync may touch this node now.
fn eligible(node: &Node) -> bool {
    !NOT_SYNCED.contains(&node.provision_state)
        && !node.maintenance
        && node.reservation.is_none()
        && node.target_power_state.is_none()
}

impl Conductor {
    /// Run the power sync forever (returns at once when `power_sync.interval_s` is 0).
    pub async fn run_power_sync(self: Arc<Self>) -> super::supervisor::LoopEnd {
        let secs = self.config.power_sync.interval_s;
        if secs == 0 {
            tracing::info!("power sync disabled (power_sync.interval_s = 0)");
            return super::supervisor::LoopEnd::NotNeeded;
        }
        let every = Duration::from_secs(secs);
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.power_sync_once().await {
                Ok(s) if s.recorded + s.enforced + s.failed > 0 => tracing::info!(
                    checked = s.checked,
                    recorded = s.recorded,
                    enforced = s.enforced,
                    failed = s.failed,
                    "power sync pass"
                ),
                Ok(_) => {}
                Err(e) => tracing::error!(error = %e, "power sync pass failed"),
            }
        }
    }

    /// One pass over every eligible node, a few BMCs at a time. Nodes are read a page at a
    /// time and a task is started only once a BMC slot is free, so a pass over 100,000 nodes
    /// holds one page and `concurrency` tasks, not the whole fleet.
    pub async fn power_sync_once(self: &Arc<Self>) -> Result<PowerSyncStats, ConductorError> {
        const PAGE: usize = 500;
        let limit = Arc::new(tokio::sync::Semaphore::new(
            self.config.power_sync.concurrency.max(1),
        ));
        let mut tasks = tokio::task::JoinSet::new();
        let mut stats = PowerSyncStats::default();
        let mut marker: Option<String> = None;
        loop {
            let page = self
                .store
                .list_nodes(&rivet_store::NodeQuery {
                    limit: PAGE,
                    marker: marker.clone(),
                    ..Default::default()
                })
                .await?;
            let Some(last) = page.last() else { break };
            marker = Some(last.uuid.clone());
            let full = page.len() == PAGE;
            // Each controller syncs the nodes the ring gives it.
            for node in page
                .into_iter()
                .filter(|n| eligible(n) && self.owns(&n.uuid))
            {
                let Ok(permit) = limit.clone().acquire_owned().await else {
                    break;
                };
                let this = self.clone();
                tasks.spawn(async move {
                    let _permit = permit;
                    this.sync_node(node).await
                });
                while let Some(done) = tasks.try_join_next() {
                    stats.count(done.unwrap_or(Outcome::Failed));
                }
            }
            if !full {
                break;
            }
        }
        while let Some(done) = tasks.join_next().await {
            stats.count(done.unwrap_or(Outcome::Failed));
        }
        Ok(stats)
    }

    /// Read one node's BMC and reconcile.
    async fn sync_node(&self, node: Node) -> Outcome {
        let uuid = node.uuid.clone();
        let bmc = match self.bmc(&node) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(node = %uuid, error = %e, "power sync: no driver");
                return Outcome::Failed;
            }
        };
        let (actual, health) = match bmc
            .get_power_and_health(&node.uuid, &node.driver_info)
            .await
        {
            Ok(read) => read,
            Err(e) => {
                // Never guess: power_state keeps its last known value.
                let streak = note_failure(&uuid);
                tracing::warn!(node = %uuid, error = %e, failed_passes = streak, "power sync: cannot read the power state; keeping the recorded one");
                if streak >= FAILURES_BEFORE_ERROR && !is_sync_error(&node) {
                    self.record_failure(&node, streak, &e).await;
                }
                return Outcome::Failed;
            }
        };
        forget_failures(&uuid);
        if is_sync_error(&node) {
            let cleared = self
                .update_fresh(&uuid, |n| {
                    if !eligible(n) || !is_sync_error(n) {
                        return false;
                    }
                    n.last_error = None;
                    true
                })
                .await;
            match cleared {
                Ok(Some(_)) => {
                    tracing::info!(node = %uuid, "power sync: the BMC answers again; its error is cleared")
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(node = %uuid, error = %e, "power sync: cannot clear the node's error")
                }
            }
        }
        // As Ironic: the health is kept on every sync, whatever the power state does.
        if node.health.as_deref() != health.map(rivet_drivers::Health::as_str) {
            self.cache_health(&uuid, health).await;
        }
        let recorded = node.power_state;
        if recorded == Some(actual) {
            return Outcome::Unchanged;
        }
        let enforce = self.config.power_sync.policy == PowerSyncPolicy::Enforce;
        match recorded {
            Some(want @ (PowerState::On | PowerState::Off)) if enforce => {
                self.enforce(&uuid, want, actual, bmc.as_ref()).await
            }
            _ => self.record(&uuid, recorded, actual).await,
        }
    }

    /// Put a streak of failed reads into the node's `last_error` (nothing else changes).
    async fn record_failure(&self, node: &Node, streak: u32, error: &rivet_drivers::DriverError) {
        let kept = node.power_state.map(|p| p.as_str()).unwrap_or("unknown");
        let msg = format!(
            "{SYNC_ERROR_PREFIX}{} from its BMC ({streak} passes in a row); power_state keeps its last known value \"{kept}\" and this error clears itself once the BMC answers again. {error}",
            node.ident()
        );
        let written = self
            .update_fresh(&node.uuid, |n| {
                if !eligible(n) || is_sync_error(n) {
                    return false;
                }
                n.last_error = Some(msg.clone());
                true
            })
            .await;
        if let Err(e) = written {
            tracing::warn!(node = %node.uuid, error = %e, "power sync: cannot record the BMC failure");
        }
    }

    /// Write the BMC's state on a fresh copy of the node (retrying write conflicts).
    async fn record(&self, uuid: &str, seen: Option<PowerState>, actual: PowerState) -> Outcome {
        for _ in 0..WRITE_ATTEMPTS {
            let mut node = match self.store.get_node(uuid).await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(node = %uuid, error = %e, "power sync: cannot reload node");
                    return Outcome::Failed;
                }
            };
            // Someone took the node, or changed its power, while the BMC answered.
            if !eligible(&node) || node.power_state != seen {
                return Outcome::Skipped;
            }
            node.power_state = Some(actual);
            match self.update_node(&node).await {
                Ok(_) => {
                    let from = seen.map(|p| p.as_str()).unwrap_or("unknown");
                    tracing::info!(node = %uuid, from, to = %actual, "power sync: recorded the BMC's power state");
                    return Outcome::Recorded;
                }
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => {
                    tracing::warn!(node = %uuid, error = %e, "power sync: cannot write node");
                    return Outcome::Failed;
                }
            }
        }
        Outcome::Skipped
    }

    /// Set the BMC back to `want`, holding `target_power_state` while it works so user power
    /// actions wait (the same claim the power API uses).
    async fn enforce(
        &self,
        uuid: &str,
        want: PowerState,
        actual: PowerState,
        bmc: &dyn rivet_drivers::Bmc,
    ) -> Outcome {
        let claimed = self
            .update_fresh(uuid, |n| {
                if !eligible(n) || n.power_state != Some(want) {
                    return false;
                }
                n.target_power_state = Some(want);
                true
            })
            .await;
        let node = match claimed {
            Ok(Some(n)) => n,
            Ok(None) => return Outcome::Skipped,
            Err(e) => {
                tracing::warn!(node = %uuid, error = %e, "power sync: cannot claim node");
                return Outcome::Failed;
            }
        };
        tracing::warn!(node = %uuid, recorded = %want, actual = %actual, "power sync: BMC differs from the recorded power state; enforcing");
        let result = bmc.set_power(uuid, &node.driver_info, want).await;
        if let Err(e) = &result {
            tracing::warn!(node = %uuid, error = %e, "power sync: cannot enforce the power state");
        }
        let released = self
            .update_fresh(uuid, |n| {
                if n.target_power_state != Some(want) {
                    return false;
                }
                n.target_power_state = None;
                true
            })
            .await;
        if let Err(e) = released {
            tracing::warn!(node = %uuid, error = %e, "power sync: cannot release node");
        }
        if result.is_ok() {
            Outcome::Enforced
        } else {
            Outcome::Failed
        }
    }

    /// Apply `change` to a fresh copy and write it, again on conflicts; `None` when `change`
    /// declines.
    pub(super) async fn update_fresh(
        &self,
        uuid: &str,
        change: impl Fn(&mut Node) -> bool,
    ) -> Result<Option<Node>, StoreError> {
        let mut last = None;
        for _ in 0..WRITE_ATTEMPTS {
            let mut node = self.store.get_node(uuid).await?;
            if !change(&mut node) {
                return Ok(None);
            }
            match self.update_node(&node).await {
                Ok(n) => return Ok(Some(n)),
                Err(e @ StoreError::Conflict { .. }) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| StoreError::Backend("no write attempted".into())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rivet_drivers::Bmc;
    use rivet_model::config::Config;
    use rivet_store::sqlite::SqliteStore;

    async fn conductor(policy: PowerSyncPolicy) -> (Arc<Conductor>, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("rivet.db");
        let store = SqliteStore::open(
            &path.to_string_lossy(),
            rivet_support::secrets::Secrets::ephemeral(),
        )
        .expect("store");
        let mut config = Config {
            conductor_id: "c1".into(),
            ..Config::default()
        };
        config.power_sync.policy = policy;
        (Conductor::new(Arc::new(store), config), dir)
    }

    async fn node(
        c: &Conductor,
        name: &str,
        state: ProvisionState,
        power: Option<PowerState>,
    ) -> Node {
        let mut n = Node::new(uuid::Uuid::new_v4().to_string(), "fake-hardware".into());
        n.name = Some(name.into());
        n.provision_state = state;
        n.power_state = power;
        c.store.create_node(&n).await.expect("create")
    }

    #[tokio::test]
    async fn record_policy_records_and_skips_what_it_must() {
        let (c, _dir) = conductor(PowerSyncPolicy::Record).await;
        let info = serde_json::Map::new();
        let managed = node(&c, "m", ProvisionState::Manageable, Some(PowerState::Off)).await;
        let first = node(&c, "first", ProvisionState::Available, None).await;
        let enroll = node(&c, "e", ProvisionState::Enroll, None).await;
        let cleaning = node(&c, "cw", ProvisionState::CleanWait, Some(PowerState::Off)).await;
        let mut maint = node(&c, "mt", ProvisionState::Manageable, Some(PowerState::Off)).await;
        maint.maintenance = true;
        c.store.update_node(&maint).await.expect("maint");
        let mut reserved = node(&c, "r", ProvisionState::Manageable, Some(PowerState::Off)).await;
        reserved.reservation = Some("other".into());
        c.store.update_node(&reserved).await.expect("reserve");
        for n in [&managed, &cleaning, &maint, &reserved] {
            c.fake
                .set_power(&n.uuid, &info, PowerState::On)
                .await
                .expect("on");
        }

        let stats = c.power_sync_once().await.expect("pass");
        assert_eq!(stats.checked, 2, "{stats:?}");
        assert_eq!(stats.recorded, 2, "{stats:?}");
        let get = |u: String| {
            let c = c.clone();
            async move { c.store.get_node(&u).await.expect("get").power_state }
        };
        assert_eq!(get(managed.uuid).await, Some(PowerState::On));
        assert_eq!(get(first.uuid).await, Some(PowerState::Off));
        assert_eq!(get(enroll.uuid).await, None);
        assert_eq!(get(cleaning.uuid).await, Some(PowerState::Off));
        assert_eq!(get(maint.uuid).await, Some(PowerState::Off));
        assert_eq!(get(reserved.uuid).await, Some(PowerState::Off));

        // Nothing differs any more: a second pass writes nothing.
        let again = c.power_sync_once().await.expect("pass");
        assert_eq!(again.recorded, 0, "{again:?}");
    }

    #[tokio::test]
    async fn enforce_policy_sets_the_bmc_back() {
        let (c, _dir) = conductor(PowerSyncPolicy::Enforce).await;
        let info = serde_json::Map::new();
        let n = node(&c, "m", ProvisionState::Available, Some(PowerState::Off)).await;
        c.fake
            .set_power(&n.uuid, &info, PowerState::On)
            .await
            .expect("on");
        let stats = c.power_sync_once().await.expect("pass");
        assert_eq!(stats.enforced, 1, "{stats:?}");
        assert_eq!(
            c.fake.get_power(&n.uuid, &info).await.expect("read"),
            PowerState::Off
        );
        let after = c.store.get_node(&n.uuid).await.expect("get");
        assert_eq!(after.power_state, Some(PowerState::Off));
        assert_eq!(after.target_power_state, None);
    }

    #[tokio::test]
    async fn unreadable_bmc_changes_nothing() {
        let (c, _dir) = conductor(PowerSyncPolicy::Record).await;
        let mut n = node(&c, "bad", ProvisionState::Manageable, Some(PowerState::On)).await;
        n.driver_info
            .insert("fake_fail".into(), "BMC unreachable".into());
        let n = c.store.update_node(&n).await.expect("update");
        let stats = c.power_sync_once().await.expect("pass");
        assert_eq!(stats.failed, 1, "{stats:?}");
        let after = c.store.get_node(&n.uuid).await.expect("get");
        assert_eq!(after.power_state, Some(PowerState::On));
        assert_eq!(after.last_error, None);
        assert_eq!(after.version, n.version);
    }

    #[tokio::test]
    async fn failed_reads_keep_the_power_state_and_are_recorded_after_a_streak() {
        let (c, _dir) = conductor(PowerSyncPolicy::Record).await;
        let mut n = node(&c, "flaky", ProvisionState::Available, Some(PowerState::On)).await;
        n.driver_info
            .insert("fake_fail".into(), "BMC at 192.0.2.7 timed out".into());
        let n = c.store.update_node(&n).await.expect("update");
        for pass in 1..=FAILURES_BEFORE_ERROR + 1 {
            let stats = c.power_sync_once().await.expect("pass");
            assert_eq!(stats.failed, 1, "{stats:?}");
            let after = c.store.get_node(&n.uuid).await.expect("get");
            assert_eq!(after.power_state, Some(PowerState::On), "pass {pass}");
            let err = after.last_error.unwrap_or_default();
            if pass < FAILURES_BEFORE_ERROR {
                assert!(err.is_empty(), "pass {pass}: {err}");
            } else {
                assert!(err.contains("flaky") && err.contains("192.0.2.7"), "{err}");
                assert!(
                    err.contains("keeps its last known value \"power on\""),
                    "{err}"
                );
            }
        }
        // Written once per streak, not on every failed pass.
        let recorded = c.store.get_node(&n.uuid).await.expect("get");
        assert_eq!(recorded.version, n.version + 1);

        // The BMC answers again (and reports off): the error goes, the state is recorded.
        let mut fixed = recorded;
        fixed.driver_info.remove("fake_fail");
        let fixed = c.store.update_node(&fixed).await.expect("update");
        c.power_sync_once().await.expect("pass");
        let after = c.store.get_node(&fixed.uuid).await.expect("get");
        assert_eq!(after.last_error, None);
        assert_eq!(after.power_state, Some(PowerState::Off));
    }

    #[tokio::test]
    async fn other_errors_are_not_cleared_by_the_sync() {
        let (c, _dir) = conductor(PowerSyncPolicy::Record).await;
        let mut n = node(&c, "e", ProvisionState::Manageable, Some(PowerState::Off)).await;
        n.last_error = Some("clean step power_on failed".into());
        let n = c.store.update_node(&n).await.expect("update");
        c.power_sync_once().await.expect("pass");
        let after = c.store.get_node(&n.uuid).await.expect("get");
        assert_eq!(
            after.last_error.as_deref(),
            Some("clean step power_on failed")
        );
    }
}
