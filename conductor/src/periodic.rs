//! Periodic work: wait-state timeouts, resuming nodes nobody drives, and start-up recovery.

use super::{Conductor, ConductorError};
use chrono::{DateTime, Utc};
use rivet_model::fsm::Event;
use rivet_model::node::NodeSummary;
use rivet_protocol::states::ProvisionState;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Nodes per read of the scans. A scan holds one page at a time: reading a 10,000-node fleet's
/// summaries at once took ~50 MiB for a moment every `check_interval_s`.
const SCAN_PAGE: usize = 500;

/// The nodes in some states, page by page ([`rivet_store::Store::node_summaries_page`]).
struct ScanPages {
    states: &'static [ProvisionState],
    /// The last UUID read; `None` before the first page.
    after: Option<String>,
    done: bool,
}

impl ScanPages {
    fn new(states: &'static [ProvisionState]) -> ScanPages {
        ScanPages {
            states,
            after: None,
            done: false,
        }
    }

    /// The next page, or `None` once every node was read.
    async fn next(
        &mut self,
        store: &dyn rivet_store::Store,
    ) -> Result<Option<Vec<NodeSummary>>, rivet_store::StoreError> {
        if self.done {
            return Ok(None);
        }
        let page = store
            .node_summaries_page(self.states, self.after.as_deref(), SCAN_PAGE)
            .await?;
        self.done = page.len() < SCAN_PAGE;
        match page.last() {
            Some(last) => self.after = Some(last.uuid.clone()),
            None => return Ok(None),
        }
        Ok(Some(page))
    }
}

const BUSY: &[ProvisionState] = &[
    ProvisionState::Verifying,
    ProvisionState::Inspecting,
    ProvisionState::Cleaning,
    ProvisionState::Deploying,
    ProvisionState::Deleting,
    ProvisionState::Adopting,
    ProvisionState::Rescuing,
    ProvisionState::Unrescuing,
    ProvisionState::Servicing,
];

const WAITS: &[ProvisionState] = &[
    ProvisionState::CleanWait,
    ProvisionState::InspectWait,
    ProvisionState::WaitCallBack,
    ProvisionState::RescueWait,
    ProvisionState::ServiceWait,
];

impl Conductor {
    /// Start-up: drop this conductor's stale reservations (it died holding them) and resume
    /// every node caught in a conductor-busy state. The conductor's work per state is
    /// idempotent (it re-reads the BMC and the node), so resuming is safe; a node whose work
    /// fails again ends in its failure state with a last_error, never stuck.
    pub async fn recover(self: &Arc<Self>) -> Result<usize, ConductorError> {
        let released = self.store.release_reservations(self.id()).await?;
        if released > 0 {
            tracing::warn!(
                count = released,
                "released reservations left by an earlier run of this conductor"
            );
        }
        // Waits too: a result that landed just before the crash may never have been acted on.
        let mut states = BUSY.to_vec();
        states.extend([
            ProvisionState::CleanWait,
            ProvisionState::InspectWait,
            ProvisionState::WaitCallBack,
        ]);
        let nodes: Vec<_> = self
            .store
            .nodes_in_states(&states)
            .await?
            .into_iter()
            .filter(|n| self.owns(&n.uuid))
            .collect();
        for n in &nodes {
            tracing::warn!(node = %n.uuid, state = %n.provision_state, "resuming node found in a transient state at start-up");
            self.kick(&n.uuid);
        }
        // A deploy failure whose agent stop and power off the last run did not get to.
        let failed: Vec<_> = self
            .store
            .nodes_in_states(&[ProvisionState::DeployFailed])
            .await?
            .into_iter()
            .filter(|n| self.owns(&n.uuid) && n.runs.failure_power_pending)
            .collect();
        for n in &failed {
            tracing::warn!(node = %n.uuid, "finishing the power off after a deploy failure that the last run left undone");
            self.after_deploy_failure(n);
        }
        Ok(nodes.len() + failed.len())
    }

