//! `rivet node logs NODE [ID]`: the agent logs rivetd kept with a node when a step failed on
//! the ramdisk (`GET /v1/nodes/{node}/logs[/{id}]`, a Rivet extension).

use crate::client::{seg, Client};
use crate::output::Output;
use anyhow::Result;
use clap::Args;
use serde_json::Value;

/// `rivet node logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// Node UUID or name.
    pub node: String,
    /// One log's id (default: every kept log, newest first).
    pub id: Option<String>,
}

pub async fn run(client: &Client, out: Output, a: LogsArgs) -> Result<()> {
    let base = format!("/v1/nodes/{}/logs", seg(&a.node));
    let doc = match &a.id {
        Some(id) => client.get(&format!("{base}/{}", seg(id)), &[]).await?,
        None => client.get(&base, &[]).await?,
    };
    if out.json {
        crate::output::print_json(&doc);
        return Ok(());
    }
    let logs = match doc.get("logs").and_then(Value::as_array) {
        Some(list) => list.clone(),
        None => vec![doc],
    };
    if logs.is_empty() {
        out.note(&format!("Node {} has no agent logs kept", a.node));
        return Ok(());
    }
    for log in &logs {
        print!("{}", render(log));
    }
    Ok(())
}

/// A header line (id, time, operation, step, command) and the text.
fn render(log: &Value) -> String {
    let field = |k: &str| match log.get(k) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "-".to_string(),
        Some(v) => v.to_string(),
    };
    format!(
        "=== agent log {} at {}: {} step {} (command {}) ===\n{}\n",
        field("id"),
        field("created_at"),
        field("operation"),
        field("step"),
        field("command_id"),
        field("text").trim_end()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_header_and_text() {
        let log = serde_json::json!({"id": 3, "created_at": "t", "operation": "clean",
            "step": "boom", "command_id": null, "text": "line 1\nline 2\n"});
        assert_eq!(
            render(&log),
            "=== agent log 3 at t: clean step boom (command -) ===\nline 1\nline 2\n"
        );
    }
}
