//! The web UI (`/ui/`): its sessions over plain HTTP (cookie flags, CSRF header on changes,
//! failed log-ins limited, log-out, nothing secret in a URL), then the pages in a real
//! headless chromium driven over WebDriver: log in, the fleet's rows and their live update,
//! filters, the verbs a node page offers per state and role, a confirmed verb, log-out.

use anyhow::{ensure, Context, Result};
use rivet_tests::webdriver::{self, Browser};
use rivet_tests::Rivetd;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const ADMIN_PW: &str = "admin-pass-1";
const VIEWER_PW: &str = "viewer-pass-1";

/// rivetd with an admin and a reader user, and `extra` config.
fn rivetd(dir: &std::path::Path, extra: &str) -> Result<Rivetd> {
    let admin = rivet_tests::hash_secret(ADMIN_PW)?;
    let viewer = rivet_tests::hash_secret(VIEWER_PW)?;
    Rivetd::start_authed_in(
        dir,
        &format!(
            "[auth]\nusers = [\n\
             {{ name = \"admin\", hash = \"{admin}\", role = \"admin\" }},\n\
             {{ name = \"viewer\", hash = \"{viewer}\", role = \"reader\" }},\n]\n{extra}"
        ),
    )
}

/// A client that follows no redirects and keeps no cookies: each test says what it sends.
fn client() -> Result<reqwest::blocking::Client> {
    Ok(reqwest::blocking::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()?)
}

/// An admin API call with basic credentials.
/// The numbers a page script returns as an array.
fn numbers(b: &Browser, script: &str) -> Result<Vec<f64>> {
    let v = b.script(script, json!([]))?;
    Ok(v.as_array()
        .with_context(|| format!("not an array: {v}"))?
        .iter()
        .filter_map(Value::as_f64)
        .collect())
}

fn admin(r: &Rivetd, method: &str, path: &str, body: Option<Value>) -> Result<(u16, Value)> {
    let mut req = client()?
        .request(method.parse()?, format!("{}{path}", r.url))
        .basic_auth("admin", Some(ADMIN_PW))
        .header("X-OpenStack-Ironic-API-Version", "latest");
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send()?;
    let status = resp.status().as_u16();
    Ok((status, resp.json().unwrap_or(Value::Null)))
}

fn create_node(r: &Rivetd, body: Value) -> Result<String> {
    let (s, v) = admin(r, "POST", "/v1/nodes", Some(body))?;
    ensure!(s == 201, "create node: {s} {v}");
    Ok(v["uuid"].as_str().context("uuid")?.to_string())
}

