//! Management calls over Redfish, as Ironic's redfish management interface makes them:
//! the BIOS cache from `Bios.Attributes`, with each setting's entry of the BMC's attribute
//! registry (see [`super::bios_registry`]); firmware components as Ironic's redfish firmware
//! interface caches them: `bios` (System `BiosVersion`), `bmc` (Manager `FirmwareVersion`
//! and `Model`) and `nic:<serial or id>` (the Chassis' `NetworkAdapters`: each controller's
//! `FirmwarePackageVersion`, the adapter's `Manufacturer`, `Model`, `SerialNumber`);
//! indicators from `IndicatorLED` of the System and its Chassis (named by their `UUID`, as
//! Ironic does); NMI with `ComputerSystem.Reset` `Nmi`; boot mode from
//! `Boot.BootSourceOverrideMode`; secure boot through the `SecureBoot` resource.

use super::Ctx;
use crate::management::{value_text, BiosReading, Indicator};
use crate::DriverError;
use rivet_model::records::FirmwareReading;
use serde_json::{json, Value};

/// The BIOS attributes, as readings with their registry fields. A registry that cannot be
/// read leaves the fields null (as in Ironic, which logs and caches the values alone).
pub(crate) async fn bios_settings(ctx: &Ctx) -> Result<Vec<BiosReading>, DriverError> {
    let sys = ctx.client.get(&ctx.system).await?;
    let Some(path) = sys["Bios"]["@odata.id"].as_str() else {
        return Ok(Vec::new());
    };
    let bios = ctx.client.get(path).await?;
    let attrs = bios["Attributes"].as_object().cloned().unwrap_or_default();
    let entries = match bios["AttributeRegistry"].as_str() {
        Some(name) => match super::bios_registry::attributes(ctx, name).await {
            Ok(Some(entries)) => entries,
            Ok(None) => {
                tracing::info!(registry = %name, "the BMC serves no such BIOS attribute registry");
                Vec::new()
            }
            Err(e) => {
                tracing::info!(registry = %name, error = %e, "BIOS attribute registry not read");
                Vec::new()
            }
        },
        None => Vec::new(),
    };
    Ok(attrs
        .iter()
        .map(|(name, v)| BiosReading {
            name: name.clone(),
            value: value_text(v),
            registry: super::bios_registry::fields(&entries, name),
        })
        .collect())
}

/// The first link of `links[key]` (`ManagedBy`, `Chassis`).
fn first_link(sys: &Value, key: &str) -> Option<String> {
    sys["Links"][key]
        .as_array()
        .and_then(|a| a.first())
        .and_then(|l| l["@odata.id"].as_str())
        .map(str::to_string)
}

/// A non-empty string property.
fn text(doc: &Value, key: &str) -> Option<String> {
    doc[key]
        .as_str()
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

/// `bios`, `bmc` and `nic:…` components, where reported (Ironic's
/// `cache_firmware_components`: the BIOS has no vendor, model or serial; the BMC only its
/// Manager's model).
pub(crate) async fn firmware_versions(ctx: &Ctx) -> Result<Vec<FirmwareReading>, DriverError> {
    let sys = ctx.client.get(&ctx.system).await?;
    let mut out = Vec::new();
    if let Some(v) = text(&sys, "BiosVersion") {
        out.push(FirmwareReading::new("bios", &v));
    }
    if let Some(mgr) = first_link(&sys, "ManagedBy") {
        let m = ctx.client.get(&mgr).await?;
        if let Some(v) = text(&m, "FirmwareVersion") {
            out.push(FirmwareReading {
                model: text(&m, "Model"),
                ..FirmwareReading::new("bmc", &v)
            });
        }
    }
    // Some BMCs refuse NetworkAdapters until the OS is up: the other components still count.
    match nic_components(ctx, &sys).await {
        Ok(nics) => out.extend(nics),
        Err(e) => tracing::warn!(error = %e, "NetworkAdapters firmware not read"),
    }
    Ok(out)
}

/// One component per network adapter controller with a `FirmwarePackageVersion`.
async fn nic_components(ctx: &Ctx, sys: &Value) -> Result<Vec<FirmwareReading>, DriverError> {
    let mut out = Vec::new();
    let Some(chassis) = first_link(sys, "Chassis") else {
        return Ok(out);
    };
    let c = ctx.client.get(&chassis).await?;
    let Some(path) = c["NetworkAdapters"]["@odata.id"].as_str() else {
        return Ok(out);
    };
    let collection = ctx.client.get(path).await?;
    let members = collection["Members"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for m in members {
        let Some(p) = m["@odata.id"].as_str() else {
            continue;
        };
        let adapter = ctx.client.get(p).await?;
        let serial = text(&adapter, "SerialNumber");
        let Some(id) = serial.clone().or_else(|| text(&adapter, "Id")) else {
            continue;
        };
        let controllers = adapter["Controllers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for ctl in controllers {
            if let Some(v) = text(&ctl, "FirmwarePackageVersion") {
                out.push(FirmwareReading {
                    component: format!("nic:{id}"),
                    version: v,
                    vendor: text(&adapter, "Manufacturer"),
                    model: text(&adapter, "Model"),
                    serial_number: serial.clone(),
                });
            }
        }
    }
    Ok(out)
}

/// `ComputerSystem.Reset` with `Nmi`.
pub(crate) async fn inject_nmi(ctx: &Ctx) -> Result<(), DriverError> {
    super::reset(ctx, "Nmi").await
}

const STATES: &[&str] = &["BLINKING", "OFF", "ON"];

fn led_state(led: &str) -> &'static str {
    match led {
        "Lit" => "ON",
        "Blinking" => "BLINKING",
        "Off" => "OFF",
        _ => "UNKNOWN",
    }
}

fn led_value(state: &str) -> Option<&'static str> {
    match state {
        "ON" => Some("Lit"),
        "BLINKING" => Some("Blinking"),
        "OFF" => Some("Off"),
        _ => None,
    }
}

