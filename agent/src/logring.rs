//! The agent's log: stderr plus an in-memory ring of the last lines.
//!
//! A failed command carries the tail of the agent's own log (`log_tail`) so the operator sees
//! why without a console on the machine. [`LogRing`] is a `tracing_subscriber` `MakeWriter`
//! that tees every formatted line to stderr and into a bounded ring.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Mutex};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::MakeWriter;

/// Default number of lines kept.
pub const DEFAULT_LINES: usize = 50;

/// Bounded ring of recent log lines; cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct LogRing {
    inner: Arc<Mutex<Ring>>,
    to_stderr: bool,
}

#[derive(Debug)]
struct Ring {
    lines: VecDeque<String>,
    capacity: usize,
    /// Bytes of a line not yet terminated by `\n`.
    partial: Vec<u8>,
}

impl LogRing {
    /// A ring of `capacity` lines that also writes to stderr when `to_stderr`.
    pub fn new(capacity: usize, to_stderr: bool) -> Self {
        LogRing {
            inner: Arc::new(Mutex::new(Ring {
                lines: VecDeque::with_capacity(capacity),
                capacity: capacity.max(1),
                partial: Vec::new(),
            })),
            to_stderr,
        }
    }

    /// The last lines, oldest first, joined with `\n`.
    pub fn tail(&self) -> String {
        match self.inner.lock() {
            Ok(r) => r.lines.iter().cloned().collect::<Vec<_>>().join("\n"),
            Err(_) => String::new(),
        }
    }

    fn push_bytes(&self, buf: &[u8]) {
        let Ok(mut r) = self.inner.lock() else {
            return;
        };
        for &b in buf {
            if b == b'\n' {
                let line = String::from_utf8_lossy(&r.partial).into_owned();
                r.partial.clear();
                if r.lines.len() == r.capacity {
                    r.lines.pop_front();
                }
                r.lines.push_back(line);
            } else if r.partial.len() < 8192 {
                // Cap a runaway line rather than grow without bound.
                r.partial.push(b);
            }
        }
    }
}

/// Writer handed out per log event.
#[derive(Debug)]
pub struct RingWriter {
    ring: LogRing,
}

impl Write for RingWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.ring.to_stderr {
            // A log line that cannot reach stderr (closed console) must still reach the ring.
            let _ = std::io::stderr().write_all(buf);
        }
        self.ring.push_bytes(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.ring.to_stderr {
            let _ = std::io::stderr().flush();
        }
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for LogRing {
    type Writer = RingWriter;

    fn make_writer(&'a self) -> Self::Writer {
        RingWriter { ring: self.clone() }
    }
}

/// `filter` as `target=level` directives (`info`, `rivet_agent=debug,hyper=warn`), the
/// `RUST_LOG` syntax without span and field matches: tracing-subscriber's `Targets`, not its
/// `EnvFilter`, whose regex engine would be most of the agent's logging code. Empty
/// directives are skipped; an invalid one means `info`.
fn targets(filter: &str) -> Targets {
    let directives: Vec<&str> = filter.split(',').filter(|s| !s.is_empty()).collect();
    if directives.is_empty() {
        return Targets::new();
    }
    directives
        .join(",")
        .parse()
        .unwrap_or_else(|_| Targets::new().with_default(LevelFilter::INFO))
}

/// Install the global subscriber: `filter` as [`targets`]; human lines into `ring` (and
/// stderr when it tees), or with `json` JSON lines on stderr and human lines in the ring. The
/// ring stays human-readable either way: its tail is read by people (the node's agent logs,
/// `rivet node logs`), while stderr is what a log collector parses. Safe to call twice (the
/// second call is a no-op).
pub fn init(filter: &str, ring: &LogRing, json: bool) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = targets(filter);
    if json {
        let quiet = LogRing {
            inner: ring.inner.clone(),
            to_stderr: false,
        };
        let _ = tracing_subscriber::registry()
            .with(filter)
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_writer(quiet),
            )
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(std::io::stderr),
            )
            .try_init();
    } else {
        let _ = tracing_subscriber::registry()
            .with(filter)
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_writer(ring.clone()),
            )
            .try_init();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_only_the_last_lines() {
        let ring = LogRing::new(3, false);
        let mut w = ring.make_writer();
        for i in 0..5 {
            writeln!(w, "line {i}").unwrap();
        }
        assert_eq!(ring.tail(), "line 2\nline 3\nline 4");
    }

    #[test]
    fn joins_partial_writes() {
        let ring = LogRing::new(10, false);
        let mut w = ring.make_writer();
        w.write_all(b"hel").unwrap();
        w.write_all(b"lo\nwor").unwrap();
        assert_eq!(ring.tail(), "hello");
        w.write_all(b"ld\n\xff\n").unwrap();
        assert_eq!(ring.tail(), "hello\nworld\n\u{fffd}");
    }

    #[test]
    fn filter_directives_read_as_env_filter_read_them() {
        use tracing::Level;
        let f = targets("debug");
        assert!(f.would_enable("hyper_util::client", &Level::DEBUG));
        assert!(!f.would_enable("rivet_agent", &Level::TRACE));
        let f = targets("WARN,rivet_agent=debug,,rivet_agent::fetch=off");
        assert!(f.would_enable("rivet_agent::heartbeat", &Level::DEBUG));
        assert!(!f.would_enable("rivet_agent::fetch", &Level::ERROR));
        assert!(!f.would_enable("rustls", &Level::INFO));
        assert!(f.would_enable("rustls", &Level::WARN));
        // A bare target means all its levels; nothing else is enabled.
        let f = targets("rivet_hardware_managers");
        assert!(f.would_enable("rivet_hardware_managers::deploy", &Level::TRACE));
        assert!(!f.would_enable("rivet_agent", &Level::ERROR));
        // Invalid: info. Empty: nothing (EnvFilter::try_new("") enables nothing either).
        let f = targets("rivet_agent=loud");
        assert!(f.would_enable("anything", &Level::INFO));
        assert!(!f.would_enable("anything", &Level::DEBUG));
        assert!(!targets("").would_enable("anything", &Level::ERROR));
        assert!(!targets(",").would_enable("anything", &Level::ERROR));
    }
}
