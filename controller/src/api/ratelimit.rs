//! Per-source token buckets for the unauthenticated agent endpoints (lookup, failed agent-token
//! checks), so a stranger on the provisioning network cannot enumerate hardware or hammer the
//! token check as fast as the network allows.
//!
//! A source is the TCP peer's address; IPv6 peers are keyed by their /64 (one host can hold a
//! whole /64, so keying by /128 would let it pick a fresh address for every request) and
//! IPv4-mapped IPv6 as the IPv4 address. Forwarded-for headers are not trusted: behind a
//! reverse proxy all agents share the proxy's bucket, so raise the limits there.
//!
//! Memory is bounded: at most [`MAX_SOURCES`] buckets. A bucket that has refilled completely
//! carries no information (it is what a new source gets) and is dropped by the periodic
//! sweep; when the table is full of sources that are all still draining, further new
//! sources share one overflow bucket instead of evicting a limited one (evicting would hand
//! an attacker with many addresses a fresh budget).
//!
//! [`RateLimiter::refuse`] is the one 429 (with `Retry-After`) every limited endpoint answers.

use super::ApiError;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use rivet_support::http::PeerAddr;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Most sources tracked at once (about 60 bytes each).
pub const MAX_SOURCES: usize = 16_384;

/// How often idle buckets are swept out, and the window of "one warning per source".
const WINDOW: Duration = Duration::from_secs(60);

/// The key of a source address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SourceKey {
    /// An IPv4 peer (or IPv4-mapped IPv6).
    V4(std::net::Ipv4Addr),
    /// The /64 of an IPv6 peer.
    V6Net(u64),
    /// Every source that did not fit in the table.
    Overflow,
}

impl SourceKey {
    /// The key of a peer address.
    pub fn of(ip: IpAddr) -> SourceKey {
        match ip {
            IpAddr::V4(v4) => SourceKey::V4(v4),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => SourceKey::V4(v4),
                None => SourceKey::V6Net((u128::from(v6) >> 64) as u64),
            },
        }
    }
}

impl std::fmt::Display for SourceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SourceKey::V4(a) => write!(f, "{a}"),
            SourceKey::V6Net(n) => write!(f, "{}/64", Ipv6Addr::from(u128::from(*n) << 64)),
            SourceKey::Overflow => f.write_str("(sources beyond the rate-limit table)"),
        }
    }
}

/// What [`RateLimiter::take`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Within the limit (one unit was taken).
    Allowed,
    /// Over the limit.
    Limited {
        /// When one unit will be available again (at least 1 s: `Retry-After` is in seconds).
        retry_after: Duration,
        /// Whether to log it: true once per source per minute, so a flood is not a log flood.
        warn: bool,
    },
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    updated: Instant,
    warned: Option<Instant>,
}

#[derive(Debug)]
struct Table {
    buckets: HashMap<SourceKey, Bucket>,
    swept: Instant,
}

/// A token bucket per source: `per_minute` units of burst, refilled at `per_minute / 60` per
/// second. `per_minute = 0` disables the limit.
#[derive(Debug)]
pub struct RateLimiter {
    per_minute: u32,
    max_sources: usize,
    table: Mutex<Table>,
}

