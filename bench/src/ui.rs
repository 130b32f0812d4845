//! `rivet-bench ui`: the web UI's fleet page with N nodes, measured in the same headless
//! Chromium the browser tests drive over WebDriver (`rivet_tests::webdriver`).
//!
//! The store is pre-filled as `rivet-bench api` does (`api::prefill`: N `available` nodes),
//! then a release rivetd (`--no-auth`: the viewer is an anonymous admin, so there is no
//! log-in form to fill; a session cookie costs the same requests) serves the page. Measured
//! in the page itself, with its own clock:
//!
//! - **first render**: navigation start → the fleet's rows drawn with every node read (the
//!   `rivet:fleet-ready` performance mark fleet.js sets), cold (new browser profile) and on
//!   reloads;
//! - **bytes on first load**: every resource's `transferSize` (headers and compressed body),
//!   split into the page's own files and the `/v1` node listing;
//! - **a state change in its row**: the page sends `manage` for a node in view and watches its
//!   row each animation frame; the time from sending to the row showing `manageable`
//!   (the API's answer included);
//! - **scrolling**: the list scrolled by `--scroll-px` each frame for `--scroll-frames`
//!   frames; the intervals between frames, and how many took more than 1.5 frames (dropped);
//! - **rivetd's RSS with `--sessions` UI event streams** (`GET /ui/events`, as each open page
//!   holds) open while nodes change.

use crate::rivetd::{Rivetd, Settings};
use crate::stats::mib;
use anyhow::{bail, Context, Result};
use rivet_tests::webdriver::{self, Browser};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Options of `rivet-bench ui`.
#[derive(Debug, Clone)]
pub struct UiOpts {
    /// Nodes in the store.
    pub nodes: usize,
    /// Reloads measured after the cold first load.
    pub reloads: usize,
    /// State changes measured.
    pub changes: usize,
    /// Frames of scrolling.
    pub scroll_frames: usize,
    /// Pixels scrolled per frame.
    pub scroll_px: usize,
    /// UI event streams held open for the RSS figure.
    pub sessions: usize,
    /// rivetd binary.
    pub rivetd: Option<PathBuf>,
    /// Keep the temporary directory.
    pub keep: bool,
}

const T: Duration = Duration::from_secs(60);

/// Milliseconds from navigation start to the fleet's first full render, once it happened.
fn ready_ms(b: &Browser) -> Result<f64> {
    b.wait_until(
        "the fleet's first render",
        "return performance.getEntriesByName('rivet:fleet-ready').length > 0",
        json!([]),
        T,
    )?;
    b.script(
        "return performance.getEntriesByName('rivet:fleet-ready')[0].startTime",
        json!([]),
    )?
    .as_f64()
    .context("no ready mark")
}

/// (page files, node listing, listing uncompressed) bytes transferred by this page load.
fn transferred(b: &Browser) -> Result<(f64, f64, f64)> {
    let v = b.script(
        "const all = [...performance.getEntriesByType('navigation'), ...performance.getEntriesByType('resource')];
         let files = 0, data = 0, raw = 0;
         for (const e of all) {
           if (e.name.includes('/v1/')) { data += e.transferSize; raw += e.decodedBodySize; }
           else if (!e.name.includes('/ui/events')) files += e.transferSize;
         }
         return [files, data, raw];",
        json!([]),
    )?;
    let f = |i: usize| v[i].as_f64().unwrap_or(0.0);
    Ok((f(0), f(1), f(2)))
}

fn kib(bytes: f64) -> String {
    format!("{:.0} KiB", bytes / 1024.0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Open one `/ui/events` stream on `addr` and read its first event; the socket stays open.
fn open_stream(addr: &str) -> Result<TcpStream> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET /ui/events HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n"
    )?;
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&got).contains("event: hello") {
        let n = s.read(&mut buf)?;
        if n == 0 {
            bail!("event stream closed: {}", String::from_utf8_lossy(&got));
        }
        got.extend_from_slice(&buf[..n]);
    }
    Ok(s)
}

