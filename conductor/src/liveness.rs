//! Agent liveness writes, batched across nodes.
//!
//! Every heartbeat that carries new progress (or comes after [`super::agent`]'s quiet
//! interval) records the node's liveness. Written one statement per heartbeat, that is one
//! transaction per heartbeat: at thousands of heartbeats a second the database spends most
//! of its CPU starting and committing them. Instead each rivetd keeps the latest record per
//! node here and a supervised loop writes them all every [`FLUSH_EVERY`] (sooner once
//! [`FLUSH_AT`] nodes are waiting) in one statement.
//!
//! What that changes for readers: the wait-state timeout scan and a controller taking a
//! node over see a heartbeat up to [`FLUSH_EVERY`] (plus one write) late, far inside any
//! heartbeat timeout. What must not be late goes through [`LivenessBatcher::write_now`]:
//! a lookup that issues a token writes the boot's first liveness before the token (see
//! `lookup`), after a batch on its way that holds the same node (not after others: a fleet
//! booting at once looks up by the thousand), and drops the node's queued record so an
//! older heartbeat cannot land after it. Shutdown flushes before the leases are handed
//! back. A failed write keeps its records for the next flush unless a newer one for the
//! same node arrived meanwhile; the queue holds at most one record per node, so a long
//! database outage cannot grow it past the fleet.

use rivet_model::node::Liveness;
use rivet_store::{Store, StoreError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// How long a heartbeat's liveness may wait before it is written. Short against the
/// heartbeat timeout (minutes) and the agents' own heartbeat interval (seconds), long enough
/// that at a few thousand heartbeats a second one statement carries hundreds of nodes.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// Write at once when this many nodes wait, without waiting for [`FLUSH_EVERY`].
pub const FLUSH_AT: usize = 1000;

/// Most nodes written by one statement (a flush of more is split): keeps one statement's
/// argument and its row locks small.
const ROWS_PER_STATEMENT: usize = 1000;

/// Where batches are written: the store, or a test's stand-in.
#[async_trait::async_trait]
pub trait LivenessSink: Send + Sync {
    /// Write `records` (each node at most once); how many nodes were written.
    async fn write(&self, records: &[(String, Liveness)]) -> Result<u64, StoreError>;
}

#[async_trait::async_trait]
impl LivenessSink for Arc<dyn Store> {
    async fn write(&self, records: &[(String, Liveness)]) -> Result<u64, StoreError> {
        self.record_liveness_many(records).await
    }
}

/// The latest liveness of each node not yet written, and the writer of batches.
pub struct LivenessBatcher {
    sink: Box<dyn LivenessSink>,
    queue: Mutex<Queue>,
    /// Signalled when [`FLUSH_AT`] nodes wait.
    full: Notify,
    /// Signalled when a batch has been written (or failed).
    landed: Notify,
    /// One flush at a time.
    flushing: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Queue {
    /// The latest record of each node not yet written.
    pending: HashMap<String, Liveness>,
    /// Nodes of the batch being written: a direct write of one of them waits for it, so
    /// that the batch's older record cannot land after the direct one. Other direct writes
    /// (a lookup storm at a fleet's boot) do not wait.
    in_flight: std::collections::HashSet<String>,
}

impl LivenessBatcher {
    /// A batcher writing to `sink`.
    pub fn new(sink: impl LivenessSink + 'static) -> LivenessBatcher {
        LivenessBatcher {
            sink: Box::new(sink),
            queue: Mutex::new(Queue::default()),
            full: Notify::new(),
            landed: Notify::new(),
            flushing: tokio::sync::Mutex::new(()),
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        match self.queue.lock() {
            Ok(q) => q,
            Err(p) => p.into_inner(),
        }
    }

    /// Queue node `uuid`'s liveness for the next flush; it replaces any queued one.
    pub fn record(&self, uuid: &str, liveness: Liveness) {
        let waiting = {
            let mut q = self.queue();
            q.pending.insert(uuid.to_string(), liveness);
            q.pending.len()
        };
        if waiting >= FLUSH_AT {
            self.full.notify_one();
        }
    }

    /// How many nodes wait to be written.
    pub fn waiting(&self) -> usize {
        self.queue().pending.len()
    }

    /// Write node `uuid`'s liveness now, replacing its queued record; when a batch being
    /// written holds the node, after that batch. `NotFound` when there is no such node.
    pub async fn write_now(&self, uuid: &str, liveness: Liveness) -> Result<(), StoreError> {
        loop {
            // Armed before looking, so a batch landing in between still wakes us.
            let landed = self.landed.notified();
            tokio::pin!(landed);
            landed.as_mut().enable();
            {
                let mut q = self.queue();
                q.pending.remove(uuid);
                if !q.in_flight.contains(uuid) {
                    break;
                }
            }
            landed.await;
        }
        let n = self.sink.write(&[(uuid.to_string(), liveness)]).await?;
        rivet_store::one_node_row(n, uuid)
    }

    /// Write every queued record; returns how many nodes were written. On failure the
    /// records not written go back in the queue (a newer one queued meanwhile wins).
    pub async fn flush(&self) -> Result<u64, StoreError> {
        let _flushing = self.flushing.lock().await;
        let batch: Vec<(String, Liveness)> = {
            let mut q = self.queue();
            let batch: Vec<_> = std::mem::take(&mut q.pending).into_iter().collect();
            q.in_flight = batch.iter().map(|(u, _)| u.clone()).collect();
            batch
        };
        // Clears `in_flight` however this ends, a cancelled flush included, so no direct
        // write waits for a batch that will never land.
        let _landing = Landing(self);
        let mut written = Ok(0);
        for (i, chunk) in batch.chunks(ROWS_PER_STATEMENT).enumerate() {
            match self.sink.write(chunk).await {
                Ok(n) => {
                    if let Ok(w) = &mut written {
                        *w += n
                    }
                }
                Err(e) => {
                    let mut q = self.queue();
                    for (uuid, l) in &batch[i * ROWS_PER_STATEMENT..] {
                        q.pending.entry(uuid.clone()).or_insert_with(|| l.clone());
                    }
                    written = Err(e);
                    break;
                }
            }
        }
        written
    }

    /// The flush loop: never ends by itself (run it supervised). A failed flush is logged
    /// and retried at the next tick with the records it kept.
    pub async fn run(self: Arc<Self>) {
        self.run_every(FLUSH_EVERY).await
    }

    async fn run_every(self: Arc<Self>, every: Duration) {
        let mut failing = false;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = self.full.notified() => {}
            }
            match self.flush().await {
                Ok(_) if failing => {
                    tracing::info!("agent liveness is written again");
                    failing = false;
                }
                Ok(_) => {}
                Err(e) => {
                    // Once per outage at warn, then quietly: the heartbeats keep coming.
                    if !failing {
                        tracing::warn!(error = %e, waiting = self.waiting(), "cannot write agent liveness; keeping it for the next try");
                    } else {
                        tracing::debug!(error = %e, "agent liveness still not written");
                    }
                    failing = true;
                }
            }
        }
    }
}

/// The end of a flush: its nodes are no longer in flight.
struct Landing<'a>(&'a LivenessBatcher);

