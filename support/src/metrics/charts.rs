//! What the web UI's charts draw (`GET /ui/charts.json`): the same observations as the
//! Prometheus families beside it (time per provision state and per step, failures, deploy
//! durations), kept also as small plain aggregates this process can read back — the
//! `prometheus_client` histograms can be encoded but not read. Bounded: one entry per
//! provision state and per step name (the label sets of the families), a fixed list of
//! deploy-duration buckets and a ring of 1,440 one-minute failure counts (24 hours).
//!
//! Like every family here it counts what this process saw since it started: a restart
//! starts the charts afresh, as it does Prometheus counters.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::{LazyLock, Mutex};

/// Upper bounds (seconds) of the deploy-duration buckets; one more bucket holds the rest.
pub const DEPLOY_BOUNDS: &[f64] = &[
    1.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0,
];

/// Minutes of failure history kept.
const MINUTES: usize = 24 * 60;

/// Count and total seconds of one kind of time span.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Spent {
    /// Spans observed.
    pub count: u64,
    /// Their total, seconds.
    pub seconds: f64,
}

impl Spent {
    fn add(&mut self, secs: f64) {
        self.count += 1;
        self.seconds += secs;
    }
}

/// A snapshot of the charts' data (what `/ui/charts.json` serves).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Time nodes spent in each provision state, counted when they left it.
    pub states: BTreeMap<String, Spent>,
    /// Time each finished or failed step took, by `operation: interface.step`.
    pub steps: BTreeMap<String, Spent>,
    /// Deploys that reached `active`: counts per bucket (`le` seconds; the last is +Inf).
    pub deploy_buckets: Vec<(Option<f64>, u64)>,
    /// Every deploy observed.
    pub deploys: Spent,
    /// Failures (transitions into a failed state) per minute over the last hour, oldest
    /// first: `[minute start as Unix seconds, count]`.
    pub failures_per_minute: Vec<(i64, u64)>,
    /// The same per hour over the last 24 hours, oldest first.
    pub failures_per_hour: Vec<(i64, u64)>,
    /// Failures by the failed state entered, since start.
    pub failures_by_state: BTreeMap<String, u64>,
}

impl Snapshot {
    /// As JSON: `{"states": {name: {count, seconds}}, "steps": {…}, "deploys": {count,
    /// seconds, buckets: [{le, count}]}, "failures": {per_minute: [[t, n]], per_hour: [[t,
    /// n]], by_state: {state: n}}}` (`le` is null for the last bucket).
    pub fn to_json(&self) -> Value {
        let spent = |m: &BTreeMap<String, Spent>| -> Value {
            m.iter()
                .map(|(k, v)| (k.clone(), json!({"count": v.count, "seconds": v.seconds})))
                .collect::<serde_json::Map<_, _>>()
                .into()
        };
        json!({
            "states": spent(&self.states),
            "steps": spent(&self.steps),
            "deploys": {
                "count": self.deploys.count,
                "seconds": self.deploys.seconds,
                "buckets": self.deploy_buckets.iter()
                    .map(|(le, n)| json!({"le": le, "count": n}))
                    .collect::<Vec<_>>(),
            },
            "failures": {
                "per_minute": self.failures_per_minute,
                "per_hour": self.failures_per_hour,
                "by_state": self.failures_by_state,
            },
        })
    }
}

#[derive(Debug)]
struct Charts {
    states: BTreeMap<String, Spent>,
    steps: BTreeMap<String, Spent>,
    deploy: Vec<u64>,
    deploys: Spent,
    /// `(minute since the epoch, count)` per slot `minute % MINUTES`.
    minutes: Vec<(i64, u64)>,
    failures_by_state: BTreeMap<String, u64>,
}

static CHARTS: LazyLock<Mutex<Charts>> = LazyLock::new(|| {
    Mutex::new(Charts {
        states: BTreeMap::new(),
        steps: BTreeMap::new(),
        deploy: vec![0; DEPLOY_BOUNDS.len() + 1],
        deploys: Spent::default(),
        minutes: vec![(-1, 0); MINUTES],
        failures_by_state: BTreeMap::new(),
    })
});

fn with<T>(f: impl FnOnce(&mut Charts) -> T) -> T {
    // A panic while holding the lock leaves plain counters behind: still usable.
    let mut g = CHARTS.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut g)
}

