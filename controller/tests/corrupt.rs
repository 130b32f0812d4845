//! A node whose stored JSON is damaged (by hand, or by a failing disk) is shown with an error
//! naming the node and the column, refused for every write, and its stored bytes are never
//! overwritten — not even by a writer holding a copy read before the damage. Other nodes go
//! on working. The damage is done with the database's own client (`sqlite3`, `psql`), as an
//! operator or a bad disk would, outside rivetd.
//!
//! Runs on SQLite and on PostgreSQL (`RIVET_TEST_POSTGRES`, see `support`).

use crate::support;

use reqwest::{Method, StatusCode};
use rivet_store::StoreError;
use serde_json::json;
use std::process::Command;
use std::time::Duration;
use support::{message, on_every_backend, Server, TestDb};

on_every_backend!(
    damaged_node_is_shown_refused_and_kept,
    malformed_cleaning_run_fails_instead_of_restarting,
);

/// Runs `sql` with the backend's command-line client; its output, trimmed.
fn sql(db: &TestDb, sql: &str) -> String {
    let (tool, out) = if db.is_postgres() {
        (
            "psql",
            Command::new("psql")
                .args([
                    "-X",
                    "-q",
                    "-A",
                    "-t",
                    "-v",
                    "ON_ERROR_STOP=1",
                    "-d",
                    &db.url(),
                    "-c",
                    sql,
                ])
                .output(),
        )
    } else {
        (
            "sqlite3",
            Command::new("sqlite3")
                .arg(db.sqlite_file())
                .arg(sql)
                .output(),
        )
    };
    let out = out.unwrap_or_else(|e| {
        panic!("{tool} cannot run ({e}): scripts/setup.sh installs it (sqlite3, postgresql-client)")
    });
    assert!(
        out.status.success(),
        "{tool} failed on {sql:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn have_client(db: &TestDb) -> bool {
    let tool = if db.is_postgres() { "psql" } else { "sqlite3" };
    let ok = Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        let why = format!("{tool} is not installed (scripts/setup.sh installs it)");
        if std::env::var("RIVET_REQUIRE_PEERS").as_deref() == Ok("1") {
            panic!("missing prerequisite: {why} (RIVET_REQUIRE_PEERS=1)");
        }
        eprintln!("skipping: {why}");
    }
    ok
}

