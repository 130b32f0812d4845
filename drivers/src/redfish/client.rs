//! The Redfish HTTP client: `get`/`patch`/`post` with authentication (basic or a Redfish
//! session, re-created on 401), per-request timeouts, bounded retries with back-off on
//! connection errors and 5xx answers (GETs also on dropped connections and timeouts), and
//! errors that say how often they tried and what to check, carrying the BMC's own messages
//! (`error.@Message.ExtendedInfo[].Message`) so they reach `last_error`.
//!
//! HTTP clients (one per TLS setting) and sessions (one per BMC and user) are shared by the
//! whole process. No credential is ever logged or put into an error message.

use super::info::{AuthType, RedfishInfo, Secret, Verify};
use crate::{DriverError, DriversConfig};
use reqwest::{Method, StatusCode, Url};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// An answer from the BMC (2xx, or the caller asked for the raw status).
#[derive(Debug, Clone)]
pub(crate) struct Response {
    /// HTTP status.
    pub(crate) status: u16,
    /// `Location` header (task monitors, created sessions).
    pub(crate) location: Option<String>,
    /// JSON body (`Null` when empty or not JSON).
    pub(crate) body: Value,
}

/// How requests authenticate, once decided for a BMC and user.
#[derive(Clone)]
enum SessionState {
    /// The BMC has no usable SessionService: HTTP basic.
    Basic,
    /// A session token.
    Token(String),
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct ClientKey {
    verify: String,
    connect_ms: u64,
    request_ms: u64,
}

fn clients() -> &'static Mutex<HashMap<ClientKey, reqwest::Client>> {
    static C: OnceLock<Mutex<HashMap<ClientKey, reqwest::Client>>> = OnceLock::new();
    C.get_or_init(|| Mutex::new(HashMap::new()))
}

fn sessions() -> &'static Mutex<HashMap<String, SessionState>> {
    static S: OnceLock<Mutex<HashMap<String, SessionState>>> = OnceLock::new();
    S.get_or_init(|| Mutex::new(HashMap::new()))
}

fn sha256_hex(bytes: &[u8]) -> String {
    rivet_support::credentials::hex(&Sha256::digest(bytes))
}

fn bmc(msg: impl Into<String>) -> DriverError {
    DriverError::Bmc(msg.into())
}

/// The shared reqwest client for a TLS setting (built once; reads a CA bundle each time so
/// a replaced file takes effect).
fn http_client(verify: &Verify, cfg: &DriversConfig) -> Result<reqwest::Client, DriverError> {
    let (verify_key, pem) = match verify {
        Verify::Roots => ("roots".to_string(), None),
        Verify::Off => ("off".to_string(), None),
        Verify::CaFile(path) => {
            let pem = std::fs::read(path).map_err(|e| DriverError::BadDriverInfo {
                field: "redfish_verify_ca".into(),
                reason: format!("cannot read the CA bundle {}: {e}", path.display()),
            })?;
            (format!("ca:{}", sha256_hex(&pem)), Some(pem))
        }
    };
    let key = ClientKey {
        verify: verify_key,
        connect_ms: cfg.redfish_connect_timeout_s.max(1) * 1000,
        request_ms: cfg.redfish_request_timeout_s.max(1) * 1000,
    };
    let mut cache = clients()
        .lock()
        .map_err(|_| bmc("Redfish client cache poisoned"))?;
    if let Some(c) = cache.get(&key) {
        return Ok(c.clone());
    }
    let mut b = reqwest::Client::builder()
        .connect_timeout(Duration::from_millis(key.connect_ms))
        .timeout(Duration::from_millis(key.request_ms))
        .pool_idle_timeout(Duration::from_secs(30))
        .user_agent(concat!("rivet-redfish/", env!("CARGO_PKG_VERSION")));
    match (verify, pem) {
        (Verify::Off, _) => b = b.danger_accept_invalid_certs(true),
        (Verify::CaFile(path), Some(pem)) => {
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                DriverError::BadDriverInfo {
                    field: "redfish_verify_ca".into(),
                    reason: format!("{} is not a PEM CA bundle: {e}", path.display()),
                }
            })?;
            if certs.is_empty() {
                return Err(DriverError::BadDriverInfo {
                    field: "redfish_verify_ca".into(),
                    reason: format!("{} holds no PEM certificate", path.display()),
                });
            }
            b = b.tls_built_in_root_certs(false);
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        _ => {}
    }
    let client = b
        .build()
        .map_err(|e| bmc(format!("cannot build the Redfish HTTP client: {e}")))?;
    cache.insert(key, client.clone());
    Ok(client)
}

