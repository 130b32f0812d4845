//! Discovery: enrol a node for a ramdisk whose lookup matched nothing (`[discovery]`, off by
//! default). The node is created in `enroll` with the configured driver, a port per MAC,
//! the inventory stored, properties derived from it as inspection does, and the inspection
//! rules applied (so a rule can set `driver` and `driver_info` from `bmc_address`).
//!
//! Discovered nodes are marked `driver_internal_info.auto_discovered = true` (Ironic puts the
//! same flag in the plugin data of discovered nodes) with `discovered_at`.
//!
//! A machine whose MACs already belong to a node gets that node back, and the configured end
//! only while the node is a discovered one still in `enroll`; any other node's machine is
//! told to wait, never powered off (`end_for_known`).
//!
//! The same machine never gets two nodes: port addresses are unique in the store, so of two
//! concurrent discoveries of one MAC only one creates its ports; the other removes the node it
//! had just created and answers with the winner's.

pub use rivet_model::config::DiscoveryConfig;

use super::Conductor;
use chrono::Utc;
use rivet_model::inspection::derive;
use rivet_model::port::Port;
use rivet_protocol::discovery::{DiscoverRequest, DiscoverResponse, DiscoveryEnd};
use rivet_protocol::states::ProvisionState;
use rivet_store::{PortQuery, StoreError};
use serde_json::{json, Map, Value};

/// Why a discovery was refused.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// `[discovery] enabled = false`.
    #[error("discovery is disabled on this controller; set [discovery] enabled = true in rivetd's configuration, or enrol the node with its MACs")]
    Disabled,
    /// The inventory cannot identify a machine.
    #[error("{0}")]
    BadRequest(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The usable MACs of an inventory, lower case, each once.
pub fn macs_of(req: &DiscoverRequest) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for i in &req.inventory.interfaces {
        let m = i.mac_address.trim().to_ascii_lowercase();
        let valid = m.len() == 17
            && m.split(':').count() == 6
            && m.split(':')
                .all(|b| b.len() == 2 && b.chars().all(|c| c.is_ascii_hexdigit()))
            && m != "00:00:00:00:00:00"
            && m != "ff:ff:ff:ff:ff:ff";
        if valid && !out.contains(&m) {
            out.push(m);
        }
    }
    // Every discovery claims ports in the same order, so of concurrent discoveries of one
    // machine the one that claims the first MAC wins and the others give up before
    // claiming anything else.
    out.sort();
    out
}

impl Conductor {
    /// The node that has one of `macs` as a port, if any.
    async fn node_with_mac(&self, macs: &[String]) -> Result<Option<String>, StoreError> {
        for mac in macs {
            let ports = self
                .store
                .list_ports(&PortQuery {
                    address: Some(mac.clone()),
                    ..Default::default()
                })
                .await?;
            if let Some(p) = ports.into_iter().find(|p| &p.address == mac) {
                return Ok(Some(p.node_uuid));
            }
        }
        Ok(None)
    }

