//! The deploy engine: `active`/`deploy`/`rebuild` run Ironic's deploy steps, merged by
//! priority like clean steps.
//!
//! Default steps, highest priority first: `deploy` (100, conductor: boot the ramdisk through
//! the boot interface), `write_image` (80, in-band: the agent streams and verifies the image
//! and writes the configdrive), `prepare_instance_boot` (60: boot from disk, persistent),
//! `tear_down_agent` (40: the agent powers off, then the BMC makes sure), `boot_instance`
//! (20: power on). The agent's own deploy steps join the plan when it calls back
//! (`get_deploy_steps`); `deploy_steps` of the request change priorities (0 drops a step) or
//! add agent steps.
//!
//! The run is typed ([`DeployRun`]) and kept in the node's run state (a document that does
//! not decode marks the node corrupt, naming the column: the run is never silently
//! restarted). Like cleaning, every decision is written before it is acted on,
//! so a controller killed mid-deploy resumes where it stopped: the agent keeps writing and
//! reports to the new process. The `fake` deploy interface (fake-hardware only) does no work.

use super::steps::{self, PlannedStep, Source};
use super::{Conductor, ConductorError};
use chrono::Utc;
use rivet_drivers::{Bmc, BootDevice};
use rivet_model::fsm::Event;
use rivet_model::node::Node;
use rivet_model::runs::DeployRun;
use rivet_protocol::agent::{CommandKind, CommandStatus, DeployStepsResult};
use rivet_protocol::deploy::{WriteImageArgs, WRITE_IMAGE};
use rivet_protocol::states::{PowerState, ProvisionState};
use rivet_protocol::steps::{RequestedDeployStep, StepDescriptor};
use serde_json::{Map, Value};

/// How long `tear_down_agent` waits for the agent to power the machine off itself before
/// the BMC does it.
const SOFT_POWER_OFF_WAIT_S: i64 = 30;
/// How long a failed deploy waits for the agent to stop its aborted command (and wipe
/// what it wrote) before the BMC powers the node off.
const ABORT_WAIT_S: u64 = 10;

/// Audit action of what happened to the power of a node whose deploy failed (node history,
/// INFO): powered off, or left on and why.
pub const FAILURE_POWER_ACTION: &str = "deploy_failure_power";
/// The same when the power off failed (node history, ERROR), with the BMC's error.
pub const FAILURE_POWER_ERROR_ACTION: &str = "deploy_failure_power_error";

/// What a failed deploy did with the node's power.
#[derive(Debug, Clone, PartialEq, Eq)]
enum FailurePower {
    /// Powered off through the power interface.
    Off,
    /// Left as it was, on purpose: why.
    Left(&'static str),
    /// The power off failed: the error.
    Failed(String),
}

/// A conductor deploy step.
fn conductor_step(step: &str, priority: i64) -> PlannedStep {
    PlannedStep {
        step: StepDescriptor {
            interface: "deploy".into(),
            step: step.into(),
            priority,
            abortable: false,
            argsinfo: Default::default(),
            reboot_requested: false,
            requires_ramdisk: false,
        },
        args: Map::new(),
        source: Source::Conductor,
    }
}

/// The conductor's default deploy steps.
pub(crate) fn conductor_deploy_steps() -> Vec<PlannedStep> {
    vec![
        conductor_step("deploy", 100),
        conductor_step("prepare_instance_boot", 60),
        conductor_step("tear_down_agent", 40),
        conductor_step("boot_instance", 20),
    ]
}

/// Apply the operator's requested priorities and args to `plan`, drop priority 0, and sort
/// (priority descending, Ironic's interface order on ties, stable otherwise).
fn apply_requested(
    mut plan: Vec<PlannedStep>,
    requested: &[RequestedDeployStep],
) -> Vec<PlannedStep> {
    for p in &mut plan {
        if let Some(r) = requested
            .iter()
            .find(|r| r.interface == p.step.interface && r.step == p.step.step)
        {
            p.step.priority = r.priority;
            if !r.args.is_empty() {
                p.args = r.args.clone();
            }
        }
    }
    plan.retain(|p| p.step.priority > 0);
    plan.sort_by(|a, b| {
        b.step.priority.cmp(&a.step.priority).then(
            steps::interface_rank(&b.step.interface).cmp(&steps::interface_rank(&a.step.interface)),
        )
    });
    plan
}

/// Requested deploy steps the default steps do not know: they must come from the agent.
/// The `deploy` step itself cannot be dropped (it boots the ramdisk every other step needs).
pub(crate) fn check_requested(requested: &[RequestedDeployStep]) -> Result<(), String> {
    for r in requested {
        if r.interface == "deploy" && r.step == "deploy" && r.priority == 0 {
            return Err(
                "deploy_steps: the deploy.deploy step boots the ramdisk and cannot be disabled"
                    .into(),
            );
        }
        if r.priority < 0 {
            return Err(format!(
                "deploy_steps: {}.{} has a negative priority; use 0 to skip it or a positive number",
                r.interface, r.step
            ));
        }
    }
    Ok(())
}

impl Conductor {
    fn put_run(node: &mut Node, run: &DeployRun) {
        node.runs.deploy = Some(run.clone());
    }

