//! HTTPS and hard connections: `rivetd tls init` makes a CA and a server certificate; rivetd
//! serves HTTPS with them; the CLI (RIVET_CA) and the agent (--ca / RIVET_CA) trust it, a
//! client with the wrong CA fails clearly; a client that never finishes its headers or its
//! TLS handshake is cut off.

use anyhow::{ensure, Context, Result};
use rivet_tests::agentproc::AgentProcess;
use rivet_tests::{bin, free_port};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tls_init(dir: &Path) -> Result<()> {
    let out = Command::new(bin("rivetd"))
        .arg("tls")
        .arg("init")
        .arg(dir)
        .output()?;
    ensure!(
        out.status.success(),
        "tls init: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in ["ca.pem", "ca-key.pem", "server.pem", "server-key.pem"] {
        ensure!(dir.join(f).exists(), "{f} missing");
    }
    Ok(())
}

fn https_client(ca: &Path) -> Result<reqwest::blocking::Client> {
    let pem = std::fs::read(ca)?;
    Ok(reqwest::blocking::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&pem)?)
        .timeout(Duration::from_secs(10))
        .build()?)
}

/// rivetd over HTTPS (or plain HTTP when `tls` is None) with a 2 s header deadline.
fn start(dir: &Path, tls: Option<&Path>) -> Result<(Daemon, u16)> {
    let port = free_port()?;
    let mut cfg = String::from("[api]\nheader_read_timeout_s = 2\n[agent]\nlong_poll_s = 2\n[conductor]\ncheck_interval_s = 1\n");
    if let Some(t) = tls {
        cfg = format!(
            "tls_cert = \"{}\"\ntls_key = \"{}\"\n{cfg}",
            t.join("server.pem").display(),
            t.join("server-key.pem").display()
        );
    }
    let cfg_path = dir.join(format!("rivetd-{port}.toml"));
    std::fs::write(&cfg_path, cfg)?;
    let log = std::fs::File::create(dir.join(format!("rivetd-{port}.log")))?;
    let child = Command::new(bin("rivetd"))
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--no-auth",
            "--config",
        ])
        .arg(&cfg_path)
        .arg("--db")
        .arg(format!(
            "sqlite:{}",
            dir.join(format!("rivet-{port}.db")).display()
        ))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("spawn rivetd")?;
    let d = Daemon(child);
    let deadline = Instant::now() + Duration::from_secs(15);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        ensure!(Instant::now() < deadline, "rivetd did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((d, port))
}

