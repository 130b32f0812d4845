//! `rivet portgroup …`: port groups (bonds of a node's ports, API 1.23).

use crate::client::{seg, Client};
use crate::output::{self, Output};
use crate::port::{all, pairs};
use anyhow::{anyhow, Result};
use clap::{Args, Subcommand};
use serde_json::{json, Value};

/// Fields `create` and `set` share.
#[derive(Debug, Args)]
pub struct GroupFields {
    /// Unique name.
    #[arg(long)]
    name: Option<String>,
    /// MAC address of the bond.
    #[arg(long)]
    address: Option<String>,
    /// Bonding mode (default active-backup).
    #[arg(long)]
    mode: Option<String>,
    /// Bonding property, KEY=VALUE (repeatable).
    #[arg(long = "property", value_name = "KEY=VALUE")]
    properties: Vec<String>,
    /// Operator data, KEY=VALUE (repeatable).
    #[arg(long = "extra", value_name = "KEY=VALUE")]
    extra: Vec<String>,
    /// Whether its ports may be used on their own.
    #[arg(long, value_name = "true|false", action = clap::ArgAction::Set)]
    standalone_ports_supported: Option<bool>,
    /// Physical network (API 1.102).
    #[arg(long)]
    physical_network: Option<String>,
    /// Category (API 1.103).
    #[arg(long)]
    category: Option<String>,
}

/// `rivet portgroup` subcommands.
#[derive(Debug, Subcommand)]
pub enum PortgroupCmd {
    /// Create a port group on a node.
    Create {
        /// Node UUID.
        #[arg(long)]
        node: String,
        /// UUID (generated when absent).
        #[arg(long)]
        uuid: Option<String>,
        #[command(flatten)]
        fields: GroupFields,
    },
    /// List port groups (all pages), optionally of one node.
    List {
        /// Node UUID or name.
        #[arg(long)]
        node: Option<String>,
    },
    /// Show a port group and its ports.
    Show {
        /// Port group UUID or name.
        portgroup: String,
    },
    /// Change fields of a port group.
    Set {
        /// Port group UUID or name.
        portgroup: String,
        #[command(flatten)]
        fields: GroupFields,
    },
    /// Clear fields (name, address, physical_network, category, or extra/KEY, properties/KEY).
    Unset {
        /// Port group UUID or name.
        portgroup: String,
        /// Field to clear (repeatable).
        #[arg(long = "field", required = true)]
        fields: Vec<String>,
    },
    /// Delete a port group (refused while ports are in it).
    Delete {
        /// Port group UUID or name.
        portgroup: String,
    },
}

fn given(f: GroupFields) -> Result<Vec<(String, Value)>> {
    let mut out: Vec<(String, Value)> = Vec::new();
    for (k, v) in [
        ("name", f.name),
        ("address", f.address),
        ("mode", f.mode),
        ("physical_network", f.physical_network),
        ("category", f.category),
    ] {
        if let Some(v) = v {
            out.push((k.into(), Value::from(v)));
        }
    }
    if let Some(b) = f.standalone_ports_supported {
        out.push(("standalone_ports_supported".into(), Value::from(b)));
    }
    for (k, v) in pairs("property", &f.properties)? {
        out.push((format!("properties/{k}"), v));
    }
    for (k, v) in pairs("extra", &f.extra)? {
        out.push((format!("extra/{k}"), v));
    }
    Ok(out)
}

/// Run a `rivet portgroup` subcommand.
pub async fn run(cmd: PortgroupCmd, client: &Client, out: Output) -> Result<()> {
    match cmd {
        PortgroupCmd::Create { node, uuid, fields } => {
            let mut body = json!({ "node_uuid": node, "extra": {}, "properties": {} });
            if let Some(u) = uuid {
                body["uuid"] = Value::from(u);
            }
            for (k, v) in given(fields)? {
                match k.split_once('/') {
                    Some((obj, key)) => body[obj][key] = v,
                    None => body[k] = v,
                }
            }
            let doc = client.post("/v1/portgroups", &body).await?;
            out.document(&doc);
        }
        PortgroupCmd::List { node } => {
            let query: Vec<(&str, String)> = node.into_iter().map(|n| ("node", n)).collect();
            let groups = all(client, "/v1/portgroups/detail", &query, "portgroups").await?;
            if out.json {
                output::print_json(&json!({ "portgroups": groups }));
            } else {
                let rows = output::rows(&groups, &["uuid", "name", "address", "node_uuid", "mode"]);
                print!(
                    "{}",
                    output::table(&["UUID", "Name", "Address", "Node UUID", "Mode"], &rows)
                );
            }
        }
        PortgroupCmd::Show { portgroup } => {
            let g = seg(&portgroup);
            let doc = client.get(&format!("/v1/portgroups/{g}"), &[]).await?;
            let ports = all(client, &format!("/v1/portgroups/{g}/ports"), &[], "ports").await?;
            if out.json {
                let mut doc = doc;
                doc["port_uuids"] = ports.iter().map(|p| p["uuid"].clone()).collect();
                output::print_json(&doc);
            } else {
                out.document(&doc);
                let rows = output::rows(&ports, &["uuid", "address"]);
                print!("\nPorts:\n{}", output::table(&["UUID", "Address"], &rows));
            }
        }
        PortgroupCmd::Set { portgroup, fields } => {
            let ops: Vec<Value> = given(fields)?
                .into_iter()
                .map(|(k, v)| json!({"op": "add", "path": format!("/{k}"), "value": v}))
                .collect();
            if ops.is_empty() {
                return Err(anyhow!("nothing to set: give at least one field"));
            }
            let doc = client
                .patch(&format!("/v1/portgroups/{}", seg(&portgroup)), &ops)
                .await?;
            out.document(&doc);
        }
        PortgroupCmd::Unset { portgroup, fields } => {
            let ops: Vec<Value> = fields
                .iter()
                .map(|f| json!({"op": "remove", "path": format!("/{f}")}))
                .collect();
            let doc = client
                .patch(&format!("/v1/portgroups/{}", seg(&portgroup)), &ops)
                .await?;
            out.document(&doc);
        }
        PortgroupCmd::Delete { portgroup } => {
            client
                .delete(&format!("/v1/portgroups/{}", seg(&portgroup)))
                .await?;
            out.note(&format!("Deleted port group {portgroup}"));
        }
    }
    Ok(())
}