    fn wait_timeout(&self, state: ProvisionState) -> u64 {
        let c = &self.config.conductor;
        match state {
            ProvisionState::CleanWait => c.clean_wait_timeout_s,
            ProvisionState::InspectWait => c.inspect_wait_timeout_s,
            ProvisionState::WaitCallBack => c.deploy_callback_timeout_s,
            ProvisionState::ServiceWait => c.clean_wait_timeout_s,
            _ => c.rescue_wait_timeout_s,
        }
    }

    /// Why a node in a wait state has waited too long, if it has.
    fn overdue(&self, node: &NodeSummary, now: chrono::DateTime<Utc>) -> Option<String> {
        let state = node.provision_state;
        let step = node
            .clean_step
            .as_ref()
            .or(node.deploy_step.as_ref())
            .and_then(|s| s.get("step"))
            .and_then(serde_json::Value::as_str)
            .map(|s| format!(" while step {s:?} was running"))
            .unwrap_or_default();
        if state == ProvisionState::CleanWait {
            let step_limit = self.config.cleaning.step_timeout_s as i64;
            let started = node.runs.clean.as_ref().and_then(|r| r.step_started_at);
            if let Some(age) = started
                .map(|t| (now - t).num_seconds())
                .filter(|a| *a >= step_limit)
            {
                return Some(format!(
                    "clean step timed out on node {} after {age} s (limit cleaning.step_timeout_s = {step_limit} s){step}",
                    node.ident()
                ));
            }
        }
        if state == ProvisionState::WaitCallBack {
            let step_limit = self.config.cleaning.step_timeout_s as i64;
            if let Some(age) = node
                .runs
                .deploy
                .as_ref()
                .and_then(|r| r.step_started_at)
                .map(|t| (now - t).num_seconds())
                .filter(|a| *a >= step_limit)
            {
                return Some(format!(
                    "deploy step timed out on node {} after {age} s (limit cleaning.step_timeout_s = {step_limit} s){step}",
                    node.ident()
                ));
            }
        }
        if matches!(
            state,
            ProvisionState::CleanWait | ProvisionState::WaitCallBack
        ) {
            let hb_limit = self.config.agent.heartbeat_timeout_s as i64;
            if node.runs.has_agent() {
                let age = node
                    .liveness
                    .last_heartbeat
                    .map(|t| (now - t).num_seconds());
                if let Some(age) = age.filter(|a| *a >= hb_limit) {
                    return Some(format!(
                        "no heartbeat from the agent of node {} for {age} s (limit {hb_limit} s){step}; \
                         the ramdisk died or lost its network — check its console, then retry the operation",
                        node.ident()
                    ));
                }
            }
        }
        let timeout = self.wait_timeout(state);
        // The agent's heartbeats keep a wait alive, as Ironic's heartbeats touch the node.
        let since = node.provision_updated_at.unwrap_or(node.created_at);
        let since = match node.liveness.last_heartbeat {
            Some(hb) if hb > since => hb,
            _ => since,
        };
        if (now - since).num_seconds() >= timeout as i64 {
            return Some(format!(
                "timeout reached in \"{state}\": no word from the ramdisk of node {} for {timeout} s{step}; \
                 check its console and network, then `manage` and retry",
                node.ident()
            ));
        }
        None
    }

    /// One pass of the periodic scan: fail overdue waits and resume transient nodes nobody
    /// drives. When `resume_waits`, also returns every node waiting on its agent, for the
    /// caller to kick at a gentle pace (the safety net for a kick lost in a crash; results
    /// normally kick their node as they arrive, and each kick costs a few store reads, so
    /// 10,000 of them at once would stall heartbeats for seconds).
    pub async fn scan_once(
        self: &Arc<Self>,
        resume_waits: bool,
    ) -> Result<Vec<String>, ConductorError> {
        let now = Utc::now();
        let mut waits: Vec<String> = Vec::new();
        let mut pages = ScanPages::new(WAITS);
        while let Some(page) = pages.next(self.store.as_ref()).await? {
            for summary in page {
                if resume_waits
                    && !summary.maintenance
                    && matches!(
                        summary.provision_state,
                        ProvisionState::CleanWait
                            | ProvisionState::InspectWait
                            | ProvisionState::WaitCallBack
                    )
                {
                    waits.push(summary.uuid.clone());
                }
                self.fail_if_overdue(summary, now).await;
            }
        }
        let mut pages = ScanPages::new(BUSY);
        while let Some(page) = pages.next(self.store.as_ref()).await? {
            for n in page.into_iter().filter(|n| !n.maintenance) {
                // Owned nodes only; the lease taken by the task decides whether a reservation
                // another controller holds is still live. (A node in maintenance is left alone
                // by the task itself.)
                if self.owns(&n.uuid) && !self.is_running(&n.uuid) {
                    self.kick(&n.uuid);
                }
            }
        }
        Ok(waits)
    }

