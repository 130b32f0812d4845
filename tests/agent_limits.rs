//! The agent endpoints' defences against strangers, against the real rivetd over real TCP (so
//! every request has a peer address): per-source rate limits on lookup and on failed token
//! checks (a correct heartbeat is never limited), one 404 for "unknown" and "expects no
//! ramdisk", tokens tied to the boot that looked up, tokens forgotten on power actions, and
//! the per-connection request limit.

use anyhow::{ensure, Context, Result};
use rivet_tests::Rivetd;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::time::Duration;

const BOOT_A: &str = "0b4c1a52-7e2f-4d0e-9a51-1f1f0c0ffee0";
const BOOT_B: &str = "5d6e7f80-1234-4abc-8def-000000000b0b";

/// rivetd with fast timing and `extra` config (TOML under the sections it names).
fn start(dir: &tempfile::TempDir, agent: &str, api: &str) -> Result<Rivetd> {
    let cfg = dir.path().join("rivetd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[agent]\nlong_poll_s = 1\nheartbeat_timeout_s = 60\n{agent}\n\
             [conductor]\ncheck_interval_s = 1\n[api]\n{api}\n"
        ),
    )?;
    let cfg = cfg.display().to_string();
    Rivetd::start(&dir.path().join("r.db"), 0, &["--config", &cfg])
}

fn verb(d: &Rivetd, name: &str, target: &str, then: &'static str) -> Result<Value> {
    let (s, v) = d.call(
        "PUT",
        &format!("/v1/nodes/{name}/states/provision"),
        Some(json!({"target": target})),
    )?;
    ensure!(s == 202, "{target}: {s} {v}");
    d.wait_node(name, Duration::from_secs(15), |v| {
        v["provision_state"] == then
    })
}

/// A manageable node with one port `mac`; returns its UUID.
fn manageable(d: &Rivetd, name: &str, mac: &str) -> Result<String> {
    let uuid = d.create_node_with_port(
        json!({"driver": "fake-hardware", "deploy_interface": "direct", "name": name}),
        mac,
    )?;
    verb(d, name, "manage", "manageable")?;
    Ok(uuid)
}

/// A raw agent request: status, headers, body bytes.
struct Answer {
    status: u16,
    retry_after: Option<String>,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    fn message(&self) -> String {
        serde_json::from_slice::<rivet_protocol::api::ErrorBody>(&self.body)
            .map(|b| b.message())
            .unwrap_or_else(|_| String::from_utf8_lossy(&self.body).into_owned())
    }
}

fn post(d: &Rivetd, path: &str, token: Option<&str>, body: Value) -> Result<Answer> {
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let mut r = http.post(format!("{}{path}", d.url)).json(&body);
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    let resp = r.send().with_context(|| format!("POST {path}"))?;
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    Ok(Answer {
        status,
        retry_after,
        body: resp.bytes()?.to_vec(),
    })
}

fn lookup(d: &Rivetd, body: Value) -> Result<Answer> {
    post(d, "/agent/v1/lookup", None, body)
}

fn heartbeat(d: &Rivetd, uuid: &str, token: Option<&str>, boot: Option<&str>) -> Result<Answer> {
    let mut body = json!({"agent_version": "t", "wait": false});
    if let Some(b) = boot {
        body["boot_id"] = json!(b);
    }
    post(d, &format!("/agent/v1/heartbeat/{uuid}"), token, body)
}

/// Move `name` to "clean wait" and look up as boot `boot`; returns the token.
fn enrolled(d: &Rivetd, name: &str, uuid: &str, boot: &str) -> Result<String> {
    verb(d, name, "provide", "clean wait")?;
    let a = lookup(
        d,
        json!({"node_uuid": uuid, "agent_version": "t", "boot_id": boot}),
    )?;
    ensure!(a.status == 200, "lookup {}: {}", a.status, a.message());
    a.json()["agent_token"]
        .as_str()
        .map(str::to_string)
        .context("no token on the first lookup")
}

