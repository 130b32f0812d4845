//! SQLite backend: one file in WAL mode, migrations embedded and run at open.
//!
//! One connection writes (SQLite serialises writers anyway) and a few read-only connections
//! read beside it: in WAL mode a reader sees the last commit and never waits for the writer,
//! so the periodic scan reading every waiting node does not hold up heartbeat writes. Each
//! call blocks its thread for tens of microseconds to a few milliseconds; on the
//! multi-thread runtime it runs under `block_in_place`, so tokio moves the worker's other
//! tasks (held long polls, other requests) to another thread meanwhile. JSON fields are
//! stored as text.

use super::decode::Decoder;
use super::{
    ConductorRecord, Node, NodeQuery, Port, PortQuery, SortDir, Store, StoreError, StoredCommand,
    NODE_SORT_KEYS,
};
use async_trait::async_trait;
use chrono::{DateTime, SecondsFormat, Utc};
use rivet_protocol::agent::{Command, CommandResult};
use rivet_protocol::states::ProvisionState;
use rusqlite::{params, Connection, OptionalExtension, Row};
use serde_json::{Map, Value};
use std::sync::{Mutex, MutexGuard};

/// Schema migrations, applied in order; index + 1 is the schema version.
/// The numbered migrations, oldest first (index + 1 is the schema version). Public so a test
/// can build a database at an old version and upgrade it.
pub const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE nodes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    uuid TEXT NOT NULL UNIQUE,
    name TEXT UNIQUE,
    driver TEXT NOT NULL,
    driver_info TEXT NOT NULL,
    driver_internal_info TEXT NOT NULL,
    properties TEXT NOT NULL,
    instance_info TEXT NOT NULL,
    instance_uuid TEXT,
    extra TEXT NOT NULL,
    provision_state TEXT NOT NULL,
    target_provision_state TEXT,
    provision_updated_at TEXT,
    power_state TEXT,
    target_power_state TEXT,
    maintenance INTEGER NOT NULL DEFAULT 0,
    maintenance_reason TEXT,
    fault TEXT,
    last_error TEXT,
    clean_step TEXT,
    deploy_step TEXT,
    reservation TEXT,
    conductor TEXT,
    automated_clean INTEGER,
    resource_class TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT,
    version INTEGER NOT NULL
);
CREATE INDEX nodes_provision_state ON nodes(provision_state);
CREATE INDEX nodes_reservation ON nodes(reservation);
CREATE TABLE ports (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    uuid TEXT NOT NULL UNIQUE,
    node_uuid TEXT NOT NULL REFERENCES nodes(uuid) ON DELETE CASCADE,
    address TEXT NOT NULL UNIQUE,
    pxe_enabled INTEGER NOT NULL,
    extra TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT,
    version INTEGER NOT NULL
);
CREATE INDEX ports_node ON ports(node_uuid);
"#,
    r#"
CREATE TABLE agent_commands (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    node_uuid TEXT NOT NULL REFERENCES nodes(uuid) ON DELETE CASCADE,
    command TEXT NOT NULL,
    result TEXT,
    cancelled INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL,
    finished_at TEXT
);
CREATE INDEX agent_commands_node ON agent_commands(node_uuid, result);
CREATE TABLE node_inventory (
    node_uuid TEXT PRIMARY KEY REFERENCES nodes(uuid) ON DELETE CASCADE,
    inventory TEXT NOT NULL,
    collected_at TEXT NOT NULL
);
"#,
    r#"
ALTER TABLE nodes ADD COLUMN inspect_interface TEXT;
ALTER TABLE nodes ADD COLUMN inspection_started_at TEXT;
ALTER TABLE nodes ADD COLUMN inspection_finished_at TEXT;
ALTER TABLE nodes ADD COLUMN traits TEXT NOT NULL DEFAULT '[]';
CREATE TABLE inspection_rules (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    uuid TEXT NOT NULL UNIQUE,
    priority INTEGER NOT NULL,
    body TEXT NOT NULL,
    created_at TEXT NOT NULL
);
"#,
    // The audit trail: state-changing admin requests and the provision transitions they (or
    // the conductor) cause. Append-only.
    r#"
CREATE TABLE audit_log (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at TEXT NOT NULL,
    actor TEXT NOT NULL,
    source TEXT,
    method TEXT,
    path TEXT,
    node_uuid TEXT,
    action TEXT NOT NULL,
    status INTEGER,
    detail TEXT
);
CREATE INDEX audit_log_node ON audit_log(node_uuid, seq);
"#,
    // Several controllers on one database: their registration heartbeats (a node's
    // reservation lives as long as its holder's heartbeat).
    r#"
CREATE TABLE conductors (
    id TEXT PRIMARY KEY,
    hostname TEXT NOT NULL,
    started_at TEXT NOT NULL,
    last_seen TEXT NOT NULL
);
"#,
    // Per-node interface implementations (boot, deploy, …) as one JSON object; NULL = the
    // hardware type's defaults.
    r#"
ALTER TABLE nodes ADD COLUMN interfaces TEXT;
"#,
    // Agent liveness outside the node's version (Store::record_liveness).
    r#"
ALTER TABLE nodes ADD COLUMN agent_last_heartbeat TEXT;
ALTER TABLE nodes ADD COLUMN agent_version TEXT;
ALTER TABLE nodes ADD COLUMN step_progress TEXT;
"#,
];

/// The schema version this build knows.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// A SQLite-backed store.
pub struct SqliteStore {
    /// The one connection that writes.
    conn: Mutex<Connection>,
    /// Read-only connections (none: reads go to the writer).
    readers: Vec<Mutex<Connection>>,
    /// Where the next read starts looking for a free reader.
    next_reader: std::sync::atomic::AtomicUsize,
    /// Seals driver_info secrets on write, opens them on read.
    secrets: std::sync::Arc<crate::secrets::Secrets>,
}

fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

fn ts(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, false)
}

