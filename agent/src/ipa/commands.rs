//! IPA's commands in Rivet's terms: the `extension.method` names a stock Ironic sends
//! (`clean.execute_clean_step`, `deploy.execute_deploy_step`, `standby.power_off`…), each
//! mapped onto the executor's [`CommandKind`] and the same hardware managers the rivetd mode
//! uses, and each result shaped the way Ironic's `AgentClient` reads it back.
//!
//! A command this agent cannot carry out is refused the way IPA refuses an unknown one
//! (HTTP 400, `InvalidCommandError`), which Ironic reports as unsupported: nothing is
//! answered with a success the agent did not earn.

use rivet_protocol::agent::{CleanStepsResult, CommandKind, DeployStepsResult};
use serde_json::{json, Map, Value};

/// How the agent handles one IPA command.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// Through the executor (one at a time, abortable, timed).
    Execute(CommandKind),
    /// At once, in the server.
    Immediate(Immediate),
}

/// Commands answered without the executor.
#[derive(Debug, Clone, PartialEq)]
pub enum Immediate {
    /// `standby.sync`: flush every file system and disk cache.
    Sync,
    /// `standby.get_partition_uuids`: the partitions of the disk last written.
    PartitionUuids,
    /// `image.install_bootloader` on a whole-disk image.
    InstallBootloader {
        /// `target_boot_mode`.
        boot_mode: String,
    },
    /// `log.collect_system_logs`: the agent's own log, tar.gz'd and base64'd.
    CollectLogs,
    /// `deploy.get_deploy_steps`-like listings with nothing offered (`service`).
    NoServiceSteps,
}

/// An IPA-style refusal: HTTP status, `type` and message.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// HTTP status.
    pub code: u16,
    /// IPA's exception type.
    pub kind: &'static str,
    /// The message (Ironic reads `faultstring`).
    pub message: String,
}

fn invalid(message: impl Into<String>) -> Refusal {
    Refusal {
        code: 400,
        kind: "InvalidCommandParamsError",
        message: message.into(),
    }
}

/// The step object of an execute_*_step command: `{"interface", "step", "args"}`.
fn step_of(params: &Map<String, Value>) -> Result<(String, String, Map<String, Value>), Refusal> {
    let step = params
        .get("step")
        .and_then(Value::as_object)
        .ok_or_else(|| invalid("Invalid params: \"step\" must be an object"))?;
    let name = step
        .get("step")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("Invalid params: the step has no \"step\" name"))?;
    let interface = step
        .get("interface")
        .and_then(Value::as_str)
        .unwrap_or("deploy");
    let args = step
        .get("args")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    Ok((interface.to_string(), name.to_string(), args))
}

/// `write_image`'s arguments from Ironic's `image_info`, `configdrive` and the node (root
/// device hints, boot mode), in the shape the deploy manager reads.
pub fn write_image_args(
    args: &Map<String, Value>,
    node: &Value,
) -> Result<Map<String, Value>, Refusal> {
    let info = args
        .get("image_info")
        .and_then(Value::as_object)
        .ok_or_else(|| invalid("write_image needs image_info"))?;
    if info.get("image_type").and_then(Value::as_str) == Some("partition") {
        return Err(Refusal {
            code: 400,
            kind: "InvalidCommandParamsError",
            message: "partition images are not supported by rivet-agent: deploy a whole-disk \
                      image"
                .into(),
        });
    }
    let url = info
        .get("urls")
        .and_then(Value::as_array)
        .and_then(|u| u.first())
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("image_info has no urls"))?;
    let mut out = Map::new();
    out.insert("image_source".into(), json!(url));
    for (from, to) in [
        ("disk_format", "disk_format"),
        ("os_hash_algo", "os_hash_algo"),
        ("os_hash_value", "os_hash_value"),
        ("checksum", "checksum"),
    ] {
        if let Some(v) = info
            .get(from)
            .filter(|v| v.as_str().is_some_and(|s| !s.is_empty()))
        {
            out.insert(to.into(), v.clone());
        }
    }
    // IPA's rule: instance_info's hints, else the node's properties'.
    let hints = node
        .pointer("/instance_info/root_device")
        .filter(|h| h.as_object().is_some_and(|o| !o.is_empty()))
        .or_else(|| {
            node.pointer("/properties/root_device")
                .filter(|h| h.as_object().is_some_and(|o| !o.is_empty()))
        });
    if let Some(h) = hints {
        out.insert("root_device".into(), h.clone());
    }
    if let Some(cd) = args.get("configdrive").and_then(Value::as_str) {
        if !cd.is_empty() {
            out.insert("configdrive".into(), json!(cd));
        }
    }
    out.insert("boot_mode".into(), json!(boot_mode(info, node)));
    Ok(out)
}

