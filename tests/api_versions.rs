//! docs/api-versions.md against a running rivetd: every microversion from 1.1 to the advertised
//! maximum has a row, and every row marked **served** passes its probe at that row's version
//! (a route answers 2xx, or a field is in a node's document and not in one a client of the
//! version before sees). The advertised maximum must not pass the highest version whose every
//! row up to it is served or not applicable (**n/a**: IPA's ramdisk API, Keystone policy).
//!
//! The route table: every route of Ironic's API reference, with the microversion that added
//! it ([`ROUTES`]). A route of a **served** row, or of a **partial** row unless the route is
//! one [`KNOWN_MISSING`] names, must be routed at that version and at the advertised maximum:
//! a request may fail (a missing resource, a bad body) but not with the router's own 404 or a
//! 405.

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
            ["served", "partial", "no", "n/a"].contains(&cells[2]),
            "status must be served, partial, no or n/a: {line}"
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

/// Every route of Ironic's API reference (`api-ref/source/*.inc`) with the microversion that
/// added it. `{node}` is the probe node, `{missing}` a UUID no resource has, `{driver}` a
/// hardware type, `{conductor}` the test's conductor.
const ROUTES: &[(u32, &str, &str)] = &[
    (1, "GET", "/v1/nodes"),
    (1, "POST", "/v1/nodes"),
    (1, "GET", "/v1/nodes/detail"),
    (1, "GET", "/v1/nodes/{node}"),
    (1, "PATCH", "/v1/nodes/{missing}"),
    (1, "DELETE", "/v1/nodes/{missing}"),
    (1, "GET", "/v1/nodes/{node}/states"),
    (1, "PUT", "/v1/nodes/{missing}/states/power"),
    (1, "PUT", "/v1/nodes/{missing}/states/provision"),
    (1, "GET", "/v1/nodes/{node}/states/console"),
    (1, "PUT", "/v1/nodes/{missing}/states/console"),
    (1, "GET", "/v1/nodes/{node}/validate"),
    (1, "PUT", "/v1/nodes/{missing}/maintenance"),
    (1, "DELETE", "/v1/nodes/{missing}/maintenance"),
    (1, "GET", "/v1/nodes/{node}/management/boot_device"),
    (1, "PUT", "/v1/nodes/{missing}/management/boot_device"),
    (
        1,
        "GET",
        "/v1/nodes/{node}/management/boot_device/supported",
    ),
    (1, "GET", "/v1/nodes/{node}/vendor_passthru/methods"),
    (1, "GET", "/v1/nodes/{node}/ports"),
    (1, "GET", "/v1/nodes/{node}/ports/detail"),
    (1, "GET", "/v1/ports"),
    (1, "POST", "/v1/ports"),
    (1, "GET", "/v1/ports/detail"),
    (1, "GET", "/v1/ports/{missing}"),
    (1, "PATCH", "/v1/ports/{missing}"),
    (1, "DELETE", "/v1/ports/{missing}"),
    (1, "GET", "/v1/chassis"),
    (1, "POST", "/v1/chassis"),
    (1, "GET", "/v1/chassis/detail"),
    (1, "GET", "/v1/chassis/{missing}"),
    (1, "PATCH", "/v1/chassis/{missing}"),
    (1, "DELETE", "/v1/chassis/{missing}"),
    (1, "GET", "/v1/chassis/{missing}/nodes"),
    (1, "GET", "/v1/drivers"),
    (1, "GET", "/v1/drivers/{driver}"),
    (1, "GET", "/v1/drivers/{driver}/properties"),
    (1, "GET", "/v1/drivers/{driver}/vendor_passthru/methods"),
    (12, "PUT", "/v1/nodes/{missing}/states/raid"),
    (
        12,
        "GET",
        "/v1/drivers/{driver}/raid/logical_disk_properties",
    ),
    (22, "GET", "/v1/lookup"),
    (22, "POST", "/v1/heartbeat/{missing}"),
    (23, "GET", "/v1/portgroups"),
    (23, "POST", "/v1/portgroups"),
    (23, "GET", "/v1/portgroups/detail"),
    (23, "GET", "/v1/portgroups/{missing}"),
    (23, "PATCH", "/v1/portgroups/{missing}"),
    (23, "DELETE", "/v1/portgroups/{missing}"),
    (24, "GET", "/v1/nodes/{node}/portgroups"),
    (24, "GET", "/v1/nodes/{node}/portgroups/detail"),
    (24, "GET", "/v1/portgroups/{missing}/ports"),
    (24, "GET", "/v1/portgroups/{missing}/ports/detail"),
    (28, "GET", "/v1/nodes/{node}/vifs"),
    (28, "POST", "/v1/nodes/{missing}/vifs"),
    (28, "DELETE", "/v1/nodes/{missing}/vifs/{missing}"),
    (29, "PUT", "/v1/nodes/{missing}/management/inject_nmi"),
    (32, "GET", "/v1/volume"),
    (32, "GET", "/v1/volume/connectors"),
    (32, "POST", "/v1/volume/connectors"),
    (32, "GET", "/v1/volume/connectors/{missing}"),
    (32, "PATCH", "/v1/volume/connectors/{missing}"),
    (32, "DELETE", "/v1/volume/connectors/{missing}"),
    (32, "GET", "/v1/volume/targets"),
    (32, "POST", "/v1/volume/targets"),
    (32, "GET", "/v1/volume/targets/{missing}"),
    (32, "PATCH", "/v1/volume/targets/{missing}"),
    (32, "DELETE", "/v1/volume/targets/{missing}"),
    (32, "GET", "/v1/nodes/{node}/volume"),
    (32, "GET", "/v1/nodes/{node}/volume/connectors"),
    (32, "GET", "/v1/nodes/{node}/volume/targets"),
    (37, "GET", "/v1/nodes/{node}/traits"),
    (37, "PUT", "/v1/nodes/{missing}/traits"),
    (37, "PUT", "/v1/nodes/{missing}/traits/CUSTOM_X"),
    (37, "DELETE", "/v1/nodes/{missing}/traits"),
    (37, "DELETE", "/v1/nodes/{missing}/traits/CUSTOM_X"),
    (40, "GET", "/v1/nodes/{node}/bios"),
    (40, "GET", "/v1/nodes/{node}/bios/{missing}"),
    (49, "GET", "/v1/conductors"),
    (49, "GET", "/v1/conductors/{conductor}"),
    (52, "GET", "/v1/allocations"),
    (52, "POST", "/v1/allocations"),
    (52, "GET", "/v1/allocations/{missing}"),
    (52, "DELETE", "/v1/allocations/{missing}"),
    (52, "GET", "/v1/nodes/{node}/allocation"),
    (52, "DELETE", "/v1/nodes/{missing}/allocation"),
    (54, "POST", "/v1/events"),
    (55, "GET", "/v1/deploy_templates"),
    (55, "POST", "/v1/deploy_templates"),
    (55, "GET", "/v1/deploy_templates/{missing}"),
    (55, "PATCH", "/v1/deploy_templates/{missing}"),
    (55, "DELETE", "/v1/deploy_templates/{missing}"),
    (57, "PATCH", "/v1/allocations/{missing}"),
    (63, "GET", "/v1/nodes/{node}/management/indicators"),
    (76, "PUT", "/v1/nodes/{missing}/states/boot_mode"),
    (76, "PUT", "/v1/nodes/{missing}/states/secure_boot"),
    (78, "GET", "/v1/nodes/{node}/history"),
    (78, "GET", "/v1/nodes/{node}/history/{missing}"),
    (81, "GET", "/v1/nodes/{node}/inventory"),
    (82, "GET", "/v1/shards"),
    (83, "GET", "/v1/nodes/{node}/children"),
    (84, "POST", "/v1/continue_inspection"),
    (86, "GET", "/v1/nodes/{node}/firmware"),
    (89, "POST", "/v1/nodes/{missing}/vmedia"),
    (89, "DELETE", "/v1/nodes/{missing}/vmedia"),
    (92, "GET", "/v1/runbooks"),
    (92, "POST", "/v1/runbooks"),
    (92, "GET", "/v1/runbooks/{missing}"),
    (92, "PATCH", "/v1/runbooks/{missing}"),
    (92, "DELETE", "/v1/runbooks/{missing}"),
    (93, "GET", "/v1/nodes/{node}/vmedia"),
    (96, "GET", "/v1/inspection_rules"),
    (96, "POST", "/v1/inspection_rules"),
    (96, "GET", "/v1/inspection_rules/{missing}"),
    (96, "PATCH", "/v1/inspection_rules/{missing}"),
    (96, "DELETE", "/v1/inspection_rules/{missing}"),
    (96, "DELETE", "/v1/inspection_rules"),
];