fn parse_ts(s: Option<String>) -> Option<DateTime<Utc>> {
    s.and_then(|s| DateTime::parse_from_rfc3339(&s).ok())
        .map(|t| t.with_timezone(&Utc))
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

/// The node columns a node write sets, in one order for INSERT and UPDATE.
macro_rules! node_columns {
    () => {
        "uuid, name, driver, driver_info, driver_internal_info, properties, \
    instance_info, instance_uuid, extra, provision_state, target_provision_state, \
    provision_updated_at, power_state, target_power_state, maintenance, maintenance_reason, \
    fault, last_error, clean_step, deploy_step, reservation, conductor, automated_clean, \
    resource_class, created_at, updated_at, version, inspect_interface, inspection_started_at, \
    inspection_finished_at, traits, interfaces"
    };
}
const NODE_COLUMNS: &str = node_columns!();

/// What a node read selects: [`NODE_COLUMNS`], then the liveness columns, which node
/// writes never touch.
const NODE_SELECT: &str = concat!(
    node_columns!(),
    ", agent_last_heartbeat, agent_version, step_progress"
);

fn node_from_row(r: &Row<'_>) -> rusqlite::Result<Node> {
    let mut d = Decoder::default();
    let text = |i: usize| r.get::<_, String>(i);
    let opt = |i: usize| r.get::<_, Option<String>>(i);
    let mut node = Node {
        uuid: r.get(0)?,
        name: r.get(1)?,
        driver: r.get(2)?,
        driver_info: d.map("driver_info", &text(3)?),
        driver_internal_info: d.map("driver_internal_info", &text(4)?),
        properties: d.map("properties", &text(5)?),
        instance_info: d.map("instance_info", &text(6)?),
        instance_uuid: r.get(7)?,
        extra: d.map("extra", &text(8)?),
        provision_state: d.parse("provision_state", &text(9)?, ProvisionState::Error),
        target_provision_state: d.opt_parse("target_provision_state", opt(10)?.as_deref()),
        provision_updated_at: parse_ts(r.get(11)?),
        power_state: d.opt_parse("power_state", opt(12)?.as_deref()),
        target_power_state: d.opt_parse("target_power_state", opt(13)?.as_deref()),
        maintenance: r.get(14)?,
        maintenance_reason: r.get(15)?,
        fault: r.get(16)?,
        last_error: r.get(17)?,
        clean_step: d.opt_value("clean_step", opt(18)?.as_deref()),
        deploy_step: d.opt_value("deploy_step", opt(19)?.as_deref()),
        reservation: r.get(20)?,
        conductor: r.get(21)?,
        automated_clean: r.get(22)?,
        resource_class: r.get(23)?,
        created_at: parse_ts(r.get(24)?).unwrap_or_else(Utc::now),
        updated_at: parse_ts(r.get(25)?),
        version: r.get(26)?,
        inspect_interface: r.get(27)?,
        inspection_started_at: parse_ts(r.get(28)?),
        inspection_finished_at: parse_ts(r.get(29)?),
        traits: d.json("traits", Some(text(30)?.as_str())),
        interfaces: d.json("interfaces", opt(31)?.as_deref()),
        corrupt: None,
        liveness: super::Liveness {
            last_heartbeat: parse_ts(r.get(32)?),
            agent_version: r.get(33)?,
            progress: d.opt_value("step_progress", opt(34)?.as_deref()),
        },
    };
    node.corrupt = d.finish();
    Ok(node)
}

/// Extra condition of every node UPDATE: the JSON object columns still hold objects. A
/// copy read before someone damaged the row (by hand, or a failing disk) would otherwise
/// overwrite the damaged bytes with its stale values; this way the write conflicts, the
/// writer reloads, and the reload refuses the write as corrupt ([`Node::writable`]).
const NODE_INTACT: &str = "json_type(CASE WHEN json_valid(driver_info) THEN driver_info END) IS 'object' \
    AND json_type(CASE WHEN json_valid(driver_internal_info) THEN driver_internal_info END) IS 'object' \
    AND json_type(CASE WHEN json_valid(properties) THEN properties END) IS 'object' \
    AND json_type(CASE WHEN json_valid(instance_info) THEN instance_info END) IS 'object' \
    AND json_type(CASE WHEN json_valid(extra) THEN extra END) IS 'object'";

const PORT_COLUMNS: &str =
    "uuid, node_uuid, address, pxe_enabled, extra, created_at, updated_at, version";

fn port_from_row(r: &Row<'_>) -> rusqlite::Result<Port> {
    Ok(Port {
        uuid: r.get(0)?,
        node_uuid: r.get(1)?,
        address: r.get(2)?,
        pxe_enabled: r.get(3)?,
        extra: text_to_map(&r.get::<_, String>(4)?),
        created_at: parse_ts(r.get(5)?).unwrap_or_else(Utc::now),
        updated_at: parse_ts(r.get(6)?),
        version: r.get(7)?,
    })
}

fn unique_violation(e: &rusqlite::Error) -> Option<String> {
    match e {
        rusqlite::Error::SqliteFailure(f, Some(msg))
            if f.code == rusqlite::ErrorCode::ConstraintViolation && msg.contains("UNIQUE") =>
        {
            Some(msg.clone())
        }
        _ => None,
    }
}

impl SqliteStore {
    /// Open (creating if needed) the database file and bring its schema up to date.
    pub fn open(
        path: &str,
        secrets: std::sync::Arc<crate::secrets::Secrets>,
    ) -> Result<SqliteStore, StoreError> {
        Self::open_with(
            path,
            secrets,
            crate::config::StoreConfig::default().sqlite_readers,
        )
    }

    /// [`SqliteStore::open`] with `readers` read-only connections beside the writer (0: all
    /// calls on the writer). An in-memory database has no readers: each connection would
    /// see a database of its own.
    pub fn open_with(
        path: &str,
        secrets: std::sync::Arc<crate::secrets::Secrets>,
        readers: usize,
    ) -> Result<SqliteStore, StoreError> {
        let conn = connect(path)?;
        migrate(&conn)?;
        let in_memory = path.is_empty() || path == ":memory:" || path.contains("mode=memory");
        let readers = if in_memory { 0 } else { readers };
        let readers = (0..readers)
            .map(|_| connect_reader(path).map(Mutex::new))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(SqliteStore {
            conn: Mutex::new(conn),
            readers,
            next_reader: std::sync::atomic::AtomicUsize::new(0),
            secrets,
        })
    }

    /// Run `f` on the writer connection: at once on this thread when it is free (a write
    /// takes microseconds), else wait for it under `block_in_place`.
    fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if let Ok(mut conn) = self.conn.try_lock() {
            return f(&mut conn);
        }
        blocking(|| {
            let mut conn = lock(&self.conn)?;
            f(&mut conn)
        })
    }

    /// Run `f` (a short read) on a free reader at once, else wait for one under
    /// `block_in_place`.
    fn read<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if self.readers.is_empty() {
            return self.with(f);
        }
        match self.free_reader() {
            Ok(mut conn) => f(&mut conn),
            Err(_) => self.read_long(f),
        }
    }

    /// Run `f` (a read that may take long: a listing, a scan of every waiting node) on a
    /// reader under `block_in_place`, so the worker's other tasks move on meanwhile.
    fn read_long<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        blocking(|| {
            let mut conn = if self.readers.is_empty() {
                lock(&self.conn)?
            } else {
                match self.free_reader() {
                    Ok(conn) => conn,
                    Err(busy) => lock(&self.readers[busy])?,
                }
            };
            f(&mut conn)
        })
    }

    /// A reader that is free now, trying each once from a rotating start; else the index of
    /// the one to wait for. Needs at least one reader.
    fn free_reader(&self) -> Result<MutexGuard<'_, Connection>, usize> {
        let n = self.readers.len();
        let start = self
            .next_reader
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for i in 0..n {
            if let Ok(conn) = self.readers[(start + i) % n].try_lock() {
                return Ok(conn);
            }
        }
        Err(start % n)
    }
}

