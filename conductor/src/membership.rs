//! This controller among others on one database: registration heartbeat (which keeps its
//! leases alive),
//! the hash ring of live controllers, routing of kicks and agent wake-ups to whoever can act
//! on them, and takeover when a controller dies.
//!
//! With one controller (the SQLite default) the ring holds only this one, kicks stay local
//! and nothing is published, so the single-process path costs one heartbeat write per
//! interval and nothing per request.

use super::supervisor::LoopEnd;
use super::Conductor;
use rivet_protocol::states::ProvisionState;
use rivet_store::Notice;
use rivet_support::cluster::HashRing;
use std::sync::Arc;
use std::time::Duration;

/// States in which a node is (or may be) under some controller's lease.
const LEASED: &[ProvisionState] = &[
    ProvisionState::Verifying,
    ProvisionState::Inspecting,
    ProvisionState::InspectWait,
    ProvisionState::Cleaning,
    ProvisionState::CleanWait,
    ProvisionState::CleanHold,
    ProvisionState::Deploying,
    // A deploy (or rescue, or servicing) waiting for its agent is leased too: without
    // these, a controller killed mid-`write_image` left the node to nobody.
    ProvisionState::WaitCallBack,
    ProvisionState::DeployHold,
    ProvisionState::Deleting,
    ProvisionState::Adopting,
    ProvisionState::Rescuing,
    ProvisionState::RescueWait,
    ProvisionState::Unrescuing,
    ProvisionState::Servicing,
    ProvisionState::ServiceWait,
    ProvisionState::ServiceHold,
];

