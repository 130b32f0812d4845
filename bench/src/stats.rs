//! Latency samples and their percentiles; number formatting for the table.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Nearest-rank percentile of sorted values (`p` in 0..=100).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Milliseconds with one decimal (two below 1 ms).
pub fn ms(d: Duration) -> String {
    let v = d.as_secs_f64() * 1000.0;
    if v < 1.0 {
        format!("{v:.2} ms")
    } else {
        format!("{v:.1} ms")
    }
}

/// MiB with one decimal, from KiB.
pub fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// Latencies of requests that completed while recording was on, shared by many tasks.
#[derive(Default)]
pub struct Recorder {
    on: AtomicBool,
    samples: Mutex<Vec<Duration>>,
    errors: AtomicU64,
}

impl Recorder {
    /// Start a fresh recording.
    pub fn start(&self) {
        if let Ok(mut s) = self.samples.lock() {
            s.clear();
        }
        self.errors.store(0, Ordering::SeqCst);
        self.on.store(true, Ordering::SeqCst);
    }

    /// Stop; the sorted samples and the error count.
    pub fn stop(&self) -> (Vec<Duration>, u64) {
        self.on.store(false, Ordering::SeqCst);
        let mut v = match self.samples.lock() {
            Ok(mut s) => std::mem::take(&mut *s),
            Err(_) => Vec::new(),
        };
        v.sort_unstable();
        (v, self.errors.swap(0, Ordering::SeqCst))
    }

    /// A request finished in `d`.
    pub fn ok(&self, d: Duration) {
        if self.on.load(Ordering::Relaxed) {
            if let Ok(mut s) = self.samples.lock() {
                s.push(d);
            }
        }
    }

    /// A request failed (error status, timeout, connection error).
    pub fn err(&self) {
        if self.on.load(Ordering::Relaxed) {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&v, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&v, 100.0), Duration::from_millis(100));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
    }

    #[test]
    fn records_only_while_on() {
        let r = Recorder::default();
        r.ok(Duration::from_millis(1));
        r.start();
        r.ok(Duration::from_millis(3));
        r.ok(Duration::from_millis(2));
        r.err();
        let (v, e) = r.stop();
        r.ok(Duration::from_millis(9));
        assert_eq!(v, vec![Duration::from_millis(2), Duration::from_millis(3)]);
        assert_eq!(e, 1);
    }
}
