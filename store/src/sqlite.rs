//! SQLite engine: one file in WAL mode, migrations embedded and run at open.
//!
//! Every statement runs on a thread made for blocking, never on a tokio worker: one thread
//! owns the connection that writes (SQLite serialises writers anyway), a few threads own
//! read-only connections and share one queue. An async caller hands its statement over and
//! awaits the answer; nothing waits on a lock on a worker, so a 5 s `busy_timeout` or a WAL
//! checkpoint stalls one SQLite thread, not the runtime, whatever the call site. In WAL mode a
//! reader sees the last commit and never waits for the writer, so the periodic scan reading
//! every waiting node does not hold up heartbeat writes; a short read goes to the writer's
//! thread when it has nothing queued (its page cache survives its own commits, while a
//! reader's is emptied by every commit). JSON fields are stored as text, times as RFC 3339
//! text with microseconds, flags as 0/1.
//!
//! The queries themselves are in [`super::queries`]; their `$n` placeholders are SQLite's
//! `?n`. Each connection gets two SQL functions the queries use: `now()` (this process's
//! clock, as the stored time text) and `ago(seconds)`.

use super::queries::SqlStore;
use super::sql::{Access, Arg, Dialect, Engine, ExecError, SqlRow};
use super::StoreError;
use chrono::{DateTime, SecondsFormat, Utc};
use rusqlite::types::Value as Cell;
use rusqlite::Connection;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

/// The schema version this build knows (store/migrations.rs holds the migrations).
pub use super::migrations::SCHEMA_VERSION;

/// The SQLite store.
pub type SqliteStore = SqlStore<SqliteEngine>;

/// A statement to run on a SQLite thread, with the connection that thread owns.
type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// The SQLite engine.
pub struct SqliteEngine {
    /// The writer thread's queue.
    writer: Sender<Job>,
    /// Jobs queued or running on the writer thread.
    writer_load: Arc<AtomicUsize>,
    /// The reader threads' shared queue (none: reads go to the writer).
    readers: Option<Sender<Job>>,
    /// How many reader threads there are (the tests check the default).
    #[cfg(test)]
    reader_threads: usize,
    /// The database file, for messages.
    path: String,
}

/// Run jobs from `queue` on `conn` until every sender is gone. A job that panics takes only
/// itself down: its caller hears that the statement failed, the thread keeps serving.
fn serve(mut conn: Connection, queue: Arc<Mutex<Receiver<Job>>>, load: Option<Arc<AtomicUsize>>) {
    loop {
        let job = {
            let Ok(rx) = queue.lock() else { return };
            match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut conn)));
        if let Some(load) = &load {
            load.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Start a thread named `name` serving `queue` on `conn`.
fn start(
    name: String,
    conn: Connection,
    queue: Arc<Mutex<Receiver<Job>>>,
    load: Option<Arc<AtomicUsize>>,
) -> Result<(), StoreError> {
    std::thread::Builder::new()
        .name(name)
        .spawn(move || serve(conn, queue, load))
        .map(|_| ())
        .map_err(|e| StoreError::Backend(format!("cannot start a SQLite thread: {e}")))
}

fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

/// A time as stored: RFC 3339 with microseconds, so text order is time order.
fn ts(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, false)
}

fn parse_ts(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

fn cell(arg: Arg) -> Cell {
    match arg {
        Arg::Null => Cell::Null,
        Arg::Text(s) | Arg::Json(s) => Cell::Text(s),
        Arg::Int(i) => Cell::Integer(i),
        Arg::Bool(b) => Cell::Integer(i64::from(b)),
        Arg::Float(f) => Cell::Real(f),
        Arg::Time(t) => Cell::Text(ts(&t)),
    }
}

/// `$n` placeholders as SQLite's `?n` (a `$` inside a quoted JSON path is not followed by a
/// digit).
fn numbered(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('?');
        } else {
            out.push(c);
        }
    }
    out
}

/// A result row, its values owned.
pub struct SqliteRow(Vec<Cell>);

