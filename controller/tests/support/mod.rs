//! Scaffolding shared by the controller's integration tests, included with `mod support;`:
//! the database a test runs on (a SQLite file, or a scratch PostgreSQL database when
//! `RIVET_TEST_POSTGRES` names a server), `on_every_backend!` to run a test on both, and
//! rivetd's router served on a loopback port with a client for it.
//!
//! Without `RIVET_TEST_POSTGRES` the PostgreSQL runs skip with a message, or fail when
//! `RIVET_REQUIRE_PEERS=1` (CI), so that CI never passes without having run them.

// Each test file is its own crate and uses only part of this module.
#![allow(dead_code)]

use reqwest::{Body, Method, RequestBuilder, StatusCode};
use rivet_model::config::{Config, Role, TokenEntry};
use rivet_store::postgres::ScratchDatabase;
use rivet_store::Store;
use rivet_support::credentials::hash_secret;
use rivet_support::secrets::{Key, Secrets, SecretsConfig};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One test's database, removed when dropped. Its directory holds the SQLite file, or for
/// PostgreSQL the secrets key file rivetd needs there.
pub struct TestDb {
    dir: tempfile::TempDir,
    scratch: Option<ScratchDatabase>,
}

impl TestDb {
    pub fn sqlite() -> TestDb {
        TestDb {
            dir: tempfile::tempdir().expect("tempdir"),
            scratch: None,
        }
    }

    /// A scratch PostgreSQL database, or None (after saying why) when there is no server.
    pub fn postgres(test: &str) -> Option<TestDb> {
        let base = std::env::var("RIVET_TEST_POSTGRES").unwrap_or_default();
        if base.is_empty() {
            let what = "RIVET_TEST_POSTGRES is not set (run scripts/setup-postgres.sh and export the URL it prints)";
            if std::env::var("RIVET_REQUIRE_PEERS").as_deref() == Ok("1") {
                panic!("{test}: missing prerequisite: {what} (RIVET_REQUIRE_PEERS=1)");
            }
            eprintln!("skipping {test}: {what}");
            return None;
        }
        let db = ScratchDatabase::create(&base, "rivet_test").expect("create scratch database");
        Some(TestDb {
            dir: tempfile::tempdir().expect("tempdir"),
            scratch: Some(db),
        })
    }

    pub fn is_postgres(&self) -> bool {
        self.scratch.is_some()
    }

    /// A directory that lives as long as the database.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The SQLite database file (unused on PostgreSQL).
    pub fn sqlite_file(&self) -> PathBuf {
        self.dir.path().join("rivet.db")
    }

    pub fn url(&self) -> String {
        match &self.scratch {
            None => format!("sqlite:{}", self.sqlite_file().display()),
            Some(db) => db.url().to_string(),
        }
    }

    /// The `[secrets]` config: SQLite uses the key made next to its file; PostgreSQL a key
    /// file written here (it refuses to make one up).
    pub fn secrets_config(&self) -> SecretsConfig {
        if !self.is_postgres() {
            return SecretsConfig::default();
        }
        let path = self.dir.path().join("secrets.key");
        if !path.exists() {
            Key::generate()
                .expect("key")
                .write_new(&path)
                .expect("key file");
        }
        SecretsConfig {
            key_file: Some(path),
            previous_key_file: None,
        }
    }

    /// rivetd's default config on this database.
    pub fn config(&self) -> Config {
        let mut config = Config {
            db: self.url(),
            secrets: self.secrets_config(),
            ..Config::default()
        };
        // On PostgreSQL the default is the working directory (the crate's, under cargo).
        config.image_cache.dir = Some(self.dir().join("image-cache"));
        config
    }

    /// The configured key (as rivetd would load it).
    pub fn configured(&self) -> Arc<Secrets> {
        let secrets = Secrets::from_config(
            &self.secrets_config(),
            &self.url(),
            true,
            &rivet_store::sealing::holds_sealed_values,
        );
        Arc::new(secrets.expect("secrets"))
    }

    pub fn open(&self, secrets: Arc<Secrets>) -> Arc<dyn Store> {
        rivet_store::open(&self.url(), secrets).expect("open store")
    }
}

/// Runs `async fn $name(db: TestDb)` once per backend, as `$name::sqlite` and
/// `$name::postgres`.
#[allow(unused_macros)]
macro_rules! on_every_backend {
    ($($name:ident),+ $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                super::$name($crate::support::TestDb::sqlite()).await
            }

            #[tokio::test]
            async fn postgres() {
                let test = concat!(stringify!($name), "::postgres");
                if let Some(db) = $crate::support::TestDb::postgres(test) {
                    super::$name(db).await
                }
            }
        }
    )+};
}
#[allow(unused_imports)]
pub(crate) use on_every_backend;

/// A plain SQL connection to a PostgreSQL database.
pub async fn pg(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    client
}

/// Adds three credentials: `boss` (admin), `ops` (operator), `viewer` (reader); each token
/// is `NAME-token`.
pub fn add_role_tokens(config: &mut Config) {
    for (name, role) in [
        ("boss", Role::Admin),
        ("ops", Role::Operator),
        ("viewer", Role::Reader),
    ] {
        config.auth.tokens.push(TokenEntry {
            name: name.into(),
            hash: hash_secret(&format!("{name}-token")).expect("hash"),
            role,
        });
    }
}

/// rivetd's router served on a loopback port until the test ends, and a client for it.
pub struct Server {
    pub base: String,
    pub http: reqwest::Client,
}

impl Server {
    /// Builds rivetd's router from `config` and serves it.
    pub async fn start(config: Config) -> Server {
        let (_conductor, app) = rivet_controller::server::build(config)
            .await
            .expect("build");
        Server::serve(app).await
    }

    pub async fn serve(app: axum::Router) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Server {
            base: format!("http://{addr}"),
            http: reqwest::Client::new(),
        }
    }

    /// rivetd with `--no-auth` on `db`, served, and its conductor (for tests that reach
    /// into the store or install a fault hook).
    pub async fn start_no_auth(db: &TestDb) -> (Arc<rivet_conductor::Conductor>, Server) {
        let config = Config {
            no_auth: true,
            ..db.config()
        };
        let (conductor, app) = rivet_controller::server::build(config)
            .await
            .expect("build");
        (conductor, Server::serve(app).await)
    }

    /// Sends a request with an optional JSON body: the status and the JSON answer.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut r = self.request(method, path);
        if let Some(b) = body {
            r = r.json(&b);
        }
        answer(r).await
    }

    /// A request for `path`, asking for the latest API version.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.base))
            .header("X-OpenStack-Ironic-API-Version", "latest")
    }

    /// A request whose body is sent as given, labelled JSON: for bodies serde_json would
    /// never write (malformed, huge, nested without end).
    pub fn raw_json(&self, method: Method, path: &str, body: impl Into<Body>) -> RequestBuilder {
        self.request(method, path)
            .header("Content-Type", "application/json")
            .body(body)
    }
}

/// Sends `r`: the status and the JSON body (`Null` when the body is not JSON).
pub async fn answer(r: RequestBuilder) -> (StatusCode, Value) {
    let resp = r.send().await.expect("send");
    let s = resp.status();
    let text = resp.text().await.unwrap_or_default();
    (s, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// The error's human message (Ironic nests it as a JSON string): the protocol's own decoder.
pub fn message(v: &Value) -> String {
    serde_json::from_value::<rivet_protocol::api::ErrorBody>(v.clone())
        .map(|b| b.message())
        .unwrap_or_default()
}
