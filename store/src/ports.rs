//! Ports and port groups in the store: Ironic's port fields beyond the MAC (name, port group,
//! physical network, local link connection, internal_info where VIFs live …) and the
//! `portgroups` table, for both engines. The `Store` trait methods in `queries.rs` delegate
//! here.

use super::queries::SqlStore;
use super::sql::{placeholders, Access, Arg, Dialect, Engine, ExecError, SqlRow};
use super::{PortQuery, SortDir, StoreError};
use chrono::Utc;
use rivet_model::port::{Port, PortAttrs, Portgroup};
use serde_json::{Map, Value};

/// A port group listing request.
#[derive(Debug, Clone, Default)]
pub struct PortgroupQuery {
    /// Only this node's groups.
    pub node_uuid: Option<String>,
    /// Only this MAC.
    pub address: Option<String>,
    /// Only groups of nodes in these shards.
    pub shards: Vec<String>,
    /// Only groups of nodes in these conductor groups.
    pub conductor_groups: Vec<String>,
    /// Page size.
    pub limit: usize,
    /// UUID of the last group of the previous page.
    pub marker: Option<String>,
    /// One of [`PORTGROUP_SORT_KEYS`]; empty means `id`.
    pub sort_key: String,
    /// Direction (ascending when absent).
    pub sort_dir: Option<SortDir>,
}

/// Columns a port listing may sort by (Ironic refuses the JSON ones).
pub const PORT_SORT_KEYS: &[&str] = &[
    "id",
    "uuid",
    "address",
    "name",
    "node_uuid",
    "portgroup_uuid",
    "pxe_enabled",
    "physical_network",
    "is_smartnic",
    "description",
    "vendor",
    "category",
    "created_at",
    "updated_at",
];

/// Columns a port group listing may sort by.
pub const PORTGROUP_SORT_KEYS: &[&str] = &[
    "id",
    "uuid",
    "address",
    "name",
    "node_uuid",
    "mode",
    "standalone_ports_supported",
    "physical_network",
    "category",
    "created_at",
    "updated_at",
];

const PORT_COLUMNS: &str = "uuid, node_uuid, address, pxe_enabled, extra, created_at, updated_at, \
     version, name, portgroup_uuid, physical_network, internal_info, local_link_connection, \
     is_smartnic, description, vendor, category, available_for_dynamic_portgroup";

const PORTGROUP_COLUMNS: &str = "uuid, name, node_uuid, address, extra, internal_info, mode, \
     properties, standalone_ports_supported, physical_network, category, dynamic_portgroup, \
     created_at, updated_at, version";

fn obj(text: Option<String>) -> Map<String, Value> {
    match text.as_deref().map(serde_json::from_str) {
        Some(Ok(Value::Object(m))) => m,
        _ => Map::new(),
    }
}

fn map_arg(m: &Map<String, Value>) -> Arg {
    Arg::Json(Value::Object(m.clone()).to_string())
}

fn port_from_row(mut r: impl SqlRow) -> Result<Port, StoreError> {
    Ok(Port {
        uuid: r.text(0)?,
        node_uuid: r.text(1)?,
        address: r.text(2)?,
        pxe_enabled: r.flag(3)?,
        extra: obj(r.json(4)?),
        created_at: r.time(5)?.unwrap_or_else(Utc::now),
        updated_at: r.time(6)?,
        version: r.int(7)?,
        attrs: PortAttrs {
            name: r.opt_text(8)?,
            portgroup_uuid: r.opt_text(9)?,
            physical_network: r.opt_text(10)?,
            internal_info: obj(r.json(11)?),
            local_link_connection: obj(r.json(12)?),
            is_smartnic: r.opt_flag(13)?.unwrap_or(false),
            description: r.opt_text(14)?,
            vendor: r.opt_text(15)?,
            category: r.opt_text(16)?,
            available_for_dynamic_portgroup: r.opt_flag(17)?.unwrap_or(false),
        },
    })
}

