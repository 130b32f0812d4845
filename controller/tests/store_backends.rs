//! Store conformance: the same checks against every backend, so SQLite and PostgreSQL stay
//! interchangeable (errors and their messages, listing order, queues, migrations).
//!
//! SQLite always runs. PostgreSQL runs when `RIVET_TEST_POSTGRES` holds a server URL whose
//! role may create databases (`scripts/setup-postgres.sh` prints one); each test gets its own
//! scratch database, dropped at the end. Without the variable the PostgreSQL half skips with
//! a message, or fails when `RIVET_REQUIRE_PEERS=1` (CI).

use crate::support;

use chrono::{DateTime, Duration, SubsecRound, Utc};
use rivet_model::node::Node;
use rivet_model::port::Port;
use rivet_protocol::agent::{Command, CommandKind, CommandResult, CommandStatus};
use rivet_protocol::states::{PowerState, ProvisionState};
use rivet_store::{NodeQuery, PortQuery, SortDir, StoreError, NODE_SORT_KEYS};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use support::{on_every_backend, pg, TestDb};

/// One sealing key for the whole run, so a test may reopen a store and read its secrets.
fn secrets() -> Arc<rivet_support::secrets::Secrets> {
    static KEY: std::sync::OnceLock<Arc<rivet_support::secrets::Secrets>> =
        std::sync::OnceLock::new();
    KEY.get_or_init(rivet_support::secrets::Secrets::ephemeral)
        .clone()
}

on_every_backend!(
    node_round_trip,
    optimistic_versions_and_duplicates,
    paging_sorting_and_filters,
    nodes_in_states_and_reservations,
    ports_unique_mac_and_cascade,
    lookup_by_system,
    command_queue,
    inventory,
    inspection_rules,
    concurrent_writers_one_wins,
    migrations_and_newer_schema,
    survives_lost_connections,
    rivetd_db_upgrade_serve_and_refuse,
    conductors_and_leases,
    liveness_is_outside_the_version,
    liveness_in_batches,
    summary_and_pending_in_one_read,
    upgrade_from_the_first_schema,
    notification_connection_ends_with_its_listener,
);

/// Times as the store keeps them (microseconds).
fn micros(t: DateTime<Utc>) -> DateTime<Utc> {
    t.trunc_subsecs(6)
}

fn node(uuid: &str, name: Option<&str>) -> Node {
    let mut n = Node::new(uuid.into(), "fake-hardware".into());
    n.name = name.map(str::to_string);
    n
}

fn port(uuid: &str, node: &str, mac: &str) -> Port {
    Port {
        uuid: uuid.into(),
        node_uuid: node.into(),
        address: mac.into(),
        pxe_enabled: true,
        extra: Map::new(),
        created_at: Utc::now(),
        updated_at: None,
        version: 0,
        attrs: Default::default(),
    }
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        other => panic!("not an object: {other}"),
    }
}

async fn node_round_trip(db: TestDb) {
    let s = db.open(secrets());
    let now = Utc::now();
    let mut n = node("3f1c2a9e-0000-4000-8000-000000000001", Some("full"));
    n.driver_info = obj(json!({"redfish_address": "https://10.0.0.1", "redfish_password": "pw"}));
    n.driver_internal_info = obj(json!({"agent_token": "h", "clean_steps": [{"step": "erase"}]}));
    n.properties =
        obj(json!({"cpus": 8, "memory_mb": 65536, "ratio": 1.5, "big": 18446744073709551615u64}));
    n.instance_info = obj(json!({"image_source": "http://x/img"}));
    n.instance_uuid = Some("inst-1".into());
    // Unicode, escapes and a NUL inside JSON survive both backends.
    n.extra = obj(
        json!({"owner": "ops", "note": "naïve ☃ \"quoted\" \\ \u{0} end", "nested": {"a": [1, null, true]}}),
    );
    n.provision_state = ProvisionState::CleanWait;
    n.target_provision_state = Some(ProvisionState::Available);
    n.provision_updated_at = Some(now - Duration::seconds(30));
    n.power_state = Some(PowerState::On);
    n.target_power_state = Some(PowerState::Off);
    n.maintenance = true;
    n.maintenance_reason = Some("fan".into());
    n.fault = Some("clean failure".into());
    n.last_error = Some("step failed: 'disk' é".into());
    n.clean_step = Some(json!({"interface": "deploy", "step": "erase_devices", "args": {}}));
    n.deploy_step = Some(json!({}));
    n.reservation = Some("c1".into());
    n.conductor = Some("c1".into());
    n.automated_clean = Some(false);
    n.resource_class = Some("baremetal.large".into());
    n.inspect_interface = Some("redfish".into());
    n.inspection_started_at = Some(now - Duration::seconds(60));
    n.inspection_finished_at = Some(now);
    n.traits = vec!["CUSTOM_GPU".into(), "CUSTOM_RAID".into()];

    let created = s.create_node(&n).await.expect("create");
    assert_eq!(created.version, 1);
    assert_eq!(created.updated_at, None);

    let by_uuid = s.get_node(&n.uuid).await.expect("by uuid");
    let by_name = s.get_node("full").await.expect("by name");
    assert_eq!(by_uuid, by_name);
    let mut want = created.clone();
    want.created_at = micros(want.created_at);
    want.provision_updated_at = want.provision_updated_at.map(micros);
    want.inspection_started_at = want.inspection_started_at.map(micros);
    want.inspection_finished_at = want.inspection_finished_at.map(micros);
    assert_eq!(by_uuid, want);

    // A minimal node: every optional field reads back empty.
    let bare = s
        .create_node(&node("3f1c2a9e-0000-4000-8000-000000000002", None))
        .await
        .expect("bare");
    let got = s.get_node(&bare.uuid).await.expect("get bare");
    assert_eq!(got.name, None);
    assert_eq!(got.clean_step, None);
    assert_eq!(got.power_state, None);
    assert_eq!(got.automated_clean, None);
    assert!(got.traits.is_empty());
    assert!(got.extra.is_empty());

    // A NUL from a tool's output in a free-text field never makes the node unwritable:
    // both engines store U+FFFD (PostgreSQL text cannot hold NUL; one store, one behaviour).
    let mut nul = by_uuid.clone();
    nul.last_error = Some("erase failed: \u{0}garbage".into());
    nul.maintenance_reason = Some("\u{0}".into());
    s.update_node(&nul).await.expect("update with NUL");
    let got = s.get_node(&n.uuid).await.expect("get NUL");
    assert_eq!(
        got.last_error.as_deref(),
        Some("erase failed: \u{FFFD}garbage")
    );
    assert_eq!(got.maintenance_reason.as_deref(), Some("\u{FFFD}"));
    assert_eq!(got.version, 2);
    let by_uuid = got;

    // Updating round-trips too and stamps updated_at.
    let mut u = by_uuid.clone();
    u.clean_step = None;
    u.maintenance = false;
    u.extra.insert("k".into(), json!([1, 2]));
    let updated = s.update_node(&u).await.expect("update");
    assert_eq!(updated.version, 3);
    let after = s.get_node(&u.uuid).await.expect("get updated");
    assert_eq!(after.version, 3);
    assert_eq!(after.clean_step, None);
    assert!(!after.maintenance);
    assert_eq!(after.extra["k"], json!([1, 2]));
    assert_eq!(after.updated_at, updated.updated_at.map(micros));

    let err = s.get_node("nope").await.expect_err("missing");
    assert!(
        matches!(err, StoreError::NotFound { kind: "node", .. }),
        "{err}"
    );
    assert_eq!(err.to_string(), "node nope could not be found");
}

