//! A fault-injecting HTTP/1.1 proxy to put in front of a BMC emulator (sushy-tools) for
//! the BMC-fault scenarios (tests/bmc_faults.rs). Point a node's `redfish_address` at
//! [`FaultProxy::url`]; requests are forwarded to the emulator unless a fault is armed, in
//! which case the proxy delays the answer, drops the connection without answering, or answers
//! a Redfish-shaped HTTP error itself. Faults are armed at run time by the test, for a time
//! window, for the next N requests, or until healed. Every request is logged (arrival time,
//! method, path, what the proxy did) so tests can count retries and measure back-off.
//!
//! Plain std threads (one per connection); each answer closes its connection, so every
//! request the client makes is one connection here and a drop is always seen by the client.
//! It also stands between agents and rivetd's image cache (tests/image_cache.rs), where
//! [`Fault::Cut`] ends a download part-way.

use anyhow::{Context, Result};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the proxy does to a request while a fault is armed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Wait this long, then forward (a slow BMC; past the client's timeout, a hung one).
    Delay(Duration),
    /// Read the request, then close the connection without a byte of answer.
    Drop,
    /// Answer this HTTP status with a Redfish error body, without forwarding.
    Status(u16),
    /// Forward, pass on only this many bytes of the answer (head included), then close: a
    /// download cut part-way.
    Cut(usize),
}

/// One request the proxy saw.
#[derive(Debug, Clone)]
pub struct Seen {
    /// When its head arrived.
    pub at: Instant,
    /// HTTP method.
    pub method: String,
    /// Request target (path and query).
    pub path: String,
    /// Its `Range` header, if any.
    pub range: Option<String>,
    /// The fault applied; `None`: forwarded untouched.
    pub fault: Option<Fault>,
}

/// How long an armed fault lasts.
#[derive(Debug, Clone, Copy)]
enum Until {
    /// A window that opens with the next request (whenever the client gets to it).
    Window(Duration),
    Time(Instant),
    Count(u32),
    Healed,
}

#[derive(Default)]
struct Shared {
    upstream: AtomicU16,
    armed: Mutex<Option<(Fault, Until)>>,
    log: Mutex<Vec<Seen>>,
    stop: AtomicBool,
}

impl Shared {
    /// The fault for a request arriving now (consumes one of a counted fault).
    fn take_fault(&self) -> Option<Fault> {
        let mut armed = self.armed.lock().ok()?;
        let (fault, until) = (*armed)?;
        match until {
            Until::Time(end) if Instant::now() >= end => {
                *armed = None;
                None
            }
            Until::Window(d) => {
                *armed = Some((fault, Until::Time(Instant::now() + d)));
                Some(fault)
            }
            Until::Count(0) => {
                *armed = None;
                None
            }
            Until::Count(n) => {
                *armed = Some((fault, Until::Count(n - 1)));
                Some(fault)
            }
            _ => Some(fault),
        }
    }
}

/// A running proxy; stops accepting on drop.
pub struct FaultProxy {
    /// `http://127.0.0.1:PORT`: use it as `redfish_address`.
    pub url: String,
    /// Its port.
    pub port: u16,
    shared: Arc<Shared>,
}