impl SqliteRow {
    fn take(&mut self, i: usize) -> Result<Cell, StoreError> {
        self.0
            .get_mut(i)
            .map(|c| std::mem::replace(c, Cell::Null))
            .ok_or_else(|| StoreError::Backend(format!("a result row has no column {i}")))
    }
}

fn wrong_type(i: usize, want: &str, got: &Cell) -> StoreError {
    StoreError::Backend(format!(
        "column {i} holds {:?} where {want} is stored",
        got.data_type()
    ))
}

impl SqlRow for SqliteRow {
    fn opt_text(&mut self, i: usize) -> Result<Option<String>, StoreError> {
        match self.take(i)? {
            Cell::Null => Ok(None),
            Cell::Text(s) => Ok(Some(s)),
            other => Err(wrong_type(i, "text", &other)),
        }
    }

    fn opt_int(&mut self, i: usize) -> Result<Option<i64>, StoreError> {
        match self.take(i)? {
            Cell::Null => Ok(None),
            Cell::Integer(n) => Ok(Some(n)),
            other => Err(wrong_type(i, "an integer", &other)),
        }
    }

    fn opt_flag(&mut self, i: usize) -> Result<Option<bool>, StoreError> {
        Ok(self.opt_int(i)?.map(|n| n != 0))
    }

    fn time(&mut self, i: usize) -> Result<Option<DateTime<Utc>>, StoreError> {
        Ok(self.opt_text(i)?.as_deref().and_then(parse_ts))
    }

    fn json(&mut self, i: usize) -> Result<Option<String>, StoreError> {
        self.opt_text(i)
    }
}

/// A failed statement as a store error: a full disk or a failing one is
/// [`StoreError::Unavailable`] (nothing was written; once space is freed the same connection
/// writes again), naming the file and what to do.
fn fault(path: &str, e: rusqlite::Error) -> StoreError {
    let code = match &e {
        rusqlite::Error::SqliteFailure(f, _) => f.code,
        _ => return backend(e),
    };
    let dir = std::path::Path::new(path)
        .parent()
        .map(|d| d.display().to_string())
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| ".".into());
    match code {
        rusqlite::ErrorCode::DiskFull => StoreError::Unavailable(format!(
            "the database's disk is full: SQLite cannot write to {path} ({e}); nothing was \
             changed. Free space on the filesystem holding {dir} and retry; rivetd writes \
             again without a restart"
        )),
        rusqlite::ErrorCode::SystemIoFailure => StoreError::Unavailable(format!(
            "disk I/O error on the database {path} ({e}); nothing was changed. Check the disk \
             and the filesystem holding {dir} (full, read-only, failing) and retry"
        )),
        _ => backend(e),
    }
}

