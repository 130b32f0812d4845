//! Talking to the controller: the [`Transport`] trait (HTTP in production, a fake in tests)
//! and lookup with backoff over several controller URLs.

use crate::backoff::Backoff;
use rivet_protocol::agent::{
    HeartbeatRequest, HeartbeatResponse, LookupRequest, LookupResponse, HEARTBEAT_PATH, LOOKUP_PATH,
};
use std::future::Future;
use std::path::Path;
use std::time::Duration;

/// How long a lookup may take.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a request to the controller failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// The controller answered with an error status.
    #[error("controller answered HTTP {status}: {body}")]
    Status {
        /// HTTP status code.
        status: u16,
        /// Start of the response body.
        body: String,
    },
    /// The controller is rate-limiting this address (HTTP 429): wait `retry_after` before
    /// the next request to it.
    #[error("controller answered HTTP 429 (retry after {} s): {body}", retry_after.as_secs())]
    RateLimited {
        /// How long the controller asked us to wait (its `Retry-After`, bounded).
        retry_after: Duration,
        /// Start of the response body (says which limit was hit).
        body: String,
    },
    /// No answer: connection refused, DNS, TLS, timeout.
    #[error("cannot reach the controller: {0}")]
    Connect(String),
    /// An answer that is not the expected JSON.
    #[error("unexpected answer from the controller: {0}")]
    Decode(String),
}

impl TransportError {
    /// HTTP status, if the controller answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            TransportError::Status { status, .. } => Some(*status),
            TransportError::RateLimited { .. } => Some(429),
            _ => None,
        }
    }

    /// How long to stay away, when the controller said so (HTTP 429).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            TransportError::RateLimited { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

/// Longest `Retry-After` honoured: a controller (or a proxy) asking for more is not allowed to
/// park the agent for longer than this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// `Retry-After` in delta-seconds (what rivetd sends), bounded by [`MAX_RETRY_AFTER`]. An
/// HTTP-date or garbage falls back to one second rather than being ignored.
pub fn parse_retry_after(value: Option<&str>) -> Duration {
    value
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1))
        .clamp(Duration::from_secs(1), MAX_RETRY_AFTER)
}

/// Errors building the HTTP client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The CA file could not be read.
    #[error("cannot read CA certificate {path}: {source}")]
    ReadCa {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The CA file is not PEM, or the TLS stack refused it.
    #[error("bad CA certificate {path}: {reason}")]
    BadCa {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
}

/// The two agent endpoints. `base` is a controller URL without trailing slash.
pub trait Transport: Send + Sync + 'static {
    /// `POST {base}/agent/v1/lookup`.
    fn lookup(
        &self,
        base: &str,
        req: &LookupRequest,
    ) -> impl Future<Output = Result<LookupResponse, TransportError>> + Send;

    /// `POST {base}/agent/v1/heartbeat/{node}` with `Authorization: Bearer {token}`.
    fn heartbeat(
        &self,
        base: &str,
        node: &str,
        token: &str,
        req: &HeartbeatRequest,
        timeout: Duration,
    ) -> impl Future<Output = Result<HeartbeatResponse, TransportError>> + Send;

    /// `POST {base}/agent/v1/discover` (the `discovery` module drives it); a transport without it
    /// answers as a controller with discovery disabled.
    fn discover(
        &self,
        base: &str,
        req: &rivet_protocol::discovery::DiscoverRequest,
    ) -> impl Future<Output = Result<rivet_protocol::discovery::DiscoverResponse, TransportError>> + Send
    {
        let _ = (base, req);
        async {
            Err(TransportError::Status {
                status: 403,
                body: "discovery is not supported by this transport".into(),
            })
        }
    }
}

/// reqwest over rustls.
#[derive(Debug, Clone)]
pub struct HttpTransport {
    client: reqwest::Client,
}

