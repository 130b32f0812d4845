//! A panic inside one node's conductor task (injected with the test-only fault hook) fails
//! that node's operation with a `last_error` that says so, while other nodes go on; the node
//! is not wedged: once the fault is gone the same verb works again.
//!
//! Runs on SQLite and on PostgreSQL (`RIVET_TEST_POSTGRES`, see `support`).

use crate::support;

use reqwest::{Method, StatusCode};
use rivet_protocol::states::ProvisionState;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{on_every_backend, Server, TestDb};

on_every_backend!(panicking_node_task_fails_its_node_only);

async fn verb(s: &Server, node: &str, target: &str) {
    let (st, v) = s
        .call(
            Method::PUT,
            &format!("/v1/nodes/{node}/states/provision"),
            Some(json!({ "target": target })),
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{target} {node}: {v}");
}

async fn wait_for(s: &Server, node: &str, state: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, v) = s
            .call(Method::GET, &format!("/v1/nodes/{node}"), None)
            .await;
        // `enroll` is also where the node starts: only the failed one has a last_error.
        if v["provision_state"] == state && (state != "enroll" || !v["last_error"].is_null()) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{node} never reached {state}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn panicking_node_task_fails_its_node_only(db: TestDb) {
    let (conductor, s) = Server::start_no_auth(&db).await;
    for name in ["victim", "bystander"] {
        let (st, v) = s
            .call(
                Method::POST,
                "/v1/nodes",
                Some(json!({"name": name, "driver": "fake-hardware"})),
            )
            .await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
    }

    // Verification of the victim panics.
    conductor.set_fault_hook(Some(Arc::new(|n| {
        if n.name.as_deref() == Some("victim") {
            panic!("injected fault in {}", n.provision_state);
        }
    })));
    verb(&s, "victim", "manage").await;
    verb(&s, "bystander", "manage").await;
    let v = wait_for(&s, "victim", "enroll").await;
    let err = v["last_error"].as_str().unwrap_or_default();
    assert!(
        err.contains("internal error")
            && err.contains("node victim")
            && err.contains("injected fault in verifying"),
        "{err}"
    );
    wait_for(&s, "bystander", "manageable").await;

    // Not wedged: without the fault the same verb goes through.
    conductor.set_fault_hook(None);
    verb(&s, "victim", "manage").await;
    wait_for(&s, "victim", "manageable").await;

    // A panic during cleaning: clean failed, reservation released, the other node available.
    conductor.set_fault_hook(Some(Arc::new(|n| {
        if n.name.as_deref() == Some("victim") && n.provision_state == ProvisionState::Cleaning {
            panic!("injected fault while cleaning");
        }
    })));
    verb(&s, "victim", "provide").await;
    verb(&s, "bystander", "provide").await;
    let v = wait_for(&s, "victim", "clean failed").await;
    let err = v["last_error"].as_str().unwrap_or_default();
    assert!(err.contains("injected fault while cleaning"), "{err}");
    assert!(v["reservation"].is_null(), "{v}");
    wait_for(&s, "bystander", "available").await;
    assert!(
        !conductor.is_running(v["uuid"].as_str().unwrap_or_default()),
        "the victim's task is still registered as running"
    );
}
