//! Allocations (Ironic 1.52): picking an `available` node for an allocation, backfilling
//! one for a node already deployed, and releasing a node when its allocation goes.
//!
//! Exclusion holds in the store, not in this process: a node is taken by writing its
//! `instance_uuid` with the version that was read (a compare-and-swap), and the
//! allocation's `node_uuid` is unique. Two allocations racing for one node — on one
//! controller or several sharing PostgreSQL — cannot both win; the loser moves on to the
//! next candidate. New allocations are processed at once; the `allocations` loop picks up
//! any left `allocating` (a restart in between) and forgets allocations of deleted nodes.

use super::supervisor::LoopEnd;
use super::{Conductor, ConductorError};
use rivet_model::node::Node;
use rivet_protocol::states::{PowerState, ProvisionState};
use rivet_store::allocations::alloc_state;
use rivet_store::NodeExt;
use rivet_store::{Allocation, AllocationQuery, NodeQuery, StoreError};
use std::sync::Arc;
use std::time::Duration;

/// How often the loop looks for allocations left `allocating`.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Node states in which Ironic lets an allocation go while an operation is under way
/// (`states.UPDATE_ALLOWED_STATES`).
const UPDATE_ALLOWED: &[&str] = &[
    "deploy failed",
    "inspecting",
    "inspect failed",
    "inspect wait",
    "clean failed",
    "error",
    "verifying",
    "adopt failed",
    "rescue failed",
    "unrescue failed",
    "service",
    "service hold",
    "service failed",
];

/// Why an allocation could not be processed (becomes its `last_error`).
fn failed(uuid: &str, error: &str) -> String {
    format!("Failed to process allocation {uuid}: {error}.")
}

fn has_traits(node: &Node, traits: &[String]) -> bool {
    traits.iter().all(|t| node.traits.contains(t))
}

/// Ironic's `_verify_node`: the node still fits the allocation when it is about to be taken.
fn still_fits(node: &Node, a: &Allocation) -> bool {
    !node.maintenance
        && node.instance_uuid.is_none()
        && node.allocation_uuid.is_none()
        && node.provision_state == ProvisionState::Available
        && node.resource_class == a.resource_class
        && has_traits(node, &a.traits)
}

impl Conductor {
    /// Process allocation `uuid` now, in a tracked task (shutdown waits for it).
    pub fn allocate_soon(self: &Arc<Self>, uuid: String) {
        if self.shutdown.is_cancelled() {
            return;
        }
        let this = self.clone();
        self.tasks.spawn(async move {
            if let Err(e) = this.process_allocation(&uuid).await {
                tracing::error!(allocation = %uuid, error = %e, "allocation processing failed");
            }
        });
    }