fn lock(conn: &Mutex<Connection>) -> Result<MutexGuard<'_, Connection>, StoreError> {
    conn.lock()
        .map_err(|_| StoreError::Backend("store mutex poisoned".into()))
}

/// Run `f`, which blocks on the disk or a connection lock: under `block_in_place` on the
/// multi-thread runtime, so the worker's other tasks move to another thread; inline where
/// that is not possible (a current-thread runtime, or no runtime).
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// A read-only connection to the database at `path` (already migrated by the writer).
fn connect_reader(path: &str) -> Result<Connection, StoreError> {
    use rusqlite::OpenFlags;
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(path, flags)
        .map_err(|e| StoreError::Backend(format!("cannot open SQLite file {path} to read: {e}")))?;
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(backend)?;
    // Each read after another connection's commit starts by emptying this connection's page
    // cache (that is how WAL readers stay current), at a cost that grows with the cache: at
    // thousands of heartbeat writes a second a large reader cache is emptied more than it
    // is used (the profile showed it as the top SQLite function). Pages come from the OS
    // page cache instead, which the writer keeps warm.
    conn.execute_batch("PRAGMA cache_size = -256")
        .map_err(backend)?;
    Ok(conn)
}

fn connect(path: &str) -> Result<Connection, StoreError> {
    let conn = Connection::open(path)
        .map_err(|e| StoreError::Backend(format!("cannot open SQLite file {path}: {e}")))?;
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(backend)?;
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;",
    )
    .map_err(backend)?;
    Ok(conn)
}

/// Apply pending migrations to the file at `path` (creating it if needed) and return the
/// schema versions before and after (`rivetd db upgrade`).
pub fn upgrade(path: &str) -> Result<(i64, i64), StoreError> {
    let conn = connect(path)?;
    let before = migrate(&conn)?;
    Ok((before, SCHEMA_VERSION))
}

/// Apply pending migrations; refuse a schema newer than this build. Returns the version
/// found.
fn migrate(conn: &Connection) -> Result<i64, StoreError> {
    conn.execute_batch("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        .map_err(backend)?;
    let current: i64 = conn
        .query_row(
            "SELECT COALESCE(MAX(version), 0) FROM schema_version",
            [],
            |r| r.get(0),
        )
        .map_err(backend)?;
    if current > SCHEMA_VERSION {
        return Err(StoreError::Backend(format!(
            "database schema version {current} is newer than this rivetd knows ({SCHEMA_VERSION}); \
             run a newer rivetd"
        )));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let version = i as i64 + 1;
        let tx = conn.unchecked_transaction().map_err(backend)?;
        tx.execute_batch(sql).map_err(backend)?;
        tx.execute(
            "INSERT INTO schema_version (version) VALUES (?1)",
            [version],
        )
        .map_err(backend)?;
        tx.commit().map_err(backend)?;
        tracing::info!(version, "applied database migration");
    }
    Ok(current)
}

fn sort_column(key: &str) -> Result<&'static str, StoreError> {
    if key == "id" {
        return Ok("id");
    }
    NODE_SORT_KEYS
        .iter()
        .find(|k| **k == key)
        .copied()
        .ok_or_else(|| StoreError::Backend(format!("invalid sort key {key}")))
}

fn opt_json(v: &Option<Value>) -> Option<String> {
    v.as_ref().map(|v| v.to_string())
}

