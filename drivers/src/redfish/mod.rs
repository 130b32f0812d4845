//! The `redfish` driver: power, one-time boot override, virtual media, BIOS and firmware
//! out-of-band steps, and out-of-band inspection over the DMTF Redfish API.
//!
//! Tested against the sushy-tools emulator (power, boot, virtual media, NIC MACs) and an
//! in-tree mock for what sushy's fake driver does not serve (BIOS, firmware update tasks,
//! processors). Every error that leaves this module has the node's password removed.

mod bios;
mod bios_registry;
mod client;
mod firmware;
mod info;
mod inspect;
mod management;
mod media;

use super::{Bmc, BootDevice, DriverError, DriversConfig, Health, OobInventory};
use async_trait::async_trait;
use client::RedfishClient;
use info::RedfishInfo;
pub use info::PROPERTIES;
use rivet_protocol::states::PowerState;
use rivet_protocol::steps::StepDescriptor;
use serde_json::{json, Map, Value};
use std::time::{Duration, Instant};
use tracing::Instrument;

/// The Redfish driver. Cheap to create; HTTP clients and sessions are shared process-wide.
#[derive(Debug, Clone, Default)]
pub struct RedfishBmc {
    cfg: DriversConfig,
}

/// One operation's view of a node's BMC: the client and the ComputerSystem's path.
pub(crate) struct Ctx {
    pub(crate) client: RedfishClient,
    pub(crate) info: RedfishInfo,
    pub(crate) system: String,
    pub(crate) cfg: DriversConfig,
}

impl Ctx {
    /// Wait between two reads of a BMC that is still working.
    pub(crate) async fn pause(&self) {
        tokio::time::sleep(Duration::from_millis(self.cfg.poll_interval_ms.max(10))).await;
    }
}

impl RedfishBmc {
    /// A driver with these timeouts and retries.
    pub fn new(cfg: DriversConfig) -> RedfishBmc {
        RedfishBmc { cfg }
    }

    /// Parse `driver_info`, build the client, find the system.
    async fn ctx(&self, info: &Map<String, Value>) -> Result<Ctx, DriverError> {
        let info = info::parse(info)?;
        let secret = info.secret().map(str::to_string);
        let built = async {
            let client = RedfishClient::new(&info, &self.cfg)?;
            let system = match &info.system_path {
                Some(p) => p.clone(),
                None => only_system(&client).await?,
            };
            Ok((client, system))
        }
        .await;
        let (client, system) = scrub(built, secret.as_deref())?;
        Ok(Ctx {
            client,
            info,
            system,
            cfg: self.cfg.clone(),
        })
    }
}

impl Ctx {
    /// `r` with the password removed from any error text.
    fn scrub<T>(&self, r: Result<T, DriverError>) -> Result<T, DriverError> {
        scrub(r, self.info.secret())
    }
}

/// The span every BMC request of one operation runs in: its log lines carry the node.
fn span(node: &str) -> tracing::Span {
    tracing::info_span!("redfish", node = %node)
}

/// Remove the password from an error's text.
fn scrub<T>(r: Result<T, DriverError>, secret: Option<&str>) -> Result<T, DriverError> {
    use super::redact;
    r.map_err(|e| match e {
        DriverError::Bmc(m) => DriverError::Bmc(redact(&m, secret)),
        DriverError::BadDriverInfo { field, reason } => DriverError::BadDriverInfo {
            field,
            reason: redact(&reason, secret),
        },
        DriverError::BadStepArgs { step, reason } => DriverError::BadStepArgs {
            step,
            reason: redact(&reason, secret),
        },
        other => other,
    })
}

/// The BMC's only ComputerSystem (when `redfish_system_id` is not given).
async fn only_system(client: &RedfishClient) -> Result<String, DriverError> {
    let systems = client.get("/redfish/v1/Systems").await?;
    let members = members(&systems);
    match members.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(DriverError::Bmc(format!(
            "Redfish BMC at {} lists no ComputerSystem",
            client.address()
        ))),
        many => Err(DriverError::BadDriverInfo {
            field: "redfish_system_id".into(),
            reason: format!(
                "is required: the BMC at {} manages {} systems ({})",
                client.address(),
                many.len(),
                many.join(", ")
            ),
        }),
    }
}

