//! `/v1/allocations` (Ironic 1.52; PATCH 1.57, backfill 1.58, owner 1.60) and a node's
//! allocation (`/v1/nodes/{node}/allocation`). The conductor picks the node
//! (`conductor::allocations`); here requests are checked and answered as Ironic does.

use super::body::{at_most, is_logical_name, object_body, object_in, string_in, Named};
use super::render::{base_url, document, parse_fields};
use super::resource::{self, fetch, page_of, paged, Access, Listing, Page, Patched, Resource};
use super::version::ApiVersion;
use super::{listing, ApiError, ApiResult, AppState};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::{Json, Router};
use chrono::Utc;
use rivet_model::microversions as mv;
use rivet_store::allocations::alloc_state;
use rivet_store::{Allocation, AllocationQuery, StoreError, ALLOCATION_SORT_KEYS};
use serde_json::{json, Map, Value};
use std::collections::HashMap;

pub fn routes() -> Router<AppState> {
    resource::routes::<Api>().route(
        "/v1/nodes/{ident}/allocation",
        get(node_show).delete(node_remove),
    )
}

const BACKFILL_SINCE: (u32, u32) = (1, 58);
const OWNER_SINCE: (u32, u32) = (1, 60);

fn not_acceptable(what: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_ACCEPTABLE,
        format!(
            "Request not acceptable. The minimal required API version should be 1.60 for {what}"
        ),
    )
}

/// A logical name, in the words of the allocation API.
fn check_name(name: &str, action: &str) -> Result<(), ApiError> {
    if is_logical_name(name) {
        return Ok(());
    }
    Err(ApiError::bad_request(format!(
        "Cannot {action} allocation with invalid name '{name}'"
    )))
}

/// A node named in a request: its UUID; 400 when there is none (Ironic's NodeNotFound as a
/// BAD_REQUEST in request bodies and filters).
async fn node_uuid_of(state: &AppState, ident: &str) -> ApiResult<rivet_model::node::Node> {
    match state.conductor.store.get_node(ident).await {
        Err(StoreError::NotFound { .. }) => Err(ApiError::bad_request(format!(
            "Node {ident} could not be found."
        ))),
        r => Ok(r?),
    }
}

fn opt_string(doc: &Map<String, Value>, key: &str) -> Result<Option<String>, ApiError> {
    string_in(doc, key, Named::Field)
}

fn string_list(doc: &Map<String, Value>, key: &str) -> Result<Vec<String>, ApiError> {
    match doc.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(ApiError::bad_request(format!(
                    "{other} is not of type 'string' (in {key})"
                ))),
            })
            .collect(),
        Some(other) => Err(ApiError::bad_request(format!(
            "{other} is not of type 'array', 'null' (field {key})"
        ))),
    }
}

fn check_traits(traits: &[String]) -> Result<(), ApiError> {
    for t in traits {
        if let Some(e) = super::node_actions::traits::trait_error(&Value::from(t.clone())) {
            return Err(ApiError::bad_request(e));
        }
    }
    Ok(())
}

const CREATE_FIELDS: &[&str] = &[
    "candidate_nodes",
    "extra",
    "name",
    "node",
    "owner",
    "resource_class",
    "traits",
    "uuid",
];

/// Ironic answers a request below the version it needs with 404 for reads, 405 for writes.
fn too_old(version: (u32, u32), access: Access) -> ApiError {
    let since = Api::since(access);
    let (status, what) = match access {
        Access::Update => (
            StatusCode::METHOD_NOT_ALLOWED,
            "The API version does not allow updating allocations",
        ),
        Access::Create | Access::Delete => (
            StatusCode::METHOD_NOT_ALLOWED,
            "The API version does not allow allocations",
        ),
        Access::Read => (
            StatusCode::NOT_FOUND,
            "The API version does not allow allocations",
        ),
    };
    ApiError::new(
        status,
        format!(
            "{what} (this request asked for {}.{}; send X-OpenStack-Ironic-API-Version: {}.{} or later)",
            version.0, version.1, since.0, since.1
        ),
    )
}

/// The allocations collection.
pub(super) struct Api;