    /// Enrol the machine that sent `req` (or name the node it already has).
    pub async fn discover(
        &self,
        req: &DiscoverRequest,
    ) -> Result<DiscoverResponse, DiscoveryError> {
        let cfg = &self.config.discovery;
        if !cfg.enabled {
            return Err(DiscoveryError::Disabled);
        }
        let macs = macs_of(req);
        if macs.is_empty() {
            return Err(DiscoveryError::BadRequest(
                "the inventory has no usable MAC address: a discovered node needs at least one port".into(),
            ));
        }
        let answer = |node_uuid: String, created: bool| DiscoverResponse {
            node_uuid,
            created,
            end: cfg.end,
        };
        if let Some(existing) = self.node_with_mac(&macs).await? {
            let end = self.end_for_known(&existing).await?;
            tracing::info!(node = %existing, ?macs, ?end, "discovery: these MACs already belong to a node; none created");
            return Ok(DiscoverResponse {
                node_uuid: existing,
                created: false,
                end,
            });
        }

        let inventory = serde_json::to_value(&req.inventory).unwrap_or(Value::Null);
        let mut node =
            rivet_model::node::Node::new(uuid::Uuid::new_v4().to_string(), cfg.driver.clone());
        rivet_model::internal_info::mark_discovered(&mut node.driver_internal_info, Utc::now());
        if let Ok(d) = derive::derive(&req.inventory, None) {
            let p = &mut node.properties;
            if d.cpus > 0 {
                p.insert("cpus".into(), json!(d.cpus));
            }
            if !d.cpu_arch.is_empty() {
                p.insert("cpu_arch".into(), json!(d.cpu_arch));
            }
            if d.memory_mb > 0 {
                p.insert("memory_mb".into(), json!(d.memory_mb));
            }
            if d.local_gb > 0 {
                p.insert("local_gb".into(), json!(d.local_gb));
            }
        }
        let mut node = self.store.create_node(&node).await?;

        // The ports claim the MACs; the store's unique address decides a race.
        let pxe_mac = req
            .inventory
            .boot
            .pxe_interface
            .as_ref()
            .map(|m| m.to_ascii_lowercase())
            .filter(|m| macs.contains(m));
        for mac in &macs {
            let port = Port {
                uuid: uuid::Uuid::new_v4().to_string(),
                node_uuid: node.uuid.clone(),
                address: mac.clone(),
                pxe_enabled: pxe_mac.as_deref().is_none_or(|p| p == mac),
                extra: Map::new(),
                created_at: Utc::now(),
                updated_at: None,
                version: 0,
                attrs: Default::default(),
            };
            match self.store.create_port(&port).await {
                Ok(_) => {}
                Err(StoreError::Duplicate(_)) => {
                    self.undo_discovery(&node).await;
                    let winner = self.node_with_mac(&macs).await?.ok_or_else(|| {
                        DiscoveryError::BadRequest(format!(
                            "MAC {mac} was claimed by another node that is gone again; retry discovery"
                        ))
                    })?;
                    tracing::info!(node = %winner, mac = %mac, "discovery: a concurrent discovery enrolled this machine; none created");
                    return Ok(answer(winner, false));
                }
                Err(e) => {
                    self.undo_discovery(&node).await;
                    return Err(e.into());
                }
            }
        }
        self.store.save_inventory(&node.uuid, &inventory).await?;

        match self.apply_inspection_rules(&mut node, &inventory).await? {
            Ok(()) => {}
            Err(msg) => {
                // The node stays enrolled (its MACs are claimed); the operator sees why.
                tracing::warn!(node = %node.uuid, "discovery: {msg}");
                node.last_error = Some(msg);
            }
        }
        let node = self.update_node(&node).await?;
        tracing::info!(
            node = %node.uuid, ?macs, driver = %node.driver,
            bmc = ?req.inventory.bmc_address, end = ?cfg.end,
            "discovery: node enrolled"
        );
        Ok(answer(node.uuid, true))
    }

    /// What a machine whose MACs already belong to node `uuid` should do. The configured end
    /// is for discovered machines, so it applies to a node discovery enrolled that still
    /// waits in `enroll` (the machine booted again before the operator took it). Any other
    /// node is the operator's: a machine that booted the ramdisk on its own (an `active`
    /// server whose boot order fell back to the network, say) is not powered off behind the
    /// operator's back. It keeps looking up, as Ironic's agent does when no node expects it,
    /// and the log names the node and its state.
    async fn end_for_known(&self, uuid: &str) -> Result<DiscoveryEnd, StoreError> {
        let node = self.store.get_node(uuid).await?;
        let discovered = rivet_model::internal_info::is_auto_discovered(&node.driver_internal_info);
        if discovered && node.provision_state == ProvisionState::Enroll {
            return Ok(self.config.discovery.end);
        }
        tracing::warn!(
            node = %uuid,
            state = %node.provision_state,
            "discovery: the machine of this node booted the ramdisk although no operation expects it; \
             it is left running and keeps looking up (check its boot order if it should not have booted from the network)"
        );
        Ok(DiscoveryEnd::Wait)
    }

    /// Remove a node created by a discovery that lost a race (best effort: logged).
    async fn undo_discovery(&self, node: &rivet_model::node::Node) {
        if let Ok(ports) = self
            .store
            .list_ports(&PortQuery {
                node_uuid: Some(node.uuid.clone()),
                ..Default::default()
            })
            .await
        {
            for p in ports {
                if let Err(e) = self.store.delete_port(&p.uuid).await {
                    tracing::warn!(port = %p.uuid, error = %e, "discovery: cannot remove port of the losing node");
                }
            }
        }
        if let Err(e) = self.store.delete_node(&node.uuid, node.version).await {
            tracing::warn!(node = %node.uuid, error = %e, "discovery: cannot remove the node of a lost race");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rivet_protocol::inventory::Interface;

    #[test]
    fn macs_are_normalized_deduplicated_sorted_and_junk_dropped() {
        let mut req = DiscoverRequest::default();
        for m in [
            "52:54:00:00:00:0B",
            "52:54:00:00:00:0a",
            "52:54:00:00:00:0b",
            "00:00:00:00:00:00",
            "ff:ff:ff:ff:ff:ff",
            "not-a-mac",
            "52:54:00:00:00",
            "",
        ] {
            req.inventory.interfaces.push(Interface {
                mac_address: m.into(),
                ..Default::default()
            });
        }
        assert_eq!(macs_of(&req), ["52:54:00:00:00:0a", "52:54:00:00:00:0b"]);
        assert!(!DiscoveryConfig::default().enabled, "off by default");
    }
}
