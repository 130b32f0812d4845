//! The schema's numbered migrations, one text for both dialects (index + 1 is the schema
//! version; `sqlite::migrate` and `postgres::migrate` apply the missing ones in order, each
//! recording its version).
//!
//! The texts are written once, with placeholders for the column types the two databases
//! spell differently, so the schemas cannot drift apart:
//!
//! | placeholder | SQLite | PostgreSQL |
//! |---|---|---|
//! | `{serial}` | `INTEGER PRIMARY KEY AUTOINCREMENT` | `BIGSERIAL PRIMARY KEY` |
//! | `{int}` | `INTEGER` | `BIGINT` |
//! | `{bool}` | `INTEGER` (`TRUE`/`FALSE` are 1/0) | `BOOLEAN` |
//! | `{time}` | `TEXT` (RFC 3339, see sqlite.rs) | `TIMESTAMPTZ` |
//! | `{json}` | `TEXT` | `JSON` |
//!
//! A line starting with `sqlite: ` or `postgres: ` is for that database only (an index one
//! of them cannot build). A released migration is never edited in what it does: add a new
//! one. (Before this module the two dialects had a copy each; the PostgreSQL texts rendered
//! from these are the same to the byte, and the SQLite schema is the same column for column.)

use super::sql::Dialect;

/// The schema version this build knows.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Migration `index` (0-based: its version is `index + 1`) in `dialect`'s SQL; `None` past the
/// last.
pub fn sql(index: usize, dialect: Dialect) -> Option<String> {
    MIGRATIONS.get(index).map(|m| render(m, dialect))
}

/// Every migration in `dialect`'s SQL, oldest first.
pub fn all(dialect: Dialect) -> impl Iterator<Item = String> {
    MIGRATIONS.iter().map(move |m| render(m, dialect))
}

fn render(template: &str, dialect: Dialect) -> String {
    let (mine, theirs) = match dialect {
        Dialect::Sqlite => ("sqlite: ", "postgres: "),
        Dialect::Postgres => ("postgres: ", "sqlite: "),
    };
    let types: [(&str, &str); 5] = match dialect {
        Dialect::Sqlite => [
            ("{serial}", "INTEGER PRIMARY KEY AUTOINCREMENT"),
            ("{int}", "INTEGER"),
            ("{bool}", "INTEGER"),
            ("{time}", "TEXT"),
            ("{json}", "TEXT"),
        ],
        Dialect::Postgres => [
            ("{serial}", "BIGSERIAL PRIMARY KEY"),
            ("{int}", "BIGINT"),
            ("{bool}", "BOOLEAN"),
            ("{time}", "TIMESTAMPTZ"),
            ("{json}", "JSON"),
        ],
    };
    let mut out = String::with_capacity(template.len() + 64);
    for line in template.split_inclusive('\n') {
        if line.starts_with(theirs) {
            continue;
        }
        out.push_str(line.strip_prefix(mine).unwrap_or(line));
    }
    for (placeholder, spelled) in types {
        out = out.replace(placeholder, spelled);
    }
    out
}

const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE nodes (
    id {serial},
    uuid TEXT NOT NULL CONSTRAINT nodes_uuid_key UNIQUE,
    name TEXT CONSTRAINT nodes_name_key UNIQUE,
    driver TEXT NOT NULL,
    driver_info {json} NOT NULL,
    driver_internal_info {json} NOT NULL,
    properties {json} NOT NULL,
    instance_info {json} NOT NULL,
    instance_uuid TEXT,
    extra {json} NOT NULL,
    provision_state TEXT NOT NULL,
    target_provision_state TEXT,
    provision_updated_at {time},
    power_state TEXT,
    target_power_state TEXT,
    maintenance {bool} NOT NULL DEFAULT FALSE,
    maintenance_reason TEXT,
    fault TEXT,
    last_error TEXT,
    clean_step {json},
    deploy_step {json},
    reservation TEXT,
    conductor TEXT,
    automated_clean {bool},
    resource_class TEXT,
    created_at {time} NOT NULL,
    updated_at {time},
    version {int} NOT NULL
);
CREATE INDEX nodes_provision_state ON nodes(provision_state);
CREATE INDEX nodes_reservation ON nodes(reservation);
CREATE TABLE ports (
    id {serial},
    uuid TEXT NOT NULL CONSTRAINT ports_uuid_key UNIQUE,
    node_uuid TEXT NOT NULL REFERENCES nodes(uuid) ON DELETE CASCADE,
    address TEXT NOT NULL CONSTRAINT ports_address_key UNIQUE,
    pxe_enabled {bool} NOT NULL,
    extra {json} NOT NULL,
    created_at {time} NOT NULL,
    updated_at {time},
    version {int} NOT NULL
);
CREATE INDEX ports_node ON ports(node_uuid);
"#,
    // Migration 2: agent commands and inventories. PostgreSQL cannot index a JSON column
    // (`result`), and the pending scan is what needs the index: a partial one there.
    r#"