fn port_values(p: &Port) -> Vec<Arg> {
    let a = &p.attrs;
    vec![
        p.uuid.as_str().into(),
        p.node_uuid.as_str().into(),
        p.address.as_str().into(),
        p.pxe_enabled.into(),
        map_arg(&p.extra),
        p.created_at.into(),
        p.updated_at.into(),
        p.version.into(),
        a.name.clone().into(),
        a.portgroup_uuid.clone().into(),
        a.physical_network.clone().into(),
        map_arg(&a.internal_info),
        map_arg(&a.local_link_connection),
        a.is_smartnic.into(),
        a.description.clone().into(),
        a.vendor.clone().into(),
        a.category.clone().into(),
        a.available_for_dynamic_portgroup.into(),
    ]
}

fn portgroup_from_row(mut r: impl SqlRow) -> Result<Portgroup, StoreError> {
    Ok(Portgroup {
        uuid: r.text(0)?,
        name: r.opt_text(1)?,
        node_uuid: r.text(2)?,
        address: r.opt_text(3)?,
        extra: obj(r.json(4)?),
        internal_info: obj(r.json(5)?),
        mode: r.opt_text(6)?,
        properties: obj(r.json(7)?),
        standalone_ports_supported: r.opt_flag(8)?.unwrap_or(true),
        physical_network: r.opt_text(9)?,
        category: r.opt_text(10)?,
        dynamic_portgroup: r.opt_flag(11)?.unwrap_or(false),
        created_at: r.time(12)?.unwrap_or_else(Utc::now),
        updated_at: r.time(13)?,
        version: r.int(14)?,
    })
}

fn portgroup_values(g: &Portgroup) -> Vec<Arg> {
    vec![
        g.uuid.as_str().into(),
        g.name.clone().into(),
        g.node_uuid.as_str().into(),
        g.address.clone().into(),
        map_arg(&g.extra),
        map_arg(&g.internal_info),
        g.mode.clone().into(),
        map_arg(&g.properties),
        g.standalone_ports_supported.into(),
        g.physical_network.clone().into(),
        g.category.clone().into(),
        g.dynamic_portgroup.into(),
        g.created_at.into(),
        g.updated_at.into(),
        g.version.into(),
    ]
}

/// The expression a listing sorts by (the key is already checked): NULLs first ascending on
/// both engines, text byte-wise, so the marker's row-value comparison holds.
fn sort_expr(d: Dialect, key: &str) -> String {
    match key {
        "id" | "created_at" | "pxe_enabled" | "is_smartnic" | "standalone_ports_supported" => {
            key.into()
        }
        "updated_at" => match d {
            Dialect::Sqlite => "COALESCE(updated_at, '')".into(),
            Dialect::Postgres => "COALESCE(updated_at, '-infinity')".into(),
        },
        _ => format!("COALESCE({key}, ''){}", d.bytewise()),
    }
}

fn not_found(kind: &'static str, ident: &str) -> StoreError {
    StoreError::NotFound {
        kind,
        ident: ident.to_string(),
    }
}

/// Ironic's message for a unique field that is taken.
fn duplicate(
    kind: &str,
    what: &str,
    p_name: &Option<String>,
    address: &str,
    uuid: &str,
) -> StoreError {
    StoreError::Duplicate(if what.contains("name") {
        format!(
            "A {kind} with name {} already exists.",
            p_name.as_deref().unwrap_or("")
        )
    } else if what.contains("address") {
        format!("A {kind} with MAC address {address} already exists.")
    } else {
        format!("A {kind} with UUID {uuid} already exists.")
    })
}

/// `IN ($n, …)` over `values`, pushing them onto `args`.
fn in_list(args: &mut Vec<Arg>, values: &[String], lower: bool) -> String {
    let first = args.len() + 1;
    for v in values {
        args.push(if lower { v.to_lowercase() } else { v.clone() }.into());
    }
    placeholders(first, values.len())
}

