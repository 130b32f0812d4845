//! VIFs (API 1.28): `GET|POST /v1/nodes/{node}/vifs`, `DELETE /v1/nodes/{node}/vifs/{vif}`.
//!
//! Rivet has no Neutron, so attaching is the bookkeeping of Ironic's `VIFPortIDMixin` (what
//! its `flat` interface records; Ironic's own `noop` interface keeps nothing): the VIF ID goes
//! into `internal_info.tenant_vif_port_id` of a free port group or port, chosen as
//! `get_free_port_like_object` chooses (the one named by `port_uuid`/`portgroup_uuid`, 1.67;
//! else a group with free ports before a port, a PXE-enabled port before another). Detaching
//! clears it (and `extra.vif_port_id`) and removes a dynamic port group (1.111). A node with
//! no ports and no port groups has nothing to bind a VIF to: attaching and detaching are
//! accepted and record nothing, as Ironic's `noop` interface does.

use super::refuse_locked;
use crate::api::port_common::ports_of;
use crate::api::{ApiError, ApiResult, ApiVersion, AppState};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use rivet_model::node::Node;
use rivet_model::port::{Port, Portgroup};
use rivet_store::NodeExt;
use rivet_store::{PortgroupQuery, StoreError};
use serde_json::{json, Value};

/// `port_uuid`/`portgroup_uuid` in the attach body (`MINOR_67_NODE_VIF_ATTACH_PORT`).
const VIF_PORT_VERSION: (u32, u32) = (1, 67);
/// Where the tenant VIF is kept (Ironic's `NetType.TENANT.vif_key`).
const VIF_KEY: &str = "tenant_vif_port_id";

/// The node, its ports and its port groups.
async fn load(state: &AppState, ident: &str) -> ApiResult<(Node, Vec<Port>, Vec<Portgroup>)> {
    let node = state.conductor.store.get_node(ident).await?;
    let ports = ports_of(state, Some(&node.uuid), None).await?;
    let groups = state
        .conductor
        .store
        .list_portgroups(&PortgroupQuery {
            node_uuid: Some(node.uuid.clone()),
            ..Default::default()
        })
        .await?;
    Ok((node, ports, groups))
}

fn vif_of(internal_info: &serde_json::Map<String, Value>) -> Option<&str> {
    internal_info.get(VIF_KEY).and_then(Value::as_str)
}

pub(super) async fn vif_list(
    State(state): State<AppState>,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
    let (_, ports, groups) = load(&state, &ident).await?;
    let vifs: Vec<Value> = ports
        .iter()
        .filter_map(|p| vif_of(&p.attrs.internal_info))
        .chain(groups.iter().filter_map(|g| vif_of(&g.internal_info)))
        .map(|id| json!({ "id": id }))
        .collect();
    Ok(Json(json!({ "vifs": vifs })))
}

/// What a VIF is attached to.
enum Target {
    Port(Port),
    Group(Portgroup),
}

/// A VIF ID as Ironic's `args.uuid_or_name` takes it.
fn check_vif_id(id: &str) -> Result<(), ApiError> {
    let ok = uuid::Uuid::parse_str(id).is_ok()
        || (!id.is_empty()
            && id.len() <= 255
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-._~".contains(c)));
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "Expected UUID or name for id: {id}"
        )))
    }
}

/// Ironic's `_get_free_portgroups_and_ports` and `get_free_port_like_object` without
/// physical networks (no Neutron: every port's network is allowed).
fn choose(
    vif: &str,
    ports: Vec<Port>,
    groups: Vec<Portgroup>,
    port_uuid: Option<&str>,
    portgroup_uuid: Option<&str>,
) -> Result<Target, ApiError> {
    let already = |kind: &str, uuid: &str| {
        ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "Unable to attach VIF because VIF {vif} is already attached to Ironic {kind} \
                 {uuid}"
            ),
        )
    };
    let mut free: Vec<Target> = Vec::new();
    let mut by_group: Vec<(String, Port)> = Vec::new();
    let mut unusable_groups: Vec<Option<String>> = Vec::new();
    for p in ports {
        if port_uuid.is_some_and(|u| u != p.uuid) {
            continue;
        }
        if let Some(v) = vif_of(&p.attrs.internal_info) {
            if v == vif {
                return Err(already("Port", &p.uuid));
            }
            unusable_groups.push(p.attrs.portgroup_uuid.clone());
            continue;
        }
        match (&p.attrs.portgroup_uuid, portgroup_uuid) {
            (None, None) => free.push(Target::Port(p)),
            (Some(g), _) => by_group.push((g.clone(), p)),
            (None, Some(_)) => {}
        }
    }
    if port_uuid.is_none() {
        for g in groups {
            if portgroup_uuid.is_some_and(|u| u != g.uuid) {
                continue;
            }
            if let Some(v) = vif_of(&g.internal_info) {
                if v == vif {
                    return Err(already("Portgroup", &g.uuid));
                }
                continue;
            }
            let members: Vec<Port> = by_group
                .iter()
                .filter(|(u, _)| *u == g.uuid)
                .map(|(_, p)| p.clone())
                .collect();
            if unusable_groups.contains(&Some(g.uuid.clone())) {
                if portgroup_uuid.is_none() {
                    free.extend(members.into_iter().map(Target::Port));
                }
            } else if !members.is_empty() {
                free.push(Target::Group(g));
            }
        }
    }
    // Python's stable sort, reversed on (is_group, pxe_enabled): groups, then PXE ports.
    let key = |t: &Target| match t {
        Target::Group(_) => (true, true),
        Target::Port(p) => (false, p.pxe_enabled),
    };
    let best = free.iter().map(key).max();
    let pick = best.and_then(|b| free.into_iter().find(|t| key(t) == b));
    pick.ok_or_else(|| {
        ApiError::bad_request(format!(
            "Unable to attach VIF {vif}, not enough free physical ports."
        ))
    })
}

