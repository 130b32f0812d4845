//! The conductor: runs each node's current operation to its next stable point.
//!
//! It is level-triggered: [`Conductor::kick`] loads the node, decides the next action from its
//! provision state, does it, and writes the result with an optimistic version check. A lost
//! task, a restart or a duplicate kick all converge, because the decision is made again from
//! what the store says. Work for one node runs in at most one task at a time; while it runs
//! the node carries this conductor's id in `reservation`.
//!
//! A layer of rivetd above the store and the drivers (which it joins: it reads a node, asks
//! its BMC or its agent, writes the result) and under the API. [`metrics`] is its exposition
//! of the process-wide registry, with the fleet read from the store at scrape time.
//!
//! It serves no HTTP: the agent protocol, the API and `GET /metrics` (on the API address and
//! on `[metrics] listen`) are rivetd's, in the controller crate, which calls in here; the
//! controller also hands its own critical loops to [`Conductor::run_background`] so they are
//! supervised with the conductor's.
#![warn(missing_docs)]

pub mod agent;
mod agent_logs;
mod allocations;
pub mod bmc_caches;
pub mod boot;
pub mod boot_mode;
mod cleaning;
pub mod console_tail;
mod deploying;
pub mod discovery;
mod errors;
pub mod fast_track;
pub mod health;
mod identity;
pub mod image_cache;
mod inspection;
pub mod inspection_rules;
mod liveness;
mod local_image;
mod membership;
pub mod metrics;
pub mod node_events;
mod oob_steps;
mod periodic;
mod power_policy;
mod power_sync;
mod raid_steps;
mod rescue;
pub mod servicing;
pub mod step_record;
pub mod step_report;
pub use rivet_model::steps;
pub mod supervisor;
mod templates;
mod text;
mod verbs;

pub use deploying::{FAILURE_POWER_ACTION, FAILURE_POWER_ERROR_ACTION};
pub use errors::ConductorError;
pub use fast_track::FAST_TRACK_ACTION;
pub use local_image::ImageRefusal;
pub use verbs::check_image_info;
pub use verbs::AbortRefusal;

