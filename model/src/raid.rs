//! RAID as Ironic's `ironic/common/raid.py` and its agent RAID interface (`AgentRAID` in
//! `ironic/drivers/modules/agent.py`) define it, with no I/O: the target configuration's
//! schema (`ironic/drivers/raid_config_schema.json` and the one-root-volume rule), the
//! filtering `raid.create_configuration` applies before the agent builds anything, and what a
//! built configuration changes on the node (`update_raid_info`, `_delete_configuration_final`).
//!
//! The agent's side of the contract (docs/ironic-compatibility.md, "RAID steps"): the agent
//! offers `raid.create_configuration` and `raid.delete_configuration` (clean, priority 0) and
//! `raid.apply_configuration` (deploy, priority 0) only when it can build software RAID; the
//! conductor sends the configuration to build as the [`TARGET_ARG`] argument of the step, and
//! a step that built arrays answers `{"raid_config": {"logical_disks": [...]}}`.

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

/// The RAID clean step that builds the node's `target_raid_config`.
pub const CREATE_CONFIGURATION: &str = "create_configuration";
/// The RAID clean step that removes every array.
pub const DELETE_CONFIGURATION: &str = "delete_configuration";
/// The RAID deploy step that builds its `raid_config` argument.
pub const APPLY_CONFIGURATION: &str = "apply_configuration";
/// The argument of a building RAID step that carries the configuration the agent builds.
pub const TARGET_ARG: &str = "target_raid_config";
/// `raid.apply_configuration`'s argument: the configuration to apply.
pub const RAID_CONFIG_ARG: &str = "raid_config";

/// Ironic's logical disk properties and their descriptions (the schema's text).
pub const LOGICAL_DISK_PROPERTIES: &[(&str, &str)] = &[
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

fn invalid(msg: String) -> String {
    format!("RAID config validation error: {msg}")
}

/// A RAID configuration checked as Ironic's `validate_configuration` checks it: the whole
/// schema (so `{}` lacks `logical_disks`) and at most one root volume. The message names the
/// field (Ironic's prefix "RAID config validation error: …").
pub fn validate_configuration(cfg: &Value) -> Result<(), String> {
    let Some(cfg) = cfg.as_object() else {
        return Err(invalid(format!("{cfg} is not of type 'object'")));
    };
    if let Some(k) = cfg.keys().find(|k| *k != "logical_disks") {
        return Err(invalid(format!(
            "Additional properties are not allowed ('{k}' was unexpected)"
        )));
    }
    let Some(disks) = cfg.get("logical_disks") else {
        return Err(invalid("'logical_disks' is a required property".into()));
    };
    let Some(disks) = disks.as_array() else {
        return Err(invalid("'logical_disks' must be a list".into()));
    };
    if disks.is_empty() {
        return Err(invalid("[] is too short (logical_disks)".into()));
    }
    for (i, d) in disks.iter().enumerate() {
        let Some(d) = d.as_object() else {
            return Err(invalid(format!("logical_disks[{i}] is not an object")));
        };
        check_logical_disk(i, d)?;
    }
    root_volume(disks).map(|_| ())
}

/// A target configuration as `PUT …/states/raid` stores it: `{}` (no target) or a
/// configuration [`validate_configuration`] accepts (Ironic's conductor validates only a
/// non-empty target).
pub fn validate_target(cfg: &Map<String, Value>) -> Result<(), String> {
    if cfg.is_empty() {
        return Ok(());
    }
    validate_configuration(&Value::Object(cfg.clone()))
}

fn check_logical_disk(i: usize, d: &Map<String, Value>) -> Result<(), String> {
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
                a.iter().all(Value::is_string) || (a.len() >= 2 && a.iter().all(Value::is_object))
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
    Ok(())
}

fn is_root(d: &Value) -> bool {
    // Python truthiness of `x.get('is_root_volume')`, as Ironic tests it.
    match d.get("is_root_volume") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
    }
}

