//! `rivet deploy-template …`: Ironic's deploy templates (API 1.55): named deploy steps a
//! deploy runs when the instance asks for the template's name among its traits
//! (`instance_info.traits`). Also the step-file reading and listing `rivet runbook` shares.

use crate::client::{seg, Client};
use crate::output::{self, Output};
use anyhow::{anyhow, Context, Result};
use clap::Subcommand;
use serde_json::{json, Map, Value};

/// `rivet deploy-template` subcommands.
#[derive(Debug, Subcommand)]
pub enum TemplateCmd {
    /// Create a deploy template.
    Create {
        /// Name: a trait (CUSTOM_…).
        name: String,
        /// Steps as JSON (`[{"interface": "deploy", "step": "…", "args": {}, "priority": 150}]`),
        /// or `@FILE` to read them from a file.
        #[arg(long)]
        steps: String,
        /// Free text.
        #[arg(long)]
        description: Option<String>,
        /// UUID (generated when absent).
        #[arg(long)]
        uuid: Option<String>,
        /// Operator data, KEY=VALUE (repeatable).
        #[arg(long = "extra", value_name = "KEY=VALUE")]
        extra: Vec<String>,
    },
    /// List deploy templates.
    List,
    /// Show a deploy template.
    Show {
        /// Name or UUID.
        template: String,
    },
    /// Delete a deploy template.
    Delete {
        /// Name or UUID.
        template: String,
    },
}

/// Steps given as JSON text or `@FILE`.
pub fn read_steps(arg: &str) -> Result<Value> {
    let text = match arg.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?,
        None => arg.to_string(),
    };
    let steps: Value = serde_json::from_str(&text).context("--steps is not JSON")?;
    if !steps.is_array() {
        return Err(anyhow!("--steps must be a JSON list of steps"));
    }
    Ok(steps)
}

/// `KEY=VALUE` pairs as an object.
pub fn pairs(items: &[String]) -> Result<Map<String, Value>> {
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

/// Print the listing of `collection` (`deploy_templates`, `runbooks`).
pub async fn list(client: &Client, out: Output, collection: &str) -> Result<()> {
    let page = client.get(&format!("/v1/{collection}/detail"), &[]).await?;
    let items = page[collection]
        .as_array()
        .cloned()
        .ok_or_else(|| anyhow!("rivetd answered without a {collection:?} list"))?;
    if out.json {
        let mut doc = Map::new();
        doc.insert(collection.into(), Value::Array(items));
        output::print_json(&Value::Object(doc));
    } else {
        let rows: Vec<Vec<String>> = items
            .iter()
            .map(|t| {
                vec![
                    output::cell(&t["uuid"]),
                    output::cell(&t["name"]),
                    t["steps"].as_array().map_or(0, Vec::len).to_string(),
                ]
            })
            .collect();
        print!("{}", output::table(&["UUID", "Name", "Steps"], &rows));
    }
    Ok(())
}

/// Run a `rivet deploy-template` subcommand.
pub async fn run(cmd: TemplateCmd, client: &Client, out: Output) -> Result<()> {
    match cmd {
        TemplateCmd::Create {
            name,
            steps,
            description,
            uuid,
            extra,
        } => {
            let mut body = json!({
                "name": name,
                "steps": read_steps(&steps)?,
                "extra": pairs(&extra)?,
            });
            if let Some(d) = description {
                body["description"] = Value::from(d);
            }
            if let Some(u) = uuid {
                body["uuid"] = Value::from(u);
            }
            let doc = client.post("/v1/deploy_templates", &body).await?;
            out.document(&doc);
        }
        TemplateCmd::List => list(client, out, "deploy_templates").await?,
        TemplateCmd::Show { template } => {
            let doc = client
                .get(&format!("/v1/deploy_templates/{}", seg(&template)), &[])
                .await?;
            out.document(&doc);
        }
        TemplateCmd::Delete { template } => {
            client
                .delete(&format!("/v1/deploy_templates/{}", seg(&template)))
                .await?;
            out.note(&format!("Deleted deploy template {template}"));
        }
    }
    Ok(())
}
