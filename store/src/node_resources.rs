//! Node sub-resources in the store: volume connectors and targets (Ironic 1.32), and the
//! BIOS settings and firmware components a node's BMC reported (caches, replaced whole on
//! each refresh). All rows go with their node (`ON DELETE CASCADE`, migration 13).

use super::queries::SqlStore;
use super::sql::{placeholders, Access, Arg, Engine, ExecError, SqlRow};
use super::{SortDir, StoreError};
use chrono::{DateTime, SubsecRound, Utc};
use serde_json::{Map, Value};
use std::collections::HashMap;

/// A volume connector: how a node reaches a storage network (Ironic's `VolumeConnector`).
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeConnector {
    /// Its UUID.
    pub uuid: String,
    /// The node it belongs to.
    pub node_uuid: String,
    /// `iqn`, `ip`, `mac`, `wwnn`, `wwpn`, `port` or `portgroup`.
    pub kind: String,
    /// The identifier of that type (unique with the type).
    pub connector_id: String,
    /// Free-form data.
    pub extra: Map<String, Value>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last update.
    pub updated_at: Option<DateTime<Utc>>,
}

/// A volume target: a volume a node may attach and boot from (Ironic's `VolumeTarget`).
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeTarget {
    /// Its UUID.
    pub uuid: String,
    /// The node it belongs to.
    pub node_uuid: String,
    /// The volume's type (`iscsi`, `fibre_channel`, …).
    pub volume_type: String,
    /// Properties of the volume for the storage interface.
    pub properties: Map<String, Value>,
    /// Boot order of the volume on its node (unique per node).
    pub boot_index: i64,
    /// The volume's identifier in the block storage service.
    pub volume_id: String,
    /// Free-form data.
    pub extra: Map<String, Value>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last update.
    pub updated_at: Option<DateTime<Utc>>,
}

/// Columns a volume listing may sort by (besides `id`).
pub const CONNECTOR_SORT_KEYS: &[&str] = &[
    "id",
    "uuid",
    "node_uuid",
    "type",
    "connector_id",
    "created_at",
    "updated_at",
];
/// Columns a volume target listing may sort by.
pub const TARGET_SORT_KEYS: &[&str] = &[
    "id",
    "uuid",
    "node_uuid",
    "volume_type",
    "boot_index",
    "volume_id",
    "created_at",
    "updated_at",
];

/// A page of volume connectors or targets.
#[derive(Debug, Clone)]
pub struct VolumeQuery {
    /// Only those of this node.
    pub node_uuid: Option<String>,
    /// Page size (0: the default page).
    pub limit: usize,
    /// UUID of the last item of the previous page.
    pub marker: Option<String>,
    /// One of [`CONNECTOR_SORT_KEYS`] / [`TARGET_SORT_KEYS`].
    pub sort_key: String,
    /// Direction.
    pub sort_dir: SortDir,
}

/// A node's RAID configurations (Ironic 1.12) and boot state (1.75), kept beside the node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeManagement {
    /// What the operator asked for (`PUT …/states/raid`).
    pub target_raid_config: Map<String, Value>,
    /// What the agent RAID steps built, with `last_updated` (`{}`: nothing built, or deleted).
    pub raid_config: Map<String, Value>,
    /// `bios` or `uefi`, as the BMC last reported it.
    pub boot_mode: Option<String>,
    /// Whether UEFI secure boot is on, as the BMC last reported it.
    pub secure_boot: Option<bool>,
    /// Whether the node's console is enabled (`PUT …/states/console`).
    pub console_enabled: bool,
}

/// One BIOS setting as the BMC reported it, with its registry entry (Ironic 1.74 fields:
/// `attribute_type`, `allowable_values`, `lower_bound`, …) when the BMC has one.
#[derive(Debug, Clone, PartialEq)]
pub struct BiosSetting {
    /// Setting name.
    pub name: String,
    /// Current value, as text.
    pub value: Option<String>,
    /// Registry fields by Ironic's names; absent ones are null.
    pub registry: Map<String, Value>,
    /// When first read.
    pub created_at: DateTime<Utc>,
    /// When last changed.
    pub updated_at: Option<DateTime<Utc>>,
}

