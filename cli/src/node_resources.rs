//! `rivet node bios|firmware|children|indicator|inject-nmi|boot-mode|secure-boot|raid|console-state`
//! (flattened into `rivet node`) and `rivet volume connector|target …`: node sub-resources
//! and management calls of Ironic's API.

use crate::client::{seg, Client};
use crate::output::{self, Output};
use anyhow::{anyhow, Result};
use clap::Subcommand;
use serde_json::{json, Map, Value};

/// Node sub-resource subcommands (part of `rivet node`).
#[derive(Debug, Subcommand)]
pub enum NodeResourceCmd {
    /// BIOS settings the BMC reported (cached at manage, inspect and clean).
    Bios {
        /// Node UUID or name.
        node: String,
        /// Only this setting.
        setting: Option<String>,
    },
    /// Firmware components and their versions (cached like BIOS settings).
    Firmware {
        /// Node UUID or name.
        node: String,
    },
    /// Child nodes (their parent_node is this node).
    Children {
        /// Node UUID or name.
        node: String,
    },
    /// Indicator LEDs: list them, or read or set one (NAME@COMPONENT).
    Indicator {
        /// Node UUID or name.
        node: String,
        /// The indicator, as `rivet node indicator NODE` lists it.
        indicator: Option<String>,
        /// Set it: ON, OFF or BLINKING.
        #[arg(long)]
        state: Option<String>,
    },
    /// Inject a non-maskable interrupt.
    InjectNmi {
        /// Node UUID or name.
        node: String,
    },
    /// Set the boot mode (bios or uefi) through the BMC.
    BootMode {
        /// Node UUID or name.
        node: String,
        /// bios or uefi.
        mode: String,
    },
    /// Turn UEFI secure boot on or off through the BMC.
    SecureBoot {
        /// Node UUID or name.
        node: String,
        /// on or off.
        #[arg(value_parser = ["on", "off"])]
        state: String,
    },
    /// RAID configurations: `show` the target and current ones, `set` the target one.
    #[command(subcommand)]
    Raid(RaidCmd),
    /// The console state: enabled, and its console_info (`rivet node console` attaches).
    ConsoleState {
        /// Node UUID or name.
        node: String,
    },
}

fn node_path(node: &str) -> String {
    format!("/v1/nodes/{}", seg(node))
}

