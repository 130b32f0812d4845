//! Servicing (Ironic 1.87): steps run on an `active` node without redeploying it.
//!
//! `{"target": "service", "service_steps": [...]}` plans the steps in the order given:
//! the conductor's own (`hold`, `wait`, `power_on`, `power_off`, `reboot`), the driver's
//! out-of-band steps (BIOS, firmware…, whatever `Bmc::steps` offers for the node), and the
//! rest in-band, on the agent. The ramdisk is booted only when an in-band step comes up, and
//! once it was booted the instance is booted from its disk again at the end. With
//! `disable_ramdisk` only conductor and out-of-band steps are accepted.
//!
//! The instance's disk is the point of the node being `active`: steps that erase disks are
//! refused unless the step's args carry `"erase_instance_disk": true` (which is removed
//! before the step runs).
//!
//! The run is typed ([`ServiceRun`] in the node's run state); the running step is shown as
//! `service_step`. Level-triggered like cleaning: each call makes one decision and writes it.

use super::steps::{self, PlannedStep, Source};
use super::{Conductor, ConductorError};
use rivet_drivers::{Bmc, BootDevice};
use rivet_model::fsm::Event;
use rivet_model::node::Node;
use rivet_model::runs::ServiceRun;
use rivet_protocol::agent::{Command, CommandKind, CommandStatus};
use rivet_protocol::states::{PowerState, ProvisionState};
use rivet_protocol::steps::RequestedStep;
use serde_json::Value;
use std::time::Duration;

/// The arg that allows a disk-erasing step during servicing.
const ERASE_OK: &str = "erase_instance_disk";

/// The node's run, if it has one.
pub(crate) fn run_of(node: &Node) -> Option<ServiceRun> {
    node.runs.service.clone()
}

fn put_run(node: &mut Node, run: &ServiceRun) {
    node.runs.service = Some(run.clone());
}

/// `service_step` as shown: the running step, `{}` between steps and outside servicing.
pub fn service_step(node: &Node) -> Value {
    node.runs
        .service
        .as_ref()
        .and_then(|r| r.current.clone())
        .filter(|c| !c.is_null())
        .unwrap_or_else(|| serde_json::json!({}))
}

/// Whether a step erases disks (and so would destroy the instance).
fn erases(step: &str) -> bool {
    step.starts_with("erase_") || step == "write_image" || step.contains("wipe")
}

/// Check the request before anything changes; the message says what to fix.
pub(crate) fn check_request(
    requested: &[RequestedStep],
    oob: &[rivet_protocol::steps::StepDescriptor],
    disable_ramdisk: bool,
) -> Result<(), String> {
    if requested.is_empty() {
        return Err("service_steps is empty; give at least one step".into());
    }
    for r in requested {
        if r.interface.is_empty() || r.step.is_empty() {
            return Err("each service step needs an interface and a step".into());
        }
        if erases(&r.step) && r.args.get(ERASE_OK) != Some(&Value::Bool(true)) {
            return Err(format!(
                "service step {}.{} erases disks and would destroy the instance; add \"{ERASE_OK}\": true to its args if that is what you want",
                r.interface, r.step
            ));
        }
        let conductor = steps::conductor_steps()
            .iter()
            .any(|c| c.step == r.step && c.interface == r.interface);
        let driver = oob
            .iter()
            .any(|s| s.step == r.step && s.interface == r.interface);
        if disable_ramdisk && !conductor && !driver {
            return Err(format!(
                "service step {}.{} is not an out-of-band step, and disable_ramdisk is set: in-band steps need the ramdisk",
                r.interface, r.step
            ));
        }
    }
    Ok(())
}

/// A fresh run for a `service` verb.
pub(crate) fn start_run(node: &mut Node, requested: Vec<RequestedStep>, disable_ramdisk: bool) {
    // A retry after `service failed` may find the machine still in the ramdisk the failed run
    // booted: the instance must still be booted again at the end.
    let ramdisk_booted = run_of(node).is_some_and(|r| r.ramdisk_booted);
    put_run(
        node,
        &ServiceRun {
            requested,
            disable_ramdisk,
            ramdisk_booted,
            ..Default::default()
        },
    );
}

fn step_doc(p: &PlannedStep) -> Value {
    serde_json::json!({
        "interface": p.step.interface,
        "step": p.step.step,
        "priority": p.step.priority,
        "abortable": p.step.abortable,
        "args": p.args,
        "source": p.source,
    })
}

