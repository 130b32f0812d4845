//! BIOS over Redfish: read `Bios.Attributes`, stage settings in the BIOS settings object
//! (`bios.apply_configuration`), reset to defaults with `Bios.ResetBios`
//! (`bios.factory_reset`). Both steps ask for a reboot: BMCs apply BIOS changes at the next
//! boot, and the step descriptors say so with `reboot_requested`.

use super::Ctx;
use crate::drivers::DriverError;
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

/// Stage `settings` in the BIOS settings object; report what is already in effect.
pub(crate) async fn apply(ctx: &Ctx, settings: Vec<(String, Value)>) -> Result<Value, DriverError> {
    let path = bios_path(ctx).await?;
    let bios = ctx.client.get(&path).await?;
    let settings_obj = &bios["@Redfish.Settings"];
    let target = settings_obj["SettingsObject"]["@odata.id"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| format!("{path}/Settings"));
    let wanted: Map<String, Value> = settings.into_iter().collect();
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