/// One firmware component and its versions (Ironic 1.86).
#[derive(Debug, Clone, PartialEq)]
pub struct FirmwareComponent {
    /// `bios`, `bmc`, or a BMC's own component name.
    pub component: String,
    /// The version first seen.
    pub initial_version: String,
    /// The version now.
    pub current_version: Option<String>,
    /// The version Rivet last flashed (Rivet flashes none yet).
    pub last_version_flashed: Option<String>,
    /// Its maker, where the BMC names one (1.114).
    pub vendor: Option<String>,
    /// Its model, where the BMC names one (1.114).
    pub model: Option<String>,
    /// Its serial number, where the BMC names one (1.114).
    pub serial_number: Option<String>,
    /// When first read.
    pub created_at: DateTime<Utc>,
    /// When last changed.
    pub updated_at: Option<DateTime<Utc>>,
}

pub use rivet_model::records::FirmwareReading;

const CONNECTOR_SELECT: &str = "uuid, node_uuid, type, connector_id, extra, created_at, updated_at";
const TARGET_SELECT: &str = "uuid, node_uuid, volume_type, properties, boot_index, volume_id, \
     extra, created_at, updated_at";

fn json_map(text: Option<String>) -> Map<String, Value> {
    match text.map(|t| serde_json::from_str(&t)) {
        Some(Ok(Value::Object(m))) => m,
        _ => Map::new(),
    }
}

fn map_arg(m: &Map<String, Value>) -> Arg {
    Arg::Json(Value::Object(m.clone()).to_string())
}

fn connector_from_row(mut r: impl SqlRow) -> Result<VolumeConnector, StoreError> {
    Ok(VolumeConnector {
        uuid: r.text(0)?,
        node_uuid: r.text(1)?,
        kind: r.text(2)?,
        connector_id: r.text(3)?,
        extra: json_map(r.json(4)?),
        created_at: r.time(5)?.unwrap_or_else(Utc::now),
        updated_at: r.time(6)?,
    })
}

fn target_from_row(mut r: impl SqlRow) -> Result<VolumeTarget, StoreError> {
    Ok(VolumeTarget {
        uuid: r.text(0)?,
        node_uuid: r.text(1)?,
        volume_type: r.text(2)?,
        properties: json_map(r.json(3)?),
        boot_index: r.int(4)?,
        volume_id: r.text(5)?,
        extra: json_map(r.json(6)?),
        created_at: r.time(7)?.unwrap_or_else(Utc::now),
        updated_at: r.time(8)?,
    })
}

fn plain(e: ExecError) -> StoreError {
    match e {
        ExecError::Unique(w) => StoreError::Backend(w),
        ExecError::Store(e) => e,
    }
}

fn not_found(kind: &'static str, ident: &str) -> StoreError {
    StoreError::NotFound {
        kind,
        ident: ident.to_string(),
    }
}

fn connector_duplicate(what: &str, c: &VolumeConnector) -> StoreError {
    if what.contains("connector_id") {
        StoreError::Duplicate(format!(
            "A volume connector with type {} and connector ID {} already exists.",
            c.kind, c.connector_id
        ))
    } else {
        StoreError::Duplicate(format!(
            "A volume connector with UUID {} already exists.",
            c.uuid
        ))
    }
}

fn target_duplicate(what: &str, t: &VolumeTarget) -> StoreError {
    if what.contains("boot_index") {
        StoreError::Duplicate(format!(
            "A volume target with boot index '{}' for the same node already exists.",
            t.boot_index
        ))
    } else {
        StoreError::Duplicate(format!(
            "A volume target with UUID {} already exists.",
            t.uuid
        ))
    }
}

