//! Putting rivetd together: open the store, recover, start the periodic scan, serve.

use crate::api::{self, AppState};
use crate::conductor::Conductor;
use crate::config::Config;
use anyhow::Context;
use std::net::SocketAddr;
use std::sync::Arc;

/// Check the listen address against the auth mode: `--no-auth` only on loopback.
pub fn check_listen(config: &Config) -> anyhow::Result<SocketAddr> {
    let addr: SocketAddr = config
        .listen
        .parse()
        .with_context(|| format!("listen address {:?} is not ADDR:PORT", config.listen))?;
    if config.no_auth && !addr.ip().is_loopback() {
        anyhow::bail!(
            "--no-auth is accepted only on a loopback address, not {addr}; configure [auth] tokens instead"
        );
    }
    if !config.no_auth && config.auth.tokens.is_empty() && config.auth.users.is_empty() {
        anyhow::bail!(
            "no admin credentials configured: add [auth] tokens/users to the config (hash with `rivetd hash-secret`), or run with --no-auth on a loopback address"
        );
    }
    Ok(addr)
}

/// Build the conductor and the router for `config` (used by main and by tests).
pub async fn build(config: Config) -> anyhow::Result<(Arc<Conductor>, axum::Router)> {
    let store = crate::store::open(&config.db)
        .with_context(|| format!("opening database {}", config.db))?;
    let conductor = Conductor::new(store, config);
    let resumed = conductor.recover().await?;
    if resumed > 0 {
        tracing::warn!(count = resumed, "resumed nodes left in transient states");
    }
    let app = api::router(AppState {
        conductor: conductor.clone(),
    });
    Ok((conductor, app))
}

/// Serve until the listener fails or a shutdown signal arrives.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    let addr = check_listen(&config)?;
    let (conductor, app) = build(config).await?;
    tokio::spawn(conductor.clone().run_periodic());
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    tracing::info!(%addr, conductor = conductor.id(), "rivetd listening");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await
        .context("server failed")
}

/// SIGINT or SIGTERM.
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
    tracing::info!("shutting down");
}