    /// One decision of a deploy. `Some(node)` when something was written and the caller
    /// should decide again; `None` when waiting for the agent.
    pub(crate) async fn advance_deploy(
        &self,
        mut node: Node,
        bmc: &dyn Bmc,
    ) -> Result<Option<Node>, ConductorError> {
        if !node.interfaces.uses_agent(&node.driver) {
            // The fake deploy interface (fake-hardware only, validated at create/patch).
            tracing::info!(node = %node.uuid, "fake deploy interface: nothing to write");
            node.runs.deploy = None;
            node.runs.deploy_request = None;
            let node = self.ensure_state(node, ProvisionState::Deploying).await?;
            return self.event(node, Event::Done, None).await.map(Some);
        }
        let run = match node.runs.deploy.clone() {
            Some(r) => r,
            None => {
                let requested = node.runs.deploy_request.take().unwrap_or_default();
                // The deploy templates the instance asks for (instance_info.traits).
                let requested = match self.with_template_steps(&node, requested).await? {
                    Ok(r) => r,
                    Err(msg) => {
                        let node = self.ensure_state(node, ProvisionState::Deploying).await?;
                        return self.fail(node, &msg).await.map(Some);
                    }
                };
                let run = DeployRun {
                    plan: apply_requested(conductor_deploy_steps(), &requested),
                    requested,
                    ..Default::default()
                };
                Self::put_run(&mut node, &run);
                return self
                    .ensure_state(node, ProvisionState::Deploying)
                    .await
                    .map(Some);
            }
        };
        let Some(step) = run.plan.get(run.index).cloned() else {
            return self.finish_deploy(node).await.map(Some);
        };
        // Every step after `deploy` may be the agent's: its steps join the plan first.
        if step.step.step != "deploy" && !run.agent_steps_merged {
            return self.gather_deploy_steps(node, run).await;
        }
        node.deploy_step = Some(super::cleaning::step_doc(&step));
        match step.source {
            Source::Agent => self.advance_agent_deploy_step(node, run, &step).await,
            Source::Driver => {
                // Out-of-band deploy steps come only from deploy templates (not served yet):
                // refuse rather than skip.
                let msg = format!(
                    "deploy step {}.{} of node {} is an out-of-band step, which Rivet does not run during deploy yet",
                    step.step.interface,
                    step.step.step,
                    node.ident()
                );
                let node = self.ensure_state(node, ProvisionState::Deploying).await?;
                self.fail(node, &msg).await.map(Some)
            }
            Source::Conductor => self.run_conductor_deploy_step(node, run, &step, bmc).await,
        }
    }

    /// Ask the agent for its deploy steps (once it has called back) and merge them in.
    async fn gather_deploy_steps(
        &self,
        mut node: Node,
        mut run: DeployRun,
    ) -> Result<Option<Node>, ConductorError> {
        let uuid = node.uuid.clone();
        if !super::cleaning::has_agent(&node) {
            // The ramdisk is booting: wait for its lookup.
            return self.wait_in(node, ProvisionState::WaitCallBack).await;
        }
        let Some(id) = run.steps_command.clone() else {
            let id = uuid::Uuid::new_v4().to_string();
            run.steps_command = Some(id.clone());
            Self::put_run(&mut node, &run);
            let node = self
                .ensure_state(node, ProvisionState::WaitCallBack)
                .await?;
            self.queue(
                &uuid,
                rivet_protocol::agent::Command {
                    id,
                    kind: CommandKind::GetDeploySteps,
                },
            )
            .await?;
            return Ok(Some(node));
        };
        let Some(result) = self
            .ensure_queued(&uuid, &id, CommandKind::GetDeploySteps)
            .await?
        else {
            return Ok(None);
        };
        if result.status != CommandStatus::Succeeded {
            let msg = format!(
                "the agent on node {} could not list its deploy steps: {}",
                node.ident(),
                result.error.unwrap_or_default()
            );
            let node = self.ensure_state(node, ProvisionState::Deploying).await?;
            return self.fail(node, &msg).await.map(Some);
        }
        let agent: Vec<StepDescriptor> =
            match serde_json::from_value::<DeployStepsResult>(result.result) {
                Ok(r) => r.deploy_steps,
                Err(e) => {
                    let msg = format!(
                        "the agent on node {} sent unreadable deploy steps: {e}",
                        node.ident()
                    );
                    let node = self.ensure_state(node, ProvisionState::Deploying).await?;
                    return self.fail(node, &msg).await.map(Some);
                }
            };
        if !agent.iter().any(|s| s.step == WRITE_IMAGE) {
            let msg = format!(
                "the agent on node {} offers no {WRITE_IMAGE} deploy step (its steps: {}); boot a Rivet ramdisk that can deploy",
                node.ident(),
                agent.iter().map(|s| s.step.as_str()).collect::<Vec<_>>().join(", ")
            );
            let node = self.ensure_state(node, ProvisionState::Deploying).await?;
            return self.fail(node, &msg).await.map(Some);
        }
        // The agent's RAID steps only through the agent RAID interface (Ironic's
        // AgentRAID.get_deploy_steps).
        let raid_iface = super::raid_steps::raid_interface(&node);
        let agent = steps::agent_steps_for(&agent, &raid_iface);
        // Agent steps with priority 0 run only when requested with a priority.
        let mut extra: Vec<PlannedStep> = agent
            .into_iter()
            .filter(|s| {
                s.priority > 0
                    || run
                        .requested
                        .iter()
                        .any(|r| r.step == s.step && r.interface == s.interface && r.priority > 0)
            })
            .map(|s| PlannedStep {
                step: s,
                args: Map::new(),
                source: Source::Agent,
            })
            .collect();
        // A requested `hold` pauses the deploy in `deploy hold` at its priority.
        if run
            .requested
            .iter()
            .any(|r| r.interface == "deploy" && r.step == "hold" && r.priority > 0)
        {
            extra.push(conductor_step("hold", 0));
        }
        // Every requested step must exist somewhere, with the arguments it requires.
        for r in run.requested.iter().filter(|r| r.priority > 0) {
            let Some(known) = run
                .plan
                .iter()
                .chain(extra.iter())
                .find(|p| p.step.step == r.step && p.step.interface == r.interface)
            else {
                let no_raid = if r.interface == "raid" {
                    steps::NoRaidSteps::of(&raid_iface, "direct", Some(true)).reason()
                } else {
                    String::new()
                };
                let msg = format!(
                    "deploy step {}.{} requested for node {} is offered neither by the conductor nor by its agent{no_raid}",
                    r.interface,
                    r.step,
                    node.ident()
                );
                let node = self.ensure_state(node, ProvisionState::Deploying).await?;
                return self.fail(node, &msg).await.map(Some);
            };
            // As Ironic's _validate_user_step: every required argument given.
            let missing: Vec<String> = known
                .step
                .argsinfo
                .iter()
                .filter(|(name, info)| info.required && !r.args.contains_key(*name))
                .map(|(name, info)| format!("{name} ({})", info.description))
                .collect();
            if !missing.is_empty() {
                let msg = format!(
                    "deploy step {}.{} requested for node {} is missing these required arguments: {}",
                    r.interface,
                    r.step,
                    node.ident(),
                    missing.join(", ")
                );
                let node = self.ensure_state(node, ProvisionState::Deploying).await?;
                return self.fail(node, &msg).await.map(Some);
            }
        }
        // The steps already run stay as they were; the rest are merged and re-sorted.
        let done: Vec<PlannedStep> = run.plan.drain(..run.index).collect();
        let mut rest: Vec<PlannedStep> = std::mem::take(&mut run.plan);
        rest.append(&mut extra);
        let rest = apply_requested(rest, &run.requested);
        run.plan = done.into_iter().chain(rest).collect();
        run.agent_steps_merged = true;
        tracing::info!(node = %uuid, steps = ?run.plan.iter().map(|p| p.step.step.as_str()).collect::<Vec<_>>(), "deploy plan");
        Self::put_run(&mut node, &run);
        Ok(Some(self.update_node(&node).await?))
    }

