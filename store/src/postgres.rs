//! PostgreSQL engine: the database several controllers share. It behaves exactly as the
//! SQLite engine (same queries from [`super::queries`], same errors, same listing order, same
//! migration numbering), so the store and API test suites run unchanged against both.
//!
//! How it differs inside:
//! - JSON fields are `JSON` columns (the text is kept verbatim, as SQLite keeps it, and the
//!   server still checks it is JSON); values cross the wire as that text. Times are
//!   `TIMESTAMPTZ` (microseconds, as SQLite's text stamps), flags are `BOOLEAN`.
//! - Connections come from a deadpool pool on the caller's runtime; each keeps its prepared
//!   statements. A connection found closed (server restart, or its runtime gone) is replaced
//!   on the next checkout.
//! - Migrations run under an advisory lock in one transaction, so several controllers
//!   starting at once apply them once.
//!
//! No TLS: use it on loopback or a trusted network.

use super::queries::SqlStore;
use super::sql::{Access, Arg, Dialect, Engine, ExecError, SqlRow};
use super::{Notice, StoreError};
use chrono::{DateTime, Utc};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use std::future::Future;
use std::time::Duration;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{to_sql_checked, FromSql, IsNull, ToSql, Type};
use tokio_postgres::{Client, NoTls, Row};

/// The schema version this build knows (store/migrations.rs holds the migrations).
pub use super::migrations::SCHEMA_VERSION;

// Both backends must know the same schema versions.

/// Advisory lock key held while migrating ("rivet" in ASCII).
const MIGRATION_LOCK: i64 = 0x0072_6976_6574;

/// Connect timeout when the URL does not set `connect_timeout`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The PostgreSQL store.
pub type PostgresStore = SqlStore<PostgresEngine>;

/// The PostgreSQL engine.
pub struct PostgresEngine {
    pool: Pool,
    config: tokio_postgres::Config,
    /// `user@host:port/db`, for messages (never the password).
    target: String,
}

type BoxError = Box<dyn std::error::Error + Sync + Send>;

impl ToSql for Arg {
    fn to_sql(&self, ty: &Type, out: &mut bytes::BytesMut) -> Result<IsNull, BoxError> {
        match self {
            Arg::Null => Ok(IsNull::Yes),
            // JSON's binary form is its text; JSONB's is a version byte, then the text.
            Arg::Text(s) | Arg::Json(s) if *ty == Type::JSON => {
                out.extend_from_slice(s.as_bytes());
                Ok(IsNull::No)
            }
            Arg::Text(s) | Arg::Json(s) if *ty == Type::JSONB => {
                out.extend_from_slice(&[1]);
                out.extend_from_slice(s.as_bytes());
                Ok(IsNull::No)
            }
            Arg::Text(s) | Arg::Json(s) => s.to_sql(ty, out),
            Arg::Int(i) if *ty == Type::INT4 => i32::try_from(*i)?.to_sql(ty, out),
            Arg::Int(i) if *ty == Type::FLOAT8 => (*i as f64).to_sql(ty, out),
            Arg::Int(i) => i.to_sql(ty, out),
            Arg::Bool(b) => b.to_sql(ty, out),
            Arg::Float(f) => f.to_sql(ty, out),
            Arg::Time(t) => t.to_sql(ty, out),
        }
    }

    // Each variant checks the server's type itself (above).
    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

/// A JSON column read as its text.
struct JsonText(String);

impl<'a> FromSql<'a> for JsonText {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<JsonText, BoxError> {
        let raw = if *ty == Type::JSONB {
            raw.get(1..).unwrap_or_default()
        } else {
            raw
        };
        Ok(JsonText(std::str::from_utf8(raw)?.to_string()))
    }

    fn accepts(ty: &Type) -> bool {
        matches!(*ty, Type::JSON | Type::JSONB | Type::TEXT | Type::VARCHAR)
    }
}

/// A result row.
pub struct PgRow(Row);

impl PgRow {
    fn get<'a, T: FromSql<'a>>(&'a self, i: usize) -> Result<T, StoreError> {
        self.0.try_get(i).map_err(db)
    }
}

impl SqlRow for PgRow {
    fn opt_text(&mut self, i: usize) -> Result<Option<String>, StoreError> {
        self.get(i)
    }

    fn opt_int(&mut self, i: usize) -> Result<Option<i64>, StoreError> {
        self.get(i)
    }

