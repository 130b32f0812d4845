//! Allocations (Ironic 1.52) and step templates — deploy templates (1.55) and runbooks
//! (1.92) — in the store: their listing queries and SQL for both engines (the records
//! themselves are in [`super::records`], re-exported here).
//!
//! A node holds at most one allocation: `allocations.node_uuid` is unique, so two
//! allocations that race for one node cannot both record it, whatever the conductor does.
//! Deploy templates and runbooks share one table (`step_templates`), told apart by `kind`;
//! a name is unique per kind.

use super::queries::SqlStore;
use super::sql::{placeholders, Access, Arg, Dialect, Engine, ExecError, SqlRow};
use super::{SortDir, StoreError};
use chrono::Utc;
use serde_json::{Map, Value};

pub use super::records::{
    alloc_state, Allocation, AllocationQuery, StepTemplate, TemplateKind, TemplateQuery,
    ALLOCATION_SORT_KEYS, TEMPLATE_SORT_KEYS,
};

const ALLOCATION_SELECT: &str = "uuid, name, node_uuid, state, last_error, resource_class, \
     candidate_nodes, traits, extra, owner, created_at, updated_at, version";

const TEMPLATE_SELECT: &str = "kind, uuid, name, steps, extra, owner, public, disable_ramdisk, \
     created_at, updated_at, version, description, traits";

