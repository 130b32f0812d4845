//! Roles end to end: admin, operator and reader credentials against a real router, each
//! allowed or refused (403 naming the role and what it lacks), and driver_info hidden from
//! non-admins.

use crate::support;

use reqwest::StatusCode;
use serde_json::{json, Value};
use support::{add_role_tokens, answer, message, Server, TestDb};

async fn start() -> (Server, TestDb) {
    let db = TestDb::sqlite();
    let mut config = db.config();
    add_role_tokens(&mut config);
    (Server::start(config).await, db)
}

async fn call(
    server: &Server,
    who: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut r = server
        .request(method, path)
        .bearer_auth(format!("{who}-token"));
    if let Some(b) = body {
        r = r.json(&b);
    }
    answer(r).await
}

#[tokio::test]
async fn each_role_allowed_and_refused() {
    use reqwest::Method as M;
    let (server, _db) = start().await;
    let node = json!({"driver": "fake-hardware", "name": "n1", "driver_info": {"ipmi_address": "10.1.2.3", "ipmi_password": "pw"}});

    // Operator and reader cannot create; admin can.
    let (s, v) = call(&server, "ops", M::POST, "/v1/nodes", Some(node.clone())).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert!(
        message(&v).contains("role operator") && message(&v).contains("creating"),
        "{v}"
    );
    let (s, v) = call(&server, "viewer", M::POST, "/v1/nodes", Some(node.clone())).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert!(message(&v).contains("role reader"), "{v}");
    let (s, v) = call(&server, "boss", M::POST, "/v1/nodes", Some(node)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["driver_info"]["ipmi_address"], "10.1.2.3");

    // Everyone reads; only admin sees driver_info.
    for who in ["ops", "viewer"] {
        let (s, v) = call(&server, who, M::GET, "/v1/nodes/n1", None).await;
        assert_eq!(s, 200);
        assert!(v.get("driver_info").is_none(), "{who} saw driver_info: {v}");
        let (_, list) = call(&server, who, M::GET, "/v1/nodes/detail", None).await;
        assert!(
            list["nodes"][0].get("driver_info").is_none(),
            "{who}: {list}"
        );
        assert_eq!(list["nodes"][0]["name"], "n1");
    }

    // Operator: provision, power and maintenance verbs, nothing else.
    let (s, v) = call(
        &server,
        "ops",
        M::PUT,
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "manage"})),
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let (s, _) = call(
        &server,
        "ops",
        M::PUT,
        "/v1/nodes/n1/maintenance",
        Some(json!({"reason": "x"})),
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let (s, v) = call(
        &server,
        "ops",
        M::PATCH,
        "/v1/nodes/n1",
        Some(json!([{"op": "add", "path": "/extra/a", "value": 1}])),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    let (s, _) = call(&server, "ops", M::DELETE, "/v1/nodes/n1", None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = call(
        &server,
        "ops",
        M::POST,
        "/v1/inspection_rules",
        Some(json!({"actions": [{"action": "add-trait", "name": "X"}]})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    // Reader: nothing that changes state.
    let (s, v) = call(
        &server,
        "viewer",
        M::PUT,
        "/v1/nodes/n1/states/power",
        Some(json!({"target": "power on"})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert!(message(&v).contains("read-only"), "{v}");

    // A wrong token is 401, not 403.
    let (s, _) = call(&server, "nobody", M::GET, "/v1/nodes", None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
}
