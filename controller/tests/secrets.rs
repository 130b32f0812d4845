//! Secrets at rest, on both store backends: BMC passwords given through the API are sealed
//! in the database (the raw column text read with plain SQL, and for SQLite the raw bytes of
//! the file and its -wal/-shm, never hold them), the API still masks them, the store hands
//! them back in clear, and `secrets::rotate` re-seals everything (clear legacy values too)
//! so that only the new key opens them.
//!
//! `NAME::postgres` runs when `RIVET_TEST_POSTGRES` names a server (scripts/setup-postgres.sh);
//! without it it skips with a message, or fails when `RIVET_REQUIRE_PEERS=1` (CI).

use crate::support;

use reqwest::StatusCode;
use rivet_model::config::Config;
use rivet_model::node::Node;
use rivet_store::sealing::rotate;
use rivet_support::secrets::{Key, Secrets};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;
use support::{on_every_backend, pg, Server, TestDb};

const REDFISH_PW: &str = "Redfish-Pa55w0rd-at-rest";
const IPMI_PW: &str = "Ipmi-Pa55w0rd-at-rest";
const TOKEN: &str = "Nested-T0ken-at-rest";
const PATCHED_PW: &str = "Patched-Pa55w0rd-at-rest";
const LEGACY_PW: &str = "Legacy-Clear-Pa55w0rd";

/// `driver_info` of every node as the database holds it, by plain SQL.
async fn raw_driver_info(db: &TestDb) -> Vec<(String, String)> {
    if db.is_postgres() {
        return pg(&db.url())
            .await
            .query("SELECT uuid, driver_info::text FROM nodes ORDER BY id", &[])
            .await
            .expect("query")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
    }
    let c = rusqlite::Connection::open(db.sqlite_file()).expect("sqlite");
    let mut st = c
        .prepare("SELECT uuid, driver_info FROM nodes ORDER BY id")
        .expect("prepare");
    let rows = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("query");
    rows.collect::<Result<_, _>>().expect("rows")
}

/// Overwrite a node's stored driver_info with `text` (a row written before sealing).
async fn write_raw(db: &TestDb, uuid: &str, text: &str) {
    if db.is_postgres() {
        pg(&db.url())
            .await
            .execute(
                "UPDATE nodes SET driver_info = $1::text::json WHERE uuid = $2",
                &[&text, &uuid],
            )
            .await
            .expect("update");
        return;
    }
    let c = rusqlite::Connection::open(db.sqlite_file()).expect("sqlite");
    c.execute(
        "UPDATE nodes SET driver_info = ?1 WHERE uuid = ?2",
        [text, uuid],
    )
    .expect("update");
}

on_every_backend!(
    api_passwords_are_sealed_in_the_database,
    rotate_reseals_everything_and_only_the_new_key_opens
);

fn no_password_in(text: &str, what: &str) {
    for pw in [REDFISH_PW, IPMI_PW, TOKEN, PATCHED_PW, LEGACY_PW] {
        assert!(!text.contains(pw), "{what} holds {pw} in clear");
    }
}

async fn api_passwords_are_sealed_in_the_database(db: TestDb) {
    let config = Config {
        no_auth: true,
        ..db.config()
    };
    let server = Server::start(config).await;
    let call = |method: reqwest::Method, path: &str, body: Value| {
        server.request(method, path).json(&body).send()
    };
    for (name, driver, info) in [
        (
            "rf",
            "redfish",
            json!({"redfish_address": "https://10.0.0.1", "redfish_username": "root",
                   "redfish_password": REDFISH_PW, "extra": {"api_token": TOKEN}}),
        ),
        (
            "bmc",
            "ipmi",
            json!({"ipmi_address": "10.0.0.2", "ipmi_username": "admin", "ipmi_password": IPMI_PW}),
        ),
    ] {
        let r = call(
            reqwest::Method::POST,
            "/v1/nodes",
            json!({"name": name, "driver": driver, "driver_info": info}),
        )
        .await
        .expect("create");
        assert_eq!(r.status(), StatusCode::CREATED);
        let text = r.text().await.expect("body");
        no_password_in(&text, "the create answer");
        assert!(text.contains("******"), "{text}");
    }
    // A JSON patch is the update path.
    let r = call(
        reqwest::Method::PATCH,
        "/v1/nodes/bmc",
        json!([{"op": "replace", "path": "/driver_info/ipmi_password", "value": PATCHED_PW}]),
    )
    .await
    .expect("patch");
    assert_eq!(r.status(), StatusCode::OK);
    no_password_in(&r.text().await.expect("body"), "the patch answer");
    for path in ["/v1/nodes/rf", "/v1/nodes/bmc", "/v1/nodes/detail"] {
        let r = server
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .expect("get");
        no_password_in(&r.text().await.expect("body"), path);
    }

    let raw = raw_driver_info(&db).await;
    assert_eq!(raw.len(), 2, "{raw:?}");
    for (uuid, text) in &raw {
        no_password_in(text, &format!("node {uuid}'s driver_info column"));
        assert!(text.contains("rivet-sealed:v2:"), "{text}");
    }
    assert!(
        raw[0].1.contains("10.0.0.1"),
        "only secrets are sealed: {}",
        raw[0].1
    );
    if !db.is_postgres() {
        // The raw bytes, before and after a checkpoint: pages in the WAL count too.
        let scan = |when: &str| {
            for suffix in ["", "-wal", "-shm"] {
                let path = PathBuf::from(format!("{}{suffix}", db.sqlite_file().display()));
                if let Ok(bytes) = std::fs::read(&path) {
                    let text = String::from_utf8_lossy(&bytes);
                    no_password_in(&text, &format!("{} ({when})", path.display()));
                }
            }
        };
        scan("live");
        let c = rusqlite::Connection::open(db.sqlite_file()).expect("sqlite");
        c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .expect("checkpoint");
        scan("checkpointed");
    }

    // The store hands the clear values back to the drivers.
    let s = db.open(db.configured());
    let rf = s.get_node("rf").await.expect("rf");
    assert_eq!(rf.driver_info["redfish_password"], REDFISH_PW);
    assert_eq!(rf.driver_info["extra"]["api_token"], TOKEN);
    let bmc = s.get_node("bmc").await.expect("bmc");
    assert_eq!(bmc.driver_info["ipmi_password"], PATCHED_PW);
    assert_eq!(bmc.driver_info["ipmi_username"], "admin");
}

