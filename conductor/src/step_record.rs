//! Node-history rows the conductor writes ([`Conductor::record_history`]: fast track,
//! health changes, erase reports, deploy-failure power), and what a merged cleaning run
//! leaves behind for operators: one node-history entry per clean
//! step that finished (so `GET /v1/nodes/{node}/history` shows the order the in-band and
//! out-of-band steps really ran in), and the refusal of an `abort` while a step that must not
//! be interrupted (a firmware flash) runs in the conductor.

use super::errors::ConductorError;
use super::steps::{PlannedStep, Source};
use super::Conductor;
use chrono::Utc;
use rivet_model::node::Node;
use rivet_protocol::states::ProvisionState;
use rivet_store::AuditEntry;
use serde_json::Value;

/// Audit action of a finished clean step (node history event type `cleaning`).
pub const CLEAN_STEP_ACTION: &str = "clean_step";

/// The history event text of a finished step: `clean step INTERFACE.STEP done (SOURCE,
/// priority N)`.
fn event_text(step: &PlannedStep) -> String {
    let source = match step.source {
        Source::Agent => "in-band",
        Source::Driver => "out-of-band",
        Source::Conductor => "conductor",
    };
    format!(
        "clean step {}.{} done ({source}, priority {})",
        step.step.interface, step.step.step, step.step.priority
    )
}

/// A stored step row (`EVENT; state: STATE`) as (event, state).
pub fn parse_detail(detail: &str) -> Option<(&str, &str)> {
    detail.rsplit_once("; state: ")
}

impl Conductor {
    /// One conductor row in `node`'s history: `action`, and `EVENT; state: STATE` as its
    /// detail (the history reads the state after `; state: `). Best effort: a failed write
    /// is logged as `what`, and never fails the operation it records.
    pub(super) async fn record_history(&self, node: &Node, action: &str, event: &str, what: &str) {
        let entry = AuditEntry {
            seq: 0,
            created_at: Utc::now(),
            actor: format!("conductor:{}", self.id()),
            source: None,
            method: None,
            path: None,
            node_uuid: Some(node.uuid.clone()),
            action: action.into(),
            status: None,
            detail: Some(super::text::truncate_chars(
                &format!("{event}; state: {}", node.provision_state),
                1000,
            )),
        };
        if let Err(e) = self.store.append_audit(&entry).await {
            tracing::warn!(node = %node.uuid, error = %e, "could not record {what} in the node history");
        }
    }

    /// Record that `step` of `node`'s cleaning finished.
    pub(super) async fn record_clean_step(&self, node: &Node, step: &PlannedStep) {
        self.record_history(
            node,
            CLEAN_STEP_ACTION,
            &event_text(step),
            "a finished clean step",
        )
        .await;
    }
}

/// `abort` while the conductor itself runs a clean step that is not abortable (an
/// out-of-band firmware update or BIOS change, in `cleaning`): refused, and the step and
/// the rest of the cleaning go on. Ironic answers 409 here too (the conductor holds the
/// node's lock for a synchronous step); in `clean wait` a non-abortable in-band step is
/// instead marked `abort_after`, as Ironic does.
pub(crate) fn abort_refusal(node: &Node) -> Option<ConductorError> {
    if node.provision_state != ProvisionState::Cleaning {
        return None;
    }
    let step = node.clean_step.as_ref()?;
    let abortable = step
        .get("abortable")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    if abortable {
        return None;
    }
    let name = |k: &str| {
        step.get(k)
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string()
    };
    Some(ConductorError::NotAbortable {
        node: node.ident().to_string(),
        step: format!("{}.{}", name("interface"), name("step")),
        state: node.provision_state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rivet_protocol::steps::StepDescriptor;

    #[test]
    fn abort_is_refused_only_during_a_non_abortable_conductor_step() {
        let mut node = Node::new("u-1".into(), "redfish".into());
        node.name = Some("n1".into());
        node.provision_state = ProvisionState::Cleaning;
        assert!(abort_refusal(&node).is_none(), "no step running");
        node.clean_step = Some(serde_json::json!({
            "interface": "firmware", "step": "update", "abortable": false}));
        let e = abort_refusal(&node).expect("refused").to_string();
        assert!(
            e.contains("n1") && e.contains("firmware.update") && e.contains("cannot be aborted"),
            "{e}"
        );
        node.provision_state = ProvisionState::CleanWait;
        assert!(
            abort_refusal(&node).is_none(),
            "clean wait: abort_after instead"
        );
        node.provision_state = ProvisionState::Cleaning;
        node.clean_step = Some(serde_json::json!({
            "interface": "deploy", "step": "erase_devices", "abortable": true}));
        assert!(abort_refusal(&node).is_none());
    }

    #[test]
    fn event_text_round_trips_through_the_detail() {
        let step = PlannedStep {
            step: StepDescriptor {
                interface: "bios".into(),
                ..StepDescriptor::in_band("apply_configuration", 0)
            },
            args: Default::default(),
            source: Source::Driver,
        };
        let detail = format!("{}; state: cleaning", event_text(&step));
        assert_eq!(
            parse_detail(&detail),
            Some((
                "clean step bios.apply_configuration done (out-of-band, priority 0)",
                "cleaning"
            ))
        );
    }
}
