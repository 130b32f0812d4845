//! Admin requests: provision verbs, power, maintenance. Each validates first and writes
//! nothing when it refuses.

use super::steps::{self, PlannedStep, Source};
use super::{Conductor, ConductorError};
use crate::fsm::{self, Event};
use crate::store::{AuditEntry, Node};
use chrono::Utc;
use rivet_protocol::agent::CommandKind;
use rivet_protocol::api::ProvisionRequest;
use rivet_protocol::states::{PowerState, ProvisionState, Verb};
use rivet_protocol::steps::RequestedStep;
use serde_json::Value;
use std::sync::Arc;

/// driver_internal_info key: the verb and caller that started the node's current operation,
/// the cause its transitions record in the audit trail.
const CAUSE_KEY: &str = "provision_cause";

/// At most `max` characters of `s`.
fn truncate_chars(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

/// Microversion a verb needs (Ironic's milestones).
fn min_version(verb: Verb, state: ProvisionState) -> (u32, u32) {
    match verb {
        Verb::Abort if state == ProvisionState::InspectWait => (1, 41),
        Verb::Abort if state == ProvisionState::WaitCallBack => (1, 110),
        Verb::Abort => (1, 13),
        Verb::Clean => (1, 15),
        Verb::Unhold => (1, 85),
        Verb::Adopt => (1, 17),
        Verb::Rescue | Verb::Unrescue => (1, 38),
        _ => (1, 1),
    }
}

impl Conductor {
    /// `PUT /v1/nodes/{id}/states/provision`: check, move the node, start the work. `by`
    /// names the caller for the audit trail (the cause of the transitions that follow).
    pub async fn provision(
        self: &Arc<Self>,
        ident: &str,
        req: &ProvisionRequest,
        version: (u32, u32),
        by: &str,
    ) -> Result<Node, ConductorError> {
        let mut node = self.store.get_node(ident).await?;
        let verb = req.target;
        let state = node.provision_state;
        let need = min_version(verb, state);
        if version < need {
            return Err(ConductorError::BadRequest(format!(
                "\"{verb}\" in \"{state}\" needs API version {}.{} or later; send X-OpenStack-Ironic-API-Version: {}.{}",
                need.0, need.1, need.0, need.1
            )));
        }
        if req.clean_steps.is_some() && verb != Verb::Clean {
            return Err(ConductorError::BadRequest(format!(
                "clean_steps is only valid with target \"clean\", not \"{verb}\""
            )));
        }
        if verb == Verb::Clean && req.clean_steps.is_none() {
            return Err(ConductorError::BadRequest(
                "target \"clean\" needs clean_steps (a list, possibly empty)".into(),
            ));
        }
        let to = fsm::next_for_verb(state, verb).ok_or_else(|| ConductorError::InvalidState {
            node: node.ident().to_string(),
            state,
            action: verb.to_string(),
            allowed: fsm::allowed_verbs(state),
        })?;
        if let Some(by) = &node.reservation {
            // Cleaning holds the node for the whole run; abort and unhold are how an
            // operator steers that run.
            if !matches!(verb, Verb::Abort | Verb::Unhold) {
                return Err(ConductorError::Locked {
                    node: node.ident().to_string(),
                    by: by.clone(),
                    state,
                });
            }
        }
        if node.maintenance && matches!(verb, Verb::Active | Verb::Deploy | Verb::Rebuild) {
            return Err(ConductorError::BadRequest(format!(
                "node {} is in maintenance; \"{verb}\" is refused until `rivet node maintenance unset {}`",
                node.ident(),
                node.ident()
            )));
        }
        if verb == Verb::Clean {
            self.check_manual_steps(&node, req.clean_steps.as_deref().unwrap_or_default())
                .await?;
        }
        // Every transition of the operation this verb starts names it as its cause.
        node.driver_internal_info.insert(
            CAUSE_KEY.into(),
            Value::from(format!("{verb} by {}", truncate_chars(by, 200))),
        );
        if verb == Verb::Abort
            && matches!(state, ProvisionState::CleanWait | ProvisionState::CleanHold)
        {
            return self.abort_cleaning(node).await;
        }
        let event = Event::from_verb(verb);
        node.target_provision_state = fsm::target_of(state, event, to);
        node.provision_state = to;
        node.provision_updated_at = Some(Utc::now());
        if verb == Verb::Abort {
            node.last_error = Some(format!(
                "{} operation was aborted by an operator in \"{state}\"",
                match state {
                    ProvisionState::InspectWait => "inspection",
                    ProvisionState::WaitCallBack | ProvisionState::DeployHold => "deploy",
                    ProvisionState::RescueWait => "rescue",
                    _ => "clean",
                }
            ));
            node.reservation = None;
        } else {
            node.last_error = None;
            node.fault = None;
        }
        if matches!(verb, Verb::Provide | Verb::Clean) {
            super::cleaning::clear_run(&mut node);
            node.driver_internal_info.remove("requested_clean_steps");
            // Reserved for the whole run, by the controller that owns the node (which may
            // not be the one that received this request).
            node.reservation = Some(self.owner_of(&node.uuid));
        }
        if verb == Verb::Inspect {
            super::inspection::clear_run(&mut node);
            node.inspection_started_at = None;
            node.inspection_finished_at = None;
            super::agent::forget_agent_token(&mut node);
        }
        if verb == Verb::Clean {
            let steps = serde_json::to_value(req.clean_steps.as_deref().unwrap_or_default())
                .map_err(|e| ConductorError::BadRequest(e.to_string()))?;
            node.driver_internal_info
                .insert("requested_clean_steps".into(), steps);
        }
        if to.is_stable() || to.is_failed() {
            node.target_provision_state = None;
        }
        if to.is_stable() {
            super::agent::forget_agent_token(&mut node);
        }
        let node = self.store.update_node(&node).await?;
        self.record_transition(&node, state, &format!("verb: {verb}"))
            .await;
        tracing::info!(node = %node.uuid, from = %state, to = %to, verb = %verb, "provision verb accepted");
        if verb == Verb::Abort && state == ProvisionState::InspectWait {
            // Tell the ramdisk to stop: it still holds its token and picks this up.
            self.send_command(&node.uuid, CommandKind::PowerOff).await?;
        }
        if to.is_conductor_busy() || to == ProvisionState::CleanWait {
            self.kick(&node.uuid);
        }
        Ok(node)
    }

    /// Manual steps are checked before anything runs: against the node's cached steps (from
    /// its last cleaning), the driver's out-of-band steps and the conductor's reserved ones.
    /// Without a cache, agent steps are checked when the agent reports its steps instead.
    async fn check_manual_steps(
        &self,
        node: &Node,
        requested: &[RequestedStep],
    ) -> Result<(), ConductorError> {
        let bmc = self.bmc(node)?;
        let driver = bmc.steps(&node.uuid, &node.driver_info).await;
        let cached: Option<Vec<PlannedStep>> = node
            .driver_internal_info
            .get("cached_clean_steps")
            .and_then(|v| serde_json::from_value(v.clone()).ok());
        let agent: Vec<_> = cached
            .as_deref()
            .unwrap_or_default()
            .iter()
            .filter(|p| p.source == Source::Agent)
            .map(|p| p.step.clone())
            .collect();
        let available = steps::available(&agent, &driver);
        let checkable: Vec<RequestedStep> = requested
            .iter()
            .filter(|r| {
                cached.is_some()
                    || r.interface != "deploy"
                    || steps::conductor_steps().iter().any(|c| c.step == r.step)
            })
            .cloned()
            .collect();
        steps::manual_plan(&checkable, &available)
            .map(|_| ())
            .map_err(|e| ConductorError::BadRequest(format!("node {}: {e}", node.ident())))
    }

    /// `abort` in clean wait / clean hold. A step that is not abortable is never interrupted:
    /// the abort is recorded on `clean_step` and takes effect when the step ends.
    async fn abort_cleaning(self: &Arc<Self>, mut node: Node) -> Result<Node, ConductorError> {
        let state = node.provision_state;
        let step_name = node
            .clean_step
            .as_ref()
            .and_then(|s| s.get("step"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let abortable = node
            .clean_step
            .as_ref()
            .and_then(|s| s.get("abortable"))
            .and_then(Value::as_bool)
            .unwrap_or(true);
        let running = node
            .driver_internal_info
            .get("clean_command")
            .and_then(Value::as_str)
            .map(str::to_string);
        if let (Some(step), Some(_), false) = (&step_name, &running, abortable) {
            if let Some(obj) = node.clean_step.as_mut().and_then(Value::as_object_mut) {
                obj.insert("abort_after".into(), Value::Bool(true));
            }
            let node = self.store.update_node(&node).await?;
            tracing::warn!(node = %node.uuid, step = %step, "abort requested during a non-abortable step; cleaning fails when it ends");
            return Ok(node);
        }
        let during = step_name
            .as_deref()
            .map(|s| format!("during step {s:?}"))
            .unwrap_or_else(|| "before any step ran".into());
        let msg = format!("clean operation was aborted by an operator in \"{state}\" {during}");
        node.last_error = Some(msg.clone());
        let uuid = node.uuid.clone();
        let node = self.event(node, Event::Abort, Some(msg)).await?;
        if let Some(id) = running {
            // Tell the agent to stop the step; it still holds its token for this boot.
            self.send_command(&uuid, CommandKind::Abort { command_id: id })
                .await?;
        }
        Ok(node)
    }

    /// `PUT /v1/nodes/{id}/states/power`.
    pub async fn set_power(
        self: &Arc<Self>,
        ident: &str,
        target: PowerState,
    ) -> Result<Node, ConductorError> {
        use ProvisionState::*;
        let mut node = self.store.get_node(ident).await?;
        let state = node.provision_state;
        if matches!(state, Cleaning | CleanWait | CleanHold) {
            return Err(ConductorError::BadRequest(format!(
                "node {} is in \"{state}\"; power actions are refused while cleaning — abort the cleaning first (`rivet node abort {}`)",
                node.ident(),
                node.ident()
            )));
        }
        if target == PowerState::Error {
            return Err(ConductorError::BadRequest(
                "target must be one of: power on, power off, rebooting, soft rebooting, soft power off"
                    .into(),
            ));
        }
        if let Some(by) = &node.reservation {
            return Err(ConductorError::Locked {
                node: node.ident().to_string(),
                by: by.clone(),
                state,
            });
        }
        if let Some(t) = node.target_power_state {
            return Err(ConductorError::BadRequest(format!(
                "node {} already has a power action in progress (target \"{t}\"); retry when it ends",
                node.ident()
            )));
        }
        let bmc = self.bmc(&node)?;
        node.target_power_state = Some(target);
        node.last_error = None;
        let node = self.store.update_node(&node).await?;
        let this = self.clone();
        let uuid = node.uuid.clone();
        tokio::spawn(async move {
            let result = async {
                let mut n = this.store.get_node(&uuid).await?;
                let was_on = n.power_state == Some(PowerState::On);
                let outcome = match bmc.set_power(&n.uuid, &n.driver_info, target).await {
                    Ok(()) => bmc.get_power(&n.uuid, &n.driver_info).await,
                    Err(e) => Err(e),
                };
                // The record may have changed while the BMC worked: apply our fields to a
                // fresh copy.
                n = this.store.get_node(&uuid).await?;
                n.target_power_state = None;
                // Anything but switching on a running machine ends or starts a boot: the
                // ramdisk's token (if any) belonged to the old one.
                let new_boot = target != PowerState::On || !was_on;
                match outcome {
                    Ok(p) => {
                        n.power_state = Some(p);
                        if new_boot {
                            super::agent::forget_agent_token(&mut n);
                        }
                    }
                    Err(e) => {
                        n.last_error = Some(format!(
                            "failed to set power state of node {} to \"{target}\": {e}",
                            n.ident()
                        ))
                    }
                }
                this.store.update_node(&n).await?;
                if new_boot {
                    // A held heartbeat of the old boot hears at once that its token is gone.
                    this.wakeup(&uuid).notify_waiters();
                }
                Ok::<_, ConductorError>(())
            }
            .await;
            if let Err(e) = result {
                tracing::error!(node = %uuid, error = %e, "power action failed");
            }
        });
        Ok(node)
    }

    /// `PUT`/`DELETE /v1/nodes/{id}/maintenance`.
    pub async fn set_maintenance(
        self: &Arc<Self>,
        ident: &str,
        on: bool,
        reason: Option<String>,
    ) -> Result<Node, ConductorError> {
        let mut node = self.store.get_node(ident).await?;
        node.maintenance = on;
        node.maintenance_reason = if on { reason } else { None };
        if !on {
            node.fault = None;
        }
        let node = self.store.update_node(&node).await?;
        if !on && node.provision_state.is_conductor_busy() {
            self.kick(&node.uuid);
        }
        Ok(node)
    }

    /// Append the audit row of a provision transition just written: `from -> to (how;
    /// cause: …)`, the cause being the verb and caller that started the operation, and the
    /// error when the node failed. A failed insert is a warning, never a failed transition.
    pub(super) async fn record_transition(&self, node: &Node, from: ProvisionState, how: &str) {
        let to = node.provision_state;
        let origin = node
            .driver_internal_info
            .get(CAUSE_KEY)
            .and_then(Value::as_str);
        let error = node.last_error.as_deref().filter(|_| to.is_failed());
        let cause = match (error, origin) {
            (Some(e), Some(o)) => format!("{e}; during {o}"),
            (Some(e), None) => e.to_string(),
            (None, Some(o)) => o.to_string(),
            (None, None) => "conductor".to_string(),
        };
        let entry = AuditEntry {
            seq: 0,
            created_at: Utc::now(),
            actor: format!("conductor:{}", self.id()),
            source: None,
            method: None,
            path: None,
            node_uuid: Some(node.uuid.clone()),
            action: "transition".into(),
            status: None,
            detail: Some(truncate_chars(
                &format!("{from} -> {to} ({how}; cause: {cause})"),
                1000,
            )),
        };
        if let Err(e) = self.store.append_audit(&entry).await {
            tracing::warn!(node = %node.uuid, error = %e, "could not record a provision transition in the audit log");
        }
    }

    /// Whether a node may be deleted now.
    pub fn check_deletable(&self, node: &Node) -> Result<(), ConductorError> {
        use ProvisionState::*;
        if let Some(by) = &node.reservation {
            return Err(ConductorError::Locked {
                node: node.ident().to_string(),
                by: by.clone(),
                state: node.provision_state,
            });
        }
        if !node.maintenance && !matches!(node.provision_state, Manageable | Enroll | AdoptFailed) {
            return Err(ConductorError::BadRequest(format!(
                "node {} is in \"{}\"; it can be deleted only in enroll, manageable or adopt failed (or in maintenance) — run `manage` first",
                node.ident(),
                node.provision_state
            )));
        }
        Ok(())
    }
}
