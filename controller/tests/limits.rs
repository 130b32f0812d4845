//! Request limits through a real rivetd router: nesting depth, string and key lengths, keys per
//! object, steps and patch operations per request, on admin and agent endpoints. Each broken
//! limit is a 400 naming the field and the limit, and changes nothing.

use crate::support;

use reqwest::{Method, StatusCode};
use rivet_model::config::Config;
use serde_json::{json, Value};
use support::{answer, message, Server, TestDb};

struct App {
    server: Server,
    _db: TestDb,
}

async fn start() -> App {
    let db = TestDb::sqlite();
    let config = Config {
        no_auth: true,
        ..db.config()
    };
    App {
        server: Server::start(config).await,
        _db: db,
    }
}

impl App {
    async fn call(&self, method: Method, path: &str, body: String) -> (StatusCode, Value) {
        answer(self.server.raw_json(method, path, body)).await
    }

    async fn get(&self, path: &str) -> Value {
        let (s, v) = self.call(Method::GET, path, String::new()).await;
        assert_eq!(s, StatusCode::OK, "{path}: {v}");
        v
    }
}

fn nested(depth: usize) -> Value {
    let mut v = json!(1);
    for _ in 0..depth {
        v = json!({ "a": v });
    }
    v
}

#[tokio::test]
async fn each_limit_is_a_400_that_changes_nothing() {
    let app = start().await;
    let (s, v) = app
        .call(
            Method::POST,
            "/v1/nodes",
            json!({"driver": "fake-hardware", "name": "n1", "extra": {"a": nested(25)}})
                .to_string(),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = app
        .call(
            Method::POST,
            "/v1/ports",
            json!({"address": "52:54:00:00:00:01", "node_uuid": "n1"}).to_string(),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let nodes_before = app.get("/v1/nodes?detail=true").await;
    let ports_before = app.get("/v1/ports?detail=true").await;

    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let deep_field = |field: &str| {
        format!(
            r#"{{"driver":"fake-hardware","{field}":{}1{}}}"#,
            "{\"k\":".repeat(100_000),
            "}".repeat(100_000)
        )
    };
    let step = json!({"interface": "deploy", "step": "erase_devices_metadata"});
    let op = json!({"op": "add", "path": "/extra/b", "value": 1});
    let many_keys: serde_json::Map<String, Value> =
        (0..1001).map(|i| (format!("k{i}"), json!(i))).collect();
    let cases: Vec<(Method, &str, String, &str)> = vec![
        (Method::POST, "/v1/nodes", deep.clone(), "[0][0][0]: nested deeper than 32 levels"),
        (Method::POST, "/v1/nodes", deep_field("driver_info"), "nested deeper than 32 levels"),
        (Method::POST, "/v1/nodes", deep_field("extra"), "nested deeper than 32 levels"),
        (
            Method::POST,
            "/v1/nodes",
            json!({"driver": "fake-hardware", "name": "n".repeat(5000)}).to_string(),
            "name: string of 5000 bytes, at most 4096 allowed",
        ),
        (
            Method::POST,
            "/v1/nodes",
            json!({"driver": "fake-hardware", "driver_info": {"k".repeat(256): "v"}}).to_string(),
            "driver_info: a key of 256 bytes, at most 255 allowed",
        ),
        (
            Method::POST,
            "/v1/nodes",
            json!({"driver": "fake-hardware", "properties": many_keys}).to_string(),
            "properties: more than 1000 keys in one object",
        ),
        (
            Method::PATCH,
            "/v1/nodes/n1",
            json!(vec![op; 101]).to_string(),
            "request body: 101 patch operations, at most 100 per request",
        ),
        (
            // Each body is small, but the result would nest 25 + 20 levels under extra.
            Method::PATCH,
            "/v1/nodes/n1",
            json!([{"op": "add", "path": format!("/extra/a{}", "/a".repeat(24)), "value": nested(20)}])
                .to_string(),
            "nested deeper than 32 levels",
        ),
        (
            Method::PUT,
            "/v1/nodes/n1/states/provision",
            json!({"target": "clean", "clean_steps": vec![step; 5000]}).to_string(),
            "clean_steps: 5000 steps, at most 200 per request",
        ),
        (
            Method::PUT,
            "/v1/nodes/n1/states/power",
            json!({"target": "x".repeat(5000)}).to_string(),
            "target: string of 5000 bytes",
        ),
        (Method::PUT, "/v1/nodes/n1/states/power", deep.clone(), "nested deeper"),
        (
            Method::POST,
            "/v1/ports",
            json!({"address": "52:54:00:00:00:02", "node_uuid": "n1", "extra": nested(40)})
                .to_string(),
            "nested deeper than 32 levels",
        ),
        (
            Method::PATCH,
            "/v1/ports/52:54:00:00:00:01",
            json!([{"op": "add", "path": "/extra/x", "value": "x".repeat(4097)}]).to_string(),
            "string of 4097 bytes",
        ),
        (
            Method::POST,
            "/agent/v1/lookup",
            json!({"macs": vec!["52:54:00:00:00:01"; 300]}).to_string(),
            "macs[256]: more than 256 items in one list",
        ),
        (Method::POST, "/agent/v1/lookup", deep.clone(), "nested deeper than 4 levels"),
        (
            Method::POST,
            "/agent/v1/heartbeat/n1",
            deep,
            "[0][0][0]: nested deeper than 64 levels",
        ),
    ];
    for (method, path, body, want) in cases {
        let (s, v) = app.call(method.clone(), path, body).await;
        let m = message(&v);
        assert_eq!(s, StatusCode::BAD_REQUEST, "{method} {path}: {v}");
        assert!(
            m.contains(want),
            "{method} {path}: {m:?} should say {want:?}"
        );
    }
    assert_eq!(app.get("/v1/nodes?detail=true").await, nodes_before);
    assert_eq!(app.get("/v1/ports?detail=true").await, ports_before);
    // The node is still readable and patchable within the limits.
    let (s, v) = app
        .call(
            Method::PATCH,
            "/v1/nodes/n1",
            json!([{"op": "add", "path": "/extra/b", "value": nested(28)}]).to_string(),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
}
