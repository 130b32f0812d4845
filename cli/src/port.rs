//! `rivet port …`: a node's NICs (MACs the agent is looked up by) with Ironic's port fields,
//! and `rivet node vif …` (VIFs attached to a node's ports and port groups).

use crate::client::{seg, Client};
use crate::output::{self, Output};
use anyhow::{anyhow, Result};
use clap::{Args, Subcommand};
use serde_json::{json, Map, Value};

/// Fields `rivet port create` and `rivet port set` share.
#[derive(Debug, Args, Default)]
pub struct PortFields {
    /// Unique name (API 1.88).
    #[arg(long)]
    name: Option<String>,
    /// Port group UUID or name it belongs to.
    #[arg(long)]
    portgroup: Option<String>,
    /// Physical network.
    #[arg(long)]
    physical_network: Option<String>,
    /// Local link connection, KEY=VALUE (switch_id, port_id, switch_info, hostname,
    /// network_type; repeatable).
    #[arg(long = "local-link-connection", value_name = "KEY=VALUE")]
    local_link_connection: Vec<String>,
    /// Operator data, KEY=VALUE (repeatable).
    #[arg(long = "extra", value_name = "KEY=VALUE")]
    extra: Vec<String>,
    /// Whether this is a Smart NIC.
    #[arg(long, value_name = "true|false", action = clap::ArgAction::Set)]
    is_smartnic: Option<bool>,
    /// Free text (API 1.97).
    #[arg(long)]
    description: Option<String>,
    /// NIC vendor (API 1.100).
    #[arg(long)]
    vendor: Option<String>,
    /// Category (API 1.101).
    #[arg(long)]
    category: Option<String>,
}

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
        /// UUID (generated when absent).
        #[arg(long)]
        uuid: Option<String>,
        #[command(flatten)]
        fields: PortFields,
    },
    /// List ports (all pages), optionally of one node or port group.
    List {
        /// Node UUID or name.
        #[arg(long)]
        node: Option<String>,
        /// Port group UUID or name.
        #[arg(long)]
        portgroup: Option<String>,
        /// MAC address.
        #[arg(long)]
        address: Option<String>,
    },
    /// Show a port.
    Show {
        /// Port UUID or name.
        port: String,
    },
    /// Change fields of a port.
    Set {
        /// Port UUID or name.
        port: String,
        /// New MAC address.
        #[arg(long)]
        address: Option<String>,
        /// Move the port to this node (UUID).
        #[arg(long)]
        node: Option<String>,
        /// Whether the node PXE-boots from this port.
        #[arg(long, value_name = "true|false", action = clap::ArgAction::Set)]
        pxe_enabled: Option<bool>,
        #[command(flatten)]
        fields: PortFields,
    },
    /// Clear fields of a port (name, portgroup, physical_network, description, vendor,
    /// category, local_link_connection, or extra/KEY).
    Unset {
        /// Port UUID or name.
        port: String,
        /// Field to clear (repeatable).
        #[arg(long = "field", required = true)]
        fields: Vec<String>,
    },
    /// Delete a port.
    Delete {
        /// Port UUID.
        uuid: String,
    },
}

/// `rivet node vif list|attach|detach NODE …`.
#[derive(Debug, Subcommand)]
pub enum VifCmd {
    /// The VIFs attached to a node.
    List {
        /// Node UUID or name.
        node: String,
    },
    /// Attach a VIF to a free port or port group of the node.
    Attach {
        /// Node UUID or name.
        node: String,
        /// VIF ID.
        vif: String,
        /// Attach to this port (API 1.67).
        #[arg(long, conflicts_with = "portgroup_uuid")]
        port_uuid: Option<String>,
        /// Attach to this port group (API 1.67).
        #[arg(long)]
        portgroup_uuid: Option<String>,
    },
    /// Detach a VIF.
    Detach {
        /// Node UUID or name.
        node: String,
        /// VIF ID.
        vif: String,
    },
}

/// Pages fetched at most when following `next` links (a guard against a looping server).
const MAX_PAGES: usize = 10_000;

/// `KEY=VALUE` items as an object.
pub fn pairs(flag: &str, items: &[String]) -> Result<Map<String, Value>> {
    items
        .iter()
        .map(|kv| {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| anyhow!("--{flag} {kv:?} is not KEY=VALUE"))?;
            Ok((k.to_string(), Value::from(v)))
        })
        .collect()
}

