//! Store conformance for ports' later fields and port groups, on every backend: round trips,
//! unique names and MACs, filters (port group, shard, conductor group), sorting and paging,
//! optimistic versions, and a port group refusing deletion while ports are in it.

use crate::support;

use chrono::Utc;
use rivet_model::node::Node;
use rivet_model::port::{Port, PortAttrs, Portgroup};
use rivet_store::{PortQuery, PortgroupQuery, SortDir, StoreError};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use support::{on_every_backend, TestDb};

fn secrets() -> Arc<rivet_support::secrets::Secrets> {
    static KEY: std::sync::OnceLock<Arc<rivet_support::secrets::Secrets>> =
        std::sync::OnceLock::new();
    KEY.get_or_init(rivet_support::secrets::Secrets::ephemeral)
        .clone()
}

on_every_backend!(ports_and_portgroups);

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        other => panic!("not an object: {other}"),
    }
}

fn port(uuid: &str, node: &str, mac: &str, attrs: PortAttrs) -> Port {
    Port {
        uuid: uuid.into(),
        node_uuid: node.into(),
        address: mac.into(),
        pxe_enabled: true,
        extra: Map::new(),
        created_at: Utc::now(),
        updated_at: None,
        version: 0,
        attrs,
    }
}

fn group(uuid: &str, node: &str, name: Option<&str>, mac: Option<&str>) -> Portgroup {
    Portgroup {
        uuid: uuid.into(),
        name: name.map(str::to_string),
        node_uuid: node.into(),
        address: mac.map(str::to_string),
        extra: Map::new(),
        internal_info: Map::new(),
        mode: Some("802.3ad".into()),
        properties: obj(json!({"miimon": "100"})),
        standalone_ports_supported: false,
        physical_network: Some("physnet1".into()),
        category: Some("storage".into()),
        dynamic_portgroup: false,
        created_at: Utc::now(),
        updated_at: None,
        version: 0,
    }
}