impl Drop for Landing<'_> {
    fn drop(&mut self) {
        self.0.queue().in_flight.clear();
        self.0.landed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};
    use std::sync::atomic::{AtomicBool, Ordering};

    type Batches = Arc<Mutex<Vec<Vec<(String, Liveness)>>>>;

    /// Records every batch; fails while `fail` is set.
    #[derive(Clone, Default)]
    struct Fake {
        batches: Batches,
        fail: Arc<AtomicBool>,
        /// While set, a write of several records waits for `release`.
        hold: Arc<AtomicBool>,
        release: Arc<Notify>,
    }

    #[async_trait::async_trait]
    impl LivenessSink for Fake {
        async fn write(&self, records: &[(String, Liveness)]) -> Result<u64, StoreError> {
            if records.len() > 1 && self.hold.load(Ordering::SeqCst) {
                self.release.notified().await;
            }
            if self.fail.load(Ordering::SeqCst) {
                return Err(StoreError::Unavailable("database down".into()));
            }
            self.batches.lock().expect("lock").push(records.to_vec());
            Ok(records.len() as u64)
        }
    }

    impl Fake {
        fn written(&self) -> HashMap<String, Liveness> {
            let mut all = HashMap::new();
            for b in self.batches.lock().expect("lock").iter() {
                for (u, l) in b {
                    all.insert(u.clone(), l.clone());
                }
            }
            all
        }
    }

    fn at(s: i64) -> Liveness {
        Liveness {
            last_heartbeat: Some(
                Utc.timestamp_opt(1_700_000_000 + s, 0)
                    .single()
                    .expect("time"),
            ),
            agent_version: Some("1".into()),
            progress: Some(serde_json::json!({ "step": s })),
        }
    }

    #[tokio::test]
    async fn records_coalesce_and_one_flush_writes_them_all() {
        let fake = Fake::default();
        let b = LivenessBatcher::new(fake.clone());
        b.record("a", at(1));
        b.record("b", at(1));
        b.record("a", at(2));
        assert_eq!(b.waiting(), 2);
        assert_eq!(b.flush().await.expect("flush"), 2);
        assert_eq!(fake.batches.lock().expect("lock").len(), 1, "one statement");
        let w = fake.written();
        assert_eq!(w["a"], at(2), "the latest record of a node wins");
        assert_eq!(w["b"], at(1));
        assert_eq!(b.waiting(), 0);
        assert_eq!(b.flush().await.expect("flush"), 0);
        assert_eq!(
            fake.batches.lock().expect("lock").len(),
            1,
            "nothing to write, no statement"
        );
    }

    #[tokio::test]
    async fn a_failed_flush_keeps_its_records_unless_newer_ones_came() {
        let fake = Fake::default();
        let b = LivenessBatcher::new(fake.clone());
        b.record("a", at(1));
        b.record("b", at(1));
        fake.fail.store(true, Ordering::SeqCst);
        assert!(b.flush().await.is_err());
        assert_eq!(b.waiting(), 2, "records kept for the next try");
        b.record("a", at(3));
        fake.fail.store(false, Ordering::SeqCst);
        assert_eq!(b.flush().await.expect("flush"), 2);
        let w = fake.written();
        assert_eq!(
            w["a"],
            at(3),
            "the newer record was not replaced by the retried one"
        );
        assert_eq!(w["b"], at(1));
    }

    #[tokio::test]
    async fn the_loop_flushes_on_its_own_and_write_now_replaces_the_queued_record() {
        let fake = Fake::default();
        let b = Arc::new(LivenessBatcher::new(fake.clone()));
        let looping = tokio::spawn(b.clone().run());
        b.record("a", at(1));
        b.record("b", at(1));
        b.write_now("b", at(5)).await.expect("store");
        let deadline = tokio::time::Instant::now() + FLUSH_EVERY * 20;
        while fake.written().len() < 2 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the loop never flushed"
            );
            tokio::time::sleep(FLUSH_EVERY / 4).await;
        }
        looping.abort();
        let w = fake.written();
        assert_eq!(w["a"], at(1));
        assert_eq!(w["b"], at(5), "the queued older record of b was dropped");
    }

    /// A direct write waits for a batch on its way only when that batch holds its node.
    #[tokio::test]
    async fn write_now_waits_only_for_a_batch_holding_its_node() {
        let fake = Fake::default();
        let b = Arc::new(LivenessBatcher::new(fake.clone()));
        b.record("x", at(1));
        b.record("y", at(1));
        fake.hold.store(true, Ordering::SeqCst);
        let flushing = tokio::spawn({
            let b = b.clone();
            async move { b.flush().await }
        });
        while b.queue().in_flight.len() < 2 {
            tokio::task::yield_now().await;
        }
        tokio::time::timeout(Duration::from_secs(5), b.write_now("z", at(2)))
            .await
            .expect("a node outside the batch waited for it")
            .expect("write");
        let direct = tokio::spawn({
            let b = b.clone();
            async move { b.write_now("x", at(5)).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!direct.is_finished(), "wrote x before its batch landed");
        fake.hold.store(false, Ordering::SeqCst);
        fake.release.notify_waiters();
        flushing.await.expect("join").expect("flush");
        direct.await.expect("join").expect("write");
        let batches = fake.batches.lock().expect("lock").clone();
        assert_eq!(batches.len(), 3, "{batches:?}");
        assert_eq!(batches[0], vec![("z".to_string(), at(2))]);
        assert_eq!(
            batches[2],
            vec![("x".to_string(), at(5))],
            "x's direct write came last"
        );
    }

    /// Shutdown writes what is queued (before the leases go back), through the real store.
    #[tokio::test]
    async fn shutdown_flushes_into_the_store() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = rivet_store::sqlite::SqliteStore::open(
            &dir.path().join("rivet.db").to_string_lossy(),
            rivet_support::secrets::Secrets::ephemeral(),
        )
        .expect("store");
        let config = rivet_model::config::Config {
            conductor_id: "c1".into(),
            ..rivet_model::config::Config::default()
        };
        let c = crate::Conductor::new(Arc::new(store), config);
        let node = rivet_model::node::Node::new("u1".into(), "fake-hardware".into());
        c.store.create_node(&node).await.expect("create");
        // No flush loop runs here: only shutdown can write it.
        c.liveness.record("u1", at(9));
        assert_eq!(
            c.store.node_summary("u1").await.expect("store").liveness,
            Liveness::default()
        );
        c.shut_down().await;
        assert_eq!(c.liveness.waiting(), 0);
        assert_eq!(
            c.store.node_summary("u1").await.expect("store").liveness,
            at(9)
        );
    }

    #[tokio::test]
    async fn a_full_queue_flushes_before_the_interval() {
        let fake = Fake::default();
        let b = Arc::new(LivenessBatcher::new(fake.clone()));
        // An interval that never comes: only a full queue can make it write.
        let looping = tokio::spawn(b.clone().run_every(Duration::from_secs(3600)));
        for i in 0..FLUSH_AT - 1 {
            b.record(&format!("n{i}"), at(1));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            fake.written().is_empty(),
            "flushed before the queue was full"
        );
        b.record("last", at(1));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while fake.written().len() < FLUSH_AT {
            assert!(
                tokio::time::Instant::now() < deadline,
                "not flushed when full"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        looping.abort();
    }
}
