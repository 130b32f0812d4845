//! The serial console (`ipmitool-socat`) end to end through rivetd's console hub.
//!
//! Most tests run rivetd with `[drivers] ipmitool` pointing at a stand-in (a small Python
//! script written here) whose `sol activate` plays a BMC: it prints a scripted stream, echoes
//! what it is sent, and behaves by the node's `ipmi_address` — `mode-normal`, `mode-die`
//! (the first session drops after five lines), `mode-refuse` (the BMC answers "SOL payload
//! already active"), `mode-hostile` (NUL bytes, invalid UTF-8, 10 MiB without a newline).
//! Checked: fan-out to a TCP and a WebSocket viewer, one writer, the bounded log and its
//! tail, reconnect after the session dies (log and history say so), re-opening after a
//! rivetd restart, failure events quoting the console, tickets, readers that cannot type,
//! Ironic's refusals and `last_error`, and the `baremetal` CLI round trip.
//!
//! `real_sol_through_ipmi_sim` uses the real ipmitool against OpenIPMI's ipmi_sim with a
//! `sol "tcp:…"` device fed by the test (skipped without ipmi_sim unless
//! RIVET_REQUIRE_PEERS=1).

use anyhow::{bail, ensure, Context, Result};
use rivet_tests::peers::{have_ipmi_sim, IpmiSim};
use rivet_tests::{free_port, prerequisite, Rivetd};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};
use tungstenite::client::IntoClientRequest;
use tungstenite::Message;

/// The stand-in ipmitool; `{dir}` is where it keeps its call log and activation counts.
const STAND_IN: &str = r#"#!/usr/bin/env python3
import os, sys, time, threading
D = "{dir}"
args = sys.argv[1:]
addr = args[args.index("-H") + 1]
with open(os.path.join(D, "calls.log"), "a") as f:
    f.write("ARGS %s ENV %s\n" % (" ".join(args), "set" if os.environ.get("IPMI_PASSWORD") else "unset"))
out = sys.stdout.buffer
if args[-2:] == ["sol", "deactivate"]:
    sys.exit(0)
if args[-2:] != ["sol", "activate"]:
    sys.stderr.write("Error: the stand-in BMC does not do %s\n" % " ".join(args[-3:]))
    sys.exit(1)
n_file = os.path.join(D, addr + ".activations")
n = int(open(n_file).read()) if os.path.exists(n_file) else 0
open(n_file, "w").write(str(n + 1))
if addr == "mode-refuse":
    sys.stderr.write("Info: SOL payload already active on another session\n")
    sys.exit(1)
out.write(b"[SOL Session operational.  Use ~? for help]\r\n")
out.flush()
lock = threading.Lock()
def echo():
    while True:
        b = os.read(0, 4096)
        if not b:
            os._exit(0)
        with lock:
            out.write(b"ECHO:" + b + b"\r\n")
            out.flush()
threading.Thread(target=echo, daemon=True).start()
def hostile():
    with lock:
        out.write(b"\x00\x00\xff\xfe\xc3\x28 bad utf8 \x1b[31m red\r\n")
        chunk = b"x" * 65536
        for _ in range(160):
            out.write(chunk)
        out.write(b"\r\nAFTER-HOSTILE\r\n")
        out.flush()
# The burst waits for the test's go (a file): its viewers must be connected first.
go = os.path.join(D, "go-hostile") if addr == "mode-hostile" else None
i = 0
while True:
    if go and os.path.exists(go):
        go = None
        hostile()
    with lock:
        out.write(b"\x1b[1mline %d activation %d\x1b[0m\r\n" % (i, n))
        out.flush()
    i += 1
    if addr == "mode-die" and n == 0 and i >= 5:
        sys.stderr.write("Error: the stand-in BMC dropped the session\n")
        sys.exit(1)
    time.sleep(0.1)
"#;

const PASSWORD: &str = "sol-S3cret-pw";

