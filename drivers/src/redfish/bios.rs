//! BIOS over Redfish: read `Bios.Attributes`, stage settings in the BIOS settings object
//! (`bios.apply_configuration`), reset to defaults with `Bios.ResetBios`
//! (`bios.factory_reset`). Both steps ask for a reboot: BMCs apply BIOS changes at the next
//! boot, and the step descriptors say so with `reboot_requested`.

use super::Ctx;
use crate::management::value_text;
use crate::DriverError;
use rivet_protocol::steps::{ArgInfo, StepDescriptor};
use serde_json::{json, Map, Value};

const APPLY: &str = "bios.apply_configuration";

/// `bios.apply_configuration`: manual only, reboot afterwards.
pub(crate) fn apply_configuration_descriptor() -> StepDescriptor {
    let mut argsinfo = std::collections::BTreeMap::new();
    argsinfo.insert(
        "settings".to_string(),
        ArgInfo {
            description: "BIOS attributes to set: a list of {\"name\": ..., \"value\": ...}".into(),
            required: true,
        },
    );
    StepDescriptor {
        interface: "bios".into(),
        step: "apply_configuration".into(),
        priority: 0,
        abortable: false,
        argsinfo,
        reboot_requested: true,
        requires_ramdisk: false,
    }
}

/// `bios.factory_reset`: manual only, reboot afterwards.
pub(crate) fn factory_reset_descriptor() -> StepDescriptor {
    StepDescriptor {
        interface: "bios".into(),
        step: "factory_reset".into(),
        priority: 0,
        abortable: false,
        argsinfo: Default::default(),
        reboot_requested: true,
        requires_ramdisk: false,
    }
}

fn bad_args(reason: impl Into<String>) -> DriverError {
    DriverError::BadStepArgs {
        step: APPLY.into(),
        reason: reason.into(),
    }
}

/// `settings`: a non-empty list of `{name, value}` (Ironic's shape).
pub(crate) fn parse_settings(
    args: &Map<String, Value>,
) -> Result<Vec<(String, Value)>, DriverError> {
    let list = args
        .get("settings")
        .ok_or_else(|| {
            bad_args("argument \"settings\" is required: a list of {\"name\", \"value\"}")
        })?
        .as_array()
        .ok_or_else(|| bad_args("argument \"settings\" must be a list of {\"name\", \"value\"}"))?;
    if list.is_empty() {
        return Err(bad_args("argument \"settings\" is empty"));
    }
    list.iter()
        .enumerate()
        .map(|(i, item)| {
            let name = item["name"]
                .as_str()
                .filter(|n| !n.is_empty())
                .ok_or_else(|| bad_args(format!("settings[{i}] has no \"name\" string")))?;
            let value = item
                .get("value")
                .filter(|v| !v.is_null())
                .ok_or_else(|| bad_args(format!("settings[{i}] ({name}) has no \"value\"")))?;
            Ok((name.to_string(), value.clone()))
        })
        .collect()
}

/// The system's `Bios` resource path.
async fn bios_path(ctx: &Ctx) -> Result<String, DriverError> {
    let sys = ctx.client.get(&ctx.system).await?;
    sys["Bios"]["@odata.id"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| DriverError::Unsupported {
            driver: "redfish".into(),
            operation: format!(
                "BIOS settings: {} at {} has no Bios resource",
                ctx.system,
                ctx.client.address()
            ),
        })
}

/// `Bios.Attributes` as the BMC reports them now.
pub(crate) async fn attributes(ctx: &Ctx) -> Result<Map<String, Value>, DriverError> {
    let bios = ctx.client.get(&bios_path(ctx).await?).await?;
    Ok(bios["Attributes"].as_object().cloned().unwrap_or_default())
}

/// Whether the BMC's value is the requested one. Values are compared as Ironic stores them
/// (text), so `"5"` asked for an integer attribute that reads back `5` counts as applied.
fn same_value(now: Option<&Value>, wanted: &Value) -> bool {
    now.is_some_and(|v| v == wanted || value_text(v) == value_text(wanted))
}

