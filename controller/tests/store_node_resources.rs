//! Store conformance for node sub-resources on every backend: volume connectors and targets
//! (round trip, unique (type, connector_id) and (node, boot_index), node filter, sorting and
//! paging, update and delete), the BIOS and firmware caches (replace, keep times of unchanged
//! rows), RAID configuration, child nodes, and everything going with its node.

use crate::support;

use chrono::Utc;
use rivet_model::node::Node;
use rivet_store::{
    BiosSetting, FirmwareReading, NodeManagement, SortDir, StoreError, VolumeConnector,
    VolumeQuery, VolumeTarget,
};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use support::{on_every_backend, TestDb};

fn secrets() -> Arc<rivet_support::secrets::Secrets> {
    static KEY: std::sync::OnceLock<Arc<rivet_support::secrets::Secrets>> =
        std::sync::OnceLock::new();
    KEY.get_or_init(rivet_support::secrets::Secrets::ephemeral)
        .clone()
}

on_every_backend!(volumes, caches_raid_and_children);

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        other => panic!("not an object: {other}"),
    }
}

fn connector(uuid: &str, node: &str, kind: &str, id: &str) -> VolumeConnector {
    VolumeConnector {
        uuid: uuid.into(),
        node_uuid: node.into(),
        kind: kind.into(),
        connector_id: id.into(),
        extra: obj(json!({"k": "v"})),
        created_at: Utc::now(),
        updated_at: None,
    }
}

fn target(uuid: &str, node: &str, boot_index: i64) -> VolumeTarget {
    VolumeTarget {
        uuid: uuid.into(),
        node_uuid: node.into(),
        volume_type: "iscsi".into(),
        properties: obj(json!({"target_lun": 0})),
        boot_index,
        volume_id: format!("vol-{uuid}"),
        extra: Map::new(),
        created_at: Utc::now(),
        updated_at: None,
    }
}

fn query(node: Option<&str>, limit: usize, marker: Option<&str>, key: &str) -> VolumeQuery {
    VolumeQuery {
        node_uuid: node.map(str::to_string),
        limit,
        marker: marker.map(str::to_string),
        sort_key: key.into(),
        sort_dir: SortDir::Asc,
    }
}