fn strings(text: Option<String>) -> Vec<String> {
    text.and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

fn object(text: Option<String>) -> Map<String, Value> {
    match text.and_then(|t| serde_json::from_str(&t).ok()) {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

fn allocation_from_row(mut r: impl SqlRow) -> Result<Allocation, StoreError> {
    Ok(Allocation {
        uuid: r.text(0)?,
        name: r.opt_text(1)?,
        node_uuid: r.opt_text(2)?,
        state: r.text(3)?,
        last_error: r.opt_text(4)?,
        resource_class: r.opt_text(5)?,
        candidate_nodes: strings(r.json(6)?),
        traits: strings(r.json(7)?),
        extra: object(r.json(8)?),
        owner: r.opt_text(9)?,
        created_at: r.time(10)?.unwrap_or_else(Utc::now),
        updated_at: r.time(11)?,
        version: r.int(12)?,
    })
}

fn template_from_row(mut r: impl SqlRow) -> Result<StepTemplate, StoreError> {
    let kind = match r.text(0)?.as_str() {
        "runbook" => TemplateKind::Runbook,
        _ => TemplateKind::Deploy,
    };
    Ok(StepTemplate {
        kind,
        uuid: r.text(1)?,
        name: r.text(2)?,
        steps: r
            .json(3)?
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default(),
        extra: object(r.json(4)?),
        owner: r.opt_text(5)?,
        public: r.flag(6)?,
        disable_ramdisk: r.flag(7)?,
        created_at: r.time(8)?.unwrap_or_else(Utc::now),
        updated_at: r.time(9)?,
        version: r.int(10)?,
        description: r.opt_text(11)?,
        traits: strings(r.json(12)?),
    })
}

fn json_arg(v: impl serde::Serialize) -> Arg {
    Arg::Json(serde_json::to_string(&v).unwrap_or_else(|_| "null".into()))
}

fn allocation_values(a: &Allocation) -> Vec<Arg> {
    vec![
        a.uuid.as_str().into(),
        a.name.clone().into(),
        a.node_uuid.clone().into(),
        a.state.as_str().into(),
        a.last_error.clone().into(),
        a.resource_class.clone().into(),
        json_arg(&a.candidate_nodes),
        json_arg(&a.traits),
        json_arg(&a.extra),
        a.owner.clone().into(),
        a.created_at.into(),
        a.updated_at.into(),
        a.version.into(),
    ]
}

fn template_values(t: &StepTemplate) -> Vec<Arg> {
    vec![
        t.kind.as_str().into(),
        t.uuid.as_str().into(),
        t.name.as_str().into(),
        json_arg(&t.steps),
        json_arg(&t.extra),
        t.owner.clone().into(),
        t.public.into(),
        t.disable_ramdisk.into(),
        t.created_at.into(),
        t.updated_at.into(),
        t.version.into(),
        t.description.clone().into(),
        json_arg(&t.traits),
    ]
}

/// The expression a listing sorts `key` by: never NULL (so a marker's row-value comparison
/// holds), text byte-wise.
fn sort_expr(d: Dialect, key: &str) -> String {
    match key {
        "id" | "created_at" => key.into(),
        "updated_at" => match d {
            Dialect::Sqlite => "COALESCE(updated_at, '')".into(),
            Dialect::Postgres => "COALESCE(updated_at, '-infinity')".into(),
        },
        _ => format!("COALESCE({key}, ''){}", d.bytewise()),
    }
}

/// A duplicate-key error of an allocation write, in Ironic's words.
fn allocation_duplicate(what: &str, a: &Allocation) -> StoreError {
    if what.contains("node_uuid") {
        StoreError::Duplicate(format!(
            "Node {} already has an allocation.",
            a.node_uuid.as_deref().unwrap_or("")
        ))
    } else if what.contains("name") {
        StoreError::Duplicate(format!(
            "An allocation with name {} already exists.",
            a.name.as_deref().unwrap_or("")
        ))
    } else {
        StoreError::Duplicate(format!(
            "An allocation with UUID {} already exists.",
            a.uuid
        ))
    }
}

fn template_duplicate(what: &str, t: &StepTemplate) -> StoreError {
    let kind = match t.kind {
        TemplateKind::Deploy => "A deploy template",
        TemplateKind::Runbook => "A runbook",
    };
    if what.contains("uuid") {
        StoreError::Duplicate(format!("{kind} with UUID {} already exists.", t.uuid))
    } else {
        StoreError::Duplicate(format!("{kind} with name {} already exists.", t.name))
    }
}

impl<E: Engine> SqlStore<E> {
    async fn alloc_rows(&self, sql: &str, args: Vec<Arg>) -> Result<Vec<Allocation>, StoreError> {
        let rows = self.engine.rows(Access::Read, sql, args).await?;
        rows.into_iter().map(allocation_from_row).collect()
    }

    async fn template_rows(
        &self,
        access: Access,
        sql: &str,
        args: Vec<Arg>,
    ) -> Result<Vec<StepTemplate>, StoreError> {
        let rows = self.engine.rows(access, sql, args).await?;
        rows.into_iter().map(template_from_row).collect()
    }

    pub(super) async fn sql_create_allocation(
        &self,
        a: &Allocation,
    ) -> Result<Allocation, StoreError> {
        let mut a = a.clone();
        a.version = 1;
        a.updated_at = None;
        let sql = format!(
            "INSERT INTO allocations ({ALLOCATION_SELECT}) VALUES ({})",
            placeholders(1, 13)
        );
        match self.engine.execute(&sql, allocation_values(&a)).await {
            Ok(_) => Ok(a),
            Err(ExecError::Unique(what)) => Err(allocation_duplicate(&what, &a)),
            Err(ExecError::Store(e)) => Err(e),
        }
    }

    pub(super) async fn sql_get_allocation(&self, ident: &str) -> Result<Allocation, StoreError> {
        let sql = format!(
            "SELECT {ALLOCATION_SELECT} FROM allocations WHERE uuid = $1 OR name = $1 \
             ORDER BY (uuid = $1) DESC LIMIT 1"
        );
        self.alloc_rows(&sql, vec![ident.into()])
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| StoreError::NotFound {
                kind: "allocation",
                ident: ident.to_string(),
            })
    }

    pub(super) async fn sql_allocation_of_node(
        &self,
        node_uuid: &str,
    ) -> Result<Option<Allocation>, StoreError> {
        let sql = format!("SELECT {ALLOCATION_SELECT} FROM allocations WHERE node_uuid = $1");
        Ok(self
            .alloc_rows(&sql, vec![node_uuid.into()])
            .await?
            .into_iter()
            .next())
    }

    pub(super) async fn sql_list_allocations(
        &self,
        q: &AllocationQuery,
    ) -> Result<Vec<Allocation>, StoreError> {
        if !ALLOCATION_SORT_KEYS.contains(&q.sort_key.as_str()) {
            return Err(StoreError::Backend(format!(
                "invalid sort key {}",
                q.sort_key
            )));
        }
        let expr = sort_expr(self.engine.dialect(), &q.sort_key);
        let (op, dir) = if q.sort_dir == SortDir::Asc {
            (">", "ASC")
        } else {
            ("<", "DESC")
        };
        let mut wheres: Vec<String> = Vec::new();
        let mut args: Vec<Arg> = Vec::new();
        for (col, v) in [
            ("node_uuid", &q.node_uuid),
            ("resource_class", &q.resource_class),
            ("state", &q.state),
            ("owner", &q.owner),
        ] {
            if let Some(v) = v {
                args.push(v.as_str().into());
                wheres.push(format!("{col} = ${}", args.len()));
            }
        }
        if let Some(m) = &q.marker {
            let rows = self
                .engine
                .rows(
                    Access::Read,
                    "SELECT id FROM allocations WHERE uuid = $1",
                    vec![m.as_str().into()],
                )
                .await?;
            let id = match rows.into_iter().next() {
                Some(mut r) => r.int(0)?,
                None => {
                    return Err(StoreError::NotFound {
                        kind: "allocation",
                        ident: m.clone(),
                    })
                }
            };
            args.push(id.into());
            let i = args.len();
            wheres.push(if q.sort_key == "id" {
                format!("id {op} ${i}")
            } else {
                format!("({expr}, id) {op} (SELECT {expr}, id FROM allocations WHERE id = ${i})")
            });
        }
        args.push(Arg::Int(
            i64::try_from(super::page_limit(q.limit)).unwrap_or(i64::MAX),
        ));
        let sql = format!(
            "SELECT {ALLOCATION_SELECT} FROM allocations {} ORDER BY {expr} {dir}, id {dir} LIMIT ${}",
            super::where_clause(&wheres),
            args.len()
        );
        let rows = self.engine.rows(Access::Scan, &sql, args).await?;
        rows.into_iter().map(allocation_from_row).collect()
    }

    pub(super) async fn sql_update_allocation(
        &self,
        a: &Allocation,
    ) -> Result<Allocation, StoreError> {
        let mut a = a.clone();
        let expected = a.version;
        a.version += 1;
        a.updated_at = Some(Utc::now());
        let mut args = allocation_values(&a);
        // created_at (the 11th value) is never rewritten.
        args.remove(10);
        args.push(expected.into());
        let n = self
            .engine
            .execute(
                "UPDATE allocations SET name = $2, node_uuid = $3, state = $4, last_error = $5, \
                 resource_class = $6, candidate_nodes = $7, traits = $8, extra = $9, owner = $10, \
                 updated_at = $11, version = $12 WHERE uuid = $1 AND version = $13",
                args,
            )
            .await;
        match n {
            Ok(1) => Ok(a),
            Ok(_) => {
                self.sql_get_allocation(&a.uuid).await?;
                Err(StoreError::Conflict {
                    kind: "allocation",
                    ident: a.uuid.clone(),
                    expected,
                })
            }
            Err(ExecError::Unique(what)) => Err(allocation_duplicate(&what, &a)),
            Err(ExecError::Store(e)) => Err(e),
        }
    }

    pub(super) async fn sql_delete_allocation(&self, uuid: &str) -> Result<(), StoreError> {
        let n = self
            .engine
            .execute("DELETE FROM allocations WHERE uuid = $1", vec![uuid.into()])
            .await
            .map_err(|e| match e {
                ExecError::Unique(w) => StoreError::Duplicate(w),
                ExecError::Store(e) => e,
            })?;
        if n == 0 {
            return Err(StoreError::NotFound {
                kind: "allocation",
                ident: uuid.to_string(),
            });
        }
        Ok(())
    }

    pub(super) async fn sql_create_template(
        &self,
        t: &StepTemplate,
    ) -> Result<StepTemplate, StoreError> {
        let mut t = t.clone();
        t.version = 1;
        t.updated_at = None;
        let sql = format!(
            "INSERT INTO step_templates ({TEMPLATE_SELECT}) VALUES ({})",
            placeholders(1, 13)
        );
        match self.engine.execute(&sql, template_values(&t)).await {
            Ok(_) => Ok(t),
            Err(ExecError::Unique(what)) => Err(template_duplicate(&what, &t)),
            Err(ExecError::Store(e)) => Err(e),
        }
    }

    pub(super) async fn sql_get_template(
        &self,
        kind: TemplateKind,
        ident: &str,
    ) -> Result<StepTemplate, StoreError> {
        let sql = format!(
            "SELECT {TEMPLATE_SELECT} FROM step_templates WHERE kind = $1 \
             AND (uuid = $2 OR name = $2) ORDER BY (uuid = $2) DESC LIMIT 1"
        );
        self.template_rows(Access::Read, &sql, vec![kind.as_str().into(), ident.into()])
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| StoreError::NotFound {
                kind: kind.as_str(),
                ident: ident.to_string(),
            })
    }

    pub(super) async fn sql_list_templates(
        &self,
        q: &TemplateQuery,
    ) -> Result<Vec<StepTemplate>, StoreError> {
        if !TEMPLATE_SORT_KEYS.contains(&q.sort_key.as_str()) {
            return Err(StoreError::Backend(format!(
                "invalid sort key {}",
                q.sort_key
            )));
        }
        let expr = sort_expr(self.engine.dialect(), &q.sort_key);
        let (op, dir) = if q.sort_dir == SortDir::Asc {
            (">", "ASC")
        } else {
            ("<", "DESC")
        };
        let mut args: Vec<Arg> = vec![q.kind.as_str().into()];
        let mut wheres: Vec<String> = vec!["kind = $1".into()];
        if let Some(names) = &q.names {
            if names.is_empty() {
                return Ok(Vec::new());
            }
            let first = args.len() + 1;
            args.extend(names.iter().map(|n| Arg::from(n.as_str())));
            wheres.push(format!("name IN ({})", placeholders(first, names.len())));
        }
        if let Some(o) = &q.owner {
            args.push(o.as_str().into());
            wheres.push(format!("owner = ${}", args.len()));
        }
        if let Some(p) = q.public {
            args.push(p.into());
            wheres.push(format!("public = ${}", args.len()));
        }
        if let Some(m) = &q.marker {
            let rows = self
                .engine
                .rows(
                    Access::Read,
                    "SELECT id FROM step_templates WHERE uuid = $1 AND kind = $2",
                    vec![m.as_str().into(), q.kind.as_str().into()],
                )
                .await?;
            let id = match rows.into_iter().next() {
                Some(mut r) => r.int(0)?,
                None => {
                    return Err(StoreError::NotFound {
                        kind: q.kind.as_str(),
                        ident: m.clone(),
                    })
                }
            };
            args.push(id.into());
            let i = args.len();
            wheres.push(if q.sort_key == "id" {
                format!("id {op} ${i}")
            } else {
                format!("({expr}, id) {op} (SELECT {expr}, id FROM step_templates WHERE id = ${i})")
            });
        }
        args.push(Arg::Int(
            i64::try_from(super::page_limit(q.limit)).unwrap_or(i64::MAX),
        ));
        let sql = format!(
            "SELECT {TEMPLATE_SELECT} FROM step_templates {} ORDER BY {expr} {dir}, id {dir} LIMIT ${}",
            super::where_clause(&wheres),
            args.len()
        );
        self.template_rows(Access::Scan, &sql, args).await
    }

    pub(super) async fn sql_update_template(
        &self,
        t: &StepTemplate,
    ) -> Result<StepTemplate, StoreError> {
        let mut t = t.clone();
        let expected = t.version;
        t.version += 1;
        t.updated_at = Some(Utc::now());
        let mut args = template_values(&t);
        // created_at (the 9th value) is never rewritten.
        args.remove(8);
        args.push(expected.into());
        let n = self
            .engine
            .execute(
                "UPDATE step_templates SET name = $3, steps = $4, extra = $5, owner = $6, \
                 public = $7, disable_ramdisk = $8, updated_at = $9, version = $10, \
                 description = $11, traits = $12 WHERE kind = $1 AND uuid = $2 AND version = $13",
                args,
            )
            .await;
        match n {
            Ok(1) => Ok(t),
            Ok(_) => {
                self.sql_get_template(t.kind, &t.uuid).await?;
                Err(StoreError::Conflict {
                    kind: t.kind.as_str(),
                    ident: t.uuid.clone(),
                    expected,
                })
            }
            Err(ExecError::Unique(what)) => Err(template_duplicate(&what, &t)),
            Err(ExecError::Store(e)) => Err(e),
        }
    }

    pub(super) async fn sql_delete_template(
        &self,
        kind: TemplateKind,
        uuid: &str,
    ) -> Result<(), StoreError> {
        let n = self
            .engine
            .execute(
                "DELETE FROM step_templates WHERE kind = $1 AND uuid = $2",
                vec![kind.as_str().into(), uuid.into()],
            )
            .await
            .map_err(|e| match e {
                ExecError::Unique(w) => StoreError::Duplicate(w),
                ExecError::Store(e) => e,
            })?;
        if n == 0 {
            return Err(StoreError::NotFound {
                kind: kind.as_str(),
                ident: uuid.to_string(),
            });
        }
        Ok(())
    }
}
