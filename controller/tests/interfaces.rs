//! Node interfaces through the API, on both backends: per-hardware-type defaults and
//! validation, the fake interfaces of fake-hardware that finish without an agent, verbs an
//! interface cannot do refused up front (nothing changes), and deploy inputs checked before
//! the node leaves `available`.

use crate::support;

use reqwest::{Method, StatusCode};
use rivet_model::config::Config;
use serde_json::{json, Value};
use std::time::Duration;
use support::{answer, message, on_every_backend, Server, TestDb};

struct App {
    server: Server,
    _db: TestDb,
}

async fn start(db: TestDb) -> App {
    let mut config = Config {
        no_auth: true,
        ..db.config()
    };
    config.conductor.check_interval_s = 1;
    App {
        server: Server::start(config).await,
        _db: db,
    }
}

impl App {
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut r = self.server.request(method, path);
        if let Some(b) = body {
            r = r.json(&b);
        }
        answer(r).await
    }

    async fn node(&self, ident: &str) -> Value {
        let (s, v) = self
            .call(Method::GET, &format!("/v1/nodes/{ident}"), None)
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        v
    }

    /// The node's record version, from its `ETag` (the document has no version field, as
    /// Ironic's has none).
    async fn etag_version(&self, ident: &str) -> i64 {
        let r = self
            .server
            .request(Method::GET, &format!("/v1/nodes/{ident}"))
            .send()
            .await
            .expect("get node");
        r.headers()
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim_matches('"').parse().ok())
            .expect("an ETag with the record version")
    }

    async fn verb(&self, ident: &str, body: Value) -> (StatusCode, Value) {
        self.call(
            Method::PUT,
            &format!("/v1/nodes/{ident}/states/provision"),
            Some(body),
        )
        .await
    }

    async fn wait_state(&self, ident: &str, state: &str) -> Value {
        for _ in 0..400 {
            let v = self.node(ident).await;
            if v["provision_state"] == state {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!(
            "node {ident} never reached {state}: {}",
            self.node(ident).await
        );
    }
}

async fn defaults_and_validation(db: TestDb) {
    let app = start(db).await;
    let (s, v) = app
        .call(
            Method::POST,
            "/v1/nodes",
            Some(json!({"driver": "redfish", "name": "r1"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["boot_interface"], "ipxe");
    assert_eq!(v["deploy_interface"], "direct");
    assert_eq!(v["power_interface"], "redfish");
    assert_eq!(v["rescue_interface"], "no-rescue");
    assert_eq!(v["network_interface"], "noop");
    let (s, v) = app
        .call(
            Method::POST,
            "/v1/nodes",
            Some(json!({"driver": "ipmi", "name": "i1"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["management_interface"], "ipmitool");
    let (_, v) = app
        .call(
            Method::POST,
            "/v1/nodes",
            Some(json!({"driver": "fake-hardware", "name": "f1"})),
        )
        .await;
    assert_eq!(v["deploy_interface"], "fake");
    assert_eq!(v["boot_interface"], "fake");

    // fake interfaces exist only on fake-hardware: refused, nothing created.
    let (s, v) = app
        .call(
            Method::POST,
            "/v1/nodes",
            Some(json!({"driver": "redfish", "name": "r2", "deploy_interface": "fake"})),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let m = message(&v);
    assert!(
        m.contains("r2") && m.contains("deploy_interface") && m.contains("direct"),
        "{m}"
    );
    let (s, _) = app.call(Method::GET, "/v1/nodes/r2", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // PATCH: a bad value is refused and changes nothing; a good one sticks.
    let (s, v) = app
        .call(
            Method::PATCH,
            "/v1/nodes/r1",
            Some(json!([{"op": "replace", "path": "/boot_interface", "value": "fake"}])),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(message(&v).contains("boot_interface"), "{v}");
    assert_eq!(app.node("r1").await["boot_interface"], "ipxe");
    let (s, v) = app
        .call(
            Method::PATCH,
            "/v1/nodes/r1",
            Some(json!([{"op": "replace", "path": "/boot_interface", "value": "pxe"}])),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["boot_interface"], "pxe");
    // As Ironic: a new driver keeps the node's interfaces, which must suit it (400 naming
    // the one that does not); with reset_interfaces (1.45) every interface the patch does
    // not set goes back to the new driver's default.
    let change = json!([
        {"op": "replace", "path": "/driver", "value": "fake-hardware"},
        {"op": "replace", "path": "/deploy_interface", "value": "direct"}
    ]);
    let (s, v) = app
        .call(Method::PATCH, "/v1/nodes/r1", Some(change.clone()))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(v.to_string().contains("reset_interfaces"), "{v}");
    let (s, v) = app
        .call(
            Method::PATCH,
            "/v1/nodes/r1?reset_interfaces=true",
            Some(change),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["boot_interface"], "fake");
    assert_eq!(v["power_interface"], "fake");
    assert_eq!(v["deploy_interface"], "direct");
}

/// As in Ironic, fake-hardware with its fake interfaces goes through manage, cleaning,
/// deploy, rescue and undeploy without any agent.
async fn fake_hardware_lifecycle_without_agent(db: TestDb) {
    let app = start(db).await;
    let (s, v) = app
        .call(
            Method::POST,
            "/v1/nodes",
            Some(json!({"driver": "fake-hardware", "name": "f"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    for (verb, rest) in [
        ("manage", "manageable"),
        ("provide", "available"),
        ("active", "active"),
        ("rescue", "rescue"),
        ("unrescue", "active"),
        ("deleted", "available"),
    ] {
        let body = if verb == "rescue" {
            json!({"target": verb, "rescue_password": "pw"})
        } else {
            json!({"target": verb})
        };
        let (s, v) = app.verb("f", body).await;
        assert_eq!(s, StatusCode::ACCEPTED, "{verb}: {v}");
        let n = app.wait_state("f", rest).await;
        assert!(n["last_error"].is_null(), "{verb}: {n}");
    }
    // rescue needs a password (Ironic's rule), and only rescue takes one.
    let (s, v) = app.verb("f", json!({"target": "rescue"})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(message(&v).contains("rescue_password"), "{v}");
    // A manual clean asking for an in-band step has no agent to run it: 400 up front.
    let (s, _) = app.verb("f", json!({"target": "manage"})).await;
    assert_eq!(s, StatusCode::ACCEPTED);
    app.wait_state("f", "manageable").await;
    let (s, v) = app
        .verb(
            "f",
            json!({"target": "clean", "clean_steps": [{"interface": "deploy", "step": "erase_devices"}]}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(app.node("f").await["provision_state"], "manageable");
}

/// `direct` deploys need an image and a way to verify it before anything changes; verbs an
/// interface cannot do are refused; abort outside a wait state and DELETE …/provision with
/// nothing running get Ironic's answers.
async fn deploy_inputs_checked_up_front(db: TestDb) {
    let app = start(db).await;
    let (s, v) = app
        .call(
            Method::POST,
            "/v1/nodes",
            Some(
                json!({"driver": "fake-hardware", "name": "d", "deploy_interface": "direct",
                        "automated_clean": false}),
            ),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    app.verb("d", json!({"target": "manage"})).await;
    app.wait_state("d", "manageable").await;
    app.verb("d", json!({"target": "provide"})).await;
    app.wait_state("d", "available").await;
    let before = app.etag_version("d").await;

    let refuse = |body: Value, want: &'static str| {
        let app = &app;
        async move {
            let (s, v) = app.verb("d", body.clone()).await;
            assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {v}");
            let m = message(&v);
            assert!(m.contains(want), "{body}: {m}");
        }
    };
    refuse(json!({"target": "active"}), "no instance_info.image_source").await;
    let patch = |ops: Value| {
        let app = &app;
        async move {
            let (s, v) = app.call(Method::PATCH, "/v1/nodes/d", Some(ops)).await;
            assert_eq!(s, StatusCode::OK, "{v}");
        }
    };
    patch(json!([{"op": "add", "path": "/instance_info/image_source", "value": "ftp://x/y.img"}]))
        .await;
    refuse(json!({"target": "active"}), "http:// or https://").await;
    patch(json!([{"op": "add", "path": "/instance_info/image_source", "value": "http://127.0.0.1:9/y.img"}]))
        .await;
    refuse(json!({"target": "active"}), "no image checksum").await;
    patch(json!([{"op": "add", "path": "/instance_info/image_checksum", "value": "d41d8cd98f00b204e9800998ecf8427e"}]))
        .await;
    refuse(json!({"target": "active"}), "MD5").await;
    patch(json!([
        {"op": "remove", "path": "/instance_info/image_checksum"},
        {"op": "add", "path": "/instance_info/image_os_hash_algo", "value": "sha256"},
        {"op": "add", "path": "/instance_info/image_os_hash_value", "value": "abc"}
    ]))
    .await;
    refuse(json!({"target": "active"}), "64 hex digits").await;
    patch(json!([
        {"op": "add", "path": "/instance_info/image_os_hash_value", "value": "a".repeat(64)},
        {"op": "add", "path": "/instance_info/image_disk_format", "value": "vmdk"}
    ]))
    .await;
    refuse(json!({"target": "active"}), "not permitted").await;
    patch(json!([{"op": "remove", "path": "/instance_info/image_disk_format"}])).await;
    refuse(
        json!({"target": "active", "configdrive": {"colour": 1}}),
        "configdrive",
    )
    .await;
    refuse(
        json!({"target": "manage", "configdrive": "x"}),
        "only valid with target",
    )
    .await;
    refuse(json!({"target": "abort"}), "not allowed").await;
    refuse(
        json!({"target": "rescue", "rescue_password": "pw"}),
        "not allowed",
    )
    .await;
    refuse(
        json!({"target": "provide", "rescue_password": "pw"}),
        "rescue_password",
    )
    .await;
    let after = app.node("d").await;
    assert_eq!(after["provision_state"], "available");
    assert_eq!(
        app.etag_version("d").await,
        before + 6,
        "only the patches wrote"
    );

    // Nothing runs: DELETE …/provision is a 404 that changes nothing.
    let (s, v) = app
        .call(Method::DELETE, "/v1/nodes/d/provision", None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    assert!(message(&v).contains("no provision task"), "{v}");

    // Valid: the deploy starts and waits for a ramdisk (there is none here).
    let (s, v) = app.verb("d", json!({"target": "active"})).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let n = app.wait_state("d", "wait call-back").await;
    assert_eq!(n["target_provision_state"], "active");
    // Abort while the ramdisk boots: deploy failed, saying so.
    let (s, v) = app
        .call(Method::DELETE, "/v1/nodes/d/provision", None)
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let n = app.wait_state("d", "deploy failed").await;
    let err = n["last_error"].as_str().unwrap_or_default();
    assert!(err.contains("aborted") && err.contains("ramdisk"), "{n}");
    for _ in 0..100 {
        if app.node("d").await["power_state"] == "power off" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(app.node("d").await["power_state"], "power off");
    // From deploy failed, `deleted` tears down and (cleaning disabled here) rests in available
    // with the instance forgotten.
    let (s, v) = app.verb("d", json!({"target": "deleted"})).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let n = app.wait_state("d", "available").await;
    assert_eq!(n["instance_info"], json!({}), "{n}");
}

/// `reset_interfaces` (1.45) with a new driver resets every interface the patch does not
/// name, inspection included, to the new driver's default (Ironic resets all of
/// `ALL_INTERFACES`); without it an interface the new driver lacks is a 400 that changes
/// nothing.
async fn reset_interfaces_resets_every_unnamed_one(db: TestDb) {
    let app = start(db).await;
    let (s, v) = app
        .call(
            Method::POST,
            "/v1/nodes",
            Some(
                json!({"driver": "redfish", "name": "rs", "inspect_interface": "redfish",
                        "rescue_interface": "agent", "raid_interface": "agent",
                        "boot_interface": "redfish-virtual-media",
                        "bios_interface": "no-bios"}),
            ),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let to_ipmi = json!([{"op": "replace", "path": "/driver", "value": "ipmi"},
                         {"op": "replace", "path": "/boot_interface", "value": "pxe"},
                         {"op": "replace", "path": "/power_interface", "value": "ipmitool"},
                         {"op": "replace", "path": "/management_interface", "value": "ipmitool"},
                         {"op": "replace", "path": "/firmware_interface", "value": "no-firmware"},
                         {"op": "replace", "path": "/vendor_interface", "value": "no-vendor"}]);
    // Without reset_interfaces the redfish inspection does not suit ipmi.
    let (s, v) = app
        .call(Method::PATCH, "/v1/nodes/rs", Some(to_ipmi.clone()))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(message(&v).contains("inspect_interface"), "{v}");
    assert_eq!(app.node("rs").await["driver"], "redfish");
    let (s, v) = app
        .call(
            Method::PATCH,
            "/v1/nodes/rs?reset_interfaces=true",
            Some(
                json!([{"op": "replace", "path": "/driver", "value": "ipmi"},
                        {"op": "replace", "path": "/raid_interface", "value": "agent"}]),
            ),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    for (field, want) in [
        ("driver", "ipmi"),
        ("boot_interface", "ipxe"),
        ("deploy_interface", "direct"),
        ("power_interface", "ipmitool"),
        ("management_interface", "ipmitool"),
        ("rescue_interface", "no-rescue"),
        ("bios_interface", "no-bios"),
        ("inspect_interface", "agent"),
        ("vendor_interface", "ipmitool"),
        // Named by the patch: kept.
        ("raid_interface", "agent"),
    ] {
        assert_eq!(v[field], want, "{field}: {v}");
    }
    assert_eq!(app.node("rs").await["inspect_interface"], "agent");
}

on_every_backend!(
    reset_interfaces_resets_every_unnamed_one,
    defaults_and_validation,
    fake_hardware_lifecycle_without_agent,
    deploy_inputs_checked_up_front,
);
