//! `rivet port …`: a node's NICs (MACs the agent is looked up by).

use crate::client::{seg, Client};
use crate::output::{self, Output};
use anyhow::{anyhow, Result};
use clap::Subcommand;
use rivet_protocol::api::PortCreate;
use serde_json::{json, Value};

/// `rivet port` subcommands.
#[derive(Debug, Subcommand)]
pub enum PortCmd {
    /// Register a NIC of a node.
    Create {
        /// Node UUID or name.
        #[arg(long)]
        node: String,
        /// MAC address (aa:bb:cc:dd:ee:ff).
        #[arg(long)]
        address: String,
        /// Whether the node PXE-boots from this port.
        #[arg(long, value_name = "true|false", default_value_t = true, action = clap::ArgAction::Set)]
        pxe_enabled: bool,
    },
    /// List ports, optionally of one node.
    List {
        /// Node UUID or name.
        #[arg(long)]
        node: Option<String>,
    },
    /// Delete a port.
    Delete {
        /// Port UUID.
        uuid: String,
    },
}

/// Run a `rivet port` subcommand.
pub async fn run(cmd: PortCmd, client: &Client, out: Output) -> Result<()> {
    match cmd {
        PortCmd::Create {
            node,
            address,
            pxe_enabled,
        } => {
            let body = PortCreate {
                address,
                node_uuid: node,
                pxe_enabled,
                ..Default::default()
            };
            let doc = client.post("/v1/ports", &body).await?;
            out.document(&doc);
        }
        PortCmd::List { node } => {
            let query: Vec<(&str, String)> = node.into_iter().map(|n| ("node", n)).collect();
            let page = client.get("/v1/ports/detail", &query).await?;
            let ports = page.get("ports").and_then(Value::as_array).ok_or_else(|| {
                anyhow!("rivetd answered /v1/ports/detail without a \"ports\" list")
            })?;
            if out.json {
                output::print_json(&json!({ "ports": ports }));
            } else {
                let rows = output::rows(ports, &["uuid", "address", "node_uuid", "pxe_enabled"]);
                print!(
                    "{}",
                    output::table(&["UUID", "Address", "Node UUID", "PXE Enabled"], &rows)
                );
            }
        }
        PortCmd::Delete { uuid } => {
            client.delete(&format!("/v1/ports/{}", seg(&uuid))).await?;
            out.note(&format!("Deleted port {uuid}"));
        }
    }
    Ok(())
}
