//! IPA's REST API on the ramdisk, which Ironic calls back on: `POST /v1/commands/`
//! (`?wait=true|false&agent_token=…`), `GET /v1/commands/`, `GET /v1/commands/{id}`,
//! `GET /v1/status`. HTTP/1.1 on hyper, over TLS by default as IPA's automatic TLS does: a
//! self-signed certificate for the callback address is made at start ([`AutoTls`]) and sent
//! to Ironic in every heartbeat (`agent_verify_ca`), and Ironic (whose `[agent] require_tls`
//! is on by default) verifies the agent with it.
//!
//! This is the one inbound port the agent ever opens, and only in IPA mode. Every command
//! request must carry the agent token Ironic gave at lookup; without one, or with another,
//! the answer is IPA's 401 and nothing runs.

use super::Shared;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::sync::Arc;
use tokio::net::TcpListener;

/// Largest request body taken (Ironic's biggest is a configdrive inside a deploy step).
const MAX_BODY: usize = 64 << 20;

fn reply(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

/// IPA's error body.
pub fn fault(status: StatusCode, kind: &str, message: &str) -> Response<Full<Bytes>> {
    reply(
        status,
        &json!({"type": kind, "code": status.as_u16(), "message": message,
                "details": message, "faultstring": message}),
    )
}

fn query(req: &Request<Incoming>) -> Map<String, Value> {
    let mut m = Map::new();
    for pair in req.uri().query().unwrap_or_default().split('&') {
        if let Some((k, v)) = pair.split_once('=') {
            m.insert(k.to_string(), json!(percent_decode(v)));
        } else if !pair.is_empty() {
            m.insert(pair.to_string(), json!(""));
        }
    }
    m
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3])
                    .ok()
                    .filter(|h| h.bytes().all(|c| c.is_ascii_hexdigit()))
                    .unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let q = query(&req);
    let path = req.uri().path().trim_end_matches('/').to_string();
    let method = req.method().clone();
    match (method, path.as_str()) {
        (Method::GET, "") => reply(
            StatusCode::OK,
            &json!({"name": "rivet-agent", "versions": [{"id": "v1"}],
                    "default_version": {"id": "v1"}}),
        ),
        (Method::GET, "/v1/status") => reply(StatusCode::OK, &shared.status()),
        (m, p) if p.starts_with("/v1/commands") => {
            if !shared.token_ok(q.get("agent_token").and_then(Value::as_str)) {
                return fault(
                    StatusCode::UNAUTHORIZED,
                    "InvalidCommandError",
                    "Invalid or missing agent token received.",
                );
            }
            match (m, p) {
                (Method::GET, "/v1/commands") => {
                    reply(StatusCode::OK, &json!({"commands": shared.list()}))
                }
                (Method::GET, p) => {
                    let id = p.trim_start_matches("/v1/commands/");
                    match shared.get(id) {
                        Some(c) => reply(StatusCode::OK, &c),
                        None => fault(
                            StatusCode::NOT_FOUND,
                            "RequestedObjectNotFoundError",
                            &format!("Command not found: {id}"),
                        ),
                    }
                }
                (Method::POST, "/v1/commands") => {
                    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
                        Ok(b) => b.to_bytes(),
                        Err(e) => {
                            return fault(
                                StatusCode::BAD_REQUEST,
                                "InvalidContentError",
                                &format!("cannot read the request body: {e}"),
                            )
                        }
                    };
                    let Ok(Value::Object(cmd)) = serde_json::from_slice::<Value>(&body) else {
                        return fault(
                            StatusCode::BAD_REQUEST,
                            "InvalidContentError",
                            "Invalid command: the body must be a JSON object {\"name\", \"params\"}",
                        );
                    };
                    let Some(name) = cmd.get("name").and_then(Value::as_str) else {
                        return fault(
                            StatusCode::BAD_REQUEST,
                            "InvalidContentError",
                            "Invalid command: missing \"name\"",
                        );
                    };
                    let params = cmd
                        .get("params")
                        .and_then(Value::as_object)
                        .cloned()
                        .unwrap_or_default();
                    let wait = q.get("wait").and_then(Value::as_str) == Some("true");
                    match shared.run(name, params, wait).await {
                        Ok(v) => reply(StatusCode::OK, &v),
                        Err((status, kind, msg)) => fault(status, kind, &msg),
                    }
                }
                _ => fault(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "InvalidCommandError",
                    "method not allowed",
                ),
            }
        }
        _ => fault(StatusCode::NOT_FOUND, "NotFound", "no such resource"),
    }
}

/// A self-signed certificate for the agent's callback address, and the acceptor using it.
pub struct AutoTls {
    /// The certificate, PEM: what the heartbeat sends as `agent_verify_ca`.
    pub cert_pem: String,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl AutoTls {
    /// A fresh key and certificate naming `host` (an IP address or a DNS name) as its
    /// subject and only subject alternative name; valid from 2020 to 2050, so a ramdisk whose
    /// clock is wrong (no RTC battery, no NTP yet) still presents a valid certificate.
    pub fn new(host: &str) -> Result<AutoTls, String> {
        use rcgen::{CertificateParams, DnType, KeyPair};
        let mut params = CertificateParams::new(vec![host.to_string()])
            .map_err(|e| format!("certificate for {host}: {e}"))?;
        params
            .distinguished_name
            .push(DnType::CommonName, host.to_string());
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2050, 1, 1);
        let key = KeyPair::generate().map_err(|e| format!("TLS key: {e}"))?;
        let cert = params
            .self_signed(&key)
            .map_err(|e| format!("self-signed certificate: {e}"))?;
        let cert_pem = cert.pem();
        let der = rustls_pki_types::CertificateDer::from(cert.der().to_vec());
        let key_der = rustls_pki_types::PrivateKeyDer::try_from(key.serialize_der())
            .map_err(|e| format!("TLS key: {e}"))?;
        let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(Arc::new(
            tokio_rustls::rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(vec![der], key_der)
        .map_err(|e| format!("TLS: {e}"))?;
        Ok(AutoTls {
            cert_pem,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        })
    }
}

/// Serve IPA's API on `listener` until `shutdown` resolves, over `tls` when given.
/// Connections run in a JoinSet owned here, so none outlives the server.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    tls: Option<Arc<AutoTls>>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(done) = conns.join_next(), if !conns.is_empty() => {
                if let Err(e) = done {
                    tracing::warn!(error = %e, "IPA API connection task failed");
                }
            }
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "IPA API: accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let shared = shared.clone();
                let tls = tls.clone();
                conns.spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let shared = shared.clone();
                        async move { Ok::<_, Infallible>(handle(shared, req).await) }
                    });
                    let http = hyper::server::conn::http1::Builder::new();
                    let served = match tls {
                        Some(t) => match t.acceptor.accept(stream).await {
                            Ok(s) => http.serve_connection(hyper_util::rt::TokioIo::new(s), svc).await,
                            Err(e) => {
                                tracing::warn!(%peer, error = %e, "IPA API: TLS handshake failed");
                                return;
                            }
                        },
                        None => http.serve_connection(hyper_util::rt::TokioIo::new(stream), svc).await,
                    };
                    if let Err(e) = served {
                        tracing::debug!(%peer, error = %e, "IPA API connection ended");
                    }
                });
            }
        }
    }
    conns.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_query_values() {
        assert_eq!(percent_decode("a%2Fb+c"), "a/b c");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}
