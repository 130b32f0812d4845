//! `GET /v1/nodes/{node}/logs[/{id}]` by role: admin and operator read a node's kept agent
//! logs, a reader is refused (403 naming its role), no credentials get 401.

use crate::support;

use chrono::Utc;
use reqwest::{Method, StatusCode};
use rivet_store::NodeLog;
use serde_json::json;
use support::{add_role_tokens, answer, message, Server, TestDb};

#[tokio::test]
async fn logs_are_for_admin_and_operator_only() {
    let db = TestDb::sqlite();
    let mut config = db.config();
    add_role_tokens(&mut config);
    let (conductor, app) = rivet_controller::server::build(config)
        .await
        .expect("build");
    let server = Server::serve(app).await;
    let (s, v) = answer(
        server
            .request(Method::POST, "/v1/nodes")
            .bearer_auth("boss-token")
            .json(&json!({"driver": "fake-hardware", "name": "n1"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let uuid = v["uuid"].as_str().unwrap_or_default().to_string();
    let log = conductor
        .store
        .add_node_log(&NodeLog {
            id: 0,
            node_uuid: uuid.clone(),
            created_at: Utc::now(),
            operation: "deploy".into(),
            step: Some("write_image".into()),
            command_id: Some("c-1".into()),
            text: "writing\nno space left".into(),
        })
        .await
        .expect("add");

    for who in ["boss", "ops"] {
        let (s, v) = answer(
            server
                .request(Method::GET, "/v1/nodes/n1/logs")
                .bearer_auth(format!("{who}-token")),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{who}: {v}");
        assert_eq!(v["logs"][0]["text"], "writing\nno space left", "{v}");
        assert_eq!(v["logs"][0]["step"], "write_image", "{v}");
        let (s, v) = answer(
            server
                .request(Method::GET, &format!("/v1/nodes/{uuid}/logs/{}", log.id))
                .bearer_auth(format!("{who}-token")),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{who}: {v}");
        assert_eq!(v["id"], log.id, "{v}");
        assert_eq!(v["operation"], "deploy", "{v}");
    }
    for path in [
        "/v1/nodes/n1/logs".to_string(),
        format!("/v1/nodes/n1/logs/{}", log.id),
    ] {
        let (s, v) = answer(
            server
                .request(Method::GET, &path)
                .bearer_auth("viewer-token"),
        )
        .await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
        assert!(message(&v).contains("role reader"), "{v}");
        let (s, _) = answer(server.request(Method::GET, &path)).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED);
    }
}