/// The resources with an indicator: `(component, name, path, IndicatorLED)`.
async fn leds(ctx: &Ctx) -> Result<Vec<(String, String, String, String)>, DriverError> {
    let sys = ctx.client.get(&ctx.system).await?;
    let mut out = Vec::new();
    if let Some(chassis) = first_link(&sys, "Chassis") {
        let c = ctx.client.get(&chassis).await?;
        if let Some(led) = c["IndicatorLED"].as_str() {
            let name = c["UUID"].as_str().or(c["Id"].as_str()).unwrap_or("chassis");
            out.push(("chassis".into(), name.into(), chassis, led.into()));
        }
    }
    if let Some(led) = sys["IndicatorLED"].as_str() {
        let name = sys["UUID"]
            .as_str()
            .or(sys["Id"].as_str())
            .unwrap_or("system");
        out.push(("system".into(), name.into(), ctx.system.clone(), led.into()));
    }
    Ok(out)
}

pub(crate) async fn indicators(ctx: &Ctx) -> Result<Vec<Indicator>, DriverError> {
    Ok(leds(ctx)
        .await?
        .into_iter()
        .map(|(component, name, _, _)| Indicator {
            component,
            name,
            readonly: false,
            states: STATES.iter().map(|s| s.to_string()).collect(),
        })
        .collect())
}

fn no_indicator(component: &str, name: &str) -> DriverError {
    DriverError::BadDriverInfo {
        field: "indicator".into(),
        reason: format!("the BMC has no indicator {name}@{component}"),
    }
}

pub(crate) async fn indicator_state(
    ctx: &Ctx,
    component: &str,
    name: &str,
) -> Result<String, DriverError> {
    leds(ctx)
        .await?
        .into_iter()
        .find(|(c, n, _, _)| c == component && n == name)
        .map(|(_, _, _, led)| led_state(&led).to_string())
        .ok_or_else(|| no_indicator(component, name))
}

pub(crate) async fn set_indicator_state(
    ctx: &Ctx,
    component: &str,
    name: &str,
    state: &str,
) -> Result<(), DriverError> {
    let (_, _, path, _) = leds(ctx)
        .await?
        .into_iter()
        .find(|(c, n, _, _)| c == component && n == name)
        .ok_or_else(|| no_indicator(component, name))?;
    let led = led_value(state).ok_or_else(|| DriverError::BadDriverInfo {
        field: "state".into(),
        reason: format!(
            "indicator state {state} is not one of {}",
            STATES.join(", ")
        ),
    })?;
    ctx.client
        .patch(&path, &json!({"IndicatorLED": led}))
        .await?;
    Ok(())
}

/// `(boot mode, secure boot)`: `UEFI` is `uefi`, `Legacy` is `bios`.
pub(crate) async fn boot_mode(ctx: &Ctx) -> Result<(Option<String>, Option<bool>), DriverError> {
    let sys = ctx.client.get(&ctx.system).await?;
    let mode = match sys["Boot"]["BootSourceOverrideMode"].as_str() {
        Some("UEFI") => Some("uefi".to_string()),
        Some("Legacy") => Some("bios".to_string()),
        _ => None,
    };
    let secure = match (mode.as_deref(), sys["SecureBoot"]["@odata.id"].as_str()) {
        // Secure Boot is a UEFI feature: in Legacy mode it is off, and BMCs may refuse to
        // show the resource at all (sushy-tools answers 501).
        (Some("bios"), _) => Some(false),
        (_, Some(p)) => ctx.client.get(p).await?["SecureBootEnable"].as_bool(),
        (_, None) => None,
    };
    Ok((mode, secure))
}

pub(crate) async fn set_boot_mode(ctx: &Ctx, mode: &str) -> Result<(), DriverError> {
    let value = match mode {
        "uefi" => "UEFI",
        "bios" => "Legacy",
        other => {
            return Err(DriverError::BadDriverInfo {
                field: "boot_mode".into(),
                reason: format!("{other} is not bios or uefi"),
            })
        }
    };
    ctx.client
        .patch(
            &ctx.system,
            &json!({"Boot": {"BootSourceOverrideMode": value}}),
        )
        .await?;
    Ok(())
}

pub(crate) async fn set_secure_boot(ctx: &Ctx, on: bool) -> Result<(), DriverError> {
    let sys = ctx.client.get(&ctx.system).await?;
    let path = sys["SecureBoot"]["@odata.id"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| DriverError::Unsupported {
            driver: "redfish".into(),
            operation: format!(
                "secure boot: {} at {} has no SecureBoot resource",
                ctx.system,
                ctx.client.address()
            ),
        })?;
    // As Ironic's redfish management: nothing to do when already so, and Secure Boot is
    // refused in Legacy mode (the BMC would accept the PATCH and the machine would ignore it).
    if ctx.client.get(&path).await?["SecureBootEnable"].as_bool() == Some(on) {
        return Ok(());
    }
    if on && sys["Boot"]["BootSourceOverrideMode"].as_str() == Some("Legacy") {
        return Err(DriverError::Bmc(format!(
            "{} at {} is in Legacy boot mode: Secure Boot needs UEFI; set the boot mode to uefi first",
            ctx.system,
            ctx.client.address()
        )));
    }
    ctx.client
        .patch(&path, &json!({"SecureBootEnable": on}))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn led_names() {
        for s in STATES {
            assert_eq!(led_state(led_value(s).unwrap_or_default()), *s);
        }
        assert_eq!(led_state("Weird"), "UNKNOWN");
        assert_eq!(led_value("UNKNOWN"), None);
    }
}
