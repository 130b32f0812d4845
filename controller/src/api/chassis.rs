//! `/v1/chassis`: Ironic's grouping of nodes (API 1.1), and the nodes of a chassis.

use super::body::check_uuid;
use super::nodes;
use super::render::{links, time};
use super::resource::{self, fetch, found, Access, Page, Parent, Resource};
use super::version::{ver, Version};
use super::{listing, ApiError, ApiResult, AppState};
use crate::store::{Chassis, ChassisQuery, SortDir, StoreError, CHASSIS_SORT_KEYS};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::routing::get;
use axum::Router;
use chrono::Utc;
use rivet_protocol::api::PatchOp;
use serde_json::{json, Map, Value};
use std::collections::HashMap;

pub fn routes() -> Router<AppState> {
    resource::routes::<Api>()
        .route(
            "/v1/chassis/{uuid}/nodes",
            get(chassis_nodes).delete(no_nodes_delete),
        )
        .route("/v1/chassis/{uuid}/nodes/detail", get(chassis_nodes_detail))
}

/// Fields a chassis listing shows without `detail` (Ironic's DEFAULT_RETURN_FIELDS, and links).
const LIST_FIELDS: &[&str] = &["uuid", "description", "links"];

/// Longest description Ironic accepts.
const MAX_DESCRIPTION: usize = 255;

/// The chassis document.
fn chassis_full(c: &Chassis, base: &str) -> Map<String, Value> {
    let nodes = format!("{}/nodes", c.uuid);
    let v = json!({
        "uuid": c.uuid,
        "description": c.description,
        "extra": c.extra,
        "created_at": time(&Some(c.created_at)),
        "updated_at": time(&c.updated_at),
        "links": links(base, "chassis", &c.uuid),
        "nodes": links(base, "chassis", &nodes),
    });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// `description` and `extra` of a body or patched document, checked as Ironic's
/// CHASSIS_SCHEMA checks them.
fn fields_of(doc: &Map<String, Value>) -> Result<(Option<String>, Map<String, Value>), ApiError> {
    let description = match doc.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.chars().count() > MAX_DESCRIPTION => {
            return Err(ApiError::bad_request(format!(
                "'{s}' is too long: description is {} characters; at most {MAX_DESCRIPTION} are allowed",
                s.chars().count()
            )))
        }
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "{other} is not of type 'string', 'null'"
            )))
        }
    };
    let extra = match doc.get("extra") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "{other} is not of type 'object', 'null'"
            )))
        }
    };
    Ok((description, extra))
}

/// The chassis collection.
pub(super) struct Api;