CREATE TABLE agent_commands (
    seq {serial},
    id TEXT NOT NULL CONSTRAINT agent_commands_id_key UNIQUE,
    node_uuid TEXT NOT NULL REFERENCES nodes(uuid) ON DELETE CASCADE,
    command {json} NOT NULL,
    result {json},
    cancelled {bool} NOT NULL DEFAULT FALSE,
    created_at {time} NOT NULL,
    finished_at {time}
);
sqlite: CREATE INDEX agent_commands_node ON agent_commands(node_uuid, result);
postgres: CREATE INDEX agent_commands_node ON agent_commands(node_uuid);
postgres: CREATE INDEX agent_commands_pending ON agent_commands(node_uuid, seq) WHERE result IS NULL;
CREATE TABLE node_inventory (
    node_uuid TEXT PRIMARY KEY REFERENCES nodes(uuid) ON DELETE CASCADE,
    inventory {json} NOT NULL,
    collected_at {time} NOT NULL
);
"#,
    r#"
ALTER TABLE nodes ADD COLUMN inspect_interface TEXT;
ALTER TABLE nodes ADD COLUMN inspection_started_at {time};
ALTER TABLE nodes ADD COLUMN inspection_finished_at {time};
ALTER TABLE nodes ADD COLUMN traits {json} NOT NULL DEFAULT '[]';
CREATE TABLE inspection_rules (
    seq {serial},
    uuid TEXT NOT NULL CONSTRAINT inspection_rules_uuid_key UNIQUE,
    priority {int} NOT NULL,
    body {json} NOT NULL,
    created_at {time} NOT NULL
);
"#,
    // The audit trail: state-changing admin requests and the provision transitions they (or
    // the conductor) cause. Append-only.
    r#"
CREATE TABLE audit_log (
    seq {serial},
    created_at {time} NOT NULL,
    actor TEXT NOT NULL,
    source TEXT,
    method TEXT,
    path TEXT,
    node_uuid TEXT,
    action TEXT NOT NULL,
    status {int},
    detail TEXT
);
CREATE INDEX audit_log_node ON audit_log(node_uuid, seq);
"#,
    // Several controllers on one database: their registration heartbeats (a node's
    // reservation lives as long as its holder's heartbeat).
    r#"
CREATE TABLE conductors (
    id TEXT PRIMARY KEY,
    hostname TEXT NOT NULL,
    started_at {time} NOT NULL,
    last_seen {time} NOT NULL
);
"#,
    // Per-node interface implementations (boot, deploy, …) as one JSON object; NULL = the
    // hardware type's defaults.
    r#"
ALTER TABLE nodes ADD COLUMN interfaces {json};
"#,
    // Agent liveness outside the node's version (Store::record_liveness).
    r#"
ALTER TABLE nodes ADD COLUMN agent_last_heartbeat {time};
ALTER TABLE nodes ADD COLUMN agent_version TEXT;
ALTER TABLE nodes ADD COLUMN step_progress {json};
"#,
    // The conductor's typed run state (crate::runs), out of driver_internal_info.
    r#"