fn wait_node(r: &Rivetd, uuid: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, v) = admin(r, "GET", &format!("/v1/nodes/{uuid}"), None)?;
        if pred(&v) {
            return Ok(v);
        }
        ensure!(Instant::now() < deadline, "node {uuid} never {what}: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// POST the log-in form; (status, session id from Set-Cookie, the whole Set-Cookie, Location).
fn login(r: &Rivetd, user: &str, pw: &str) -> Result<(u16, Option<String>, String, String)> {
    let resp = client()?
        .post(format!("{}/ui/login", r.url))
        .form(&[("username", user), ("password", pw)])
        .send()?;
    let header = |n: &str| {
        resp.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let cookie = header("set-cookie");
    let id = cookie
        .strip_prefix("rivet_session=")
        .and_then(|c| c.split(';').next())
        .filter(|c| !c.is_empty())
        .map(str::to_string);
    Ok((resp.status().as_u16(), id, cookie, header("location")))
}

/// A request with the session cookie and optionally a CSRF header.
fn with_session(
    r: &Rivetd,
    method: &str,
    path: &str,
    id: &str,
    csrf: Option<&str>,
    body: Option<Value>,
) -> Result<(u16, Value)> {
    let mut req = client()?
        .request(method.parse()?, format!("{}{path}", r.url))
        .header("cookie", format!("rivet_session={id}"))
        .header("X-OpenStack-Ironic-API-Version", "latest");
    if let Some(c) = csrf {
        req = req.header("x-rivet-csrf", c);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send()?;
    let status = resp.status().as_u16();
    Ok((status, resp.json().unwrap_or(Value::Null)))
}

#[test]
fn web_ui_sessions_cookies_csrf_and_failed_logins() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let r = rivetd(dir.path(), "[api]\nfailed_auth_per_minute = 3\n")?;
    let http = client()?;

    // GET / is still Ironic's version document; the UI is under /ui/.
    let root: Value = http.get(format!("{}/", r.url)).send()?.json()?;
    assert!(root["versions"].is_array(), "{root}");
    let resp = http.get(format!("{}/ui/", r.url)).send()?;
    assert_eq!(resp.status().as_u16(), 303);
    assert_eq!(resp.headers()["location"], "/ui/login");
    let form = http.get(format!("{}/ui/login", r.url)).send()?.text()?;
    assert!(
        form.contains("name=\"username\"") && form.contains("name=\"password\""),
        "{form}"
    );
    let js = http.get(format!("{}/ui/assets/app.js", r.url)).send()?;
    assert_eq!(js.status().as_u16(), 200);
    assert!(js.headers()["content-type"]
        .to_str()?
        .starts_with("text/javascript"));

    // A wrong password: refused, no cookie.
    let (s, id, _, _) = login(&r, "admin", "wrong")?;
    assert_eq!((s, id), (401, None));
    // The right one: a session cookie script cannot read and other sites never send, with an
    // expiry; plain HTTP here, so not `Secure`. The redirect carries nothing secret.
    let (s, id, cookie, location) = login(&r, "admin", ADMIN_PW)?;
    assert_eq!(s, 303, "{cookie}");
    let id = id.context("no session cookie")?;
    assert_eq!(location, "/ui/");
    for flag in ["HttpOnly", "SameSite=Strict", "Max-Age=", "Path=/"] {
        assert!(cookie.contains(flag), "{flag} missing: {cookie}");
    }
    assert!(!cookie.contains("Secure"), "{cookie}");
    assert!(!location.contains(&id));

    // The cookie is an API credential: reads need nothing more.
    let (s, _) = with_session(&r, "GET", "/v1/nodes", &id, None, None)?;
    assert_eq!(s, 200);
    let (s, me) = with_session(&r, "GET", "/ui/whoami", &id, None, None)?;
    assert_eq!(s, 200);
    assert_eq!(me["role"], "admin");
    let csrf = me["csrf"].as_str().context("csrf")?.to_string();
    assert_ne!(csrf, id);

    // A change needs the session's CSRF header: without it, or with another value, 403 and
    // the node is unchanged.
    let node = create_node(&r, json!({"driver": "fake-hardware", "name": "csrf-1"}))?;
    let path = format!("/v1/nodes/{node}/maintenance");
    let (s, v) = with_session(&r, "PUT", &path, &id, None, Some(json!({"reason": "x"})))?;
    assert_eq!(s, 403, "{v}");
    assert!(rivet_tests::fault(&v).contains("x-rivet-csrf"), "{v}");
    let (s, _) = with_session(
        &r,
        "PUT",
        &path,
        &id,
        Some("forged"),
        Some(json!({"reason": "x"})),
    )?;
    assert_eq!(s, 403);
    let (_, n) = admin(&r, "GET", &format!("/v1/nodes/{node}"), None)?;
    assert_eq!(n["maintenance"], false);
    let (s, v) = with_session(
        &r,
        "PUT",
        &path,
        &id,
        Some(&csrf),
        Some(json!({"reason": "x"})),
    )?;
    assert!((200..300).contains(&s), "{s} {v}");
    let (_, n) = admin(&r, "GET", &format!("/v1/nodes/{node}"), None)?;
    assert_eq!(n["maintenance"], true);

    // A reader's session reads but changes nothing, and the UI is told so.
    let (s, rid, _, _) = login(&r, "viewer", VIEWER_PW)?;
    assert_eq!(s, 303);
    let rid = rid.context("reader session")?;
    let (_, rme) = with_session(&r, "GET", "/ui/whoami", &rid, None, None)?;
    assert_eq!(rme["may"]["provision"], false, "{rme}");
    let rcsrf = rme["csrf"].as_str().context("csrf")?.to_string();
    let (s, _) = with_session(&r, "DELETE", &path, &rid, Some(&rcsrf), None)?;
    assert_eq!(s, 403);

    // A log-in posted from another site's page is refused.
    let resp = http
        .post(format!("{}/ui/login", r.url))
        .header("origin", "http://evil.example")
        .form(&[("username", "admin"), ("password", ADMIN_PW)])
        .send()?;
    assert_eq!(resp.status().as_u16(), 403);
    assert!(resp.headers().get("set-cookie").is_none());

    // Log-out needs the CSRF header too; then the cookie is worthless.
    let out = |csrf: Option<&str>| -> Result<u16> {
        let mut req = http
            .post(format!("{}/ui/logout", r.url))
            .header("cookie", format!("rivet_session={id}"));
        if let Some(c) = csrf {
            req = req.header("x-rivet-csrf", c);
        }
        Ok(req.send()?.status().as_u16())
    };
    assert_eq!(out(None)?, 403);
    assert_eq!(
        with_session(&r, "GET", "/v1/nodes", &id, None, None)?.0,
        200
    );
    assert_eq!(out(Some(&csrf))?, 204);
    assert_eq!(
        with_session(&r, "GET", "/v1/nodes", &id, None, None)?.0,
        401
    );
    assert_eq!(
        with_session(&r, "GET", "/ui/whoami", &id, None, None)?.0,
        401
    );

    // Failed log-ins share the API's failed-authentication limit (3 a minute here): the
    // source is soon refused with 429, and then even the right password is not checked.
    let mut limited = None;
    for attempt in 0..5 {
        let (s, _, _, _) = login(&r, "admin", "guess")?;
        if s == 429 {
            limited = Some(attempt);
            break;
        }
        assert_eq!(s, 401);
    }
    assert!(limited.is_some(), "failed log-ins were never limited");
    let resp = client()?
        .post(format!("{}/ui/login", r.url))
        .form(&[("username", "admin"), ("password", ADMIN_PW)])
        .send()?;
    assert_eq!(resp.status().as_u16(), 429);
    assert!(resp.headers().get("retry-after").is_some());
    assert!(resp.headers().get("set-cookie").is_none());
    // Nothing secret reached the log.
    let log = r.log_text();
    assert!(!log.contains(ADMIN_PW) && !log.contains(&id) && !log.contains(&csrf));
    // Log-ins (accepted and refused, not the flood over the limit) and the log-out are in
    // the audit trail, with nothing secret; the UI's requests are counted in /metrics.
    let (s, audit) = admin(&r, "GET", "/v1/audit?limit=1000", None)?;
    ensure!(s == 200, "{audit}");
    let rows = audit["audit"].as_array().context("audit rows")?;
    let count = |action: &str, status: u64, actor: &str| {
        rows.iter()
            .filter(|r| {
                r["action"] == action
                    && r["status"] == status
                    && r["actor"].as_str().is_some_and(|a| a.contains(actor))
            })
            .count()
    };
    assert_eq!(count("ui:login", 303, "admin (role admin)"), 1, "{audit}");
    assert_eq!(count("ui:login", 303, "viewer (role reader)"), 1, "{audit}");
    assert!(count("ui:login", 401, "log-in as admin") >= 2, "{audit}");
    assert_eq!(count("ui:logout", 204, "admin (role admin)"), 1, "{audit}");
    assert_eq!(count("ui:login", 429, ""), 0, "{audit}");
    let text = audit.to_string();
    assert!(!text.contains(ADMIN_PW) && !text.contains(&id) && !text.contains("guess"));
    let metrics = client()?
        .get(format!("{}/metrics", r.url))
        .basic_auth("admin", Some(ADMIN_PW))
        .send()?
        .text()?;
    ensure!(
        metrics.contains("route=\"/ui/login\"") && metrics.contains("route=\"/ui/whoami\""),
        "UI requests not in /metrics"
    );
    Ok(())
}

/// The rows the fleet page shows now (a JavaScript expression).
const ROWS: &str = "[...document.querySelectorAll('[data-node]')].map(r => r.dataset.node)";
/// The provision state row `arguments[0]` shows (a JavaScript expression).
const STATE_OF: &str = "(() => { const r = document.querySelector(`[data-node=\"${arguments[0]}\"] [data-field=provision_state]`); \
                        return r ? r.dataset.state : null; })()";

#[test]
fn web_ui_in_a_real_browser() -> Result<()> {
    let Some((chromium, chromedriver)) = webdriver::required() else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let r = rivetd(dir.path(), "")?;
    let alpha = create_node(
        &r,
        json!({"driver": "fake-hardware", "name": "alpha", "owner": "team-x"}),
    )?;
    let bravo = create_node(&r, json!({"driver": "fake-hardware", "name": "bravo"}))?;
    let charlie = create_node(&r, json!({"driver": "fake-hardware", "name": "charlie"}))?;
    for n in [&alpha, &charlie] {
        let (s, v) = admin(
            &r,
            "PUT",
            &format!("/v1/nodes/{n}/states/provision"),
            Some(json!({"target": "manage"})),
        )?;
        ensure!(s == 202, "manage: {s} {v}");
        wait_node(&r, n, "manageable", |v| {
            v["provision_state"] == "manageable"
        })?;
    }
    let b = Browser::start(&chromium, &chromedriver)?;
    let t = Duration::from_secs(20);

    // Not logged in: the log-in form. A wrong password stays there, with an error.
    b.goto(&format!("{}/ui/", r.url))?;
    ensure!(b.url()?.ends_with("/ui/login"), "{}", b.url()?);
    let submit = |user: &str, pw: &str| -> Result<()> {
        let u = b.wait_for("input[name=username]", t)?;
        b.type_into(&u, user)?;
        let p = b.wait_for("input[name=password]", t)?;
        b.type_into(&p, pw)?;
        let go = b.wait_for("button[type=submit]", t)?;
        b.click(&go)
    };
    submit("admin", "not-the-password")?;
    b.wait_for("#login-error", t)?;
    ensure!(b.url()?.ends_with("/ui/login"));
    submit("admin", ADMIN_PW)?;
    b.wait_until(
        "the fleet page",
        "return location.pathname === '/ui/'",
        json!([]),
        t,
    )?;

    // The fleet: one row per node, with its state.
    b.wait_until(
        "three rows",
        &format!("return {ROWS}.length === 3"),
        json!([]),
        t,
    )?;
    let state_of = format!("return {STATE_OF}");
    assert_eq!(b.script(&state_of, json!([alpha]))?, "manageable");
    assert_eq!(b.script(&state_of, json!([bravo]))?, "enroll");

    // A change made through the API appears in its row without a reload (the marker set on
    // this page survives).
    b.script("window.__sameDocument = 46; return true", json!([]))?;
    let (s, v) = admin(
        &r,
        "PUT",
        &format!("/v1/nodes/{bravo}/states/provision"),
        Some(json!({"target": "manage"})),
    )?;
    ensure!(s == 202, "{v}");
    b.wait_until(
        "bravo's row shows manageable",
        &format!("return window.__sameDocument === 46 && {STATE_OF} === 'manageable'"),
        json!([bravo]),
        t,
    )?;

    // Filters narrow the rows: by owner, by free text, by state.
    let owner = b.wait_for("input[name=owner]", t)?;
    b.type_into(&owner, "team-x")?;
    b.wait_until(
        "owner filter",
        &format!("const rows = {ROWS}; return rows.length === 1 && rows[0] === arguments[0]"),
        json!([alpha]),
        t,
    )?;
    b.script("const o = document.querySelector('input[name=owner]'); o.value = ''; o.dispatchEvent(new Event('input')); return true", json!([]))?;
    let q = b.wait_for("input[name=q]", t)?;
    b.type_into(&q, "charl")?;
    b.wait_until(
        "text filter",
        &format!("const rows = {ROWS}; return rows.length === 1 && rows[0] === arguments[0]"),
        json!([charlie]),
        t,
    )?;
    b.script("const o = document.querySelector('input[name=q]'); o.value = ''; o.dispatchEvent(new Event('input')); return true", json!([]))?;
    b.wait_until(
        "all rows again",
        &format!("return {ROWS}.length === 3"),
        json!([]),
        t,
    )?;

    // A manageable node's page offers provide, never undeploy.
    b.goto(&format!("{}/ui/nodes/{alpha}", r.url))?;
    b.wait_for("#verbs", t)?;
    ensure!(
        b.find("[data-verb=provide]")?.is_some(),
        "no provide on a manageable node"
    );
    ensure!(
        b.find("[data-verb=undeploy]")?.is_none(),
        "undeploy offered on a manageable node"
    );
    ensure!(
        b.find("[data-verb=deploy]")?.is_none(),
        "deploy offered on a manageable node"
    );

    // Power it on (no confirmation needed), then off: a destructive verb asks in a dialog and
    // acts only once confirmed; the change is read back through the API.
    b.click_css("[data-verb=power-on]", t)?;
    wait_node(&r, &alpha, "powered on", |v| v["power_state"] == "power on")?;
    b.click_css("[data-verb=power-off]", t)?;
    b.wait_for("dialog[open] [data-confirm]", t)?;
    std::thread::sleep(Duration::from_millis(300));
    let (_, v) = admin(&r, "GET", &format!("/v1/nodes/{alpha}"), None)?;
    assert_eq!(v["power_state"], "power on", "acted before confirmation");
    b.click_css("dialog[open] [data-confirm]", t)?;
    wait_node(&r, &alpha, "powered off", |v| {
        v["power_state"] == "power off"
    })?;

    // The session lives in an HttpOnly cookie, never in a URL.
    let cookies = b.cookies()?;
    let session = cookies
        .iter()
        .find(|c| c["name"] == "rivet_session")
        .context("no session cookie in the browser")?;
    assert_eq!(session["httpOnly"], true);
    let id = session["value"]
        .as_str()
        .context("cookie value")?
        .to_string();
    ensure!(!b.url()?.contains(&id));
    let (s, _) = with_session(&r, "GET", "/v1/nodes", &id, None, None)?;
    assert_eq!(s, 200);

    // Log-out ends the session: the cookie no longer works.
    let out = b.wait_for("[data-action=logout]", t)?;
    b.click(&out)?;
    b.wait_until(
        "the log-in page",
        "return location.pathname === '/ui/login'",
        json!([]),
        t,
    )?;
    let (s, _) = with_session(&r, "GET", "/v1/nodes", &id, None, None)?;
    assert_eq!(s, 401, "the session still works after log-out");

    // A reader sees the node but no verbs.
    submit("viewer", VIEWER_PW)?;
    b.wait_until(
        "the fleet page",
        "return location.pathname === '/ui/'",
        json!([]),
        t,
    )?;
    b.goto(&format!("{}/ui/nodes/{alpha}", r.url))?;
    b.wait_for("#verbs", t)?;
    b.wait_for("#node-state", t)?;
    let verbs = b.script(
        "return document.querySelectorAll('[data-verb]').length",
        json!([]),
    )?;
    assert_eq!(verbs, 0, "a reader was offered verbs");
    Ok(())
}

/// The charts page in a real browser: after one fake deploy, the deploy-duration chart holds
/// exactly one sample and the time-per-state chart names the states the nodes went through.
/// With `RIVET_SCREENSHOTS=DIR` it also saves the README's pictures (fleet, node, charts).
#[test]
fn web_ui_charts_after_a_deploy() -> Result<()> {
    let Some((chromium, chromedriver)) = webdriver::required() else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let r = rivetd(dir.path(), "")?;
    let verb = |n: &str, target: &str| -> Result<()> {
        let (s, v) = admin(
            &r,
            "PUT",
            &format!("/v1/nodes/{n}/states/provision"),
            Some(json!({ "target": target })),
        )?;
        ensure!(s == 202, "{target}: {s} {v}");
        Ok(())
    };
    let mut nodes = Vec::new();
    for (i, owner) in ["team-a", "team-a", "team-b", "team-b", "team-c"]
        .iter()
        .enumerate()
    {
        let n = create_node(
            &r,
            json!({"driver": "fake-hardware", "name": format!("rack1-u{:02}", i * 2 + 1),
                   "owner": owner, "resource_class": "bm-large"}),
        )?;
        nodes.push(n);
    }
    for n in &nodes[..4] {
        verb(n, "manage")?;
    }
    for n in &nodes[..4] {
        wait_node(&r, n, "manageable", |v| {
            v["provision_state"] == "manageable"
        })?;
    }
    // One deploy (fake deploy interface: nothing written), from available to active.
    let deployed = &nodes[0];
    verb(deployed, "provide")?;
    wait_node(&r, deployed, "available", |v| {
        v["provision_state"] == "available"
    })?;
    let (s, v) = admin(
        &r,
        "PATCH",
        &format!("/v1/nodes/{deployed}"),
        Some(json!([{"op": "add", "path": "/instance_info/image_source",
                      "value": "http://images.example/ubuntu.img"}])),
    )?;
    ensure!(s == 200, "{v}");
    verb(deployed, "active")?;
    wait_node(&r, deployed, "active", |v| v["provision_state"] == "active")?;
    let (s, v) = admin(
        &r,
        "PUT",
        &format!("/v1/nodes/{}/maintenance", nodes[3]),
        Some(json!({"reason": "fan failure"})),
    )?;
    ensure!((200..300).contains(&s), "{v}");

    let b = Browser::start(&chromium, &chromedriver)?;
    let t = Duration::from_secs(20);
    b.goto(&format!("{}/ui/login", r.url))?;
    let u = b.wait_for("input[name=username]", t)?;
    b.type_into(&u, "admin")?;
    let p = b.wait_for("input[name=password]", t)?;
    b.type_into(&p, ADMIN_PW)?;
    let go = b.wait_for("button[type=submit]", t)?;
    b.click(&go)?;
    b.wait_until(
        "five rows",
        &format!("return {ROWS}.length === 5"),
        json!([]),
        t,
    )?;
    // Rows are placed one under the other (their `top` is set through the CSSOM, which the
    // CSP allows, not a style attribute, which it refuses).
    let tops = numbers(
        &b,
        "return [...document.querySelectorAll('[data-node]')].map(r => r.getBoundingClientRect().top)",
    )?;
    ensure!(
        tops.windows(2).all(|w| w[1] > w[0]),
        "rows overlap: {tops:?}"
    );
    // The counts per state are chips, one per state (3 manageable here).
    let counts = b.script(
        "return document.getElementById('counts').textContent",
        json!([]),
    )?;
    let counts = counts.as_str().unwrap_or_default();
    ensure!(
        counts.contains("manageable 3") && !counts.contains("[object"),
        "counts: {counts}"
    );
    b.screenshot_to_env("fleet")?;

    let nav = b.wait_for("#nav-charts", t)?;
    b.click(&nav)?;
    b.wait_until(
        "the deploy chart with one deploy",
        "const f = document.querySelector('[data-chart=deploys]'); return !!f && f.dataset.total === '1'",
        json!([]),
        t,
    )?;
    // Exactly one bar of the distribution holds the sample (a fake deploy: ≤ 1 s or ≤ 10 s).
    let bars = numbers(
        &b,
        "return [...document.querySelectorAll('[data-chart=deploys] rect')].map(r => Number(r.dataset.value))",
    )?;
    ensure!(
        bars.len() == 11 && bars.iter().sum::<f64>() == 1.0,
        "deploy buckets: {bars:?}"
    );
    // Time per provision state: every state the deploy passed through is named, as text.
    let states = b.script(
        "return [...document.querySelectorAll('[data-chart=states] rect')].map(r => r.dataset.label)",
        json!([]),
    )?;
    for s in [
        "enroll",
        "verifying",
        "manageable",
        "available",
        "deploying",
    ] {
        ensure!(
            states.as_array().is_some_and(|a| a.iter().any(|v| v == s)),
            "{s} missing from the time-per-state chart: {states}"
        );
    }
    // Nodes per state now: 5 in all.
    let total = b.script(
        "return document.querySelector('[data-chart=nodes]').dataset.total",
        json!([]),
    )?;
    assert_eq!(total, "5");
    b.screenshot_to_env("charts")?;

    // The same figures through the JSON the page reads, and on /metrics.
    let (s, doc) = admin(&r, "GET", "/ui/charts.json", None)?;
    ensure!(s == 200, "{doc}");
    assert_eq!(doc["deploys"]["count"], 1, "{doc}");
    let metrics = client()?
        .get(format!("{}/metrics", r.url))
        .basic_auth("admin", Some(ADMIN_PW))
        .send()?
        .text()?;
    ensure!(
        metrics.contains("rivet_deploy_duration_seconds_count 1"),
        "no deploy in /metrics"
    );

    b.goto(&format!("{}/ui/nodes/{deployed}", r.url))?;
    b.wait_for("#node-state", t)?;
    b.wait_for("#timeline", t)?;
    b.screenshot_to_env("node")?;
    Ok(())
}

/// A test exec plugin with one step that reports its progress (`progress i/n` on stderr),
/// a tenth of a second a unit.
const PROGRESS_PLUGIN: &str = r#"#!/bin/sh
case "${1:-}" in
describe) echo '{"name": "ui-steps", "support_level": 1}' ;;
steps) echo '[{"interface": "deploy", "step": "burn_in", "priority": 0, "abortable": true, "argsinfo": {}}]' ;;
execute)
  cat >/dev/null
  n=40; i=0
  while [ $i -lt $n ]; do sleep 0.1; i=$((i + 1)); echo "progress $i/$n" >&2; done
  echo '{}' ;;
