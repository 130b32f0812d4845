//! API tests against a real rivetd router on a loopback port: every endpoint, and every kind
//! of bad input answered with a 4xx that changes nothing.
//!
//! Each test runs twice, on a SQLite file (`NAME::sqlite`) and on a scratch PostgreSQL
//! database (`NAME::postgres`) when `RIVET_TEST_POSTGRES` names a server
//! (`scripts/setup-postgres.sh` prints one); without it the PostgreSQL runs skip with a
//! message, or fail when `RIVET_REQUIRE_PEERS=1` (CI).

use crate::support;

use reqwest::StatusCode;
use rivet_model::config::{Config, TokenEntry};
use rivet_support::credentials::hash_secret;
use serde_json::{json, Value};
use std::time::Duration;
use support::{answer, message, on_every_backend, Server, TestDb};

struct App {
    server: Server,
    _db: TestDb,
}

async fn start(db: TestDb, mutate: impl FnOnce(&mut Config)) -> App {
    let mut config = Config {
        no_auth: true,
        ..db.config()
    };
    config.api.max_body_bytes = 64 * 1024;
    mutate(&mut config);
    App {
        server: Server::start(config).await,
        _db: db,
    }
}

impl App {
    async fn get(&self, path: &str) -> (StatusCode, Value) {
        answer(self.server.request(reqwest::Method::GET, path)).await
    }

    async fn send(&self, method: reqwest::Method, path: &str, body: Value) -> (StatusCode, Value) {
        answer(self.server.request(method, path).json(&body)).await
    }

    async fn raw(
        &self,
        method: reqwest::Method,
        path: &str,
        body: &'static str,
    ) -> (StatusCode, Value) {
        answer(self.server.raw_json(method, path, body)).await
    }

    async fn create(&self, name: &str) -> Value {
        let (s, v) = self
            .send(
                reqwest::Method::POST,
                "/v1/nodes",
                json!({"driver": "fake-hardware", "name": name}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        v
    }

    async fn provision(&self, node: &str, target: &str) -> (StatusCode, Value) {
        self.send(
            reqwest::Method::PUT,
            &format!("/v1/nodes/{node}/states/provision"),
            json!({"target": target}),
        )
        .await
    }

    async fn wait_state(&self, node: &str, state: &str) -> Value {
        for _ in 0..200 {
            let (_, v) = self.get(&format!("/v1/nodes/{node}")).await;
            if v["provision_state"] == state {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let (_, v) = self.get(&format!("/v1/nodes/{node}")).await;
        panic!("node {node} never reached {state}: {v}");
    }
}

on_every_backend!(
    version_documents_and_negotiation,
    node_lifecycle,
    listing_pages_sorts_and_filters,
    paging_keeps_a_filter_value_with_query_characters,
    bad_input_is_refused_and_changes_nothing,
    patch_with_etag_and_masking,
    ports_crud,
    delete_only_in_allowed_states_and_locks,
    verify_failure_returns_to_enroll_with_last_error,
    auth_required_unless_no_auth,
    ironic_node_fields_and_lifecycle_flags,
    chassis_crud_and_nodes,
    fast_track_lookup_per_node_override,
    fast_track_lookup_with_config_on,
);

async fn version_documents_and_negotiation(db: TestDb) {
    let app = start(db, |_| {}).await;
    let r = app
        .server
        .http
        .get(format!("{}/v1", app.server.base))
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), 200);
    // The advertised maximum is whatever protocol says (the lead sets it from what is served).
    let (major, minor) = rivet_protocol::api::MAX_VERSION;
    let max = format!("{major}.{minor}");
    assert_eq!(r.headers()["X-OpenStack-Ironic-API-Minimum-Version"], "1.1");
    assert_eq!(
        r.headers()["X-OpenStack-Ironic-API-Maximum-Version"],
        max.as_str()
    );
    assert_eq!(r.headers()["X-OpenStack-Ironic-API-Version"], "1.1");
    let (s, root) = app.get("/").await;
    assert_eq!(s, 200);
    assert_eq!(root["default_version"]["version"], max.as_str());

    let r = app
        .server
        .http
        .get(format!("{}/v1/nodes", app.server.base))
        .header("X-OpenStack-Ironic-API-Version", "1.999")
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), StatusCode::NOT_ACCEPTABLE);
    assert_eq!(
        r.headers()["X-OpenStack-Ironic-API-Maximum-Version"],
        max.as_str()
    );
    let body: Value = r.json().await.expect("json");
    assert!(message(&body).contains("1.999"), "{body}");

    let r = app
        .server
        .http
        .get(format!("{}/v1/nodes", app.server.base))
        .header("X-OpenStack-Ironic-API-Version", "1.20")
        .send()
        .await
        .expect("get");
    assert_eq!(r.headers()["X-OpenStack-Ironic-API-Version"], "1.20");

    // Clients older than 1.11 know no `enroll`: Ironic creates their nodes `available`,
    // which a client older than 1.2 reads as NOSTATE (null).
    for (version, state) in [
        ("1.10", json!("available")),
        ("1.11", json!("enroll")),
        ("1.1", Value::Null),
    ] {
        let r = app
            .server
            .http
            .post(format!("{}/v1/nodes", app.server.base))
            .header("X-OpenStack-Ironic-API-Version", version)
            .json(&json!({"driver": "fake-hardware"}))
            .send()
            .await
            .expect("post");
        assert_eq!(r.status(), StatusCode::CREATED);
        let body: Value = r.json().await.expect("json");
        assert_eq!(
            body["provision_state"], state,
            "created at {version}: {body}"
        );
    }
}