impl FaultProxy {
    /// Listen on a free loopback port and forward to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared::default());
        shared.upstream.store(upstream, Ordering::SeqCst);
        let s = shared.clone();
        std::thread::Builder::new()
            .name(format!("faultproxy-{port}"))
            .spawn(move || {
                for conn in listener.incoming() {
                    if s.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let s = s.clone();
                    let _ = std::thread::Builder::new()
                        .name("faultproxy-conn".into())
                        .spawn(move || {
                            let _ = serve(conn, &s);
                        });
                }
            })
            .context("spawning the fault proxy")?;
        Ok(FaultProxy {
            url: format!("http://127.0.0.1:{port}"),
            port,
            shared,
        })
    }

    fn arm(&self, armed: Option<(Fault, Until)>) {
        if let Ok(mut a) = self.shared.armed.lock() {
            *a = armed;
        }
    }

    /// Apply `fault` to every request that arrives in the next `window`.
    pub fn fail_for(&self, fault: Fault, window: Duration) {
        self.arm(Some((fault, Until::Time(Instant::now() + window))));
    }

    /// Apply `fault` to every request in a `window` that opens with the next request, so
    /// the window does not depend on how long the client takes to start talking.
    pub fn fail_window_from_next(&self, fault: Fault, window: Duration) {
        self.arm(Some((fault, Until::Window(window))));
    }

    /// Apply `fault` to the next `count` requests.
    pub fn fail_next(&self, fault: Fault, count: u32) {
        self.arm(Some((fault, Until::Count(count))));
    }

    /// Apply `fault` to every request until [`FaultProxy::heal`].
    pub fn fail_always(&self, fault: Fault) {
        self.arm(Some((fault, Until::Healed)));
    }

    /// Forward everything again.
    pub fn heal(&self) {
        self.arm(None);
    }

    /// Every request seen so far, oldest first.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared
            .log
            .lock()
            .map(|l| l.clone())
            .unwrap_or_default()
    }

    /// The upstream port (the emulator's).
    pub fn upstream(&self) -> u16 {
        self.shared.upstream.load(Ordering::SeqCst)
    }

    /// Forward to `127.0.0.1:port` from now on (for an upstream that needs the proxy's URL
    /// in its configuration before it starts).
    pub fn forward_to(&self, port: u16) {
        self.shared.upstream.store(port, Ordering::SeqCst);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept so its thread sees `stop` and ends.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Read one request head (up to the blank line) and its `Content-Length` body.
fn read_request(conn: &mut TcpStream) -> Result<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        anyhow::ensure!(buf.len() < 64 * 1024, "request head too large");
        let n = conn.read(&mut chunk)?;
        anyhow::ensure!(n > 0, "client closed before a full request head");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < length {
        let n = conn.read(&mut chunk)?;
        anyhow::ensure!(n > 0, "client closed inside the request body");
        body.extend_from_slice(&chunk[..n]);
    }
    Ok((head, body))
}

/// `head` with its `Connection`/`Keep-Alive` headers replaced by `Connection: close`, so
/// each side ends the exchange by closing.
fn closing(head: &str) -> String {
    let mut out = String::new();
    for line in head.split("\r\n").filter(|l| !l.is_empty()) {
        let name = line.split(':').next().unwrap_or("").trim();
        if name.eq_ignore_ascii_case("connection") || name.eq_ignore_ascii_case("keep-alive") {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    out
}

fn serve(mut conn: TcpStream, shared: &Shared) -> Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    let (head, body) = read_request(&mut conn)?;
    let mut words = head.split_whitespace();
    let method = words.next().unwrap_or("").to_string();
    let path = words.next().unwrap_or("").to_string();
    let range = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("range"))
        .map(|(_, v)| v.trim().to_string());
    let fault = shared.take_fault();
    if let Ok(mut log) = shared.log.lock() {
        log.push(Seen {
            at: Instant::now(),
            method,
            path,
            range,
            fault,
        });
    }
    match fault {
        Some(Fault::Drop) => {
            let _ = conn.shutdown(Shutdown::Both);
            return Ok(());
        }
        Some(Fault::Status(code)) => {
            let json = serde_json::json!({"error": {
                "code": "Base.1.0.GeneralError",
                "message": format!("fault proxy: injected HTTP {code}"),
            }})
            .to_string();
            let answer = format!(
                "HTTP/1.1 {code} Injected Fault\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{json}",
                json.len()
            );
            conn.write_all(answer.as_bytes())?;
            let _ = conn.shutdown(Shutdown::Both);
            return Ok(());
        }
        Some(Fault::Delay(d)) => std::thread::sleep(d),
        Some(Fault::Cut(_)) | None => {}
    }
    let upstream = shared.upstream.load(Ordering::SeqCst);
    let mut up = TcpStream::connect(("127.0.0.1", upstream))?;
    up.set_read_timeout(Some(Duration::from_secs(30)))?;
    up.write_all(closing(&head).as_bytes())?;
    up.write_all(&body)?;
    let mut answer = Vec::new();
    up.read_to_end(&mut answer)?;
    // Rewrite the answer's head the same way; the body passes through untouched.
    let out = match answer.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(i) => {
            let mut out = closing(&String::from_utf8_lossy(&answer[..i + 4])).into_bytes();
            out.extend_from_slice(&answer[i + 4..]);
            out
        }
        None => answer,
    };
    let out = match fault {
        Some(Fault::Cut(n)) => &out[..n.min(out.len())],
        _ => &out[..],
    };
    // The client may have given up (timeout) meanwhile: a failed write is fine.
    let _ = conn.write_all(out);
    let _ = conn.shutdown(Shutdown::Both);
    Ok(())
}
