//! The node page's console panel in headless chromium (WebDriver), against a rivetd whose
//! console is console.rs's stand-in BMC (numbered lines; what it is sent comes back as
//! `ECHO:…`): the captured log shows first, live bytes follow in xterm.js, an admin's keys
//! reach the BMC and take the pen, a reader's terminal is read-only and its keys do not.

use super::console::{config, free_block, stand_in};
use anyhow::{ensure, Context, Result};
use rivet_tests::webdriver::{self, Browser};
use rivet_tests::Rivetd;
use serde_json::{json, Value};
use std::io::Write;
use std::time::{Duration, Instant};

const ADMIN_PW: &str = "admin-console-pw";
const VIEWER_PW: &str = "viewer-console-pw";

/// The terminal's whole buffer as text, one line per row.
const BUFFER: &str = "const c = window.rivetConsole; if (!c) return ''; \
    const b = c.term.buffer.active; let s = ''; \
    for (let i = 0; i < b.length; i++) { const l = b.getLine(i); if (l) s += l.translateToString(true) + '\\n'; } \
    return s;";

fn api(r: &Rivetd, method: &str, path: &str, body: Option<Value>) -> Result<(u16, Vec<u8>)> {
    let mut req = reqwest::blocking::Client::new()
        .request(method.parse()?, format!("{}{path}", r.url))
        .basic_auth("admin", Some(ADMIN_PW))
        .header("X-OpenStack-Ironic-API-Version", "latest");
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send()?;
    Ok((resp.status().as_u16(), resp.bytes()?.to_vec()))
}

/// What the stand-in echoed, joined: keystrokes arrive a few at a time, each echoed as
/// `ECHO:<chunk>\r\n`.
fn echoed(r: &Rivetd) -> Result<String> {
    let (s, log) = api(r, "GET", "/v1/nodes/n1/console/log", None)?;
    ensure!(s == 200, "log: {s}");
    let log = String::from_utf8_lossy(&log).into_owned();
    Ok(log
        .split("ECHO:")
        .skip(1)
        .filter_map(|p| p.split("\r\n").next())
        .collect())
}

fn log_in(b: &Browser, r: &Rivetd, user: &str, pw: &str, t: Duration) -> Result<()> {
    b.goto(&format!("{}/ui/login", r.url))?;
    let u = b.wait_for("input[name=username]", t)?;
    b.type_into(&u, user)?;
    let p = b.wait_for("input[name=password]", t)?;
    b.type_into(&p, pw)?;
    let go = b.wait_for("button[type=submit]", t)?;
    b.click(&go)?;
    b.wait_until(
        "the fleet page",
        "return location.pathname === '/ui/'",
        json!([]),
        t,
    )
}

/// Open n1's page and wait until its console shows the log and is live.
fn open_console(b: &Browser, r: &Rivetd, t: Duration) -> Result<()> {
    b.goto(&format!("{}/ui/nodes/n1", r.url))?;
    b.wait_until(
        "the console panel ready",
        "const c = document.getElementById('console'); return !!c && c.dataset.ready === '1'",
        json!([]),
        t,
    )
}