pub(super) async fn vif_attach(
    State(state): State<AppState>,
    ApiVersion(version): ApiVersion,
    Path(ident): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<StatusCode> {
    let body = super::json_body(&body)?.unwrap_or(Value::Null);
    let Value::Object(info) = body else {
        return Err(ApiError::bad_request(
            "a VIF must be a JSON object with an \"id\"",
        ));
    };
    let id = match info.get("id") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "{other} is not of type 'string' (id)"
            )))
        }
        None => return Err(ApiError::bad_request("'id' is a required property")),
    };
    check_vif_id(&id)?;
    let port_uuid = info.get("port_uuid").and_then(Value::as_str);
    let portgroup_uuid = info.get("portgroup_uuid").and_then(Value::as_str);
    if version >= VIF_PORT_VERSION && port_uuid.is_some() && portgroup_uuid.is_some() {
        return Err(ApiError::bad_request(
            "Cannot specify both port_uuid and portgroup_uuid",
        ));
    }
    let (node, ports, groups) = load(&state, &ident).await?;
    node.writable()?;
    refuse_locked(&node, false)?;
    if ports.is_empty() && groups.is_empty() && port_uuid.is_none() && portgroup_uuid.is_none() {
        // Nothing to bind the VIF to: accepted and not recorded, as Ironic's `noop` network
        // interface accepts every VIF (what clients' CI runs against on fake-hardware).
        tracing::info!(node = %node.uuid, vif = %id, "VIF accepted on a node without ports: nothing to bind, nothing recorded (noop network)");
        return Ok(StatusCode::NO_CONTENT);
    }
    let store = &state.conductor.store;
    match choose(&id, ports, groups, port_uuid, portgroup_uuid)? {
        Target::Port(mut p) => {
            p.attrs
                .internal_info
                .insert(VIF_KEY.into(), Value::from(id));
            store.update_port(&p).await?;
        }
        Target::Group(mut g) => {
            g.internal_info.insert(VIF_KEY.into(), Value::from(id));
            store.update_portgroup(&g).await?;
        }
    }
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn vif_detach(
    State(state): State<AppState>,
    Path((ident, vif)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    check_vif_id(&vif)?;
    let (node, ports, groups) = load(&state, &ident).await?;
    node.writable()?;
    refuse_locked(&node, false)?;
    let no_ports = ports.is_empty() && groups.is_empty();
    let store = &state.conductor.store;
    if let Some(mut g) = groups
        .iter()
        .find(|g| vif_of(&g.internal_info) == Some(vif.as_str()))
        .cloned()
    {
        g.internal_info.remove(VIF_KEY);
        g.extra.remove("vif_port_id");
        if g.dynamic_portgroup {
            // Dynamic groups go away with their VIF (Ironic's _teardown_dynamic_portgroup).
            for mut p in ports
                .into_iter()
                .filter(|p| p.attrs.portgroup_uuid.as_deref() == Some(g.uuid.as_str()))
            {
                p.attrs.portgroup_uuid = None;
                store.update_port(&p).await?;
            }
            match store.delete_portgroup(&g.uuid).await {
                Ok(_) | Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        } else {
            store.update_portgroup(&g).await?;
        }
        return Ok(StatusCode::NO_CONTENT);
    }
    if let Some(mut p) = ports
        .into_iter()
        .find(|p| vif_of(&p.attrs.internal_info) == Some(vif.as_str()))
    {
        p.attrs.internal_info.remove(VIF_KEY);
        p.extra.remove("vif_port_id");
        store.update_port(&p).await?;
        return Ok(StatusCode::NO_CONTENT);
    }
    if no_ports {
        // The other half of a VIF accepted without ports (see `vif_attach`).
        return Ok(StatusCode::NO_CONTENT);
    }
    Err(ApiError::bad_request(format!(
        "Unable to detach VIF {vif} from node {} because it is not attached to it.",
        node.uuid
    )))
}