async fn optimistic_versions_and_duplicates(db: TestDb) {
    let s = db.open(secrets());
    let a = s.create_node(&node("u-a", Some("a"))).await.expect("a");
    let b = s.create_node(&node("u-b", Some("b"))).await.expect("b");

    let mut first = a.clone();
    first.last_error = Some("x".into());
    s.update_node(&first).await.expect("first writer");
    let err = s.update_node(&a).await.expect_err("stale");
    assert!(
        matches!(
            err,
            StoreError::Conflict {
                kind: "node",
                expected: 1,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "node u-a was changed by another request (version 1 is stale); reload it and retry"
    );

    let ghost = node("u-ghost", None);
    let err = s.update_node(&ghost).await.expect_err("missing");
    assert!(
        matches!(err, StoreError::NotFound { kind: "node", .. }),
        "{err}"
    );

    let err = s
        .create_node(&node("u-c", Some("a")))
        .await
        .expect_err("dup name");
    assert!(matches!(err, StoreError::Duplicate(_)), "{err}");
    assert_eq!(err.to_string(), "a node named \"a\" already exists");
    let err = s
        .create_node(&node("u-a", Some("c")))
        .await
        .expect_err("dup uuid");
    assert_eq!(err.to_string(), "a node with UUID u-a already exists");

    // Renaming onto a taken name.
    let mut rename = b.clone();
    rename.name = Some("a".into());
    let err = s.update_node(&rename).await.expect_err("rename");
    assert!(matches!(err, StoreError::Duplicate(_)), "{err}");
    assert_eq!(err.to_string(), "a node named \"a\" already exists");
    assert_eq!(s.get_node("u-b").await.expect("b").version, 1);

    // Delete checks the version too; a missing node is a conflict as well.
    let err = s.delete_node("u-b", 7).await.expect_err("stale delete");
    assert!(
        matches!(err, StoreError::Conflict { expected: 7, .. }),
        "{err}"
    );
    let err = s
        .delete_node("u-none", 1)
        .await
        .expect_err("missing delete");
    assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
    s.delete_node("u-b", 1).await.expect("delete");
    assert!(s.get_node("b").await.is_err());
    // The name is free again.
    s.create_node(&node("u-b2", Some("b")))
        .await
        .expect("reuse name");
}

/// The order a listing must have: the key (NULL lowest, text byte-wise), then creation order.
fn expected_order(nodes: &[Node], key: &str, dir: SortDir) -> Vec<String> {
    #[derive(PartialEq, PartialOrd)]
    enum K {
        Text(Vec<u8>),
        Time(Option<DateTime<Utc>>),
        Flag(bool),
        Seq,
    }
    let text = |s: Option<&str>| K::Text(s.unwrap_or_default().as_bytes().to_vec());
    let mut keyed: Vec<(K, usize, String)> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let k = match key {
                "id" => K::Seq,
                "uuid" => text(Some(&n.uuid)),
                "name" => text(n.name.as_deref()),
                "created_at" => K::Time(Some(n.created_at)),
                "updated_at" => K::Time(n.updated_at),
                "provision_state" => text(Some(n.provision_state.as_str())),
                "provision_updated_at" => K::Time(n.provision_updated_at),
                "driver" => text(Some(&n.driver)),
                "resource_class" => text(n.resource_class.as_deref()),
                "power_state" => text(n.power_state.map(|p| p.as_str())),
                "maintenance" => K::Flag(n.maintenance),
                other => panic!("unknown key {other}"),
            };
            (k, i, n.uuid.clone())
        })
        .collect();
    keyed.sort_by(|a, b| {
        let o =
            a.0.partial_cmp(&b.0)
                .expect("comparable")
                .then(a.1.cmp(&b.1));
        if dir == SortDir::Asc {
            o
        } else {
            o.reverse()
        }
    });
    keyed.into_iter().map(|(_, _, u)| u).collect()
}

