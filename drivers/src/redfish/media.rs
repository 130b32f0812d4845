//! Virtual media over Redfish: find the CD/DVD device (under the ComputerSystem, as sushy
//! serves it, or under its Managers, as most BMCs do), insert an ISO by URL, eject.

use super::{members, Ctx};
use crate::DriverError;
use serde_json::{json, Value};

/// VirtualMedia collections of the system: its own, then its managers'.
async fn collections(ctx: &Ctx) -> Result<Vec<String>, DriverError> {
    let sys = ctx.client.get(&ctx.system).await?;
    let mut out: Vec<String> = sys["VirtualMedia"]["@odata.id"]
        .as_str()
        .map(str::to_string)
        .into_iter()
        .collect();
    let managers = sys["Links"]["ManagedBy"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for m in managers {
        let Some(path) = m["@odata.id"].as_str() else {
            continue;
        };
        let manager = ctx.client.get(path).await?;
        if let Some(vm) = manager["VirtualMedia"]["@odata.id"].as_str() {
            out.push(vm.to_string());
        }
    }
    Ok(out)
}

fn is_cd(device: &Value) -> bool {
    device["MediaTypes"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| matches!(t.as_str(), Some("CD") | Some("DVD")))
}

/// Every CD/DVD virtual media device: (path, resource).
async fn cd_devices(ctx: &Ctx) -> Result<Vec<(String, Value)>, DriverError> {
    let mut out = Vec::new();
    for coll in collections(ctx).await? {
        let list = ctx.client.get(&coll).await?;
        for path in members(&list) {
            let dev = ctx.client.get(&path).await?;
            if is_cd(&dev) {
                out.push((path, dev));
            }
        }
        if !out.is_empty() {
            break;
        }
    }
    Ok(out)
}

fn action_target(path: &str, dev: &Value, action: &str) -> String {
    dev["Actions"][format!("#VirtualMedia.{action}")]["target"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| format!("{path}/Actions/VirtualMedia.{action}"))
}

fn inserted(dev: &Value) -> bool {
    dev["Inserted"].as_bool().unwrap_or(false)
        || dev["Image"].as_str().is_some_and(|i| !i.is_empty())
}

/// Insert `url` into the first CD/DVD device (ejecting what is there first).
pub(crate) async fn insert(ctx: &Ctx, url: &str) -> Result<(), DriverError> {
    let ok = reqwest::Url::parse(url)
        .map(|u| matches!(u.scheme(), "http" | "https"))
        .unwrap_or(false);
    if !ok {
        return Err(DriverError::Bmc(format!(
            "virtual media image {url:?} is not an http(s) URL"
        )));
    }
    let devices = cd_devices(ctx).await?;
    let Some((path, dev)) = devices.first() else {
        return Err(DriverError::Unsupported {
            driver: "redfish".into(),
            operation: format!(
                "virtual media: {} at {} has no CD/DVD virtual media device",
                ctx.system,
                ctx.client.address()
            ),
        });
    };
    if inserted(dev) {
        ctx.client
            .post(&action_target(path, dev, "EjectMedia"), &json!({}))
            .await?;
    }
    let body = json!({"Image": url, "Inserted": true, "WriteProtected": true});
    ctx.client
        .post(&action_target(path, dev, "InsertMedia"), &body)
        .await?;
    Ok(())
}

/// Eject every inserted CD/DVD image (nothing inserted is fine).
pub(crate) async fn eject(ctx: &Ctx) -> Result<(), DriverError> {
    for (path, dev) in cd_devices(ctx).await? {
        if inserted(&dev) {
            ctx.client
                .post(&action_target(&path, &dev, "EjectMedia"), &json!({}))
                .await?;
        }
    }
    Ok(())
}

/// Every virtual media device of the first collection that has any (the system's, else its
/// managers'), as Ironic's `get_virtual_media` reports them.
pub(crate) async fn list(ctx: &Ctx) -> Result<Vec<crate::VirtualMedia>, DriverError> {
    for coll in collections(ctx).await? {
        let list = ctx.client.get(&coll).await?;
        let paths = members(&list);
        if paths.is_empty() {
            continue;
        }
        let mut out = Vec::with_capacity(paths.len());
        for path in paths {
            let dev = ctx.client.get(&path).await?;
            out.push(crate::VirtualMedia {
                media_types: dev["MediaTypes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|t| t.as_str().map(str::to_string))
                    .collect(),
                inserted: dev["Inserted"].as_bool(),
                image: dev["Image"].as_str().map(str::to_string),
            });
        }
        return Ok(out);
    }
    Ok(Vec::new())
}