/// Routes of **partial** rows that the row's note says are not served (none at present).
/// Only consulted for partial rows: a served row's routes are always checked.
const KNOWN_MISSING: &[&str] = &[];

/// The router's own answer to a path it does not route (`api::not_found`), or a 405 for a
/// method it does not route there; anything else (2xx, 400, a handler's 404 naming a missing
/// resource, 406 from a version gate below the row's version) means the route is there.
fn route_missing(status: u16, body: &str, path: &str) -> bool {
    status == 405 || (status == 404 && body.contains(&format!("the resource {path} could not")))
}

fn send(d: &Rivetd, minor: u32, method: &str, path: &str) -> Result<(u16, String)> {
    let m = reqwest::Method::from_bytes(method.as_bytes())?;
    let mut req = reqwest::blocking::Client::new()
        .request(m.clone(), format!("{}{path}", d.url))
        .header("X-OpenStack-Ironic-API-Version", format!("1.{minor}"));
    if m != reqwest::Method::GET && m != reqwest::Method::DELETE {
        // A body no handler accepts: the route answers 400, nothing is created or changed.
        req = req
            .header("Content-Type", "application/json")
            .body("[\"route-table probe\"]");
    }
    let resp = req.send()?;
    Ok((resp.status().as_u16(), resp.text().unwrap_or_default()))
}

