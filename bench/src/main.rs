//! rivet-bench: whole-system benchmarks of Rivet, each printing markdown rows for docs/numbers.md's
//! "Numbers" table (`| What | Result | Command |`).
//!
//! - `fleet`: N simulated agents heartbeating against a release rivetd at offered rates;
//! - `clean-fleet`: automated cleaning of N nodes whose agents offer no-op steps;
//! - `api`: node listing and GET latency with N nodes in the store, rivetd RSS;
//! - `agent`: static agent size, inventory time and peak RSS;
//! - `console`: rivetd RSS per enabled serial console with N streaming, keystroke round trip
//!   through the WebSocket (a stand-in ipmitool: this binary under the name `ipmitool`);
//! - `deploy`: the static agent's `write_image` against `curl | dd` on a loop device (root);
//! - `fleet-deploy`: N real agents deploying one image at once, `http` against `local`
//!   (rivetd's image cache): origin bytes, wall time, rivetd CPU/RSS (see fleet_deploy.rs);
//! - `soak`: N agents cycling clean → deploy → undeploy with agent crashes and rivetd
//!   restarts; checks resting states, no step run twice, rivetd RSS (see soak.rs);
//! - `ui`: the web UI's fleet page with N nodes in headless Chromium over WebDriver: first
//!   render, bytes, a state change in its row, scrolling, RSS with open event streams.
//!
//! rivetd runs as a child (`target/release/rivetd` next to this binary, or `--rivetd`) on a
//! free 127.0.0.1 port with a SQLite file in a temporary directory; it is killed at the end.
//! The fleet benches can instead run N rivetd on a scratch PostgreSQL database
//! (`--postgres BASE_URL --controllers N`), dropped at the end.
//! All traffic stays on loopback; every load loop is bounded in count and time.

mod agent;
mod api;
mod console;
mod deploy;
mod fleet;
mod fleet_deploy;
mod procstat;
mod rivetd;
mod sim;
mod soak;
mod stats;
mod ui;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "rivet-bench", version, about = "Rivet whole-system benchmarks")]
struct Cli {
    /// Print the table header before the rows.
    #[arg(long, global = true)]
    header: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Args, Clone)]
