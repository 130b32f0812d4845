//! The process-wide Prometheus registry of rivetd and the small typed recorders the call
//! sites use (`http`, `agent_heartbeat`, `step_*`, `store_query`, `bmc_call`). Labels are
//! primitive values the callers hand in, so this layer knows no store, driver or conductor
//! type; the exposition (`GET /metrics`, which also reads the fleet from the store at scrape
//! time through [`set_fleet`]) lives with the conductor in rivetd.
//!
//! Every family is prefixed `rivet_`; counters end in `_total`, durations are `_seconds`
//! histograms. Labels are bounded: API requests are labelled by the route template axum
//! matched (`/v1/nodes/{ident}`), never by the raw path, so a node UUID never becomes a
//! label value.

pub use rivet_model::config::MetricsConfig;

pub mod charts;

#[cfg(feature = "http")]
use axum::extract::{MatchedPath, Request};
#[cfg(feature = "http")]
use axum::http::Method;
#[cfg(feature = "http")]
use axum::middleware::Next;
#[cfg(feature = "http")]
use axum::response::Response;
use chrono::{DateTime, Utc};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use rivet_model::steps::{PlannedStep, Source};
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::LazyLock;
use std::time::Instant;

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ImageLabels {
    image: String,
    in_use: bool,
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
    state_seconds: HistogramFamily<StateLabels>,
    provision_failures: Family<StateLabels, Counter>,
    deploy_seconds: Histogram,
    bmc_requests: Family<BmcLabels, Counter>,
    bmc_seconds: HistogramFamily<BmcOperationLabels>,
    store_seconds: HistogramFamily<AccessLabels>,
    nodes: Family<NodeLabels, Gauge>,
    longest_in_state: Family<StateLabels, Gauge<f64, AtomicU64>>,
    leases: Family<ControllerLabels, Gauge>,
    conductors_alive: Gauge,
    scrape_errors: Counter,
    cache_hits: Counter,
    cache_misses: Counter,
    cache_revalidated: Counter,
    cache_evictions: Counter,
    cache_origin_bytes: Counter,
    cache_served_bytes: Counter,
    cache_bytes: Gauge,
    cache_images: Family<ImageLabels, Gauge>,
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
        state_seconds: Family::new_with_constructor(step_buckets),
        provision_failures: Family::default(),
        deploy_seconds: step_buckets(),
        bmc_requests: Family::default(),
        bmc_seconds: Family::new_with_constructor(bmc_buckets),
        store_seconds: Family::new_with_constructor(store_buckets),
        nodes: Family::default(),
        longest_in_state: Family::default(),
        leases: Family::default(),
        conductors_alive: Gauge::default(),
        scrape_errors: Counter::default(),
        cache_hits: Counter::default(),
        cache_misses: Counter::default(),
        cache_revalidated: Counter::default(),
        cache_evictions: Counter::default(),
        cache_origin_bytes: Counter::default(),
        cache_served_bytes: Counter::default(),
        cache_bytes: Gauge::default(),
        cache_images: Family::default(),
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
        "provision_state_duration_seconds",
        "Time a node spent in a provision state, observed when it left it",
        m.state_seconds.clone(),
    );
    r.register(
        "provision_failures",
        "Transitions into a failed provision state, by the state entered",
        m.provision_failures.clone(),
    );
    r.register(
        "deploy_duration_seconds",
        "Time from a deploy verb (active, rebuild) to the node being active",
        m.deploy_seconds.clone(),
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
    r.register(
        "image_cache_hits",
        "Deploys served an image already in the image cache (or joining its one download)",
        m.cache_hits.clone(),
    );
    r.register(
        "image_cache_misses",
        "Image cache lookups that downloaded the image from its origin",
        m.cache_misses.clone(),
    );
    r.register(
        "image_cache_revalidations",
        "Cached images confirmed unchanged by their origin (a conditional request answered 304)",
        m.cache_revalidated.clone(),
    );
    r.register(
        "image_cache_evictions",
        "Cached images removed: least recently used over max_bytes, past the ttl, purged, or found corrupt",
        m.cache_evictions.clone(),
    );
    r.register(
        "image_cache_origin_bytes",
        "Image bytes the image cache received from origins",
        m.cache_origin_bytes.clone(),
    );
    r.register(
        "image_cache_served_bytes",
        "Image bytes rivetd sent to agents from the image cache (its egress for local downloads)",
        m.cache_served_bytes.clone(),
    );
    r.register(
        "image_cache_bytes",
        "Bytes of complete images in the image cache",
        m.cache_bytes.clone(),
    );
    r.register(
        "image_cache_image_bytes",
        "Each cached image's size, by content address and whether a running deploy reads it",
        m.cache_images.clone(),
    );
    Metrics { registry: r, ..m }
});

#[cfg(feature = "http")]
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
/// axum matched (`unmatched` for the fallback's 404s). With the `http` feature.
#[cfg(feature = "http")]
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
        let secs = seconds_since(started);
        charts::step_ended(operation, &labels.interface, &labels.step, secs);
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

fn seconds_since(t: DateTime<Utc>) -> f64 {
    (Utc::now() - t).num_milliseconds().max(0) as f64 / 1000.0
}