impl Conductor {
    /// Move between `servicing` and `service wait` as the next action needs, else write.
    async fn service_state(
        &self,
        node: Node,
        want: ProvisionState,
    ) -> Result<Node, ConductorError> {
        use ProvisionState::*;
        match (node.provision_state, want) {
            (Servicing, ServiceWait) => self.event(node, Event::Wait, None).await,
            (ServiceWait, Servicing) => self.event(node, Event::Resume, None).await,
            _ => Ok(self.update_node(&node).await?),
        }
    }

    async fn service_fail(&self, node: Node, msg: &str) -> Result<Option<Node>, ConductorError> {
        self.fail(node, msg).await.map(Some)
    }

    /// One decision of a servicing run.
    pub(crate) async fn advance_service(
        &self,
        mut node: Node,
        bmc: &dyn Bmc,
    ) -> Result<Option<Node>, ConductorError> {
        let uuid = node.uuid.clone();
        let Some(mut run) = run_of(&node) else {
            let msg = format!(
                "servicing of node {} has no steps recorded; send `service` with service_steps again",
                node.ident()
            );
            return self.service_fail(node, &msg).await;
        };
        // 1. The plan, in the order asked.
        let Some(plan) = run.plan.clone() else {
            let oob = bmc.steps(&uuid, &node.driver_info).await;
            if let Err(e) = check_request(&run.requested, &oob, run.disable_ramdisk) {
                let msg = format!("servicing of node {} refused: {e}", node.ident());
                return self.service_fail(node, &msg).await;
            }
            let mut plan = Vec::new();
            for r in &run.requested {
                let mut args = r.args.clone();
                args.remove(ERASE_OK);
                let conductor = steps::conductor_steps()
                    .into_iter()
                    .find(|c| c.step == r.step && c.interface == r.interface);
                let driver = oob
                    .iter()
                    .find(|s| s.step == r.step && s.interface == r.interface)
                    .cloned();
                let (step, source) = match (conductor, driver) {
                    (Some(c), _) => (c, Source::Conductor),
                    (None, Some(d)) => (d, Source::Driver),
                    (None, None) => (
                        rivet_protocol::steps::StepDescriptor {
                            interface: r.interface.clone(),
                            step: r.step.clone(),
                            priority: 0,
                            abortable: false,
                            argsinfo: Default::default(),
                            reboot_requested: false,
                            requires_ramdisk: true,
                        },
                        Source::Agent,
                    ),
                };
                for (name, info) in &step.argsinfo {
                    if info.required && !args.contains_key(name) {
                        let msg = format!(
                            "servicing of node {} refused: step {}.{} needs argument {name:?} ({})",
                            node.ident(),
                            r.interface,
                            r.step,
                            info.description
                        );
                        return self.service_fail(node, &msg).await;
                    }
                }
                plan.push(PlannedStep { step, args, source });
            }
            tracing::info!(node = %uuid, steps = ?plan.iter().map(|p| p.step.step.as_str()).collect::<Vec<_>>(), "service plan");
            run.plan = Some(plan);
            run.index = 0;
            put_run(&mut node, &run);
            return Ok(Some(self.update_node(&node).await?));
        };
        // 2. The next step, or the end.
        let Some(step) = plan.get(run.index).cloned() else {
            return self.finish_service(node, run, bmc).await.map(Some);
        };
        run.current = Some(step_doc(&step));
        match step.source {
            Source::Conductor => {
                let name = step.step.step.as_str();
                if name == "hold" {
                    run.index += 1;
                    run.current = None;
                    put_run(&mut node, &run);
                    tracing::info!(node = %uuid, "servicing on hold; `unhold` continues, `abort` stops");
                    return self.event(node, Event::Hold, None).await.map(Some);
                }
                put_run(&mut node, &run);
                let node = self.service_state(node, ProvisionState::Servicing).await?;
                let done = match name {
                    "wait" => {
                        let secs = step
                            .args
                            .get("seconds")
                            .and_then(Value::as_u64)
                            .unwrap_or(0)
                            .min(3600);
                        tokio::time::sleep(Duration::from_secs(secs)).await;
                        Ok(())
                    }
                    "power_on" => {
                        bmc.set_power(&uuid, &node.driver_info, PowerState::On)
                            .await
                    }
                    "power_off" if super::power_policy::kept_on(&node) => {
                        Err(rivet_drivers::DriverError::Unsupported {
                            driver: "conductor".into(),
                            operation: "power_off on a node with disable_power_off set".into(),
                        })
                    }
                    "power_off" => {
                        bmc.set_power(&uuid, &node.driver_info, PowerState::Off)
                            .await
                    }
                    "reboot" => {
                        bmc.set_power(&uuid, &node.driver_info, PowerState::Rebooting)
                            .await
                    }
                    other => Err(rivet_drivers::DriverError::Unsupported {
                        driver: "conductor".into(),
                        operation: format!("service step {other}"),
                    }),
                };
                let node = self.store.get_node(&uuid).await?;
                self.service_step_done(node, &step, done.map(|_| ())).await
            }
            Source::Driver => {
                put_run(&mut node, &run);
                let node = self.service_state(node, ProvisionState::Servicing).await?;
                tracing::info!(node = %uuid, step = %step.step.step, "running out-of-band service step");
                let done = match bmc
                    .execute_step(&uuid, &node.driver_info, &step.step, &step.args)
                    .await
                {
                    // BIOS settings and the like apply at the next boot: reboot (back into
                    // the ramdisk if this run booted it), check, refresh the caches.
                    Ok(result) => {
                        let ramdisk = match run.ramdisk_booted {
                            true => Some((
                                super::boot::BootMethod::of(&node).ramdisk_device(),
                                self.override_mode(&node).await,
                            )),
                            false => None,
                        };
                        super::oob_steps::reboot_verify_refresh(
                            self.store.as_ref(),
                            bmc,
                            &node,
                            &step,
                            &result,
                            ramdisk,
                        )
                        .await
                        .map(|()| super::oob_steps::reboot_needed(&step, &result))
                    }
                    Err(e) => Err(e),
                };
                let mut node = self.store.get_node(&uuid).await?;
                if done.as_ref().is_ok_and(|rebooted| *rebooted) && run.ramdisk_booted {
                    // The rebooted ramdisk looks up again and gets a new token.
                    super::agent::forget_agent_token(&mut node);
                    let _ = self.store.cancel_pending(&node.uuid).await;
                }
                self.service_step_done(node, &step, done.map(|_| ())).await
            }
            Source::Agent => {
                if !run.ramdisk_booted {
                    if node.provision_state != ProvisionState::Servicing {
                        return self.event(node, Event::Resume, None).await.map(Some);
                    }
                    if let Err(e) = self.boot_ramdisk(&mut node, bmc).await {
                        let msg = format!(
                            "failed to boot the ramdisk for service step {} on node {}: {e}",
                            step.step.step,
                            node.ident()
                        );
                        return self.service_fail(node, &msg).await;
                    }
                    run.ramdisk_booted = true;
                    put_run(&mut node, &run);
                    tracing::info!(node = %uuid, "servicing ramdisk booting; waiting for the agent");
                    return self.event(node, Event::Wait, None).await.map(Some);
                }
                if !super::cleaning::has_agent(&node) {
                    if node.provision_state != ProvisionState::ServiceWait {
                        put_run(&mut node, &run);
                        return self
                            .service_state(node, ProvisionState::ServiceWait)
                            .await
                            .map(Some);
                    }
                    return Ok(None);
                }
                let kind = CommandKind::ExecuteStep {
                    interface: step.step.interface.clone(),
                    step: step.step.step.clone(),
                    args: step.args.clone(),
                };
                let Some(id) = run.command.clone() else {
                    let id = uuid::Uuid::new_v4().to_string();
                    run.command = Some(id.clone());
                    put_run(&mut node, &run);
                    let node = self
                        .service_state(node, ProvisionState::ServiceWait)
                        .await?;
                    self.queue(&uuid, Command { id, kind }).await?;
                    return Ok(Some(node));
                };
                let Some(result) = self.ensure_queued(&uuid, &id, kind).await? else {
                    return Ok(None);
                };
                let done = if result.status == CommandStatus::Succeeded {
                    Ok(())
                } else {
                    Err(result.error.unwrap_or_else(|| "no reason given".into()))
                };
                self.service_step_done(node, &step, done).await
            }
        }
    }

