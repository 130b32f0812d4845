//! docs/openapi.json against the code and the running server: the committed file equals what
//! `rivetd openapi` generates; the real router (built by `server::build`, as rivetd builds it)
//! serves exactly the (path, method) pairs the document lists; a live rivetd answers every
//! documented path with the documented methods; the security each operation declares is what
//! the server enforces; and a maintained validator (`openapi-spec-validator`, OpenAPI 3.1,
//! installed by scripts/setup.sh into .venv) accepts the file.
//!
//! The walk of the router reads axum's `Debug` output (axum lists no routes otherwise); it
//! checks known routes first, so a changed format fails loudly instead of passing empty.
//!
//! Bounded: one rivetd, two in-process routers, ~600 loopback requests (10 s client timeout
//! each), two validator runs; 10-15 s after the build on the 2-core CI machine.

use rivet_controller::api::openapi::{self, PASSTHRU_METHODS};
use rivet_tests::{bin, fault, prerequisite, Rivetd};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

const REGENERATE: &str =
    "regenerate it with: cargo run -q -p rivet-controller --bin rivetd -- openapi > docs/openapi.json";

fn committed_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json")
}

/// Methods per path as the generated document lists them.
fn documented() -> BTreeMap<String, BTreeSet<String>> {
    let doc: Value = serde_json::from_str(&openapi::json()).expect("generated document is JSON");
    let mut out = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        let methods: BTreeSet<String> = item
            .as_object()
            .expect("path item")
            .keys()
            .filter(|k| {
                ["get", "put", "post", "delete", "patch", "options", "head"].contains(&k.as_str())
            })
            .map(|k| k.to_ascii_uppercase())
            .collect();
        out.insert(path.clone(), methods);
    }
    out
}

#[test]
fn committed_file_equals_generated() {
    let generated = openapi::json();
    let committed = std::fs::read_to_string(committed_path())
        .unwrap_or_else(|e| panic!("cannot read docs/openapi.json ({e}); {REGENERATE}"));
    assert!(
        committed == generated,
        "docs/openapi.json differs from the document the code generates; {REGENERATE}"
    );
    // The subcommand prints the same text.
    let exe = bin("rivetd");
    assert!(
        exe.exists(),
        "{} not built: run `cargo build --workspace --bins`",
        exe.display()
    );
    let out = std::process::Command::new(&exe)
        .arg("openapi")
        .output()
        .expect("run rivetd openapi");
    assert!(
        out.status.success(),
        "rivetd openapi failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout) == generated,
        "`rivetd openapi` prints something else than api::openapi::json()"
    );
}

/// The routes of the real router: path template → methods (`*` for a route that takes any
/// method). axum has no route listing, but its `Debug` shows each route id's path and its
/// method router's `Allow` header; the parser below fails loudly when that format changes.
fn router_routes(router: &axum::Router) -> BTreeMap<String, BTreeSet<String>> {
    let dump = format!("{router:?}");
    // Route ids of the path router (not the fallback router, which comes after).
    let main = dump
        .split("fallback_router")
        .next()
        .expect("Router debug has a path_router");
    let mut paths: BTreeMap<u64, String> = BTreeMap::new();
    let mut methods: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    let node = main.rsplit("Node { paths: {").next().expect("Node paths");
    for entry in node.split("RouteId(").skip(1) {
        let (id, rest) = entry.split_once(')').expect("route id");
        let id: u64 = id.parse().expect("numeric route id");
        let rest = rest.trim_start_matches(": ");
        if let Some(p) = rest.strip_prefix('"') {
            let end = p.find('"').expect("closing quote");
            paths.insert(id, p[..end].to_string());
        }
    }
    let routes = main.split("Node { paths: {").next().expect("routes part");
    for entry in routes.split("RouteId(").skip(1) {
        let (id, rest) = entry.split_once(')').expect("route id");
        let id: u64 = id.parse().expect("numeric route id");
        let allow = rest
            .split("allow_header: ")
            .nth(1)
            .unwrap_or_else(|| panic!("no allow_header for route {id} in axum's Debug output"));
        let set: BTreeSet<String> = if allow.starts_with("Skip") {
            ["*".to_string()].into()
        } else if let Some(bytes) = allow.strip_prefix("Bytes(b\"") {
            let end = bytes.find('"').expect("closing quote");
            bytes[..end]
                .split(',')
                .filter(|m| *m != "HEAD")
                .map(str::to_string)
                .collect()
        } else {
            panic!(
                "unexpected allow_header for route {id}: {}",
                &allow[..allow.len().min(40)]
            );
        };
        methods.insert(id, set);
    }
    assert!(
        paths.len() > 50,
        "found only {} routes in axum's Debug output: has its format changed?",
        paths.len()
    );
    paths
        .into_iter()
        .map(|(id, p)| {
            let m = methods
                .remove(&id)
                .unwrap_or_else(|| panic!("no methods for route {p}"));
            (p, m)
        })
        .collect()
}

