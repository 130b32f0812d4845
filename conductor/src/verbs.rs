//! Admin requests: provision verbs, power, maintenance. Each validates first and writes
//! nothing when it refuses.

use super::metrics;
use super::steps::{self, PlannedStep, Source};
use super::text::truncate_chars;
use super::{Conductor, ConductorError};
use chrono::{DateTime, Utc};
use rivet_model::fsm::{self, Event};
use rivet_model::internal_info;
use rivet_model::node::Node;
use rivet_protocol::agent::CommandKind;
use rivet_protocol::api::ProvisionRequest;
use rivet_protocol::states::{PowerState, ProvisionState, Verb};
use rivet_protocol::steps::RequestedStep;
use rivet_store::{AuditEntry, StoreError};
use serde_json::Value;
use std::sync::Arc;

/// Check the image fields of `instance_info` a `direct` deploy needs, before anything
/// changes (Ironic refuses these with a 400 too): an http(s) `image_source` and a way to
/// verify it (`image_os_hash_algo` + `image_os_hash_value`, or `image_checksum`).
pub fn check_image_info(node: &Node) -> Result<(), String> {
    let info = &node.instance_info;
    let s = |k: &str| info.get(k).and_then(Value::as_str).map(str::trim);
    let Some(source) = s("image_source").filter(|v| !v.is_empty()) else {
        return Err(format!(
            "node {} has no instance_info.image_source; set it to the image's http(s) URL (`rivet node deploy {} --image URL`)",
            node.ident(),
            node.ident()
        ));
    };
    if !(source.starts_with("http://") || source.starts_with("https://")) {
        return Err(format!(
            "node {}: instance_info.image_source {source:?} must be an http:// or https:// URL (the agent downloads it)",
            node.ident()
        ));
    }
    if let Some(t) = s("image_type") {
        if t != "whole-disk" {
            return Err(format!(
                "node {}: instance_info.image_type {t:?} is not supported; Rivet deploys whole-disk images",
                node.ident()
            ));
        }
    }
    let hex_len = |algo: &str| match algo {
        "sha256" => Some(64),
        "sha512" => Some(128),
        _ => None,
    };
    match (s("image_os_hash_algo"), s("image_os_hash_value"), s("image_checksum")) {
        (Some(algo), Some(value), _) => {
            let Some(len) = hex_len(algo) else {
                return Err(format!(
                    "node {}: instance_info.image_os_hash_algo {algo:?} is not supported; use sha256 or sha512",
                    node.ident()
                ));
            };
            if value.len() != len || !value.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(format!(
                    "node {}: instance_info.image_os_hash_value must be {len} hex digits for {algo}",
                    node.ident()
                ));
            }
            Ok(())
        }
        (Some(_), None, _) | (None, Some(_), _) => Err(format!(
            "node {}: set both instance_info.image_os_hash_algo and image_os_hash_value",
            node.ident()
        )),
        (None, None, Some(c)) => {
            let url = c.starts_with("http://") || c.starts_with("https://");
            let hex = c.chars().all(|ch| ch.is_ascii_hexdigit());
            if url || (hex && matches!(c.len(), 64 | 128)) {
                Ok(())
            } else if hex && c.len() == 32 {
                Err(format!(
                    "node {}: instance_info.image_checksum looks like an MD5 digest, which is refused; use image_os_hash_algo sha256 or sha512",
                    node.ident()
                ))
            } else {
                Err(format!(
                    "node {}: instance_info.image_checksum must be a sha256/sha512 hex digest or the URL of a checksums file",
                    node.ident()
                ))
            }
        }
        (None, None, None) => Err(format!(
            "node {} has no image checksum; set instance_info.image_os_hash_algo and image_os_hash_value (or image_checksum)",
            node.ident()
        )),
    }
}

/// The configdrive of a deploy request as the agent takes it: a URL, or gzip+base64 ISO.
fn prepare_configdrive(cd: &Value, node: &Node) -> Result<String, String> {
    // The node's network_data (1.66) goes in when the request's configdrive has none.
    let cd = rivet_support::configdrive::with_node_network_data(cd, &node.attrs.network_data);
    rivet_support::configdrive::prepare(&cd, &node.uuid, node.name.as_deref())
        .map(rivet_support::configdrive::Prepared::into_string)
        .map_err(|e| e.to_string())
}