/// Talks to one BMC as one user.
pub(crate) struct RedfishClient {
    http: reqwest::Client,
    base: Url,
    username: Option<String>,
    password: Option<Secret>,
    auth: AuthType,
    retries: u32,
    backoff: Duration,
    session_key: String,
}

impl RedfishClient {
    /// A client for the BMC in `info` (no network I/O).
    pub(crate) fn new(info: &RedfishInfo, cfg: &DriversConfig) -> Result<Self, DriverError> {
        let http = http_client(&info.verify, cfg)?;
        let pw_hash = sha256_hex(info.secret().unwrap_or("").as_bytes());
        let session_key = format!(
            "{}\u{0}{}\u{0}{pw_hash}",
            info.address,
            info.username.as_deref().unwrap_or("")
        );
        Ok(RedfishClient {
            http,
            base: info.address.clone(),
            username: info.username.clone(),
            password: info.password.clone(),
            auth: info.auth,
            retries: cfg.redfish_retries.min(10),
            backoff: Duration::from_millis(cfg.redfish_retry_backoff_ms),
            session_key,
        })
    }

    /// The BMC's address, for messages.
    pub(crate) fn address(&self) -> &str {
        self.base.as_str().trim_end_matches('/')
    }

    /// `path` (absolute path or full URL) resolved against the BMC address.
    fn url(&self, path: &str) -> Result<Url, DriverError> {
        if path.starts_with("http://") || path.starts_with("https://") {
            return Url::parse(path).map_err(|e| bmc(format!("BMC gave a bad URL {path}: {e}")));
        }
        let prefix = self.base.path().trim_end_matches('/');
        let full = if path.starts_with(prefix) || prefix.is_empty() {
            path.to_string()
        } else {
            format!("{prefix}{path}")
        };
        self.base
            .join(&full)
            .map_err(|e| bmc(format!("bad Redfish path {path}: {e}")))
    }

    /// GET a resource; any non-2xx is an error.
    pub(crate) async fn get(&self, path: &str) -> Result<Value, DriverError> {
        Ok(self.request(Method::GET, path, None).await?.body)
    }

    /// GET returning the status too (task monitors answer 202 while running).
    pub(crate) async fn get_response(&self, path: &str) -> Result<Response, DriverError> {
        self.request(Method::GET, path, None).await
    }

    /// PATCH a resource.
    pub(crate) async fn patch(&self, path: &str, body: &Value) -> Result<Response, DriverError> {
        self.request(Method::PATCH, path, Some(body)).await
    }

    /// POST to a collection or an action.
    pub(crate) async fn post(&self, path: &str, body: &Value) -> Result<Response, DriverError> {
        self.request(Method::POST, path, Some(body)).await
    }

    /// One logical request: authenticate, retry, and turn failures into clear errors.
    async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Response, DriverError> {
        let url = self.url(path)?;
        let mut relogged = false;
        loop {
            let auth = self.auth_state().await?;
            let (status, resp, attempts) =
                self.send_with_retries(&method, &url, body, &auth).await?;
            if status == StatusCode::UNAUTHORIZED {
                if let (SessionState::Token(_), false) = (&auth, relogged) {
                    // The session expired or was deleted on the BMC: log in again, once.
                    tracing::debug!(bmc = %self.address(), "Redfish session rejected; logging in again");
                    self.forget_session();
                    relogged = true;
                    continue;
                }
            }
            return self.finish(&method, path, status, resp, attempts).await;
        }
    }