#[test]
fn lookups_beyond_the_limit_get_429_but_a_correct_heartbeat_still_works() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start(
        &dir,
        "lookup_per_minute = 4\nfailed_auth_per_minute = 100",
        "",
    )?;
    let uuid = manageable(&d, "n1", "52:54:00:aa:00:01")?;
    let token = enrolled(&d, "n1", &uuid, BOOT_A)?; // lookup 1 of 4
    for i in 2..=4 {
        let a = lookup(&d, json!({"macs": [format!("52:54:00:bb:00:0{i}")]}))?;
        ensure!(a.status == 404, "lookup {i}: {} {}", a.status, a.message());
    }
    // The fifth, even for the real node, is refused: 429, Retry-After, the limit named, and
    // nothing about nodes.
    let a = lookup(
        &d,
        json!({"node_uuid": uuid, "macs": ["52:54:00:aa:00:01"]}),
    )?;
    ensure!(a.status == 429, "{} {}", a.status, a.message());
    let wait: u64 = a.retry_after.as_deref().unwrap_or("").parse()?;
    ensure!((1..=60).contains(&wait), "Retry-After {wait}");
    let msg = a.message();
    ensure!(
        msg.contains("lookup_per_minute") && msg.contains("4 per minute"),
        "{msg}"
    );
    let text = String::from_utf8_lossy(&a.body);
    ensure!(
        !text.contains(&uuid) && !text.contains("n1") && !text.contains("52:54"),
        "{text}"
    );
    // A correct heartbeat from the same address is not limited.
    for _ in 0..3 {
        let hb = heartbeat(&d, &uuid, Some(&token), Some(BOOT_A))?;
        ensure!(hb.status == 200, "{} {}", hb.status, hb.message());
    }
    // One warning for the source, not one per refused request.
    for _ in 0..5 {
        ensure!(lookup(&d, json!({"macs": ["52:54:00:cc:00:01"]}))?.status == 429);
    }
    let log = d.log_text();
    ensure!(
        log.matches("agent lookups from this source are over the limit")
            .count()
            == 1,
        "{log}"
    );
    Ok(())
}

#[test]
fn failed_token_checks_beyond_the_limit_get_429_and_change_nothing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start(&dir, "failed_auth_per_minute = 3", "")?;
    let uuid = manageable(&d, "n1", "52:54:00:aa:00:02")?;
    let token = enrolled(&d, "n1", &uuid, BOOT_A)?;
    // The conductor answers the lookup by queueing its first commands: let it settle, so
    // what is compared below can only change through the refused heartbeats.
    let before = d.wait_node("n1", std::time::Duration::from_secs(10), |n| {
        n["driver_internal_info"]["run_state"]["clean"]["steps_command"].is_string()
    })?;
    // Three failures are answered 401 — a missing token, a wrong one, an unknown node (the
    // same answer as a wrong token, so heartbeats cannot probe which nodes exist)…
    let a = heartbeat(&d, &uuid, None, Some(BOOT_A))?;
    ensure!(a.status == 401, "{} {}", a.status, a.message());
    let b = heartbeat(&d, &uuid, Some("not-the-token"), Some(BOOT_A))?;
    ensure!(b.status == 401, "{} {}", b.status, b.message());
    let c = heartbeat(&d, "no-such-node", Some("not-the-token"), Some(BOOT_A))?;
    ensure!(c.status == 401, "{} {}", c.status, c.message());
    ensure!(b.body == c.body, "unknown node answered differently");
    // …then 429 naming the limit.
    for _ in 0..3 {
        let e = heartbeat(&d, &uuid, Some("not-the-token"), Some(BOOT_A))?;
        ensure!(e.status == 429, "{} {}", e.status, e.message());
        ensure!(e.retry_after.is_some());
        ensure!(
            e.message().contains("failed_auth_per_minute"),
            "{}",
            e.message()
        );
    }
    ensure!(
        d.node("n1")? == before,
        "a refused heartbeat changed the node"
    );
    // The right token is still accepted from the same address.
    let ok = heartbeat(&d, &uuid, Some(&token), Some(BOOT_A))?;
    ensure!(ok.status == 200, "{} {}", ok.status, ok.message());
    Ok(())
}

#[test]
fn lookup_for_a_node_expecting_no_ramdisk_is_the_unknown_hardware_404() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start(&dir, "", "")?;
    let uuid = manageable(&d, "n1", "52:54:00:aa:00:03")?;
    let unknown_mac = lookup(
        &d,
        json!({"macs": ["52:54:00:ff:ff:ff"], "agent_version": "t"}),
    )?;
    let known_mac = lookup(
        &d,
        json!({"macs": ["52:54:00:aa:00:03"], "agent_version": "t"}),
    )?;
    let unknown_uuid = lookup(
        &d,
        json!({"node_uuid": "7c1e3c1e-0000-4000-8000-000000000000", "agent_version": "t"}),
    )?;
    let known_uuid = lookup(&d, json!({"node_uuid": uuid, "agent_version": "t"}))?;
    for a in [&unknown_mac, &known_mac, &unknown_uuid, &known_uuid] {
        ensure!(a.status == 404, "{} {}", a.status, a.message());
    }
    ensure!(
        known_mac.body == unknown_mac.body,
        "bodies differ:\n{}\n{}",
        String::from_utf8_lossy(&known_mac.body),
        String::from_utf8_lossy(&unknown_mac.body)
    );
    ensure!(known_uuid.body == unknown_uuid.body);
    ensure!(known_uuid.body == unknown_mac.body);
    Ok(())
}