/// Microversion a verb needs (Ironic's `MIN_VERB_VERSIONS` and the state-bound ones: 406
/// below it), from the one table of microversions.
fn min_version(verb: Verb, state: ProvisionState) -> (u32, u32) {
    use rivet_model::microversions as mv;
    match verb {
        Verb::Abort if state == ProvisionState::InspectWait => mv::VERB_ABORT_INSPECT_WAIT,
        Verb::Abort if state == ProvisionState::WaitCallBack => mv::VERB_ABORT_WAIT_CALLBACK,
        Verb::Abort => mv::VERB_ABORT,
        Verb::Clean => mv::VERB_CLEAN,
        Verb::Unhold => mv::VERB_UNHOLD,
        Verb::Adopt => mv::VERB_ADOPT,
        Verb::Rescue | Verb::Unrescue => mv::VERB_RESCUE,
        Verb::Service => mv::VERB_SERVICE,
        Verb::Manage | Verb::Provide => mv::VERB_MANAGE_PROVIDE,
        Verb::Inspect => mv::VERB_INSPECT,
        Verb::Deploy | Verb::Undeploy => mv::VERB_DEPLOY_UNDEPLOY,
        _ => mv::BASE,
    }
}

/// Why `DELETE /v1/nodes/{id}/provision` did not abort.
#[derive(Debug, thiserror::Error)]
pub enum AbortRefusal {
    /// No provision task runs (404).
    #[error("node {node} is in \"{state}\": no provision task is running to abort")]
    NoTask {
        /// The node.
        node: String,
        /// Its state.
        state: ProvisionState,
    },
    /// The running step may not be interrupted (403).
    #[error("node {node} is running step {step:?} in \"{state}\", which is not abortable; wait for it to end, then abort")]
    NotAbortable {
        /// The node.
        node: String,
        /// The step.
        step: String,
        /// Its state.
        state: ProvisionState,
    },
    /// Anything else (state errors, store failures).
    #[error(transparent)]
    Other(#[from] ConductorError),
}

impl Conductor {
    /// Ironic's `_concurrent_action_limit('provisioning')`: refuse a new deploy while
    /// `[conductor] max_concurrent_deploy` nodes are in `deploying` or `wait call-back`
    /// across the fleet (one aggregate query). Not queued: the client retries.
    async fn concurrent_deploy_limit(&self) -> Result<(), ConductorError> {
        let counts = self.store.node_counts().await?;
        let deploying: i64 = counts
            .iter()
            .filter(|c| {
                c.provision_state == ProvisionState::Deploying.as_str()
                    || c.provision_state == ProvisionState::WaitCallBack.as_str()
            })
            .map(|c| c.count)
            .sum();
        if deploying >= i64::from(self.config.conductor.max_concurrent_deploy) {
            tracing::warn!(
                deploying,
                limit = self.config.conductor.max_concurrent_deploy,
                "deploy refused: [conductor] max_concurrent_deploy reached"
            );
            return Err(ConductorError::ConcurrentActionLimit {
                task_type: "provisioning",
            });
        }
        Ok(())
    }

    /// `PUT /v1/nodes/{id}/states/provision`: check, move the node, start the work. `by`
    /// names the caller for the audit trail (the cause of the transitions that follow).
    pub async fn provision(
        self: &Arc<Self>,
        ident: &str,
        req: &ProvisionRequest,
        version: (u32, u32),
        by: &str,
    ) -> Result<Node, ConductorError> {
        // The conductor may write the node between our read and our write (a heartbeat, a
        // step's bookkeeping): decide again from the fresh record rather than answer 409 for
        // a race the caller cannot see. Every check runs again each time.
        let mut attempts = 0;
        loop {
            match self.provision_once(ident, req, version, by).await {
                Err(ConductorError::Store(StoreError::Conflict { .. })) if attempts < 4 => {
                    attempts += 1;
                }
                r => return r,
            }
        }
    }

