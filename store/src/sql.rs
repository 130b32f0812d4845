//! What a database engine gives the store: run one SQL text with typed arguments, hand back
//! rows. Backend-agnostic: this module imports neither engine nor the queries. The `queries`
//! module holds every query once, written against this interface; the `sqlite` and
//! `postgres` modules implement it, and the crate root picks one when a store is opened.
//!
//! Query texts use PostgreSQL's numbered placeholders (`$1`, `$2`…); the SQLite engine reads
//! them as its own numbered form (`?1`, `?2`…), so one text serves both. The few places where
//! the two SQL dialects differ (how a sort key orders NULLs and text, JSON type tests, the
//! lease statement) are methods of [`Dialect`], next to each other, not copies of queries.

use super::StoreError;
use chrono::{DateTime, Utc};

/// A query argument. The engine binds it in its own representation: SQLite keeps times as
/// RFC 3339 text and flags as integers, PostgreSQL as `TIMESTAMPTZ` and `BOOLEAN`; JSON goes
/// as its text on both (PostgreSQL's `JSON` columns keep the text verbatim).
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    /// NULL.
    Null,
    /// Text.
    Text(String),
    /// An integer.
    Int(i64),
    /// A flag.
    Bool(bool),
    /// A float (seconds of an interval).
    Float(f64),
    /// A point in time.
    Time(DateTime<Utc>),
    /// JSON text.
    Json(String),
}

impl From<&str> for Arg {
    fn from(s: &str) -> Arg {
        Arg::Text(s.to_string())
    }
}

impl From<String> for Arg {
    fn from(s: String) -> Arg {
        Arg::Text(s)
    }
}

impl From<i64> for Arg {
    fn from(i: i64) -> Arg {
        Arg::Int(i)
    }
}

impl From<bool> for Arg {
    fn from(b: bool) -> Arg {
        Arg::Bool(b)
    }
}

impl From<DateTime<Utc>> for Arg {
    fn from(t: DateTime<Utc>) -> Arg {
        Arg::Time(t)
    }
}

impl<T: Into<Arg>> From<Option<T>> for Arg {
    fn from(v: Option<T>) -> Arg {
        v.map_or(Arg::Null, Into::into)
    }
}

impl Arg {
    /// JSON text (`None` → NULL).
    pub fn json(text: Option<String>) -> Arg {
        text.map_or(Arg::Null, Arg::Json)
    }
}

/// One result row, read by column index. Each column is read once (SQLite rows hand their
/// values over instead of copying them).
pub trait SqlRow: Send {
    /// A nullable text column.
    fn opt_text(&mut self, i: usize) -> Result<Option<String>, StoreError>;
    /// A nullable integer column.
    fn opt_int(&mut self, i: usize) -> Result<Option<i64>, StoreError>;
    /// A nullable flag column.
    fn opt_flag(&mut self, i: usize) -> Result<Option<bool>, StoreError>;
    /// A nullable time column (a SQLite text that is not a time reads as NULL).
    fn time(&mut self, i: usize) -> Result<Option<DateTime<Utc>>, StoreError>;
    /// A nullable JSON column, as its text.
    fn json(&mut self, i: usize) -> Result<Option<String>, StoreError>;

    /// A text column that is never NULL.
    fn text(&mut self, i: usize) -> Result<String, StoreError> {
        self.opt_text(i)?.ok_or_else(|| null_column(i))
    }
    /// An integer column that is never NULL.
    fn int(&mut self, i: usize) -> Result<i64, StoreError> {
        self.opt_int(i)?.ok_or_else(|| null_column(i))
    }
    /// A flag column that is never NULL.
    fn flag(&mut self, i: usize) -> Result<bool, StoreError> {
        self.opt_flag(i)?.ok_or_else(|| null_column(i))
    }
}

fn null_column(i: usize) -> StoreError {
    StoreError::Backend(format!(
        "column {i} of a result row is NULL where a value is required"
    ))
}

/// What a statement does, so an engine can place it: SQLite runs every statement on threads
/// of its own, a short read on the writer's when it is idle, a scan always on a reader's,
/// a write on the writer's; PostgreSQL treats them alike. Also the label of its timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// A short read by key.
    Read,
    /// A listing or scan that may take long.
    Scan,
    /// A statement that writes (`… RETURNING`), on the writer.
    Write,
}

impl Access {
    /// The metrics label of this kind of access.
    pub fn label(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Scan => "scan",
            Access::Write => "write",
        }
    }
}

/// Why a write failed.
#[derive(Debug)]
pub enum ExecError {
    /// A unique constraint refused it; the engine's text names the constraint or column
    /// (`nodes_name_key`, `UNIQUE constraint failed: nodes.name`).
    Unique(String),
    /// Anything else.
    Store(StoreError),
}

impl From<StoreError> for ExecError {
    fn from(e: StoreError) -> ExecError {
        ExecError::Store(e)
    }
}

/// The SQL dialect of an engine: the few fragments that differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite 3.46 (bundled).
    Sqlite,
    /// PostgreSQL 13 or later.
    Postgres,
}