    fn opt_flag(&mut self, i: usize) -> Result<Option<bool>, StoreError> {
        self.get(i)
    }

    fn time(&mut self, i: usize) -> Result<Option<DateTime<Utc>>, StoreError> {
        self.get(i)
    }

    fn json(&mut self, i: usize) -> Result<Option<String>, StoreError> {
        Ok(self.get::<Option<JsonText>>(i)?.map(|j| j.0))
    }
}

/// The constraint a unique violation hit.
fn unique_violation(e: &tokio_postgres::Error) -> Option<String> {
    let d = e.as_db_error()?;
    (*d.code() == SqlState::UNIQUE_VIOLATION).then(|| d.constraint().unwrap_or_default().into())
}

impl SqlStore<PostgresEngine> {
    /// Connect to `url` (`postgres://user:password@host:port/db`) and bring its schema up to
    /// date. Refuses a schema newer than this build.
    pub fn open(
        url: &str,
        secrets: std::sync::Arc<rivet_support::secrets::Secrets>,
    ) -> Result<PostgresStore, StoreError> {
        Self::open_with(
            url,
            secrets,
            rivet_model::config::StoreConfig::default().postgres_pool,
        )
    }

    /// [`PostgresStore::open`] with a pool of `connections`.
    pub fn open_with(
        url: &str,
        secrets: std::sync::Arc<rivet_support::secrets::Secrets>,
        connections: usize,
    ) -> Result<PostgresStore, StoreError> {
        let config = parse_url(url)?;
        let target = describe(&config);
        // Migrate on a thread of its own: open is synchronous and may be called from a
        // runtime's thread.
        let (c, t) = (config.clone(), target.clone());
        on_own_thread(async move { migrate(&mut connect(c, t).await?).await })?;
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                // Reuse a connection unless it is closed; a query on one that broke since
                // fails once and the pool drops it.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(connections.max(1))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .create_timeout(config.get_connect_timeout().copied())
            .build()
            .map_err(|e| StoreError::Backend(format!("cannot build the PostgreSQL pool: {e}")))?;
        let engine = PostgresEngine {
            pool,
            config,
            target,
        };
        Ok(SqlStore::new(engine, secrets))
    }

    /// Apply pending migrations and return the schema versions before and after (for
    /// `rivetd db upgrade`).
    pub fn upgrade(url: &str) -> Result<(i64, i64), StoreError> {
        let config = parse_url(url)?;
        let target = describe(&config);
        on_own_thread(async move { migrate(&mut connect(config, target).await?).await })
    }

    /// The schema version of the database at `url` (0 when empty), without migrating.
    pub fn schema_version_of(url: &str) -> Result<i64, StoreError> {
        let config = parse_url(url)?;
        let target = describe(&config);
        on_own_thread(async move {
            let client = connect(config, target).await?;
            let exists: bool = client
                .query_one("SELECT to_regclass('schema_version') IS NOT NULL", &[])
                .await
                .map_err(db)?
                .try_get(0)
                .map_err(db)?;
            if !exists {
                return Ok(0);
            }
            stored_version(&client).await
        })
    }
}

impl PostgresEngine {
    /// A pooled connection, with what failed named.
    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(|e| {
            let passing = match &e {
                deadpool_postgres::PoolError::Backend(e) => unreachable_server(e),
                _ => true,
            };
            let why = match &e {
                deadpool_postgres::PoolError::Backend(e) => db_message(e),
                other => other.to_string(),
            };
            let why = why.strip_prefix("PostgreSQL: ").unwrap_or(&why).to_string();
            let message = format!("cannot connect to PostgreSQL {}: {why}", self.target);
            if passing {
                StoreError::Unavailable(format!(
                    "{message}; nothing was changed. rivetd reconnects by itself once the \
                     server answers again: retry"
                ))
            } else {
                StoreError::Backend(message)
            }
        })
    }
}

fn refs(args: &[Arg]) -> Vec<&(dyn ToSql + Sync)> {
    args.iter().map(|a| a as &(dyn ToSql + Sync)).collect()
}

#[async_trait::async_trait]
impl Engine for PostgresEngine {
    type Row = PgRow;

    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    async fn rows(
        &self,
        _access: Access,
        sql: &str,
        args: Vec<Arg>,
    ) -> Result<Vec<PgRow>, StoreError> {
        let client = self.client().await?;
        let st = client.prepare_cached(sql).await.map_err(db)?;
        let rows = client.query(&st, &refs(&args)).await.map_err(db)?;
        Ok(rows.into_iter().map(PgRow).collect())
    }