impl<E: Engine> SqlStore<E> {
    async fn exec(&self, sql: &str, args: Vec<Arg>) -> Result<u64, ExecError> {
        self.engine.execute(sql, args).await
    }

    /// A page of `table` rows (`select` columns) under `q`, sorted on a checked key.
    async fn volume_page<T>(
        &self,
        table: &'static str,
        kind: &'static str,
        select: &str,
        keys: &[&str],
        q: &VolumeQuery,
        read: impl FnMut(E::Row) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        if !keys.contains(&q.sort_key.as_str()) {
            return Err(StoreError::Backend(format!(
                "invalid sort key {}",
                q.sort_key
            )));
        }
        let key = q.sort_key.as_str();
        let expr = if key == "updated_at" {
            // Never NULL, so the row-value comparison of the marker holds.
            "COALESCE(updated_at, created_at)"
        } else {
            key
        };
        let (op, dir) = if q.sort_dir == SortDir::Asc {
            (">", "ASC")
        } else {
            ("<", "DESC")
        };
        let mut wheres: Vec<String> = Vec::new();
        let mut args: Vec<Arg> = Vec::new();
        if let Some(n) = &q.node_uuid {
            args.push(n.as_str().into());
            wheres.push(format!("node_uuid = ${}", args.len()));
        }
        if let Some(m) = &q.marker {
            let rows = self
                .engine
                .rows(
                    Access::Read,
                    &format!("SELECT id FROM {table} WHERE uuid = $1"),
                    vec![m.as_str().into()],
                )
                .await?;
            let id = match rows.into_iter().next() {
                Some(mut r) => r.int(0)?,
                None => return Err(not_found(kind, m)),
            };
            args.push(id.into());
            let n = args.len();
            wheres.push(format!(
                "({expr}, id) {op} (SELECT {expr}, id FROM {table} WHERE id = ${n})"
            ));
        }
        let limit = super::page_limit(q.limit);
        args.push(Arg::Int(i64::try_from(limit).unwrap_or(i64::MAX)));
        let sql = format!(
            "SELECT {select} FROM {table} {} ORDER BY {expr} {dir}, id {dir} LIMIT ${}",
            super::where_clause(&wheres),
            args.len()
        );
        let rows = self.engine.rows(Access::Scan, &sql, args).await?;
        rows.into_iter().map(read).collect()
    }

    pub(super) async fn nr_create_volume_connector(
        &self,
        c: &VolumeConnector,
    ) -> Result<VolumeConnector, StoreError> {
        // Both engines keep microseconds: hand back what a read will give.
        let c = &VolumeConnector {
            created_at: c.created_at.trunc_subsecs(6),
            updated_at: c.updated_at.map(|t| t.trunc_subsecs(6)),
            ..c.clone()
        };
        let sql = format!(
            "INSERT INTO volume_connectors ({CONNECTOR_SELECT}) VALUES ({})",
            placeholders(1, 7)
        );
        let args = vec![
            c.uuid.as_str().into(),
            c.node_uuid.as_str().into(),
            c.kind.as_str().into(),
            c.connector_id.as_str().into(),
            map_arg(&c.extra),
            c.created_at.into(),
            c.updated_at.into(),
        ];
        match self.exec(&sql, args).await {
            Ok(_) => Ok(c.clone()),
            Err(ExecError::Unique(what)) => Err(connector_duplicate(&what, c)),
            Err(ExecError::Store(e)) => Err(e),
        }
    }

    pub(super) async fn nr_get_volume_connector(
        &self,
        uuid: &str,
    ) -> Result<VolumeConnector, StoreError> {
        let sql = format!("SELECT {CONNECTOR_SELECT} FROM volume_connectors WHERE uuid = $1");
        let rows = self
            .engine
            .rows(Access::Read, &sql, vec![uuid.into()])
            .await?;
        match rows.into_iter().next() {
            Some(r) => connector_from_row(r),
            None => Err(not_found("volume connector", uuid)),
        }
    }

