//! RFC 6902 JSON patch as Ironic applies it: `add`, `replace`, `remove` (and `test`) on a
//! document of the patchable fields; anything else is refused with the path named.
//!
//! Pure, so the controller and the fuzz targets apply patches the same way. The caller checks
//! the patched document against [`crate::limits::check_value`]: a patch may nest values.

use crate::api::PatchOp;
use serde_json::Value;
use std::fmt;

/// Why a patch was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatchError {
    /// The patch is malformed or does not fit the document (HTTP 400).
    Invalid(String),
    /// A `test` operation did not match (HTTP 409).
    TestFailed(String),
}

impl fmt::Display for PatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PatchError::Invalid(m) | PatchError::TestFailed(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for PatchError {}

fn invalid(m: String) -> PatchError {
    PatchError::Invalid(m)
}

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

fn split(path: &str) -> Result<Vec<String>, PatchError> {
    let rest = path
        .strip_prefix('/')
        .ok_or_else(|| invalid(format!("patch path {path:?} must start with '/'")))?;
    Ok(rest.split('/').map(unescape).collect())
}

/// The node fields `PATCH /v1/nodes/{id}` may change: the document the controller (and the
/// `node_patch` fuzz target) applies a node patch to holds exactly these keys.
pub const NODE_PATCHABLE: &[&str] = &[
    "name",
    "driver",
    "driver_info",
    "properties",
    "instance_info",
    "instance_uuid",
    "extra",
    "resource_class",
    "automated_clean",
    "owner",
    "lessee",
    "description",
    "conductor_group",
    "shard",
    "network_data",
    "instance_name",
    "parent_node",
    "disable_power_off",
    "retired",
    "retired_reason",
    "protected",
    "protected_reason",
    "inspect_interface",
    "boot_interface",
    "deploy_interface",
    "power_interface",
    "management_interface",
    "rescue_interface",
    "bios_interface",
    "console_interface",
    "firmware_interface",
    "network_interface",
    "raid_interface",
    "storage_interface",
    "vendor_interface",
    "chassis_uuid",
    "maintenance",
];

/// Apply `ops` to `doc`, allowing only top-level keys in `patchable`. On error `doc` may be
/// partly patched: callers apply to a copy and keep it only on success.
pub fn apply(doc: &mut Value, ops: &[PatchOp], patchable: &[&str]) -> Result<(), PatchError> {
    if ops.is_empty() {
        return Err(invalid("patch is empty: send a list of operations".into()));
    }
    for op in ops {
        let parts = split(&op.path)?;
        let top = parts.first().map(String::as_str).unwrap_or("");
        if !patchable.contains(&top) {
            return Err(invalid(format!(
                "cannot patch {}: it is read-only or unknown (patchable: {})",
                op.path,
                patchable.join(", ")
            )));
        }
        let (parent_path, last) = parts.split_at(parts.len() - 1);
        let last = &last[0];
        let mut parent = &mut *doc;
        for p in parent_path {
            parent = parent
                .get_mut(p.as_str())
                .ok_or_else(|| invalid(format!("patch path {} does not exist", op.path)))?;
        }
        let obj = parent
            .as_object_mut()
            .ok_or_else(|| invalid(format!("patch path {}: parent is not an object", op.path)))?;
        match op.op.as_str() {
            "add" | "replace" => {
                let value = op
                    .value
                    .clone()
                    .ok_or_else(|| invalid(format!("patch {} {} needs a value", op.op, op.path)))?;
                if op.op == "replace" && !obj.contains_key(last) {
                    return Err(invalid(format!(
                        "cannot replace {}: it does not exist (use add)",
                        op.path
                    )));
                }
                obj.insert(last.clone(), value);
            }
            "remove" => {
                if parent_path.is_empty() {
                    // Removing a top-level field resets it.
                    let reset = match obj.get(last) {
                        Some(Value::Object(_)) => Value::Object(Default::default()),
                        _ => Value::Null,
                    };
                    obj.insert(last.clone(), reset);
                } else if obj.remove(last).is_none() {
                    return Err(invalid(format!(
                        "cannot remove {}: it does not exist",
                        op.path
                    )));
                }
            }
            "test" => {
                if obj.get(last) != op.value.as_ref() {
                    return Err(PatchError::TestFailed(format!(
                        "patch test failed at {}",
                        op.path
                    )));
                }
            }
            other => {
                return Err(invalid(format!(
                    "patch op {other:?} is not supported (use add, replace, remove or test)"
                )))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn op(op: &str, path: &str, value: Option<Value>) -> PatchOp {
        PatchOp {
            op: op.into(),
            path: path.into(),
            value,
        }
    }

    #[test]
    fn add_replace_remove() {
        let mut doc = json!({"name": "a", "extra": {"x": 1}});
        apply(
            &mut doc,
            &[
                op("replace", "/name", Some(json!("b"))),
                op("add", "/extra/y", Some(json!(2))),
                op("remove", "/extra/x", None),
            ],
            &["name", "extra"],
        )
        .expect("patch");
        assert_eq!(doc, json!({"name": "b", "extra": {"y": 2}}));
    }

    #[test]
    fn refuses_read_only_and_missing() {
        let mut doc = json!({"name": "a", "extra": {}});
        let e = apply(
            &mut doc,
            &[op("replace", "/provision_state", Some(json!("x")))],
            &["name", "extra"],
        )
        .expect_err("read-only");
        assert!(e.to_string().contains("/provision_state"));
        assert!(apply(&mut doc, &[op("remove", "/extra/nope", None)], &["extra"]).is_err());
        assert!(apply(&mut doc, &[op("move", "/name", None)], &["name"]).is_err());
        assert!(apply(
            &mut doc,
            &[op("replace", "/extra/x", Some(json!(1)))],
            &["extra"]
        )
        .is_err());
        assert!(matches!(
            apply(
                &mut doc,
                &[op("test", "/name", Some(json!("b")))],
                &["name"]
            ),
            Err(PatchError::TestFailed(_))
        ));
    }
}
