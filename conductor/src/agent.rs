//! The controller's side of the agent protocol: lookup, token, heartbeat long poll, the
//! per-node command queue and result intake.

use super::{Conductor, ConductorError};
use base64::Engine;
use chrono::Utc;
use rivet_model::node::{Node, NodeSummary};
use rivet_protocol::agent::{
    AgentConfig, Command, CommandKind, CommandResult, CommandStatus, HeartbeatRequest,
    HeartbeatResponse, LookupRequest, LookupResponse,
};
use rivet_protocol::states::ProvisionState;
use rivet_store::{normalize_mac, StoreError};
use rivet_support::credentials::{constant_time_eq, hex};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;

/// Held polls that read their answer from the store at once. Polls held together end
/// together (a fleet that started polling in one moment times out in one moment, every
/// `long_poll_s`); beyond this many, the rest wait their turn as small parked futures instead
/// of each allocating its store reads at the same instant.
pub(super) const ANSWERING_AT_ONCE: usize = 256;

/// How often an agent's liveness is written when nothing else changed.
const LIVENESS_WRITE_EVERY: chrono::Duration = chrono::Duration::seconds(2);

/// States in which a ramdisk is expected and may look up (with fast track, also
/// [`crate::fast_track::FAST_TRACK_STATES`]).
pub const LOOKUP_ALLOWED: &[ProvisionState] = &[
    ProvisionState::Cleaning,
    ProvisionState::CleanWait,
    ProvisionState::CleanHold,
    ProvisionState::Inspecting,
    ProvisionState::InspectWait,
    ProvisionState::Deploying,
    ProvisionState::WaitCallBack,
    ProvisionState::Rescuing,
    ProvisionState::RescueWait,
    ProvisionState::Servicing,
    ProvisionState::ServiceWait,
    ProvisionState::ServiceHold,
];

/// Whether a ramdisk may look up `node` now: the states that expect one
/// ([`LOOKUP_ALLOWED`]), and with fast track also
/// [`crate::fast_track::FAST_TRACK_STATES`] (Ironic's two lookup sets).
pub fn lookup_allowed(node: &Node, deploy: &rivet_model::config::DeployConfig) -> bool {
    LOOKUP_ALLOWED.contains(&node.provision_state)
        || (crate::fast_track::FAST_TRACK_STATES.contains(&node.provision_state)
            && crate::fast_track::enabled_or_off(node, deploy))
}

/// Why an agent request was refused.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Unknown hardware or a node that expects no ramdisk (one message for both, on purpose).
    #[error("no node is waiting for a ramdisk with these identifiers")]
    NotFound,
    /// Missing or wrong token.
    #[error("agent token missing or invalid for this node; look up again after a fresh boot")]
    Unauthorized,
    /// The right token, sent by another boot than the one it was issued to.
    #[error("agent token belongs to another boot of this ramdisk; the agent must look up again")]
    OtherBoot,
    /// Malformed request.
    #[error("{0}")]
    BadRequest(String),
    /// Conductor/store failure.
    #[error(transparent)]
    Conductor(#[from] ConductorError),
}

impl From<StoreError> for AgentError {
    fn from(e: StoreError) -> Self {
        AgentError::Conductor(e.into())
    }
}

/// Forget a node's agent token and the boot it belongs to: whatever ends or starts a boot
/// (the conductor's reboots and power actions, the end of an operation) calls this, since a
/// new boot must earn a new token at lookup.
pub(crate) fn forget_agent_token(node: &mut Node) {
    node.runs.agent = None;
}

/// A boot id as the kernel writes it: hex digits and dashes, not too long.
fn check_boot_id(boot_id: Option<&str>) -> Result<(), AgentError> {
    match boot_id {
        Some(b)
            if b.is_empty()
                || b.len() > rivet_protocol::agent::MAX_BOOT_ID_LEN
                || !b.chars().all(|c| c.is_ascii_hexdigit() || c == '-') =>
        {
            Err(AgentError::BadRequest(format!(
                "boot_id must be the kernel's boot id (/proc/sys/kernel/random/boot_id): hex digits and dashes, 1 to {} characters",
                rivet_protocol::agent::MAX_BOOT_ID_LEN
            )))
        }
        _ => Ok(()),
    }
}