struct Common {
    /// rivetd binary (default: `rivetd` next to this binary).
    #[arg(long, value_name = "PATH")]
    rivetd: Option<PathBuf>,
    /// Keep the temporary directory (rivetd.log, rivet.db).
    #[arg(long)]
    keep: bool,
    /// Load-generator threads (tokio workers); it shares the machine with rivetd.
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

#[derive(Args, Clone)]
struct FleetArgs {
    /// Nodes (one simulated agent each).
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// Admin API requests in flight during set-up.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// `[agent] long_poll_s` of rivetd.
    #[arg(long, default_value_t = 30)]
    long_poll_s: u64,
    /// `[agent] heartbeat_timeout_s` of rivetd.
    #[arg(long, default_value_t = 300)]
    heartbeat_timeout_s: u64,
    /// `[conductor] check_interval_s` of rivetd.
    #[arg(long, default_value_t = 10)]
    check_interval_s: u64,
    /// `[store] sqlite_readers` of rivetd (0: every store call on the one writer connection,
    /// as before the readers existed); rivetd's default when absent.
    #[arg(long)]
    sqlite_readers: Option<usize>,
    /// Upper bound of the set-up (enrol, provide, agents booted), seconds.
    #[arg(long, default_value_t = 600)]
    setup_limit_s: u64,
    /// Run on PostgreSQL: a scratch database created on this server (its role needs
    /// CREATEDB) and dropped at the end, e.g. postgres://rivet:rivet@127.0.0.1:55432/rivet.
    #[arg(long, value_name = "BASE_URL")]
    postgres: Option<String>,
    /// rivetd processes sharing the database (distinct conductor ids, one secrets key);
    /// agents are spread over them round-robin. More than one needs --postgres.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=16))]
    controllers: u64,
    #[command(flatten)]
    common: Common,
}

#[derive(Subcommand)]
enum Cmd {
    /// Sustained heartbeats/s, latency, rivetd CPU and RSS with N agents at offered rates.
    Fleet {
        #[command(flatten)]
        fleet: FleetArgs,
        /// Offered heartbeat rates of the whole fleet (per second), tried in order; stops
        /// after the first one not sustained (≥ 95 % delivered, no errors).
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "1000,2500,5000,7500,10000"
        )]
        rates: Vec<f64>,
        /// Recorded seconds per rate.
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        /// Unrecorded seconds at each rate first.
        #[arg(long, default_value_t = 5)]
        warmup: u64,
        /// Also measure every agent long-polling (`wait: true`), the production loop.
        #[arg(long)]
        long_poll_phase: bool,
        /// Try every rate even after one was not sustained.
        #[arg(long)]
        no_stop: bool,
        /// Agents report no progress for their running step (by default every heartbeat
        /// carries growing erase progress, so rivetd writes it).
        #[arg(long)]
        no_progress: bool,
    },
    /// Automated cleaning of N nodes with no-op steps: provide → all available.
    CleanFleet {
        #[command(flatten)]
        fleet: FleetArgs,
    },
    /// Listing and GET latency with N nodes in the store; rivetd RSS.
    Api {
        /// Nodes in the store.
        #[arg(long, default_value_t = 10_000)]
        nodes: usize,
        /// Requests per page measurement.
        #[arg(long, default_value_t = 30)]
        page_requests: usize,
        /// Single-node GETs.
        #[arg(long, default_value_t = 200)]
        get_requests: usize,
        /// Skip the second rivetd run that measures peak RSS during a power-sync pass.
        #[arg(long)]
        no_power_sync_pass: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Static agent size, `rivet-agent inventory` time and peak RSS.
    Agent {
        /// The agent binary (default: built by scripts/build-agent.sh).
        #[arg(long, value_name = "PATH")]
        agent_bin: Option<PathBuf>,
        /// Timed inventory runs.
        #[arg(long, default_value_t = 20)]
        runs: usize,
    },
    /// rivetd RSS per enabled serial console with N streaming; keystroke round trip through
    /// the WebSocket.
    Console {
        /// Console counts measured in turn; the last is the headline.
        #[arg(long, value_delimiter = ',', default_value = "100,1000")]
        steps: Vec<usize>,
        /// Each stand-in BMC prints a line this often (ms).
        #[arg(long, default_value_t = 1000)]
        line_every_ms: u64,
        /// Seconds each step streams before RSS is sampled.
        #[arg(long, default_value_t = 20)]
        settle_s: u64,
        /// Keystrokes timed through the WebSocket.
        #[arg(long, default_value_t = 500)]
        keystrokes: usize,
        #[command(flatten)]
        common: Common,
    },
    /// Chaos soak: N agents cycle clean → deploy → undeploy while agents crash and rivetd
    /// restarts; exits non-zero when a node does not rest, a step ran twice or RSS grew.
    Soak {
        /// Minutes of chaos (settling comes on top).
        #[arg(long, default_value_t = 30.0)]
        minutes: f64,
        /// Nodes, one simulated agent each.
        #[arg(long, default_value_t = 1000)]
        agents: usize,
        /// RNG seed (default: from the clock; printed).
        #[arg(long)]
        seed: Option<u64>,
        /// Admin API requests in flight during enrollment.
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
        /// Mean agent crashes per minute, fleet-wide (0: none).
        #[arg(long, default_value_t = 10.0)]
        crashes_per_min: f64,
        /// Seconds between rivetd restarts, MIN,MAX (0,0: none).
        #[arg(long, value_delimiter = ',', default_value = "30,120")]
        restart_every_s: Vec<u64>,
        /// Percent of restarts done with SIGKILL (the rest SIGTERM).
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(0..=100))]
        sigkill_percent: u32,
        /// Duration of one agent step in milliseconds, MIN,MAX.
        #[arg(long, value_delimiter = ',', default_value = "300,2000")]
        step_ms: Vec<u64>,
        /// Seconds a node rests between operations, MIN,MAX.
        #[arg(long, value_delimiter = ',', default_value = "10,60")]
        idle_s: Vec<u64>,
        /// Seconds after each rivetd start before its RSS counts as steady.
        #[arg(long, default_value_t = 30)]
        rss_warmup_s: u64,
        /// Allowed RSS growth within one rivetd lifetime after the warm-up, percent.
        #[arg(long, default_value_t = 20.0)]
        rss_limit_pct: f64,
        /// Upper bound of the settle phase after the chaos, seconds.
        #[arg(long, default_value_t = 180)]
        settle_s: u64,
        /// rivetd's `[agent] heartbeat_timeout_s` (how soon a crashed agent's node fails).
        #[arg(long, default_value_t = 30)]
        heartbeat_timeout_s: u64,
        #[command(flatten)]
        common: Common,
    },
    /// The web UI's fleet page in headless Chromium (scripts/setup-browser.sh): first
    /// render, bytes on first load, a state change in its row, scrolling, RSS with N open
    /// event streams.
    Ui {
        /// Nodes in the store.
        #[arg(long, default_value_t = 10_000)]
        nodes: usize,
        /// Reloads measured after the cold first load.
        #[arg(long, default_value_t = 5)]
        reloads: usize,
        /// State changes measured.
        #[arg(long, default_value_t = 10)]
        changes: usize,
        /// Frames of scrolling.
        #[arg(long, default_value_t = 300)]
        scroll_frames: usize,
        /// Pixels scrolled per frame.
        #[arg(long, default_value_t = 200)]
        scroll_px: usize,
        /// UI event streams held open for the RSS figure.
        #[arg(long, default_value_t = 100)]
        sessions: usize,
        #[command(flatten)]
        common: Common,
    },
    /// `write_image` (raw, qcow2, zstd) against `curl | dd` on a loop device (needs root).
    Deploy {
        /// Image size in GiB.
        #[arg(long, default_value_t = 2)]
        size_gib: u64,
        /// Interleaved rounds.
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// The agent binary (default: built by scripts/build-agent.sh).
        #[arg(long, value_name = "PATH")]
        agent_bin: Option<PathBuf>,
        /// Directory for the images and the disk's backing file (default: the temp dir).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// N real agents (disks are files) deploying one image at once, `image_download_source`
    /// `http` against `local`: origin bytes, wall time, rivetd CPU and RSS; every disk checked.
    FleetDeploy {
        /// Fleet sizes, one round each per source.
        #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
        nodes: Vec<usize>,
        /// Image size in MiB (the disks need N × this under --dir).
        #[arg(long, default_value_t = 64)]
        image_mib: u64,
        /// Sources, in order.
        #[arg(long, value_delimiter = ',', default_value = "http,local")]
        sources: Vec<String>,
        /// Directory for the image, the disk files and rivetd's state (default: the temp dir).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// The agent binary (default: `rivet-agent` next to rivetd).
        #[arg(long, value_name = "PATH")]
        agent_bin: Option<PathBuf>,
        /// Upper bound of one round, seconds.
        #[arg(long, default_value_t = 600)]
        round_limit_s: u64,
        #[command(flatten)]
        common: Common,
    },
}