/// The route-table check (module doc): the failures, one line each.
fn missing_routes(d: &Rivetd, rows: &[Row], max: u32, node: &str) -> Result<Vec<String>> {
    let missing_uuid = "0e4f6b8a-0000-4000-8000-00000000dead";
    let mut failures = Vec::new();
    for (minor, method, template) in ROUTES.iter().filter(|r| r.0 <= max) {
        let Some(row) = rows.iter().find(|r| r.minor == *minor) else {
            continue;
        };
        let path = template
            .replace("{node}", node)
            .replace("{missing}", missing_uuid)
            .replace("{driver}", "fake-hardware")
            .replace("{conductor}", "test-conductor");
        if row.status == "n/a" {
            // IPA's ramdisk endpoints: answered with a 404 that says what to boot instead.
            let (status, body) = send(d, max, method, &path)?;
            if status != 404 || !body.contains("ironic-python-agent") {
                failures.push(format!(
                    "{method} {template} (1.{minor}, n/a) must answer 404 naming \
                     ironic-python-agent's API: {status} {body}"
                ));
            }
            continue;
        }
        let checked = row.status == "served"
            || (row.status == "partial" && !KNOWN_MISSING.contains(template));
        if !checked {
            continue;
        }
        // Hidden below its version, as Ironic hides it: a 404 (or what Ironic's older
        // routing answers there, 405 or 406, as for traits); a GET, so nothing changes.
        if *minor > 1 && *method == "GET" {
            let (status, body) = send(d, minor - 1, method, &path)?;
            if ![404, 405, 406].contains(&status) {
                failures.push(format!(
                    "{method} {template} (1.{minor}) answers {status} at 1.{}, not 404: {body}",
                    minor - 1
                ));
            }
        }
        for at in [*minor, max] {
            let (status, body) = send(d, at, method, &path)?;
            if route_missing(status, &body, &path) {
                failures.push(format!(
                    "{method} {template} (1.{minor}, row {}) is not routed at 1.{at}: {status} {body}",
                    row.status
                ));
            }
        }
    }
    Ok(failures)
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
    // Rows past the advertised maximum may stay (what Ironic has that is not advertised).
    let minors: Vec<u32> = rows.iter().map(|r| r.minor).collect();
    let want: Vec<u32> = (1..=max).collect();
    ensure!(
        minors.get(..want.len()) == Some(&want[..]) && minors.windows(2).all(|w| w[1] == w[0] + 1),
        "docs/api-versions.md must have one row per version from 1.1 to at least 1.{max}, in order"
    );
    let advertised: Vec<&Row> = rows.iter().filter(|r| r.minor <= max).collect();

    let name = "probe-node";
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(json!({"driver": "fake-hardware", "name": name})),
    )?;
    ensure!(s == 201, "{v}");

    let mut failures = Vec::new();
    for row in advertised.iter().filter(|r| r.status == "served") {
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
    // Not-applicable rows (IPA's ramdisk API, Keystone policy markers) do not hold the
    // maximum down: no client of the admin API calls them (the table says why per row).
    let truthful = rows
        .iter()
        .take_while(|r| r.status == "served" || r.status == "n/a")
        .last()
        .map(|r| r.minor);
    let served = rows.iter().filter(|r| r.status == "served").count();
    eprintln!(
        "api-versions: {served} of {} microversions served; advertised 1.{max}; every version served up to {}",
        rows.len(),
        truthful.map_or("none (1.1 is partial)".to_string(), |m| format!("1.{m}"))
    );
    let unrouted = missing_routes(&d, &rows, max, name)?;
    // Advertising a version that is not served is the bug this test exists for.
    ensure!(
        truthful.unwrap_or(0) >= max,
        "rivetd advertises 1.{max} but serves every version only up to 1.{}: serve the rows \
         in between or lower MAX_VERSION (protocol/src/api.rs)",
        truthful.unwrap_or(0)
    );
    if !failures.is_empty() || !unrouted.is_empty() {
        bail!(
            "served rows whose probe fails:\n{}\nroutes of advertised, served microversions that are missing:\n{}",
            failures.join("\n"),
            unrouted.join("\n")
        );
    }
    Ok(())
}

