//! PostgreSQL backend: the database several controllers share. It behaves exactly as the
//! SQLite backend (same errors and messages, same listing order, same migration numbering), so
//! the store and API test suites run unchanged against both.
//!
//! How it differs inside:
//! - JSON fields are `JSON` columns (the text is kept verbatim, as SQLite keeps it, and the
//!   server still checks it is JSON); values cross the wire as text. Times are `TIMESTAMPTZ`
//!   (microseconds, as SQLite's text stamps), flags are `BOOLEAN`.
//! - Text sort keys compare with `COLLATE "C"` (byte order, as SQLite compares), whatever the
//!   database's locale.
//! - PostgreSQL text cannot hold NUL (U+0000): in the free-text fields (`last_error`,
//!   `maintenance_reason`, `fault`) it is stored as U+FFFD, so a tool's stray NUL cannot make
//!   a node unwritable; elsewhere it is refused with a clear error. Inside JSON it is kept.
//! - A small pool of connections, each with its own prepared-statement cache; a connection
//!   found closed (server restart) is replaced on the next checkout.
//! - [`super::open`] is synchronous, so the store owns a one-thread runtime that connects and
//!   drives the connections' sockets; queries are awaited from any runtime.
//! - Migrations run under an advisory lock in one transaction, so several controllers
//!   starting at once apply them once.
//!
//! No TLS: use it on loopback or a trusted network.

use super::decode::Decoder;
use super::{
    ConductorRecord, Node, NodeQuery, Notice, Port, PortQuery, SortDir, Store, StoreError,
    StoredCommand, NODE_SORT_KEYS,
};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rivet_protocol::agent::{Command, CommandResult};
use rivet_protocol::states::ProvisionState;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::LazyLock;
use std::time::Duration;
use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Row, Statement};

/// Schema migrations, applied in order; index + 1 is the schema version. Each entry is the
/// PostgreSQL twin of the SQLite migration with the same number.
/// The numbered migrations, oldest first (index + 1 is the schema version). Public so a test
/// can build a database at an old version and upgrade it.
pub const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE nodes (
    id BIGSERIAL PRIMARY KEY,
    uuid TEXT NOT NULL CONSTRAINT nodes_uuid_key UNIQUE,
    name TEXT CONSTRAINT nodes_name_key UNIQUE,
    driver TEXT NOT NULL,
    driver_info JSON NOT NULL,
    driver_internal_info JSON NOT NULL,
    properties JSON NOT NULL,
    instance_info JSON NOT NULL,
    instance_uuid TEXT,
    extra JSON NOT NULL,
    provision_state TEXT NOT NULL,
    target_provision_state TEXT,
    provision_updated_at TIMESTAMPTZ,
    power_state TEXT,
    target_power_state TEXT,
    maintenance BOOLEAN NOT NULL DEFAULT FALSE,
    maintenance_reason TEXT,
    fault TEXT,
    last_error TEXT,
    clean_step JSON,
    deploy_step JSON,
    reservation TEXT,
    conductor TEXT,
    automated_clean BOOLEAN,
    resource_class TEXT,
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ,
    version BIGINT NOT NULL
);
CREATE INDEX nodes_provision_state ON nodes(provision_state);
CREATE INDEX nodes_reservation ON nodes(reservation);
CREATE TABLE ports (
    id BIGSERIAL PRIMARY KEY,
    uuid TEXT NOT NULL CONSTRAINT ports_uuid_key UNIQUE,
    node_uuid TEXT NOT NULL REFERENCES nodes(uuid) ON DELETE CASCADE,
    address TEXT NOT NULL CONSTRAINT ports_address_key UNIQUE,
    pxe_enabled BOOLEAN NOT NULL,
    extra JSON NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ,
    version BIGINT NOT NULL
);
CREATE INDEX ports_node ON ports(node_uuid);
"#,
    // SQLite indexes (node_uuid, result); JSON has no btree order here, and the pending scan
    // is what needs it.
    r#"
CREATE TABLE agent_commands (
    seq BIGSERIAL PRIMARY KEY,
    id TEXT NOT NULL CONSTRAINT agent_commands_id_key UNIQUE,
    node_uuid TEXT NOT NULL REFERENCES nodes(uuid) ON DELETE CASCADE,
    command JSON NOT NULL,
    result JSON,
    cancelled BOOLEAN NOT NULL DEFAULT FALSE,
    created_at TIMESTAMPTZ NOT NULL,
    finished_at TIMESTAMPTZ
);
CREATE INDEX agent_commands_node ON agent_commands(node_uuid);
CREATE INDEX agent_commands_pending ON agent_commands(node_uuid, seq) WHERE result IS NULL;
CREATE TABLE node_inventory (
    node_uuid TEXT PRIMARY KEY REFERENCES nodes(uuid) ON DELETE CASCADE,
    inventory JSON NOT NULL,
    collected_at TIMESTAMPTZ NOT NULL
);
"#,
    r#"
ALTER TABLE nodes ADD COLUMN inspect_interface TEXT;
ALTER TABLE nodes ADD COLUMN inspection_started_at TIMESTAMPTZ;
ALTER TABLE nodes ADD COLUMN inspection_finished_at TIMESTAMPTZ;
ALTER TABLE nodes ADD COLUMN traits JSON NOT NULL DEFAULT '[]';
CREATE TABLE inspection_rules (
    seq BIGSERIAL PRIMARY KEY,
    uuid TEXT NOT NULL CONSTRAINT inspection_rules_uuid_key UNIQUE,
    priority BIGINT NOT NULL,
    body JSON NOT NULL,
    created_at TIMESTAMPTZ NOT NULL
);
"#,
    r#"
CREATE TABLE audit_log (
    seq BIGSERIAL PRIMARY KEY,
    created_at TIMESTAMPTZ NOT NULL,
    actor TEXT NOT NULL,
    source TEXT,
    method TEXT,
    path TEXT,
    node_uuid TEXT,
    action TEXT NOT NULL,
    status BIGINT,
    detail TEXT
);
CREATE INDEX audit_log_node ON audit_log(node_uuid, seq);
"#,
    r#"
CREATE TABLE conductors (
    id TEXT PRIMARY KEY,
    hostname TEXT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL,
    last_seen TIMESTAMPTZ NOT NULL
);
"#,
    r#"
ALTER TABLE nodes ADD COLUMN interfaces JSON;
"#,
    // Agent liveness outside the node's version (Store::record_liveness).
    r#"
ALTER TABLE nodes ADD COLUMN agent_last_heartbeat TIMESTAMPTZ;
ALTER TABLE nodes ADD COLUMN agent_version TEXT;
ALTER TABLE nodes ADD COLUMN step_progress JSON;
"#,
];

/// The schema version this build knows.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

// Both backends must know the same schema versions.
const _: () = assert!(SCHEMA_VERSION == super::sqlite::SCHEMA_VERSION);

/// Advisory lock key held while migrating ("rivet" in ASCII).
const MIGRATION_LOCK: i64 = 0x0072_6976_6574;

/// Connections per store; each serves one call at a time.
const POOL_SIZE: usize = 8;

