//! What a successful erase step did, per device, kept in the node history: the agent's
//! `erase_devices*` result names the method each device got (`nvme format (user data
//! erase)`, `nvme sanitize (block erase)`, `ata security erase`, `blkzeroout`…), and an
//! operator has to be able to tell afterwards whether a disk was secure-erased or only
//! zeroed. Written as an audit row (`action = step_report`) that `api::history` shows as an
//! INFO entry of the activity (cleaning, servicing…). Only the device paths and method names
//! are kept, never the raw result.

use super::Conductor;
use rivet_model::node::Node;
use serde_json::Value;

/// The audit action of a step report; `api::history` shows these rows as entries.
pub const STEP_REPORT_ACTION: &str = "step_report";

/// Longest method name kept (agent output is bounded, but stay short in the history).
const MAX_FIELD: usize = 128;

fn short(s: &str) -> String {
    s.chars()
        .filter(|c| !c.is_control())
        .take(MAX_FIELD)
        .collect()
}

/// `DEVICE: METHOD` per erased device and `DEVICE: skipped (REASON)` per skipped one, `; `
/// separated; `None` when the result is not an erase report.
pub fn erase_summary(result: &Value) -> Option<String> {
    let devices = result.get("devices")?.as_array()?;
    let mut parts: Vec<String> = devices
        .iter()
        .filter_map(|d| {
            Some(format!(
                "{}: {}",
                short(d.get("device")?.as_str()?),
                short(d.get("method")?.as_str()?)
            ))
        })
        .collect();
    if let Some(skipped) = result.get("skipped").and_then(Value::as_array) {
        parts.extend(skipped.iter().filter_map(|d| {
            Some(format!(
                "{}: skipped ({})",
                short(d.get("device")?.as_str()?),
                short(d.get("reason")?.as_str()?)
            ))
        }));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// The history event of an erase report.
pub fn report_event(operation: &str, step: &str, summary: &str) -> String {
    format!("{operation} step {step} erased: {summary}")
}

impl Conductor {
    /// Record what an erase step did on each device (nothing for other steps). Failures are
    /// logged: a report never fails the step.
    pub(super) async fn record_step_report(
        &self,
        node: &Node,
        operation: &str,
        step: &str,
        result: &Value,
    ) {
        if !step.starts_with("erase_devices") {
            return;
        }
        let Some(summary) = erase_summary(result) else {
            return;
        };
        tracing::info!(node = %node.uuid, step, %summary, "erase step result");
        let event = report_event(operation, step, &summary);
        self.record_history(node, STEP_REPORT_ACTION, &event, "an erase report")
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn summary_of_an_erase_result() {
        let r = json!({"devices": [
            {"device": "/dev/nvme0n1", "size": 1, "method": "nvme format (user data erase)"},
            {"device": "/dev/sda", "method": "blkzeroout"},
            {"device": "/dev/sdb"}
        ], "skipped": [{"device": "/dev/sr0", "reason": "read-only device"}]});
        assert_eq!(
            erase_summary(&r).as_deref(),
            Some(
                "/dev/nvme0n1: nvme format (user data erase); /dev/sda: blkzeroout; \
                 /dev/sr0: skipped (read-only device)"
            )
        );
        assert_eq!(erase_summary(&json!({"devices": []})), None);
        assert_eq!(erase_summary(&json!("ok")), None);
        let long = "x".repeat(1000);
        let r = json!({"devices": [{"device": "/dev/a\n", "method": long}]});
        let s = erase_summary(&r).expect("summary");
        assert!(s.len() < 200 && !s.contains('\n'), "{s}");
    }
}
