//! Command line: `run` (default, ramdisk mode), `inventory`, `steps`, `step NAME`.
//!
//! [`run_with`] is the whole program; `main` only names the managers. A vendor agent calls
//! [`run`] with its own managers (added to the stock ones) or [`run_with`] to choose all of them.

use crate::config::{self, Overrides, Settings};
use crate::executor::{Executor, ExecutorOptions, PowerMode};
use crate::fetch::HttpFetcher;
use crate::heartbeat::{Agent, AgentOptions};
use crate::inventory::{self, InventoryOptions, Root};
use crate::logring::{self, LogRing};
use crate::{pid1, HttpTransport};
use clap::{Args, Parser, Subcommand};
use rivet_hardware_managers::deploy::{DeployManager, DiskLister};
use rivet_hardware_managers::raid::SoftwareRaidManager;
use rivet_hardware_managers::{
    default_managers, Dispatcher, HardwareManager, ManagerConfig, StepContext,
};
use rivet_protocol::agent::CleanStepsResult;
use serde_json::{Map, Value};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// Lines kept in memory; failed results carry the last [`logring::DEFAULT_LINES`].
const RING_LINES: usize = 200;

#[derive(Parser, Debug)]
#[command(
    name = "rivet-agent",
    version,
    about = "Rivet's in-band agent: inventory, steps, and the controller conversation",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
    /// Flags of `run`, which is the default subcommand.
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Ramdisk mode: look up, heartbeat, run the controller's commands (default).
    Run(RunArgs),
    /// Print this machine's inventory JSON and exit.
    Inventory(LocalArgs),
    /// Print the steps the hardware managers offer (JSON) and exit.
    Steps(LocalArgs),
    /// Run one step locally, without a controller: progress on stderr, result JSON on stdout.
    Step(StepArgs),
}

#[derive(Args, Debug, Default)]
struct RunArgs {
    /// Controller URL(s), comma separated (else RIVET_CONTROLLER, else rivet.controller=).
    #[arg(long, value_delimiter = ',', value_name = "URL[,URL…]")]
    controller: Vec<String>,
    #[command(flatten)]
    local: LocalArgs,
    /// Node UUID hint for lookup (else RIVET_NODE, else rivet.node=).
    #[arg(long, value_name = "UUID")]
    node: Option<String>,
    /// Extra CA certificate (PEM) for https controllers (else RIVET_CA, else rivet.ca=).
    #[arg(long, value_name = "PATH")]
    ca: Option<PathBuf>,
    /// Time limit of one execute_step, in seconds.
    #[arg(long, default_value_t = 6 * 3600, value_name = "SECS")]
    step_timeout: u64,
    /// Time limit of the other commands, in seconds.
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    command_timeout: u64,
    /// IPA mode: a stock Ironic's API URL (else `ipa-api-url=` on the kernel command line).
    /// The agent then looks up, heartbeats and serves IPA's REST API as ironic-python-agent.
    #[arg(long, value_name = "URL")]
    ironic: Option<String>,
    /// IPA mode: where IPA's API listens (else port `ipa-listen-port=`, default 9999, on all
    /// addresses).
    #[arg(long, value_name = "ADDR:PORT")]
    ipa_listen: Option<std::net::SocketAddr>,
    /// IPA mode: the callback URL sent to Ironic (else `ipa-advertise-host=`/`-port=`, else
    /// the address that routes to Ironic).
    #[arg(long, value_name = "URL")]
    ipa_advertise: Option<String>,
    /// IPA mode: post the inventory here first, for in-band inspection (else
    /// `ipa-inspection-callback-url=`).
    #[arg(long, value_name = "URL")]
    inspection_callback: Option<String>,
    /// IPA mode: serve IPA's API over plain HTTP instead of TLS with a self-signed
    /// certificate (else `ipa-enable-auto-tls=0`); Ironic then needs `[agent] require_tls =
    /// false`.
    #[arg(long)]
    ipa_no_tls: bool,
    /// Directory whose etc/passwd and etc/shadow get the rescue login (finalize_rescue).
    /// The ramdisk's init uses `/`; a local agent without this refuses to rescue, so it
    /// never changes the host's own accounts.
    #[arg(long, value_name = "DIR")]
    rescue_root: Option<PathBuf>,
}

