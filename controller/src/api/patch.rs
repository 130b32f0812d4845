//! JSON patch for the admin API: the pure applier lives in `rivet_protocol::patch`; here its
//! errors become HTTP answers and the patched document is held to the admin body limits, so
//! patches applied one after another cannot nest a node deeper than one body may.

use super::ApiError;
use axum::http::StatusCode;
use rivet_protocol::api::PatchOp;
use rivet_protocol::limits::{check_value, Limits};
use rivet_protocol::patch::PatchError;
use serde_json::Value;

/// Apply `ops` to `doc`, allowing only top-level keys in `patchable`; 400 (409 for a failed
/// `test`) naming the path otherwise.
pub fn apply(doc: &mut Value, ops: &[PatchOp], patchable: &[&str]) -> Result<(), ApiError> {
    rivet_protocol::patch::apply(doc, ops, patchable).map_err(|e| match e {
        PatchError::Invalid(m) => ApiError::bad_request(m),
        PatchError::TestFailed(m) => ApiError::new(StatusCode::CONFLICT, m),
    })?;
    check_value(doc, &Limits::ADMIN)
        .map_err(|e| ApiError::bad_request(format!("after the patch, {e}")))
}

/// The top-level field a patch path names.
pub fn patched_fields(ops: &[PatchOp]) -> Vec<String> {
    ops.iter()
        .filter_map(|o| o.path.trim_start_matches('/').split('/').next())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nested(depth: usize) -> Value {
        let mut v = json!(1);
        for _ in 0..depth {
            v = json!({ "a": v });
        }
        v
    }

    // Regression: each patch body was within limits, but adding nested values under nested
    // values grew `extra` past serde_json's recursion limit (128), and the stored node could
    // no longer be read back.
    #[test]
    fn patches_cannot_nest_past_the_limit() {
        let mut doc = json!({"extra": nested(20)});
        let path = format!("/extra{}", "/a".repeat(20));
        let op = PatchOp {
            op: "add".into(),
            path,
            value: Some(nested(20)),
        };
        let e = apply(&mut doc, &[op], &["extra"]).expect_err("too deep");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(
            e.message.contains("nested deeper than 32 levels"),
            "{}",
            e.message
        );
        assert!(e.message.contains("extra.a.a"), "{}", e.message);
    }
}