/// Connect timeout when the URL does not set `connect_timeout`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Node columns in one order for INSERT, UPDATE and SELECT; `true` marks JSON columns.
const NODE_COLUMNS: [(&str, bool); 32] = [
    ("uuid", false),
    ("name", false),
    ("driver", false),
    ("driver_info", true),
    ("driver_internal_info", true),
    ("properties", true),
    ("instance_info", true),
    ("instance_uuid", false),
    ("extra", true),
    ("provision_state", false),
    ("target_provision_state", false),
    ("provision_updated_at", false),
    ("power_state", false),
    ("target_power_state", false),
    ("maintenance", false),
    ("maintenance_reason", false),
    ("fault", false),
    ("last_error", false),
    ("clean_step", true),
    ("deploy_step", true),
    ("reservation", false),
    ("conductor", false),
    ("automated_clean", false),
    ("resource_class", false),
    ("created_at", false),
    ("updated_at", false),
    ("version", false),
    ("inspect_interface", false),
    ("inspection_started_at", false),
    ("inspection_finished_at", false),
    ("traits", true),
    ("interfaces", true),
];

/// `uuid, name, …` for INSERT and UPDATE.
static NODE_NAMES: LazyLock<String> = LazyLock::new(|| {
    NODE_COLUMNS
        .iter()
        .map(|(c, _)| *c)
        .collect::<Vec<_>>()
        .join(", ")
});

/// `uuid, name, driver, driver_info::text, …`: what `node_from_row` reads.
static NODE_SELECT: LazyLock<String> = LazyLock::new(|| {
    NODE_COLUMNS
        .iter()
        .map(|(c, json)| {
            if *json {
                format!("{c}::text")
            } else {
                (*c).to_string()
            }
        })
        .chain(
            // Liveness, which node writes never touch (Store::record_liveness).
            [
                "agent_last_heartbeat",
                "agent_version",
                "step_progress::text",
            ]
            .map(str::to_string),
        )
        .collect::<Vec<_>>()
        .join(", ")
});

/// `$1, $2, $3, $4::text::json, …`: JSON travels as text, as SQLite stores it.
static NODE_PLACEHOLDERS: LazyLock<String> = LazyLock::new(|| {
    NODE_COLUMNS
        .iter()
        .enumerate()
        .map(|(i, (_, json))| {
            if *json {
                format!("${}::text::json", i + 1)
            } else {
                format!("${}", i + 1)
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
});

const PORT_SELECT: &str =
    "uuid, node_uuid, address, pxe_enabled, extra::text, created_at, updated_at, version";

/// A PostgreSQL-backed store.
pub struct PostgresStore {
    config: tokio_postgres::Config,
    /// `user@host:port/db`, for messages (never the password).
    target: String,
    slots: Vec<Mutex<Option<Conn>>>,
    next: AtomicUsize,
    /// Drives the connections.
    runtime: OwnedRuntime,
    /// Seals driver_info secrets on write, opens them on read.
    secrets: std::sync::Arc<crate::secrets::Secrets>,
}

/// A runtime that shuts down without blocking when dropped, so it may be dropped from async
/// code (a plain `Runtime` panics there).
struct OwnedRuntime(Option<tokio::runtime::Runtime>);

impl OwnedRuntime {
    fn new() -> Result<OwnedRuntime, StoreError> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("rivet-postgres")
            .enable_all()
            .build()
            .map(|rt| OwnedRuntime(Some(rt)))
            .map_err(|e| StoreError::Backend(format!("cannot start the PostgreSQL runtime: {e}")))
    }

    /// Run `fut` on this runtime and await it from any other.
    async fn run<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        let rt = self
            .0
            .as_ref()
            .ok_or_else(|| StoreError::Backend("the PostgreSQL runtime is shut down".into()))?;
        rt.spawn(fut)
            .await
            .map_err(|e| StoreError::Backend(format!("PostgreSQL task failed: {e}")))?
    }

    /// Run `fut` on this runtime and wait for it from this (non-runtime or other-runtime)
    /// thread.
    fn wait<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        let rt = self
            .0
            .as_ref()
            .ok_or_else(|| StoreError::Backend("the PostgreSQL runtime is shut down".into()))?;
        let (tx, rx) = std::sync::mpsc::channel();
        rt.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv()
            .map_err(|_| StoreError::Backend("the PostgreSQL task was interrupted".into()))?
    }
}

impl Drop for OwnedRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// One connection and the statements prepared on it.
struct Conn {
    client: Client,
    statements: HashMap<String, Statement>,
}

impl Conn {
    /// `sql` prepared once per connection.
    async fn prepare(&mut self, sql: &str) -> Result<Statement, StoreError> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(sql).await.map_err(db)?;
        self.statements.insert(sql.to_string(), s.clone());
        Ok(s)
    }

    async fn query(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let s = self.prepare(sql).await?;
        self.client.query(&s, params).await.map_err(db)
    }

    async fn query_opt(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, StoreError> {
        let s = self.prepare(sql).await?;
        self.client.query_opt(&s, params).await.map_err(db)
    }

    /// Rows changed, or the raw error (callers map unique violations).
    async fn execute(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Result<u64, tokio_postgres::Error>, StoreError> {
        let s = self.prepare(sql).await?;
        Ok(self.client.execute(&s, params).await)
    }
}

/// PostgreSQL's own message for an error.
fn db_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) if *d.code() == SqlState::CHARACTER_NOT_IN_REPERTOIRE => format!(
            "PostgreSQL cannot store this text ({}); remove NUL (U+0000) characters",
            d.message()
        ),
        Some(d) => match d.detail() {
            Some(detail) => format!("{} ({detail})", d.message()),
            None => d.message().to_string(),
        },
        None => {
            // The client's error says what failed ("error connecting to server"), its
            // sources why.
            let mut m = format!("PostgreSQL: {e}");
            let mut source = std::error::Error::source(e);
            while let Some(s) = source {
                m.push_str(&format!(": {s}"));
                source = s.source();
            }
            m
        }
    }
}

/// A database error as a store error.
fn db(e: tokio_postgres::Error) -> StoreError {
    StoreError::Backend(db_message(&e))
}

/// The constraint a unique violation hit.
fn unique_violation(e: &tokio_postgres::Error) -> Option<&str> {
    let d = e.as_db_error()?;
    (*d.code() == SqlState::UNIQUE_VIOLATION).then(|| d.constraint().unwrap_or_default())
}

fn map_to_text(m: &Map<String, Value>) -> String {
    Value::Object(m.clone()).to_string()
}