fn wait_buffer(b: &Browser, needle: &str, t: Duration) -> Result<()> {
    let deadline = Instant::now() + t;
    loop {
        let text = b.script(BUFFER, json!([]))?;
        let text = text.as_str().unwrap_or_default();
        if text.contains(needle) {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{needle:?} never in the terminal; it shows {:?}",
            &text[text.len().saturating_sub(600)..]
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn web_console_panel_in_a_real_browser() -> Result<()> {
    let Some((chromium, chromedriver)) = webdriver::required() else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let ipmitool = stand_in(dir.path())?;
    let first = free_block(2)?;
    let admin = rivet_tests::hash_secret(ADMIN_PW)?;
    let viewer = rivet_tests::hash_secret(VIEWER_PW)?;
    let r = Rivetd::start_authed_in(
        dir.path(),
        &format!(
            "{}[auth]\nusers = [\n\
             {{ name = \"admin\", hash = \"{admin}\", role = \"admin\" }},\n\
             {{ name = \"viewer\", hash = \"{viewer}\", role = \"reader\" }},\n]\n",
            config(&ipmitool, first, 2)
        ),
    )?;
    let (s, body) = api(
        &r,
        "POST",
        "/v1/nodes",
        Some(json!({
            "driver": "ipmi", "name": "n1", "console_interface": "ipmitool-socat",
            "driver_info": {"ipmi_address": "mode-normal", "ipmi_username": "admin", "ipmi_password": "pw"},
        })),
    )?;
    ensure!(s == 201, "create: {s} {}", String::from_utf8_lossy(&body));
    let (s, _) = api(
        &r,
        "PUT",
        "/v1/nodes/n1/states/console",
        Some(json!({"enabled": true})),
    )?;
    ensure!(s == 202, "enable: {s}");
    let t = Duration::from_secs(30);
    let deadline = Instant::now() + t;
    loop {
        let (_, b) = api(&r, "GET", "/v1/nodes/n1/console/log?tail=4096", None)?;
        if String::from_utf8_lossy(&b).contains("line 3 ") {
            break;
        }
        ensure!(Instant::now() < deadline, "the console never printed");
        std::thread::sleep(Duration::from_millis(100));
    }

    let b = Browser::start(&chromium, &chromedriver)?;
    log_in(&b, &r, "admin", ADMIN_PW, t)?;
    open_console(&b, &r, t)?;
    // From the log: printed before the page opened. Then live lines keep coming.
    wait_buffer(&b, "SOL Session operational", t)?;
    wait_buffer(&b, "line 0 activation 0", t)?;
    let (_, now) = api(&r, "GET", "/v1/nodes/n1/console/log?tail=200", None)?;
    let now = String::from_utf8_lossy(&now).into_owned();
    let last: u64 = now
        .rsplit("line ")
        .next()
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    wait_buffer(&b, &format!("line {} activation 0", last + 5), t)?;
    ensure!(
        b.script(
            "return document.getElementById('console').dataset.canWrite",
            json!([])
        )? == "true"
    );

    // A TCP viewer types first and holds the pen; the page says so, and its Take over
    // control gives the pen to the admin.
    let (_, st) = api(&r, "GET", "/v1/nodes/n1/states/console", None)?;
    let st: Value = serde_json::from_slice(&st)?;
    let port: u16 = st["console_info"]["url"]
        .as_str()
        .and_then(|u| u.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .context("console port")?;
    let mut tcp = std::net::TcpStream::connect(("127.0.0.1", port))?;
    tcp.write_all(b"from-tcp\n")?;
    b.wait_until(
        "the pen shown as the TCP viewer's",
        "const p = document.querySelector('[data-console=pen]'); return !!p && p.textContent.includes('tcp viewer')",
        json!([]),
        t,
    )?;
    let take = b.wait_for("[data-action=console-takeover]", t)?;
    b.click(&take)?;

    // An admin's keys reach the BMC, and the admin now holds the pen.
    let keys = b.wait_for(".xterm-helper-textarea", t)?;
    b.type_into(&keys, "typed-in-browser")?;
    let deadline = Instant::now() + t;
    while !echoed(&r)?.contains("typed-in-browser") {
        ensure!(
            Instant::now() < deadline,
            "the keys never reached the BMC: {:?}",
            echoed(&r)?
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    wait_buffer(&b, "ECHO:", t)?;
    b.wait_until(
        "the pen shown as the admin's",
        "const p = document.querySelector('[data-console=pen]'); return !!p && p.textContent.includes('admin')",
        json!([]),
        t,
    )?;

    // A reader: read-only terminal, no take-over control, keys never sent.
    let out = b.wait_for("#logout", t)?;
    b.click(&out)?;
    b.wait_until(
        "logged out",
        "return location.pathname === '/ui/login'",
        json!([]),
        t,
    )?;
    log_in(&b, &r, "viewer", VIEWER_PW, t)?;
    open_console(&b, &r, t)?;
    wait_buffer(&b, "ECHO:", t)?;
    ensure!(
        b.script(
            "return [document.getElementById('console').dataset.canWrite, \
             window.rivetConsole.term.options.disableStdin, \
             document.querySelector('[data-action=console-takeover]').hidden]",
            json!([])
        )? == json!(["false", true, true])
    );
    let keys = b.wait_for(".xterm-helper-textarea", t)?;
    b.type_into(&keys, "reader-typed")?;
    std::thread::sleep(Duration::from_millis(1500));
    ensure!(
        !echoed(&r)?.contains("reader"),
        "a reader's keys reached the BMC"
    );
    // The tickets the pages used are in no log line.
    ensure!(!r.log_text().contains("ticket="), "a ticket was logged");
    Ok(())
}
