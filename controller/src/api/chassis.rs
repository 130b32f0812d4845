//! `/v1/chassis`: Ironic's grouping of nodes (API 1.1), and the nodes of a chassis.

use super::body::{check_length, check_uuid, object_body, object_in, string_in, uuid_in, Named};
use super::nodes;
use super::render::{document, links};
use super::resource::{
    self, fetch, found, page_of, paged, Access, Listing, Page, Patched, Resource,
};
use super::version::ApiVersion;
use super::{ApiError, ApiResult, AppState};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::routing::get;
use axum::Router;
use chrono::Utc;
use rivet_model::node::Chassis;
use rivet_store::{ChassisQuery, StoreError, CHASSIS_SORT_KEYS};
use serde_json::{json, Map, Value};
use std::collections::HashMap;

pub fn routes() -> Router<AppState> {
    resource::routes::<Api>()
        .route(
            "/v1/chassis/{uuid}/nodes",
            get(chassis_nodes::<false>).delete(no_nodes_delete),
        )
        .route(
            "/v1/chassis/{uuid}/nodes/detail",
            get(chassis_nodes::<true>),
        )
}

/// Fields a chassis listing shows without `detail` (Ironic's DEFAULT_RETURN_FIELDS, and links).
const LIST_FIELDS: &[&str] = &["uuid", "description", "links"];

/// Longest description Ironic accepts.
const MAX_DESCRIPTION: usize = 255;

/// The chassis document.
fn chassis_full(c: &Chassis, base: &str) -> Map<String, Value> {
    document(
        json!({
        "uuid": c.uuid,
        "description": c.description,
        "extra": c.extra,
        "nodes": links(base, "chassis", &format!("{}/nodes", c.uuid)),
        }),
        base,
        "chassis",
        &c.uuid,
        c.created_at,
        c.updated_at,
    )
}

/// `description` and `extra` of a body or patched document, checked as Ironic's
/// CHASSIS_SCHEMA checks them.
fn fields_of(doc: &Map<String, Value>) -> Result<(Option<String>, Map<String, Value>), ApiError> {
    let description = string_in(doc, "description", Named::Bare)?;
    if let Some(d) = &description {
        check_length("description", d, MAX_DESCRIPTION)?;
    }
    Ok((description, object_in(doc, "extra", Named::Bare)?))
}

/// The chassis collection.
pub(super) struct Api;

impl Resource for Api {
    type Record = Chassis;
    const PATH: &'static str = "chassis";
    const NAME: &'static str = "Chassis";
    const IDENT: &'static str = "uuid";
    const LIST_FIELDS: &'static [&'static str] = LIST_FIELDS;
    const SORT_KEYS: &'static [&'static str] = CHASSIS_SORT_KEYS;
    const PATCHABLE: &'static [&'static str] = &["description", "extra"];

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

    async fn list(state: &AppState, _l: &Listing<'_>, page: Page) -> ApiResult<Vec<Chassis>> {
        let q = paged!(ChassisQuery {}, page);
        page_of::<Self, _>(state.conductor.store.list_chassis(&q).await)
    }

    type Body = Value;

    async fn create(state: &AppState, body: Value, _version: (u32, u32)) -> ApiResult<Chassis> {
        let doc = object_body(body, "a chassis", &["uuid", "description", "extra"])?;
        let uuid = uuid_in(&doc, Named::Bare)?;
        let (description, extra) = fields_of(&doc)?;
        let chassis = Chassis {
            uuid,
            description,
            extra,
            ..Self::blank()
        };
        Ok(state.conductor.store.create_chassis(&chassis).await?)
    }

    async fn patched(state: &AppState, c: Chassis, p: Patched<'_>) -> ApiResult<Chassis> {
        let doc = p.doc;
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

/// `GET /v1/chassis/{uuid}/nodes` (`DETAIL`: its `/detail`): the node listing of
/// `/v1/nodes` limited to the chassis (404 when there is none).
async fn chassis_nodes<const DETAIL: bool>(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiVersion(version): ApiVersion,
    Path(uuid): Path<String>,
    Query(mut params): Query<HashMap<String, String>>,
) -> ApiResult<super::node_json::JsonBytes> {
    let chassis = fetch::<Api>(&state, &uuid, Access::Read).await?;
    if params.contains_key("chassis_uuid") {
        return Err(ApiError::bad_request(
            "chassis_uuid cannot be given when listing the nodes of a chassis",
        ));
    }
    params.insert("chassis_uuid".into(), chassis.uuid);
    nodes::list_inner(&state, &headers, version, params, DETAIL).await
}

/// Nodes are not deleted through their chassis (Ironic: 400).
async fn no_nodes_delete() -> ApiError {
    ApiError::bad_request("nodes cannot be deleted through /v1/chassis/{uuid}/nodes")
}
