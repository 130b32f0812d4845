//! `rivet inspection-rule …` (Ironic's `/v1/inspection_rules`, API 1.96) and
//! `rivet discovery list` (nodes enrolled by discovery: `driver_internal_info.auto_discovered`).

use crate::client::{seg, Client};
use crate::output::{self, Output};
use anyhow::{anyhow, Context, Result};
use clap::Subcommand;
use serde_json::{json, Value};

/// `rivet inspection-rule` subcommands.
#[derive(Debug, Subcommand)]
pub enum RuleCmd {
    /// Create a rule from JSON: `--actions '[{"op": "add-trait", "args": {"name": "CUSTOM_X"}}]'`
    /// (each of --conditions/--actions may also be `@FILE`), or a whole rule with `--file`.
    Create {
        /// The whole rule as JSON (`@FILE` or `-` for stdin); flags below override its keys.
        #[arg(long)]
        file: Option<String>,
        /// Conditions: a JSON list of `{"op", "args", "loop", "multiple"}`.
        #[arg(long)]
        conditions: Option<String>,
        /// Actions: a JSON list of `{"op", "args", "loop"}`.
        #[arg(long)]
        actions: Option<String>,
        /// Free text.
        #[arg(long)]
        description: Option<String>,
        /// 0..9999, higher runs first.
        #[arg(long)]
        priority: Option<i64>,
        /// Hide conditions and actions in API output (cannot be unset later).
        #[arg(long)]
        sensitive: bool,
        /// Phase (`main`).
        #[arg(long)]
        phase: Option<String>,
        /// UUID (generated when absent).
        #[arg(long)]
        uuid: Option<String>,
    },
    /// List rules.
    List {
        /// All fields.
        #[arg(long)]
        long: bool,
    },
    /// Show a rule.
    Show {
        /// Rule UUID.
        uuid: String,
    },
    /// Change a rule (JSON patch under the hood).
    Set {
        /// Rule UUID.
        uuid: String,
        /// New conditions (JSON list or `@FILE`).
        #[arg(long)]
        conditions: Option<String>,
        /// New actions (JSON list or `@FILE`).
        #[arg(long)]
        actions: Option<String>,
        /// New description.
        #[arg(long)]
        description: Option<String>,
        /// New priority.
        #[arg(long)]
        priority: Option<i64>,
        /// Mark sensitive.
        #[arg(long)]
        sensitive: bool,
    },
    /// Delete rules.
    Delete {
        /// Rule UUIDs.
        #[arg(required = true)]
        uuids: Vec<String>,
    },
}

/// `rivet discovery` subcommands.
#[derive(Debug, Subcommand)]
pub enum DiscoveryCmd {
    /// Nodes that discovery enrolled.
    List,
}

/// JSON from an argument: literal, `@FILE`, or `-` (stdin).
fn json_arg(what: &str, text: &str) -> Result<Value> {
    let raw = if text == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading stdin")?
    } else if let Some(path) = text.strip_prefix('@') {
        std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?
    } else {
        text.to_string()
    };
    serde_json::from_str(&raw).with_context(|| format!("{what} is not valid JSON"))
}

const TABLE: &[&str] = &["uuid", "priority", "phase", "description"];
const HEADERS: &[&str] = &["UUID", "Priority", "Phase", "Description"];

