//! The node list filters Ironic clients send (`shard=a,b`, `sharded`, `instance_name`,
//! `project`, `description_contains`) on both backends, with SQL's wildcards in the text
//! taken literally.

use crate::support::{self, on_every_backend};

use rivet_model::node::Node;
use rivet_store::NodeQuery;
use support::TestDb;

on_every_backend!(node_filters);

async fn node_filters(db: TestDb) {
    let s = db.open(rivet_support::secrets::Secrets::ephemeral());
    let mk = |i: u32, name: &str| {
        let mut n = Node::new(
            format!("7a2b3c4d-0000-4000-8000-{i:012}"),
            "fake-hardware".into(),
        );
        n.name = Some(name.into());
        n
    };
    let mut a = mk(1, "a");
    a.attrs.shard = Some("s1".into());
    a.attrs.owner = Some("p1".into());
    a.attrs.instance_name = Some("web-1".into());
    a.attrs.description = Some("rack 5_1 100% busy".into());
    let mut b = mk(2, "b");
    b.attrs.shard = Some("s2".into());
    b.attrs.lessee = Some("p1".into());
    b.attrs.description = Some("rack 501".into());
    let c = mk(3, "c");
    for n in [&a, &b, &c] {
        s.create_node(n).await.expect("create");
    }
    let names = |q: NodeQuery| {
        let s = &s;
        async move {
            let mut v: Vec<String> = s
                .list_nodes(&q)
                .await
                .expect("list")
                .into_iter()
                .filter_map(|n| n.name)
                .collect();
            v.sort();
            v
        }
    };
    let q = NodeQuery::default;
    assert_eq!(
        names(NodeQuery {
            shards: vec!["s1".into(), "s2".into()],
            ..q()
        })
        .await,
        ["a", "b"]
    );
    assert_eq!(
        names(NodeQuery {
            shards: vec!["s2".into()],
            ..q()
        })
        .await,
        ["b"]
    );
    assert_eq!(
        names(NodeQuery {
            sharded: Some(false),
            ..q()
        })
        .await,
        ["c"]
    );
    assert_eq!(
        names(NodeQuery {
            sharded: Some(true),
            ..q()
        })
        .await,
        ["a", "b"]
    );
    assert_eq!(
        names(NodeQuery {
            instance_name: Some("web-1".into()),
            ..q()
        })
        .await,
        ["a"]
    );
    assert_eq!(
        names(NodeQuery {
            project: Some("p1".into()),
            ..q()
        })
        .await,
        ["a", "b"]
    );
    assert_eq!(
        names(NodeQuery {
            description_contains: Some("rack 5".into()),
            ..q()
        })
        .await,
        ["a", "b"]
    );
    // `_` and `%` are not wildcards: "5_1" does not match "501", "100%" only itself.
    assert_eq!(
        names(NodeQuery {
            description_contains: Some("5_1".into()),
            ..q()
        })
        .await,
        ["a"]
    );
    assert_eq!(
        names(NodeQuery {
            description_contains: Some("0%".into()),
            ..q()
        })
        .await,
        ["a"]
    );
}