/// After a failed statement: SQLite ends the statement, but an I/O error may leave a
/// transaction open on the writer, and every later write would then fail; end it.
fn settle(c: &Connection) {
    if !c.is_autocommit() {
        if let Err(e) = c.execute_batch("ROLLBACK") {
            tracing::warn!(error = %e, "cannot roll back after a failed SQLite write");
        }
    }
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

impl SqlStore<SqliteEngine> {
    /// Open (creating if needed) the database file and bring its schema up to date.
    pub fn open(
        path: &str,
        secrets: std::sync::Arc<rivet_support::secrets::Secrets>,
    ) -> Result<SqliteStore, StoreError> {
        Self::open_with(
            path,
            secrets,
            rivet_model::config::StoreConfig::default().sqlite_readers,
        )
    }

    /// [`SqliteStore::open`] with `readers` read-only connections beside the writer (0: all
    /// calls on the writer). An in-memory database has no readers: each connection would
    /// see a database of its own.
    pub fn open_with(
        path: &str,
        secrets: std::sync::Arc<rivet_support::secrets::Secrets>,
        readers: usize,
    ) -> Result<SqliteStore, StoreError> {
        let conn = connect(path)?;
        migrate(&conn)?;
        let in_memory = path.is_empty() || path == ":memory:" || path.contains("mode=memory");
        let readers = if in_memory { 0 } else { readers };
        let (writer, queue) = channel::<Job>();
        let writer_load = Arc::new(AtomicUsize::new(0));
        start(
            "sqlite-writer".into(),
            conn,
            Arc::new(Mutex::new(queue)),
            Some(writer_load.clone()),
        )?;
        let reader_queue = if readers > 0 {
            let (tx, rx) = channel::<Job>();
            let rx = Arc::new(Mutex::new(rx));
            for i in 0..readers {
                start(
                    format!("sqlite-reader-{i}"),
                    connect_reader(path)?,
                    rx.clone(),
                    None,
                )?;
            }
            Some(tx)
        } else {
            None
        };
        let engine = SqliteEngine {
            writer,
            writer_load,
            readers: reader_queue,
            #[cfg(test)]
            reader_threads: readers,
            path: path.to_string(),
        };
        Ok(SqlStore::new(engine, secrets))
    }
}

impl SqliteEngine {
    /// Run `f` on a SQLite thread through `queue` and await its answer.
    async fn on<T: Send + 'static>(
        &self,
        queue: &Sender<Job>,
        load: Option<&Arc<AtomicUsize>>,
        f: impl FnOnce(&mut Connection) -> T + Send + 'static,
    ) -> Result<T, StoreError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |c| {
            let _ = tx.send(f(c));
        });
        if let Some(load) = load {
            load.fetch_add(1, Ordering::AcqRel);
        }
        if queue.send(job).is_err() {
            if let Some(load) = load {
                load.fetch_sub(1, Ordering::AcqRel);
            }
            return Err(self.stopped());
        }
        rx.await.map_err(|_| self.stopped())
    }

    fn stopped(&self) -> StoreError {
        StoreError::Backend(format!(
            "SQLite {}: the statement's thread stopped (a panic in the statement; see the log)",
            self.path
        ))
    }

    /// Run `f` on the writer's thread.
    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> T + Send + 'static,
    ) -> Result<T, StoreError> {
        self.on(&self.writer, Some(&self.writer_load), f).await
    }

    /// Run `f` (a read) on the writer's thread when nothing is queued there and `short`,
    /// else on a reader thread (the writer's when there are none).
    async fn read<T: Send + 'static>(
        &self,
        short: bool,
        f: impl FnOnce(&mut Connection) -> T + Send + 'static,
    ) -> Result<T, StoreError> {
        match &self.readers {
            Some(readers) if !(short && self.writer_load.load(Ordering::Acquire) == 0) => {
                self.on(readers, None, f).await
            }
            _ => self.write(f).await,
        }
    }
}

/// Run `sql` on `c` and collect its rows.
fn query(c: &mut Connection, sql: &str, args: Vec<Arg>) -> Result<Vec<SqliteRow>, rusqlite::Error> {
    let mut st = c.prepare_cached(sql)?;
    let width = st.column_count();
    let mut rows = st.query(rusqlite::params_from_iter(args.into_iter().map(cell)))?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        let values = (0..width)
            .map(|i| r.get::<_, Cell>(i))
            .collect::<Result<Vec<_>, _>>()?;
        out.push(SqliteRow(values));
    }
    Ok(out)
}

#[async_trait::async_trait]
impl Engine for SqliteEngine {
    type Row = SqliteRow;

    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    async fn rows(
        &self,
        access: Access,
        sql: &str,
        args: Vec<Arg>,
    ) -> Result<Vec<SqliteRow>, StoreError> {
        let sql = numbered(sql);
        let r = match access {
            Access::Read => self.read(true, move |c| query(c, &sql, args)).await?,
            Access::Scan => self.read(false, move |c| query(c, &sql, args)).await?,
            Access::Write => {
                self.write(move |c| query(c, &sql, args).inspect_err(|_| settle(c)))
                    .await?
            }
        };
        r.map_err(|e| fault(&self.path, e))
    }