/// `Members[].@odata.id` of a collection.
pub(crate) fn members(collection: &Value) -> Vec<String> {
    collection["Members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["@odata.id"].as_str().map(str::to_string))
        .collect()
}

/// Redfish `PowerState` → ours. Transitional states count as where they are heading to be
/// consistent with Ironic.
fn power_from_redfish(s: &str) -> Option<PowerState> {
    match s {
        "On" | "PoweringOn" => Some(PowerState::On),
        "Off" | "PoweringOff" => Some(PowerState::Off),
        _ => None,
    }
}

async fn read_power(ctx: &Ctx) -> Result<PowerState, DriverError> {
    Ok(read_power_and_health(ctx).await?.0)
}

/// The System's `PowerState` and `Status.Health` (Ironic's `get_node_health` reads the same
/// resource), from one GET.
async fn read_power_and_health(ctx: &Ctx) -> Result<(PowerState, Option<Health>), DriverError> {
    let sys = ctx.client.get(&ctx.system).await?;
    let health = Health::from_redfish(sys["Status"]["Health"].as_str());
    let raw = sys["PowerState"].as_str().unwrap_or("");
    let power = power_from_redfish(raw).ok_or_else(|| {
        DriverError::Bmc(format!(
            "Redfish BMC at {} reports an unknown PowerState {raw:?} for {}",
            ctx.client.address(),
            ctx.system
        ))
    })?;
    Ok((power, health))
}

/// Which ResetType reaches `target` from `current`, and the state to wait for; `None` when
/// there is nothing to do.
fn reset_plan(
    current: PowerState,
    target: PowerState,
) -> Result<Option<(&'static str, PowerState)>, DriverError> {
    use PowerState::*;
    Ok(match (target, current) {
        (On, On) | (Off, Off) | (SoftOff, Off) => None,
        (On, _) => Some(("On", On)),
        (Off, _) => Some(("ForceOff", Off)),
        (SoftOff, _) => Some(("GracefulShutdown", Off)),
        // A reboot of a node that is off is a power on.
        (Rebooting, Off) | (SoftRebooting, Off) => Some(("On", On)),
        (Rebooting, _) => Some(("ForceRestart", On)),
        (SoftRebooting, _) => Some(("GracefulRestart", On)),
        (Error, _) => {
            return Err(DriverError::Bmc(
                "cannot set power state \"error\"".to_string(),
            ))
        }
    })
}

async fn reset(ctx: &Ctx, reset_type: &str) -> Result<(), DriverError> {
    let sys = ctx.client.get(&ctx.system).await?;
    let action = &sys["Actions"]["#ComputerSystem.Reset"];
    if let Some(allowed) = action["ResetType@Redfish.AllowableValues"].as_array() {
        if !allowed.iter().any(|v| v.as_str() == Some(reset_type)) {
            return Err(DriverError::Unsupported {
                driver: "redfish".into(),
                operation: format!(
                    "ResetType {reset_type} on {} (the BMC allows {})",
                    ctx.system,
                    Value::Array(allowed.clone())
                ),
            });
        }
    }
    let target = action["target"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| format!("{}/Actions/ComputerSystem.Reset", ctx.system));
    ctx.client
        .post(&target, &json!({"ResetType": reset_type}))
        .await?;
    Ok(())
}

/// Poll until the BMC reports `want` (BMCs apply power changes asynchronously).
async fn wait_power(ctx: &Ctx, want: PowerState, reset_type: &str) -> Result<(), DriverError> {
    let limit = Duration::from_secs(ctx.cfg.power_wait_s.max(1));
    let deadline = Instant::now() + limit;
    loop {
        let now = read_power(ctx).await?;
        if now == want {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(DriverError::Bmc(format!(
                "Redfish BMC at {} still reports \"{now}\" {} s after ResetType {reset_type}; expected \"{want}\"",
                ctx.client.address(),
                limit.as_secs()
            )));
        }
        ctx.pause().await;
    }
}

async fn set_power(ctx: &Ctx, target: PowerState) -> Result<(), DriverError> {
    let current = read_power(ctx).await?;
    let Some((reset_type, want)) = reset_plan(current, target)? else {
        return Ok(());
    };
    if let Err(e) = reset(ctx, reset_type).await {
        // A machine that turned itself off meanwhile (the agent powering off in
        // tear_down_agent races the BMC's ForceOff, which some BMCs then refuse as "not
        // running") is where it was asked to be.
        if want == PowerState::Off && matches!(read_power(ctx).await, Ok(PowerState::Off)) {
            return Ok(());
        }
        return Err(e);
    }
    wait_power(ctx, want, reset_type).await
}

/// Ironic's Redfish boot devices (its `BOOT_DEVICE_MAP`), in its order.
const BOOT_DEVICES: &[(BootDevice, &str)] = &[
    (BootDevice::Pxe, "Pxe"),
    (BootDevice::Disk, "Hdd"),
    (BootDevice::Cdrom, "Cd"),
    (BootDevice::Bios, "BiosSetup"),
    (BootDevice::UefiHttp, "UefiHttp"),
];

/// What the API may ask for: [`BOOT_DEVICES`] without their Redfish names.
const SUPPORTED_BOOT_DEVICES: &[BootDevice] = &[
    BootDevice::Pxe,
    BootDevice::Disk,
    BootDevice::Cdrom,
    BootDevice::Bios,
    BootDevice::UefiHttp,
];

fn boot_target(device: BootDevice) -> Option<&'static str> {
    BOOT_DEVICES
        .iter()
        .find(|(d, _)| *d == device)
        .map(|(_, t)| *t)
}

