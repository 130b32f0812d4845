//! Dialling `GET /v1/nodes/{node}/console/ws` from the CLI: `ws://` for an http rivetd,
//! `wss://` (rustls with the webpki roots reqwest trusts, plus `RIVET_CA`) for an https one,
//! with the same bearer token and version header as every other request. The token goes in
//! a header, never in the URL, so it is in no log.

use crate::client::{self, seg, Client};
use anyhow::{anyhow, bail, Context, Result};
use reqwest::{StatusCode, Url};
use rivet_protocol::api::VERSION_HEADER;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::rustls::{self, pki_types::pem::PemObject, pki_types::CertificateDer};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::WebSocketStream;

/// A TCP or TLS stream under the WebSocket.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// The console's WebSocket.
pub type Socket = WebSocketStream<Box<dyn Io>>;

/// Open the node's console WebSocket.
pub async fn connect(client: &Client, node: &str) -> Result<Socket> {
    let base = Url::parse(client.base()).context("rivetd URL")?;
    let tls = match base.scheme() {
        "http" => false,
        "https" => true,
        other => bail!("rivetd URL scheme {other:?}: the console needs http or https"),
    };
    let host = base
        .host_str()
        .context("rivetd URL has no host")?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = base
        .port_or_known_default()
        .context("rivetd URL has no port")?;
    let mut ws_url = base.clone();
    // http → ws and https → wss: both special schemes, so the url crate allows the change.
    ws_url
        .set_scheme(if tls { "wss" } else { "ws" })
        .map_err(|()| anyhow!("cannot turn {base} into a WebSocket URL"))?;
    ws_url.set_path(&format!(
        "{}/v1/nodes/{}/console/ws",
        base.path().trim_end_matches('/'),
        seg(node)
    ));
    let mut req = ws_url.as_str().into_client_request()?;
    req.headers_mut()
        .insert(VERSION_HEADER, HeaderValue::from_static("latest"));
    if let Some(t) = client.token() {
        let mut v = HeaderValue::from_str(&format!("Bearer {t}"))
            .context("RIVET_TOKEN is not a valid header value")?;
        v.set_sensitive(true);
        req.headers_mut().insert("authorization", v);
    }
    let tcp = tokio::time::timeout(
        Duration::from_secs(10),
        TcpStream::connect((host.as_str(), port)),
    )
    .await
    .map_err(|_| anyhow!("cannot reach rivetd at {}: timed out", client.base()))?
    .map_err(|e| {
        anyhow!(
            "cannot reach rivetd at {}: {e}; is it running? (set RIVET_URL)",
            client.base()
        )
    })?;
    // Keystrokes are tiny: send each at once.
    let _ = tcp.set_nodelay(true);
    let io: Box<dyn Io> = if tls {
        let connector = tokio_rustls::TlsConnector::from(Arc::new(tls_config()?));
        let name = rustls::pki_types::ServerName::try_from(host.clone())
            .map_err(|e| anyhow!("{host} is not a TLS server name: {e}"))?;
        Box::new(
            connector
                .connect(name, tcp)
                .await
                .with_context(|| format!("TLS with {}", client.base()))?,
        )
    } else {
        Box::new(tcp)
    };
    match tokio_tungstenite::client_async(req, io).await {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            let status = StatusCode::from_u16(resp.status().as_u16())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let body = String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default());
            Err(anyhow!(client::ClientError::Http {
                status,
                message: client::error_message(status, &body),
            }))
        }
        Err(e) => Err(anyhow!("console WebSocket of node {node}: {e}")),
    }
}

/// The roots reqwest's `rustls-tls` trusts (webpki-roots) plus `RIVET_CA`.
fn tls_config() -> Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some((path, pem)) = client::ca_pem()? {
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert =
                cert.map_err(|e| anyhow!("RIVET_CA {path} is not a PEM certificate: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| anyhow!("RIVET_CA {path}: {e}"))?;
        }
    }
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .context("TLS versions")?
    .with_root_certificates(roots)
    .with_no_client_auth())
}