ALTER TABLE nodes ADD COLUMN run_state {json};
"#,
    // Ironic's ownership and lifecycle fields (store::Attributes).
    r#"
ALTER TABLE nodes ADD COLUMN owner TEXT;
ALTER TABLE nodes ADD COLUMN lessee TEXT;
ALTER TABLE nodes ADD COLUMN description TEXT;
ALTER TABLE nodes ADD COLUMN conductor_group TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN shard TEXT;
ALTER TABLE nodes ADD COLUMN instance_name TEXT;
ALTER TABLE nodes ADD COLUMN parent_node TEXT;
ALTER TABLE nodes ADD COLUMN network_data {json} NOT NULL DEFAULT '{}';
ALTER TABLE nodes ADD COLUMN retired {bool} NOT NULL DEFAULT FALSE;
ALTER TABLE nodes ADD COLUMN retired_reason TEXT;
ALTER TABLE nodes ADD COLUMN protected {bool} NOT NULL DEFAULT FALSE;
ALTER TABLE nodes ADD COLUMN protected_reason TEXT;
ALTER TABLE nodes ADD COLUMN disable_power_off {bool} NOT NULL DEFAULT FALSE;
"#,
    // Chassis (Ironic's grouping of nodes) and a node's chassis.
    r#"
CREATE TABLE chassis (
    id {serial},
    uuid TEXT NOT NULL CONSTRAINT chassis_uuid_key UNIQUE,
    description TEXT,
    extra {json} NOT NULL DEFAULT '{}',
    created_at {time} NOT NULL,
    updated_at {time},
    version {int} NOT NULL
);
ALTER TABLE nodes ADD COLUMN chassis_uuid TEXT;
CREATE INDEX nodes_chassis ON nodes(chassis_uuid);
"#,
    // Migration 11: the rest of Ironic's port fields, port groups (a port's group is named by
    // UUID; a group is refused deletion while ports name it) and VIFs (kept in internal_info).
    r#"
ALTER TABLE ports ADD COLUMN name TEXT;
CREATE UNIQUE INDEX ports_name_key ON ports(name);
ALTER TABLE ports ADD COLUMN portgroup_uuid TEXT;
CREATE INDEX ports_portgroup ON ports(portgroup_uuid);
ALTER TABLE ports ADD COLUMN physical_network TEXT;
ALTER TABLE ports ADD COLUMN internal_info {json} NOT NULL DEFAULT '{}';
ALTER TABLE ports ADD COLUMN local_link_connection {json} NOT NULL DEFAULT '{}';
ALTER TABLE ports ADD COLUMN is_smartnic {bool} NOT NULL DEFAULT FALSE;
ALTER TABLE ports ADD COLUMN description TEXT;
ALTER TABLE ports ADD COLUMN vendor TEXT;
ALTER TABLE ports ADD COLUMN category TEXT;
ALTER TABLE ports ADD COLUMN available_for_dynamic_portgroup {bool} NOT NULL DEFAULT FALSE;
CREATE TABLE portgroups (
    id {serial},
    uuid TEXT NOT NULL CONSTRAINT portgroups_uuid_key UNIQUE,
    name TEXT CONSTRAINT portgroups_name_key UNIQUE,
    node_uuid TEXT NOT NULL REFERENCES nodes(uuid) ON DELETE CASCADE,
    address TEXT CONSTRAINT portgroups_address_key UNIQUE,
    extra {json} NOT NULL DEFAULT '{}',
    internal_info {json} NOT NULL DEFAULT '{}',
    mode TEXT,
    properties {json} NOT NULL DEFAULT '{}',
    standalone_ports_supported {bool} NOT NULL DEFAULT TRUE,
    physical_network TEXT,
    category TEXT,
    dynamic_portgroup {bool} NOT NULL DEFAULT FALSE,
    created_at {time} NOT NULL,
    updated_at {time},
    version {int} NOT NULL
);
CREATE INDEX portgroups_node ON portgroups(node_uuid);
"#,
    // Migration 12: allocations (a node holds at most one: the unique node_uuid), and the
    // step documents of deploy templates and runbooks (`kind`), names unique per kind.
    r#"