    /// The controller-wide allocations loop: allocations left `allocating` are processed,
    /// allocations of deleted nodes are forgotten.
    pub async fn run_allocations(self: Arc<Self>) -> LoopEnd {
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return LoopEnd::NotNeeded,
                _ = tokio::time::sleep(SWEEP_EVERY) => {}
            }
            if let Err(e) = self.sweep_allocations().await {
                tracing::warn!(error = %e, "allocation sweep failed; retrying");
            }
        }
    }

    async fn sweep_allocations(&self) -> Result<(), ConductorError> {
        let pending = self
            .store
            .list_allocations(&AllocationQuery {
                state: Some(alloc_state::ALLOCATING.into()),
                ..Default::default()
            })
            .await?;
        for a in pending {
            self.process_allocation(&a.uuid).await?;
        }
        let held = self
            .store
            .list_allocations(&AllocationQuery {
                state: Some(alloc_state::ACTIVE.into()),
                ..Default::default()
            })
            .await?;
        for a in held {
            let Some(node) = &a.node_uuid else { continue };
            if let Err(StoreError::NotFound { .. }) = self.store.node_summary(node).await {
                // Ironic deletes a node's allocation with the node.
                tracing::info!(allocation = %a.uuid, node = %node, "node deleted; its allocation goes with it");
                match self.store.delete_allocation(&a.uuid).await {
                    Ok(()) | Err(StoreError::NotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    /// Ironic's `do_allocate`: pick a node for an `allocating` allocation, or record why
    /// none fits. A no-op for an allocation already processed or deleted.
    pub async fn process_allocation(&self, uuid: &str) -> Result<(), ConductorError> {
        let a = match self.store.get_allocation(uuid).await {
            Ok(a) => a,
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        if a.state != alloc_state::ALLOCATING {
            return Ok(());
        }
        let outcome = match self.candidates(&a).await {
            Ok(nodes) => self.take_one(&a, nodes).await,
            Err(why) => Err(why),
        };
        match outcome {
            Ok(Some(node)) => {
                tracing::info!(allocation = %a.uuid, node = %node, "node reserved for allocation");
                Ok(())
            }
            // Deleted (or processed elsewhere) meanwhile.
            Ok(None) => Ok(()),
            Err(why) => {
                let msg = failed(&a.uuid, &why);
                tracing::error!(allocation = %a.uuid, error = %msg, "allocation failed");
                self.allocation_failed(&a.uuid, &msg).await
            }
        }
    }

    /// Mark allocation `uuid` failed with `msg`, unless it is gone or no longer allocating.
    async fn allocation_failed(&self, uuid: &str, msg: &str) -> Result<(), ConductorError> {
        for _ in 0..5 {
            let mut a = match self.store.get_allocation(uuid).await {
                Ok(a) => a,
                Err(StoreError::NotFound { .. }) => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            if a.state != alloc_state::ALLOCATING {
                return Ok(());
            }
            a.state = alloc_state::ERROR.into();
            a.node_uuid = None;
            a.last_error = Some(msg.to_string());
            match self.store.update_allocation(&a).await {
                Ok(_) => return Ok(()),
                Err(StoreError::Conflict { .. }) => continue,
                Err(StoreError::NotFound { .. }) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Ironic's `_candidate_nodes`: available, unassociated, powered-known nodes out of
    /// maintenance of the resource class (among the candidates, of the owner), with the
    /// traits; shuffled, a node named as the allocation first (1.79). `Err` says why none.
    async fn candidates(&self, a: &Allocation) -> Result<Vec<Node>, String> {
        let rc = a.resource_class.clone().unwrap_or_default();
        let mut nodes = Vec::new();
        let mut marker = None;
        loop {
            let page = self
                .store
                .list_nodes(&NodeQuery {
                    provision_state: Some(ProvisionState::Available),
                    maintenance: Some(false),
                    associated: Some(false),
                    resource_class: Some(rc.clone()),
                    marker: marker.clone(),
                    ..Default::default()
                })
                .await
                .map_err(|e| format!("cannot list nodes: {e}"))?;
            let full = page.len() == NodeQuery::default().limit;
            marker = page.last().map(|n| n.uuid.clone());
            nodes.extend(page);
            if !full {
                break;
            }
        }
        nodes.retain(|n| {
            n.power_state.is_some_and(|p| p != PowerState::Error)
                && n.allocation_uuid.is_none()
                && (a.candidate_nodes.is_empty() || a.candidate_nodes.contains(&n.uuid))
                && a.owner.as_ref().is_none_or(|o| {
                    n.attrs.owner.as_ref() == Some(o) || n.attrs.lessee.as_ref() == Some(o)
                })
        });
        if nodes.is_empty() {
            return Err(if a.candidate_nodes.is_empty() {
                format!("no available nodes match the resource class {rc}")
            } else {
                format!(
                    "none of the requested nodes are available and match the resource class {rc}"
                )
            });
        }
        if !a.traits.is_empty() {
            nodes.retain(|n| has_traits(n, &a.traits));
            if nodes.is_empty() {
                return Err(format!(
                    "no suitable nodes have the requested traits {}",
                    a.traits.join(", ")
                ));
            }
        }
        use rand::seq::SliceRandom;
        nodes.shuffle(&mut rand::thread_rng());
        if let Some(name) = &a.name {
            if let Some(i) = nodes.iter().position(|n| n.name.as_ref() == Some(name)) {
                let n = nodes.remove(i);
                nodes.insert(0, n);
            }
        }
        Ok(nodes)
    }

    /// Ironic's `_allocate_node`: take the first candidate that still fits. `Ok(None)` when
    /// the allocation went away meanwhile.
    async fn take_one(&self, a: &Allocation, nodes: Vec<Node>) -> Result<Option<String>, String> {
        let total = nodes.len();
        let mut busy = 0;
        for candidate in nodes {
            for _attempt in 0..3 {
                let mut node = match self.store.get_node(&candidate.uuid).await {
                    Ok(n) => n,
                    Err(_) => break,
                };
                if node.writable().is_err() || !still_fits(&node, a) {
                    break;
                }
                node.instance_uuid = Some(a.uuid.clone());
                match self.update_node(&node).await {
                    Ok(_) => {}
                    // Someone wrote the node in between: look at it again.
                    Err(StoreError::Conflict { .. }) => {
                        busy += 1;
                        continue;
                    }
                    Err(_) => break,
                }
                match self.claim(a, &node.uuid).await {
                    Ok(true) => return Ok(Some(node.uuid)),
                    Ok(false) => {
                        self.release_node(&node.uuid, &a.uuid).await;
                        return Ok(None);
                    }
                    Err(e) => {
                        self.release_node(&node.uuid, &a.uuid).await;
                        tracing::warn!(allocation = %a.uuid, node = %node.uuid, error = %e, "cannot record the node on the allocation");
                        break;
                    }
                }
            }
        }
        let rc = a.resource_class.as_deref().unwrap_or_default();
        Err(if busy > 0 && total > 0 {
            format!("could not reserve any of {total} suitable nodes of resource class {rc}")
        } else {
            format!("all nodes of resource class {rc} were filtered out during reservation (taken by another allocation or changed meanwhile)")
        })
    }

    /// Record node `node` on the allocation, still `allocating`: `Ok(false)` when it was
    /// deleted or processed elsewhere meanwhile.
    async fn claim(&self, a: &Allocation, node: &str) -> Result<bool, StoreError> {
        for _ in 0..5 {
            let mut cur = match self.store.get_allocation(&a.uuid).await {
                Ok(c) => c,
                Err(StoreError::NotFound { .. }) => return Ok(false),
                Err(e) => return Err(e),
            };
            if cur.state != alloc_state::ALLOCATING {
                return Ok(false);
            }
            cur.node_uuid = Some(node.to_string());
            cur.state = alloc_state::ACTIVE.into();
            cur.last_error = None;
            match self.store.update_allocation(&cur).await {
                Ok(_) => return Ok(true),
                Err(StoreError::Conflict { .. }) => continue,
                Err(StoreError::NotFound { .. }) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }

    /// Clear `instance_uuid` of node `node` if it still names allocation `alloc`.
    async fn release_node(&self, node: &str, alloc: &str) {
        for _ in 0..5 {
            let mut n = match self.store.get_node(node).await {
                Ok(n) => n,
                Err(_) => return,
            };
            if n.instance_uuid.as_deref() != Some(alloc) || n.writable().is_err() {
                return;
            }
            n.instance_uuid = None;
            match self.update_node(&n).await {
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => {
                    tracing::error!(node = %node, error = %e, "cannot release the node's instance_uuid");
                    return;
                }
                Ok(_) => return,
            }
        }
    }

    /// Ironic's `backfill_allocation` (1.58): the allocation of a node already deployed.
    /// The allocation is stored first; on a mismatch it is kept in `error` and the reason
    /// returned.
    pub async fn backfill_allocation(
        &self,
        a: Allocation,
        node: &Node,
    ) -> Result<Allocation, ConductorError> {
        let mut errors = Vec::new();
        if node.provision_state != ProvisionState::Active {
            errors.push(format!(
                "Node must be in the \"active\" state, but the current state is \"{}\"",
                node.provision_state
            ));
        }
        if let Some(rc) = &a.resource_class {
            if node.resource_class.as_ref() != Some(rc) {
                errors.push(format!(
                    "Resource class {} does not match the requested resource class {rc}",
                    node.resource_class.as_deref().unwrap_or("None")
                ));
            }
        }
        if !has_traits(node, &a.traits) {
            errors.push(format!(
                "List of traits {:?} does not match the requested traits {:?}",
                node.traits, a.traits
            ));
        }
        if !a.candidate_nodes.is_empty() && !a.candidate_nodes.contains(&node.uuid) {
            errors.push(format!(
                "Candidate nodes must be empty or contain the target node, but got {:?}",
                a.candidate_nodes
            ));
        }
        let mut stored = self.store.create_allocation(&a).await?;
        let refuse = |why: String| ConductorError::BadRequest(failed(&a.uuid, &why));
        let why = if !errors.is_empty() {
            Some(format!(
                "Cannot backfill an allocation for node {}: {}",
                node.uuid,
                errors.join("; ")
            ))
        } else if node.allocation_uuid.is_some() {
            Some(format!("Node {} already has an allocation", node.uuid))
        } else if node.instance_uuid.as_ref().is_some_and(|i| *i != a.uuid) {
            Some(format!(
                "Node {} is associated with instance {}",
                node.uuid,
                node.instance_uuid.as_deref().unwrap_or("")
            ))
        } else {
            None
        };
        if let Some(why) = why {
            stored.state = alloc_state::ERROR.into();
            stored.last_error = Some(failed(&a.uuid, &why));
            let _ = self.store.update_allocation(&stored).await;
            return Err(refuse(why));
        }
        // The node takes the allocation's UUID as its instance, as Ironic's database does.
        if node.instance_uuid.is_none() {
            let mut n = node.clone();
            n.writable()?;
            n.instance_uuid = Some(a.uuid.clone());
            if let Err(e) = self.update_node(&n).await {
                stored.state = alloc_state::ERROR.into();
                stored.last_error = Some(failed(&a.uuid, &e.to_string()));
                let _ = self.store.update_allocation(&stored).await;
                return Err(e.into());
            }
        }
        stored.node_uuid = Some(node.uuid.clone());
        stored.state = alloc_state::ACTIVE.into();
        match self.store.update_allocation(&stored).await {
            Ok(s) => Ok(s),
            Err(e) => {
                self.release_node(&node.uuid, &a.uuid).await;
                Err(e.into())
            }
        }
    }

    /// Ironic's `destroy_allocation`: refused (the inner `Err`, Ironic's InvalidState, a
    /// 409) while the node is deployed or being worked on, unless in maintenance; the node
    /// forgets the allocation's instance.
    pub async fn destroy_allocation(
        &self,
        a: &Allocation,
    ) -> Result<Result<(), String>, ConductorError> {
        if let Some(node_uuid) = &a.node_uuid {
            match self.store.get_node(node_uuid).await {
                Ok(node) => {
                    if let Err(why) = check_deallocation(&node, a) {
                        return Ok(Err(why));
                    }
                    self.store.delete_allocation(&a.uuid).await?;
                    self.release_node(&node.uuid, &a.uuid).await;
                }
                Err(StoreError::NotFound { .. }) => self.store.delete_allocation(&a.uuid).await?,
                Err(e) => return Err(e.into()),
            }
        } else {
            self.store.delete_allocation(&a.uuid).await?;
        }
        tracing::info!(allocation = %a.uuid, "allocation deleted");
        Ok(Ok(()))
    }
}

/// Ironic's `verify_node_for_deallocation`.
fn check_deallocation(node: &Node, a: &Allocation) -> Result<(), String> {
    if node.maintenance {
        return Ok(());
    }
    let state = node.provision_state.to_string();
    if node.target_provision_state.is_some() && !UPDATE_ALLOWED.contains(&state.as_str()) {
        return Err(format!(
            "Cannot remove allocation {} for node {}, because the node is in state {state} where updates are not allowed (and maintenance mode is off)",
            a.uuid, node.uuid
        ));
    }
    if node.provision_state == ProvisionState::Active {
        return Err(format!(
            "Cannot remove allocation {} for node {}, because the node is active (and maintenance mode is off)",
            a.uuid, node.uuid
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc() -> Allocation {
        Allocation {
            uuid: "a".into(),
            name: None,
            node_uuid: Some("n".into()),
            state: alloc_state::ALLOCATING.into(),
            last_error: None,
            resource_class: Some("gold".into()),
            candidate_nodes: Vec::new(),
            traits: vec!["CUSTOM_A".into()],
            extra: Default::default(),
            owner: None,
            created_at: chrono::Utc::now(),
            updated_at: None,
            version: 1,
        }
    }

    fn node() -> Node {
        let mut n = Node::new("n".into(), "fake-hardware".into());
        n.provision_state = ProvisionState::Available;
        n.resource_class = Some("gold".into());
        n.traits = vec!["CUSTOM_A".into(), "CUSTOM_B".into()];
        n
    }

    #[test]
    fn a_node_fits_only_while_free_available_and_matching() {
        let a = alloc();
        assert!(still_fits(&node(), &a));
        for change in [
            (|n: &mut Node| n.maintenance = true) as fn(&mut Node),
            |n| n.instance_uuid = Some("i".into()),
            |n| n.allocation_uuid = Some("other".into()),
            |n| n.provision_state = ProvisionState::Active,
            |n| n.resource_class = Some("silver".into()),
            |n| n.traits = vec!["CUSTOM_B".into()],
        ] {
            let mut n = node();
            change(&mut n);
            assert!(!still_fits(&n, &a), "{n:?}");
        }
    }

    #[test]
    fn deallocation_is_refused_while_deployed_or_busy_unless_in_maintenance() {
        let a = alloc();
        let mut n = node();
        assert!(check_deallocation(&n, &a).is_ok());
        n.provision_state = ProvisionState::Active;
        let e = check_deallocation(&n, &a).expect_err("active");
        assert!(e.contains("because the node is active"), "{e}");
        n.maintenance = true;
        assert!(check_deallocation(&n, &a).is_ok());
        n.maintenance = false;
        n.provision_state = ProvisionState::Deploying;
        n.target_provision_state = Some(ProvisionState::Active);
        let e = check_deallocation(&n, &a).expect_err("deploying");
        assert!(e.contains("where updates are not allowed"), "{e}");
        n.provision_state = ProvisionState::DeployFailed;
        assert!(check_deallocation(&n, &a).is_ok());
    }
}
