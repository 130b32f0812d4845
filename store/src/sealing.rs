//! The store's side of secrets at rest ([`rivet_support::secrets`] seals and opens values;
//! the store decides when): every node read is opened here, `rivetd secrets rotate` walks
//! the database re-sealing with a new key, and a SQLite file is asked whether it already
//! holds sealed values before a missing key file may be replaced.

use super::{NodeQuery, Store, StoreError};
use rivet_model::node::Node;
use rivet_support::secrets::{Key, Resealer, RotateReport, Secrets};
use std::path::Path;
use std::sync::Arc;

/// `node` with its driver_info secrets opened.
pub fn open_node(secrets: &Secrets, mut node: Node) -> Result<Node, StoreError> {
    let uuid = node.uuid.clone();
    secrets.open_info(&uuid, &mut node.driver_info)?;
    Ok(node)
}

/// Re-seal every node's driver_info secrets in the database at `url` with `new`, opening
/// the old values with `old` (`rivetd secrets rotate`). One write per node with the usual
/// version check, so a concurrent change is re-read, never overwritten. Values already
/// under `new` in the current format (v2) are left alone: running it again changes nothing;
/// v1 values are rewritten as v2 even when `new` is the key that sealed them.
pub async fn rotate(url: &str, old: &Secrets, new: &Key) -> Result<RotateReport, StoreError> {
    // The backends' own sealing is off: this function reads and writes the sealed text.
    let store: Arc<dyn Store> = super::open(url, Arc::new(Secrets::passthrough()))?;
    let new = Resealer::new(new);
    let mut report = RotateReport::default();
    let mut marker: Option<String> = None;
    loop {
        let page = store
            .list_nodes(&NodeQuery {
                limit: 500,
                marker: marker.clone(),
                ..NodeQuery::default()
            })
            .await?;
        let Some(last) = page.last() else { break };
        marker = Some(last.uuid.clone());
        for node in page {
            report.nodes_checked += 1;
            let mut node = node;
            // A node changed under us is read again; a handful of tries is plenty offline
            // and for a quiet fleet.
            for attempt in 0.. {
                let uuid = node.uuid.clone();
                let (changed, clear) = new.reseal_info(old, &uuid, &mut node.driver_info)?;
                if changed == 0 {
                    break;
                }
                match store.update_node(&node).await {
                    Ok(_) => {
                        report.nodes_changed += 1;
                        report.fields_resealed += changed;
                        report.fields_were_clear += clear;
                        break;
                    }
                    Err(StoreError::Conflict { .. }) if attempt < 5 => {
                        node = store.get_node(&uuid).await?;
                    }
                    Err(StoreError::NotFound { .. }) => break,
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(report)
}

/// Whether the SQLite file at `db` already stores sealed secrets (so its key exists somewhere).
/// A missing file or a database without nodes holds none.
pub fn holds_sealed_values(db: &Path) -> bool {
    if !db.exists() {
        return false;
    }
    let Ok(conn) =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
    else {
        return false;
    };
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM nodes WHERE driver_info LIKE '%rivet-sealed:%')",
        [],
        |r| r.get::<_, bool>(0),
    )
    .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rivet_support::secrets::SecretsConfig;
    use serde_json::json;

    #[test]
    fn lost_key_file_is_not_replaced_while_the_database_holds_sealed_values() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("r.db");
        let url = format!("sqlite:{}", db.display());
        let cfg = SecretsConfig::default();
        let secrets = Arc::new(
            Secrets::from_config(&cfg, &url, true, &holds_sealed_values).expect("generate"),
        );
        let store = super::super::open(&url, secrets).expect("open");
        let mut n = Node::new("u1".into(), "ipmi".into());
        n.driver_info = json!({"ipmi_address": "10.0.0.1", "ipmi_password": "hunter2"})
            .as_object()
            .cloned()
            .unwrap_or_default();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(store.create_node(&n)).expect("create");
        drop(store);
        std::fs::remove_file(dir.path().join("r.db.key")).expect("lose the key");
        let err = Secrets::from_config(&cfg, &url, true, &holds_sealed_values)
            .expect_err("must not regenerate");
        let msg = err.to_string();
        assert!(msg.contains("key file") && msg.contains("restore"), "{msg}");
        assert!(
            !dir.path().join("r.db.key").exists(),
            "a new key was written"
        );
    }
}