fn rivet(url: &str, ca: Option<&Path>, args: &[&str]) -> Result<(bool, String)> {
    let mut cmd = Command::new(bin("rivet"));
    cmd.args(args).env("RIVET_URL", url).env_remove("RIVET_CA");
    if let Some(ca) = ca {
        cmd.env("RIVET_CA", ca);
    }
    let out = cmd.output()?;
    Ok((
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}

#[test]
fn https_with_generated_ca_for_cli_and_agent_and_wrong_ca_fails() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = dir.path().join("pki");
    tls_init(&pki)?;
    let other = dir.path().join("other-pki");
    tls_init(&other)?;
    let (_d, port) = start(dir.path(), Some(&pki))?;
    let url = format!("https://127.0.0.1:{port}");
    let ca = pki.join("ca.pem");

    let (ok, out) = rivet(
        &url,
        Some(&ca),
        &[
            "node",
            "create",
            "--driver",
            "fake-hardware",
            "--name",
            "n1",
        ],
    )?;
    ensure!(ok, "CLI over HTTPS with the CA: {out}");
    let (ok, out) = rivet(&url, None, &["node", "list"])?;
    assert!(!ok, "CLI without the CA must fail: {out}");
    assert!(
        out.to_lowercase().contains("certificate"),
        "the failure should say why: {out}"
    );
    let (ok, out) = rivet(&url, Some(&other.join("ca.pem")), &["node", "list"])?;
    assert!(!ok, "CLI with the wrong CA must fail: {out}");
    assert!(out.to_lowercase().contains("certificate"), "{out}");

    // The agent verifies the controller against the CA and completes lookup + inventory.
    let http = https_client(&ca)?;
    let call = |method: reqwest::Method, path: &str, body: Option<Value>| -> Result<(u16, Value)> {
        let mut r = http
            .request(method, format!("{url}{path}"))
            .header("X-OpenStack-Ironic-API-Version", "latest");
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send()?;
        let s = resp.status().as_u16();
        Ok((s, resp.json().unwrap_or(Value::Null)))
    };
    let (_, node) = call(reqwest::Method::GET, "/v1/nodes/n1", None)?;
    let uuid = node["uuid"].as_str().unwrap_or_default().to_string();
    // In-band inspection through the agent below (fake-hardware's default is `fake`).
    call(
        reqwest::Method::PATCH,
        "/v1/nodes/n1",
        Some(json!([{"op": "replace", "path": "/inspect_interface", "value": "agent"}])),
    )?;
    call(
        reqwest::Method::PUT,
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "manage"})),
    )?;
    std::thread::sleep(Duration::from_millis(500));
    let (s, v) = call(
        reqwest::Method::PUT,
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "inspect"})),
    )?;
    ensure!(s == 202, "{v}");
    let disk = dir.path().join("disk.img");
    std::fs::File::create(&disk)?.set_len(8 << 30)?;
    let ca_str = ca.display().to_string();
    let _agent = AgentProcess::start(
        &url,
        &uuid,
        &[&disk],
        None,
        &dir.path().join("agent.log"),
        &[("RIVET_CA", ca_str.as_str())],
    )?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, n) = call(reqwest::Method::GET, "/v1/nodes/n1", None)?;
        if n["provision_state"] == "manageable" && n["inspection_finished_at"].is_string() {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "agent over HTTPS never finished inspection: {n}\n{}",
            std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // An agent trusting the wrong CA never gets in, and says why.
    let other_ca = other.join("ca.pem").display().to_string();
    let mut bad = AgentProcess::start(
        &url,
        &uuid,
        &[&disk],
        None,
        &dir.path().join("bad-agent.log"),
        &[("RIVET_CA", other_ca.as_str())],
    )?;
    std::thread::sleep(Duration::from_secs(3));
    bad.kill9();
    let log = bad.log_text().to_lowercase();
    assert!(
        log.contains("certificate"),
        "the agent should report the TLS failure: {log}"
    );
    Ok(())
}

#[test]
fn slow_clients_are_cut_off() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = dir.path().join("pki");
    tls_init(&pki)?;
    for tls in [None, Some(pki.as_path())] {
        let (_d, port) = start(dir.path(), tls)?;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(15)))?;
        // Half a request (plain) or half a handshake (TLS: a few bytes of a ClientHello).
        if tls.is_none() {
            s.write_all(b"GET /v1 HTTP/1.1\r\nHost: x\r\n")?;
        } else {
            s.write_all(&[0x16, 0x03, 0x01])?;
        }
        let started = Instant::now();
        let mut buf = [0u8; 512];
        let n = loop {
            match s.read(&mut buf) {
                Ok(0) => break 0,
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break 0,
                Err(e) => return Err(e.into()),
            }
        };
        let waited = started.elapsed();
        assert!(
            waited < Duration::from_secs(8),
            "slow client held the connection for {waited:?} (tls: {})",
            tls.is_some()
        );
        // Plain HTTP may answer 408 before closing; TLS just closes.
        if n > 0 {
            let text = String::from_utf8_lossy(&buf[..n]);
            assert!(
                text.contains("408") || tls.is_some(),
                "unexpected answer: {text}"
            );
        }
    }
    Ok(())
}

#[test]
fn plain_http_off_loopback_is_refused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // Credentials configured (so --no-auth's own loopback rule is not what refuses it).
    let cfg = dir.path().join("rivetd.toml");
    std::fs::write(
        &cfg,
        "[auth]\ntokens = [{ name = \"ops\", hash = \"sha256$salt$00\" }]\n",
    )?;
    let out = Command::new(bin("rivetd"))
        .args(["--listen", "0.0.0.0:6399", "--config"])
        .arg(&cfg)
        .arg("--db")
        .arg(format!("sqlite:{}", dir.path().join("r.db").display()))
        .output()?;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("plain HTTP") && err.contains("tls init"),
        "{err}"
    );
    Ok(())
}