/// `boot_mode` in a capabilities value: `"k:v,k:v"` or an object.
fn capability(caps: Option<&Value>, key: &str) -> Option<String> {
    match caps? {
        Value::String(s) => s.split(',').find_map(|kv| {
            let (k, v) = kv.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_string())
        }),
        Value::Object(o) => o.get(key).and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

/// The boot mode the instance will boot in, resolved as Ironic resolves it
/// (`boot_mode_utils.get_boot_mode`): what the deploy says, then the instance's and the
/// node's capabilities, then the mode the BMC reports, then Ironic's default, `uefi`. On
/// `uefi` `write_image` makes the image's loader the first boot entry, which is what IPA's
/// `install_bootloader` does for a whole-disk image; Ironic's later call then finds it done.
pub fn boot_mode(info: &Map<String, Value>, node: &Value) -> &'static str {
    let candidates = [
        info.get("deploy_boot_mode")
            .and_then(Value::as_str)
            .map(str::to_string),
        node.pointer("/instance_info/deploy_boot_mode")
            .and_then(Value::as_str)
            .map(str::to_string),
        capability(node.pointer("/instance_info/capabilities"), "boot_mode"),
        capability(node.pointer("/properties/capabilities"), "boot_mode"),
        node.pointer("/driver_info/boot_mode")
            .and_then(Value::as_str)
            .map(str::to_string),
        node.get("boot_mode")
            .and_then(Value::as_str)
            .map(str::to_string),
    ];
    for c in candidates.into_iter().flatten() {
        match c.as_str() {
            "bios" => return "bios",
            "uefi" => return "uefi",
            _ => {}
        }
    }
    "uefi"
}

/// Ironic's erase settings, which it hands IPA in the node's `driver_internal_info`
/// (`[deploy] shred_random_overwrite_iterations`, `continue_if_disk_secure_erase_fails`,
/// `enable_nvme_secure_erase`/`enable_ata_secure_erase`, `disk_erasure_concurrency`), as
/// the erase steps' arguments. Arguments the step itself carries win.
pub fn erase_args(node: &Value) -> Map<String, Value> {
    let dii = node.get("driver_internal_info");
    let get = |k: &str| dii.and_then(|d| d.get(k));
    let mut out = Map::new();
    if let Some(n) = get("agent_erase_devices_iterations").and_then(Value::as_u64) {
        out.insert("random_passes".into(), json!(n.min(16)));
    }
    if let Some(b) = get("agent_continue_if_secure_erase_failed").and_then(Value::as_bool) {
        out.insert("continue_if_secure_erase_failed".into(), json!(b));
    }
    let nvme = get("agent_enable_nvme_secure_erase").and_then(Value::as_bool);
    let ata = get("agent_enable_ata_secure_erase").and_then(Value::as_bool);
    if nvme == Some(false) && ata == Some(false) {
        out.insert("secure_erase".into(), json!(false));
    }
    if let Some(n) = get("disk_erasure_concurrency").and_then(Value::as_u64) {
        out.insert("concurrency".into(), json!(n.clamp(1, 64)));
    }
    out
}