/// `Boot.BootSourceOverrideTarget` / `BootSourceOverrideEnabled` → ours; what Ironic does
/// not map (`None`, `Disabled`, vendor targets) reads as unknown.
fn boot_from_redfish(boot: &Value) -> super::BootDeviceState {
    let target = boot["BootSourceOverrideTarget"].as_str();
    super::BootDeviceState {
        boot_device: BOOT_DEVICES
            .iter()
            .find(|(_, t)| Some(*t) == target)
            .map(|(d, _)| *d),
        persistent: match boot["BootSourceOverrideEnabled"].as_str() {
            Some("Continuous") => Some(true),
            Some("Once") => Some(false),
            _ => None,
        },
    }
}

/// `BootSourceOverrideMode`'s value for a boot mode.
fn redfish_mode(mode: super::BootMode) -> &'static str {
    match mode {
        super::BootMode::Uefi => "UEFI",
        super::BootMode::Bios => "Legacy",
    }
}

/// The boot override PATCH. It names the mode (the one passed in, else the older
/// `driver_info.boot_mode`) when the BMC reports another one or none: a BMC given a target
/// alone may fall back to its default mode. A mode the BMC already has is left out, as
/// Ironic's minimal override does: some BMCs treat any `BootSourceOverrideMode` as a mode
/// change and rebuild the firmware settings (sushy-tools' libvirt driver turns Secure Boot
/// off with it).
async fn set_boot(
    ctx: &Ctx,
    device: BootDevice,
    persistent: bool,
    mode: Option<super::BootMode>,
) -> Result<(), DriverError> {
    let target = boot_target(device).ok_or_else(|| DriverError::Unsupported {
        driver: "redfish".into(),
        operation: format!("boot device {}", device.as_str()),
    })?;
    let mut boot = json!({
        "BootSourceOverrideTarget": target,
        "BootSourceOverrideEnabled": if persistent { "Continuous" } else { "Once" },
    });
    let mode = mode
        .map(redfish_mode)
        .or(ctx.info.boot_mode.map(|m| m.redfish()));
    if let Some(mode) = mode {
        let current = match ctx.client.get(&ctx.system).await {
            Ok(sys) => sys["Boot"]["BootSourceOverrideMode"]
                .as_str()
                .map(str::to_string),
            Err(_) => None,
        };
        if current.as_deref() != Some(mode) {
            boot["BootSourceOverrideMode"] = mode.into();
        }
    }
    ctx.client
        .patch(&ctx.system, &json!({ "Boot": boot }))
        .await?;
    Ok(())
}

