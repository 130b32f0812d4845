//! RAID configuration (API 1.12): `PUT /v1/nodes/{node}/states/raid` sets the node's
//! `target_raid_config`, checked against Ironic's RAID schema
//! (`ironic/drivers/raid_config_schema.json`) and the extra rule of `ironic/common/raid.py`
//! (at most one root volume); `GET /v1/drivers/{driver}/raid/logical_disk_properties`
//! lists the properties a logical disk may have.
//!
//! The RAID interface decides, as in Ironic's conductor: `fake` (fake-hardware) and `agent`
//! validate and store the target; `no-raid` answers 404 "does not support raid" to a
//! configuration, but stores `{}` (Ironic validates only a non-empty target, so clearing it
//! works on every node). Rivet does not build RAID volumes yet: the `agent` interface keeps
//! the target for the in-band step a later ramdisk will offer, no step is advertised meanwhile
//! (see `rivet_model::steps::manual_plan`), and `raid_config` stays `{}`.

use super::{json_body, ver};
use crate::api::{ApiError, ApiResult, ApiVersion, AppState};
use crate::interfaces::Iface;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde_json::{Map, Value};

/// `MINOR_12_RAID_CONFIG`.
pub(crate) const RAID_VERSION: (u32, u32) = (1, 12);

/// Ironic's logical disk properties and their descriptions (the schema's text).
pub(crate) const LOGICAL_DISK_PROPERTIES: &[(&str, &str)] = &[
    ("raid_level", "RAID level for the logical disk. Valid values are 'JBOD', '0', '1', '2', '5', '6', '1+0', '5+0' and '6+0'. Required."),
    ("size_gb", "Size in GiB (Integer) for the logical disk. Use 'MAX' as size_gb if this logical disk is supposed to use the rest of the space available. Required."),
    ("volume_name", "Name of the volume to be created. If this is not specified, it will be auto-generated. Optional."),
    ("is_root_volume", "Specifies whether this disk is a root volume. By default, this is False. Optional."),
    ("share_physical_disks", "Specifies whether other logical disks can share physical disks with this logical disk. By default, this is False. Optional."),
    ("disk_type", "The type of disk preferred. Valid values are 'hdd' and 'ssd'. If this is not specified, disk type will not be a selection criterion for choosing backing physical disks. Optional."),
    ("interface_type", "The interface type of disk. Valid values are 'sata', 'scsi' and 'sas'. If this is not specified, interface type will not be a selection criterion for choosing backing physical disks. Optional."),
    ("number_of_physical_disks", "Number of physical disks to use for this logical disk. By default, the driver uses the minimum number of disks required for that RAID level. Optional."),
    ("controller", "Controller to use for this logical disk. If not specified, the driver will choose a suitable RAID controller on the bare metal node. Optional."),
    ("physical_disks", "The physical disks to use for this logical disk. If not specified, the driver will choose suitable physical disks to use. Optional."),
];

const RAID_LEVELS: &[&str] = &["JBOD", "0", "1", "2", "5", "6", "1+0", "5+0", "6+0"];

fn gate(version: (u32, u32)) -> Result<(), ApiError> {
    if version >= RAID_VERSION {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::NOT_ACCEPTABLE,
        format!(
            "RAID configuration needs API version {} or later; this request asked for {}",
            ver(RAID_VERSION),
            ver(version)
        ),
    ))
}

fn invalid(msg: String) -> ApiError {
    ApiError::bad_request(format!("RAID config validation error: {msg}"))
}