/// The real router, as `rivetd` builds it, on a fresh SQLite database; `no_auth` as given.
fn real_router(dir: &Path, no_auth: bool) -> axum::Router {
    let config = rivet_model::config::Config {
        db: format!("sqlite:{}", dir.join("rivet.db").display()),
        no_auth,
        conductor_id: "openapi-test".into(),
        ..Default::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (conductor, _app) = rt
        .block_on(rivet_controller::server::build(config))
        .expect("build the router");
    // The routes behind the path rewriting `api::router` puts in front of them.
    rivet_controller::api::routes(rivet_controller::api::AppState::new(conductor))
}

#[test]
fn every_route_of_the_router_is_documented_and_nothing_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    let served = router_routes(&real_router(dir.path(), true));
    // The parser reads what the router has: known routes with their methods.
    assert_eq!(
        served
            .get("/v1/nodes")
            .map(|m| m.iter().map(String::as_str).collect::<Vec<_>>()),
        Some(vec!["GET", "POST"])
    );
    assert_eq!(
        served
            .get("/v1/nodes/{ident}/vendor_passthru")
            .map(|m| m.iter().map(String::as_str).collect::<Vec<_>>()),
        Some(vec!["*"])
    );
    let documented = documented();
    let mut problems = Vec::new();
    for (path, methods) in &served {
        let want: BTreeSet<String> = if methods.contains("*") {
            PASSTHRU_METHODS.iter().map(|m| m.to_string()).collect()
        } else {
            methods.clone()
        };
        match documented.get(path) {
            None => problems.push(format!("router serves {path} {want:?}, docs lack it: add rows to OPERATIONS in controller/src/api/openapi.rs")),
            Some(have) if *have != want => problems.push(format!("{path}: router serves {want:?}, the document lists {have:?}")),
            Some(_) => {}
        }
    }
    for path in documented.keys() {
        if !served.contains_key(path) {
            problems.push(format!(
                "the document lists {path}, which the router does not serve"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/openapi.json and the router disagree:\n{}",
        problems.join("\n")
    );
}

/// The faultstring of the router's fallback (no route matched).
fn is_fallback(status: u16, body: &str, path: &str) -> bool {
    let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    status == 404 && fault(&v) == format!("the resource {path} could not be found")
}

fn concrete(path: &str, node: &str) -> String {
    path.split('/')
        .map(
            |seg| match seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                Some("ident" | "node") => node.to_string(),
                Some(_) => "probe-x".to_string(),
                None => seg.to_string(),
            },
        )
        .collect::<Vec<_>>()
        .join("/")
}

#[test]
fn a_live_rivetd_serves_every_documented_path_and_method() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rivetd = Rivetd::start(&dir.path().join("rivet.db"), 0, &[]).expect("start rivetd");
    let (s, node) = rivetd
        .call(
            "POST",
            "/v1/nodes",
            Some(json!({"name": "openapi-probe", "driver": "fake-hardware"})),
        )
        .expect("create node");
    assert_eq!(s, 201, "create node: {node}");
    let uuid = node["uuid"].as_str().expect("uuid").to_string();
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");

    // The document is served as generated, without credentials.
    let resp = http
        .get(format!("{}/v1/openapi.json", rivetd.url))
        .send()
        .expect("GET openapi.json");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    assert!(
        resp.text().expect("body") == openapi::json(),
        "GET /v1/openapi.json differs from the generated document"
    );

    let mut problems = Vec::new();
    let mut allow_checked = 0;
    let doc: Value = serde_json::from_str(&openapi::json()).expect("json");
    for (path, methods) in documented() {
        let url = format!("{}{}", rivetd.url, concrete(&path, &uuid));
        // A method no route has: axum answers 405 with the path's methods in Allow when the
        // path is routed (routes that take any method run their handler instead).
        let resp = http
            .request(reqwest::Method::OPTIONS, &url)
            .header("X-OpenStack-Ironic-API-Version", "latest")
            .send()
            .expect("OPTIONS");
        let status = resp.status().as_u16();
        let allow = resp
            .headers()
            .get("allow")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = resp.text().unwrap_or_default();
        if is_fallback(status, &body, &concrete(&path, &uuid)) {
            problems.push(format!("{path}: not routed (the router's 404)"));
            continue;
        }
        if status == 405 {
            allow_checked += 1;
            let allowed: BTreeSet<String> = allow
                .unwrap_or_default()
                .split(',')
                .map(|m| m.trim().to_string())
                .filter(|m| !m.is_empty() && m != "HEAD")
                .collect();
            if allowed != methods {
                problems.push(format!(
                    "{path}: rivetd allows {allowed:?}, the document lists {methods:?}"
                ));
            }
        } else if methods != PASSTHRU_METHODS.iter().map(|m| m.to_string()).collect() {
            problems.push(format!(
                "{path}: OPTIONS got {status}, expected 405 with Allow"
            ));
        }
        if methods.contains("GET") {
            let (s, v) = rivetd
                .call("GET", &concrete(&path, &uuid), None)
                .expect("GET");
            let responses = &doc["paths"][&path]["get"]["responses"];
            if (200..300).contains(&s) && responses.get(s.to_string()).is_none() {
                problems.push(format!(
                    "GET {path}: answered {s}, which the document does not list"
                ));
            }
            if s == 404
                && fault(&v)
                    == format!("the resource {} could not be found", concrete(&path, &uuid))
            {
                problems.push(format!(
                    "GET {path}: the router's 404 at the newest microversion"
                ));
            }
        }
    }
    // Each documented minimum microversion is where the answer changes: one version below it
    // rivetd refuses the GET (Ironic's gate), at it rivetd answers something else.
    let mut gates_checked = 0;
    for (path, item) in doc["paths"].as_object().expect("paths") {
        let Some(since) = item["get"]["x-openstack-min-version"].as_str() else {
            continue;
        };
        let (major, minor) = since.split_once('.').expect("MAJOR.MINOR");
        let minor: u32 = minor.parse().expect("minor");
        // Paths whose parameters the probe can fill with a real resource: the node's.
        let only_node = openapi::params(path).all(|p| p == "ident")
            && path.starts_with("/v1/nodes/")
            || !path.contains('{');
        if minor <= 1 || !only_node {
            continue;
        }
        let concrete = concrete(path, &uuid);
        let below = format!("{major}.{}", minor - 1);
        let (s_below, v_below) = rivetd
            .call_at(Some(&below), "GET", &concrete, None)
            .expect("GET");
        let (s_at, v_at) = rivetd
            .call_at(Some(since), "GET", &concrete, None)
            .expect("GET");
        gates_checked += 1;
        if !(400..500).contains(&s_below) {
            problems.push(format!(
                "GET {path} at {below}: {s_below}, but the document says it needs {since}"
            ));
        } else if s_below == s_at && fault(&v_below) == fault(&v_at) {
            problems.push(format!(
                "GET {path}: the same answer at {below} and {since} ({s_at} {}): is {since} its minimum?",
                fault(&v_at)
            ));
        }
    }
    assert!(
        gates_checked > 30,
        "only {gates_checked} minimum versions checked"
    );

    // Writes on this test's own resources answer the success status the document lists.
    let documented_status = |method: &str, template: &str| -> Vec<u16> {
        doc["paths"][template][method.to_ascii_lowercase()]["responses"]
            .as_object()
            .map(|r| r.keys().filter_map(|k| k.parse().ok()).collect())
            .unwrap_or_default()
    };
    let mut write = |method: &str, template: &str, concrete: &str, body: Option<Value>| -> Value {
        let (s, v) = rivetd.call(method, concrete, body).expect("write");
        let want = documented_status(method, template);
        if !want.contains(&s) {
            problems.push(format!(
                "{method} {template}: answered {s} {v}, the document lists {want:?}"
            ));
        }
        v
    };
    let chassis = write(
        "POST",
        "/v1/chassis",
        "/v1/chassis",
        Some(json!({"description": "openapi"})),
    );
    let chassis = chassis["uuid"].as_str().unwrap_or("missing").to_string();
    write(
        "PATCH",
        "/v1/chassis/{uuid}",
        &format!("/v1/chassis/{chassis}"),
        Some(json!([{"op": "replace", "path": "/description", "value": "probe"}])),
    );
    write(
        "DELETE",
        "/v1/chassis/{uuid}",
        &format!("/v1/chassis/{chassis}"),
        None,
    );
    let port = write(
        "POST",
        "/v1/ports",
        "/v1/ports",
        Some(json!({"address": "52:54:00:0a:0b:0c", "node_uuid": uuid})),
    );
    let port = port["uuid"].as_str().unwrap_or("missing").to_string();
    write(
        "DELETE",
        "/v1/ports/{ident}",
        &format!("/v1/ports/{port}"),
        None,
    );
    let n = format!("/v1/nodes/{uuid}");
    write(
        "PUT",
        "/v1/nodes/{ident}/traits",
        &format!("{n}/traits"),
        Some(json!({"traits": ["CUSTOM_A"]})),
    );
    write(
        "PUT",
        "/v1/nodes/{ident}/traits/{trait}",
        &format!("{n}/traits/CUSTOM_B"),
        None,
    );
    write(
        "DELETE",
        "/v1/nodes/{ident}/traits/{trait}",
        &format!("{n}/traits/CUSTOM_B"),
        None,
    );
    write(
        "DELETE",
        "/v1/nodes/{ident}/traits",
        &format!("{n}/traits"),
        None,
    );
    write(
        "PUT",
        "/v1/nodes/{ident}/maintenance",
        &format!("{n}/maintenance"),
        Some(json!({"reason": "openapi"})),
    );
    write(
        "DELETE",
        "/v1/nodes/{ident}/maintenance",
        &format!("{n}/maintenance"),
        None,
    );
    write(
        "PUT",
        "/v1/nodes/{ident}/states/power",
        &format!("{n}/states/power"),
        Some(json!({"target": "power on"})),
    );
    write(
        "PUT",
        "/v1/nodes/{ident}/states/provision",
        &format!("{n}/states/provision"),
        Some(json!({"target": "manage"})),
    );
    assert!(
        allow_checked > 100,
        "only {allow_checked} paths answered 405 with Allow"
    );
    assert!(
        problems.is_empty(),
        "a live rivetd and docs/openapi.json disagree:\n{}",
        problems.join("\n")
    );
}

/// Serve the real router in-process with authentication on (no credentials configured, so
/// every admin request is a 401) and check each operation's declared security.
#[test]
fn declared_security_is_what_the_server_enforces() {
    let dir = tempfile::tempdir().expect("tempdir");
    let router = real_router(dir.path(), false);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("addr");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = stop_rx.await;
                })
                .await
                .expect("serve");
        });
    });
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let doc: Value = serde_json::from_str(&openapi::json()).expect("json");
    let mut problems = Vec::new();
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("item") {
            let Some(security) = op.get("security").and_then(Value::as_array) else {
                continue;
            };
            let public = security.is_empty();
            // Unauthenticated writes to public routes are not sent: they could change things.
            if public && method != "get" {
                continue;
            }
            let url = format!(
                "http://{addr}{}",
                concrete(path, "00000000-0000-0000-0000-000000000000")
            );
            let m = reqwest::Method::from_bytes(method.to_ascii_uppercase().as_bytes())
                .expect("method");
            let mut req = http
                .request(m, &url)
                .header("X-OpenStack-Ironic-API-Version", "latest");
            // A well-formed agent body, so the heartbeat reaches its token check (admin
            // routes check credentials before reading any body).
            if method != "get" {
                req = req.json(&json!({"agent_version": "openapi-probe"}));
            }
            let resp = req.send().expect("request");
            let status = resp.status().as_u16();
            checked += 1;
            if public && status == 401 {
                problems.push(format!("{method} {path}: documented as open, answered 401"));
            }
            if !public && status != 401 {
                problems.push(format!(
                    "{method} {path}: documented as needing credentials, answered {status} without"
                ));
            }
        }
    }
    let _ = stop_tx.send(());
    server.join().expect("server thread");
    assert!(checked > 150, "checked only {checked} operations");
    assert!(
        problems.is_empty(),
        "declared security differs from the server's:\n{}",
        problems.join("\n")
    );
}

