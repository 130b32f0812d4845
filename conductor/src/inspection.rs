//! The inspection engine: in-band (boot the ramdisk, collect the agent's inventory) or
//! out-of-band (ask the BMC), then derive properties and ports and apply the rules.
//!
//! Level-triggered like cleaning: each call makes one decision from the node's inspection
//! run ([`rivet_model::runs::InspectRun`]) and writes it before acting.

use super::{Conductor, ConductorError};
use chrono::Utc;
use rivet_drivers::{Bmc, OobInventory};
use rivet_model::fsm::Event;
use rivet_model::inspection::derive;
use rivet_model::node::Node;
use rivet_model::port::Port;
use rivet_protocol::agent::{Command, CommandKind, CommandStatus};
use rivet_protocol::inventory::Inventory;
use rivet_protocol::states::ProvisionState;
use rivet_store::{PortQuery, StoreError};
use serde_json::{json, Map, Value};

/// Forget the bookkeeping of an inspection run.
pub(crate) fn clear_run(node: &mut Node) {
    node.runs.inspect = None;
}

impl Conductor {
    /// One decision of an inspection run.
    pub(crate) async fn advance_inspection(
        &self,
        mut node: Node,
        bmc: &dyn Bmc,
    ) -> Result<Option<Node>, ConductorError> {
        let uuid = node.uuid.clone();
        let interface = node
            .inspect_interface
            .clone()
            .unwrap_or_else(|| "agent".into());
        if interface == "no-inspect" {
            let msg = format!("node {} has inspect_interface \"no-inspect\"; set it to agent or the driver's name", node.ident());
            return self.fail(node, &msg).await.map(Some);
        }
        if interface != "agent" {
            node.inspection_started_at.get_or_insert_with(Utc::now);
            tracing::info!(node = %uuid, interface, "out-of-band inspection");
            return match bmc.inspect(&uuid, &node.driver_info).await {
                Ok(oob) => self
                    .finish_inspection(node, bmc, oob_inventory(&oob), false)
                    .await
                    .map(Some),
                Err(e) => {
                    let msg = format!(
                        "out-of-band inspection of node {} failed: {e}",
                        node.ident()
                    );
                    self.fail(node, &msg).await.map(Some)
                }
            };
        }

        if !node.runs.inspect.as_ref().is_some_and(|r| r.booted) {
            if self.fast_track_start(&node, "inspection").await {
                // The running ramdisk is this run's: ask it for the inventory at once.
                node.inspection_started_at = Some(Utc::now());
                node.runs.inspect = Some(rivet_model::runs::InspectRun {
                    booted: true,
                    command: None,
                });
                return Ok(Some(self.update_node(&node).await?));
            }
            if let Err(e) = self.boot_ramdisk(&mut node, bmc).await {
                let msg = format!(
                    "failed to boot the inspection ramdisk on node {}: {e}",
                    node.ident()
                );
                return self.fail(node, &msg).await.map(Some);
            }
            node.inspection_started_at = Some(Utc::now());
            node.runs.inspect = Some(rivet_model::runs::InspectRun {
                booted: true,
                command: None,
            });
            tracing::info!(node = %uuid, "inspection ramdisk booting; waiting for the agent");
            return self
                .ensure_state(node, ProvisionState::InspectWait)
                .await
                .map(Some);
        }
        if !node.runs.has_agent() {
            return self
                .ensure_state(node, ProvisionState::InspectWait)
                .await
                .map(|_| None);
        }
        let Some(id) = node.runs.inspect.as_ref().and_then(|r| r.command.clone()) else {
            let id = uuid::Uuid::new_v4().to_string();
            node.runs
                .inspect
                .get_or_insert_with(Default::default)
                .command = Some(id.clone());
            let node = self.ensure_state(node, ProvisionState::InspectWait).await?;
            match self
                .store
                .enqueue_command(
                    &uuid,
                    &Command {
                        id,
                        kind: CommandKind::GetInventory,
                    },
                )
                .await
            {
                Ok(()) | Err(StoreError::Duplicate(_)) => {}
                Err(e) => return Err(e.into()),
            }
            self.wake_agent(&uuid);
            return Ok(Some(node));
        };
        let result = match self.store.command(&uuid, &id).await {
            Ok(c) => c.result,
            Err(StoreError::NotFound { .. }) => {
                // Written on the node but not queued (a crash in between): queue it now.
                self.store
                    .enqueue_command(
                        &uuid,
                        &Command {
                            id,
                            kind: CommandKind::GetInventory,
                        },
                    )
                    .await?;
                self.wake_agent(&uuid);
                None
            }
            Err(e) => return Err(e.into()),
        };
        let Some(result) = result else {
            return Ok(None);
        };
        if result.status != CommandStatus::Succeeded {
            let msg = format!(
                "the agent on node {} could not collect its inventory: {}",
                node.ident(),
                result.error.unwrap_or_default()
            );
            return self.fail(node, &msg).await.map(Some);
        }
        let inventory = result
            .result
            .get("inventory")
            .cloned()
            .map(serde_json::from_value::<Inventory>);
        let inventory = match inventory {
            Some(Ok(inv)) => inv,
            _ => {
                let msg = format!(
                    "the agent on node {} sent an unreadable inventory",
                    node.ident()
                );
                return self.fail(node, &msg).await.map(Some);
            }
        };
        let node = self.ensure_state(node, ProvisionState::Inspecting).await?;
        self.finish_inspection(node, bmc, inventory, true)
            .await
            .map(Some)
    }