async fn paging_sorting_and_filters(db: TestDb) {
    let s = db.open(secrets());
    // Names that a locale collation would order differently from bytes, ties, and NULLs.
    let names = [
        Some("beta"),
        Some("Alpha"),
        None,
        Some("alpha"),
        Some("_under"),
        Some("zeta-1"),
        Some("zeta.1"),
        Some("Zeta"),
        None,
        Some("émile"),
        Some("10"),
        Some("9"),
    ];
    let t0 = Utc::now() - Duration::hours(1);
    let mut created = Vec::new();
    for (i, name) in names.iter().enumerate() {
        // UUIDs not in creation order, so uuid order differs from id order.
        let mut n = node(&format!("{:02x}-node", (i * 7) % 12 * 13), *name);
        n.created_at = t0 + Duration::seconds((i as i64 * 5) % 3);
        n.driver = if i % 3 == 0 { "ipmi" } else { "fake-hardware" }.into();
        n.resource_class = match i % 4 {
            0 => None,
            1 => Some("gpu".into()),
            _ => Some("small".into()),
        };
        n.power_state = [None, Some(PowerState::On), Some(PowerState::Off)][i % 3];
        n.maintenance = i % 5 == 0;
        n.provision_state = [
            ProvisionState::Enroll,
            ProvisionState::Manageable,
            ProvisionState::Available,
            ProvisionState::CleanWait,
        ][i % 4];
        n.provision_updated_at = (i % 2 == 0).then(|| t0 + Duration::seconds(i as i64 % 4));
        created.push(s.create_node(&n).await.expect("create"));
    }
    // Some updates so updated_at has values and NULLs.
    for i in [3usize, 7, 1] {
        let mut n = s.get_node(&created[i].uuid).await.expect("get");
        n.last_error = Some("touched".into());
        s.update_node(&n).await.expect("update");
    }
    let mut all = Vec::new();
    for n in &created {
        all.push(s.get_node(&n.uuid).await.expect("reload"));
    }

    let mut keys: Vec<&str> = NODE_SORT_KEYS.to_vec();
    keys.push("id");
    for key in keys {
        for dir in [SortDir::Asc, SortDir::Desc] {
            let want = expected_order(&all, key, dir);
            let full = s
                .list_nodes(&NodeQuery {
                    sort_key: key.into(),
                    sort_dir: dir,
                    ..Default::default()
                })
                .await
                .expect("list");
            let got: Vec<String> = full.into_iter().map(|n| n.uuid).collect();
            assert_eq!(got, want, "sort by {key} {dir:?}");
            // The same order page by page, for several page sizes.
            for limit in [1, 3, 5] {
                let mut q = NodeQuery {
                    limit,
                    sort_key: key.into(),
                    sort_dir: dir,
                    ..Default::default()
                };
                let mut paged = Vec::new();
                loop {
                    let page = s.list_nodes(&q).await.expect("page");
                    assert!(page.len() <= limit);
                    if page.is_empty() {
                        break;
                    }
                    q.marker = page.last().map(|n| n.uuid.clone());
                    paged.extend(page.into_iter().map(|n| n.uuid));
                }
                assert_eq!(paged, want, "pages of {limit} by {key} {dir:?}");
            }
        }
    }

    // Filters, alone and combined, keep id order.
    let filtered = |q: NodeQuery| {
        let s = s.clone();
        async move {
            s.list_nodes(&q)
                .await
                .expect("filter")
                .into_iter()
                .map(|n| n.uuid)
                .collect::<Vec<_>>()
        }
    };
    let pick = |f: &dyn Fn(&Node) -> bool| -> Vec<String> {
        all.iter()
            .filter(|n| f(n))
            .map(|n| n.uuid.clone())
            .collect()
    };
    assert_eq!(
        filtered(NodeQuery {
            provision_state: Some(ProvisionState::Manageable),
            ..Default::default()
        })
        .await,
        pick(&|n| n.provision_state == ProvisionState::Manageable)
    );
    assert_eq!(
        filtered(NodeQuery {
            maintenance: Some(true),
            ..Default::default()
        })
        .await,
        pick(&|n| n.maintenance)
    );
    assert_eq!(
        filtered(NodeQuery {
            maintenance: Some(false),
            driver: Some("fake-hardware".into()),
            resource_class: Some("small".into()),
            ..Default::default()
        })
        .await,
        pick(&|n| !n.maintenance
            && n.driver == "fake-hardware"
            && n.resource_class.as_deref() == Some("small"))
    );
    assert!(filtered(NodeQuery {
        driver: Some("nope".into()),
        ..Default::default()
    })
    .await
    .is_empty());
    // Filters combine with paging.
    let mut q = NodeQuery {
        limit: 2,
        driver: Some("fake-hardware".into()),
        sort_key: "name".into(),
        ..Default::default()
    };
    let mut paged = Vec::new();
    loop {
        let page = s.list_nodes(&q).await.expect("page");
        if page.is_empty() {
            break;
        }
        q.marker = page.last().map(|n| n.uuid.clone());
        paged.extend(page.into_iter().map(|n| n.uuid));
    }
    let fake: Vec<Node> = all
        .iter()
        .filter(|n| n.driver == "fake-hardware")
        .cloned()
        .collect();
    assert_eq!(paged, expected_order(&fake, "name", SortDir::Asc));

    // Limit 0 is an empty page; a bad marker or sort key is an error.
    let q = NodeQuery {
        limit: 0,
        ..Default::default()
    };
    assert!(s.list_nodes(&q).await.expect("limit 0").is_empty());
    let err = s
        .list_nodes(&NodeQuery {
            marker: Some("no-such-node".into()),
            ..Default::default()
        })
        .await
        .expect_err("bad marker");
    assert!(
        matches!(
            err,
            StoreError::NotFound {
                kind: "marker node",
                ..
            }
        ),
        "{err}"
    );
    let err = s
        .list_nodes(&NodeQuery {
            sort_key: "driver_info".into(),
            ..Default::default()
        })
        .await
        .expect_err("bad key");
    assert!(err.to_string().contains("invalid sort key"), "{err}");
}