    async fn execute(&self, sql: &str, args: Vec<Arg>) -> Result<u64, ExecError> {
        let sql = numbered(sql);
        let r = self
            .write(move |c| {
                c.prepare_cached(&sql)
                    .and_then(|mut st| {
                        st.execute(rusqlite::params_from_iter(args.into_iter().map(cell)))
                    })
                    .inspect_err(|_| settle(c))
            })
            .await
            .map_err(ExecError::Store)?;
        match r {
            Ok(n) => Ok(n as u64),
            Err(e) => Err(match unique_violation(&e) {
                Some(msg) => ExecError::Unique(msg),
                None => ExecError::Store(fault(&self.path, e)),
            }),
        }
    }
}

/// The SQL functions the queries use where PostgreSQL has its own: `now()` (the stored text
/// of this process's clock; one controller, so its clock is the database's) and
/// `ago(seconds)` (that long before now).
fn add_functions(conn: &Connection) -> Result<(), StoreError> {
    use rusqlite::functions::FunctionFlags;
    let flags = FunctionFlags::SQLITE_UTF8;
    conn.create_scalar_function("now", 0, flags, |_| Ok(ts(&Utc::now())))
        .map_err(backend)?;
    conn.create_scalar_function("ago", 1, flags, |ctx| {
        let secs: f64 = ctx.get(0)?;
        let before = chrono::Duration::microseconds((secs * 1e6) as i64);
        Ok(ts(&(Utc::now() - before)))
    })
    .map_err(backend)
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
    add_functions(&conn)?;
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
    add_functions(&conn)?;
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
    for (i, sql) in super::migrations::all(Dialect::Sqlite)
        .enumerate()
        .skip(current as usize)
    {
        let version = i as i64 + 1;
        let tx = conn.unchecked_transaction().map_err(backend)?;
        tx.execute_batch(&sql).map_err(backend)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NodeQuery, SortDir, Store};
    use rivet_model::node::Node;
    use rivet_model::port::Port;
    use rivet_protocol::states::ProvisionState;
    use serde_json::{Map, Value};

    fn store() -> (tempfile::TempDir, SqliteStore) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.db");
        let s = SqliteStore::open(
            path.to_str().expect("utf8"),
            rivet_support::secrets::Secrets::ephemeral(),
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
        assert_eq!(s.engine.reader_threads, 4);
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
        let readers = s.engine.readers.as_ref().expect("readers");
        let refused = s
            .engine
            .on(readers, None, |c| c.execute("DELETE FROM nodes", []))
            .await
            .expect("a reader thread answers");
        assert!(refused.is_err(), "a reader could write");
    }

    /// A slow statement runs on a SQLite thread: on a one-worker runtime, another task keeps
    /// running meanwhile (run on the worker, the statement would stall it, ticks and all).
    #[tokio::test]
    async fn a_slow_statement_does_not_stall_the_runtime() {
        let (_dir, s) = store();
        let ticks = std::sync::Arc::new(AtomicUsize::new(0));
        let ticker = {
            let ticks = ticks.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    ticks.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        tokio::task::yield_now().await;
        let sql = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c \
                   WHERE x < 3000000) SELECT count(*) FROM c";
        for access in [Access::Read, Access::Scan, Access::Write] {
            let before = ticks.load(Ordering::Relaxed);
            let started = std::time::Instant::now();
            s.engine.rows(access, sql, vec![]).await.expect("count");
            let took = started.elapsed();
            let ticked = ticks.load(Ordering::Relaxed) - before;
            // A 5 ms timer on an idle runtime ticks many times during a statement this long;
            // a stalled one not at all.
            let expected = (took.as_millis() / 5 / 4) as usize;
            assert!(
                took.as_millis() >= 40 && ticked >= expected.max(2),
                "{access:?}: {ticked} ticks during a {took:?} statement"
            );
        }
        ticker.abort();
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
            attrs: Default::default(),
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
        drop(SqliteStore::open(p, rivet_support::secrets::Secrets::ephemeral()).expect("open"));
        let c = Connection::open(p).expect("raw");
        c.execute("INSERT INTO schema_version (version) VALUES (999)", [])
            .expect("bump");
        drop(c);
        let err = SqliteStore::open(p, rivet_support::secrets::Secrets::ephemeral())
            .err()
            .expect("must refuse");
        assert!(err.to_string().contains("newer"), "{err}");
    }
}