fn list_of(doc: &Value, key: &str) -> Vec<Value> {
    doc.get(key)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn table(out: Output, doc: &Value, key: &str, keys: &[&str], headers: &[&str]) {
    if out.json {
        output::print_json(doc);
    } else {
        let rows = output::rows(&list_of(doc, key), keys);
        print!("{}", output::table(headers, &rows));
    }
}

/// Run a node sub-resource subcommand.
pub async fn run(cmd: NodeResourceCmd, client: &Client, out: Output) -> Result<()> {
    match cmd {
        NodeResourceCmd::Bios { node, setting } => match setting {
            Some(s) => {
                let doc = client
                    .get(&format!("{}/bios/{}", node_path(&node), seg(&s)), &[])
                    .await?;
                out.document(doc.get(&s).unwrap_or(&doc));
            }
            None => {
                let doc = client
                    .get(&format!("{}/bios", node_path(&node)), &[])
                    .await?;
                table(out, &doc, "bios", &["name", "value"], &["Name", "Value"]);
            }
        },
        NodeResourceCmd::Firmware { node } => {
            let doc = client
                .get(&format!("{}/firmware", node_path(&node)), &[])
                .await?;
            table(
                out,
                &doc,
                "firmware",
                &[
                    "component",
                    "initial_version",
                    "current_version",
                    "vendor",
                    "model",
                    "serial_number",
                ],
                &[
                    "Component",
                    "Initial Version",
                    "Current Version",
                    "Vendor",
                    "Model",
                    "Serial Number",
                ],
            );
        }
        NodeResourceCmd::Children { node } => {
            let doc = client
                .get(&format!("{}/children", node_path(&node)), &[])
                .await?;
            if out.json {
                output::print_json(&doc);
            } else {
                for c in list_of(&doc, "children") {
                    println!("{}", output::cell(&c));
                }
            }
        }
        NodeResourceCmd::Indicator {
            node,
            indicator,
            state,
        } => {
            let base = format!("{}/management/indicators", node_path(&node));
            match (indicator, state) {
                (None, None) => {
                    let doc = client.get(&base, &[]).await?;
                    table(
                        out,
                        &doc,
                        "indicators",
                        &["name", "component", "readonly", "states"],
                        &["Name", "Component", "Read Only", "States"],
                    );
                }
                (Some(i), None) => {
                    let doc = client.get(&format!("{base}/{}", seg(&i)), &[]).await?;
                    out.document(&doc);
                }
                (Some(i), Some(s)) => {
                    client
                        .put(&format!("{base}/{}", seg(&i)), Some(&json!({ "state": s })))
                        .await?;
                    out.note(&format!("Indicator {i} of node {node} set to {s}"));
                }
                (None, Some(_)) => return Err(anyhow!("--state needs an INDICATOR")),
            }
        }
        NodeResourceCmd::InjectNmi { node } => {
            client
                .put(
                    &format!("{}/management/inject_nmi", node_path(&node)),
                    Some(&json!({})),
                )
                .await?;
            out.note(&format!("NMI injected into node {node}"));
        }
        NodeResourceCmd::BootMode { node, mode } => {
            client
                .put(
                    &format!("{}/states/boot_mode", node_path(&node)),
                    Some(&json!({ "target": mode })),
                )
                .await?;
            out.note(&format!("Boot mode of node {node} set to {mode}"));
        }
        NodeResourceCmd::SecureBoot { node, state } => {
            client
                .put(
                    &format!("{}/states/secure_boot", node_path(&node)),
                    Some(&json!({ "target": state == "on" })),
                )
                .await?;
            out.note(&format!("Secure boot of node {node} turned {state}"));
        }
        NodeResourceCmd::Raid(RaidCmd::Set { node, config, file }) => {
            let cfg = raid_config(config, file)?;
            client
                .put(&format!("{}/states/raid", node_path(&node)), Some(&cfg))
                .await?;
            out.note(&format!("Target RAID configuration of node {node} set"));
        }
        NodeResourceCmd::Raid(RaidCmd::Show { node }) => {
            let doc = client
                .get(&format!("{}/states", node_path(&node)), &[])
                .await?;
            let keep: Map<String, Value> = ["target_raid_config", "raid_config"]
                .iter()
                .map(|k| {
                    (
                        (*k).to_string(),
                        doc.get(*k).cloned().unwrap_or(Value::Null),
                    )
                })
                .collect();
            out.document(&Value::Object(keep));
        }
        NodeResourceCmd::ConsoleState { node } => {
            let doc = client
                .get(&format!("{}/states/console", node_path(&node)), &[])
                .await?;
            out.document(&doc);
        }
    }
    Ok(())
}

/// `rivet node raid` subcommands.
#[derive(Debug, Subcommand)]
pub enum RaidCmd {
    /// Show the node's `target_raid_config` and `raid_config`.
    Show {
        /// Node UUID or name.
        node: String,
    },
    /// Set the target RAID configuration (checked by rivetd against Ironic's RAID schema;
    /// `{}` clears it).
    Set {
        /// Node UUID or name.
        node: String,
        /// The configuration as JSON, e.g. '{"logical_disks": [{"raid_level": "1", "size_gb": 100}]}'.
        #[arg(required_unless_present = "file", conflicts_with = "file")]
        config: Option<String>,
        /// Read the configuration from this JSON file instead.
        #[arg(long)]
        file: Option<std::path::PathBuf>,
    },
}

/// The target RAID configuration of `rivet node raid set`, from its argument or its file.
fn raid_config(config: Option<String>, file: Option<std::path::PathBuf>) -> Result<Value> {
    let (text, from) = match (config, file) {
        (Some(c), _) => (c, "the configuration argument".to_string()),
        (None, Some(f)) => (
            std::fs::read_to_string(&f)
                .map_err(|e| anyhow!("cannot read --file {}: {e}", f.display()))?,
            format!("--file {}", f.display()),
        ),
        (None, None) => return Err(anyhow!("give the configuration as JSON or with --file")),
    };
    let cfg: Value = serde_json::from_str(&text).map_err(|e| anyhow!("{from} is not JSON: {e}"))?;
    if !cfg.is_object() {
        return Err(anyhow!(
            "{from} must be a JSON object such as {{\"logical_disks\": [...]}}, not {cfg}"
        ));
    }
    Ok(cfg)
}

/// `rivet volume` subcommands.
#[derive(Debug, Subcommand)]
pub enum VolumeCmd {
    /// Volume connectors: how a node reaches a storage network.
    #[command(subcommand)]
    Connector(ConnectorCmd),
    /// Volume targets: volumes a node may attach and boot from.
    #[command(subcommand)]
    Target(TargetCmd),
}

/// `rivet volume connector` subcommands.
#[derive(Debug, Subcommand)]
pub enum ConnectorCmd {
    /// Create a connector.
    Create {
        /// Node UUID or name.
        #[arg(long)]
        node: String,
        /// iqn, ip, mac, wwnn, wwpn, port or portgroup.
        #[arg(long = "type")]
        kind: String,
        /// The identifier of that type.
        #[arg(long)]
        connector_id: String,
        /// Operator data, KEY=VALUE (repeatable).
        #[arg(long = "extra", value_name = "KEY=VALUE")]
        extra: Vec<String>,
    },
    /// List connectors (all, or one node's).
    List {
        /// Only this node's.
        #[arg(long)]
        node: Option<String>,
    },
    /// Show a connector.
    Show {
        /// Connector UUID.
        uuid: String,
    },
    /// Delete a connector (the node must be powered off, or manageable or enroll).
    Delete {
        /// Connector UUID.
        uuid: String,
    },
}

/// `rivet volume target` subcommands.
#[derive(Debug, Subcommand)]
pub enum TargetCmd {
    /// Create a target.
    Create {
        /// Node UUID or name.
        #[arg(long)]
        node: String,
        /// The volume's type (iscsi, fibre_channel, …).
        #[arg(long = "type")]
        volume_type: String,
        /// The volume's identifier in the block storage service.
        #[arg(long)]
        volume_id: String,
        /// Boot order on the node (unique per node).
        #[arg(long)]
        boot_index: u32,
        /// Properties, KEY=VALUE (repeatable).
        #[arg(long = "property", value_name = "KEY=VALUE")]
        properties: Vec<String>,
    },
    /// List targets (all, or one node's).
    List {
        /// Only this node's.
        #[arg(long)]
        node: Option<String>,
    },
    /// Show a target.
    Show {
        /// Target UUID.
        uuid: String,
    },
    /// Delete a target (the node must be powered off, or manageable or enroll).
    Delete {
        /// Target UUID.
        uuid: String,
    },
}

fn pairs(flag: &str, items: &[String]) -> Result<Map<String, Value>> {
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

/// A node's UUID (volume bodies name nodes by UUID).
async fn node_uuid(client: &Client, node: &str) -> Result<String> {
    let doc = client.get(&node_path(node), &[]).await?;
    doc["uuid"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow!("node {node} has no uuid in rivetd's answer"))
}

async fn listing(client: &Client, kind: &str, node: Option<String>) -> Result<Value> {
    let path = match node {
        Some(n) => format!("{}/volume/{kind}", node_path(&n)),
        None => format!("/v1/volume/{kind}"),
    };
    Ok(client.get(&path, &[("detail", "true".to_string())]).await?)
}

/// Run a `rivet volume` subcommand.
pub async fn run_volume(cmd: VolumeCmd, client: &Client, out: Output) -> Result<()> {
    match cmd {
        VolumeCmd::Connector(c) => match c {
            ConnectorCmd::Create {
                node,
                kind,
                connector_id,
                extra,
            } => {
                let body = json!({
                    "node_uuid": node_uuid(client, &node).await?,
                    "type": kind,
                    "connector_id": connector_id,
                    "extra": pairs("extra", &extra)?,
                });
                out.document(&client.post("/v1/volume/connectors", &body).await?);
            }
            ConnectorCmd::List { node } => {
                let doc = listing(client, "connectors", node).await?;
                table(
                    out,
                    &doc,
                    "connectors",
                    &["uuid", "node_uuid", "type", "connector_id"],
                    &["UUID", "Node UUID", "Type", "Connector ID"],
                );
            }
            ConnectorCmd::Show { uuid } => {
                let doc = client
                    .get(&format!("/v1/volume/connectors/{}", seg(&uuid)), &[])
                    .await?;
                out.document(&doc);
            }
            ConnectorCmd::Delete { uuid } => {
                client
                    .delete(&format!("/v1/volume/connectors/{}", seg(&uuid)))
                    .await?;
                out.note(&format!("Deleted volume connector {uuid}"));
            }
        },
        VolumeCmd::Target(t) => match t {
            TargetCmd::Create {
                node,
                volume_type,
                volume_id,
                boot_index,
                properties,
            } => {
                let body = json!({
                    "node_uuid": node_uuid(client, &node).await?,
                    "volume_type": volume_type,
                    "volume_id": volume_id,
                    "boot_index": boot_index,
                    "properties": pairs("property", &properties)?,
                });
                out.document(&client.post("/v1/volume/targets", &body).await?);
            }
            TargetCmd::List { node } => {
                let doc = listing(client, "targets", node).await?;
                table(
                    out,
                    &doc,
                    "targets",
                    &[
                        "uuid",
                        "node_uuid",
                        "volume_type",
                        "boot_index",
                        "volume_id",
                    ],
                    &["UUID", "Node UUID", "Type", "Boot Index", "Volume ID"],
                );
            }
            TargetCmd::Show { uuid } => {
                let doc = client
                    .get(&format!("/v1/volume/targets/{}", seg(&uuid)), &[])
                    .await?;
                out.document(&doc);
            }
            TargetCmd::Delete { uuid } => {
                client
                    .delete(&format!("/v1/volume/targets/{}", seg(&uuid)))
                    .await?;
                out.note(&format!("Deleted volume target {uuid}"));
            }
        },
    }
    Ok(())
}