/// `rivet-bench ui`.
pub fn run(o: UiOpts) -> Result<Vec<String>> {
    let Some((chromium, chromedriver)) = webdriver::installed() else {
        bail!("chromium and chromedriver are not installed (scripts/setup-browser.sh)");
    };
    let n = o.nodes;
    if n < 10 {
        bail!("--nodes must be at least 10");
    }
    let exe = crate::rivetd::locate(o.rivetd.as_deref())?;
    let dir = tempfile::Builder::new()
        .prefix("rivet-bench-ui-")
        .tempdir()?;
    let db = dir.path().join("rivet.db");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let t = Instant::now();
    let uuids = rt.block_on(crate::api::prefill(&db, n))?;
    eprintln!("pre-filled {n} nodes in {:.1} s", t.elapsed().as_secs_f64());
    let d = rt.block_on(Rivetd::start(&exe, dir.path(), &db, &Settings::default()))?;
    let rss_idle = d.rss_kib();
    let mut rows = Vec::new();
    let cmd = format!("`rivet-bench ui --nodes {n}`");

    // First render and bytes, cold: a new profile, nothing cached.
    let b = Browser::start(&chromium, &chromedriver)?;
    let url = format!("{}/ui/", d.url);
    b.goto(&url)?;
    let cold = ready_ms(&b)?;
    let (files, data, raw) = transferred(&b)?;
    let shown = b.script(
        "return document.querySelectorAll('[data-node]').length",
        json!([]),
    )?;
    let count = b.script(
        "return document.getElementById('shown').textContent",
        json!([]),
    )?;
    eprintln!("cold: {cold:.0} ms; rows in the DOM {shown}; {count}");
    if !count
        .as_str()
        .is_some_and(|c| c.starts_with(&format!("{n} of {n}")))
    {
        bail!("the page does not show all {n} nodes: {count}");
    }
    let mut warm = Vec::new();
    for _ in 0..o.reloads {
        b.goto(&url)?;
        warm.push(ready_ms(&b)?);
    }
    rows.push(format!(
        "| UI: fleet page first render, {n} nodes (navigation → every row read and drawn) | cold {cold:.0} ms; reloads median {:.0} ms (of {}) | {cmd} |",
        median(warm.clone()),
        warm.len()
    ));
    rows.push(format!(
        "| UI: bytes on first load, {n} nodes | page files {} (gzip) + node listing {} ({} uncompressed) = {} | {cmd} |",
        kib(files),
        kib(data),
        kib(raw),
        kib(files + data)
    ));

    // A state change, seen in its row: rows 1.. of the list by name are in view.
    let mut lat = Vec::new();
    for uuid in uuids.iter().skip(1).take(o.changes) {
        b.script(
            "const uuid = arguments[0];
             window.__t0 = performance.now(); window.__t1 = null; window.__status = null;
             const check = () => {
               const r = document.querySelector(`[data-node=\"${uuid}\"] [data-field=provision_state]`);
               if (r && r.dataset.state === 'manageable') window.__t1 = performance.now();
               else requestAnimationFrame(check);
             };
             requestAnimationFrame(check);
             fetch(`/v1/nodes/${uuid}/states/provision`, { method: 'PUT',
               headers: { 'content-type': 'application/json', 'X-OpenStack-Ironic-API-Version': 'latest' },
               body: JSON.stringify({ target: 'manage' }) }).then((r) => { window.__status = r.status; });
             return true;",
            json!([uuid]),
        )?;
        b.wait_until(
            "the row shows manageable",
            "return window.__t1 !== null",
            json!([]),
            T,
        )?;
        let v = b.script(
            "return [window.__t1 - window.__t0, window.__status]",
            json!([]),
        )?;
        if v[1] != 202 {
            bail!("manage answered {}", v[1]);
        }
        lat.push(v[0].as_f64().unwrap_or(f64::MAX));
    }
    let max = lat.iter().copied().fold(0.0, f64::max);
    rows.push(format!(
        "| UI: a state change visible in its row, {n} nodes (verb sent → row redrawn) | median {:.0} ms, max {max:.0} ms (of {}) | {cmd} |",
        median(lat.clone()),
        lat.len()
    ));

    // Scrolling: one step per frame, the frame intervals measured in the page.
    b.script(
        "const vp = document.getElementById('rows'); const px = arguments[0]; const frames = arguments[1];
         window.__frames = []; window.__scrolled = false; let last = null;
         const step = (t) => {
           if (last !== null) window.__frames.push(t - last);
           last = t;
           if (window.__frames.length >= frames) { window.__scrolled = true; return; }
           vp.scrollTop += px;
           requestAnimationFrame(step);
         };
         requestAnimationFrame(step);
         return true;",
        json!([o.scroll_px, o.scroll_frames]),
    )?;
    b.wait_until("the scroll", "return window.__scrolled", json!([]), T)?;
    // Fast frames count only if the rows in view were drawn.
    b.wait_until(
        "rows in view after the scroll",
        "const vp = document.getElementById('rows');
         const rows = [...vp.querySelectorAll('[data-node]')];
         return vp.scrollTop > 0 && rows.some((r) => r.offsetTop >= vp.scrollTop && r.offsetTop < vp.scrollTop + vp.clientHeight)
           && rows.some((r) => r.offsetTop <= vp.scrollTop + vp.clientHeight - 32 && r.offsetTop + 32 > vp.scrollTop + vp.clientHeight - 32);",
        json!([]),
        T,
    )?;
    let frames: Vec<f64> = b
        .script("return window.__frames", json!([]))?
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default();
    let mut sorted = frames.clone();
    sorted.sort_by(f64::total_cmp);
    let p = |q: f64| sorted[((sorted.len() - 1) as f64 * q) as usize];
    let frame = p(0.5);
    let dropped = frames.iter().filter(|f| **f > frame * 1.5).count();
    rows.push(format!(
        "| UI: scrolling the fleet list, {n} nodes ({} px a frame, {} frames) | frame interval p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; {dropped} frames over 1.5× p50 | {cmd} |",
        o.scroll_px,
        frames.len(),
        frame,
        p(0.99),
        sorted.last().copied().unwrap_or(0.0)
    ));
    drop(b);

    // rivetd's memory with many open pages' event streams, while nodes change: the same
    // changes are made once before (maintenance on) and once with the streams (off), so
    // what the changes themselves cost is in both figures.
    let admin = crate::rivetd::Admin::new(&d.url)?;
    let change_all = |on: bool| {
        rt.block_on(async {
            for uuid in uuids.iter().skip(100).take(100) {
                let path = format!("/v1/nodes/{uuid}/maintenance");
                if on {
                    admin
                        .call(
                            reqwest::Method::PUT,
                            &path,
                            Some(json!({"reason": "bench"})),
                        )
                        .await?;
                } else {
                    admin.call(reqwest::Method::DELETE, &path, None).await?;
                }
            }
            anyhow::Ok(())
        })
    };
    change_all(true)?;
    std::thread::sleep(Duration::from_secs(2));
    let rss_before = d.rss_kib();
    let addr = d.url.trim_start_matches("http://").to_string();
    let streams = (0..o.sessions)
        .map(|_| open_stream(&addr))
        .collect::<Result<Vec<_>>>()?;
    change_all(false)?;
    std::thread::sleep(Duration::from_secs(2));
    let rss_open = d.rss_kib();
    // Every stream got the changes (read what is buffered for it).
    let mut delivered = 0;
    for mut s in streams {
        s.set_read_timeout(Some(Duration::from_millis(200)))?;
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0;
        while let Ok(k) = s.read(&mut buf[got..]) {
            if k == 0 || got + k >= buf.len() {
                break;
            }
            got += k;
        }
        if String::from_utf8_lossy(&buf[..got])
            .matches("event: node")
            .count()
            >= 100
        {
            delivered += 1;
        }
    }
    rows.push(format!(
        "| UI: rivetd RSS with {} open event streams (100 node changes pushed to each), {n} nodes | {} idle → {} before → {} with the streams: +{} ({:.0} KiB a stream); {delivered} streams got every change | {cmd} |",
        o.sessions,
        mib(rss_idle),
        mib(rss_before),
        mib(rss_open),
        mib(rss_open.saturating_sub(rss_before)),
        rss_open.saturating_sub(rss_before) as f64 / o.sessions.max(1) as f64
    ));
    if o.keep {
        eprintln!("kept {}", dir.keep().display());
    }
    Ok(rows)
}