impl HttpTransport {
    /// A client trusting the usual web roots plus `ca` (PEM), if given.
    pub fn new(ca: Option<&Path>) -> Result<Self, ClientError> {
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .connect_timeout(Duration::from_secs(10))
            .user_agent(concat!("rivet-agent/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = ca {
            let shown = path.display().to_string();
            let pem = std::fs::read(path).map_err(|source| ClientError::ReadCa {
                path: shown.clone(),
                source,
            })?;
            let certs =
                reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| ClientError::BadCa {
                    path: shown.clone(),
                    reason: error_chain(&e),
                })?;
            if certs.is_empty() {
                return Err(ClientError::BadCa {
                    path: shown,
                    reason: "no certificate in the file".into(),
                });
            }
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        let client = builder.build().map_err(|e| ClientError::BadCa {
            path: ca.map(|p| p.display().to_string()).unwrap_or_default(),
            reason: error_chain(&e),
        })?;
        Ok(HttpTransport { client })
    }

    async fn post<Req: serde::Serialize, Resp: serde::de::DeserializeOwned>(
        &self,
        url: String,
        token: Option<&str>,
        body: &Req,
        timeout: Duration,
    ) -> Result<Resp, TransportError> {
        let mut req = self.client.post(&url).json(body).timeout(timeout);
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| TransportError::Connect(format!("{url}: {}", error_chain(&e))))?;
        let status = resp.status();
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            let retry_after = parse_retry_after(
                resp.headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok()),
            );
            let body = resp.text().await.unwrap_or_default();
            return Err(TransportError::RateLimited {
                retry_after,
                body: body.chars().take(500).collect(),
            });
        }
        if !status.is_success() {
            let body = resp.text().await.unwrap_or_default();
            return Err(TransportError::Status {
                status: status.as_u16(),
                body: body.chars().take(500).collect(),
            });
        }
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| TransportError::Connect(format!("{url}: {}", error_chain(&e))))?;
        serde_json::from_slice(&bytes).map_err(|e| TransportError::Decode(format!("{url}: {e}")))
    }
}

impl Transport for HttpTransport {
    async fn lookup(
        &self,
        base: &str,
        req: &LookupRequest,
    ) -> Result<LookupResponse, TransportError> {
        self.post(format!("{base}{LOOKUP_PATH}"), None, req, LOOKUP_TIMEOUT)
            .await
    }

    async fn heartbeat(
        &self,
        base: &str,
        node: &str,
        token: &str,
        req: &HeartbeatRequest,
        timeout: Duration,
    ) -> Result<HeartbeatResponse, TransportError> {
        self.post(
            format!("{base}{HEARTBEAT_PATH}/{node}"),
            Some(token),
            req,
            timeout,
        )
        .await
    }

    async fn discover(
        &self,
        base: &str,
        req: &rivet_protocol::discovery::DiscoverRequest,
    ) -> Result<rivet_protocol::discovery::DiscoverResponse, TransportError> {
        let url = format!("{base}{}", rivet_protocol::discovery::DISCOVER_PATH);
        self.post(url, None, req, LOOKUP_TIMEOUT).await
    }
}

/// An error with its sources, so "error sending request" says *why* (refused, TLS, DNS…).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        let msg = inner.to_string();
        if !s.contains(&msg) {
            s.push_str(": ");
            s.push_str(&msg);
        }
        src = inner.source();
    }
    s
}

/// Look up until a controller answers. Tries every URL in turn starting at `start`, sleeps
/// with backoff after a full round fails; 404 (unknown hardware) is retried like any error.
/// A 429 makes the pause at least the controller's `Retry-After`. Returns the index of the
/// controller that answered. Cancel by dropping the future.
pub async fn lookup_until_found<T: Transport>(
    transport: &T,
    controllers: &[String],
    start: usize,
    req: &LookupRequest,
    backoff: &mut Backoff,
) -> (usize, LookupResponse) {
    loop {
        let mut asked_to_wait = Duration::ZERO;
        for i in 0..controllers.len() {
            let idx = (start + i) % controllers.len();
            let url = &controllers[idx];
            match transport.lookup(url, req).await {
                Ok(resp) => {
                    backoff.reset();
                    return (idx, resp);
                }
                Err(e) if e.status() == Some(404) => tracing::info!(
                    controller = %url,
                    macs = ?req.macs,
                    "controller does not know this machine (404); enrol it with one of these MACs"
                ),
                Err(e) => {
                    if let Some(wait) = e.retry_after() {
                        asked_to_wait = asked_to_wait.max(wait);
                    }
                    tracing::warn!(controller = %url, error = %e, "lookup failed")
                }
            }
        }
        let delay = backoff.next_delay().max(asked_to_wait);
        tracing::debug!(?delay, attempt = backoff.attempts(), "retrying lookup");
        tokio::time::sleep(delay).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_parsed_and_bounded() {
        assert_eq!(parse_retry_after(Some("7")), Duration::from_secs(7));
        assert_eq!(parse_retry_after(Some(" 12 ")), Duration::from_secs(12));
        assert_eq!(parse_retry_after(Some("0")), Duration::from_secs(1));
        assert_eq!(parse_retry_after(Some("999999")), MAX_RETRY_AFTER);
        assert_eq!(
            parse_retry_after(Some("Wed, 21 Oct 2015 07:28:00 GMT")),
            Duration::from_secs(1)
        );
        assert_eq!(parse_retry_after(None), Duration::from_secs(1));
        let e = TransportError::RateLimited {
            retry_after: Duration::from_secs(3),
            body: "slow down".into(),
        };
        assert_eq!(e.status(), Some(429));
        assert_eq!(e.retry_after(), Some(Duration::from_secs(3)));
        assert!(e.to_string().contains("retry after 3 s"), "{e}");
    }
}
