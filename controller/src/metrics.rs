//! Prometheus metrics of rivetd: one process-wide registry, small typed functions the call
//! sites use (`http`, `agent_heartbeat`, `step_*`, `store_query`, the metered BMC in
//! [`bmc`]), and the scrape handler behind `GET /metrics`.
//!
//! Every family is prefixed `rivet_`; counters end in `_total`, durations are `_seconds`
//! histograms. Labels are bounded: API requests are labelled by the route template axum
//! matched (`/v1/nodes/{ident}`), never by the raw path, so a node UUID never becomes a
//! label value. Node counts, state ages, leases and live controllers are not kept up to
//! date by the code that changes them: they are read from the store at scrape time with one
//! aggregate query ([`crate::store::Store::node_counts`]), so they can never drift from it.
//!
//! `/metrics` is served on the API address (behind auth: an admin or `metrics`-role
//! credential, open with `--no-auth`) and, when `[metrics] listen` is set, on an address of
//! its own without credentials (a supervised controller-wide loop, see [`serve_listener`]).
//! The answer is the Prometheus text format, or OpenMetrics when the scraper asks for it in
//! `Accept`.

pub mod bmc;

use crate::conductor::steps::{PlannedStep, Source};
use crate::conductor::supervisor::LoopEnd;
use crate::conductor::Conductor;
use crate::store::sql::Access;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, LazyLock};
use std::time::Instant;

/// `[metrics]` in the config file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// `ADDR:PORT` of an extra listener serving `GET /metrics` without credentials (plain
    /// HTTP: keep it on loopback or a monitoring network). Unset: only the API address
    /// serves it, behind auth.
    pub listen: Option<String>,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: &'static str,
    route: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    method: &'static str,
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    operation: &'static str,
    interface: String,
    step: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepOutcomeLabels {
    operation: &'static str,
    interface: String,
    step: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BmcLabels {
    driver: &'static str,
    operation: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BmcOperationLabels {
    driver: &'static str,
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AccessLabels {
    access: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct NodeLabels {
    provision_state: String,
    power_state: String,
    maintenance: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    provision_state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: String,
}

/// Every family, registered once.
struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    request_seconds: HistogramFamily<RouteLabels>,
    heartbeats: Counter,
    long_polls: Gauge,
    steps_started: Family<StepLabels, Counter>,
    steps_finished: Family<StepLabels, Counter>,
    steps_failed: Family<StepLabels, Counter>,
    step_seconds: HistogramFamily<StepOutcomeLabels>,
    bmc_requests: Family<BmcLabels, Counter>,
    bmc_seconds: HistogramFamily<BmcOperationLabels>,
    store_seconds: HistogramFamily<AccessLabels>,
    nodes: Family<NodeLabels, Gauge>,
    longest_in_state: Family<StateLabels, Gauge<f64, AtomicU64>>,
    leases: Family<ControllerLabels, Gauge>,
    conductors_alive: Gauge,
    scrape_errors: Counter,
}

/// Request latencies: 1 ms to ~65 s (long polls land in the top buckets).
fn request_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Step durations: 1 s to ~9 h (a whole-disk erase is hours).
fn step_buckets() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 3.0, 11))
}

/// BMC calls: 10 ms to ~20 min (a firmware step polls its BMC task inside one call).
fn bmc_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 3.0, 12))
}