impl RateLimiter {
    /// Takes one unit for the request's source (`peer`, absent for a router driven
    /// in-process); the 429 to answer when it is over, naming `what` and the `setting` that
    /// limits it and nothing about nodes. The first refusal of a source in a minute is logged.
    pub(super) fn refuse(
        &self,
        peer: Option<&Extension<PeerAddr>>,
        setting: &str,
        what: &str,
    ) -> Option<Response> {
        let ip = peer?.0 .0.ip();
        let Decision::Limited { retry_after, warn } = self.take(ip) else {
            return None;
        };
        let per_minute = self.per_minute();
        if warn {
            tracing::warn!(
                source = %SourceKey::of(ip),
                limit = setting,
                per_minute,
                "{what} from this source are over the limit; answering 429 (logged once a minute per source)"
            );
        }
        let secs = retry_after.as_secs().max(1);
        let mut resp = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "too many {what} from this address: the limit is {per_minute} per minute \
                 ({setting}); retry after {secs} s"
            ),
        )
        .into_response();
        resp.headers_mut()
            .insert(axum::http::header::RETRY_AFTER, HeaderValue::from(secs));
        Some(resp)
    }

    /// A limiter allowing `per_minute` per source (0: unlimited).
    pub fn new(per_minute: u32) -> RateLimiter {
        Self::with_capacity(per_minute, MAX_SOURCES)
    }

    /// Like [`RateLimiter::new`] with a smaller table (tests).
    pub fn with_capacity(per_minute: u32, max_sources: usize) -> RateLimiter {
        RateLimiter {
            per_minute,
            max_sources: max_sources.max(1),
            table: Mutex::new(Table {
                buckets: HashMap::new(),
                swept: Instant::now(),
            }),
        }
    }

    /// The configured rate.
    pub fn per_minute(&self) -> u32 {
        self.per_minute
    }

    /// Take one unit for `ip` now.
    pub fn take(&self, ip: IpAddr) -> Decision {
        self.take_at(SourceKey::of(ip), Instant::now())
    }

    /// Take one unit for `key` at `now` (the clock is a parameter so tests need not sleep).
    pub fn take_at(&self, key: SourceKey, now: Instant) -> Decision {
        if self.per_minute == 0 {
            return Decision::Allowed;
        }
        let capacity = f64::from(self.per_minute);
        let per_sec = capacity / 60.0;
        // The lock is held for a few arithmetic operations (and a bounded sweep), never across
        // an await.
        let mut table = match self.table.lock() {
            Ok(t) => t,
            Err(p) => p.into_inner(),
        };
        let full = table.buckets.len() >= self.max_sources;
        if now.saturating_duration_since(table.swept) >= WINDOW
            || (full && now.saturating_duration_since(table.swept) >= Duration::from_secs(1))
        {
            table.swept = now;
            table.buckets.retain(|_, b| {
                let refilled =
                    b.tokens + now.saturating_duration_since(b.updated).as_secs_f64() * per_sec;
                refilled < capacity
            });
        }
        let key = if table.buckets.contains_key(&key) || table.buckets.len() < self.max_sources {
            key
        } else {
            SourceKey::Overflow
        };
        let bucket = table.buckets.entry(key).or_insert(Bucket {
            tokens: capacity,
            updated: now,
            warned: None,
        });
        let elapsed = now.saturating_duration_since(bucket.updated).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * per_sec).min(capacity);
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Decision::Allowed;
        }
        let wait = ((1.0 - bucket.tokens) / per_sec).ceil().max(1.0);
        let warn = match bucket.warned {
            Some(at) if now.saturating_duration_since(at) < WINDOW => false,
            _ => {
                bucket.warned = Some(now);
                true
            }
        };
        Decision::Limited {
            retry_after: Duration::from_secs(wait as u64),
            warn,
        }
    }

    /// How long until `ip` may fail again, when it is over the limit now; takes nothing (a
    /// log-in form checks this before it spends an argon2 verification on the attempt).
    pub fn exhausted(&self, ip: IpAddr) -> Option<Duration> {
        if self.per_minute == 0 {
            return None;
        }
        let per_sec = f64::from(self.per_minute) / 60.0;
        let table = match self.table.lock() {
            Ok(t) => t,
            Err(p) => p.into_inner(),
        };
        let b = table.buckets.get(&SourceKey::of(ip))?;
        let now = Instant::now();
        let tokens = b.tokens + now.saturating_duration_since(b.updated).as_secs_f64() * per_sec;
        (tokens < 1.0)
            .then(|| Duration::from_secs(((1.0 - tokens) / per_sec).ceil().max(1.0) as u64))
    }

    /// Sources tracked now (tests, and to show the table stays bounded).
    pub fn tracked(&self) -> usize {
        match self.table.lock() {
            Ok(t) => t.buckets.len(),
            Err(p) => p.into_inner().buckets.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn v4(last: u8) -> SourceKey {
        SourceKey::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    #[test]
    fn burst_then_limited_then_refills() {
        let rl = RateLimiter::new(60); // one per second, burst of 60
        let t0 = Instant::now();
        for i in 0..60 {
            assert_eq!(rl.take_at(v4(1), t0), Decision::Allowed, "take {i}");
        }
        let Decision::Limited { retry_after, warn } = rl.take_at(v4(1), t0) else {
            panic!("61st take allowed");
        };
        assert_eq!(retry_after, Duration::from_secs(1));
        assert!(warn, "first refusal is logged");
        // Another source is not affected.
        assert_eq!(rl.take_at(v4(2), t0), Decision::Allowed);
        // A second later one more unit is there, then none again.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(rl.take_at(v4(1), t1), Decision::Allowed);
        assert!(matches!(rl.take_at(v4(1), t1), Decision::Limited { .. }));
        // A minute later the burst is back.
        let t2 = t1 + Duration::from_secs(60);
        for _ in 0..60 {
            assert_eq!(rl.take_at(v4(1), t2), Decision::Allowed);
        }
    }

    #[test]
    fn retry_after_says_when_a_unit_returns() {
        let rl = RateLimiter::new(6); // one per 10 s
        let t0 = Instant::now();
        for _ in 0..6 {
            rl.take_at(v4(1), t0);
        }
        match rl.take_at(v4(1), t0) {
            Decision::Limited { retry_after, .. } => assert_eq!(retry_after.as_secs(), 10),
            d => panic!("{d:?}"),
        }
        match rl.take_at(v4(1), t0 + Duration::from_secs(4)) {
            Decision::Limited { retry_after, .. } => assert_eq!(retry_after.as_secs(), 6),
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn one_warning_per_source_per_window() {
        let rl = RateLimiter::new(1);
        let t0 = Instant::now();
        assert_eq!(rl.take_at(v4(1), t0), Decision::Allowed);
        let warns = (0..100)
            .filter(|i| {
                matches!(
                    rl.take_at(v4(1), t0 + Duration::from_millis(*i)),
                    Decision::Limited { warn: true, .. }
                )
            })
            .count();
        assert_eq!(warns, 1);
        // The next window warns again.
        let later = t0 + Duration::from_secs(61);
        assert_eq!(rl.take_at(v4(1), later), Decision::Allowed);
        assert!(matches!(
            rl.take_at(v4(1), later),
            Decision::Limited { warn: true, .. }
        ));
    }

    #[test]
    fn zero_means_unlimited() {
        let rl = RateLimiter::new(0);
        let t0 = Instant::now();
        for _ in 0..10_000 {
            assert_eq!(rl.take_at(v4(1), t0), Decision::Allowed);
        }
        assert_eq!(rl.tracked(), 0);
    }

    #[test]
    fn table_is_bounded_idle_sources_are_swept_and_overflow_is_shared() {
        let rl = RateLimiter::with_capacity(2, 4);
        let t0 = Instant::now();
        for i in 0..4 {
            rl.take_at(v4(i), t0);
        }
        assert_eq!(rl.tracked(), 4);
        // Full table, nobody idle: new sources share the overflow bucket (burst 2)…
        assert_eq!(rl.take_at(v4(10), t0), Decision::Allowed);
        assert_eq!(rl.take_at(v4(11), t0), Decision::Allowed);
        assert!(matches!(rl.take_at(v4(12), t0), Decision::Limited { .. }));
        assert_eq!(rl.tracked(), 4 + 1, "four sources and the overflow bucket");
        // …and a tracked source keeps its own (drained) bucket: no eviction resets it.
        rl.take_at(v4(0), t0);
        assert!(matches!(rl.take_at(v4(0), t0), Decision::Limited { .. }));
        // Once they have refilled (idle), the sweep drops them and new sources get their own.
        let later = t0 + Duration::from_secs(120);
        assert_eq!(rl.take_at(v4(20), later), Decision::Allowed);
        assert_eq!(rl.tracked(), 1);
    }

    #[test]
    fn ipv6_is_keyed_by_its_64_and_mapped_v4_as_v4() {
        let a: IpAddr = "2001:db8:1:2::1"
            .parse()
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let b: IpAddr = "2001:db8:1:2:ffff::9"
            .parse()
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let c: IpAddr = "2001:db8:1:3::1"
            .parse()
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(SourceKey::of(a), SourceKey::of(b));
        assert_ne!(SourceKey::of(a), SourceKey::of(c));
        assert_eq!(SourceKey::of(a).to_string(), "2001:db8:1:2::/64");
        let mapped: IpAddr = "::ffff:192.0.2.7"
            .parse()
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(
            SourceKey::of(mapped),
            SourceKey::V4(Ipv4Addr::new(192, 0, 2, 7))
        );
    }
}
