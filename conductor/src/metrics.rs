//! What `GET /metrics` of rivetd answers: the exposition of the process-wide registry
//! ([`rivet_support::metrics`], re-exported here so call sites keep `crate::metrics::…`), with
//! the families read from the store at scrape time — node counts, state ages, leases and live
//! controllers come from one aggregate query ([`rivet_store::Store::node_counts`]), so they
//! can never drift from it — and the metered BMC wrapper ([`bmc`]).
//!
//! The text is the Prometheus text format, or OpenMetrics when asked for ([`exposition`]).
//! The conductor serves no HTTP: rivetd (the controller crate) answers `GET /metrics` on the
//! API address (behind auth: an admin or `metrics`-role credential, open with `--no-auth`)
//! and, when `[metrics] listen` is set, on an address of its own without credentials, and
//! picks the format from the scraper's `Accept`.

pub use rivet_support::metrics::*;

pub mod bmc;

use crate::Conductor;
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;

/// Serialises scrapes: the store-derived families are cleared and refilled per scrape.
static SCRAPE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Refill the families read from the store.
async fn refresh(conductor: &Conductor) -> Result<(), rivet_store::StoreError> {
    let counts = conductor.store.node_counts().await?;
    let alive = conductor
        .store
        .list_conductors(conductor.config.conductor.dead_after_s)
        .await?
        .iter()
        .filter(|c| c.alive)
        .count();
    let mut nodes: BTreeMap<(String, String, bool), i64> = BTreeMap::new();
    let mut oldest: BTreeMap<String, DateTime<Utc>> = BTreeMap::new();
    let mut leases: BTreeMap<String, i64> = BTreeMap::new();
    for c in counts {
        *nodes
            .entry((
                c.provision_state.clone(),
                c.power_state.unwrap_or_else(|| "none".into()),
                c.maintenance,
            ))
            .or_default() += c.count;
        if let Some(t) = c.oldest_change {
            let e = oldest.entry(c.provision_state).or_insert(t);
            *e = (*e).min(t);
        }
        if let Some(holder) = c.reservation {
            *leases.entry(holder).or_default() += c.count;
        }
    }
    let now = Utc::now();
    let longest_in_state = oldest
        .into_iter()
        .map(|(state, since)| {
            let secs = (now - since).num_milliseconds().max(0) as f64 / 1000.0;
            (state, secs)
        })
        .collect();
    set_fleet(Fleet {
        nodes,
        longest_in_state,
        leases,
        me: conductor.id().to_string(),
        conductors_alive: alive as i64,
    });
    Ok(())
}

/// The exposition of every family after refreshing the store's: OpenMetrics when
/// `openmetrics`, else the Prometheus text format; the text and its content type. A store
/// that cannot be read costs only the store's families (they keep their last values, and
/// the scrape-error counter goes up); the process families are still worth serving.
pub async fn exposition(
    conductor: &Conductor,
    openmetrics: bool,
) -> Result<(String, &'static str), std::fmt::Error> {
    let _one = SCRAPE.lock().await;
    if let Err(e) = refresh(conductor).await {
        scrape_failed();
        tracing::warn!(error = %e, "metrics: cannot read node counts from the store");
    }
    encode(openmetrics)
}