fn text_to_map(s: &str) -> Map<String, Value> {
    match serde_json::from_str(s) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

fn get<'a, T: tokio_postgres::types::FromSql<'a>>(r: &'a Row, i: usize) -> Result<T, StoreError> {
    r.try_get(i).map_err(db)
}

fn node_from_row(r: &Row) -> Result<Node, StoreError> {
    let mut d = Decoder::default();
    let mut node = Node {
        uuid: get(r, 0)?,
        name: get(r, 1)?,
        driver: get(r, 2)?,
        driver_info: d.map("driver_info", get(r, 3)?),
        driver_internal_info: d.map("driver_internal_info", get(r, 4)?),
        properties: d.map("properties", get(r, 5)?),
        instance_info: d.map("instance_info", get(r, 6)?),
        instance_uuid: get(r, 7)?,
        extra: d.map("extra", get(r, 8)?),
        provision_state: d.parse("provision_state", get(r, 9)?, ProvisionState::Error),
        target_provision_state: d.opt_parse("target_provision_state", get(r, 10)?),
        provision_updated_at: get(r, 11)?,
        power_state: d.opt_parse("power_state", get(r, 12)?),
        target_power_state: d.opt_parse("target_power_state", get(r, 13)?),
        maintenance: get(r, 14)?,
        maintenance_reason: get(r, 15)?,
        fault: get(r, 16)?,
        last_error: get(r, 17)?,
        clean_step: d.opt_value("clean_step", get(r, 18)?),
        deploy_step: d.opt_value("deploy_step", get(r, 19)?),
        reservation: get(r, 20)?,
        conductor: get(r, 21)?,
        automated_clean: get(r, 22)?,
        resource_class: get(r, 23)?,
        created_at: get(r, 24)?,
        updated_at: get(r, 25)?,
        version: get(r, 26)?,
        inspect_interface: get(r, 27)?,
        inspection_started_at: get(r, 28)?,
        inspection_finished_at: get(r, 29)?,
        traits: d.json("traits", Some(get(r, 30)?)),
        interfaces: d.json("interfaces", get(r, 31)?),
        corrupt: None,
        liveness: super::Liveness {
            last_heartbeat: get(r, 32)?,
            agent_version: get(r, 33)?,
            progress: d.opt_value("step_progress", get(r, 34)?),
        },
    };
    node.corrupt = d.finish();
    Ok(node)
}

/// Extra condition of every node UPDATE: the JSON object columns still hold objects (the
/// `JSON` type already refuses malformed text). A copy read before someone damaged the row
/// would otherwise overwrite it; this way the write conflicts, the writer reloads, and the
/// reload refuses the write as corrupt ([`Node::writable`]).
const NODE_INTACT: &str = "json_typeof(driver_info) = 'object' \
    AND json_typeof(driver_internal_info) = 'object' AND json_typeof(properties) = 'object' \
    AND json_typeof(instance_info) = 'object' AND json_typeof(extra) = 'object'";

fn port_from_row(r: &Row) -> Result<Port, StoreError> {
    Ok(Port {
        uuid: get(r, 0)?,
        node_uuid: get(r, 1)?,
        address: get(r, 2)?,
        pxe_enabled: get(r, 3)?,
        extra: text_to_map(get(r, 4)?),
        created_at: get(r, 5)?,
        updated_at: get(r, 6)?,
        version: get(r, 7)?,
    })
}

/// A query parameter that owns its value.
type Param = Box<dyn ToSql + Sync + Send>;

fn refs(values: &[Param]) -> Vec<&(dyn ToSql + Sync)> {
    values
        .iter()
        .map(|v| v.as_ref() as &(dyn ToSql + Sync))
        .collect()
}

/// A message from outside (an agent's or a BMC's error text) fit for a TEXT column:
/// PostgreSQL refuses NUL characters, which SQLite keeps, so they become U+FFFD rather than
/// make the node unwritable.
fn free_text(s: &Option<String>) -> Option<String> {
    s.as_ref().map(|s| s.replace('\0', "\u{FFFD}"))
}

/// A node's values in [`NODE_COLUMNS`] order (one list for INSERT and UPDATE), with its
/// `driver_info` as sealed text ([`crate::secrets::Secrets::seal_info`]).
fn node_values(n: &Node, driver_info: String) -> Vec<Param> {
    let state = |s: Option<&str>| -> Param { Box::new(s.map(str::to_string)) };
    vec![
        Box::new(n.uuid.clone()),
        Box::new(n.name.clone()),
        Box::new(n.driver.clone()),
        Box::new(driver_info),
        Box::new(map_to_text(&n.driver_internal_info)),
        Box::new(map_to_text(&n.properties)),
        Box::new(map_to_text(&n.instance_info)),
        Box::new(n.instance_uuid.clone()),
        Box::new(map_to_text(&n.extra)),
        Box::new(n.provision_state.as_str().to_string()),
        state(n.target_provision_state.map(|s| s.as_str())),
        Box::new(n.provision_updated_at),
        state(n.power_state.map(|s| s.as_str())),
        state(n.target_power_state.map(|s| s.as_str())),
        Box::new(n.maintenance),
        Box::new(free_text(&n.maintenance_reason)),
        Box::new(free_text(&n.fault)),
        Box::new(free_text(&n.last_error)),
        Box::new(n.clean_step.as_ref().map(|v| v.to_string())),
        Box::new(n.deploy_step.as_ref().map(|v| v.to_string())),
        Box::new(n.reservation.clone()),
        Box::new(n.conductor.clone()),
        Box::new(n.automated_clean),
        Box::new(n.resource_class.clone()),
        Box::new(n.created_at),
        Box::new(n.updated_at),
        Box::new(n.version),
        Box::new(n.inspect_interface.clone()),
        Box::new(n.inspection_started_at),
        Box::new(n.inspection_finished_at),
        Box::new(serde_json::to_string(&n.traits).unwrap_or_else(|_| "[]".into())),
        Box::new(serde_json::to_string(&n.interfaces).ok()),
    ]
}

/// The expression a listing sorts by. NULLs sort as SQLite's `COALESCE(col, '')` does
/// (first when ascending) and text compares byte-wise.
fn sort_expr(key: &str) -> Result<&'static str, StoreError> {
    if key == "id" {
        return Ok("id");
    }
    let key = NODE_SORT_KEYS
        .iter()
        .find(|k| **k == key)
        .copied()
        .ok_or_else(|| StoreError::Backend(format!("invalid sort key {key}")))?;
    Ok(match key {
        "uuid" => "uuid COLLATE \"C\"",
        "name" => "COALESCE(name, '') COLLATE \"C\"",
        "created_at" => "created_at",
        "updated_at" => "COALESCE(updated_at, '-infinity')",
        "provision_state" => "provision_state COLLATE \"C\"",
        "provision_updated_at" => "COALESCE(provision_updated_at, '-infinity')",
        "driver" => "driver COLLATE \"C\"",
        "resource_class" => "COALESCE(resource_class, '') COLLATE \"C\"",
        "power_state" => "COALESCE(power_state, '') COLLATE \"C\"",
        "maintenance" => "maintenance",
        other => {
            return Err(StoreError::Backend(format!(
                "sort key {other} has no PostgreSQL expression"
            )))
        }
    })
}

/// `user@host:port/db` of a connection config, for messages.
fn describe(config: &tokio_postgres::Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".into());
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("?");
    let dbname = config.get_dbname().unwrap_or(user);
    format!("{user}@{host}:{port}/{dbname}")
}

fn parse_url(url: &str) -> Result<tokio_postgres::Config, StoreError> {
    let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
        StoreError::Backend(format!(
            "invalid PostgreSQL URL {}: {e}",
            super::redact_url(url)
        ))
    })?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_application_name().is_none() {
        config.application_name("rivetd");
    }
    Ok(config)
}