    async fn provision_once(
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
            return Err(ConductorError::NotAcceptable(format!(
                "\"{verb}\" in \"{state}\" needs API version {}.{} or later; send X-OpenStack-Ironic-API-Version: {}.{}",
                need.0, need.1, need.0, need.1
            )));
        }
        if req.clean_steps.is_some() && verb != Verb::Clean {
            return Err(ConductorError::BadRequest(format!(
                "clean_steps is only valid with target \"clean\", not \"{verb}\""
            )));
        }
        if req.service_steps.is_some() && verb != Verb::Service {
            return Err(ConductorError::BadRequest(format!(
                "service_steps is only valid with target \"service\", not \"{verb}\""
            )));
        }
        if verb == Verb::Service && req.service_steps.is_none() {
            return Err(ConductorError::BadRequest(
                "target \"service\" needs service_steps (a list of steps)".into(),
            ));
        }
        if req.disable_ramdisk.is_some() {
            // Ironic: manual cleaning from 1.70, servicing from 1.108.
            let need = match verb {
                Verb::Clean => (1, 70),
                Verb::Service => (1, 108),
                _ => {
                    return Err(ConductorError::BadRequest(format!(
                        "disable_ramdisk is only valid with target \"clean\" or \"service\", not \"{verb}\""
                    )))
                }
            };
            if version < need {
                return Err(ConductorError::BadRequest(format!(
                    "disable_ramdisk with target \"{verb}\" needs API version {}.{} or later",
                    need.0, need.1
                )));
            }
        }
        if verb == Verb::Clean && req.clean_steps.is_none() {
            return Err(ConductorError::BadRequest(
                "target \"clean\" needs clean_steps (a list, possibly empty)".into(),
            ));
        }
        match (&req.rescue_password, verb) {
            (Some(p), Verb::Rescue) if !p.is_empty() => {}
            (_, Verb::Rescue) => {
                return Err(ConductorError::BadRequest(
                    "target \"rescue\" needs a non-empty rescue_password".into(),
                ))
            }
            (Some(_), _) => {
                return Err(ConductorError::BadRequest(format!(
                    "rescue_password is only valid with target \"rescue\", not \"{verb}\""
                )))
            }
            (None, _) => {}
        }
        let deploys = matches!(verb, Verb::Active | Verb::Deploy | Verb::Rebuild);
        if req.configdrive.is_some() && !deploys {
            return Err(ConductorError::BadRequest(format!(
                "configdrive is only valid with target \"active\" or \"rebuild\", not \"{verb}\""
            )));
        }
        if let Some(steps) = &req.deploy_steps {
            if !deploys {
                return Err(ConductorError::BadRequest(format!(
                    "deploy_steps is only valid with target \"active\" or \"rebuild\", not \"{verb}\""
                )));
            }
            if version < (1, 69) {
                return Err(ConductorError::BadRequest(
                    "deploy_steps needs API version 1.69 or later".into(),
                ));
            }
            super::deploying::check_requested(steps)
                .map_err(|e| ConductorError::BadRequest(format!("node {}: {e}", node.ident())))?;
        }
        if matches!(req.configdrive, Some(Value::Object(_))) && version < (1, 56) {
            return Err(ConductorError::BadRequest(
                "a configdrive given as a JSON object needs API version 1.56 or later; send X-OpenStack-Ironic-API-Version: 1.56".into(),
            ));
        }
        if verb == Verb::Abort {
            if let Some(refusal) = super::step_record::abort_refusal(&node) {
                return Err(refusal);
            }
        }
        let to = fsm::next_for_verb(state, verb).ok_or_else(|| ConductorError::InvalidState {
            node: node.ident().to_string(),
            state,
            action: verb.to_string(),
            allowed: fsm::allowed_verbs(state),
        })?;
        if let Some(by) = &node.reservation {
            // Cleaning and deploy hold the node for the whole run; abort and unhold are how an
            // operator steers that run, and a deploy waiting on its ramdisk may be torn down.
            let steering = matches!(verb, Verb::Abort | Verb::Unhold)
                || (matches!(
                    state,
                    ProvisionState::WaitCallBack | ProvisionState::ServiceWait
                ) && matches!(verb, Verb::Deleted | Verb::Undeploy));
            if !steering {
                return Err(ConductorError::Locked {
                    node: node.ident().to_string(),
                    by: by.clone(),
                    state,
                });
            }
        }
        if node.attrs.protected && matches!(verb, Verb::Deleted | Verb::Undeploy | Verb::Rebuild) {
            return Err(protected(&node));
        }
        if node.attrs.retired && verb == Verb::Provide {
            return Err(ConductorError::BadRequest(format!(
                "The providing operation can't be performed on node {} because it is retired{}; unset retired first",
                node.uuid,
                node.attrs
                    .retired_reason
                    .as_deref()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            )));
        }
        if node.maintenance && matches!(verb, Verb::Active | Verb::Deploy | Verb::Rebuild) {
            return Err(ConductorError::BadRequest(format!(
                "node {} is in maintenance; \"{verb}\" is refused until `rivet node maintenance unset {}`",
                node.ident(),
                node.ident()
            )));
        }
        node.interfaces
            .check_verb(node.ident(), &node.driver, verb)
            .map_err(|e| ConductorError::BadRequest(e.to_string()))?;
        let direct = node.interfaces.uses_agent(&node.driver);
        if verb == Verb::Adopt && !direct {
            // The fake deploy interface checks nothing else, but an adopted node must still
            // say what runs on it.
            let has_source = node
                .instance_info
                .get("image_source")
                .and_then(Value::as_str)
                .is_some_and(|s| !s.trim().is_empty());
            if !has_source {
                return Err(ConductorError::BadRequest(format!(
                    "node {} has no instance_info.image_source; adoption needs the image the running instance came from",
                    node.ident()
                )));
            }
        }
        if (deploys || verb == Verb::Adopt) && direct {
            check_image_info(&node).map_err(ConductorError::BadRequest)?;
            self.image_download_source(&node)
                .map_err(ConductorError::BadRequest)?;
            if let Some(fmt) = node
                .instance_info
                .get("image_disk_format")
                .and_then(Value::as_str)
            {
                let permitted = &self.config.deploy.permitted_image_formats;
                if !permitted.iter().any(|p| p == fmt) {
                    return Err(ConductorError::BadRequest(format!(
                        "node {}: instance_info.image_disk_format {fmt:?} is not permitted here; permitted: {}",
                        node.ident(),
                        permitted.join(", ")
                    )));
                }
            }
        }
        if deploys {
            if let Some(cd) = &req.configdrive {
                let text = prepare_configdrive(cd, &node).map_err(|e| {
                    ConductorError::BadRequest(format!("node {}: {e}", node.ident()))
                })?;
                node.instance_info
                    .insert("configdrive".into(), Value::from(text));
            }
            if !direct && node.instance_info.contains_key("configdrive") {
                tracing::info!(node = %node.uuid, "fake deploy interface: the configdrive is kept but nothing writes it");
            }
        }
        if verb == Verb::Clean {
            self.check_manual_steps(&node, req.clean_steps.as_deref().unwrap_or_default())
                .await?;
            if req.disable_ramdisk == Some(true) {
                self.check_out_of_band_only(&node, req.clean_steps.as_deref().unwrap_or_default())
                    .await?;
            }
        }
        if verb == Verb::Service {
            let bmc = self.bmc(&node)?;
            let oob = bmc.steps(&node.uuid, &node.driver_info).await;
            super::servicing::check_request(
                req.service_steps.as_deref().unwrap_or_default(),
                &oob,
                req.disable_ramdisk == Some(true),
            )
            .map_err(|e| ConductorError::BadRequest(format!("node {}: {e}", node.ident())))?;
            super::servicing::start_run(
                &mut node,
                req.service_steps.clone().unwrap_or_default(),
                req.disable_ramdisk == Some(true),
            );
            node.reservation = Some(self.owner_of(&node.uuid));
        }
        if deploys {
            self.concurrent_deploy_limit().await?;
        }
        // Every transition of the operation this verb starts names it as its cause.
        internal_info::set_provision_cause(
            &mut node.driver_internal_info,
            format!("{verb} by {}", truncate_chars(by, 200)),
        );
        if verb == Verb::Abort
            && matches!(state, ProvisionState::CleanWait | ProvisionState::CleanHold)
        {
            return self.abort_cleaning(node).await;
        }
        if verb == Verb::Abort
            && matches!(
                state,
                ProvisionState::WaitCallBack | ProvisionState::DeployHold
            )
        {
            return self.abort_deploy(node).await;
        }
        if verb == Verb::Rescue {
            // Only the hash is kept; the plaintext ends with this request.
            let password = req.rescue_password.as_deref().unwrap_or_default();
            super::rescue::clear_run(&mut node);
            // From `service failed`: rescue boots its own ramdisk and unrescue the instance.
            node.runs.service = None;
            node.instance_info.insert(
                super::rescue::HASH_KEY.into(),
                Value::from(super::rescue::hash_password(password)),
            );
        }
        let rescue_aborted = verb == Verb::Abort && state == ProvisionState::RescueWait;
        if rescue_aborted {
            super::rescue::clear_run(&mut node);
            super::rescue::forget_password(&mut node);
            super::agent::forget_agent_token(&mut node);
        }
        let event = Event::from_verb(verb);
        let target = fsm::target_of(state, event, to);
        // `unhold` goes on with the same operation: a manual clean still ends manageable.
        if !(verb == Verb::Unhold && node.target_provision_state.is_some()) {
            node.target_provision_state = target;
        }
        node.provision_state = to;
        // When it entered the state it leaves (time per state, charts and metrics).
        // (A node never moved since enrolment entered `enroll` when it was created.)
        let since = node.provision_updated_at.or(Some(node.created_at));
        node.provision_updated_at = Some(Utc::now());
        if verb == Verb::Abort {
            node.last_error = Some(format!(
                "{} operation was aborted by an operator in \"{state}\"",
                match state {
                    ProvisionState::InspectWait => "inspection",
                    ProvisionState::WaitCallBack | ProvisionState::DeployHold => "deploy",
                    ProvisionState::RescueWait => "rescue",
                    ProvisionState::ServiceWait
                    | ProvisionState::ServiceHold
                    | ProvisionState::ServiceFailed => "service",
                    _ => "clean",
                }
            ));
            node.reservation = None;
        } else {
            node.last_error = None;
            node.fault = None;
        }
        if matches!(verb, Verb::Provide | Verb::Clean) {
            // A fresh run; a manual clean's starts with the steps asked for.
            super::cleaning::clear_run(&mut node);
            if verb == Verb::Clean {
                node.runs.clean = Some(rivet_model::runs::CleanRun {
                    requested: Some(req.clean_steps.clone().unwrap_or_default()),
                    ..Default::default()
                });
            }
            // Reserved for the whole run, by the controller that owns the node (which may
            // not be the one that received this request).
            node.reservation = Some(self.owner_of(&node.uuid));
        }
        if verb == Verb::Inspect {
            super::inspection::clear_run(&mut node);
            node.inspection_started_at = None;
            node.inspection_finished_at = None;
            // A fast-track ramdisk may take the inspection (the conductor decides, and
            // forgets the token itself when it boots the ramdisk instead).
            if !super::fast_track::able(&node, &self.config.deploy) {
                super::agent::forget_agent_token(&mut node);
            }
        }
        if deploys {
            // A fresh run: the conductor plans it from the default steps and these.
            node.runs.deploy = None;
            node.runs.deploy_request = req.deploy_steps.clone();
            internal_info::forget_deployed_image(&mut node.driver_internal_info);
            node.deploy_step = None;
            node.reservation = Some(self.owner_of(&node.uuid));
        }
        if to.is_stable() || to.is_failed() {
            node.target_provision_state = None;
        }
        if to.is_stable() && !super::fast_track::keeps_agent(&node, to, &self.config.deploy) {
            super::agent::forget_agent_token(&mut node);
        }
        let node = self.update_node(&node).await?;
        self.record_transition(&node, state, since, &format!("verb: {verb}"))
            .await;
        tracing::info!(node = %node.uuid, from = %state, to = %to, verb = %verb, "provision verb accepted");
        if verb == Verb::Abort && state == ProvisionState::InspectWait {
            // Tell the ramdisk to stop: it still holds its token and picks this up.
            self.send_command(&node.uuid, CommandKind::PowerOff).await?;
        }
        if verb == Verb::Abort
            && matches!(
                state,
                ProvisionState::ServiceWait | ProvisionState::ServiceHold
            )
        {
            self.stop_service_step(&node).await;
        }
        if verb == Verb::Abort && state == ProvisionState::ServiceFailed {
            let this = self.clone();
            let left = node.clone();
            self.tasks
                .spawn(async move { this.leave_service_failed(&left).await });
        }
        if rescue_aborted {
            let _ = self.store.cancel_pending(&node.uuid).await;
            self.wake_agent(&node.uuid);
            let this = self.clone();
            let aborted = node.clone();
            self.tasks
                .spawn(async move { this.clean_up_after_rescue_abort(&aborted).await });
        }
        // `unhold` in deploy hold goes back to wait call-back, where the conductor goes on.
        if to.is_conductor_busy()
            || matches!(
                to,
                ProvisionState::CleanWait
                    | ProvisionState::WaitCallBack
                    | ProvisionState::ServiceWait
            )
        {
            self.kick(&node.uuid);
        }
        Ok(node)
    }

