//! Exponential backoff with jitter for lookup and heartbeat retries.
//!
//! Equal jitter: the n-th delay is uniformly drawn from `[d/2, d]` with
//! `d = min(cap, base · 2ⁿ)`, so a fleet rebooting at once spreads out but no agent retries
//! faster than half the nominal delay.

use std::time::Duration;

/// Backoff bounds. Tests use milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffConfig {
    /// First delay.
    pub base: Duration,
    /// Largest delay.
    pub cap: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        BackoffConfig {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(30),
        }
    }
}

/// Retry state: call [`Backoff::next_delay`] after each failure, [`Backoff::reset`] on success.
#[derive(Debug, Clone)]
pub struct Backoff {
    cfg: BackoffConfig,
    attempt: u32,
}

impl Backoff {
    /// Fresh state.
    pub fn new(cfg: BackoffConfig) -> Self {
        Backoff { cfg, attempt: 0 }
    }

    /// The delay before the next retry.
    pub fn next_delay(&mut self) -> Duration {
        let d = delay(self.cfg, self.attempt, rand::random::<f64>());
        self.attempt = self.attempt.saturating_add(1);
        d
    }

    /// Forget past failures.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// Failures since the last reset.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }
}

/// The delay for `attempt` (0-based) given a uniform `jitter` in `[0, 1)`.
pub fn delay(cfg: BackoffConfig, attempt: u32, jitter: f64) -> Duration {
    let nominal = cfg
        .base
        .checked_mul(1u32 << attempt.min(30))
        .unwrap_or(cfg.cap)
        .min(cfg.cap);
    let half = nominal / 2;
    half + half.mul_f64(jitter.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: BackoffConfig = BackoffConfig {
        base: Duration::from_secs(1),
        cap: Duration::from_secs(30),
    };

    #[test]
    fn doubles_then_caps() {
        let top: Vec<u64> = (0..8)
            .map(|n| delay(CFG, n, 1.0).as_millis() as u64)
            .collect();
        assert_eq!(
            top,
            vec![1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        assert_eq!(delay(CFG, 0, 0.0), Duration::from_millis(500));
        assert_eq!(delay(CFG, 1000, 0.0), Duration::from_secs(15));
    }

    #[test]
    fn jitter_stays_in_range() {
        let mut b = Backoff::new(CFG);
        for n in 0..50 {
            let d = b.next_delay();
            let nominal = delay(CFG, n, 1.0);
            assert!(d >= nominal / 2 && d <= nominal, "{d:?} vs {nominal:?}");
        }
        assert_eq!(b.attempts(), 50);
        b.reset();
        assert!(b.next_delay() <= Duration::from_secs(1));
    }

    #[test]
    fn millisecond_configs_for_tests() {
        let cfg = BackoffConfig {
            base: Duration::from_millis(2),
            cap: Duration::from_millis(10),
        };
        assert_eq!(delay(cfg, 10, 1.0), Duration::from_millis(10));
    }
}