    async fn execute(&self, sql: &str, args: Vec<Arg>) -> Result<u64, ExecError> {
        let client = self.client().await?;
        let st = client.prepare_cached(sql).await.map_err(db)?;
        client
            .execute(&st, &refs(&args))
            .await
            .map_err(|e| match unique_violation(&e) {
                Some(constraint) => ExecError::Unique(constraint),
                None => ExecError::Store(db(e)),
            })
    }

    fn is_shared(&self) -> bool {
        true
    }

    async fn publish(&self, notice: &Notice) -> Result<(), StoreError> {
        self.execute(
            "SELECT pg_notify('rivet', $1)",
            vec![notice.encode().into()],
        )
        .await
        .map(|_| ())
        .map_err(|e| match e {
            ExecError::Store(e) => e,
            ExecError::Unique(c) => StoreError::Backend(c),
        })
    }

    fn subscribe(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<Notice>> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let rt = tokio::runtime::Handle::try_current().ok()?;
        rt.spawn(listen(self.config.clone(), self.target.clone(), tx));
        Some(rx)
    }
}

/// Connect one connection outside the pool (migrations, admin) and drive it on the current
/// runtime.
async fn connect(config: tokio_postgres::Config, target: String) -> Result<Client, StoreError> {
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
    Ok(client)
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

/// A database error as a store error: a lost or refused connection (a restarting server)
/// is [`StoreError::Unavailable`]; the pool replaces the connection on its next checkout.
fn db(e: tokio_postgres::Error) -> StoreError {
    let message = db_message(&e);
    if unreachable_server(&e) {
        StoreError::Unavailable(format!(
            "the PostgreSQL server is unavailable ({message}); the request may not have been \
             carried out. rivetd reconnects by itself once the server answers again: retry"
        ))
    } else {
        StoreError::Backend(message)
    }
}

/// Whether `e` says the server is gone or not yet back (closed connection, I/O or
/// connection error, shutdown or start-up in progress) rather than refusing the query.
fn unreachable_server(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        Some(code) => {
            let c = code.code();
            // Class 08: connection exception; 57P01-57P03: admin/crash shutdown, starting.
            c.starts_with("08") || c.starts_with("57P0")
        }
        None => {
            e.is_closed()
                || e.as_db_error().is_none() && {
                    let mut source = std::error::Error::source(e);
                    let mut io = false;
                    while let Some(s) = source {
                        io |= s.is::<std::io::Error>();
                        source = s.source();
                    }
                    io
                }
        }
    }
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
/// Every wait also watches the receiver: when the conductor's notice loop ends (shutdown, or
/// the supervisor stopping the controller) the notification connection closes at once,
/// instead of lingering until the next notice arrives.
async fn listen(
    config: tokio_postgres::Config,
    target: String,
    tx: tokio::sync::mpsc::UnboundedSender<Notice>,
) {
    use tokio_postgres::AsyncMessage;
    let mut first = true;
    while !tx.is_closed() {
        if !first {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = tx.closed() => return,
            }
        }
        let connected = tokio::select! {
            c = config.connect(NoTls) => c,
            _ = tx.closed() => return,
        };
        let (client, mut connection) = match connected {
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
                let message = tokio::select! {
                    m = std::future::poll_fn(|cx| connection.poll_message(cx)) => m,
                    _ = forward.closed() => return,
                };
                match message {
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

/// The highest applied migration (0 when none) of an existing `schema_version` table.
async fn stored_version(client: &impl tokio_postgres::GenericClient) -> Result<i64, StoreError> {
    client
        .query_one(
            "SELECT COALESCE(MAX(version), 0)::BIGINT FROM schema_version",
            &[],
        )
        .await
        .map_err(db)?
        .try_get(0)
        .map_err(db)
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
    let current = stored_version(&tx).await?;
    if current > SCHEMA_VERSION {
        return Err(StoreError::Backend(format!(
            "database schema version {current} is newer than this rivetd knows ({SCHEMA_VERSION}); \
             run a newer rivetd"
        )));
    }
    for (i, sql) in super::migrations::all(Dialect::Postgres)
        .enumerate()
        .skip(current as usize)
    {
        let version = i as i64 + 1;
        tx.batch_execute(&sql).await.map_err(|e| {
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
            connect(config, target)
                .await?
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
                connect(config, target)
                    .await?
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
}
