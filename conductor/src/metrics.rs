//! `GET /metrics` of rivetd: the exposition of the process-wide registry
//! ([`rivet_support::metrics`], re-exported here so call sites keep `crate::metrics::…`), with
//! the families read from the store at scrape time — node counts, state ages, leases and live
//! controllers come from one aggregate query ([`rivet_store::Store::node_counts`]), so they
//! can never drift from it — and the metered BMC wrapper ([`bmc`]).
//!
//! `/metrics` is served on the API address (behind auth: an admin or `metrics`-role
//! credential, open with `--no-auth`) and, when `[metrics] listen` is set, on an address of
//! its own without credentials (a supervised controller-wide loop, see [`serve_listener`]).
//! The answer is the Prometheus text format, or OpenMetrics when the scraper asks for it in
//! `Accept`.

pub use rivet_support::metrics::*;

pub mod bmc;

use crate::supervisor::LoopEnd;
use crate::Conductor;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;
use std::sync::Arc;

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

/// Whether the scraper asked for OpenMetrics.
fn wants_openmetrics(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"))
}

/// The exposition of every family, in the format `headers` asks for.
pub async fn render(conductor: &Conductor, headers: &HeaderMap) -> Response {
    let _one = SCRAPE.lock().await;
    if let Err(e) = refresh(conductor).await {
        // The process families are still worth serving; the store ones keep their last values.
        scrape_failed();
        tracing::warn!(error = %e, "metrics: cannot read node counts from the store");
    }
    let Ok((text, content_type)) = encode(wants_openmetrics(headers)) else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "metrics could not be encoded",
        )
            .into_response();
    };
    let mut resp = text.into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

async fn scrape_open(State(conductor): State<Arc<Conductor>>, headers: HeaderMap) -> Response {
    render(&conductor, &headers).await
}

/// The `[metrics] listen` address: `GET /metrics` without credentials, until shutdown. A
/// controller-wide loop: an address that cannot be bound stops rivetd at start-up with the
/// reason, rather than leaving the operator's monitoring silently blind.
pub async fn serve_listener(conductor: Arc<Conductor>) -> LoopEnd {
    let Some(addr) = conductor.config.metrics.listen.clone() else {
        return LoopEnd::NotNeeded;
    };
    let listener = match tokio::net::TcpListener::bind(&addr).await {
        Ok(l) => l,
        Err(e) => {
            return LoopEnd::Failed(format!("cannot listen on [metrics] listen = {addr:?}: {e}"))
        }
    };
    tracing::info!(%addr, "metrics listening (GET /metrics, no credentials)");
    let stop = conductor.shutdown.clone();
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(scrape_open))
        .with_state(conductor);
    match axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
    {
        Ok(()) => LoopEnd::NotNeeded,
        Err(e) => LoopEnd::Failed(format!("the [metrics] listener on {addr} failed: {e}")),
    }
}
