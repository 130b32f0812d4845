//! `rivet-bench fleet` and `rivet-bench clean-fleet`: simulated agent fleets against one
//! rivetd on SQLite.
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
//!   and its own CPU (the generator shares the machine).

use crate::procstat::{CpuMeter, MachineMeter};
use crate::rivetd::{for_each_concurrent, Admin, Rivetd, Settings};
use crate::sim::{Beat, Link, Profile, SimAgent};
use crate::stats::{mib, ms, percentile, Recorder};
use anyhow::{bail, Context, Result};
use rand::Rng;
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

/// A started fleet: rivetd, its temporary directory, and the agent tasks.
struct Fleet {
    rivetd: Rivetd,
    dir: Option<tempfile::TempDir>,
    admin: Admin,
    uuids: Vec<String>,
    tasks: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    keep: bool,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if let Ok(t) = self.tasks.lock() {
            for h in t.iter() {
                h.abort();
            }
        }
        self.rivetd.stop();
        if let Some(d) = self.dir.take().filter(|_| self.keep) {
            eprintln!("kept {} (rivetd.log, rivet.db)", d.keep().display());
        }
    }
}

/// Start rivetd and enroll `nodes` fake-hardware nodes to `manageable`.
async fn enroll(o: &FleetOpts) -> Result<Fleet> {
    let exe = crate::rivetd::locate(o.rivetd.as_deref())?;
    let dir = tempfile::Builder::new().prefix("rivet-bench-").tempdir()?;
    let db = dir.path().join("rivet.db");
    let rivetd = Rivetd::start(&exe, dir.path(), &db, &o.settings).await?;
    let admin = Admin::new(&rivetd.url)?;
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
        rivetd,
        dir: Some(dir),
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
    let link = Link::new(&f.rivetd.url, o.settings.long_poll_s)?;
    let profile = Arc::new(Profile::noop());
    let failures = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + o.setup_limit;
    let cpu = CpuMeter::start(Some(f.rivetd.pid()));
    let me = CpuMeter::start(None);
    let all = MachineMeter::start();
    let t0 = Instant::now();
    let (l, p, fl) = (link.clone(), profile.clone(), failures.clone());
    let boot = provide_and_boot(&f, &o, Arc::default(), move |i, u| {
        let (l, p, fl) = (l.clone(), p.clone(), fl.clone());
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
    let cores = cpu.cores();
    let gen = me.cores();
    let other = (all.cores() - cores - gen).max(0.0);
    let failed = failures.load(Ordering::SeqCst);
    let failed_nodes = f.admin.count_in_state("clean failed").await.unwrap_or(0);
    if failed + failed_nodes > 0 {
        bail!(
            "{failed} agents failed, {failed_nodes} nodes in clean failed; see {}",
            f.rivetd.log.display()
        );
    }
    let row = format!(
        "| clean-fleet: automated cleaning of {n} nodes, 2 no-op steps each (priorities 50, 40) | {:.1} s wall from first `provide` to all `available` ({:.0} nodes/s, {:.0} steps/s); rivetd {:.2} cores, peak RSS {}; generator {:.2} cores, other processes {other:.2} | `rivet-bench clean-fleet --nodes {n}` |",
        wall.as_secs_f64(),
        n as f64 / wall.as_secs_f64(),
        2.0 * n as f64 / wall.as_secs_f64(),
        cores,
        mib(f.rivetd.hwm_kib()),
        gen,
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
                        _ => {
                            rec.err();
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
    let link = Link::new(&f.rivetd.url, o.settings.long_poll_s)?;
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
        link,
        profile,
        phases: rx,
        rec: rec.clone(),
        ready: ready.clone(),
        failed: failed.clone(),
        deadline,
    };
    let provided = Arc::new(AtomicUsize::new(0));
    let ticker = {
        let (provided, ready, pid) = (provided.clone(), ready.clone(), f.rivetd.pid());
        tokio::spawn(async move {
            let t = Instant::now();
            let mut cpu = CpuMeter::start(Some(pid));
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                eprintln!(
                    "  {:>4.0} s: {} provided, {} agents running their step; rivetd {:.2} cores, RSS {}",
                    t.elapsed().as_secs_f64(),
                    provided.load(Ordering::SeqCst),
                    ready.load(Ordering::SeqCst),
                    cpu.cores(),
                    mib(crate::procstat::vm_kib(pid, "VmRSS").unwrap_or(0))
                );
                cpu = CpuMeter::start(Some(pid));
            }
        })
    };
    let booted = provide_and_boot(&f, &o, provided, move |i, u| {
        let mut a = SimAgent::new(u, i);
        a.report_progress = progress;
        fleet_agent(a, shared.clone())
    })
    .await;
    if booted.is_err() {
        ticker.abort();
    }
    booted?;
    while ready.load(Ordering::SeqCst) + failed.load(Ordering::SeqCst) < n {
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
    if failed.load(Ordering::SeqCst) > 0 {
        bail!(
            "{} agents failed during set-up; see {}",
            failed.load(Ordering::SeqCst),
            f.rivetd.log.display()
        );
    }
    eprintln!(
        "fleet of {n}: provide → every agent running its step in {:.1} s; rivetd RSS {}",
        t.elapsed().as_secs_f64(),
        mib(f.rivetd.rss_kib())
    );

    let mut rows = Vec::new();
    let mut best: Option<(f64, f64)> = None;
    for &offered in &r.rates {
        let phase = Phase::Every(Duration::from_secs_f64(n as f64 / offered));
        let m = measure(&f, &tx, &rec, phase, r.warmup, r.seconds).await?;
        let row = format!(
            "| fleet: {n} agents heartbeating (`wait: false`{}), offered {offered:.0} hb/s | {:.0} hb/s sustained, latency p50 {}, p99 {}, max {}, {} errors; rivetd {:.2} cores, peak RSS {}; generator {:.2} cores, other processes {:.2} | `rivet-bench fleet --nodes {n} --rates {offered:.0}{}` |",
            if r.progress { ", step progress in each" } else { ", no progress" },
            m.rate, ms(m.p50), ms(m.p99), ms(m.max), m.errors, m.cores, mib(m.hwm_kib), m.gen, m.other,
            if r.progress { "" } else { " --no-progress" }
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
            "| fleet: {n} agents long-polling (`wait: true`, long_poll_s = {hold}) | {n} polls held open, {:.0} hb/s, {} errors; rivetd {:.2} cores, peak RSS {}; generator {:.2} cores, other processes {:.2} | `rivet-bench fleet --nodes {n} --rates 0 --long-poll-phase` |",
            m.rate, m.errors, m.cores, mib(m.hwm_kib), m.gen, m.other
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
    cores: f64,
    gen: f64,
    other: f64,
    hwm_kib: u64,
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
    let cpu = CpuMeter::start(Some(f.rivetd.pid()));
    let me = CpuMeter::start(None);
    let all = MachineMeter::start();
    let t = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let (lat, errors) = rec.stop();
    let wall = t.elapsed().as_secs_f64();
    let (cores, gen) = (cpu.cores(), me.cores());
    Ok(Measured {
        rate: lat.len() as f64 / wall,
        p50: percentile(&lat, 50.0),
        p99: percentile(&lat, 99.0),
        max: percentile(&lat, 100.0),
        errors,
        cores,
        gen,
        other: (all.cores() - cores - gen).max(0.0),
        hwm_kib: f.rivetd.hwm_kib(),
    })
}
