//! `rivet node console NODE` (attach to the live console over rivetd's WebSocket) and
//! `rivet node console-log NODE` (the captured log). The protocol is docs/console.md's:
//! binary frames are bytes both ways, text frames are JSON events (server) and commands
//! (client). Status lines (who holds the pen, a lost session) go to stderr, console bytes to
//! stdout, untouched.

mod escape;
mod log;
mod term;
mod ws;

use anyhow::Result;
use clap::Args;
use escape::{Action, Escape};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::io::{Read, Write};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

use crate::client::Client;

pub use log::{run_log, LogArgs};

/// `rivet node console NODE`.
#[derive(Debug, Args)]
pub struct ConsoleArgs {
    /// Node UUID or name.
    pub node: String,
    /// Watch only: never type, never take the pen.
    #[arg(long)]
    pub read_only: bool,
}

/// Attach until `~.`, the end of stdin, the console closing, or SIGTERM/SIGHUP/SIGINT.
pub async fn run(args: ConsoleArgs, client: &Client) -> Result<()> {
    let socket = ws::connect(client, &args.node).await?;
    let (mut tx, mut rx) = socket.split();
    // Raw mode only once connected: a refused connection leaves the terminal as it was.
    let raw = term::RawMode::enter()?;
    let status = Status { raw: raw.is_some() };
    let mut keys = stdin_reader();
    let mut esc = Escape::new();
    let mut told_read_only = false;
    let mut term_sig = signal(SignalKind::terminate())?;
    let mut hup_sig = signal(SignalKind::hangup())?;
    // In raw mode ^C is a byte for the node; from a pipe it still raises SIGINT.
    let mut int_sig = signal(SignalKind::interrupt())?;
    let outcome: Result<()> = loop {
        tokio::select! {
            msg = rx.next() => match msg {
                None | Some(Ok(Message::Close(_))) => {
                    status.line("console closed by rivetd");
                    break Ok(());
                }
                Some(Err(e)) => {
                    status.line("connection to rivetd lost");
                    break Err(e.into());
                }
                Some(Ok(Message::Binary(b))) if !write_out(&b) => break Ok(()),
                Some(Ok(Message::Text(t))) => status.event(t.as_str(), args.read_only),
                Some(Ok(_)) => {}
            },
            typed = keys.recv() => {
                let Some(typed) = typed else {
                    // End of stdin (a pipe ran out, or the terminal is gone): leave.
                    break Ok(());
                };
                let mut leave = false;
                for act in esc.feed(&typed) {
                    let sent = match act {
                        Action::Leave => { leave = true; break; }
                        Action::Help => { status.line(escape::HELP); Ok(()) }
                        Action::Send(_) | Action::TakeOver if args.read_only => {
                            if !told_read_only {
                                told_read_only = true;
                                status.line("--read-only: keystrokes are not sent; ~. leaves");
                            }
                            Ok(())
                        }
                        Action::Send(b) => tx.send(Message::Binary(b.into())).await,
                        Action::TakeOver => {
                            tx.send(Message::Text(json!({"takeover": true}).to_string().into())).await
                        }
                    };
                    if let Err(e) = sent {
                        status.line("connection to rivetd lost");
                        return Err(e.into());
                    }
                }
                if leave {
                    break Ok(());
                }
            }
            _ = term_sig.recv() => break Err(anyhow::anyhow!("terminated (SIGTERM)")),
            _ = hup_sig.recv() => break Err(anyhow::anyhow!("hung up (SIGHUP)")),
            _ = int_sig.recv() => break Err(anyhow::anyhow!("interrupted (SIGINT)")),
        }
    };
    // Best effort: rivetd notices a dropped connection anyway.
    let _ = tx.send(Message::Close(None)).await;
    drop(raw);
    if outcome.is_ok() {
        eprintln!("[rivet: left the console of {}]", args.node);
    }
    outcome
}

/// Write console bytes to stdout; false when stdout is gone (a closed pipe).
fn write_out(bytes: &[u8]) -> bool {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes).and_then(|()| out.flush()).is_ok()
}

/// Stdin read on a thread of its own: a blocking read cannot be cancelled, and tokio's stdin
/// (a blocking-pool read) would hold the runtime's shutdown until the next keystroke.
/// `None` on the channel is the end of stdin.
fn stdin_reader() -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel(16);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buf = [0u8; 1024];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}

/// Status lines on stderr; in raw mode they need their own carriage returns.
struct Status {
    raw: bool,
}

impl Status {
    fn line(&self, text: &str) {
        let (pre, post) = if self.raw {
            ("\r\n", "\r\n")
        } else {
            ("", "\n")
        };
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "{pre}[rivet: {text}]{post}");
        let _ = err.flush();
    }

    /// One JSON event from rivetd (docs/console.md); unknown ones are ignored.
    fn event(&self, text: &str, read_only: bool) {
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            return;
        };
        let holder = |v: &Value| match v.get("holder").and_then(Value::as_str) {
            Some(h) => format!("{h} holds the pen"),
            None => "the pen is free".to_string(),
        };
        let str_of = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
        match v.get("event").and_then(Value::as_str) {
            Some("hello") => {
                let can_write = v.get("can_write") == Some(&Value::Bool(true));
                let mode = if read_only || !can_write {
                    "read-only"
                } else {
                    "you may type"
                };
                self.line(&format!(
                    "connected, {mode}; {}; ~. leaves, ~? for help",
                    holder(&v)
                ));
            }
            Some("pen") => self.line(&holder(&v)),
            Some("session") => match str_of("state").as_str() {
                "lost" => self.line("session lost; rivetd re-opens it"),
                "up" => self.line("session up"),
                other => self.line(&format!("session {other}")),
            },
            Some("refused") => {
                self.line(&format!("not sent: {}; ~t takes the pen", str_of("reason")))
            }
            Some("lagged") => self.line(&format!(
                "fell behind, {} chunks skipped (rivet node console-log has them)",
                v.get("skipped").and_then(Value::as_u64).unwrap_or(0)
            )),
            Some("error") => self.line(&str_of("reason")),
            _ => {}
        }
    }
}