/// The gate table, route by route: below the microversion of its row in
/// `api::openapi::OPERATIONS`, every route answers what `api::gates::refusal` says Ironic
/// answers (404, or 405/406/400 where Ironic's controller does), with a message naming the
/// version; at its microversion the gate lets the request through.
#[test]
fn every_route_is_refused_below_its_microversion_as_the_gate_table_says() -> Result<()> {
    use rivet_controller::api::{gates, openapi};
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start_in(dir.path(), "")?;
    let http = reqwest::blocking::Client::new();
    let created = http
        .post(format!("{}/v1/nodes", d.url))
        .header("X-OpenStack-Ironic-API-Version", "latest")
        .json(&json!({"driver": "fake-hardware", "name": "gate"}))
        .send()?;
    ensure!(created.status().as_u16() == 201, "create the probe node");
    let mut failures = Vec::new();
    let mut checked = 0;
    for op in openapi::operations() {
        let Some((major, minor)) = op.since else {
            continue;
        };
        if minor <= 1 {
            continue;
        }
        let path = op
            .path
            .replace("{ident}", "gate")
            .replace("{name}", "fake-hardware")
            .split('/')
            .map(|seg| if seg.starts_with('{') { "x" } else { seg })
            .collect::<Vec<_>>()
            .join("/");
        let method = reqwest::Method::from_bytes(op.method.as_bytes())?;
        let at = |v: String| -> Result<(u16, String)> {
            let mut req = http
                .request(method.clone(), format!("{}{path}", d.url))
                .header("X-OpenStack-Ironic-API-Version", v);
            req = match op.method {
                "PATCH" => req.json(&json!([])),
                "POST" | "PUT" => req.json(&json!({})),
                _ => req,
            };
            let resp = req.send()?;
            Ok((resp.status().as_u16(), resp.text()?))
        };
        let want = gates::refusal(op.method, op.path).as_u16();
        let (below, body) = at(format!("{major}.{}", minor - 1))?;
        if below != want || !body.contains("needs API version") {
            failures.push(format!(
                "{} {} at {major}.{}: {below} {body} (the table says {want})",
                op.method,
                op.path,
                minor - 1
            ));
        }
        let (_, body) = at(format!("{major}.{minor}"))?;
        if body.contains("needs API version") {
            failures.push(format!(
                "{} {} at {major}.{minor}: still refused: {body}",
                op.method, op.path
            ));
        }
        checked += 1;
    }
    ensure!(checked > 100, "only {checked} versioned routes checked");
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}
