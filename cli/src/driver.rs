//! `rivet driver list|show|properties`: the hardware types rivetd serves (Ironic's drivers
//! API), the live controllers serving each, their interfaces (default and enabled
//! implementations) and the `driver_info` keys each reads.

use crate::client::{seg, Client};
use crate::output::{self, Output};
use anyhow::{anyhow, Result};
use clap::Subcommand;
use serde_json::{Map, Value};

/// `rivet driver …`
#[derive(Debug, Subcommand)]
pub enum DriverCmd {
    /// Every hardware type and the live controllers serving it.
    List,
    /// One hardware type: its interfaces, default and enabled implementations.
    Show {
        /// Hardware type (fake-hardware, redfish, ipmi).
        name: String,
    },
    /// The driver_info keys a hardware type reads, with what each means.
    Properties {
        /// Hardware type (fake-hardware, redfish, ipmi).
        name: String,
    },
}

/// Run a driver command.
pub async fn run(cmd: DriverCmd, client: &Client, out: Output) -> Result<()> {
    match cmd {
        DriverCmd::List => list(client, out).await,
        DriverCmd::Show { name } => show(client, &name, out).await,
        DriverCmd::Properties { name } => properties(client, &name, out).await,
    }
}

/// Lists of names as `a, b` (a table cell would show them as JSON).
fn joined(v: &Value) -> Value {
    match v.as_array() {
        Some(a) if a.iter().all(Value::is_string) => Value::from(
            a.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(", "),
        ),
        _ => v.clone(),
    }
}

async fn list(client: &Client, out: Output) -> Result<()> {
    let page = client.get("/v1/drivers", &[]).await?;
    if out.json {
        output::print_json(&page);
        return Ok(());
    }
    let drivers = page
        .get("drivers")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("rivetd answered /v1/drivers without a \"drivers\" list"))?;
    let rows: Vec<Value> = drivers
        .iter()
        .map(|d| {
            let mut d = d.clone();
            if let Some(h) = d.get("hosts").map(joined) {
                d["hosts"] = h;
            }
            d
        })
        .collect();
    print!(
        "{}",
        output::table(
            &["Driver", "Hosts"],
            &output::rows(&rows, &["name", "hosts"])
        )
    );
    Ok(())
}

async fn show(client: &Client, name: &str, out: Output) -> Result<()> {
    let doc = client
        .get(&format!("/v1/drivers/{}", seg(name)), &[])
        .await?;
    if out.json {
        output::print_json(&doc);
        return Ok(());
    }
    let shown: Map<String, Value> = doc
        .as_object()
        .ok_or_else(|| anyhow!("rivetd answered /v1/drivers/{name} with {doc}"))?
        .iter()
        .map(|(k, v)| (k.clone(), joined(v)))
        .collect();
    out.document(&Value::Object(shown));
    Ok(())
}

async fn properties(client: &Client, name: &str, out: Output) -> Result<()> {
    let doc = client
        .get(&format!("/v1/drivers/{}/properties", seg(name)), &[])
        .await?;
    if out.json {
        output::print_json(&doc);
        return Ok(());
    }
    let props = doc
        .as_object()
        .ok_or_else(|| anyhow!("rivetd answered /v1/drivers/{name}/properties with {doc}"))?;
    let rows: Vec<Vec<String>> = props
        .iter()
        .map(|(k, v)| vec![k.clone(), output::cell(v)])
        .collect();
    print!("{}", output::table(&["Property", "Description"], &rows));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn name_lists_read_as_text() {
        assert_eq!(joined(&json!(["a", "b"])), json!("a, b"));
        assert_eq!(joined(&json!([])), json!(""));
        assert_eq!(joined(&json!("x")), json!("x"));
        let links = json!([{"href": "h", "rel": "self"}]);
        assert_eq!(joined(&links), links);
    }
}