/// Ironic's `_check_and_return_root_volumes`: the root logical disk, if any; more than one is
/// an error.
fn root_volume(disks: &[Value]) -> Result<Option<&Value>, String> {
    let roots: Vec<&Value> = disks.iter().filter(|d| is_root(d)).collect();
    if roots.len() > 1 {
        return Err(format!(
            "Raid config cannot have more than one root volume. {} root volumes were \
             specified (is_root_volume is true on more than one of logical_disks)",
            roots.len()
        ));
    }
    Ok(roots.first().copied())
}

/// A boolean step argument: absent is `default` (Ironic's defaults are true); JSON booleans
/// and the strings Ironic's API takes for booleans (`"false"`, `"0"`…) are read, anything
/// else is an error naming it.
pub fn bool_arg(
    args: &Map<String, Value>,
    step: &str,
    name: &str,
    default: bool,
) -> Result<bool, String> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) => rivet_protocol::api::parse_bool_str(s).ok_or_else(|| {
            format!("argument {name} of raid.{step} is {s:?}: it must be true or false")
        }),
        Some(other) => Err(format!(
            "argument {name} of raid.{step} is {other}: it must be true or false"
        )),
    }
}

/// Ironic's `filter_target_raid_config`: the node's target without the root volume
/// (`create_root_volume` false) or without the other volumes (`create_nonroot_volumes`
/// false). No target, or nothing left, is Ironic's MissingParameterValue text.
pub fn filter_target_raid_config(
    node_uuid: &str,
    target: &Map<String, Value>,
    create_root_volume: bool,
    create_nonroot_volumes: bool,
) -> Result<Map<String, Value>, String> {
    if target.is_empty() {
        return Err(format!(
            "Node {node_uuid} has no target RAID configuration."
        ));
    }
    let mut filtered = target.clone();
    let mut disks: Vec<Value> = target
        .get("logical_disks")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut skipped = Vec::new();
    if !create_root_volume {
        disks.retain(|d| !is_root(d));
        skipped.push("skipping root volume");
    }
    if !create_nonroot_volumes {
        disks.retain(is_root);
        skipped.push("skipping non-root volumes");
    }
    if disks.is_empty() {
        return Err(format!(
            "Node {node_uuid} has empty target RAID configuration after {}.",
            skipped.join(" and ")
        ));
    }
    filtered.insert("logical_disks".into(), Value::Array(disks));
    Ok(filtered)
}

/// The arguments `raid.create_configuration` is sent with: the operator's (or none), plus
/// [`TARGET_ARG`], the node's target filtered by `create_root_volume` and
/// `create_nonroot_volumes` as Ironic's `AgentRAID.create_configuration` does.
pub fn create_configuration_args(
    node_uuid: &str,
    target: &Map<String, Value>,
    args: &Map<String, Value>,
) -> Result<Map<String, Value>, String> {
    let root = bool_arg(args, CREATE_CONFIGURATION, "create_root_volume", true)?;
    let nonroot = bool_arg(args, CREATE_CONFIGURATION, "create_nonroot_volumes", true)?;
    let filtered = filter_target_raid_config(node_uuid, target, root, nonroot)?;
    let mut out = args.clone();
    out.insert(TARGET_ARG.into(), Value::Object(filtered));
    Ok(out)
}

/// `raid.apply_configuration`'s `raid_config` argument, checked as Ironic's
/// `validate_raid_config` checks it: the configuration that becomes the node's target.
pub fn apply_configuration_target(args: &Map<String, Value>) -> Result<Map<String, Value>, String> {
    let Some(cfg) = args.get(RAID_CONFIG_ARG) else {
        return Err(format!(
            "deploy step raid.{APPLY_CONFIGURATION} is missing its required argument \
             {RAID_CONFIG_ARG} (The RAID configuration to apply.)"
        ));
    };
    validate_configuration(cfg)?;
    Ok(cfg.as_object().cloned().unwrap_or_default())
}

