//! rivetd: parse the command line, load the config, run.

use anyhow::Context;
use clap::{Parser, Subcommand};
use rivet_model::config::Config;
use rivet_support::credentials::hash_secret;
use std::io::Read;

/// mimalloc instead of glibc malloc: rivetd's request path allocates many short-lived JSON
/// maps on many threads (store calls wait under `block_in_place`, which adds threads), and
/// glibc keeps an arena per thread whose freed memory it seldom returns (docs/numbers.md:
/// peak RSS with 10,000 held long polls).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "rivetd",
    version,
    about = "Rivet controller: nodes, provision state machine, BMCs, API"
)]
struct Cli {
    /// Address to listen on (ADDR:PORT).
    #[arg(long, env = "RIVETD_LISTEN")]
    listen: Option<String>,
    /// Database URL: sqlite:PATH or postgres://USER:PASSWORD@HOST:PORT/DB.
    #[arg(long, env = "RIVETD_DB")]
    db: Option<String>,
    /// Serve admin endpoints without credentials (loopback only).
    #[arg(long)]
    no_auth: bool,
    /// TOML configuration file.
    #[arg(long, env = "RIVETD_CONFIG")]
    config: Option<std::path::PathBuf>,
    /// This controller's id (default: host name).
    #[arg(long, env = "RIVETD_CONDUCTOR_ID")]
    conductor_id: Option<String>,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
    /// Print the effective configuration and exit.
    #[arg(long)]
    print_config: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// The provision state machine.
    Fsm {
        /// Print it as Graphviz DOT.
        #[arg(long)]
        dot: bool,
    },
    /// Database maintenance.
    Db {
        #[command(subcommand)]
        command: DbCommand,
    },
    /// TLS helpers.
    Tls {
        #[command(subcommand)]
        command: TlsCommand,
    },
    /// Hash a secret (token or password) for the [auth] config; reads stdin when omitted.
    HashSecret {
        /// The secret.
        secret: Option<String>,
    },
    /// The key that seals BMC passwords in the database.
    Secrets {
        #[command(subcommand)]
        command: SecretsCommand,
    },
    /// Print the OpenAPI 3.1 document of the API (what docs/openapi.json holds).
    Openapi,
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completion {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write man pages (rivetd.1 and one per subcommand) into DIR (packaging).
    #[command(hide = true)]
    Man {
        /// Output directory.
        dir: std::path::PathBuf,
    },
}

#[derive(Subcommand)]
enum SecretsCommand {
    /// Write a new random key (64 hex characters) to PATH with mode 0600, for [secrets]
    /// key_file. Never overwrites a file.
    InitKey {
        /// Where to write it.
        path: std::path::PathBuf,
    },
    /// Re-seal every node's driver_info secrets with the key in NEW_KEY_FILE (the configured
    /// key, or previous_key_file, opens the old values; values still in clear are sealed
    /// too). Run it with rivetd stopped, then set key_file to the new file. Running it again
    /// changes nothing. With the configured key as NEW_KEY_FILE it rewrites values older
    /// versions sealed (v1, AES-256-GCM) in the current format (v2, AES-256-GCM-SIV).
    Rotate {
        /// The new key.
        #[arg(long, value_name = "PATH")]
        new_key_file: std::path::PathBuf,
        /// Database URL (default: --db, RIVETD_DB or the config file's `db`).
        #[arg(long = "db", value_name = "URL")]
        url: Option<String>,
    },
}

#[derive(Subcommand)]
enum DbCommand {
    /// Apply pending schema migrations, without serving, and exit. Run it with the services
    /// stopped or before starting a newer rivetd; refuses a schema newer than this build.
    Upgrade {
        /// Database URL (default: --db, RIVETD_DB or the config file's `db`).
        #[arg(long = "db", value_name = "URL")]
        url: Option<String>,
    },
}

#[derive(Subcommand)]
enum TlsCommand {
    /// Make a lab CA and a server certificate in DIR (ca.pem, ca-key.pem, server.pem,
    /// server-key.pem); point tls_cert/tls_key at the server files and give clients ca.pem.
    Init {
        /// Output directory.
        dir: std::path::PathBuf,
        /// Extra host names or IP addresses the certificate must name (repeatable).
        #[arg(long = "name")]
        names: Vec<String>,
    },
}

fn load(cli: &Cli) -> anyhow::Result<Config> {
    let mut config = match &cli.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read config file {}", path.display()))?;
            Config::from_toml(&text)
                .map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))?
        }
        None => Config::default(),
    };
    if let Some(v) = &cli.listen {
        config.listen = v.clone();
    }
    if let Some(v) = &cli.db {
        config.db = v.clone();
    }
    if cli.no_auth {
        config.no_auth = true;
    }
    if let Some(v) = &cli.conductor_id {
        config.conductor_id = v.clone();
    }
    if cli.log_json {
        config.log_json = true;
    }
    Ok(config)
}

fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RIVET_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match &cli.command {
        Some(Command::Fsm { dot }) => {
            if *dot {
                print!("{}", rivet_model::fsm::to_dot());
            } else {
                for t in rivet_model::fsm::TABLE {
                    println!(
                        "{:>16} --{:<9}--> {} ({:?})",
                        t.from.as_str(),
                        t.event.as_str(),
                        t.to,
                        t.by
                    );
                }
            }
            return Ok(());
        }
        Some(Command::Tls {
            command: TlsCommand::Init { dir, names },
        }) => {
            rivet_support::tls::init(dir, names)?;
            println!(
                "wrote {0}/ca.pem, {0}/server.pem and their keys; set tls_cert = \"{0}/server.pem\" and tls_key = \"{0}/server-key.pem\", and give agents and the CLI {0}/ca.pem (rivet.ca=, RIVET_CA)",
                dir.display()
            );
            return Ok(());
        }
        Some(Command::HashSecret { secret }) => {
            let secret = match secret {
                Some(s) => s.clone(),
                None => {
                    let mut s = String::new();
                    std::io::stdin().read_to_string(&mut s)?;
                    s.trim_end_matches('\n').to_string()
                }
            };
            println!("{}", hash_secret(&secret).map_err(anyhow::Error::msg)?);
            return Ok(());
        }
        Some(Command::Db {
            command: DbCommand::Upgrade { url },
        }) => {
            let mut config = load(&cli)?;
            if let Some(url) = url {
                config.db = url.clone();
            }
            init_logging(config.log_json);
            let shown = rivet_store::redact_url(&config.db);
            let (before, after) = rivet_store::upgrade(&config.db)
                .map_err(|e| anyhow::anyhow!("upgrading database {shown}: {e}"))?;
            if before == after {
                println!("database {shown} is at schema version {after}: nothing to do");
            } else {
                println!("database {shown} upgraded from schema version {before} to {after}");
            }
            return Ok(());
        }
        Some(Command::Secrets { command }) => return secrets(&cli, command),
        Some(Command::Openapi) => {
            print!("{}", rivet_controller::api::openapi::json());
            return Ok(());
        }
        Some(Command::Completion { shell }) => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(*shell, &mut cmd, "rivetd", &mut std::io::stdout());
            return Ok(());
        }
        Some(Command::Man { dir }) => {
            std::fs::create_dir_all(dir)?;
            clap_mangen::generate_to(<Cli as clap::CommandFactory>::command(), dir)
                .with_context(|| format!("writing man pages to {}", dir.display()))?;
            return Ok(());
        }
        None => {}
    }
    let config = load(&cli)?;
    if cli.print_config {
        // The database URL may carry a password: show it redacted, like every other output.
        let mut shown = config.clone();
        shown.db = rivet_store::redact_url(&shown.db);
        print!("{}", shown.to_toml());
        return Ok(());
    }
    init_logging(config.log_json);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(rivet_controller::server::serve(config))
}

/// `rivetd secrets …`.
fn secrets(cli: &Cli, command: &SecretsCommand) -> anyhow::Result<()> {
    use rivet_store::sealing::{holds_sealed_values, rotate};
    use rivet_support::secrets::{Key, Secrets};
    match command {
        SecretsCommand::InitKey { path } => {
            let key = Key::generate()?;
            key.write_new(path)?;
            println!(
                "wrote key {} to {} (mode 0600); set [secrets] key_file = {:?} and keep a copy \
                 with the database backups",
                key.id(),
                path.display(),
                path.display().to_string()
            );
        }
        SecretsCommand::Rotate { new_key_file, url } => {
            let mut config = load(cli)?;
            if let Some(url) = url {
                config.db = url.clone();
            }
            init_logging(config.log_json);
            let shown = rivet_store::redact_url(&config.db);
            // The old key must exist already: rotating never makes one up.
            let old =
                Secrets::from_config(&config.secrets, &config.db, false, &holds_sealed_values)?;
            let new = Key::load(new_key_file)?;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("cannot start the async runtime")?;
            let r = runtime
                .block_on(rotate(&config.db, &old, &new))
                .map_err(|e| anyhow::anyhow!("rotating the secrets of {shown}: {e}"))?;
            println!(
                "re-sealed {} secrets in {} of {} nodes with key {} ({} of them were stored in clear)",
                r.fields_resealed,
                r.nodes_changed,
                r.nodes_checked,
                new.id(),
                r.fields_were_clear
            );
            println!(
                "now set [secrets] key_file = {:?} (or RIVET_SECRETS_KEY) and start rivetd; \
                 keep the old key until then",
                new_key_file.display().to_string()
            );
        }
    }
    Ok(())
}
