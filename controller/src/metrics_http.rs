//! `GET /metrics` over HTTP: the answer for the conductor's exposition
//! ([`rivet_conductor::metrics::exposition`]) in the format the scraper asks for in `Accept`
//! (OpenMetrics, else the Prometheus text format), served on the API address (behind the
//! admin router's auth, see `api`) and, when `[metrics] listen` is set, on an address of
//! its own without credentials ([`serve_listener`]).

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use rivet_conductor::supervisor::LoopEnd;
use rivet_conductor::Conductor;
use std::sync::Arc;

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
    let Ok((text, content_type)) =
        rivet_conductor::metrics::exposition(conductor, wants_openmetrics(headers)).await
    else {
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
/// controller-wide loop, supervised with the conductor's
/// ([`Conductor::run_background`]): an address that cannot be bound stops rivetd at
/// start-up with the reason, rather than leaving the operator's monitoring silently blind.
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