impl Conductor {
    /// The ring as this controller sees it now.
    pub fn ring(&self) -> Arc<HashRing> {
        match self.ring.read() {
            Ok(r) => r.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// The controller that owns node `uuid` (this one while the ring is empty).
    pub fn owner_of(&self, uuid: &str) -> String {
        self.ring().owner(uuid).unwrap_or(self.id()).to_string()
    }

    /// Whether this controller owns node `uuid`.
    pub fn owns(&self, uuid: &str) -> bool {
        self.ring().owner(uuid).is_none_or(|o| o == self.id())
    }

    /// How long a silent controller stays alive in the others' eyes; its leases expire with
    /// it.
    pub fn dead_after_s(&self) -> u64 {
        self.config.conductor.dead_after_s.max(1)
    }

    fn clustered(&self) -> bool {
        self.ring().members().len() > 1
    }

    /// Wake the agent long polls of `uuid`, here and (when others share the store) wherever
    /// the agent's heartbeat is held.
    pub fn wake_agent(&self, uuid: &str) {
        self.wakeup(uuid).notify_waiters();
        if self.clustered() {
            self.publish(Notice::Wake {
                from: self.id().to_string(),
                node: uuid.to_string(),
            });
        }
    }

    /// Ask the owner of `uuid` to drive it.
    pub(super) fn forward_kick(&self, uuid: &str) {
        self.publish(Notice::Kick {
            from: self.id().to_string(),
            node: uuid.to_string(),
        });
    }

    fn publish(&self, notice: Notice) {
        let store = self.store.clone();
        // On the node-task tracker, so shutdown waits for a notice in flight like for any
        // other work it started.
        self.tasks.spawn(async move {
            if let Err(e) = store.publish(&notice).await {
                // The periodic scan and the owner's own rescan pick the node up anyway.
                tracing::warn!(error = %e, notice = %notice.encode(), "cannot notify the other controllers");
            }
        });
    }

    /// Write this controller's heartbeat (which keeps its leases alive) and rebuild the ring
    /// from the live controllers. `Ok(true)` when the membership changed.
    pub async fn refresh_membership(&self, starting: bool) -> Result<bool, super::ConductorError> {
        {
            let stopped = self.registration.lock().await;
            if *stopped {
                return Ok(false);
            }
            self.store
                .conductor_heartbeat(self.id(), &rivet_model::config::hostname(), starting)
                .await?;
        }
        let mut alive: Vec<String> = self
            .store
            .list_conductors(self.dead_after_s())
            .await?
            .into_iter()
            .filter(|c| c.alive)
            .map(|c| c.id)
            .collect();
        // This controller just wrote its heartbeat: it is alive even if its clock and the
        // database's disagree.
        alive.push(self.id().to_string());
        let ring = HashRing::new(alive);
        let old = self.ring();
        if *old == ring {
            return Ok(false);
        }
        tracing::info!(
            members = ?ring.members(),
            before = ?old.members(),
            "controller membership changed; nodes are spread over the new ring"
        );
        match self.ring.write() {
            Ok(mut r) => *r = Arc::new(ring),
            Err(p) => *p.into_inner() = Arc::new(ring),
        }
        Ok(true)
    }

    /// After a membership change: drive the nodes this controller now owns (a dead
    /// controller's leases have expired by now, so they are taken over), and hand back the
    /// ones it holds but no longer owns, unless a task is working on them right now (that
    /// task finishes its step; the next rebalance hands the node over).
    pub async fn rebalance(self: &Arc<Self>) -> Result<(usize, usize), super::ConductorError> {
        let (mut taken, mut handed) = (0, 0);
        for node in self.store.node_summaries(LEASED).await? {
            if self.owns(&node.uuid) {
                let foreign = node.reservation.as_deref().is_some_and(|r| r != self.id());
                if foreign {
                    tracing::warn!(node = %node.uuid, state = %node.provision_state,
                        previous = node.reservation.as_deref().unwrap_or_default(),
                        "taking the node over from another controller");
                    taken += 1;
                }
                let held = matches!(
                    node.provision_state,
                    ProvisionState::CleanHold
                        | ProvisionState::DeployHold
                        | ProvisionState::ServiceHold
                );
                if !node.maintenance && !held {
                    self.kick(&node.uuid);
                }
            } else if node.reservation.as_deref() == Some(self.id())
                && !self.is_running(&node.uuid)
                && self.store.release_lease(&node.uuid, self.id()).await?
            {
                handed += 1;
                self.forward_kick(&node.uuid);
            }
        }
        if taken + handed > 0 {
            tracing::info!(taken, handed, "rebalanced nodes over the controllers");
        }
        Ok((taken, handed))
    }

    /// Heartbeat (keeping this controller's leases alive) and follow membership forever.
    /// On a shared store, a heartbeat that has failed for `dead_after_s` ends it: the other
    /// controllers count this one dead and take its nodes, so it must stop driving them.
    pub async fn run_membership(self: Arc<Self>) -> LoopEnd {
        let every = Duration::from_secs(self.config.conductor.heartbeat_interval_s.max(1));
        let dead_after = Duration::from_secs(self.dead_after_s());
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tick.tick().await;
            match self.refresh_membership(false).await {
                Ok(changed) => {
                    last_ok = tokio::time::Instant::now();
                    if changed {
                        if let Err(e) = self.rebalance().await {
                            tracing::error!(error = %e, "rebalancing after a membership change failed");
                        }
                    }
                }
                Err(e) if self.store.is_shared() && last_ok.elapsed() >= dead_after => {
                    return LoopEnd::Failed(format!(
                        "no registration heartbeat written for {} s (dead_after_s = {}): the other \
                         controllers count this one dead and have taken its nodes; last error: {e}",
                        last_ok.elapsed().as_secs(),
                        dead_after.as_secs()
                    ));
                }
                // Only a shared database has other controllers to take the nodes over; on
                // SQLite (one controller) the failure is the store's (a full disk, say).
                Err(e) if self.store.is_shared() => {
                    tracing::error!(error = %e, "controller heartbeat failed; other controllers will count this one dead and take its nodes")
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot write this controller's registration heartbeat to the database")
                }
            }
        }
    }

    /// Act on other controllers' notices forever (when the store carries them).
    pub async fn run_notices(self: Arc<Self>) -> LoopEnd {
        let Some(mut rx) = self.store.subscribe() else {
            return LoopEnd::NotNeeded;
        };
        while let Some(notice) = rx.recv().await {
            match notice {
                Notice::Kick { from, node } if from != self.id() && self.owns(&node) => {
                    self.kick(&node);
                }
                Notice::Wake { from, node } if from != self.id() => {
                    self.wakeup(&node).notify_waiters();
                }
                Notice::Resync => {
                    if let Err(e) = self.rebalance().await {
                        tracing::error!(error = %e, "rescan after a lost notification connection failed");
                    }
                }
                _ => {}
            }
        }
        LoopEnd::Failed("the notification stream from the database ended".into())
    }
}