    pub(super) async fn nr_list_volume_connectors(
        &self,
        q: &VolumeQuery,
    ) -> Result<Vec<VolumeConnector>, StoreError> {
        self.volume_page(
            "volume_connectors",
            "volume connector",
            CONNECTOR_SELECT,
            CONNECTOR_SORT_KEYS,
            q,
            connector_from_row,
        )
        .await
    }

    pub(super) async fn nr_update_volume_connector(
        &self,
        c: &VolumeConnector,
    ) -> Result<VolumeConnector, StoreError> {
        let mut c = c.clone();
        c.updated_at = Some(Utc::now().trunc_subsecs(6));
        let args = vec![
            c.uuid.as_str().into(),
            c.node_uuid.as_str().into(),
            c.kind.as_str().into(),
            c.connector_id.as_str().into(),
            map_arg(&c.extra),
            c.updated_at.into(),
        ];
        match self
            .exec(
                "UPDATE volume_connectors SET node_uuid = $2, type = $3, connector_id = $4, \
                 extra = $5, updated_at = $6 WHERE uuid = $1",
                args,
            )
            .await
        {
            Ok(1) => Ok(c),
            Ok(_) => Err(not_found("volume connector", &c.uuid)),
            Err(ExecError::Unique(what)) => Err(connector_duplicate(&what, &c)),
            Err(ExecError::Store(e)) => Err(e),
        }
    }

    pub(super) async fn nr_delete_volume_connector(&self, uuid: &str) -> Result<(), StoreError> {
        match self
            .exec(
                "DELETE FROM volume_connectors WHERE uuid = $1",
                vec![uuid.into()],
            )
            .await
        {
            Ok(1) => Ok(()),
            Ok(_) => Err(not_found("volume connector", uuid)),
            Err(ExecError::Unique(what)) => Err(StoreError::Backend(what)),
            Err(ExecError::Store(e)) => Err(e),
        }
    }

    pub(super) async fn nr_create_volume_target(
        &self,
        t: &VolumeTarget,
    ) -> Result<VolumeTarget, StoreError> {
        let t = &VolumeTarget {
            created_at: t.created_at.trunc_subsecs(6),
            updated_at: t.updated_at.map(|t| t.trunc_subsecs(6)),
            ..t.clone()
        };
        let sql = format!(
            "INSERT INTO volume_targets ({TARGET_SELECT}) VALUES ({})",
            placeholders(1, 9)
        );
        let args = vec![
            t.uuid.as_str().into(),
            t.node_uuid.as_str().into(),
            t.volume_type.as_str().into(),
            map_arg(&t.properties),
            t.boot_index.into(),
            t.volume_id.as_str().into(),
            map_arg(&t.extra),
            t.created_at.into(),
            t.updated_at.into(),
        ];
        match self.exec(&sql, args).await {
            Ok(_) => Ok(t.clone()),
            Err(ExecError::Unique(what)) => Err(target_duplicate(&what, t)),
            Err(ExecError::Store(e)) => Err(e),
        }
    }

    pub(super) async fn nr_get_volume_target(
        &self,
        uuid: &str,
    ) -> Result<VolumeTarget, StoreError> {
        let sql = format!("SELECT {TARGET_SELECT} FROM volume_targets WHERE uuid = $1");
        let rows = self
            .engine
            .rows(Access::Read, &sql, vec![uuid.into()])
            .await?;
        match rows.into_iter().next() {
            Some(r) => target_from_row(r),
            None => Err(not_found("volume target", uuid)),
        }
    }

    pub(super) async fn nr_list_volume_targets(
        &self,
        q: &VolumeQuery,
    ) -> Result<Vec<VolumeTarget>, StoreError> {
        self.volume_page(
            "volume_targets",
            "volume target",
            TARGET_SELECT,
            TARGET_SORT_KEYS,
            q,
            target_from_row,
        )
        .await
    }