/// A node's values in [`NODE_COLUMNS`] order (one list for INSERT and UPDATE), with its
/// `driver_info` as sealed text ([`crate::secrets::Secrets::seal_info`]).
fn node_values(n: &Node, driver_info: String) -> Vec<rusqlite::types::Value> {
    use rusqlite::types::Value as V;
    let text = |s: Option<String>| s.map(V::Text).unwrap_or(V::Null);
    let state = |s: Option<&str>| text(s.map(str::to_string));
    vec![
        V::Text(n.uuid.clone()),
        text(n.name.clone()),
        V::Text(n.driver.clone()),
        V::Text(driver_info),
        V::Text(map_to_text(&n.driver_internal_info)),
        V::Text(map_to_text(&n.properties)),
        V::Text(map_to_text(&n.instance_info)),
        text(n.instance_uuid.clone()),
        V::Text(map_to_text(&n.extra)),
        V::Text(n.provision_state.as_str().to_string()),
        state(n.target_provision_state.map(|s| s.as_str())),
        text(n.provision_updated_at.as_ref().map(ts)),
        state(n.power_state.map(|s| s.as_str())),
        state(n.target_power_state.map(|s| s.as_str())),
        V::Integer(i64::from(n.maintenance)),
        text(n.maintenance_reason.clone()),
        text(n.fault.clone()),
        text(n.last_error.clone()),
        text(opt_json(&n.clean_step)),
        text(opt_json(&n.deploy_step)),
        text(n.reservation.clone()),
        text(n.conductor.clone()),
        n.automated_clean
            .map(|b| V::Integer(i64::from(b)))
            .unwrap_or(V::Null),
        text(n.resource_class.clone()),
        V::Text(ts(&n.created_at)),
        text(n.updated_at.as_ref().map(ts)),
        V::Integer(n.version),
        text(n.inspect_interface.clone()),
        text(n.inspection_started_at.as_ref().map(ts)),
        text(n.inspection_finished_at.as_ref().map(ts)),
        V::Text(serde_json::to_string(&n.traits).unwrap_or_else(|_| "[]".into())),
        text(serde_json::to_string(&n.interfaces).ok()),
    ]
}