    /// Turn an answer into a [`Response`] or an error carrying the BMC's messages.
    async fn finish(
        &self,
        method: &Method,
        path: &str,
        status: StatusCode,
        resp: reqwest::Response,
        attempts: u32,
    ) -> Result<Response, DriverError> {
        let location = resp
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let text = resp.text().await.unwrap_or_default();
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(Response {
                status: status.as_u16(),
                location,
                body,
            });
        }
        Err(self.status_error(method, path, status, &body, &text, attempts))
    }

    fn status_error(
        &self,
        method: &Method,
        path: &str,
        status: StatusCode,
        body: &Value,
        text: &str,
        attempts: u32,
    ) -> DriverError {
        let mut detail = error_messages(body).join("; ");
        if detail.is_empty() {
            detail = text.trim().chars().take(200).collect();
        }
        let detail = if detail.is_empty() {
            String::new()
        } else {
            format!(": {detail}")
        };
        let user = self.username.as_deref().unwrap_or("(none)");
        let msg = match status {
            StatusCode::UNAUTHORIZED => format!(
                "Redfish BMC at {} rejected the credentials of user {user:?} (HTTP 401 Unauthorized{detail}); check redfish_username and redfish_password",
                self.address()
            ),
            StatusCode::FORBIDDEN => format!(
                "Redfish BMC at {} refused {method} {path} for user {user:?} (HTTP 403 Forbidden{detail}); the account may lack the privilege",
                self.address()
            ),
            // A server error means the BMC itself is in trouble (busy, rebooting, a
            // crashed service): say how often we tried and what to look at.
            s if s.is_server_error() => format!(
                "Redfish {method} {path} at {} failed with HTTP {status}{detail}{}; check that the BMC at {} is healthy (it may be busy or rebooting; reset the BMC if it keeps failing)",
                self.address(),
                tries(attempts),
                self.address()
            ),
            _ => format!(
                "Redfish {method} {path} at {} failed with HTTP {status}{detail}",
                self.address()
            ),
        };
        bmc(crate::redact(
            &msg,
            self.password.as_ref().map(|p| p.0.as_str()),
        ))
    }

    /// Send, retrying with a doubling back-off ([`is_retryable_error`],
    /// [`is_retryable_status`]): a GET on any transport failure but TLS and on any 5xx but
    /// 501; a request that changes something only when it cannot have been applied (the
    /// connection never opened, or 503), so an action such as a firmware update or a power
    /// reset is never sent twice. Also returns how many attempts were made.
    async fn send_with_retries(
        &self,
        method: &Method,
        url: &Url,
        body: Option<&Value>,
        auth: &SessionState,
    ) -> Result<(StatusCode, reqwest::Response, u32), DriverError> {
        let mut delay = self.backoff;
        let mut attempt = 0;
        loop {
            let result = self.send_once(method, url, body, auth).await;
            let retry = match &result {
                Ok(r) => is_retryable_status(method, r.status()),
                Err(e) => is_retryable_error(method, e),
            };
            if retry && attempt < self.retries {
                attempt += 1;
                tracing::debug!(bmc = %self.address(), %method, path = url.path(), attempt, "Redfish request failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
                continue;
            }
            return match result {
                Ok(r) => Ok((r.status(), r, attempt + 1)),
                Err(e) => Err(self.transport_error(method, url, &e, attempt + 1)),
            };
        }
    }

    async fn send_once(
        &self,
        method: &Method,
        url: &Url,
        body: Option<&Value>,
        auth: &SessionState,
    ) -> Result<reqwest::Response, reqwest::Error> {
        let mut req = self
            .http
            .request(method.clone(), url.clone())
            .header(reqwest::header::ACCEPT, "application/json")
            .header("OData-Version", "4.0");
        req = match auth {
            SessionState::Token(t) => req.header("X-Auth-Token", t),
            SessionState::Basic => match &self.username {
                Some(u) => req.basic_auth(u, self.password.as_ref().map(|p| &p.0)),
                None => req,
            },
        };
        if let Some(b) = body {
            req = req.json(b);
        }
        req.send().await
    }

    fn transport_error(
        &self,
        method: &Method,
        url: &Url,
        e: &reqwest::Error,
        attempts: u32,
    ) -> DriverError {
        let chain = error_chain(e);
        let tries = tries(attempts);
        let msg = if is_tls_error(e) {
            format!(
                "TLS failure talking to the Redfish BMC at {}: {chain}; check redfish_address (http or https) and redfish_verify_ca (a CA bundle path, or false to skip verification)",
                self.address()
            )
        } else if e.is_timeout() {
            format!(
                "Redfish BMC at {} did not answer {method} {} in time{tries}: {chain}; check that the BMC is up and not overloaded (raise [drivers] redfish_request_timeout_s for a slow BMC)",
                self.address(),
                url.path()
            )
        } else if e.is_connect() {
            format!(
                "cannot connect to the Redfish BMC at {}{tries}: {chain}; check redfish_address and that the BMC is reachable",
                self.address()
            )
        } else {
            format!(
                "Redfish {method} {} at {} failed{tries}: {chain}; check that the BMC at {} is up and reachable from this controller",
                url.path(),
                self.address(),
                self.address()
            )
        };
        bmc(crate::redact(
            &msg,
            self.password.as_ref().map(|p| p.0.as_str()),
        ))
    }

    // ---- authentication ----

    /// Basic, or a session token (created on first use and shared by the process).
    async fn auth_state(&self) -> Result<SessionState, DriverError> {
        if self.auth == AuthType::Basic || self.username.is_none() {
            return Ok(SessionState::Basic);
        }
        if let Some(s) = self.cached_session() {
            return Ok(s);
        }
        let state = self.login().await?;
        if let Ok(mut m) = sessions().lock() {
            m.insert(self.session_key.clone(), state.clone());
        }
        Ok(state)
    }

    fn cached_session(&self) -> Option<SessionState> {
        sessions().lock().ok()?.get(&self.session_key).cloned()
    }

    fn forget_session(&self) {
        if let Ok(mut m) = sessions().lock() {
            m.remove(&self.session_key);
        }
    }

    /// Create a session through the SessionService; in `auto` mode fall back to basic when
    /// the BMC offers none.
    async fn login(&self) -> Result<SessionState, DriverError> {
        let auto = self.auth == AuthType::Auto;
        let Some(sessions_path) = self.sessions_path().await? else {
            if auto {
                return Ok(SessionState::Basic);
            }
            return Err(bmc(format!(
                "Redfish BMC at {} offers no SessionService; set redfish_auth_type to basic or auto",
                self.address()
            )));
        };
        let body = json!({
            "UserName": self.username.as_deref().unwrap_or(""),
            "Password": self.password.as_ref().map(|p| p.0.as_str()).unwrap_or(""),
        });
        let url = self.url(&sessions_path)?;
        let (status, resp, attempts) = self
            .send_with_retries(&Method::POST, &url, Some(&body), &SessionState::Basic)
            .await?;
        if auto
            && matches!(
                status,
                StatusCode::NOT_FOUND
                    | StatusCode::METHOD_NOT_ALLOWED
                    | StatusCode::NOT_IMPLEMENTED
            )
        {
            return Ok(SessionState::Basic);
        }
        let token = resp
            .headers()
            .get("X-Auth-Token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let answer = self
            .finish(&Method::POST, &sessions_path, status, resp, attempts)
            .await?;
        match token {
            Some(t) => Ok(SessionState::Token(t)),
            None if auto => {
                tracing::debug!(bmc = %self.address(), status = answer.status, "Redfish session created without a token; using basic auth");
                Ok(SessionState::Basic)
            }
            None => Err(bmc(format!(
                "Redfish BMC at {} created a session but returned no X-Auth-Token",
                self.address()
            ))),
        }
    }

    /// Where sessions are created, from the (unauthenticated) service root.
    async fn sessions_path(&self) -> Result<Option<String>, DriverError> {
        let url = self.url("/redfish/v1/")?;
        let (status, resp, attempts) = self
            .send_with_retries(&Method::GET, &url, None, &SessionState::Basic)
            .await?;
        let root = self
            .finish(&Method::GET, "/redfish/v1/", status, resp, attempts)
            .await?;
        let link = root.body["Links"]["Sessions"]["@odata.id"]
            .as_str()
            .map(str::to_string);
        if link.is_some() {
            return Ok(link);
        }
        Ok(root.body["SessionService"]["@odata.id"]
            .as_str()
            .map(|s| format!("{}/Sessions", s.trim_end_matches('/'))))
    }
}

fn is_retryable_status(method: &Method, s: StatusCode) -> bool {
    if *method == Method::GET {
        s.is_server_error() && s != StatusCode::NOT_IMPLEMENTED
    } else {
        s == StatusCode::SERVICE_UNAVAILABLE
    }
}

/// Transport failures worth another attempt. A TLS failure never heals by itself. A GET
/// changes nothing, so a dropped connection or a timed-out answer (a BMC that hiccups or
/// is briefly overloaded) is retried; anything else only when the connection never opened
/// (refused, or the connect timed out), since a request that was sent may have been applied.
fn is_retryable_error(method: &Method, e: &reqwest::Error) -> bool {
    if is_tls_error(e) {
        return false;
    }
    *method == Method::GET || e.is_connect()
}

/// ` (after N attempts)` when there was more than one.
fn tries(attempts: u32) -> String {
    if attempts > 1 {
        format!(" (after {attempts} attempts)")
    } else {
        String::new()
    }
}

/// Whether the failure happened in the TLS layer (a handshake with a plain-HTTP port, an
/// untrusted or mismatched certificate).
fn is_tls_error(e: &reqwest::Error) -> bool {
    let chain = error_chain(e).to_ascii_lowercase();
    [
        "certificate",
        "tls",
        "handshake",
        "invalidcontenttype",
        "corrupt message",
    ]
    .iter()
    .any(|k| chain.contains(k))
}

/// An error and its causes, most specific last, without repeats.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(c) = cur {
        let s = c.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
        cur = c.source();
    }
    parts.join(": ")
}