/// An out-of-band step, its arguments checked.
enum Run {
    Apply(Vec<(String, Value)>),
    FactoryReset,
    Firmware(Vec<firmware::Image>),
}

/// The out-of-band steps this driver offers: BIOS and firmware, manual only.
pub fn redfish_steps() -> Vec<StepDescriptor> {
    vec![
        bios::apply_configuration_descriptor(),
        bios::factory_reset_descriptor(),
        firmware::update_descriptor(),
    ]
}

#[async_trait]
impl Bmc for RedfishBmc {
    fn validate(&self, driver_info: &Map<String, Value>) -> Result<(), DriverError> {
        info::parse(driver_info).map(|_| ())
    }

    async fn get_power(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
    ) -> Result<PowerState, DriverError> {
        tracing::debug!(node = %node, "redfish: reading power state");
        let ctx = self.ctx(driver_info).await?;
        ctx.scrub(read_power(&ctx).instrument(span(node)).await)
    }

    async fn get_power_and_health(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
    ) -> Result<(PowerState, Option<Health>), DriverError> {
        tracing::debug!(node = %node, "redfish: reading power state and health");
        let ctx = self.ctx(driver_info).await?;
        ctx.scrub(read_power_and_health(&ctx).instrument(span(node)).await)
    }

    async fn set_power(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
        target: PowerState,
    ) -> Result<(), DriverError> {
        tracing::info!(node = %node, target = %target, "redfish: setting power");
        let ctx = self.ctx(driver_info).await?;
        ctx.scrub(set_power(&ctx, target).instrument(span(node)).await)
    }

    async fn set_boot_device(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
        device: BootDevice,
        mode: Option<super::BootMode>,
    ) -> Result<(), DriverError> {
        tracing::info!(node = %node, device = device.as_str(), "redfish: one-time boot override");
        let ctx = self.ctx(driver_info).await?;
        ctx.scrub(
            set_boot(&ctx, device, false, mode)
                .instrument(span(node))
                .await,
        )
    }

    async fn set_boot_device_persistent(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
        device: BootDevice,
        mode: Option<super::BootMode>,
    ) -> Result<(), DriverError> {
        tracing::info!(node = %node, device = device.as_str(), "redfish: persistent boot device");
        let ctx = self.ctx(driver_info).await?;
        ctx.scrub(
            set_boot(&ctx, device, true, mode)
                .instrument(span(node))
                .await,
        )
    }

