//! The agent's calls to a stock Ironic, as ironic-python-agent makes them: lookup
//! (`GET /v1/lookup`), heartbeat (`POST /v1/heartbeat/{node}`) and the in-band inspection
//! callback (`POST /v1/continue_inspection`). Ironic's microversion header is sent on each:
//! 1.68 is the lowest that takes `agent_token`, `agent_version` and `agent_verify_ca` in
//! a heartbeat, and every Ironic since Wallaby serves it.

use serde_json::{json, Value};
use std::time::Duration;

/// The microversion the agent speaks.
pub const API_VERSION: &str = "1.68";

/// What a successful lookup gives the agent.
#[derive(Debug, Clone, PartialEq)]
pub struct Lookup {
    /// The node, as Ironic shows it to its ramdisk.
    pub node: Value,
    /// The node's UUID.
    pub uuid: String,
    /// The agent token every command must carry (absent when Ironic had already given one
    /// out, which Ironic does once per boot).
    pub token: Option<String>,
    /// `heartbeat_timeout`: Ironic fails the node when no heartbeat comes for this long.
    pub heartbeat_timeout: Duration,
}

/// Why a call to Ironic failed.
#[derive(Debug, thiserror::Error)]
pub enum IronicError {
    /// Not connected, timed out, TLS…
    #[error("{0}")]
    Transport(String),
    /// Ironic answered with an error status.
    #[error("Ironic answered {status}: {message}")]
    Status {
        /// HTTP status.
        status: u16,
        /// Ironic's faultstring (or the body).
        message: String,
    },
    /// A 2xx whose body is not what Ironic sends.
    #[error("unexpected answer from Ironic: {0}")]
    Body(String),
}

/// Client of one Ironic API.
#[derive(Clone)]
pub struct IronicClient {
    base: String,
    http: reqwest::Client,
}

/// Ironic's error body: `{"error_message": "{\"faultstring\": …}"}` (the inner one a JSON
/// string), or a plain `faultstring`.
fn faultstring(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    if let Some(inner) = v.get("error_message").and_then(Value::as_str) {
        if let Ok(iv) = serde_json::from_str::<Value>(inner) {
            if let Some(f) = iv.get("faultstring").and_then(Value::as_str) {
                return f.to_string();
            }
        }
        return inner.to_string();
    }
    v.get("faultstring")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| body.chars().take(300).collect())
}

