//! `rivet runbook …`: Ironic's runbooks (API 1.92): named steps a node whose traits include
//! the runbook's name runs with `rivet runbook clean` (a manual clean by runbook).

use crate::client::{seg, Client};
use crate::output::Output;
use crate::template::{list, pairs, read_steps};
use anyhow::Result;
use clap::Subcommand;
use serde_json::{json, Value};

/// `rivet runbook` subcommands.
#[derive(Debug, Subcommand)]
pub enum RunbookCmd {
    /// Create a runbook.
    Create {
        /// Name: a trait (CUSTOM_…) nodes allowed to run it carry.
        name: String,
        /// Steps as JSON (`[{"interface": "deploy", "step": "…", "args": {}, "order": 1}]`),
        /// or `@FILE` to read them from a file.
        #[arg(long)]
        steps: String,
        /// Visible to every project.
        #[arg(long)]
        public: bool,
        /// Owning project.
        #[arg(long)]
        owner: Option<String>,
        /// Run the steps without booting the ramdisk (out-of-band steps only).
        #[arg(long)]
        disable_ramdisk: bool,
        /// UUID (generated when absent).
        #[arg(long)]
        uuid: Option<String>,
        /// Operator data, KEY=VALUE (repeatable).
        #[arg(long = "extra", value_name = "KEY=VALUE")]
        extra: Vec<String>,
    },
    /// List runbooks.
    List,
    /// Show a runbook.
    Show {
        /// Name or UUID.
        runbook: String,
    },
    /// Delete a runbook.
    Delete {
        /// Name or UUID.
        runbook: String,
    },
    /// Clean a `manageable` node with the runbook's steps.
    Clean {
        /// Node name or UUID.
        node: String,
        /// Runbook name or UUID.
        runbook: String,
    },
}

/// Run a `rivet runbook` subcommand.
pub async fn run(cmd: RunbookCmd, client: &Client, out: Output) -> Result<()> {
    match cmd {
        RunbookCmd::Create {
            name,
            steps,
            public,
            owner,
            disable_ramdisk,
            uuid,
            extra,
        } => {
            let mut body = json!({
                "name": name,
                "steps": read_steps(&steps)?,
                "extra": pairs(&extra)?,
                "public": public,
                "disable_ramdisk": disable_ramdisk,
            });
            if let Some(o) = owner {
                body["owner"] = Value::from(o);
            }
            if let Some(u) = uuid {
                body["uuid"] = Value::from(u);
            }
            let doc = client.post("/v1/runbooks", &body).await?;
            out.document(&doc);
        }
        RunbookCmd::List => list(client, out, "runbooks").await?,
        RunbookCmd::Show { runbook } => {
            let doc = client
                .get(&format!("/v1/runbooks/{}", seg(&runbook)), &[])
                .await?;
            out.document(&doc);
        }
        RunbookCmd::Delete { runbook } => {
            client
                .delete(&format!("/v1/runbooks/{}", seg(&runbook)))
                .await?;
            out.note(&format!("Deleted runbook {runbook}"));
        }
        RunbookCmd::Clean { node, runbook } => {
            client
                .put(
                    &format!("/v1/nodes/{}/states/provision", seg(&node)),
                    Some(&json!({"target": "clean", "runbook": runbook})),
                )
                .await?;
            out.note(&format!(
                "Cleaning of node {node} with runbook {runbook} started"
            ));
        }
    }
    Ok(())
}
