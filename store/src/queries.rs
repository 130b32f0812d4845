//! Every query of the store, written once for both engines ([`super::sql::Engine`]): the
//! [`super::Store`] implementation itself. Where the dialects differ the text takes a
//! fragment from [`Dialect`]; only the lease statement has a form per dialect (PostgreSQL
//! takes and reports the lease in one round trip, SQLite cannot write inside a `WITH`).

use super::decode::Decoder;
use super::records::{
    Allocation, AllocationQuery, NodeCount, StepTemplate, TemplateKind, TemplateQuery,
};
use super::sql::{placeholders, Access, Arg, Dialect, Engine, ExecError, SqlRow};
use super::PortgroupQuery;
use super::{
    AuditEntry, AuditQuery, ChassisQuery, ConductorRecord, NodeExt, NodeQuery, Notice, PortQuery,
    SortDir, Store, StoreError, StoredCommand, CHASSIS_SORT_KEYS, NODE_SORT_KEYS,
};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rivet_model::node::{Attributes, Chassis, Liveness, Node, NodeSummary};
use rivet_model::port::Port;
use rivet_model::port::Portgroup;
use rivet_model::runs::Runs;
use rivet_protocol::agent::{Command, CommandResult};
use rivet_protocol::states::ProvisionState;
use serde_json::{Map, Value};
use std::sync::{Arc, LazyLock};

/// The store over an engine.
pub struct SqlStore<E> {
    pub(crate) engine: E,
    /// Seals driver_info secrets on write, opens them on read.
    secrets: Arc<rivet_support::secrets::Secrets>,
}

impl<E: Engine> SqlStore<E> {
    pub(crate) fn new(engine: E, secrets: Arc<rivet_support::secrets::Secrets>) -> SqlStore<E> {
        SqlStore { engine, secrets }
    }

    fn dialect(&self) -> Dialect {
        self.engine.dialect()
    }

    async fn one<T>(
        &self,
        access: Access,
        sql: &str,
        args: Vec<Arg>,
        read: impl FnOnce(E::Row) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        let _timer = rivet_support::metrics::store_query(access.label());
        let rows = self.engine.rows(access, sql, args).await?;
        rows.into_iter().next().map(read).transpose()
    }

    async fn all<T>(
        &self,
        access: Access,
        sql: &str,
        args: Vec<Arg>,
        read: impl FnMut(E::Row) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let _timer = rivet_support::metrics::store_query(access.label());
        let rows = self.engine.rows(access, sql, args).await?;
        rows.into_iter().map(read).collect()
    }

    async fn write(&self, sql: &str, args: Vec<Arg>) -> Result<u64, StoreError> {
        let _timer = rivet_support::metrics::store_query(Access::Write.label());
        self.engine.execute(sql, args).await.map_err(|e| match e {
            ExecError::Unique(what) => StoreError::Duplicate(what),
            ExecError::Store(e) => e,
        })
    }

    fn open_nodes(&self, rows: Vec<E::Row>) -> Result<Vec<Node>, StoreError> {
        rows.into_iter()
            .map(|r| node_from_row(r).and_then(|n| super::sealing::open_node(&self.secrets, n)))
            .collect()
    }
}

/// Node columns a node write sets, in one order for INSERT and UPDATE.
const NODE_COLUMNS: [&str; 48] = [
    "uuid",
    "name",
    "driver",
    "driver_info",
    "driver_internal_info",
    "properties",
    "instance_info",
    "instance_uuid",
    "extra",
    "provision_state",
    "target_provision_state",
    "provision_updated_at",
    "power_state",
    "target_power_state",
    "maintenance",
    "maintenance_reason",
    "fault",
    "last_error",
    "clean_step",
    "deploy_step",
    "reservation",
    "conductor",
    "automated_clean",
    "resource_class",
    "created_at",
    "updated_at",
    "version",
    "inspect_interface",
    "inspection_started_at",
    "inspection_finished_at",
    "traits",
    "interfaces",
    "run_state",
    "owner",
    "lessee",
    "description",
    "conductor_group",
    "shard",
    "instance_name",
    "parent_node",
    "network_data",
    "retired",
    "retired_reason",
    "protected",
    "protected_reason",
    "disable_power_off",
    "chassis_uuid",
    "health",
];

/// What a node read selects: [`NODE_COLUMNS`], then the liveness columns, which node writes
/// never touch ([`Store::record_liveness`]).
static NODE_SELECT: LazyLock<String> = LazyLock::new(|| {
    let mut cols = NODE_COLUMNS.to_vec();
    cols.extend(["agent_last_heartbeat", "agent_version", "step_progress"]);
    // Derived, never written with the node: the allocation holding it (its own table).
    cols.push("(SELECT a.uuid FROM allocations a WHERE a.node_uuid = nodes.uuid)");
    cols.join(", ")
});

static NODE_INSERT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO nodes ({}) VALUES ({})",
        NODE_COLUMNS.join(", "),
        placeholders(1, NODE_COLUMNS.len())
    )
});

const CHASSIS_SELECT: &str = "uuid, description, extra, created_at, updated_at, version";

fn chassis_from_row(mut r: impl SqlRow) -> Result<Chassis, StoreError> {
    Ok(Chassis {
        uuid: r.text(0)?,
        description: r.opt_text(1)?,
        extra: match serde_json::from_str(&r.json(2)?.unwrap_or_default()) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        },
        created_at: r.time(3)?.unwrap_or_else(Utc::now),
        updated_at: r.time(4)?,
        version: r.int(5)?,
    })
}

const AUDIT_SELECT: &str =
    "seq, created_at, actor, source, method, path, node_uuid, action, status, detail";