#[test]
fn an_openapi_validator_accepts_the_committed_file() {
    let venv = std::env::var("RIVET_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv"));
    let exe = venv.join("bin/openapi-spec-validator");
    if !prerequisite(exe.exists(), "openapi-spec-validator in .venv") {
        return;
    }
    let out = std::process::Command::new(&exe)
        .arg("--schema")
        .arg("3.1")
        .arg(committed_path())
        .output()
        .expect("run openapi-spec-validator");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "openapi-spec-validator rejects docs/openapi.json:\n{text}"
    );
    assert!(text.contains("OK"), "unexpected validator output: {text}");

    // The validator must be able to fail: a document with a broken reference.
    let mut doc: Value = serde_json::from_str(&openapi::json()).expect("json");
    doc["paths"]["/v1/nodes"]["get"]["responses"]["200"]["content"]["application/json"]["schema"] =
        json!({"$ref": "#/components/schemas/NoSuchSchema"});
    let bad = tempfile::NamedTempFile::new().expect("tempfile");
    std::fs::write(bad.path(), doc.to_string()).expect("write");
    let out = std::process::Command::new(&exe)
        .arg("--schema")
        .arg("3.1")
        .arg(bad.path())
        .output()
        .expect("run openapi-spec-validator");
    assert!(
        !out.status.success(),
        "the validator accepted a document with a dangling $ref"
    );
}
