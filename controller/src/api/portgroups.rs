//! `/v1/portgroups` (API 1.23): bonds of a node's ports, as Ironic's `portgroup.py`: CRUD by
//! UUID or name, `mode` and `properties` (1.26), `physical_network` (1.102, passed on to the
//! member ports), `category` (1.103), `dynamic_portgroup` (1.111, read-only), the shard and
//! conductor group filters, `/v1/nodes/{node}/portgroups` (1.24); deleting a group that still
//! holds ports is refused (400, Ironic's PortgroupNotEmpty).

use super::body::{
    boolean, check_logical_name, check_uuid, mac, object_body, opt_object, opt_string, uuid_in,
    Named,
};
use super::listing::{check_query_versions, list_param};
use super::port_common::{connectivity_editable, ports_of, refuse_locked};
use super::render::{document, links, select};
use super::resource::{
    self, found, page_of, paged, Access, Listing, OfNode, Page, Patched, Resource,
};
use super::version::{check_gated, hide_newer, not_acceptable, vstr};
use super::{ApiError, ApiResult, AppState};
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use chrono::Utc;
use rivet_model::microversions as mv;
use rivet_model::node::Node;
use rivet_model::port::Portgroup;
use rivet_store::{PortgroupQuery, StoreError, PORTGROUP_SORT_KEYS};
use serde_json::{json, Map, Value};

pub fn routes() -> Router<AppState> {
    resource::routes::<Api>()
        .route(
            "/v1/nodes/{ident}/portgroups",
            get(resource::list::<Api, OfNode, false>).post(no_sub_write),
        )
        .route(
            "/v1/nodes/{ident}/portgroups/detail",
            get(resource::list::<Api, OfNode, true>),
        )
}

/// `physical_network` of a port group (`MINOR_102_PORTGROUP_PHYSICAL_NETWORK`).
pub(super) const PHYSNET_VERSION: (u32, u32) = (1, 102);
/// Port group shard filter (`MINOR_106_PORTGROUP_SHARD`).
const PG_SHARD_VERSION: (u32, u32) = (1, 106);

/// Fields that appeared after 1.23, with their microversion.
const FIELD_VERSIONS: &[(&str, (u32, u32))] = &[
    ("mode", (1, 26)),
    ("properties", (1, 26)),
    ("physical_network", PHYSNET_VERSION),
    ("category", (1, 103)),
    ("dynamic_portgroup", (1, 111)),
];

/// Fields of a non-detailed listing (Ironic's `_DEFAULT_RETURN_FIELDS`, and links).
const LIST_FIELDS: &[&str] = &["uuid", "address", "name", "links"];

/// Ironic's `[DEFAULT] default_portgroup_mode`.
const DEFAULT_MODE: &str = "active-backup";

const BODY_KEYS: &[&str] = &[
    "address",
    "category",
    "extra",
    "mode",
    "name",
    "node_uuid",
    "physical_network",
    "properties",
    "standalone_ports_supported",
    "uuid",
];

const PATCHABLE: &[&str] = &[
    "address",
    "extra",
    "mode",
    "name",
    "node_uuid",
    "properties",
    "standalone_ports_supported",
    "physical_network",
    "category",
];

/// A node named in a path or query (404 when there is none).
pub(super) async fn node_of(state: &AppState, ident: &str) -> ApiResult<Node> {
    match state.conductor.store.get_node(ident).await {
        Err(StoreError::NotFound { .. }) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("Node {ident} could not be found."),
        )),
        r => Ok(r?),
    }
}

/// The port group collection.
pub(super) struct Api;

/// A port group by UUID or name, its NotFound in Ironic's words.
pub(super) async fn fetch(state: &AppState, ident: &str) -> ApiResult<Portgroup> {
    resource::fetch::<Api>(state, ident, Access::Read).await
}

fn full(g: &Portgroup, base: &str) -> Map<String, Value> {
    let ports = format!("{}/ports", g.uuid);
    document(
        json!({
        "uuid": g.uuid,
        "name": g.name,
        "node_uuid": g.node_uuid,
        "address": g.address,
        "extra": g.extra,
        "internal_info": g.internal_info,
        "mode": g.mode,
        "properties": g.properties,
        "standalone_ports_supported": g.standalone_ports_supported,
        "physical_network": g.physical_network,
        "category": g.category,
        "dynamic_portgroup": g.dynamic_portgroup,
        "ports": links(base, "portgroups", &ports),
        }),
        base,
        "portgroups",
        &g.uuid,
        g.created_at,
        g.updated_at,
    )
}

/// The checked fields of a body or patched document.
struct Fields {
    name: Option<String>,
    address: Option<String>,
    extra: Map<String, Value>,
    mode: Option<String>,
    properties: Map<String, Value>,
    standalone: bool,
    physical_network: Option<String>,
    category: Option<String>,
}

