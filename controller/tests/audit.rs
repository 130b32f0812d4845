//! The audit trail end to end against a real router: every state-changing request and every
//! refused one is a row (who, from where, what, which node, status), provision transitions
//! are rows naming their cause, no password ever appears, and only admins read it at
//! `GET /v1/audit`, page by page.
//!
//! Each test runs on a SQLite file (`NAME::sqlite`) and on a scratch PostgreSQL database
//! (`NAME::postgres`) when `RIVET_TEST_POSTGRES` names a server (`scripts/setup-postgres.sh`
//! prints one); without it the PostgreSQL runs skip with a message, or fail when
//! `RIVET_REQUIRE_PEERS=1` (CI).

use crate::support;

use reqwest::{Method, StatusCode};
use rivet_controller::server::PeerAddr;
use serde_json::{json, Value};
use std::time::Duration;
use support::{add_role_tokens, answer, message, on_every_backend, Server, TestDb};

on_every_backend!(
    provide_records_requests_and_transitions_with_causes,
    refused_requests_are_recorded,
    passwords_never_reach_the_trail,
    only_admins_read_it_and_it_pages,
);

/// Where every request of these tests comes from, as the server's connection layer would
/// report it.
const PEER: &str = "192.0.2.7:40123";

struct App {
    server: Server,
    _db: TestDb,
}

/// rivetd with three credentials: `boss` (admin), `ops` (operator), `viewer` (reader); each
/// token is `NAME-token`.
async fn start(db: TestDb) -> App {
    let mut config = db.config();
    add_role_tokens(&mut config);
    let (_conductor, app) = rivet_controller::server::build(config)
        .await
        .expect("build");
    let peer: std::net::SocketAddr = PEER.parse().expect("addr");
    let app = app.layer(axum::middleware::map_request(
        move |mut req: axum::extract::Request| async move {
            req.extensions_mut().insert(PeerAddr(peer));
            req
        },
    ));
    App {
        server: Server::serve(app).await,
        _db: db,
    }
}

impl App {
    /// A request as `who` (`None`: no credentials).
    async fn call(
        &self,
        who: Option<&str>,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut r = self.server.request(method, path);
        if let Some(who) = who {
            r = r.bearer_auth(format!("{who}-token"));
        }
        if let Some(b) = body {
            r = r.json(&b);
        }
        answer(r).await
    }

    async fn admin(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        self.call(Some("boss"), method, path, body).await
    }

    async fn provision(&self, node: &str, target: &str) {
        let (s, v) = self
            .admin(
                Method::PUT,
                &format!("/v1/nodes/{node}/states/provision"),
                Some(json!({ "target": target })),
            )
            .await;
        assert_eq!(s, StatusCode::ACCEPTED, "{target} on {node}: {v}");
    }