/// A node went from provision state `from` (entered at `since`, when known) to `to`;
/// `failed` when `to` is a failed state.
pub fn provision_transition(from: &str, to: &str, since: Option<DateTime<Utc>>, failed: bool) {
    let m = &*METRICS;
    if let Some(since) = since {
        let secs = seconds_since(since);
        m.state_seconds
            .get_or_create(&StateLabels {
                provision_state: from.to_string(),
            })
            .observe(secs);
        charts::state_left(from, secs);
    }
    if failed {
        m.provision_failures
            .get_or_create(&StateLabels {
                provision_state: to.to_string(),
            })
            .inc();
        charts::failed(to, Utc::now().timestamp());
    }
}

/// A deploy started at `started` (its verb) reached `active`.
pub fn deploy_finished(started: DateTime<Utc>) {
    let secs = seconds_since(started);
    METRICS.deploy_seconds.observe(secs);
    charts::deployed(secs);
}

/// Times one store query while alive.
#[must_use = "the query is timed until this is dropped"]
pub struct StoreTimer {
    access: &'static str,
    start: Instant,
}

impl Drop for StoreTimer {
    fn drop(&mut self) {
        METRICS
            .store_seconds
            .get_or_create(&AccessLabels {
                access: self.access,
            })
            .observe(self.start.elapsed().as_secs_f64());
    }
}

/// Start timing a store query of one kind of access (`read`, `scan`, `write`).
pub fn store_query(access: &'static str) -> StoreTimer {
    StoreTimer {
        access,
        start: Instant::now(),
    }
}

/// One out-of-band BMC operation ended (the metered BMC wrapper of the drivers' callers).
pub fn bmc_call(
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

/// The fleet as the store sees it at a scrape: the families that are read, not counted.
#[derive(Debug, Default)]
pub struct Fleet {
    /// Nodes per (provision state, power state or `none`, maintenance).
    pub nodes: BTreeMap<(String, String, bool), i64>,
    /// Per provision state, seconds since its longest-waiting node changed state.
    pub longest_in_state: BTreeMap<String, f64>,
    /// Node leases per controller; `me` shows at 0 while it holds nothing.
    pub leases: BTreeMap<String, i64>,
    /// This controller's id.
    pub me: String,
    /// Controllers alive.
    pub conductors_alive: i64,
}

/// Replace the store-derived families with `fleet`.
pub fn set_fleet(fleet: Fleet) {
    let m = &*METRICS;
    m.nodes.clear();
    for ((provision_state, power_state, maintenance), n) in fleet.nodes {
        m.nodes
            .get_or_create(&NodeLabels {
                provision_state,
                power_state,
                maintenance,
            })
            .set(n);
    }
    m.longest_in_state.clear();
    for (provision_state, secs) in fleet.longest_in_state {
        m.longest_in_state
            .get_or_create(&StateLabels { provision_state })
            .set(secs);
    }
    m.leases.clear();
    // This controller shows even while it holds nothing: a fleet dashboard sums by it.
    m.leases
        .get_or_create(&ControllerLabels {
            controller: fleet.me,
        })
        .set(0);
    for (controller, n) in fleet.leases {
        m.leases
            .get_or_create(&ControllerLabels { controller })
            .set(n);
    }
    m.conductors_alive.set(fleet.conductors_alive);
}

/// What one image-cache lookup did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageCacheOutcome {
    /// Served from the cache (fresh, or joining a download another deploy started).
    Hit,
    /// Downloaded from the origin.
    Miss,
    /// Served from the cache after the origin answered 304 to a conditional request.
    Revalidated,
}

/// Count an image-cache lookup.
pub fn image_cache_lookup(outcome: ImageCacheOutcome) {
    let m = &*METRICS;
    match outcome {
        ImageCacheOutcome::Hit => m.cache_hits.inc(),
        ImageCacheOutcome::Miss => m.cache_misses.inc(),
        ImageCacheOutcome::Revalidated => {
            m.cache_hits.inc();
            m.cache_revalidated.inc()
        }
    };
}

/// Count `n` cached images removed.
pub fn image_cache_evicted(n: u64) {
    METRICS.cache_evictions.inc_by(n);
}

/// Count bytes received from an origin.
pub fn image_cache_origin_bytes(n: u64) {
    METRICS.cache_origin_bytes.inc_by(n);
}

/// Count bytes of a cached image handed to an agent's download.
pub fn image_cache_served_bytes(n: u64) {
    METRICS.cache_served_bytes.inc_by(n);
}

/// Replace the cache's contents: `(content address, bytes, read by a running deploy)`.
pub fn set_image_cache(images: &[(String, u64, bool)]) {
    let m = &*METRICS;
    m.cache_images.clear();
    let mut total = 0i64;
    for (image, bytes, in_use) in images {
        let b = i64::try_from(*bytes).unwrap_or(i64::MAX);
        total = total.saturating_add(b);
        m.cache_images
            .get_or_create(&ImageLabels {
                image: image.clone(),
                in_use: *in_use,
            })
            .set(b);
    }
    m.cache_bytes.set(total);
}

/// A scrape could not read the store (its families keep their last values).
pub fn scrape_failed() {
    METRICS.scrape_errors.inc();
}

/// Every family encoded: OpenMetrics when `openmetrics`, else the Prometheus text format;
/// the text and its content type.
pub fn encode(openmetrics: bool) -> Result<(String, &'static str), std::fmt::Error> {
    let mut text = String::new();
    if openmetrics {
        prometheus_client::encoding::text::encode(&mut text, &METRICS.registry)?;
        Ok((
            text,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ))
    } else {
        prometheus_client::encoding::prometheus_text::encode(&mut text, &METRICS.registry)?;
        Ok((
            text,
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        ))
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
        drop(store_query("read"));
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