/// Plan `method` (`extension.name`) with `params`.
pub fn plan(method: &str, params: &Map<String, Value>) -> Result<Plan, Refusal> {
    let node = params.get("node").cloned().unwrap_or(Value::Null);
    let exec = |interface: String, step: String, mut args: Map<String, Value>| {
        // IPA's RAID steps read the node's target configuration; rivet's take it as an arg.
        if interface == "raid" && !args.contains_key("target_raid_config") {
            if let Some(t) = node.get("target_raid_config").filter(|t| t.is_object()) {
                args.insert("target_raid_config".into(), t.clone());
            }
        }
        Plan::Execute(CommandKind::ExecuteStep {
            interface,
            step,
            args,
        })
    };
    let erase_settings = |step: &str, mut args: Map<String, Value>| {
        if step.starts_with("erase_devices") {
            for (k, v) in erase_args(&node) {
                args.entry(k).or_insert(v);
            }
        }
        args
    };
    match method {
        "clean.get_clean_steps" => Ok(Plan::Execute(CommandKind::GetCleanSteps)),
        "deploy.get_deploy_steps" => Ok(Plan::Execute(CommandKind::GetDeploySteps)),
        "service.get_service_steps" => Ok(Plan::Immediate(Immediate::NoServiceSteps)),
        "clean.execute_clean_step" => {
            let (i, s, a) = step_of(params)?;
            let a = erase_settings(&s, a);
            Ok(exec(i, s, a))
        }
        "deploy.execute_deploy_step" => {
            let (i, s, a) = step_of(params)?;
            if s == "write_image" {
                let a = write_image_args(&a, &node)?;
                return Ok(exec(i, s, a));
            }
            Ok(exec(i, s, a))
        }
        "service.execute_service_step" => Err(Refusal {
            code: 400,
            kind: "InvalidCommandError",
            message: "Unknown command: service.execute_service_step (rivet-agent offers no \
                      service steps)"
                .into(),
        }),
        "standby.power_off" => Ok(Plan::Execute(CommandKind::PowerOff)),
        "standby.reboot" => Ok(Plan::Execute(CommandKind::Reboot)),
        "standby.sync" => Ok(Plan::Immediate(Immediate::Sync)),
        "standby.get_partition_uuids" => Ok(Plan::Immediate(Immediate::PartitionUuids)),
        "image.install_bootloader" => Ok(Plan::Immediate(Immediate::InstallBootloader {
            boot_mode: params
                .get("target_boot_mode")
                .and_then(Value::as_str)
                .unwrap_or("bios")
                .to_string(),
        })),
        "log.collect_system_logs" => Ok(Plan::Immediate(Immediate::CollectLogs)),
        "rescue.finalize_rescue" => {
            let pw = params
                .get("rescue_password")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let hashed = params
                .get("hashed")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            if !hashed {
                return Err(invalid(
                    "rivet-agent takes the rescue password only hashed (SHA-256 or SHA-512 \
                     crypt, as Ironic sends it by default); this Ironic sent it in plain text",
                ));
            }
            Ok(Plan::Execute(CommandKind::FinalizeRescue {
                rescue_password_hash: pw.to_string(),
            }))
        }
        other => Err(Refusal {
            code: 400,
            kind: "InvalidCommandError",
            message: format!("Unknown command: {other}"),
        }),
    }
}

/// IPA's `command_name`: the method without its extension.
pub fn command_name(method: &str) -> &str {
    method.split_once('.').map(|(_, n)| n).unwrap_or(method)
}

/// The executor's result of `method` in the shape Ironic reads.
pub fn shape_result(method: &str, params: &Map<String, Value>, result: Value) -> Value {
    let steps_by_manager = |steps: Value, versions: Value, key: &str| {
        // IPA groups steps by hardware manager; the dispatcher already chose one per name,
        // so one group holds them all.
        json!({key: {"RivetHardwareManagers": steps}, "hardware_manager_version": versions})
    };
    match method {
        "clean.get_clean_steps" => match serde_json::from_value::<CleanStepsResult>(result.clone())
        {
            Ok(r) => steps_by_manager(
                json!(r.clean_steps),
                Value::Object(r.hardware_manager_versions),
                "clean_steps",
            ),
            Err(_) => result,
        },
        "deploy.get_deploy_steps" => {
            match serde_json::from_value::<DeployStepsResult>(result.clone()) {
                Ok(r) => steps_by_manager(
                    json!(r.deploy_steps),
                    Value::Object(r.hardware_manager_versions),
                    "deploy_steps",
                ),
                Err(_) => result,
            }
        }
        "clean.execute_clean_step" => {
            json!({"clean_result": result, "clean_step": params.get("step").cloned().unwrap_or(Value::Null)})
        }
        "deploy.execute_deploy_step" => {
            json!({"deploy_result": result, "deploy_step": params.get("step").cloned().unwrap_or(Value::Null)})
        }
        _ => result,
    }
}