pub(crate) fn stand_in(dir: &Path) -> Result<String> {
    let path = dir.join("ipmitool-stand-in.py");
    std::fs::write(&path, STAND_IN.replace("{dir}", &dir.display().to_string()))?;
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&path)
        .status()?;
    Ok(path.display().to_string())
}

/// `[drivers]` and `[console]` for a rivetd using the stand-in, ports from a free block.
pub(crate) fn config(ipmitool: &str, first_port: u16, ports: u16) -> String {
    format!(
        "[drivers]\nipmitool = {ipmitool:?}\nipmi_timeout_s = 5\n\
         [console]\nport_range = \"{first_port}:{}\"\nlog_max_bytes = 65536\nsubprocess_timeout = 5\n",
        first_port + ports
    )
}

/// A block of `n` ports nothing listens on (checked by binding each).
pub(crate) fn free_block(n: u16) -> Result<u16> {
    for _ in 0..50 {
        let start = free_port()?;
        if start > 65000 {
            continue;
        }
        if (start..start + n).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            return Ok(start);
        }
    }
    bail!("no block of {n} free ports")
}

fn create(d: &Rivetd, name: &str, address: &str) -> Result<String> {
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(json!({
            "driver": "ipmi", "name": name, "console_interface": "ipmitool-socat",
            "driver_info": {"ipmi_address": address, "ipmi_username": "admin", "ipmi_password": PASSWORD},
        })),
    )?;
    ensure!(s == 201, "create {name}: {s} {v}");
    Ok(v["uuid"].as_str().context("uuid")?.to_string())
}

fn set_console(d: &Rivetd, name: &str, on: bool) -> Result<(u16, Value)> {
    d.call(
        "PUT",
        &format!("/v1/nodes/{name}/states/console"),
        Some(json!({ "enabled": on })),
    )
}

fn wait_console(d: &Rivetd, name: &str, on: bool) -> Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (s, v) = d.call("GET", &format!("/v1/nodes/{name}/states/console"), None)?;
        ensure!(s == 200, "{s} {v}");
        if v["console_enabled"] == on {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("console of {name} not {on}: {v}; node {}", d.node(name)?);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn port_of(info: &Value) -> Result<u16> {
    let url = info["console_info"]["url"].as_str().context("url")?;
    url.rsplit(':')
        .next()
        .context("port")?
        .parse()
        .context("port")
}

/// A raw TCP viewer.
struct TcpViewer {
    s: TcpStream,
    seen: Vec<u8>,
}

impl TcpViewer {
    fn connect(port: u16) -> Result<TcpViewer> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_millis(100)))?;
        Ok(TcpViewer {
            s,
            seen: Vec::new(),
        })
    }

    fn wait_for(&mut self, needle: &[u8], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 65536];
        let mut from = 0;
        while !contains(&self.seen[from..], needle) {
            from = self.seen.len().saturating_sub(needle.len());
            ensure!(
                Instant::now() < deadline,
                "TCP viewer never saw {:?}; last: {:?}",
                String::from_utf8_lossy(needle),
                String::from_utf8_lossy(&self.seen[self.seen.len().saturating_sub(300)..])
            );
            match self.s.read(&mut buf) {
                Ok(0) => bail!("TCP console closed"),
                Ok(n) => self.seen.extend_from_slice(&buf[..n]),
                Err(_) => {}
            }
        }
        Ok(())
    }
}

pub(crate) fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

type Ws = tungstenite::WebSocket<TcpStream>;

/// A WebSocket viewer: console bytes and JSON events (lab.rs reads one from a thread).
pub(crate) struct WsViewer {
    ws: Ws,
    pub(crate) bytes: Vec<u8>,
    pub(crate) events: Vec<Value>,
}

