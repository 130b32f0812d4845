//! Aggregate node counts for the Prometheus scrape (`/metrics`): one `GROUP BY` over the
//! narrow state columns, so a scrape costs the same whether the fleet has ten nodes or ten
//! thousand, and never reads the node documents (JSON columns).

use super::queries::SqlStore;
use super::sql::{Access, Engine, SqlRow};
use super::StoreError;

pub use super::records::NodeCount;

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