    /// `abort` in wait call-back. The running step, if the agent runs one that is not
    /// abortable, finishes first (the abort is recorded on `deploy_step`); otherwise the
    /// deploy fails now, and like every deploy failure the agent is told to stop and the
    /// node is powered off (`[deploy] power_off_after_deploy_failure`).
    async fn abort_deploy(self: &Arc<Self>, mut node: Node) -> Result<Node, ConductorError> {
        let state = node.provision_state;
        match Self::running_deploy_step(&node) {
            Some((step, false)) => {
                if let Some(obj) = node.deploy_step.as_mut().and_then(Value::as_object_mut) {
                    obj.insert("abort_after".into(), Value::Bool(true));
                }
                let node = self.update_node(&node).await?;
                tracing::warn!(node = %node.uuid, step = %step, "abort requested during a non-abortable deploy step; the deploy fails when it ends");
                Ok(node)
            }
            running => {
                let during = match running {
                    Some((step, _)) => format!("during step {step:?}"),
                    None => "while waiting for the ramdisk to call back".into(),
                };
                let msg =
                    format!("deploy operation was aborted by an operator in \"{state}\" {during}");
                node.last_error = Some(msg.clone());
                // Entering `deploy failed` tells the agent to stop and powers the node off
                // in a tracked task (after_deploy_failure): the answer does not wait for
                // the BMC.
                self.event(node, Event::Abort, Some(msg)).await
            }
        }
    }

