//! Roles end to end: admin, operator and reader credentials against a real router, each
//! allowed or refused (403 naming the role and what it lacks), and driver_info hidden from
//! non-admins.

use reqwest::StatusCode;
use rivet_controller::config::{hash_secret, Config, Role, TokenEntry};
use serde_json::{json, Value};

async fn start() -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = Config {
        db: format!("sqlite:{}", dir.path().join("rivet.db").display()),
        ..Config::default()
    };
    for (name, role) in [
        ("boss", Role::Admin),
        ("ops", Role::Operator),
        ("viewer", Role::Reader),
    ] {
        config.auth.tokens.push(TokenEntry {
            name: name.into(),
            hash: hash_secret(&format!("{name}-token")),
            role,
        });
    }
    let (_c, app) = rivet_controller::server::build(config)
        .await
        .expect("build");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), dir)
}

async fn call(
    base: &str,
    who: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut r = reqwest::Client::new()
        .request(method, format!("{base}{path}"))
        .header("X-OpenStack-Ironic-API-Version", "latest")
        .bearer_auth(format!("{who}-token"));
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().await.expect("send");
    let s = resp.status();
    (s, resp.json().await.unwrap_or(Value::Null))
}

/// The error's human message (Ironic nests it as a JSON string): the protocol's own decoder.
fn message(v: &Value) -> String {
    serde_json::from_value::<rivet_protocol::api::ErrorBody>(v.clone())
        .map(|b| b.message())
        .unwrap_or_default()
}

#[tokio::test]
async fn each_role_allowed_and_refused() {
    use reqwest::Method as M;
    let (base, _dir) = start().await;
    let node = json!({"driver": "fake-hardware", "name": "n1", "driver_info": {"ipmi_address": "10.1.2.3", "ipmi_password": "pw"}});

    // Operator and reader cannot create; admin can.
    let (s, v) = call(&base, "ops", M::POST, "/v1/nodes", Some(node.clone())).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert!(
        message(&v).contains("role operator") && message(&v).contains("creating"),
        "{v}"
    );
    let (s, v) = call(&base, "viewer", M::POST, "/v1/nodes", Some(node.clone())).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert!(message(&v).contains("role reader"), "{v}");
    let (s, v) = call(&base, "boss", M::POST, "/v1/nodes", Some(node)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["driver_info"]["ipmi_address"], "10.1.2.3");

    // Everyone reads; only admin sees driver_info.
    for who in ["ops", "viewer"] {
        let (s, v) = call(&base, who, M::GET, "/v1/nodes/n1", None).await;
        assert_eq!(s, 200);
        assert!(v.get("driver_info").is_none(), "{who} saw driver_info: {v}");
        let (_, list) = call(&base, who, M::GET, "/v1/nodes/detail", None).await;
        assert!(
            list["nodes"][0].get("driver_info").is_none(),
            "{who}: {list}"
        );
        assert_eq!(list["nodes"][0]["name"], "n1");
    }

    // Operator: provision, power and maintenance verbs, nothing else.
    let (s, v) = call(
        &base,
        "ops",
        M::PUT,
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "manage"})),
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let (s, _) = call(
        &base,
        "ops",
        M::PUT,
        "/v1/nodes/n1/maintenance",
        Some(json!({"reason": "x"})),
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let (s, v) = call(
        &base,
        "ops",
        M::PATCH,
        "/v1/nodes/n1",
        Some(json!([{"op": "add", "path": "/extra/a", "value": 1}])),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    let (s, _) = call(&base, "ops", M::DELETE, "/v1/nodes/n1", None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = call(
        &base,
        "ops",
        M::POST,
        "/v1/inspection_rules",
        Some(json!({"actions": [{"action": "add-trait", "name": "X"}]})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    // Reader: nothing that changes state.
    let (s, v) = call(
        &base,
        "viewer",
        M::PUT,
        "/v1/nodes/n1/states/power",
        Some(json!({"target": "power on"})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert!(message(&v).contains("read-only"), "{v}");

    // A wrong token is 401, not 403.
    let (s, _) = call(&base, "nobody", M::GET, "/v1/nodes", None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
}