impl Resource for Api {
    type Record = Allocation;
    const PATH: &'static str = "allocations";
    const NAME: &'static str = "Allocation";
    const DETAIL_ROUTE: bool = false;
    const SINCE: (u32, u32) = mv::ALLOCATIONS;
    // A listing shows whole documents (see `detail`).
    const LIST_FIELDS: &'static [&'static str] = &[];
    const FILTERS: &'static [&'static str] = &["node", "resource_class", "state", "owner"];
    const DETAIL_PARAM: bool = false;
    const SORT_KEYS: &'static [&'static str] = ALLOCATION_SORT_KEYS;
    const PATCHABLE: &'static [&'static str] = &["name", "extra"];
    const UNSORTABLE: &'static [&'static str] = &["extra", "candidate_nodes", "traits"];

    /// `owner` is shown from 1.60.
    fn doc(a: &Allocation, base: &str, version: (u32, u32)) -> Map<String, Value> {
        let mut m = document(
            json!({
            "uuid": a.uuid,
            "name": a.name,
            "node_uuid": a.node_uuid,
            "state": a.state,
            "last_error": a.last_error,
            "resource_class": a.resource_class,
            "candidate_nodes": a.candidate_nodes,
            "traits": a.traits,
            "extra": a.extra,
            "owner": a.owner,
            }),
            base,
            "allocations",
            &a.uuid,
            a.created_at,
            a.updated_at,
        );
        if version < OWNER_SINCE {
            m.remove("owner");
        }
        m
    }

    fn blank() -> Allocation {
        Allocation {
            uuid: String::new(),
            name: None,
            node_uuid: None,
            state: alloc_state::ALLOCATING.into(),
            last_error: None,
            resource_class: None,
            candidate_nodes: Vec::new(),
            traits: Vec::new(),
            extra: Map::new(),
            owner: None,
            created_at: Utc::now(),
            updated_at: None,
            version: 0,
        }
    }

    async fn get(state: &AppState, ident: &str) -> Result<Allocation, StoreError> {
        state.conductor.store.get_allocation(ident).await
    }

    fn since(access: Access) -> (u32, u32) {
        match access {
            Access::Update => mv::ALLOCATION_UPDATE,
            _ => mv::ALLOCATIONS,
        }
    }

    fn too_old(version: (u32, u32), access: Access) -> ApiError {
        too_old(version, access)
    }

    /// Ironic's `get_rpc_allocation`: a UUID or a name, else InvalidUuidOrName (400).
    fn ident(ident: &str, _access: Access) -> ApiResult<String> {
        if is_logical_name(ident) || uuid::Uuid::parse_str(ident).is_ok() {
            return Ok(ident.to_string());
        }
        Err(ApiError::bad_request(format!(
            "Expected a logical name or UUID but received {ident}."
        )))
    }

    fn check_list(l: &Listing<'_>) -> ApiResult<()> {
        let params = l.params;
        let version = l.version;
        if params.contains_key("owner") && version < OWNER_SINCE {
            return Err(not_acceptable("the owner filter"));
        }
        Ok(())
    }

    /// `owner` is 406 below 1.60 with Ironic's words for allocations; the names are checked
    /// before the allocation is looked up.
    fn check_fields(fields: &str, version: (u32, u32)) -> ApiResult<()> {
        if version < OWNER_SINCE && fields.split(',').any(|x| x.trim() == "owner") {
            return Err(not_acceptable("the owner field"));
        }
        parse_fields(Some(fields), &Self::doc(&Self::blank(), "", version))?;
        Ok(())
    }

    /// Allocations have no short form: a listing shows whole documents.
    fn detail(_params: &HashMap<String, String>, _from_detail: bool) -> ApiResult<bool> {
        Ok(true)
    }

    /// A marker is an allocation by UUID or name.
    async fn marker(state: &AppState, marker: &str) -> ApiResult<String> {
        Ok(fetch::<Self>(state, marker, Access::Read).await?.uuid)
    }

    async fn list(state: &AppState, l: &Listing<'_>, page: Page) -> ApiResult<Vec<Allocation>> {
        let params = l.params;
        let node_uuid = match params.get("node") {
            Some(n) => Some(node_uuid_of(state, n).await?.uuid),
            None => None,
        };
        let q = paged!(
            AllocationQuery {
                node_uuid,
                resource_class: params.get("resource_class").cloned(),
                state: params.get("state").cloned(),
                owner: params.get("owner").cloned(),
            },
            page
        );
        page_of::<Self, _>(state.conductor.store.list_allocations(&q).await)
    }

    type Body = Value;

    async fn create(state: &AppState, body: Value, version: (u32, u32)) -> ApiResult<Allocation> {
        let body = object_body(body, "an allocation", CREATE_FIELDS)?;
        if body.contains_key("owner") && version < OWNER_SINCE {
            return Err(not_acceptable("the owner field"));
        }
        let name = opt_string(&body, "name")?;
        if let Some(n) = &name {
            check_name(n, "create")?;
        }
        let resource_class = at_most("resource_class", opt_string(&body, "resource_class")?, 80)?;
        let traits = string_list(&body, "traits")?;
        check_traits(&traits)?;
        let owner = at_most("owner", opt_string(&body, "owner")?, 255)?;
        let extra = object_in(&body, "extra", Named::Field)?;
        let node = match opt_string(&body, "node")? {
            Some(_) if version < BACKFILL_SINCE => {
                return Err(ApiError::bad_request(
                    "Cannot set node when creating an allocation in this API version",
                ))
            }
            Some(n) => Some(node_uuid_of(state, &n).await?),
            None => None,
        };
        let resource_class = match (resource_class, &node) {
            (Some(r), _) if !r.is_empty() => Some(r),
            (_, Some(n)) => n.resource_class.clone(),
            _ => {
                return Err(ApiError::bad_request(
                    "The resource_class field is mandatory when not backfilling",
                ))
            }
        };
        // Candidates by name or UUID, kept in the order given, stored as UUIDs.
        let mut candidate_nodes = Vec::new();
        for ident in string_list(&body, "candidate_nodes")? {
            candidate_nodes.push(node_uuid_of(state, &ident).await?.uuid);
        }
        let uuid = match opt_string(&body, "uuid")? {
            Some(u) => uuid::Uuid::parse_str(&u)
                .map_err(|_| ApiError::bad_request(format!("Expected a UUID but received {u}.")))?
                .to_string(),
            // Backfilling without a UUID: the instance's, as Ironic assumes.
            None => node
                .as_ref()
                .and_then(|n| n.instance_uuid.clone())
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
        };
        let a = Allocation {
            uuid,
            name,
            resource_class,
            candidate_nodes,
            traits,
            extra,
            owner,
            ..Self::blank()
        };
        let saved = match &node {
            Some(n) => state.conductor.backfill_allocation(a, n).await?,
            None => {
                let saved = state.conductor.store.create_allocation(&a).await?;
                state.conductor.allocate_soon(saved.uuid.clone());
                saved
            }
        };
        tracing::info!(allocation = %saved.uuid, "allocation created");
        Ok(saved)
    }

    async fn patched(state: &AppState, a: Allocation, p: Patched<'_>) -> ApiResult<Allocation> {
        let d = p.doc;
        let name = opt_string(&d, "name")?;
        if let Some(n) = &name {
            check_name(n, "update")?;
        }
        let extra = object_in(&d, "extra", Named::Field)?;
        Ok(state
            .conductor
            .store
            .update_allocation(&Allocation { name, extra, ..a })
            .await?)
    }

    async fn delete(state: &AppState, a: Allocation) -> ApiResult<()> {
        destroy(state, &a).await.map(|_| ())
    }
}

