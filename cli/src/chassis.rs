//! `rivet chassis …`: Ironic's grouping of nodes (a rack, an enclosure).

use crate::client::{seg, Client};
use crate::output::{self, Output};
use anyhow::{anyhow, Result};
use clap::Subcommand;
use serde_json::{json, Map, Value};

/// `rivet chassis` subcommands.
#[derive(Debug, Subcommand)]
pub enum ChassisCmd {
    /// Create a chassis.
    Create {
        /// Free-text description (at most 255 characters).
        #[arg(long)]
        description: Option<String>,
        /// UUID (generated when absent).
        #[arg(long)]
        uuid: Option<String>,
        /// Operator data, KEY=VALUE (repeatable).
        #[arg(long = "extra", value_name = "KEY=VALUE")]
        extra: Vec<String>,
    },
    /// List chassis.
    List,
    /// Show a chassis, with the nodes in it.
    Show {
        /// Chassis UUID.
        uuid: String,
    },
    /// Delete a chassis (refused while nodes are in it).
    Delete {
        /// Chassis UUID.
        uuid: String,
    },
}

/// Pages fetched at most when following `next` links (a guard against a looping server).
const MAX_PAGES: usize = 10_000;

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

/// Every item of a paged listing, following `next` links.
async fn all(client: &Client, first: &str, key: &str) -> Result<Vec<Value>> {
    let mut items: Vec<Value> = Vec::new();
    let mut page = client.get(first, &[]).await?;
    for _ in 0..MAX_PAGES {
        let got = page
            .get(key)
            .and_then(Value::as_array)
            .ok_or_else(|| anyhow!("rivetd answered {first} without a {key:?} list"))?;
        let empty = got.is_empty();
        items.extend(got.iter().cloned());
        let next = page
            .get("next")
            .and_then(Value::as_str)
            .and_then(Client::rebase);
        match next {
            Some(next) if !empty => page = client.get(&next, &[]).await?,
            _ => break,
        }
    }
    Ok(items)
}

/// Run a `rivet chassis` subcommand.
pub async fn run(cmd: ChassisCmd, client: &Client, out: Output) -> Result<()> {
    match cmd {
        ChassisCmd::Create {
            description,
            uuid,
            extra,
        } => {
            let mut body = json!({ "extra": pairs(&extra)? });
            if let Some(d) = description {
                body["description"] = Value::from(d);
            }
            if let Some(u) = uuid {
                body["uuid"] = Value::from(u);
            }
            let doc = client.post("/v1/chassis", &body).await?;
            out.document(&doc);
        }
        ChassisCmd::List => {
            let chassis = all(client, "/v1/chassis/detail", "chassis").await?;
            if out.json {
                output::print_json(&json!({ "chassis": chassis }));
            } else {
                let rows = output::rows(&chassis, &["uuid", "description", "created_at"]);
                print!(
                    "{}",
                    output::table(&["UUID", "Description", "Created At"], &rows)
                );
            }
        }
        ChassisCmd::Show { uuid } => {
            let u = seg(&uuid);
            let doc = client.get(&format!("/v1/chassis/{u}"), &[]).await?;
            let nodes = all(client, &format!("/v1/chassis/{u}/nodes"), "nodes").await?;
            if out.json {
                let mut doc = doc;
                doc["node_uuids"] = nodes.iter().map(|n| n["uuid"].clone()).collect();
                output::print_json(&doc);
            } else {
                out.document(&doc);
                let rows = output::rows(&nodes, &["uuid", "name", "provision_state"]);
                print!(
                    "\nNodes:\n{}",
                    output::table(&["UUID", "Name", "Provisioning State"], &rows)
                );
            }
        }
        ChassisCmd::Delete { uuid } => {
            client
                .delete(&format!("/v1/chassis/{}", seg(&uuid)))
                .await?;
            out.note(&format!("Deleted chassis {uuid}"));
        }
    }
    Ok(())
}
