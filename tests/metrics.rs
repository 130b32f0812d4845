//! rivetd's Prometheus `/metrics`, end to end: the real rivetd and rivet-agent binaries run a
//! real (manual) cleaning of a fake-hardware node; the scrape is then parsed by the Python
//! `prometheus_client` parsers (the Prometheus text format and OpenMetrics) and its values
//! checked against the store. Also: who may scrape when auth is on, the `[metrics] listen`
//! address, and that the Grafana dashboard and alert rules in docs/monitoring/ only use
//! metric names a scrape really has.

use anyhow::{ensure, Context, Result};
use rivet_tests::agentproc::AgentProcess;
use rivet_tests::{clients, prerequisite, Rivetd};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Parses the exposition on stdin with `prometheus_client`'s parser for `argv[1]` (`text`
/// or `openmetrics`) and prints the families as JSON.
const PARSE: &str = r#"
import json, sys
if sys.argv[1] == "openmetrics":
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
else:
    from prometheus_client.parser import text_string_to_metric_families
out = []
for f in text_string_to_metric_families(sys.stdin.read()):
    out.append({"name": f.name, "type": f.type, "samples": [
        {"name": s.name, "labels": s.labels, "value": s.value} for s in f.samples]})
print(json.dumps(out))
"#;

fn python() -> std::path::PathBuf {
    clients::venv().join("bin/python")
}

