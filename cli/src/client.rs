//! HTTP to rivetd: base URL, auth and version headers, and error decoding.
//!
//! Every request carries `X-OpenStack-Ironic-API-Version: latest` and, when `RIVET_TOKEN` is
//! set, `Authorization: Bearer TOKEN`. Error answers are decoded from Ironic's
//! `{"error_message": …}` into the server's own message plus the HTTP status.

use reqwest::{Method, StatusCode, Url};
use rivet_protocol::api::{ErrorBody, VERSION_HEADER};
use serde::Serialize;
use serde_json::Value;
use std::fmt;
use std::time::Duration;

/// Default controller address (Ironic's port).
pub const DEFAULT_URL: &str = "http://127.0.0.1:6385";

/// What went wrong talking to rivetd.
#[derive(Debug)]
pub enum ClientError {
    /// The server answered with an error status.
    Http {
        /// HTTP status.
        status: StatusCode,
        /// The server's message (faultstring), or the body text.
        message: String,
    },
    /// No connection could be made.
    Unreachable {
        /// Base URL tried.
        url: String,
        /// Innermost cause.
        cause: String,
    },
    /// Anything else on the wire (timeouts, bad JSON, bad URL).
    Transport(String),
}

impl ClientError {
    /// The HTTP status, when the server answered.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ClientError::Http { status, .. } => Some(*status),
            _ => None,
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Http { status, message } => write!(f, "{message} (HTTP {status})"),
            ClientError::Unreachable { url, cause } => write!(
                f,
                "cannot reach rivetd at {url}: {cause}; is it running? (set RIVET_URL)"
            ),
            ClientError::Transport(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for ClientError {}

/// A thin client for the admin API.
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

/// The innermost cause of an error, which is the useful part of reqwest's chain
/// ("Connection refused (os error 111)").
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// The message of an error answer: Ironic's faultstring when the body has one.
pub fn error_message(status: StatusCode, body: &str) -> String {
    if let Ok(b) = serde_json::from_str::<ErrorBody>(body) {
        return b.message();
    }
    let text = body.trim();
    if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("request failed")
            .to_string()
    } else {
        text.chars().take(500).collect()
    }
}

impl Client {
    /// A client for `base` (e.g. `http://127.0.0.1:6385`), with an optional bearer token.
    pub fn new(base: &str, token: Option<String>) -> Result<Self, ClientError> {
        let base = base.trim().trim_end_matches('/').to_string();
        Url::parse(&base)
            .map_err(|e| ClientError::Transport(format!("invalid rivetd URL {base:?}: {e}")))?;
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(120))
            // rivetd closes a keep-alive connection that sends no request within its header
            // read timeout (10 s by default): never reuse one idle that long, or the next
            // request meets a closed connection.
            .pool_idle_timeout(Duration::from_secs(5));
        // A private CA (`rivetd tls init` makes one) for an https rivetd.
        if let Some((path, pem)) = ca_pem()? {
            let cert = reqwest::Certificate::from_pem(&pem).map_err(|e| {
                ClientError::Transport(format!("RIVET_CA {} is not a PEM certificate: {e}", path))
            })?;
            builder = builder.add_root_certificate(cert);
        }
        let http = builder
            .build()
            .map_err(|e| ClientError::Transport(format!("cannot build HTTP client: {e}")))?;
        Ok(Client {
            http,
            base,
            token: token.filter(|t| !t.is_empty()),
        })
    }