#[derive(Args, Debug, Default)]
struct LocalArgs {
    /// Use exactly these disks (block devices or regular files), comma separated
    /// (else RIVET_DEVICES).
    #[arg(long, value_delimiter = ',', value_name = "PATH[,PATH…]")]
    devices: Vec<PathBuf>,
    /// Directory of exec-plugin hardware managers.
    #[arg(long, value_name = "DIR")]
    plugin_dir: Option<PathBuf>,
    /// Log filter, e.g. `debug` (else RIVET_LOG, else rivet.log=).
    #[arg(long, value_name = "LEVEL")]
    log: Option<String>,
    /// Log JSON lines on stderr (else RIVET_LOG_JSON=1, else rivet.log_json=1); the log tail
    /// sent with a failed step stays human-readable.
    #[arg(long)]
    log_json: bool,
}

#[derive(Args, Debug)]
struct StepArgs {
    /// Step name, e.g. `erase_devices_metadata`.
    name: String,
    /// Step arguments as a JSON object.
    #[arg(long, value_name = "JSON")]
    args: Option<String>,
    #[command(flatten)]
    local: LocalArgs,
}

/// Run the agent with the stock managers plus `extra` (a vendor's own managers).
pub fn run(extra: Vec<Arc<dyn HardwareManager>>) -> ExitCode {
    run_with(move |cfg| {
        let mut managers = default_managers(cfg);
        managers.extend(extra.iter().cloned());
        managers
    })
}

/// Run the agent; `managers` builds the hardware managers from the parsed configuration
/// (device list, plugin directory). As PID 1 this never returns.
pub fn run_with<F>(managers: F) -> ExitCode
where
    F: Fn(&ManagerConfig) -> Vec<Arc<dyn HardwareManager>>,
{
    if pid1::is_pid1() {
        pid1::early_init();
        pid1::supervise();
    }
    let cli = Cli::parse();
    match cli.command.unwrap_or(Cmd::Run(cli.run)) {
        Cmd::Run(args) => run_agent(args, &managers),
        Cmd::Inventory(args) => local(&args, "warn", &managers, |s, d| {
            print_json(&collect_inventory(s, d, false))
        }),
        Cmd::Steps(args) => local(&args, "warn", &managers, |_, d| {
            print_json(&CleanStepsResult {
                clean_steps: d.steps(),
                hardware_manager_versions: d.versions(),
            })
        }),
        Cmd::Step(args) => {
            let step_args = match parse_step_args(args.args.as_deref()) {
                Ok(a) => a,
                Err(e) => {
                    eprintln!("rivet-agent: --args: {e}");
                    return ExitCode::from(2);
                }
            };
            local(&args.local, "info", &managers, |_, d| {
                run_local_step(d, &args.name, &step_args)
            })
        }
    }
}

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

fn overrides(local: &LocalArgs) -> Overrides {
    Overrides {
        devices: local.devices.clone(),
        log: local.log.clone(),
        log_json: local.log_json,
        ..Default::default()
    }
}

fn manager_config(settings: &Settings, local: &LocalArgs) -> ManagerConfig {
    let mut cfg = ManagerConfig {
        devices: settings.devices.clone(),
        ..Default::default()
    };
    if let Some(dir) = &local.plugin_dir {
        cfg.plugin_dir = dir.clone();
    }
    // Where UEFI boot entries are written: efivarfs, unless a test or a stand-in ramdisk
    // points the agent at a directory of its own.
    if let Some(dir) = env_var("RIVET_EFIVARS").filter(|d| !d.is_empty()) {
        cfg.efivars = dir.into();
    }
    cfg
}