/// Store queries: 100 µs to ~3 s.
fn store_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 3.0, 11))
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let mut r = Registry::with_prefix("rivet");
    let m = Metrics {
        registry: Registry::default(),
        requests: Family::default(),
        request_seconds: Family::new_with_constructor(request_buckets),
        heartbeats: Counter::default(),
        long_polls: Gauge::default(),
        steps_started: Family::default(),
        steps_finished: Family::default(),
        steps_failed: Family::default(),
        step_seconds: Family::new_with_constructor(step_buckets),
        bmc_requests: Family::default(),
        bmc_seconds: Family::new_with_constructor(bmc_buckets),
        store_seconds: Family::new_with_constructor(store_buckets),
        nodes: Family::default(),
        longest_in_state: Family::default(),
        leases: Family::default(),
        conductors_alive: Gauge::default(),
        scrape_errors: Counter::default(),
    };
    r.register(
        "build",
        "rivetd's version",
        Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
    );
    r.register(
        "http_requests",
        "API requests answered, by method, route template and status",
        m.requests.clone(),
    );
    r.register(
        "http_request_duration_seconds",
        "Time to answer an API request, by method and route template (held agent long polls included)",
        m.request_seconds.clone(),
    );
    r.register(
        "agent_heartbeats",
        "Agent heartbeats accepted (token and boot checked)",
        m.heartbeats.clone(),
    );
    r.register(
        "agent_long_polls_held",
        "Agent heartbeats held open waiting for a command",
        m.long_polls.clone(),
    );
    r.register(
        "steps_started",
        "Clean and deploy steps started (sent to the agent or run through the driver)",
        m.steps_started.clone(),
    );
    r.register(
        "steps_finished",
        "Clean and deploy steps that succeeded",
        m.steps_finished.clone(),
    );
    r.register(
        "steps_failed",
        "Clean and deploy steps that failed or were aborted",
        m.steps_failed.clone(),
    );
    r.register(
        "step_duration_seconds",
        "Time from a step's start to its result, by outcome",
        m.step_seconds.clone(),
    );
    r.register(
        "bmc_requests",
        "Out-of-band BMC operations, by driver, operation and outcome (ok, error, invalid, unsupported)",
        m.bmc_requests.clone(),
    );
    r.register(
        "bmc_request_duration_seconds",
        "Time of an out-of-band BMC operation, by driver and operation",
        m.bmc_seconds.clone(),
    );
    r.register(
        "store_query_duration_seconds",
        "Time of a store query, by access (read, scan, write)",
        m.store_seconds.clone(),
    );
    r.register(
        "nodes",
        "Nodes by provision state, power state and maintenance (read from the store at scrape time)",
        m.nodes.clone(),
    );
    r.register(
        "nodes_longest_in_state_seconds",
        "How long the node that entered its provision state longest ago has been in it",
        m.longest_in_state.clone(),
    );
    r.register(
        "node_leases",
        "Nodes whose lease a controller holds, by controller",
        m.leases.clone(),
    );
    r.register(
        "conductors_alive",
        "Controllers registered on this store that heartbeat recently",
        m.conductors_alive.clone(),
    );
    r.register(
        "metrics_scrape_errors",
        "Scrapes whose store-derived families could not be read (the rest was served)",
        m.scrape_errors.clone(),
    );
    Metrics { registry: r, ..m }
});

fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// Middleware on the whole router: counts and times every answer by the route template
/// axum matched (`unmatched` for the fallback's 404s).
pub async fn http(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let method = method_label(req.method());
    let start = Instant::now();
    let resp = next.run(req).await;
    let m = &*METRICS;
    let status = resp.status().as_u16();
    m.request_seconds
        .get_or_create(&RouteLabels {
            method,
            route: route.clone(),
        })
        .observe(start.elapsed().as_secs_f64());
    m.requests
        .get_or_create(&RequestLabels {
            method,
            route,
            status,
        })
        .inc();
    resp
}

/// An agent heartbeat passed its token and boot checks.
pub fn agent_heartbeat() {
    METRICS.heartbeats.inc();
}

/// Counts a held long poll while alive (dropped when the poll answers or the client goes).
#[must_use = "the poll counts as held only while this lives"]
pub struct HeldPoll(());

impl Drop for HeldPoll {
    fn drop(&mut self) {
        METRICS.long_polls.dec();
    }
}

/// A heartbeat starts waiting for a command.
pub fn long_poll_held() -> HeldPoll {
    METRICS.long_polls.inc();
    HeldPoll(())
}