impl IronicClient {
    /// A client for `base` (`http://ironic:6385`), trusting `ca_pem` besides the system's
    /// roots when given.
    pub fn new(base: &str, ca_pem: Option<&[u8]>) -> Result<IronicClient, IronicError> {
        let mut b = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .connect_timeout(Duration::from_secs(10));
        if let Some(pem) = ca_pem {
            let cert = reqwest::Certificate::from_pem(pem)
                .map_err(|e| IronicError::Transport(format!("bad CA certificate: {e}")))?;
            b = b.add_root_certificate(cert);
        }
        let http = b
            .build()
            .map_err(|e| IronicError::Transport(e.to_string()))?;
        Ok(IronicClient {
            base: base.trim_end_matches('/').to_string(),
            http,
        })
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<(u16, String), IronicError> {
        self.send_at(req, API_VERSION).await
    }

    async fn send_at(
        &self,
        req: reqwest::RequestBuilder,
        version: &str,
    ) -> Result<(u16, String), IronicError> {
        let resp = req
            .header("X-OpenStack-Ironic-API-Version", version)
            .send()
            .await
            .map_err(|e| IronicError::Transport(e.to_string()))?;
        let status = resp.status().as_u16();
        let body = resp
            .text()
            .await
            .map_err(|e| IronicError::Transport(e.to_string()))?;
        if status >= 400 {
            return Err(IronicError::Status {
                status,
                message: faultstring(&body),
            });
        }
        Ok((status, body))
    }

    /// `GET /v1/lookup?addresses=…&node_uuid=…`.
    pub async fn lookup(
        &self,
        macs: &[String],
        node_uuid: Option<&str>,
    ) -> Result<Lookup, IronicError> {
        let mut q: Vec<(&str, String)> = vec![("addresses", macs.join(","))];
        if let Some(u) = node_uuid {
            q.push(("node_uuid", u.to_string()));
        }
        let (_, body) = self
            .send(self.http.get(format!("{}/v1/lookup", self.base)).query(&q))
            .await?;
        parse_lookup(&body)
    }

    /// `POST /v1/heartbeat/{node}`.
    pub async fn heartbeat(
        &self,
        node: &str,
        callback_url: &str,
        token: Option<&str>,
        agent_version: &str,
        verify_ca: Option<&str>,
    ) -> Result<(), IronicError> {
        let mut body = json!({"callback_url": callback_url, "agent_version": agent_version});
        if let Some(t) = token {
            body["agent_token"] = json!(t);
        }
        if let Some(ca) = verify_ca {
            body["agent_verify_ca"] = json!(ca);
        }
        self.send(
            self.http
                .post(format!("{}/v1/heartbeat/{node}", self.base))
                .json(&body),
        )
        .await
        .map(|_| ())
    }

    /// Post the inventory for in-band inspection to `url` (Ironic's
    /// `/v1/continue_inspection`, or an inspector's `/v1/continue`). Returns Ironic's answer.
    /// Sent at 1.84, where Ironic answers as a lookup does (node and agent token); an
    /// inspector that knows no microversions ignores the header.
    pub async fn continue_inspection(&self, url: &str, data: &Value) -> Result<Value, IronicError> {
        let (_, body) = self.send_at(self.http.post(url).json(data), "1.84").await?;
        Ok(serde_json::from_str(&body).unwrap_or(Value::Null))
    }
}

/// Read a lookup answer: `{"node": {...}, "config": {"agent_token": …, "heartbeat_timeout": …}}`.
pub fn parse_lookup(body: &str) -> Result<Lookup, IronicError> {
    let v: Value =
        serde_json::from_str(body).map_err(|e| IronicError::Body(format!("lookup: {e}")))?;
    let node = v
        .get("node")
        .filter(|n| n.is_object())
        .cloned()
        .ok_or_else(|| IronicError::Body("lookup answer has no node".into()))?;
    let uuid = node
        .get("uuid")
        .and_then(Value::as_str)
        .ok_or_else(|| IronicError::Body("lookup answer's node has no uuid".into()))?
        .to_string();
    let config = v.get("config").cloned().unwrap_or(Value::Null);
    let token = config
        .get("agent_token")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty() && *t != "******")
        .map(str::to_string);
    let heartbeat_timeout = config
        .get("heartbeat_timeout")
        .and_then(Value::as_u64)
        .unwrap_or(300)
        .max(5);
    Ok(Lookup {
        node,
        uuid,
        token,
        heartbeat_timeout: Duration::from_secs(heartbeat_timeout),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_answers() {
        let l = parse_lookup(
            r#"{"node": {"uuid": "u-1", "properties": {}},
                "config": {"agent_token": "tok", "heartbeat_timeout": 30,
                           "agent_token_required": true}}"#,
        )
        .unwrap();
        assert_eq!((l.uuid.as_str(), l.token.as_deref()), ("u-1", Some("tok")));
        assert_eq!(l.heartbeat_timeout, Duration::from_secs(30));
        // A token already handed out is masked by Ironic: the agent has none.
        let l = parse_lookup(r#"{"node": {"uuid": "u"}, "config": {"agent_token": "******"}}"#)
            .unwrap();
        assert_eq!(l.token, None);
        assert!(parse_lookup(r#"{"config": {}}"#).is_err());
        assert!(parse_lookup("nope").is_err());
    }

    #[test]
    fn ironic_error_bodies() {
        assert_eq!(
            faultstring(
                r#"{"error_message": "{\"faultstring\": \"Node not found\", \"debuginfo\": null}"}"#
            ),
            "Node not found"
        );
        assert_eq!(faultstring(r#"{"faultstring": "busy"}"#), "busy");
        assert_eq!(faultstring("plain"), "plain");
    }
}
