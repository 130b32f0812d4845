//! `rivet allocation …`: Ironic's allocations (API 1.52): ask for a node of a resource
//! class (and traits), see which node was picked, give it back.

use crate::client::{seg, Client};
use crate::output::{self, Output};
use anyhow::{anyhow, bail, Result};
use clap::Subcommand;
use serde_json::{json, Map, Value};
use std::time::{Duration, Instant};

/// `rivet allocation` subcommands.
#[derive(Debug, Subcommand)]
pub enum AllocationCmd {
    /// Create an allocation; the conductor picks an available node.
    Create {
        /// Resource class the node must have (optional when backfilling with --node).
        #[arg(long)]
        resource_class: Option<String>,
        /// A trait the node must have (repeatable).
        #[arg(long = "trait", value_name = "TRAIT")]
        traits: Vec<String>,
        /// A node (name or UUID) the allocation may pick (repeatable; default: any).
        #[arg(long = "candidate-node", value_name = "NODE")]
        candidate_nodes: Vec<String>,
        /// Unique name.
        #[arg(long)]
        name: Option<String>,
        /// UUID (generated when absent).
        #[arg(long)]
        uuid: Option<String>,
        /// Owning project (API 1.60).
        #[arg(long)]
        owner: Option<String>,
        /// Backfill: the allocation of this already deployed node (API 1.58).
        #[arg(long)]
        node: Option<String>,
        /// Operator data, KEY=VALUE (repeatable).
        #[arg(long = "extra", value_name = "KEY=VALUE")]
        extra: Vec<String>,
        /// Wait until the allocation is active (or fails), at most this many seconds.
        #[arg(long, value_name = "SECONDS")]
        wait: Option<u64>,
    },
    /// List allocations.
    List {
        /// Only the allocation of this node (name or UUID).
        #[arg(long)]
        node: Option<String>,
        /// Only allocations in this state (allocating, active, error).
        #[arg(long)]
        state: Option<String>,
        /// Only allocations of this resource class.
        #[arg(long)]
        resource_class: Option<String>,
    },
    /// Show an allocation.
    Show {
        /// Allocation name or UUID.
        allocation: String,
    },
    /// Delete an allocation, releasing its node.
    Delete {
        /// Allocation name or UUID.
        allocation: String,
    },
}

fn pairs(items: &[String]) -> Result<Map<String, Value>> {
    items
        .iter()
        .map(|kv| {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| anyhow!("--extra {kv:?} is not KEY=VALUE"))?;
            Ok((k.to_string(), Value::from(v)))
        })
        .collect()
}

/// Run a `rivet allocation` subcommand.
pub async fn run(cmd: AllocationCmd, client: &Client, out: Output) -> Result<()> {
    match cmd {
        AllocationCmd::Create {
            resource_class,
            traits,
            candidate_nodes,
            name,
            uuid,
            owner,
            node,
            extra,
            wait,
        } => {
            let mut body = json!({ "extra": pairs(&extra)? });
            for (k, v) in [
                ("resource_class", resource_class),
                ("name", name),
                ("uuid", uuid),
                ("owner", owner),
                ("node", node),
            ] {
                if let Some(v) = v {
                    body[k] = Value::from(v);
                }
            }
            if !traits.is_empty() {
                body["traits"] = json!(traits);
            }
            if !candidate_nodes.is_empty() {
                body["candidate_nodes"] = json!(candidate_nodes);
            }
            let mut doc = client.post("/v1/allocations", &body).await?;
            if let Some(secs) = wait {
                let uuid = doc["uuid"].as_str().unwrap_or_default().to_string();
                let deadline = Instant::now() + Duration::from_secs(secs);
                while doc["state"] == "allocating" {
                    if Instant::now() > deadline {
                        bail!("allocation {uuid} is still allocating after {secs} s");
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    doc = client
                        .get(&format!("/v1/allocations/{}", seg(&uuid)), &[])
                        .await?;
                }
                if doc["state"] == "error" {
                    out.document(&doc);
                    bail!(
                        "allocation {uuid} failed: {}",
                        doc["last_error"].as_str().unwrap_or("no reason given")
                    );
                }
            }
            out.document(&doc);
        }
        AllocationCmd::List {
            node,
            state,
            resource_class,
        } => {
            let mut query = Vec::new();
            for (k, v) in [
                ("node", node),
                ("state", state),
                ("resource_class", resource_class),
            ] {
                if let Some(v) = v {
                    query.push((k, v));
                }
            }
            let page = client.get("/v1/allocations", &query).await?;
            let items = page["allocations"]
                .as_array()
                .cloned()
                .ok_or_else(|| anyhow!("rivetd answered without an \"allocations\" list"))?;
            if out.json {
                output::print_json(&json!({ "allocations": items }));
            } else {
                let rows = output::rows(
                    &items,
                    &["uuid", "name", "resource_class", "state", "node_uuid"],
                );
                print!(
                    "{}",
                    output::table(
                        &["UUID", "Name", "Resource Class", "State", "Node UUID"],
                        &rows
                    )
                );
            }
        }
        AllocationCmd::Show { allocation } => {
            let doc = client
                .get(&format!("/v1/allocations/{}", seg(&allocation)), &[])
                .await?;
            out.document(&doc);
        }
        AllocationCmd::Delete { allocation } => {
            client
                .delete(&format!("/v1/allocations/{}", seg(&allocation)))
                .await?;
            out.note(&format!("Deleted allocation {allocation}"));
        }
    }
    Ok(())
}
