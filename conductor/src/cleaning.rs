//! The cleaning engine: automated (`provide`, tear-down) and manual (`clean`) cleaning.
//!
//! Level-triggered like the rest of the conductor: [`Conductor::advance_cleaning`] looks at the
//! node's cleaning run ([`CleanRun`]), makes one decision, writes it, and
//! returns. It is called when the node enters cleaning, when the agent looks up or reports a
//! result, when an operator unholds, and by the periodic scan (which is what resumes cleaning
//! after a controller restart). Every decision is written before it is acted on (a command id
//! is stored on the node before the command is queued), so a crash between the two repeats the
//! same command id, which the agent ignores, instead of running a step twice.

use super::steps::{self, PlannedStep, Source};
use super::{Conductor, ConductorError};
use chrono::Utc;
use rivet_drivers::Bmc;
use rivet_model::fsm::Event;
use rivet_model::node::Node;
use rivet_model::runs::{CleanRun, RamdiskUse};
use rivet_protocol::agent::{CleanStepsResult, Command, CommandKind, CommandStatus};
use rivet_protocol::states::{PowerState, ProvisionState};
use rivet_protocol::steps::RequestedStep;
use rivet_store::StoreError;
use serde_json::{json, Value};
use std::time::Duration;

/// Forget the bookkeeping of a cleaning run.
pub(crate) fn clear_run(node: &mut Node) {
    node.runs.clean = None;
}

/// The node's cleaning run, started empty if there is none.
fn run_mut(node: &mut Node) -> &mut CleanRun {
    node.runs.clean.get_or_insert_with(Default::default)
}

/// The steps a manual clean asked for (none for an automated one).
fn requested(node: &Node) -> Option<Vec<RequestedStep>> {
    node.runs.clean.as_ref().and_then(|r| r.requested.clone())
}

pub(super) fn has_agent(node: &Node) -> bool {
    node.runs.has_agent()
}

impl Conductor {
    /// Store the command on the node first (by the caller), then queue it; queueing the same
    /// id twice is harmless.
    pub(super) async fn queue(&self, uuid: &str, command: Command) -> Result<(), ConductorError> {
        match self.store.enqueue_command(uuid, &command).await {
            Ok(()) | Err(StoreError::Duplicate(_)) => {}
            Err(e) => return Err(e.into()),
        }
        tracing::info!(node = %uuid, command = command.kind.name(), id = %command.id, "command queued for agent");
        self.wake_agent(uuid);
        Ok(())
    }