/// A target RAID configuration checked as Ironic's schema and `validate_configuration`
/// check it. `{}` (no configuration) is allowed.
pub(crate) fn check_raid_config(cfg: &Map<String, Value>) -> Result<(), ApiError> {
    if cfg.is_empty() {
        return Ok(());
    }
    if let Some(k) = cfg.keys().find(|k| *k != "logical_disks") {
        return Err(invalid(format!(
            "Additional properties are not allowed ('{k}' was unexpected)"
        )));
    }
    let Some(disks) = cfg.get("logical_disks").and_then(Value::as_array) else {
        return Err(invalid("'logical_disks' must be a list".into()));
    };
    if disks.is_empty() {
        return Err(invalid("[] is too short (logical_disks)".into()));
    }
    let mut roots = 0;
    for (i, d) in disks.iter().enumerate() {
        let Some(d) = d.as_object() else {
            return Err(invalid(format!("logical_disks[{i}] is not an object")));
        };
        if let Some(k) = d
            .keys()
            .find(|k| !LOGICAL_DISK_PROPERTIES.iter().any(|(p, _)| p == k))
        {
            return Err(invalid(format!(
                "Additional properties are not allowed ('{k}' was unexpected) in logical_disks[{i}]"
            )));
        }
        for r in ["raid_level", "size_gb"] {
            if !d.contains_key(r) {
                return Err(invalid(format!(
                    "'{r}' is a required property of logical_disks[{i}]"
                )));
            }
        }
        let bad = |k: &str, what: &str| {
            invalid(format!(
                "logical_disks[{i}].{k} is {}: it must be {what}",
                d.get(k).map(Value::to_string).unwrap_or_default()
            ))
        };
        if !d["raid_level"]
            .as_str()
            .is_some_and(|l| RAID_LEVELS.contains(&l))
        {
            return Err(bad(
                "raid_level",
                &format!("one of {}", RAID_LEVELS.join(", ")),
            ));
        }
        let size_ok = d["size_gb"].as_u64().is_some() || d["size_gb"] == "MAX";
        if !size_ok {
            return Err(bad("size_gb", "a non-negative integer or \"MAX\""));
        }
        for (k, ok, what) in [
            (
                "volume_name",
                d.get("volume_name").is_none_or(Value::is_string),
                "a string",
            ),
            (
                "controller",
                d.get("controller").is_none_or(Value::is_string),
                "a string",
            ),
            (
                "is_root_volume",
                d.get("is_root_volume").is_none_or(Value::is_boolean),
                "a boolean",
            ),
            (
                "share_physical_disks",
                d.get("share_physical_disks").is_none_or(Value::is_boolean),
                "a boolean",
            ),
            (
                "disk_type",
                d.get("disk_type").is_none_or(|v| v == "hdd" || v == "ssd"),
                "hdd or ssd",
            ),
            (
                "interface_type",
                d.get("interface_type")
                    .is_none_or(|v| v == "sata" || v == "scsi" || v == "sas"),
                "sata, scsi or sas",
            ),
            (
                "number_of_physical_disks",
                d.get("number_of_physical_disks")
                    .is_none_or(|v| v.as_u64().is_some_and(|n| n > 0)),
                "an integer above 0",
            ),
        ] {
            if !ok {
                return Err(bad(k, what));
            }
        }
        if let Some(pd) = d.get("physical_disks") {
            let ok = match pd.as_array() {
                Some(a) => {
                    a.iter().all(Value::is_string)
                        || (a.len() >= 2 && a.iter().all(Value::is_object))
                }
                None => false,
            };
            if !ok {
                return Err(bad(
                    "physical_disks",
                    "a list of names, or of at least 2 objects",
                ));
            }
            if !d.contains_key("controller") {
                return Err(invalid(format!(
                    "'controller' is a dependency of 'physical_disks' in logical_disks[{i}]"
                )));
            }
        }
        if d.get("is_root_volume") == Some(&Value::Bool(true)) {
            roots += 1;
        }
    }
    if roots > 1 {
        return Err(ApiError::bad_request(format!(
            "Raid config cannot have more than one root volume. {roots} root volumes were \
             specified (is_root_volume is true on more than one of logical_disks)"
        )));
    }
    Ok(())
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
    Extension(ApiVersion(version)): Extension<ApiVersion>,
    Path(ident): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let node = state.conductor.store.get_node(&ident).await?;
    gate(version)?;
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
pub(super) async fn logical_disk_properties(
    Extension(ApiVersion(version)): Extension<ApiVersion>,
    Path(driver): Path<String>,
) -> ApiResult<Json<Value>> {
    gate(version)?;
    let Some(hw) = crate::interfaces::hardware_type(&driver) else {
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

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn raid_schema() {
        assert!(check_raid_config(&Map::new()).is_ok());
        assert!(check_raid_config(&obj(json!({"logical_disks": [
            {"raid_level": "1", "size_gb": 100, "is_root_volume": true, "volume_name": "root",
             "share_physical_disks": false, "interface_type": "sas", "number_of_physical_disks": 2},
            {"raid_level": "5", "size_gb": "MAX", "disk_type": "ssd", "controller": "c0",
             "physical_disks": ["d1", "d2", "d3"]},
            {"raid_level": "1+0", "size_gb": 0, "controller": "software",
             "physical_disks": [{"size": ">= 100"}, {"name": "/dev/sdb"}]}
        ]})))
        .is_ok());
        // Each bad case, and a word its message must carry (the field it is about).
        for (bad, field) in [
            (json!({"logical_disks": []}), "logical_disks"),
            (json!({"logical_disks": {}}), "logical_disks"),
            (json!({"other": 1}), "other"),
            (json!({"logical_disks": [7]}), "logical_disks[0]"),
            (
                json!({"logical_disks": [{"raid_level": "7", "size_gb": 1}]}),
                "raid_level",
            ),
            (
                json!({"logical_disks": [{"raid_level": 1, "size_gb": 1}]}),
                "raid_level",
            ),
            (json!({"logical_disks": [{"raid_level": "1"}]}), "size_gb"),
            (json!({"logical_disks": [{"size_gb": 1}]}), "raid_level"),
            (
                json!({"logical_disks": [{"raid_level": "1", "size_gb": -1}]}),
                "size_gb",
            ),
            (
                json!({"logical_disks": [{"raid_level": "1", "size_gb": "max"}]}),
                "size_gb",
            ),
            (
                json!({"logical_disks": [{"raid_level": "1", "size_gb": 1.5}]}),
                "size_gb",
            ),
            (
                json!({"logical_disks": [{"raid_level": "1", "size_gb": 1, "foo": 1}]}),
                "foo",
            ),
            (
                json!({"logical_disks": [{"raid_level": "1", "size_gb": 1, "volume_name": 3}]}),
                "volume_name",
            ),
            (
                json!({"logical_disks": [{"raid_level": "1", "size_gb": 1, "is_root_volume": "yes"}]}),
                "is_root_volume",
            ),
            (
                json!({"logical_disks": [{"raid_level": "1", "size_gb": 1, "share_physical_disks": 1}]}),
                "share_physical_disks",
            ),
            (
                json!({"logical_disks": [{"raid_level": "1", "size_gb": 1, "disk_type": "nvme"}]}),
                "disk_type",
            ),
            (
                json!({"logical_disks": [{"raid_level": "1", "size_gb": 1, "interface_type": "nvme"}]}),
                "interface_type",
            ),
            (
                json!({"logical_disks": [{"raid_level": "1", "size_gb": 1, "number_of_physical_disks": 0}]}),
                "number_of_physical_disks",
            ),
            (
                json!({"logical_disks": [{"raid_level": "1", "size_gb": 1, "controller": 0}]}),
                "controller",
            ),
            (
                json!({"logical_disks": [{"raid_level": "1", "size_gb": 1, "physical_disks": ["a"]}]}),
                "controller",
            ),
            (
                json!({"logical_disks": [{"raid_level": "1", "size_gb": 1, "controller": "c",
                                       "physical_disks": [{"name": "a"}]}]}),
                "physical_disks",
            ),
            (
                json!({"logical_disks": [{"raid_level": "1", "size_gb": 1, "controller": "c",
                                       "physical_disks": "a"}]}),
                "physical_disks",
            ),
            (
                json!({"logical_disks": [
                    {"raid_level": "1", "size_gb": 1, "is_root_volume": true},
                    {"raid_level": "1", "size_gb": 1, "is_root_volume": true}
                ]}),
                "is_root_volume",
            ),
        ] {
            match check_raid_config(&obj(bad.clone())) {
                Ok(()) => panic!("accepted {bad}"),
                Err(e) => {
                    assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
                    assert!(e.message.contains(field), "{bad}: {}", e.message);
                }
            }
        }
    }
}
