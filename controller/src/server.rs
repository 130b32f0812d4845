//! Putting rivetd together: open the store, recover, start the periodic scan, serve.

use crate::api::{self, AppState};
use anyhow::Context;
use rivet_conductor::Conductor;
use rivet_model::config::Config;
use rivet_support::http::serve_connection;
pub use rivet_support::http::PeerAddr;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Check the listen address against the auth mode (`--no-auth` only on loopback) and the
/// settings that cannot be checked key by key when the file is read.
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
    if config.tls_cert.is_some() != config.tls_key.is_some() {
        anyhow::bail!("tls_cert and tls_key go together: set both, or neither for plain HTTP");
    }
    if config.tls_cert.is_none() && !addr.ip().is_loopback() && !config.allow_plain_http {
        anyhow::bail!(
            "refusing plain HTTP on {addr}: agents' tokens and BMC passwords would cross the network in clear. \
             Set tls_cert/tls_key (`rivetd tls init DIR` makes a lab CA), or allow_plain_http = true if you really mean it"
        );
    }
    let c = &config.conductor;
    if c.dead_after_s < 2 * c.heartbeat_interval_s.max(1) {
        anyhow::bail!(
            "[conductor] dead_after_s = {} must be at least twice heartbeat_interval_s = {}: \
             otherwise one late heartbeat declares a live controller dead and its nodes move",
            c.dead_after_s,
            c.heartbeat_interval_s
        );
    }
    config.deploy.check().map_err(anyhow::Error::msg)?;
    config.console.check().map_err(anyhow::Error::msg)?;
    if c.max_concurrent_deploy == 0 {
        anyhow::bail!(
            "[conductor] max_concurrent_deploy must be at least 1 (Ironic's bound; the limit cannot be disabled)"
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
    let (conductor, app, _consoles) = build_with_consoles(config).await?;
    Ok((conductor, app))
}

/// [`build`], and the console hub (for the SSH front door).
pub async fn build_with_consoles(
    config: Config,
) -> anyhow::Result<(
    Arc<Conductor>,
    axum::Router,
    Arc<crate::console::ConsoleHub>,
)> {
    let secrets = rivet_support::secrets::Secrets::from_config(
        &config.secrets,
        &config.db,
        true,
        &rivet_store::sealing::holds_sealed_values,
    )?;
    let store = rivet_store::open_with(&config.db, Arc::new(secrets), &config.store)
        .with_context(|| format!("opening database {}", rivet_store::redact_url(&config.db)))?;
    // A wrong secrets key is an operator's mistake to hear about now, not as every node read
    // failing later: open the first page of nodes (their sealed passwords) once.
    store
        .list_nodes(&rivet_store::NodeQuery {
            limit: 100,
            ..Default::default()
        })
        .await
        .with_context(|| {
            format!(
                "reading the nodes of {} at start-up (is this the secrets key the database was sealed with?)",
                rivet_store::redact_url(&config.db)
            )
        })?;
    let conductor = Conductor::new(store, config);
    // Two live processes under one id would both drive its nodes: refuse before registering.
    conductor.claim_id().await?;
    // Register first, so recovery already knows which nodes are this controller's.
    conductor.refresh_membership(true).await?;
    let others: Vec<String> = conductor
        .ring()
        .members()
        .iter()
        .filter(|m| m.as_str() != conductor.id())
        .cloned()
        .collect();
    if !others.is_empty() && !conductor.store.is_shared() {
        anyhow::bail!(
            "controller(s) {} heartbeat on this SQLite database within the last {} s: SQLite serves one rivetd. \
             Stop the other one (or wait {} s if it was this host under another --conductor-id), \
             or move the fleet to PostgreSQL to run several",
            others.join(", "),
            conductor.config.conductor.dead_after_s,
            conductor.config.conductor.dead_after_s
        );
    }
    // The check above cannot see a second rivetd under this same id on SQLite.
    conductor.lock_sqlite_file().await?;
    // The image cache's index is rebuilt from its directory before any deploy resumes.
    conductor
        .image_cache
        .load()
        .await
        .map_err(anyhow::Error::msg)?;
    let resumed = conductor.recover().await?;
    if resumed > 0 {
        tracing::warn!(count = resumed, "resumed nodes left in transient states");
    }
    let state = AppState::new(conductor.clone());
    let consoles = state.console.clone();
    // Consoles enabled before the restart are opened again (in the background).
    state.console.reopen_enabled().await;
    // The web UI beside the API, on the same listener: its routes are all under /ui/, which
    // the API's router (a fallback service) never answers.
    let app = crate::ui::routes(state.clone())
        .merge(api::router(state))
        .layer(axum::middleware::from_fn(crate::ui::compress::for_pages));
    Ok((conductor, app, consoles))
}

/// Serve until a shutdown signal arrives (then drain requests, let node tasks end and hand
/// the node leases back) or a controller-wide loop stops (then the same, and an error: the
/// process must exit non-zero so that its service manager restarts it).
pub async fn serve(config: Config) -> anyhow::Result<()> {
    let addr = check_listen(&config)?;
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(c), Some(k)) => Some(tokio_rustls::TlsAcceptor::from(
            rivet_support::tls::server_config(c, k)?,
        )),
        _ => None,
    };
    let header_timeout = Duration::from_secs(config.api.header_read_timeout_s.max(1));
    let max_requests = config.api.max_requests_per_connection;
    let admission = rivet_support::http::lean::Admission::new(config.api.max_requests_in_progress);
    let (conductor, app, consoles) = build_with_consoles(config).await?;
    // rivetd's own controller-wide loop, supervised with the conductor's.
    let metrics_listener: rivet_conductor::supervisor::CriticalLoop = (
        "metrics listener",
        Box::pin(crate::metrics_http::serve_listener(conductor.clone())),
    );
    let cache_sweep: rivet_conductor::supervisor::CriticalLoop = (
        "image cache sweep",
        Box::pin(conductor.image_cache.clone().sweep_loop()),
    );
    let mut loops = vec![metrics_listener, cache_sweep];
    if let Some(listen) = conductor.config.console.ssh_listen.clone() {
        loops.push((
            "console SSH front door",
            Box::pin(crate::console::ssh::serve(consoles, listen)),
        ));
    }
    let background = tokio::spawn(conductor.clone().run_background(loops));
    tokio::pin!(background);
    let listener = listen(addr).with_context(|| format!("cannot listen on {addr}"))?;
    tracing::info!(%addr, tls = tls.is_some(), conductor = conductor.id(), "rivetd listening");
    // Under systemd (`Type=notify`) the unit counts as started only now: the store is open,
    // recovery has run and the socket accepts. Without NOTIFY_SOCKET this does nothing.
    notify_systemd(sd_notify::NotifyState::Ready);
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    // Open connections, so that shutdown can let their requests finish.
    let connections = tokio_util::task::TaskTracker::new();
    let stopping = conductor.shutdown.clone();
    loop {
        let (tcp, peer) = tokio::select! {
            // Unconstrained: accepting is cheap, and under tokio's cooperative budget this
            // loop would yield every 128 connections and wait behind every request task;
            // a fleet reconnecting at once then overflowed the kernel's accept queue.
            accepted = tokio::task::unconstrained(listener.accept()) => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: log, breathe, keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut shutdown => {
                notify_systemd(sd_notify::NotifyState::Stopping);
                drop(listener);
                conductor.shutdown.cancel();
                connections.close();
                if tokio::time::timeout(DRAIN, connections.wait()).await.is_err() {
                    tracing::warn!(open = connections.len(), "requests still open after the drain period; closing them");
                }
                conductor.shut_down().await;
                tracing::info!("rivetd stopped");
                return Ok(());
            }
            why = &mut background => {
                let why = why.unwrap_or_else(|e| format!("the supervisor itself failed: {e}"));
                tracing::error!(reason = %why, "a controller-wide loop stopped; rivetd stops taking work and exits");
                drop(listener);
                conductor.shut_down().await;
                anyhow::bail!("rivetd stopped: {why}");
            }
        };
        let app = app.clone();
        let tls = tls.clone();
        let stopping = stopping.clone();
        let admission = admission.clone();
        connections.spawn(async move {
            let _ = tcp.set_nodelay(true);
            match tls {
                // Boxed: the TLS and hyper state is large, and inline it would size every
                // plain connection's task too (10,000 held agent polls).
                Some(acceptor) => {
                    Box::pin(async move {
                        match tokio::time::timeout(header_timeout, acceptor.accept(tcp)).await {
                            Ok(Ok(stream)) => {
                                serve_connection(
                                    stream,
                                    peer,
                                    app,
                                    header_timeout,
                                    max_requests,
                                    stopping,
                                )
                                .await
                            }
                            Ok(Err(e)) => {
                                tracing::debug!(%peer, error = %e, "TLS handshake failed")
                            }
                            Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                        }
                    })
                    .await
                }
                // Plain TCP: the lean server, so that held long polls own no hyper buffers.
                None => {
                    let limits = rivet_support::http::lean::Limits {
                        header_timeout,
                        max_requests,
                        admission,
                    };
                    rivet_support::http::lean::serve(tcp, peer, app, limits, stopping).await
                }
            }
        });
    }
}

/// Tell the service manager about a state change; a failure only costs the message, so it
/// is logged, never fatal.
fn notify_systemd(state: sd_notify::NotifyState<'_>) {
    if let Err(e) = sd_notify::notify(&[state]) {
        tracing::warn!(error = %e, "cannot notify the service manager (NOTIFY_SOCKET)");
    }
}

/// Connections the kernel queues before rivetd accepts them (capped by
/// `net.core.somaxconn`). A whole fleet of agents reconnects at once after a restart or a
/// network blip; with tokio's default of 1,024 the overflow's handshakes were dropped and
/// those agents saw their first request time out (the long-poll bench with 10,000 agents lost
/// hundreds that way).
const LISTEN_BACKLOG: u32 = 8192;

/// A listening socket on `addr` with [`LISTEN_BACKLOG`].
fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// How long shutdown lets open requests finish.
const DRAIN: Duration = Duration::from_secs(10);

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