/// Node filters shared by port and port group listings.
fn node_filters(
    wheres: &mut Vec<String>,
    args: &mut Vec<Arg>,
    shards: &[String],
    conductor_groups: &[String],
) {
    if !shards.is_empty() {
        let list = in_list(args, shards, false);
        wheres.push(format!(
            "node_uuid IN (SELECT uuid FROM nodes WHERE shard IN ({list}))"
        ));
    }
    if !conductor_groups.is_empty() {
        let list = in_list(args, conductor_groups, true);
        wheres.push(format!(
            "node_uuid IN (SELECT uuid FROM nodes WHERE LOWER(COALESCE(conductor_group, '')) IN ({list}))"
        ));
    }
}

impl<E: Engine> SqlStore<E> {
    async fn rows_of<T>(
        &self,
        sql: &str,
        args: Vec<Arg>,
        read: impl FnMut(E::Row) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let rows = self.engine.rows(Access::Scan, sql, args).await?;
        rows.into_iter().map(read).collect()
    }

    /// The id of the row `marker` names in `table` (`NotFound` as `kind` otherwise).
    async fn marker_id(
        &self,
        table: &str,
        kind: &'static str,
        marker: &str,
    ) -> Result<i64, StoreError> {
        let rows = self
            .engine
            .rows(
                Access::Read,
                &format!("SELECT id FROM {table} WHERE uuid = $1"),
                vec![marker.into()],
            )
            .await?;
        match rows.into_iter().next() {
            Some(mut r) => r.int(0),
            None => Err(not_found(kind, marker)),
        }
    }

    /// `ORDER BY`, the marker condition and the limit of a listing.
    #[allow(clippy::too_many_arguments)]
    async fn page(
        &self,
        table: &str,
        kind: &'static str,
        keys: &[&str],
        sort_key: &str,
        sort_dir: Option<SortDir>,
        marker: Option<&str>,
        limit: usize,
        wheres: &mut Vec<String>,
        args: &mut Vec<Arg>,
    ) -> Result<String, StoreError> {
        let key = if sort_key.is_empty() { "id" } else { sort_key };
        if !keys.contains(&key) {
            return Err(StoreError::Backend(format!("invalid sort key {key}")));
        }
        let expr = sort_expr(self.engine.dialect(), key);
        let (op, dir) = match sort_dir.unwrap_or(SortDir::Asc) {
            SortDir::Asc => (">", "ASC"),
            SortDir::Desc => ("<", "DESC"),
        };
        if let Some(m) = marker {
            let id = self.marker_id(table, kind, m).await?;
            args.push(id.into());
            let n = args.len();
            wheres.push(if key == "id" {
                format!("id {op} ${n}")
            } else {
                format!("({expr}, id) {op} (SELECT {expr}, id FROM {table} WHERE id = ${n})")
            });
        }
        args.push(Arg::Int(
            i64::try_from(super::page_limit(limit)).unwrap_or(i64::MAX),
        ));
        Ok(format!(
            "{} ORDER BY {expr} {dir}, id {dir} LIMIT ${}",
            super::where_clause(wheres),
            args.len()
        ))
    }

    pub(super) async fn port_create(&self, port: &Port) -> Result<Port, StoreError> {
        let mut p = port.clone();
        p.version = 1;
        let sql = format!(
            "INSERT INTO ports ({PORT_COLUMNS}) VALUES ({})",
            placeholders(1, 18)
        );
        match self.engine.execute(&sql, port_values(&p)).await {
            Ok(_) => Ok(p),
            Err(ExecError::Unique(what)) => {
                Err(duplicate("port", &what, &p.attrs.name, &p.address, &p.uuid))
            }
            Err(ExecError::Store(e)) => Err(e),
        }
    }