    /// `DELETE /v1/nodes/{id}/provision`: abort the running provision task. `Ok(node)` when
    /// it was aborted (or marked to abort after a step that cannot be interrupted is not
    /// possible here: that is [`AbortRefusal::NotAbortable`]).
    pub async fn abort_task(self: &Arc<Self>, ident: &str, by: &str) -> Result<Node, AbortRefusal> {
        let node = self
            .store
            .get_node(ident)
            .await
            .map_err(|e| AbortRefusal::Other(e.into()))?;
        if let Some(refusal) = super::step_record::abort_refusal(&node) {
            return Err(AbortRefusal::Other(refusal));
        }
        let state = node.provision_state;
        let running_step = match state {
            ProvisionState::WaitCallBack | ProvisionState::DeployHold => {
                Self::running_deploy_step(&node)
            }
            ProvisionState::CleanWait | ProvisionState::CleanHold => {
                let step = node
                    .clean_step
                    .as_ref()
                    .and_then(|s| s.get("step"))
                    .and_then(Value::as_str);
                let abortable = node
                    .clean_step
                    .as_ref()
                    .and_then(|s| s.get("abortable"))
                    .and_then(Value::as_bool)
                    .unwrap_or(true);
                let running = node
                    .runs
                    .clean
                    .as_ref()
                    .is_some_and(|r| r.command.is_some());
                step.map(|s| (s.to_string(), abortable || !running))
            }
            ProvisionState::InspectWait | ProvisionState::RescueWait => None,
            s if s.is_conductor_busy() => {
                return Err(AbortRefusal::Other(ConductorError::Locked {
                    node: node.ident().to_string(),
                    by: node
                        .reservation
                        .clone()
                        .unwrap_or_else(|| self.id().to_string()),
                    state: s,
                }))
            }
            _ => {
                return Err(AbortRefusal::NoTask {
                    node: node.ident().to_string(),
                    state,
                })
            }
        };
        if let Some((step, false)) = running_step {
            return Err(AbortRefusal::NotAbortable {
                node: node.ident().to_string(),
                step,
                state,
            });
        }
        let req = ProvisionRequest {
            target: Verb::Abort,
            clean_steps: None,
            configdrive: None,
            deploy_steps: None,
            rescue_password: None,
            disable_ramdisk: None,
            service_steps: None,
            runbook: None,
        };
        self.provision(ident, &req, rivet_protocol::api::MAX_VERSION, by)
            .await
            .map_err(AbortRefusal::Other)
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
        // Without an agent (fake deploy interface) there are no in-band steps to wait for:
        // every requested step is checked now.
        let cached: Option<Vec<PlannedStep>> = if node.interfaces.uses_agent(&node.driver) {
            internal_info::cached_clean_steps(&node.driver_internal_info)
        } else {
            Some(Vec::new())
        };
        // The agent's RAID steps count only through the agent RAID interface (the cache
        // holds all the agent offered).
        let raid_iface = super::raid_steps::raid_interface(node);
        let agent: Vec<_> = cached
            .as_deref()
            .unwrap_or_default()
            .iter()
            .filter(|p| {
                p.source == Source::Agent && steps::takes_agent_step(&p.step.interface, &raid_iface)
            })
            .map(|p| p.step.clone())
            .collect();
        let available = steps::available(&agent, &driver);
        // Without a cache, the agent's steps are checked when it lists them: those of the
        // deploy interface, and the RAID ones when the agent RAID interface takes them.
        let agent_may_offer = |r: &RequestedStep| {
            r.interface == "deploy" || (r.interface == "raid" && raid_iface == "agent")
        };
        let checkable: Vec<RequestedStep> = requested
            .iter()
            .filter(|r| {
                cached.is_some()
                    || !agent_may_offer(r)
                    || steps::conductor_steps().iter().any(|c| c.step == r.step)
            })
            .cloned()
            .collect();
        let deploy_iface = node
            .interfaces
            .get(&node.driver, rivet_model::interfaces::Iface::Deploy);
        let gathered = node.interfaces.uses_agent(&node.driver).then_some(false);
        let no_raid = steps::NoRaidSteps::of(&raid_iface, &deploy_iface, gathered);
        steps::manual_plan(&checkable, &available, no_raid)
            .map(|_| ())
            .map_err(|e| ConductorError::BadRequest(format!("node {}: {e}", node.ident())))
    }

