//! `rivet node console-log NODE [--tail BYTES] [--follow]`: the captured console, raw bytes
//! to stdout.
//!
//! `--follow` reads the WebSocket rather than polling the log: the log endpoint takes only
//! `tail=` (no offset, and the capture drops its older half when full, so an offset would
//! not stay valid), and polling a tail cannot tell new bytes from old ones that repeat. The
//! socket is opened, and rivetd's `hello` (sent once this viewer is subscribed) read, *before*
//! the tail is read, so nothing printed in between is missed; a chunk printed in that instant
//! may show twice. It never types and never takes the pen.

use super::write_out;
use super::ws::{self, Socket};
use crate::client::{seg, Client};
use anyhow::{bail, Context, Result};
use clap::Args;
use futures_util::StreamExt;
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

/// `rivet node console-log NODE`.
#[derive(Debug, Args)]
pub struct LogArgs {
    /// Node UUID or name.
    pub node: String,
    /// Only the newest BYTES bytes (default: the whole capture).
    #[arg(long, value_name = "BYTES")]
    pub tail: Option<u64>,
    /// Keep printing what the console prints, until interrupted or the console is disabled.
    #[arg(long, short = 'f')]
    pub follow: bool,
}

/// Print the log, then (with `--follow`) the live console.
pub async fn run_log(args: LogArgs, client: &Client) -> Result<()> {
    if args.tail == Some(0) {
        bail!("--tail must be a positive number of bytes");
    }
    // Subscribe first (see the module doc): rivetd sends `hello` once this viewer receives
    // the console, so the log read after it misses nothing.
    let live = if args.follow {
        let mut socket = ws::connect(client, &args.node).await?;
        wait_hello(&mut socket).await?;
        Some(socket)
    } else {
        None
    };
    let query: Vec<(&str, String)> = args
        .tail
        .map(|t| vec![("tail", t.to_string())])
        .unwrap_or_default();
    let bytes = client
        .get_bytes(
            &format!("/v1/nodes/{}/console/log", seg(&args.node)),
            &query,
        )
        .await?;
    if !write_out(&bytes) {
        return Ok(());
    }
    let Some(mut live) = live else {
        return Ok(());
    };
    while let Some(msg) = live.next().await {
        match msg? {
            Message::Binary(b) if !write_out(&b) => return Ok(()),
            Message::Text(t) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap_or(Value::Null);
                if v.get("event").and_then(Value::as_str) == Some("session") {
                    let state = v.get("state").and_then(Value::as_str).unwrap_or("?");
                    eprintln!("[rivet: session {state}]");
                }
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    eprintln!("[rivet: the console of {} closed]", args.node);
    Ok(())
}

/// Read until rivetd's `hello` (its first frame).
async fn wait_hello(socket: &mut Socket) -> Result<()> {
    loop {
        let msg = socket
            .next()
            .await
            .context("rivetd closed the console before it started")??;
        if let Message::Text(t) = msg {
            let v: Value = serde_json::from_str(t.as_str()).unwrap_or(Value::Null);
            if v.get("event").and_then(Value::as_str) == Some("hello") {
                return Ok(());
            }
        }
    }
}
