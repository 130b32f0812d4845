//! `rivet-bench console`: what a serial console costs rivetd — resident memory per enabled
//! console with N consoles streaming, and the keystroke round trip through the WebSocket.
//!
//! The BMCs are a stand-in `ipmitool`: this same binary, reached through a symlink named
//! `ipmitool` (`[drivers] ipmitool`), so each of the N SOL children is a small native
//! process (no interpreter per console). Its `sol activate` prints the SOL banner, then a
//! boot-log-like line every `stream-MS` milliseconds (the node's `ipmi_address` names the
//! period), and echoes stdin back at once — the keystroke round trip is the WebSocket →
//! rivetd → child stdin → child stdout → rivetd → WebSocket path and nothing else.
//!
//! RSS is sampled after every step (0, then each step's count of consoles enabled and
//! streaming for `--settle-s`); per console is (RSS at N − RSS at 0) / N. Each step also
//! checks the consoles really stream: the capture of every enabled console must hold a
//! streamed line, and the row says how many do.

use crate::procstat::vm_kib;
use crate::rivetd::{for_each_concurrent, locate, Admin, Rivetd, Settings};
use crate::stats::{mib, ms, percentile};
use anyhow::{bail, Context, Result};
use serde_json::json;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Options of `rivet-bench console`.
#[derive(Debug, Clone)]
pub struct ConsoleOpts {
    /// Console counts measured in turn (ascending; the last is the headline).
    pub steps: Vec<usize>,
    /// Each stand-in prints a line this often.
    pub line_every_ms: u64,
    /// Seconds every step streams before RSS is sampled.
    pub settle_s: u64,
    /// Keystrokes timed through the WebSocket.
    pub keystrokes: usize,
    /// rivetd binary.
    pub rivetd: Option<PathBuf>,
    /// Keep the temporary directory.
    pub keep: bool,
}

/// The name the stand-in is reached by; `main` runs [`stand_in`] when argv\[0\] ends in it.
pub const STAND_IN_NAME: &str = "ipmitool";

/// The stand-in BMC: `ipmitool … -H stream-MS … -E sol activate|deactivate`. Returns the
/// process exit code.
pub fn stand_in(args: &[String]) -> i32 {
    let sub = args.iter().rev().take(2).rev().cloned().collect::<Vec<_>>();
    let addr = args
        .iter()
        .position(|a| a == "-H")
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_default();
    match sub.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["sol", "deactivate"] => 0,
        ["sol", "activate"] => {
            let every = addr
                .strip_prefix("stream-")
                .and_then(|m| m.parse().ok())
                .unwrap_or(1000u64);
            activate(&addr, Duration::from_millis(every.max(1)))
        }
        _ => {
            eprintln!("Error: the bench's stand-in BMC does only sol activate/deactivate");
            1
        }
    }
}

/// One SOL session: banner, a line every `every`, stdin echoed; ends when either pipe does
/// (rivetd closing stdin ends a real ipmitool session too).
fn activate(addr: &str, every: Duration) -> i32 {
    let out = std::sync::Arc::new(std::sync::Mutex::new(std::io::stdout()));
    let say = |b: &[u8]| -> bool {
        match out.lock() {
            Ok(mut o) => o.write_all(b).and_then(|()| o.flush()).is_ok(),
            Err(_) => false,
        }
    };
    if !say(b"[SOL Session operational.  Use ~? for help]\r\n") {
        return 1;
    }
    let echo_out = out.clone();
    // A small stack: a thousand of these run at once.
    let spawned = std::thread::Builder::new()
        .stack_size(64 * 1024)
        .spawn(move || {
            let mut buf = [0u8; 4096];
            let mut stdin = std::io::stdin();
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) | Err(_) => std::process::exit(0),
                    Ok(n) => {
                        let ok = match echo_out.lock() {
                            Ok(mut o) => o.write_all(&buf[..n]).and_then(|()| o.flush()).is_ok(),
                            Err(_) => false,
                        };
                        if !ok {
                            std::process::exit(0);
                        }
                    }
                }
            }
        });
    if spawned.is_err() {
        return 1;
    }
    let mut i: u64 = 0;
    loop {
        let line = format!(
            "[{:>10.6}] boot line {i} of {addr}: systemd[1]: Reached target multi-user.target\r\n",
            i as f64 * every.as_secs_f64()
        );
        if !say(line.as_bytes()) {
            return 0;
        }
        i += 1;
        std::thread::sleep(every);
    }
}

/// A process's thread count and open descriptors.
fn threads_and_fds(pid: u32) -> (u64, usize) {
    let threads = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0);
    (threads, fds)
}

