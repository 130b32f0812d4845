//! `rivet node wait`: poll a node until it reaches a provision state, with one live progress
//! line on stderr.
//!
//! On a terminal the line is rewritten in place (`\r`); otherwise a plain line is printed each
//! time the state, target or running step changes, so logs stay readable.

use crate::client::{seg, Client, ClientError};
use crate::output::{self, Output};
use anyhow::{bail, Result};
use clap::Args;
use reqwest::StatusCode;
use rivet_protocol::states::ProvisionState;
use serde_json::Value;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Poll interval.
const POLL: Duration = Duration::from_millis(500);

/// `rivet node wait`.
#[derive(Debug, Args)]
pub struct WaitArgs {
    /// Node UUID or name.
    pub node: String,
    /// Provision state to wait for, e.g. manageable, available, active.
    #[arg(long)]
    pub state: String,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
}

/// What one poll saw, reduced to what the progress line shows.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Snapshot {
    /// provision_state.
    pub state: String,
    /// target_provision_state.
    pub target: Option<String>,
    /// `interface.step` of clean_step, when a step runs.
    pub step: Option<String>,
    /// Step progress text (`3/10 (30%)`, a message).
    pub progress: Option<String>,
    /// last_error.
    pub last_error: Option<String>,
}

fn non_empty_str(v: Option<&Value>) -> Option<String> {
    v.and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// Human size for byte counts, plain numbers otherwise.
fn amount(n: u64, bytes: bool) -> String {
    if !bytes {
        return n.to_string();
    }
    const UNITS: &[&str] = &["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Render `clean_step.progress`: `{done, total, message}` or a bare percentage.
fn progress_text(p: &Value) -> Option<String> {
    match p {
        Value::Object(m) => {
            let done = m.get("done").and_then(Value::as_u64);
            let total = m.get("total").and_then(Value::as_u64).filter(|t| *t > 0);
            let message = non_empty_str(m.get("message"));
            // Erase steps count bytes; show them as sizes when they are big.
            let bytes = total.is_some_and(|t| t >= 1 << 20);
            // An image write reports its rate (bytes/s) too.
            let rate = m
                .get("rate")
                .and_then(Value::as_u64)
                .filter(|r| *r > 0)
                .map(|r| format!(" {}/s", amount(r, true)))
                .unwrap_or_default();
            let counts = match (done, total) {
                (Some(d), Some(t)) => Some(format!(
                    "{}/{} ({:.0}%){rate}",
                    amount(d, bytes),
                    amount(t, bytes),
                    (d as f64 * 100.0 / t as f64).min(100.0)
                )),
                (Some(d), None) if d > 0 => Some(amount(d, false)),
                _ => None,
            };
            match (counts, message) {
                (Some(c), Some(m)) => Some(format!("{c} {m}")),
                (c, m) => c.or(m),
            }
        }
        Value::Number(n) => n.as_f64().map(|f| {
            let pct = if f <= 1.0 { f * 100.0 } else { f };
            format!("{pct:.0}%")
        }),
        Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_string()),
        _ => None,
    }
}

impl Snapshot {
    /// Reduce a node document.
    pub fn of(node: &Value) -> Snapshot {
        // The running step: a clean step, or a deploy step (write_image's progress).
        let non_empty = |k: &str| {
            node.get(k)
                .filter(|s| s.as_object().is_some_and(|m| !m.is_empty()))
        };
        let clean = non_empty("clean_step").or_else(|| non_empty("deploy_step"));
        let step = clean.and_then(|s| {
            let name = non_empty_str(s.get("step"))?;
            Some(match non_empty_str(s.get("interface")) {
                Some(i) => format!("{i}.{name}"),
                None => name,
            })
        });
        Snapshot {
            state: non_empty_str(node.get("provision_state")).unwrap_or_else(|| "?".into()),
            target: non_empty_str(node.get("target_provision_state")),
            step,
            progress: clean
                .and_then(|s| s.get("progress"))
                .and_then(progress_text),
            last_error: non_empty_str(node.get("last_error")),
        }
    }

    /// The part whose change earns a new line when stderr is not a terminal.
    fn key(&self) -> (&str, Option<&str>, Option<&str>) {
        (&self.state, self.target.as_deref(), self.step.as_deref())
    }

    /// The progress line (without elapsed time).
    pub fn line(&self) -> String {
        let mut s = self.state.clone();
        if let Some(t) = &self.target {
            s.push_str(&format!(" → {t}"));
        }
        if let Some(step) = &self.step {
            s.push_str(&format!("  step {step}"));
            if let Some(p) = &self.progress {
                s.push_str(&format!(" {p}"));
            }
        }
        if let Some(e) = &self.last_error {
            s.push_str(&format!(
                "  last_error: {}",
                output::truncate(&output::cell(&Value::from(e.as_str())), 80)
            ));
        }
        s
    }
}

/// `12.3s`, `4m05s`.
pub fn elapsed(d: Duration) -> String {
    let secs = d.as_secs();
    if secs < 60 {
        format!("{:.1}s", d.as_secs_f64())
    } else if secs < 3600 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{}h{:02}m{:02}s", secs / 3600, (secs / 60) % 60, secs % 60)
    }
}

/// Whether a state is a failure that should end the wait.
pub fn is_failure(state: &str) -> bool {
    state.ends_with(" failed") || state == "error"
}

/// The live line on stderr.
struct Progress {
    tty: bool,
    shown: bool,
    last_key: Option<(String, Option<String>, Option<String>)>,
    /// Terminal width (`COLUMNS`, else 80).
    width: usize,
}

impl Progress {
    fn new() -> Self {
        Progress {
            tty: std::io::stderr().is_terminal(),
            shown: false,
            last_key: None,
            width: std::env::var("COLUMNS")
                .ok()
                .and_then(|c| c.trim().parse().ok())
                .unwrap_or(80),
        }
    }

    fn show(&mut self, node: &str, start: Instant, snap: &Snapshot) {
        let text = format!("[{:>7}] {node}: {}", elapsed(start.elapsed()), snap.line());
        let mut err = std::io::stderr().lock();
        if self.tty {
            // One terminal row, so `\r` can rewrite it; `ESC[K` clears what the last one left.
            let text = output::truncate(&text, self.width.saturating_sub(1).max(20));
            let _ = write!(err, "\r{text}\x1b[K");
            let _ = err.flush();
            self.shown = true;
        } else {
            let (s, t, st) = snap.key();
            let key = (s.to_string(), t.map(str::to_string), st.map(str::to_string));
            if self.last_key.as_ref() != Some(&key) {
                let _ = writeln!(err, "{text}");
                self.last_key = Some(key);
            }
        }
    }

    /// End the live line so the next message starts on a fresh line.
    fn finish(&mut self) {
        if self.tty && self.shown {
            eprintln!();
            self.shown = false;
        }
    }
}

/// Run the wait.
pub async fn run(a: WaitArgs, client: &Client, out: Output) -> Result<()> {
    let want = a.state.trim().to_string();
    if want.parse::<ProvisionState>().is_err() {
        let known: Vec<&str> = ProvisionState::ALL.iter().map(|s| s.as_str()).collect();
        bail!(
            "--state {want:?} is not a provision state; use one of: {}",
            known.join(", ")
        );
    }
    let path = format!("/v1/nodes/{}", seg(&a.node));
    let start = Instant::now();
    let deadline = start + Duration::from_secs(a.timeout);
    let mut progress = Progress::new();
    let mut last: Option<Snapshot> = None;
    // Whether the node was seen doing something (not resting in a stable state).
    let mut saw_transition = false;
    loop {
        match client.get(&path, &[]).await {
            Ok(node) => {
                let snap = Snapshot::of(&node);
                progress.show(&a.node, start, &snap);
                if snap.state == want {
                    progress.finish();
                    if out.json {
                        output::print_json(&node);
                    } else {
                        eprintln!(
                            "node {} reached \"{want}\" after {}",
                            a.node,
                            elapsed(start.elapsed())
                        );
                    }
                    return Ok(());
                }
                let stable = snap
                    .state
                    .parse::<ProvisionState>()
                    .is_ok_and(ProvisionState::is_stable);
                if is_failure(&snap.state) {
                    progress.finish();
                    bail!(
                        "node {} landed in \"{}\" while waiting for \"{want}\"; last_error: {}",
                        a.node,
                        snap.state,
                        snap.last_error.as_deref().unwrap_or("none")
                    );
                }
                // A verb that failed validation sends the node back to a stable state with
                // last_error set (manage → enroll): that is a failure too, once we saw it move.
                if stable && saw_transition && snap.target.is_none() {
                    if let Some(e) = &snap.last_error {
                        progress.finish();
                        bail!(
                            "node {} went back to \"{}\" instead of reaching \"{want}\"; last_error: {e}",
                            a.node,
                            snap.state
                        );
                    }
                }
                if !stable || snap.target.is_some() {
                    saw_transition = true;
                }
                last = Some(snap);
            }
            Err(e @ ClientError::Unreachable { .. }) | Err(e @ ClientError::Transport(_)) => {
                // rivetd restarting: keep trying until the deadline.
                if !progress.tty {
                    eprintln!(
                        "[{:>7}] {}: {e}; retrying",
                        elapsed(start.elapsed()),
                        a.node
                    );
                }
            }
            Err(e) if e.status() == Some(StatusCode::SERVICE_UNAVAILABLE) => {}
            Err(e) => {
                progress.finish();
                return Err(e.into());
            }
        }
        let now = Instant::now();
        if now >= deadline {
            progress.finish();
            let (state, err) = match &last {
                Some(s) => (
                    match &s.target {
                        Some(t) => format!("\"{}\" (target \"{t}\")", s.state),
                        None => format!("\"{}\"", s.state),
                    },
                    s.last_error.clone().unwrap_or_else(|| "none".into()),
                ),
                None => ("unknown (rivetd did not answer)".into(), "none".into()),
            };
            bail!(
                "timed out after {}s waiting for node {} to reach \"{want}\"; it is in {state}; last_error: {err}",
                a.timeout,
                a.node
            );
        }
        tokio::time::sleep(POLL.min(deadline - now)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn snapshot_with_step_progress() {
        let node = json!({
            "provision_state": "clean wait",
            "target_provision_state": "available",
            "clean_step": {"interface": "deploy", "step": "erase_devices",
                           "progress": {"done": 3, "total": 10, "message": "sda"}},
            "last_error": null,
        });
        let s = Snapshot::of(&node);
        assert_eq!(
            s.line(),
            "clean wait → available  step deploy.erase_devices 3/10 (30%) sda"
        );
    }

    #[test]
    fn snapshot_plain() {
        let s = Snapshot::of(
            &json!({"provision_state": "enroll", "target_provision_state": null,
                                      "clean_step": {}, "last_error": "BMC said no"}),
        );
        assert_eq!(s.line(), "enroll  last_error: BMC said no");
        assert_eq!(s.step, None);
    }

    #[test]
    fn progress_forms() {
        let write =
            progress_text(&json!({"done": 1u64 << 30, "total": 2u64 << 30, "rate": 300u64 << 20}));
        assert!(
            write
                .as_deref()
                .is_some_and(|w| w.contains("(50%)") && w.ends_with("/s")),
            "{write:?}"
        );
        let deploying = Snapshot::of(
            &json!({"provision_state": "wait call-back", "clean_step": {},
            "deploy_step": {"interface": "deploy", "step": "write_image", "progress": {"done": 1, "total": 4}}}),
        );
        assert_eq!(deploying.step.as_deref(), Some("deploy.write_image"));
        assert_eq!(progress_text(&json!(0.5)).as_deref(), Some("50%"));
        assert_eq!(progress_text(&json!(40)).as_deref(), Some("40%"));
        assert_eq!(
            progress_text(&json!({"done": 1u64 << 30, "total": 4u64 << 30})).as_deref(),
            Some("1.0 GiB/4.0 GiB (25%)")
        );
        assert_eq!(progress_text(&json!({"done": 0, "total": 0})), None);
    }

    #[test]
    fn failures_and_time() {
        assert!(is_failure("clean failed"));
        assert!(is_failure("error"));
        assert!(!is_failure("clean wait"));
        assert_eq!(elapsed(Duration::from_millis(1500)), "1.5s");
        assert_eq!(elapsed(Duration::from_secs(125)), "2m05s");
    }
}
