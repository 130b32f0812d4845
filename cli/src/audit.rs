//! `rivet audit`: the audit trail (admin credentials only): who changed what, from where,
//! with what result, and each provision transition with its cause.

use crate::client::Client;
use crate::output::{self, Output};
use anyhow::{anyhow, Result};
use clap::Args;
use serde_json::{json, Value};

/// Field and header of each column; the detail comes last (it is cut to fit).
const COLUMNS: &[(&str, &str)] = &[
    ("seq", "Seq"),
    ("created_at", "Time"),
    ("actor", "Actor"),
    ("source", "Source"),
    ("action", "Action"),
    ("node_uuid", "Node UUID"),
    ("status", "Status"),
    ("detail", "Detail"),
];

/// `rivet audit` arguments.
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Only rows about this node (UUID or name).
    #[arg(long)]
    node: Option<String>,
    /// How many of the newest rows to show.
    #[arg(long, default_value_t = 50)]
    limit: usize,
}

/// Print the newest `limit` rows, oldest at the top like a log.
pub async fn run(args: AuditArgs, client: &Client, out: Output) -> Result<()> {
    let mut query = vec![("limit", args.limit.to_string())];
    if let Some(n) = args.node {
        query.push(("node", n));
    }
    let page = client.get("/v1/audit", &query).await?;
    let mut rows = page
        .get("audit")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("rivetd answered /v1/audit without an \"audit\" list"))?
        .clone();
    rows.reverse();
    if out.json {
        output::print_json(&json!({ "audit": rows }));
        return Ok(());
    }
    let keys: Vec<&str> = COLUMNS.iter().map(|c| c.0).collect();
    let headers: Vec<&str> = COLUMNS.iter().map(|c| c.1).collect();
    let mut cells = output::rows(&rows, &keys);
    for row in &mut cells {
        if let Some(detail) = row.last_mut() {
            *detail = output::truncate(detail, 120);
        }
    }
    print!("{}", output::table(&headers, &cells));
    Ok(())
}