/// The configuration a building step reports (`{"raid_config": {"logical_disks": [...]}}`),
/// or Ironic's error for an agent that returned no proper result.
pub fn built_config(node_uuid: &str, result: &Value) -> Result<Map<String, Value>, String> {
    match result.get(RAID_CONFIG_ARG) {
        Some(Value::Object(cfg)) if cfg.get("logical_disks").is_some_and(Value::is_array) => {
            Ok(cfg.clone())
        }
        _ => Err(format!(
            "Agent ramdisk didn't return a proper command result while building RAID on \
             {node_uuid}. It returned '{result}' after command execution."
        )),
    }
}

/// Python's `str(datetime.utcnow())`, as Ironic writes `raid_config.last_updated`.
pub fn ironic_timestamp(at: DateTime<Utc>) -> String {
    if at.timestamp_subsec_micros() == 0 {
        at.format("%Y-%m-%d %H:%M:%S").to_string()
    } else {
        at.format("%Y-%m-%d %H:%M:%S%.6f").to_string()
    }
}

/// Ironic's `update_raid_info`: the node's new `raid_config` (the built configuration with
/// `last_updated`), and, when it has a root volume, `local_gb` from its size (unless `MAX`),
/// `root_device` from its `root_device_hint` and the `raid_level` capability in `properties`.
/// An error (two root volumes, a malformed capabilities string, a root volume without a
/// usable size or level) leaves `properties` unchanged.
pub fn update_raid_info(
    properties: &mut Map<String, Value>,
    raid_config: &Map<String, Value>,
    now: DateTime<Utc>,
) -> Result<Map<String, Value>, String> {
    let mut current = raid_config.clone();
    current.insert("last_updated".into(), Value::from(ironic_timestamp(now)));
    let disks: &[Value] = raid_config
        .get("logical_disks")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let Some(root) = root_volume(disks)? else {
        return Ok(current);
    };
    let mut props = properties.clone();
    let size = &root["size_gb"];
    if size != "MAX" {
        let gb = match size {
            Value::Number(n) => n
                .as_u64()
                .or_else(|| n.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64)),
            Value::String(s) => s.trim().parse::<u64>().ok(),
            _ => None,
        }
        .ok_or_else(|| {
            format!("the root volume's size_gb is {size}: it must be an integer or \"MAX\"")
        })?;
        props.insert("local_gb".into(), Value::from(gb));
    }
    if let Some(hint) = root.get("root_device_hint") {
        props.insert("root_device".into(), hint.clone());
    }
    let level = match &root["raid_level"] {
        Value::String(s) => s.clone(),
        Value::Null => return Err("the root volume has no raid_level".into()),
        other => other.to_string(),
    };
    let caps = updated_capabilities(props.get("capabilities"), "raid_level", &level)?;
    props.insert("capabilities".into(), caps);
    *properties = props;
    Ok(current)
}

/// Ironic's `_delete_configuration_final`: the root device hint goes (it named a volume that
/// no longer exists); the node's `raid_config` becomes `{}`.
pub fn delete_configuration_final(properties: &mut Map<String, Value>) -> Map<String, Value> {
    properties.remove("root_device");
    Map::new()
}