async fn volumes(db: TestDb) {
    let s = db.open(secrets());
    for n in ["n1", "n2"] {
        s.create_node(&Node::new(n.into(), "fake-hardware".into()))
            .await
            .expect("node");
    }
    let c1 = s
        .create_volume_connector(&connector("c1", "n1", "iqn", "iqn.2024-01.org:a"))
        .await
        .expect("c1");
    assert_eq!(s.get_volume_connector("c1").await.expect("get"), c1);
    s.create_volume_connector(&connector("c2", "n1", "wwpn", "500143802426baf4"))
        .await
        .expect("c2");
    s.create_volume_connector(&connector("c3", "n2", "ip", "192.0.2.1"))
        .await
        .expect("c3");
    // (type, connector_id) is unique across nodes; the UUID too.
    match s
        .create_volume_connector(&connector("c4", "n2", "iqn", "iqn.2024-01.org:a"))
        .await
    {
        Err(StoreError::Duplicate(m)) => assert!(m.contains("connector ID"), "{m}"),
        other => panic!("duplicate connector id: {other:?}"),
    }
    match s
        .create_volume_connector(&connector("c1", "n2", "mac", "52:54:00:00:00:01"))
        .await
    {
        Err(StoreError::Duplicate(m)) => assert!(m.contains("UUID c1"), "{m}"),
        other => panic!("duplicate uuid: {other:?}"),
    }
    // A connector of a node that does not exist is refused by the database.
    assert!(s
        .create_volume_connector(&connector("c9", "nope", "mac", "52:54:00:00:00:09"))
        .await
        .is_err());

    let mine = s
        .list_volume_connectors(&query(Some("n1"), 0, None, "id"))
        .await
        .expect("list");
    assert_eq!(
        mine.iter().map(|c| c.uuid.as_str()).collect::<Vec<_>>(),
        ["c1", "c2"]
    );
    let by_type = s
        .list_volume_connectors(&query(None, 0, None, "type"))
        .await
        .expect("by type");
    assert_eq!(
        by_type.iter().map(|c| c.kind.as_str()).collect::<Vec<_>>(),
        ["ip", "iqn", "wwpn"]
    );
    let page1 = s
        .list_volume_connectors(&query(None, 2, None, "id"))
        .await
        .expect("page1");
    let page2 = s
        .list_volume_connectors(&query(None, 2, Some(&page1[1].uuid), "id"))
        .await
        .expect("page2");
    assert_eq!(page1.len(), 2);
    assert_eq!(
        page2.iter().map(|c| c.uuid.as_str()).collect::<Vec<_>>(),
        ["c3"]
    );
    assert!(matches!(
        s.list_volume_connectors(&query(None, 2, Some("missing"), "id"))
            .await,
        Err(StoreError::NotFound { .. })
    ));

    let mut moved = c1.clone();
    moved.node_uuid = "n2".into();
    moved.connector_id = "iqn.2024-01.org:b".into();
    let saved = s.update_volume_connector(&moved).await.expect("update");
    assert!(saved.updated_at.is_some());
    assert_eq!(
        s.get_volume_connector("c1").await.expect("get").node_uuid,
        "n2"
    );
    let mut clash = saved.clone();
    clash.kind = "wwpn".into();
    clash.connector_id = "500143802426baf4".into();
    assert!(matches!(
        s.update_volume_connector(&clash).await,
        Err(StoreError::Duplicate(_))
    ));
    s.delete_volume_connector("c2").await.expect("delete");
    assert!(matches!(
        s.delete_volume_connector("c2").await,
        Err(StoreError::NotFound { .. })
    ));

    // Targets: boot_index unique per node only.
    s.create_volume_target(&target("t1", "n1", 0))
        .await
        .expect("t1");
    s.create_volume_target(&target("t2", "n2", 0))
        .await
        .expect("t2 on another node");
    match s.create_volume_target(&target("t3", "n1", 0)).await {
        Err(StoreError::Duplicate(m)) => assert!(m.contains("boot index '0'"), "{m}"),
        other => panic!("duplicate boot index: {other:?}"),
    }
    let t3 = s
        .create_volume_target(&target("t3", "n1", 1))
        .await
        .expect("t3");
    assert_eq!(s.get_volume_target("t3").await.expect("get"), t3);
    let mut t3b = t3.clone();
    t3b.boot_index = 0;
    assert!(matches!(
        s.update_volume_target(&t3b).await,
        Err(StoreError::Duplicate(_))
    ));
    t3b.boot_index = 5;
    t3b.properties = obj(json!({"auth_method": "CHAP"}));
    s.update_volume_target(&t3b).await.expect("update");
    let got = s.get_volume_target("t3").await.expect("get");
    assert_eq!(got.boot_index, 5);
    assert_eq!(got.properties["auth_method"], "CHAP");
    let desc = s
        .list_volume_targets(&VolumeQuery {
            sort_dir: SortDir::Desc,
            ..query(Some("n1"), 0, None, "boot_index")
        })
        .await
        .expect("desc");
    assert_eq!(
        desc.iter().map(|t| t.uuid.as_str()).collect::<Vec<_>>(),
        ["t3", "t1"]
    );

    // Everything goes with its node.
    let n1 = s.get_node("n1").await.expect("n1");
    s.delete_node("n1", n1.version).await.expect("delete node");
    assert!(s
        .list_volume_targets(&query(Some("n1"), 0, None, "id"))
        .await
        .expect("list")
        .is_empty());
    assert!(matches!(
        s.get_volume_target("t1").await,
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(
        s.list_volume_connectors(&query(None, 0, None, "id"))
            .await
            .expect("list")
            .len(),
        2
    );
}

fn setting(name: &str, value: &str) -> BiosSetting {
    BiosSetting {
        name: name.into(),
        value: Some(value.into()),
        registry: Map::new(),
        created_at: Utc::now(),
        updated_at: None,
    }
}

async fn caches_raid_and_children(db: TestDb) {
    let s = db.open(secrets());
    s.create_node(&Node::new("p".into(), "fake-hardware".into()))
        .await
        .expect("parent");
    let mut kid = Node::new("k".into(), "fake-hardware".into());
    kid.attrs.parent_node = Some("p".into());
    s.create_node(&kid).await.expect("child");
    assert_eq!(s.child_nodes("p").await.expect("children"), ["k"]);
    assert!(s.child_nodes("k").await.expect("none").is_empty());

    s.set_bios_settings("p", &[setting("A", "1"), setting("B", "x")])
        .await
        .expect("bios");
    let first = s.list_bios_settings("p").await.expect("list");
    assert_eq!(first.len(), 2);
    assert!(first.iter().all(|b| b.updated_at.is_none()));
    s.set_bios_settings("p", &[setting("A", "1"), setting("C", "y")])
        .await
        .expect("bios again");
    let second = s.list_bios_settings("p").await.expect("list");
    assert_eq!(
        second.iter().map(|b| b.name.as_str()).collect::<Vec<_>>(),
        ["A", "C"]
    );
    assert_eq!(second[0].created_at, first[0].created_at);
    assert!(second[0].updated_at.is_none());
    s.set_bios_settings("p", &[setting("A", "2")])
        .await
        .expect("bios changed");
    let third = s.list_bios_settings("p").await.expect("list");
    assert_eq!(third.len(), 1);
    assert_eq!(third[0].value.as_deref(), Some("2"));
    assert!(third[0].updated_at.is_some());

    let nic = |serial: &str| FirmwareReading {
        vendor: Some("Acme".into()),
        model: Some("X710".into()),
        serial_number: Some(serial.into()),
        ..FirmwareReading::new("nic:SN1", "20.5")
    };
    s.set_firmware_components(
        "p",
        &[
            FirmwareReading::new("bios", "1.0"),
            FirmwareReading::new("bmc", "2.0"),
            nic("SN1"),
        ],
    )
    .await
    .expect("fw");
    let fw = s.list_firmware_components("p").await.expect("fw list");
    assert_eq!(fw.len(), 3);
    assert_eq!(fw[2].component, "nic:SN1");
    assert_eq!(fw[2].vendor.as_deref(), Some("Acme"));
    assert_eq!(fw[2].model.as_deref(), Some("X710"));
    assert_eq!(fw[2].serial_number.as_deref(), Some("SN1"));
    assert!(fw[0].vendor.is_none() && fw[0].model.is_none() && fw[0].serial_number.is_none());
    assert!(fw[2].updated_at.is_none());
    s.set_firmware_components(
        "p",
        &[FirmwareReading::new("bios", "1.1"), nic("SN1-replaced")],
    )
    .await
    .expect("fw again");
    let fw = s.list_firmware_components("p").await.expect("fw list");
    assert_eq!(fw.len(), 3);
    assert_eq!(fw[0].component, "bios");
    assert_eq!(fw[0].initial_version, "1.0");
    assert_eq!(fw[0].current_version.as_deref(), Some("1.1"));
    assert!(fw[0].updated_at.is_some());
    assert_eq!(fw[1].current_version.as_deref(), Some("2.0"));
    // Only the identity changed: Ironic saves it on every refresh.
    assert_eq!(fw[2].current_version.as_deref(), Some("20.5"));
    assert_eq!(fw[2].serial_number.as_deref(), Some("SN1-replaced"));
    assert!(fw[2].updated_at.is_some());

    let m = s.node_management("p").await.expect("management");
    assert_eq!(m, NodeManagement::default());
    let cfg = obj(json!({"logical_disks": [{"raid_level": "1", "size_gb": 10}]}));
    s.set_target_raid_config("p", &cfg).await.expect("set");
    s.set_target_raid_config("p", &cfg)
        .await
        .expect("set twice");
    s.set_boot_state("p", Some("uefi".into()), Some(true))
        .await
        .expect("boot state");
    let m = s.node_management("p").await.expect("management");
    assert_eq!(m.target_raid_config, cfg);
    assert_eq!(m.boot_mode.as_deref(), Some("uefi"));
    assert_eq!(m.secure_boot, Some(true));
    s.set_boot_state("k", None, Some(false)).await.expect("kid");
    let both = s
        .node_managements(&["p".into(), "k".into(), "none".into()])
        .await
        .expect("both");
    assert_eq!(both.len(), 2);
    assert_eq!(both["k"].secure_boot, Some(false));
    assert!(both["k"].target_raid_config.is_empty());
    s.set_target_raid_config("p", &Map::new())
        .await
        .expect("clear");
    let m = s.node_management("p").await.expect("management");
    assert!(m.target_raid_config.is_empty());
    assert_eq!(
        m.boot_mode.as_deref(),
        Some("uefi"),
        "kept by a RAID change"
    );
    // What the RAID steps built, apart from the target; `{}` after a delete.
    let built = obj(json!({"logical_disks": [{"raid_level": "1", "size_gb": 9}],
                           "last_updated": "2026-01-02 03:04:05"}));
    s.set_raid_config("p", &built).await.expect("built");
    s.set_raid_config("k", &built)
        .await
        .expect("built on another node");
    let m = s.node_management("p").await.expect("management");
    assert_eq!(m.raid_config, built);
    assert!(m.target_raid_config.is_empty(), "target untouched");
    assert_eq!(m.boot_mode.as_deref(), Some("uefi"));
    let k = s.node_management("k").await.expect("k");
    assert_eq!((k.raid_config, k.secure_boot), (built.clone(), Some(false)));
    s.set_raid_config("p", &Map::new()).await.expect("deleted");
    assert!(s
        .node_management("p")
        .await
        .expect("m")
        .raid_config
        .is_empty());

    let p = s.get_node("p").await.expect("p");
    s.delete_node("p", p.version).await.expect("delete");
    assert!(s.list_bios_settings("p").await.expect("bios").is_empty());
    assert!(s
        .list_firmware_components("p")
        .await
        .expect("fw")
        .is_empty());
}