    /// `write_image`'s arguments from the node: image fields of `instance_info`, root device
    /// hints, the configdrive, the operator's image policy, and the node's effective boot
    /// mode (the agent writes a UEFI boot entry on a uefi node).
    pub(crate) fn write_image_args(
        &self,
        node: &Node,
        boot_mode: Option<rivet_protocol::deploy::BootMode>,
    ) -> WriteImageArgs {
        let info = &node.instance_info;
        let s = |k: &str| info.get(k).and_then(Value::as_str).map(str::to_string);
        WriteImageArgs {
            image_source: s("image_source").unwrap_or_default(),
            disk_format: s("image_disk_format"),
            os_hash_algo: s("image_os_hash_algo"),
            os_hash_value: s("image_os_hash_value"),
            checksum: s("image_checksum"),
            root_device: node
                .properties
                .get("root_device")
                .and_then(Value::as_object)
                .cloned(),
            configdrive: s("configdrive"),
            permitted_formats: self.config.deploy.permitted_image_formats.clone(),
            ca_pem: self.config.deploy.image_ca_pem(),
            download_retries: Some(self.config.deploy.image_download_retries),
            boot_mode,
        }
    }

    async fn advance_agent_deploy_step(
        &self,
        mut node: Node,
        mut run: DeployRun,
        step: &PlannedStep,
    ) -> Result<Option<Node>, ConductorError> {
        let uuid = node.uuid.clone();
        let first = run.command.is_none();
        // The id of the command this decision sends (or finds): a cached image's download
        // token is bound to it.
        let command_id = run
            .command
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let args = if step.step.step == WRITE_IMAGE {
            // The mode the ramdisk booted in; a run that booted no ramdisk (fast track, a
            // run from an older rivetd) resolves it now.
            let mode = match run.boot_mode {
                Some(m) => Some(m),
                None => self.override_mode(&node).await,
            };
            let mut args = self.write_image_args(&node, mode);
            let local = self
                .image_download_source(&node)
                .map(|s| s == rivet_model::config::ImageDownloadSource::Local);
            // Only once the command can be sent: the first send waits here for the image's
            // one download (other nodes wanting it wait on the same download).
            let sendable = !first || super::cleaning::has_agent(&node);
            let localized = match local {
                Ok(true) if sendable => self
                    .localize_image(&node, &mut args, &command_id, run.local_image.as_deref())
                    .await
                    .map(Some),
                Ok(_) => Ok(None),
                Err(e) => Err(e),
            };
            match localized {
                Ok(Some(l)) => {
                    run.local_image = Some(l.image);
                    run.local_configdrive = l.configdrive;
                }
                Ok(None) => {}
                Err(e) => {
                    crate::metrics::step_failed("deploy", step, None);
                    self.image_cache.unpin(&uuid);
                    let msg = format!(
                        "deploy step {WRITE_IMAGE} failed on node {}: {e}",
                        node.ident()
                    );
                    let node = self.ensure_state(node, ProvisionState::Deploying).await?;
                    return self.fail(node, &msg).await.map(Some);
                }
            }
            args.to_args()
        } else if first && !super::cleaning::has_agent(&node) {
            // Nothing is sent before the agent calls back (below).
            step.args.clone()
        } else {
            // The RAID steps carry the configuration to build (raid_steps); the decision
            // that sends the step checks and stores it, later ones only rebuild the command.
            match self.raid_step_args(&node, step, first).await? {
                Ok(a) => a,
                Err(_) if !first => step.args.clone(),
                Err(e) => {
                    crate::metrics::step_failed("deploy", step, None);
                    let msg = format!(
                        "deploy step {} failed on node {}: {e}",
                        step.step.step,
                        node.ident()
                    );
                    let node = self.ensure_state(node, ProvisionState::Deploying).await?;
                    return self.fail(node, &msg).await.map(Some);
                }
            }
        };
        let kind = CommandKind::ExecuteStep {
            interface: step.step.interface.clone(),
            step: step.step.step.clone(),
            args,
        };
        let Some(id) = run.command.clone() else {
            if !super::cleaning::has_agent(&node) {
                return self
                    .ensure_state(node, ProvisionState::WaitCallBack)
                    .await
                    .map(|_| None);
            }
            let id = command_id;
            run.command = Some(id.clone());
            run.step_started_at = Some(Utc::now());
            Self::put_run(&mut node, &run);
            let node = self
                .ensure_state(node, ProvisionState::WaitCallBack)
                .await?;
            self.queue(&uuid, rivet_protocol::agent::Command { id, kind })
                .await?;
            crate::metrics::step_started("deploy", step);
            tracing::info!(node = %uuid, step = %step.step.step, "deploy step sent to the agent");
            return Ok(Some(node));
        };
        let Some(result) = self.ensure_queued(&uuid, &id, kind).await? else {
            if node.provision_state != ProvisionState::WaitCallBack {
                return self
                    .ensure_state(node, ProvisionState::WaitCallBack)
                    .await
                    .map(|_| None);
            }
            return Ok(None);
        };
        let abort_after = node
            .deploy_step
            .as_ref()
            .and_then(|s| s.get("abort_after"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if step.step.step == WRITE_IMAGE {
            // The step is over either way: its image may be evicted again.
            self.image_cache.unpin(&uuid);
        }
        match result.status {
            CommandStatus::Succeeded => {
                if let Err(e) = self
                    .record_raid_result(&mut node, step, "deploy", &result.result)
                    .await?
                {
                    crate::metrics::step_failed("deploy", step, run.step_started_at);
                    let msg = format!(
                        "deploy step {} failed on node {}: {e}",
                        step.step.step,
                        node.ident()
                    );
                    let node = self.ensure_state(node, ProvisionState::Deploying).await?;
                    return self.fail(node, &msg).await.map(Some);
                }
                tracing::info!(node = %uuid, step = %step.step.step, "deploy step succeeded");
                crate::metrics::step_finished("deploy", step, run.step_started_at);
                if step.step.step == WRITE_IMAGE {
                    rivet_model::internal_info::set_deployed_image(
                        &mut node.driver_internal_info,
                        result.result.clone(),
                    );
                }
                run.index += 1;
                run.command = None;
                run.step_started_at = None;
                Self::put_run(&mut node, &run);
                node.deploy_step = None;
                if abort_after {
                    let msg = format!(
                        "deploy operation was aborted by an operator during step {:?}; the step is not abortable, so it ran to completion first",
                        step.step.step
                    );
                    // Entering `deploy failed` stops the agent and powers the node off
                    // (after_deploy_failure).
                    let node = self.ensure_state(node, ProvisionState::Deploying).await?;
                    return self.fail(node, &msg).await.map(Some);
                }
                self.ensure_state(node, ProvisionState::Deploying)
                    .await
                    .map(Some)
            }
            CommandStatus::Failed | CommandStatus::Aborted => {
                crate::metrics::step_failed("deploy", step, run.step_started_at);
                tracing::warn!(node = %node.uuid, step = %step.step.step, command = %result.id, "deploy step failed on the agent");
                let mut msg = format!(
                    "deploy step {} failed on node {}: {}",
                    step.step.step,
                    node.ident(),
                    result.error.unwrap_or_else(|| "no error message".into())
                );
                super::agent_logs::attach(
                    self.store.as_ref(),
                    &mut msg,
                    &node,
                    "deploy",
                    &step.step.step,
                    &result.id,
                    result.log_tail,
                )
                .await;
                let node = self.ensure_state(node, ProvisionState::Deploying).await?;
                self.fail(node, &msg).await.map(Some)
            }
        }
    }

    async fn run_conductor_deploy_step(
        &self,
        mut node: Node,
        mut run: DeployRun,
        step: &PlannedStep,
        bmc: &dyn Bmc,
    ) -> Result<Option<Node>, ConductorError> {
        let uuid = node.uuid.clone();
        let name = step.step.step.as_str();
        let outcome = match name {
            "deploy" => {
                // Boot the ramdisk (unless fast track finds one running: then only the boot
                // mode is put right, as a boot would); the step is done once the agent calls
                // back (the next decision gathers its steps).
                let booted = if self.fast_track_start(&node, "deploy").await {
                    self.apply_boot_mode(&node, bmc).await.map(|e| e.mode)
                } else {
                    self.boot_ramdisk(&mut node, bmc).await
                };
                if let Ok(mode) = booted {
                    run.boot_mode = Some(mode);
                    tracing::info!(node = %uuid, "deploy ramdisk booting (or running, with fast track); waiting for the agent");
                    run.index += 1;
                    Self::put_run(&mut node, &run);
                    node.deploy_step = None;
                    return self
                        .ensure_state(node, ProvisionState::WaitCallBack)
                        .await
                        .map(Some);
                }
                booted.map(|_| ())
            }
            "prepare_instance_boot" => {
                // The CD goes before the instance boots: it must not see the ramdisk.
                // Then the instance's boot mode and Secure Boot, checked on the BMC, and the
                // disk for every boot from now on, in that mode.
                async {
                    self.clean_up_ramdisk(&node, bmc).await?;
                    let eff = self.apply_boot_mode(&node, bmc).await?;
                    self.apply_secure_boot(&mut node, bmc, &eff).await?;
                    bmc.set_boot_device_persistent(
                        &uuid,
                        &node.driver_info,
                        BootDevice::Disk,
                        Some(eff.mode),
                    )
                    .await
                }
                .await
            }
            "tear_down_agent" => {
                // disable_power_off (1.95): the agent is left running; boot_instance reboots.
                let kept_on = super::power_policy::kept_on(&node);
                if super::cleaning::has_agent(&node) && !kept_on {
                    match (&run.teardown_command, run.teardown_since) {
                        (None, _) => {
                            // Ask the ramdisk to power the machine off itself (it syncs
                            // first); the BMC makes sure afterwards.
                            let id = uuid::Uuid::new_v4().to_string();
                            run.teardown_command = Some(id.clone());
                            run.teardown_since = Some(Utc::now());
                            Self::put_run(&mut node, &run);
                            let node = self
                                .ensure_state(node, ProvisionState::WaitCallBack)
                                .await?;
                            self.queue(
                                &uuid,
                                rivet_protocol::agent::Command {
                                    id,
                                    kind: CommandKind::PowerOff,
                                },
                            )
                            .await?;
                            return Ok(Some(node));
                        }
                        (Some(id), since) => {
                            let answered = self
                                .store
                                .command(&uuid, id)
                                .await
                                .map(|c| c.result.is_some())
                                .unwrap_or(true);
                            let waited = since
                                .map(|t| (Utc::now() - t).num_seconds())
                                .unwrap_or(i64::MAX);
                            if !answered && waited < SOFT_POWER_OFF_WAIT_S {
                                return Ok(None);
                            }
                        }
                    }
                }
                let off = self.power_off_unless_kept_on(&node, bmc).await;
                if off.is_ok() {
                    node.power_state = Some(super::power_policy::state_after_off(&node));
                    super::agent::forget_agent_token(&mut node);
                    let _ = self.store.cancel_pending(&uuid).await;
                }
                off
            }
            "hold" => {
                // Past the hold: `unhold` goes on with the next step, `abort` fails the deploy.
                run.index += 1;
                Self::put_run(&mut node, &run);
                node.deploy_step = None;
                tracing::info!(node = %uuid, "deploy on hold; `unhold` continues, `abort` stops");
                return self.event(node, Event::Hold, None).await.map(Some);
            }
            "boot_instance" => {
                let action = super::power_policy::boot_action(&node);
                let on = bmc.set_power(&uuid, &node.driver_info, action).await;
                if on.is_ok() {
                    node.power_state = Some(PowerState::On);
                }
                on
            }
            other => {
                let msg = format!(
                    "unknown conductor deploy step {other:?} on node {}",
                    node.ident()
                );
                let node = self.ensure_state(node, ProvisionState::Deploying).await?;
                return self.fail(node, &msg).await.map(Some);
            }
        };
        match outcome {
            Ok(()) => {
                tracing::info!(node = %uuid, step = name, "deploy step done");
                run.index += 1;
                run.teardown_command = None;
                run.teardown_since = None;
                Self::put_run(&mut node, &run);
                node.deploy_step = None;
                self.ensure_state(node, ProvisionState::Deploying)
                    .await
                    .map(Some)
            }
            Err(e) => {
                let msg = format!("deploy step {name} failed on node {}: {e}", node.ident());
                let node = self.ensure_state(node, ProvisionState::Deploying).await?;
                self.fail(node, &msg).await.map(Some)
            }
        }
    }

    async fn finish_deploy(&self, node: Node) -> Result<Node, ConductorError> {
        tracing::info!(node = %node.uuid, "deploy finished");
        // The run is forgotten in the same write that makes the node active: stored in
        // `deploying` without its run (the second write failing, the database restarting
        // or the controller killed in between), the node would deploy again from scratch.
        let mut node = self.ensure_state(node, ProvisionState::Deploying).await?;
        node.runs.deploy = None;
        node.deploy_step = None;
        self.event(node, Event::Done, None).await
    }

    /// Entering `deploy failed` — a failed step, a digest mismatch the agent reported, a
    /// callback or heartbeat timeout, an abort, a panic — whatever the path ([`Self::event`]
    /// calls this for every transition into it): stop the agent's running command and power
    /// the node off, so nothing keeps writing to the disk and nothing boots what is on it.
    /// Runs in its own tracked task: the transition is already written and never waits for a
    /// slow BMC, and a shutdown lets it finish.
    pub(crate) fn after_deploy_failure(&self, failed: &Node) {
        let Some(this) = self.me.upgrade() else {
            return;
        };
        self.image_cache.unpin(&failed.uuid);
        let failed = failed.clone();
        self.tasks
            .spawn(async move { this.stop_failed_deploy(&failed).await });
    }

    /// [`Self::after_deploy_failure`]'s work: abort the agent's deploy command if it has not
    /// ended (and give the agent [`ABORT_WAIT_S`] to stop and wipe what it wrote), then power
    /// off unless `[deploy] power_off_after_deploy_failure` is false or the node has
    /// `disable_power_off`, and say which in the node's history.
    async fn stop_failed_deploy(&self, failed: &Node) {
        let uuid = failed.uuid.as_str();
        let power_off = self.config.deploy.power_off_after_deploy_failure
            && !super::power_policy::kept_on(failed);
        if let Some(id) = Self::deploy_command(failed) {
            let ended = |c: &Result<rivet_store::StoredCommand, _>| {
                matches!(
                    c,
                    Ok(rivet_store::StoredCommand {
                        result: Some(_),
                        ..
                    })
                )
            };
            if !ended(&self.store.command(uuid, &id).await) {
                match self
                    .send_command(
                        uuid,
                        CommandKind::Abort {
                            command_id: id.clone(),
                        },
                    )
                    .await
                {
                    Ok(_) => {
                        tracing::info!(node = %uuid, command = %id, "deploy failed: the agent was told to abort its running command")
                    }
                    Err(e) => {
                        tracing::warn!(node = %uuid, command = %id, error = %e, "deploy failed: cannot tell the agent to abort its running command")
                    }
                }
                // The agent stops the step (and wipes what it wrote) before the power goes:
                // wait for its result, bounded, as a dead agent never answers.
                let deadline =
                    tokio::time::Instant::now() + std::time::Duration::from_secs(ABORT_WAIT_S);
                while power_off && tokio::time::Instant::now() < deadline {
                    if ended(&self.store.command(uuid, &id).await) {
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                }
            }
        }
        // Decided on the current record: an operator may have moved the node on meanwhile
        // (rebuild, undeploy), and then its power is that operation's.
        let node = match self.store.get_node(uuid).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(node = %uuid, error = %e, "deploy failed: cannot read the node to power it off");
                return;
            }
        };
        if node.provision_state != ProvisionState::DeployFailed {
            tracing::info!(node = %uuid, state = %node.provision_state, "the node left deploy failed before it was powered off; its power is left to the new operation");
            return;
        }
        if !node.runs.failure_power_pending {
            // Another task (or the run before a restart) decided already.
            return;
        }
        let outcome = if !self.config.deploy.power_off_after_deploy_failure {
            FailurePower::Left("[deploy] power_off_after_deploy_failure is false")
        } else if super::power_policy::kept_on(&node) {
            FailurePower::Left("disable_power_off is set")
        } else {
            if super::cleaning::has_agent(&node) {
                // The ramdisk syncs and powers off itself if it can; the BMC makes sure.
                let _ = self.send_command(uuid, CommandKind::PowerOff).await;
            }
            let off = match self.bmc(&node) {
                Ok(bmc) => match self.power_off_unless_kept_on(&node, bmc.as_ref()).await {
                    Ok(()) => {
                        self.clean_up_ramdisk_logged(&node, bmc.as_ref()).await;
                        Ok(())
                    }
                    Err(e) => Err(format!("BMC error: {e}")),
                },
                Err(e) => Err(e.to_string()),
            };
            match off {
                Ok(()) => FailurePower::Off,
                Err(e) => FailurePower::Failed(e),
            }
        };
        let mut node = node;
        if outcome == FailurePower::Off {
            let written = self
                .update_fresh(uuid, |n| {
                    if n.provision_state != ProvisionState::DeployFailed {
                        return false;
                    }
                    n.power_state = Some(PowerState::Off);
                    n.runs.failure_power_pending = false;
                    true
                })
                .await;
            match written {
                Ok(Some(n)) => node = n,
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(node = %uuid, error = %e, "could not record power off after the deploy failure")
                }
            }
        }
        match &outcome {
            FailurePower::Off => {
                tracing::info!(node = %uuid, "node powered off after the deploy failure")
            }
            FailurePower::Left(why) => {
                tracing::info!(node = %uuid, reason = why, "node not powered off after the deploy failure")
            }
            FailurePower::Failed(e) => {
                tracing::warn!(node = %uuid, error = %e, "could not power off the node after the deploy failure")
            }
        }
        if node.runs.failure_power_pending {
            let cleared = self
                .update_fresh(uuid, |n| {
                    let pending = n.runs.failure_power_pending;
                    n.runs.failure_power_pending = false;
                    pending
                })
                .await;
            match cleared {
                Ok(Some(n)) => node = n,
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(node = %uuid, error = %e, "could not record that the power after the deploy failure was decided")
                }
            }
        }
        self.record_failure_power(&node, &outcome).await;
    }

