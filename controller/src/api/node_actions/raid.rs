//! RAID configuration (API 1.12): `PUT /v1/nodes/{node}/states/raid` sets the node's
//! `target_raid_config`, checked against Ironic's RAID schema
//! (`ironic/drivers/raid_config_schema.json`) and the extra rule of `ironic/common/raid.py`
//! (at most one root volume); `GET /v1/drivers/{driver}/raid/logical_disk_properties`
//! lists the properties a logical disk may have.
//!
//! The RAID interface decides, as in Ironic's conductor: `fake` (fake-hardware) and `agent`
//! validate and store the target; `no-raid` answers 404 "does not support raid" to a
//! configuration, but stores `{}` (Ironic validates only a non-empty target, so clearing it
//! works on every node). With the `agent` interface the ramdisk's `raid.create_configuration`
//! clean step builds the target and `raid_config` records what it built
//! (`rivet_conductor::raid_steps`); the `fake` interface builds nothing.

use super::json_body;
use crate::api::{ApiError, ApiResult, AppState};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use rivet_model::interfaces::Iface;
use rivet_model::raid::LOGICAL_DISK_PROPERTIES;
use serde_json::{Map, Value};

/// A target RAID configuration checked as Ironic's schema and `validate_configuration`
/// check it (`rivet_model::raid`, shared with the `raid.apply_configuration` deploy step).
/// `{}` (no configuration) is allowed.
pub(crate) fn check_raid_config(cfg: &Map<String, Value>) -> Result<(), ApiError> {
    rivet_model::raid::validate_target(cfg).map_err(ApiError::bad_request)
}

fn no_raid(driver: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("Driver {driver} does not support raid (disabled or not implemented)."),
    )
}

/// `PUT /v1/nodes/{node}/states/raid` with the target configuration as the body: 204.
pub(super) async fn raid_set(
    State(state): State<AppState>,
    Path(ident): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let node = state.conductor.store.get_node(&ident).await?;
    let cfg = match json_body(&body)? {
        Some(Value::Object(m)) => m,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "the target RAID configuration must be an object, not {other}"
            )))
        }
        None => {
            return Err(ApiError::bad_request(
                "Missing argument: \"target_raid_config\"",
            ))
        }
    };
    // Ironic's conductor asks the RAID interface to validate only a non-empty target, so
    // `{}` clears the target even through `no-raid`.
    if !cfg.is_empty() && node.interfaces.get(&node.driver, Iface::Raid) == "no-raid" {
        return Err(no_raid(&node.driver));
    }
    super::refuse_locked(&node, false)?;
    check_raid_config(&cfg)?;
    state
        .conductor
        .store
        .set_target_raid_config(&node.uuid, &cfg)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/drivers/{driver}/raid/logical_disk_properties`.
pub(super) async fn logical_disk_properties(Path(driver): Path<String>) -> ApiResult<Json<Value>> {
    let Some(hw) = rivet_model::interfaces::hardware_type(&driver) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("Could not find the following driver(s) or hardware type(s): {driver}."),
        ));
    };
    if hw.default_of(Iface::Raid) == "no-raid" {
        return Err(no_raid(&driver));
    }
    let m: Map<String, Value> = LOGICAL_DISK_PROPERTIES
        .iter()
        .map(|(k, v)| ((*k).to_string(), Value::from(*v)))
        .collect();
    Ok(Json(Value::Object(m)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every rule is tested in `rivet_model::raid`; here, that a violation is a 400 naming
    /// the field, and `{}` passes.
    #[test]
    fn raid_schema_is_a_400() {
        assert!(check_raid_config(&Map::new()).is_ok());
        let bad = json!({"logical_disks": [{"raid_level": "7", "size_gb": 1}]});
        let e = check_raid_config(bad.as_object().expect("object")).expect_err("bad level");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(
            e.message.starts_with("RAID config validation error")
                && e.message.contains("raid_level"),
            "{}",
            e.message
        );
    }
}
