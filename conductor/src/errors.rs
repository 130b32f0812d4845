//! Conductor errors: each says what happened, to which node, and what to do.

use rivet_protocol::states::{ProvisionState, Verb};
use rivet_store::StoreError;

/// Why a request to the conductor was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ConductorError {
    /// The store failed or the record is missing/changed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The verb is not allowed in the node's state.
    #[error("node {node} is in \"{state}\"; \"{action}\" is not allowed there (allowed: {})", verbs(.allowed))]
    InvalidState {
        /// Node name or UUID.
        node: String,
        /// Its state.
        state: ProvisionState,
        /// What was asked.
        action: String,
        /// Verbs allowed in that state.
        allowed: Vec<Verb>,
    },
    /// Another operation holds the node.
    #[error("node {node} is locked by conductor {by} while it is in \"{state}\"; retry when the operation ends")]
    Locked {
        /// Node name or UUID.
        node: String,
        /// Holder.
        by: String,
        /// Its state.
        state: ProvisionState,
    },
    /// `abort` while the conductor runs a clean step that must not be interrupted (409).
    #[error("node {node} is running clean step {step} in \"{state}\", which cannot be aborted (a step that is not abortable, such as a firmware update, always runs to the end); the cleaning continues: wait for it to finish")]
    NotAbortable {
        /// Node name or UUID.
        node: String,
        /// `interface.step`.
        step: String,
        /// Its state.
        state: ProvisionState,
    },
    /// The request is malformed or not allowed as asked.
    #[error("{0}")]
    BadRequest(String),
    /// The request needs a newer microversion than it asked for (Ironic's NotAcceptable,
    /// 406).
    #[error("{0}")]
    NotAcceptable(String),
    /// The node is protected (Ironic's `NodeProtected`, 403).
    #[error("Node {node} is protected and cannot be undeployed, rebuilt or deleted; unset protected first (reason: {reason})")]
    Protected {
        /// Node UUID.
        node: String,
        /// Its protected_reason, or "none given".
        reason: String,
    },
    /// Ironic's `ConcurrentActionLimit` (503): `[conductor] max_concurrent_deploy` nodes
    /// are deploying already. The limit is not named (Ironic's reasoning: an attacker would
    /// tailor the attack to it).
    #[error("Unable to process request at this time. The concurrent action limit for {task_type} has been reached. Please contact your administrator and try again later.")]
    ConcurrentActionLimit {
        /// `provisioning`.
        task_type: &'static str,
    },
    /// The driver failed.
    #[error("node {node}: {message}")]
    Driver {
        /// Node name or UUID.
        node: String,
        /// Driver message.
        message: String,
    },
}

fn verbs(v: &[Verb]) -> String {
    if v.is_empty() {
        "none: wait for the current operation to finish".into()
    } else {
        v.iter().map(|v| v.as_str()).collect::<Vec<_>>().join(", ")
    }
}
