//! End-to-end: the `rivet` binary against a real rivetd (fake-hardware driver, SQLite in a
//! temp dir). Skips with a reason when rivetd has not been built.

use serde_json::Value;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// rivetd, killed when dropped.
struct Rivetd {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Rivetd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rivetd_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug/rivetd")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `GET /v1` answers 200.
fn answers(addr: &str) -> bool {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /v1 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    buf.starts_with("HTTP/1.1 200")
}

fn start_rivetd() -> Option<Rivetd> {
    let bin = rivetd_path();
    if !bin.exists() {
        eprintln!(
            "SKIP: {} not found; build it first with `cargo build -p rivet-controller`",
            bin.display()
        );
        return None;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let addr = format!("127.0.0.1:{}", free_port());
    let db = format!("sqlite:{}", dir.path().join("t.db").display());
    let child = Command::new(&bin)
        .args(["--listen", &addr, "--db", &db, "--no-auth"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start rivetd");
    let mut d = Rivetd {
        child,
        url: format!("http://{addr}"),
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !answers(&addr) {
        if let Ok(Some(status)) = d.child.try_wait() {
            panic!("rivetd exited early: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "rivetd did not answer GET /v1 within 20s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Some(d)
}

fn rivet(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rivet"))
        .args(args)
        .env("RIVET_URL", url)
        .env_remove("RIVET_TOKEN")
        .output()
        .expect("run rivet")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Run and require exit 0; returns stdout.
#[track_caller]
fn ok(url: &str, args: &[&str]) -> String {
    let out = rivet(url, args);
    assert!(
        out.status.success(),
        "rivet {args:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

#[track_caller]
fn ok_json(url: &str, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let s = ok(url, &all);
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("rivet {args:?} --json: {e}: {s}"))
}

#[test]
fn node_and_port_flow() {
    let Some(d) = start_rivetd() else { return };
    let url = d.url.as_str();

    // create
    let created = ok(
        url,
        &[
            "node",
            "create",
            "--name",
            "n1",
            "--driver",
            "fake-hardware",
        ],
    );
    assert!(
        created.contains("n1") && created.contains("enroll"),
        "{created}"
    );

    // list
    let list = ok(url, &["node", "list"]);
    assert!(
        list.lines()
            .any(|l| l.contains(" n1 ") && l.contains("enroll")),
        "{list}"
    );
    assert!(list.starts_with("UUID"), "{list}");

    // show --json
    let node = ok_json(url, &["node", "show", "n1"]);
    assert_eq!(node["provision_state"], "enroll", "{node}");
    assert_eq!(node["name"], "n1");

    // a verb not allowed in enroll: the server's message, exit 1
    let bad = rivet(url, &["node", "provide", "n1"]);
    assert_eq!(bad.status.code(), Some(1), "{bad:?}");
    let err = text(&bad.stderr);
    assert!(
        err.starts_with("error: ") && err.contains("enroll") && err.contains("400"),
        "{err}"
    );

    // manage + wait
    ok(url, &["node", "manage", "n1"]);
    let waited = rivet(
        url,
        &[
            "node",
            "wait",
            "n1",
            "--state",
            "manageable",
            "--timeout",
            "30",
        ],
    );
    assert!(
        waited.status.success(),
        "wait failed: {}",
        text(&waited.stderr)
    );
    assert!(text(&waited.stderr).contains("manageable"));

    // ports
    let port = ok_json(
        url,
        &[
            "port",
            "create",
            "--node",
            "n1",
            "--address",
            "52:54:00:AA:BB:01",
        ],
    );
    let port_uuid = port["uuid"].as_str().expect("port uuid").to_string();
    let ports = ok(url, &["port", "list", "--node", "n1"]);
    assert!(
        ports.contains(&port_uuid) && ports.contains("52:54:00:aa:bb:01"),
        "{ports}"
    );
    ok(url, &["port", "delete", &port_uuid]);
    let ports = ok(url, &["port", "list", "--node", "n1"]);
    assert!(!ports.contains(&port_uuid), "{ports}");

    // update
    ok(url, &["node", "update", "n1", "--set", "extra/foo=bar"]);
    let node = ok_json(url, &["node", "show", "n1"]);
    assert_eq!(node["extra"]["foo"], "bar", "{node}");
    let shown = ok(url, &["node", "show", "n1", "--fields", "extra,name"]);
    assert!(shown.contains(r#"{"foo":"bar"}"#), "{shown}");

    // power
    ok(url, &["node", "power", "n1", "off"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let node = ok_json(url, &["node", "show", "n1", "--fields", "power_state"]);
        if node["power_state"] == "power off" {
            break;
        }
        assert!(Instant::now() < deadline, "power off never landed: {node}");
        std::thread::sleep(Duration::from_millis(200));
    }

    // delete
    ok(url, &["node", "delete", "n1"]);
    let gone = rivet(url, &["node", "show", "n1"]);
    assert_eq!(gone.status.code(), Some(1));
    assert!(text(&gone.stderr).contains("404"), "{}", text(&gone.stderr));
    let list = ok(url, &["node", "list"]);
    assert!(!list.contains(" n1 "), "{list}");
}

#[test]
fn unreachable_server_is_explained() {
    let url = format!("http://127.0.0.1:{}", free_port());
    let out = rivet(&url, &["node", "list"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.starts_with(&format!("error: cannot reach rivetd at {url}"))
            && err.contains("RIVET_URL"),
        "{err}"
    );
}
