//! `rivet-bench api`: node listing and single-node GET latency with N nodes in the store, and
//! rivetd's memory at that size.
//!
//! The store is pre-filled without rivetd running: the controller's own SQLite store
//! (`rivet_store::open`) creates the schema and writes one template node — a
//! cleaned, `available` fake-hardware node with properties, cached clean steps and agent
//! bookkeeping like the clean-fleet bench leaves behind. The other N − 1 rows are copies of
//! that row (`INSERT … SELECT` of every column but `id`, with a fresh `uuid` and `name`) in
//! one transaction, so every row has exactly the columns and encodings rivetd writes. Then
//! rivetd starts on the file and requests go one at a time over keep-alive.

use crate::rivetd::{Rivetd, Settings};
use crate::stats::{mib, ms, percentile};
use anyhow::{bail, Context, Result};
use chrono::Utc;
use rand::Rng;
use rivet_model::node::Node;
use rivet_protocol::states::{PowerState, ProvisionState};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Options of `rivet-bench api`.
#[derive(Debug, Clone)]
pub struct ApiOpts {
    /// Nodes in the store.
    pub nodes: usize,
    /// Requests per page measurement.
    pub page_requests: usize,
    /// Single-node GETs.
    pub get_requests: usize,
    /// Also restart rivetd with a 1 s power sync and report its peak RSS during a pass.
    pub power_sync_pass: bool,
    /// rivetd binary.
    pub rivetd: Option<PathBuf>,
    /// Keep the temporary directory.
    pub keep: bool,
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// The template: what a node looks like after enrolment, inspection-like properties and one
/// automated cleaning (the keys rivetd's cleaning engine leaves in driver_internal_info).
fn template(uuid: &str) -> Node {
    let mut n = Node::new(uuid.to_string(), "fake-hardware".into());
    let now = Utc::now();
    n.name = Some("node-template".into());
    n.driver_info = obj(json!({
        "deploy_kernel": "http://10.0.0.1:6385/boot/vmlinuz",
        "deploy_ramdisk": "http://10.0.0.1:6385/boot/rivet.initramfs",
        "fake_bmc_note": "rack 12, U 31",
    }));
    let step = |name: &str, priority: i64| {
        json!({"interface": "deploy", "step": name, "priority": priority, "abortable": true,
               "argsinfo": {}, "reboot_requested": false, "requires_ramdisk": true,
               "args": {}, "source": "agent"})
    };
    n.driver_internal_info = obj(json!({
        "agent_version": "0.1.0",
        "agent_last_heartbeat": now.to_rfc3339(),
        "cached_clean_steps": [step("erase_devices_metadata", 99), step("erase_devices", 10)],
        "cached_clean_steps_at": now.to_rfc3339(),
    }));
    n.properties = obj(json!({
        "cpus": 64, "memory_mb": 262144, "local_gb": 1788, "cpu_arch": "x86_64",
        "capabilities": "boot_mode:uefi",
    }));
    n.extra = obj(json!({"rack": "r12", "owner": "team-compute"}));
    n.provision_state = ProvisionState::Available;
    n.provision_updated_at = Some(now);
    // The template (first row) is "on" while the fake BMC says off: the first power-sync pass
    // records that one change and so logs its summary line (how the bench sees a pass end).
    n.power_state = Some(PowerState::On);
    n.resource_class = Some("bm-256-64-x86_64".into());
    n.conductor = Some("bench".into());
    n.inspect_interface = Some("agent".into());
    n.inspection_started_at = Some(now);
    n.inspection_finished_at = Some(now);
    n.traits = vec!["CUSTOM_NVME".into()];
    n
}

/// Fill `db` with `n` nodes; their UUIDs in id order.
pub(crate) async fn prefill(db: &Path, n: usize) -> Result<Vec<String>> {
    let path = db.to_str().context("database path is not UTF-8")?;
    let first = uuid::Uuid::new_v4().to_string();
    {
        // The template node holds no secret: any key will do.
        let secrets = rivet_support::secrets::Secrets::ephemeral();
        let store = rivet_store::open(&format!("sqlite:{path}"), secrets)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        store
            .create_node(&template(&first))
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let mut conn = rusqlite::Connection::open(path)?;
    let cols: Vec<String> = {
        let mut st = conn.prepare("SELECT name FROM pragma_table_info('nodes') ORDER BY cid")?;
        let rows = st.query_map([], |r| r.get::<_, String>(0))?;
        rows.collect::<Result<_, _>>()?
    };
    if !cols.iter().any(|c| c == "uuid") || !cols.iter().any(|c| c == "name") {
        bail!("nodes table has no uuid/name column: {cols:?}");
    }
    let copied: Vec<&String> = cols.iter().filter(|c| c.as_str() != "id").collect();
    let target = copied
        .iter()
        .map(|c| c.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let source = copied
        .iter()
        .map(|c| match c.as_str() {
            "uuid" => "?1",
            "name" => "?2",
            c => c,
        })
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!("INSERT INTO nodes ({target}) SELECT {source} FROM nodes WHERE uuid = ?3");
    let mut uuids = Vec::with_capacity(n);
    uuids.push(first.clone());
    let tx = conn.transaction()?;
    {
        let mut st = tx.prepare(&sql)?;
        for i in 1..n {
            let u = uuid::Uuid::new_v4().to_string();
            st.execute(rusqlite::params![u, format!("node-{i:06}"), first])?;
            uuids.push(u);
        }
    }
    tx.commit()?;
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")?;
    Ok(uuids)
}

/// Sequential GETs of `path_of(i)`; sorted latencies and the last body's size.
async fn timed_gets(
    http: &reqwest::Client,
    base: &str,
    count: usize,
    path_of: impl Fn(usize) -> String,
) -> Result<(Vec<Duration>, usize)> {
    let mut lat = Vec::with_capacity(count);
    let mut size = 0;
    for i in 0..count {
        let path = path_of(i);
        let t = Instant::now();
        let resp = http
            .get(format!("{base}{path}"))
            .header("X-OpenStack-Ironic-API-Version", "latest")
            .send()
            .await?;
        let status = resp.status();
        let body = resp.bytes().await?;
        lat.push(t.elapsed());
        if !status.is_success() {
            bail!("GET {path}: {status} {}", String::from_utf8_lossy(&body));
        }
        size = body.len();
    }
    lat.sort_unstable();
    Ok((lat, size))
}

/// `rivet-bench api`.
pub async fn run(o: ApiOpts) -> Result<Vec<String>> {
    let n = o.nodes;
    if n < 2 {
        bail!("--nodes must be at least 2");
    }
    let exe = crate::rivetd::locate(o.rivetd.as_deref())?;
    let dir = tempfile::Builder::new().prefix("rivet-bench-").tempdir()?;
    let db = dir.path().join("rivet.db");
    let t = Instant::now();
    let uuids = prefill(&db, n).await?;
    let db_size = std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "pre-filled {n} nodes in {:.1} s (one transaction); database {:.1} MiB",
        t.elapsed().as_secs_f64(),
        db_size as f64 / (1 << 20) as f64
    );

    // Run A: rivetd's default settings (its first power-sync pass is 60 s after start; the
    // measurements below end well before that and the bench checks it).
    let settings = Settings::default();
    let started = Instant::now();
    let mut d = Rivetd::start(&exe, dir.path(), &db, &settings).await?;
    let start_s = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle_rss = d.rss_kib();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()?;
    let base = d.url.clone();
    let all = crate::procstat::MachineMeter::start();
    let cpu = crate::procstat::CpuMeter::start(Some(d.pid()));
    let me = crate::procstat::CpuMeter::start(None);
    // Warm-up: a few of each (page cache, prepared statements, allocator).
    timed_gets(&http, &base, 3, |_| "/v1/nodes/detail?limit=1000".into()).await?;
    let (first, first_size) = timed_gets(&http, &base, o.page_requests, |_| {
        "/v1/nodes/detail?limit=1000".into()
    })
    .await?;
    let marker = uuids[n / 2].clone();
    let (middle, middle_size) = timed_gets(&http, &base, o.page_requests, |_| {
        format!("/v1/nodes/detail?limit=1000&marker={marker}")
    })
    .await?;
    let (plain, plain_size) = timed_gets(&http, &base, o.page_requests, |_| {
        format!("/v1/nodes?limit=1000&marker={marker}")
    })
    .await?;
    let picks: Vec<String> = {
        let mut rng = rand::thread_rng();
        (0..o.get_requests)
            .map(|_| uuids[rng.gen_range(0..n)].clone())
            .collect()
    };
    let (single, single_size) = timed_gets(&http, &base, o.get_requests, |i| {
        format!("/v1/nodes/{}", picks[i])
    })
    .await?;
    let (cores, gen) = (cpu.cores(), me.cores());
    let other = (all.cores() - cores - gen).max(0.0);
    eprintln!("during the requests: rivetd {cores:.2} cores, generator {gen:.2}, other processes {other:.2}");
    let after_rss = d.rss_kib();
    let hwm = d.hwm_kib();
    if started.elapsed() > Duration::from_secs(settings.power_sync_interval_s) {
        eprintln!("warning: the measurements ran past rivetd's first power-sync pass");
    }
    d.stop();

    let mut rows = Vec::new();
    let page_row = |what: &str, lat: &[Duration], size: usize, cmd_extra: &str| {
        format!(
            "| api: {n} nodes, {what} | p50 {}, p99 {} ({} requests one at a time, {:.0} KiB each; other processes {other:.2} cores) | `rivet-bench api --nodes {n}{cmd_extra}` |",
            ms(percentile(lat, 50.0)),
            ms(percentile(lat, 99.0)),
            lat.len(),
            size as f64 / 1024.0
        )
    };
    rows.push(page_row(
        "`GET /v1/nodes/detail?limit=1000`, first page",
        &first,
        first_size,
        "",
    ));
    rows.push(page_row(
        "`GET /v1/nodes/detail?limit=1000&marker=…`, page from the middle",
        &middle,
        middle_size,
        "",
    ));
    rows.push(page_row(
        "`GET /v1/nodes?limit=1000&marker=…` (no detail), page from the middle",
        &plain,
        plain_size,
        "",
    ));
    rows.push(page_row(
        "`GET /v1/nodes/{uuid}`, random nodes",
        &single,
        single_size,
        "",
    ));

    let mut rss = format!(
        "{} after start ({start_s:.1} s to answer), {} after the requests (peak {})",
        mib(idle_rss),
        mib(after_rss),
        mib(hwm)
    );
    if o.power_sync_pass {
        // Run B: the same file, power sync every second; peak RSS once a pass has ended.
        let settings = Settings {
            power_sync_interval_s: 1,
            ..Settings::default()
        };
        let mut d = Rivetd::start(&exe, dir.path(), &db, &settings).await?;
        let t = Instant::now();
        let deadline = t + Duration::from_secs(120);
        loop {
            let log = std::fs::read_to_string(&d.log).unwrap_or_default();
            if log.contains("power sync pass") {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "no power-sync pass ended within 120 s; see {}",
                    d.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let pass_s = t.elapsed().as_secs_f64() - 1.0;
        rss.push_str(&format!(
            "; peak {} during a power-sync pass over every node (~{pass_s:.1} s)",
            mib(d.hwm_kib())
        ));
        d.stop();
    }
    rows.push(format!(
        "| api: rivetd RSS with {n} nodes | {rss} | `rivet-bench api --nodes {n}` |"
    ));
    if o.keep {
        eprintln!("kept {}", dir.keep().display());
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn prefill_copies_rows_the_store_reads_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("t.db");
        let uuids = prefill(&db, 50).await.expect("prefill");
        assert_eq!(uuids.len(), 50);
        let store = rivet_store::open(
            &format!("sqlite:{}", db.display()),
            rivet_support::secrets::Secrets::ephemeral(),
        )
        .expect("open");
        let n = store.get_node(&uuids[49]).await.expect("read back");
        assert_eq!(n.name.as_deref(), Some("node-000049"));
        assert_eq!(n.provision_state, ProvisionState::Available);
        assert!(n.driver_internal_info.contains_key("cached_clean_steps"));
        let all = store
            .list_nodes(&rivet_store::NodeQuery {
                limit: 1000,
                ..Default::default()
            })
            .await
            .expect("list");
        assert_eq!(all.len(), 50);
        assert_eq!(all[10].uuid, uuids[10], "id order is insertion order");
    }
}