/// The soak's heartbeat timeout must outlast its long poll (5 s) and a restart's downtime.
const LONG_POLL_FLOOR_S: u64 = 20;

fn fleet_opts(f: &FleetArgs) -> fleet::FleetOpts {
    fleet::FleetOpts {
        nodes: f.nodes,
        concurrency: f.concurrency,
        rivetd: f.common.rivetd.clone(),
        settings: rivetd::Settings {
            long_poll_s: f.long_poll_s,
            heartbeat_timeout_s: f.heartbeat_timeout_s,
            check_interval_s: f.check_interval_s,
            sqlite_readers: f.sqlite_readers,
            ..Default::default()
        },
        keep: f.common.keep,
        setup_limit: Duration::from_secs(f.setup_limit_s),
        postgres: f.postgres.clone(),
        controllers: f.controllers as usize,
    }
}

fn runtime(threads: usize) -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()?)
}

fn main() -> Result<()> {
    // Reached as `ipmitool` (a symlink the console bench makes): be the stand-in BMC.
    let argv: Vec<String> = std::env::args().collect();
    if argv
        .first()
        .is_some_and(|a| a.ends_with(&format!("/{}", console::STAND_IN_NAME)))
    {
        std::process::exit(console::stand_in(&argv[1..]));
    }
    let cli = Cli::parse();
    procstat::raise_nofile();
    let load = procstat::loadavg();
    if load > 1.0 {
        eprintln!(
            "warning: load average {load:.2}: other processes compete for the CPU; latency and rate numbers will be pessimistic (see \"other processes\" in each row)"
        );
    }
    let rows = match cli.cmd {
        Cmd::Fleet {
            fleet,
            rates,
            seconds,
            warmup,
            long_poll_phase,
            no_stop,
            no_progress,
        } => runtime(fleet.common.threads)?.block_on(fleet::fleet(
            fleet_opts(&fleet),
            fleet::RateOpts {
                rates: rates.into_iter().filter(|r| *r > 0.0).collect(),
                seconds,
                warmup,
                long_poll_phase,
                no_stop,
                progress: !no_progress,
            },
        ))?,
        Cmd::CleanFleet { fleet } => {
            runtime(fleet.common.threads)?.block_on(fleet::clean_fleet(fleet_opts(&fleet)))?
        }
        Cmd::Api {
            nodes,
            page_requests,
            get_requests,
            no_power_sync_pass,
            common,
        } => runtime(common.threads)?.block_on(api::run(api::ApiOpts {
            nodes,
            page_requests: page_requests.max(1),
            get_requests: get_requests.max(1),
            power_sync_pass: !no_power_sync_pass,
            rivetd: common.rivetd,
            keep: common.keep,
        }))?,
        Cmd::Soak {
            minutes,
            agents,
            seed,
            concurrency,
            crashes_per_min,
            restart_every_s,
            sigkill_percent,
            step_ms,
            idle_s,
            rss_warmup_s,
            rss_limit_pct,
            settle_s,
            heartbeat_timeout_s,
            common,
        } => {
            let pair = |name: &str, v: &[u64]| match v {
                [lo, hi] if lo <= hi => Ok((*lo, *hi)),
                _ => Err(anyhow::anyhow!("--{name} takes MIN,MAX with MIN <= MAX")),
            };
            runtime(common.threads)?.block_on(soak::run(soak::SoakOpts {
                minutes: minutes.max(0.0),
                agents: agents.max(1),
                seed,
                rivetd: common.rivetd,
                keep: common.keep,
                concurrency: concurrency.max(1),
                crashes_per_min,
                restart_every_s: pair("restart-every-s", &restart_every_s)?,
                sigkill_percent,
                step_ms: pair("step-ms", &step_ms)?,
                idle_s: pair("idle-s", &idle_s)?,
                rss_warmup_s,
                rss_limit_pct,
                settle_s,
                heartbeat_timeout_s: heartbeat_timeout_s.max(LONG_POLL_FLOOR_S),
            }))?
        }
        Cmd::Ui {
            nodes,
            reloads,
            changes,
            scroll_frames,
            scroll_px,
            sessions,
            common,
        } => ui::run(ui::UiOpts {
            nodes,
            reloads,
            changes: changes.clamp(1, 20),
            scroll_frames: scroll_frames.max(10),
            scroll_px,
            sessions: sessions.max(1),
            rivetd: common.rivetd,
            keep: common.keep,
        })?,
        Cmd::Console {
            steps,
            line_every_ms,
            settle_s,
            keystrokes,
            common,
        } => runtime(common.threads)?.block_on(console::run(console::ConsoleOpts {
            steps,
            line_every_ms,
            settle_s,
            keystrokes,
            rivetd: common.rivetd,
            keep: common.keep,
        }))?,
        Cmd::Agent { agent_bin, runs } => agent::run(agent::AgentOpts { agent_bin, runs })?,
        Cmd::Deploy {
            size_gib,
            reps,
            agent_bin,
            dir,
        } => deploy::run_bench(deploy::DeployOpts {
            size_gib: size_gib.max(1),
            reps: reps.max(1),
            agent_bin,
            dir,
        })?,
        Cmd::FleetDeploy {
            nodes,
            image_mib,
            sources,
            dir,
            agent_bin,
            round_limit_s,
            common,
        } => {
            runtime(common.threads)?.block_on(fleet_deploy::run(fleet_deploy::FleetDeployOpts {
                nodes: nodes.into_iter().filter(|n| *n > 0).collect(),
                image_mib: image_mib.max(1),
                sources,
                dir,
                rivetd: common.rivetd,
                agent_bin,
                round_limit: Duration::from_secs(round_limit_s),
                keep: common.keep,
            }))?
        }
    };
    if cli.header {
        println!("| What | Result | Command |");
        println!("|---|---|---|");
    }
    for r in rows {
        println!("{r}");
    }
    Ok(())
}
