//! Aggregate node counts for the Prometheus scrape (`/metrics`): one `GROUP BY` over the
//! narrow state columns, so a scrape costs the same whether the fleet has ten nodes or ten
//! thousand, and never reads the node documents (JSON columns).

use super::queries::SqlStore;
use super::sql::{Access, Engine, SqlRow};
use super::StoreError;
use chrono::{DateTime, Utc};

/// Nodes sharing one combination of the state columns.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeCount {
    /// Provision state as stored (`available`, `clean wait`…).
    pub provision_state: String,
    /// Power state as stored; `None` before the first power read.
    pub power_state: Option<String>,
    /// Maintenance flag.
    pub maintenance: bool,
    /// The controller holding these nodes' leases, if any.
    pub reservation: Option<String>,
    /// How many nodes.
    pub count: i64,
    /// The oldest `provision_updated_at` among them: how long the longest-waiting node has
    /// been in its state.
    pub oldest_change: Option<DateTime<Utc>>,
}

impl<E: Engine> SqlStore<E> {
    pub(super) async fn sql_node_counts(&self) -> Result<Vec<NodeCount>, StoreError> {
        let _timer = rivet_support::metrics::store_query(Access::Scan.label());
        let rows = self
            .engine
            .rows(
                Access::Scan,
                "SELECT provision_state, power_state, maintenance, reservation, count(*), \
                 min(provision_updated_at) FROM nodes \
                 GROUP BY provision_state, power_state, maintenance, reservation",
                vec![],
            )
            .await?;
        rows.into_iter()
            .map(|mut r| {
                Ok(NodeCount {
                    provision_state: r.text(0)?,
                    power_state: r.opt_text(1)?,
                    maintenance: r.opt_flag(2)?.unwrap_or(false),
                    reservation: r.opt_text(3)?,
                    count: r.int(4)?,
                    oldest_change: r.time(5)?,
                })
            })
            .collect()
    }
}