/// Forward the `rivet` channel's notifications to `tx` until nobody listens, reconnecting
/// (with a [`Notice::Resync`], since some may have been missed) when the connection drops.
async fn listen(
    config: tokio_postgres::Config,
    target: String,
    tx: tokio::sync::mpsc::UnboundedSender<Notice>,
) {
    use tokio_postgres::AsyncMessage;
    let mut first = true;
    while !tx.is_closed() {
        if !first {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let (client, mut connection) = match config.connect(NoTls).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(database = %target, error = %db_message(&e), "cannot open the notification connection; retrying");
                first = false;
                continue;
            }
        };
        // The connection must be polled for LISTEN to complete, and afterwards to receive.
        let forward = tx.clone();
        let driver = tokio::spawn(async move {
            loop {
                match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                    Some(Ok(AsyncMessage::Notification(n))) => {
                        if let Some(notice) = Notice::decode(n.payload()) {
                            if forward.send(notice).is_err() {
                                return;
                            }
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        tracing::warn!(error = %db_message(&e), "notification connection failed");
                        return;
                    }
                    None => return,
                }
            }
        });
        if let Err(e) = client.batch_execute("LISTEN rivet").await {
            tracing::warn!(database = %target, error = %db_message(&e), "LISTEN failed; retrying");
            driver.abort();
            first = false;
            continue;
        }
        if !first && tx.send(Notice::Resync).is_err() {
            return;
        }
        first = false;
        let _ = driver.await;
        drop(client);
    }
}

/// Connect and spawn the connection's driver on the current runtime.
async fn connect(config: tokio_postgres::Config, target: String) -> Result<Conn, StoreError> {
    let (client, connection) = config.connect(NoTls).await.map_err(|e| {
        let why = db_message(&e);
        let why = why.strip_prefix("PostgreSQL: ").unwrap_or(&why);
        StoreError::Backend(format!("cannot connect to PostgreSQL {target}: {why}"))
    })?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(database = %target, error = %e, "PostgreSQL connection closed");
        }
    });
    Ok(Conn {
        client,
        statements: HashMap::new(),
    })
}

/// Apply pending migrations; refuse a schema newer than this build. Returns the versions
/// before and after.
async fn migrate(client: &mut Client) -> Result<(i64, i64), StoreError> {
    let tx = client.transaction().await.map_err(db)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(db)?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)")
        .await
        .map_err(db)?;
    let current: i64 = tx
        .query_one(
            "SELECT COALESCE(MAX(version), 0)::BIGINT FROM schema_version",
            &[],
        )
        .await
        .map_err(db)?
        .try_get(0)
        .map_err(db)?;
    if current > SCHEMA_VERSION {
        return Err(StoreError::Backend(format!(
            "database schema version {current} is newer than this rivetd knows ({SCHEMA_VERSION}); \
             run a newer rivetd"
        )));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let version = i as i64 + 1;
        tx.batch_execute(sql).await.map_err(|e| {
            StoreError::Backend(format!("migration {version} failed: {}", db_message(&e)))
        })?;
        tx.execute(
            "INSERT INTO schema_version (version) VALUES ($1)",
            &[&version],
        )
        .await
        .map_err(db)?;
        tracing::info!(version, "applied database migration");
    }
    tx.commit().await.map_err(db)?;
    Ok((current, SCHEMA_VERSION))
}

/// Run `fut` to completion on a fresh thread with its own runtime, from sync or async code.
fn on_own_thread<T: Send + 'static>(
    fut: impl Future<Output = Result<T, StoreError>> + Send + 'static,
) -> Result<T, StoreError> {
    std::thread::Builder::new()
        .name("rivet-postgres-admin".into())
        .spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| StoreError::Backend(format!("cannot start a runtime: {e}")))?
                .block_on(fut)
        })
        .map_err(|e| StoreError::Backend(format!("cannot start a thread: {e}")))?
        .join()
        .map_err(|_| StoreError::Backend("PostgreSQL admin thread panicked".into()))?
}

impl PostgresStore {
    /// Connect to `url` (`postgres://user:password@host:port/db`) and bring its schema up to
    /// date. Refuses a schema newer than this build.
    pub fn open(
        url: &str,
        secrets: std::sync::Arc<crate::secrets::Secrets>,
    ) -> Result<PostgresStore, StoreError> {
        Self::open_migrated(url, secrets).map(|(store, _)| store)
    }

    /// Apply pending migrations and return the schema versions before and after (for
    /// `rivetd db upgrade`).
    pub fn upgrade(url: &str) -> Result<(i64, i64), StoreError> {
        // Migrations touch no node: nothing is sealed or opened.
        let secrets = std::sync::Arc::new(crate::secrets::Secrets::passthrough());
        Self::open_migrated(url, secrets).map(|(_, versions)| versions)
    }

    /// The schema version of the database at `url` (0 when empty), without migrating.
    pub fn schema_version_of(url: &str) -> Result<i64, StoreError> {
        let config = parse_url(url)?;
        let target = describe(&config);
        on_own_thread(async move {
            let conn = connect(config, target).await?;
            let exists: bool = conn
                .client
                .query_one("SELECT to_regclass('schema_version') IS NOT NULL", &[])
                .await
                .map_err(db)?
                .try_get(0)
                .map_err(db)?;
            if !exists {
                return Ok(0);
            }
            conn.client
                .query_one(
                    "SELECT COALESCE(MAX(version), 0)::BIGINT FROM schema_version",
                    &[],
                )
                .await
                .map_err(db)?
                .try_get(0)
                .map_err(db)
        })
    }

    fn open_migrated(
        url: &str,
        secrets: std::sync::Arc<crate::secrets::Secrets>,
    ) -> Result<(PostgresStore, (i64, i64)), StoreError> {
        let config = parse_url(url)?;
        let target = describe(&config);
        let runtime = OwnedRuntime::new()?;
        // Connect and migrate on the store's runtime; this thread only waits, so it may be a
        // runtime's thread itself.
        let (c, t) = (config.clone(), target.clone());
        let (conn, versions) = runtime.wait(async move {
            let mut conn = connect(c, t).await?;
            let versions = migrate(&mut conn.client).await?;
            Ok((conn, versions))
        })?;
        let mut first = Some(conn);
        let slots = (0..POOL_SIZE).map(|_| Mutex::new(first.take())).collect();
        Ok((
            PostgresStore {
                config,
                target,
                slots,
                next: AtomicUsize::new(0),
                runtime,
                secrets,
            },
            versions,
        ))
    }

    /// A free connection (or the next one, waiting), reconnected if it was closed.
    async fn conn(&self) -> Result<MappedMutexGuard<'_, Conn>, StoreError> {
        let n = self.slots.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let free = (0..n).find_map(|i| self.slots[(start + i) % n].try_lock().ok());
        let mut guard: MutexGuard<'_, Option<Conn>> = match free {
            Some(g) => g,
            None => self.slots[start % n].lock().await,
        };
        let conn = match guard.take() {
            Some(c) if !c.client.is_closed() => c,
            _ => {
                let (config, target) = (self.config.clone(), self.target.clone());
                self.runtime.run(connect(config, target)).await?
            }
        };
        Ok(MutexGuard::map(guard, move |slot| slot.insert(conn)))
    }
}