    /// The node-history row of what [`Self::stop_failed_deploy`] did with the power.
    async fn record_failure_power(&self, node: &Node, outcome: &FailurePower) {
        let (action, event) = match outcome {
            FailurePower::Off => (
                FAILURE_POWER_ACTION,
                "node powered off after the deploy failure".to_string(),
            ),
            FailurePower::Left(why) => (
                FAILURE_POWER_ACTION,
                format!("node not powered off after the deploy failure: {why}"),
            ),
            FailurePower::Failed(e) => (
                FAILURE_POWER_ERROR_ACTION,
                format!("node could not be powered off after the deploy failure: {e}"),
            ),
        };
        self.record_history(node, action, &event, "the power off after a deploy failure")
            .await;
    }

    /// The step a deploy is running now and whether it may be interrupted.
    pub(crate) fn running_deploy_step(node: &Node) -> Option<(String, bool)> {
        let step = node.deploy_step.as_ref()?;
        let name = step.get("step").and_then(Value::as_str)?.to_string();
        let abortable = step
            .get("abortable")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        Some((name, abortable || Self::deploy_command(node).is_none()))
    }

    /// The agent command of the running deploy step, for timeouts and aborts.
    pub(crate) fn deploy_command(node: &Node) -> Option<String> {
        node.runs.deploy.as_ref().and_then(|r| r.command.clone())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rivet_protocol::deploy::WRITE_IMAGE_PRIORITY;

    fn names(plan: &[PlannedStep]) -> Vec<&str> {
        plan.iter().map(|p| p.step.step.as_str()).collect()
    }

    #[test]
    fn default_plan_and_requested_priorities() {
        let mut plan = conductor_deploy_steps();
        plan.push(PlannedStep {
            step: StepDescriptor::in_band(WRITE_IMAGE, WRITE_IMAGE_PRIORITY),
            args: Map::new(),
            source: Source::Agent,
        });
        let p = apply_requested(plan.clone(), &[]);
        assert_eq!(
            names(&p),
            vec![
                "deploy",
                "write_image",
                "prepare_instance_boot",
                "tear_down_agent",
                "boot_instance"
            ]
        );
        let req = vec![
            RequestedDeployStep {
                interface: "deploy".into(),
                step: "boot_instance".into(),
                args: Map::new(),
                priority: 0,
            },
            RequestedDeployStep {
                interface: "deploy".into(),
                step: "tear_down_agent".into(),
                args: Map::new(),
                priority: 90,
            },
        ];
        let p = apply_requested(plan, &req);
        assert_eq!(
            names(&p),
            vec![
                "deploy",
                "tear_down_agent",
                "write_image",
                "prepare_instance_boot"
            ]
        );
    }

    #[test]
    fn requested_steps_checked() {
        let bad = RequestedDeployStep {
            interface: "deploy".into(),
            step: "deploy".into(),
            args: Map::new(),
            priority: 0,
        };
        assert!(check_requested(std::slice::from_ref(&bad))
            .unwrap_err()
            .contains("cannot be disabled"));
        let neg = RequestedDeployStep {
            priority: -1,
            step: "x".into(),
            ..bad
        };
        assert!(check_requested(&[neg]).unwrap_err().contains("negative"));
    }

    mod after_failure {
        use super::super::*;
        use rivet_model::config::Config;
        use rivet_protocol::agent::{Command, CommandResult};
        use rivet_store::{AuditQuery, SortDir};
        use std::sync::Arc;
        use std::time::Duration;

        async fn conductor(power_off: bool) -> (Arc<Conductor>, tempfile::TempDir) {
            let dir = tempfile::tempdir().unwrap();
            let store = rivet_store::sqlite::SqliteStore::open(
                &dir.path().join("rivet.db").to_string_lossy(),
                rivet_support::secrets::Secrets::ephemeral(),
            )
            .unwrap();
            let mut config = Config {
                conductor_id: "c1".into(),
                ..Config::default()
            };
            config.deploy.power_off_after_deploy_failure = power_off;
            (Conductor::new(Arc::new(store), config), dir)
        }

        /// A fake-hardware node in wait call-back, powered on at its (fake) BMC.
        async fn waiting(c: &Conductor, change: impl FnOnce(&mut Node)) -> Node {
            let mut n = Node::new(uuid::Uuid::new_v4().to_string(), "fake-hardware".into());
            n.provision_state = ProvisionState::WaitCallBack;
            n.power_state = Some(PowerState::On);
            change(&mut n);
            c.fake
                .set_power(&n.uuid, &Map::new(), PowerState::On)
                .await
                .unwrap();
            c.store.create_node(&n).await.unwrap()
        }

        /// The node's history rows about the power after the failure, once there is one.
        async fn power_rows(c: &Conductor, uuid: &str) -> Vec<(String, String)> {
            for _ in 0..200 {
                let rows: Vec<(String, String)> = c
                    .store
                    .list_audit(&AuditQuery {
                        node_uuid: Some(uuid.to_string()),
                        limit: 100,
                        marker: None,
                        sort_dir: SortDir::Asc,
                    })
                    .await
                    .unwrap()
                    .into_iter()
                    .filter(|r| r.action.starts_with(FAILURE_POWER_ACTION))
                    .map(|r| (r.action, r.detail.unwrap_or_default()))
                    .collect();
                if !rows.is_empty() {
                    return rows;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            panic!("no history row about the power after the deploy failure");
        }

        async fn bmc_power(c: &Conductor, uuid: &str) -> PowerState {
            c.fake.get_power(uuid, &Map::new()).await.unwrap()
        }

        #[tokio::test]
        async fn failure_powers_off_through_the_bmc_and_says_so() {
            let (c, _dir) = conductor(true).await;
            let n = waiting(&c, |_| {}).await;
            let failed = c.fail(n, "deploy step write_image failed").await.unwrap();
            assert_eq!(failed.provision_state, ProvisionState::DeployFailed);
            let rows = power_rows(&c, &failed.uuid).await;
            assert_eq!(
                rows,
                vec![(
                    FAILURE_POWER_ACTION.to_string(),
                    "node powered off after the deploy failure; state: deploy failed".to_string()
                )]
            );
            assert_eq!(bmc_power(&c, &failed.uuid).await, PowerState::Off);
            let stored = c.store.get_node(&failed.uuid).await.unwrap();
            assert_eq!(stored.power_state, Some(PowerState::Off));
        }

        /// A controller that died between writing `deploy failed` and powering off does it at
        /// start-up (the pending flag was in the transition's own write), once.
        #[tokio::test]
        async fn a_restart_finishes_the_power_off_the_last_run_left_undone() {
            let (c, _dir) = conductor(true).await;
            let n = waiting(&c, |n| {
                n.provision_state = ProvisionState::DeployFailed;
                n.runs.failure_power_pending = true;
            })
            .await;
            let resumed = c.recover().await.unwrap();
            assert_eq!(resumed, 1);
            let rows = power_rows(&c, &n.uuid).await;
            assert_eq!(rows.len(), 1, "{rows:?}");
            assert_eq!(bmc_power(&c, &n.uuid).await, PowerState::Off);
            let stored = c.store.get_node(&n.uuid).await.unwrap();
            assert!(!stored.runs.failure_power_pending, "the flag is cleared");
            // Nothing pending: a second start-up leaves the node alone.
            assert_eq!(c.recover().await.unwrap(), 0);
            // And a transition into deploy failed sets the flag in its own write.
            let n = waiting(&c, |_| {}).await;
            let failed = c.fail(n, "x").await.unwrap();
            assert!(failed.runs.failure_power_pending);
        }

        #[tokio::test]
        async fn option_off_or_disable_power_off_leave_the_power_alone() {
            let (c, _dir) = conductor(false).await;
            let n = waiting(&c, |_| {}).await;
            let failed = c.fail(n, "x").await.unwrap();
            let rows = power_rows(&c, &failed.uuid).await;
            assert_eq!(rows[0].0, FAILURE_POWER_ACTION);
            assert!(
                rows[0].1.contains("not powered off")
                    && rows[0]
                        .1
                        .contains("power_off_after_deploy_failure is false"),
                "{rows:?}"
            );
            assert_eq!(bmc_power(&c, &failed.uuid).await, PowerState::On);
            let stored = c.store.get_node(&failed.uuid).await.unwrap();
            assert_eq!(stored.power_state, Some(PowerState::On));

            let (c, _dir) = conductor(true).await;
            let n = waiting(&c, |n| n.attrs.disable_power_off = true).await;
            let failed = c.fail(n, "x").await.unwrap();
            let rows = power_rows(&c, &failed.uuid).await;
            assert!(rows[0].1.contains("disable_power_off is set"), "{rows:?}");
            assert_eq!(bmc_power(&c, &failed.uuid).await, PowerState::On);
        }

        #[tokio::test]
        async fn bmc_error_is_an_error_entry_with_its_text() {
            let (c, _dir) = conductor(true).await;
            let n = waiting(&c, |n| {
                n.driver_info
                    .insert("fake_fail".into(), Value::from("BMC unreachable"));
            })
            .await;
            let failed = c.fail(n, "x").await.unwrap();
            let rows = power_rows(&c, &failed.uuid).await;
            assert_eq!(rows[0].0, FAILURE_POWER_ERROR_ACTION);
            assert!(
                rows[0].1.contains("could not be powered off")
                    && rows[0].1.contains("BMC unreachable"),
                "{rows:?}"
            );
            let stored = c.store.get_node(&failed.uuid).await.unwrap();
            assert_eq!(stored.power_state, Some(PowerState::On), "unchanged");
        }

        /// A running deploy command is aborted first, and the power goes only once the agent
        /// stopped it (here well before ABORT_WAIT_S); exactly one abort, one power off.
        #[tokio::test]
        async fn running_command_aborted_before_the_power_off() {
            let (c, _dir) = conductor(true).await;
            let n = waiting(&c, |n| {
                n.runs.deploy = Some(DeployRun {
                    command: Some("cmd-1".into()),
                    ..Default::default()
                });
            })
            .await;
            c.store
                .enqueue_command(
                    &n.uuid,
                    &Command {
                        id: "cmd-1".into(),
                        kind: CommandKind::ExecuteStep {
                            interface: "deploy".into(),
                            step: WRITE_IMAGE.into(),
                            args: Map::new(),
                        },
                    },
                )
                .await
                .unwrap();
            let started = std::time::Instant::now();
            let failed = c
                .event(n, Event::Abort, Some("aborted".into()))
                .await
                .unwrap();
            assert_eq!(failed.provision_state, ProvisionState::DeployFailed);
            let aborts = || async {
                c.store
                    .pending_commands(&failed.uuid)
                    .await
                    .unwrap()
                    .into_iter()
                    .filter(|p| matches!(&p.kind, CommandKind::Abort { command_id } if command_id == "cmd-1"))
                    .count()
            };
            while aborts().await == 0 {
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "no abort queued"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert_eq!(
                bmc_power(&c, &failed.uuid).await,
                PowerState::On,
                "powered off before the agent stopped its command"
            );
            assert_eq!(aborts().await, 1);
            c.store
                .record_result(
                    &failed.uuid,
                    &CommandResult {
                        id: "cmd-1".into(),
                        name: "execute_step".into(),
                        status: CommandStatus::Aborted,
                        result: Value::Null,
                        error: Some("aborted".into()),
                        log_tail: None,
                    },
                )
                .await
                .unwrap();
            let rows = power_rows(&c, &failed.uuid).await;
            assert_eq!(rows.len(), 1, "{rows:?}");
            assert!(rows[0].1.starts_with("node powered off"), "{rows:?}");
            assert!(started.elapsed() < Duration::from_secs(ABORT_WAIT_S));
            assert_eq!(bmc_power(&c, &failed.uuid).await, PowerState::Off);
        }
    }
}
