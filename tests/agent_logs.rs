//! The agent's log of a failed step kept with the node: the real rivetd (JSON logs) and the
//! real rivet-agent (JSON logs) run a manual clean whose exec-plugin step prints a marker and
//! fails; the log is then found at `GET /v1/nodes/{node}/logs`, named in the node's history,
//! printed by `rivet node logs`, and both processes' stderr is checked for JSON lines that
//! carry the request id, the node and the step.
//!
//! The node logs are a Rivet extension: neither python-ironicclient's `baremetal` CLI nor
//! openstacksdk has a command for them, so they are read over raw HTTP and with `rivet`.

use anyhow::{ensure, Context, Result};
use rivet_tests::agentproc::AgentProcess;
use rivet_tests::Rivetd;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

/// `boom` prints a marker on stderr (the agent logs plugin stderr at debug level and puts
/// its tail in the error) and exits 3.
const PLUGIN: &str = r#"#!/bin/sh
case "${1:-}" in
describe) echo '{"name": "boom-steps", "support_level": 1}' ;;
steps) echo '[{"interface": "deploy", "step": "boom", "priority": 0, "abortable": true}]' ;;
execute)
  cat >/dev/null
  echo "BOOM-MARKER flux capacitor out of range" >&2
  exit 3 ;;
esac
"#;

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Whether `v` holds `key` anywhere (a JSON log line nests span fields).
fn has_key(v: &Value, key: &str, want: &dyn Fn(&Value) -> bool) -> bool {
    match v {
        Value::Object(m) => m
            .iter()
            .any(|(k, x)| (k == key && want(x)) || has_key(x, key, want)),
        Value::Array(a) => a.iter().any(|x| has_key(x, key, want)),
        _ => false,
    }
}

/// Every non-empty line of `text` as JSON (an error names the first that is not).
fn json_lines(text: &str) -> Result<Vec<Value>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("not a JSON line: {l}")))
        .collect()
}

fn agent(rivetd: &Rivetd, dir: &Path, uuid: &str, disk: &Path) -> Result<AgentProcess> {
    AgentProcess::start(
        &rivetd.url,
        uuid,
        &[disk],
        Some(&dir.join("plugins")),
        &dir.join("agent.log"),
        &[("RIVET_LOG_JSON", "1"), ("RIVET_LOG", "debug")],
    )
}

