//! `/v1/ports`: a node's NICs, found by MAC at lookup, with every port field of Ironic's
//! `port.py` and its microversion gate (internal_info 1.18 … available_for_dynamic_portgroup
//! 1.111), the listings under `/v1/nodes/{node}/ports` and `/v1/portgroups/{pg}/ports`
//! (1.24). What the port group API shares with it is in `super::port_common`.

use super::body::{
    boolean, check_logical_name, check_uuid, mac, object_body, opt_object, opt_string, uuid_in,
    Named,
};
use super::listing::{check_query_versions, list_param};
use super::patch::patched_fields;
use super::port_common::{connectivity_editable, ports_of, refuse_locked};
use super::portgroups;
use super::render::{document, select};
use super::resource::{
    self, found, page_of, paged, Access, Listing, OfNode, OfPortgroup, Page, Parent, Patched,
    Resource,
};
use super::version::{check_gated, hide_newer, not_acceptable, vstr};
use super::{ApiError, ApiResult, AppState};
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use chrono::Utc;
use rivet_model::microversions as mv;
use rivet_model::port::{Port, PortAttrs};
use rivet_protocol::api::PatchOp;
use rivet_store::{normalize_mac, PortQuery, StoreError, PORT_SORT_KEYS};
use serde_json::{json, Map, Value};

pub fn routes() -> Router<AppState> {
    resource::routes::<Api>()
        .route(
            "/v1/nodes/{ident}/ports/detail",
            get(resource::list::<Api, OfNode, true>),
        )
        .route(
            "/v1/portgroups/{ident}/ports",
            get(resource::list::<Api, OfPortgroup, false>).post(no_sub_write),
        )
        .route(
            "/v1/portgroups/{ident}/ports/detail",
            get(resource::list::<Api, OfPortgroup, true>),
        )
}

/// Port fields that appeared after 1.1, with the microversion that added each.
const PORT_FIELD_VERSIONS: &[(&str, (u32, u32))] = &[
    ("internal_info", (1, 18)),
    ("pxe_enabled", (1, 19)),
    ("local_link_connection", (1, 19)),
    ("portgroup_uuid", (1, 24)),
    ("physical_network", (1, 34)),
    ("is_smartnic", (1, 53)),
    ("name", (1, 88)),
    ("description", (1, 97)),
    ("vendor", (1, 100)),
    ("category", (1, 101)),
    ("available_for_dynamic_portgroup", (1, 111)),
];

/// Fields of a non-detailed port listing (Ironic's `_DEFAULT_RETURN_FIELDS`, and links).
const LIST_FIELDS: &[&str] = &["uuid", "address", "links"];

/// `local_link_connection.network_type` (`MINOR_64_LOCAL_LINK_CONNECTION_NETWORK_TYPE`).
const NETWORK_TYPE_VERSION: (u32, u32) = (1, 64);
/// The OVN VTEP keys are accepted from 1.90 (`MINOR_90_OVN_VTEP`) …
const OVN_VTEP_VERSION: (u32, u32) = (1, 90);
/// … until 1.105 removed them (`MINOR_105_REMOVE_OVN_VTEP`).
const OVN_VTEP_REMOVED: (u32, u32) = (1, 105);
const OVN_KEYS: &[&str] = &["vtep-logical-switch", "vtep-physical-switch"];
/// Creating a port with `node_ident` (`MINOR_94_PORT_NODENAME`).
const NODE_IDENT_VERSION: (u32, u32) = (1, 94);
/// Filtering by shard (`MINOR_82_NODE_SHARD`).
pub(super) const SHARD_VERSION: (u32, u32) = (1, 82);

/// Keys a port body may have (Ironic's `PORT_SCHEMA`).
const BODY_KEYS: &[&str] = &[
    "address",
    "extra",
    "is_smartnic",
    "local_link_connection",
    "node_ident",
    "node_uuid",
    "physical_network",
    "portgroup_uuid",
    "pxe_enabled",
    "uuid",
    "name",
    "description",
    "vendor",
    "category",
    "available_for_dynamic_portgroup",
];