async fn node_lifecycle(db: TestDb) {
    let app = start(db, |_| {}).await;
    let n = app.create("n1").await;
    assert_eq!(n["provision_state"], "enroll");
    let uuid = n["uuid"].as_str().expect("uuid").to_string();

    let (s, by_uuid) = app.get(&format!("/v1/nodes/{uuid}")).await;
    assert_eq!(s, 200);
    assert_eq!(by_uuid["name"], "n1");

    let (s, list) = app.get("/v1/nodes").await;
    assert_eq!(s, 200);
    assert_eq!(list["nodes"][0]["name"], "n1");
    assert!(
        list["nodes"][0].get("driver_info").is_none(),
        "list is not detailed"
    );
    let (_, detail) = app.get("/v1/nodes/detail").await;
    assert_eq!(detail["nodes"][0]["driver"], "fake-hardware");
    let (_, fields) = app.get("/v1/nodes?fields=uuid,provision_state").await;
    // The fields asked for, and links (Ironic's sanitize_dict).
    assert_eq!(fields["nodes"][0].as_object().expect("obj").len(), 3);
    assert!(fields["nodes"][0]["links"].is_array(), "{fields}");

    // manage: enroll -> verifying -> manageable, power state read.
    let (s, _) = app.provision("n1", "manage").await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let n = app.wait_state("n1", "manageable").await;
    assert_eq!(n["power_state"], "power off");
    let (_, st) = app.get("/v1/nodes/n1/states").await;
    assert_eq!(st["provision_state"], "manageable");

    // provide with automated cleaning off for this node -> available.
    let (s, _) = app
        .send(
            reqwest::Method::PATCH,
            "/v1/nodes/n1",
            json!([{"op": "add", "path": "/automated_clean", "value": false}]),
        )
        .await;
    assert_eq!(s, 200);
    app.provision("n1", "provide").await;
    app.wait_state("n1", "available").await;
    app.provision("n1", "active").await;
    app.wait_state("n1", "active").await;
    app.provision("n1", "deleted").await;
    app.wait_state("n1", "available").await;
    app.provision("n1", "manage").await;
    app.wait_state("n1", "manageable").await;

    // power
    let (s, _) = app
        .send(
            reqwest::Method::PUT,
            "/v1/nodes/n1/states/power",
            json!({"target": "power on"}),
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    for _ in 0..100 {
        let (_, v) = app.get("/v1/nodes/n1").await;
        if v["power_state"] == "power on" && v["target_power_state"].is_null() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, v) = app.get("/v1/nodes/n1").await;
    assert_eq!(v["power_state"], "power on");

    // maintenance
    let (s, _) = app
        .send(
            reqwest::Method::PUT,
            "/v1/nodes/n1/maintenance",
            json!({"reason": "disk swap"}),
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let (_, v) = app.get("/v1/nodes/n1").await;
    assert_eq!(v["maintenance"], true);
    assert_eq!(v["maintenance_reason"], "disk swap");
    let r = app
        .server
        .request(reqwest::Method::DELETE, "/v1/nodes/n1/maintenance")
        .send()
        .await
        .expect("del");
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let (_, v) = app.get("/v1/nodes/n1").await;
    assert_eq!(v["maintenance"], false);

    // delete
    let r = app
        .server
        .request(reqwest::Method::DELETE, "/v1/nodes/n1")
        .send()
        .await
        .expect("del");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let (s, v) = app.get("/v1/nodes/n1").await;
    assert_eq!(s, 404);
    assert!(message(&v).contains("n1"), "{v}");
}

/// A filter value holding `&`, `+`, `=`, `%`, `#`, a space and non-ASCII text reads back
/// the same from every page's `next` link: following them lists each match exactly once.
async fn paging_keeps_a_filter_value_with_query_characters(db: TestDb) {
    let app = start(db, |c| c.api.max_limit = 1000).await;
    let owner = "r&d+ops=1 50% #é";
    let mut want = Vec::new();
    for i in 0..7 {
        let v = app.create(&format!("owned-{i}")).await;
        let uuid = v["uuid"].as_str().expect("uuid").to_string();
        let value = if i % 3 == 2 { "r" } else { owner };
        let (s, v) = answer(
            app.server
                .request(reqwest::Method::PATCH, &format!("/v1/nodes/{uuid}"))
                .header("X-OpenStack-Ironic-API-Version", "1.50")
                .json(&json!([{"op": "add", "path": "/owner", "value": value}])),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        if value == owner {
            want.push(uuid);
        }
    }
    let escaped: String = owner
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let seen = page_all(
        &app.server,
        format!("/v1/nodes?limit=2&owner={escaped}"),
        "1.50",
        "nodes",
    )
    .await;
    assert_each_once(seen, want, "node");

    // The same through the resources' listing (allocations by resource_class).
    let mut want = Vec::new();
    for i in 0..5 {
        let rc = if i == 2 { "r" } else { owner };
        let (s, v) = answer(
            app.server
                .request(reqwest::Method::POST, "/v1/allocations")
                .header("X-OpenStack-Ironic-API-Version", "1.52")
                .json(&json!({"resource_class": rc})),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        if rc == owner {
            want.push(v["uuid"].as_str().expect("uuid").to_string());
        }
    }
    let seen = page_all(
        &app.server,
        format!("/v1/allocations?limit=2&resource_class={escaped}"),
        "1.52",
        "allocations",
    )
    .await;
    assert_each_once(seen, want, "allocation");
}

/// Every uuid of a collection, following its `next` links from `path` (at most 10 pages).
async fn page_all(server: &Server, mut path: String, version: &str, key: &str) -> Vec<String> {
    let mut seen = Vec::new();
    for _ in 0..10 {
        let (s, page) = answer(
            server
                .request(reqwest::Method::GET, &path)
                .header("X-OpenStack-Ironic-API-Version", version),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{path}: {page}");
        for item in page[key].as_array().expect("a collection") {
            seen.push(item["uuid"].as_str().expect("uuid").to_string());
        }
        let Some(next) = page["next"].as_str() else {
            break;
        };
        path = next
            .split_once("/v1/")
            .map(|(_, p)| format!("/v1/{p}"))
            .expect("path");
    }
    seen
}

/// `seen` holds each of `want` exactly once and nothing else.
fn assert_each_once(seen: Vec<String>, mut want: Vec<String>, what: &str) {
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), seen.len(), "a {what} listed twice: {seen:?}");
    want.sort();
    assert_eq!(sorted, want);
}

async fn listing_pages_sorts_and_filters(db: TestDb) {
    let app = start(db, |c| c.api.max_limit = 1000).await;
    for i in 0..7 {
        app.create(&format!("node-{i}")).await;
    }
    let (_, page) = app
        .get("/v1/nodes?limit=3&sort_key=name&sort_dir=desc")
        .await;
    let names: Vec<&str> = page["nodes"]
        .as_array()
        .expect("arr")
        .iter()
        .filter_map(|n| n["name"].as_str())
        .collect();
    assert_eq!(names, ["node-6", "node-5", "node-4"]);
    let next = page["next"].as_str().expect("next link");
    assert!(next.contains("marker="), "{next}");
    let path = next
        .split_once("/v1/")
        .map(|(_, p)| format!("/v1/{p}"))
        .expect("path");
    let (_, page2) = app.get(&path).await;
    assert_eq!(page2["nodes"][0]["name"], "node-3");
    let (_, f) = app
        .get("/v1/nodes?provision_state=enroll&driver=fake-hardware")
        .await;
    assert_eq!(f["nodes"].as_array().expect("arr").len(), 7);
    let (_, f) = app.get("/v1/nodes?provision_state=manageable").await;
    assert_eq!(f["nodes"].as_array().expect("arr").len(), 0);
    let (s, v) = app.get("/v1/nodes?sort_key=colour").await;
    assert_eq!(s, 400);
    assert!(message(&v).contains("colour"));
    let (s, v) = app.get("/v1/nodes?provision_state=sleepy").await;
    assert_eq!(s, 400);
    assert!(message(&v).contains("sleepy"));
    let (s, v) = app.get("/v1/nodes?fields=uuid,shoe_size").await;
    assert_eq!(s, 400);
    assert!(message(&v).contains("shoe_size"));
    let (s, _) = app.get("/v1/nodes?frobnicate=1").await;
    assert_eq!(s, 400);
}

async fn bad_input_is_refused_and_changes_nothing(db: TestDb) {
    let app = start(db, |_| {}).await;
    app.create("n1").await;
    let (_, before) = app.get("/v1/nodes/n1").await;

    use reqwest::Method as M;
    let cases: Vec<(StatusCode, Value, &str)> = vec![
        {
            let (s, v) = app.raw(M::POST, "/v1/nodes", "{\"driver\": ").await;
            (s, v, "malformed JSON")
        },
        {
            let (s, v) = app.raw(M::PATCH, "/v1/nodes/n1", "[{\"op\":").await;
            (s, v, "malformed JSON")
        },
        {
            let (s, v) = app
                .send(
                    M::POST,
                    "/v1/nodes",
                    json!({"driver": "fake-hardware", "colour": "red"}),
                )
                .await;
            (s, v, "colour")
        },
        {
            let (s, v) = app
                .send(
                    M::POST,
                    "/v1/nodes",
                    // Ironic takes "yes"/"True" for booleans (bool_from_string), not this.
                    json!({"driver": "fake-hardware", "automated_clean": "maybe"}),
                )
                .await;
            (s, v, "automated_clean")
        },
        {
            let (s, v) = app
                .send(M::POST, "/v1/nodes", json!({"driver": "warp-drive"}))
                .await;
            (s, v, "warp-drive")
        },
        {
            let (s, v) = app
                .send(
                    M::POST,
                    "/v1/nodes",
                    json!({"driver": "fake-hardware", "name": "n1"}),
                )
                .await;
            (s, v, "n1")
        },
        {
            let (s, v) = app
                .send(
                    M::POST,
                    "/v1/nodes",
                    json!({"driver": "fake-hardware", "name": "bad name!"}),
                )
                .await;
            (s, v, "bad name!")
        },
        {
            let (s, v) = app
                .send(
                    M::PUT,
                    "/v1/nodes/n1/states/provision",
                    json!({"target": "provide"}),
                )
                .await;
            (s, v, "enroll")
        },
        {
            let (s, v) = app
                .send(
                    M::PUT,
                    "/v1/nodes/n1/states/provision",
                    json!({"target": "fly"}),
                )
                .await;
            (s, v, "target")
        },
        {
            let (s, v) = app
                .send(
                    M::PUT,
                    "/v1/nodes/n1/states/provision",
                    json!({"target": "manage", "clean_steps": []}),
                )
                .await;
            (s, v, "clean_steps")
        },
        {
            let (s, v) = app
                .send(
                    M::PUT,
                    "/v1/nodes/n1/states/power",
                    json!({"target": "power sideways"}),
                )
                .await;
            (s, v, "target")
        },
        {
            let (s, v) = app
                .send(
                    M::PATCH,
                    "/v1/nodes/n1",
                    json!([{"op": "replace", "path": "/provision_state", "value": "active"}]),
                )
                .await;
            (s, v, "/provision_state")
        },
        {
            let (s, v) = app
                .send(
                    M::PATCH,
                    "/v1/nodes/n1",
                    json!([{"op": "replace", "path": "/extra", "value": 5}]),
                )
                .await;
            (s, v, "extra")
        },
        {
            let (s, v) = app
                .send(
                    M::PATCH,
                    "/v1/nodes/n1",
                    json!([{"op": "add", "path": "/name", "value": 42}]),
                )
                .await;
            (s, v, "name")
        },
        {
            let (s, v) = app
                .send(
                    M::PUT,
                    "/v1/nodes/nope/states/provision",
                    json!({"target": "manage"}),
                )
                .await;
            (s, v, "nope")
        },
        {
            let (s, v) = app
                .send(
                    M::POST,
                    "/v1/ports",
                    json!({"address": "not-a-mac", "node_uuid": "n1"}),
                )
                .await;
            (s, v, "not-a-mac")
        },
        {
            let (s, v) = app
                .send(
                    M::POST,
                    "/v1/ports",
                    json!({"address": "52:54:00:aa:bb:cc", "node_uuid": "ghost"}),
                )
                .await;
            (s, v, "ghost")
        },
    ];
    for (status, body, needle) in &cases {
        assert!(
            status.is_client_error(),
            "expected 4xx for {needle}, got {status}: {body}"
        );
        let m = message(body);
        assert!(
            m.contains(needle),
            "error for {needle:?} should name it: {m}"
        );
    }
    // Specific codes.
    assert_eq!(cases[0].0, 400);
    assert_eq!(cases[5].0, 409, "duplicate name");
    assert_eq!(cases[14].0, 404, "unknown node");

    // Oversize body: 413.
    let big = "x".repeat(100 * 1024);
    let r = app
        .server
        .request(M::POST, "/v1/nodes")
        .header("Content-Type", "application/json")
        .body(format!(
            "{{\"driver\":\"fake-hardware\",\"extra\":{{\"b\":\"{big}\"}}}}"
        ))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let v: Value = r.json().await.expect("json");
    assert!(message(&v).contains("larger"), "{v}");

    // Stale If-Match: 412.
    let r = app
        .server
        .request(M::PATCH, "/v1/nodes/n1")
        .header("If-Match", "\"999\"")
        .json(&json!([{"op": "add", "path": "/extra/a", "value": 1}]))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::PRECONDITION_FAILED);

    // Nothing changed.
    let (_, after) = app.get("/v1/nodes/n1").await;
    assert_eq!(before, after, "a refused request changed the node");
    let (_, list) = app.get("/v1/nodes").await;
    assert_eq!(list["nodes"].as_array().expect("arr").len(), 1);
    let (_, ports) = app.get("/v1/ports").await;
    assert_eq!(ports["ports"].as_array().expect("arr").len(), 0);
}

async fn patch_with_etag_and_masking(db: TestDb) {
    let app = start(db, |_| {}).await;
    let r = app
        .server
        .request(reqwest::Method::POST, "/v1/nodes")
        .json(&json!({"driver": "fake-hardware", "name": "n1",
            "driver_info": {"redfish_password": "hunter2", "redfish_username": "root"}}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 201);
    let text = r.text().await.expect("text");
    assert!(!text.contains("hunter2"), "password leaked: {text}");
    let r = app
        .server
        .request(reqwest::Method::GET, "/v1/nodes/n1")
        .send()
        .await
        .expect("get");
    let etag = r.headers()["etag"].to_str().expect("etag").to_string();
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["driver_info"]["redfish_password"], "******");
    let r = app
        .server
        .request(reqwest::Method::PATCH, "/v1/nodes/n1")
        .header("If-Match", etag.clone())
        .json(&json!([
            {"op": "replace", "path": "/name", "value": "n2"},
            {"op": "add", "path": "/properties/cpus", "value": 8},
            {"op": "remove", "path": "/driver_info/redfish_username"}
        ]))
        .send()
        .await
        .expect("patch");
    assert_eq!(r.status(), 200);
    assert_ne!(r.headers()["etag"].to_str().expect("etag"), etag);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["name"], "n2");
    assert_eq!(v["properties"]["cpus"], 8);
    assert!(v["driver_info"].get("redfish_username").is_none());
    assert_eq!(v["driver_info"]["redfish_password"], "******");
    // The old ETag is stale now.
    let r = app
        .server
        .request(reqwest::Method::PATCH, "/v1/nodes/n2")
        .header("If-Match", etag)
        .json(&json!([{"op": "add", "path": "/extra/x", "value": 1}]))
        .send()
        .await
        .expect("patch");
    assert_eq!(r.status(), StatusCode::PRECONDITION_FAILED);
}

async fn ports_crud(db: TestDb) {
    let app = start(db, |_| {}).await;
    let n = app.create("n1").await;
    let (s, p) = app
        .send(
            reqwest::Method::POST,
            "/v1/ports",
            json!({"address": "52:54:00:AA:BB:CC", "node_uuid": "n1"}),
        )
        .await;
    assert_eq!(s, 201, "{p}");
    assert_eq!(p["address"], "52:54:00:aa:bb:cc");
    assert_eq!(p["node_uuid"], n["uuid"]);
    let uuid = p["uuid"].as_str().expect("uuid");
    let (s, dup) = app
        .send(
            reqwest::Method::POST,
            "/v1/ports",
            json!({"address": "52:54:00:aa:bb:cc", "node_uuid": "n1"}),
        )
        .await;
    assert_eq!(s, 409);
    assert!(message(&dup).contains("52:54:00:aa:bb:cc"));
    let (_, l) = app.get("/v1/ports?node=n1").await;
    assert_eq!(l["ports"][0]["uuid"], uuid);
    let (_, l) = app.get("/v1/nodes/n1/ports").await;
    assert_eq!(l["ports"][0]["uuid"], uuid);
    let (s, p2) = app
        .send(
            reqwest::Method::PATCH,
            &format!("/v1/ports/{uuid}"),
            json!([{"op": "replace", "path": "/pxe_enabled", "value": false}]),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(p2["pxe_enabled"], false);
    let (s, _) = app.get(&format!("/v1/ports/{uuid}")).await;
    assert_eq!(s, 200);
    let r = app
        .server
        .request(reqwest::Method::DELETE, &format!("/v1/ports/{uuid}"))
        .send()
        .await
        .expect("del");
    assert_eq!(r.status(), 204);
    let (s, _) = app.get(&format!("/v1/ports/{uuid}")).await;
    assert_eq!(s, 404);
}

async fn delete_only_in_allowed_states_and_locks(db: TestDb) {
    // Deleting an available node is refused only where the operator turned Ironic's
    // `allow_deleting_available_nodes` off (the default allows it: tests/sdk_roundtrip.rs).
    let app = start(db, |c| c.conductor.allow_deleting_available_nodes = false).await;
    app.create("n1").await;
    let (s, _) = app
        .send(
            reqwest::Method::PATCH,
            "/v1/nodes/n1",
            json!([{"op": "add", "path": "/automated_clean", "value": false}]),
        )
        .await;
    assert_eq!(s, 200);
    app.provision("n1", "manage").await;
    app.wait_state("n1", "manageable").await;
    app.provision("n1", "provide").await;
    app.wait_state("n1", "available").await;
    let r = app
        .server
        .request(reqwest::Method::DELETE, "/v1/nodes/n1")
        .send()
        .await
        .expect("del");
    // Ironic's InvalidState: 409.
    assert_eq!(r.status(), 409);
    let v: Value = r.json().await.expect("json");
    assert!(message(&v).contains("available"), "{v}");

    // A slow BMC keeps the node reserved in "verifying": other verbs get 409.
    let (s, v) = app
        .send(
            reqwest::Method::POST,
            "/v1/nodes",
            json!({"driver": "fake-hardware", "name": "slow", "driver_info": {"fake_delay_ms": 1500}}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    app.provision("slow", "manage").await;
    let v = app.wait_state("slow", "verifying").await;
    for _ in 0..50 {
        let (_, v) = app.get("/v1/nodes/slow").await;
        if v["reservation"].is_string() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = v;
    let (s, v) = app
        .send(
            reqwest::Method::PUT,
            "/v1/nodes/slow/states/power",
            json!({"target": "power on"}),
        )
        .await;
    assert_eq!(s, 409, "{v}");
    assert!(message(&v).contains("locked"), "{v}");
    app.wait_state("slow", "manageable").await;
}

async fn verify_failure_returns_to_enroll_with_last_error(db: TestDb) {
    let app = start(db, |_| {}).await;
    let (s, _) = app
        .send(
            reqwest::Method::POST,
            "/v1/nodes",
            json!({"driver": "fake-hardware", "name": "bad", "driver_info": {"fake_fail": "connection refused"}}),
        )
        .await;
    assert_eq!(s, 201);
    app.provision("bad", "manage").await;
    let mut v = Value::Null;
    for _ in 0..100 {
        let (_, n) = app.get("/v1/nodes/bad").await;
        if n["provision_state"] == "enroll" && n["last_error"].is_string() {
            v = n;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let err = v["last_error"].as_str().expect("last_error set");
    assert!(
        err.contains("connection refused") && err.contains("bad"),
        "{err}"
    );
    assert!(v["reservation"].is_null());
}

async fn auth_required_unless_no_auth(db: TestDb) {
    let app = start(db, |c| {
        c.no_auth = false;
        c.auth.tokens.push(TokenEntry {
            name: "ops".into(),
            hash: hash_secret("tok-123").expect("hash"),
            role: Default::default(),
        });
    })
    .await;
    let (s, v) = app.get("/v1/nodes").await;
    assert_eq!(s, 401);
    assert!(message(&v).contains("authentication"));
    // Version documents stay open.
    let (s, _) = app.get("/v1").await;
    assert_eq!(s, 200);
    let r = app
        .server
        .request(reqwest::Method::GET, "/v1/nodes")
        .bearer_auth("tok-123")
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), 200);
    let r = app
        .server
        .request(reqwest::Method::GET, "/v1/nodes")
        .header("X-Auth-Token", "tok-123")
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), 200);
    let r = app
        .server
        .request(reqwest::Method::GET, "/v1/nodes")
        .bearer_auth("tok-12")
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), 401);
}

#[test]
fn no_auth_refused_off_loopback() {
    let config = Config {
        listen: "0.0.0.0:6385".into(),
        no_auth: true,
        ..Config::default()
    };
    let err = rivet_controller::server::check_listen(&config).expect_err("must refuse");
    assert!(err.to_string().contains("loopback"), "{err}");
    let config = Config {
        listen: "127.0.0.1:6385".into(),
        no_auth: true,
        ..Config::default()
    };
    assert!(rivet_controller::server::check_listen(&config).is_ok());
}

#[test]
fn out_of_range_download_retries_refused_at_start() {
    let mut config = Config {
        listen: "127.0.0.1:6385".into(),
        no_auth: true,
        ..Config::default()
    };
    config.deploy.image_download_retries = 21;
    let err = rivet_controller::server::check_listen(&config).expect_err("must refuse");
    assert!(
        err.to_string()
            .contains("[deploy] image_download_retries = 21"),
        "{err}"
    );
    config.deploy.image_download_retries = 20;
    assert!(rivet_controller::server::check_listen(&config).is_ok());
}

/// Ironic's ownership and lifecycle fields: stored, shown from their microversion, filtered
/// on; `protected` and `retired` follow Ironic's rules and change what may happen.
async fn ironic_node_fields_and_lifecycle_flags(db: TestDb) {
    let app = start(db, |_| {}).await;
    let (s, n) = app
        .send(
            reqwest::Method::POST,
            "/v1/nodes",
            json!({"driver": "fake-hardware", "name": "f1", "owner": "proj-a",
                   "lessee": "proj-b", "description": "rack 7, slot 3",
                   "conductor_group": "Rack7", "shard": "s1",
                   "network_data": {"links": [], "networks": [], "services": []},
                   "automated_clean": false}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{n}");
    assert_eq!(n["owner"], "proj-a");
    assert_eq!(
        n["conductor_group"], "rack7",
        "stored lower case as Ironic does"
    );
    assert_eq!(
        n["network_data"],
        json!({"links": [], "networks": [], "services": []})
    );
    assert_eq!(n["protected"], false);
    app.create("f2").await;

    // Shown from the version that added each field, hidden below it.
    let at = |v: &'static str| {
        app.server
            .http
            .get(format!("{}/v1/nodes/f1", app.server.base))
            .header("X-OpenStack-Ironic-API-Version", v)
    };
    let old: Value = at("1.49")
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert!(
        old.get("owner").is_none() && old.get("conductor").is_some(),
        "{old}"
    );
    let new: Value = at("1.50")
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(new["owner"], "proj-a", "{new}");
    assert!(new.get("lessee").is_none(), "lessee is 1.65: {new}");
    let ancient: Value = at("1.1")
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert!(ancient.get("name").is_none(), "name is 1.5: {ancient}");

    // Filters.
    for (query, want) in [
        ("owner=proj-a", vec!["f1"]),
        ("lessee=proj-b", vec!["f1"]),
        ("conductor_group=RACK7", vec!["f1"]),
        ("shard=s1", vec!["f1"]),
        ("retired=false", vec!["f1", "f2"]),
        ("associated=false", vec!["f1", "f2"]),
        ("associated=true", vec![]),
    ] {
        let (s, list) = app.get(&format!("/v1/nodes?{query}")).await;
        assert_eq!(s, 200, "{query}: {list}");
        let names: Vec<&str> = list["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .filter_map(|n| n["name"].as_str())
            .collect();
        assert_eq!(names, want, "{query}");
    }

    // Bad values: 400, nothing changed.
    let patch = |ops: Value| app.send(reqwest::Method::PATCH, "/v1/nodes/f1", ops);
    let (s, e) =
        patch(json!([{"op": "replace", "path": "/conductor_group", "value": "no spaces"}])).await;
    assert_eq!(s, 400, "{e}");
    let (s, e) = patch(json!([{"op": "replace", "path": "/protected_reason", "value": "x"}])).await;
    assert_eq!(s, 400, "reason without the flag: {e}");
    assert!(message(&e).contains("protected is True"), "{e}");
    // Protected only in active or rescue.
    let (s, e) = patch(json!([{"op": "replace", "path": "/protected", "value": true}])).await;
    assert_eq!(s, 409, "{e}");
    assert!(message(&e).contains("'enroll'"), "{e}");
    let (_, v) = app.get("/v1/nodes/f1").await;
    assert_eq!(v["protected"], false);
    assert_eq!(v["conductor_group"], "rack7");

    // Into service; protected there: undeploy, rebuild and delete refused with 403.
    app.provision("f1", "manage").await;
    app.wait_state("f1", "manageable").await;
    app.provision("f1", "provide").await;
    app.wait_state("f1", "available").await;
    let (s, e) = patch(json!([{"op": "replace", "path": "/retired", "value": true}])).await;
    assert_eq!(s, 409, "not retired in available: {e}");
    app.provision("f1", "active").await;
    app.wait_state("f1", "active").await;
    let (s, v) = patch(
        json!([{"op": "replace", "path": "/protected", "value": true},
                              {"op": "add", "path": "/protected_reason", "value": "prod db"}]),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["protected_reason"], "prod db");
    for verb in ["deleted", "rebuild"] {
        let (s, e) = app.provision("f1", verb).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{verb}: {e}");
        assert!(message(&e).contains("protected"), "{e}");
    }
    let (_, v) = app.get("/v1/nodes/f1").await;
    assert_eq!(v["provision_state"], "active");
    // Unprotecting clears the reason.
    let (s, v) = patch(json!([{"op": "replace", "path": "/protected", "value": false}])).await;
    assert_eq!(s, 200, "{v}");
    assert!(v["protected_reason"].is_null(), "{v}");

    // Retired: undeploy's cleaning ends in manageable, and provide is refused.
    let (s, v) = patch(json!([{"op": "replace", "path": "/retired", "value": true},
                              {"op": "add", "path": "/retired_reason", "value": "EOL"}]))
    .await;
    assert_eq!(s, 200, "{v}");
    let (s, _) = app.provision("f1", "deleted").await;
    assert_eq!(s, StatusCode::ACCEPTED);
    app.wait_state("f1", "manageable").await;
    let (s, e) = app.provision("f1", "provide").await;
    assert_eq!(s, 400, "{e}");
    assert!(message(&e).contains("retired"), "{e}");
    let (_, list) = app.get("/v1/nodes?retired=true").await;
    assert_eq!(list["nodes"][0]["name"], "f1", "{list}");
}

async fn chassis_crud_and_nodes(db: TestDb) {
    use reqwest::Method;
    let app = start(db, |_| {}).await;
    let (s, v1) = app.get("/v1").await;
    assert_eq!(s, 200);
    assert!(v1["chassis"][0]["href"]
        .as_str()
        .expect("chassis test")
        .ends_with("/v1/chassis/"));

    // Create: 201, Location, Ironic's document.
    let r = app
        .server
        .request(Method::POST, "/v1/chassis")
        .json(&json!({"description": "rack 1", "extra": {"row": 4}}))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), StatusCode::CREATED);
    let loc = r.headers()["Location"]
        .to_str()
        .expect("chassis test")
        .to_string();
    let c1: Value = r.json().await.expect("chassis test");
    let u1 = c1["uuid"].as_str().expect("chassis test").to_string();
    assert!(loc.ends_with(&format!("/v1/chassis/{u1}")), "{loc}");
    assert_eq!(c1["description"], "rack 1");
    assert_eq!(c1["extra"], json!({"row": 4}));
    assert!(c1["updated_at"].is_null());
    assert!(c1["nodes"][0]["href"]
        .as_str()
        .expect("chassis test")
        .ends_with(&format!("/v1/chassis/{u1}/nodes")));
    assert_eq!(c1["links"][1]["rel"], "bookmark");
    // Sorts before any generated (v4) UUID, so the uuid-sorted listing below is certain.
    let given = "00000000-03f2-4d2e-ae87-c02d7f33c123";
    let (s, c2) = app
        .send(Method::POST, "/v1/chassis", json!({"uuid": given}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{c2}");
    assert_eq!(c2["uuid"], given);
    assert!(c2["description"].is_null());
    // Refused: taken UUID (409), wrong types, unknown fields, too long (400).
    let (s, _) = app
        .send(Method::POST, "/v1/chassis", json!({"uuid": given}))
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    for bad in [
        json!({"description": 1334}),
        json!({"colour": "red"}),
        json!({"extra": "x"}),
        json!({"uuid": "not-a-uuid"}),
        json!({"description": "x".repeat(256)}),
    ] {
        let (s, v) = app.send(Method::POST, "/v1/chassis", bad.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {v}");
    }
    let (_, v) = app
        .send(Method::POST, "/v1/chassis", json!({"description": 1334}))
        .await;
    assert!(
        message(&v).contains("1334 is not of type 'string', 'null'"),
        "{v}"
    );

    // Show, fields, 404 and 400.
    let (s, v) = app.get(&format!("/v1/chassis/{u1}")).await;
    assert_eq!((s, &v["description"]), (StatusCode::OK, &json!("rack 1")));
    let (_, v) = app
        .get(&format!("/v1/chassis/{u1}?fields=uuid,extra"))
        .await;
    assert_eq!(
        v,
        json!({"uuid": u1, "extra": {"row": 4}, "links": [
            {"href": format!("{}/v1/chassis/{u1}", app.server.base), "rel": "self"},
            {"href": format!("{}/chassis/{u1}", app.server.base), "rel": "bookmark"},
        ]}),
        "the fields asked for, and links (Ironic's sanitize_dict)"
    );
    let (s, _) = app.get(&format!("/v1/chassis/{u1}?fields=colour")).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let missing = "eeeeeeee-cccc-aaaa-bbbb-cccccccccccc";
    let (s, _) = app.get(&format!("/v1/chassis/{missing}")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = app.get(&format!("/v1/chassis/{missing}/nodes")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = app.get("/v1/chassis/nodes").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, _) = app.get(&format!("/v1/chassis/{u1}/detail")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // List, detail, paging.
    let (s, v) = app.get("/v1/chassis").await;
    assert_eq!(s, 200);
    let list = v["chassis"].as_array().expect("chassis test");
    assert_eq!(list.len(), 2);
    let mut keys: Vec<&String> = list[0].as_object().expect("chassis test").keys().collect();
    keys.sort();
    assert_eq!(keys, ["description", "links", "uuid"]);
    assert!(v.get("next").is_none());
    let (_, v) = app.get("/v1/chassis/detail").await;
    assert_eq!(v["chassis"][0]["extra"], json!({"row": 4}));
    assert!(v["chassis"][0]["created_at"].is_string());
    let (_, v) = app.get("/v1/chassis?detail=true").await;
    assert!(v["chassis"][0]["nodes"].is_array());
    let (s, _) = app.get("/v1/chassis?detail=true&fields=uuid").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (_, p1) = app.get("/v1/chassis?limit=1").await;
    assert_eq!(p1["chassis"].as_array().expect("chassis test").len(), 1);
    assert_eq!(p1["chassis"][0]["uuid"], u1);
    let next = p1["next"].as_str().expect("chassis test");
    assert!(next.contains(&format!("marker={u1}")), "{next}");
    let (_, p2) = app.get(&format!("/v1/chassis?limit=1&marker={u1}")).await;
    assert_eq!(p2["chassis"][0]["uuid"], given);
    let (_, v) = app.get("/v1/chassis?sort_dir=desc&fields=uuid").await;
    assert_eq!(v["chassis"][0]["uuid"], json!(given));
    assert_eq!(
        v["chassis"][0].as_object().map(|o| o.len()),
        Some(2),
        "uuid, links: {v}"
    );
    let (_, v) = app.get("/v1/chassis?sort_key=uuid").await;
    assert_eq!(v["chassis"][0]["uuid"], given);
    let (s, _) = app.get("/v1/chassis?sort_key=extra").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, _) = app.get(&format!("/v1/chassis?marker={missing}")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // Patch.
    let (s, v) = app
        .send(
            Method::PATCH,
            &format!("/v1/chassis/{u1}"),
            json!([{"op": "replace", "path": "/description", "value": "Updated Chassis"},
                   {"op": "add", "path": "/extra/slot", "value": 7}]),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["description"], "Updated Chassis");
    assert_eq!(v["extra"], json!({"row": 4, "slot": 7}));
    assert!(v["updated_at"].is_string());
    for bad in [
        json!([{"op": "replace", "path": "/uuid", "value": missing}]),
        json!([{"op": "replace", "path": "/description", "value": 5}]),
    ] {
        let (s, v) = app
            .send(Method::PATCH, &format!("/v1/chassis/{u1}"), bad)
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    }
    let (s, _) = app
        .send(
            Method::PATCH,
            &format!("/v1/chassis/{missing}"),
            json!([{"op": "remove", "path": "/description"}]),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // Nodes in a chassis: create with one (a missing one is a 400), filter, sub-resource.
    let (s, v) = app
        .send(
            Method::POST,
            "/v1/nodes",
            json!({"driver": "fake-hardware", "name": "lost", "chassis_uuid": missing}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(message(&v).contains(missing), "{v}");
    let (s, n1) = app
        .send(
            Method::POST,
            "/v1/nodes",
            json!({"driver": "fake-hardware", "name": "in-rack", "chassis_uuid": u1}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{n1}");
    assert_eq!(n1["chassis_uuid"], u1.as_str());
    let n2 = app.create("elsewhere").await;
    assert!(n2["chassis_uuid"].is_null());
    let (_, v) = app.get(&format!("/v1/nodes?chassis_uuid={u1}")).await;
    let names: Vec<&Value> = v["nodes"]
        .as_array()
        .expect("chassis test")
        .iter()
        .map(|n| &n["name"])
        .collect();
    assert_eq!(names, [&json!("in-rack")]);
    let (_, v) = app.get(&format!("/v1/chassis/{u1}/nodes")).await;
    assert_eq!(v["nodes"].as_array().expect("chassis test").len(), 1);
    assert_eq!(v["nodes"][0]["name"], "in-rack");
    assert!(v["nodes"][0].get("driver").is_none());
    let (_, v) = app.get(&format!("/v1/chassis/{u1}/nodes/detail")).await;
    assert_eq!(v["nodes"][0]["chassis_uuid"], u1.as_str());
    let (_, v) = app.get(&format!("/v1/chassis/{given}/nodes")).await;
    assert_eq!(v["nodes"], json!([]));
    // Patch a node into a missing chassis (400), into the other one, then out.
    let (s, _) = app
        .send(
            Method::PATCH,
            "/v1/nodes/elsewhere",
            json!([{"op": "add", "path": "/chassis_uuid", "value": missing}]),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, v) = app
        .send(
            Method::PATCH,
            "/v1/nodes/elsewhere",
            json!([{"op": "add", "path": "/chassis_uuid", "value": given}]),
        )
        .await;
    assert_eq!((s, &v["chassis_uuid"]), (StatusCode::OK, &json!(given)));

    // A chassis with nodes is not deleted (Ironic: 400, ChassisNotEmpty).
    let (s, v) = app
        .send(Method::DELETE, &format!("/v1/chassis/{u1}"), Value::Null)
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        message(&v).contains(&format!("chassis {u1} contains nodes")),
        "{v}"
    );
    let (s, _) = app.get(&format!("/v1/chassis/{u1}")).await;
    assert_eq!(s, 200);
    let (s, v) = app
        .send(
            Method::PATCH,
            "/v1/nodes/elsewhere",
            json!([{"op": "remove", "path": "/chassis_uuid"}]),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(v["chassis_uuid"].is_null());
    let (s, _) = app
        .send(Method::DELETE, &format!("/v1/chassis/{given}"), Value::Null)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _) = app
        .send(Method::DELETE, "/v1/nodes/in-rack", Value::Null)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _) = app
        .send(Method::DELETE, &format!("/v1/chassis/{u1}"), Value::Null)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _) = app
        .send(Method::DELETE, &format!("/v1/chassis/{u1}"), Value::Null)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (_, v) = app.get("/v1/chassis").await;
    assert_eq!(v["chassis"], json!([]));
}

impl App {
    /// `POST /agent/v1/lookup` for node `uuid`, as a ramdisk would.
    async fn lookup(&self, uuid: &str) -> (StatusCode, Value) {
        self.send(
            reqwest::Method::POST,
            "/agent/v1/lookup",
            json!({"node_uuid": uuid, "agent_version": "test"}),
        )
        .await
    }

    async fn set_fast_track(&self, node: &str, value: Value) {
        let (s, v) = self
            .send(
                reqwest::Method::PATCH,
                &format!("/v1/nodes/{node}"),
                json!([{"op": "add", "path": "/driver_info/fast_track", "value": value}]),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
}

/// Without fast track a ramdisk's lookup in enroll, manageable and available is refused with
/// Ironic's 404 (the same answer as for unknown hardware); a node's `driver_info.fast_track`
/// turns it on for that node alone, in Ironic's spellings, and off again.
async fn fast_track_lookup_per_node_override(db: TestDb) {
    let app = start(db, |_| {}).await;
    let n = app.create("n1").await;
    let uuid = n["uuid"].as_str().expect("uuid").to_string();
    let (s, v) = app.lookup(&uuid).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "enroll: {v}");
    app.provision("n1", "manage").await;
    app.wait_state("n1", "manageable").await;
    let (s, v) = app.lookup(&uuid).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "manageable: {v}");
    app.provision("n1", "provide").await;
    app.wait_state("n1", "available").await;
    let (s, v) = app.lookup(&uuid).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "available: {v}");
    assert!(
        message(&v).contains("no node is waiting for a ramdisk"),
        "the refusal does not tell a wrong state from unknown hardware: {v}"
    );

    app.set_fast_track("n1", json!("True")).await;
    let (s, v) = app.lookup(&uuid).await;
    assert_eq!(s, StatusCode::OK, "available with fast track: {v}");
    assert_eq!(v["node_uuid"], uuid.as_str(), "{v}");
    assert!(
        v["agent_token"].as_str().is_some_and(|t| t.len() >= 32),
        "the first lookup of a boot gets the token: {v}"
    );
    let (s, v) = app.lookup(&uuid).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(v["agent_token"].is_null(), "a token once per boot: {v}");

    app.set_fast_track("n1", json!(false)).await;
    let (s, v) = app.lookup(&uuid).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "override off again: {v}");
    // A value that is not a boolean is no reason to accept a ramdisk.
    app.set_fast_track("n1", json!("sometimes")).await;
    let (s, v) = app.lookup(&uuid).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "unreadable override: {v}");
}

/// `[deploy] fast_track = true`: lookup is accepted in enroll, manageable and available
/// (Ironic's fast-track lookup states), never in active; `driver_info.fast_track = false`
/// turns it off for one node.
async fn fast_track_lookup_with_config_on(db: TestDb) {
    let app = start(db, |c| c.deploy.fast_track = true).await;
    let n = app.create("n1").await;
    let uuid = n["uuid"].as_str().expect("uuid").to_string();
    let (s, v) = app.lookup(&uuid).await;
    assert_eq!(s, StatusCode::OK, "enroll: {v}");
    app.provision("n1", "manage").await;
    app.wait_state("n1", "manageable").await;
    let (s, v) = app.lookup(&uuid).await;
    assert_eq!(s, StatusCode::OK, "manageable: {v}");
    app.provision("n1", "provide").await;
    app.wait_state("n1", "available").await;
    let (s, v) = app.lookup(&uuid).await;
    assert_eq!(s, StatusCode::OK, "available: {v}");
    app.set_fast_track("n1", json!("off")).await;
    let (s, v) = app.lookup(&uuid).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "per-node off: {v}");
    app.set_fast_track("n1", json!(true)).await;
    app.provision("n1", "active").await;
    app.wait_state("n1", "active").await;
    let (s, v) = app.lookup(&uuid).await;
    assert_eq!(
        s,
        StatusCode::NOT_FOUND,
        "active never expects a ramdisk: {v}"
    );
}