    /// Make sure a stored command id is really queued (a crash may have come in between).
    pub(super) async fn ensure_queued(
        &self,
        uuid: &str,
        id: &str,
        kind: CommandKind,
    ) -> Result<Option<rivet_protocol::agent::CommandResult>, ConductorError> {
        match self.store.command(uuid, id).await {
            Ok(c) => Ok(c.result),
            Err(StoreError::NotFound { .. }) => {
                self.queue(
                    uuid,
                    Command {
                        id: id.to_string(),
                        kind,
                    },
                )
                .await?;
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Move between a busy state and its wait state as the next action needs
    /// (cleaning ↔ clean wait, inspecting ↔ inspect wait); otherwise just write.
    pub(crate) async fn ensure_state(
        &self,
        node: Node,
        want: ProvisionState,
    ) -> Result<Node, ConductorError> {
        use ProvisionState::*;
        match (node.provision_state, want) {
            (a, b) if a == b => Ok(self.update_node(&node).await?),
            (Cleaning, CleanWait) | (Inspecting, InspectWait) | (Deploying, WaitCallBack) => {
                self.event(node, Event::Wait, None).await
            }
            (CleanWait, Cleaning) | (InspectWait, Inspecting) | (WaitCallBack, Deploying) => {
                self.event(node, Event::Resume, None).await
            }
            _ => Ok(self.update_node(&node).await?),
        }
    }

    /// Rest in `want` until the agent calls back. Writes only to change the state: a write
    /// of an unchanged node would only move its version under a concurrent API request.
    pub(super) async fn wait_in(
        &self,
        node: Node,
        want: ProvisionState,
    ) -> Result<Option<Node>, ConductorError> {
        if node.provision_state != want {
            self.ensure_state(node, want).await?;
        }
        Ok(None)
    }

    /// One decision of a cleaning run. `Some(node)` when something was written and the caller
    /// should decide again; `None` when waiting for the agent or an operator.
    pub(crate) async fn advance_cleaning(
        &self,
        mut node: Node,
        bmc: &dyn Bmc,
    ) -> Result<Option<Node>, ConductorError> {
        let manual = node.target_provision_state == Some(ProvisionState::Manageable);
        let uuid = node.uuid.clone();

        if !manual && !self.automated_clean_enabled(&node) {
            tracing::info!(node = %uuid, retired = node.attrs.retired, "automated cleaning disabled; node becomes available (manageable when retired)");
            clear_run(&mut node);
            let event = end_of_cleaning(&node, false);
            let node = self.ensure_state(node, ProvisionState::Cleaning).await?;
            return self.event(node, event, None).await.map(Some);
        }

        // 1. Boot the ramdisk once per run, unless the run needs none: the fake deploy
        // interface has no in-band steps at all (fake-hardware cleans without an agent, as
        // in Ironic), and a manual clean may ask only for out-of-band steps.
        if node.runs.clean.as_ref().and_then(|r| r.ramdisk).is_none() {
            if !node.interfaces.uses_agent(&node.driver) {
                let plan = self.plan_without_agent(&node, bmc, manual).await;
                let plan = match plan {
                    Ok(p) => p,
                    Err(e) => {
                        let msg = format!("cleaning of node {} refused: {e}", node.ident());
                        let node = self.ensure_state(node, ProvisionState::Cleaning).await?;
                        return self.fail(node, &msg).await.map(Some);
                    }
                };
                tracing::info!(node = %uuid, steps = plan.len(), "deploy interface has no agent: cleaning without a ramdisk");
                let run = run_mut(&mut node);
                run.ramdisk = Some(RamdiskUse::NotNeeded);
                run.plan = Some(plan);
                run.step_index = 0;
                return Ok(Some(self.update_node(&node).await?));
            }
            if manual {
                if let Some(plan) = self.plan_without_ramdisk(&node, bmc).await {
                    let driver_steps = bmc.steps(&uuid, &node.driver_info).await;
                    super::oob_steps::cache_driver_steps(&mut node, &driver_steps);
                    let run = run_mut(&mut node);
                    run.ramdisk = Some(RamdiskUse::NotNeeded);
                    run.plan = Some(plan);
                    run.step_index = 0;
                    return Ok(Some(self.update_node(&node).await?));
                }
            }
            if self.fast_track_start(&node, "cleaning").await {
                // The running ramdisk is this run's: gather its steps at once (its token
                // and long poll carry on, so the next decision's command reaches it now).
                run_mut(&mut node).ramdisk = Some(RamdiskUse::Booted);
                return Ok(Some(self.update_node(&node).await?));
            }
            if let Err(e) = self.boot_ramdisk(&mut node, bmc).await {
                let msg = format!(
                    "failed to boot the cleaning ramdisk on node {}: {e}",
                    node.ident()
                );
                return self.fail(node, &msg).await.map(Some);
            }
            run_mut(&mut node).ramdisk = Some(RamdiskUse::Booted);
            tracing::info!(node = %uuid, manual, "cleaning ramdisk booting; waiting for the agent");
            return self
                .ensure_state(node, ProvisionState::CleanWait)
                .await
                .map(Some);
        }

        // 2. Gather the steps and make the plan.
        let Some(plan) = node.runs.clean.as_ref().and_then(|r| r.plan.clone()) else {
            if !has_agent(&node) {
                return self.wait_in(node, ProvisionState::CleanWait).await;
            }
            let Some(id) = node
                .runs
                .clean
                .as_ref()
                .and_then(|r| r.steps_command.clone())
            else {
                let id = uuid::Uuid::new_v4().to_string();
                run_mut(&mut node).steps_command = Some(id.clone());
                let node = self.ensure_state(node, ProvisionState::CleanWait).await?;
                self.queue(
                    &uuid,
                    Command {
                        id,
                        kind: CommandKind::GetCleanSteps,
                    },
                )
                .await?;
                return Ok(Some(node));
            };
            let Some(result) = self
                .ensure_queued(&uuid, &id, CommandKind::GetCleanSteps)
                .await?
            else {
                return Ok(None);
            };
            if result.status != CommandStatus::Succeeded {
                let msg = format!(
                    "the agent on node {} could not list its clean steps: {}",
                    node.ident(),
                    result.error.unwrap_or_default()
                );
                return self.fail(node, &msg).await.map(Some);
            }
            let agent_steps = match serde_json::from_value::<CleanStepsResult>(result.result) {
                Ok(r) => r.clean_steps,
                Err(e) => {
                    let msg = format!(
                        "the agent on node {} sent unreadable clean steps: {e}",
                        node.ident()
                    );
                    return self.fail(node, &msg).await.map(Some);
                }
            };
            let driver_steps = bmc.steps(&uuid, &node.driver_info).await;
            // The cache keeps everything the agent offered (Ironic's agent_cached_clean_steps);
            // readers take the steps the node's interfaces take (steps::planned_for).
            rivet_model::internal_info::set_cached_clean_steps(
                &mut node.driver_internal_info,
                &steps::available(&agent_steps, &driver_steps),
                Utc::now(),
            );
            // The agent's RAID steps only through the agent RAID interface.
            let raid_iface = super::raid_steps::raid_interface(&node);
            let agent_steps = steps::agent_steps_for(&agent_steps, &raid_iface);
            let planned = if manual {
                let requested = requested(&node).unwrap_or_default();
                let available = steps::available(&agent_steps, &driver_steps);
                let no_raid = steps::NoRaidSteps::of(&raid_iface, "direct", Some(true));
                match steps::manual_plan(&requested, &available, no_raid) {
                    Ok(p) => p,
                    Err(e) => {
                        let msg = format!("manual cleaning of node {} refused: {e}", node.ident());
                        return self.fail(node, &msg).await.map(Some);
                    }
                }
            } else {
                steps::automated_plan(
                    &agent_steps,
                    &driver_steps,
                    &self.config.cleaning.priority_overrides,
                )
            };
            tracing::info!(node = %uuid, steps = ?planned.iter().map(|p| p.step.step.as_str()).collect::<Vec<_>>(), "cleaning plan");
            let run = run_mut(&mut node);
            run.plan = Some(planned);
            run.step_index = 0;
            return Ok(Some(self.update_node(&node).await?));
        };

        // 3. Run the plan, one step per decision.
        let index = node.runs.clean.as_ref().map_or(0, |r| r.step_index);
        let Some(step) = plan.get(index).cloned() else {
            return self.finish_cleaning(node, bmc, manual).await.map(Some);
        };
        match step.source {
            Source::Agent => self.advance_agent_step(node, &step, index).await,
            Source::Driver => {
                node.clean_step = Some(step_doc(&step));
                let node = self.ensure_state(node, ProvisionState::Cleaning).await?;
                tracing::info!(node = %uuid, step = %step.step.step, "running out-of-band clean step");
                crate::metrics::step_started("clean", &step);
                match bmc
                    .execute_step(&uuid, &node.driver_info, &step.step, &step.args)
                    .await
                {
                    Ok(result) => {
                        let node = self.store.get_node(&uuid).await?;
                        let mut step = step.clone();
                        step.step.reboot_requested =
                            super::oob_steps::reboot_needed(&step, &result);
                        let node = self.step_done(node, &step, index).await?;
                        if !step.step.reboot_requested
                            || node.provision_state != ProvisionState::Cleaning
                        {
                            return Ok(Some(node));
                        }
                        // step_done rebooted the node: the driver checks the step took effect.
                        let checked = super::oob_steps::verify_and_refresh(
                            self.store.as_ref(),
                            bmc,
                            &node,
                            &step,
                            &result,
                        )
                        .await;
                        match checked {
                            Ok(()) => Ok(Some(node)),
                            Err(e) => {
                                crate::metrics::step_failed("clean", &step, None);
                                let msg = format!(
                                    "clean step {} failed on node {}: {e}",
                                    step.step.step,
                                    node.ident()
                                );
                                self.fail(node, &msg).await.map(Some)
                            }
                        }
                    }
                    Err(e) => {
                        crate::metrics::step_failed("clean", &step, None);
                        let node = self.store.get_node(&uuid).await?;
                        let msg = format!(
                            "clean step {} failed on node {}: {e}",
                            step.step.step,
                            node.ident()
                        );
                        self.fail(node, &msg).await.map(Some)
                    }
                }
            }
            Source::Conductor => self
                .run_conductor_step(node, bmc, &step, index)
                .await
                .map(Some),
        }
    }

    /// The plan of a node whose deploy interface has no agent: the driver's and the
    /// conductor's steps only (none on fake-hardware's automated cleaning).
    async fn plan_without_agent(
        &self,
        node: &Node,
        bmc: &dyn Bmc,
        manual: bool,
    ) -> Result<Vec<PlannedStep>, String> {
        let driver_steps = bmc.steps(&node.uuid, &node.driver_info).await;
        if !manual {
            return Ok(steps::automated_plan(
                &[],
                &driver_steps,
                &self.config.cleaning.priority_overrides,
            ));
        }
        let requested = requested(node).unwrap_or_default();
        let raid_iface = super::raid_steps::raid_interface(node);
        let deploy_iface = node
            .interfaces
            .get(&node.driver, rivet_model::interfaces::Iface::Deploy);
        let no_raid = steps::NoRaidSteps::of(&raid_iface, &deploy_iface, None);
        steps::manual_plan(&requested, &steps::available(&[], &driver_steps), no_raid)
            .map_err(|e| e.to_string())
    }

    /// A manual plan that needs no ramdisk: every requested step is the driver's or the
    /// conductor's. `None` when the ramdisk is needed (or the request does not resolve yet).
    async fn plan_without_ramdisk(&self, node: &Node, bmc: &dyn Bmc) -> Option<Vec<PlannedStep>> {
        let requested = requested(node)?;
        if requested.is_empty() {
            return None; // An empty manual clean gathers the agent's steps.
        }
        let driver_steps = bmc.steps(&node.uuid, &node.driver_info).await;
        let available = steps::available(&[], &driver_steps);
        steps::manual_plan(&requested, &available, steps::NoRaidSteps::Unknown).ok()
    }

    async fn advance_agent_step(
        &self,
        mut node: Node,
        step: &PlannedStep,
        index: usize,
    ) -> Result<Option<Node>, ConductorError> {
        let uuid = node.uuid.clone();
        let kind = |args| CommandKind::ExecuteStep {
            interface: step.step.interface.clone(),
            step: step.step.step.clone(),
            args,
        };
        let Some(id) = node.runs.clean.as_ref().and_then(|r| r.command.clone()) else {
            if !has_agent(&node) {
                // After a requested reboot: wait for the agent to look up again.
                return self.wait_in(node, ProvisionState::CleanWait).await;
            }
            // The RAID steps carry the configuration to build; a node without one fails
            // here, before the agent is asked (Ironic's AgentRAID.create_configuration).
            let args = match self.raid_step_args(&node, step, true).await? {
                Ok(a) => a,
                Err(e) => {
                    crate::metrics::step_failed("clean", step, None);
                    let msg = format!(
                        "clean step {} failed on node {}: {e}",
                        step.step.step,
                        node.ident()
                    );
                    node.clean_step = Some(step_doc(step));
                    let node = self.ensure_state(node, ProvisionState::Cleaning).await?;
                    return self.fail(node, &msg).await.map(Some);
                }
            };
            let kind = kind(args);
            let id = uuid::Uuid::new_v4().to_string();
            let run = run_mut(&mut node);
            run.command = Some(id.clone());
            run.step_started_at = Some(Utc::now());
            node.clean_step = Some(step_doc(step));
            let node = self.ensure_state(node, ProvisionState::CleanWait).await?;
            self.queue(&uuid, Command { id, kind }).await?;
            crate::metrics::step_started("clean", step);
            tracing::info!(node = %uuid, step = %step.step.step, index, "clean step sent to the agent");
            return Ok(Some(node));
        };
        // Only used if the command must be queued again (a crash between writing its id and
        // queueing it): the same arguments, rebuilt.
        let args = self
            .raid_step_args(&node, step, false)
            .await?
            .unwrap_or_else(|_| step.args.clone());
        let Some(result) = self.ensure_queued(&uuid, &id, kind(args)).await? else {
            if node.provision_state != ProvisionState::CleanWait {
                return self
                    .ensure_state(node, ProvisionState::CleanWait)
                    .await
                    .map(|_| None);
            }
            return Ok(None);
        };
        match result.status {
            CommandStatus::Succeeded => {
                self.record_step_report(&node, "clean", &step.step.step, &result.result)
                    .await;
                if let Err(e) = self
                    .record_raid_result(&mut node, step, "clean", &result.result)
                    .await?
                {
                    let started = node.runs.clean.as_ref().and_then(|r| r.step_started_at);
                    crate::metrics::step_failed("clean", step, started);
                    let msg = format!(
                        "clean step {} failed on node {}: {e}",
                        step.step.step,
                        node.ident()
                    );
                    let node = self.ensure_state(node, ProvisionState::Cleaning).await?;
                    return self.fail(node, &msg).await.map(Some);
                }
                self.step_done(node, step, index).await.map(Some)
            }
            CommandStatus::Failed | CommandStatus::Aborted => {
                let started = node.runs.clean.as_ref().and_then(|r| r.step_started_at);
                crate::metrics::step_failed("clean", step, started);
                tracing::warn!(node = %node.uuid, step = %step.step.step, command = %result.id, "clean step failed on the agent");
                let mut msg = format!(
                    "clean step {} failed on node {}: {}",
                    step.step.step,
                    node.ident(),
                    result.error.unwrap_or_else(|| "no error message".into())
                );
                super::agent_logs::attach(
                    self.store.as_ref(),
                    &mut msg,
                    &node,
                    "clean",
                    &step.step.step,
                    &result.id,
                    result.log_tail,
                )
                .await;
                node.fault = Some("clean failure".into());
                let node = self.ensure_state(node, ProvisionState::Cleaning).await?;
                self.fail(node, &msg).await.map(Some)
            }
        }
    }

    /// A step finished: honour `abort_after` and `reboot_requested`, move to the next.
    async fn step_done(
        &self,
        mut node: Node,
        step: &PlannedStep,
        index: usize,
    ) -> Result<Node, ConductorError> {
        let abort_after = node
            .clean_step
            .as_ref()
            .and_then(|s| s.get("abort_after"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let started = node.runs.clean.as_ref().and_then(|r| r.step_started_at);
        crate::metrics::step_finished("clean", step, started);
        tracing::info!(node = %node.uuid, step = %step.step.step, index, "clean step succeeded");
        self.record_clean_step(&node, step).await;
        let run = run_mut(&mut node);
        run.step_index = index + 1;
        run.command = None;
        run.step_started_at = None;
        node.clean_step = None;
        if abort_after {
            let msg = format!(
                "clean operation was aborted by an operator during step {:?}; the step is not abortable, so it ran to completion first",
                step.step.step
            );
            let node = self.ensure_state(node, ProvisionState::Cleaning).await?;
            return self.fail(node, &msg).await;
        }
        if step.step.reboot_requested {
            let bmc = self.bmc(&node)?;
            // A one-time boot override is consumed by each boot: set it again so the
            // reboot comes back into the ramdisk, not the disk (unless this run has none).
            let ramdisk =
                node.runs.clean.as_ref().and_then(|r| r.ramdisk) != Some(RamdiskUse::NotNeeded);
            let rebooted = async {
                if ramdisk {
                    let device = super::boot::BootMethod::of(&node).ramdisk_device();
                    let mode = self.override_mode(&node).await;
                    bmc.set_boot_device(&node.uuid, &node.driver_info, device, mode)
                        .await?;
                }
                bmc.set_power(&node.uuid, &node.driver_info, PowerState::Rebooting)
                    .await
            }
            .await;
            if let Err(e) = rebooted {
                let msg = format!(
                    "failed to reboot node {} after step {}: {e}",
                    node.ident(),
                    step.step.step
                );
                return self.fail(node, &msg).await;
            }
            // The rebooted ramdisk looks up again and gets a new token.
            super::agent::forget_agent_token(&mut node);
            let _ = self.store.cancel_pending(&node.uuid).await;
        }
        Ok(self.update_node(&node).await?)
    }

    async fn run_conductor_step(
        &self,
        node: Node,
        bmc: &dyn Bmc,
        step: &PlannedStep,
        index: usize,
    ) -> Result<Node, ConductorError> {
        let uuid = node.uuid.clone();
        match step.step.step.as_str() {
            "hold" => {
                let mut node = node;
                run_mut(&mut node).step_index = index + 1;
                node.clean_step = None;
                tracing::info!(node = %uuid, "cleaning on hold; `unhold` continues, `abort` stops");
                self.event(node, Event::Hold, None).await
            }
            "wait" => {
                let secs = step
                    .args
                    .get("seconds")
                    .and_then(Value::as_u64)
                    .unwrap_or(0)
                    .min(3600);
                self.ensure_state(node, ProvisionState::Cleaning).await?;
                tokio::time::sleep(Duration::from_secs(secs)).await;
                let node = self.store.get_node(&uuid).await?;
                self.step_done(node, step, index).await
            }
            other => {
                let target = match other {
                    "power_on" => PowerState::On,
                    "power_off" => PowerState::Off,
                    _ => PowerState::Rebooting,
                };
                let mut node = self.ensure_state(node, ProvisionState::Cleaning).await?;
                // As Ironic's node_power_action: never off with disable_power_off (1.95).
                if target == PowerState::Off && super::power_policy::kept_on(&node) {
                    let msg = format!(
                        "clean step power_off refused on node {}: it has disable_power_off set; unset it or drop the step",
                        node.ident()
                    );
                    return self.fail(node, &msg).await;
                }
                if let Err(e) = bmc.set_power(&uuid, &node.driver_info, target).await {
                    let msg = format!("clean step {other} failed on node {}: {e}", node.ident());
                    return self.fail(node, &msg).await;
                }
                // Off or a reboot ends the running boot, and switching on a machine that was
                // off starts one: either way the old token is void.
                if target != PowerState::On || node.power_state != Some(PowerState::On) {
                    super::agent::forget_agent_token(&mut node);
                }
                node.power_state = Some(if target == PowerState::Off {
                    PowerState::Off
                } else {
                    PowerState::On
                });
                let node = self.update_node(&node).await?;
                self.step_done(node, step, index).await
            }
        }
    }

    /// Every step done: power off (unless fast track leaves the ramdisk running), forget the
    /// run, and rest in available (automated) or manageable (manual).
    async fn finish_cleaning(
        &self,
        node: Node,
        bmc: &dyn Bmc,
        manual: bool,
    ) -> Result<Node, ConductorError> {
        let mut node = self.ensure_state(node, ProvisionState::Cleaning).await?;
        if self.fast_track_keep_running(&node, "cleaning").await {
            // Fast track: no power action (Ironic's tear_down_inband_cleaning); the boot
            // medium is still put away, the ramdisk runs from memory.
            self.clean_up_ramdisk_logged(&node, bmc).await;
        } else {
            // The boot the token belonged to is over (even when disable_power_off leaves the
            // node on: it rebooted).
            if let Err(msg) = self.end_ramdisk(&mut node, bmc, "cleaning").await {
                return self.fail(node, &msg).await;
            }
        }
        clear_run(&mut node);
        let _ = self.store.cancel_pending(&node.uuid).await;
        tracing::info!(node = %node.uuid, manual, "cleaning finished");
        crate::bmc_caches::refresh_caches_logged(
            self.store.as_ref(),
            bmc,
            &node.uuid,
            &node.driver_info,
        )
        .await;
        let event = end_of_cleaning(&node, manual);
        self.event(node, event, None).await
    }
}

/// The event that ends a cleaning run: back to manageable for a manual clean and for a
/// retired node (Ironic never offers a retired node for deployment again), else available.
fn end_of_cleaning(node: &Node, manual: bool) -> Event {
    if manual || node.attrs.retired {
        Event::Manage
    } else {
        Event::Done
    }
}

/// What `clean_step` on the node shows while a step runs.
pub(super) fn step_doc(step: &PlannedStep) -> Value {
    json!({
        "interface": step.step.interface,
        "step": step.step.step,
        "priority": step.step.priority,
        "abortable": step.step.abortable,
        "args": step.args,
        "source": step.source,
    })
}