/// What a PATCH may touch (Ironic's `PATCH_ALLOWED_FIELDS`).
const PATCHABLE: &[&str] = &[
    "address",
    "extra",
    "is_smartnic",
    "local_link_connection",
    "node_uuid",
    "physical_network",
    "portgroup_uuid",
    "pxe_enabled",
    "name",
    "description",
    "vendor",
    "category",
    "available_for_dynamic_portgroup",
];

/// `local_link_connection` checked as Ironic's `LOCAL_LINK_CONN_SCHEMA` (any of: switch_id and
/// port_id; port_id and hostname (Smart NIC); network_type unmanaged; port_id and both OVN
/// VTEP keys; empty), its switch_id normalized (a MAC or an OpenFlow datapath ID), and the keys
/// a microversion does not have refused with 406.
fn check_llc(
    llc: &Map<String, Value>,
    version: (u32, u32),
) -> Result<Map<String, Value>, ApiError> {
    const KEYS: &[&str] = &[
        "port_id",
        "switch_id",
        "hostname",
        "switch_info",
        "network_type",
        "vtep-logical-switch",
        "vtep-physical-switch",
    ];
    if let Some(bad) = llc.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(ApiError::bad_request(format!(
            "Invalid local_link_connection: additional properties are not allowed ('{bad}' \
             was unexpected); allowed: {}",
            KEYS.join(", ")
        )));
    }
    if llc.contains_key("network_type") && version < NETWORK_TYPE_VERSION {
        return Err(not_acceptable(
            "local_link_connection/network_type",
            NETWORK_TYPE_VERSION,
        ));
    }
    if OVN_KEYS.iter().any(|k| llc.contains_key(*k))
        && !(OVN_VTEP_VERSION..OVN_VTEP_REMOVED).contains(&version)
    {
        return Err(ApiError::new(
            StatusCode::NOT_ACCEPTABLE,
            format!(
                "Request not acceptable: local_link_connection/vtep-logical-switch and \
                 vtep-physical-switch are accepted from API version {} until {} (removed)",
                vstr(OVN_VTEP_VERSION),
                vstr(OVN_VTEP_REMOVED)
            ),
        ));
    }
    for (k, v) in llc {
        if !v.is_string() {
            return Err(ApiError::bad_request(format!(
                "Invalid local_link_connection: {v} is not of type 'string' ({k})"
            )));
        }
    }
    let has = |k: &str| llc.contains_key(k);
    if has("vtep-logical-switch") != has("vtep-physical-switch") {
        return Err(ApiError::bad_request(
            "Invalid local_link_connection: vtep-logical-switch and vtep-physical-switch \
             must be given together",
        ));
    }
    let nt = llc.get("network_type").and_then(Value::as_str);
    if let Some(t) = nt {
        if t != "managed" && t != "unmanaged" {
            return Err(ApiError::bad_request(format!(
                "Invalid local_link_connection: '{t}' is not one of ['managed', 'unmanaged'] \
                 (network_type)"
            )));
        }
    }
    let valid = llc.is_empty()
        || (has("port_id") && has("switch_id"))
        || (has("port_id") && has("hostname"))
        || nt == Some("unmanaged")
        || (has("port_id") && has("vtep-logical-switch"));
    if !valid {
        return Err(ApiError::bad_request(format!(
            "Invalid local_link_connection {}: give port_id and switch_id (or port_id and \
             hostname for a Smart NIC, or network_type \"unmanaged\")",
            Value::Object(llc.clone())
        )));
    }
    let mut out = llc.clone();
    if let Some(sw) = llc.get("switch_id").and_then(Value::as_str) {
        let norm = normalize_mac(sw)
            .or_else(|| datapath_id(sw))
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "Expected a MAC address or OpenFlow datapath ID but received {sw}."
                ))
            })?;
        out.insert("switch_id".into(), Value::from(norm));
    }
    Ok(out)
}