/// The deploy manager and the firmware it writes boot entries to: the test's or stand-in's
/// `RIVET_EFIVARS`; none for an agent on disks named to it (`--devices`: a stand-in on this
/// host, whose firmware is never the node's); else efivarfs, as in the ramdisk.
fn deploy_manager(
    fetcher: Arc<HttpFetcher>,
    lister: DiskLister,
    settings: &Settings,
    mcfg: &ManagerConfig,
) -> DeployManager {
    let m = DeployManager::new(fetcher, lister);
    let explicit = env_var("RIVET_EFIVARS").is_some_and(|d| !d.is_empty());
    if settings.devices.is_some() && !explicit {
        m.without_firmware()
    } else {
        m.with_efivars(mcfg.efivars.clone())
    }
}

/// The stock managers plus the deploy manager (`write_image`), which needs the agent's
/// network (its [`HttpFetcher`]) and its view of the disks (the `--devices` list, or the
/// inventory's disks).
fn with_deploy(
    mut managers: Vec<Arc<dyn HardwareManager>>,
    settings: &Settings,
    mcfg: &ManagerConfig,
) -> Vec<Arc<dyn HardwareManager>> {
    let devices = settings.devices.clone();
    let lister: DiskLister = Arc::new(move || match &devices {
        Some(paths) => inventory::disks_for_paths(&Root::default(), paths),
        None => inventory::collect_disks(&Root::default()),
    });
    let fetcher = Arc::new(HttpFetcher::new(settings.ca.clone()));
    managers.push(Arc::new(deploy_manager(
        fetcher,
        lister.clone(),
        settings,
        mcfg,
    )));
    // Software RAID steps, offered only where mdadm and md exist (the ramdisk).
    managers.push(Arc::new(SoftwareRaidManager::new(lister)));
    managers
}

/// Shared set-up of the local subcommands: settings, quiet logging, dispatcher.
fn local<M, F>(args: &LocalArgs, default_log: &str, managers: &M, body: F) -> ExitCode
where
    M: Fn(&ManagerConfig) -> Vec<Arc<dyn HardwareManager>>,
    F: FnOnce(&Settings, &Dispatcher) -> ExitCode,
{
    let mut settings =
        match config::resolve(&config::read_cmdline(), &env_var, &overrides(args), false) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("rivet-agent: {e}");
                return ExitCode::from(2);
            }
        };
    // Local commands print JSON on stdout; keep stderr quiet unless asked.
    if args.log.is_none() && env_var("RIVET_LOG").is_none() {
        settings.log = default_log.to_string();
    }
    logring::init(
        &settings.log,
        &LogRing::new(RING_LINES, true),
        settings.log_json,
    );
    let mcfg = manager_config(&settings, args);
    let dispatcher = Dispatcher::new(with_deploy(managers(&mcfg), &settings, &mcfg));
    body(&settings, &dispatcher)
}

fn collect_inventory(
    settings: &Settings,
    dispatcher: &Dispatcher,
    skip_bmc: bool,
) -> rivet_protocol::inventory::Inventory {
    let mut inv = inventory::collect(
        &Root::default(),
        &InventoryOptions {
            devices: settings.devices.clone(),
            pxe_mac: settings.pxe_mac.clone(),
            skip_bmc,
        },
    );
    dispatcher.inventory(&mut inv);
    inv
}