fn token_hash(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

fn new_token() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut bytes);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// What a heartbeat asked for, as far as choosing its command goes: kept instead of the
/// whole request while a poll is held.
struct Asked {
    /// The command the agent runs now.
    running: Option<String>,
    /// The commands whose results this heartbeat carried.
    reported: Vec<String>,
    /// Whether the agent waits for a command (`wait: true`).
    wait: bool,
}

impl Asked {
    fn of(req: &HeartbeatRequest) -> Asked {
        Asked {
            running: req.running.as_ref().map(|r| r.id.clone()),
            reported: req.results.iter().map(|r| r.id.clone()).collect(),
            wait: req.wait,
        }
    }
}

/// What a heartbeat gets.
pub enum Heartbeat {
    /// The answer, now.
    Now(HeartbeatResponse),
    /// Nothing to send yet and the agent waits: [`HeldPoll::answer`] waits for a command.
    Held(HeldPoll),
}

/// A long poll between its checks and its answer.
///
/// Why a value rather than the rest of the request's future: 10,000 agents hold a poll each,
/// all the time. Everything the request needed until here (its head, its body, the extractors,
/// the middleware's state and spans, the store calls' futures) is gone; what waits is this —
/// the node, the token to check again, what to choose a command by, and the armed wake-up —
/// a few hundred bytes. The HTTP layer waits for [`HeldPoll::answer`] outside the request
/// (`api/deferred.rs`).
pub struct HeldPoll {
    conductor: Arc<Conductor>,
    uuid: String,
    token: Option<String>,
    asked: Asked,
    acks: Vec<String>,
    notified: OwnedNotified,
}

impl HeldPoll {
    /// Wait up to `long_poll_s` for a command (or shutdown), then answer: the command if one
    /// came, or none; 401 if the operation ended meanwhile and took the token with it.
    pub async fn answer(self) -> Result<HeartbeatResponse, AgentError> {
        let HeldPoll {
            conductor,
            uuid,
            token,
            asked,
            acks,
            notified,
        } = self;
        let long_poll = held_for(conductor.config.agent.long_poll_s, rand::random::<f64>());
        {
            let _held = crate::metrics::long_poll_held();
            // Shutdown answers held polls at once; the agent comes back to whoever serves next.
            tokio::select! {
                _ = tokio::time::timeout(long_poll, notified) => {}
                _ = conductor.shutdown.cancelled() => {}
            }
        }
        // The semaphore is never closed; if it were, answering without a turn is still right.
        let _turn = conductor.answering.acquire().await.ok();
        // Boxed: the store calls' futures are allocated only now, not for the whole wait.
        Box::pin(conductor.after_hold(&uuid, token.as_deref(), &asked, acks)).await
    }
}

/// How long a poll is held: between 80 % and 100 % of `long_poll_s`, by `draw` in [0, 1).
/// Why not exactly `long_poll_s`: agents that began polling in one moment (a restart, a
/// network blip, a bench) would otherwise all come back in one moment, every `long_poll_s`,
/// for as long as they run; spread over a fifth of the period, they stop arriving together
/// within a few rounds.
fn held_for(long_poll_s: u64, draw: f64) -> Duration {
    Duration::from_secs(long_poll_s).mul_f64(0.8 + 0.2 * draw.clamp(0.0, 1.0))
}

impl Conductor {
    /// The end of a held poll.
    async fn after_hold(
        &self,
        uuid: &str,
        token: Option<&str>,
        asked: &Asked,
        acks: Vec<String>,
    ) -> Result<HeartbeatResponse, AgentError> {
        // The operation may have ended while we waited (the token goes with it): tell the
        // agent now rather than at its next heartbeat.
        match self.store.node_summary(uuid).await {
            Ok(n) => Self::check_token(&n, token)?,
            Err(StoreError::NotFound { .. }) => return Err(AgentError::NotFound),
            Err(e) => return Err(e.into()),
        }
        let command = self.next_command(uuid, asked).await?;
        Ok(HeartbeatResponse { command, acks })
    }

    /// The wake-up handle of a node's long polls.
    pub fn wakeup(&self, uuid: &str) -> Arc<Notify> {
        let mut map = match self.wakeups.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        map.entry(uuid.to_string())
            .or_insert_with(|| Arc::new(Notify::new()))
            .clone()
    }