async fn rotate_reseals_everything_and_only_the_new_key_opens(db: TestDb) {
    let old = db.configured();
    let s = db.open(db.configured());
    let mut with_secrets = Vec::new();
    for (name, info) in [
        (
            "a",
            json!({"ipmi_address": "10.0.0.3", "ipmi_password": IPMI_PW}),
        ),
        (
            "b",
            json!({"redfish_password": REDFISH_PW, "extra": {"api_token": TOKEN}}),
        ),
        ("plain", json!({"ipmi_address": "10.0.0.4"})),
        ("legacy", json!({})),
    ] {
        let mut n = Node::new(uuid::Uuid::new_v4().to_string(), "ipmi".into());
        n.name = Some(name.into());
        n.driver_info = info.as_object().cloned().unwrap_or_default();
        with_secrets.push(s.create_node(&n).await.expect("create"));
    }
    // A row written before sealing existed: its password in clear.
    let legacy = with_secrets[3].uuid.clone();
    let legacy_info = json!({"ipmi_password": LEGACY_PW}).to_string();
    write_raw(&db, &legacy, &legacy_info).await;
    let n = s.get_node(&legacy).await.expect("legacy reads");
    assert_eq!(n.driver_info["ipmi_password"], LEGACY_PW);
    drop(s);

    let new_path = db.dir().join("new.key");
    Key::generate()
        .expect("key")
        .write_new(&new_path)
        .expect("new key");
    let new = Key::load(&new_path).expect("load");
    let report = rotate(&db.url(), &old, &new).await.expect("rotate");
    assert_eq!(report.nodes_checked, 4, "{report:?}");
    assert_eq!(report.nodes_changed, 3, "{report:?}");
    assert_eq!(report.fields_resealed, 4, "{report:?}");
    assert_eq!(report.fields_were_clear, 1, "{report:?}");
    let again = rotate(&db.url(), &old, &new).await.expect("rotate again");
    assert_eq!(
        (again.nodes_changed, again.fields_resealed),
        (0, 0),
        "{again:?}"
    );

    let raw = raw_driver_info(&db).await;
    for (uuid, text) in &raw {
        no_password_in(text, &format!("node {uuid} after rotate"));
        if text.contains("password") || text.contains("token") {
            assert!(
                text.contains(&format!("rivet-sealed:v2:{}:", new.id())),
                "{text}"
            );
            assert!(!text.contains(old.key_id().expect("id")), "{text}");
        }
    }

    // The old key alone no longer opens them, and says why.
    let err = db
        .open(db.configured())
        .get_node("a")
        .await
        .expect_err("old key");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("was sealed with key {}", new.id())) && msg.contains("rotate"),
        "{msg}"
    );
    // The new key does (and the old one as previous_key_file is not needed).
    let s = db.open(Arc::new(Secrets::new(&new, &[])));
    assert_eq!(
        s.get_node("a").await.expect("a").driver_info["ipmi_password"],
        IPMI_PW
    );
    let b = s.get_node("b").await.expect("b");
    assert_eq!(b.driver_info["extra"]["api_token"], TOKEN);
    assert_eq!(
        s.get_node(&legacy).await.expect("legacy").driver_info["ipmi_password"],
        LEGACY_PW
    );

    // A clear legacy row is also sealed on the node's next ordinary write.
    write_raw(&db, &legacy, &legacy_info).await;
    let n = s.get_node(&legacy).await.expect("legacy");
    s.update_node(&n).await.expect("write");
    let raw = raw_driver_info(&db).await;
    let (_, text) = raw.iter().find(|(u, _)| *u == legacy).expect("row");
    no_password_in(text, "the legacy node after a write");
    assert!(text.contains("rivet-sealed:v2:"), "{text}");
}