/// The messages of a Redfish error body: `error.@Message.ExtendedInfo[].Message`, else
/// `error.message`.
fn error_messages(body: &Value) -> Vec<String> {
    let err = &body["error"];
    let mut out: Vec<String> = err["@Message.ExtendedInfo"]
        .as_array()
        .into_iter()
        .chain(body["@Message.ExtendedInfo"].as_array())
        .flatten()
        .filter_map(|m| {
            let text = m["Message"].as_str()?;
            let resolution = m["Resolution"].as_str().filter(|r| !r.is_empty());
            Some(match resolution {
                Some(r) => format!("{text} ({r})"),
                None => text.to_string(),
            })
        })
        .collect();
    if out.is_empty() {
        if let Some(m) = err["message"].as_str() {
            out.push(m.to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extended_info_messages_are_extracted() {
        let body = json!({"error": {"code": "Base.1.0.GeneralError", "message": "general",
        "@Message.ExtendedInfo": [
            {"MessageId": "Base.1.8.PropertyValueNotInList", "Message": "The value Foo for ProcTurbo is not in the list", "Resolution": "Choose a listed value."},
            {"MessageId": "x", "Message": "Second"}
        ]}});
        assert_eq!(
            error_messages(&body),
            vec![
                "The value Foo for ProcTurbo is not in the list (Choose a listed value.)",
                "Second"
            ]
        );
        let sushy = json!({"error": {"message": "Fake system x was not found",
            "@Message.ExtendedInfo": [{"MessageId": "Base.1.0.GeneralError"}]}});
        assert_eq!(error_messages(&sushy), vec!["Fake system x was not found"]);
        assert!(error_messages(&Value::Null).is_empty());
    }

    #[test]
    fn retry_policy() {
        let (get, post) = (Method::GET, Method::POST);
        assert!(is_retryable_status(&get, StatusCode::SERVICE_UNAVAILABLE));
        assert!(is_retryable_status(&get, StatusCode::INTERNAL_SERVER_ERROR));
        assert!(!is_retryable_status(&get, StatusCode::NOT_IMPLEMENTED));
        assert!(!is_retryable_status(&get, StatusCode::BAD_REQUEST));
        assert!(is_retryable_status(&post, StatusCode::SERVICE_UNAVAILABLE));
        assert!(!is_retryable_status(
            &post,
            StatusCode::INTERNAL_SERVER_ERROR
        ));
    }
}