/// A node left `state` after `secs`.
pub(super) fn state_left(state: &str, secs: f64) {
    with(|c| c.states.entry(state.to_string()).or_default().add(secs));
}

/// A step ended after `secs`.
pub(super) fn step_ended(operation: &str, interface: &str, step: &str, secs: f64) {
    with(|c| {
        c.steps
            .entry(format!("{operation}: {interface}.{step}"))
            .or_default()
            .add(secs)
    });
}

/// A deploy reached `active` after `secs`.
pub(super) fn deployed(secs: f64) {
    let i = DEPLOY_BOUNDS
        .iter()
        .position(|b| secs <= *b)
        .unwrap_or(DEPLOY_BOUNDS.len());
    with(|c| {
        c.deploy[i] += 1;
        c.deploys.add(secs);
    });
}

/// A node entered failed state `state` at Unix time `now_s`.
pub(super) fn failed(state: &str, now_s: i64) {
    let minute = now_s.div_euclid(60);
    with(|c| {
        let slot = &mut c.minutes[minute.rem_euclid(MINUTES as i64) as usize];
        if slot.0 != minute {
            *slot = (minute, 0);
        }
        slot.1 += 1;
        *c.failures_by_state.entry(state.to_string()).or_default() += 1;
    });
}

/// The charts' data now (`now_s`: Unix seconds).
pub fn snapshot(now_s: i64) -> Snapshot {
    let this_minute = now_s.div_euclid(60);
    with(|c| {
        let count_at = |minute: i64| {
            let slot = c.minutes[minute.rem_euclid(MINUTES as i64) as usize];
            if slot.0 == minute {
                slot.1
            } else {
                0
            }
        };
        let failures_per_minute = (0..60)
            .rev()
            .map(|ago| {
                let m = this_minute - ago;
                (m * 60, count_at(m))
            })
            .collect();
        let this_hour = this_minute.div_euclid(60);
        let failures_per_hour = (0..24)
            .rev()
            .map(|ago| {
                let h = this_hour - ago;
                let sum = (h * 60..h * 60 + 60)
                    .filter(|m| *m <= this_minute && this_minute - *m < MINUTES as i64)
                    .map(count_at)
                    .sum();
                (h * 3600, sum)
            })
            .collect();
        let deploy_buckets = c
            .deploy
            .iter()
            .enumerate()
            .map(|(i, n)| (DEPLOY_BOUNDS.get(i).copied(), *n))
            .collect();
        Snapshot {
            states: c.states.clone(),
            steps: c.steps.clone(),
            deploy_buckets,
            deploys: c.deploys.clone(),
            failures_per_minute,
            failures_per_hour,
            failures_by_state: c.failures_by_state.clone(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the aggregates are process-wide, so the assertions compare before and after.
    #[test]
    fn observations_land_in_their_buckets_and_minutes() {
        let now = 1_800_000_000;
        let before = snapshot(now);
        deployed(0.5);
        deployed(45.0);
        deployed(99_999.0);
        failed("charts-test failed", now);
        failed("charts-test failed", now - 60 * 61);
        state_left("charts-test", 2.0);
        state_left("charts-test", 3.0);
        let s = snapshot(now);
        let delta = |i: usize| s.deploy_buckets[i].1 - before.deploy_buckets[i].1;
        assert_eq!(delta(0), 1, "0.5 s is in le=1");
        assert_eq!(delta(3), 1, "45 s is in le=60");
        assert_eq!(delta(DEPLOY_BOUNDS.len()), 1, "the rest in +Inf");
        assert_eq!(s.deploy_buckets.last().map(|b| b.0), Some(None));
        assert_eq!(s.failures_per_minute.len(), 60);
        assert_eq!(s.failures_per_minute[59].0, now.div_euclid(60) * 60);
        assert!(s.failures_per_minute[59].1 >= 1);
        let hour: u64 = s.failures_per_hour.iter().map(|h| h.1).sum();
        let minute: u64 = s.failures_per_minute.iter().map(|m| m.1).sum();
        assert!(hour > minute, "the older failure counts only in the hours");
        assert_eq!(s.failures_by_state["charts-test failed"], 2);
        assert_eq!(s.states["charts-test"].count, 2);
        assert_eq!(s.states["charts-test"].seconds, 5.0);
    }
}