/// IPA's error type for a failed `method`.
pub fn error_type(method: &str) -> &'static str {
    match method {
        "clean.execute_clean_step" => "CleaningError",
        "deploy.execute_deploy_step" => "DeploymentError",
        _ => "CommandExecutionError",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn write_image_from_ironic_image_info() {
        let p = params(json!({
            "step": {"interface": "deploy", "step": "write_image", "priority": 80,
                     "args": {"image_info": {"id": "x", "urls": ["http://img/a.qcow2"],
                                             "disk_format": "qcow2", "os_hash_algo": "sha256",
                                             "os_hash_value": "ab", "checksum": "",
                                             "image_type": "whole-disk",
                                             "deploy_boot_mode": "bios"},
                              "configdrive": "H4sI..."}},
            "node": {"uuid": "n", "properties": {"root_device": {"name": "/dev/sdb"}},
                     "instance_info": {}}}));
        let Plan::Execute(CommandKind::ExecuteStep {
            interface,
            step,
            args,
        }) = plan("deploy.execute_deploy_step", &p).expect("plan")
        else {
            panic!("not a step")
        };
        assert_eq!(
            (interface.as_str(), step.as_str()),
            ("deploy", "write_image")
        );
        assert_eq!(
            Value::Object(args),
            json!({"image_source": "http://img/a.qcow2", "disk_format": "qcow2",
                   "os_hash_algo": "sha256", "os_hash_value": "ab",
                   "root_device": {"name": "/dev/sdb"}, "configdrive": "H4sI...",
                   "boot_mode": "bios"})
        );
        // Ironic's order, and its default.
        let info = Map::new();
        assert_eq!(boot_mode(&info, &json!({})), "uefi");
        assert_eq!(
            boot_mode(
                &info,
                &json!({"properties": {"capabilities": "cpu_vt:true,boot_mode:bios"}})
            ),
            "bios"
        );
        assert_eq!(
            boot_mode(
                &info,
                &json!({"instance_info": {"capabilities": {"boot_mode": "uefi"}},
                        "properties": {"capabilities": "boot_mode:bios"}})
            ),
            "uefi"
        );
        assert_eq!(boot_mode(&info, &json!({"boot_mode": "bios"})), "bios");
        let mut partition = p.clone();
        partition["step"]["args"]["image_info"]["image_type"] = json!("partition");
        let e = plan("deploy.execute_deploy_step", &partition).expect_err("partition");
        assert!(e.message.contains("whole-disk"), "{e:?}");
    }

    #[test]
    fn ironic_erase_settings_become_step_args() {
        let p = params(json!({
            "step": {"interface": "deploy", "step": "erase_devices", "args": {"concurrency": 2}},
            "node": {"driver_internal_info": {"agent_erase_devices_iterations": 1,
                     "agent_continue_if_secure_erase_failed": true,
                     "agent_enable_nvme_secure_erase": false, "agent_enable_ata_secure_erase": false,
                     "disk_erasure_concurrency": 4}}}));
        let Ok(Plan::Execute(CommandKind::ExecuteStep { args, .. })) =
            plan("clean.execute_clean_step", &p)
        else {
            panic!("erase step")
        };
        assert_eq!(
            Value::Object(args),
            json!({"concurrency": 2, "random_passes": 1, "continue_if_secure_erase_failed": true,
                   "secure_erase": false})
        );
    }

    #[test]
    fn names_results_and_refusals() {
        assert_eq!(
            command_name("clean.execute_clean_step"),
            "execute_clean_step"
        );
        let r = shape_result(
            "clean.execute_clean_step",
            &params(json!({"step": {"step": "erase_devices"}})),
            json!({"ok": 1}),
        );
        assert_eq!(
            r,
            json!({"clean_result": {"ok": 1}, "clean_step": {"step": "erase_devices"}})
        );
        let steps = shape_result(
            "clean.get_clean_steps",
            &Map::new(),
            json!({"clean_steps": [{"interface": "deploy", "step": "erase_devices", "priority": 10}],
                   "hardware_manager_versions": {"generic_hardware_manager": "1.0"}}),
        );
        assert_eq!(
            steps["clean_steps"]["RivetHardwareManagers"][0]["step"],
            "erase_devices"
        );
        assert_eq!(
            steps["hardware_manager_version"]["generic_hardware_manager"],
            "1.0"
        );
        let e = plan("system.lockdown", &Map::new()).expect_err("unknown");
        assert_eq!((e.code, e.kind), (400, "InvalidCommandError"));
        assert!(e.message.starts_with("Unknown command: system.lockdown"));
        let e = plan(
            "rescue.finalize_rescue",
            &params(json!({"rescue_password": "pw"})),
        )
        .expect_err("plaintext");
        assert!(e.message.contains("hashed"), "{e:?}");
        // RAID steps get the node's target configuration.
        let p = params(
            json!({"step": {"interface": "raid", "step": "create_configuration"},
                              "node": {"target_raid_config": {"logical_disks": []}}}),
        );
        let Ok(Plan::Execute(CommandKind::ExecuteStep { args, .. })) =
            plan("clean.execute_clean_step", &p)
        else {
            panic!("raid step")
        };
        assert_eq!(args["target_raid_config"], json!({"logical_disks": []}));
    }
}