#[async_trait]
impl Store for PostgresStore {
    async fn create_node(&self, node: &Node) -> Result<Node, StoreError> {
        let mut n = node.clone();
        n.version = 1;
        n.updated_at = None;
        let values = node_values(&n, self.secrets.seal_info(&n.uuid, &n.driver_info));
        let sql = format!(
            "INSERT INTO nodes ({}) VALUES ({})",
            *NODE_NAMES, *NODE_PLACEHOLDERS
        );
        let mut c = self.conn().await?;
        match c.execute(&sql, &refs(&values)).await? {
            Ok(_) => Ok(n),
            Err(e) => match unique_violation(&e) {
                Some("nodes_name_key") => Err(StoreError::Duplicate(format!(
                    "a node named {:?} already exists",
                    n.name.as_deref().unwrap_or_default()
                ))),
                Some(_) => Err(StoreError::Duplicate(format!(
                    "a node with UUID {} already exists",
                    n.uuid
                ))),
                None => Err(db(e)),
            },
        }
    }

    async fn get_node(&self, ident: &str) -> Result<Node, StoreError> {
        let sql = format!(
            "SELECT {} FROM nodes WHERE uuid = $1 OR name = $1 LIMIT 1",
            *NODE_SELECT
        );
        let row = self.conn().await?.query_opt(&sql, &[&ident]).await?;
        match row {
            Some(r) => node_from_row(&r).and_then(|n| self.secrets.open_node(n)),
            None => Err(StoreError::NotFound {
                kind: "node",
                ident: ident.to_string(),
            }),
        }
    }

    async fn list_nodes(&self, q: &NodeQuery) -> Result<Vec<Node>, StoreError> {
        let expr = sort_expr(&q.sort_key)?;
        let mut c = self.conn().await?;
        let mut wheres: Vec<String> = Vec::new();
        let mut args: Vec<Param> = Vec::new();
        if let Some(marker) = &q.marker {
            let found = c
                .query_opt("SELECT id FROM nodes WHERE uuid = $1", &[marker])
                .await?;
            let id: i64 = match found {
                Some(r) => get(&r, 0)?,
                None => {
                    return Err(StoreError::NotFound {
                        kind: "marker node",
                        ident: marker.clone(),
                    })
                }
            };
            let op = if q.sort_dir == SortDir::Asc { ">" } else { "<" };
            args.push(Box::new(id));
            wheres.push(format!(
                "({expr}, id) {op} (SELECT {expr}, id FROM nodes WHERE id = ${})",
                args.len()
            ));
        }
        if let Some(s) = q.provision_state {
            args.push(Box::new(s.as_str().to_string()));
            wheres.push(format!("provision_state = ${}", args.len()));
        }
        if let Some(m) = q.maintenance {
            args.push(Box::new(m));
            wheres.push(format!("maintenance = ${}", args.len()));
        }
        if let Some(d) = &q.driver {
            args.push(Box::new(d.clone()));
            wheres.push(format!("driver = ${}", args.len()));
        }
        if let Some(rc) = &q.resource_class {
            args.push(Box::new(rc.clone()));
            wheres.push(format!("resource_class = ${}", args.len()));
        }
        let where_sql = super::where_clause(&wheres);
        let dir = if q.sort_dir == SortDir::Asc {
            "ASC"
        } else {
            "DESC"
        };
        // LIMIT NULL is no limit, as SQLite's negative one.
        args.push(Box::new(i64::try_from(q.limit).ok()));
        let sql = format!(
            "SELECT {} FROM nodes {where_sql} ORDER BY {expr} {dir}, id {dir} LIMIT ${}",
            *NODE_SELECT,
            args.len()
        );
        let rows = c.query(&sql, &refs(&args)).await?;
        rows.iter()
            .map(|r| node_from_row(r).and_then(|n| self.secrets.open_node(n)))
            .collect()
    }

    async fn nodes_in_states(&self, states: &[ProvisionState]) -> Result<Vec<Node>, StoreError> {
        if states.is_empty() {
            return Ok(Vec::new());
        }
        let names: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
        let sql = format!(
            "SELECT {} FROM nodes WHERE provision_state = ANY($1) ORDER BY id",
            *NODE_SELECT
        );
        let rows = self.conn().await?.query(&sql, &[&names]).await?;
        rows.iter()
            .map(|r| node_from_row(r).and_then(|n| self.secrets.open_node(n)))
            .collect()
    }

    async fn update_node(&self, node: &Node) -> Result<Node, StoreError> {
        node.writable()?;
        let mut n = node.clone();
        let expected = n.version;
        n.version += 1;
        n.updated_at = Some(Utc::now());
        let mut values = node_values(&n, self.secrets.seal_info(&n.uuid, &n.driver_info));
        values.push(Box::new(expected));
        // Row-value UPDATE: the same column list and order as INSERT.
        let sql = format!(
            "UPDATE nodes SET ({}) = ({}) WHERE uuid = $1 AND version = ${} AND {NODE_INTACT}",
            *NODE_NAMES,
            *NODE_PLACEHOLDERS,
            values.len()
        );
        let mut c = self.conn().await?;
        match c.execute(&sql, &refs(&values)).await? {
            Ok(1) => Ok(n),
            Ok(_) => {
                let exists = c
                    .query_opt("SELECT 1 FROM nodes WHERE uuid = $1", &[&n.uuid])
                    .await?
                    .is_some();
                if exists {
                    Err(StoreError::Conflict {
                        kind: "node",
                        ident: n.uuid.clone(),
                        expected,
                    })
                } else {
                    Err(StoreError::NotFound {
                        kind: "node",
                        ident: n.uuid.clone(),
                    })
                }
            }
            Err(e) => match unique_violation(&e) {
                Some(_) => Err(StoreError::Duplicate(format!(
                    "a node named {:?} already exists",
                    n.name.as_deref().unwrap_or_default()
                ))),
                None => Err(db(e)),
            },
        }
    }

    async fn record_liveness(
        &self,
        uuid: &str,
        liveness: &super::Liveness,
    ) -> Result<(), StoreError> {
        let progress = liveness.progress.as_ref().map(Value::to_string);
        let n = self
            .conn()
            .await?
            .execute(
                "UPDATE nodes SET agent_last_heartbeat = $2, agent_version = $3, \
                 step_progress = $4::text::json WHERE uuid = $1",
                &[
                    &uuid,
                    &liveness.last_heartbeat,
                    &liveness.agent_version,
                    &progress,
                ],
            )
            .await?
            .map_err(db)?;
        super::one_node_row(n, uuid)
    }

    async fn delete_node(&self, uuid: &str, version: i64) -> Result<(), StoreError> {
        let mut c = self.conn().await?;
        let tx = c.client.transaction().await.map_err(db)?;
        tx.execute("DELETE FROM ports WHERE node_uuid = $1", &[&uuid])
            .await
            .map_err(db)?;
        let n = tx
            .execute(
                "DELETE FROM nodes WHERE uuid = $1 AND version = $2",
                &[&uuid, &version],
            )
            .await
            .map_err(db)?;
        if n != 1 {
            // Dropping the transaction rolls the port deletions back.
            return Err(StoreError::Conflict {
                kind: "node",
                ident: uuid.to_string(),
                expected: version,
            });
        }
        tx.commit().await.map_err(db)
    }