use chrono::Utc;
use rivet_drivers::{self as drivers, fake::FakeBmc, Bmc, BootDevice};
use rivet_model::config::Config;
use rivet_model::fsm::{self, Event};
use rivet_model::node::Node;
use rivet_protocol::states::ProvisionState;
use rivet_store::NodeExt;
use rivet_store::{Store, StoreError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// How long a node task waits before driving the node again when the database is
/// unavailable (a restart takes seconds; a full disk waits for an operator).
const STORE_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

/// The conductor and everything it needs.
pub struct Conductor {
    /// Node and port records.
    pub store: Arc<dyn Store>,
    /// Configuration.
    pub config: Config,
    /// The in-memory BMCs of `fake-hardware` nodes.
    pub fake: Arc<FakeBmc>,
    /// Nodes with a task running in this process.
    /// Value: kicked again while running, so the task decides once more before it ends (a
    /// result that lands just after the task's last look must not wait for the next scan).
    running: Mutex<HashMap<String, bool>>,
    /// Per-node wake-ups of agent long polls.
    wakeups: Mutex<HashMap<String, Arc<tokio::sync::Notify>>>,
    /// Held polls reading their answer at once ([`agent::HeldPoll::answer`]).
    answering: tokio::sync::Semaphore,
    /// Live controllers sharing the store; a node's work belongs to its owner on this ring.
    ring: std::sync::RwLock<Arc<rivet_support::cluster::HashRing>>,
    /// Node tasks (waited for at shutdown).
    pub tasks: supervisor::TaskTracker,
    /// Cancelled once, at shutdown: no new node task starts, held long polls answer.
    pub shutdown: supervisor::CancellationToken,
    /// Agent liveness waiting to be written in one batch ([`liveness`]).
    liveness: Arc<liveness::LivenessBatcher>,
    /// Test-only fault injection: called with the node before each decision.
    fault_hook: std::sync::RwLock<Option<FaultHook>>,
    /// Held around each registration heartbeat; `true` once shutdown has marked this
    /// controller offline, so that a heartbeat racing the shutdown cannot mark it online again.
    pub(crate) registration: tokio::sync::Mutex<bool>,
    /// This conductor, for work started from `&self` that must outlive the call (the power
    /// off after a deploy failure).
    me: std::sync::Weak<Conductor>,
    /// Every node record this process writes, for live views ([`node_events`]).
    pub events: node_events::NodeEvents,
    /// The console capture failure events quote ([`console_tail`]), installed by rivetd.
    console_tail: std::sync::OnceLock<Arc<dyn console_tail::ConsoleTail>>,
    /// The images of `image_download_source = "local"` deploys ([`image_cache`]).
    pub image_cache: Arc<image_cache::ImageCache>,
}

/// A function the conductor calls before each decision about a node (tests inject panics
/// with it; production never sets one).
pub type FaultHook = Arc<dyn Fn(&Node) + Send + Sync>;

impl Conductor {
    /// A conductor over `store`.
    pub fn new(store: Arc<dyn Store>, config: Config) -> Arc<Conductor> {
        Arc::new_cyclic(|me| Conductor {
            me: me.clone(),
            liveness: Arc::new(liveness::LivenessBatcher::new(store.clone())),
            store,
            fake: Arc::new(FakeBmc::default()),
            running: Mutex::new(HashMap::new()),
            wakeups: Mutex::new(HashMap::new()),
            answering: tokio::sync::Semaphore::new(agent::ANSWERING_AT_ONCE),
            ring: std::sync::RwLock::new(Arc::new(rivet_support::cluster::HashRing::new([config
                .conductor_id
                .clone()]))),
            tasks: supervisor::TaskTracker::new(),
            shutdown: supervisor::CancellationToken::new(),
            fault_hook: std::sync::RwLock::new(None),
            registration: tokio::sync::Mutex::new(false),
            events: node_events::NodeEvents::default(),
            console_tail: std::sync::OnceLock::new(),
            image_cache: Arc::new(image_cache::ImageCache::new(
                config.image_cache.dir_for(&config.db),
                config.image_cache.clone(),
                config.deploy.image_ca_pem(),
            )),
            config,
        })
    }

    /// Install (or with `None` remove) a fault hook: for tests that need a node task to
    /// misbehave, e.g. panic, to see that the node fails cleanly while others go on.
    #[doc(hidden)]
    pub fn set_fault_hook(&self, hook: Option<FaultHook>) {
        match self.fault_hook.write() {
            Ok(mut h) => *h = hook,
            Err(p) => *p.into_inner() = hook,
        }
    }

    /// Write `node` (optimistic version check, as [`Store::update_node`]) and publish the
    /// written record to live watchers. Every node write of the conductor goes through here,
    /// so a watcher sees provision, power, maintenance and step changes alike.
    pub async fn update_node(&self, node: &Node) -> Result<Node, StoreError> {
        let written = self.store.update_node(node).await?;
        self.events.publish(&written);
        Ok(written)
    }

    /// This conductor's id.
    pub fn id(&self) -> &str {
        &self.config.conductor_id
    }

    /// The BMC driver of a node.
    pub fn bmc(&self, node: &Node) -> Result<Arc<dyn Bmc>, ConductorError> {
        let bmc = drivers::for_node(&node.driver, &self.fake, &self.config.drivers);
        bmc.map(|b| crate::metrics::bmc::wrap(&node.driver, b))
            .map_err(|e| ConductorError::Driver {
                node: node.ident().to_string(),
                message: e.to_string(),
            })
    }

    /// Whether a task for `uuid` runs in this process.
    pub fn is_running(&self, uuid: &str) -> bool {
        self.running
            .lock()
            .map(|r| r.contains_key(uuid))
            .unwrap_or(false)
    }

    /// Make sure a task drives `uuid` forward; a no-op when one already runs. A node another
    /// controller owns is its business: it is told instead.
    pub fn kick(self: &Arc<Self>, uuid: &str) {
        if self.shutdown.is_cancelled() {
            // Shutting down: the next owner (or this one, restarted) resumes the node.
            return;
        }
        if !self.owns(uuid) {
            self.forward_kick(uuid);
            return;
        }
        {
            let Ok(mut running) = self.running.lock() else {
                return;
            };
            if let Some(again) = running.get_mut(uuid) {
                *again = true;
                return;
            }
            running.insert(uuid.to_string(), false);
        }
        let this = self.clone();
        let uuid = uuid.to_string();
        self.tasks.spawn(async move {
            use futures_util::FutureExt;
            loop {
                // A panic is caught here, not left to kill the task: the node would keep its
                // `running` entry and no task would ever drive it again until a restart.
                match std::panic::AssertUnwindSafe(this.drive(&uuid))
                    .catch_unwind()
                    .await
                {
                    Ok(Ok(())) => {}
                    Ok(Err(ConductorError::Store(StoreError::Unavailable(why))))
                        if !this.shutdown.is_cancelled() =>
                    {
                        // The database is out for a while (restarting, disk full): resume
                        // once it answers; the agent or timer that kicked the node may not
                        // come again.
                        tracing::warn!(node = %uuid, error = %why, "database unavailable; driving the node again in {STORE_RETRY:?}");
                        tokio::select! {
                            _ = this.shutdown.cancelled() => {}
                            _ = tokio::time::sleep(STORE_RETRY) => continue,
                        }
                    }
                    Ok(Err(e)) => {
                        tracing::error!(node = %uuid, error = %e, "conductor task failed")
                    }
                    Err(payload) => {
                        let what = supervisor::panic_message(&*payload);
                        tracing::error!(node = %uuid, panic = %what, "conductor task panicked; failing the node's operation");
                        this.fail_after_panic(&uuid, &what).await;
                    }
                }
                let Ok(mut running) = this.running.lock() else {
                    return;
                };
                match running.get_mut(&uuid) {
                    Some(again) if *again => *again = false,
                    _ => {
                        running.remove(&uuid);
                        return;
                    }
                }
            }
        });
    }

    /// Drive a node until it rests (stable, waiting, failed, or in maintenance).
    async fn drive(&self, uuid: &str) -> Result<(), ConductorError> {
        let mut node = self.store.get_node(uuid).await?;
        loop {
            if node.corrupt.is_some() {
                // Acting on a half-read record could power off the wrong thing or forget a
                // run; the operator repairs the row, then kicks it again with a verb.
                let e = node
                    .writable()
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                tracing::error!(node = %uuid, error = %e, "node record does not decode; conductor leaves it alone");
                return Ok(());
            }
            if node.maintenance {
                tracing::info!(node = %uuid, state = %node.provision_state, "node in maintenance; conductor paused");
                return Ok(());
            }
            let agent_wait = matches!(
                node.provision_state,
                ProvisionState::CleanWait
                    | ProvisionState::InspectWait
                    | ProvisionState::WaitCallBack
                    | ProvisionState::RescueWait
                    | ProvisionState::ServiceWait
            );
            if !node.provision_state.is_conductor_busy() && !agent_wait {
                return Ok(());
            }
            match self.step(node.clone()).await {
                Ok(Some(n)) => node = n,
                Ok(None) => return Ok(()),
                // Someone else wrote (an API call, the periodic scan): decide again from the
                // stored node, which is what level-triggered means.
                Err(ConductorError::Store(StoreError::Conflict { .. })) => {
                    node = self.store.get_node(uuid).await?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One decision for a node in a conductor-busy state: the node as written, or `None`
    /// when nothing more can happen until something external does.
    async fn step(&self, mut node: Node) -> Result<Option<Node>, ConductorError> {
        use ProvisionState::*;
        let hook = self.fault_hook.read().ok().and_then(|h| h.clone());
        if let Some(hook) = hook {
            hook(&node);
        }
        if node.reservation.as_deref() != Some(self.id()) {
            // Take the lease in one statement, whatever other controllers believe about the
            // ring; refused while another live controller holds it. A node that already
            // names this controller needs no statement: a steal would have moved its
            // version, and the next write would conflict and bring us back here.
            if !self
                .store
                .acquire_lease(&node.uuid, self.id(), self.dead_after_s())
                .await?
            {
                tracing::debug!(node = %node.uuid, holder = node.reservation.as_deref().unwrap_or_default(),
                    "another live controller holds the node's lease; leaving it");
                return Ok(None);
            }
            node = self.store.get_node(&node.uuid).await?;
            // Another controller may have finished the work meanwhile (rings disagree for a
            // moment after a membership change): a resting node keeps no reservation.
            let holds = node.provision_state.is_conductor_busy()
                || matches!(
                    node.provision_state,
                    CleanWait
                        | CleanHold
                        | InspectWait
                        | WaitCallBack
                        | DeployHold
                        | RescueWait
                        | ServiceWait
                        | ServiceHold
                );
            if !holds {
                self.store.release_lease(&node.uuid, self.id()).await?;
                return Ok(None);
            }
        }
        let bmc = match self.bmc(&node) {
            Ok(b) => b,
            Err(e) => return self.fail(node, &e.to_string()).await.map(Some),
        };
        match node.provision_state {
            Verifying => {
                let checked = match bmc.validate(&node.driver_info) {
                    Ok(()) => bmc.get_power(&node.uuid, &node.driver_info).await,
                    Err(e) => Err(e),
                };
                match checked {
                    Ok(power) => {
                        node.power_state = Some(power);
                        crate::bmc_caches::refresh_caches_logged(
                            self.store.as_ref(),
                            bmc.as_ref(),
                            &node.uuid,
                            &node.driver_info,
                        )
                        .await;
                        self.event(node, Event::Done, None).await.map(Some)
                    }
                    Err(e) => {
                        let msg = format!(
                            "failed to verify the BMC of node {}: {e}; fix driver_info and run `manage` again",
                            node.ident()
                        );
                        self.fail(node, &msg).await.map(Some)
                    }
                }
            }
            Cleaning | CleanWait => self.advance_cleaning(node, bmc.as_ref()).await,
            Deleting => {
                // Tear down: power off, boot from the network again (the next boot is the
                // cleaning ramdisk's), forget the instance, then automated cleaning.
                let torn = async {
                    // disable_power_off (1.95): no power off; the reboot below instead.
                    self.power_off_unless_kept_on(&node, bmc.as_ref()).await?;
                    // Secure Boot Rivet turned on was the instance's, not the machine's.
                    self.undo_secure_boot(&node, bmc.as_ref()).await?;
                    // The next boot is the cleaning ramdisk's: from the network for PXE
                    // (virtual media sets its own one-time override when it inserts).
                    if !node.interfaces.fake_boot(&node.driver)
                        && boot::BootMethod::of(&node) == boot::BootMethod::Network
                    {
                        bmc.set_boot_device_persistent(
                            &node.uuid,
                            &node.driver_info,
                            BootDevice::Pxe,
                            self.override_mode(&node).await,
                        )
                        .await?;
                    }
                    self.reboot_if_kept_on(&node, bmc.as_ref()).await?;
                    Ok::<_, rivet_drivers::DriverError>(())
                }
                .await;
                if let Err(e) = torn {
                    let msg = format!(
                        "failed to tear down node {}: {e}; fix the BMC and send `deleted` again",
                        node.ident()
                    );
                    return self.fail(node, &msg).await.map(Some);
                }
                node.power_state = Some(power_policy::state_after_off(&node));
                node.instance_uuid = None;
                // Ironic deletes the node's allocation with its instance.
                if let Some(a) = node.allocation_uuid.take() {
                    if let Err(e) = self.store.delete_allocation(&a).await {
                        tracing::warn!(node = %node.uuid, allocation = %a, error = %e, "cannot delete the allocation of the undeployed node");
                    }
                }
                node.instance_info.clear();
                rivet_model::internal_info::set_secure_boot_enabled_by_rivet(
                    &mut node.driver_internal_info,
                    false,
                );
                node.runs.deploy = None;
                rivet_model::internal_info::forget_deployed_image(&mut node.driver_internal_info);
                node.runs.service = None;
                rescue::clear_run(&mut node);
                agent::forget_agent_token(&mut node);
                let _ = self.store.cancel_pending(&node.uuid).await;
                self.event(node, Event::Clean, None).await.map(Some)
            }
            Inspecting | InspectWait => self.advance_inspection(node, bmc.as_ref()).await,
            Deploying | WaitCallBack => self.advance_deploy(node, bmc.as_ref()).await,
            Adopting => self.adopt(node, bmc.as_ref()).await.map(Some),
            Servicing | ServiceWait => self.advance_service(node, bmc.as_ref()).await,
            // The agent rescue interface boots the ramdisk; `fake` (fake-hardware) has no
            // work to do, as in Ironic.
            Rescuing | RescueWait | Unrescuing
                if node
                    .interfaces
                    .get(&node.driver, rivet_model::interfaces::Iface::Rescue)
                    == "agent" =>
            {
                if node.provision_state == Unrescuing {
                    self.advance_unrescue(node, bmc.as_ref()).await.map(Some)
                } else {
                    self.advance_rescue(node, bmc.as_ref()).await
                }
            }
            Rescuing | Unrescuing => {
                if node
                    .interfaces
                    .check_verb(
                        node.ident(),
                        &node.driver,
                        rivet_protocol::states::Verb::Rescue,
                    )
                    .is_ok()
                {
                    self.event(node, Event::Done, None).await.map(Some)
                } else {
                    let msg = format!(
                        "node {} has rescue_interface {:?}, which cannot rescue",
                        node.ident(),
                        node.interfaces
                            .get(&node.driver, rivet_model::interfaces::Iface::Rescue)
                    );
                    self.fail(node, &msg).await.map(Some)
                }
            }
            _ => Ok(None),
        }
    }

    /// Adopt a node that already runs its instance: check the deploy interface has what it
    /// needs (the image the instance came from) and that the BMC answers, then `active`.
    /// Nothing is written and the power is left alone.
    async fn adopt(&self, mut node: Node, bmc: &dyn Bmc) -> Result<Node, ConductorError> {
        if node.interfaces.uses_agent(&node.driver) {
            if let Err(e) = verbs::check_image_info(&node) {
                let msg = format!("adoption of node {} failed: {e}", node.ident());
                return self.fail(node, &msg).await;
            }
        }
        let checked = match bmc.validate(&node.driver_info) {
            Ok(()) => bmc.get_power(&node.uuid, &node.driver_info).await,
            Err(e) => Err(e),
        };
        match checked {
            Ok(power) => {
                node.power_state = Some(power);
                tracing::info!(node = %node.uuid, power = %power, "node adopted");
                self.event(node, Event::Done, None).await
            }
            Err(e) => {
                let msg = format!(
                    "adoption of node {} failed: its BMC did not answer: {e}; fix driver_info and `adopt` again",
                    node.ident()
                );
                self.fail(node, &msg).await
            }
        }
    }

    /// Whether automated cleaning applies to this node.
    pub fn automated_clean_enabled(&self, node: &Node) -> bool {
        node.automated_clean
            .unwrap_or(self.config.conductor.automated_clean)
    }

    /// Fire a conductor event and persist. Leaving a busy state for a resting one releases
    /// the reservation in the same write.
    async fn event(
        &self,
        mut node: Node,
        event: Event,
        last_error: Option<String>,
    ) -> Result<Node, ConductorError> {
        let from = node.provision_state;
        let to = fsm::next(from, event).ok_or_else(|| ConductorError::InvalidState {
            node: node.ident().to_string(),
            state: from,
            action: event.as_str().to_string(),
            allowed: fsm::allowed_verbs(from),
        })?;
        node.provision_state = to;
        node.target_provision_state = match fsm::target_of(from, event, to) {
            // Staying inside one operation keeps its target (manual vs automated cleaning).
            Some(_) if node.target_provision_state.is_some() && !to.is_stable() => {
                node.target_provision_state
            }
            t => t,
        };
        // When it entered the state it leaves (enrolment, if it never moved).
        let since = node.provision_updated_at.or(Some(node.created_at));
        node.provision_updated_at = Some(Utc::now());
        if let Some(err) = last_error {
            node.last_error = Some(err);
        }
        // Cleaning and deploy keep the node reserved for the whole run, waits and holds
        // included.
        let keeps = matches!(
            to,
            ProvisionState::CleanWait
                | ProvisionState::CleanHold
                | ProvisionState::WaitCallBack
                | ProvisionState::DeployHold
                | ProvisionState::ServiceWait
                | ProvisionState::ServiceHold
        );
        if !to.is_conductor_busy() && !keeps {
            node.reservation = None;
        }
        if to.is_stable() || to.is_failed() {
            node.clean_step = None;
            node.deploy_step = None;
        }
        if to.is_stable() {
            // The ramdisk's token belongs to one boot and one operation. A failed node keeps
            // it so the agent can still collect an abort for the step it may be running, and
            // a fast-track ramdisk left running keeps it for the next operation.
            if fast_track::keeps_agent(&node, to, &self.config.deploy) {
                tracing::info!(node = %node.uuid, state = %to, "fast track: the agent keeps its token and goes on heartbeating");
            } else {
                agent::forget_agent_token(&mut node);
            }
        }
        // The power after a deploy failure is decided in the background; recorded here, in
        // the transition's own write, so a restart in between still does it (recover()).
        node.runs.failure_power_pending = to == ProvisionState::DeployFailed;
        tracing::info!(node = %node.uuid, from = %from, to = %to, event = event.as_str(), "provision state changed");
        let node = self.update_node(&node).await?;
        self.record_transition(&node, from, since, &format!("event: {}", event.as_str()))
            .await;
        if to.is_stable() {
            // The agent's token is gone: release its long poll so it hears so at once.
            self.wake_agent(&node.uuid);
        }
        if to == ProvisionState::DeployFailed {
            // Every way into `deploy failed` stops the agent and powers the node off here,
            // once, after the transition is written.
            self.after_deploy_failure(&node);
        }
        Ok(node)
    }

    /// Fire `fail` with a message.
    async fn fail(&self, node: Node, message: &str) -> Result<Node, ConductorError> {
        tracing::warn!(node = %node.uuid, state = %node.provision_state, error = message, "operation failed");
        self.event(node, Event::Fail, Some(message.to_string()))
            .await
    }
}