    pub(super) async fn nr_update_volume_target(
        &self,
        t: &VolumeTarget,
    ) -> Result<VolumeTarget, StoreError> {
        let mut t = t.clone();
        t.updated_at = Some(Utc::now().trunc_subsecs(6));
        let args = vec![
            t.uuid.as_str().into(),
            t.node_uuid.as_str().into(),
            t.volume_type.as_str().into(),
            map_arg(&t.properties),
            t.boot_index.into(),
            t.volume_id.as_str().into(),
            map_arg(&t.extra),
            t.updated_at.into(),
        ];
        match self
            .exec(
                "UPDATE volume_targets SET node_uuid = $2, volume_type = $3, properties = $4, \
                 boot_index = $5, volume_id = $6, extra = $7, updated_at = $8 WHERE uuid = $1",
                args,
            )
            .await
        {
            Ok(1) => Ok(t),
            Ok(_) => Err(not_found("volume target", &t.uuid)),
            Err(ExecError::Unique(what)) => Err(target_duplicate(&what, &t)),
            Err(ExecError::Store(e)) => Err(e),
        }
    }

    pub(super) async fn nr_delete_volume_target(&self, uuid: &str) -> Result<(), StoreError> {
        match self
            .exec(
                "DELETE FROM volume_targets WHERE uuid = $1",
                vec![uuid.into()],
            )
            .await
        {
            Ok(1) => Ok(()),
            Ok(_) => Err(not_found("volume target", uuid)),
            Err(ExecError::Unique(what)) => Err(StoreError::Backend(what)),
            Err(ExecError::Store(e)) => Err(e),
        }
    }

    /// Replace node `node_uuid`'s BIOS cache with `settings`; a setting whose value and
    /// registry are unchanged keeps its times.
    pub(super) async fn nr_set_bios_settings(
        &self,
        node_uuid: &str,
        settings: &[BiosSetting],
    ) -> Result<(), StoreError> {
        let old = self.nr_list_bios_settings(node_uuid).await?;
        let now = Utc::now().trunc_subsecs(6);
        let plain = |e: ExecError| match e {
            ExecError::Unique(w) => StoreError::Backend(w),
            ExecError::Store(e) => e,
        };
        for o in &old {
            if !settings.iter().any(|s| s.name == o.name) {
                self.exec(
                    "DELETE FROM bios_settings WHERE node_uuid = $1 AND name = $2",
                    vec![node_uuid.into(), o.name.as_str().into()],
                )
                .await
                .map_err(plain)?;
            }
        }
        for s in settings {
            match old.iter().find(|o| o.name == s.name) {
                Some(o) if o.value == s.value && o.registry == s.registry => {}
                Some(_) => {
                    self.exec(
                        "UPDATE bios_settings SET value = $3, registry = $4, updated_at = $5 \
                         WHERE node_uuid = $1 AND name = $2",
                        vec![
                            node_uuid.into(),
                            s.name.as_str().into(),
                            s.value.clone().into(),
                            map_arg(&s.registry),
                            now.into(),
                        ],
                    )
                    .await
                    .map_err(plain)?;
                }
                None => {
                    self.exec(
                        "INSERT INTO bios_settings (node_uuid, name, value, registry, created_at, \
                         updated_at) VALUES ($1, $2, $3, $4, $5, NULL)",
                        vec![
                            node_uuid.into(),
                            s.name.as_str().into(),
                            s.value.clone().into(),
                            map_arg(&s.registry),
                            now.into(),
                        ],
                    )
                    .await
                    .map_err(plain)?;
                }
            }
        }
        Ok(())
    }

