//! One live process per conductor id on a shared database.
//!
//! Leases, the hash ring and agent wake-ups are all keyed by the conductor id, so two
//! processes under one id (two rivetd on one host both defaulting to the host name) would
//! each believe they own every node of that id and drive them at once. At start, before it
//! writes its own registration heartbeat, a controller therefore looks at the row of its id:
//! when that row's heartbeat is still fresh it watches it, and refuses to start if the
//! heartbeat moves (someone alive writes it), or takes the id over once the heartbeat has
//! expired (its previous holder died: a crash or `kill -9` leaves a fresh row behind, and the
//! replacement waits at most `dead_after_s` for it).
//!
//! Ironic's `register_conductor` raises `ConductorAlreadyRegistered` for an `online` row of
//! the same hostname, but its conductor then logs a warning and registers over it anyway;
//! Rivet refuses, because a second live process under one id is never what the operator
//! meant.
//!
//! On SQLite only one rivetd may use the file at all: one under another id is refused by the
//! heartbeat check in `server::build`; one under the same id would be invisible to it, so
//! the serving process also holds an exclusive `flock` on `<database>.rivetd.lock` for its
//! lifetime (the kernel releases it when the process dies, so a restart after `kill -9` is
//! not delayed).

use super::Conductor;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

/// The SQLite lock files this process holds, kept open (the lock lives as long as the open
/// file). A second `build` on the same file in one process (tests) reuses the lock.
static SQLITE_LOCKS: Mutex<Vec<(PathBuf, std::fs::File)>> = Mutex::new(Vec::new());

/// How often the row is re-read while it is being watched.
const POLL: Duration = Duration::from_millis(250);

impl Conductor {
    /// Make sure no live process already runs under this controller's id; `Err` names the
    /// id, when it was last seen and what to do.
    pub async fn claim_id(&self) -> anyhow::Result<()> {
        if !self.store.is_shared() {
            return Ok(());
        }
        let dead_after = self.dead_after_s();
        let Some(first) = self.own_row(dead_after).await? else {
            return Ok(());
        };
        if !first.alive {
            return Ok(());
        }
        // The row can stay fresh for at most `dead_after_s` without a writer; a live holder
        // writes it every `heartbeat_interval_s`, well inside that.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(dead_after + 1);
        tracing::warn!(
            conductor = self.id(),
            last_seen = %first.last_seen,
            "a controller with this id heartbeat recently; waiting to see whether it is still alive"
        );
        loop {
            tokio::time::sleep(POLL).await;
            let Some(now) = self.own_row(dead_after).await? else {
                return Ok(());
            };
            if now.last_seen != first.last_seen {
                anyhow::bail!(
                    "conductor id {:?} is already registered by a live controller (host {:?}, \
                     started {}, last heartbeat {}): two processes under one id would both drive \
                     its nodes. Give this rivetd its own --conductor-id (or conductor_id in the \
                     config), or stop the other one first",
                    self.id(),
                    now.hostname,
                    now.started_at,
                    now.last_seen
                );
            }
            if !now.alive || tokio::time::Instant::now() >= deadline {
                tracing::warn!(
                    conductor = self.id(),
                    last_seen = %now.last_seen,
                    "the previous controller under this id stopped heartbeating; taking the id over"
                );
                return Ok(());
            }
        }
    }

    /// On SQLite: take the database's process lock, or say which controller holds it.
    pub async fn lock_sqlite_file(&self) -> anyhow::Result<()> {
        if self.store.is_shared() {
            return Ok(());
        }
        let Some(path) = self.config.db.strip_prefix("sqlite:") else {
            return Ok(());
        };
        let path = path.strip_prefix("//").unwrap_or(path);
        if path.is_empty() || path.starts_with(':') || path.contains("mode=memory") {
            return Ok(());
        }
        let lock = PathBuf::from(format!(
            "{}.rivetd.lock",
            path.split('?').next().unwrap_or(path)
        ));
        let mut held = match SQLITE_LOCKS.lock() {
            Ok(h) => h,
            Err(p) => p.into_inner(),
        };
        if held.iter().any(|(p, _)| *p == lock) {
            return Ok(());
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock)
            .map_err(|e| {
                anyhow::anyhow!("cannot open the SQLite lock file {}: {e}", lock.display())
            })?;
        match file.try_lock() {
            Ok(()) => {
                held.push((lock, file));
                Ok(())
            }
            Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
                "another rivetd already serves SQLite database {path} (it holds {}; conductor id \
                 {:?} is registered there): SQLite serves one rivetd. Stop the other one first, or \
                 move the fleet to PostgreSQL to run several, each with its own --conductor-id",
                lock.display(),
                self.id()
            ),
            Err(std::fs::TryLockError::Error(e)) => {
                anyhow::bail!("cannot lock {}: {e}", lock.display())
            }
        }
    }

    async fn own_row(
        &self,
        dead_after: u64,
    ) -> anyhow::Result<Option<rivet_store::ConductorRecord>> {
        Ok(self
            .store
            .list_conductors(dead_after)
            .await?
            .into_iter()
            .find(|c| c.id == self.id()))
    }
}