/// An OpenFlow datapath ID (16 hex digits, colons optional), lower-cased.
fn datapath_id(s: &str) -> Option<String> {
    let hex: String = s.chars().filter(|c| *c != ':').collect();
    (hex.len() == 16 && hex.chars().all(|c| c.is_ascii_hexdigit())).then(|| {
        if s.contains(':') {
            s.to_ascii_lowercase()
        } else {
            hex.to_ascii_lowercase()
        }
    })
}

/// The whole port document (before gating).
fn port_full(p: &Port, base: &str) -> Map<String, Value> {
    let a = &p.attrs;
    document(
        json!({
        "uuid": p.uuid,
        "address": p.address,
        "node_uuid": p.node_uuid,
        "portgroup_uuid": a.portgroup_uuid,
        "pxe_enabled": p.pxe_enabled,
        "extra": p.extra,
        "internal_info": a.internal_info,
        "local_link_connection": a.local_link_connection,
        "physical_network": a.physical_network,
        "is_smartnic": a.is_smartnic,
        "name": a.name,
        "description": a.description,
        "vendor": a.vendor,
        "category": a.category,
        "available_for_dynamic_portgroup": a.available_for_dynamic_portgroup,
        }),
        base,
        "ports",
        &p.uuid,
        p.created_at,
        p.updated_at,
    )
}

/// A port's document as a client at `version` sees it (Ironic's
/// `hide_fields_in_newer_versions`).
pub(super) fn port_doc(p: &Port, base: &str, version: (u32, u32)) -> Map<String, Value> {
    let mut doc = port_full(p, base);
    hide_newer(&mut doc, PORT_FIELD_VERSIONS, version);
    let ovn_shown = (OVN_VTEP_VERSION..OVN_VTEP_REMOVED).contains(&version);
    if let Some(Value::Object(llc)) = doc.get("local_link_connection") {
        if !ovn_shown && OVN_KEYS.iter().any(|k| llc.contains_key(*k)) {
            doc.insert("local_link_connection".into(), json!({}));
        }
    }
    doc
}

/// The node a body names (400 when there is none: a POST's reference, not its resource).
async fn node_ref(state: &AppState, ident: &str) -> ApiResult<rivet_model::node::Node> {
    match state.conductor.store.get_node(ident).await {
        Err(StoreError::NotFound { .. }) => Err(ApiError::bad_request(format!(
            "Node {ident} could not be found."
        ))),
        r => Ok(r?),
    }
}

/// The port group a port body names (400 when there is none), which must be of `node`.
async fn portgroup_ref(
    state: &AppState,
    ident: &str,
    node: &str,
) -> ApiResult<rivet_model::port::Portgroup> {
    let pg = match state.conductor.store.get_portgroup(ident).await {
        Err(StoreError::NotFound { .. }) => {
            return Err(ApiError::bad_request(format!(
                "Portgroup {ident} could not be found."
            )))
        }
        r => r?,
    };
    if pg.node_uuid != node {
        return Err(ApiError::bad_request(
            "Port can not be added to a portgroup belonging to a different node.",
        ));
    }
    Ok(pg)
}

