//! The store's allocations, deploy templates and runbooks on both backends (SQLite always,
//! PostgreSQL with `RIVET_TEST_POSTGRES`): round trips, unique names and nodes, optimistic
//! versions, listings, and a node's `allocation_uuid` read from its allocation.

use crate::support;

use chrono::Utc;
use rivet_model::node::Node;
use rivet_store::{
    Allocation, AllocationQuery, SortDir, StepTemplate, StoreError, TemplateKind, TemplateQuery,
};
use serde_json::{json, Map};
use support::{on_every_backend, TestDb};

on_every_backend!(allocations_round_trip, templates_round_trip);

fn allocation(uuid: &str, name: Option<&str>, rc: &str) -> Allocation {
    Allocation {
        uuid: uuid.into(),
        name: name.map(str::to_string),
        node_uuid: None,
        state: "allocating".into(),
        last_error: None,
        resource_class: Some(rc.into()),
        candidate_nodes: vec!["n-1".into()],
        traits: vec!["CUSTOM_A".into()],
        extra: Map::from_iter([("k".to_string(), json!("v"))]),
        owner: Some("proj".into()),
        created_at: Utc::now(),
        updated_at: None,
        version: 0,
    }
}

async fn allocations_round_trip(db: TestDb) {
    let s = db.open(rivet_support::secrets::Secrets::ephemeral());
    let node = s
        .create_node(&Node::new(
            "6a0c1d2e-0000-4000-8000-00000000000a".into(),
            "fake-hardware".into(),
        ))
        .await
        .expect("node");
    assert_eq!(node.allocation_uuid, None);

    let a = s
        .create_allocation(&allocation("a-1", Some("first"), "gold"))
        .await
        .expect("create");
    assert_eq!(a.version, 1);
    let got = s.get_allocation("first").await.expect("by name");
    assert_eq!(got.uuid, "a-1");
    assert_eq!(got.candidate_nodes, vec!["n-1".to_string()]);
    assert_eq!(got.traits, vec!["CUSTOM_A".to_string()]);
    assert_eq!(got.extra["k"], "v");
    assert_eq!(got.owner.as_deref(), Some("proj"));
    assert_eq!(
        s.get_allocation("a-1").await.expect("by uuid").name,
        got.name
    );
    assert!(matches!(
        s.get_allocation("nope").await,
        Err(StoreError::NotFound { .. })
    ));
    // Unique UUID and name.
    assert!(matches!(
        s.create_allocation(&allocation("a-1", None, "gold")).await,
        Err(StoreError::Duplicate(m)) if m.contains("a-1")
    ));
    assert!(matches!(
        s.create_allocation(&allocation("a-2", Some("first"), "gold")).await,
        Err(StoreError::Duplicate(m)) if m.contains("first")
    ));

    // Holding a node: the node reads its allocation; a second allocation cannot hold it.
    let mut held = got.clone();
    held.node_uuid = Some(node.uuid.clone());
    held.state = "active".into();
    let held = s.update_allocation(&held).await.expect("hold");
    assert_eq!(held.version, 2);
    assert_eq!(
        s.get_node(&node.uuid)
            .await
            .expect("node")
            .allocation_uuid
            .as_deref(),
        Some("a-1")
    );
    assert_eq!(
        s.allocation_of_node(&node.uuid)
            .await
            .expect("of node")
            .map(|a| a.uuid),
        Some("a-1".to_string())
    );
    let mut other = s
        .create_allocation(&allocation("a-2", None, "silver"))
        .await
        .expect("second");
    other.node_uuid = Some(node.uuid.clone());
    assert!(matches!(
        s.update_allocation(&other).await,
        Err(StoreError::Duplicate(m)) if m.contains("already has an allocation")
    ));
    // A stale version conflicts.
    assert!(matches!(
        s.update_allocation(&got).await,
        Err(StoreError::Conflict { .. })
    ));
    // A node update does not touch the derived field.
    let node = s.get_node(&node.uuid).await.expect("node");
    let node = s.update_node(&node).await.expect("update node");
    assert_eq!(node.allocation_uuid.as_deref(), Some("a-1"));

    // Listing: filters, sort, marker.
    for i in 3..6 {
        s.create_allocation(&allocation(&format!("a-{i}"), None, "silver"))
            .await
            .expect("more");
    }
    let silver = s
        .list_allocations(&AllocationQuery {
            resource_class: Some("silver".into()),
            sort_key: "uuid".into(),
            sort_dir: SortDir::Desc,
            ..Default::default()
        })
        .await
        .expect("list");
    let uuids: Vec<&str> = silver.iter().map(|a| a.uuid.as_str()).collect();
    assert_eq!(uuids, ["a-5", "a-4", "a-3", "a-2"]);
    let page = s
        .list_allocations(&AllocationQuery {
            resource_class: Some("silver".into()),
            sort_key: "uuid".into(),
            sort_dir: SortDir::Desc,
            marker: Some("a-4".into()),
            limit: 1,
            ..Default::default()
        })
        .await
        .expect("page");
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].uuid, "a-3");
    let by_node = s
        .list_allocations(&AllocationQuery {
            node_uuid: Some(node.uuid.clone()),
            state: Some("active".into()),
            owner: Some("proj".into()),
            ..Default::default()
        })
        .await
        .expect("by node");
    assert_eq!(by_node.len(), 1);
    for key in rivet_store::ALLOCATION_SORT_KEYS {
        s.list_allocations(&AllocationQuery {
            sort_key: key.to_string(),
            marker: Some("a-3".into()),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("sort by {key}: {e}"));
    }

    s.delete_allocation("a-1").await.expect("delete");
    assert!(matches!(
        s.delete_allocation("a-1").await,
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(
        s.get_node(&node.uuid).await.expect("node").allocation_uuid,
        None
    );
}

fn template(kind: TemplateKind, uuid: &str, name: &str) -> StepTemplate {
    StepTemplate {
        kind,
        uuid: uuid.into(),
        name: name.into(),
        description: Some("d".into()),
        traits: vec!["CUSTOM_T".into()],
        steps: vec![json!({"interface": "deploy", "step": "s", "args": {}, "priority": 10})],
        extra: Map::new(),
        owner: None,
        public: true,
        disable_ramdisk: false,
        created_at: Utc::now(),
        updated_at: None,
        version: 0,
    }
}

async fn templates_round_trip(db: TestDb) {
    let s = db.open(rivet_support::secrets::Secrets::ephemeral());
    let dt = s
        .create_template(&template(TemplateKind::Deploy, "t-1", "CUSTOM_X"))
        .await
        .expect("deploy template");
    // The same name as another kind is fine; twice in one kind is not.
    s.create_template(&template(TemplateKind::Runbook, "r-1", "CUSTOM_X"))
        .await
        .expect("runbook");
    assert!(matches!(
        s.create_template(&template(TemplateKind::Deploy, "t-2", "CUSTOM_X")).await,
        Err(StoreError::Duplicate(m)) if m.contains("CUSTOM_X")
    ));
    let got = s
        .get_template(TemplateKind::Deploy, "CUSTOM_X")
        .await
        .expect("by name");
    assert_eq!(got.uuid, "t-1");
    assert_eq!(got.steps[0]["priority"], 10);
    assert_eq!(got.traits, vec!["CUSTOM_T".to_string()]);
    assert!(got.public);
    assert!(matches!(
        s.get_template(TemplateKind::Runbook, "t-1").await,
        Err(StoreError::NotFound { .. })
    ));
    let mut changed = got.clone();
    changed.name = "CUSTOM_Y".into();
    changed
        .steps
        .push(json!({"interface": "bios", "step": "b", "args": {}, "priority": 5}));
    let changed = s.update_template(&changed).await.expect("update");
    assert_eq!(changed.version, dt.version + 1);
    assert!(matches!(
        s.update_template(&got).await,
        Err(StoreError::Conflict { .. })
    ));
    s.create_template(&template(TemplateKind::Deploy, "t-3", "CUSTOM_Z"))
        .await
        .expect("third");
    let named = s
        .list_templates(&TemplateQuery {
            names: Some(vec!["CUSTOM_Y".into(), "CUSTOM_Q".into()]),
            ..TemplateQuery::all(TemplateKind::Deploy)
        })
        .await
        .expect("by names");
    assert_eq!(named.len(), 1);
    assert_eq!(named[0].steps.len(), 2);
    let page = s
        .list_templates(&TemplateQuery {
            sort_key: "name".into(),
            marker: Some("t-1".into()),
            ..TemplateQuery::all(TemplateKind::Deploy)
        })
        .await
        .expect("page");
    let names: Vec<&str> = page.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["CUSTOM_Z"]);
    let public = s
        .list_templates(&TemplateQuery {
            public: Some(true),
            ..TemplateQuery::all(TemplateKind::Runbook)
        })
        .await
        .expect("public");
    assert_eq!(public.len(), 1);
    s.delete_template(TemplateKind::Deploy, "t-1")
        .await
        .expect("delete");
    assert!(matches!(
        s.delete_template(TemplateKind::Deploy, "t-1").await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(s.get_template(TemplateKind::Runbook, "r-1").await.is_ok());
}