    fn supported_boot_devices(&self) -> &'static [BootDevice] {
        SUPPORTED_BOOT_DEVICES
    }

    async fn get_boot_device(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
    ) -> Result<super::BootDeviceState, DriverError> {
        tracing::debug!(node = %node, "redfish: reading the boot device");
        let ctx = self.ctx(driver_info).await?;
        let sys = ctx.scrub(ctx.client.get(&ctx.system).instrument(span(node)).await)?;
        Ok(boot_from_redfish(&sys["Boot"]))
    }

    async fn steps(&self, _node: &str, _driver_info: &Map<String, Value>) -> Vec<StepDescriptor> {
        redfish_steps()
    }

    async fn execute_step(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
        step: &StepDescriptor,
        args: &Map<String, Value>,
    ) -> Result<Value, DriverError> {
        let name = format!("{}.{}", step.interface, step.step);
        tracing::info!(node = %node, step = %name, "redfish: running out-of-band step");
        // Arguments are checked before the BMC is contacted.
        let run = match name.as_str() {
            "bios.apply_configuration" => Run::Apply(bios::parse_settings(args)?),
            "bios.factory_reset" => Run::FactoryReset,
            "firmware.update" => Run::Firmware(firmware::parse_images(args)?),
            _ => {
                return Err(DriverError::Unsupported {
                    driver: "redfish".into(),
                    operation: format!("out-of-band step {name}"),
                })
            }
        };
        let ctx = self.ctx(driver_info).await?;
        let result = async {
            match run {
                Run::Apply(settings) => bios::apply(&ctx, settings).await,
                Run::FactoryReset => bios::factory_reset(&ctx).await,
                Run::Firmware(images) => firmware::update(&ctx, node, &images).await,
            }
        }
        .instrument(span(node))
        .await;
        ctx.scrub(result)
    }

    async fn verify_step(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
        step: &StepDescriptor,
        args: &Map<String, Value>,
        result: &Value,
    ) -> Result<(), DriverError> {
        if (step.interface.as_str(), step.step.as_str()) != ("bios", "apply_configuration")
            || result["reboot_required"] == false
        {
            return Ok(());
        }
        let wanted = bios::parse_settings(args)?;
        let ctx = self.ctx(driver_info).await?;
        let result = bios::verify(&ctx, node, &wanted)
            .instrument(span(node))
            .await;
        ctx.scrub(result)
    }

    async fn insert_virtual_media(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
        url: &str,
    ) -> Result<(), DriverError> {
        tracing::info!(node = %node, "redfish: inserting virtual media");
        let ctx = self.ctx(driver_info).await?;
        ctx.scrub(media::insert(&ctx, url).instrument(span(node)).await)
    }

    async fn eject_virtual_media(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
    ) -> Result<(), DriverError> {
        tracing::info!(node = %node, "redfish: ejecting virtual media");
        let ctx = self.ctx(driver_info).await?;
        ctx.scrub(media::eject(&ctx).instrument(span(node)).await)
    }

    async fn get_virtual_media(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
    ) -> Result<Vec<super::VirtualMedia>, DriverError> {
        tracing::debug!(node = %node, "redfish: reading virtual media");
        let ctx = self.ctx(driver_info).await?;
        ctx.scrub(media::list(&ctx).instrument(span(node)).await)
    }

    async fn inspect(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
    ) -> Result<OobInventory, DriverError> {
        tracing::info!(node = %node, "redfish: out-of-band inspection");
        let ctx = self.ctx(driver_info).await?;
        ctx.scrub(inspect::inspect(&ctx).instrument(span(node)).await)
    }

    async fn bios_settings(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
    ) -> Result<Vec<super::management::BiosReading>, DriverError> {
        let ctx = self.ctx(driver_info).await?;
        ctx.scrub(management::bios_settings(&ctx).instrument(span(node)).await)
    }

    async fn firmware_versions(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
    ) -> Result<Vec<rivet_model::records::FirmwareReading>, DriverError> {
        let ctx = self.ctx(driver_info).await?;
        ctx.scrub(
            management::firmware_versions(&ctx)
                .instrument(span(node))
                .await,
        )
    }

    async fn inject_nmi(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
    ) -> Result<(), DriverError> {
        tracing::info!(node = %node, "redfish: injecting an NMI");
        let ctx = self.ctx(driver_info).await?;
        ctx.scrub(management::inject_nmi(&ctx).instrument(span(node)).await)
    }

    async fn indicators(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
    ) -> Result<Vec<super::management::Indicator>, DriverError> {
        let ctx = self.ctx(driver_info).await?;
        ctx.scrub(management::indicators(&ctx).instrument(span(node)).await)
    }

    async fn indicator_state(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
        component: &str,
        name: &str,
    ) -> Result<String, DriverError> {
        let ctx = self.ctx(driver_info).await?;
        let r = management::indicator_state(&ctx, component, name);
        ctx.scrub(r.instrument(span(node)).await)
    }

    async fn set_indicator_state(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
        component: &str,
        name: &str,
        state: &str,
    ) -> Result<(), DriverError> {
        let ctx = self.ctx(driver_info).await?;
        let r = management::set_indicator_state(&ctx, component, name, state);
        ctx.scrub(r.instrument(span(node)).await)
    }

    async fn boot_mode(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
    ) -> Result<(Option<String>, Option<bool>), DriverError> {
        let ctx = self.ctx(driver_info).await?;
        ctx.scrub(management::boot_mode(&ctx).instrument(span(node)).await)
    }

    async fn set_boot_mode(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
        mode: &str,
    ) -> Result<(), DriverError> {
        let ctx = self.ctx(driver_info).await?;
        ctx.scrub(
            management::set_boot_mode(&ctx, mode)
                .instrument(span(node))
                .await,
        )
    }

    async fn set_secure_boot(
        &self,
        node: &str,
        driver_info: &Map<String, Value>,
        on: bool,
    ) -> Result<(), DriverError> {
        let ctx = self.ctx(driver_info).await?;
        ctx.scrub(
            management::set_secure_boot(&ctx, on)
                .instrument(span(node))
                .await,
        )
    }
}