fn step_labels(operation: &'static str, step: &PlannedStep) -> StepLabels {
    StepLabels {
        operation,
        interface: step.step.interface.clone(),
        step: step.step.step.clone(),
    }
}

/// Steps the conductor runs itself (`hold`, `wait`, power) are not counted: `hold` never
/// finishes as a step, and they are not work on the machine.
fn counted(step: &PlannedStep) -> bool {
    step.source != Source::Conductor
}

/// A `operation` (`clean`, `deploy`) step was sent to the agent or handed to the driver.
pub fn step_started(operation: &'static str, step: &PlannedStep) {
    if counted(step) {
        let m = &*METRICS;
        let labels = step_labels(operation, step);
        m.steps_started.get_or_create(&labels).inc();
        // Present at 0 from the first start, so `rate()` and failure ratios have a series.
        drop(m.steps_finished.get_or_create(&labels));
        drop(m.steps_failed.get_or_create(&labels));
    }
}

fn step_ended(
    operation: &'static str,
    step: &PlannedStep,
    started_at: Option<DateTime<Utc>>,
    ok: bool,
) {
    if !counted(step) {
        return;
    }
    let m = &*METRICS;
    let labels = step_labels(operation, step);
    if ok {
        m.steps_finished.get_or_create(&labels).inc();
    } else {
        m.steps_failed.get_or_create(&labels).inc();
    }
    if let Some(started) = started_at {
        let secs = (Utc::now() - started).num_milliseconds().max(0) as f64 / 1000.0;
        m.step_seconds
            .get_or_create(&StepOutcomeLabels {
                operation,
                interface: labels.interface,
                step: labels.step,
                outcome: if ok { "succeeded" } else { "failed" },
            })
            .observe(secs);
    }
}

/// A step succeeded; `started_at` (when known) gives its duration.
pub fn step_finished(
    operation: &'static str,
    step: &PlannedStep,
    started_at: Option<DateTime<Utc>>,
) {
    step_ended(operation, step, started_at, true);
}

/// A step failed or was aborted.
pub fn step_failed(operation: &'static str, step: &PlannedStep, started_at: Option<DateTime<Utc>>) {
    step_ended(operation, step, started_at, false);
}

/// Times one store query while alive.
#[must_use = "the query is timed until this is dropped"]
pub struct StoreTimer {
    access: Access,
    start: Instant,
}

impl Drop for StoreTimer {
    fn drop(&mut self) {
        let access = match self.access {
            Access::Read => "read",
            Access::Scan => "scan",
            Access::Write => "write",
        };
        METRICS
            .store_seconds
            .get_or_create(&AccessLabels { access })
            .observe(self.start.elapsed().as_secs_f64());
    }
}

/// Start timing a store query.
pub fn store_query(access: Access) -> StoreTimer {
    StoreTimer {
        access,
        start: Instant::now(),
    }
}

/// One out-of-band BMC operation ended (see [`bmc::Metered`]).
pub(crate) fn bmc_call(
    driver: &'static str,
    operation: &'static str,
    outcome: &'static str,
    elapsed: std::time::Duration,
) {
    let m = &*METRICS;
    m.bmc_requests
        .get_or_create(&BmcLabels {
            driver,
            operation,
            outcome,
        })
        .inc();
    // The error series exists at 0 beside the first success: error-rate alerts need it.
    drop(m.bmc_requests.get_or_create(&BmcLabels {
        driver,
        operation,
        outcome: "error",
    }));
    m.bmc_seconds
        .get_or_create(&BmcOperationLabels { driver, operation })
        .observe(elapsed.as_secs_f64());
}