impl Resource for Api {
    type Record = Chassis;
    type Query = ChassisQuery;
    type ShowQuery = listing::ShowParams;
    type Body = Value;
    const PATH: &'static str = "chassis";
    const KEY: &'static str = "chassis";
    const NAME: &'static str = "Chassis";
    const IDENT: &'static str = "uuid";
    const LIST_FIELDS: &'static [&'static str] = LIST_FIELDS;
    const LIST_PARAMS: &'static [&'static str] = &[
        "limit", "marker", "sort_key", "sort_dir", "fields", "detail",
    ];
    const SORT_KEYS: &'static [&'static str] = CHASSIS_SORT_KEYS;

    fn uuid(c: &Chassis) -> &str {
        &c.uuid
    }

    fn doc(c: &Chassis, base: &str, _version: (u32, u32)) -> Map<String, Value> {
        chassis_full(c, base)
    }

    fn blank() -> Chassis {
        Chassis {
            uuid: String::new(),
            description: None,
            extra: Map::new(),
            created_at: Utc::now(),
            updated_at: None,
            version: 0,
        }
    }

    /// Chassis are named by UUID only.
    fn ident(ident: &str, _access: Access) -> ApiResult<String> {
        check_uuid("chassis_uuid", ident)
    }

    async fn get(state: &AppState, uuid: &str) -> Result<Chassis, StoreError> {
        state.conductor.store.get_chassis(uuid).await
    }

    async fn query(
        _state: &AppState,
        _params: &HashMap<String, String>,
        _version: (u32, u32),
        _parent: Option<&Parent>,
        page: Page,
    ) -> ApiResult<ChassisQuery> {
        Ok(ChassisQuery {
            limit: page.limit,
            marker: page.marker,
            sort_key: page.sort_key,
            sort_dir: page.sort_dir.unwrap_or(SortDir::Asc),
        })
    }

    async fn list(state: &AppState, q: &ChassisQuery) -> Result<Vec<Chassis>, StoreError> {
        state.conductor.store.list_chassis(q).await
    }

    async fn create(state: &AppState, body: Value, _version: (u32, u32)) -> ApiResult<Chassis> {
        let Value::Object(doc) = body else {
            return Err(ApiError::bad_request("a chassis must be a JSON object"));
        };
        if let Some(bad) = doc
            .keys()
            .find(|k| !["uuid", "description", "extra"].contains(&k.as_str()))
        {
            return Err(ApiError::bad_request(format!(
                "Additional properties are not allowed ('{bad}' was unexpected)"
            )));
        }
        let uuid = match doc.get("uuid") {
            None | Some(Value::Null) => uuid::Uuid::new_v4().to_string(),
            Some(Value::String(u)) => check_uuid("uuid", u)?,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "{other} is not of type 'string', 'null'"
                )))
            }
        };
        let (description, extra) = fields_of(&doc)?;
        let chassis = Chassis {
            uuid,
            description,
            extra,
            ..Self::blank()
        };
        Ok(state.conductor.store.create_chassis(&chassis).await?)
    }

    fn patch_doc(c: &Chassis, _version: (u32, u32)) -> ApiResult<Value> {
        Ok(json!({
            "description": c.description,
            "extra": c.extra,
        }))
    }

    fn patchable(_version: (u32, u32)) -> Vec<&'static str> {
        vec!["description", "extra"]
    }

    async fn patched(
        state: &AppState,
        c: Chassis,
        doc: Map<String, Value>,
        _ops: &[PatchOp],
        _version: (u32, u32),
    ) -> ApiResult<Chassis> {
        let (description, extra) = fields_of(&doc)?;
        let new = Chassis {
            description,
            extra,
            ..c
        };
        Ok(state.conductor.store.update_chassis(&new).await?)
    }

    async fn delete(state: &AppState, c: Chassis) -> ApiResult<()> {
        match found::<Self, _>(&c.uuid, state.conductor.store.delete_chassis(&c.uuid).await)? {
            true => Ok(()),
            // Ironic's ChassisNotEmpty is an Invalid: 400.
            false => Err(ApiError::bad_request(format!(
                "Cannot complete the requested action because chassis {} contains nodes.",
                c.uuid
            ))),
        }
    }
}

/// The node listing of `/v1/nodes` limited to the chassis (404 when there is none).
async fn nodes_of(
    state: AppState,
    headers: HeaderMap,
    version: Version,
    uuid: String,
    mut params: HashMap<String, String>,
    detail: bool,
) -> ApiResult<super::node_json::JsonBytes> {
    let chassis = fetch::<Api>(&state, &uuid, Access::Read).await?;
    if params.contains_key("chassis_uuid") {
        return Err(ApiError::bad_request(
            "chassis_uuid cannot be given when listing the nodes of a chassis",
        ));
    }
    params.insert("chassis_uuid".into(), chassis.uuid);
    nodes::list_inner(&state, &headers, ver(&version), params, detail).await
}

async fn chassis_nodes(
    State(state): State<AppState>,
    headers: HeaderMap,
    version: Version,
    Path(uuid): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<super::node_json::JsonBytes> {
    nodes_of(state, headers, version, uuid, params, false).await
}

async fn chassis_nodes_detail(
    State(state): State<AppState>,
    headers: HeaderMap,
    version: Version,
    Path(uuid): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<super::node_json::JsonBytes> {
    nodes_of(state, headers, version, uuid, params, true).await
}

/// Nodes are not deleted through their chassis (Ironic: 400).
async fn no_nodes_delete() -> ApiError {
    ApiError::bad_request("nodes cannot be deleted through /v1/chassis/{uuid}/nodes")
}
