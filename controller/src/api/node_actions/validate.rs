//! `GET /v1/nodes/{node}/validate` (every microversion): each driver interface but vendor as
//! `{"result": bool, "reason": …}`, as Ironic's `validate_driver_interfaces` reports them. The
//! boot and deploy verdicts check what a deploy would need: PXE ports and boot artefacts or the
//! virtual-media ISO, the image fields and the root device hints.

use crate::api::port_common::ports_of;
use crate::api::{ApiResult, AppState};
use axum::extract::{Path, State};
use axum::Json;
use rivet_model::interfaces::Iface;
use rivet_model::node::Node;
use rivet_store::NodeExt;
use serde_json::{json, Map, Value};

/// One interface's verdict: `Ok` shows `{"result": true}`, `Err` `{"result": false,
/// "reason": …}` (Ironic's conductor gives a reason only with a failure).
type Verdict = Result<(), String>;

fn verdict(v: &Verdict) -> Value {
    match v {
        Ok(()) => json!({ "result": true }),
        Err(reason) => json!({ "result": false, "reason": reason }),
    }
}

/// `GET /v1/nodes/{node}/validate`: every interface but vendor, as Ironic's
/// `validate_driver_interfaces` reports them at every microversion.
pub(super) async fn validate(
    State(state): State<AppState>,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
    let node = state.conductor.store.get_node(&ident).await?;
    node.writable()?;
    let bmc = state.conductor.bmc(&node).map_err(|e| e.to_string());
    let driver_info: Verdict = match &bmc {
        Ok(b) => b.validate(&node.driver_info).map_err(|e| e.to_string()),
        Err(e) => Err(e.clone()),
    };
    let unsupported = |iface: &str| -> Verdict {
        Err(format!(
            "Driver {} does not support {iface} (disabled or not implemented).",
            node.driver
        ))
    };
    // The rest of an interface: `no-*` fails, `noop`/`fake` pass, the driver's own
    // implementation (redfish, ipmitool) needs its driver_info.
    let generic = |iface: &str, value: &str| -> Verdict {
        match value {
            v if v.starts_with("no-") => unsupported(iface),
            "noop" | "fake" => Ok(()),
            _ => driver_info.clone(),
        }
    };
    let get = |i: Iface| node.interfaces.get(&node.driver, i);
    let boot = boot_verdict(&state, &node, &driver_info).await;
    let deploy = match get(Iface::Deploy).as_str() {
        "fake" => Ok(()),
        // The agent's deploy boots the ramdisk through the boot interface first.
        "direct" => boot.clone().and_then(|()| image_verdict(&node)),
        _ => unsupported("deploy"),
    };
    let inspect_iface = node.inspect_interface.as_deref().unwrap_or("agent");
    let inspect = match inspect_iface {
        "agent" => boot.clone(),
        "redfish" if node.driver != "redfish" => unsupported("out-of-band inspection"),
        v => generic("inspect", v),
    };
    let mut out = Map::new();
    out.insert("boot".into(), verdict(&boot));
    out.insert("deploy".into(), verdict(&deploy));
    out.insert("management".into(), verdict(&driver_info));
    out.insert(
        "network".into(),
        verdict(&generic("network", &get(Iface::Network))),
    );
    out.insert("power".into(), verdict(&driver_info));
    for iface in [
        Iface::Bios,
        Iface::Console,
        Iface::Firmware,
        Iface::Raid,
        Iface::Rescue,
        Iface::Storage,
    ] {
        out.insert(
            iface.as_str().into(),
            verdict(&generic(iface.as_str(), &get(iface))),
        );
    }
    if matches!(get(Iface::Raid).as_str(), "agent" | "fake") {
        // Ironic's agent (and fake) RAID interface validates as RAIDInterface.validate does: the stored
        // target configuration, if there is one, against the RAID schema (no driver_info, no
        // boot: its steps run in whatever ramdisk cleaning or deploy boots).
        let target = state
            .conductor
            .store
            .node_management(&node.uuid)
            .await?
            .target_raid_config;
        out.insert(
            "raid".into(),
            verdict(&rivet_model::raid::validate_target(&target)),
        );
    }
    if get(Iface::Rescue) == "agent" {
        // The agent rescue interface boots the ramdisk through the boot interface.
        out.insert("rescue".into(), verdict(&boot));
    }
    out.insert("inspect".into(), verdict(&inspect));
    Ok(Json(Value::Object(out)))
}