async fn destroy(state: &AppState, a: &Allocation) -> ApiResult<StatusCode> {
    match state.conductor.destroy_allocation(a).await? {
        Ok(()) => Ok(StatusCode::NO_CONTENT),
        // Ironic's InvalidState.
        Err(why) => Err(ApiError::new(StatusCode::CONFLICT, why)),
    }
}

/// The node's allocation, or Ironic's 404 for a node without one.
/// The allocation of a node. A missing node is a 404 on DELETE, but a 400 on GET: Ironic
/// lists the allocations filtered by the node there, and a filter naming no node is a bad
/// request.
async fn of_node(
    state: &AppState,
    ident: &str,
    version: (u32, u32),
    missing_node: StatusCode,
) -> ApiResult<Allocation> {
    resource::gate::<Api>(version, Access::Read)?;
    let node = match state.conductor.store.get_node(ident).await {
        Err(StoreError::NotFound { .. }) => {
            return Err(ApiError::new(
                missing_node,
                format!("Node {ident} could not be found."),
            ))
        }
        r => r?,
    };
    match state.conductor.store.allocation_of_node(&node.uuid).await? {
        Some(a) => Ok(a),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("Allocation for node {ident} was not found"),
        )),
    }
}

async fn node_show(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiVersion(version): ApiVersion,
    Path(ident): Path<String>,
    Query(p): Query<listing::ShowParams>,
) -> ApiResult<Json<Value>> {
    let a = of_node(&state, &ident, version, StatusCode::BAD_REQUEST).await?;
    let base = base_url(&headers);
    let fields = resource::fields_of::<Api>(p.fields.as_deref(), &base, version)?;
    let full = Api::doc(&a, &base, version);
    Ok(Json(match fields {
        Some(f) => super::render::sanitized(full, &f),
        None => Value::Object(full),
    }))
}

async fn node_remove(
    State(state): State<AppState>,
    ApiVersion(version): ApiVersion,
    Path(ident): Path<String>,
) -> ApiResult<StatusCode> {
    let a = of_node(&state, &ident, version, StatusCode::NOT_FOUND).await?;
    destroy(&state, &a).await
}

/// Ironic's rule for a node PATCH that removes `instance_uuid` from a node holding an
/// allocation: refused (409) unless the node is in maintenance or in enroll, inspecting,
/// inspect wait, manageable or available; otherwise the allocation goes with the instance.
pub(super) async fn follow_instance_removal(
    state: &AppState,
    old: &rivet_model::node::Node,
    new: &mut rivet_model::node::Node,
) -> ApiResult<()> {
    use rivet_protocol::states::ProvisionState as P;
    let Some(alloc) = old.allocation_uuid.clone() else {
        return Ok(());
    };
    if old.instance_uuid.is_none() || new.instance_uuid.is_some() {
        return Ok(());
    }
    let allowed = [
        P::Enroll,
        P::Inspecting,
        P::InspectWait,
        P::Manageable,
        P::Available,
    ];
    if !old.maintenance && !allowed.contains(&old.provision_state) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "Node {} with an allocation can not have instance_uuid removed unless it is in one of allowed (enroll, inspecting, inspect wait, manageable, available) states or in maintenance mode. Current state is '{}'.",
                old.uuid, old.provision_state
            ),
        ));
    }
    match state.conductor.store.delete_allocation(&alloc).await {
        Ok(()) | Err(StoreError::NotFound { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    tracing::info!(node = %old.uuid, allocation = %alloc, "instance_uuid removed; the node's allocation deleted");
    new.allocation_uuid = None;
    Ok(())
}