    pub(super) async fn port_get(&self, ident: &str) -> Result<Port, StoreError> {
        let sql = format!(
            "SELECT {PORT_COLUMNS} FROM ports WHERE uuid = $1 OR name = $1 \
             ORDER BY CASE WHEN uuid = $1 THEN 0 ELSE 1 END"
        );
        let rows = self
            .engine
            .rows(Access::Read, &sql, vec![ident.into()])
            .await?;
        match rows.into_iter().next() {
            Some(r) => port_from_row(r),
            None => Err(not_found("port", ident)),
        }
    }

    pub(super) async fn port_list(&self, q: &PortQuery) -> Result<Vec<Port>, StoreError> {
        let mut wheres: Vec<String> = Vec::new();
        let mut args: Vec<Arg> = Vec::new();
        for (col, v) in [
            ("node_uuid", &q.node_uuid),
            ("address", &q.address),
            ("portgroup_uuid", &q.portgroup_uuid),
        ] {
            if let Some(v) = v {
                args.push(v.as_str().into());
                wheres.push(format!("{col} = ${}", args.len()));
            }
        }
        if let Some(d) = &q.description_contains {
            args.push(d.as_str().into());
            wheres.push(format!(
                "COALESCE(description, '') LIKE '%' || ${} || '%'",
                args.len()
            ));
        }
        node_filters(&mut wheres, &mut args, &q.shards, &q.conductor_groups);
        let tail = self
            .page(
                "ports",
                "port",
                PORT_SORT_KEYS,
                &q.sort_key,
                q.sort_dir,
                q.marker.as_deref(),
                q.limit,
                &mut wheres,
                &mut args,
            )
            .await?;
        let sql = format!("SELECT {PORT_COLUMNS} FROM ports {tail}");
        self.rows_of(&sql, args, port_from_row).await
    }

    pub(super) async fn port_update(&self, port: &Port) -> Result<Port, StoreError> {
        let mut p = port.clone();
        let expected = p.version;
        p.version += 1;
        p.updated_at = Some(Utc::now());
        let mut args = port_values(&p);
        args.remove(5); // created_at never changes
        args.push(expected.into());
        let r = self
            .engine
            .execute(
                "UPDATE ports SET node_uuid = $2, address = $3, pxe_enabled = $4, extra = $5, \
                 updated_at = $6, version = $7, name = $8, portgroup_uuid = $9, \
                 physical_network = $10, internal_info = $11, local_link_connection = $12, \
                 is_smartnic = $13, description = $14, vendor = $15, category = $16, \
                 available_for_dynamic_portgroup = $17 \
                 WHERE uuid = $1 AND version = $18",
                args,
            )
            .await;
        match r {
            Ok(1) => Ok(p),
            Ok(_) => {
                self.port_get(&p.uuid).await?;
                Err(StoreError::Conflict {
                    kind: "port",
                    ident: p.uuid.clone(),
                    expected,
                })
            }
            Err(ExecError::Unique(what)) => {
                Err(duplicate("port", &what, &p.attrs.name, &p.address, &p.uuid))
            }
            Err(ExecError::Store(e)) => Err(e),
        }
    }

    pub(super) async fn port_delete(&self, uuid: &str) -> Result<(), StoreError> {
        let n = self
            .engine
            .execute("DELETE FROM ports WHERE uuid = $1", vec![uuid.into()])
            .await
            .map_err(|e| match e {
                ExecError::Unique(w) => StoreError::Backend(w),
                ExecError::Store(e) => e,
            })?;
        if n == 0 {
            return Err(not_found("port", uuid));
        }
        Ok(())
    }

    pub(super) async fn portgroup_create(&self, g: &Portgroup) -> Result<Portgroup, StoreError> {
        let mut g = g.clone();
        g.version = 1;
        g.updated_at = None;
        let sql = format!(
            "INSERT INTO portgroups ({PORTGROUP_COLUMNS}) VALUES ({})",
            placeholders(1, 15)
        );
        match self.engine.execute(&sql, portgroup_values(&g)).await {
            Ok(_) => Ok(g),
            Err(ExecError::Unique(what)) => Err(duplicate(
                "portgroup",
                &what,
                &g.name,
                g.address.as_deref().unwrap_or(""),
                &g.uuid,
            )),
            Err(ExecError::Store(e)) => Err(e),
        }
    }