async fn ports_and_portgroups(db: TestDb) {
    let s = db.open(secrets());
    let mut n1 = Node::new("n1".into(), "fake-hardware".into());
    n1.attrs.shard = Some("rack-a".into());
    n1.attrs.conductor_group = "Blue".into();
    s.create_node(&n1).await.expect("n1");
    s.create_node(&Node::new("n2".into(), "fake-hardware".into()))
        .await
        .expect("n2");

    // Port groups: round trip, by UUID or name, unique name and MAC.
    let g1 = s
        .create_portgroup(&group("g1", "n1", Some("bond0"), Some("52:54:00:aa:00:01")))
        .await
        .expect("g1");
    assert_eq!(g1.version, 1);
    let got = s.get_portgroup("bond0").await.expect("by name");
    assert_eq!(got.uuid, "g1");
    assert_eq!(got.properties["miimon"], "100");
    assert_eq!(got.mode.as_deref(), Some("802.3ad"));
    assert!(!got.standalone_ports_supported);
    assert_eq!(got.category.as_deref(), Some("storage"));
    assert_eq!(s.get_portgroup("g1").await.expect("by uuid").name, got.name);
    let e = s
        .create_portgroup(&group("g2", "n1", Some("bond0"), None))
        .await
        .expect_err("dup name");
    assert!(
        matches!(&e, StoreError::Duplicate(m) if m.contains("name bond0")),
        "{e}"
    );
    let e = s
        .create_portgroup(&group("g2", "n2", None, Some("52:54:00:aa:00:01")))
        .await
        .expect_err("dup mac");
    assert!(
        matches!(&e, StoreError::Duplicate(m) if m.contains("MAC address 52:54:00:aa:00:01")),
        "{e}"
    );
    s.create_portgroup(&group("g2", "n2", None, None))
        .await
        .expect("g2 without name or MAC");
    s.create_portgroup(&group("g3", "n2", None, None))
        .await
        .expect("two groups without name or MAC");
    assert!(matches!(
        s.get_portgroup("nope").await,
        Err(StoreError::NotFound { .. })
    ));

    // Ports with every later field.
    let attrs = PortAttrs {
        name: Some("eth0".into()),
        portgroup_uuid: Some("g1".into()),
        physical_network: Some("physnet1".into()),
        internal_info: obj(json!({"tenant_vif_port_id": "vif-1"})),
        local_link_connection: obj(json!({"switch_id": "00:11:22:33:44:55", "port_id": "Gi0/1"})),
        is_smartnic: true,
        description: Some("first".into()),
        vendor: Some("intel".into()),
        category: Some("data".into()),
        available_for_dynamic_portgroup: true,
    };
    let p1 = port("p1", "n1", "52:54:00:00:00:01", attrs.clone());
    s.create_port(&p1).await.expect("p1");
    let got = s.get_port("eth0").await.expect("port by name");
    assert_eq!(got.uuid, "p1");
    assert_eq!(got.attrs, attrs);
    let e = s
        .create_port(&port(
            "p9",
            "n2",
            "52:54:00:00:00:09",
            PortAttrs {
                name: Some("eth0".into()),
                ..Default::default()
            },
        ))
        .await
        .expect_err("dup port name");
    assert!(
        matches!(&e, StoreError::Duplicate(m) if m.contains("name eth0")),
        "{e}"
    );
    for (u, n, mac, name, desc) in [
        ("p2", "n1", "52:54:00:00:00:02", "eth1", "second"),
        ("p3", "n2", "52:54:00:00:00:03", "eth2", "third one"),
        ("p4", "n2", "52:54:00:00:00:04", "a-first", "fourth"),
    ] {
        let a = PortAttrs {
            name: Some(name.into()),
            description: Some(desc.into()),
            ..Default::default()
        };
        s.create_port(&port(u, n, mac, a)).await.expect("port");
    }

    let uuids = |v: Vec<Port>| v.into_iter().map(|p| p.uuid).collect::<Vec<_>>();
    let q = |f: &dyn Fn(&mut PortQuery)| {
        let mut q = PortQuery::default();
        f(&mut q);
        q
    };
    let list = |q: PortQuery| {
        let s = s.clone();
        async move { uuids(s.list_ports(&q).await.expect("list")) }
    };
    assert_eq!(
        list(q(&|q| q.portgroup_uuid = Some("g1".into()))).await,
        ["p1"]
    );
    assert_eq!(
        list(q(&|q| q.shards = vec!["rack-a".into()])).await,
        ["p1", "p2"]
    );
    assert_eq!(
        list(q(&|q| q.conductor_groups = vec!["blue".into()])).await,
        ["p1", "p2"]
    );
    assert_eq!(
        list(q(&|q| q.description_contains = Some("ir".into()))).await,
        ["p1", "p3"]
    );
    assert_eq!(
        list(q(&|q| q.sort_key = "name".into())).await,
        ["p4", "p1", "p2", "p3"]
    );
    assert_eq!(
        list(q(&|q| {
            q.sort_key = "name".into();
            q.sort_dir = Some(SortDir::Desc);
            q.limit = 2;
        }))
        .await,
        ["p3", "p2"]
    );
    assert_eq!(
        list(q(&|q| {
            q.sort_key = "name".into();
            q.sort_dir = Some(SortDir::Desc);
            q.limit = 2;
            q.marker = Some("p2".into());
        }))
        .await,
        ["p1", "p4"]
    );
    assert!(matches!(
        s.list_ports(&q(&|q| q.marker = Some("gone".into()))).await,
        Err(StoreError::NotFound { .. })
    ));

    // Versions: a stale write conflicts; a write moves the version.
    let mut p = s.get_port("p1").await.expect("p1");
    p.attrs.physical_network = Some("physnet2".into());
    let saved = s.update_port(&p).await.expect("update");
    assert_eq!(saved.version, 2);
    assert!(matches!(
        s.update_port(&p).await,
        Err(StoreError::Conflict { .. })
    ));
    let mut g = s.get_portgroup("g1").await.expect("g1");
    g.internal_info = obj(json!({"tenant_vif_port_id": "vif-2"}));
    s.update_portgroup(&g).await.expect("update group");
    assert!(matches!(
        s.update_portgroup(&g).await,
        Err(StoreError::Conflict { .. })
    ));
    assert_eq!(
        s.get_portgroup("g1").await.expect("g1").internal_info["tenant_vif_port_id"],
        "vif-2"
    );

    // Group listings: by node, by MAC, by shard, sorted.
    let gl = |q: PortgroupQuery| {
        let s = s.clone();
        async move {
            s.list_portgroups(&q)
                .await
                .expect("groups")
                .into_iter()
                .map(|g| g.uuid)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        gl(PortgroupQuery {
            node_uuid: Some("n2".into()),
            ..Default::default()
        })
        .await,
        ["g2", "g3"]
    );
    assert_eq!(
        gl(PortgroupQuery {
            address: Some("52:54:00:aa:00:01".into()),
            ..Default::default()
        })
        .await,
        ["g1"]
    );
    assert_eq!(
        gl(PortgroupQuery {
            shards: vec!["rack-a".into()],
            ..Default::default()
        })
        .await,
        ["g1"]
    );
    assert_eq!(
        gl(PortgroupQuery {
            sort_dir: Some(SortDir::Desc),
            limit: 2,
            ..Default::default()
        })
        .await,
        ["g3", "g2"]
    );

    // A group with ports is not deleted; once empty it is.
    assert!(!s.delete_portgroup("g1").await.expect("refused"));
    let mut p = s.get_port("p1").await.expect("p1");
    p.attrs.portgroup_uuid = None;
    s.update_port(&p).await.expect("leave group");
    assert!(s.delete_portgroup("g1").await.expect("deleted"));
    assert!(matches!(
        s.delete_portgroup("g1").await,
        Err(StoreError::NotFound { .. })
    ));

    // Deleting a node takes its groups and ports along.
    let n2 = s.get_node("n2").await.expect("n2");
    s.delete_node("n2", n2.version).await.expect("delete n2");
    assert!(gl(PortgroupQuery::default()).await.is_empty());
    assert_eq!(list(PortQuery::default()).await, ["p1", "p2"]);
}