#[test]
fn token_belongs_to_the_boot_that_looked_up() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start(&dir, "", "")?;
    let uuid = manageable(&d, "n1", "52:54:00:aa:00:04")?;
    let token = enrolled(&d, "n1", &uuid, BOOT_A)?;
    let node = d.node("n1")?;
    ensure!(
        node["driver_internal_info"]["agent_boot_id"] == BOOT_A,
        "{node}"
    );
    // Let the conductor's answer to the lookup settle first (see above).
    let before = d.wait_node("n1", std::time::Duration::from_secs(10), |n| {
        n["driver_internal_info"]["run_state"]["clean"]["steps_command"].is_string()
    })?;
    for other in [Some(BOOT_B), None] {
        let a = heartbeat(&d, &uuid, Some(&token), other)?;
        ensure!(a.status == 401, "{other:?}: {} {}", a.status, a.message());
        ensure!(
            a.message().contains(
                "token belongs to another boot of this ramdisk; the agent must look up again"
            ),
            "{}",
            a.message()
        );
    }
    ensure!(
        d.node("n1")? == before,
        "a refused heartbeat changed the node"
    );
    // Another boot looking up gets no token: it was handed out once, to boot A.
    let again = lookup(
        &d,
        json!({"node_uuid": uuid, "agent_version": "t", "boot_id": BOOT_B}),
    )?;
    ensure!(again.status == 200 && again.json()["agent_token"].is_null());
    let ok = heartbeat(&d, &uuid, Some(&token), Some(BOOT_A))?;
    ensure!(ok.status == 200, "{} {}", ok.status, ok.message());
    Ok(())
}

#[test]
fn malformed_boot_id_is_a_400_naming_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start(&dir, "", "")?;
    let uuid = manageable(&d, "n1", "52:54:00:aa:00:05")?;
    verb(&d, "n1", "provide", "clean wait")?;
    let bad = lookup(
        &d,
        json!({"node_uuid": uuid, "agent_version": "t", "boot_id": "<script>"}),
    )?;
    ensure!(bad.status == 400, "{} {}", bad.status, bad.message());
    ensure!(bad.message().contains("boot_id"), "{}", bad.message());
    ensure!(
        !d.node("n1")?["driver_internal_info"]
            .as_object()
            .is_some_and(|o| o.contains_key("agent_boot_id")),
        "a refused lookup changed the node"
    );
    Ok(())
}

#[test]
fn a_power_action_voids_the_token() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start(&dir, "", "")?;
    let uuid = manageable(&d, "n1", "52:54:00:aa:00:06")?;
    let token = enrolled(&d, "n1", &uuid, BOOT_A)?;
    // An aborted cleaning rests in "clean failed", where the token is kept (the agent may
    // still have to collect an abort) and power actions are allowed.
    verb(&d, "n1", "abort", "clean failed")?;
    ensure!(heartbeat(&d, &uuid, Some(&token), Some(BOOT_A))?.status == 200);
    let (s, v) = d.call(
        "PUT",
        "/v1/nodes/n1/states/power",
        Some(json!({"target": "power off"})),
    )?;
    ensure!(s == 202, "{s} {v}");
    let n = d.wait_node("n1", Duration::from_secs(10), |v| {
        v["target_power_state"].is_null()
    })?;
    ensure!(n["power_state"] == "power off", "{n}");
    ensure!(
        n["driver_internal_info"].get("agent_boot_id").is_none(),
        "the boot is over but its id is still recorded: {n}"
    );
    let hb = heartbeat(&d, &uuid, Some(&token), Some(BOOT_A))?;
    ensure!(hb.status == 401, "{} {}", hb.status, hb.message());
    Ok(())
}

/// Read one HTTP/1.1 answer: status, whether it says `Connection: close`.
fn read_answer(r: &mut BufReader<std::net::TcpStream>) -> Result<(u16, bool)> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    ensure!(!line.is_empty(), "connection closed before an answer");
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .context("status line")?
        .parse()?;
    let (mut len, mut close) = (0usize, false);
    loop {
        let mut h = String::new();
        r.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (name, value) = h.split_once(':').context("header")?;
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => len = value.trim().parse()?,
            "connection" => close = value.trim().eq_ignore_ascii_case("close"),
            _ => {}
        }
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok((status, close))
}