    async fn wait_state(&self, node: &str, state: &str) -> Value {
        for _ in 0..400 {
            let (_, v) = self
                .admin(Method::GET, &format!("/v1/nodes/{node}"), None)
                .await;
            if v["provision_state"] == state {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("node {node} never reached {state}");
    }

    /// The whole trail (or one node's), oldest first.
    async fn trail(&self, node: Option<&str>) -> Vec<Value> {
        let path = match node {
            Some(n) => format!("/v1/audit?sort_dir=asc&node={n}"),
            None => "/v1/audit?sort_dir=asc".to_string(),
        };
        let (s, v) = self.admin(Method::GET, &path, None).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        v["audit"].as_array().expect("audit list").clone()
    }
}

/// The transition rows' details, in order.
fn transitions(rows: &[Value]) -> Vec<String> {
    rows.iter()
        .filter(|r| r["action"] == "transition")
        .map(|r| r["detail"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// The one request row with this action (panics naming what is there otherwise).
fn request<'a>(rows: &'a [Value], action: &str) -> &'a Value {
    let found: Vec<&Value> = rows.iter().filter(|r| r["action"] == action).collect();
    assert_eq!(found.len(), 1, "rows with action {action}: {rows:#?}");
    found[0]
}

async fn provide_records_requests_and_transitions_with_causes(db: TestDb) {
    let app = start(db).await;
    let (s, n1) = app
        .admin(
            Method::POST,
            "/v1/nodes",
            Some(json!({"driver": "fake-hardware", "name": "n1", "automated_clean": false})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{n1}");
    let uuid = n1["uuid"].as_str().expect("uuid").to_string();
    app.provision("n1", "manage").await;
    app.wait_state("n1", "manageable").await;
    app.provision("n1", "provide").await;
    app.wait_state("n1", "available").await;

    // Asked by name, answered by UUID: every row about the node carries its UUID.
    let rows = app.trail(Some("n1")).await;
    assert!(
        rows.iter().all(|r| r["node_uuid"] == uuid.as_str()),
        "{rows:#?}"
    );

    let create = request(&rows, "node:create");
    assert_eq!(create["actor"], "boss (role admin)");
    assert_eq!(create["source"], PEER);
    assert_eq!(create["method"], "POST");
    assert_eq!(create["path"], "/v1/nodes");
    assert_eq!(create["status"], 201);
    let provide = request(&rows, "provision:provide");
    assert_eq!(provide["path"], "/v1/nodes/n1/states/provision");
    assert_eq!(provide["status"], 202);
    assert_eq!(request(&rows, "provision:manage")["status"], 202);
    for r in &rows {
        assert!(
            chrono::DateTime::parse_from_rfc3339(r["created_at"].as_str().unwrap_or_default())
                .is_ok(),
            "{r}"
        );
    }

    // Each state change, in order, with the verb and caller that caused it.
    let cause_manage = "cause: manage by boss (role admin)";
    let cause_provide = "cause: provide by boss (role admin)";
    assert_eq!(
        transitions(&rows),
        vec![
            format!("enroll -> verifying (verb: manage; target: manageable; {cause_manage})"),
            format!("verifying -> manageable (event: done; {cause_manage})"),
            format!("manageable -> cleaning (verb: provide; target: available; {cause_provide})"),
            format!("cleaning -> available (event: done; {cause_provide})"),
        ]
    );
    let t = rows
        .iter()
        .find(|r| r["action"] == "transition")
        .expect("transition row");
    assert!(
        t["actor"]
            .as_str()
            .unwrap_or_default()
            .starts_with("conductor:"),
        "{t}"
    );
    assert!(t["method"].is_null() && t["status"].is_null(), "{t}");

    // A failure names its error as the cause, and the operation it ended.
    let (s, v) = app
        .admin(
            Method::POST,
            "/v1/nodes",
            Some(json!({"driver": "fake-hardware", "name": "w", "deploy_interface": "direct"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    app.provision("w", "manage").await;
    app.wait_state("w", "manageable").await;
    app.provision("w", "provide").await;
    app.wait_state("w", "clean wait").await;
    app.provision("w", "abort").await;
    app.wait_state("w", "clean failed").await;
    let rows = app.trail(Some("w")).await;
    let t = transitions(&rows);
    assert_eq!(
        t[2..4],
        [
            "manageable -> cleaning (verb: provide; target: available; cause: provide by boss (role admin))",
            "cleaning -> clean wait (event: wait; target: available; cause: provide by boss (role admin))",
        ],
        "{t:#?}"
    );
    let last = t.last().expect("abort transition");
    assert!(
        last.starts_with("clean wait -> clean failed (event: abort; cause: clean operation was aborted by an operator")
            && last.ends_with("; during abort by boss (role admin))"),
        "{last}"
    );
}

async fn refused_requests_are_recorded(db: TestDb) {
    let app = start(db).await;
    let node = json!({"driver": "fake-hardware", "name": "n1"});
    // A stranger without credentials, one with a wrong token, an operator beyond its role.
    let (s, _) = app
        .call(None, Method::POST, "/v1/nodes", Some(node.clone()))
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _) = app
        .call(Some("guess"), Method::DELETE, "/v1/nodes/n1", None)
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _) = app
        .call(Some("ops"), Method::POST, "/v1/nodes", Some(node.clone()))
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // Bad input from an admin: a verb the state does not allow, an unknown field.
    let (s, created) = app.admin(Method::POST, "/v1/nodes", Some(node)).await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, v) = app
        .admin(
            Method::PUT,
            "/v1/nodes/n1/states/provision",
            Some(json!({"target": "provide"})),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let (s, _) = app
        .admin(
            Method::POST,
            "/v1/nodes",
            Some(json!({"driver": "fake-hardware", "colour": "blue"})),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    // A refused read is recorded too; an allowed one is not.
    let (s, _) = app.call(None, Method::GET, "/v1/nodes", None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _) = app
        .call(Some("viewer"), Method::GET, "/v1/nodes", None)
        .await;
    assert_eq!(s, StatusCode::OK);
    // The agent's endpoints are not admin requests.
    let (s, _) = app
        .call(
            None,
            Method::POST,
            "/agent/v1/lookup",
            Some(json!({"version": "x", "inventory": {"interfaces": []}})),
        )
        .await;
    assert!(s.is_client_error(), "{s}");

    let rows = app.trail(None).await;
    let summary: Vec<(String, String, String, u64)> = rows
        .iter()
        .filter(|r| r["action"] != "transition")
        .map(|r| {
            (
                r["actor"].as_str().unwrap_or_default().to_string(),
                r["method"].as_str().unwrap_or_default().to_string(),
                r["action"].as_str().unwrap_or_default().to_string(),
                r["status"].as_u64().unwrap_or_default(),
            )
        })
        .collect();
    let row =
        |a: &str, m: &str, act: &str, s: u64| (a.to_string(), m.to_string(), act.to_string(), s);
    assert_eq!(
        summary,
        vec![
            row(
                "unauthenticated (no credentials)",
                "POST",
                "node:create",
                401
            ),
            row(
                "unauthenticated (bad or unknown token)",
                "DELETE",
                "node:delete",
                401
            ),
            row("ops (role operator)", "POST", "node:create", 403),
            row("boss (role admin)", "POST", "node:create", 201),
            row("boss (role admin)", "PUT", "provision:provide", 400),
            row("boss (role admin)", "POST", "node:create", 400),
            row("unauthenticated (no credentials)", "GET", "read:nodes", 401),
        ],
        "{rows:#?}"
    );
    // Refusals carry their message; the failed verb names the node and its state.
    assert!(
        rows[2]["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("role operator"),
        "{}",
        rows[2]
    );
    let bad_verb = request(&rows, "provision:provide");
    assert_eq!(bad_verb["node_uuid"], created["uuid"]);
    assert!(
        bad_verb["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("enroll"),
        "{bad_verb}"
    );
    let unknown_field = &rows[5];
    assert!(
        unknown_field["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("colour"),
        "{unknown_field}"
    );
    // The stranger's DELETE named a node that resolves: the row says which.
    assert!(rows[1]["node_uuid"] == created["uuid"] || rows[1]["node_uuid"] == "n1");
}

async fn passwords_never_reach_the_trail(db: TestDb) {
    let app = start(db).await;
    let (s, v) = app
        .admin(
            Method::POST,
            "/v1/nodes",
            Some(json!({"driver": "fake-hardware", "name": "n1",
                "driver_info": {"ipmi_address": "10.0.0.9", "ipmi_password": "create-pw-8812"}})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = app
        .admin(
            Method::PATCH,
            "/v1/nodes/n1",
            Some(json!([
                {"op": "replace", "path": "/driver_info/ipmi_password", "value": "patch-pw-7731"},
                {"op": "add", "path": "/driver_info/redfish_password", "value": "patch-pw-7732"},
            ])),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    // A patch that fails still records no value.
    let (s, _) = app
        .admin(
            Method::PATCH,
            "/v1/nodes/n1",
            Some(json!([{"op": "replace", "path": "/uuid", "value": "bad-pw-4410"}])),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, _) = app
        .call(
            Some("ops"),
            Method::PATCH,
            "/v1/nodes/n1",
            Some(json!([{"op": "replace", "path": "/driver_info/ipmi_password", "value": "ops-pw-9913"}])),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    let rows = app.trail(None).await;
    let patches: Vec<&Value> = rows
        .iter()
        .filter(|r| r["action"] == "node:patch")
        .collect();
    assert_eq!(patches.len(), 3, "{rows:#?}");
    assert_eq!(
        patches[0]["detail"],
        "patch: replace /driver_info/ipmi_password, add /driver_info/redfish_password"
    );
    assert_eq!(patches[0]["status"], 200);
    let (_, raw) = app.admin(Method::GET, "/v1/audit", None).await;
    let text = raw.to_string();
    for pw in [
        "create-pw-8812",
        "patch-pw-7731",
        "patch-pw-7732",
        "bad-pw-4410",
        "ops-pw-9913",
    ] {
        assert!(!text.contains(pw), "{pw} in the audit trail: {text}");
    }
}

async fn only_admins_read_it_and_it_pages(db: TestDb) {
    let app = start(db).await;
    for who in ["ops", "viewer"] {
        let (s, v) = app.call(Some(who), Method::GET, "/v1/audit", None).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{who}: {v}");
        let msg = message(&v);
        assert!(
            msg.contains(&format!("{who} (role")) && msg.contains("audit log"),
            "{who}: {msg}"
        );
    }
    for i in 0..5 {
        let (s, _) = app
            .admin(
                Method::POST,
                "/v1/nodes",
                Some(json!({"driver": "fake-hardware", "name": format!("n{i}")})),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED);
    }
    // Everything, newest first (the default): two refused reads, five creates.
    let (s, all) = app.admin(Method::GET, "/v1/audit", None).await;
    assert_eq!(s, StatusCode::OK, "{all}");
    let all = all["audit"].as_array().expect("list").clone();
    assert_eq!(all.len(), 7, "{all:#?}");
    let seqs: Vec<i64> = all
        .iter()
        .map(|r| r["seq"].as_i64().expect("seq"))
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] > w[1]), "{seqs:?}");
    assert_eq!(all[6]["action"], "read:audit");
    assert_eq!(all[6]["status"], 403);

    // Pages of two, following `next`, give the same rows in the same order.
    let mut paged = Vec::new();
    let mut url = Some(format!("{}/v1/audit?limit=2", app.server.base));
    while let Some(u) = url.take() {
        // `next` is built from the Host header, which names this server.
        let path = u
            .strip_prefix(&app.server.base)
            .expect("next on this server");
        let (s, page) = app.admin(Method::GET, path, None).await;
        assert_eq!(s, StatusCode::OK, "{page}");
        let rows = page["audit"].as_array().expect("list");
        assert!(rows.len() <= 2);
        paged.extend(rows.iter().map(|r| r["seq"].as_i64().expect("seq")));
        url = page["next"].as_str().map(str::to_string);
    }
    assert_eq!(paged, seqs);

    // Oldest first, from a marker; one node's rows only.
    let (_, asc) = app
        .admin(
            Method::GET,
            &format!("/v1/audit?sort_dir=asc&limit=3&marker={}", seqs[6]),
            None,
        )
        .await;
    let asc: Vec<i64> = asc["audit"]
        .as_array()
        .expect("list")
        .iter()
        .map(|r| r["seq"].as_i64().expect("seq"))
        .collect();
    assert_eq!(asc, vec![seqs[5], seqs[4], seqs[3]]);
    let (_, one) = app.admin(Method::GET, "/v1/audit?node=n3", None).await;
    let one = one["audit"].as_array().expect("list");
    assert_eq!(one.len(), 1, "{one:#?}");
    assert_eq!(one[0]["detail"], "name n3");

    // Bad parameters are a 400 naming them.
    for (q, word) in [
        ("marker=abc", "marker"),
        ("limit=-1", "limit"),
        ("sort_dir=up", "sort_dir"),
        ("colour=1", "colour"),
    ] {
        let (s, v) = app
            .admin(Method::GET, &format!("/v1/audit?{q}"), None)
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{q}: {v}");
        assert!(v.to_string().contains(word), "{q}: {v}");
    }
}
