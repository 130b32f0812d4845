//! docs/api-versions.md against a running rivetd: every microversion from 1.1 to the advertised
//! maximum has a row, and every row marked **served** passes its probe at that row's version
//! (a route answers 2xx, or a field is in a node's document and not in one a client of the
//! version before sees). Prints the highest version whose
//! every row up to it is served, which is what rivetd could truthfully advertise.

use anyhow::{bail, ensure, Context, Result};
use rivet_tests::Rivetd;
use serde_json::{json, Value};
use std::path::PathBuf;

/// One row of the table.
#[derive(Debug)]
struct Row {
    minor: u32,
    status: String,
    probe: String,
}

fn table() -> Result<Vec<Row>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/api-versions.md");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let mut rows = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("| 1.")) {
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
        ensure!(cells.len() == 5, "a row needs 5 cells: {line}");
        let minor = cells[0]
            .strip_prefix("1.")
            .and_then(|m| m.parse().ok())
            .with_context(|| format!("bad version in {line}"))?;
        ensure!(
            ["served", "partial", "no"].contains(&cells[2]),
            "status must be served, partial or no: {line}"
        );
        rows.push(Row {
            minor,
            status: cells[2].to_string(),
            probe: cells[4].to_string(),
        });
    }
    Ok(rows)
}

fn get(d: &Rivetd, minor: u32, path: &str) -> Result<(u16, Value)> {
    let resp = reqwest::blocking::Client::new()
        .get(format!("{}{path}", d.url))
        .header("X-OpenStack-Ironic-API-Version", format!("1.{minor}"))
        .send()?;
    let status = resp.status().as_u16();
    Ok((status, resp.json().unwrap_or(Value::Null)))
}

#[test]
fn every_served_microversion_passes_its_probe() -> Result<()> {
    let rows = table()?;
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start_in(dir.path(), "")?;
    let (s, root) = d.call("GET", "/v1", None)?;
    ensure!(s == 200, "{root}");
    let max: u32 = root["version"]["version"]
        .as_str()
        .and_then(|v| v.strip_prefix("1."))
        .and_then(|m| m.parse().ok())
        .with_context(|| format!("no version in {root}"))?;
    let minors: Vec<u32> = rows.iter().map(|r| r.minor).collect();
    let want: Vec<u32> = (1..=max).collect();
    ensure!(
        minors == want,
        "docs/api-versions.md must have one row per version 1.1..1.{max}, in order"
    );

    let name = "probe-node";
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(json!({"driver": "fake-hardware", "name": name})),
    )?;
    ensure!(s == 201, "{v}");

    let mut failures = Vec::new();
    for row in rows.iter().filter(|r| r.status == "served") {
        let outcome = if let Some(path) = row.probe.strip_prefix("GET ") {
            let path = path.replace("{name}", name);
            let (s, body) = get(&d, row.minor, &path)?;
            if (200..300).contains(&s) {
                Ok(())
            } else {
                Err(format!("GET {path} at 1.{}: {s} {body}", row.minor))
            }
        } else if let Some(field) = row.probe.strip_prefix("field node.") {
            // Shown from its version on, hidden from clients one version older.
            let (s, node) = get(&d, row.minor, &format!("/v1/nodes/{name}"))?;
            let (_, older) = get(&d, row.minor - 1, &format!("/v1/nodes/{name}"))?;
            if s != 200 || node.get(field).is_none() {
                Err(format!("node at 1.{} lacks {field}: {s} {node}", row.minor))
            } else if row.minor > 1 && older.get(field).is_some() {
                Err(format!("node at 1.{} already shows {field}", row.minor - 1))
            } else {
                Ok(())
            }
        } else if row.probe == "—" {
            Ok(())
        } else {
            Err(format!("1.{}: unknown probe {:?}", row.minor, row.probe))
        };
        if let Err(e) = outcome {
            failures.push(e);
        }
    }
    let truthful = rows
        .iter()
        .take_while(|r| r.status == "served")
        .last()
        .map(|r| r.minor);
    let served = rows.iter().filter(|r| r.status == "served").count();
    eprintln!(
        "api-versions: {served} of {} microversions served; advertised 1.{max}; every version served up to {}",
        rows.len(),
        truthful.map_or("none (1.1 is partial)".to_string(), |m| format!("1.{m}"))
    );
    if !failures.is_empty() {
        bail!("served rows whose probe fails:\n{}", failures.join("\n"));
    }
    Ok(())
}