    /// Record the end of a step: the next one, or `service failed` with the reason.
    async fn service_step_done<E: std::fmt::Display>(
        &self,
        mut node: Node,
        step: &PlannedStep,
        outcome: Result<(), E>,
    ) -> Result<Option<Node>, ConductorError> {
        let Some(mut run) = run_of(&node) else {
            return Ok(Some(node));
        };
        match outcome {
            Ok(()) => {
                tracing::info!(node = %node.uuid, step = %step.step.step, "service step done");
                run.index += 1;
                run.command = None;
                run.current = None;
                put_run(&mut node, &run);
                Ok(Some(self.update_node(&node).await?))
            }
            Err(e) => {
                run.command = None;
                put_run(&mut node, &run);
                let msg = format!(
                    "service step {}.{} failed on node {}: {e}",
                    step.step.interface,
                    step.step.step,
                    node.ident()
                );
                self.service_fail(node, &msg).await
            }
        }
    }

    /// All steps done: boot the instance again if the ramdisk ran, then `active`.
    async fn finish_service(
        &self,
        mut node: Node,
        run: ServiceRun,
        bmc: &dyn Bmc,
    ) -> Result<Node, ConductorError> {
        if run.ramdisk_booted {
            if let Err(e) = self.boot_instance_again(&mut node, bmc).await {
                let msg = format!(
                    "servicing of node {} ran its steps but could not boot the instance again: {e}",
                    node.ident()
                );
                return self.fail(node, &msg).await;
            }
        }
        node.runs.service = None;
        tracing::info!(node = %node.uuid, "servicing finished");
        let node = if node.provision_state == ProvisionState::ServiceWait {
            self.event(node, Event::Resume, None).await?
        } else {
            node
        };
        self.event(node, Event::Done, None).await
    }