fn node_from_row(mut r: impl SqlRow) -> Result<Node, StoreError> {
    let mut d = Decoder::default();
    let mut node = Node {
        uuid: r.text(0)?,
        name: r.opt_text(1)?,
        driver: r.text(2)?,
        driver_info: d.map("driver_info", &r.json(3)?.unwrap_or_default()),
        driver_internal_info: d.map("driver_internal_info", &r.json(4)?.unwrap_or_default()),
        properties: d.map("properties", &r.json(5)?.unwrap_or_default()),
        instance_info: d.map("instance_info", &r.json(6)?.unwrap_or_default()),
        instance_uuid: r.opt_text(7)?,
        extra: d.map("extra", &r.json(8)?.unwrap_or_default()),
        provision_state: d.parse("provision_state", &r.text(9)?, ProvisionState::Error),
        target_provision_state: d.opt_parse("target_provision_state", r.opt_text(10)?.as_deref()),
        provision_updated_at: r.time(11)?,
        power_state: d.opt_parse("power_state", r.opt_text(12)?.as_deref()),
        target_power_state: d.opt_parse("target_power_state", r.opt_text(13)?.as_deref()),
        maintenance: r.flag(14)?,
        maintenance_reason: r.opt_text(15)?,
        fault: r.opt_text(16)?,
        last_error: r.opt_text(17)?,
        clean_step: d.opt_value("clean_step", r.json(18)?.as_deref()),
        deploy_step: d.opt_value("deploy_step", r.json(19)?.as_deref()),
        reservation: r.opt_text(20)?,
        conductor: r.opt_text(21)?,
        automated_clean: r.opt_flag(22)?,
        resource_class: r.opt_text(23)?,
        created_at: r.time(24)?.unwrap_or_else(Utc::now),
        updated_at: r.time(25)?,
        version: r.int(26)?,
        inspect_interface: r.opt_text(27)?,
        inspection_started_at: r.time(28)?,
        inspection_finished_at: r.time(29)?,
        traits: d.json("traits", Some(r.json(30)?.as_deref().unwrap_or("[]"))),
        interfaces: d.json("interfaces", r.json(31)?.as_deref()),
        runs: Runs::default(),
        attrs: Attributes {
            owner: r.opt_text(33)?,
            lessee: r.opt_text(34)?,
            description: r.opt_text(35)?,
            conductor_group: r.opt_text(36)?.unwrap_or_default(),
            shard: r.opt_text(37)?,
            instance_name: r.opt_text(38)?,
            parent_node: r.opt_text(39)?,
            network_data: d.map("network_data", &r.json(40)?.unwrap_or_default()),
            retired: r.flag(41)?,
            retired_reason: r.opt_text(42)?,
            protected: r.flag(43)?,
            protected_reason: r.opt_text(44)?,
            disable_power_off: r.flag(45)?,
        },
        corrupt: None,
        chassis_uuid: r.opt_text(46)?,
        health: r.opt_text(47)?,
        liveness: Liveness {
            last_heartbeat: r.time(48)?,
            agent_version: r.opt_text(49)?,
            progress: d.opt_value("step_progress", r.json(50)?.as_deref()),
        },
        allocation_uuid: r.opt_text(NODE_COLUMNS.len() + 3)?,
    };
    node.runs = decode_runs(&mut d, r.json(32)?, &mut node.driver_internal_info);
    node.corrupt = d.finish();
    Ok(node)
}

/// The `run_state` column; for a node written before it existed (NULL), the bookkeeping
/// still in `dii`, moved out of it.
fn decode_runs(d: &mut Decoder, run_state: Option<String>, dii: &mut Map<String, Value>) -> Runs {
    match run_state {
        Some(text) => d.json("run_state", Some(&text)),
        None => Runs::take_legacy(dii).unwrap_or_else(|e| {
            d.fail("driver_internal_info", e);
            Runs::default()
        }),
    }
}

fn map_text(m: &Map<String, Value>) -> Arg {
    Arg::Json(Value::Object(m.clone()).to_string())
}

fn opt_json(v: &Option<Value>) -> Arg {
    Arg::json(v.as_ref().map(Value::to_string))
}

/// Text from outside (an agent's or a BMC's error message) fit for a text column:
/// PostgreSQL text cannot hold NUL (U+0000), so on both engines it becomes U+FFFD rather
/// than make the node unwritable on one of them.
fn free_text(s: &Option<String>) -> Arg {
    s.as_ref().map(|s| s.replace('\0', "\u{FFFD}")).into()
}

/// A node's values in [`NODE_COLUMNS`] order, with its `driver_info` sealed
/// ([`rivet_support::secrets::Secrets::seal_info`]).
fn node_values(n: &Node, driver_info: String) -> Vec<Arg> {
    let state = |s: Option<ProvisionState>| Arg::from(s.map(|s| s.as_str()));
    let power = |s: Option<rivet_protocol::states::PowerState>| Arg::from(s.map(|s| s.as_str()));
    vec![
        n.uuid.as_str().into(),
        n.name.clone().into(),
        n.driver.as_str().into(),
        Arg::Json(driver_info),
        map_text(&n.driver_internal_info),
        map_text(&n.properties),
        map_text(&n.instance_info),
        n.instance_uuid.clone().into(),
        map_text(&n.extra),
        n.provision_state.as_str().into(),
        state(n.target_provision_state),
        n.provision_updated_at.into(),
        power(n.power_state),
        power(n.target_power_state),
        n.maintenance.into(),
        free_text(&n.maintenance_reason),
        free_text(&n.fault),
        free_text(&n.last_error),
        opt_json(&n.clean_step),
        opt_json(&n.deploy_step),
        n.reservation.clone().into(),
        n.conductor.clone().into(),
        n.automated_clean.into(),
        n.resource_class.clone().into(),
        n.created_at.into(),
        n.updated_at.into(),
        n.version.into(),
        n.inspect_interface.clone().into(),
        n.inspection_started_at.into(),
        n.inspection_finished_at.into(),
        Arg::Json(serde_json::to_string(&n.traits).unwrap_or_else(|_| "[]".into())),
        Arg::json(serde_json::to_string(&n.interfaces).ok()),
        Arg::json(serde_json::to_string(&n.runs).ok()),
        free_text(&n.attrs.owner),
        free_text(&n.attrs.lessee),
        free_text(&n.attrs.description),
        n.attrs.conductor_group.as_str().into(),
        n.attrs.shard.clone().into(),
        free_text(&n.attrs.instance_name),
        n.attrs.parent_node.clone().into(),
        map_text(&n.attrs.network_data),
        n.attrs.retired.into(),
        free_text(&n.attrs.retired_reason),
        n.attrs.protected.into(),
        free_text(&n.attrs.protected_reason),
        n.attrs.disable_power_off.into(),
        n.chassis_uuid.clone().into(),
        free_text(&n.health),
    ]
}

/// What [`summary_from_row`] reads; `driver_internal_info` only for a node written before
/// `run_state` existed, whose run is still in it.
const SUMMARY_SELECT: &str = "uuid, name, provision_state, maintenance, reservation, \
    provision_updated_at, created_at, clean_step, deploy_step, run_state, agent_last_heartbeat, \
    agent_version, step_progress, CASE WHEN run_state IS NULL THEN driver_internal_info END";

