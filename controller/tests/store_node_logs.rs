//! The agent logs kept with a node (migration 16) on both backends (SQLite always,
//! PostgreSQL with `RIVET_TEST_POSTGRES`): newest first, only the newest few kept, per node,
//! gone with the node.

use crate::support;

use chrono::Utc;
use rivet_model::node::Node;
use rivet_store::{NodeLog, StoreError, NODE_LOGS_KEPT};
use support::{on_every_backend, TestDb};

on_every_backend!(node_logs_round_trip);

fn log(node: &str, n: i64) -> NodeLog {
    NodeLog {
        id: 0,
        node_uuid: node.into(),
        created_at: Utc::now(),
        operation: "clean".into(),
        step: Some(format!("step-{n}")),
        command_id: (n % 2 == 0).then(|| format!("cmd-{n}")),
        text: format!("line {n}\nsecond line"),
    }
}

async fn node_logs_round_trip(db: TestDb) {
    let s = db.open(rivet_support::secrets::Secrets::ephemeral());
    let a = "6a0c1d2e-0000-4000-8000-0000000000a1";
    let b = "6a0c1d2e-0000-4000-8000-0000000000b2";
    for u in [a, b] {
        s.create_node(&Node::new(u.into(), "fake-hardware".into()))
            .await
            .expect("node");
    }
    assert!(s.list_node_logs(a).await.expect("empty").is_empty());

    let first = s.add_node_log(&log(a, 0)).await.expect("add");
    assert!(first.id > 0);
    assert_eq!(first.text, "line 0\nsecond line");
    assert_eq!(first.command_id.as_deref(), Some("cmd-0"));
    let got = s.get_node_log(a, first.id).await.expect("get");
    assert_eq!(got, first);
    // A log is found only under its own node.
    assert!(matches!(
        s.get_node_log(b, first.id).await,
        Err(StoreError::NotFound { .. })
    ));

    s.add_node_log(&log(b, 100)).await.expect("other node");
    for n in 1..NODE_LOGS_KEPT + 3 {
        s.add_node_log(&log(a, n)).await.expect("add");
    }
    let all = s.list_node_logs(a).await.expect("list");
    assert_eq!(all.len() as i64, NODE_LOGS_KEPT);
    assert_eq!(
        all[0].step.as_deref(),
        Some(format!("step-{}", NODE_LOGS_KEPT + 2).as_str())
    );
    assert!(all.windows(2).all(|w| w[0].id > w[1].id), "newest first");
    assert!(all.iter().all(|l| l.node_uuid == a));
    assert!(
        matches!(
            s.get_node_log(a, first.id).await,
            Err(StoreError::NotFound { .. })
        ),
        "the oldest was dropped"
    );
    assert_eq!(s.list_node_logs(b).await.expect("b").len(), 1);

    let node = s.get_node(a).await.expect("node");
    s.delete_node(a, node.version).await.expect("delete");
    assert!(s.list_node_logs(a).await.expect("gone").is_empty());
    assert_eq!(s.list_node_logs(b).await.expect("b kept").len(), 1);
}