/// The port fields of a body or patched document, checked as Ironic checks them.
fn attrs_of(
    doc: &Map<String, Value>,
    version: (u32, u32),
    internal_info: Map<String, Value>,
) -> Result<(bool, Map<String, Value>, PortAttrs), ApiError> {
    let pxe = match doc.get("pxe_enabled") {
        None | Some(Value::Null) => true,
        Some(v) => boolean("pxe_enabled", v)?,
    };
    let extra = opt_object(doc, "extra")?;
    let llc = check_llc(&opt_object(doc, "local_link_connection")?, version)?;
    let is_smartnic = match doc.get("is_smartnic") {
        None | Some(Value::Null) => false,
        Some(v) => boolean("is_smartnic", v)?,
    };
    if is_smartnic && !(llc.contains_key("port_id") && llc.contains_key("hostname")) {
        return Err(ApiError::bad_request(
            "Smart NIC port must have port_id and hostname in local_link_connection",
        ));
    }
    let physical_network = opt_string(doc, "physical_network", Some(64))?;
    if physical_network.as_deref() == Some("") {
        return Err(ApiError::bad_request(
            "A non-empty value is required when setting physical_network",
        ));
    }
    let available = match doc.get("available_for_dynamic_portgroup") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "{other} is not of type 'boolean' (available_for_dynamic_portgroup)"
            )))
        }
    };
    let name = opt_string(doc, "name", Some(255))?;
    if let Some(n) = &name {
        check_logical_name("port", n)?;
    }
    let portgroup_uuid = opt_string(doc, "portgroup_uuid", None)?;
    Ok((
        pxe,
        extra,
        PortAttrs {
            name,
            portgroup_uuid,
            physical_network,
            internal_info,
            local_link_connection: llc,
            is_smartnic,
            description: opt_string(doc, "description", Some(255))?,
            vendor: opt_string(doc, "vendor", Some(32))?,
            category: opt_string(doc, "category", Some(80))?,
            available_for_dynamic_portgroup: available,
        },
    ))
}

/// 409 when a PXE-enabled port joins a group that does not support standalone ports.
fn check_standalone(pg: &rivet_model::port::Portgroup, pxe: bool) -> Result<(), ApiError> {
    if pxe && !pg.standalone_ports_supported {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "Port group {} doesn't support standalone ports. This port cannot be a \
                 member of that portgroup as the port's 'pxe_enabled' field is True.",
                pg.uuid
            ),
        ));
    }
    Ok(())
}

/// Ironic's `validate_port_physnet`: a port in a group has the physical network of the
/// group's other ports (or, with none, the group's own).
async fn check_physnet(
    state: &AppState,
    port_uuid: &str,
    pg: &rivet_model::port::Portgroup,
    physnet: &Option<String>,
) -> Result<(), ApiError> {
    let others = ports_of(state, None, Some(&pg.uuid)).await?;
    let theirs = others
        .iter()
        .find(|p| p.uuid != port_uuid)
        .map(|p| p.attrs.physical_network.clone())
        .or_else(|| pg.physical_network.clone().map(Some));
    match theirs {
        Some(net) if &net != physnet => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "Port with physical network {} cannot become a member of port group {} which \
                 has ports in physical network {}.",
                physnet.as_deref().unwrap_or("None"),
                pg.uuid,
                net.as_deref().unwrap_or("None")
            ),
        )),
        _ => Ok(()),
    }
}

/// Where Ironic keeps a port's or group's VIFs (`NetType` keys).
pub(super) const VIF_KEYS: &[&str] = &[
    "tenant_vif_port_id",
    "cleaning_vif_port_id",
    "provisioning_vif_port_id",
    "rescuing_vif_port_id",
    "servicing_vif_port_id",
    "inspection_vif_port_id",
];

/// The port collection.
pub(super) struct Api;