fn print_json<T: serde::Serialize>(value: &T) -> ExitCode {
    match serde_json::to_string_pretty(value) {
        Ok(s) => {
            println!("{s}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rivet-agent: cannot encode JSON: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse_step_args(text: Option<&str>) -> Result<Map<String, Value>, String> {
    match text {
        None => Ok(Map::new()),
        Some(t) => match serde_json::from_str::<Value>(t) {
            Ok(Value::Object(m)) => Ok(m),
            Ok(_) => Err("must be a JSON object".into()),
            Err(e) => Err(e.to_string()),
        },
    }
}

/// Run a step on a worker thread, echoing progress changes to stderr.
fn run_local_step(dispatcher: &Dispatcher, step: &str, args: &Map<String, Value>) -> ExitCode {
    let ctx = StepContext::new();
    let outcome = std::thread::scope(|s| {
        let worker = s.spawn(|| dispatcher.execute(step, args, &ctx));
        let mut last = None;
        while !worker.is_finished() {
            let p = ctx.progress();
            if p != last {
                if let Some(p) = &p {
                    eprintln!("progress: {}/{} {}", p.done, p.total, p.message);
                }
                last = p;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        worker.join()
    });
    match outcome {
        Ok(Ok(value)) => print_json(&value),
        Ok(Err(e)) => {
            eprintln!("rivet-agent: step {step} failed: {e}");
            ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!("rivet-agent: step {step} crashed");
            ExitCode::FAILURE
        }
    }
}

/// Ramdisk mode.
fn run_agent<M>(args: RunArgs, managers: &M) -> ExitCode
where
    M: Fn(&ManagerConfig) -> Vec<Arc<dyn HardwareManager>>,
{
    let flags = Overrides {
        controllers: args.controller.clone(),
        node: args.node.clone(),
        ca: args.ca.clone(),
        ..overrides(&args.local)
    };
    let cmdline = config::read_cmdline();
    let boot = config::parse_cmdline(&cmdline);
    let ironic = args.ironic.clone().or(boot.ipa_api_url.clone());
    let settings = match config::resolve(&cmdline, &env_var, &flags, ironic.is_none()) {
        Ok(s) => s,
        Err(e) => return fatal(&e.to_string()),
    };
    let ring = LogRing::new(RING_LINES, true);
    logring::init(&settings.log, &ring, settings.log_json);
    let ring_for_ipa = ring.clone();

    let mcfg = manager_config(&settings, &args.local);
    let dispatcher = Arc::new(Dispatcher::new(with_deploy(
        managers(&mcfg),
        &settings,
        &mcfg,
    )));
    for (name, level) in dispatcher.managers() {
        tracing::info!(manager = name, ?level, "hardware manager loaded");
    }
    let transport = match HttpTransport::new(settings.ca.as_deref()) {
        Ok(t) => t,
        Err(e) => return fatal(&e.to_string()),
    };
    let inventory = InventoryOptions {
        devices: settings.devices.clone(),
        pxe_mac: settings.pxe_mac.clone(),
        skip_bmc: false,
    };
    let power = if pid1::owns_machine() {
        PowerMode::Real
    } else {
        PowerMode::LogOnly
    };
    let executor = Executor::new(
        dispatcher.clone(),
        ExecutorOptions {
            step_timeout: Duration::from_secs(args.step_timeout),
            command_timeout: Duration::from_secs(args.command_timeout),
            power,
            rescue_root: crate::rescue::RescueRoot::choose(
                pid1::owns_machine(),
                args.rescue_root.clone(),
            ),
            inventory: inventory.clone(),
            ..Default::default()
        },
        ring,
    );
    if let Some(api_url) = ironic {
        let port = boot.ipa_listen_port.unwrap_or(9999);
        let listen = args
            .ipa_listen
            .unwrap_or_else(|| std::net::SocketAddr::from(([0, 0, 0, 0], port)));
        let advertise = args.ipa_advertise.clone().or_else(|| {
            boot.ipa_advertise_host.as_ref().map(|h| {
                format!(
                    "http://{h}:{}",
                    boot.ipa_advertise_port.unwrap_or(listen.port())
                )
            })
        });
        let ca_pem = match &settings.ca {
            Some(p) => match std::fs::read(p) {
                Ok(b) => Some(b),
                Err(e) => return fatal(&format!("cannot read CA {}: {e}", p.display())),
            },
            None => None,
        };
        let opts = crate::ipa::IpaOptions {
            api_url,
            listen,
            advertise,
            node: settings.node.clone(),
            inspection_callback: args
                .inspection_callback
                .clone()
                .or(boot.ipa_inspection_callback.clone()),
            ca_pem,
            inventory,
            auto_tls: !args.ipa_no_tls && boot.ipa_auto_tls.unwrap_or(true),
        };
        tracing::info!(version = rivet_protocol::VERSION, ironic = %opts.api_url,
                       listen = %opts.listen, devices = ?settings.devices,
                       "rivet-agent starting in IPA mode");
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(r) => r,
            Err(e) => return fatal(&format!("cannot start the async runtime: {e}")),
        };
        let log = ring_for_ipa.clone();
        return match runtime.block_on(crate::ipa::run(
            opts,
            executor,
            dispatcher,
            log,
            shutdown_signal(),
        )) {
            Ok(()) => {
                tracing::info!("rivet-agent stopped");
                ExitCode::SUCCESS
            }
            Err(e) => fatal(&e),
        };
    }
    let agent = Agent::new(
        AgentOptions {
            controllers: settings.controllers.clone(),
            node: settings.node.clone(),
            inventory,
            ..Default::default()
        },
        transport,
        dispatcher,
        executor,
    );
    tracing::info!(
        version = rivet_protocol::VERSION,
        controllers = ?settings.controllers,
        devices = ?settings.devices,
        "rivet-agent starting"
    );
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fatal(&format!("cannot start the async runtime: {e}")),
    };
    runtime.block_on(agent.run(shutdown_signal()));
    tracing::info!("rivet-agent stopped");
    ExitCode::SUCCESS
}

/// Configuration errors: exit 2. Under our init, wait first so the restart loop is slow.
fn fatal(msg: &str) -> ExitCode {
    eprintln!("rivet-agent: {msg}");
    if pid1::owns_machine() {
        std::thread::sleep(Duration::from_secs(10));
    }
    ExitCode::from(2)
}

/// Ctrl-C or SIGTERM, except as the ramdisk's worker, which runs until power-off.
async fn shutdown_signal() {
    if pid1::owns_machine() {
        return std::future::pending().await;
    }
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
    tracing::info!("shutdown requested");
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn subcommand_spellings() {
        let c = Cli::try_parse_from(["rivet-agent", "--controller", "http://a,http://b"]).unwrap();
        assert!(c.command.is_none());
        assert_eq!(c.run.controller, vec!["http://a", "http://b"]);
        let c = Cli::try_parse_from([
            "rivet-agent",
            "run",
            "--controller",
            "http://a",
            "--devices",
            "/tmp/a,/tmp/b",
            "--node",
            "n1",
            "--ca",
            "/ca.pem",
            "--plugin-dir",
            "/p",
        ])
        .unwrap();
        match c.command {
            Some(Cmd::Run(r)) => {
                assert_eq!(r.local.devices.len(), 2);
                assert_eq!(r.local.plugin_dir, Some(PathBuf::from("/p")));
            }
            other => panic!("{other:?}"),
        }
        let c =
            Cli::try_parse_from(["rivet-agent", "step", "erase_devices", "--args", "{}"]).unwrap();
        assert!(matches!(c.command, Some(Cmd::Step(s)) if s.name == "erase_devices"));
        assert!(Cli::try_parse_from(["rivet-agent", "inventory", "--devices", "/x"]).is_ok());
        assert!(Cli::try_parse_from(["rivet-agent", "steps"]).is_ok());
    }

    #[test]
    fn step_args() {
        assert!(parse_step_args(None).unwrap().is_empty());
        assert_eq!(parse_step_args(Some(r#"{"a":1}"#)).unwrap()["a"], 1);
        assert!(parse_step_args(Some("[1]")).is_err());
        assert!(parse_step_args(Some("{")).is_err());
    }
}