    /// The base URL (no trailing slash).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The bearer token, when one is set.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// Turn a server-supplied absolute link (e.g. a `next` link) into a path on our base URL,
    /// so a proxy or a `Host` mismatch does not send us elsewhere.
    pub fn rebase(link: &str) -> Option<String> {
        let url = Url::parse(link).ok()?;
        Some(match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_string(),
        })
    }

    /// Send one request; `Ok(None)` for an empty successful body (202, 204).
    pub async fn request<B: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&B>,
    ) -> Result<Option<Value>, ClientError> {
        let url = format!("{}{path}", self.base);
        let mut req = self
            .http
            .request(method, &url)
            .header(VERSION_HEADER, "latest")
            .header(reqwest::header::ACCEPT, "application/json");
        if !query.is_empty() {
            req = req.query(query);
        }
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.map_err(|e| {
            if e.is_connect() {
                ClientError::Unreachable {
                    url: self.base.clone(),
                    cause: root_cause(&e),
                }
            } else if e.is_timeout() {
                ClientError::Transport(format!("rivetd at {} did not answer in time", self.base))
            } else {
                ClientError::Transport(format!("request to {url} failed: {}", root_cause(&e)))
            }
        })?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| {
            ClientError::Transport(format!("reading the answer from {url}: {}", root_cause(&e)))
        })?;
        if !status.is_success() {
            return Err(ClientError::Http {
                status,
                message: error_message(status, &text),
            });
        }
        if text.trim().is_empty() {
            return Ok(None);
        }
        serde_json::from_str(&text).map(Some).map_err(|e| {
            ClientError::Transport(format!("rivetd answered {url} with invalid JSON: {e}"))
        })
    }

    /// GET a text document (`/metrics`), with the token.
    pub async fn get_text(&self, path: &str) -> Result<String, ClientError> {
        let bytes = self.get_bytes(path, &[]).await?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// GET a document as bytes (the console log is not necessarily UTF-8), with the token.
    pub async fn get_bytes(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<Vec<u8>, ClientError> {
        let url = format!("{}{path}", self.base);
        let mut req = self.http.get(&url).header(VERSION_HEADER, "latest");
        if !query.is_empty() {
            req = req.query(query);
        }
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.map_err(|e| {
            if e.is_connect() {
                ClientError::Unreachable {
                    url: self.base.clone(),
                    cause: root_cause(&e),
                }
            } else {
                ClientError::Transport(format!("request to {url} failed: {}", root_cause(&e)))
            }
        })?;
        let status = resp.status();
        let body = resp.bytes().await.map_err(|e| {
            ClientError::Transport(format!("reading the answer from {url}: {}", root_cause(&e)))
        })?;
        if !status.is_success() {
            return Err(ClientError::Http {
                status,
                message: error_message(status, &String::from_utf8_lossy(&body)),
            });
        }
        Ok(body.to_vec())
    }

    /// GET a JSON document.
    pub async fn get(&self, path: &str, query: &[(&str, String)]) -> Result<Value, ClientError> {
        Ok(self
            .request::<()>(Method::GET, path, query, None)
            .await?
            .unwrap_or(Value::Null))
    }

    /// POST a body, returning the created document.
    pub async fn post<B: Serialize + ?Sized>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<Value, ClientError> {
        Ok(self
            .request(Method::POST, path, &[], Some(body))
            .await?
            .unwrap_or(Value::Null))
    }

    /// PUT a body (state changes answer 202 with no body).
    pub async fn put<B: Serialize + ?Sized>(
        &self,
        path: &str,
        body: Option<&B>,
    ) -> Result<Option<Value>, ClientError> {
        self.request(Method::PUT, path, &[], body).await
    }

    /// PATCH with an RFC 6902 list.
    pub async fn patch<B: Serialize + ?Sized>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<Value, ClientError> {
        Ok(self
            .request(Method::PATCH, path, &[], Some(body))
            .await?
            .unwrap_or(Value::Null))
    }

    /// DELETE.
    pub async fn delete(&self, path: &str) -> Result<(), ClientError> {
        self.request::<()>(Method::DELETE, path, &[], None)
            .await
            .map(|_| ())
    }
}

/// `RIVET_CA`: the path (for messages) and the PEM bytes of a private CA, when set.
pub fn ca_pem() -> Result<Option<(String, Vec<u8>)>, ClientError> {
    let Some(path) = std::env::var_os("RIVET_CA").filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    let shown = path.to_string_lossy().into_owned();
    let pem = std::fs::read(&path)
        .map_err(|e| ClientError::Transport(format!("cannot read RIVET_CA {shown}: {e}")))?;
    Ok(Some((shown, pem)))
}

/// Percent-encode one path segment (node names are URL-safe, but be safe with user input).
pub fn seg(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_ironic_errors() {
        let body = serde_json::to_string(&ErrorBody::new("node n1 is in \"enroll\"", true))
            .unwrap_or_default();
        assert_eq!(
            error_message(StatusCode::BAD_REQUEST, &body),
            "node n1 is in \"enroll\""
        );
        assert_eq!(error_message(StatusCode::BAD_GATEWAY, " "), "Bad Gateway");
        assert_eq!(error_message(StatusCode::BAD_GATEWAY, "oops\n"), "oops");
    }

    #[test]
    fn rebases_links() {
        assert_eq!(
            Client::rebase("http://other:1/v1/nodes?limit=2&marker=abc").as_deref(),
            Some("/v1/nodes?limit=2&marker=abc")
        );
        assert_eq!(Client::rebase("not a url"), None);
    }

    #[test]
    fn encodes_segments() {
        assert_eq!(seg("n1.a-b_c~"), "n1.a-b_c~");
        assert_eq!(seg("a b/c"), "a%20b%2Fc");
    }
}
