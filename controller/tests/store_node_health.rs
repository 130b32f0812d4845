//! `nodes.health` (migration 15, API 1.109) on both backends (SQLite always, PostgreSQL
//! with `RIVET_TEST_POSTGRES`): created null, written and cleared by a node update, read
//! back by get and list, and the columns read after it (liveness, allocation) still in place.

use crate::support;

use chrono::Utc;
use rivet_model::node::{Liveness, Node};
use rivet_store::NodeQuery;
use serde_json::json;
use support::{on_every_backend, TestDb};

on_every_backend!(health_round_trip);

async fn health_round_trip(db: TestDb) {
    let s = db.open(rivet_support::secrets::Secrets::ephemeral());
    let uuid = "6a0c1d2e-0000-4000-8000-0000000001a0";
    let created = s
        .create_node(&Node::new(uuid.into(), "redfish".into()))
        .await
        .expect("create");
    assert_eq!(created.health, None);

    let mut n = created.clone();
    n.health = Some("Warning".into());
    let written = s.update_node(&n).await.expect("update");
    assert_eq!(written.health.as_deref(), Some("Warning"));
    assert_eq!(
        s.get_node(uuid).await.expect("get").health.as_deref(),
        Some("Warning")
    );

    // Liveness is read from the columns after `health`: a shifted index would mix them up.
    let now = Utc::now();
    let live = Liveness {
        last_heartbeat: Some(now),
        agent_version: Some("9.9.9".into()),
        progress: Some(json!({"command_id": "c", "step": "s", "progress": 40})),
    };
    s.record_liveness(uuid, &live).await.expect("liveness");
    let got = s.get_node(uuid).await.expect("get");
    assert_eq!(got.health.as_deref(), Some("Warning"));
    assert_eq!(got.liveness.agent_version.as_deref(), Some("9.9.9"));
    assert_eq!(got.liveness.progress, live.progress);
    assert!(got.liveness.last_heartbeat.is_some());
    assert_eq!(got.allocation_uuid, None);
    assert_eq!(got.corrupt, None);

    let listed = s.list_nodes(&NodeQuery::default()).await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].health.as_deref(), Some("Warning"));

    let mut cleared = got.clone();
    cleared.health = None;
    s.update_node(&cleared).await.expect("clear");
    assert_eq!(s.get_node(uuid).await.expect("get").health, None);
}