    /// Queue a command for a node's agent and wake its long poll. Returns the command id.
    pub async fn send_command(
        &self,
        uuid: &str,
        kind: CommandKind,
    ) -> Result<String, ConductorError> {
        let id = uuid::Uuid::new_v4().to_string();
        let command = Command {
            id: id.clone(),
            kind,
        };
        self.store.enqueue_command(uuid, &command).await?;
        tracing::info!(node = %uuid, command = command.kind.name(), id = %id, "command queued for agent");
        self.wake_agent(uuid);
        Ok(id)
    }

    async fn find_for_lookup(&self, req: &LookupRequest) -> Result<Option<Node>, StoreError> {
        if let Some(u) = &req.node_uuid {
            match self.store.get_node(u).await {
                Ok(n) => return Ok(Some(n)),
                Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        let macs: Vec<String> = req.macs.iter().filter_map(|m| normalize_mac(m)).collect();
        let found = match self.store.node_by_macs(&macs).await? {
            Some(u) => Some(u),
            None => {
                self.store
                    .node_by_system(req.system_uuid.as_deref(), req.system_serial.as_deref())
                    .await?
            }
        };
        match found {
            Some(u) => Ok(Some(self.store.get_node(&u).await?)),
            None => Ok(None),
        }
    }

    /// `POST /agent/v1/lookup`: find the node; hand out the token once per ramdisk boot.
    pub async fn lookup(
        self: &Arc<Self>,
        req: &LookupRequest,
    ) -> Result<LookupResponse, AgentError> {
        if req.macs.is_empty()
            && req.system_uuid.is_none()
            && req.system_serial.is_none()
            && req.node_uuid.is_none()
        {
            return Err(AgentError::BadRequest(
                "lookup needs at least one of macs, system_uuid, system_serial, node_uuid".into(),
            ));
        }
        check_boot_id(req.boot_id.as_deref())?;
        for _ in 0..5 {
            let Some(mut node) = self.find_for_lookup(req).await? else {
                return Err(AgentError::NotFound);
            };
            if !lookup_allowed(&node, &self.config.deploy) {
                tracing::info!(node = %node.uuid, state = %node.provision_state, "lookup refused: node expects no ramdisk");
                return Err(AgentError::NotFound);
            }
            // Once per boot, as Ironic does: a later lookup (even one claiming another boot
            // id) gets no token, or anyone who knows a MAC could take over the node's agent
            // session. The conductor forgets the token when it reboots or powers the node.
            let token = if node.runs.has_agent() {
                None
            } else {
                let t = new_token();
                // The token belongs to this boot; heartbeats must come from it.
                node.runs.agent = Some(rivet_model::runs::AgentSession {
                    token_hash: token_hash(&t),
                    boot_id: req.boot_id.clone(),
                });
                Some(t)
            };
            let uuid = node.uuid.clone();
            if token.is_some() {
                // A fresh ramdisk boot: what an earlier boot was asked to do is void. Cancel
                // it before the token is written: once it is, the conductor may queue this
                // boot's first commands, which must not be cancelled with the old ones.
                self.store.cancel_pending(&uuid).await?;
                // The lookup that gets the token is the agent's first sign of life on this
                // boot: the heartbeat timeout counts from here, not from an earlier boot's
                // last heartbeat. Written before the token: in between, the periodic scan
                // saw a token with the last boot's liveness and failed the node at once
                // (found by rivet-bench soak). A lookup that gets no token (an agent process
                // restarted without it, retrying for ever) is no sign of life: counting it
                // kept the node waiting for ever instead of failing on the timeout.
                let liveness = rivet_model::node::Liveness {
                    last_heartbeat: Some(Utc::now()),
                    agent_version: Some(req.agent_version.clone()),
                    progress: None,
                };
                // Directly, not batched: it must be in the store before the token, and no
                // older heartbeat still queued may land after it.
                self.liveness.write_now(&uuid, liveness).await?;
            }
            match self.update_node(&node).await {
                Ok(_) => {}
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
            if token.is_some() {
                // Start the conversation with the inventory.
                self.send_command(&uuid, CommandKind::GetInventory).await?;
                tracing::info!(node = %uuid, "agent looked up; token issued for this boot");
                self.kick(&uuid);
            } else {
                tracing::info!(node = %uuid, "agent looked up again; token already issued for this boot");
            }
            return Ok(LookupResponse {
                node_uuid: uuid,
                node_name: node.name.clone(),
                agent_token: token,
                config: AgentConfig {
                    long_poll_s: self.config.agent.long_poll_s,
                    heartbeat_timeout_s: self.config.agent.heartbeat_timeout_s,
                },
            });
        }
        Err(AgentError::Conductor(ConductorError::BadRequest(
            "node kept changing during lookup; retry".into(),
        )))
    }

    fn check_token(node: &NodeSummary, token: Option<&str>) -> Result<(), AgentError> {
        let stored = node
            .runs
            .agent
            .as_ref()
            .map(|a| a.token_hash.as_str())
            .ok_or(AgentError::Unauthorized)?;
        let token = token.ok_or(AgentError::Unauthorized)?;
        if constant_time_eq(token_hash(token).as_bytes(), stored.as_bytes()) {
            Ok(())
        } else {
            Err(AgentError::Unauthorized)
        }
    }

    /// After a good token: the heartbeat must come from the boot the token was issued to.
    /// A token issued to an agent that sent no boot id (older agents) is not tied to a boot.
    fn check_boot(node: &NodeSummary, boot_id: Option<&str>) -> Result<(), AgentError> {
        match node.runs.agent.as_ref().and_then(|a| a.boot_id.as_deref()) {
            Some(stored) if Some(stored) != boot_id => {
                tracing::debug!(node = %node.uuid, "heartbeat with this node's token from another boot refused");
                Err(AgentError::OtherBoot)
            }
            _ => Ok(()),
        }
    }

    /// Take in the results of a heartbeat; returns the ids to ack.
    async fn intake(
        &self,
        uuid: &str,
        results: &[CommandResult],
    ) -> Result<Vec<String>, AgentError> {
        let mut acks = Vec::new();
        for r in results {
            match self.store.record_result(uuid, r).await {
                Ok(true) => {
                    tracing::info!(node = %uuid, command = %r.name, id = %r.id, status = ?r.status, "agent result received");
                    if r.name == "get_inventory" && r.status == CommandStatus::Succeeded {
                        if let Some(inv) = r.result.get("inventory") {
                            self.store.save_inventory(uuid, inv).await?;
                        }
                    }
                }
                Ok(false) => {
                    tracing::debug!(node = %uuid, id = %r.id, "duplicate result ignored");
                }
                Err(StoreError::NotFound { .. }) => {
                    tracing::warn!(node = %uuid, id = %r.id, "result for a command this controller never queued; dropped");
                }
                Err(e) => return Err(e.into()),
            }
            acks.push(r.id.clone());
        }
        Ok(acks)
    }

    /// The command to hand the agent now, if any.
    async fn next_command(&self, uuid: &str, asked: &Asked) -> Result<Option<Command>, AgentError> {
        let pending = self.store.pending_commands(uuid).await?;
        Ok(Self::choose_command(pending, asked))
    }

    /// Of a node's `pending` commands, the one to hand the agent now, if any.
    fn choose_command(pending: Vec<Command>, asked: &Asked) -> Option<Command> {
        // Aborts may overtake a running step; anything else waits for the agent to be idle.
        if let Some(running) = &asked.running {
            return pending
                .into_iter()
                .find(|c| matches!(c.kind, CommandKind::Abort { .. }) && &c.id != running);
        }
        pending
            .into_iter()
            .find(|c| !asked.reported.contains(&c.id))
    }

    /// `POST /agent/v1/heartbeat/{node}`: record, ack, and hand out at most one command, or
    /// — when there is nothing to send and the agent waits — a [`HeldPoll`] that answers
    /// within `long_poll_s`.
    pub async fn heartbeat(
        self: &Arc<Self>,
        ident: &str,
        token: Option<&str>,
        req: HeartbeatRequest,
    ) -> Result<Heartbeat, AgentError> {
        // The narrow read: a heartbeat needs the agent session and the liveness, not the
        // node's documents, and the node's queued commands come in the same statement.
        let (node, pending) = match self.store.node_summary_and_pending(ident).await {
            Ok(n) => n,
            Err(StoreError::NotFound { .. }) => return Err(AgentError::NotFound),
            Err(e) => return Err(e.into()),
        };
        Self::check_token(&node, token)?;
        Self::check_boot(&node, req.boot_id.as_deref())?;
        crate::metrics::agent_heartbeat();
        let uuid = node.uuid.clone();
        let acks = self.intake(&uuid, &req.results).await?;
        if !acks.is_empty() {
            // Results may move the node's operation on: start deciding now, while this
            // request records liveness, so the next command is ready sooner.
            self.on_results(&uuid);
        }

        // Record liveness (which also keeps a wait state's timeout away) outside the node's
        // version: heartbeats neither invalidate ETags nor race API writes. A node
        // heartbeating several times a second (step after step) is written at most every
        // LIVENESS_WRITE_EVERY unless its progress changed.
        let progress = req.running.as_ref().and_then(|r| {
            r.progress.as_ref().map(|p| {
                serde_json::json!({
                    "command_id": r.id,
                    "step": r.step,
                    "progress": p,
                })
            })
        });
        let recent = node
            .liveness
            .last_heartbeat
            .map(|t| Utc::now().signed_duration_since(t) < LIVENESS_WRITE_EVERY)
            .unwrap_or(false);
        let progress_changed = progress.is_some() && progress != node.liveness.progress;
        let version_changed = node.liveness.agent_version.as_deref() != Some(&req.agent_version);
        if progress_changed {
            if let Some(p) = &progress {
                // Live views show it now; the store has it within liveness::FLUSH_EVERY.
                self.events.publish_progress(&uuid, p);
            }
        }
        if !recent || progress_changed || version_changed {
            let liveness = rivet_model::node::Liveness {
                last_heartbeat: Some(Utc::now()),
                agent_version: Some(req.agent_version.clone()),
                progress: progress.or_else(|| node.liveness.progress.clone()),
            };
            // Batched with other nodes' heartbeats, written within liveness::FLUSH_EVERY.
            self.liveness.record(&uuid, liveness);
        }

        drop(node);
        let asked = Asked::of(&req);
        drop(req);
        // Armed before the commands are read: a command queued from here on wakes the poll
        // (wake-ups are `notify_waiters`, which a `Notified` receives from its creation on).
        let notified = self.wakeup(&uuid).notified_owned();
        // The commands read with the node serve unless results just came in: those may
        // have had the conductor queue more, so read again as before.
        let from_snapshot = acks.is_empty();
        let command = if from_snapshot {
            Self::choose_command(pending, &asked)
        } else {
            self.next_command(&uuid, &asked).await?
        };
        if command.is_some() || !asked.wait {
            return Ok(Heartbeat::Now(HeartbeatResponse { command, acks }));
        }
        // About to hold the poll: a command queued after the snapshot but before the
        // wake-up above was armed would not wake it, so look once more now that it is.
        if from_snapshot {
            if let Some(cmd) = self.next_command(&uuid, &asked).await? {
                return Ok(Heartbeat::Now(HeartbeatResponse {
                    command: Some(cmd),
                    acks,
                }));
            }
        }
        Ok(Heartbeat::Held(HeldPoll {
            conductor: self.clone(),
            uuid,
            token: token.map(str::to_owned),
            asked,
            acks,
            notified,
        }))
    }

    /// New agent results may move the node's operation on.
    fn on_results(self: &Arc<Self>, uuid: &str) {
        self.kick(uuid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poll_is_held_between_four_fifths_and_all_of_long_poll_s() {
        assert_eq!(held_for(30, 0.0), Duration::from_secs(24));
        assert_eq!(held_for(30, 0.5), Duration::from_secs(27));
        assert!(held_for(30, 0.999_999) <= Duration::from_secs(30));
        assert!(held_for(30, 0.999_999) > Duration::from_millis(29_999));
        // A draw outside [0, 1) cannot hold a poll longer than asked or shorter than 80 %.
        assert_eq!(held_for(30, 7.0), Duration::from_secs(30));
        assert_eq!(held_for(30, -1.0), Duration::from_secs(24));
        assert_eq!(held_for(0, 0.5), Duration::ZERO);
    }
}