/// Serialises scrapes: the store-derived families are cleared and refilled per scrape.
static SCRAPE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Refill the families read from the store.
async fn refresh(conductor: &Conductor) -> Result<(), crate::store::StoreError> {
    let counts = conductor.store.node_counts().await?;
    let alive = conductor
        .store
        .list_conductors(conductor.config.conductor.dead_after_s)
        .await?
        .iter()
        .filter(|c| c.alive)
        .count();
    let mut nodes: BTreeMap<NodeLabels, i64> = BTreeMap::new();
    let mut oldest: BTreeMap<String, DateTime<Utc>> = BTreeMap::new();
    let mut leases: BTreeMap<String, i64> = BTreeMap::new();
    for c in counts {
        *nodes
            .entry(NodeLabels {
                provision_state: c.provision_state.clone(),
                power_state: c.power_state.unwrap_or_else(|| "none".into()),
                maintenance: c.maintenance,
            })
            .or_default() += c.count;
        if let Some(t) = c.oldest_change {
            let e = oldest.entry(c.provision_state).or_insert(t);
            *e = (*e).min(t);
        }
        if let Some(holder) = c.reservation {
            *leases.entry(holder).or_default() += c.count;
        }
    }
    let m = &*METRICS;
    m.nodes.clear();
    for (labels, n) in nodes {
        m.nodes.get_or_create(&labels).set(n);
    }
    m.longest_in_state.clear();
    let now = Utc::now();
    for (provision_state, since) in oldest {
        let secs = (now - since).num_milliseconds().max(0) as f64 / 1000.0;
        m.longest_in_state
            .get_or_create(&StateLabels { provision_state })
            .set(secs);
    }
    m.leases.clear();
    // This controller shows even while it holds nothing: a fleet dashboard sums by it.
    m.leases
        .get_or_create(&ControllerLabels {
            controller: conductor.id().to_string(),
        })
        .set(0);
    for (controller, n) in leases {
        m.leases
            .get_or_create(&ControllerLabels { controller })
            .set(n);
    }
    m.conductors_alive.set(alive as i64);
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
        METRICS.scrape_errors.inc();
        tracing::warn!(error = %e, "metrics: cannot read node counts from the store");
    }
    let mut text = String::new();
    let (encoded, content_type) = if wants_openmetrics(headers) {
        (
            prometheus_client::encoding::text::encode(&mut text, &METRICS.registry),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )
    } else {
        (
            prometheus_client::encoding::prometheus_text::encode(&mut text, &METRICS.registry),
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        )
    };
    if encoded.is_err() {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "metrics could not be encoded",
        )
            .into_response();
    }
    let mut resp = text.into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// `GET /metrics` on the API address (the admin router's auth runs first).
pub async fn scrape(State(state): State<crate::api::AppState>, headers: HeaderMap) -> Response {
    render(&state.conductor, &headers).await
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_follow_the_naming_conventions() {
        step_started(
            "clean",
            &PlannedStep {
                step: rivet_protocol::steps::StepDescriptor {
                    interface: "deploy".into(),
                    step: "erase_devices".into(),
                    priority: 10,
                    abortable: true,
                    argsinfo: Default::default(),
                    reboot_requested: false,
                    requires_ramdisk: true,
                },
                args: Default::default(),
                source: Source::Agent,
            },
        );
        drop(store_query(Access::Read));
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &METRICS.registry)
            .expect("encode");
        let mut types = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("type line");
                assert!(name.starts_with("rivet_"), "{line}");
                match kind {
                    "counter" => assert!(name.ends_with("_total"), "{line}"),
                    "histogram" => assert!(name.ends_with("_seconds"), "{line}"),
                    _ => {}
                }
                types.push(name.to_string());
            }
        }
        for name in [
            "rivet_build_info",
            "rivet_steps_started_total",
            "rivet_store_query_duration_seconds",
            "rivet_steps_failed_total",
        ] {
            assert!(
                types.iter().any(|t| t == name),
                "{name} missing in {types:?}"
            );
        }
        assert!(text.contains(
            "rivet_steps_started_total{operation=\"clean\",interface=\"deploy\",step=\"erase_devices\"}"
        ));
    }
}