fn have_parser() -> bool {
    prerequisite(
        Command::new(python())
            .args(["-c", "import prometheus_client, yaml"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false),
        "prometheus_client and PyYAML in .venv",
    )
}

/// Run a Python snippet with `input` on stdin; its stdout as JSON.
fn py_json(script: &str, args: &[&str], input: &str) -> Result<Value> {
    use std::io::Write;
    let mut child = Command::new(python())
        .arg("-c")
        .arg(script)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .context("python stdin")?
        .write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "python failed: {}\ninput:\n{input}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// A parsed scrape.
struct Scrape {
    families: Vec<Value>,
}

impl Scrape {
    fn parse(text: &str, format: &str) -> Result<Scrape> {
        let v = py_json(PARSE, &[format], text)?;
        let families = v.as_array().context("families")?.clone();
        Ok(Scrape { families })
    }

    fn family(&self, name: &str) -> Option<&Value> {
        self.families.iter().find(|f| f["name"] == name)
    }

    /// Samples named `name` whose labels include every pair of `labels`.
    fn samples(&self, name: &str, labels: &[(&str, &str)]) -> Vec<&Value> {
        self.families
            .iter()
            .flat_map(|f| f["samples"].as_array().into_iter().flatten())
            .filter(|s| s["name"] == name)
            .filter(|s| labels.iter().all(|(k, v)| s["labels"][*k] == *v))
            .collect()
    }

    /// The sum of those samples' values.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples(name, labels)
            .iter()
            .filter_map(|s| s["value"].as_f64())
            .sum()
    }

    fn sample_names(&self) -> BTreeSet<String> {
        self.families
            .iter()
            .flat_map(|f| f["samples"].as_array().into_iter().flatten())
            .filter_map(|s| s["name"].as_str().map(str::to_string))
            .collect()
    }
}

fn get_text(url: &str, token: Option<&str>, accept: Option<&str>) -> Result<(u16, String)> {
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let mut req = http.get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(a) = accept {
        req = req.header("Accept", a);
    }
    let resp = req.send().with_context(|| format!("GET {url}"))?;
    Ok((resp.status().as_u16(), resp.text()?))
}

/// `8-4-4-4-12` hex: a UUID, which must never be a label value (unbounded cardinality).
fn looks_like_uuid(s: &str) -> bool {
    s.split(|c: char| !(c.is_ascii_hexdigit() || c == '-'))
        .any(|part| {
            let groups: Vec<&str> = part.split('-').collect();
            groups.len() == 5
                && groups
                    .iter()
                    .zip([8, 4, 4, 4, 12])
                    .all(|(g, n)| g.len() == n)
        })
}

#[test]
fn scrape_after_a_real_cleaning_parses_and_matches_the_store() -> Result<()> {
    if !have_parser() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let metrics_port = rivet_tests::free_port()?;
    let cfg = dir.path().join("rivetd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[agent]\nlong_poll_s = 2\n[conductor]\ncheck_interval_s = 1\n\
             [metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n"
        ),
    )?;
    let cfg_arg = cfg.display().to_string();
    let rivetd = Rivetd::start(&dir.path().join("rivet.db"), 0, &["--config", &cfg_arg])?;
    let (s, v) = rivetd.call(
        "POST",
        "/v1/nodes",
        Some(json!({"driver": "fake-hardware", "deploy_interface": "direct", "name": "n1"})),
    )?;
    ensure!(s == 201, "{v}");
    let uuid = v["uuid"].as_str().unwrap_or_default().to_string();
    // A second node that stays in enroll, so the counts have two states to match.
    let (s, v) = rivetd.call(
        "POST",
        "/v1/nodes",
        Some(json!({"driver": "fake-hardware", "name": "n2"})),
    )?;
    ensure!(s == 201, "{v}");
    let (s, v) = rivetd.call(
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "manage"})),
    )?;
    ensure!(s == 202, "{v}");
    rivetd.wait_node("n1", Duration::from_secs(10), |v| {
        v["provision_state"] == "manageable"
    })?;

    // A real manual cleaning: the agent erases the metadata of a sparse disk image.
    let disk = dir.path().join("disk0.img");
    std::fs::File::create(&disk)?.set_len(32 << 20)?;
    let (s, v) = rivetd.call(
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "clean", "clean_steps": [
            {"interface": "deploy", "step": "erase_devices_metadata", "args": {}}
        ]})),
    )?;
    ensure!(s == 202, "{v}");
    rivetd.wait_node("n1", Duration::from_secs(10), |v| {
        v["provision_state"] == "clean wait"
    })?;
    let mut agent = AgentProcess::start(
        &rivetd.url,
        &uuid,
        &[&disk],
        None,
        &dir.path().join("agent.log"),
        &[],
    )?;
    let node = rivetd
        .wait_node("n1", Duration::from_secs(60), |v| {
            v["provision_state"] == "manageable"
        })
        .map_err(|e| {
            anyhow::anyhow!(
                "cleaning did not finish: {e}\n--- rivetd ---\n{}\n--- agent ---\n{}",
                rivetd.log_text(),
                agent.log_text()
            )
        })?;
    agent.kill9();
    ensure!(node["last_error"].is_null(), "{node}");
    let (s, _) = rivetd.call("GET", &format!("/v1/nodes/{uuid}"), None)?;
    ensure!(s == 200);

    // The Prometheus text format (what a plain GET gets), parsed by the text parser.
    let (s, text) = get_text(&format!("{}/metrics", rivetd.url), None, None)?;
    ensure!(s == 200, "{text}");
    let scrape = Scrape::parse(&text, "text")?;
    for family in [
        "rivet_build_info",
        "rivet_nodes",
        "rivet_nodes_longest_in_state_seconds",
        "rivet_node_leases",
        "rivet_conductors_alive",
        "rivet_http_requests",
        "rivet_http_request_duration_seconds",
        "rivet_agent_heartbeats",
        "rivet_agent_long_polls_held",
        "rivet_steps_started",
        "rivet_steps_finished",
        "rivet_steps_failed",
        "rivet_step_duration_seconds",
        "rivet_bmc_requests",
        "rivet_bmc_request_duration_seconds",
        "rivet_store_query_duration_seconds",
    ] {
        ensure!(
            scrape.family(family).is_some(),
            "family {family} missing from the scrape:\n{text}"
        );
    }
    let kind = |name: &str| scrape.family(name).map(|f| f["type"].clone());
    assert_eq!(kind("rivet_steps_started"), Some(json!("counter")));
    assert_eq!(
        kind("rivet_step_duration_seconds"),
        Some(json!("histogram"))
    );
    assert_eq!(kind("rivet_nodes"), Some(json!("gauge")));

    // Node counts match the store, state by state.
    let (_, nodes) = rivetd.call("GET", "/v1/nodes", None)?;
    let mut by_state: BTreeMap<String, f64> = BTreeMap::new();
    for n in nodes["nodes"].as_array().context("nodes")? {
        *by_state
            .entry(
                n["provision_state"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
            .or_default() += 1.0;
    }
    assert_eq!(by_state.len(), 2, "{nodes}");
    for (state, n) in &by_state {
        assert_eq!(
            scrape.sum("rivet_nodes", &[("provision_state", state)]),
            *n,
            "nodes in {state}"
        );
    }
    assert_eq!(scrape.sum("rivet_nodes", &[]), 2.0);
    assert_eq!(scrape.sum("rivet_conductors_alive", &[]), 1.0);
    assert_eq!(
        scrape
            .samples("rivet_node_leases", &[("controller", "test-conductor")])
            .len(),
        1
    );
    assert!(
        scrape.sum(
            "rivet_nodes_longest_in_state_seconds",
            &[("provision_state", "enroll")]
        ) >= 0.0
    );

    // The cleaning step was counted, with a duration.
    let step = [
        ("operation", "clean"),
        ("interface", "deploy"),
        ("step", "erase_devices_metadata"),
    ];
    assert_eq!(
        scrape.sum("rivet_steps_started_total", &step),
        1.0,
        "{text}"
    );
    assert_eq!(scrape.sum("rivet_steps_finished_total", &step), 1.0);
    assert_eq!(scrape.sum("rivet_steps_failed_total", &step), 0.0);
    assert_eq!(scrape.sum("rivet_step_duration_seconds_count", &step), 1.0);
    assert!(scrape.sum("rivet_agent_heartbeats_total", &[]) >= 1.0);
    assert_eq!(scrape.sum("rivet_agent_long_polls_held", &[]), 0.0);
    assert!(
        scrape.sum(
            "rivet_bmc_requests_total",
            &[
                ("driver", "fake-hardware"),
                ("operation", "set_power"),
                ("outcome", "ok")
            ]
        ) >= 1.0,
        "{text}"
    );
    assert!(scrape.sum("rivet_store_query_duration_seconds_count", &[]) > 0.0);
    let version = scrape.samples("rivet_build_info", &[]);
    assert_eq!(version.len(), 1);
    assert!(!version[0]["labels"]["version"]
        .as_str()
        .unwrap_or_default()
        .is_empty());

    // API requests by route template, never by raw path.
    assert!(
        scrape.sum(
            "rivet_http_requests_total",
            &[
                ("method", "GET"),
                ("route", "/v1/nodes/{ident}"),
                ("status", "200")
            ]
        ) >= 1.0,
        "{text}"
    );
    assert!(
        scrape.sum(
            "rivet_http_requests_total",
            &[("method", "POST"), ("route", "/agent/v1/heartbeat/{node}")]
        ) >= 1.0
            || scrape
                .samples("rivet_http_requests_total", &[])
                .iter()
                .any(|s| s["labels"]["route"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("heartbeat")),
        "no heartbeat route in {text}"
    );
    for s in scrape.samples("rivet_http_requests_total", &[]) {
        let route = s["labels"]["route"].as_str().unwrap_or_default();
        assert!(route.starts_with('/') || route == "unmatched", "{route}");
    }
    for f in &scrape.families {
        for s in f["samples"].as_array().into_iter().flatten() {
            for (k, v) in s["labels"].as_object().into_iter().flatten() {
                let v = v.as_str().unwrap_or_default();
                assert!(
                    !looks_like_uuid(v) && !v.contains(&uuid),
                    "label {k}={v:?} of {} carries a UUID",
                    s["name"]
                );
            }
        }
    }

    // OpenMetrics on request, parsed by the stricter OpenMetrics parser.
    let (s, om) = get_text(
        &format!("{}/metrics", rivetd.url),
        None,
        Some("application/openmetrics-text; version=1.0.0"),
    )?;
    ensure!(s == 200);
    ensure!(om.trim_end().ends_with("# EOF"), "{om}");
    let om = Scrape::parse(&om, "openmetrics")?;
    assert_eq!(om.sum("rivet_nodes", &[]), 2.0);
    assert_eq!(om.sum("rivet_steps_started_total", &step), 1.0);

    // The [metrics] listen address serves the same, without credentials.
    let (s, own) = get_text(
        &format!("http://127.0.0.1:{metrics_port}/metrics"),
        None,
        None,
    )?;
    ensure!(s == 200, "{own}");
    let own = Scrape::parse(&own, "text")?;
    assert_eq!(own.sum("rivet_nodes", &[]), 2.0);

    check_monitoring_docs(&scrape)?;
    Ok(())
}

/// The PromQL metric names in `expr`: `rivet_…` identifiers.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("rivet_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        // Not part of a longer identifier (`xrivet_`).
        let before = rest[..i].chars().last();
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            out.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    out
}

/// The dashboard is JSON with panels and targets, the rules are YAML Prometheus rule groups,
/// and every metric either of them names is in `scrape`.
fn check_monitoring_docs(scrape: &Scrape) -> Result<()> {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/monitoring");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(
        docs.join("grafana-dashboard.json"),
    )?)
    .context("grafana-dashboard.json is not JSON")?;
    let panels = dashboard["panels"].as_array().context("dashboard panels")?;
    ensure!(panels.len() >= 6, "only {} panels", panels.len());
    let mut exprs = Vec::new();
    for p in panels {
        ensure!(p["title"].is_string(), "panel without a title: {p}");
        let targets = p["targets"].as_array().context("panel targets")?;
        ensure!(!targets.is_empty(), "panel {} has no target", p["title"]);
        for t in targets {
            exprs.push(t["expr"].as_str().context("target expr")?.to_string());
        }
    }
    let rules_text = std::fs::read_to_string(docs.join("alerts.yml"))?;
    let rules = py_json(
        "import json, sys, yaml; print(json.dumps(yaml.safe_load(sys.stdin)))",
        &[],
        &rules_text,
    )?;
    let groups = rules["groups"].as_array().context("rule groups")?;
    let mut alerts = BTreeSet::new();
    for g in groups {
        ensure!(g["name"].is_string());
        for r in g["rules"].as_array().context("rules")? {
            let name = r["alert"].as_str().context("alert name")?;
            ensure!(r["expr"].is_string(), "alert {name} has no expr");
            ensure!(
                r["labels"]["severity"].is_string() && r["annotations"]["summary"].is_string(),
                "alert {name} lacks severity or summary"
            );
            alerts.insert(name.to_string());
            exprs.push(r["expr"].as_str().unwrap_or_default().to_string());
        }
    }
    for wanted in [
        "RivetNodeStuckInWaitState",
        "RivetBmcErrorRate",
        "RivetNoConductorAlive",
        "RivetdDown",
    ] {
        ensure!(
            alerts.contains(wanted),
            "alert {wanted} missing: {alerts:?}"
        );
    }
    let served = scrape.sample_names();
    let mut referenced = BTreeSet::new();
    for e in &exprs {
        referenced.extend(metric_names(e));
    }
    ensure!(
        referenced.len() >= 8,
        "few metrics referenced: {referenced:?}"
    );
    for name in referenced {
        ensure!(
            served.contains(&name),
            "docs/monitoring references {name}, which the scrape does not have: {served:?}"
        );
    }
    Ok(())
}

