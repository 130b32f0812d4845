//! `rivet-bench fleet` and `rivet-bench clean-fleet`: simulated agent fleets against one
//! rivetd on SQLite, or against one or several rivetd sharing a scratch PostgreSQL database
//! (`--postgres BASE_URL --controllers N`: distinct conductor ids, one secrets key, the same
//! config; each agent talks to one controller, round-robin; the admin calls go to the first).
//!
//! Both enroll N fake-hardware nodes through the admin API (`POST /v1/nodes`, `manage`), then
//! `provide` them (automated cleaning). The fake driver's "boot" of the cleaning ramdisk is
//! the bench starting a simulated agent as soon as the node is in `clean wait`.
//!
//! - **clean-fleet**: the agents offer two no-op steps (priorities 50 and 40); wall time from
//!   the first `provide` to every node `available`.
//! - **fleet**: the agents offer one `erase_devices` step that never ends, so every node rests
//!   in `clean wait` with its agent reporting the step as running, with progress — the steady
//!   state of a fleet erasing disks. Then, for each offered rate, every agent heartbeats
//!   (`wait: false`) at a fixed interval of N / rate seconds from a random offset, and the
//!   bench records client-side latency, rivetd's CPU (utime+stime from /proc) and peak RSS,
//!   and its own CPU (the generator shares the machine). On PostgreSQL it also records the
//!   CPU of the server's processes for the bench database, and which controller owns (ring)
//!   and holds (lease) each node.

use crate::procstat::{CpuMeter, MachineMeter, PostgresMeter};
use crate::rivetd::{for_each_concurrent, Admin, Rivetd, Settings};
use crate::sim::{Beat, Link, Profile, SimAgent};
use crate::stats::{mib, ms, percentile, Recorder};
use anyhow::{bail, Context, Result};
use rand::Rng;
use rivet_store::postgres::ScratchDatabase;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Options shared by both fleet benches.
#[derive(Debug, Clone)]
pub struct FleetOpts {
    /// Nodes (= simulated agents).
    pub nodes: usize,
    /// Admin API requests in flight during set-up (create, manage, provide).
    pub concurrency: usize,
    /// rivetd binary (default: next to this one).
    pub rivetd: Option<PathBuf>,
    /// rivetd settings.
    pub settings: Settings,
    /// Keep the temporary directory (rivetd's log and database).
    pub keep: bool,
    /// Upper bound of the whole set-up.
    pub setup_limit: Duration,
    /// `Some(base URL)`: a scratch database on this PostgreSQL server (dropped at the end)
    /// instead of a SQLite file.
    pub postgres: Option<String>,
    /// rivetd processes sharing the database (more than one needs `postgres`).
    pub controllers: usize,
}

impl FleetOpts {
    /// "SQLite" or "PostgreSQL", for the rows.
    fn backend(&self) -> &'static str {
        if self.postgres.is_some() {
            "PostgreSQL"
        } else {
            "SQLite"
        }
    }

    /// The flags that select the backend and controllers, for the rows' command column.
    fn flags(&self) -> String {
        match &self.postgres {
            Some(_) => format!(" --postgres URL --controllers {}", self.controllers),
            None => String::new(),
        }
    }
}

/// What drives the agents' heartbeats once their long step runs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// `wait: false` every `period`.
    Every(Duration),
    /// `wait: true`, again as soon as the answer comes (the production agent's loop).
    LongPoll,
    /// Stop.
    Stop,
}

/// A started fleet: the rivetd processes, their temporary directory and database, and the
/// agent tasks.
struct Fleet {
    rivetds: Vec<Rivetd>,
    dir: Option<tempfile::TempDir>,
    /// Dropped (DROP DATABASE … WITH (FORCE)) after the controllers are stopped.
    scratch: Option<ScratchDatabase>,
    /// Admin client of the first controller.
    admin: Admin,
    uuids: Vec<String>,
    tasks: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    keep: bool,
}

impl Fleet {
    /// One agent link per controller; agent `i` talks to `links[i % len]`.
    fn links(&self, long_poll_s: u64) -> Result<Vec<Link>> {
        self.rivetds
            .iter()
            .map(|d| Link::new(&d.url, long_poll_s))
            .collect()
    }

