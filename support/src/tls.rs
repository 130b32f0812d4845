//! TLS for the API: loading the configured certificate and key, and `rivetd tls init DIR`,
//! which makes a small CA and a server certificate for labs and the demo.

use anyhow::{Context, Result};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;

/// A rustls server configuration from PEM files.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<tokio_rustls::rustls::ServerConfig>> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("cannot read certificate {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("bad PEM in {}", cert.display()))?;
    if certs.is_empty() {
        anyhow::bail!("{} holds no certificate", cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("cannot read private key {}", key.display()))?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("certificate and key do not match")?;
    Ok(Arc::new(config))
}

/// Write `ca.pem`, `ca-key.pem`, `server.pem` and `server-key.pem` into `dir`. The server
/// certificate names localhost, 127.0.0.1, ::1 and every `extra_names` entry (host names or
/// IP addresses). Keys are written mode 0600.
pub fn init(dir: &Path, extra_names: &[String]) -> Result<()> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;

    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "Rivet lab CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate()?;
    let ca = ca_params.self_signed(&ca_key)?;

    let mut names = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    names.extend(extra_names.iter().cloned());
    let mut params = CertificateParams::new(names)?;
    params.distinguished_name.push(DnType::CommonName, "rivetd");
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &ca, &ca_key)?;

    write(dir, "ca.pem", &ca.pem(), 0o644)?;
    write(dir, "ca-key.pem", &ca_key.serialize_pem(), 0o600)?;
    write(dir, "server.pem", &cert.pem(), 0o644)?;
    write(dir, "server-key.pem", &key.serialize_pem(), 0o600)?;
    Ok(())
}

fn write(dir: &Path, name: &str, text: &str, mode: u32) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(name);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}
