//! `rivet`: the admin command line for rivetd (Ironic's API, Ironic's vocabulary).
//!
//! Thin: parse the command line, build the client, dispatch to `node`/`port`. Errors print as
//! `error: <message>` on stderr with exit status 1.

mod allocation;
mod audit;
mod chassis;
mod client;
mod conductor;
mod console;
mod demo;
mod driver;
mod image_cache;
mod inspection_rule;
mod lifecycle;
mod metrics;
mod node;
mod node_logs;
mod node_resources;
mod output;
mod port;
mod portgroup;
mod runbook;
mod shard;
mod template;
mod wait;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "rivet",
    version,
    about = "Rivet admin CLI: enrol, clean and provision bare-metal nodes"
)]
struct Cli {
    /// rivetd base URL.
    #[arg(long, global = true, env = "RIVET_URL", default_value = client::DEFAULT_URL)]
    url: String,
    /// Print raw JSON responses instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Nodes: enrolment, state machine, power, maintenance.
    #[command(subcommand)]
    Node(node::NodeCmd),
    /// Ports: a node's NICs.
    #[command(subcommand)]
    Port(port::PortCmd),
    /// Port groups: bonds of a node's ports.
    #[command(subcommand)]
    Portgroup(portgroup::PortgroupCmd),
    /// Chassis: Ironic's grouping of nodes.
    #[command(subcommand)]
    Chassis(chassis::ChassisCmd),
    /// Volume connectors and targets (API 1.32): stored and shown; Rivet does not boot
    /// from volumes.
    #[command(subcommand)]
    Volume(node_resources::VolumeCmd),
    /// Inspection rules (API 1.96): conditions and actions run after every inspection.
    #[command(subcommand)]
    InspectionRule(inspection_rule::RuleCmd),
    /// Discovery: nodes enrolled for unknown machines that booted the ramdisk.
    #[command(subcommand)]
    Discovery(inspection_rule::DiscoveryCmd),
    /// Allocations (API 1.52): ask for a node of a resource class and traits.
    #[command(subcommand)]
    Allocation(allocation::AllocationCmd),
    /// Deploy templates (API 1.55): deploy steps chosen by an instance's traits.
    #[command(subcommand)]
    DeployTemplate(template::TemplateCmd),
    /// Runbooks (API 1.92): named steps run by a manual clean.
    #[command(subcommand)]
    Runbook(runbook::RunbookCmd),
    /// The audit trail (admin only): requests, refusals and provision transitions.
    Audit(audit::AuditArgs),
    /// Controllers sharing the database (several rivetd on PostgreSQL).
    #[command(subcommand)]
    Conductor(conductor::ConductorCmd),
    /// Hardware types (Ironic's drivers): hosts, interfaces, driver_info keys.
    #[command(subcommand)]
    Driver(driver::DriverCmd),
    /// Shards (API 1.82): how many nodes each holds.
    #[command(subcommand)]
    Shard(shard::ShardCmd),
    /// rivetd's image cache (`image_download_source = "local"`): list, purge.
    #[command(subcommand)]
    ImageCache(image_cache::ImageCacheCmd),
    /// rivetd's Prometheus metrics (`GET /metrics`; a metrics or admin token).
    Metrics(metrics::MetricsArgs),
    /// The whole flow on this machine: rivetd, a fake-hardware node, a local agent on
    /// sparse-file disks; automated then manual cleaning.
    Demo(demo::DemoArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completion {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write man pages (rivet.1 and one per subcommand) into DIR (packaging).
    #[command(hide = true)]
    Man {
        /// Output directory.
        dir: std::path::PathBuf,
    },
}

/// The admin API client for `--url` / `RIVET_URL`, with `RIVET_TOKEN` when set.
fn client(url: &str) -> anyhow::Result<client::Client> {
    let token = std::env::var("RIVET_TOKEN").ok();
    Ok(client::Client::new(url, token)?)
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let out = output::Output { json: cli.json };
    match cli.command {
        Command::Node(cmd) => node::run(cmd, &client(&cli.url)?, out).await,
        Command::Port(cmd) => port::run(cmd, &client(&cli.url)?, out).await,
        Command::Portgroup(cmd) => portgroup::run(cmd, &client(&cli.url)?, out).await,
        Command::Chassis(cmd) => chassis::run(cmd, &client(&cli.url)?, out).await,
        Command::Volume(cmd) => node_resources::run_volume(cmd, &client(&cli.url)?, out).await,
        Command::InspectionRule(cmd) => inspection_rule::run(cmd, &client(&cli.url)?, out).await,
        Command::Discovery(cmd) => {
            inspection_rule::run_discovery(cmd, &client(&cli.url)?, out).await
        }
        Command::Allocation(cmd) => allocation::run(cmd, &client(&cli.url)?, out).await,
        Command::DeployTemplate(cmd) => template::run(cmd, &client(&cli.url)?, out).await,
        Command::Runbook(cmd) => runbook::run(cmd, &client(&cli.url)?, out).await,
        Command::Audit(a) => audit::run(a, &client(&cli.url)?, out).await,
        Command::Conductor(cmd) => conductor::run(cmd, &client(&cli.url)?, out).await,
        Command::Driver(cmd) => driver::run(cmd, &client(&cli.url)?, out).await,
        Command::Shard(cmd) => shard::run(cmd, &client(&cli.url)?, out).await,
        Command::ImageCache(cmd) => image_cache::run(cmd, &client(&cli.url)?, out).await,
        Command::Metrics(a) => metrics::run(a, &client(&cli.url)?).await,
        // The demo starts its own rivetd: the caller's URL and token do not apply.
        Command::Demo(a) => demo::run(a).await,
        Command::Completion { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "rivet", &mut std::io::stdout());
            Ok(())
        }
        Command::Man { dir } => {
            std::fs::create_dir_all(&dir)?;
            clap_mangen::generate_to(<Cli as clap::CommandFactory>::command(), &dir)?;
            Ok(())
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn maintenance_takes_node_then_action() {
        let cli = Cli::try_parse_from([
            "rivet",
            "node",
            "maintenance",
            "n1",
            "set",
            "--reason",
            "disk",
        ]);
        assert!(cli.is_ok(), "{cli:?}");
        let cli = Cli::try_parse_from(["rivet", "node", "power", "n1", "reboot", "--json"]);
        assert!(cli.is_ok(), "{cli:?}");
    }
}