    /// A port group by UUID or name.
    pub(super) async fn portgroup_get(&self, ident: &str) -> Result<Portgroup, StoreError> {
        let sql = format!(
            "SELECT {PORTGROUP_COLUMNS} FROM portgroups WHERE uuid = $1 OR name = $1 \
             ORDER BY CASE WHEN uuid = $1 THEN 0 ELSE 1 END"
        );
        let rows = self
            .engine
            .rows(Access::Read, &sql, vec![ident.into()])
            .await?;
        match rows.into_iter().next() {
            Some(r) => portgroup_from_row(r),
            None => Err(not_found("portgroup", ident)),
        }
    }

    pub(super) async fn portgroup_list(
        &self,
        q: &PortgroupQuery,
    ) -> Result<Vec<Portgroup>, StoreError> {
        let mut wheres: Vec<String> = Vec::new();
        let mut args: Vec<Arg> = Vec::new();
        for (col, v) in [("node_uuid", &q.node_uuid), ("address", &q.address)] {
            if let Some(v) = v {
                args.push(v.as_str().into());
                wheres.push(format!("{col} = ${}", args.len()));
            }
        }
        node_filters(&mut wheres, &mut args, &q.shards, &q.conductor_groups);
        let tail = self
            .page(
                "portgroups",
                "portgroup",
                PORTGROUP_SORT_KEYS,
                &q.sort_key,
                q.sort_dir,
                q.marker.as_deref(),
                q.limit,
                &mut wheres,
                &mut args,
            )
            .await?;
        let sql = format!("SELECT {PORTGROUP_COLUMNS} FROM portgroups {tail}");
        self.rows_of(&sql, args, portgroup_from_row).await
    }

    pub(super) async fn portgroup_update(&self, g: &Portgroup) -> Result<Portgroup, StoreError> {
        let mut g = g.clone();
        let expected = g.version;
        g.version += 1;
        g.updated_at = Some(Utc::now());
        let mut args = portgroup_values(&g);
        args.remove(12); // created_at never changes
        args.push(expected.into());
        let r = self
            .engine
            .execute(
                "UPDATE portgroups SET name = $2, node_uuid = $3, address = $4, extra = $5, \
                 internal_info = $6, mode = $7, properties = $8, \
                 standalone_ports_supported = $9, physical_network = $10, category = $11, \
                 dynamic_portgroup = $12, updated_at = $13, version = $14 \
                 WHERE uuid = $1 AND version = $15",
                args,
            )
            .await;
        match r {
            Ok(1) => Ok(g),
            Ok(_) => {
                self.portgroup_get(&g.uuid).await?;
                Err(StoreError::Conflict {
                    kind: "portgroup",
                    ident: g.uuid.clone(),
                    expected,
                })
            }
            Err(ExecError::Unique(what)) => Err(duplicate(
                "portgroup",
                &what,
                &g.name,
                g.address.as_deref().unwrap_or(""),
                &g.uuid,
            )),
            Err(ExecError::Store(e)) => Err(e),
        }
    }

    pub(super) async fn portgroup_delete(&self, uuid: &str) -> Result<bool, StoreError> {
        // One statement, so a port cannot join between the check and the delete.
        let n = self
            .engine
            .execute(
                "DELETE FROM portgroups WHERE uuid = $1 \
                 AND NOT EXISTS (SELECT 1 FROM ports WHERE portgroup_uuid = $1)",
                vec![uuid.into()],
            )
            .await
            .map_err(|e| match e {
                ExecError::Unique(w) => StoreError::Backend(w),
                ExecError::Store(e) => e,
            })?;
        if n == 1 {
            return Ok(true);
        }
        self.portgroup_get(uuid).await?;
        Ok(false)
    }
}