    async fn release_reservations(&self, conductor: &str) -> Result<u64, StoreError> {
        self.conn()
            .await?
            .execute(
                "UPDATE nodes SET reservation = NULL, version = version + 1 WHERE reservation = $1",
                &[&conductor],
            )
            .await?
            .map_err(db)
    }

    async fn conductor_heartbeat(
        &self,
        id: &str,
        hostname: &str,
        starting: bool,
    ) -> Result<(), StoreError> {
        self.conn()
            .await?
            .execute(
                "INSERT INTO conductors (id, hostname, started_at, last_seen) VALUES ($1, $2, now(), now()) \
                 ON CONFLICT (id) DO UPDATE SET hostname = EXCLUDED.hostname, last_seen = EXCLUDED.last_seen, \
                 started_at = CASE WHEN $3 THEN EXCLUDED.started_at ELSE conductors.started_at END",
                &[&id, &hostname, &starting],
            )
            .await?
            .map(|_| ())
            .map_err(db)
    }

    async fn list_conductors(&self, dead_after_s: u64) -> Result<Vec<ConductorRecord>, StoreError> {
        let dead = dead_after_s as f64;
        let rows = self
            .conn()
            .await?
            .query(
                "SELECT id, hostname, started_at, last_seen, \
                   last_seen > now() - make_interval(secs => $1) \
                 FROM conductors ORDER BY id COLLATE \"C\"",
                &[&dead],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(ConductorRecord {
                    id: get(r, 0)?,
                    hostname: get(r, 1)?,
                    started_at: get(r, 2)?,
                    last_seen: get(r, 3)?,
                    alive: get(r, 4)?,
                })
            })
            .collect()
    }

    async fn acquire_lease(
        &self,
        uuid: &str,
        id: &str,
        dead_after_s: u64,
    ) -> Result<bool, StoreError> {
        let dead = dead_after_s as f64;
        // One statement: take the node when free or its holder is dead, then say who holds
        // it (the UPDATE's own row, or the unchanged row when nothing was taken).
        let row = self
            .conn()
            .await?
            .query_opt(
                "WITH taken AS (UPDATE nodes SET version = version + 1, reservation = $2 \
                   WHERE uuid = $1 AND (reservation IS NULL OR reservation <> $2) \
                     AND (reservation IS NULL OR NOT EXISTS (SELECT 1 FROM conductors c \
                         WHERE c.id = nodes.reservation \
                           AND c.last_seen > now() - make_interval(secs => $3))) \
                   RETURNING reservation) \
                 SELECT reservation FROM taken \
                 UNION ALL SELECT reservation FROM nodes WHERE uuid = $1 AND NOT EXISTS (SELECT 1 FROM taken)",
                &[&uuid, &id, &dead],
            )
            .await?;
        Ok(match row {
            Some(r) => get::<Option<String>>(&r, 0)?.as_deref() == Some(id),
            None => false,
        })
    }

    async fn release_lease(&self, uuid: &str, id: &str) -> Result<bool, StoreError> {
        self.conn()
            .await?
            .execute(
                "UPDATE nodes SET reservation = NULL, version = version + 1 \
                 WHERE uuid = $1 AND reservation = $2",
                &[&uuid, &id],
            )
            .await?
            .map(|n| n == 1)
            .map_err(db)
    }

    async fn publish(&self, notice: &Notice) -> Result<(), StoreError> {
        self.conn()
            .await?
            .execute("SELECT pg_notify('rivet', $1)", &[&notice.encode()])
            .await?
            .map(|_| ())
            .map_err(db)
    }

    fn is_shared(&self) -> bool {
        true
    }

    fn subscribe(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<Notice>> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let rt = self.runtime.0.as_ref()?;
        rt.spawn(listen(self.config.clone(), self.target.clone(), tx));
        Some(rx)
    }

    async fn create_port(&self, port: &Port) -> Result<Port, StoreError> {
        let mut p = port.clone();
        p.version = 1;
        let sql = "INSERT INTO ports (uuid, node_uuid, address, pxe_enabled, extra, created_at, \
                   updated_at, version) VALUES ($1, $2, $3, $4, $5::text::json, $6, $7, $8)";
        let r = self
            .conn()
            .await?
            .execute(
                sql,
                &[
                    &p.uuid,
                    &p.node_uuid,
                    &p.address,
                    &p.pxe_enabled,
                    &map_to_text(&p.extra),
                    &p.created_at,
                    &p.updated_at,
                    &p.version,
                ],
            )
            .await?;
        match r {
            Ok(_) => Ok(p),
            Err(e) => match unique_violation(&e) {
                Some("ports_address_key") => Err(StoreError::Duplicate(format!(
                    "a port with MAC address {} already exists",
                    p.address
                ))),
                Some(_) => Err(StoreError::Duplicate(format!(
                    "a port with UUID {} already exists",
                    p.uuid
                ))),
                None => Err(db(e)),
            },
        }
    }

    async fn get_port(&self, uuid: &str) -> Result<Port, StoreError> {
        let sql = format!("SELECT {PORT_SELECT} FROM ports WHERE uuid = $1");
        match self.conn().await?.query_opt(&sql, &[&uuid]).await? {
            Some(r) => port_from_row(&r),
            None => Err(StoreError::NotFound {
                kind: "port",
                ident: uuid.to_string(),
            }),
        }
    }

    async fn list_ports(&self, q: &PortQuery) -> Result<Vec<Port>, StoreError> {
        let mut wheres: Vec<String> = Vec::new();
        let mut args: Vec<Param> = Vec::new();
        if let Some(n) = &q.node_uuid {
            args.push(Box::new(n.clone()));
            wheres.push(format!("node_uuid = ${}", args.len()));
        }
        if let Some(a) = &q.address {
            args.push(Box::new(a.clone()));
            wheres.push(format!("address = ${}", args.len()));
        }
        if let Some(m) = &q.marker {
            args.push(Box::new(m.clone()));
            wheres.push(format!(
                "id > (SELECT id FROM ports WHERE uuid = ${})",
                args.len()
            ));
        }
        let where_sql = super::where_clause(&wheres);
        let limit = super::page_limit(q.limit);
        args.push(Box::new(i64::try_from(limit).ok()));
        let sql = format!(
            "SELECT {PORT_SELECT} FROM ports {where_sql} ORDER BY id LIMIT ${}",
            args.len()
        );
        let rows = self.conn().await?.query(&sql, &refs(&args)).await?;
        rows.iter().map(port_from_row).collect()
    }

    async fn update_port(&self, port: &Port) -> Result<Port, StoreError> {
        let mut p = port.clone();
        let expected = p.version;
        p.version += 1;
        p.updated_at = Some(Utc::now());
        let r = self
            .conn()
            .await?
            .execute(
                "UPDATE ports SET node_uuid = $2, address = $3, pxe_enabled = $4, \
                 extra = $5::text::json, updated_at = $6, version = $7 \
                 WHERE uuid = $1 AND version = $8",
                &[
                    &p.uuid,
                    &p.node_uuid,
                    &p.address,
                    &p.pxe_enabled,
                    &map_to_text(&p.extra),
                    &p.updated_at,
                    &p.version,
                    &expected,
                ],
            )
            .await?;
        match r {
            Ok(1) => Ok(p),
            Ok(_) => Err(StoreError::Conflict {
                kind: "port",
                ident: p.uuid.clone(),
                expected,
            }),
            Err(e) => match unique_violation(&e) {
                Some(_) => Err(StoreError::Duplicate(format!(
                    "a port with MAC address {} already exists",
                    p.address
                ))),
                None => Err(db(e)),
            },
        }
    }

    async fn delete_port(&self, uuid: &str) -> Result<(), StoreError> {
        let n = self
            .conn()
            .await?
            .execute("DELETE FROM ports WHERE uuid = $1", &[&uuid])
            .await?
            .map_err(db)?;
        if n == 0 {
            Err(StoreError::NotFound {
                kind: "port",
                ident: uuid.to_string(),
            })
        } else {
            Ok(())
        }
    }

    async fn node_by_macs(&self, macs: &[String]) -> Result<Option<String>, StoreError> {
        if macs.is_empty() {
            return Ok(None);
        }
        let row = self
            .conn()
            .await?
            .query_opt(
                "SELECT node_uuid FROM ports WHERE address = ANY($1) LIMIT 1",
                &[&macs],
            )
            .await?;
        row.map(|r| get(&r, 0)).transpose()
    }

    async fn node_by_system(
        &self,
        system_uuid: Option<&str>,
        serial: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        if system_uuid.is_none() && serial.is_none() {
            return Ok(None);
        }
        // As SQLite's json_extract: the UUID compares case-insensitively whatever its JSON
        // type; the serial only as a JSON string.
        let row = self
            .conn()
            .await?
            .query_opt(
                "SELECT uuid FROM nodes WHERE \
                 ($1::text IS NOT NULL AND lower(properties ->> 'system_uuid') = lower($1::text)) \
                 OR ($2::text IS NOT NULL AND json_typeof(properties -> 'system_serial') = 'string' \
                     AND properties ->> 'system_serial' = $2::text) LIMIT 1",
                &[&system_uuid, &serial],
            )
            .await?;
        row.map(|r| get(&r, 0)).transpose()
    }

    async fn enqueue_command(&self, node_uuid: &str, command: &Command) -> Result<(), StoreError> {
        let text =
            serde_json::to_string(command).map_err(|e| StoreError::Backend(e.to_string()))?;
        let r = self
            .conn()
            .await?
            .execute(
                "INSERT INTO agent_commands (id, node_uuid, command, created_at) \
                 VALUES ($1, $2, $3::text::json, $4)",
                &[&command.id, &node_uuid, &text, &Utc::now()],
            )
            .await?;
        match r {
            Ok(_) => Ok(()),
            Err(e) => match unique_violation(&e) {
                Some(_) => Err(StoreError::Duplicate(format!(
                    "command {} already queued",
                    command.id
                ))),
                None => Err(db(e)),
            },
        }
    }

    async fn pending_commands(&self, node_uuid: &str) -> Result<Vec<Command>, StoreError> {
        let rows = self
            .conn()
            .await?
            .query(
                "SELECT command::text FROM agent_commands WHERE node_uuid = $1 \
                 AND result IS NULL AND NOT cancelled ORDER BY seq",
                &[&node_uuid],
            )
            .await?;
        rows.iter()
            .map(|r| {
                serde_json::from_str(get(r, 0)?).map_err(|e| StoreError::Backend(e.to_string()))
            })
            .collect()
    }

    async fn record_result(
        &self,
        node_uuid: &str,
        result: &CommandResult,
    ) -> Result<bool, StoreError> {
        let text = serde_json::to_string(result).map_err(|e| StoreError::Backend(e.to_string()))?;
        let mut c = self.conn().await?;
        let n = c
            .execute(
                "UPDATE agent_commands SET result = $3::text::json, finished_at = $4 \
                 WHERE node_uuid = $1 AND id = $2 AND result IS NULL",
                &[&node_uuid, &result.id, &text, &Utc::now()],
            )
            .await?
            .map_err(db)?;
        if n == 1 {
            return Ok(true);
        }
        let known = c
            .query_opt(
                "SELECT seq FROM agent_commands WHERE node_uuid = $1 AND id = $2",
                &[&node_uuid, &result.id],
            )
            .await?;
        match known {
            Some(_) => Ok(false),
            None => Err(StoreError::NotFound {
                kind: "command",
                ident: result.id.clone(),
            }),
        }
    }

    async fn command(&self, node_uuid: &str, id: &str) -> Result<StoredCommand, StoreError> {
        let row = self
            .conn()
            .await?
            .query_opt(
                "SELECT command::text, result::text FROM agent_commands \
                 WHERE node_uuid = $1 AND id = $2",
                &[&node_uuid, &id],
            )
            .await?
            .ok_or_else(|| StoreError::NotFound {
                kind: "command",
                ident: id.to_string(),
            })?;
        let json = |e: serde_json::Error| StoreError::Backend(e.to_string());
        let result: Option<&str> = get(&row, 1)?;
        Ok(StoredCommand {
            command: serde_json::from_str(get(&row, 0)?).map_err(json)?,
            result: result.map(serde_json::from_str).transpose().map_err(json)?,
        })
    }

    async fn cancel_pending(&self, node_uuid: &str) -> Result<u64, StoreError> {
        self.conn()
            .await?
            .execute(
                "UPDATE agent_commands SET cancelled = TRUE WHERE node_uuid = $1 AND result IS NULL",
                &[&node_uuid],
            )
            .await?
            .map_err(db)
    }

    async fn put_rule(&self, uuid: &str, priority: i64, body: &Value) -> Result<(), StoreError> {
        self.conn()
            .await?
            .execute(
                "INSERT INTO inspection_rules (uuid, priority, body, created_at) \
                 VALUES ($1, $2, $3::text::json, $4) \
                 ON CONFLICT (uuid) DO UPDATE SET priority = EXCLUDED.priority, body = EXCLUDED.body",
                &[&uuid, &priority, &body.to_string(), &Utc::now()],
            )
            .await?
            .map_err(db)?;
        Ok(())
    }

    async fn list_rules(&self) -> Result<Vec<Value>, StoreError> {
        let rows = self
            .conn()
            .await?
            .query(
                "SELECT body::text FROM inspection_rules ORDER BY priority DESC, seq",
                &[],
            )
            .await?;
        rows.iter()
            .map(|r| {
                serde_json::from_str(get(r, 0)?).map_err(|e| StoreError::Backend(e.to_string()))
            })
            .collect()
    }

    async fn delete_rule(&self, uuid: &str) -> Result<(), StoreError> {
        let n = self
            .conn()
            .await?
            .execute("DELETE FROM inspection_rules WHERE uuid = $1", &[&uuid])
            .await?
            .map_err(db)?;
        if n == 0 {
            return Err(StoreError::NotFound {
                kind: "inspection rule",
                ident: uuid.to_string(),
            });
        }
        Ok(())
    }

    async fn save_inventory(&self, node_uuid: &str, inventory: &Value) -> Result<(), StoreError> {
        self.conn()
            .await?
            .execute(
                "INSERT INTO node_inventory (node_uuid, inventory, collected_at) \
                 VALUES ($1, $2::text::json, $3) \
                 ON CONFLICT (node_uuid) DO UPDATE SET inventory = EXCLUDED.inventory, \
                 collected_at = EXCLUDED.collected_at",
                &[&node_uuid, &inventory.to_string(), &Utc::now()],
            )
            .await?
            .map_err(db)?;
        Ok(())
    }

    async fn get_inventory(&self, node_uuid: &str) -> Result<(Value, DateTime<Utc>), StoreError> {
        let row = self
            .conn()
            .await?
            .query_opt(
                "SELECT inventory::text, collected_at FROM node_inventory WHERE node_uuid = $1",
                &[&node_uuid],
            )
            .await?
            .ok_or_else(|| StoreError::NotFound {
                kind: "inventory of node",
                ident: node_uuid.to_string(),
            })?;
        Ok((
            serde_json::from_str(get(&row, 0)?).map_err(|e| StoreError::Backend(e.to_string()))?,
            get(&row, 1)?,
        ))
    }

    async fn append_audit(&self, e: &super::AuditEntry) -> Result<(), StoreError> {
        // Details quote error text from agents and BMCs: NULs would make the INSERT fail.
        let detail = free_text(&e.detail);
        self.conn()
            .await?
            .execute(
                "INSERT INTO audit_log (created_at, actor, source, method, path, node_uuid, \
                 action, status, detail) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                &[
                    &e.created_at,
                    &e.actor.replace('\0', "\u{FFFD}"),
                    &e.source,
                    &e.method,
                    &free_text(&e.path),
                    &free_text(&e.node_uuid),
                    &e.action.replace('\0', "\u{FFFD}"),
                    &e.status.map(i64::from),
                    &detail,
                ],
            )
            .await?
            .map_err(db)?;
        Ok(())
    }

    async fn list_audit(
        &self,
        q: &super::AuditQuery,
    ) -> Result<Vec<super::AuditEntry>, StoreError> {
        let (cmp, dir) = match q.sort_dir {
            SortDir::Asc => (">", "ASC"),
            SortDir::Desc => ("<", "DESC"),
        };
        let mut wheres: Vec<String> = Vec::new();
        let mut args: Vec<Param> = Vec::new();
        if let Some(n) = &q.node_uuid {
            args.push(Box::new(n.clone()));
            wheres.push(format!("node_uuid = ${}", args.len()));
        }
        if let Some(m) = q.marker {
            args.push(Box::new(m));
            wheres.push(format!("seq {cmp} ${}", args.len()));
        }
        let where_sql = super::where_clause(&wheres);
        let limit = super::page_limit(q.limit);
        args.push(Box::new(i64::try_from(limit).ok()));
        let sql = format!(
            "SELECT seq, created_at, actor, source, method, path, node_uuid, action, status, \
             detail FROM audit_log {where_sql} ORDER BY seq {dir} LIMIT ${}",
            args.len()
        );
        let rows = self.conn().await?.query(&sql, &refs(&args)).await?;
        rows.iter()
            .map(|r| {
                Ok(super::AuditEntry {
                    seq: get(r, 0)?,
                    created_at: get(r, 1)?,
                    actor: get(r, 2)?,
                    source: get(r, 3)?,
                    method: get(r, 4)?,
                    path: get(r, 5)?,
                    node_uuid: get(r, 6)?,
                    action: get(r, 7)?,
                    status: get::<Option<i64>>(r, 8)?.and_then(|s| u16::try_from(s).ok()),
                    detail: get(r, 9)?,
                })
            })
            .collect()
    }
}

