//! The agent logs kept with a node: when a step fails on the ramdisk, the tail of the agent's
//! own log arrives with the failed command result and is stored here (migration 16), like
//! Ironic's deploy/clean log collection but in the database instead of a log directory. Only
//! the newest [`NODE_LOGS_KEPT`] per node are kept; the rows go with the node
//! (`ON DELETE CASCADE`).

use super::queries::SqlStore;
use super::sql::{Access, Engine, ExecError, SqlRow};
use super::StoreError;
use chrono::{DateTime, SubsecRound, Utc};

/// How many logs a node keeps; older ones are dropped when a new one is stored.
pub const NODE_LOGS_KEPT: i64 = 10;

/// One stored agent log.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeLog {
    /// Its id (increasing; unique across nodes).
    pub id: i64,
    /// The node it belongs to.
    pub node_uuid: String,
    /// When it was stored.
    pub created_at: DateTime<Utc>,
    /// `clean`, `deploy`, `service`…
    pub operation: String,
    /// The step that failed, if known.
    pub step: Option<String>,
    /// The agent command that failed, if known.
    pub command_id: Option<String>,
    /// The log text as the agent sent it.
    pub text: String,
}

fn log_from_row(mut r: impl SqlRow) -> Result<NodeLog, StoreError> {
    Ok(NodeLog {
        id: r.int(0)?,
        node_uuid: r.text(1)?,
        created_at: r.time(2)?.unwrap_or_else(Utc::now),
        operation: r.text(3)?,
        step: r.opt_text(4)?,
        command_id: r.opt_text(5)?,
        text: r.text(6)?,
    })
}

fn plain(e: ExecError) -> StoreError {
    match e {
        ExecError::Unique(w) => StoreError::Backend(w),
        ExecError::Store(e) => e,
    }
}

const COLUMNS: &str = "id, node_uuid, created_at, operation, step, command_id, text";

impl<E: Engine> SqlStore<E> {
    /// Store `log` (its id and time are assigned) and drop the node's logs beyond the newest
    /// [`NODE_LOGS_KEPT`].
    pub(super) async fn nl_add_node_log(&self, log: &NodeLog) -> Result<NodeLog, StoreError> {
        let now = Utc::now().trunc_subsecs(6);
        let rows = self
            .engine
            .rows(
                Access::Write,
                &format!(
                    "INSERT INTO node_logs (node_uuid, created_at, operation, step, command_id, \
                     text) VALUES ($1, $2, $3, $4, $5, $6) RETURNING {COLUMNS}"
                ),
                vec![
                    log.node_uuid.as_str().into(),
                    now.into(),
                    log.operation.as_str().into(),
                    log.step.clone().into(),
                    log.command_id.clone().into(),
                    log.text.as_str().into(),
                ],
            )
            .await?;
        let stored = match rows.into_iter().next() {
            Some(r) => log_from_row(r)?,
            None => {
                return Err(StoreError::Backend(
                    "INSERT node_logs returned no row".into(),
                ))
            }
        };
        self.engine
            .execute(
                "DELETE FROM node_logs WHERE node_uuid = $1 AND id NOT IN \
                 (SELECT id FROM node_logs WHERE node_uuid = $1 ORDER BY id DESC LIMIT $2)",
                vec![log.node_uuid.as_str().into(), NODE_LOGS_KEPT.into()],
            )
            .await
            .map_err(plain)?;
        Ok(stored)
    }

    /// A node's logs, newest first.
    pub(super) async fn nl_list_node_logs(
        &self,
        node_uuid: &str,
    ) -> Result<Vec<NodeLog>, StoreError> {
        let rows = self
            .engine
            .rows(
                Access::Read,
                &format!("SELECT {COLUMNS} FROM node_logs WHERE node_uuid = $1 ORDER BY id DESC"),
                vec![node_uuid.into()],
            )
            .await?;
        rows.into_iter().map(log_from_row).collect()
    }

    /// Log `id` of node `node_uuid`.
    pub(super) async fn nl_get_node_log(
        &self,
        node_uuid: &str,
        id: i64,
    ) -> Result<NodeLog, StoreError> {
        let rows = self
            .engine
            .rows(
                Access::Read,
                &format!("SELECT {COLUMNS} FROM node_logs WHERE node_uuid = $1 AND id = $2"),
                vec![node_uuid.into(), id.into()],
            )
            .await?;
        match rows.into_iter().next() {
            Some(r) => log_from_row(r),
            None => Err(StoreError::NotFound {
                kind: "node log",
                ident: format!("{id} of node {node_uuid}"),
            }),
        }
    }
}