fn summary_from_row(mut r: impl SqlRow) -> Result<NodeSummary, StoreError> {
    let mut d = Decoder::default();
    let mut s = NodeSummary {
        uuid: r.text(0)?,
        name: r.opt_text(1)?,
        provision_state: d.parse("provision_state", &r.text(2)?, ProvisionState::Error),
        maintenance: r.flag(3)?,
        reservation: r.opt_text(4)?,
        provision_updated_at: r.time(5)?,
        created_at: r.time(6)?.unwrap_or_else(Utc::now),
        clean_step: d.opt_value("clean_step", r.json(7)?.as_deref()),
        deploy_step: d.opt_value("deploy_step", r.json(8)?.as_deref()),
        runs: Runs::default(),
        liveness: Liveness {
            last_heartbeat: r.time(10)?,
            agent_version: r.opt_text(11)?,
            progress: d.opt_value("step_progress", r.json(12)?.as_deref()),
        },
        corrupt: false,
    };
    let run_state = r.json(9)?;
    let mut dii = match r.json(13)? {
        Some(text) => d.map("driver_internal_info", &text),
        None => Map::new(),
    };
    s.runs = decode_runs(&mut d, run_state, &mut dii);
    s.corrupt = d.finish().is_some();
    Ok(s)
}

fn audit_from_row(mut r: impl SqlRow) -> Result<AuditEntry, StoreError> {
    Ok(AuditEntry {
        seq: r.int(0)?,
        created_at: r.time(1)?.unwrap_or_else(Utc::now),
        actor: r.text(2)?,
        source: r.opt_text(3)?,
        method: r.opt_text(4)?,
        path: r.opt_text(5)?,
        node_uuid: r.opt_text(6)?,
        action: r.text(7)?,
        status: r.opt_int(8)?.and_then(|s| u16::try_from(s).ok()),
        detail: r.opt_text(9)?,
    })
}

/// A JSON document stored by the store itself (a command, a rule, an inventory).
fn parse_json<T: serde::de::DeserializeOwned>(
    what: &str,
    text: Option<String>,
) -> Result<T, StoreError> {
    serde_json::from_str(text.as_deref().unwrap_or("null"))
        .map_err(|e| StoreError::Backend(format!("stored {what} does not decode: {e}")))
}

fn to_json(v: &impl serde::Serialize) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Backend(e.to_string()))
}

fn not_found(kind: &'static str, ident: &str) -> StoreError {
    StoreError::NotFound {
        kind,
        ident: ident.to_string(),
    }
}

/// A listing's `LIMIT` argument.
fn limit_arg(limit: usize) -> Arg {
    Arg::Int(i64::try_from(limit).unwrap_or(i64::MAX))
}

#[async_trait]
impl<E: Engine> Store for SqlStore<E> {
    async fn create_node(&self, node: &Node) -> Result<Node, StoreError> {
        let mut n = node.clone();
        n.version = 1;
        n.updated_at = None;
        let values = node_values(&n, self.secrets.seal_info(&n.uuid, &n.driver_info));
        let _timer = rivet_support::metrics::store_query(Access::Write.label());
        match self.engine.execute(&NODE_INSERT, values).await {
            Ok(_) => Ok(n),
            Err(ExecError::Unique(what)) if what.contains("name") => {
                Err(StoreError::Duplicate(format!(
                    "a node named {:?} already exists",
                    n.name.as_deref().unwrap_or_default()
                )))
            }
            Err(ExecError::Unique(_)) => Err(StoreError::Duplicate(format!(
                "a node with UUID {} already exists",
                n.uuid
            ))),
            Err(ExecError::Store(e)) => Err(e),
        }
    }

    async fn get_node(&self, ident: &str) -> Result<Node, StoreError> {
        let sql = format!(
            "SELECT {} FROM nodes WHERE uuid = $1 OR name = $1 LIMIT 1",
            *NODE_SELECT
        );
        let rows = self
            .engine
            .rows(Access::Read, &sql, vec![ident.into()])
            .await?;
        self.open_nodes(rows)?
            .pop()
            .ok_or_else(|| not_found("node", ident))
    }

    async fn list_nodes(&self, q: &NodeQuery) -> Result<Vec<Node>, StoreError> {
        if q.sort_key != "id" && !NODE_SORT_KEYS.contains(&q.sort_key.as_str()) {
            return Err(StoreError::Backend(format!(
                "invalid sort key {}",
                q.sort_key
            )));
        }
        let expr = self.dialect().sort_expr(&q.sort_key);
        let mut wheres: Vec<String> = Vec::new();
        let mut args: Vec<Arg> = Vec::new();
        if let Some(marker) = &q.marker {
            let id = self
                .one(
                    Access::Read,
                    "SELECT id FROM nodes WHERE uuid = $1",
                    vec![marker.as_str().into()],
                    |mut r| r.int(0),
                )
                .await?
                .ok_or_else(|| not_found("marker node", marker))?;
            let op = if q.sort_dir == SortDir::Asc { ">" } else { "<" };
            args.push(id.into());
            // By id alone, a plain range the primary key serves (the row-value form below
            // makes SQLite scan every row).
            wheres.push(if q.sort_key == "id" {
                format!("id {op} ${}", args.len())
            } else {
                format!(
                    "({expr}, id) {op} (SELECT {expr}, id FROM nodes WHERE id = ${})",
                    args.len()
                )
            });
        }
        let mut filter = |column: &str, value: Arg| {
            args.push(value);
            wheres.push(format!("{column} = ${}", args.len()));
        };
        if let Some(s) = q.provision_state {
            filter("provision_state", s.as_str().into());
        }
        if let Some(m) = q.maintenance {
            filter("maintenance", m.into());
        }
        if let Some(d) = &q.driver {
            filter("driver", d.as_str().into());
        }
        if let Some(rc) = &q.resource_class {
            filter("resource_class", rc.as_str().into());
        }
        for (column, value) in [
            ("owner", &q.owner),
            ("lessee", &q.lessee),
            ("conductor_group", &q.conductor_group),
            ("shard", &q.shard),
            ("instance_uuid", &q.instance_uuid),
            ("fault", &q.fault),
            ("chassis_uuid", &q.chassis_uuid),
            ("instance_name", &q.instance_name),
        ] {
            if let Some(v) = value {
                filter(column, v.as_str().into());
            }
        }
        if let Some(r) = q.retired {
            filter("retired", r.into());
        }
        if let Some(a) = q.associated {
            wheres.push(format!(
                "instance_uuid IS {}NULL",
                if a { "NOT " } else { "" }
            ));
        }
        if !q.shards.is_empty() {
            let first = args.len() + 1;
            args.extend(q.shards.iter().map(|s| Arg::from(s.as_str())));
            wheres.push(format!(
                "shard IN ({})",
                placeholders(first, q.shards.len())
            ));
        }
        if let Some(s) = q.sharded {
            wheres.push(format!("shard IS {}NULL", if s { "NOT " } else { "" }));
        }
        if let Some(p) = &q.project {
            args.push(p.as_str().into());
            wheres.push(format!("(owner = ${0} OR lessee = ${0})", args.len()));
        }
        if let Some(d) = &q.description_contains {
            // A substring match (both dialects); `_`, `%` and `\` in the text are literal.
            let escaped = d
                .replace('\\', "\\\\")
                .replace('%', "\\%")
                .replace('_', "\\_");
            args.push(format!("%{escaped}%").into());
            wheres.push(format!("description LIKE ${} ESCAPE '\\'", args.len()));
        }
        if let Some(p) = &q.parent_node {
            args.push(p.as_str().into());
            wheres.push(format!("parent_node = ${}", args.len()));
        } else if q.hide_children {
            wheres.push("parent_node IS NULL".into());
        }
        let dir = if q.sort_dir == SortDir::Asc {
            "ASC"
        } else {
            "DESC"
        };
        args.push(limit_arg(q.limit));
        let sql = format!(
            "SELECT {} FROM nodes {} ORDER BY {expr} {dir}, id {dir} LIMIT ${}",
            *NODE_SELECT,
            super::where_clause(&wheres),
            args.len()
        );
        let _timer = rivet_support::metrics::store_query(Access::Scan.label());
        let rows = self.engine.rows(Access::Scan, &sql, args).await?;
        self.open_nodes(rows)
    }