/// Run a `rivet inspection-rule` subcommand.
pub async fn run(cmd: RuleCmd, client: &Client, out: Output) -> Result<()> {
    match cmd {
        RuleCmd::Create {
            file,
            conditions,
            actions,
            description,
            priority,
            sensitive,
            phase,
            uuid,
        } => {
            let mut body = match file {
                Some(f) => json_arg("--file", &f)?,
                None => json!({}),
            };
            let obj = body
                .as_object_mut()
                .ok_or_else(|| anyhow!("--file must hold a JSON object (one rule)"))?;
            if let Some(c) = conditions {
                obj.insert("conditions".into(), json_arg("--conditions", &c)?);
            }
            if let Some(a) = actions {
                obj.insert("actions".into(), json_arg("--actions", &a)?);
            }
            if !obj.contains_key("actions") {
                return Err(anyhow!("a rule needs --actions (or \"actions\" in --file)"));
            }
            if let Some(d) = description {
                obj.insert("description".into(), Value::from(d));
            }
            if let Some(p) = priority {
                obj.insert("priority".into(), Value::from(p));
            }
            if sensitive {
                obj.insert("sensitive".into(), Value::Bool(true));
            }
            if let Some(p) = phase {
                obj.insert("phase".into(), Value::from(p));
            }
            if let Some(u) = uuid {
                obj.insert("uuid".into(), Value::from(u));
            }
            let doc = client.post("/v1/inspection_rules", &body).await?;
            out.document(&doc);
        }
        RuleCmd::List { long } => {
            let q = [("detail", long.to_string())];
            let doc = client.get("/v1/inspection_rules", &q).await?;
            let rules = doc["inspection_rules"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if out.json {
                output::print_json(&json!({ "inspection_rules": rules }));
            } else {
                let rows = output::rows(&rules, TABLE);
                print!("{}", output::table(HEADERS, &rows));
            }
        }
        RuleCmd::Show { uuid } => {
            let doc = client
                .get(&format!("/v1/inspection_rules/{}", seg(&uuid)), &[])
                .await?;
            out.document(&doc);
        }
        RuleCmd::Set {
            uuid,
            conditions,
            actions,
            description,
            priority,
            sensitive,
        } => {
            let mut ops = Vec::new();
            let mut replace = |path: &str, value: Value| {
                ops.push(json!({"op": "replace", "path": path, "value": value}));
            };
            if let Some(c) = conditions {
                replace("/conditions", json_arg("--conditions", &c)?);
            }
            if let Some(a) = actions {
                replace("/actions", json_arg("--actions", &a)?);
            }
            if let Some(d) = description {
                replace("/description", Value::from(d));
            }
            if let Some(p) = priority {
                replace("/priority", Value::from(p));
            }
            if sensitive {
                replace("/sensitive", Value::Bool(true));
            }
            if ops.is_empty() {
                return Err(anyhow!("nothing to change: give at least one option"));
            }
            let doc = client
                .patch(&format!("/v1/inspection_rules/{}", seg(&uuid)), &ops)
                .await?;
            out.document(&doc);
        }
        RuleCmd::Delete { uuids } => {
            for u in uuids {
                client
                    .delete(&format!("/v1/inspection_rules/{}", seg(&u)))
                    .await?;
                out.note(&format!("Deleted inspection rule {u}"));
            }
        }
    }
    Ok(())
}

/// Run a `rivet discovery` subcommand.
pub async fn run_discovery(cmd: DiscoveryCmd, client: &Client, out: Output) -> Result<()> {
    match cmd {
        DiscoveryCmd::List => {
            let mut nodes = Vec::new();
            let mut page = client.get("/v1/nodes/detail", &[]).await?;
            // Follow `next` links (bounded: a looping server must not hang the CLI).
            for _ in 0..10_000 {
                let got = page["nodes"].as_array().cloned().unwrap_or_default();
                let empty = got.is_empty();
                nodes.extend(
                    got.into_iter()
                        .filter(|n| n["driver_internal_info"]["auto_discovered"] == true),
                );
                match page["next"].as_str().and_then(Client::rebase) {
                    Some(next) if !empty => page = client.get(&next, &[]).await?,
                    _ => break,
                }
            }
            if out.json {
                output::print_json(&json!({ "nodes": nodes }));
            } else {
                let rows: Vec<Vec<String>> = nodes
                    .iter()
                    .map(|n| {
                        let s = |v: &Value| v.as_str().unwrap_or("").to_string();
                        vec![
                            s(&n["uuid"]),
                            s(&n["name"]),
                            s(&n["driver"]),
                            s(&n["provision_state"]),
                            s(&n["driver_internal_info"]["discovered_at"]),
                        ]
                    })
                    .collect();
                print!(
                    "{}",
                    output::table(
                        &[
                            "UUID",
                            "Name",
                            "Driver",
                            "Provisioning State",
                            "Discovered At"
                        ],
                        &rows
                    )
                );
            }
        }
    }
    Ok(())
}