/// `?1, ?2, …, ?n`.
fn placeholders(n: usize) -> String {
    (1..=n)
        .map(|i| format!("?{i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[async_trait]
impl Store for SqliteStore {
    async fn create_node(&self, node: &Node) -> Result<Node, StoreError> {
        let mut n = node.clone();
        n.version = 1;
        n.updated_at = None;
        let driver_info = self.secrets.seal_info(&n.uuid, &n.driver_info);
        self.with(|c| {
            let values = node_values(&n, driver_info);
            let r = c.execute(
                &format!(
                    "INSERT INTO nodes ({NODE_COLUMNS}) VALUES ({})",
                    placeholders(values.len())
                ),
                rusqlite::params_from_iter(values),
            );
            match r {
                Ok(_) => Ok(n),
                Err(e) => match unique_violation(&e) {
                    Some(msg) if msg.contains("nodes.name") => Err(StoreError::Duplicate(format!(
                        "a node named {:?} already exists",
                        n.name.as_deref().unwrap_or_default()
                    ))),
                    Some(_) => Err(StoreError::Duplicate(format!(
                        "a node with UUID {} already exists",
                        n.uuid
                    ))),
                    None => Err(backend(e)),
                },
            }
        })
    }

    async fn get_node(&self, ident: &str) -> Result<Node, StoreError> {
        self.read(|c| {
            c.prepare_cached(&format!(
                "SELECT {NODE_SELECT} FROM nodes WHERE uuid = ?1 OR name = ?1 LIMIT 1"
            ))
            .map_err(backend)?
            .query_row([ident], node_from_row)
            .optional()
            .map_err(backend)?
            .ok_or_else(|| StoreError::NotFound {
                kind: "node",
                ident: ident.to_string(),
            })
        })
        .and_then(|n| self.secrets.open_node(n))
    }

    async fn list_nodes(&self, q: &NodeQuery) -> Result<Vec<Node>, StoreError> {
        let col = sort_column(&q.sort_key)?;
        self.read_long(|c| {
            let mut wheres: Vec<String> = Vec::new();
            let mut args: Vec<rusqlite::types::Value> = Vec::new();
            let sort_expr = if col == "id" {
                "id".to_string()
            } else {
                format!("COALESCE({col}, '')")
            };
            if let Some(marker) = &q.marker {
                let found: Option<(rusqlite::types::Value, i64)> = c
                    .query_row(
                        &format!("SELECT {sort_expr}, id FROM nodes WHERE uuid = ?1"),
                        [marker],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()
                    .map_err(backend)?;
                let (value, id) = found.ok_or_else(|| StoreError::NotFound {
                    kind: "marker node",
                    ident: marker.clone(),
                })?;
                let op = if q.sort_dir == SortDir::Asc { ">" } else { "<" };
                if col == "id" {
                    wheres.push(format!("id {op} ?"));
                    args.push(id.into());
                } else {
                    wheres.push(format!(
                        "({sort_expr} {op} ? OR ({sort_expr} = ? AND id {op} ?))"
                    ));
                    args.push(value.clone());
                    args.push(value);
                    args.push(id.into());
                }
            }
            if let Some(s) = q.provision_state {
                wheres.push("provision_state = ?".into());
                args.push(s.as_str().to_string().into());
            }
            if let Some(m) = q.maintenance {
                wheres.push("maintenance = ?".into());
                args.push(i64::from(m).into());
            }
            if let Some(d) = &q.driver {
                wheres.push("driver = ?".into());
                args.push(d.clone().into());
            }
            if let Some(rc) = &q.resource_class {
                wheres.push("resource_class = ?".into());
                args.push(rc.clone().into());
            }
            let where_sql = super::where_clause(&wheres);
            let dir = if q.sort_dir == SortDir::Asc { "ASC" } else { "DESC" };
            let sql = format!(
                "SELECT {NODE_SELECT} FROM nodes {where_sql} ORDER BY {sort_expr} {dir}, id {dir} LIMIT ?"
            );
            args.push((q.limit as i64).into());
            let mut stmt = c.prepare_cached(&sql).map_err(backend)?;
            let rows = stmt
                .query_map(rusqlite::params_from_iter(args), node_from_row)
                .map_err(backend)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(backend)
        })
        .and_then(|nodes| self.secrets.open_nodes(nodes))
    }

    async fn nodes_in_states(&self, states: &[ProvisionState]) -> Result<Vec<Node>, StoreError> {
        if states.is_empty() {
            return Ok(Vec::new());
        }
        self.read_long(|c| {
            let marks = vec!["?"; states.len()].join(", ");
            let sql = format!(
                "SELECT {NODE_SELECT} FROM nodes WHERE provision_state IN ({marks}) ORDER BY id"
            );
            let mut stmt = c.prepare_cached(&sql).map_err(backend)?;
            let rows = stmt
                .query_map(
                    rusqlite::params_from_iter(states.iter().map(|s| s.as_str())),
                    node_from_row,
                )
                .map_err(backend)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(backend)
        })
        .and_then(|nodes| self.secrets.open_nodes(nodes))
    }

    async fn update_node(&self, node: &Node) -> Result<Node, StoreError> {
        node.writable()?;
        let mut n = node.clone();
        let expected = n.version;
        n.version += 1;
        n.updated_at = Some(Utc::now());
        let driver_info = self.secrets.seal_info(&n.uuid, &n.driver_info);
        self.with(|c| {
            let mut values = node_values(&n, driver_info);
            let count = values.len();
            values.push(expected.into());
            // Row-value UPDATE: the same column list and order as INSERT.
            let set_cols = &NODE_COLUMNS["uuid, ".len()..];
            let marks = (2..=count)
                .map(|i| format!("?{i}"))
                .collect::<Vec<_>>()
                .join(", ");
            let r = c
                .prepare_cached(&format!(
                    "UPDATE nodes SET ({set_cols}) = ({marks}) WHERE uuid = ?1 AND version = ?{} \
                     AND {NODE_INTACT}",
                    count + 1
                ))
                .and_then(|mut st| st.execute(rusqlite::params_from_iter(values)));
            match r {
                Ok(1) => Ok(n),
                Ok(_) => {
                    let exists: bool = c
                        .query_row("SELECT 1 FROM nodes WHERE uuid = ?1", [&n.uuid], |_| Ok(()))
                        .optional()
                        .map_err(backend)?
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
                    None => Err(backend(e)),
                },
            }
        })
    }

    async fn record_liveness(
        &self,
        uuid: &str,
        liveness: &super::Liveness,
    ) -> Result<(), StoreError> {
        self.with(|c| {
            let n = c
                .prepare_cached(
                    "UPDATE nodes SET agent_last_heartbeat = ?2, agent_version = ?3, \
                     step_progress = ?4 WHERE uuid = ?1",
                )
                .and_then(|mut st| {
                    st.execute(params![
                        uuid,
                        liveness.last_heartbeat.as_ref().map(ts),
                        liveness.agent_version,
                        opt_json(&liveness.progress)
                    ])
                })
                .map_err(backend)?;
            super::one_node_row(n as u64, uuid)
        })
    }

    async fn delete_node(&self, uuid: &str, version: i64) -> Result<(), StoreError> {
        self.with(|c| {
            let tx = c.transaction().map_err(backend)?;
            tx.execute("DELETE FROM ports WHERE node_uuid = ?1", [uuid])
                .map_err(backend)?;
            let n = tx
                .execute(
                    "DELETE FROM nodes WHERE uuid = ?1 AND version = ?2",
                    params![uuid, version],
                )
                .map_err(backend)?;
            if n != 1 {
                return Err(StoreError::Conflict {
                    kind: "node",
                    ident: uuid.to_string(),
                    expected: version,
                });
            }
            tx.commit().map_err(backend)
        })
    }

    async fn release_reservations(&self, conductor: &str) -> Result<u64, StoreError> {
        self.with(|c| {
            c.execute(
                "UPDATE nodes SET reservation = NULL, version = version + 1 WHERE reservation = ?1",
                [conductor],
            )
            .map(|n| n as u64)
            .map_err(backend)
        })
    }

    async fn conductor_heartbeat(
        &self,
        id: &str,
        hostname: &str,
        starting: bool,
    ) -> Result<(), StoreError> {
        let now = ts(&Utc::now());
        self.with(|c| {
            c.prepare_cached(
                "INSERT INTO conductors (id, hostname, started_at, last_seen) VALUES (?1, ?2, ?3, ?3) \
                 ON CONFLICT (id) DO UPDATE SET hostname = excluded.hostname, last_seen = excluded.last_seen, \
                 started_at = CASE WHEN ?4 THEN excluded.started_at ELSE conductors.started_at END",
            )
            .and_then(|mut st| st.execute(params![id, hostname, now, starting]))
            .map(|_| ())
            .map_err(backend)
        })
    }

    async fn list_conductors(&self, dead_after_s: u64) -> Result<Vec<ConductorRecord>, StoreError> {
        let now = Utc::now();
        self.read(|c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT id, hostname, started_at, last_seen FROM conductors ORDER BY id",
                )
                .map_err(backend)?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                    ))
                })
                .map_err(backend)?;
            let mut out = Vec::new();
            for row in rows {
                let (id, hostname, started, seen) = row.map_err(backend)?;
                let last_seen = parse_ts(Some(seen)).unwrap_or_default();
                out.push(ConductorRecord {
                    id,
                    hostname,
                    started_at: parse_ts(Some(started)).unwrap_or_default(),
                    alive: (now - last_seen).num_seconds() < dead_after_s as i64,
                    last_seen,
                });
            }
            Ok(out)
        })
    }

    async fn acquire_lease(
        &self,
        uuid: &str,
        id: &str,
        dead_after_s: u64,
    ) -> Result<bool, StoreError> {
        let dead_before = ts(&(Utc::now() - chrono::Duration::seconds(dead_after_s as i64)));
        self.with(|c| {
            c.prepare_cached(
                "UPDATE nodes SET version = version + 1, reservation = ?2 \
                 WHERE uuid = ?1 AND (reservation IS NULL OR reservation <> ?2) \
                   AND (reservation IS NULL OR NOT EXISTS (SELECT 1 FROM conductors c \
                       WHERE c.id = nodes.reservation AND c.last_seen > ?3))",
            )
            .and_then(|mut st| st.execute(params![uuid, id, dead_before]))
            .map_err(backend)?;
            // Taken now, or already ours.
            c.prepare_cached("SELECT reservation FROM nodes WHERE uuid = ?1")
                .and_then(|mut st| {
                    st.query_row([uuid], |r| r.get::<_, Option<String>>(0))
                        .optional()
                })
                .map(|holder| holder.flatten().as_deref() == Some(id))
                .map_err(backend)
        })
    }

    async fn release_lease(&self, uuid: &str, id: &str) -> Result<bool, StoreError> {
        self.with(|c| {
            c.execute(
                "UPDATE nodes SET reservation = NULL, version = version + 1 \
                 WHERE uuid = ?1 AND reservation = ?2",
                params![uuid, id],
            )
            .map(|n| n == 1)
            .map_err(backend)
        })
    }

    async fn create_port(&self, port: &Port) -> Result<Port, StoreError> {
        let mut p = port.clone();
        p.version = 1;
        self.with(|c| {
            let r = c.execute(
                &format!(
                    "INSERT INTO ports ({PORT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
                ),
                params![
                    p.uuid,
                    p.node_uuid,
                    p.address,
                    p.pxe_enabled,
                    map_to_text(&p.extra),
                    ts(&p.created_at),
                    p.updated_at.as_ref().map(ts),
                    p.version
                ],
            );
            match r {
                Ok(_) => Ok(p),
                Err(e) => match unique_violation(&e) {
                    Some(msg) if msg.contains("address") => Err(StoreError::Duplicate(format!(
                        "a port with MAC address {} already exists",
                        p.address
                    ))),
                    Some(_) => Err(StoreError::Duplicate(format!(
                        "a port with UUID {} already exists",
                        p.uuid
                    ))),
                    None => Err(backend(e)),
                },
            }
        })
    }

    async fn get_port(&self, uuid: &str) -> Result<Port, StoreError> {
        self.read(|c| {
            c.query_row(
                &format!("SELECT {PORT_COLUMNS} FROM ports WHERE uuid = ?1"),
                [uuid],
                port_from_row,
            )
            .optional()
            .map_err(backend)?
            .ok_or_else(|| StoreError::NotFound {
                kind: "port",
                ident: uuid.to_string(),
            })
        })
    }

    async fn list_ports(&self, q: &PortQuery) -> Result<Vec<Port>, StoreError> {
        self.read_long(|c| {
            let mut wheres: Vec<&str> = Vec::new();
            let mut args: Vec<rusqlite::types::Value> = Vec::new();
            if let Some(n) = &q.node_uuid {
                wheres.push("node_uuid = ?");
                args.push(n.clone().into());
            }
            if let Some(a) = &q.address {
                wheres.push("address = ?");
                args.push(a.clone().into());
            }
            if let Some(m) = &q.marker {
                wheres.push("id > (SELECT id FROM ports WHERE uuid = ?)");
                args.push(m.clone().into());
            }
            let where_sql = super::where_clause(&wheres);
            let limit = super::page_limit(q.limit);
            args.push((limit as i64).into());
            let sql = format!("SELECT {PORT_COLUMNS} FROM ports {where_sql} ORDER BY id LIMIT ?");
            let mut stmt = c.prepare_cached(&sql).map_err(backend)?;
            let rows = stmt
                .query_map(rusqlite::params_from_iter(args), port_from_row)
                .map_err(backend)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(backend)
        })
    }

    async fn update_port(&self, port: &Port) -> Result<Port, StoreError> {
        let mut p = port.clone();
        let expected = p.version;
        p.version += 1;
        p.updated_at = Some(Utc::now());
        self.with(|c| {
            let r = c.execute(
                "UPDATE ports SET node_uuid = ?2, address = ?3, pxe_enabled = ?4, extra = ?5, \
                 updated_at = ?6, version = ?7 WHERE uuid = ?1 AND version = ?8",
                params![
                    p.uuid,
                    p.node_uuid,
                    p.address,
                    p.pxe_enabled,
                    map_to_text(&p.extra),
                    p.updated_at.as_ref().map(ts),
                    p.version,
                    expected
                ],
            );
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
                    None => Err(backend(e)),
                },
            }
        })
    }

    async fn delete_port(&self, uuid: &str) -> Result<(), StoreError> {
        self.with(|c| {
            let n = c
                .execute("DELETE FROM ports WHERE uuid = ?1", [uuid])
                .map_err(backend)?;
            if n == 0 {
                Err(StoreError::NotFound {
                    kind: "port",
                    ident: uuid.to_string(),
                })
            } else {
                Ok(())
            }
        })
    }

    async fn node_by_macs(&self, macs: &[String]) -> Result<Option<String>, StoreError> {
        if macs.is_empty() {
            return Ok(None);
        }
        self.read(|c| {
            let marks = vec!["?"; macs.len()].join(", ");
            c.query_row(
                &format!("SELECT node_uuid FROM ports WHERE address IN ({marks}) LIMIT 1"),
                rusqlite::params_from_iter(macs.iter()),
                |r| r.get(0),
            )
            .optional()
            .map_err(backend)
        })
    }

    async fn node_by_system(
        &self,
        system_uuid: Option<&str>,
        serial: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        if system_uuid.is_none() && serial.is_none() {
            return Ok(None);
        }
        self.read(|c| {
            c.query_row(
                "SELECT uuid FROM nodes WHERE (?1 IS NOT NULL AND lower(json_extract(properties, '$.system_uuid')) = lower(?1)) \
                 OR (?2 IS NOT NULL AND json_extract(properties, '$.system_serial') = ?2) LIMIT 1",
                params![system_uuid, serial],
                |r| r.get(0),
            )
            .optional()
            .map_err(backend)
        })
    }

    async fn enqueue_command(&self, node_uuid: &str, command: &Command) -> Result<(), StoreError> {
        let text = serde_json::to_string(command).map_err(backend)?;
        self.with(|c| {
            c.execute(
                "INSERT INTO agent_commands (id, node_uuid, command, created_at) VALUES (?1, ?2, ?3, ?4)",
                params![command.id, node_uuid, text, ts(&Utc::now())],
            )
            .map_err(|e| match unique_violation(&e) {
                Some(_) => StoreError::Duplicate(format!("command {} already queued", command.id)),
                None => backend(e),
            })?;
            Ok(())
        })
    }

    async fn pending_commands(&self, node_uuid: &str) -> Result<Vec<Command>, StoreError> {
        self.read(|c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT command FROM agent_commands WHERE node_uuid = ?1 AND result IS NULL \
                     AND cancelled = 0 ORDER BY seq",
                )
                .map_err(backend)?;
            let rows = stmt
                .query_map([node_uuid], |r| r.get::<_, String>(0))
                .map_err(backend)?;
            let mut out = Vec::new();
            for text in rows {
                let text = text.map_err(backend)?;
                out.push(serde_json::from_str(&text).map_err(backend)?);
            }
            Ok(out)
        })
    }

    async fn record_result(
        &self,
        node_uuid: &str,
        result: &CommandResult,
    ) -> Result<bool, StoreError> {
        let text = serde_json::to_string(result).map_err(backend)?;
        self.with(|c| {
            let n = c
                .execute(
                    "UPDATE agent_commands SET result = ?3, finished_at = ?4 \
                     WHERE node_uuid = ?1 AND id = ?2 AND result IS NULL",
                    params![node_uuid, result.id, text, ts(&Utc::now())],
                )
                .map_err(backend)?;
            if n == 1 {
                return Ok(true);
            }
            let known: Option<i64> = c
                .query_row(
                    "SELECT seq FROM agent_commands WHERE node_uuid = ?1 AND id = ?2",
                    params![node_uuid, result.id],
                    |r| r.get(0),
                )
                .optional()
                .map_err(backend)?;
            match known {
                Some(_) => Ok(false),
                None => Err(StoreError::NotFound {
                    kind: "command",
                    ident: result.id.clone(),
                }),
            }
        })
    }

    async fn command(&self, node_uuid: &str, id: &str) -> Result<StoredCommand, StoreError> {
        self.read(|c| {
            let row: Option<(String, Option<String>)> = c
                .query_row(
                    "SELECT command, result FROM agent_commands WHERE node_uuid = ?1 AND id = ?2",
                    params![node_uuid, id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(backend)?;
            let (cmd, res) = row.ok_or_else(|| StoreError::NotFound {
                kind: "command",
                ident: id.to_string(),
            })?;
            Ok(StoredCommand {
                command: serde_json::from_str(&cmd).map_err(backend)?,
                result: res
                    .map(|r| serde_json::from_str(&r))
                    .transpose()
                    .map_err(backend)?,
            })
        })
    }

    async fn cancel_pending(&self, node_uuid: &str) -> Result<u64, StoreError> {
        self.with(|c| {
            c.execute(
                "UPDATE agent_commands SET cancelled = 1 WHERE node_uuid = ?1 AND result IS NULL",
                [node_uuid],
            )
            .map(|n| n as u64)
            .map_err(backend)
        })
    }

    async fn put_rule(&self, uuid: &str, priority: i64, body: &Value) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                "INSERT INTO inspection_rules (uuid, priority, body, created_at) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT(uuid) DO UPDATE SET priority = excluded.priority, body = excluded.body",
                params![uuid, priority, body.to_string(), ts(&Utc::now())],
            )
            .map_err(backend)?;
            Ok(())
        })
    }

    async fn list_rules(&self) -> Result<Vec<Value>, StoreError> {
        self.read(|c| {
            let mut stmt = c
                .prepare_cached("SELECT body FROM inspection_rules ORDER BY priority DESC, seq")
                .map_err(backend)?;
            let rows = stmt
                .query_map([], |r| r.get::<_, String>(0))
                .map_err(backend)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(serde_json::from_str(&row.map_err(backend)?).map_err(backend)?);
            }
            Ok(out)
        })
    }

    async fn delete_rule(&self, uuid: &str) -> Result<(), StoreError> {
        self.with(|c| {
            let n = c
                .execute("DELETE FROM inspection_rules WHERE uuid = ?1", [uuid])
                .map_err(backend)?;
            if n == 0 {
                return Err(StoreError::NotFound {
                    kind: "inspection rule",
                    ident: uuid.to_string(),
                });
            }
            Ok(())
        })
    }

    async fn save_inventory(&self, node_uuid: &str, inventory: &Value) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                "INSERT INTO node_inventory (node_uuid, inventory, collected_at) VALUES (?1, ?2, ?3) \
                 ON CONFLICT(node_uuid) DO UPDATE SET inventory = excluded.inventory, \
                 collected_at = excluded.collected_at",
                params![node_uuid, inventory.to_string(), ts(&Utc::now())],
            )
            .map_err(backend)?;
            Ok(())
        })
    }

    async fn get_inventory(&self, node_uuid: &str) -> Result<(Value, DateTime<Utc>), StoreError> {
        self.read(|c| {
            let row: Option<(String, String)> = c
                .query_row(
                    "SELECT inventory, collected_at FROM node_inventory WHERE node_uuid = ?1",
                    [node_uuid],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(backend)?;
            let (inv, at) = row.ok_or_else(|| StoreError::NotFound {
                kind: "inventory of node",
                ident: node_uuid.to_string(),
            })?;
            Ok((
                serde_json::from_str(&inv).map_err(backend)?,
                parse_ts(Some(at)).unwrap_or_else(Utc::now),
            ))
        })
    }

    async fn append_audit(&self, e: &super::AuditEntry) -> Result<(), StoreError> {
        self.with(|c| {
            c.prepare_cached(
                "INSERT INTO audit_log (created_at, actor, source, method, path, node_uuid, \
                 action, status, detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )
            .map_err(backend)?
            .execute(params![
                ts(&e.created_at),
                e.actor,
                e.source,
                e.method,
                e.path,
                e.node_uuid,
                e.action,
                e.status.map(i64::from),
                e.detail,
            ])
            .map_err(backend)?;
            Ok(())
        })
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
        let mut args: Vec<rusqlite::types::Value> = Vec::new();
        if let Some(n) = &q.node_uuid {
            wheres.push("node_uuid = ?".into());
            args.push(n.clone().into());
        }
        if let Some(m) = q.marker {
            wheres.push(format!("seq {cmp} ?"));
            args.push(m.into());
        }
        let where_sql = super::where_clause(&wheres);
        let limit = super::page_limit(q.limit);
        args.push((limit as i64).into());
        let sql = format!(
            "SELECT seq, created_at, actor, source, method, path, node_uuid, action, status, \
             detail FROM audit_log {where_sql} ORDER BY seq {dir} LIMIT ?"
        );
        self.read_long(|c| {
            let mut stmt = c.prepare_cached(&sql).map_err(backend)?;
            let rows = stmt
                .query_map(rusqlite::params_from_iter(args), |r| {
                    Ok(super::AuditEntry {
                        seq: r.get(0)?,
                        created_at: parse_ts(r.get(1)?).unwrap_or_else(Utc::now),
                        actor: r.get(2)?,
                        source: r.get(3)?,
                        method: r.get(4)?,
                        path: r.get(5)?,
                        node_uuid: r.get(6)?,
                        action: r.get(7)?,
                        status: r
                            .get::<_, Option<i64>>(8)?
                            .and_then(|s| u16::try_from(s).ok()),
                        detail: r.get(9)?,
                    })
                })
                .map_err(backend)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(backend)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, SqliteStore) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.db");
        let s = SqliteStore::open(
            path.to_str().expect("utf8"),
            crate::secrets::Secrets::ephemeral(),
        )
        .expect("open");
        (dir, s)
    }

    /// Reads go to the read-only connections: each must see the writer's last commit at
    /// once (a reader left inside an old snapshot would hand the conductor stale nodes), and
    /// a write through a reader is impossible.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn readers_see_every_commit_at_once() {
        let (_dir, s) = store();
        assert_eq!(s.readers.len(), 4);
        let s = std::sync::Arc::new(s);
        let mut tasks = Vec::new();
        for t in 0..8 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..25 {
                    let uuid = format!("n-{t}-{i}");
                    let mut n = s
                        .create_node(&Node::new(uuid.clone(), "fake-hardware".into()))
                        .await
                        .expect("create");
                    for round in 0..3 {
                        let seen = s.get_node(&uuid).await.expect("read after create");
                        assert_eq!(seen.version, n.version, "{uuid} round {round}");
                        n.extra.insert("round".into(), round.into());
                        n = s.update_node(&n).await.expect("update");
                    }
                    let seen = s.get_node(&uuid).await.expect("read after update");
                    assert_eq!(seen.extra.get("round"), Some(&2.into()), "{uuid}");
                }
            }));
        }
        for t in tasks {
            t.await.expect("task");
        }
        let all = s.list_nodes(&NodeQuery::default()).await.expect("list");
        assert_eq!(all.len(), 200);
        let refused = s.readers[0]
            .lock()
            .expect("reader")
            .execute("DELETE FROM nodes", []);
        assert!(refused.is_err(), "a reader could write");
    }

    #[tokio::test]
    async fn node_round_trip_and_optimistic_update() {
        let (_d, s) = store();
        let mut n = Node::new("u1".into(), "fake-hardware".into());
        n.name = Some("n1".into());
        n.driver_info.insert("k".into(), Value::from(1));
        let created = s.create_node(&n).await.expect("create");
        assert_eq!(created.version, 1);
        let got = s.get_node("n1").await.expect("by name");
        assert_eq!(got.uuid, "u1");
        assert_eq!(got.driver_info["k"], 1);
        let mut a = got.clone();
        a.last_error = Some("x".into());
        let a = s.update_node(&a).await.expect("update");
        assert_eq!(a.version, 2);
        // Writing from the stale copy fails.
        let err = s.update_node(&got).await.expect_err("stale");
        assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
        let dup = s.create_node(&n).await.expect_err("dup");
        assert!(matches!(dup, StoreError::Duplicate(_)));
    }

    #[tokio::test]
    async fn paging_and_filters() {
        let (_d, s) = store();
        for i in 0..25 {
            let mut n = Node::new(format!("u{i:02}"), "fake-hardware".into());
            n.name = Some(format!("n{i:02}"));
            if i % 5 == 0 {
                n.provision_state = ProvisionState::Manageable;
            }
            s.create_node(&n).await.expect("create");
        }
        let mut seen = Vec::new();
        let mut q = NodeQuery {
            limit: 10,
            sort_key: "name".into(),
            sort_dir: SortDir::Desc,
            ..Default::default()
        };
        loop {
            let page = s.list_nodes(&q).await.expect("list");
            if page.is_empty() {
                break;
            }
            q.marker = page.last().map(|n| n.uuid.clone());
            seen.extend(page.into_iter().map(|n| n.name.unwrap_or_default()));
        }
        assert_eq!(seen.len(), 25);
        assert_eq!(seen[0], "n24");
        assert_eq!(seen[24], "n00");
        let q = NodeQuery {
            provision_state: Some(ProvisionState::Manageable),
            ..Default::default()
        };
        assert_eq!(s.list_nodes(&q).await.expect("filter").len(), 5);
    }

    #[tokio::test]
    async fn ports_unique_mac_and_cascade() {
        let (_d, s) = store();
        let n = s
            .create_node(&Node::new("u1".into(), "fake-hardware".into()))
            .await
            .expect("node");
        let p = Port {
            uuid: "p1".into(),
            node_uuid: n.uuid.clone(),
            address: "52:54:00:00:00:01".into(),
            pxe_enabled: true,
            extra: Map::new(),
            created_at: Utc::now(),
            updated_at: None,
            version: 0,
        };
        s.create_port(&p).await.expect("port");
        let mut p2 = p.clone();
        p2.uuid = "p2".into();
        assert!(matches!(
            s.create_port(&p2).await,
            Err(StoreError::Duplicate(_))
        ));
        assert_eq!(
            s.node_by_macs(&["52:54:00:00:00:01".into()])
                .await
                .expect("lookup"),
            Some("u1".into())
        );
        s.delete_node("u1", n.version).await.expect("delete");
        assert!(s.get_port("p1").await.is_err());
    }

    #[test]
    fn refuses_newer_schema() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.db");
        let p = path.to_str().expect("utf8");
        drop(SqliteStore::open(p, crate::secrets::Secrets::ephemeral()).expect("open"));
        let c = Connection::open(p).expect("raw");
        c.execute("INSERT INTO schema_version (version) VALUES (999)", [])
            .expect("bump");
        drop(c);
        let err = SqliteStore::open(p, crate::secrets::Secrets::ephemeral())
            .err()
            .expect("must refuse");
        assert!(err.to_string().contains("newer"), "{err}");
    }
}