/// Median of five RSS samples a second apart (KiB).
async fn rss_kib(pid: u32) -> u64 {
    let mut v = Vec::new();
    for _ in 0..5 {
        v.push(vm_kib(pid, "VmRSS").unwrap_or(0));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    v.sort_unstable();
    v[v.len() / 2]
}

/// `getrlimit` of `res`, the soft limit.
fn soft_limit(res: libc::__rlimit_resource_t) -> u64 {
    // SAFETY: getrlimit writes into the zeroed struct we own.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(res, &mut r) != 0 {
            return 0;
        }
        r.rlim_cur
    }
}

/// How many of `uuids` have a capture holding a streamed line.
fn captured(dir: &Path, uuids: &[String]) -> usize {
    uuids
        .iter()
        .filter(|u| {
            std::fs::read(dir.join(format!("{u}.log")))
                .map(|b| b.windows(11).any(|w| w == b"boot line 1"))
                .unwrap_or(false)
        })
        .count()
}

/// Wait until every one of `uuids` reports its console enabled.
async fn wait_enabled(admin: &Admin, uuids: &[String], limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    for u in uuids {
        loop {
            let v = admin
                .call(
                    reqwest::Method::GET,
                    &format!("/v1/nodes/{u}/states/console"),
                    None,
                )
                .await?;
            if v["console_enabled"] == true {
                break;
            }
            if Instant::now() > deadline {
                bail!("console of {u} not enabled after {limit:?}: {v}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

/// `rivet-bench console`.
pub async fn run(o: ConsoleOpts) -> Result<Vec<String>> {
    let exe = locate(o.rivetd.as_deref())?;
    let n = o.steps.iter().copied().max().unwrap_or(0);
    if n == 0 {
        bail!("--steps needs a count above 0");
    }
    // Per console rivetd holds a listener, three pipes and the capture file; each stand-in
    // is a process with two threads.
    let nofile = soft_limit(libc::RLIMIT_NOFILE);
    let nproc = soft_limit(libc::RLIMIT_NPROC);
    if nofile < (n as u64) * 8 + 1024 {
        bail!(
            "open-file limit {nofile} is too low for {n} consoles (need about {}): raise ulimit -n",
            n * 8 + 1024
        );
    }
    if nproc < (n as u64) * 3 + 1024 {
        bail!("process limit {nproc} is too low for {n} consoles: raise ulimit -u");
    }
    let me = std::env::current_exe().context("locating rivet-bench")?;
    let tmp = tempfile::Builder::new()
        .prefix("rivet-bench-console")
        .tempdir()?;
    let dir = tmp.path().to_path_buf();
    let ipmitool = dir.join(STAND_IN_NAME);
    std::os::unix::fs::symlink(&me, &ipmitool)?;
    // Enough ports for every console; ones in use are skipped by rivetd.
    let first_port = 30000u32;
    let last_port = (first_port + n as u32 + 2000).min(65000);
    let settings = Settings {
        power_sync_interval_s: 0,
        tables: format!(
            "\n[drivers]\nipmitool = {:?}\nipmi_timeout_s = 10\n\n[console]\nport_range = \"{first_port}:{last_port}\"\nsubprocess_timeout = 10\n",
            ipmitool.display().to_string()
        ),
        ..Settings::default()
    };
    let db = dir.join("rivet.db");
    let mut d = Rivetd::start(&exe, &dir, &db, &settings).await?;
    let pid = d.pid();
    let admin = Admin::new(&d.url)?;
    let every = o.line_every_ms.max(1);
    let a = admin.clone();
    let uuids = for_each_concurrent(n, 16, move |i| {
        let a = a.clone();
        async move {
            let v = a
                .call(
                    reqwest::Method::POST,
                    "/v1/nodes",
                    Some(json!({
                        "driver": "ipmi", "name": format!("con-{i}"),
                        "console_interface": "ipmitool-socat",
                        "driver_info": {"ipmi_address": format!("stream-{every}"),
                                        "ipmi_username": "bench", "ipmi_password": "bench-pw"},
                    })),
                )
                .await?;
            v["uuid"]
                .as_str()
                .map(str::to_string)
                .context("node create answered without a uuid")
        }
    })
    .await?;
    let capture_dir = dir.join("console");
    let cmd = format!(
        "`rivet-bench console --steps {} --line-every-ms {every} --settle-s {} --keystrokes {}`",
        o.steps
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(","),
        o.settle_s,
        o.keystrokes
    );

    tokio::time::sleep(Duration::from_secs(3)).await;
    let base = rss_kib(pid).await;
    let (t0, f0) = threads_and_fds(pid);
    let mut rows = vec![format!(
        "| console: rivetd RSS, {n} nodes, 0 consoles (baseline) | {}; {t0} threads, {f0} fds | {cmd} |",
        mib(base)
    )];
    eprintln!("baseline: {} ({t0} threads, {f0} fds)", mib(base));
    let mut enabled = 0;
    for &step in &o.steps {
        let step = step.min(n);
        if step <= enabled {
            continue;
        }
        let started = Instant::now();
        let batch: Vec<String> = uuids[enabled..step].to_vec();
        let a = admin.clone();
        let b = batch.clone();
        for_each_concurrent(b.len(), 16, move |i| {
            let a = a.clone();
            let u = b[i].clone();
            async move {
                a.call(
                    reqwest::Method::PUT,
                    &format!("/v1/nodes/{u}/states/console"),
                    Some(json!({"enabled": true})),
                )
                .await
                .map(|_| ())
            }
        })
        .await?;
        wait_enabled(&admin, &batch, Duration::from_secs(300)).await?;
        let took = started.elapsed();
        enabled = step;
        tokio::time::sleep(Duration::from_secs(o.settle_s)).await;
        let rss = rss_kib(pid).await;
        let (t, f) = threads_and_fds(pid);
        let streaming = captured(&capture_dir, &uuids[..enabled]);
        let per = (rss.saturating_sub(base) as f64) / enabled as f64;
        eprintln!(
            "{enabled} consoles: {} ({per:.0} KiB each), {t} threads, {f} fds, {streaming} captured, enabled in {took:.1?}",
            mib(rss)
        );
        rows.push(format!(
            "| console: rivetd RSS with {enabled} consoles streaming (a line every {every} ms each) | {}: **{per:.0} KiB per console** over the baseline; {t} threads, {f} fds; {streaming} of {enabled} captures streaming after {} s; all enabled in {:.1} s | {cmd} |",
            mib(rss),
            o.settle_s,
            took.as_secs_f64()
        ));
    }

    // The keystroke round trip on the first console, the others streaming meanwhile.
    let url = d.url.clone();
    let node = uuids[0].clone();
    let count = o.keystrokes.max(1);
    let rtts = tokio::task::spawn_blocking(move || round_trips(&url, &node, count))
        .await
        .context("round-trip thread")??;
    rows.push(format!(
        "| console: keystroke round trip through the WebSocket ({enabled} consoles streaming) | p50 {}, p99 {}, max {} ({} keystrokes, one at a time) | {cmd} |",
        ms(percentile(&rtts, 50.0)),
        ms(percentile(&rtts, 99.0)),
        ms(rtts[rtts.len() - 1]),
        rtts.len()
    ));
    d.stop();
    if o.keep {
        let kept = tmp.keep();
        eprintln!("kept {}", kept.display());
    }
    Ok(rows)
}

/// Type `count` keystrokes one at a time on `node`'s console and time each until its echo
/// comes back as output (sorted).
fn round_trips(url: &str, node: &str, count: usize) -> Result<Vec<Duration>> {
    use tungstenite::client::IntoClientRequest;
    use tungstenite::Message;
    let addr = url.trim_start_matches("http://");
    let req = format!("ws://{addr}/v1/nodes/{node}/console/ws").into_client_request()?;
    let tcp = std::net::TcpStream::connect(addr)?;
    tcp.set_nodelay(true)?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let (mut ws, _) = tungstenite::client::client(req, tcp)
        .map_err(|e| anyhow::anyhow!("WebSocket handshake: {e}"))?;
    // The viewer is subscribed once hello has come.
    loop {
        match ws.read()? {
            Message::Text(t) if t.as_str().contains("\"hello\"") => break,
            Message::Close(_) => bail!("console WebSocket closed before hello"),
            _ => {}
        }
    }
    let mut out = Vec::with_capacity(count);
    let mut seen: Vec<u8> = Vec::new();
    for i in 0..count {
        let marker = format!("<k{i:06}>");
        seen.clear();
        let t = Instant::now();
        ws.send(Message::Binary(marker.clone().into_bytes().into()))?;
        loop {
            if t.elapsed() > Duration::from_secs(10) {
                bail!("keystroke {i} not echoed within 10 s");
            }
            match ws.read()? {
                Message::Binary(b) => {
                    seen.extend_from_slice(&b);
                    if seen.windows(marker.len()).any(|w| w == marker.as_bytes()) {
                        break;
                    }
                }
                Message::Text(t) if t.as_str().contains("\"refused\"") => {
                    bail!("keystroke refused: {t}")
                }
                Message::Close(_) => bail!("console WebSocket closed"),
                _ => {}
            }
        }
        out.push(t.elapsed());
    }
    out.sort_unstable();
    Ok(out)
}