impl Dialect {
    /// `COLLATE …` that makes text compare byte-wise (SQLite's default; PostgreSQL's depends
    /// on the database's locale otherwise).
    pub fn bytewise(self) -> &'static str {
        match self {
            Dialect::Sqlite => "",
            Dialect::Postgres => " COLLATE \"C\"",
        }
    }

    /// The expression a node listing sorts by for `key` (already checked against
    /// [`super::NODE_SORT_KEYS`]). NULLs sort first ascending on both, text byte-wise.
    pub fn sort_expr(self, key: &str) -> String {
        let nullable_time = matches!(key, "updated_at" | "provision_updated_at");
        let nullable = matches!(key, "name" | "resource_class" | "power_state");
        match self {
            Dialect::Sqlite if key == "id" => "id".into(),
            Dialect::Sqlite => format!("COALESCE({key}, '')"),
            Dialect::Postgres => match key {
                "id" | "created_at" | "maintenance" => key.into(),
                _ if nullable_time => format!("COALESCE({key}, '-infinity')"),
                _ if nullable => format!("COALESCE({key}, ''){}", self.bytewise()),
                _ => format!("{key}{}", self.bytewise()),
            },
        }
    }

    /// A condition that is true when the JSON object columns of `nodes` still hold objects:
    /// part of every node UPDATE, so a copy read before someone damaged the row cannot
    /// overwrite the damaged bytes (the write conflicts; the reload is refused as corrupt).
    /// PostgreSQL's `JSON` type already refuses text that is not JSON.
    pub fn node_intact(self) -> &'static str {
        match self {
            Dialect::Sqlite => {
                "json_type(CASE WHEN json_valid(driver_info) THEN driver_info END) IS 'object' \
                 AND json_type(CASE WHEN json_valid(driver_internal_info) THEN driver_internal_info END) IS 'object' \
                 AND json_type(CASE WHEN json_valid(properties) THEN properties END) IS 'object' \
                 AND json_type(CASE WHEN json_valid(instance_info) THEN instance_info END) IS 'object' \
                 AND json_type(CASE WHEN json_valid(extra) THEN extra END) IS 'object' \
                 AND (run_state IS NULL \
                      OR json_type(CASE WHEN json_valid(run_state) THEN run_state END) IS 'object')"
            }
            Dialect::Postgres => {
                "json_typeof(driver_info) = 'object' \
                 AND json_typeof(driver_internal_info) = 'object' AND json_typeof(properties) = 'object' \
                 AND json_typeof(instance_info) = 'object' AND json_typeof(extra) = 'object' \
                 AND (run_state IS NULL OR json_typeof(run_state) = 'object')"
            }
        }
    }

    /// The time `seconds` (a float argument) before the database's `now()`.
    pub fn ago(self, seconds: &str) -> String {
        match self {
            // A function of each connection (sqlite.rs).
            Dialect::Sqlite => format!("ago({seconds})"),
            Dialect::Postgres => format!("(now() - make_interval(secs => {seconds}))"),
        }
    }

    /// A `FROM` source with one row `v` per element of the JSON array argument `param`, the
    /// element in `v.value` (read with `->` / `->>`, which both dialects have): one
    /// statement for a batch of rows of any size, so PostgreSQL keeps one prepared statement.
    pub fn json_rows(self, param: &str) -> String {
        match self {
            Dialect::Sqlite => format!("json_each({param}) AS v"),
            Dialect::Postgres => format!("json_array_elements({param}::json) AS v(value)"),
        }
    }

    /// `text` (an RFC 3339 time as text) as a time value of this engine: SQLite keeps times
    /// as that text.
    pub fn time_from_text(self, text: &str) -> String {
        match self {
            Dialect::Sqlite => text.to_string(),
            Dialect::Postgres => format!("({text})::timestamptz"),
        }
    }

    /// An aggregate: the JSON array of JSON column `column` ordered by `order`. The array
    /// text, or NULL over no rows on PostgreSQL (`[]` on SQLite).
    pub fn json_array_of(self, column: &str, order: &str) -> String {
        match self {
            // Ordered aggregates since SQLite 3.44; json() embeds the text as JSON.
            Dialect::Sqlite => format!("json_group_array(json({column}) ORDER BY {order})"),
            Dialect::Postgres => format!("json_agg({column} ORDER BY {order})"),
        }
    }

    /// True when member `key` of JSON column `column` is a JSON string.
    pub fn json_member_is_string(self, column: &str, key: &str) -> String {
        match self {
            Dialect::Sqlite => format!("json_type({column}, '$.{key}') = 'text'"),
            Dialect::Postgres => format!("json_typeof({column} -> '{key}') = 'string'"),
        }
    }
}

/// `$first, $first+1, …` for `n` arguments (an `IN (…)` list).
pub fn placeholders(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A database the store runs its queries on.
#[async_trait::async_trait]
pub trait Engine: Send + Sync + 'static {
    /// A result row.
    type Row: SqlRow;

    /// Its dialect.
    fn dialect(&self) -> Dialect;

    /// Run `sql` and return its rows.
    async fn rows(
        &self,
        access: Access,
        sql: &str,
        args: Vec<Arg>,
    ) -> Result<Vec<Self::Row>, StoreError>;

    /// Run a statement that writes; the number of rows it changed.
    async fn execute(&self, sql: &str, args: Vec<Arg>) -> Result<u64, ExecError>;

    /// Whether several controllers may share this database.
    fn is_shared(&self) -> bool {
        false
    }

    /// Tell every controller sharing the database.
    async fn publish(&self, _notice: &super::Notice) -> Result<(), StoreError> {
        Ok(())
    }

    /// Notices from every controller sharing the database.
    fn subscribe(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<super::Notice>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sort_key_has_an_expression_in_both_dialects() {
        for key in super::super::NODE_SORT_KEYS.iter().chain(&["id"]) {
            for d in [Dialect::Sqlite, Dialect::Postgres] {
                let e = d.sort_expr(key);
                assert!(e.contains(key), "{d:?} {key}: {e}");
            }
        }
        assert_eq!(placeholders(3, 2), "$3, $4");
    }
}