CREATE TABLE allocations (
    id {serial},
    uuid TEXT NOT NULL CONSTRAINT allocations_uuid_key UNIQUE,
    name TEXT CONSTRAINT allocations_name_key UNIQUE,
    node_uuid TEXT CONSTRAINT allocations_node_uuid_key UNIQUE,
    state TEXT NOT NULL,
    last_error TEXT,
    resource_class TEXT,
    candidate_nodes {json} NOT NULL DEFAULT '[]',
    traits {json} NOT NULL DEFAULT '[]',
    extra {json} NOT NULL DEFAULT '{}',
    owner TEXT,
    created_at {time} NOT NULL,
    updated_at {time},
    version {int} NOT NULL
);
CREATE INDEX allocations_state ON allocations(state);
CREATE TABLE step_templates (
    id {serial},
    kind TEXT NOT NULL,
    uuid TEXT NOT NULL CONSTRAINT step_templates_uuid_key UNIQUE,
    name TEXT NOT NULL,
    description TEXT,
    traits {json} NOT NULL DEFAULT '[]',
    steps {json} NOT NULL DEFAULT '[]',
    extra {json} NOT NULL DEFAULT '{}',
    owner TEXT,
    public {bool} NOT NULL DEFAULT FALSE,
    disable_ramdisk {bool} NOT NULL DEFAULT FALSE,
    created_at {time} NOT NULL,
    updated_at {time},
    version {int} NOT NULL,
    CONSTRAINT step_templates_kind_name_key UNIQUE (kind, name)
);
"#,
    // Migration 13: node sub-resources: volume connectors and targets (Ironic 1.32), the BIOS
    // settings cache (1.40/1.74), the firmware components cache (1.86; vendor, model and
    // serial number 1.114), and a node's RAID configurations (1.12), boot mode and secure
    // boot (1.75).
    r#"
CREATE TABLE volume_connectors (
    id {serial},
    uuid TEXT NOT NULL UNIQUE,
    node_uuid TEXT NOT NULL REFERENCES nodes(uuid) ON DELETE CASCADE,
    type TEXT NOT NULL,
    connector_id TEXT NOT NULL,
    extra {json} NOT NULL DEFAULT '{}',
    created_at {time} NOT NULL,
    updated_at {time},
    UNIQUE (type, connector_id)
);
CREATE INDEX volume_connectors_node ON volume_connectors(node_uuid);
CREATE TABLE volume_targets (
    id {serial},
    uuid TEXT NOT NULL UNIQUE,
    node_uuid TEXT NOT NULL REFERENCES nodes(uuid) ON DELETE CASCADE,
    volume_type TEXT NOT NULL,
    properties {json} NOT NULL DEFAULT '{}',
    boot_index {int} NOT NULL,
    volume_id TEXT NOT NULL,
    extra {json} NOT NULL DEFAULT '{}',
    created_at {time} NOT NULL,
    updated_at {time},
    UNIQUE (node_uuid, boot_index)
);
CREATE TABLE bios_settings (
    node_uuid TEXT NOT NULL REFERENCES nodes(uuid) ON DELETE CASCADE,
    name TEXT NOT NULL,
    value TEXT,
    registry {json} NOT NULL DEFAULT '{}',
    created_at {time} NOT NULL,
    updated_at {time},
    PRIMARY KEY (node_uuid, name)
);
CREATE TABLE node_management (
    node_uuid TEXT PRIMARY KEY REFERENCES nodes(uuid) ON DELETE CASCADE,
    target_raid_config {json} NOT NULL DEFAULT '{}',
    raid_config {json} NOT NULL DEFAULT '{}',
    boot_mode TEXT,
    secure_boot {bool}
);
CREATE TABLE firmware_components (
    node_uuid TEXT NOT NULL REFERENCES nodes(uuid) ON DELETE CASCADE,
    component TEXT NOT NULL,
    initial_version TEXT NOT NULL,
    current_version TEXT,
    last_version_flashed TEXT,
    created_at {time} NOT NULL,
    updated_at {time},
    vendor TEXT,
    model TEXT,
    serial_number TEXT,
    PRIMARY KEY (node_uuid, component)
);
"#,
    // Migration 14: inspection rules in Ironic's schema (API 1.96). The table is unchanged:
    // a rule is one JSON body. Bodies in Rivet's former schema are converted in Rust (SQL
    // cannot rewrite them portably) the first time the rules are read, and stored again:
    // conductor/inspection_rules.rs `load_rules`, inspection/rules.rs `from_stored`.
    r#"