impl WsViewer {
    pub(crate) fn connect(port: u16, path: &str, token: Option<&str>) -> Result<WsViewer> {
        let mut req = format!("ws://127.0.0.1:{port}{path}").into_client_request()?;
        if let Some(t) = token {
            req.headers_mut()
                .insert("Authorization", format!("Bearer {t}").parse()?);
        }
        let tcp = TcpStream::connect(("127.0.0.1", port))?;
        let (ws, _) = tungstenite::client::client(req, tcp.try_clone()?)
            .map_err(|e| anyhow::anyhow!("WebSocket handshake: {e}"))?;
        tcp.set_read_timeout(Some(Duration::from_millis(100)))?;
        Ok(WsViewer {
            ws,
            bytes: Vec::new(),
            events: Vec::new(),
        })
    }

    /// Read one frame (or time out after 100 ms); an error once the socket is closed.
    pub(crate) fn pump(&mut self) -> Result<()> {
        match self.ws.read() {
            Ok(Message::Binary(b)) => self.bytes.extend_from_slice(&b),
            Ok(Message::Text(t)) => self.events.push(serde_json::from_str(t.as_str())?),
            Ok(Message::Close(_)) => bail!("WebSocket closed"),
            Ok(_) => {}
            Err(tungstenite::Error::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => bail!("WebSocket: {e}"),
        }
        Ok(())
    }

    fn wait_bytes(&mut self, needle: &[u8], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut from = 0;
        while !contains(&self.bytes[from..], needle) {
            from = self.bytes.len().saturating_sub(needle.len());
            ensure!(
                Instant::now() < deadline,
                "WebSocket viewer never saw {:?}",
                String::from_utf8_lossy(needle)
            );
            self.pump()?;
        }
        Ok(())
    }

    fn wait_event(&mut self, pred: impl Fn(&Value) -> bool, timeout: Duration) -> Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.events.iter().find(|e| pred(e)) {
                return Ok(e.clone());
            }
            ensure!(
                Instant::now() < deadline,
                "no such event; got {:?}",
                self.events
            );
            self.pump()?;
        }
    }

    fn send_text(&mut self, v: Value) -> Result<()> {
        self.ws.send(Message::Text(v.to_string().into()))?;
        Ok(())
    }

    pub(crate) fn send_bytes(&mut self, b: &[u8]) -> Result<()> {
        self.ws.send(Message::Binary(b.to_vec().into()))?;
        Ok(())
    }
}

fn history_events(d: &Rivetd, node: &str) -> Result<Vec<Value>> {
    let (s, v) = d.call(
        "GET",
        &format!("/v1/nodes/{node}/history?detail=true"),
        None,
    )?;
    ensure!(s == 200, "{s} {v}");
    Ok(v["history"].as_array().cloned().unwrap_or_default())
}

fn log_text(d: &Rivetd, node: &str, tail: Option<u64>) -> Result<(u16, Vec<u8>)> {
    let q = tail.map(|t| format!("?tail={t}")).unwrap_or_default();
    let r = reqwest::blocking::get(format!("{}/v1/nodes/{node}/console/log{q}", d.url))?;
    Ok((r.status().as_u16(), r.bytes()?.to_vec()))
}