    /// A CPU meter per controller.
    fn cpu_meters(&self) -> Vec<CpuMeter> {
        self.rivetds
            .iter()
            .map(|d| CpuMeter::start(Some(d.pid())))
            .collect()
    }

    /// The PostgreSQL meter of the bench database (none on SQLite).
    fn pg_meter(&self) -> Option<PostgresMeter> {
        self.scratch
            .as_ref()
            .map(|s| PostgresMeter::start(s.name()))
    }

    /// Where the controllers' logs are.
    fn logs(&self) -> String {
        self.rivetds
            .iter()
            .map(|d| d.log.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// ", 3 rivetd on PostgreSQL" for the rows' first column (nothing for the SQLite default).
fn where_text(o: &FleetOpts) -> String {
    match o.postgres {
        Some(_) => format!(", {} rivetd on {}", o.controllers.max(1), o.backend()),
        None => String::new(),
    }
}

/// "; PostgreSQL 0.52 cores" when measured.
fn pg_text(cores: Option<f64>) -> String {
    cores
        .map(|c| format!("; PostgreSQL {c:.2} cores"))
        .unwrap_or_default()
}

/// Nodes in `clean wait` whose cleaning never got to a step (name and reservation), at
/// most 20, for the message about stuck agents.
async fn stuck_nodes(admin: &Admin) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut marker = String::new();
    for _ in 0..1000 {
        let mut path = "/v1/nodes?provision_state=clean%20wait&fields=uuid,name,clean_step,reservation&limit=1000".to_string();
        if !marker.is_empty() {
            path.push_str(&format!("&marker={marker}"));
        }
        let v = admin.call(reqwest::Method::GET, &path, None).await?;
        let page = v["nodes"].as_array().cloned().unwrap_or_default();
        out.extend(
            page.iter()
                .filter(|n| n["clean_step"].as_object().is_none_or(|o| o.is_empty()))
                .map(|n| {
                    format!(
                        "{} (lease {})",
                        n["name"].as_str().unwrap_or_default(),
                        n["reservation"].as_str().unwrap_or("none")
                    )
                }),
        );
        match page.last().and_then(|p| p["uuid"].as_str()) {
            Some(u) if page.len() == 1000 && out.len() < 20 => marker = u.to_string(),
            _ => break,
        }
    }
    out.truncate(20);
    Ok(out)
}

/// "; nodes per controller (ring owner / lease holder): bench-1 3341/3341, …" from every
/// node's (`conductor`, `reservation`).
fn spread_text(owners: &[(String, String)]) -> String {
    let mut by: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (owner, holder) in owners {
        by.entry(owner.as_str()).or_default().0 += 1;
        if !holder.is_empty() {
            by.entry(holder.as_str()).or_default().1 += 1;
        }
    }
    let parts: Vec<String> = by
        .iter()
        .map(|(id, (own, held))| format!("{id} {own}/{held}"))
        .collect();
    format!(
        "; nodes per controller (ring owner / lease holder): {}",
        parts.join(", ")
    )
}

/// Controllers' cores as a row fragment: "0.85 cores" for one, "1.20 cores (0.41 + 0.40 +
/// 0.39)" for several.
fn cores_text(each: &[f64]) -> String {
    let sum: f64 = each.iter().sum();
    if each.len() == 1 {
        format!("{sum:.2} cores")
    } else {
        let parts: Vec<String> = each.iter().map(|c| format!("{c:.2}")).collect();
        format!("{sum:.2} cores ({})", parts.join(" + "))
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if let Ok(t) = self.tasks.lock() {
            for h in t.iter() {
                h.abort();
            }
        }
        for d in &mut self.rivetds {
            d.stop();
        }
        if let Some(d) = self.dir.take().filter(|_| self.keep) {
            eprintln!("kept {} (rivetd logs, rivet.db)", d.keep().display());
        }
    }
}

/// Start the controllers on their database and wait until each sees all of them alive.
async fn start_controllers(
    o: &FleetOpts,
    dir: &std::path::Path,
) -> Result<(Vec<Rivetd>, Option<ScratchDatabase>)> {
    let exe = crate::rivetd::locate(o.rivetd.as_deref())?;
    let Some(base) = &o.postgres else {
        if o.controllers > 1 {
            bail!("--controllers {} needs --postgres: several rivetd share only a PostgreSQL database", o.controllers);
        }
        let db = dir.join("rivet.db");
        return Ok((
            vec![Rivetd::start(&exe, dir, &db, &o.settings).await?],
            None,
        ));
    };
    let scratch = ScratchDatabase::create(base, "rivet_bench")
        .with_context(|| format!("creating a scratch database on {}", redact(base)))?;
    // Controllers sharing a database share its secrets key.
    let key = dir.join("secrets.key");
    let made = std::process::Command::new(&exe)
        .args(["secrets", "init-key"])
        .arg(&key)
        .output()
        .with_context(|| format!("running {} secrets init-key", exe.display()))?;
    if !made.status.success() {
        bail!(
            "rivetd secrets init-key: {}",
            String::from_utf8_lossy(&made.stderr)
        );
    }
    let settings = Settings {
        secrets_key_file: Some(key),
        ..o.settings.clone()
    };
    let n = o.controllers.max(1);
    let ids: Vec<String> = (1..=n).map(|i| format!("bench-{i}")).collect();
    let mut rivetds = Vec::new();
    for id in &ids {
        rivetds.push(Rivetd::start_on(&exe, dir, scratch.url(), Some(id), &settings).await?);
    }
    // Load only once the ring holds every controller, as each of them sees it.
    let deadline = Instant::now() + Duration::from_secs(60);
    for d in &rivetds {
        let admin = Admin::new(&d.url)?;
        loop {
            let seen = admin.conductors().await?;
            let alive = ids
                .iter()
                .filter(|id| seen.iter().any(|(h, a)| h == *id && *a))
                .count();
            if alive == n {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "{} sees {alive} of {n} controllers alive after 60 s: {seen:?}",
                    d.url
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // GET /v1/conductors reads the table; each controller rebuilds its ring at its next
    // membership tick ([conductor] heartbeat_interval_s, 2 s by default). Load only after
    // every ring holds all N, or two controllers may both drive a node meanwhile.
    tokio::time::sleep(Duration::from_secs(5)).await;
    eprintln!(
        "{n} rivetd on PostgreSQL database {}, all alive",
        scratch.name()
    );
    Ok((rivetds, Some(scratch)))
}

/// A database URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let user = &url[s + 3..at];
            let user = user.split(':').next().unwrap_or_default();
            format!("{}{user}:…{}", &url[..s + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

/// Start the controllers and enroll `nodes` fake-hardware nodes to `manageable`.
async fn enroll(o: &FleetOpts) -> Result<Fleet> {
    let dir = tempfile::Builder::new().prefix("rivet-bench-").tempdir()?;
    let (rivetds, scratch) = start_controllers(o, dir.path()).await?;
    let admin = Admin::new(&rivetds[0].url)?;
    let t = Instant::now();
    let a = admin.clone();
    let limit = o.setup_limit;
    let uuids = for_each_concurrent(o.nodes, o.concurrency, move |i| {
        let a = a.clone();
        async move {
            let u = a.create_node(&format!("sim-{i:06}")).await?;
            a.provision(&u, "manage").await?;
            a.wait_state(&u, "manageable", Duration::from_millis(20), limit)
                .await?;
            Ok(u)
        }
    })
    .await?;
    eprintln!(
        "enrolled {} nodes to manageable in {:.1} s ({:.0} nodes/s; create + manage + poll, {} in flight)",
        uuids.len(),
        t.elapsed().as_secs_f64(),
        uuids.len() as f64 / t.elapsed().as_secs_f64(),
        o.concurrency
    );
    Ok(Fleet {
        rivetds,
        dir: Some(dir),
        scratch,
        admin,
        uuids,
        tasks: Arc::new(Mutex::new(Vec::new())),
        keep: false,
    })
}

/// `provide` every node; as each reaches `clean wait`, boot a simulated agent on it
/// (`agent(index, uuid)` runs as its own task). Returns when every node has been provided
/// and its agent started.
async fn provide_and_boot<F, Fut>(
    f: &Fleet,
    o: &FleetOpts,
    provided: Arc<AtomicUsize>,
    agent: F,
) -> Result<()>
where
    F: Fn(usize, String) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let agent = Arc::new(agent);
    let a = f.admin.clone();
    let uuids = f.uuids.clone();
    let tasks = f.tasks.clone();
    let limit = o.setup_limit;
    for_each_concurrent(uuids.len(), o.concurrency, move |i| {
        let (a, u, agent, tasks, provided) = (
            a.clone(),
            uuids[i].clone(),
            agent.clone(),
            tasks.clone(),
            provided.clone(),
        );
        async move {
            a.provision(&u, "provide").await?;
            a.wait_state(&u, "clean wait", Duration::from_millis(10), limit)
                .await?;
            provided.fetch_add(1, Ordering::SeqCst);
            let h = tokio::spawn(agent(i, u));
            if let Ok(mut t) = tasks.lock() {
                t.push(h.abort_handle());
            }
            Ok(())
        }
    })
    .await
    .map(|_| ())
}

/// `rivet-bench clean-fleet`: automated cleaning of N nodes with no-op steps.
pub async fn clean_fleet(o: FleetOpts) -> Result<Vec<String>> {
    let mut f = enroll(&o).await?;
    f.keep = o.keep;
    let links = f.links(o.settings.long_poll_s)?;
    let profile = Arc::new(Profile::noop());
    let failures = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + o.setup_limit;
    let cpus = f.cpu_meters();
    let pg = f.pg_meter();
    let me = CpuMeter::start(None);
    let all = MachineMeter::start();
    let t0 = Instant::now();
    let (p, fl) = (profile.clone(), failures.clone());
    let boot = provide_and_boot(&f, &o, Arc::default(), move |i, u| {
        let (l, p, fl) = (links[i % links.len()].clone(), p.clone(), fl.clone());
        async move {
            let mut a = SimAgent::new(u, i);
            if let Err(e) = a.converse(&l, &p, deadline).await {
                eprintln!("{e:#}");
                fl.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    // Count `available` while provides are still going out.
    let n = o.nodes;
    let admin = f.admin.clone();
    let watch_done = async move {
        loop {
            let c = admin.count_in_state("available").await?;
            if c >= n {
                return Ok::<Instant, anyhow::Error>(Instant::now());
            }
            if Instant::now() > deadline {
                bail!("only {c} of {n} nodes available after {:?}", o.setup_limit);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let (booted, done) = tokio::join!(boot, watch_done);
    booted?;
    let done = done?;
    let wall = done - t0;
    let each: Vec<f64> = cpus.iter().map(CpuMeter::cores).collect();
    let cores: f64 = each.iter().sum();
    let pg_cores = pg.as_ref().map(PostgresMeter::cores);
    let gen = me.cores();
    let other = (all.cores() - cores - gen - pg_cores.unwrap_or(0.0)).max(0.0);
    let failed = failures.load(Ordering::SeqCst);
    let failed_nodes = f.admin.count_in_state("clean failed").await.unwrap_or(0);
    if failed + failed_nodes > 0 {
        bail!(
            "{failed} agents failed, {failed_nodes} nodes in clean failed; see {}",
            f.logs()
        );
    }
    let hwm = f.rivetds.iter().map(Rivetd::hwm_kib).max().unwrap_or(0);
    let row = format!(
        "| clean-fleet: automated cleaning of {n} nodes, 2 no-op steps each (priorities 50, 40){} | {:.1} s wall from first `provide` to all `available` ({:.0} nodes/s, {:.0} steps/s); rivetd {}, peak RSS {}{}; generator {:.2} cores, other processes {other:.2} | `rivet-bench clean-fleet --nodes {n}{}` |",
        where_text(&o),
        wall.as_secs_f64(),
        n as f64 / wall.as_secs_f64(),
        2.0 * n as f64 / wall.as_secs_f64(),
        cores_text(&each),
        mib(hwm),
        pg_text(pg_cores),
        gen,
        o.flags(),
    );
    Ok(vec![row])
}

/// Options of `rivet-bench fleet`.
#[derive(Debug, Clone)]
pub struct RateOpts {
    /// Offered heartbeat rates (per second, whole fleet), tried in order.
    pub rates: Vec<f64>,
    /// Recorded seconds per rate.
    pub seconds: u64,
    /// Unrecorded seconds at each rate before recording.
    pub warmup: u64,
    /// Also measure the production loop: every agent long-polling (`wait: true`).
    pub long_poll_phase: bool,
    /// Keep going after a rate that is not sustained.
    pub no_stop: bool,
    /// Agents report their running step's progress (growing bytes) in every heartbeat, as an
    /// erasing agent does; without it a heartbeat only reports that the step runs.
    pub progress: bool,
}

/// What every agent of the fleet bench shares.
#[derive(Clone)]
struct Shared {
    link: Link,
    profile: Arc<Profile>,
    phases: watch::Receiver<Phase>,
    rec: Arc<Recorder>,
    ready: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
    deadline: Instant,
}

/// One agent after boot: converse until the long step runs, then follow the phases.
async fn fleet_agent(mut a: SimAgent, s: Shared) {
    let Shared {
        link,
        profile,
        mut phases,
        rec,
        ready,
        failed,
        deadline,
    } = s;
    match a.converse(&link, &profile, deadline).await {
        Ok(true) => {
            ready.fetch_add(1, Ordering::SeqCst);
        }
        Ok(false) => {
            eprintln!("node {}: cleaning ended before the long step ran", a.node);
            failed.fetch_add(1, Ordering::SeqCst);
            return;
        }
        Err(e) => {
            eprintln!("{e:#}");
            failed.fetch_add(1, Ordering::SeqCst);
            return;
        }
    }
    loop {
        let phase = *phases.borrow_and_update();
        match phase {
            Phase::Stop => return,
            Phase::Every(period) => {
                let offset = rand::thread_rng().gen_range(0.0..period.as_secs_f64());
                let mut next = Instant::now() + Duration::from_secs_f64(offset);
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep_until(next.into()) => {}
                        r = phases.changed() => {
                            if r.is_err() { return; }
                            break;
                        }
                    }
                    match a.heartbeat(&link, &profile, false).await {
                        Ok((Beat::Ok, d)) => rec.ok(d),
                        Ok((beat, _)) => {
                            rec.err();
                            report_error(&a.node, &format!("{beat:?}"));
                        }
                        Err(e) => {
                            rec.err();
                            report_error(&a.node, &format!("{e:#}"));
                        }
                    }
                    // Never faster than the interval; behind schedule, send at once.
                    next = (next + period).max(Instant::now());
                }
            }
            Phase::LongPoll => loop {
                tokio::select! {
                    r = a.heartbeat(&link, &profile, true) => match r {
                        Ok((Beat::Ok, d)) => rec.ok(d),
                        other => {
                            rec.err();
                            let what = match other {
                                Ok((beat, _)) => format!("{beat:?}"),
                                Err(e) => format!("{e:#}"),
                            };
                            report_error(&a.node, &what);
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    },
                    r = phases.changed() => {
                        if r.is_err() { return; }
                        break;
                    }
                }
            },
        }
    }
}

/// `rivet-bench fleet`: sustained heartbeat load of N agents at each offered rate.
pub async fn fleet(o: FleetOpts, r: RateOpts) -> Result<Vec<String>> {
    let n = o.nodes;
    let mut f = enroll(&o).await?;
    f.keep = o.keep;
    let links = f.links(o.settings.long_poll_s)?;
    let profile = Arc::new(Profile::long_erase());
    let rec = Arc::new(Recorder::default());
    let ready = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    // While the fleet boots, agents whose step already runs heartbeat gently (≤ 500/s).
    let idle = Phase::Every(Duration::from_secs_f64((n as f64 / 500.0).max(1.0)));
    let (tx, rx) = watch::channel(idle);
    let deadline = Instant::now() + o.setup_limit;
    let t = Instant::now();
    let progress = r.progress;
    let shared = Shared {
        link: links[0].clone(),
        profile,
        phases: rx,
        rec: rec.clone(),
        ready: ready.clone(),
        failed: failed.clone(),
        deadline,
    };
    let provided = Arc::new(AtomicUsize::new(0));
    let ticker = {
        let (provided, ready) = (provided.clone(), ready.clone());
        let pids: Vec<u32> = f.rivetds.iter().map(Rivetd::pid).collect();
        tokio::spawn(async move {
            let t = Instant::now();
            let meters =
                || -> Vec<CpuMeter> { pids.iter().map(|p| CpuMeter::start(Some(*p))).collect() };
            let mut cpus = meters();
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                let rss: u64 = pids
                    .iter()
                    .map(|p| crate::procstat::vm_kib(*p, "VmRSS").unwrap_or(0))
                    .sum();
                eprintln!(
                    "  {:>4.0} s: {} provided, {} agents running their step; rivetd {}, RSS {}",
                    t.elapsed().as_secs_f64(),
                    provided.load(Ordering::SeqCst),
                    ready.load(Ordering::SeqCst),
                    cores_text(&cpus.iter().map(CpuMeter::cores).collect::<Vec<_>>()),
                    mib(rss)
                );
                cpus = meters();
            }
        })
    };
    let booted = provide_and_boot(&f, &o, provided, move |i, u| {
        let mut a = SimAgent::new(u, i);
        a.report_progress = progress;
        let s = Shared {
            link: links[i % links.len()].clone(),
            ..shared.clone()
        };
        fleet_agent(a, s)
    })
    .await;
    if booted.is_err() {
        ticker.abort();
    }
    booted?;
    // Every node is provided and its agent booted. An agent that makes no progress for
    // STALL after the last one did is stuck (its node waits for something that will not
    // come): the fleet is measured without it and the rows say how many there were.
    const STALL: Duration = Duration::from_secs(60);
    let (mut last, mut since) = (ready.load(Ordering::SeqCst), Instant::now());
    while ready.load(Ordering::SeqCst) + failed.load(Ordering::SeqCst) < n {
        let now_ready = ready.load(Ordering::SeqCst);
        if now_ready != last {
            (last, since) = (now_ready, Instant::now());
        }
        if since.elapsed() > STALL && now_ready > 0 {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "only {} of {n} agents reached their long step within {:?}",
                ready.load(Ordering::SeqCst),
                o.setup_limit
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ticker.abort();
    let stuck = n - ready.load(Ordering::SeqCst) - failed.load(Ordering::SeqCst);
    let stuck_text = if stuck > 0 {
        let nodes = stuck_nodes(&f.admin).await.unwrap_or_default();
        eprintln!(
            "{stuck} agents never got their long step ({STALL:?} without progress); measured without them. Nodes in clean wait without a clean step: {nodes:?}"
        );
        format!("; {stuck} of {n} nodes stuck in clean wait during set-up, not in the load")
    } else {
        String::new()
    };
    if failed.load(Ordering::SeqCst) > 0 {
        bail!(
            "{} agents failed during set-up; see {}",
            failed.load(Ordering::SeqCst),
            f.logs()
        );
    }
    eprintln!(
        "fleet of {n}: provide → every agent running its step in {:.1} s; rivetd RSS {}",
        t.elapsed().as_secs_f64(),
        f.rivetds
            .iter()
            .map(|d| mib(d.rss_kib()))
            .collect::<Vec<_>>()
            .join(" + ")
    );
    let spread = if f.rivetds.len() > 1 {
        spread_text(&f.admin.owners().await?)
    } else {
        String::new()
    };
    if !spread.is_empty() {
        eprintln!("{}", spread.trim_start_matches("; "));
    }

    let mut rows = Vec::new();
    let mut best: Option<(f64, f64)> = None;
    for &offered in &r.rates {
        let phase = Phase::Every(Duration::from_secs_f64(n as f64 / offered));
        let m = measure(&f, &tx, &rec, phase, r.warmup, r.seconds).await?;
        let row = format!(
            "| fleet: {n} agents heartbeating (`wait: false`{}), offered {offered:.0} hb/s{} | {:.0} hb/s sustained, latency p50 {}, p99 {}, max {}, {} errors; rivetd {}, peak RSS {}{}; generator {:.2} cores, other processes {:.2}{spread}{stuck_text} | `rivet-bench fleet --nodes {n} --rates {offered:.0}{}{}` |",
            if r.progress { ", step progress in each" } else { ", no progress" },
            where_text(&o),
            m.rate, ms(m.p50), ms(m.p99), ms(m.max), m.errors, cores_text(&m.each), mib(m.hwm_kib),
            pg_text(m.pg), m.gen, m.other,
            if r.progress { "" } else { " --no-progress" },
            o.flags(),
        );
        eprintln!("{row}");
        rows.push(row);
        let sustained = m.rate >= 0.95 * offered && m.errors == 0;
        if sustained && m.p99 < Duration::from_millis(50) {
            best = Some((m.rate, offered));
        }
        if !sustained && !r.no_stop {
            eprintln!("offered {offered:.0} hb/s not sustained; higher rates skipped");
            break;
        }
    }
    match best {
        Some((rate, offered)) => eprintln!(
            "highest rate sustained with p99 < 50 ms: {rate:.0} hb/s (offered {offered:.0})"
        ),
        None => eprintln!("no offered rate was sustained with p99 < 50 ms"),
    }
    if r.long_poll_phase {
        let hold = o.settings.long_poll_s;
        let m = measure(
            &f,
            &tx,
            &rec,
            Phase::LongPoll,
            hold + 2,
            r.seconds.max(hold * 2),
        )
        .await?;
        let row = format!(
            "| fleet: {n} agents long-polling (`wait: true`, long_poll_s = {hold}){} | {n} polls held open, {:.0} hb/s, {} errors; rivetd {}, RSS while the polls are held {} (sampled every second; peak over rivetd's whole run {}){}; generator {:.2} cores, other processes {:.2} | `rivet-bench fleet --nodes {n} --rates 0 --long-poll-phase{}` |",
            where_text(&o),
            m.rate, m.errors, cores_text(&m.each), mib(m.rss_during_kib), mib(m.hwm_kib), pg_text(m.pg), m.gen, m.other,
            o.flags(),
        );
        eprintln!("{row}");
        rows.push(row);
    }
    let _ = tx.send(Phase::Stop);
    Ok(rows)
}

/// Say what the first few failed heartbeats got (the count is in the row).
fn report_error(node: &str, what: &str) {
    static SHOWN: AtomicUsize = AtomicUsize::new(0);
    if SHOWN.fetch_add(1, Ordering::Relaxed) < 5 {
        eprintln!("heartbeat of node {node} failed: {what}");
    }
}

/// One recorded phase.
struct Measured {
    rate: f64,
    p50: Duration,
    p99: Duration,
    max: Duration,
    errors: u64,
    /// Cores of each controller.
    each: Vec<f64>,
    /// Cores of the PostgreSQL processes (none on SQLite).
    pg: Option<f64>,
    gen: f64,
    other: f64,
    /// Peak resident memory of the largest controller over its whole life so far.
    hwm_kib: u64,
    /// The largest resident memory of any controller sampled (every second) while the
    /// phase was measured: what the phase itself costs, not the set-up or earlier phases.
    rss_during_kib: u64,
}

/// Switch the agents to `phase`, let it settle for `warmup` s, record for `seconds` s.
async fn measure(
    f: &Fleet,
    tx: &watch::Sender<Phase>,
    rec: &Recorder,
    phase: Phase,
    warmup: u64,
    seconds: u64,
) -> Result<Measured> {
    tx.send(phase).context("agents gone")?;
    tokio::time::sleep(Duration::from_secs(warmup)).await;
    rec.start();
    let cpus = f.cpu_meters();
    let pg_meter = f.pg_meter();
    let me = CpuMeter::start(None);
    let all = MachineMeter::start();
    let t = Instant::now();
    let pids: Vec<u32> = f.rivetds.iter().map(Rivetd::pid).collect();
    let mut rss_during_kib = 0;
    while t.elapsed() < Duration::from_secs(seconds) {
        for p in &pids {
            let kib = crate::procstat::vm_kib(*p, "VmRSS").unwrap_or(0);
            rss_during_kib = rss_during_kib.max(kib);
        }
        let left = Duration::from_secs(seconds).saturating_sub(t.elapsed());
        tokio::time::sleep(left.min(Duration::from_secs(1))).await;
    }
    let (lat, errors) = rec.stop();
    let wall = t.elapsed().as_secs_f64();
    let each: Vec<f64> = cpus.iter().map(CpuMeter::cores).collect();
    let pg = pg_meter.as_ref().map(PostgresMeter::cores);
    let (cores, gen) = (each.iter().sum::<f64>(), me.cores());
    Ok(Measured {
        rate: lat.len() as f64 / wall,
        p50: percentile(&lat, 50.0),
        p99: percentile(&lat, 99.0),
        max: percentile(&lat, 100.0),
        errors,
        each,
        pg,
        gen,
        other: (all.cores() - cores - gen - pg.unwrap_or(0.0)).max(0.0),
        hwm_kib: f.rivetds.iter().map(Rivetd::hwm_kib).max().unwrap_or(0),
        rss_during_kib,
    })
}