    pub(super) async fn nr_list_bios_settings(
        &self,
        node_uuid: &str,
    ) -> Result<Vec<BiosSetting>, StoreError> {
        let rows = self
            .engine
            .rows(
                Access::Read,
                "SELECT name, value, registry, created_at, updated_at FROM bios_settings \
                 WHERE node_uuid = $1 ORDER BY name",
                vec![node_uuid.into()],
            )
            .await?;
        rows.into_iter()
            .map(|mut r| {
                Ok(BiosSetting {
                    name: r.text(0)?,
                    value: r.opt_text(1)?,
                    registry: json_map(r.json(2)?),
                    created_at: r.time(3)?.unwrap_or_else(Utc::now),
                    updated_at: r.time(4)?,
                })
            })
            .collect()
    }

    /// Record node `node_uuid`'s firmware components: a new one keeps its first version as
    /// `initial_version`; a known one gets its `current_version` and, as Ironic saves them on
    /// every refresh, its vendor, model and serial number updated.
    pub(super) async fn nr_set_firmware_components(
        &self,
        node_uuid: &str,
        components: &[FirmwareReading],
    ) -> Result<(), StoreError> {
        let old = self.nr_list_firmware_components(node_uuid).await?;
        let now = Utc::now().trunc_subsecs(6);
        for c in components {
            let args = vec![
                node_uuid.into(),
                c.component.as_str().into(),
                c.version.as_str().into(),
                now.into(),
                c.vendor.clone().into(),
                c.model.clone().into(),
                c.serial_number.clone().into(),
            ];
            match old.iter().find(|o| o.component == c.component) {
                Some(o)
                    if o.current_version.as_deref() == Some(c.version.as_str())
                        && o.vendor == c.vendor
                        && o.model == c.model
                        && o.serial_number == c.serial_number => {}
                Some(_) => {
                    self.exec(
                        "UPDATE firmware_components SET current_version = $3, updated_at = $4, \
                         vendor = $5, model = $6, serial_number = $7 \
                         WHERE node_uuid = $1 AND component = $2",
                        args,
                    )
                    .await
                    .map_err(plain)?;
                }
                None => {
                    self.exec(
                        "INSERT INTO firmware_components (node_uuid, component, initial_version, \
                         current_version, last_version_flashed, created_at, updated_at, vendor, \
                         model, serial_number) VALUES ($1, $2, $3, $3, NULL, $4, NULL, $5, $6, $7)",
                        args,
                    )
                    .await
                    .map_err(plain)?;
                }
            }
        }
        Ok(())
    }

    /// A node's RAID configurations and boot state; defaults when never set.
    pub(super) async fn nr_node_management(
        &self,
        node_uuid: &str,
    ) -> Result<NodeManagement, StoreError> {
        let mut all = self.nr_node_managements(&[node_uuid.to_string()]).await?;
        Ok(all.remove(node_uuid).unwrap_or_default())
    }

    /// [`NodeManagement`] of each of `uuids` that has one.
    pub(super) async fn nr_node_managements(
        &self,
        uuids: &[String],
    ) -> Result<HashMap<String, NodeManagement>, StoreError> {
        if uuids.is_empty() {
            return Ok(HashMap::new());
        }
        let sql = format!(
            "SELECT node_uuid, target_raid_config, raid_config, boot_mode, secure_boot, \
             console_enabled FROM node_management WHERE node_uuid IN ({})",
            placeholders(1, uuids.len())
        );
        let args = uuids.iter().map(|u| u.as_str().into()).collect();
        let rows = self.engine.rows(Access::Read, &sql, args).await?;
        rows.into_iter()
            .map(|mut r| {
                Ok((
                    r.text(0)?,
                    NodeManagement {
                        target_raid_config: json_map(r.json(1)?),
                        raid_config: json_map(r.json(2)?),
                        boot_mode: r.opt_text(3)?,
                        secure_boot: r.opt_flag(4)?,
                        console_enabled: r.flag(5)?,
                    },
                ))
            })
            .collect()
    }