/// Fan-out to a TCP and a WebSocket viewer, one writer, the log, a reconnect, a restart,
/// a failure event quoting the console, and the `baremetal` CLI.
#[test]
fn console_fan_out_log_reconnect_and_restart() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ipmitool = stand_in(dir.path())?;
    let first = free_block(10)?;
    let conf = config(&ipmitool, first, 10);
    let mut d = Rivetd::start_in(dir.path(), &conf)?;
    let uuid = create(&d, "c1", "mode-die")?;

    let (s, v) = set_console(&d, "c1", true)?;
    ensure!(s == 202, "{s} {v}");
    let info = wait_console(&d, "c1", true)?;
    ensure!(info["console_info"]["type"] == "socat", "{info}");
    let port = port_of(&info)?;
    ensure!((first..first + 10).contains(&port), "{info}");
    let n = d.node("c1")?;
    ensure!(n["console_enabled"] == true, "{n}");

    // Two viewers of the one session.
    let mut tcp = TcpViewer::connect(port)?;
    let mut ws = WsViewer::connect(d.port, "/v1/nodes/c1/console/ws", None)?;
    let hello = ws.wait_event(|e| e["event"] == "hello", Duration::from_secs(5))?;
    ensure!(hello["can_write"] == true, "{hello}");
    // The first session dies after five lines; the second comes back.
    tcp.wait_for(b"line 2 activation 1", Duration::from_secs(20))?;
    ws.wait_bytes(b"line 2 activation 1", Duration::from_secs(10))?;
    ensure!(
        contains(&tcp.seen, b"SOL session lost") && contains(&tcp.seen, b"re-established"),
        "{}",
        String::from_utf8_lossy(&tcp.seen)
    );

    // One writer: the WebSocket types first and holds the pen; the TCP viewer is refused.
    ws.send_bytes(b"from-ws")?;
    tcp.wait_for(b"ECHO:from-ws", Duration::from_secs(5))?;
    tcp.s.write_all(b"from-tcp")?;
    tcp.wait_for(b"read-only", Duration::from_secs(5))?;
    ws.send_text(json!({"input": "again"}))?;
    ws.wait_bytes(b"ECHO:again", Duration::from_secs(5))?;
    ensure!(
        !contains(&ws.bytes, b"ECHO:from-tcp"),
        "the TCP viewer typed"
    );

    // The log: newest last, bounded by tail, and the loss recorded.
    let (s, all) = log_text(&d, "c1", None)?;
    ensure!(s == 200, "{s}");
    ensure!(contains(&all, b"SOL session lost") && contains(&all, b"ECHO:again"));
    let (s, tail) = log_text(&d, "c1", Some(100))?;
    ensure!(s == 200 && tail.len() == 100, "{s} {}", tail.len());
    ensure!(all.ends_with(&tail) || contains(&all, &tail[..50]));
    let (s, _) = log_text(&d, "c1", Some(0))?;
    ensure!(s == 400, "tail=0: {s}");
    let h = history_events(&d, "c1")?;
    ensure!(
        h.iter().any(|e| e["event"]
            .as_str()
            .unwrap_or("")
            .contains("SOL session lost")
            && e["severity"] == "ERROR"),
        "{h:?}"
    );

    // A failed operation quotes the console (ANSI stripped): manage fails here because
    // the stand-in BMC answers no power command.
    let (s, v) = d.call(
        "PUT",
        "/v1/nodes/c1/states/provision",
        Some(json!({"target": "manage"})),
    )?;
    ensure!(s == 202, "{s} {v}");
    d.wait_node("c1", Duration::from_secs(60), |n| {
        n["provision_state"] == "enroll" && !n["last_error"].is_null()
    })?;
    let h = history_events(&d, "c1")?;
    let failure = h
        .iter()
        .find(|e| {
            e["severity"] == "ERROR" && e["event"].as_str().unwrap_or("").contains("console (last")
        })
        .with_context(|| format!("no failure event quoting the console: {h:?}"))?;
    let text = failure["event"].as_str().unwrap_or("");
    ensure!(
        text.contains("activation 1") && !text.contains('\x1b'),
        "{text}"
    );

    // Attach and detach are in the audit trail (no keystrokes).
    drop(tcp);
    let (_, audit) = d.call("GET", &format!("/v1/audit?node={uuid}&limit=200"), None)?;
    let actions: Vec<&str> = audit["audit"]
        .as_array()
        .map(|a| a.iter().filter_map(|r| r["action"].as_str()).collect())
        .unwrap_or_default();
    ensure!(
        actions.contains(&"console:attach") && actions.contains(&"console:enable"),
        "{actions:?}"
    );
    // Viewer rows never carry keystrokes (a failure event may quote the console's echo).
    let viewer_rows: Vec<&Value> = audit["audit"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|r| {
                    r["action"]
                        .as_str()
                        .is_some_and(|x| x.starts_with("console:"))
                })
                .collect()
        })
        .unwrap_or_default();
    ensure!(
        !viewer_rows.is_empty()
            && viewer_rows
                .iter()
                .all(|r| !r.to_string().contains("from-ws")),
        "{viewer_rows:?}"
    );

    // A restart: the console is open again, the log kept, the URL the same.
    drop(ws);
    d.terminate(Duration::from_secs(15))?;
    let d = Rivetd::start_in(dir.path(), &conf)?;
    let info = wait_console(&d, "c1", true)?;
    ensure!(port_of(&info)? == port, "{info}");
    let mut tcp = TcpViewer::connect(port)?;
    tcp.wait_for(b"activation 2", Duration::from_secs(20))?;
    let (_, all) = log_text(&d, "c1", None)?;
    ensure!(contains(&all, b"activation 0") && contains(&all, b"activation 2"));

    // The baremetal CLI, unchanged: show, disable (then shown below).
    if rivet_tests::clients::available() {
        let v = rivet_tests::clients::baremetal_json(&d, &["node", "console", "show", "c1"])?;
        ensure!(v["console_enabled"] == true, "{v}");
        ensure!(
            v["console_info"]["url"] == format!("tcp://127.0.0.1:{port}"),
            "{v}"
        );
        rivet_tests::clients::baremetal(&d, &["node", "console", "disable", "c1"])?;
    } else {
        let (s, v) = set_console(&d, "c1", false)?;
        ensure!(s == 202, "{s} {v}");
    }
    let info = wait_console(&d, "c1", false)?;
    ensure!(info["console_info"].is_null(), "{info}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_ok() {
        ensure!(
            Instant::now() < deadline,
            "port {port} still open after disable"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The password only ever went through the environment.
    let calls = std::fs::read_to_string(dir.path().join("calls.log"))?;
    ensure!(
        calls.contains("sol deactivate") && !calls.contains(PASSWORD),
        "{calls}"
    );
    ensure!(calls.lines().all(|l| l.ends_with("ENV set")), "{calls}");
    ensure!(
        !d.log_text().contains(PASSWORD),
        "the password reached rivetd's log"
    );
    Ok(())
}

pub(crate) const ADMIN: &str = "admin-console-token";
pub(crate) const READER: &str = "reader-console-token";

/// Refusals as Ironic's, tickets, a reader that cannot type, and a hostile stream.
#[test]
fn console_refusals_tickets_readers_and_a_hostile_stream() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ipmitool = stand_in(dir.path())?;
    let first = free_block(2)?;
    let admin = rivet_tests::hash_secret(ADMIN)?;
    let reader = rivet_tests::hash_secret(READER)?;
    let conf = format!(
        "{}[auth]\ntokens = [{{ name = \"adm\", hash = \"{admin}\", role = \"admin\" }}, \
         {{ name = \"ro\", hash = \"{reader}\", role = \"reader\" }}]\n",
        config(&ipmitool, first, 2)
    );
    let d = Rivetd::start_in_with_auth(dir.path(), &conf)?;
    let http = reqwest::blocking::Client::new();
    let call =
        |token: &str, method: &str, path: &str, body: Option<Value>| -> Result<(u16, Value)> {
            let mut r = http
                .request(method.parse()?, format!("{}{path}", d.url))
                .bearer_auth(token)
                .header("X-OpenStack-Ironic-API-Version", "latest");
            if let Some(b) = body {
                r = r.json(&b);
            }
            let resp = r.send()?;
            let s = resp.status().as_u16();
            Ok((
                s,
                serde_json::from_str(&resp.text()?).unwrap_or(Value::Null),
            ))
        };
    let create = |name: &str, info: Value, iface: &str| -> Result<()> {
        let (s, v) = call(
            ADMIN,
            "POST",
            "/v1/nodes",
            Some(
                json!({"driver": "ipmi", "name": name, "console_interface": iface, "driver_info": info}),
            ),
        )?;
        ensure!(s == 201, "{s} {v}");
        Ok(())
    };
    let enable = |name: &str, on: bool| {
        call(
            ADMIN,
            "PUT",
            &format!("/v1/nodes/{name}/states/console"),
            Some(json!({ "enabled": on })),
        )
    };

    // Missing ipmi_address: 400 naming it, nothing changed.
    create("bare", json!({"ipmi_username": "u"}), "ipmitool-socat")?;
    let (s, v) = enable("bare", true)?;
    ensure!(s == 400, "{s} {v}");
    ensure!(v.to_string().contains("ipmi_address"), "{v}");
    // no-console refuses as Ironic's.
    create("none", json!({"ipmi_address": "mode-normal"}), "no-console")?;
    let (s, v) = enable("none", true)?;
    ensure!(
        s == 400 && v.to_string().contains("does not support console"),
        "{s} {v}"
    );
    // A bad body.
    let (s, _) = call(
        ADMIN,
        "PUT",
        "/v1/nodes/none/states/console",
        Some(json!({"enabled": "maybe"})),
    )?;
    ensure!(s == 400, "{s}");
    // The BMC refuses: 202, then disabled with last_error saying why.
    create(
        "busy",
        json!({"ipmi_address": "mode-refuse", "ipmi_password": PASSWORD}),
        "ipmitool-socat",
    )?;
    let (s, v) = enable("busy", true)?;
    ensure!(s == 202, "{s} {v}");
    let n = wait_last_error(&call, "busy")?;
    ensure!(
        n["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("already active"),
        "{n}"
    );
    ensure!(n["console_enabled"] == false, "{n}");

    // Two ports: two consoles fit, the third finds the range exhausted.
    for name in ["a", "b", "c"] {
        create(
            name,
            json!({"ipmi_address": if name == "a" { "mode-hostile" } else { "mode-normal" }, "ipmi_password": PASSWORD}),
            "ipmitool-socat",
        )?;
    }
    for name in ["a", "b"] {
        let (s, v) = enable(name, true)?;
        ensure!(s == 202, "{s} {v}");
        wait_enabled(&call, name)?;
    }
    // Viewers of node a, then its hostile burst.
    let (_, a) = call(ADMIN, "GET", "/v1/nodes/a/states/console", None)?;
    let mut tcp_a = TcpViewer::connect(port_of(&a)?)?;
    let mut ws_a = WsViewer::connect(d.port, "/v1/nodes/a/console/ws", Some(ADMIN))?;
    ws_a.wait_event(|e| e["event"] == "hello", Duration::from_secs(10))?;
    std::fs::write(dir.path().join("go-hostile"), b"")?;
    let (s, _) = enable("c", true)?;
    ensure!(s == 202);
    let n = wait_last_error(&call, "c")?;
    ensure!(
        n["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("not enough free ports"),
        "{n}"
    );

    // WebSocket credentials: none is a 401; a ticket works once.
    let e = WsViewer::connect(d.port, "/v1/nodes/b/console/ws", None).err();
    ensure!(
        e.is_some_and(|e| e.to_string().contains("401")),
        "unauthenticated WebSocket accepted"
    );
    let (s, t) = call(READER, "POST", "/v1/nodes/b/console/ticket", None)?;
    ensure!(s == 201, "{s} {t}");
    let url = t["url"].as_str().context("ticket url")?.to_string();
    let mut ro = WsViewer::connect(d.port, &url, None)?;
    let again = WsViewer::connect(d.port, &url, None).err();
    ensure!(
        again.is_some_and(|e| e.to_string().contains("401")),
        "a ticket was used twice"
    );
    // A ticket is for its node.
    let (_, t2) = call(READER, "POST", "/v1/nodes/b/console/ticket", None)?;
    let other = format!(
        "/v1/nodes/a/console/ws?ticket={}",
        t2["ticket"].as_str().unwrap_or("")
    );
    ensure!(
        WsViewer::connect(d.port, &other, None).is_err(),
        "a ticket opened another node"
    );
    // The audit trail does not hold the ticket.
    let (_, audit) = call(ADMIN, "GET", "/v1/audit?limit=500", None)?;
    ensure!(
        !audit
            .to_string()
            .contains(t["ticket"].as_str().unwrap_or("-")),
        "ticket in the audit trail"
    );

    // The reader watches and may not type or take over.
    let hello = ro.wait_event(|e| e["event"] == "hello", Duration::from_secs(5))?;
    ensure!(hello["can_write"] == false, "{hello}");
    // Any line: "line 3" would match only lines 3 and 30–39 of a stream that started
    // seconds before this viewer (a loaded machine missed them all).
    ro.wait_bytes(b" activation ", Duration::from_secs(10))?;
    ro.send_bytes(b"reader-typed")?;
    ro.wait_event(|e| e["event"] == "refused", Duration::from_secs(5))?;
    ro.send_text(json!({"takeover": true}))?;
    std::thread::sleep(Duration::from_millis(500));
    ro.pump()?;
    ensure!(
        ro.events.iter().filter(|e| e["event"] == "refused").count() >= 2,
        "{:?}",
        ro.events
    );
    ensure!(
        !contains(&ro.bytes, b"ECHO:reader-typed"),
        "the reader typed"
    );
    // An admin types, and takes over from another admin.
    let mut w1 = WsViewer::connect(d.port, "/v1/nodes/b/console/ws", Some(ADMIN))?;
    let mut w2 = WsViewer::connect(d.port, "/v1/nodes/b/console/ws", Some(ADMIN))?;
    w1.send_bytes(b"first")?;
    w1.wait_bytes(b"ECHO:first", Duration::from_secs(5))?;
    w2.send_bytes(b"second")?;
    w2.wait_event(|e| e["event"] == "refused", Duration::from_secs(5))?;
    w2.send_text(json!({"takeover": true}))?;
    w2.wait_event(
        |e| e["event"] == "pen" && e["holder"] == "adm (role admin)",
        Duration::from_secs(5),
    )?;
    w2.send_bytes(b"third")?;
    ro.wait_bytes(b"ECHO:third", Duration::from_secs(5))?;
    let (_, audit) = call(ADMIN, "GET", "/v1/audit?node=b&limit=200", None)?;
    ensure!(audit.to_string().contains("console:takeover"), "{audit}");

    // The hostile stream (NUL, invalid UTF-8, 10 MiB without a newline) went to both kinds
    // of viewer; rivetd and they live through it (the next line follows it), the log stays
    // bounded.
    let after = b"AFTER-HOSTILE\r\n\x1b[1mline ";
    tcp_a.wait_for(after, Duration::from_secs(60))?;
    ws_a.wait_bytes(after, Duration::from_secs(60))?;
    ensure!(
        contains(&ws_a.bytes, b"\x00\x00\xff\xfe\xc3\x28 bad utf8"),
        "bytes changed on the way"
    );
    let r = http
        .get(format!("{}/v1/nodes/a/console/log", d.url))
        .bearer_auth(READER)
        .send()?;
    ensure!(r.status().as_u16() == 200);
    let log = r.bytes()?;
    ensure!(log.len() <= 65536, "log {} bytes", log.len());
    ensure!(
        contains(&log, b"activation 0"),
        "the log lost the lines after the burst"
    );
    let (s, _) = call(ADMIN, "GET", "/v1/nodes/a", None)?;
    ensure!(s == 200, "rivetd unwell after the hostile stream");
    Ok(())
}

/// An authenticated API call: (token, method, path, body) → (status, JSON).
type Call<'a> = dyn Fn(&str, &str, &str, Option<Value>) -> Result<(u16, Value)> + 'a;

fn wait_last_error(call: &Call, name: &str) -> Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, n) = call(ADMIN, "GET", &format!("/v1/nodes/{name}"), None)?;
        if !n["last_error"].is_null() {
            return Ok(n);
        }
        ensure!(Instant::now() < deadline, "no last_error on {name}: {n}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn wait_enabled(call: &Call, name: &str) -> Result<()> {
    wait_enabled_is(call, name, true)
}

fn wait_enabled_is(call: &Call, name: &str, on: bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, v) = call(
            ADMIN,
            "GET",
            &format!("/v1/nodes/{name}/states/console"),
            None,
        )?;
        if v["console_enabled"] == on {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "console of {name} not {on}: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The real thing: rivetd's console through ipmitool and OpenIPMI's ipmi_sim, whose SOL
/// device is a TCP port this test serves as the machine's serial line.
#[test]
fn real_sol_through_ipmi_sim() -> Result<()> {
    if !prerequisite(
        have_ipmi_sim(),
        "ipmi_sim and ipmitool (Debian openipmi, ipmitool; scripts/setup-peers.sh)",
    ) {
        return Ok(());
    }
    // The "serial port": ipmi_sim connects to it and relays it over SOL.
    let serial = std::net::TcpListener::bind("127.0.0.1:0")?;
    let serial_port = serial.local_addr()?.port();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let typed = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let (stop2, typed2) = (stop.clone(), typed.clone());
    serial.set_nonblocking(true)?;
    let feeder = std::thread::spawn(move || {
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            let Ok((mut c, _)) = serial.accept() else {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            };
            let _ = c.set_nonblocking(false);
            let _ = c.set_read_timeout(Some(Duration::from_millis(200)));
            let mut i = 0;
            while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                if c.write_all(format!("REAL-SOL line {i}\r\n").as_bytes())
                    .is_err()
                {
                    break;
                }
                i += 1;
                let mut b = [0u8; 256];
                match c.read(&mut b) {
                    Ok(0) => break,
                    Ok(n) => typed2
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .extend_from_slice(&b[..n]),
                    Err(_) => {}
                }
            }
        }
    });
    let sim = IpmiSim::start_with(
        "admin",
        PASSWORD,
        &format!("sol \"tcp:127.0.0.1:{serial_port}\" 115200"),
    )?;
    let dir = tempfile::tempdir()?;
    let first = free_block(3)?;
    let d = Rivetd::start_in(
        dir.path(),
        &format!(
            "[console]\nport_range = \"{first}:{}\"\nsubprocess_timeout = 10\n",
            first + 3
        ),
    )?;
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(
            json!({"driver": "ipmi", "name": "real", "console_interface": "ipmitool-socat",
                    "driver_info": sim.driver_info(PASSWORD)}),
        ),
    )?;
    ensure!(s == 201, "{s} {v}");
    let (s, v) = set_console(&d, "real", true)?;
    ensure!(s == 202, "{s} {v}");
    let info = wait_console(&d, "real", true)?;
    let mut tcp = TcpViewer::connect(port_of(&info)?)?;
    tcp.wait_for(b"REAL-SOL line", Duration::from_secs(20))?;
    // Typing reaches the serial line.
    tcp.s.write_all(b"typed-through-sol\r")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !contains(
        &typed.lock().unwrap_or_else(|p| p.into_inner()),
        b"typed-through-sol",
    ) {
        ensure!(
            Instant::now() < deadline,
            "keystrokes never reached the serial line"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // While rivetd holds the session, a second SOL session is refused by the BMC.
    let second = std::process::Command::new("ipmitool")
        .args([
            "-I",
            "lanplus",
            "-H",
            "127.0.0.1",
            "-C",
            "3",
            "-p",
            &sim.port.to_string(),
            "-U",
            "admin",
            "-E",
            "sol",
            "activate",
        ])
        .env("IPMI_PASSWORD", PASSWORD)
        .stdin(std::process::Stdio::null())
        .output()?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&second.stdout),
        String::from_utf8_lossy(&second.stderr)
    );
    ensure!(
        !second.status.success() && said.contains("already active"),
        "second sol activate: {said}"
    );
    let (s, _) = set_console(&d, "real", false)?;
    ensure!(s == 202);
    wait_console(&d, "real", false)?;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = feeder.join();
    Ok(())
}