#[test]
fn failed_step_log_is_kept_with_the_node() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("rivetd.toml");
    std::fs::write(
        &cfg,
        "[agent]\nlong_poll_s = 2\nheartbeat_timeout_s = 60\n[conductor]\ncheck_interval_s = 1\n",
    )?;
    let cfg_arg = cfg.display().to_string();
    let rivetd = Rivetd::start(
        &dir.path().join("rivet.db"),
        0,
        &["--config", &cfg_arg, "--log-json"],
    )?;
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins)?;
    let plugin = plugins.join("boom-steps");
    std::fs::write(&plugin, PLUGIN)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755))?;
    let disk = dir.path().join("disk0.img");
    std::fs::File::create(&disk)?.set_len(16 << 20)?;

    let (s, v) = rivetd.call(
        "POST",
        "/v1/nodes",
        Some(json!({"driver": "fake-hardware", "deploy_interface": "direct", "name": "n1"})),
    )?;
    ensure!(s == 201, "{v}");
    let uuid = v["uuid"].as_str().unwrap_or_default().to_string();
    let (s, v) = rivetd.call("GET", "/v1/nodes/n1/logs", None)?;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["logs"], json!([]), "a new node has no logs: {v}");
    rivetd.call(
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "manage"})),
    )?;
    let wait = |what: &str, want: &'static str| {
        rivetd
            .wait_node("n1", Duration::from_secs(60), |v| {
                v["provision_state"] == want
            })
            .map_err(|e| {
                anyhow::anyhow!(
                    "{what}: {e}\n--- rivetd ---\n{}\n--- agent ---\n{}",
                    tail(&rivetd.log_text()),
                    tail(
                        &std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default()
                    )
                )
            })
    };
    wait("manage", "manageable")?;

    // An empty manual clean caches the agent's steps (boom among them).
    let (s, v) = rivetd.call(
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "clean", "clean_steps": []})),
    )?;
    ensure!(s == 202, "{v}");
    let mut a = agent(&rivetd, dir.path(), &uuid, &disk)?;
    wait("gather steps", "manageable")?;
    a.kill9();

    let (s, v) = rivetd.call(
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "clean", "clean_steps": [{"interface": "deploy", "step": "boom"}]})),
    )?;
    ensure!(s == 202, "{v}");
    let a = agent(&rivetd, dir.path(), &uuid, &disk)?;
    let node = wait("boom fails", "clean failed")?;
    drop(a);
    let last_error = node["last_error"].as_str().unwrap_or_default().to_string();

    // The log is kept with the node and holds the plugin's output.
    let (s, v) = rivetd.call("GET", "/v1/nodes/n1/logs", None)?;
    assert_eq!(s, 200, "{v}");
    let logs = v["logs"].as_array().cloned().unwrap_or_default();
    assert_eq!(logs.len(), 1, "{v}");
    let log = &logs[0];
    assert_eq!(log["node_uuid"], json!(uuid), "{log}");
    assert_eq!(log["operation"], "clean", "{log}");
    assert_eq!(log["step"], "boom", "{log}");
    assert!(log["command_id"].is_string(), "{log}");
    let text = log["text"].as_str().unwrap_or_default();
    assert!(text.contains("BOOM-MARKER"), "{log}");
    // The ring stays human-readable while stderr is JSON.
    assert!(
        text.lines()
            .all(|l| serde_json::from_str::<Value>(l).is_err()),
        "{text}"
    );
    let id = log["id"].as_i64().context("log id")?;
    let path = format!("/v1/nodes/{uuid}/logs/{id}");
    assert!(
        last_error.ends_with(&format!("agent log: {path}")),
        "{last_error}"
    );
    let (s, one) = rivetd.call("GET", &path, None)?;
    assert_eq!(s, 200, "{one}");
    assert_eq!(&one, log);
    let (s, v) = rivetd.call("GET", &format!("/v1/nodes/{uuid}/logs/{}", id + 1000), None)?;
    assert_eq!(s, 404, "{v}");
    let (s, v) = rivetd.call("GET", "/v1/nodes/n1/logs/nope", None)?;
    assert_eq!(s, 404, "{v}");
    let (s, v) = rivetd.call("GET", "/v1/nodes/nope/logs", None)?;
    assert_eq!(s, 404, "{v}");

    // The history's failure entry says where the log is.
    let (s, h) = rivetd.call("GET", "/v1/nodes/n1/history?detail=true", None)?;
    assert_eq!(s, 200, "{h}");
    let events: Vec<&str> = h["history"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e["event"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        events
            .iter()
            .any(|e| e.ends_with(&format!("agent log: {path}"))),
        "{h}"
    );

    // `rivet node logs` prints it, all and by id.
    for extra in [vec![], vec![id.to_string()]] {
        let out = std::process::Command::new(rivet_tests::bin("rivet"))
            .args(["--url", &rivetd.url, "node", "logs", "n1"])
            .args(&extra)
            .output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success(),
            "rivet node logs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("BOOM-MARKER"), "{stdout}");
        assert!(stdout.contains("clean step boom"), "{stdout}");
    }

    // The agent's stderr is JSON lines; those of the failed step carry its name.
    let agent_log = std::fs::read_to_string(dir.path().join("agent.log"))?;
    let lines = json_lines(&agent_log)?;
    assert!(
        lines
            .iter()
            .any(|l| has_key(l, "step", &|v| v == "boom")
                && l.to_string().contains("command failed")),
        "no `command failed` line with step boom:\n{}",
        tail(&agent_log)
    );

    // rivetd's stderr is JSON lines; an API call's line carries its request id and node.
    let resp = reqwest::blocking::get(format!("{}/v1/nodes/n1", rivetd.url))?;
    let rid = resp
        .headers()
        .get("x-openstack-request-id")
        .and_then(|h| h.to_str().ok())
        .context("request id header")?
        .to_string();
    std::thread::sleep(Duration::from_millis(300));
    let lines = json_lines(&rivetd.log_text())?;
    let ours: Vec<&Value> = lines
        .iter()
        .filter(|l| has_key(l, "request_id", &|v| v == rid.as_str()))
        .collect();
    assert!(
        !ours.is_empty(),
        "no line with {rid}:\n{}",
        tail(&rivetd.log_text())
    );
    assert!(
        ours.iter().all(|l| has_key(l, "node", &|v| v == "n1")),
        "{ours:?}"
    );
    // A caller's well-formed X-OpenStack-Request-Id is the request's global id: it rides
    // beside the fresh local id on every line of the request; a malformed one is ignored.
    let global = "req-5d2c1b0a-9e8f-4a7b-8c6d-5e4f3a2b1c0d";
    let client = reqwest::blocking::Client::new();
    let mut locals = Vec::new();
    for sent in [global, "req-not-a-uuid"] {
        let resp = client
            .get(format!("{}/v1/nodes/n1", rivetd.url))
            .header("X-OpenStack-Request-Id", sent)
            .send()?;
        let local = resp
            .headers()
            .get("x-openstack-request-id")
            .and_then(|h| h.to_str().ok())
            .context("request id header")?
            .to_string();
        assert!(local != sent, "the local id is rivetd's own");
        locals.push(local);
    }
    std::thread::sleep(Duration::from_millis(300));
    let lines = json_lines(&rivetd.log_text())?;
    let with = |rid: &str| -> Vec<Value> {
        lines
            .iter()
            .filter(|l| has_key(l, "request_id", &|v| v == rid))
            .cloned()
            .collect()
    };
    let traced = with(&locals[0]);
    assert!(
        !traced.is_empty()
            && traced
                .iter()
                .all(|l| has_key(l, "global_request_id", &|v| v == global)),
        "lines of {} lack global_request_id {global}: {traced:?}",
        locals[0]
    );
    let untraced = with(&locals[1]);
    assert!(
        !untraced.is_empty()
            && untraced
                .iter()
                .all(|l| !l.to_string().contains("global_request_id")),
        "a malformed id became a global id: {untraced:?}"
    );
    // Conductor lines about the failed step name node and step.
    assert!(
        lines.iter().any(|l| has_key(l, "step", &|v| v == "boom")
            && has_key(l, "node", &|v| v == uuid.as_str())
            && l.to_string().contains("failed")),
        "no conductor line with node and step:\n{}",
        tail(&rivetd.log_text())
    );

    // The logs go with the node.
    let (s, v) = rivetd.call(
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "manage"})),
    )?;
    ensure!(s == 202, "{v}");
    wait("back to manageable", "manageable")?;
    let (s, v) = rivetd.call("DELETE", "/v1/nodes/n1", None)?;
    ensure!(s == 204, "{v}");
    let c = rusqlite::Connection::open(dir.path().join("rivet.db"))?;
    let left: i64 = c.query_row("SELECT count(*) FROM node_logs", [], |r| r.get(0))?;
    assert_eq!(left, 0);
    Ok(())
}