async fn damaged_node_is_shown_refused_and_kept(db: TestDb) {
    if !have_client(&db) {
        return;
    }
    let (conductor, s) = Server::start_no_auth(&db).await;
    for name in ["broken", "fine", "stale"] {
        let (st, v) = s
            .call(
                Method::POST,
                "/v1/nodes",
                Some(json!({"name": name, "driver": "fake-hardware", "extra": {"rack": "r1"}})),
            )
            .await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
    }
    // The JSON type of PostgreSQL refuses malformed text, so the damage there is an array
    // where an object belongs; SQLite stores whatever text it is given.
    let damage = if db.is_postgres() {
        r#"["half", "a", "record"]"#
    } else {
        r#"{"agent_token_hash": "ab"#
    };
    sql(
        &db,
        &format!("UPDATE nodes SET driver_internal_info = '{damage}' WHERE name = 'broken'"),
    );
    let stored = || {
        sql(
            &db,
            "SELECT driver_internal_info FROM nodes WHERE name = 'broken'",
        )
    };
    assert_eq!(stored(), damage);

    // Shown, with the error naming the node and the column.
    let (st, v) = s.call(Method::GET, "/v1/nodes/broken", None).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let last_error = v["last_error"].as_str().unwrap_or_default().to_string();
    assert!(
        last_error.contains("node broken") && last_error.contains("driver_internal_info"),
        "{last_error}"
    );
    let (st, v) = s.call(Method::GET, "/v1/nodes/detail", None).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["nodes"].as_array().map(Vec::len), Some(3), "{v}");

    // Every write refused with a 409 that says what is wrong; nothing changes.
    let patch = json!([{"op": "add", "path": "/extra/owner", "value": "ops"}]);
    let refusals = [
        (Method::PATCH, "/v1/nodes/broken", Some(patch.clone())),
        (
            Method::PUT,
            "/v1/nodes/broken/states/provision",
            Some(json!({"target": "manage"})),
        ),
        (Method::DELETE, "/v1/nodes/broken", None),
    ];
    for (method, path, body) in refusals {
        let (st, v) = s.call(method.clone(), path, body).await;
        assert_eq!(st, StatusCode::CONFLICT, "{method} {path}: {v}");
        let m = message(&v);
        assert!(
            m.contains("driver_internal_info") && m.contains("node broken") && m.contains("repair"),
            "{method} {path}: {m}"
        );
    }
    assert_eq!(stored(), damage, "the damaged bytes were rewritten");
    let extra = sql(&db, "SELECT extra FROM nodes WHERE name = 'broken'");
    assert!(!extra.contains("owner"), "{extra}");

    // A writer holding a copy read before the damage cannot overwrite it either: its write
    // conflicts, and the reload it then does is refused as corrupt.
    let before = conductor.store.get_node("stale").await.expect("read");
    sql(
        &db,
        &format!("UPDATE nodes SET driver_internal_info = '{damage}' WHERE name = 'stale'"),
    );
    let mut edited = before.clone();
    edited.extra.insert("owner".into(), json!("ops"));
    match conductor.store.update_node(&edited).await {
        Err(StoreError::Conflict { .. }) => {}
        other => panic!("a stale copy overwrote a damaged record: {other:?}"),
    }
    let reloaded = conductor.store.get_node("stale").await.expect("read");
    match conductor.store.update_node(&reloaded).await {
        Err(StoreError::Corrupt { field, .. }) => assert_eq!(field, "driver_internal_info"),
        other => panic!("a damaged record was written: {other:?}"),
    }
    assert_eq!(
        sql(
            &db,
            "SELECT driver_internal_info FROM nodes WHERE name = 'stale'"
        ),
        damage
    );

    // The other node works as before: patched, and driven through verification.
    let (st, v) = s.call(Method::PATCH, "/v1/nodes/fine", Some(patch)).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (st, v) = s
        .call(
            Method::PUT,
            "/v1/nodes/fine/states/provision",
            Some(json!({"target": "manage"})),
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{v}");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, v) = s.call(Method::GET, "/v1/nodes/fine", None).await;
        if v["provision_state"] == "manageable" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "fine never became manageable: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Repaired by hand, the node is writable again.
    sql(
        &db,
        "UPDATE nodes SET driver_internal_info = '{}' WHERE name = 'broken'",
    );
    let (st, v) = s
        .call(
            Method::PATCH,
            "/v1/nodes/broken",
            Some(json!([{"op": "add", "path": "/extra/owner", "value": "ops"}])),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert!(v["last_error"].is_null(), "{v}");
}

/// A cleaning run whose stored state is valid JSON but not what the engine wrote (a plan that
/// is not a list) marks the node corrupt naming `run_state`: it is shown with that error, the
/// conductor leaves it alone (the steps are not gathered and run again from the first), every
/// write is refused and the stored bytes stay as they are.
async fn malformed_cleaning_run_fails_instead_of_restarting(db: TestDb) {
    let (conductor, s) = Server::start_no_auth(&db).await;
    let (st, v) = s
        .call(
            Method::POST,
            "/v1/nodes",
            Some(json!({"name": "n1", "driver": "fake-hardware", "deploy_interface": "direct"})),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let uuid = v["uuid"].as_str().unwrap_or_default().to_string();
    for (target, state) in [("manage", "manageable"), ("provide", "clean wait")] {
        let (st, v) = s
            .call(
                Method::PUT,
                "/v1/nodes/n1/states/provision",
                Some(json!({ "target": target })),
            )
            .await;
        assert_eq!(st, StatusCode::ACCEPTED, "{v}");
        wait_state(&s, state).await;
    }
    let run = sql(&db, "SELECT run_state FROM nodes WHERE name = 'n1'");
    assert!(
        run.contains("\"clean\""),
        "the run is in its own column: {run}"
    );
    let damage = r#"{"v": 1, "clean": {"plan": {"steps": "lost"}}}"#;
    sql(
        &db,
        &format!("UPDATE nodes SET run_state = '{damage}' WHERE name = 'n1'"),
    );
    let before = conductor
        .store
        .pending_commands(&uuid)
        .await
        .expect("queue")
        .len();
    conductor.kick(&uuid);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (st, v) = s.call(Method::GET, "/v1/nodes/n1", None).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["provision_state"], "clean wait", "{v}");
    let err = v["last_error"].as_str().unwrap_or_default();
    assert!(
        err.contains("node n1") && err.contains("run_state"),
        "{err}"
    );
    let (st, v) = s
        .call(
            Method::PUT,
            "/v1/nodes/n1/states/provision",
            Some(json!({"target": "abort"})),
        )
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
    assert!(message(&v).contains("run_state"), "{v}");
    let pending = conductor
        .store
        .pending_commands(&uuid)
        .await
        .expect("queue");
    assert_eq!(
        pending.len(),
        before,
        "the conductor acted on a damaged run: {pending:?}"
    );
    assert_eq!(
        sql(&db, "SELECT run_state FROM nodes WHERE name = 'n1'").replace(' ', ""),
        damage.replace(' ', ""),
        "the stored bytes changed"
    );
}

async fn wait_state(s: &Server, state: &str) -> serde_json::Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, v) = s.call(Method::GET, "/v1/nodes/n1", None).await;
        if v["provision_state"] == state {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never reached {state}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
