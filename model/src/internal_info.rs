//! The keys of a node's `driver_internal_info` that Rivet itself writes, each behind one
//! typed reader and one writer, so no module spells a key or re-implements a value's shape.
//! They stay in `driver_internal_info` (not in the run state) because they outlive one
//! operation and Ironic's clients read the same kind of facts there: the cause of the current
//! operation, what `write_image` reported, the merged clean steps of the last cleaning, and
//! whether discovery enrolled the node, and whether Rivet turned Secure Boot on.

use crate::steps::PlannedStep;
use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

const PROVISION_CAUSE: &str = "provision_cause";
const DEPLOYED_IMAGE: &str = "deployed_image";
const CLEAN_STEPS: &str = "cached_clean_steps";
const CLEAN_STEPS_AT: &str = "cached_clean_steps_at";
const AUTO_DISCOVERED: &str = "auto_discovered";
const DISCOVERED_AT: &str = "discovered_at";
const SECURE_BOOT_ENABLED: &str = "secure_boot_enabled_by_rivet";

/// The verb and caller that started the node's current operation (`provide by admin`): the
/// cause its transitions record in the audit trail.
pub fn provision_cause(dii: &Map<String, Value>) -> Option<&str> {
    dii.get(PROVISION_CAUSE).and_then(Value::as_str)
}

/// Set the cause of the operation a verb starts.
pub fn set_provision_cause(dii: &mut Map<String, Value>, cause: String) {
    dii.insert(PROVISION_CAUSE.into(), Value::from(cause));
}

/// Keep what the last `write_image` reported (device, format, digest…) while `active`.
pub fn set_deployed_image(dii: &mut Map<String, Value>, result: Value) {
    dii.insert(DEPLOYED_IMAGE.into(), result);
}

/// Forget the deployed image (a new deploy, an undeploy).
pub fn forget_deployed_image(dii: &mut Map<String, Value>) {
    dii.remove(DEPLOYED_IMAGE);
}

/// The merged clean steps of the last cleaning (or of a ramdisk-free manual clean), if any
/// were recorded and still decode.
pub fn cached_clean_steps(dii: &Map<String, Value>) -> Option<Vec<PlannedStep>> {
    dii.get(CLEAN_STEPS)
        .and_then(|v| serde_json::from_value(v.clone()).ok())
}

/// The cache as `GET /v1/nodes/{node}/clean_steps` shows it: the steps and when they were
/// gathered (null when unknown). `None` before the first cleaning.
pub fn cached_clean_steps_doc(dii: &Map<String, Value>) -> Option<(Value, Value)> {
    let steps = dii.get(CLEAN_STEPS)?.clone();
    Some((
        steps,
        dii.get(CLEAN_STEPS_AT).cloned().unwrap_or(Value::Null),
    ))
}

/// Replace the clean-step cache with `available`, gathered `at`: the one writer of it.
pub fn set_cached_clean_steps(
    dii: &mut Map<String, Value>,
    available: &[PlannedStep],
    at: DateTime<Utc>,
) {
    dii.insert(
        CLEAN_STEPS.into(),
        serde_json::to_value(available).unwrap_or(Value::Null),
    );
    dii.insert(CLEAN_STEPS_AT.into(), Value::from(at.to_rfc3339()));
}

/// Whether Rivet turned Secure Boot on for the deployed instance (so undeploy turns it off
/// again; a machine that already had it on is left as it was).
pub fn secure_boot_enabled_by_rivet(dii: &Map<String, Value>) -> bool {
    dii.get(SECURE_BOOT_ENABLED)
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// Record that Rivet turned Secure Boot on (`true`), or forget it once turned off (`false`).
pub fn set_secure_boot_enabled_by_rivet(dii: &mut Map<String, Value>, enabled: bool) {
    if enabled {
        dii.insert(SECURE_BOOT_ENABLED.into(), Value::Bool(true));
    } else {
        dii.remove(SECURE_BOOT_ENABLED);
    }
}

/// Mark a node enrolled by discovery (as Ironic marks its auto-discovered nodes).
pub fn mark_discovered(dii: &mut Map<String, Value>, at: DateTime<Utc>) {
    dii.insert(AUTO_DISCOVERED.into(), Value::Bool(true));
    dii.insert(DISCOVERED_AT.into(), Value::from(at.to_rfc3339()));
}

/// Whether discovery enrolled the node.
pub fn is_auto_discovered(dii: &Map<String, Value>) -> bool {
    dii.get(AUTO_DISCOVERED)
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steps::Source;
    use rivet_protocol::steps::StepDescriptor;

    #[test]
    fn each_key_reads_back_what_its_writer_wrote() {
        let mut dii = Map::new();
        assert_eq!(provision_cause(&dii), None);
        set_provision_cause(&mut dii, "provide by admin".into());
        assert_eq!(provision_cause(&dii), Some("provide by admin"));
        set_deployed_image(&mut dii, serde_json::json!({"device": "/dev/vda"}));
        assert!(dii.contains_key("deployed_image"));
        forget_deployed_image(&mut dii);
        assert!(!dii.contains_key("deployed_image"));
        assert!(cached_clean_steps(&dii).is_none() && cached_clean_steps_doc(&dii).is_none());
        let step = PlannedStep {
            step: StepDescriptor {
                interface: "deploy".into(),
                step: "erase_devices".into(),
                priority: 10,
                abortable: true,
                argsinfo: Default::default(),
                reboot_requested: false,
                requires_ramdisk: true,
            },
            args: Map::new(),
            source: Source::Agent,
        };
        let at = Utc::now();
        set_cached_clean_steps(&mut dii, std::slice::from_ref(&step), at);
        assert_eq!(cached_clean_steps(&dii), Some(vec![step]));
        let (_, when) = cached_clean_steps_doc(&dii).unwrap_or_default();
        assert_eq!(when, Value::from(at.to_rfc3339()));
        assert!(!is_auto_discovered(&dii));
        mark_discovered(&mut dii, at);
        assert!(is_auto_discovered(&dii));
        // The keys Ironic's clients see are the ones Rivet always wrote.
        let mut keys: Vec<_> = dii.keys().cloned().collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "auto_discovered",
                "cached_clean_steps",
                "cached_clean_steps_at",
                "discovered_at",
                "provision_cause"
            ]
        );
    }
}
