//! `rivet conductor list`: the controllers sharing rivetd's database, whether each is alive,
//! when it last heartbeat, and how many nodes the hash ring gives it now.

use crate::client::Client;
use crate::output::{self, Output};
use anyhow::{anyhow, Result};
use clap::Subcommand;
use serde_json::{json, Value};
use std::collections::HashMap;

/// `rivet conductor …`
#[derive(Debug, Subcommand)]
pub enum ConductorCmd {
    /// Every registered controller, with its liveness and its share of the nodes.
    List,
}

/// Run a conductor command.
pub async fn run(cmd: ConductorCmd, client: &Client, out: Output) -> Result<()> {
    match cmd {
        ConductorCmd::List => list(client, out).await,
    }
}

async fn list(client: &Client, out: Output) -> Result<()> {
    let page = client
        .get("/v1/conductors", &[("detail", "true".into())])
        .await?;
    let mut rows = page
        .get("conductors")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("rivetd answered /v1/conductors without a \"conductors\" list"))?
        .clone();
    // Ownership is computed by whichever controller answers; one listing of node owners.
    let nodes = client
        .get(
            "/v1/nodes",
            &[
                ("fields", "uuid,conductor".into()),
                ("limit", "1000".into()),
            ],
        )
        .await?;
    let mut owned: HashMap<String, usize> = HashMap::new();
    for n in nodes
        .get("nodes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(c) = n.get("conductor").and_then(Value::as_str) {
            *owned.entry(c.to_string()).or_default() += 1;
        }
    }
    for r in &mut rows {
        let name = r
            .get("hostname")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let count = owned.get(name).copied().unwrap_or(0);
        r["nodes"] = json!(count);
    }
    if out.json {
        output::print_json(&json!({ "conductors": rows }));
        return Ok(());
    }
    let keys = ["hostname", "alive", "updated_at", "created_at", "nodes"];
    let headers = [
        "Conductor",
        "Alive",
        "Last seen",
        "Started",
        "Nodes (first 1000)",
    ];
    print!("{}", output::table(&headers, &output::rows(&rows, &keys)));
    Ok(())
}