    /// Derive properties and ports, apply the rules, power off (unless fast track leaves the
    /// ramdisk running), and rest in manageable.
    async fn finish_inspection(
        &self,
        mut node: Node,
        bmc: &dyn Bmc,
        inv: Inventory,
        in_band: bool,
    ) -> Result<Node, ConductorError> {
        let hints = node
            .properties
            .get("root_device")
            .and_then(Value::as_object)
            .cloned();
        let derived = match derive::derive(&inv, hints.as_ref()) {
            Ok(d) => d,
            Err(e) => {
                let msg = format!("inspection of node {} failed: {e}", node.ident());
                return self.fail(node, &msg).await;
            }
        };
        let p = &mut node.properties;
        if derived.cpus > 0 {
            p.insert("cpus".into(), json!(derived.cpus));
        }
        if !derived.cpu_arch.is_empty() {
            p.insert("cpu_arch".into(), json!(derived.cpu_arch));
        }
        if derived.memory_mb > 0 {
            p.insert("memory_mb".into(), json!(derived.memory_mb));
        }
        if in_band {
            p.insert("local_gb".into(), json!(derived.local_gb));
            derive::set_capability(p, "boot_mode", &derived.boot_mode);
        }
        let template = &self.config.inspection.resource_class_template;
        // Only from a complete picture: "bm-0-0-" would be worse than no class at all.
        let complete = derived.cpus > 0 && derived.memory_mb > 0 && !derived.cpu_arch.is_empty();
        if node.resource_class.is_none() && !template.is_empty() && complete {
            node.resource_class = Some(derive::resource_class(template, &derived));
        }

        // Ports first, so rules can change them; rules see the inventory and the node as it
        // stands now.
        self.sync_ports(&node, &derived.ports).await?;
        let inv_doc = serde_json::to_value(&inv).unwrap_or(Value::Null);
        if let Err(msg) = self.apply_inspection_rules(&mut node, &inv_doc).await? {
            return self.fail(node, &msg).await;
        }
        if in_band && self.fast_track_keep_running(&node, "inspection").await {
            // Fast track: no power action (Ironic's inspection tear-down skips it); the boot
            // medium is still put away, the ramdisk runs from memory.
            self.clean_up_ramdisk_logged(&node, bmc).await;
        } else if in_band {
            if let Err(msg) = self.end_ramdisk(&mut node, bmc, "inspection").await {
                return self.fail(node, &msg).await;
            }
        }
        node.inspection_finished_at = Some(Utc::now());
        clear_run(&mut node);
        tracing::info!(node = %node.uuid, cpus = derived.cpus, memory_mb = derived.memory_mb, local_gb = derived.local_gb, "inspection finished");
        crate::bmc_caches::refresh_caches_logged(
            self.store.as_ref(),
            bmc,
            &node.uuid,
            &node.driver_info,
        )
        .await;
        self.event(node, Event::Done, None).await
    }

    /// A port per NIC: create missing ones, update `pxe_enabled` on the booting one. A MAC
    /// that belongs to another node is left alone (logged).
    async fn sync_ports(&self, node: &Node, nics: &[(String, bool)]) -> Result<(), ConductorError> {
        let mine = self
            .store
            .list_ports(&PortQuery {
                node_uuid: Some(node.uuid.clone()),
                ..Default::default()
            })
            .await?;
        let any_pxe = nics.iter().any(|(_, pxe)| *pxe);
        for (mac, pxe) in nics {
            if let Some(p) = mine.iter().find(|p| &p.address == mac) {
                if any_pxe && p.pxe_enabled != *pxe {
                    let mut p = p.clone();
                    p.pxe_enabled = *pxe;
                    self.store.update_port(&p).await?;
                }
                continue;
            }
            let port = Port {
                uuid: uuid::Uuid::new_v4().to_string(),
                node_uuid: node.uuid.clone(),
                address: mac.clone(),
                pxe_enabled: *pxe,
                extra: Map::new(),
                created_at: Utc::now(),
                updated_at: None,
                version: 0,
                attrs: Default::default(),
            };
            match self.store.create_port(&port).await {
                Ok(_) => {
                    tracing::info!(node = %node.uuid, mac = %mac, pxe = *pxe, "port created by inspection")
                }
                Err(StoreError::Duplicate(_)) => {
                    tracing::warn!(node = %node.uuid, mac = %mac, "MAC already belongs to another node's port; not added")
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

/// What the BMC knows, in inventory shape (no disks: local_gb stays as it was).
fn oob_inventory(oob: &OobInventory) -> Inventory {
    let mut inv = Inventory::default();
    inv.cpu.count = oob.cpus.unwrap_or(0).min(u64::from(u32::MAX)) as u32;
    inv.cpu.architecture = oob.cpu_arch.clone().unwrap_or_default();
    inv.memory.physical_mb = oob.memory_mb.unwrap_or(0);
    inv.interfaces = oob
        .macs
        .iter()
        .enumerate()
        .map(|(i, m)| rivet_protocol::inventory::Interface {
            name: format!("nic{i}"),
            mac_address: m.clone(),
            ..Default::default()
        })
        .collect();
    inv
}
