//! `rivet shard list`: every shard and how many nodes it holds (`GET /v1/shards`, API 1.82);
//! nodes without a shard are counted under `None`, as Ironic does.

use crate::client::Client;
use crate::output::{self, Output};
use anyhow::{anyhow, Result};
use clap::Subcommand;
use serde_json::Value;

/// `rivet shard …`
#[derive(Debug, Subcommand)]
pub enum ShardCmd {
    /// Every shard with its node count, the most populated first.
    List,
}

/// Run a shard command.
pub async fn run(cmd: ShardCmd, client: &Client, out: Output) -> Result<()> {
    match cmd {
        ShardCmd::List => list(client, out).await,
    }
}

async fn list(client: &Client, out: Output) -> Result<()> {
    let doc = client.get("/v1/shards", &[]).await?;
    if out.json {
        output::print_json(&doc);
        return Ok(());
    }
    let rows = doc
        .get("shards")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("rivetd answered /v1/shards without a \"shards\" list"))?;
    print!(
        "{}",
        output::table(&["Name", "Count"], &output::rows(rows, &["name", "count"]))
    );
    Ok(())
}