impl Resource for Api {
    type Record = Port;
    const PATH: &'static str = "ports";
    const NAME: &'static str = "Port";
    const FIELD_VERSIONS: &'static [(&'static str, (u32, u32))] = PORT_FIELD_VERSIONS;
    const LIST_FIELDS: &'static [&'static str] = LIST_FIELDS;
    const FILTERS: &'static [&'static str] = &[
        "node",
        "node_uuid",
        "address",
        "portgroup",
        "shard",
        "conductor_groups",
        "description_contains",
    ];
    const SORT_KEYS: &'static [&'static str] = PORT_SORT_KEYS;
    const PATCHABLE: &'static [&'static str] = PATCHABLE;
    const UNSORTABLE: &'static [&'static str] =
        &["extra", "internal_info", "local_link_connection"];

    fn doc(p: &Port, base: &str, version: (u32, u32)) -> Map<String, Value> {
        port_doc(p, base, version)
    }

    fn blank() -> Port {
        Port {
            uuid: String::new(),
            node_uuid: String::new(),
            address: String::new(),
            pxe_enabled: false,
            extra: Map::new(),
            created_at: Utc::now(),
            updated_at: None,
            version: 0,
            attrs: PortAttrs::default(),
        }
    }

    async fn get(state: &AppState, ident: &str) -> Result<Port, StoreError> {
        state.conductor.store.get_port(ident).await
    }

    /// A port is shown and patched by UUID or name (a MAC address is a 400, as Ironic's
    /// `args.uuid_or_name`), deleted by UUID only.
    fn ident(ident: &str, access: Access) -> ApiResult<String> {
        match access {
            Access::Delete => check_uuid("port_uuid", ident),
            _ => super::body::check_uuid_or_name("port_ident", ident),
        }
    }

    fn check_list(l: &Listing<'_>) -> ApiResult<()> {
        let params = l.params;
        let version = l.version;
        let path = l.path;
        if let Some(Parent::Portgroup(_)) = l.parent {
            resource::gate::<portgroups::Api>(version, Access::Read)?;
            // Port group sub-resources are 1.24 (Ironic answers 404 below).
            if version < mv::PORTGROUP_SUBRESOURCES {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!(
                        "the resource {path} could not be found (it needs API version {} or \
                         later)",
                        vstr(mv::PORTGROUP_SUBRESOURCES)
                    ),
                ));
            }
        }
        check_query_versions(params, version)?;
        if params.contains_key("portgroup") && version < mv::PORTGROUP_SUBRESOURCES {
            return Err(not_acceptable(
                "portgroup filter",
                mv::PORTGROUP_SUBRESOURCES,
            ));
        }
        if params.contains_key("shard") && version < SHARD_VERSION {
            return Err(not_acceptable("shard filter", SHARD_VERSION));
        }
        Ok(())
    }

    /// `fields` is 1.8 (406 below), as Ironic.
    fn check_fields(fields: &str, version: (u32, u32)) -> ApiResult<()> {
        if version < (1, 8) {
            return Err(not_acceptable("fields", (1, 8)));
        }
        check_gated(
            PORT_FIELD_VERSIONS,
            fields.split(',').map(str::trim),
            version,
        )
    }

    async fn list(state: &AppState, l: &Listing<'_>, page: Page) -> ApiResult<Vec<Port>> {
        let params = l.params;
        let node_ident = l.node("node").or(params.get("node_uuid"));
        let pg_ident = match l.parent {
            Some(Parent::Portgroup(g)) => Some(g),
            _ => params.get("portgroup"),
        };
        if let Some(u) = params.get("node_uuid") {
            check_uuid("node_uuid", u)?;
        }
        let shards = list_param(params, "shard");
        let conductor_groups = list_param(params, "conductor_groups");
        let exclusive = [node_ident.is_some(), pg_ident.is_some(), !shards.is_empty()];
        if exclusive.iter().filter(|b| **b).count() > 1 {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "Operation not permitted: filter ports by only one of node, portgroup and shard.",
            ));
        }
        let address = params.get("address").map(|a| mac(a)).transpose()?;
        if !conductor_groups.is_empty()
            && (node_ident.is_some() || pg_ident.is_some() || address.is_some())
        {
            return Err(ApiError::bad_request(
                "Filtering by conductor_groups cannot be combined with node_ident, \
                 portgroup_ident, or node address filters.",
            ));
        }
        let node_uuid = match node_ident {
            Some(n) => Some(portgroups::node_of(state, n).await?.uuid),
            None => None,
        };
        let portgroup_uuid = match pg_ident {
            Some(g) => Some(portgroups::fetch(state, g).await?.uuid),
            None => None,
        };
        let q = paged!(
            PortQuery {
                node_uuid,
                address,
                portgroup_uuid,
                shards,
                conductor_groups,
                description_contains: params.get("description_contains").cloned(),
            },
            page
        );
        page_of::<Self, _>(state.conductor.store.list_ports(&q).await)
    }

    type Body = Value;

    async fn create(state: &AppState, body: Value, version: (u32, u32)) -> ApiResult<Port> {
        let mut doc = object_body(body, "a port", BODY_KEYS)?;
        let address = match doc.get("address") {
            Some(Value::String(a)) => mac(a)?,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "{other} is not of type 'string' (address)"
                )))
            }
            None => return Err(ApiError::bad_request("'address' is a required property")),
        };
        let node_ident = match (doc.remove("node_uuid"), doc.remove("node_ident")) {
            (Some(_), Some(_)) | (None, None) => {
                return Err(ApiError::bad_request(
                    "Give exactly one of node_uuid and node_ident (is valid under each of \
                     {'required': ['node_ident']}, {'required': ['node_uuid']})",
                ))
            }
            // Rivet has always taken a name here too (Ironic wants a UUID, or node_ident).
            (Some(Value::String(u)), None) => u,
            (None, Some(Value::String(n))) => {
                if version < NODE_IDENT_VERSION {
                    return Err(not_acceptable("node_ident", NODE_IDENT_VERSION));
                }
                n
            }
            (Some(other), None) | (None, Some(other)) => {
                return Err(ApiError::bad_request(format!(
                    "{other} is not of type 'string' (node)"
                )))
            }
        };
        check_gated(PORT_FIELD_VERSIONS, doc.keys().map(String::as_str), version)?;
        let uuid = uuid_in(&doc, Named::Key)?;
        let node = node_ref(state, &node_ident).await?;
        refuse_locked(&node)?;
        let (pxe, extra, mut attrs) = attrs_of(&doc, version, Map::new())?;
        if let Some(pg_ident) = attrs.portgroup_uuid.clone() {
            let pg = portgroup_ref(state, &pg_ident, &node.uuid).await?;
            check_standalone(&pg, pxe)?;
            check_physnet(state, &uuid, &pg, &attrs.physical_network).await?;
            attrs.portgroup_uuid = Some(pg.uuid);
        }
        let port = Port {
            uuid,
            node_uuid: node.uuid,
            address,
            pxe_enabled: pxe,
            extra,
            created_at: Utc::now(),
            updated_at: None,
            version: 0,
            attrs,
        };
        Ok(state.conductor.store.create_port(&port).await?)
    }

    fn check_patch(ops: &[PatchOp], version: (u32, u32)) -> ApiResult<()> {
        let touched = patched_fields(ops);
        check_gated(
            PORT_FIELD_VERSIONS,
            touched.iter().map(String::as_str),
            version,
        )?;
        if ops
            .iter()
            .any(|o| o.path.starts_with("/local_link_connection/network_type"))
            && version < NETWORK_TYPE_VERSION
        {
            return Err(not_acceptable(
                "local_link_connection/network_type",
                NETWORK_TYPE_VERSION,
            ));
        }
        Ok(())
    }

    /// The whole port: a client that does not see some fields keeps them.
    fn patch_doc(port: &Port, _version: (u32, u32)) -> ApiResult<Value> {
        Ok(select(port_full(port, ""), PATCHABLE))
    }

    async fn patched(state: &AppState, port: Port, p: Patched<'_>) -> ApiResult<Port> {
        let doc = p.doc;
        let ops = p.ops;
        let version = p.version;
        let a = &port.attrs;
        let touched = patched_fields(ops);
        let address = match doc.get("address") {
            Some(Value::String(a)) => mac(a)?,
            _ => return Err(ApiError::bad_request("'address' is a required property")),
        };
        let node_ident = match doc.get("node_uuid") {
            Some(Value::String(n)) => n.clone(),
            _ => return Err(ApiError::bad_request("'node_uuid' is a required property")),
        };
        let node = node_ref(state, &node_ident).await?;
        refuse_locked(&node)?;
        if node.provision_state == rivet_protocol::states::ProvisionState::Inspecting {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "Cannot update port \"{}\" on \"{}\" while it is in state \"inspecting\".",
                    port.uuid, node.uuid
                ),
            ));
        }
        let (pxe, extra, mut attrs) = attrs_of(&doc, version, a.internal_info.clone())?;
        let mut group = None;
        if let Some(pg_ident) = attrs.portgroup_uuid.clone() {
            let pg = portgroup_ref(state, &pg_ident, &node.uuid).await?;
            check_standalone(&pg, pxe)?;
            attrs.portgroup_uuid = Some(pg.uuid.clone());
            group = Some(pg);
        }
        if version >= super::portgroups::PHYSNET_VERSION
            && touched.iter().any(|f| f == "physical_network")
            && attrs.portgroup_uuid.is_some()
        {
            return Err(ApiError::bad_request(
                "physical_network cannot be changed while the port belongs to a portgroup.",
            ));
        }
        // Ironic's conductor (update_port): no new MAC for a node in use, connectivity only
        // while the node is not deployed, and a group member on its group's network.
        let in_use = node.provision_state == rivet_protocol::states::ProvisionState::Active
            || node.instance_uuid.is_some();
        if address != port.address && in_use && !node.maintenance {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "Cannot update hardware address for port {} as node {} is active or has \
                     instance UUID assigned; set maintenance first",
                    port.uuid, node.uuid
                ),
            ));
        }
        let connectivity = attrs.portgroup_uuid != a.portgroup_uuid
            || pxe != port.pxe_enabled
            || attrs.local_link_connection != a.local_link_connection
            || attrs.physical_network != a.physical_network;
        if connectivity && !connectivity_editable(&node) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "Port {} can not have any connectivity attributes (portgroup_id, \
                     pxe_enabled, local_link_connection, physical_network) updated unless node \
                     {} is in a enroll, inspecting, inspect wait, manageable state or in \
                     maintenance mode. The current state is {}.",
                    port.uuid, node.uuid, node.provision_state
                ),
            ));
        }
        if let Some(pg) = &group {
            if attrs.portgroup_uuid != a.portgroup_uuid
                || attrs.physical_network != a.physical_network
            {
                check_physnet(state, &port.uuid, pg, &attrs.physical_network).await?;
            }
        }
        let new = Port {
            address,
            node_uuid: node.uuid,
            pxe_enabled: pxe,
            extra,
            attrs,
            ..port
        };
        Ok(state.conductor.store.update_port(&new).await?)
    }

    async fn delete(state: &AppState, port: Port) -> ApiResult<()> {
        let node = state.conductor.store.get_node(&port.node_uuid).await?;
        refuse_locked(&node)?;
        let vif = VIF_KEYS
            .iter()
            .find_map(|k| port.attrs.internal_info.get(*k).and_then(Value::as_str));
        if let (Some(vif), false) = (vif, node.maintenance) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "Cannot delete the port {} as it is bound to VIF {vif} for use; detach \
                     it (or set maintenance) first.",
                    port.uuid
                ),
            ));
        }
        found::<Self, _>(
            &port.uuid,
            state.conductor.store.delete_port(&port.uuid).await,
        )
    }
}

/// Ports are created through `/v1/ports` only (Ironic's MalformedRequestURI: 400).
pub(super) async fn no_sub_write() -> ApiError {
    ApiError::bad_request("Malformed request URI: create ports with POST /v1/ports")
}