#[test]
fn a_keep_alive_connection_is_closed_after_the_request_limit() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start(&dir, "", "max_requests_per_connection = 5")?;
    let tcp = std::net::TcpStream::connect(("127.0.0.1", d.port))?;
    tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut w = tcp.try_clone()?;
    let mut r = BufReader::new(tcp);
    for i in 1..=5 {
        w.write_all(b"GET /v1 HTTP/1.1\r\nHost: rivet\r\n\r\n")?;
        let (status, close) = read_answer(&mut r)?;
        ensure!(status == 200, "request {i}: {status}");
        ensure!(
            close == (i == 5),
            "request {i}: Connection: close = {close}"
        );
    }
    // The server has closed its side: a sixth request gets no answer (EOF, or a reset).
    let _ = w.write_all(b"GET /v1 HTTP/1.1\r\nHost: rivet\r\n\r\n");
    let mut rest = Vec::new();
    match r.read_to_end(&mut rest) {
        Ok(_) => ensure!(rest.is_empty(), "answered after the limit"),
        Err(e) => ensure!(
            e.kind() == std::io::ErrorKind::ConnectionReset,
            "expected EOF, got {e}"
        ),
    }
    // A new connection is served.
    let (s, _) = d.call("GET", "/v1", None)?;
    ensure!(s == 200);
    Ok(())
}

/// The admin API's failed-authentication limit: wrong credentials from one address get 401
/// (each recorded in the audit trail) until `[api] failed_auth_per_minute`, then 429 with
/// `Retry-After` and no audit row each; the right credential from the same address still works.
#[test]
fn failed_admin_authentications_are_limited_and_do_not_flood_the_audit_trail() -> Result<()> {
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir()?;
    let hash = rivet_tests::hash_secret("s3cret-admin-token")?;
    let port = rivet_tests::free_port()?;
    let cfg = dir.path().join("auth.toml");
    std::fs::write(
        &cfg,
        format!(
            "[auth]\ntokens = [{{ name = \"boss\", hash = \"{hash}\", role = \"admin\" }}]\n\
             [api]\nfailed_auth_per_minute = 3\n"
        ),
    )?;
    let log = std::fs::File::create(dir.path().join("rivetd.log"))?;
    let mut child = Command::new(rivet_tests::bin("rivetd"))
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--db")
        .arg(format!("sqlite:{}", dir.path().join("r.db").display()))
        .arg("--config")
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()?;
    let result = (|| -> Result<()> {
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()?;
        let url = format!("http://127.0.0.1:{port}");
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while http.get(format!("{url}/v1")).send().is_err() {
            ensure!(std::time::Instant::now() < deadline, "rivetd did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        let attempt = |token: &str| -> Result<reqwest::blocking::Response> {
            Ok(http
                .post(format!("{url}/v1/nodes"))
                .bearer_auth(token)
                // Interfaces are 1.31 on (406 without a version, as in Ironic).
                .header("X-OpenStack-Ironic-API-Version", "latest")
                .json(&json!({"driver": "fake-hardware", "deploy_interface": "direct"}))
                .send()?)
        };
        for i in 0..3 {
            let r = attempt(&format!("guess-{i}"))?;
            ensure!(r.status() == 401, "guess {i}: {}", r.status());
        }
        for i in 3..6 {
            let r = attempt(&format!("guess-{i}"))?;
            ensure!(r.status() == 429, "guess {i}: {}", r.status());
            ensure!(r.headers().contains_key("retry-after"), "no Retry-After");
            let text = r.text()?;
            ensure!(text.contains("failed_auth_per_minute"), "{text}");
        }
        let ok = attempt("s3cret-admin-token")?;
        ensure!(ok.status() == 201, "the right token: {}", ok.status());
        let audit: Value = http
            .get(format!("{url}/v1/audit?limit=100"))
            .bearer_auth("s3cret-admin-token")
            .send()?
            .json()?;
        let statuses: Vec<u64> = audit["audit"]
            .as_array()
            .context("audit list")?
            .iter()
            .filter_map(|e| e["status"].as_u64())
            .collect();
        ensure!(
            statuses.iter().filter(|s| **s == 401).count() == 3
                && !statuses.contains(&429)
                && statuses.contains(&201),
            "audit statuses: {statuses:?}"
        );
        Ok(())
    })();
    let _ = child.kill();
    let _ = child.wait();
    result
}