esac
"#;

/// The running step's progress, live: the real agent runs a manual clean step that reports
/// progress, and the fleet row and the node page show it move without a reload.
#[test]
fn web_ui_shows_step_progress_live() -> Result<()> {
    let Some((chromium, chromedriver)) = webdriver::required() else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let r = Rivetd::start_in(
        dir.path(),
        "[agent]\nlong_poll_s = 2\n[conductor]\ncheck_interval_s = 1\n",
    )?;
    let (s, v) = r.call(
        "POST",
        "/v1/nodes",
        Some(json!({"driver": "fake-hardware", "deploy_interface": "direct", "name": "burner"})),
    )?;
    ensure!(s == 201, "{v}");
    let uuid = v["uuid"].as_str().context("uuid")?.to_string();
    r.call(
        "PUT",
        "/v1/nodes/burner/states/provision",
        Some(json!({"target": "manage"})),
    )?;
    r.wait_node("burner", Duration::from_secs(10), |v| {
        v["provision_state"] == "manageable"
    })?;
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins)?;
    let plugin = plugins.join("ui-steps");
    std::fs::write(&plugin, PROGRESS_PLUGIN)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755))?;

    let b = Browser::start(&chromium, &chromedriver)?;
    let t = Duration::from_secs(20);
    b.goto(&format!("{}/ui/", r.url))?;
    b.wait_until(
        "the fleet",
        &format!("return {ROWS}.length === 1"),
        json!([]),
        t,
    )?;
    let (s, v) = r.call(
        "PUT",
        "/v1/nodes/burner/states/provision",
        Some(
            json!({"target": "clean", "clean_steps": [{"interface": "deploy", "step": "burn_in"}]}),
        ),
    )?;
    ensure!(s == 202, "{v}");
    r.wait_node("burner", Duration::from_secs(10), |v| {
        v["provision_state"] == "clean wait"
    })?;
    let disk = dir.path().join("disk0.img");
    std::fs::File::create(&disk)?.set_len(16 << 20)?;
    let _agent = rivet_tests::agentproc::AgentProcess::start(
        &r.url,
        &uuid,
        &[&disk],
        Some(&plugins),
        &dir.path().join("agent.log"),
        &[],
    )?;
    // The row's step cell: the step's name and a percentage that grows while the page stays.
    let pct = "((u) => { const p = document.querySelector(`[data-node=\"${u}\"] [data-field=progress]`); \
               return p && p.dataset.pct !== '' ? Number(p.dataset.pct) : -1; })(arguments[0])";
    b.script("window.__sameDocument = 46; return true", json!([]))?;
    b.wait_until(
        "progress in the row",
        &format!("return ({pct}) > 0 && ({pct}) < 100"),
        json!([uuid]),
        t,
    )?;
    let first = b
        .script(&format!("return {pct}"), json!([uuid]))?
        .as_i64()
        .unwrap_or(-1);
    b.wait_until(
        "the progress moves on",
        &format!("return window.__sameDocument === 46 && ({pct}) > {first}"),
        json!([uuid]),
        t,
    )?;
    let cell = b.script(
        "return document.querySelector(`[data-node=\"${arguments[0]}\"] [data-field=step]`).textContent",
        json!([uuid]),
    )?;
    ensure!(
        cell.as_str().is_some_and(|c| c.contains("deploy.burn_in")),
        "step cell: {cell}"
    );
    b.screenshot_to_env("fleet-progress")?;
    // The node page shows it too, and it moves there as well.
    b.goto(&format!("{}/ui/nodes/{uuid}", r.url))?;
    let cell_pct =
        "(() => { const p = document.querySelector('td[data-field=step] [data-field=progress]'); \
                    return p && p.dataset.pct !== '' ? Number(p.dataset.pct) : -1; })()";
    b.wait_until(
        "progress on the node page",
        &format!("return ({cell_pct}) > 0"),
        json!([]),
        t,
    )?;
    let first = b
        .script(&format!("return {cell_pct}"), json!([]))?
        .as_i64()
        .unwrap_or(-1);
    b.wait_until(
        "the node page's progress moves on",
        &format!("return ({cell_pct}) > {first} || ({cell_pct}) === -1"),
        json!([]),
        t,
    )?;
    r.wait_node("burner", Duration::from_secs(30), |v| {
        v["provision_state"] == "manageable"
    })?;
    Ok(())
}