async fn nodes_in_states_and_reservations(db: TestDb) {
    let s = db.open(secrets());
    let states = [
        ProvisionState::CleanWait,
        ProvisionState::Available,
        ProvisionState::InspectWait,
        ProvisionState::CleanWait,
    ];
    let mut uuids = Vec::new();
    for (i, st) in states.iter().enumerate() {
        let mut n = node(&format!("z{i}"), None);
        n.provision_state = *st;
        n.reservation = (i != 1).then(|| if i == 3 { "c2" } else { "c1" }.to_string());
        uuids.push(s.create_node(&n).await.expect("create").uuid);
    }
    let got: Vec<String> = s
        .nodes_in_states(&[ProvisionState::InspectWait, ProvisionState::CleanWait])
        .await
        .expect("scan")
        .into_iter()
        .map(|n| n.uuid)
        .collect();
    assert_eq!(got, vec!["z0", "z2", "z3"]);
    assert!(s.nodes_in_states(&[]).await.expect("none").is_empty());

    // The scans' narrow read says the same as a full read of each node.
    let mut z2 = s.get_node("z2").await.expect("z2");
    z2.clean_step = Some(json!({"step": "erase_devices", "abortable": true}));
    z2.runs.clean = Some(rivet_model::runs::CleanRun {
        step_index: 3,
        command: Some("c-3".into()),
        step_started_at: Some(micros(Utc::now())),
        ..Default::default()
    });
    z2.provision_updated_at = Some(micros(Utc::now()));
    s.update_node(&z2).await.expect("write z2");
    let live = rivet_model::node::Liveness {
        last_heartbeat: Some(micros(Utc::now())),
        ..Default::default()
    };
    s.record_liveness("z2", &live).await.expect("liveness");
    let summaries = s
        .node_summaries(&[ProvisionState::InspectWait, ProvisionState::CleanWait])
        .await
        .expect("summaries");
    assert_eq!(summaries.len(), 3);
    for summary in &summaries {
        let full = s.get_node(&summary.uuid).await.expect("full");
        assert_eq!(
            *summary,
            rivet_model::node::NodeSummary::of(&full),
            "{}",
            summary.uuid
        );
    }
    assert_eq!(
        summaries[1].runs.clean.as_ref().map(|c| c.step_index),
        Some(3)
    );
    assert_eq!(summaries[1].liveness, live);
    assert_eq!(s.node_summary("z2").await.expect("one"), summaries[1]);
    assert!(matches!(
        s.node_summary("nope").await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(s.node_summaries(&[]).await.expect("none").is_empty());

    // Page by page (as the periodic scan reads): the same summaries, by UUID, each once.
    let waits = [ProvisionState::InspectWait, ProvisionState::CleanWait];
    let (mut paged, mut after) = (Vec::new(), None::<String>);
    loop {
        let page = s
            .node_summaries_page(&waits, after.as_deref(), 2)
            .await
            .expect("page");
        assert!(page.len() <= 2, "a page holds at most its limit");
        let Some(last) = page.last() else { break };
        after = Some(last.uuid.clone());
        paged.extend(page);
    }
    let mut by_uuid = summaries.clone();
    by_uuid.sort_by(|a, b| a.uuid.cmp(&b.uuid));
    assert_eq!(paged, by_uuid);
    let rest = s
        .node_summaries_page(&waits, Some("z0"), 10)
        .await
        .expect("after z0");
    assert_eq!(
        rest.iter().map(|n| n.uuid.as_str()).collect::<Vec<_>>(),
        ["z2", "z3"]
    );
    assert!(s
        .node_summaries_page(&waits, None, 0)
        .await
        .expect("limit 0")
        .is_empty());
    assert!(s
        .node_summaries_page(&[], None, 10)
        .await
        .expect("no states")
        .is_empty());

    assert_eq!(s.release_reservations("c1").await.expect("release"), 2);
    assert_eq!(s.release_reservations("c1").await.expect("again"), 0);
    let z0 = s.get_node("z0").await.expect("z0");
    assert_eq!(z0.reservation, None);
    assert_eq!(z0.version, 2, "a released node's version moves");
    let z3 = s.get_node("z3").await.expect("z3");
    assert_eq!(z3.reservation.as_deref(), Some("c2"));
    assert_eq!(z3.version, 1);
}

/// Registration heartbeats, liveness, and the lease rules several controllers rely on: a
/// reservation lives as long as its holder's heartbeat.
async fn conductors_and_leases(db: TestDb) {
    let s = db.open(secrets());
    s.conductor_heartbeat("c1", "host-a", true)
        .await
        .expect("register c1");
    s.conductor_heartbeat("c2", "host-b", true)
        .await
        .expect("register c2");
    let first = s.list_conductors(5).await.expect("list");
    assert_eq!(
        first
            .iter()
            .map(|c| (c.id.as_str(), c.alive))
            .collect::<Vec<_>>(),
        vec![("c1", true), ("c2", true)]
    );
    assert_eq!(first[1].hostname, "host-b");
    // A heartbeat that is not a start keeps started_at and moves last_seen.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    s.conductor_heartbeat("c1", "host-a", false)
        .await
        .expect("beat");
    let again = s.list_conductors(5).await.expect("list");
    assert_eq!(again[0].started_at, first[0].started_at);
    assert!(again[0].last_seen > first[0].last_seen);
    // With a zero window nobody is alive.
    assert!(s
        .list_conductors(0)
        .await
        .expect("list")
        .iter()
        .all(|c| !c.alive));

    let mut n = node("l1", None);
    n.provision_state = ProvisionState::CleanWait;
    s.create_node(&n).await.expect("create");
    // Free: c1 takes it, its version moves (a reservation is a change others must see).
    assert!(s.acquire_lease("l1", "c1", 5).await.expect("take"));
    let got = s.get_node("l1").await.expect("get");
    assert_eq!(got.reservation.as_deref(), Some("c1"));
    assert_eq!(got.version, 2);
    // Taking one's own lease again is not a change.
    assert!(s.acquire_lease("l1", "c1", 5).await.expect("again"));
    assert_eq!(s.get_node("l1").await.expect("get").version, 2);
    // A live holder keeps others out, whatever they believe.
    assert!(!s.acquire_lease("l1", "c2", 5).await.expect("refused"));
    assert_eq!(s.get_node("l1").await.expect("get").version, 2);
    // A holder silent for longer than the window is dead: its lease is taken over.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    s.conductor_heartbeat("c2", "host-b", false)
        .await
        .expect("c2 beats");
    assert!(s.acquire_lease("l1", "c2", 1).await.expect("taken over"));
    let got = s.get_node("l1").await.expect("get");
    assert_eq!(got.reservation.as_deref(), Some("c2"));
    assert_eq!(got.version, 3);
    // Release only by the holder.
    assert!(!s.release_lease("l1", "c1").await.expect("not c1's"));
    assert!(s.release_lease("l1", "c2").await.expect("released"));
    assert_eq!(s.get_node("l1").await.expect("get").reservation, None);
    // A reservation by a controller that never registered is dead at once.
    let mut got = s.get_node("l1").await.expect("get");
    got.reservation = Some("never-registered".into());
    s.update_node(&got).await.expect("reserve for a stranger");
    assert!(s
        .acquire_lease("l1", "c1", 5)
        .await
        .expect("a stranger is not alive"));
    // An unknown node is nobody's.
    assert!(!s.acquire_lease("nope", "c1", 5).await.expect("unknown"));
}

async fn ports_unique_mac_and_cascade(db: TestDb) {
    let s = db.open(secrets());
    let n1 = s.create_node(&node("n1", Some("one"))).await.expect("n1");
    let n2 = s.create_node(&node("n2", Some("two"))).await.expect("n2");
    let mut p1 = port("p1", "n1", "52:54:00:00:00:01");
    p1.extra = obj(json!({"switch": "sw1"}));
    let created = s.create_port(&p1).await.expect("p1");
    assert_eq!(created.version, 1);
    s.create_port(&port("p2", "n1", "52:54:00:00:00:02"))
        .await
        .expect("p2");
    s.create_port(&port("p3", "n2", "52:54:00:00:00:03"))
        .await
        .expect("p3");

    let got = s.get_port("p1").await.expect("get");
    assert_eq!(got.extra["switch"], "sw1");
    assert_eq!(got.created_at, micros(p1.created_at));
    assert!(got.pxe_enabled);

    let err = s
        .create_port(&port("p4", "n2", "52:54:00:00:00:01"))
        .await
        .expect_err("dup mac");
    assert_eq!(
        err.to_string(),
        "A port with MAC address 52:54:00:00:00:01 already exists."
    );
    let err = s
        .create_port(&port("p1", "n2", "52:54:00:00:00:09"))
        .await
        .expect_err("dup uuid");
    assert_eq!(err.to_string(), "A port with UUID p1 already exists.");
    let err = s
        .create_port(&port("p5", "no-node", "52:54:00:00:00:05"))
        .await
        .expect_err("no node");
    assert!(matches!(err, StoreError::Backend(_)), "{err}");

    // Listing: by node, by address, paged by marker, limit 0 meaning the default.
    let uuids = |v: Vec<Port>| v.into_iter().map(|p| p.uuid).collect::<Vec<_>>();
    let q = |node: Option<&str>, address: Option<&str>, limit, marker: Option<&str>| PortQuery {
        node_uuid: node.map(str::to_string),
        address: address.map(str::to_string),
        limit,
        marker: marker.map(str::to_string),
        ..Default::default()
    };
    assert_eq!(
        uuids(s.list_ports(&q(None, None, 0, None)).await.expect("all")),
        ["p1", "p2", "p3"]
    );
    assert_eq!(
        uuids(
            s.list_ports(&q(Some("n1"), None, 0, None))
                .await
                .expect("n1")
        ),
        ["p1", "p2"]
    );
    assert_eq!(
        uuids(
            s.list_ports(&q(None, Some("52:54:00:00:00:03"), 0, None))
                .await
                .expect("mac")
        ),
        ["p3"]
    );
    assert_eq!(
        uuids(
            s.list_ports(&q(None, None, 1, Some("p1")))
                .await
                .expect("page")
        ),
        ["p2"]
    );
    // An unknown marker is NotFound (Ironic answers 404).
    assert!(matches!(
        s.list_ports(&q(None, None, 0, Some("nope"))).await,
        Err(StoreError::NotFound { kind: "port", .. })
    ));

    // Updates: optimistic, MAC still unique.
    let mut moved = got.clone();
    moved.node_uuid = "n2".into();
    moved.pxe_enabled = false;
    let moved = s.update_port(&moved).await.expect("move");
    assert_eq!(moved.version, 2);
    let err = s.update_port(&got).await.expect_err("stale");
    assert!(
        matches!(err, StoreError::Conflict { kind: "port", .. }),
        "{err}"
    );
    let mut clash = moved.clone();
    clash.address = "52:54:00:00:00:02".into();
    let err = s.update_port(&clash).await.expect_err("clash");
    assert_eq!(
        err.to_string(),
        "A port with MAC address 52:54:00:00:00:02 already exists."
    );
    let reread = s.get_port("p1").await.expect("reread");
    assert_eq!(reread.node_uuid, "n2");
    assert!(!reread.pxe_enabled);
    assert!(reread.updated_at.is_some());

    // Lookup by MACs.
    assert_eq!(
        s.node_by_macs(&["aa:aa:aa:aa:aa:aa".into(), "52:54:00:00:00:02".into()])
            .await
            .expect("lookup"),
        Some("n1".into())
    );
    assert_eq!(
        s.node_by_macs(&["aa:aa:aa:aa:aa:aa".into()])
            .await
            .expect("miss"),
        None
    );
    assert_eq!(s.node_by_macs(&[]).await.expect("empty"), None);

    // Deleting a port; deleting a node takes its ports, commands and inventory along.
    s.delete_port("p3").await.expect("delete port");
    let err = s.delete_port("p3").await.expect_err("again");
    assert!(
        matches!(err, StoreError::NotFound { kind: "port", .. }),
        "{err}"
    );
    s.enqueue_command("n1", &cmd("c-n1", CommandKind::GetInventory))
        .await
        .expect("cmd");
    s.save_inventory("n1", &json!({"cpu": {}}))
        .await
        .expect("inventory");
    // A stale delete changes nothing (the port deletion is rolled back).
    assert!(s.delete_node("n1", 99).await.is_err());
    assert!(s.get_port("p2").await.is_ok());
    s.delete_node("n1", n1.version).await.expect("delete node");
    assert!(s.get_port("p2").await.is_err());
    assert!(s.command("n1", "c-n1").await.is_err());
    assert!(s.get_inventory("n1").await.is_err());
    // The port that moved to n2 stays.
    assert!(s.get_port("p1").await.is_ok());
    s.delete_node("n2", n2.version).await.expect("delete n2");
    assert!(s.get_port("p1").await.is_err());
}

async fn lookup_by_system(db: TestDb) {
    let s = db.open(secrets());
    let mut a = node("sys-a", None);
    a.properties = obj(
        json!({"system_uuid": "ABCDEF01-2345-6789-ABCD-EF0123456789", "system_serial": "SN-1"}),
    );
    let mut b = node("sys-b", None);
    b.properties = obj(json!({"system_serial": "SN-2"}));
    let mut c = node("sys-c", None);
    c.properties = obj(json!({"system_serial": 12345}));
    for n in [&a, &b, &c] {
        s.create_node(n).await.expect("create");
    }
    let find = |u: Option<&'static str>, sn: Option<&'static str>| {
        let s = s.clone();
        async move { s.node_by_system(u, sn).await.expect("lookup") }
    };
    assert_eq!(
        find(Some("abcdef01-2345-6789-abcd-ef0123456789"), None).await,
        Some("sys-a".into()),
        "the system UUID compares case-insensitively"
    );
    assert_eq!(find(None, Some("SN-2")).await, Some("sys-b".into()));
    assert_eq!(find(None, Some("sn-2")).await, None, "serials are exact");
    assert_eq!(find(Some("nope"), Some("SN-1")).await, Some("sys-a".into()));
    assert_eq!(find(None, Some("12345")).await, None, "only string serials");
    assert_eq!(find(Some("nope"), None).await, None);
    assert_eq!(find(None, None).await, None);
}

fn cmd(id: &str, kind: CommandKind) -> Command {
    Command {
        id: id.into(),
        kind,
    }
}

fn result(id: &str, status: CommandStatus) -> CommandResult {
    CommandResult {
        id: id.into(),
        name: "execute_step".into(),
        status,
        result: json!({"erased": ["/dev/sda"]}),
        error: None,
        log_tail: None,
    }
}

async fn command_queue(db: TestDb) {
    let s = db.open(secrets());
    s.create_node(&node("q1", None)).await.expect("q1");
    s.create_node(&node("q2", None)).await.expect("q2");
    let step = CommandKind::ExecuteStep {
        interface: "deploy".into(),
        step: "erase_devices".into(),
        args: obj(json!({"passes": 1, "label": "ü"})),
    };
    s.enqueue_command("q1", &cmd("c1", CommandKind::GetInventory))
        .await
        .expect("c1");
    s.enqueue_command("q1", &cmd("c2", step.clone()))
        .await
        .expect("c2");
    s.enqueue_command("q2", &cmd("c3", CommandKind::Reboot))
        .await
        .expect("c3");
    let err = s
        .enqueue_command("q2", &cmd("c1", CommandKind::PowerOff))
        .await
        .expect_err("dup id");
    assert_eq!(err.to_string(), "command c1 already queued");
    assert!(s
        .enqueue_command("no-node", &cmd("c9", CommandKind::Reboot))
        .await
        .is_err());

    let pending = s.pending_commands("q1").await.expect("pending");
    assert_eq!(
        pending,
        vec![
            cmd("c1", CommandKind::GetInventory),
            cmd("c2", step.clone())
        ]
    );

    // A result is stored once; a re-delivery is recognised; an unknown id is NotFound.
    assert!(s
        .record_result("q1", &result("c1", CommandStatus::Succeeded))
        .await
        .expect("first"));
    assert!(!s
        .record_result("q1", &result("c1", CommandStatus::Failed))
        .await
        .expect("again"));
    let err = s
        .record_result("q2", &result("c1", CommandStatus::Succeeded))
        .await
        .expect_err("other node's command");
    assert!(
        matches!(
            err,
            StoreError::NotFound {
                kind: "command",
                ..
            }
        ),
        "{err}"
    );
    let stored = s.command("q1", "c1").await.expect("command");
    assert_eq!(stored.command, cmd("c1", CommandKind::GetInventory));
    assert_eq!(
        stored.result,
        Some(result("c1", CommandStatus::Succeeded)),
        "the first result wins"
    );
    assert_eq!(s.command("q1", "c2").await.expect("c2").result, None);
    assert!(matches!(
        s.command("q2", "c2").await,
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(
        s.pending_commands("q1").await.expect("pending"),
        vec![cmd("c2", step)]
    );

    // Cancelling drops what has no result; a late result is still recorded.
    assert_eq!(s.cancel_pending("q1").await.expect("cancel"), 1);
    assert!(s.pending_commands("q1").await.expect("none").is_empty());
    assert_eq!(s.pending_commands("q2").await.expect("q2").len(), 1);
    assert!(s
        .record_result("q1", &result("c2", CommandStatus::Aborted))
        .await
        .expect("late"));
    assert_eq!(s.cancel_pending("q1").await.expect("nothing left"), 0);
}

async fn inventory(db: TestDb) {
    let s = db.open(secrets());
    s.create_node(&node("i1", None)).await.expect("i1");
    let err = s.get_inventory("i1").await.expect_err("none yet");
    assert!(
        matches!(
            err,
            StoreError::NotFound {
                kind: "inventory of node",
                ..
            }
        ),
        "{err}"
    );
    let before = micros(Utc::now());
    let inv = json!({"cpu": {"count": 8, "model_name": "Xeon®"}, "disks": [{"name": "/dev/sda", "size": 1u64 << 40}], "boot": null});
    s.save_inventory("i1", &inv).await.expect("save");
    let (got, at) = s.get_inventory("i1").await.expect("get");
    assert_eq!(got, inv);
    assert!(at >= before && at <= Utc::now(), "{at}");
    let inv2 = json!({"cpu": {"count": 16}});
    s.save_inventory("i1", &inv2).await.expect("replace");
    let (got2, at2) = s.get_inventory("i1").await.expect("get again");
    assert_eq!(got2, inv2);
    assert!(at2 >= at);
    assert!(s.save_inventory("no-node", &inv).await.is_err());
}

async fn inspection_rules(db: TestDb) {
    let s = db.open(secrets());
    assert!(s.list_rules().await.expect("empty").is_empty());
    let rule = |uuid: &str, priority: i64| json!({"uuid": uuid, "priority": priority, "actions": [{"op": "add-trait", "args": {"name": "CUSTOM_X"}}]});
    s.put_rule("r1", 0, &rule("r1", 0)).await.expect("r1");
    s.put_rule("r2", 50, &rule("r2", 50)).await.expect("r2");
    s.put_rule("r3", 0, &rule("r3", 0)).await.expect("r3");
    s.put_rule("r4", 50, &rule("r4", 50)).await.expect("r4");
    let ids = |v: Vec<Value>| {
        v.into_iter()
            .map(|r| r["uuid"].as_str().unwrap_or_default().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ids(s.list_rules().await.expect("list")),
        ["r2", "r4", "r1", "r3"]
    );
    // Replacing keeps the rule's place among equals and takes the new priority.
    s.put_rule(
        "r1",
        0,
        &json!({"uuid": "r1", "priority": 0, "description": "new"}),
    )
    .await
    .expect("replace");
    let rules = s.list_rules().await.expect("list");
    assert_eq!(rules[2]["description"], "new");
    assert_eq!(ids(rules), ["r2", "r4", "r1", "r3"]);
    s.put_rule("r3", 100, &rule("r3", 100))
        .await
        .expect("raise");
    assert_eq!(
        ids(s.list_rules().await.expect("list")),
        ["r3", "r2", "r4", "r1"]
    );
    s.delete_rule("r2").await.expect("delete");
    let err = s.delete_rule("r2").await.expect_err("again");
    assert!(
        matches!(
            err,
            StoreError::NotFound {
                kind: "inspection rule",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(ids(s.list_rules().await.expect("list")), ["r3", "r4", "r1"]);
}

async fn concurrent_writers_one_wins(db: TestDb) {
    let s = db.open(secrets());
    let n = s.create_node(&node("race", None)).await.expect("create");
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..16 {
        let (s, mut n) = (s.clone(), n.clone());
        tasks.spawn(async move {
            n.last_error = Some(format!("writer {i}"));
            s.update_node(&n).await
        });
    }
    let (mut ok, mut conflicts) = (0, 0);
    while let Some(r) = tasks.join_next().await {
        match r.expect("task") {
            Ok(_) => ok += 1,
            Err(StoreError::Conflict { .. }) => conflicts += 1,
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert_eq!((ok, conflicts), (1, 15));
    assert_eq!(s.get_node("race").await.expect("get").version, 2);

    // Results recorded concurrently for one command: exactly one is new.
    s.enqueue_command("race", &cmd("rc", CommandKind::GetInventory))
        .await
        .expect("cmd");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let s = s.clone();
        tasks.spawn(async move {
            s.record_result("race", &result("rc", CommandStatus::Succeeded))
                .await
        });
    }
    let mut fresh = 0;
    while let Some(r) = tasks.join_next().await {
        if r.expect("task").expect("record") {
            fresh += 1;
        }
    }
    assert_eq!(fresh, 1);
}

/// Write a schema version row behind the store's back.
async fn bump_schema(db: &TestDb, version: i64) {
    if db.is_postgres() {
        let client = pg(&db.url()).await;
        client
            .execute(
                "INSERT INTO schema_version (version) VALUES ($1)",
                &[&version],
            )
            .await
            .expect("bump");
    } else {
        let c = rusqlite::Connection::open(db.sqlite_file()).expect("sqlite");
        c.execute(
            "INSERT INTO schema_version (version) VALUES (?1)",
            [version],
        )
        .expect("bump");
    }
}

async fn migrations_and_newer_schema(db: TestDb) {
    // An empty database is brought to the current version, once.
    let (before, after) = rivet_store::upgrade(&db.url()).expect("upgrade");
    assert_eq!(before, 0);
    assert!(after >= 3);
    assert_eq!(
        rivet_store::upgrade(&db.url()).expect("again"),
        (after, after)
    );
    // Opening an up-to-date database keeps its data.
    {
        let s = db.open(secrets());
        s.create_node(&node("kept", None)).await.expect("create");
    }
    let s = db.open(secrets());
    assert!(s.get_node("kept").await.is_ok());
    drop(s);

    // A schema from the future is refused by open and by upgrade, with a clear message.
    bump_schema(&db, after + 1).await;
    let want = format!(
        "database schema version {} is newer than this rivetd knows ({after}); run a newer rivetd",
        after + 1
    );
    let err = rivet_store::open(&db.url(), secrets())
        .err()
        .expect("open must refuse");
    assert!(err.to_string().contains(&want), "{err}");
    let err = rivet_store::upgrade(&db.url()).expect_err("upgrade must refuse");
    assert!(err.to_string().contains(&want), "{err}");
}

/// Cut every connection to the test database but this one (PostgreSQL only: a server restart
/// or a failover looks the same to the store).
async fn cut_connections(db: &TestDb) -> u64 {
    let client = pg(&db.url()).await;
    client
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .expect("terminate")
        .len() as u64
}

/// The LISTEN connection lives as long as the conductor's notice loop holds the receiver:
/// dropped (shutdown), the connection closes at once (PostgreSQL; SQLite has no notices).
async fn notification_connection_ends_with_its_listener(db: TestDb) {
    let s = db.open(secrets());
    let Some(rx) = s.subscribe() else {
        assert!(!db.is_postgres(), "PostgreSQL carries notices");
        return;
    };
    let client = pg(&db.url()).await;
    let listening = || async {
        client
            .query(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
                 AND query = 'LISTEN rivet'",
                &[],
            )
            .await
            .expect("pg_stat_activity")
            .len()
    };
    let mut seen = 0;
    for _ in 0..100 {
        seen = listening().await;
        if seen > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(seen, 1, "the notification connection is up");
    drop(rx);
    let mut left = seen;
    for _ in 0..40 {
        left = listening().await;
        if left == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(left, 0, "the notification connection outlived its listener");
}

async fn survives_lost_connections(db: TestDb) {
    let s = db.open(secrets());
    s.create_node(&node("keep", None)).await.expect("create");
    // Use several pooled connections at once so more than one is open.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let s = s.clone();
        tasks.spawn(async move { s.get_node("keep").await });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("task").expect("get");
    }
    if db.is_postgres() {
        assert!(cut_connections(&db).await >= 1, "the store had connections");
        // The pool notices closed connections and opens new ones; give the client a moment
        // to read the server's goodbye.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    for _ in 0..10 {
        assert_eq!(s.get_node("keep").await.expect("after").uuid, "keep");
    }
    let mut n = s.get_node("keep").await.expect("get");
    n.last_error = Some("still writable".into());
    s.update_node(&n).await.expect("update");
}

/// Run the rivetd binary with `state` as its state directory (as systemd's
/// `StateDirectory=` gives it: on PostgreSQL the image cache goes there, not into the
/// crate's directory); (success, stdout, stderr).
fn rivetd(state: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rivetd"))
        .args(args)
        .env("STATE_DIRECTORY", state)
        .env_remove("RIVETD_DB")
        .env("RUST_BACKTRACE", "0")
        .env("RIVET_SECRETS_KEY", "5e".repeat(32))
        .output()
        .expect("run rivetd");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The operator's view: `rivetd db upgrade` offline, then `rivetd --db` serves; a database
/// from a newer rivetd is refused by both, saying so.
async fn rivetd_db_upgrade_serve_and_refuse(db: TestDb) {
    let url = db.url();
    let (ok, out, err) = rivetd(db.dir(), &["db", "upgrade", "--db", &url]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("upgraded from schema version 0 to"), "{out}");
    let (ok, out, err) = rivetd(db.dir(), &["--db", &url, "db", "upgrade"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("nothing to do"), "{out}");
    if db.is_postgres() {
        assert!(!out.contains(":rivet@"), "the password is not shown: {out}");
    }

    // Serve on the upgraded database.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_rivetd"))
        .args(["--db", &url, "--listen", &listen, "--no-auth"])
        .env("RIVET_LOG", "warn")
        // PostgreSQL needs a configured key to seal BMC passwords with.
        .env("RIVET_SECRETS_KEY", "5e".repeat(32))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn rivetd");
    let http = reqwest::Client::new();
    let base = format!("http://{listen}");
    let mut created = None;
    for _ in 0..100 {
        let r = http
            .post(format!("{base}/v1/nodes"))
            // Names are 1.5 on: without a version (1.1) a name is 406, as in Ironic.
            .header("X-OpenStack-Ironic-API-Version", "latest")
            .json(&json!({"driver": "fake-hardware", "name": "served"}))
            .send()
            .await;
        if let Ok(r) = r {
            created = Some(r.status());
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let listed: Value = http
        .get(format!("{base}/v1/nodes"))
        .header("X-OpenStack-Ironic-API-Version", "latest")
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(created, Some(reqwest::StatusCode::CREATED));
    assert_eq!(listed["nodes"][0]["name"], "served", "{listed}");

    // A newer schema: both commands refuse and say why.
    let (_, after) = rivet_store::upgrade(&url).expect("versions");
    bump_schema(&db, after + 1).await;
    let want = format!(
        "database schema version {} is newer than this rivetd knows",
        after + 1
    );
    let (ok, out, err) = rivetd(db.dir(), &["db", "upgrade", "--db", &url]);
    assert!(!ok, "{out}");
    assert!(err.contains(&want), "{err}");
    let (ok, out, err) = rivetd(db.dir(), &["--db", &url, "--listen", &listen, "--no-auth"]);
    assert!(!ok, "{out}");
    assert!(err.contains(&want), "{err}");
}

/// Several controllers starting at once on an empty PostgreSQL database apply each migration
/// once (an advisory lock serialises them).
#[tokio::test]
async fn postgres_concurrent_first_open_migrates_once() {
    let Some(db) = TestDb::postgres("postgres_concurrent_first_open_migrates_once") else {
        return;
    };
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let url = db.url();
            std::thread::spawn(move || rivet_store::open(&url, secrets()).map(|_| ()))
        })
        .collect();
    for t in threads {
        t.join().expect("thread").expect("open");
    }
    let client = pg(&db.url()).await;
    let rows = client
        .query("SELECT version FROM schema_version ORDER BY version", &[])
        .await
        .expect("versions");
    let versions: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    let (_, current) = rivet_store::upgrade(&db.url()).expect("current");
    assert_eq!(versions, (1..=current).collect::<Vec<_>>());
}

/// Heartbeat liveness is written without a version check and without moving the version
/// (ETag): an API write made from a copy read before the heartbeat still succeeds, and does
/// not roll the liveness back.
async fn liveness_is_outside_the_version(db: TestDb) {
    let s = db.open(secrets());
    let created = s.create_node(&node("n1", None)).await.expect("create");
    let at = micros(Utc::now());
    let live = rivet_model::node::Liveness {
        last_heartbeat: Some(at),
        agent_version: Some("1.2.3".into()),
        progress: Some(
            json!({"command_id": "c1", "step": "erase_devices", "progress": {"done": 3, "total": 10}}),
        ),
    };
    s.record_liveness("n1", &live).await.expect("liveness");
    let read = s.get_node("n1").await.expect("read");
    assert_eq!(read.version, created.version, "liveness moved the version");
    assert_eq!(read.updated_at, created.updated_at);
    assert_eq!(read.liveness, live);

    // A write from the copy read before the heartbeat: no conflict, liveness kept.
    let mut edited = created.clone();
    edited.extra.insert("owner".into(), json!("ops"));
    let written = s
        .update_node(&edited)
        .await
        .expect("API write after a heartbeat");
    assert_eq!(written.version, created.version + 1);
    let read = s.get_node("n1").await.expect("read");
    assert_eq!(read.liveness, live, "a node write rolled the liveness back");
    assert_eq!(read.extra.get("owner"), Some(&json!("ops")));
    // Listings carry it too.
    let listed = s.list_nodes(&NodeQuery::default()).await.expect("list");
    assert_eq!(listed[0].liveness, live);

    match s.record_liveness("nope", &live).await {
        Err(StoreError::NotFound { .. }) => {}
        other => panic!("liveness for an unknown node: {other:?}"),
    }
}

/// Liveness of many nodes in one statement: each node gets its own record (absent fields
/// clear the column, as `record_liveness` does), unknown nodes are skipped, others are not
/// touched, and versions do not move.
async fn liveness_in_batches(db: TestDb) {
    let s = db.open(secrets());
    let n1 = s.create_node(&node("n1", None)).await.expect("create");
    s.create_node(&node("n2", None)).await.expect("create");
    s.create_node(&node("n3", None)).await.expect("create");
    let at = micros(Utc::now());
    let one = rivet_model::node::Liveness {
        last_heartbeat: Some(at),
        agent_version: Some("1.2.3".into()),
        progress: Some(
            json!({"command_id": "c1", "step": "erase_devices", "progress": {"done": 3, "total": 10}, "note": "it's \"quoted\""}),
        ),
    };
    s.record_liveness("n2", &one).await.expect("liveness");
    let two = rivet_model::node::Liveness {
        last_heartbeat: Some(at + chrono::Duration::microseconds(7)),
        agent_version: None,
        progress: None,
    };
    assert_eq!(s.record_liveness_many(&[]).await.expect("empty batch"), 0);
    let n = s
        .record_liveness_many(&[
            ("n1".into(), one.clone()),
            ("ghost".into(), one.clone()),
            ("n2".into(), two.clone()),
        ])
        .await
        .expect("batch");
    assert_eq!(n, 2, "the unknown node was counted");
    let r1 = s.get_node("n1").await.expect("read");
    assert_eq!(r1.liveness, one);
    assert_eq!(r1.version, n1.version, "liveness moved the version");
    assert_eq!(s.node_summary("n2").await.expect("read").liveness, two);
    assert_eq!(
        s.get_node("n3").await.expect("read").liveness,
        rivet_model::node::Liveness::default(),
        "a node outside the batch was written"
    );
}

/// A heartbeat's one read: the node's summary and exactly what `pending_commands` returns
/// (queue order; answered, cancelled and other nodes' commands left out), by UUID or name.
async fn summary_and_pending_in_one_read(db: TestDb) {
    let s = db.open(secrets());
    s.create_node(&node("p1", Some("first"))).await.expect("p1");
    s.create_node(&node("p2", None)).await.expect("p2");
    let (summary, pending) = s.node_summary_and_pending("p1").await.expect("read");
    assert_eq!(summary, s.node_summary("p1").await.expect("summary"));
    assert!(pending.is_empty(), "{pending:?}");
    let step = CommandKind::ExecuteStep {
        interface: "deploy".into(),
        step: "erase_devices".into(),
        args: obj(json!({"label": "ü \"q\""})),
    };
    for (id, kind) in [
        ("a", CommandKind::GetInventory),
        ("b", step),
        ("c", CommandKind::Reboot),
    ] {
        s.enqueue_command("p1", &cmd(id, kind))
            .await
            .expect("enqueue");
    }
    s.enqueue_command("p2", &cmd("other", CommandKind::PowerOff))
        .await
        .expect("enqueue");
    assert!(s
        .record_result("p1", &result("a", CommandStatus::Succeeded))
        .await
        .expect("result"));
    let expected = s.pending_commands("p1").await.expect("pending");
    assert_eq!(
        expected.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        ["b", "c"]
    );
    for ident in ["p1", "first"] {
        let (summary, pending) = s.node_summary_and_pending(ident).await.expect("read");
        assert_eq!(summary.uuid, "p1");
        assert_eq!(pending, expected, "by {ident}");
    }
    s.cancel_pending("p1").await.expect("cancel");
    assert!(s
        .node_summary_and_pending("p1")
        .await
        .expect("read")
        .1
        .is_empty());
    match s.node_summary_and_pending("nope").await {
        Err(StoreError::NotFound { .. }) => {}
        other => panic!("an unknown node: {other:?}"),
    }
}

/// A database made by the first released schema (migration 1 alone, a node written with its
/// columns) is brought to the current schema by `rivetd db upgrade`'s code path, and the node
/// reads back whole and is writable.
async fn upgrade_from_the_first_schema(db: TestDb) {
    let insert = "INSERT INTO nodes (uuid, name, driver, driver_info, driver_internal_info, \
        properties, instance_info, extra, provision_state, maintenance, created_at, version) \
        VALUES ('9e1c7a4e-0000-4000-8000-000000000001', 'old', 'fake-hardware', '{}', \
        '{\"cached_clean_steps_at\": \"2025-01-01T00:00:00Z\"}', '{\"cpus\": 8}', '{}', \
        '{\"rack\": \"r1\"}', 'manageable', FALSE, '2025-01-01T00:00:00+00:00', 3), \
        ('9e1c7a4e-0000-4000-8000-000000000002', 'midclean', 'fake-hardware', '{}', \
        '{\"agent_token_hash\": \"h\", \"cleaning_booted\": true, \"clean_plan\": [], \
          \"clean_step_index\": 2, \"clean_command\": \"c-7\", \"provision_cause\": \"provide\"}', \
        '{}', '{}', '{}', 'clean wait', FALSE, '2025-01-01T00:00:00+00:00', 5)";
    if db.is_postgres() {
        let c = pg(&db.url()).await;
        c.batch_execute("CREATE TABLE schema_version (version BIGINT NOT NULL)")
            .await
            .expect("schema_version");
        let first = rivet_store::migrations::sql(0, rivet_store::sql::Dialect::Postgres)
            .expect("migration 1");
        c.batch_execute(&first).await.expect("migration 1");
        c.batch_execute("INSERT INTO schema_version (version) VALUES (1)")
            .await
            .expect("version");
        c.batch_execute(insert).await.expect("old node");
    } else {
        let c = rusqlite::Connection::open(db.sqlite_file()).expect("sqlite");
        c.execute_batch("CREATE TABLE schema_version (version INTEGER NOT NULL)")
            .expect("schema_version");
        let first = rivet_store::migrations::sql(0, rivet_store::sql::Dialect::Sqlite)
            .expect("migration 1");
        c.execute_batch(&first).expect("migration 1");
        c.execute_batch("INSERT INTO schema_version (version) VALUES (1)")
            .expect("version");
        c.execute_batch(insert).expect("old node");
    }
    let (before, after) = rivet_store::upgrade(&db.url()).expect("upgrade");
    assert_eq!((before, after), (1, rivet_store::sqlite::SCHEMA_VERSION));
    let s = db.open(secrets());
    let n = s.get_node("old").await.expect("read the old node");
    assert!(n.corrupt.is_none(), "{:?}", n.corrupt);
    assert_eq!(n.provision_state, ProvisionState::Manageable);
    assert_eq!(n.version, 3);
    assert_eq!(n.properties.get("cpus"), Some(&json!(8)));
    assert_eq!(n.extra.get("rack"), Some(&json!("r1")));
    assert!(n.traits.is_empty());
    assert_eq!(n.liveness, rivet_model::node::Liveness::default());
    let mut edited = n.clone();
    edited.extra.insert("owner".into(), json!("ops"));
    let written = s.update_node(&edited).await.expect("write the old node");
    assert_eq!(written.version, 4);

    // A node caught mid-cleaning by the upgrade: its run bookkeeping moves from
    // driver_internal_info to the typed run state, so the cleaning resumes where it was.
    let n = s
        .get_node("midclean")
        .await
        .expect("read the mid-clean node");
    assert!(n.corrupt.is_none(), "{:?}", n.corrupt);
    let clean = n.runs.clean.clone().expect("the cleaning run carried over");
    assert_eq!(
        (clean.step_index, clean.command.as_deref()),
        (2, Some("c-7"))
    );
    assert_eq!(
        n.runs.agent.as_ref().map(|a| a.token_hash.as_str()),
        Some("h")
    );
    assert_eq!(
        n.driver_internal_info.keys().collect::<Vec<_>>(),
        vec!["provision_cause"]
    );
    let written = s.update_node(&n).await.expect("write the mid-clean node");
    let again = s.get_node("midclean").await.expect("read again");
    assert_eq!(
        again.runs, written.runs,
        "the run state is stored in its column"
    );
}
