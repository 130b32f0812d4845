//! `Store::node_counts` (what `/metrics` reads at scrape time) on both backends: nodes
//! grouped by provision state, power state, maintenance and lease holder, with the oldest
//! state change of each group.

use crate::support::{self, on_every_backend};

use chrono::{Duration, Utc};
use rivet_model::node::Node;
use rivet_protocol::states::{PowerState, ProvisionState};
use support::TestDb;

on_every_backend!(counts_group_the_state_columns);

async fn counts_group_the_state_columns(db: TestDb) {
    let s = db.open(rivet_support::secrets::Secrets::ephemeral());
    assert!(s.node_counts().await.expect("empty counts").is_empty());
    let now = Utc::now();
    let mk = |i: u32, state, power, maintenance, lease: Option<&str>, age_s: i64| {
        let mut n = Node::new(
            format!("3f1c2a9e-0000-4000-8000-{i:012}"),
            "fake-hardware".into(),
        );
        n.provision_state = state;
        n.power_state = power;
        n.maintenance = maintenance;
        n.reservation = lease.map(str::to_string);
        n.provision_updated_at = Some(now - Duration::seconds(age_s));
        n
    };
    let nodes = [
        mk(
            1,
            ProvisionState::CleanWait,
            Some(PowerState::On),
            false,
            Some("c1"),
            600,
        ),
        mk(
            2,
            ProvisionState::CleanWait,
            Some(PowerState::On),
            false,
            Some("c1"),
            60,
        ),
        mk(
            3,
            ProvisionState::Available,
            Some(PowerState::Off),
            true,
            None,
            10,
        ),
        mk(4, ProvisionState::Enroll, None, false, None, 5),
    ];
    for n in &nodes {
        s.create_node(n).await.expect("create");
    }
    let mut counts = s.node_counts().await.expect("counts");
    counts.sort_by(|a, b| a.provision_state.cmp(&b.provision_state));
    assert_eq!(counts.len(), 3, "{counts:?}");
    let wait = counts
        .iter()
        .find(|c| c.provision_state == "clean wait")
        .expect("clean wait group");
    assert_eq!(wait.count, 2);
    assert_eq!(wait.power_state.as_deref(), Some("power on"));
    assert!(!wait.maintenance);
    assert_eq!(wait.reservation.as_deref(), Some("c1"));
    let oldest = wait.oldest_change.expect("oldest change");
    let age = (now - oldest).num_seconds();
    assert!((599..=601).contains(&age), "oldest is {age} s old");
    let avail = counts
        .iter()
        .find(|c| c.provision_state == "available")
        .expect("available group");
    assert!(avail.maintenance);
    assert_eq!(avail.reservation, None);
    let enroll = counts
        .iter()
        .find(|c| c.provision_state == "enroll")
        .expect("enroll group");
    assert_eq!(enroll.power_state, None);
    assert_eq!(counts.iter().map(|c| c.count).sum::<i64>(), 4);
}