/// Stage `settings` in the BIOS settings object; report what is already in effect. When
/// every setting already has its value (and no other value is staged for it), nothing is
/// staged and `reboot_required` is false, so the conductor skips the reboot (as Ironic does).
pub(crate) async fn apply(ctx: &Ctx, settings: Vec<(String, Value)>) -> Result<Value, DriverError> {
    let path = bios_path(ctx).await?;
    let bios = ctx.client.get(&path).await?;
    let settings_obj = &bios["@Redfish.Settings"];
    let target = settings_obj["SettingsObject"]["@odata.id"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| format!("{path}/Settings"));
    let wanted: Map<String, Value> = settings.into_iter().collect();
    let current = bios["Attributes"].as_object().cloned().unwrap_or_default();
    if wanted.iter().all(|(k, v)| same_value(current.get(k), v)) {
        // A value staged for another run would still apply at the next boot.
        let staged = ctx.client.get(&target).await.ok();
        let conflicting = staged
            .as_ref()
            .and_then(|s| s["Attributes"].as_object())
            .is_some_and(|p| {
                wanted
                    .iter()
                    .any(|(k, v)| p.get(k).is_some_and(|pv| !same_value(Some(pv), v)))
            });
        if !conflicting {
            return Ok(json!({
                "requested": wanted,
                "pending": {},
                "reboot_required": false,
            }));
        }
    }
    let mut body = json!({ "Attributes": wanted });
    let on_reset = settings_obj["SupportedApplyTimes"]
        .as_array()
        .is_some_and(|a| a.iter().any(|v| v == "OnReset"));
    if on_reset {
        body["@Redfish.SettingsApplyTime"] = json!({"ApplyTime": "OnReset"});
    }
    ctx.client.patch(&target, &body).await?;
    let now = attributes(ctx).await?;
    let pending: Map<String, Value> = wanted
        .iter()
        .filter(|(k, v)| now.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok(json!({
        "requested": wanted,
        "pending": pending,
        "reboot_required": !pending.is_empty(),
    }))
}

/// After the reboot: every requested setting reads back with its value. BMCs refresh
/// `Bios.Attributes` some time after power on, so this polls up to the power wait before
/// failing with the settings the BMC did not apply.
pub(crate) async fn verify(
    ctx: &Ctx,
    node: &str,
    wanted: &[(String, Value)],
) -> Result<(), DriverError> {
    let limit = std::time::Duration::from_secs(ctx.cfg.power_wait_s.max(1));
    let deadline = std::time::Instant::now() + limit;
    loop {
        let now = attributes(ctx).await?;
        let missing: Vec<String> = wanted
            .iter()
            .filter(|(k, v)| !same_value(now.get(k), v))
            .map(|(k, v)| {
                let read = now
                    .get(k)
                    .map_or_else(|| "absent".to_string(), Value::to_string);
                format!("{k} (requested {v}, reads {read})")
            })
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(DriverError::Bmc(format!(
                "Redfish BIOS apply_configuration on node {node}: after the reboot the BMC at {} did not apply {}; \
                 check the names and values against GET /v1/nodes/{node}/bios and the BMC's attribute registry",
                ctx.client.address(),
                missing.join(", ")
            )));
        }
        ctx.pause().await;
    }
}

/// `Bios.ResetBios`: defaults at the next boot.
pub(crate) async fn factory_reset(ctx: &Ctx) -> Result<Value, DriverError> {
    let path = bios_path(ctx).await?;
    let bios = ctx.client.get(&path).await?;
    let target = bios["Actions"]["#Bios.ResetBios"]["target"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| format!("{path}/Actions/Bios.ResetBios"));
    ctx.client.post(&target, &json!({})).await?;
    Ok(json!({"reset_requested": true, "reboot_required": true}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn values_compare_as_ironic_stores_them() {
        assert!(same_value(Some(&json!(5)), &json!("5")));
        assert!(same_value(Some(&json!(true)), &json!("True")));
        assert!(same_value(Some(&json!("Disabled")), &json!("Disabled")));
        assert!(!same_value(Some(&json!("Enabled")), &json!("Disabled")));
        assert!(!same_value(None, &json!("Disabled")));
    }

    #[test]
    fn settings_are_checked() {
        let ok = parse_settings(&args(json!({"settings": [
            {"name": "ProcTurboMode", "value": "Disabled"},
            {"name": "NumLock", "value": true}
        ]})))
        .expect("valid");
        assert_eq!(ok[0], ("ProcTurboMode".into(), json!("Disabled")));
        for bad in [
            json!({}),
            json!({"settings": {}}),
            json!({"settings": []}),
            json!({"settings": [{"value": 1}]}),
            json!({"settings": [{"name": "X"}]}),
        ] {
            match parse_settings(&args(bad.clone())) {
                Err(DriverError::BadStepArgs { step, .. }) => assert_eq!(step, APPLY),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