/// Whether the boot interface has what it needs to boot the ramdisk.
async fn boot_verdict(state: &AppState, node: &Node, driver_info: &Verdict) -> Verdict {
    let boot = &state.conductor.config.boot;
    match node.interfaces.get(&node.driver, Iface::Boot).as_str() {
        "fake" => Ok(()),
        "ipxe" | "pxe" => {
            let ports = ports_of(state, Some(&node.uuid), None)
                .await
                .map_err(|e| e.to_string())?;
            if !ports.iter().any(|p| p.pxe_enabled) {
                return Err(format!(
                    "Node {} does not have any port associated with it",
                    node.uuid
                ));
            }
            let dir = boot.artefact_dir.as_deref().ok_or_else(|| {
                "rivetd has no [boot] artefact_dir, so it has no kernel and ramdisk to network-boot; set it to image-build's output directory".to_string()
            })?;
            for file in ["vmlinuz", "rivet.initramfs"] {
                let path = dir.join(file);
                // One stat per file: cheap enough for the async thread.
                std::fs::metadata(&path).map_err(|e| {
                    format!("cannot read the boot artefact {}: {e}", path.display())
                })?;
            }
            Ok(())
        }
        rivet_conductor::boot::VIRTUAL_MEDIA => {
            driver_info.clone()?;
            let (boot, uuid) = (boot.clone(), node.uuid.clone());
            // Reads the ISO the first time (tens of MiB): off the async threads.
            tokio::task::spawn_blocking(move || rivet_support::bootiso::check(&boot, &uuid))
                .await
                .map_err(|e| e.to_string())?
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
        _ => Err(format!(
            "Driver {} does not support boot (disabled or not implemented).",
            node.driver
        )),
    }
}

/// The image fields a `direct` deploy needs — the conductor's own check, so validate and
/// deploy can never disagree — and the root device hints. A missing image_source is told in
/// Ironic's words, which clients and operators grep for.
fn image_verdict(node: &Node) -> Verdict {
    let missing = node
        .instance_info
        .get("image_source")
        .and_then(Value::as_str)
        .is_none_or(|v| v.trim().is_empty());
    if missing {
        return Err(format!(
            "Node {} failed to validate deploy image info. Some parameters were missing. Missing are: ['instance_info.image_source']",
            node.uuid
        ));
    }
    rivet_conductor::check_image_info(node)?;
    match node.properties.get("root_device") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Object(hints)) => rivet_protocol::hints::validate(hints)
            .map_err(|e| format!("node {}: properties.root_device: {e}", node.ident())),
        Some(other) => Err(format!(
            "node {}: properties.root_device must be an object of root device hints, not {other}",
            node.ident()
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn image_verdicts() {
        let mut n = Node::new("u-1".into(), "fake-hardware".into());
        assert!(image_verdict(&n)
            .unwrap_err()
            .contains("Missing are: ['instance_info.image_source']"));
        n.instance_info
            .insert("image_source".into(), json!("http://h/i.raw"));
        assert!(image_verdict(&n).unwrap_err().contains("no image checksum"));
        n.instance_info
            .insert("image_os_hash_algo".into(), json!("sha256"));
        assert!(image_verdict(&n)
            .unwrap_err()
            .contains("image_os_hash_value"));
        // What deploy refuses, validate refuses too (an MD5 digest).
        let mut md5 = Node::new("u-2".into(), "fake-hardware".into());
        md5.instance_info
            .insert("image_source".into(), json!("http://h/i.raw"));
        md5.instance_info
            .insert("image_checksum".into(), json!("ab".repeat(16)));
        assert!(image_verdict(&md5).unwrap_err().contains("MD5"));
        n.instance_info
            .insert("image_os_hash_value".into(), json!("ab".repeat(32)));
        assert_eq!(image_verdict(&n), Ok(()));
        n.properties
            .insert("root_device".into(), json!({"colour": "blue"}));
        assert!(image_verdict(&n).unwrap_err().contains("root_device"));
    }
}