/// A throw-away database on a PostgreSQL server, for tests and benchmarks that each need an
/// empty one: created on [`ScratchDatabase::create`], dropped (its connections cut) on drop.
pub struct ScratchDatabase {
    /// The server's URL as given (parsed again on drop: a `Config` is large).
    admin_url: String,
    name: String,
    url: String,
}

impl ScratchDatabase {
    /// Create `{prefix}_{random}` on the server of `base_url` (whose role needs CREATEDB).
    /// `prefix` is lower-case letters, digits and `_`.
    pub fn create(base_url: &str, prefix: &str) -> Result<ScratchDatabase, StoreError> {
        if prefix.is_empty()
            || !prefix
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(StoreError::Backend(format!(
                "scratch database prefix {prefix:?} must be lower-case letters, digits and _"
            )));
        }
        let admin = parse_url(base_url)?;
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        let url = with_dbname(base_url, &name)?;
        let (config, target, n) = (admin.clone(), describe(&admin), name.clone());
        on_own_thread(async move {
            let conn = connect(config, target).await?;
            conn.client
                .batch_execute(&format!("CREATE DATABASE \"{n}\""))
                .await
                .map_err(db)
        })?;
        Ok(ScratchDatabase {
            admin_url: base_url.to_string(),
            name,
            url,
        })
    }

    /// The URL of the new database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        let n = self.name.clone();
        let r = parse_url(&self.admin_url).and_then(|config| {
            let target = describe(&config);
            on_own_thread(async move {
                let conn = connect(config, target).await?;
                conn.client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS \"{n}\" WITH (FORCE)"))
                    .await
                    .map_err(db)
            })
        });
        if let Err(e) = r {
            tracing::warn!(database = %self.name, error = %e, "cannot drop scratch database");
        }
    }
}