    /// Set a node's `target_raid_config` (`{}` clears it).
    pub(super) async fn nr_set_target_raid_config(
        &self,
        node_uuid: &str,
        target: &Map<String, Value>,
    ) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO node_management (node_uuid, target_raid_config) VALUES ($1, $2) \
             ON CONFLICT (node_uuid) DO UPDATE SET target_raid_config = excluded.target_raid_config",
            vec![node_uuid.into(), map_arg(target)],
        )
        .await
        .map_err(plain)?;
        Ok(())
    }

    /// Set a node's `raid_config` (`{}` clears it).
    pub(super) async fn nr_set_raid_config(
        &self,
        node_uuid: &str,
        current: &Map<String, Value>,
    ) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO node_management (node_uuid, raid_config) VALUES ($1, $2) \
             ON CONFLICT (node_uuid) DO UPDATE SET raid_config = excluded.raid_config",
            vec![node_uuid.into(), map_arg(current)],
        )
        .await
        .map_err(plain)?;
        Ok(())
    }

    /// Record the boot mode and secure boot state the BMC reports.
    pub(super) async fn nr_set_boot_state(
        &self,
        node_uuid: &str,
        boot_mode: Option<String>,
        secure_boot: Option<bool>,
    ) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO node_management (node_uuid, boot_mode, secure_boot) VALUES ($1, $2, $3) \
             ON CONFLICT (node_uuid) DO UPDATE SET boot_mode = excluded.boot_mode, \
             secure_boot = excluded.secure_boot",
            vec![node_uuid.into(), boot_mode.into(), secure_boot.into()],
        )
        .await
        .map_err(plain)?;
        Ok(())
    }

    /// Record whether a node's console is enabled.
    pub(super) async fn nr_set_console_enabled(
        &self,
        node_uuid: &str,
        enabled: bool,
    ) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO node_management (node_uuid, console_enabled) VALUES ($1, $2) \
             ON CONFLICT (node_uuid) DO UPDATE SET console_enabled = excluded.console_enabled",
            vec![node_uuid.into(), enabled.into()],
        )
        .await
        .map_err(plain)?;
        Ok(())
    }

    /// UUIDs of the nodes whose console is enabled.
    pub(super) async fn nr_console_enabled_nodes(&self) -> Result<Vec<String>, StoreError> {
        let rows = self
            .engine
            .rows(
                Access::Read,
                "SELECT node_uuid FROM node_management WHERE console_enabled ORDER BY node_uuid",
                vec![],
            )
            .await?;
        rows.into_iter().map(|mut r| r.text(0)).collect()
    }

    /// UUIDs of the nodes whose `parent_node` is `parent`, oldest first.
    pub(super) async fn nr_child_nodes(&self, parent: &str) -> Result<Vec<String>, StoreError> {
        let rows = self
            .engine
            .rows(
                Access::Read,
                "SELECT uuid FROM nodes WHERE parent_node = $1 ORDER BY id",
                vec![parent.into()],
            )
            .await?;
        rows.into_iter().map(|mut r| r.text(0)).collect()
    }

    pub(super) async fn nr_list_firmware_components(
        &self,
        node_uuid: &str,
    ) -> Result<Vec<FirmwareComponent>, StoreError> {
        let rows = self
            .engine
            .rows(
                Access::Read,
                "SELECT component, initial_version, current_version, last_version_flashed, \
                 created_at, updated_at, vendor, model, serial_number FROM firmware_components \
                 WHERE node_uuid = $1 ORDER BY component",
                vec![node_uuid.into()],
            )
            .await?;
        rows.into_iter()
            .map(|mut r| {
                Ok(FirmwareComponent {
                    component: r.text(0)?,
                    initial_version: r.text(1)?,
                    current_version: r.opt_text(2)?,
                    last_version_flashed: r.opt_text(3)?,
                    created_at: r.time(4)?.unwrap_or_else(Utc::now),
                    updated_at: r.time(5)?,
                    vendor: r.opt_text(6)?,
                    model: r.opt_text(7)?,
                    serial_number: r.opt_text(8)?,
                })
            })
            .collect()
    }
}