fn fields_of(doc: &Map<String, Value>) -> Result<Fields, ApiError> {
    let name = opt_string(doc, "name", Some(255))?;
    if let Some(n) = &name {
        check_logical_name("portgroup", n)?;
    }
    let address = opt_string(doc, "address", None)?
        .map(|a| mac(&a))
        .transpose()?;
    let standalone = match doc.get("standalone_ports_supported") {
        None | Some(Value::Null) => true,
        Some(v) => boolean("standalone_ports_supported", v)?,
    };
    let physical_network = opt_string(doc, "physical_network", Some(64))?;
    Ok(Fields {
        name,
        address,
        extra: opt_object(doc, "extra")?,
        mode: opt_string(doc, "mode", None)?,
        properties: opt_object(doc, "properties")?,
        standalone,
        physical_network,
        category: opt_string(doc, "category", Some(80))?,
    })
}

impl Resource for Api {
    type Record = Portgroup;
    const PATH: &'static str = "portgroups";
    const NAME: &'static str = "Portgroup";
    const SINCE: (u32, u32) = mv::PORTGROUPS;
    const FIELD_VERSIONS: &'static [(&'static str, (u32, u32))] = FIELD_VERSIONS;
    const LIST_FIELDS: &'static [&'static str] = LIST_FIELDS;
    const FILTERS: &'static [&'static str] = &["node", "address", "shard", "conductor_groups"];
    const SORT_KEYS: &'static [&'static str] = PORTGROUP_SORT_KEYS;
    const PATCHABLE: &'static [&'static str] = PATCHABLE;
    const UNSORTABLE: &'static [&'static str] = &["extra", "internal_info", "properties"];

    fn doc(g: &Portgroup, base: &str, version: (u32, u32)) -> Map<String, Value> {
        let mut doc = full(g, base);
        hide_newer(&mut doc, FIELD_VERSIONS, version);
        doc
    }

    fn blank() -> Portgroup {
        Portgroup {
            uuid: String::new(),
            name: None,
            node_uuid: String::new(),
            address: None,
            extra: Map::new(),
            internal_info: Map::new(),
            mode: None,
            properties: Map::new(),
            standalone_ports_supported: true,
            physical_network: None,
            category: None,
            dynamic_portgroup: false,
            created_at: Utc::now(),
            updated_at: None,
            version: 0,
        }
    }

    async fn get(state: &AppState, ident: &str) -> Result<Portgroup, StoreError> {
        state.conductor.store.get_portgroup(ident).await
    }

    /// A UUID or a name (Ironic 39's path schema for port groups): a MAC address or anything
    /// else is a 400.
    fn ident(ident: &str, _access: Access) -> ApiResult<String> {
        super::body::check_uuid_or_name("portgroup", ident)
    }

    /// Below 1.23 there are no port groups (Ironic: 404).
    fn too_old(_version: (u32, u32), _access: Access) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "The resource could not be found: port groups need API version {} or later",
                vstr(mv::PORTGROUPS)
            ),
        )
    }

    fn check_list(l: &Listing<'_>) -> ApiResult<()> {
        let params = l.params;
        let version = l.version;
        // `/v1/nodes/{node}/portgroups` is 1.24 (Ironic: 404 below).
        if l.parent.is_some() && version < mv::PORTGROUP_SUBRESOURCES {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "The resource could not be found: a node's port groups need API version {} \
                     or later",
                    vstr(mv::PORTGROUP_SUBRESOURCES)
                ),
            ));
        }
        check_query_versions(params, version)?;
        if params.contains_key("shard") && version < PG_SHARD_VERSION {
            return Err(not_acceptable("shard filter", PG_SHARD_VERSION));
        }
        Ok(())
    }

    async fn list(state: &AppState, l: &Listing<'_>, page: Page) -> ApiResult<Vec<Portgroup>> {
        let params = l.params;
        let node_ident = l.node("node");
        let address = params.get("address").map(|a| mac(a)).transpose()?;
        let shards = list_param(params, "shard");
        let conductor_groups = list_param(params, "conductor_groups");
        let n = [
            node_ident.is_some(),
            address.is_some(),
            !shards.is_empty(),
            !conductor_groups.is_empty(),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if n > 1 {
            return Err(ApiError::bad_request(
                "Filtering by node, address, or shard simultaneously is not supported.",
            ));
        }
        let node_uuid = match node_ident {
            Some(n) => Some(node_of(state, n).await?.uuid),
            None => None,
        };
        let q = paged!(
            PortgroupQuery {
                node_uuid,
                address,
                shards,
                conductor_groups,
            },
            page
        );
        page_of::<Self, _>(state.conductor.store.list_portgroups(&q).await)
    }

    type Body = Value;

    async fn create(state: &AppState, body: Value, version: (u32, u32)) -> ApiResult<Portgroup> {
        let doc = object_body(body, "a portgroup", BODY_KEYS)?;
        check_gated(FIELD_VERSIONS, doc.keys().map(String::as_str), version)?;
        let node_uuid = match doc.get("node_uuid") {
            Some(Value::String(u)) => check_uuid("node_uuid", u)?,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "{other} is not of type 'string' (node_uuid)"
                )))
            }
            None => return Err(ApiError::bad_request("'node_uuid' is a required property")),
        };
        let uuid = uuid_in(&doc, Named::Key)?;
        let f = fields_of(&doc)?;
        let node = match state.conductor.store.get_node(&node_uuid).await {
            Err(StoreError::NotFound { .. }) => {
                return Err(ApiError::bad_request(format!(
                    "Node {node_uuid} could not be found."
                )))
            }
            r => r?,
        };
        refuse_locked(&node)?;
        let g = Portgroup {
            uuid,
            name: f.name,
            node_uuid: node.uuid,
            address: f.address,
            extra: f.extra,
            internal_info: Map::new(),
            mode: Some(f.mode.unwrap_or_else(|| DEFAULT_MODE.into())),
            properties: f.properties,
            standalone_ports_supported: f.standalone,
            physical_network: f.physical_network,
            category: f.category,
            dynamic_portgroup: false,
            created_at: Utc::now(),
            updated_at: None,
            version: 0,
        };
        Ok(state.conductor.store.create_portgroup(&g).await?)
    }

    /// The whole group: a client that does not see some fields keeps them.
    fn patch_doc(g: &Portgroup, _version: (u32, u32)) -> ApiResult<Value> {
        Ok(select(full(g, ""), PATCHABLE))
    }

    async fn patched(state: &AppState, g: Portgroup, p: Patched<'_>) -> ApiResult<Portgroup> {
        let doc = p.doc;
        if !doc.contains_key("mode") || doc.get("mode") == Some(&Value::Null) {
            return Err(ApiError::bad_request(
                "'mode' is a mandatory attribute and can not be removed",
            ));
        }
        let f = fields_of(&doc)?;
        let node_ident = match doc.get("node_uuid") {
            Some(Value::String(n)) => check_uuid("node_uuid", n)?,
            _ => return Err(ApiError::bad_request("'node_uuid' is a required property")),
        };
        let node = match state.conductor.store.get_node(&node_ident).await {
            Err(StoreError::NotFound { .. }) => {
                return Err(ApiError::bad_request(format!(
                    "Node {node_ident} could not be found."
                )))
            }
            r => r?,
        };
        let current = state.conductor.store.get_node(&g.node_uuid).await?;
        refuse_locked(&current)?;
        refuse_locked(&node)?;
        if node.provision_state == rivet_protocol::states::ProvisionState::Inspecting {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "Cannot update portgroup \"{}\" on node \"{}\" while it is in state \
                     \"inspecting\".",
                    g.uuid, node.uuid
                ),
            ));
        }
        let members = ports_of(state, None, Some(&g.uuid)).await?;
        // Ironic's conductor (update_portgroup): a group changes node only while its node is
        // not deployed, and only when empty.
        if node.uuid != g.node_uuid {
            if !connectivity_editable(&current) {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    format!(
                        "Portgroup {} can not be associated to node {} unless the node is in a \
                         enroll, inspecting, inspect wait, manageable state or in maintenance \
                         mode. Current state is '{}'.",
                        g.uuid, current.uuid, current.provision_state
                    ),
                ));
            }
            if !members.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "Portgroup {} can not be associated with node {} because there are ports \
                     associated with this portgroup.",
                    g.uuid, node.uuid
                )));
            }
        }
        let physnet_changed = f.physical_network != g.physical_network;
        let new = Portgroup {
            name: f.name,
            node_uuid: node.uuid,
            address: f.address,
            extra: f.extra,
            mode: f.mode,
            properties: f.properties,
            standalone_ports_supported: f.standalone,
            physical_network: f.physical_network,
            category: f.category,
            ..g
        };
        let saved = state.conductor.store.update_portgroup(&new).await?;
        // Ironic's update_portgroup_physical_network: the members follow the group.
        if physnet_changed {
            for mut p in members {
                p.attrs.physical_network = saved.physical_network.clone();
                state.conductor.store.update_port(&p).await?;
            }
        }
        Ok(saved)
    }

    async fn delete(state: &AppState, g: Portgroup) -> ApiResult<()> {
        refuse_locked(&state.conductor.store.get_node(&g.node_uuid).await?)?;
        match found::<Self, _>(
            &g.uuid,
            state.conductor.store.delete_portgroup(&g.uuid).await,
        )? {
            true => Ok(()),
            false => Err(ApiError::bad_request(format!(
                "Cannot complete the requested action because portgroup {} contains ports.",
                g.uuid
            ))),
        }
    }
}

/// Port groups are created through `/v1/portgroups` only (Ironic's MalformedRequestURI).
async fn no_sub_write() -> ApiError {
    ApiError::bad_request("Malformed request URI: create port groups with POST /v1/portgroups")
}