    async fn nodes_in_states(&self, states: &[ProvisionState]) -> Result<Vec<Node>, StoreError> {
        if states.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT {} FROM nodes WHERE provision_state IN ({}) ORDER BY id",
            *NODE_SELECT,
            placeholders(1, states.len())
        );
        let args = states.iter().map(|s| s.as_str().into()).collect();
        let _timer = rivet_support::metrics::store_query(Access::Scan.label());
        let rows = self.engine.rows(Access::Scan, &sql, args).await?;
        self.open_nodes(rows)
    }

    async fn node_summary(&self, ident: &str) -> Result<NodeSummary, StoreError> {
        let sql =
            format!("SELECT {SUMMARY_SELECT} FROM nodes WHERE uuid = $1 OR name = $1 LIMIT 1");
        self.one(Access::Read, &sql, vec![ident.into()], summary_from_row)
            .await?
            .ok_or_else(|| not_found("node", ident))
    }

    async fn node_summary_and_pending(
        &self,
        ident: &str,
    ) -> Result<(NodeSummary, Vec<Command>), StoreError> {
        // The same commands, in the same order, as pending_commands.
        let sql = format!(
            "SELECT {SUMMARY_SELECT}, (SELECT {} FROM agent_commands c \
             WHERE c.node_uuid = nodes.uuid AND c.result IS NULL AND c.cancelled = FALSE) \
             FROM nodes WHERE uuid = $1 OR name = $1 LIMIT 1",
            self.dialect().json_array_of("c.command", "c.seq")
        );
        let (summary, pending) = self
            .one(Access::Read, &sql, vec![ident.into()], |mut r| {
                let pending = r.json(14)?;
                Ok((summary_from_row(r)?, pending))
            })
            .await?
            .ok_or_else(|| not_found("node", ident))?;
        let pending: Option<Vec<Command>> = parse_json("commands", pending)?;
        Ok((summary, pending.unwrap_or_default()))
    }

    async fn node_summaries(
        &self,
        states: &[ProvisionState],
    ) -> Result<Vec<NodeSummary>, StoreError> {
        if states.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT {SUMMARY_SELECT} FROM nodes WHERE provision_state IN ({}) ORDER BY id",
            placeholders(1, states.len())
        );
        let args = states.iter().map(|s| s.as_str().into()).collect();
        self.all(Access::Scan, &sql, args, summary_from_row).await
    }

    async fn node_summaries_page(
        &self,
        states: &[ProvisionState],
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<NodeSummary>, StoreError> {
        if states.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let mut args: Vec<Arg> = states.iter().map(|s| s.as_str().into()).collect();
        // `provision_state || ''`: the state's index must not be used here. Both engines
        // would take it for the IN list and then sort every matching node to return the first
        // page — for each page, so a scan over 10,000 waiting nodes read 200,000 rows. Without
        // it, they walk the UUID index from `after` and stop after `limit` matches.
        let mut sql = format!(
            "SELECT {SUMMARY_SELECT} FROM nodes WHERE (provision_state || '') IN ({})",
            placeholders(1, states.len())
        );
        if let Some(after) = after {
            args.push(after.into());
            sql.push_str(&format!(" AND uuid > ${}", args.len()));
        }
        args.push(limit_arg(limit));
        sql.push_str(&format!(" ORDER BY uuid LIMIT ${}", args.len()));
        self.all(Access::Scan, &sql, args, summary_from_row).await
    }

    async fn update_node(&self, node: &Node) -> Result<Node, StoreError> {
        node.writable()?;
        let mut n = node.clone();
        let expected = n.version;
        n.version += 1;
        n.updated_at = Some(Utc::now());
        let mut values = node_values(&n, self.secrets.seal_info(&n.uuid, &n.driver_info));
        values.push(expected.into());
        // Row-value UPDATE: the same column list and order as INSERT (uuid, $1, is the key).
        let sql = format!(
            "UPDATE nodes SET ({}) = ({}) WHERE uuid = $1 AND version = ${} AND {}",
            NODE_COLUMNS[1..].join(", "),
            placeholders(2, NODE_COLUMNS.len() - 1),
            values.len(),
            self.dialect().node_intact()
        );
        let timer = rivet_support::metrics::store_query(Access::Write.label());
        let written = self.engine.execute(&sql, values).await;
        drop(timer);
        match written {
            Ok(1) => Ok(n),
            Ok(_) => {
                let exists = self
                    .one(
                        Access::Read,
                        "SELECT 1 FROM nodes WHERE uuid = $1",
                        vec![n.uuid.as_str().into()],
                        |_| Ok(()),
                    )
                    .await?
                    .is_some();
                if exists {
                    Err(StoreError::Conflict {
                        kind: "node",
                        ident: n.uuid.clone(),
                        expected,
                    })
                } else {
                    Err(not_found("node", &n.uuid))
                }
            }
            Err(ExecError::Unique(_)) => Err(StoreError::Duplicate(format!(
                "a node named {:?} already exists",
                n.name.as_deref().unwrap_or_default()
            ))),
            Err(ExecError::Store(e)) => Err(e),
        }
    }

    async fn record_liveness_many(
        &self,
        records: &[(String, Liveness)],
    ) -> Result<u64, StoreError> {
        if records.is_empty() {
            return Ok(0);
        }
        // The batch goes as one JSON array argument, so the text (and PostgreSQL's prepared
        // statement) is the same whatever the batch size. Absent members read as NULL on both
        // engines (a JSON null might not). Times in the text SQLite stores them as (RFC 3339,
        // microseconds), which PostgreSQL parses.
        let rows: Vec<Value> = records
            .iter()
            .map(|(uuid, l)| {
                let mut row = Map::new();
                row.insert("uuid".into(), Value::String(uuid.clone()));
                if let Some(t) = l.last_heartbeat {
                    row.insert(
                        "at".into(),
                        t.to_rfc3339_opts(chrono::SecondsFormat::Micros, false)
                            .into(),
                    );
                }
                if let Some(v) = &l.agent_version {
                    row.insert("version".into(), Value::String(v.clone()));
                }
                if let Some(p) = &l.progress {
                    row.insert("progress".into(), p.clone());
                }
                Value::Object(row)
            })
            .collect();
        let d = self.dialect();
        let sql = format!(
            "UPDATE nodes SET agent_last_heartbeat = {}, agent_version = (v.value ->> 'version'), \
             step_progress = (v.value -> 'progress') FROM {} WHERE nodes.uuid = (v.value ->> 'uuid')",
            d.time_from_text("v.value ->> 'at'"),
            d.json_rows("$1")
        );
        self.write(&sql, vec![Arg::Json(to_json(&rows)?)]).await
    }

    async fn delete_node(&self, uuid: &str, version: i64) -> Result<(), StoreError> {
        // Ports, queued commands and the inventory go with it (ON DELETE CASCADE).
        let n = self
            .write(
                "DELETE FROM nodes WHERE uuid = $1 AND version = $2",
                vec![uuid.into(), version.into()],
            )
            .await?;
        if n != 1 {
            return Err(StoreError::Conflict {
                kind: "node",
                ident: uuid.to_string(),
                expected: version,
            });
        }
        Ok(())
    }

    async fn release_reservations(&self, conductor: &str) -> Result<u64, StoreError> {
        self.write(
            "UPDATE nodes SET reservation = NULL, version = version + 1 WHERE reservation = $1",
            vec![conductor.into()],
        )
        .await
    }

    async fn conductor_heartbeat(
        &self,
        id: &str,
        hostname: &str,
        starting: bool,
    ) -> Result<(), StoreError> {
        // `now()` is the database's clock (SQLite's is this process's: see sqlite.rs).
        self.write(
            "INSERT INTO conductors (id, hostname, started_at, last_seen, online) \
             VALUES ($1, $2, now(), now(), TRUE) \
             ON CONFLICT (id) DO UPDATE SET hostname = excluded.hostname, \
             last_seen = excluded.last_seen, online = TRUE, \
             started_at = CASE WHEN $3 THEN excluded.started_at ELSE conductors.started_at END",
            vec![id.into(), hostname.into(), starting.into()],
        )
        .await
        .map(|_| ())
    }

    async fn conductor_stopped(&self, id: &str) -> Result<(), StoreError> {
        self.write(
            "UPDATE conductors SET online = FALSE WHERE id = $1",
            vec![id.into()],
        )
        .await
        .map(|_| ())
    }

    async fn list_conductors(&self, dead_after_s: u64) -> Result<Vec<ConductorRecord>, StoreError> {
        let sql = format!(
            "SELECT id, hostname, started_at, last_seen, now(), online FROM conductors ORDER BY id{}",
            self.dialect().bytewise()
        );
        let dead = chrono::Duration::seconds(i64::try_from(dead_after_s).unwrap_or(i64::MAX));
        self.all(Access::Read, &sql, vec![], |mut r| {
            let last_seen = r.time(3)?.unwrap_or_default();
            let now = r.time(4)?.unwrap_or_else(Utc::now);
            Ok(ConductorRecord {
                id: r.text(0)?,
                hostname: r.text(1)?,
                started_at: r.time(2)?.unwrap_or_default(),
                alive: r.flag(5)? && now - last_seen < dead,
                last_seen,
            })
        })
        .await
    }

    async fn acquire_lease(
        &self,
        uuid: &str,
        id: &str,
        dead_after_s: u64,
    ) -> Result<bool, StoreError> {
        // Take the node when it is free or its holder has not heartbeat within
        // `dead_after_s` by the database's clock; then say who holds it.
        let take = format!(
            "UPDATE nodes SET version = version + 1, reservation = $2 \
             WHERE uuid = $1 AND (reservation IS NULL OR reservation <> $2) \
               AND (reservation IS NULL OR NOT EXISTS (SELECT 1 FROM conductors c \
                   WHERE c.id = nodes.reservation AND c.online AND c.last_seen > {}))",
            self.dialect().ago("$3")
        );
        let args = vec![uuid.into(), id.into(), Arg::Float(dead_after_s as f64)];
        let holder = match self.dialect() {
            // One round trip: the UPDATE's own row, or the unchanged row when nothing was
            // taken.
            Dialect::Postgres => {
                let sql = format!(
                    "WITH taken AS ({take} RETURNING reservation) \
                     SELECT reservation FROM taken UNION ALL SELECT reservation FROM nodes \
                     WHERE uuid = $1 AND NOT EXISTS (SELECT 1 FROM taken)"
                );
                self.one(Access::Write, &sql, args, |mut r| r.opt_text(0))
                    .await?
            }
            // SQLite cannot write inside a WITH; its one writer makes two statements safe.
            Dialect::Sqlite => {
                self.write(&take, args).await?;
                self.one(
                    Access::Write,
                    "SELECT reservation FROM nodes WHERE uuid = $1",
                    vec![uuid.into()],
                    |mut r| r.opt_text(0),
                )
                .await?
            }
        };
        Ok(holder.flatten().as_deref() == Some(id))
    }

    async fn release_lease(&self, uuid: &str, id: &str) -> Result<bool, StoreError> {
        self.write(
            "UPDATE nodes SET reservation = NULL, version = version + 1 \
             WHERE uuid = $1 AND reservation = $2",
            vec![uuid.into(), id.into()],
        )
        .await
        .map(|n| n == 1)
    }

    fn is_shared(&self) -> bool {
        self.engine.is_shared()
    }

    async fn publish(&self, notice: &Notice) -> Result<(), StoreError> {
        self.engine.publish(notice).await
    }

    fn subscribe(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<Notice>> {
        self.engine.subscribe()
    }

    async fn create_port(&self, port: &Port) -> Result<Port, StoreError> {
        self.port_create(port).await
    }

    async fn get_port(&self, ident: &str) -> Result<Port, StoreError> {
        self.port_get(ident).await
    }

    async fn list_ports(&self, q: &PortQuery) -> Result<Vec<Port>, StoreError> {
        self.port_list(q).await
    }

    async fn update_port(&self, port: &Port) -> Result<Port, StoreError> {
        self.port_update(port).await
    }

    async fn delete_port(&self, uuid: &str) -> Result<(), StoreError> {
        self.port_delete(uuid).await
    }

    async fn create_portgroup(&self, pg: &Portgroup) -> Result<Portgroup, StoreError> {
        self.portgroup_create(pg).await
    }

    async fn get_portgroup(&self, ident: &str) -> Result<Portgroup, StoreError> {
        self.portgroup_get(ident).await
    }

    async fn list_portgroups(&self, q: &PortgroupQuery) -> Result<Vec<Portgroup>, StoreError> {
        self.portgroup_list(q).await
    }

    async fn update_portgroup(&self, pg: &Portgroup) -> Result<Portgroup, StoreError> {
        self.portgroup_update(pg).await
    }

    async fn delete_portgroup(&self, uuid: &str) -> Result<bool, StoreError> {
        self.portgroup_delete(uuid).await
    }

    async fn create_chassis(&self, chassis: &Chassis) -> Result<Chassis, StoreError> {
        let mut c = chassis.clone();
        c.version = 1;
        c.updated_at = None;
        let sql = format!(
            "INSERT INTO chassis ({CHASSIS_SELECT}) VALUES ({})",
            placeholders(1, 6)
        );
        let values = vec![
            c.uuid.as_str().into(),
            free_text(&c.description),
            map_text(&c.extra),
            c.created_at.into(),
            c.updated_at.into(),
            c.version.into(),
        ];
        match self.engine.execute(&sql, values).await {
            Ok(_) => Ok(c),
            Err(ExecError::Unique(_)) => Err(StoreError::Duplicate(format!(
                "A chassis with UUID {} already exists.",
                c.uuid
            ))),
            Err(ExecError::Store(e)) => Err(e),
        }
    }

    async fn get_chassis(&self, uuid: &str) -> Result<Chassis, StoreError> {
        let sql = format!("SELECT {CHASSIS_SELECT} FROM chassis WHERE uuid = $1");
        self.one(Access::Read, &sql, vec![uuid.into()], chassis_from_row)
            .await?
            .ok_or_else(|| not_found("chassis", uuid))
    }

    async fn list_chassis(&self, q: &ChassisQuery) -> Result<Vec<Chassis>, StoreError> {
        if !CHASSIS_SORT_KEYS.contains(&q.sort_key.as_str()) {
            return Err(StoreError::Backend(format!(
                "invalid sort key {}",
                q.sort_key
            )));
        }
        // Never NULL, so the row-value comparison of the marker holds.
        let expr = if q.sort_key == "description" {
            "COALESCE(description, '')"
        } else {
            q.sort_key.as_str()
        };
        let (op, dir) = if q.sort_dir == SortDir::Asc {
            (">", "ASC")
        } else {
            ("<", "DESC")
        };
        let mut wheres: Vec<String> = Vec::new();
        let mut args: Vec<Arg> = Vec::new();
        if let Some(m) = &q.marker {
            let id = self
                .one(
                    Access::Read,
                    "SELECT id FROM chassis WHERE uuid = $1",
                    vec![m.as_str().into()],
                    |mut r| r.int(0),
                )
                .await?
                .ok_or_else(|| not_found("chassis", m))?;
            args.push(id.into());
            wheres.push(if q.sort_key == "id" {
                format!("id {op} $1")
            } else {
                format!("({expr}, id) {op} (SELECT {expr}, id FROM chassis WHERE id = $1)")
            });
        }
        args.push(limit_arg(super::page_limit(q.limit)));
        let sql = format!(
            "SELECT {CHASSIS_SELECT} FROM chassis {} ORDER BY {expr} {dir}, id {dir} LIMIT ${}",
            super::where_clause(&wheres),
            args.len()
        );
        self.all(Access::Scan, &sql, args, chassis_from_row).await
    }

    async fn update_chassis(&self, chassis: &Chassis) -> Result<Chassis, StoreError> {
        let mut c = chassis.clone();
        let expected = c.version;
        c.version += 1;
        c.updated_at = Some(Utc::now());
        let n = self
            .write(
                "UPDATE chassis SET description = $2, extra = $3, updated_at = $4, version = $5 \
                 WHERE uuid = $1 AND version = $6",
                vec![
                    c.uuid.as_str().into(),
                    free_text(&c.description),
                    map_text(&c.extra),
                    c.updated_at.into(),
                    c.version.into(),
                    expected.into(),
                ],
            )
            .await?;
        if n == 1 {
            return Ok(c);
        }
        self.get_chassis(&c.uuid).await?;
        Err(StoreError::Conflict {
            kind: "chassis",
            ident: c.uuid.clone(),
            expected,
        })
    }

    async fn delete_chassis(&self, uuid: &str) -> Result<bool, StoreError> {
        // One statement, so a node cannot be counted out between the check and the delete.
        let n = self
            .write(
                "DELETE FROM chassis WHERE uuid = $1 \
                 AND NOT EXISTS (SELECT 1 FROM nodes WHERE chassis_uuid = $1)",
                vec![uuid.into()],
            )
            .await?;
        if n == 1 {
            return Ok(true);
        }
        self.get_chassis(uuid).await?;
        Ok(false)
    }

    async fn create_volume_connector(
        &self,
        c: &super::VolumeConnector,
    ) -> Result<super::VolumeConnector, StoreError> {
        self.nr_create_volume_connector(c).await
    }
    async fn get_volume_connector(&self, uuid: &str) -> Result<super::VolumeConnector, StoreError> {
        self.nr_get_volume_connector(uuid).await
    }
    async fn list_volume_connectors(
        &self,
        q: &super::VolumeQuery,
    ) -> Result<Vec<super::VolumeConnector>, StoreError> {
        self.nr_list_volume_connectors(q).await
    }
    async fn update_volume_connector(
        &self,
        c: &super::VolumeConnector,
    ) -> Result<super::VolumeConnector, StoreError> {
        self.nr_update_volume_connector(c).await
    }
    async fn delete_volume_connector(&self, uuid: &str) -> Result<(), StoreError> {
        self.nr_delete_volume_connector(uuid).await
    }
    async fn create_volume_target(
        &self,
        t: &super::VolumeTarget,
    ) -> Result<super::VolumeTarget, StoreError> {
        self.nr_create_volume_target(t).await
    }
    async fn get_volume_target(&self, uuid: &str) -> Result<super::VolumeTarget, StoreError> {
        self.nr_get_volume_target(uuid).await
    }
    async fn list_volume_targets(
        &self,
        q: &super::VolumeQuery,
    ) -> Result<Vec<super::VolumeTarget>, StoreError> {
        self.nr_list_volume_targets(q).await
    }
    async fn update_volume_target(
        &self,
        t: &super::VolumeTarget,
    ) -> Result<super::VolumeTarget, StoreError> {
        self.nr_update_volume_target(t).await
    }
    async fn delete_volume_target(&self, uuid: &str) -> Result<(), StoreError> {
        self.nr_delete_volume_target(uuid).await
    }
    async fn set_bios_settings(
        &self,
        node_uuid: &str,
        settings: &[super::BiosSetting],
    ) -> Result<(), StoreError> {
        self.nr_set_bios_settings(node_uuid, settings).await
    }
    async fn list_bios_settings(
        &self,
        node_uuid: &str,
    ) -> Result<Vec<super::BiosSetting>, StoreError> {
        self.nr_list_bios_settings(node_uuid).await
    }
    async fn set_firmware_components(
        &self,
        node_uuid: &str,
        components: &[super::FirmwareReading],
    ) -> Result<(), StoreError> {
        self.nr_set_firmware_components(node_uuid, components).await
    }
    async fn list_firmware_components(
        &self,
        node_uuid: &str,
    ) -> Result<Vec<super::FirmwareComponent>, StoreError> {
        self.nr_list_firmware_components(node_uuid).await
    }

    async fn node_management(&self, node_uuid: &str) -> Result<super::NodeManagement, StoreError> {
        self.nr_node_management(node_uuid).await
    }
    async fn node_managements(
        &self,
        uuids: &[String],
    ) -> Result<std::collections::HashMap<String, super::NodeManagement>, StoreError> {
        self.nr_node_managements(uuids).await
    }
    async fn set_boot_state(
        &self,
        node_uuid: &str,
        boot_mode: Option<String>,
        secure_boot: Option<bool>,
    ) -> Result<(), StoreError> {
        self.nr_set_boot_state(node_uuid, boot_mode, secure_boot)
            .await
    }
    async fn set_console_enabled(&self, node_uuid: &str, enabled: bool) -> Result<(), StoreError> {
        self.nr_set_console_enabled(node_uuid, enabled).await
    }

    async fn console_enabled_nodes(&self) -> Result<Vec<String>, StoreError> {
        self.nr_console_enabled_nodes().await
    }
    async fn set_target_raid_config(
        &self,
        node_uuid: &str,
        target: &Map<String, Value>,
    ) -> Result<(), StoreError> {
        self.nr_set_target_raid_config(node_uuid, target).await
    }
    async fn set_raid_config(
        &self,
        node_uuid: &str,
        current: &Map<String, Value>,
    ) -> Result<(), StoreError> {
        self.nr_set_raid_config(node_uuid, current).await
    }
    async fn child_nodes(&self, parent: &str) -> Result<Vec<String>, StoreError> {
        self.nr_child_nodes(parent).await
    }

    async fn node_by_macs(&self, macs: &[String]) -> Result<Option<String>, StoreError> {
        if macs.is_empty() {
            return Ok(None);
        }
        let sql = format!(
            "SELECT node_uuid FROM ports WHERE address IN ({}) LIMIT 1",
            placeholders(1, macs.len())
        );
        let args = macs.iter().map(|m| m.as_str().into()).collect();
        self.one(Access::Read, &sql, args, |mut r| r.text(0)).await
    }

    async fn node_by_system(
        &self,
        system_uuid: Option<&str>,
        serial: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        if system_uuid.is_none() && serial.is_none() {
            return Ok(None);
        }
        // The UUID compares case-insensitively whatever its JSON type; the serial only as a
        // JSON string.
        let sql = format!(
            "SELECT uuid FROM nodes WHERE \
             (CAST($1 AS TEXT) IS NOT NULL \
              AND lower(properties ->> 'system_uuid') = lower(CAST($1 AS TEXT))) \
             OR (CAST($2 AS TEXT) IS NOT NULL AND {} \
              AND properties ->> 'system_serial' = CAST($2 AS TEXT)) LIMIT 1",
            self.dialect()
                .json_member_is_string("properties", "system_serial")
        );
        self.one(
            Access::Read,
            &sql,
            vec![system_uuid.into(), serial.into()],
            |mut r| r.text(0),
        )
        .await
    }

    async fn enqueue_command(&self, node_uuid: &str, command: &Command) -> Result<(), StoreError> {
        let r = self
            .engine
            .execute(
                "INSERT INTO agent_commands (id, node_uuid, command, created_at) \
                 VALUES ($1, $2, $3, $4)",
                vec![
                    command.id.as_str().into(),
                    node_uuid.into(),
                    Arg::Json(to_json(command)?),
                    Utc::now().into(),
                ],
            )
            .await;
        match r {
            Ok(_) => Ok(()),
            Err(ExecError::Unique(_)) => Err(StoreError::Duplicate(format!(
                "command {} already queued",
                command.id
            ))),
            Err(ExecError::Store(e)) => Err(e),
        }
    }

    async fn pending_commands(&self, node_uuid: &str) -> Result<Vec<Command>, StoreError> {
        self.all(
            Access::Read,
            "SELECT command FROM agent_commands WHERE node_uuid = $1 \
             AND result IS NULL AND cancelled = FALSE ORDER BY seq",
            vec![node_uuid.into()],
            |mut r| parse_json("command", r.json(0)?),
        )
        .await
    }

    async fn record_result(
        &self,
        node_uuid: &str,
        result: &CommandResult,
    ) -> Result<bool, StoreError> {
        let n = self
            .write(
                "UPDATE agent_commands SET result = $3, finished_at = $4 \
                 WHERE node_uuid = $1 AND id = $2 AND result IS NULL",
                vec![
                    node_uuid.into(),
                    result.id.as_str().into(),
                    Arg::Json(to_json(result)?),
                    Utc::now().into(),
                ],
            )
            .await?;
        if n == 1 {
            return Ok(true);
        }
        let known = self
            .one(
                Access::Write,
                "SELECT seq FROM agent_commands WHERE node_uuid = $1 AND id = $2",
                vec![node_uuid.into(), result.id.as_str().into()],
                |_| Ok(()),
            )
            .await?;
        match known {
            Some(()) => Ok(false),
            None => Err(not_found("command", &result.id)),
        }
    }

    async fn command(&self, node_uuid: &str, id: &str) -> Result<StoredCommand, StoreError> {
        self.one(
            Access::Read,
            "SELECT command, result FROM agent_commands WHERE node_uuid = $1 AND id = $2",
            vec![node_uuid.into(), id.into()],
            |mut r| {
                Ok(StoredCommand {
                    command: parse_json("command", r.json(0)?)?,
                    result: r
                        .json(1)?
                        .map(|t| parse_json("command result", Some(t)))
                        .transpose()?,
                })
            },
        )
        .await?
        .ok_or_else(|| not_found("command", id))
    }

    async fn add_node_log(&self, log: &super::NodeLog) -> Result<super::NodeLog, StoreError> {
        self.nl_add_node_log(log).await
    }
    async fn list_node_logs(&self, node_uuid: &str) -> Result<Vec<super::NodeLog>, StoreError> {
        self.nl_list_node_logs(node_uuid).await
    }
    async fn get_node_log(&self, node_uuid: &str, id: i64) -> Result<super::NodeLog, StoreError> {
        self.nl_get_node_log(node_uuid, id).await
    }
    async fn cancel_pending(&self, node_uuid: &str) -> Result<u64, StoreError> {
        self.write(
            "UPDATE agent_commands SET cancelled = TRUE WHERE node_uuid = $1 AND result IS NULL",
            vec![node_uuid.into()],
        )
        .await
    }

    async fn put_rule(&self, uuid: &str, priority: i64, body: &Value) -> Result<(), StoreError> {
        self.write(
            "INSERT INTO inspection_rules (uuid, priority, body, created_at) \
             VALUES ($1, $2, $3, $4) \
             ON CONFLICT (uuid) DO UPDATE SET priority = excluded.priority, body = excluded.body",
            vec![
                uuid.into(),
                priority.into(),
                Arg::Json(body.to_string()),
                Utc::now().into(),
            ],
        )
        .await
        .map(|_| ())
    }

    async fn list_rules(&self) -> Result<Vec<Value>, StoreError> {
        self.all(
            Access::Read,
            "SELECT body FROM inspection_rules ORDER BY priority DESC, seq",
            vec![],
            |mut r| parse_json("inspection rule", r.json(0)?),
        )
        .await
    }

    async fn delete_rule(&self, uuid: &str) -> Result<(), StoreError> {
        let n = self
            .write(
                "DELETE FROM inspection_rules WHERE uuid = $1",
                vec![uuid.into()],
            )
            .await?;
        if n == 0 {
            return Err(not_found("inspection rule", uuid));
        }
        Ok(())
    }

    async fn save_inventory(&self, node_uuid: &str, inventory: &Value) -> Result<(), StoreError> {
        self.write(
            "INSERT INTO node_inventory (node_uuid, inventory, collected_at) VALUES ($1, $2, $3) \
             ON CONFLICT (node_uuid) DO UPDATE SET inventory = excluded.inventory, \
             collected_at = excluded.collected_at",
            vec![
                node_uuid.into(),
                Arg::Json(inventory.to_string()),
                Utc::now().into(),
            ],
        )
        .await
        .map(|_| ())
    }

    async fn get_inventory(&self, node_uuid: &str) -> Result<(Value, DateTime<Utc>), StoreError> {
        self.one(
            Access::Read,
            "SELECT inventory, collected_at FROM node_inventory WHERE node_uuid = $1",
            vec![node_uuid.into()],
            |mut r| {
                Ok((
                    parse_json("inventory", r.json(0)?)?,
                    r.time(1)?.unwrap_or_else(Utc::now),
                ))
            },
        )
        .await?
        .ok_or_else(|| not_found("inventory of node", node_uuid))
    }

    async fn append_audit(&self, e: &AuditEntry) -> Result<(), StoreError> {
        // Details quote error text from agents and BMCs.
        self.write(
            "INSERT INTO audit_log (created_at, actor, source, method, path, node_uuid, \
             action, status, detail) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            vec![
                e.created_at.into(),
                free_text(&Some(e.actor.clone())),
                e.source.clone().into(),
                e.method.clone().into(),
                free_text(&e.path),
                free_text(&e.node_uuid),
                free_text(&Some(e.action.clone())),
                e.status.map(i64::from).into(),
                free_text(&e.detail),
            ],
        )
        .await
        .map(|_| ())
    }

    async fn list_audit(&self, q: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
        let (cmp, dir) = match q.sort_dir {
            SortDir::Asc => (">", "ASC"),
            SortDir::Desc => ("<", "DESC"),
        };
        let mut wheres: Vec<String> = Vec::new();
        let mut args: Vec<Arg> = Vec::new();
        if let Some(n) = &q.node_uuid {
            args.push(n.as_str().into());
            wheres.push(format!("node_uuid = ${}", args.len()));
        }
        if let Some(m) = q.marker {
            args.push(m.into());
            wheres.push(format!("seq {cmp} ${}", args.len()));
        }
        args.push(limit_arg(super::page_limit(q.limit)));
        let sql = format!(
            "SELECT {AUDIT_SELECT} FROM audit_log {} ORDER BY seq {dir} LIMIT ${}",
            super::where_clause(&wheres),
            args.len()
        );
        self.all(Access::Scan, &sql, args, audit_from_row).await
    }

    async fn shard_counts(&self) -> Result<Vec<(Option<String>, i64)>, StoreError> {
        // As Ironic: one row per distinct shard, NULL included, by descending count.
        self.all(
            Access::Scan,
            "SELECT shard, count(*) FROM nodes GROUP BY shard ORDER BY count(*) DESC, shard",
            vec![],
            |mut r| Ok((r.opt_text(0)?, r.int(1)?)),
        )
        .await
    }

    async fn node_counts(&self) -> Result<Vec<NodeCount>, StoreError> {
        self.sql_node_counts().await
    }
    async fn create_allocation(&self, a: &Allocation) -> Result<Allocation, StoreError> {
        self.sql_create_allocation(a).await
    }
    async fn get_allocation(&self, ident: &str) -> Result<Allocation, StoreError> {
        self.sql_get_allocation(ident).await
    }
    async fn allocation_of_node(&self, node: &str) -> Result<Option<Allocation>, StoreError> {
        self.sql_allocation_of_node(node).await
    }
    async fn list_allocations(&self, q: &AllocationQuery) -> Result<Vec<Allocation>, StoreError> {
        self.sql_list_allocations(q).await
    }
    async fn update_allocation(&self, a: &Allocation) -> Result<Allocation, StoreError> {
        self.sql_update_allocation(a).await
    }
    async fn delete_allocation(&self, uuid: &str) -> Result<(), StoreError> {
        self.sql_delete_allocation(uuid).await
    }
    async fn create_template(&self, t: &StepTemplate) -> Result<StepTemplate, StoreError> {
        self.sql_create_template(t).await
    }
    async fn get_template(&self, k: TemplateKind, id: &str) -> Result<StepTemplate, StoreError> {
        self.sql_get_template(k, id).await
    }
    async fn list_templates(&self, q: &TemplateQuery) -> Result<Vec<StepTemplate>, StoreError> {
        self.sql_list_templates(q).await
    }
    async fn update_template(&self, t: &StepTemplate) -> Result<StepTemplate, StoreError> {
        self.sql_update_template(t).await
    }
    async fn delete_template(&self, k: TemplateKind, uuid: &str) -> Result<(), StoreError> {
        self.sql_delete_template(k, uuid).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_lists_agree() {
        let n = Node::new("u".into(), "d".into());
        assert_eq!(node_values(&n, String::new()).len(), NODE_COLUMNS.len());
        assert!(NODE_INSERT.ends_with("$48)"), "{}", *NODE_INSERT);
    }
}