-- migration 14: no DDL (rule bodies are converted on first read)
"#,
    // Migration 15: the hardware health the BMC last reported (Ironic's `node.health`, 1.109),
    // written by power sync; NULL when the driver reports none.
    r#"
ALTER TABLE nodes ADD COLUMN health TEXT;
"#,
    // Migration 16: the agent's log of a failed step, kept with its node (a Rivet extension
    // like Ironic's deploy/clean log collection): store/node_logs.rs, `GET /v1/nodes/{node}/logs`.
    r#"
CREATE TABLE node_logs (
    id {serial},
    node_uuid TEXT NOT NULL REFERENCES nodes(uuid) ON DELETE CASCADE,
    created_at {time} NOT NULL,
    operation TEXT NOT NULL,
    step TEXT,
    command_id TEXT,
    text TEXT NOT NULL
);
CREATE INDEX node_logs_node ON node_logs(node_uuid, id);
"#,
    // Migration 17: a controller that stopped cleanly says so (Ironic's `conductors.online`),
    // so a restart under its id, and the other controllers, need not wait `dead_after_s` for
    // its heartbeat to age.
    r#"
ALTER TABLE conductors ADD COLUMN online {bool} NOT NULL DEFAULT TRUE;
"#,
    // Migration 18: whether a node's console is enabled (Ironic's `node.console_enabled`),
    // kept beside its boot state: only the `fake` console interface turns it on today.
    r#"
ALTER TABLE node_management ADD COLUMN console_enabled {bool} NOT NULL DEFAULT FALSE;
"#,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placeholder_and_dialect_line_is_rendered() {
        for dialect in [Dialect::Sqlite, Dialect::Postgres] {
            for (i, sql) in all(dialect).enumerate() {
                for left in [
                    "{serial}",
                    "{int}",
                    "{bool}",
                    "{time}",
                    "{json}",
                    "sqlite: ",
                    "postgres: ",
                ] {
                    assert!(
                        !sql.contains(left),
                        "migration {} ({dialect:?}) still has {left:?}",
                        i + 1
                    );
                }
            }
        }
        let pg = sql(1, Dialect::Postgres).unwrap_or_default();
        let lite = sql(1, Dialect::Sqlite).unwrap_or_default();
        assert!(pg.contains("WHERE result IS NULL") && !lite.contains("WHERE result IS NULL"));
        assert!(lite.contains("ON agent_commands(node_uuid, result)"));
        assert!(
            pg.contains("seq BIGSERIAL PRIMARY KEY")
                && lite.contains("seq INTEGER PRIMARY KEY AUTOINCREMENT")
        );
        assert_eq!(sql(MIGRATIONS.len(), Dialect::Sqlite), None);
    }

    #[test]
    fn the_sqlite_schema_builds_from_scratch() {
        let conn = rusqlite::Connection::open_in_memory().expect("in-memory SQLite");
        for (i, sql) in all(Dialect::Sqlite).enumerate() {
            conn.execute_batch(&sql)
                .unwrap_or_else(|e| panic!("migration {}: {e}", i + 1));
        }
        // TRUE/FALSE defaults are stored as SQLite's 1/0, as the row decoding expects.
        conn.execute(
            "INSERT INTO conductors (id, hostname, started_at, last_seen) VALUES ('c', 'h', 'x', 'y')",
            [],
        )
        .expect("insert");
        let online: i64 = conn
            .query_row("SELECT online FROM conductors", [], |r| r.get(0))
            .expect("read");
        assert_eq!(online, 1);
    }
}