/// `url` with its database name replaced by `dbname`.
fn with_dbname(url: &str, dbname: &str) -> Result<String, StoreError> {
    let Some(scheme_end) = url.find("://") else {
        // key=value form: a later key wins.
        return Ok(format!("{url} dbname={dbname}"));
    };
    let rest_start = scheme_end + 3;
    let (base, query) = match url[rest_start..].find('?') {
        Some(q) => url.split_at(rest_start + q),
        None => (url, ""),
    };
    let authority_end = base[rest_start..]
        .find('/')
        .map(|i| rest_start + i)
        .unwrap_or(base.len());
    Ok(format!("{}/{dbname}{query}", &base[..authority_end]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dbname_replaced() {
        let f = |u| with_dbname(u, "x").expect("url");
        assert_eq!(f("postgres://a:b@h:1/db"), "postgres://a:b@h:1/x");
        assert_eq!(f("postgres://a:b@h:1"), "postgres://a:b@h:1/x");
        assert_eq!(
            f("postgresql://h/db?sslmode=disable"),
            "postgresql://h/x?sslmode=disable"
        );
        assert_eq!(f("host=h user=u"), "host=h user=u dbname=x");
    }

    #[test]
    fn every_sort_key_has_an_expression() {
        for k in NODE_SORT_KEYS {
            sort_expr(k).expect("expression");
        }
        assert!(sort_expr("nope").is_err());
    }

    #[test]
    fn column_lists_agree() {
        let n = Node::new("u".into(), "d".into());
        assert_eq!(node_values(&n, String::new()).len(), NODE_COLUMNS.len());
        assert!(NODE_PLACEHOLDERS.contains("$31::text::json"));
    }
}