    /// Fail a node's wait when it is overdue (the scan's check of one node).
    async fn fail_if_overdue(self: &Arc<Self>, summary: NodeSummary, now: DateTime<Utc>) {
        // Timeouts are the owner's to enforce; another controller's nodes are its own.
        // A record that does not decode is shown with its error and left as stored.
        if summary.maintenance || summary.corrupt || !self.owns(&summary.uuid) {
            return;
        }
        if self.overdue(&summary, now).is_none() {
            return;
        }
        // Overdue by the summary: decide again on the whole, current record.
        let node = match self.store.get_node(&summary.uuid).await {
            Ok(n) if n.corrupt.is_none() => n,
            Ok(_) => return,
            Err(e) => {
                tracing::error!(node = %summary.uuid, error = %e, "cannot read a timed-out node");
                return;
            }
        };
        let Some(msg) = self.overdue(&NodeSummary::of(&node), now) else {
            return;
        };
        let state = node.provision_state;
        let uuid = node.uuid.clone();
        let running = node.runs.running_command().map(str::to_string);
        match self.event(node, Event::Fail, Some(msg)).await {
            Ok(n) => {
                tracing::warn!(node = %n.uuid, state = %state, "wait timed out");
                // A deploy's command is aborted by after_deploy_failure, with the power off.
                if let Some(id) =
                    running.filter(|_| n.provision_state != ProvisionState::DeployFailed)
                {
                    let _ = self
                        .send_command(
                            &uuid,
                            rivet_protocol::agent::CommandKind::Abort { command_id: id },
                        )
                        .await;
                }
            }
            // Changed under us (a heartbeat arrived): the next scan decides again.
            Err(ConductorError::Store(rivet_store::StoreError::Conflict { .. })) => {}
            // One node's failure must not keep the others' timeouts from being enforced.
            Err(e) => tracing::error!(node = %uuid, error = %e, "cannot fail a timed-out wait"),
        }
    }

    /// Kick each of `uuids` (owned, not already driven) once, spread evenly over `span`.
    async fn kick_paced(self: Arc<Self>, uuids: Vec<String>, span: Duration) {
        let gap = span / u32::try_from(uuids.len() + 1).unwrap_or(u32::MAX);
        for uuid in uuids {
            if self.owns(&uuid) && !self.is_running(&uuid) {
                self.kick(&uuid);
            }
            tokio::time::sleep(gap).await;
        }
    }

    /// Run the scan forever (supervised with the other controller-wide loops by
    /// [`Conductor::run_background`]).
    pub async fn run_periodic(self: Arc<Self>) -> super::supervisor::LoopEnd {
        let every = Duration::from_secs(self.config.conductor.check_interval_s.max(1));
        // The wait-state safety net runs at most once a minute (or every scan if slower).
        let resume_every = every.max(Duration::from_secs(60));
        let mut last_resume = tokio::time::Instant::now();
        // One paced safety-net walk at a time.
        let pacing = Arc::new(AtomicBool::new(false));
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let resume_waits = last_resume.elapsed() >= resume_every;
            if resume_waits {
                last_resume = tokio::time::Instant::now();
            }
            match self.scan_once(resume_waits).await {
                Ok(waits) if !waits.is_empty() && !pacing.load(Ordering::Acquire) => {
                    pacing.store(true, Ordering::Release);
                    let (this, pacing) = (self.clone(), pacing.clone());
                    self.tasks.spawn(async move {
                        this.kick_paced(waits, resume_every.mul_f32(0.8)).await;
                        pacing.store(false, Ordering::Release);
                    });
                }
                Ok(_) => {}
                Err(e) => tracing::error!(error = %e, "periodic scan failed"),
            }
        }
    }
}