impl RedfishBmc {
    /// The BIOS attributes the BMC reports now (`Bios.Attributes`).
    pub async fn bios_attributes(
        &self,
        driver_info: &Map<String, Value>,
    ) -> Result<Map<String, Value>, DriverError> {
        let ctx = self.ctx(driver_info).await?;
        ctx.scrub(bios::attributes(&ctx).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_plans() {
        use PowerState::*;
        let plan = |c, t| reset_plan(c, t).expect("plan");
        assert_eq!(plan(Off, On), Some(("On", On)));
        assert_eq!(plan(On, On), None);
        assert_eq!(plan(On, Off), Some(("ForceOff", Off)));
        assert_eq!(plan(On, SoftOff), Some(("GracefulShutdown", Off)));
        assert_eq!(plan(On, Rebooting), Some(("ForceRestart", On)));
        assert_eq!(plan(Off, Rebooting), Some(("On", On)));
        assert_eq!(plan(On, SoftRebooting), Some(("GracefulRestart", On)));
        assert!(reset_plan(On, Error).is_err());
    }

    #[test]
    fn boot_device_names() {
        let state = |target: &str, enabled: &str| {
            boot_from_redfish(
                &json!({"BootSourceOverrideTarget": target, "BootSourceOverrideEnabled": enabled}),
            )
        };
        let s = state("Cd", "Continuous");
        assert_eq!(
            (s.boot_device, s.persistent),
            (Some(BootDevice::Cdrom), Some(true))
        );
        let s = state("Hdd", "Once");
        assert_eq!(
            (s.boot_device, s.persistent),
            (Some(BootDevice::Disk), Some(false))
        );
        let s = state("None", "Disabled");
        assert_eq!((s.boot_device, s.persistent), (None, None));
        assert_eq!(boot_target(BootDevice::Bios), Some("BiosSetup"));
        assert_eq!(boot_target(BootDevice::Safe), None);
        for d in SUPPORTED_BOOT_DEVICES {
            let t = boot_target(*d).expect("a target");
            assert_eq!(state(t, "Once").boot_device, Some(*d));
        }
    }

    #[test]
    fn power_names() {
        assert_eq!(power_from_redfish("On"), Some(PowerState::On));
        assert_eq!(power_from_redfish("PoweringOff"), Some(PowerState::Off));
        assert_eq!(power_from_redfish("Paused"), None);
    }

    #[test]
    fn steps_are_manual_and_firmware_is_not_abortable() {
        let steps = redfish_steps();
        assert!(steps.iter().all(|s| s.priority == 0 && !s.requires_ramdisk));
        let fw = steps
            .iter()
            .find(|s| s.interface == "firmware" && s.step == "update")
            .expect("firmware.update");
        assert!(!fw.abortable);
        let bios = steps
            .iter()
            .find(|s| s.step == "apply_configuration")
            .expect("bios.apply_configuration");
        assert!(bios.argsinfo["settings"].required);
    }
}