/// Ironic's `get_updated_capabilities`: `key:value` set in a `"k1:v1,k2:v2"` capabilities
/// string, in place when the key is there, appended otherwise. A string with an entry that
/// is not `key:value` is Ironic's error. Rivet also reads capabilities written as a JSON
/// object (`rivet_model::boot_mode::capabilities`); one is updated as an object.
pub fn updated_capabilities(
    current: Option<&Value>,
    key: &str,
    value: &str,
) -> Result<Value, String> {
    let text = match current {
        None | Some(Value::Null) => "",
        Some(Value::String(s)) => s.as_str(),
        Some(Value::Object(m)) => {
            let mut m = m.clone();
            m.insert(key.into(), Value::from(value));
            return Ok(Value::Object(m));
        }
        Some(other) => return Err(format!("Invalid capabilities string '{other}'.")),
    };
    let mut caps: Vec<(String, String)> = Vec::new();
    if !text.is_empty() {
        for entry in text.split(',') {
            let Some((k, v)) = entry.split_once(':') else {
                return Err(format!("Invalid capabilities string '{text}'."));
            };
            match caps.iter_mut().find(|(have, _)| have == k) {
                Some(c) => c.1 = v.to_string(),
                None => caps.push((k.to_string(), v.to_string())),
            }
        }
    }
    match caps.iter_mut().find(|(k, _)| k == key) {
        Some(c) => c.1 = value.to_string(),
        None => caps.push((key.to_string(), value.to_string())),
    }
    Ok(Value::from(
        caps.iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect::<Vec<_>>()
            .join(","),
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn raid_schema() {
        assert!(validate_target(&Map::new()).is_ok());
        let e = validate_configuration(&json!({})).unwrap_err();
        assert!(e.contains("'logical_disks' is a required property"), "{e}");
        let e = validate_configuration(&json!("RAID1")).unwrap_err();
        assert!(e.contains("not of type 'object'"), "{e}");
        assert!(validate_target(&obj(json!({"logical_disks": [
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
            match validate_target(&obj(bad.clone())) {
                Ok(()) => panic!("accepted {bad}"),
                Err(e) => assert!(e.contains(field), "{bad}: {e}"),
            }
        }
    }

    fn target() -> Map<String, Value> {
        obj(json!({"logical_disks": [
            {"raid_level": "1", "size_gb": 10, "is_root_volume": true},
            {"raid_level": "0", "size_gb": "MAX"},
        ]}))
    }

    #[test]
    fn filter_as_ironic() {
        let u = "1be26c0b-03f2-4d2e-ae87-c02d7f33c123";
        assert_eq!(
            filter_target_raid_config(u, &Map::new(), true, true).unwrap_err(),
            format!("Node {u} has no target RAID configuration.")
        );
        assert_eq!(
            filter_target_raid_config(u, &target(), true, true).unwrap(),
            target()
        );
        let only_root = filter_target_raid_config(u, &target(), true, false).unwrap();
        assert_eq!(
            only_root["logical_disks"],
            json!([{"raid_level": "1", "size_gb": 10, "is_root_volume": true}])
        );
        let no_root = filter_target_raid_config(u, &target(), false, true).unwrap();
        assert_eq!(
            no_root["logical_disks"],
            json!([{"raid_level": "0", "size_gb": "MAX"}])
        );
        assert_eq!(
            filter_target_raid_config(u, &target(), false, false).unwrap_err(),
            format!(
                "Node {u} has empty target RAID configuration after skipping root volume and \
                 skipping non-root volumes."
            )
        );
        let roots_only = obj(json!({"logical_disks": [{"raid_level": "1", "size_gb": 1,
                                                        "is_root_volume": true}]}));
        assert_eq!(
            filter_target_raid_config(u, &roots_only, false, true).unwrap_err(),
            format!("Node {u} has empty target RAID configuration after skipping root volume.")
        );
        // The step's arguments: the operator's kept, the filtered target added.
        let args = create_configuration_args(
            u,
            &target(),
            &obj(json!({"create_nonroot_volumes": "false", "delete_existing": true})),
        )
        .unwrap();
        assert_eq!(args[TARGET_ARG], json!(only_root));
        assert_eq!(args["delete_existing"], true);
        let e = create_configuration_args(u, &target(), &obj(json!({"create_root_volume": 3})))
            .unwrap_err();
        assert!(e.contains("create_root_volume"), "{e}");
    }

    #[test]
    fn apply_needs_a_valid_config() {
        let cfg = json!({"logical_disks": [{"raid_level": "1", "size_gb": 10}]});
        assert_eq!(
            apply_configuration_target(&obj(json!({"raid_config": cfg.clone()}))).unwrap(),
            obj(cfg)
        );
        let e = apply_configuration_target(&Map::new()).unwrap_err();
        assert!(e.contains("raid_config"), "{e}");
        let e = apply_configuration_target(&obj(json!({"raid_config": {"logical_disks": [
            {"raid_level": "4", "size_gb": 10}]}})))
        .unwrap_err();
        assert!(
            e.starts_with("RAID config validation error") && e.contains("raid_level"),
            "{e}"
        );
    }

    #[test]
    fn update_raid_info_as_ironic() {
        let at = Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap();
        assert_eq!(ironic_timestamp(at), "2026-01-02 03:04:05");
        let at = at + chrono::Duration::microseconds(1500);
        assert_eq!(ironic_timestamp(at), "2026-01-02 03:04:05.001500");
        let built = obj(json!({"logical_disks": [
            {"raid_level": "1", "size_gb": 9, "is_root_volume": true, "controller": "software",
             "volume_name": "root", "physical_disks": [{"name": "/dev/vda"}, {"name": "/dev/vdb"}],
             "root_device_hint": {"name": "/dev/md0"}},
            {"raid_level": "0", "size_gb": 20, "controller": "software"},
        ]}));
        let mut props = obj(json!({"capabilities": "boot_mode:bios,raid_level:0,x:y", "cpus": 2}));
        let stored = update_raid_info(&mut props, &built, at).unwrap();
        assert_eq!(stored["last_updated"], "2026-01-02 03:04:05.001500");
        assert_eq!(stored["logical_disks"], built["logical_disks"]);
        assert_eq!(
            Value::Object(props),
            json!({"capabilities": "boot_mode:bios,raid_level:1,x:y", "cpus": 2,
                   "local_gb": 9, "root_device": {"name": "/dev/md0"}})
        );
        // MAX keeps local_gb; no capabilities yet: one is written.
        let max = obj(json!({"logical_disks": [
            {"raid_level": "1+0", "size_gb": "MAX", "is_root_volume": true}]}));
        let mut props = obj(json!({"local_gb": 50}));
        update_raid_info(&mut props, &max, at).unwrap();
        assert_eq!(
            Value::Object(props),
            json!({"local_gb": 50, "capabilities": "raid_level:1+0"})
        );
        // No root volume: properties untouched.
        let mut props = obj(json!({"local_gb": 50}));
        let none = obj(json!({"logical_disks": [{"raid_level": "0", "size_gb": 5}]}));
        assert!(update_raid_info(&mut props, &none, at).is_ok());
        assert_eq!(Value::Object(props), json!({"local_gb": 50}));
        // Errors leave properties as they were.
        let mut props = obj(json!({"capabilities": "boot_mode:bios,oops"}));
        let e = update_raid_info(&mut props, &built, at).unwrap_err();
        assert_eq!(e, "Invalid capabilities string 'boot_mode:bios,oops'.");
        assert_eq!(
            Value::Object(props),
            json!({"capabilities": "boot_mode:bios,oops"})
        );
        let two = obj(json!({"logical_disks": [
            {"raid_level": "1", "size_gb": 1, "is_root_volume": true},
            {"raid_level": "1", "size_gb": 1, "is_root_volume": true}]}));
        let e = update_raid_info(&mut Map::new(), &two, at).unwrap_err();
        assert!(e.contains("more than one root volume"), "{e}");
        // Capabilities as an object stay an object.
        let mut props = obj(json!({"capabilities": {"boot_mode": "uefi"}}));
        update_raid_info(&mut props, &max, at).unwrap();
        assert_eq!(
            props["capabilities"],
            json!({"boot_mode": "uefi", "raid_level": "1+0"})
        );
        // Delete: the hint goes, raid_config is {}.
        let mut props = obj(json!({"root_device": {"name": "/dev/md0"}, "local_gb": 9}));
        assert!(delete_configuration_final(&mut props).is_empty());
        assert_eq!(Value::Object(props), json!({"local_gb": 9}));
    }

    #[test]
    fn built_config_needs_logical_disks() {
        let u = "n1";
        let ok = json!({"raid_config": {"logical_disks": []}});
        assert!(built_config(u, &ok).is_ok());
        for bad in [json!({}), json!({"raid_config": {}}), json!(null)] {
            let e = built_config(u, &bad).unwrap_err();
            assert!(
                e.starts_with(
                    "Agent ramdisk didn't return a proper command result while building RAID on n1."
                ),
                "{e}"
            );
        }
    }
}