/// With auth on: no credentials → 401; a metrics-role token scrapes but reads nothing else
/// (403); a reader may not scrape; admin may; the `[metrics] listen` address needs nothing.
#[test]
fn metrics_need_the_metrics_or_admin_role() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let admin = rivet_tests::hash_secret("admin-token")?;
    let scraper = rivet_tests::hash_secret("scrape-token")?;
    let reader = rivet_tests::hash_secret("reader-token")?;
    let metrics_port = rivet_tests::free_port()?;
    let cfg = dir.path().join("auth.toml");
    std::fs::write(
        &cfg,
        format!(
            "[auth]\ntokens = [\n\
             {{ name = \"boss\", hash = \"{admin}\", role = \"admin\" }},\n\
             {{ name = \"prom\", hash = \"{scraper}\", role = \"metrics\" }},\n\
             {{ name = \"ro\", hash = \"{reader}\", role = \"reader\" }},\n]\n\
             [metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n"
        ),
    )?;
    let port = rivet_tests::free_port()?;
    let log_path = dir.path().join("rivetd.log");
    let log = std::fs::File::create(&log_path)?;
    /// The child, killed however the test ends.
    struct Child(std::process::Child);
    impl Drop for Child {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _child = Child(
        Command::new(rivet_tests::bin("rivetd"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--db")
            .arg(format!("sqlite:{}", dir.path().join("r.db").display()))
            .arg("--config")
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?,
    );
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while get_text(&format!("{url}/v1"), None, None).is_err() {
        ensure!(
            Instant::now() < deadline,
            "rivetd did not start: {}",
            std::fs::read_to_string(&log_path).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let metrics = format!("{url}/metrics");
    let (s, body) = get_text(&metrics, None, None)?;
    assert_eq!(s, 401, "{body}");
    assert!(!body.contains("rivet_nodes"), "{body}");
    let (s, body) = get_text(&metrics, Some("wrong-token"), None)?;
    assert_eq!(s, 401, "{body}");
    let (s, body) = get_text(&metrics, Some("scrape-token"), None)?;
    assert_eq!(s, 200, "{body}");
    assert!(body.contains("rivet_build_info{"), "{body}");
    let (s, body) = get_text(&format!("{url}/v1/nodes"), Some("scrape-token"), None)?;
    assert_eq!(s, 403, "{body}");
    assert!(body.contains("metrics"), "{body}");
    let (s, _) = get_text(&metrics, Some("reader-token"), None)?;
    assert_eq!(s, 403);
    let (s, _) = get_text(&format!("{url}/v1/nodes"), Some("reader-token"), None)?;
    assert_eq!(s, 200);
    let (s, _) = get_text(&metrics, Some("admin-token"), None)?;
    assert_eq!(s, 200);
    // The operator's own metrics address: no credentials.
    let (s, body) = get_text(
        &format!("http://127.0.0.1:{metrics_port}/metrics"),
        None,
        None,
    )?;
    assert_eq!(s, 200, "{body}");
    assert!(body.contains("rivet_conductors_alive 1"), "{body}");
    // `rivet metrics PREFIX` with the scraper's token; a reader's is refused.
    let cli = |token: &str| {
        Command::new(rivet_tests::bin("rivet"))
            .args(["--url", &url, "metrics", "rivet_conductors_alive"])
            .env("RIVET_TOKEN", token)
            .output()
    };
    let out = cli("scrape-token")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("rivet_conductors_alive 1"), "{stdout}");
    assert!(!stdout.contains("rivet_nodes"), "{stdout}");
    let out = cli("reader-token")?;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("metrics"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Only /metrics there: the API is not reachable through it.
    let (s, _) = get_text(
        &format!("http://127.0.0.1:{metrics_port}/v1/nodes"),
        None,
        None,
    )?;
    assert_eq!(s, 404);
    Ok(())
}

#[test]
fn uuid_detector_works() {
    assert!(looks_like_uuid(
        "node 3f2504e0-4f89-11d3-9a0c-0305e82c3301 x"
    ));
    assert!(!looks_like_uuid("/v1/nodes/{node}"));
    assert_eq!(
        metric_names("sum(rate(rivet_bmc_requests_total{outcome=\"error\"}[5m])) / up"),
        BTreeSet::from(["rivet_bmc_requests_total".to_string()])
    );
}