/// Every item of a paged listing, following `next` links.
pub async fn all(
    client: &Client,
    first: &str,
    query: &[(&str, String)],
    key: &str,
) -> Result<Vec<Value>> {
    let mut items: Vec<Value> = Vec::new();
    let mut page = client.get(first, query).await?;
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

/// The fields given, as `(field, value)`.
fn given(f: PortFields) -> Result<Vec<(&'static str, Value)>> {
    let mut out: Vec<(&'static str, Value)> = Vec::new();
    for (k, v) in [
        ("name", f.name),
        ("portgroup_uuid", f.portgroup),
        ("physical_network", f.physical_network),
        ("description", f.description),
        ("vendor", f.vendor),
        ("category", f.category),
    ] {
        if let Some(v) = v {
            out.push((k, Value::from(v)));
        }
    }
    if let Some(b) = f.is_smartnic {
        out.push(("is_smartnic", Value::from(b)));
    }
    if !f.local_link_connection.is_empty() {
        out.push((
            "local_link_connection",
            Value::Object(pairs("local-link-connection", &f.local_link_connection)?),
        ));
    }
    if !f.extra.is_empty() {
        out.push(("extra", Value::Object(pairs("extra", &f.extra)?)));
    }
    Ok(out)
}

fn table(out: Output, key: &str, items: Vec<Value>, cols: &[(&str, &str)]) {
    if out.json {
        output::print_json(&json!({ key: items }));
    } else {
        let keys: Vec<&str> = cols.iter().map(|c| c.0).collect();
        let heads: Vec<&str> = cols.iter().map(|c| c.1).collect();
        print!("{}", output::table(&heads, &output::rows(&items, &keys)));
    }
}

/// Run a `rivet port` subcommand.
pub async fn run(cmd: PortCmd, client: &Client, out: Output) -> Result<()> {
    match cmd {
        PortCmd::Create {
            node,
            address,
            pxe_enabled,
            uuid,
            fields,
        } => {
            // node_ident takes a name or UUID (API 1.94).
            let mut body = json!({
                "address": address,
                "node_ident": node,
                "pxe_enabled": pxe_enabled,
            });
            if let Some(u) = uuid {
                body["uuid"] = Value::from(u);
            }
            for (k, v) in given(fields)? {
                body[k] = v;
            }
            let doc = client.post("/v1/ports", &body).await?;
            out.document(&doc);
        }
        PortCmd::List {
            node,
            portgroup,
            address,
        } => {
            let query: Vec<(&str, String)> = [("node", node), ("portgroup", portgroup)]
                .into_iter()
                .chain([("address", address)])
                .filter_map(|(k, v)| v.map(|v| (k, v)))
                .collect();
            let ports = all(client, "/v1/ports/detail", &query, "ports").await?;
            table(
                out,
                "ports",
                ports,
                &[
                    ("uuid", "UUID"),
                    ("address", "Address"),
                    ("name", "Name"),
                    ("node_uuid", "Node UUID"),
                    ("portgroup_uuid", "Port Group UUID"),
                    ("pxe_enabled", "PXE Enabled"),
                ],
            );
        }
        PortCmd::Show { port } => {
            let doc = client
                .get(&format!("/v1/ports/{}", seg(&port)), &[])
                .await?;
            out.document(&doc);
        }
        PortCmd::Set {
            port,
            address,
            node,
            pxe_enabled,
            fields,
        } => {
            let mut ops: Vec<Value> = Vec::new();
            let mut add = |path: &str, value: Value| {
                ops.push(json!({"op": "add", "path": format!("/{path}"), "value": value}));
            };
            if let Some(a) = address {
                add("address", Value::from(a));
            }
            if let Some(n) = node {
                add("node_uuid", Value::from(n));
            }
            if let Some(p) = pxe_enabled {
                add("pxe_enabled", Value::from(p));
            }
            for (k, v) in given(fields)? {
                match (k, v) {
                    // Keys are added one by one, as `baremetal port set --extra` does.
                    ("extra" | "local_link_connection", Value::Object(m)) => {
                        for (mk, mv) in m {
                            add(&format!("{k}/{mk}"), mv);
                        }
                    }
                    (k, v) => add(k, v),
                }
            }
            if ops.is_empty() {
                return Err(anyhow!("nothing to set: give at least one field"));
            }
            let doc = client
                .patch(&format!("/v1/ports/{}", seg(&port)), &ops)
                .await?;
            out.document(&doc);
        }
        PortCmd::Unset { port, fields } => {
            let ops: Vec<Value> = fields
                .iter()
                .map(|f| {
                    let f = if f == "portgroup" {
                        "portgroup_uuid"
                    } else {
                        f
                    };
                    json!({"op": "remove", "path": format!("/{f}")})
                })
                .collect();
            let doc = client
                .patch(&format!("/v1/ports/{}", seg(&port)), &ops)
                .await?;
            out.document(&doc);
        }
        PortCmd::Delete { uuid } => {
            client.delete(&format!("/v1/ports/{}", seg(&uuid))).await?;
            out.note(&format!("Deleted port {uuid}"));
        }
    }
    Ok(())
}

/// Run a `rivet node vif` subcommand.
pub async fn run_vif(cmd: VifCmd, client: &Client, out: Output) -> Result<()> {
    match cmd {
        VifCmd::List { node } => {
            let doc = client
                .get(&format!("/v1/nodes/{}/vifs", seg(&node)), &[])
                .await?;
            let vifs = doc
                .get("vifs")
                .and_then(Value::as_array)
                .cloned()
                .ok_or_else(|| anyhow!("rivetd answered without a \"vifs\" list"))?;
            table(out, "vifs", vifs, &[("id", "ID")]);
        }
        VifCmd::Attach {
            node,
            vif,
            port_uuid,
            portgroup_uuid,
        } => {
            let mut body = json!({ "id": vif });
            if let Some(p) = port_uuid {
                body["port_uuid"] = Value::from(p);
            }
            if let Some(g) = portgroup_uuid {
                body["portgroup_uuid"] = Value::from(g);
            }
            client
                .post(&format!("/v1/nodes/{}/vifs", seg(&node)), &body)
                .await?;
            out.note(&format!("Attached VIF {vif} to node {node}"));
        }
        VifCmd::Detach { node, vif } => {
            client
                .delete(&format!("/v1/nodes/{}/vifs/{}", seg(&node), seg(&vif)))
                .await?;
            out.note(&format!("Detached VIF {vif} from node {node}"));
        }
    }
    Ok(())
}