    /// Power off, put the ramdisk's medium away, boot from the instance's disk.
    async fn boot_instance_again(
        &self,
        node: &mut Node,
        bmc: &dyn Bmc,
    ) -> Result<(), rivet_drivers::DriverError> {
        let uuid = node.uuid.clone();
        // disable_power_off (1.95): never off; the boot below is then a reboot.
        self.power_off_unless_kept_on(node, bmc).await?;
        super::agent::forget_agent_token(node);
        let _ = self.store.cancel_pending(&uuid).await;
        self.clean_up_ramdisk(node, bmc).await?;
        let mode = self.override_mode(node).await;
        bmc.set_boot_device_persistent(&uuid, &node.driver_info, BootDevice::Disk, mode)
            .await?;
        let action = super::power_policy::boot_action(node);
        bmc.set_power(&uuid, &node.driver_info, action).await?;
        node.power_state = Some(PowerState::On);
        Ok(())
    }

    /// After `abort` in `service wait`/`service hold`: stop the agent's running step.
    pub(crate) async fn stop_service_step(&self, node: &Node) {
        if let Some(id) = run_of(node).and_then(|r| r.command) {
            let _ = self
                .send_command(&node.uuid, CommandKind::Abort { command_id: id })
                .await;
        }
    }

    /// `abort` from `service failed` back to `active`: if the ramdisk ran, the instance is
    /// booted again (best effort, logged) and the run forgotten. `left` is the node as the
    /// abort wrote it; this runs in the background after that write, so the node may already
    /// have started something new (a `service` sent the moment it read `active`): then the
    /// run on it is the new one and is left alone.
    pub(crate) async fn leave_service_failed(&self, left: &Node) {
        let uuid = left.uuid.clone();
        let booted = run_of(left).is_some_and(|r| r.ramdisk_booted);
        let mut power = None;
        if booted {
            let Ok(mut n) = self.store.get_node(&uuid).await else {
                return;
            };
            let Ok(bmc) = self.bmc(&n) else { return };
            match self.boot_instance_again(&mut n, bmc.as_ref()).await {
                Ok(()) => power = n.power_state,
                Err(e) => {
                    tracing::warn!(node = %uuid, error = %e, "could not boot the instance again after servicing was abandoned; power it on from its disk by hand")
                }
            }
        }
        // Read again after the BMC's round trips: only the node the abort left is ours.
        let Ok(mut n) = self.store.get_node(&uuid).await else {
            return;
        };
        if n.provision_state != left.provision_state
            || n.provision_updated_at != left.provision_updated_at
        {
            return;
        }
        if power.is_some() {
            n.power_state = power;
        }
        n.runs.service = None;
        if let Err(e) = self.update_node(&n).await {
            tracing::warn!(node = %uuid, error = %e, "could not forget the servicing run");
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn req(iface: &str, step: &str, args: Value) -> RequestedStep {
        RequestedStep {
            interface: iface.into(),
            step: step.into(),
            args: args.as_object().cloned().unwrap_or_default(),
            order: None,
        }
    }

    #[test]
    fn erase_refused_unless_asked_and_in_band_refused_without_ramdisk() {
        let e = check_request(
            &[req("deploy", "erase_devices", serde_json::json!({}))],
            &[],
            false,
        )
        .unwrap_err();
        assert!(e.contains("erase_instance_disk"), "{e}");
        assert!(check_request(
            &[req(
                "deploy",
                "erase_devices",
                serde_json::json!({"erase_instance_disk": true})
            )],
            &[],
            false
        )
        .is_ok());
        let e = check_request(
            &[req("deploy", "burnin_cpu", serde_json::json!({}))],
            &[],
            true,
        )
        .unwrap_err();
        assert!(e.contains("disable_ramdisk"), "{e}");
        assert!(check_request(&[req("deploy", "hold", serde_json::json!({}))], &[], true).is_ok());
        assert!(check_request(&[], &[], false).is_err());
    }
}