    /// `disable_ramdisk` with manual cleaning: every step must run without the ramdisk.
    async fn check_out_of_band_only(
        &self,
        node: &Node,
        requested: &[RequestedStep],
    ) -> Result<(), ConductorError> {
        let bmc = self.bmc(node)?;
        let oob = bmc.steps(&node.uuid, &node.driver_info).await;
        for r in requested {
            let known = steps::conductor_steps()
                .iter()
                .chain(oob.iter())
                .any(|s| s.step == r.step && s.interface == r.interface);
            if !known {
                return Err(ConductorError::BadRequest(format!(
                    "node {}: clean step {}.{} is not an out-of-band step, and disable_ramdisk is set: in-band steps need the ramdisk",
                    node.ident(),
                    r.interface,
                    r.step
                )));
            }
        }
        Ok(())
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
        let running = node.runs.clean.as_ref().and_then(|r| r.command.clone());
        if let (Some(step), Some(_), false) = (&step_name, &running, abortable) {
            if let Some(obj) = node.clean_step.as_mut().and_then(Value::as_object_mut) {
                obj.insert("abort_after".into(), Value::Bool(true));
            }
            let node = self.update_node(&node).await?;
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
        self.set_power_within(ident, target, None).await
    }

    /// [`Self::set_power`] with Ironic's power `timeout` (1.27): a BMC that has not reached
    /// the target within it fails the action (`last_error`).
    pub async fn set_power_within(
        self: &Arc<Self>,
        ident: &str,
        target: PowerState,
        timeout: Option<std::time::Duration>,
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
        if node.attrs.disable_power_off && matches!(target, PowerState::Off | PowerState::SoftOff) {
            return Err(ConductorError::BadRequest(format!(
                "node {} has disable_power_off set: it is never powered off; reboot it, or unset disable_power_off",
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
        let node = self.update_node(&node).await?;
        let this = self.clone();
        let uuid = node.uuid.clone();
        // Tracked: a shutdown waits for the power action to be recorded.
        self.tasks.spawn(async move {
            let result = async {
                let mut n = this.store.get_node(&uuid).await?;
                let was_on = n.power_state == Some(PowerState::On);
                let action = bmc.set_power(&n.uuid, &n.driver_info, target);
                let done = match timeout {
                    None => action.await,
                    Some(t) => tokio::time::timeout(t, action).await.unwrap_or_else(|_| {
                        Err(rivet_drivers::DriverError::Bmc(format!(
                            "the BMC did not reach \"{target}\" within the requested timeout of {} s",
                            t.as_secs()
                        )))
                    }),
                };
                let outcome = match done {
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
                this.update_node(&n).await?;
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
        let node = self.update_node(&node).await?;
        if !on && node.provision_state.is_conductor_busy() {
            self.kick(&node.uuid);
        }
        Ok(node)
    }

    /// Append the audit row of a provision transition just written: `from -> to (how[;
    /// target: T]; cause: …)`, the cause being the verb and caller that started the operation, and the
    /// error when the node failed. A failed insert is a warning, never a failed transition.
    pub(super) async fn record_transition(
        &self,
        node: &Node,
        from: ProvisionState,
        since: Option<DateTime<Utc>>,
        how: &str,
    ) {
        let to = node.provision_state;
        metrics::provision_transition(from.as_str(), to.as_str(), since, to.is_failed());
        if to == ProvisionState::Active && from != ProvisionState::Active {
            if let Some(started) = self.deploy_started_at(&node.uuid).await {
                metrics::deploy_finished(started);
            }
        }
        let origin = internal_info::provision_cause(&node.driver_internal_info);
        // A failure event records its error even when the node falls back to a stable state
        // (verifying -> enroll): node history shows it as an ERROR entry.
        let error = node
            .last_error
            .as_deref()
            .filter(|_| to.is_failed() || how == "event: fail");
        let cause = match (error, origin) {
            (Some(e), Some(o)) => format!("{e}; during {o}"),
            (Some(e), None) => e.to_string(),
            (None, Some(o)) => o.to_string(),
            (None, None) => "conductor".to_string(),
        };
        // The target as the transition left it (node history's target_provision_state).
        let target = node
            .target_provision_state
            .map(|t| format!("; target: {t}"))
            .unwrap_or_default();
        // A failure quotes the node's console when rivetd captured one (the error first,
        // inside the cause, so the history shows it as the event).
        let console = if error.is_some() {
            self.console_quote(&node.uuid).await
        } else {
            String::new()
        };
        let cause = if console.is_empty() {
            cause
        } else {
            match cause.rsplit_once("; during ") {
                Some((e, o)) => format!("{}{console}; during {o}", truncate_chars(e, 1000)),
                None => format!("{}{console}", truncate_chars(&cause, 1000)),
            }
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
                &format!("{from} -> {to} ({how}{target}; cause: {cause})"),
                if console.is_empty() {
                    1000
                } else {
                    1200 + console.chars().count()
                },
            )),
        };
        if let Err(e) = self.store.append_audit(&entry).await {
            tracing::warn!(node = %node.uuid, error = %e, "could not record a provision transition in the audit log");
        }
    }

    /// When the deploy that just made node `uuid` active started: the newest transition
    /// into `deploying` a verb made (`active`, `rebuild`), read back from the audit trail so
    /// a deploy accepted by another controller, or before a restart, still counts. None when
    /// it is not among the node's last rows (an adoption, a trail cut short).
    async fn deploy_started_at(&self, uuid: &str) -> Option<DateTime<Utc>> {
        let rows = self
            .store
            .list_audit(&rivet_store::AuditQuery {
                node_uuid: Some(uuid.to_string()),
                limit: 100,
                ..Default::default()
            })
            .await
            .ok()?;
        rows.iter()
            .filter(|r| r.action == "transition")
            .find(|r| {
                r.detail
                    .as_deref()
                    .is_some_and(|d| d.contains(" -> deploying (verb: "))
            })
            .map(|r| r.created_at)
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
        if node.attrs.protected {
            return Err(protected(node));
        }
        // Ironic's DELETE_ALLOWED_STATES, plus `available` unless the operator turned
        // `allow_deleting_available_nodes` off.
        let available_ok = self.config.conductor.allow_deleting_available_nodes;
        let allowed = matches!(node.provision_state, Manageable | Enroll | AdoptFailed)
            || (available_ok && node.provision_state == Available);
        if !node.maintenance && !allowed {
            let states = if available_ok {
                "enroll, manageable, adopt failed or available"
            } else {
                "enroll, manageable or adopt failed"
            };
            return Err(ConductorError::BadRequest(format!(
                "Can not delete node {} while it is in provision state \"{}\"; it can be deleted in {states}, or in maintenance — run `manage` (or set maintenance) first",
                node.ident(),
                node.provision_state
            )));
        }
        Ok(())
    }
}

fn protected(node: &Node) -> ConductorError {
    ConductorError::Protected {
        node: node.uuid.clone(),
        reason: node
            .attrs
            .protected_reason
            .clone()
            .unwrap_or_else(|| "none given".into()),
    }
}
