//! `/v1/volume`: Ironic's volume connectors and targets (API 1.32), at the top level and
//! under `/v1/nodes/{node}/volume`. They are stored, validated and shown as Ironic does;
//! booting from a volume is not done (every node's `storage_interface` is `noop`).
//!
//! As in Ironic's conductor, a connector or target may only change while its node is powered
//! off, and only be deleted while the node is powered off or in `manageable`, `enroll` or
//! `adopt failed` (400 otherwise); a node held by another operation answers 409.

use super::body::check_uuid;
use super::render::{base_url, document};
use super::resource::{
    self, found, page_of, paged, Access, Listing, OfNode, Page, Patched, Resource,
};
use super::{listing, ApiError, ApiResult, AppState};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::{Json, Router};
use chrono::Utc;
use rivet_model::microversions as mv;
use rivet_model::node::Node;
use rivet_protocol::states::{PowerState, ProvisionState};
use rivet_store::{
    StoreError, VolumeConnector, VolumeQuery, VolumeTarget, CONNECTOR_SORT_KEYS, TARGET_SORT_KEYS,
};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::marker::PhantomData;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/volume", get(root))
        .route("/v1/volume/", get(root))
        .merge(resource::routes::<Connectors>())
        .merge(resource::routes::<Targets>())
        .route("/v1/nodes/{ident}/volume", get(node_root))
        .route(
            "/v1/nodes/{ident}/volume/connectors",
            get(resource::list::<Connectors, OfNode, false>).post(malformed),
        )
        .route(
            "/v1/nodes/{ident}/volume/targets",
            get(resource::list::<Targets, OfNode, false>).post(malformed),
        )
}

/// What a PATCH may change (Ironic's `PATCH_ALLOWED_FIELDS`); a body has these and `uuid`.
const CONNECTOR_PATCHABLE: &[&str] = &["connector_id", "extra", "node_uuid", "type"];
const TARGET_PATCHABLE: &[&str] = &[
    "boot_index",
    "extra",
    "node_uuid",
    "properties",
    "volume_id",
    "volume_type",
];

const CONNECTOR_FIELDS: &[&str] = &["uuid", "node_uuid", "type", "connector_id"];
const TARGET_FIELDS: &[&str] = &[
    "uuid",
    "node_uuid",
    "volume_type",
    "boot_index",
    "volume_id",
];

/// Below 1.32 the volume API does not exist (Ironic: 404).
fn too_old(v: (u32, u32)) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!(
            "the volume API needs API version 1.32 or later; this request asked for {}.{}",
            v.0, v.1
        ),
    )
}

#[derive(Clone, Copy, PartialEq)]
pub(super) enum Kind {
    Connector,
    Target,
}

/// A stored connector or target.
pub(super) enum Record {
    Connector(VolumeConnector),
    Target(VolumeTarget),
}

impl Record {
    fn uuid(&self) -> &str {
        match self {
            Record::Connector(c) => &c.uuid,
            Record::Target(t) => &t.uuid,
        }
    }

    fn node_uuid(&self) -> &str {
        match self {
            Record::Connector(c) => &c.node_uuid,
            Record::Target(t) => &t.node_uuid,
        }
    }

    fn doc(&self, base: &str) -> Map<String, Value> {
        match self {
            Record::Connector(c) => connector_doc(c, base),
            Record::Target(t) => target_doc(t, base),
        }
    }
}

/// Which of the two collections.
pub(super) trait VolumeKind: Send + Sync + 'static {
    const KIND: Kind;
}

/// `/v1/volume/connectors`.
pub(super) struct ConnectorKind;
/// `/v1/volume/targets`.
pub(super) struct TargetKind;

impl VolumeKind for ConnectorKind {
    const KIND: Kind = Kind::Connector;
}

impl VolumeKind for TargetKind {
    const KIND: Kind = Kind::Target;
}

/// A volume collection.
pub(super) struct Api<K>(PhantomData<fn() -> K>);
type Connectors = Api<ConnectorKind>;
type Targets = Api<TargetKind>;

/// The `what`, `path` and `name` of one `kind`, as consts read them.
const fn kind_text(kind: Kind, connector: &'static str, target: &'static str) -> &'static str {
    match kind {
        Kind::Connector => connector,
        Kind::Target => target,
    }
}

fn connector_doc(c: &VolumeConnector, base: &str) -> Map<String, Value> {
    document(
        json!({
        "uuid": c.uuid,
        "node_uuid": c.node_uuid,
        "type": c.kind,
        "connector_id": c.connector_id,
        "extra": c.extra,
        }),
        base,
        "volume/connectors",
        &c.uuid,
        c.created_at,
        c.updated_at,
    )
}

fn target_doc(t: &VolumeTarget, base: &str) -> Map<String, Value> {
    document(
        json!({
        "uuid": t.uuid,
        "node_uuid": t.node_uuid,
        "volume_type": t.volume_type,
        "properties": t.properties,
        "boot_index": t.boot_index,
        "volume_id": t.volume_id,
        "extra": t.extra,
        }),
        base,
        "volume/targets",
        &t.uuid,
        t.created_at,
        t.updated_at,
    )
}

fn volume_links(base: &str, prefix: &str) -> Value {
    let l = |rel: &str| {
        json!([
            {"href": format!("{base}/v1/{prefix}{rel}"), "rel": "self"},
            {"href": format!("{base}/{prefix}{rel}"), "rel": "bookmark"},
        ])
    };
    json!({
        "links": l(""),
        "connectors": l("connectors"),
        "targets": l("targets"),
    })
}

async fn root(headers: HeaderMap) -> ApiResult<Json<Value>> {
    Ok(Json(volume_links(&base_url(&headers), "volume/")))
}

async fn node_root(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
    state.conductor.store.get_node(&ident).await?;
    Ok(Json(volume_links(
        &base_url(&headers),
        &format!("nodes/{ident}/volume/"),
    )))
}

async fn malformed() -> ApiError {
    ApiError::bad_request(
        "Malformed request URI. Create volume connectors and targets with POST /v1/volume/connectors or /v1/volume/targets.",
    )
}

impl<K: VolumeKind> Resource for Api<K> {
    type Record = Record;
    const SHOW_TAKES_DETAIL: bool = true;
    const PATH: &'static str = kind_text(K::KIND, "volume/connectors", "volume/targets");
    const NAME: &'static str = kind_text(K::KIND, "Volume connector", "Volume target");
    const IDENT: &'static str = "uuid";
    const DETAIL_ROUTE: bool = false;
    const SINCE: (u32, u32) = mv::VOLUME;
    const LIST_FIELDS: &'static [&'static str] = match K::KIND {
        Kind::Connector => CONNECTOR_FIELDS,
        Kind::Target => TARGET_FIELDS,
    };
    const FILTERS: &'static [&'static str] = &["node"];
    const SORT_KEYS: &'static [&'static str] = match K::KIND {
        Kind::Connector => CONNECTOR_SORT_KEYS,
        Kind::Target => TARGET_SORT_KEYS,
    };
    const UNSORTABLE: &'static [&'static str] = &["extra", "properties"];
    const PATCHABLE: &'static [&'static str] = match K::KIND {
        Kind::Connector => CONNECTOR_PATCHABLE,
        Kind::Target => TARGET_PATCHABLE,
    };

    fn doc(r: &Record, base: &str, _version: (u32, u32)) -> Map<String, Value> {
        r.doc(base)
    }

    fn blank() -> Record {
        let now = Utc::now();
        match K::KIND {
            Kind::Connector => Record::Connector(VolumeConnector {
                uuid: String::new(),
                node_uuid: String::new(),
                kind: String::new(),
                connector_id: String::new(),
                extra: Map::new(),
                created_at: now,
                updated_at: None,
            }),
            Kind::Target => Record::Target(VolumeTarget {
                uuid: String::new(),
                node_uuid: String::new(),
                volume_type: String::new(),
                properties: Map::new(),
                boot_index: 0,
                volume_id: String::new(),
                extra: Map::new(),
                created_at: now,
                updated_at: None,
            }),
        }
    }

    fn too_old(version: (u32, u32), _access: Access) -> ApiError {
        too_old(version)
    }

    /// Connectors and targets are named by UUID only.
    fn ident(ident: &str, _access: Access) -> ApiResult<String> {
        let what = kind_text(K::KIND, "connector_uuid", "target_uuid");
        check_uuid(what, ident)
    }

    async fn get(state: &AppState, uuid: &str) -> Result<Record, StoreError> {
        let store = &state.conductor.store;
        Ok(match K::KIND {
            Kind::Connector => Record::Connector(store.get_volume_connector(uuid).await?),
            Kind::Target => Record::Target(store.get_volume_target(uuid).await?),
        })
    }

    fn detail(params: &HashMap<String, String>, _from_detail: bool) -> ApiResult<bool> {
        let detail = listing::bool_param(params, "detail")?.unwrap_or(false);
        if detail && params.contains_key("fields") {
            return Err(ApiError::bad_request(
                "Can't fetch a subset of fields with 'detail' set",
            ));
        }
        Ok(detail)
    }

    async fn list(state: &AppState, l: &Listing<'_>, page: Page) -> ApiResult<Vec<Record>> {
        let node_uuid = match l.node("node") {
            Some(n) => Some(state.conductor.store.get_node(n).await?.uuid),
            None => None,
        };
        let q = paged!(VolumeQuery { node_uuid }, page);
        let store = &state.conductor.store;
        page_of::<Self, _>(match K::KIND {
            Kind::Connector => store
                .list_volume_connectors(&q)
                .await
                .map(|found| found.into_iter().map(Record::Connector).collect()),
            Kind::Target => store
                .list_volume_targets(&q)
                .await
                .map(|found| found.into_iter().map(Record::Target).collect()),
        })
    }

    type Body = Value;

    async fn create(state: &AppState, body: Value, _version: (u32, u32)) -> ApiResult<Record> {
        let Value::Object(doc) = body else {
            return Err(ApiError::bad_request("the body must be a JSON object"));
        };
        check_doc(K::KIND, &doc)?;
        let node = node_named(state, &str_of(&doc, "node_uuid")).await?;
        let uuid = match doc.get("uuid").and_then(Value::as_str) {
            Some(u) => check_uuid("uuid", u)?,
            None => uuid::Uuid::new_v4().to_string(),
        };
        let store = &state.conductor.store;
        Ok(match from_doc(Self::blank(), &doc, uuid, node.uuid) {
            Record::Connector(c) => Record::Connector(store.create_volume_connector(&c).await?),
            Record::Target(t) => Record::Target(store.create_volume_target(&t).await?),
        })
    }

    /// The patched document checked, and refused while the node (the new one too, when the
    /// patch moves it) is not powered off.
    async fn patched(state: &AppState, r: Record, p: Patched<'_>) -> ApiResult<Record> {
        let mut doc = p.doc;
        let uuid = r.uuid().to_string();
        doc.insert("uuid".into(), Value::from(uuid.clone()));
        for k in ["extra", "properties"] {
            if doc.get(k).is_some_and(Value::is_null) {
                doc.insert(k.into(), json!({}));
            }
        }
        if K::KIND == Kind::Connector {
            doc.remove("properties");
        }
        check_doc(K::KIND, &doc)?;
        let action = kind_text(K::KIND, "volume connector update", "volume target update");
        let new_node = str_of(&doc, "node_uuid");
        if new_node != r.node_uuid() {
            let old = state.conductor.store.get_node(r.node_uuid()).await?;
            check_node_allows(&old, action, false)?;
        }
        let node = node_named(state, &new_node).await?;
        check_node_allows(&node, action, false)?;
        let store = &state.conductor.store;
        let saved = match from_doc(r, &doc, uuid.clone(), node.uuid) {
            Record::Connector(c) => store
                .update_volume_connector(&c)
                .await
                .map(Record::Connector),
            Record::Target(t) => store.update_volume_target(&t).await.map(Record::Target),
        };
        found::<Self, _>(&uuid, saved)
    }

    async fn delete(state: &AppState, r: Record) -> ApiResult<()> {
        let store = &state.conductor.store;
        let node = store.get_node(r.node_uuid()).await?;
        let action = kind_text(
            K::KIND,
            "volume connector deletion",
            "volume target deletion",
        );
        check_node_allows(&node, action, true)?;
        let deleted = match &r {
            Record::Connector(c) => store.delete_volume_connector(&c.uuid).await,
            Record::Target(t) => store.delete_volume_target(&t.uuid).await,
        };
        found::<Self, _>(r.uuid(), deleted)
    }
}
// ------------------------------------------------------------------ validation

fn schema_error(msg: String) -> ApiError {
    ApiError::bad_request(format!("Invalid input: {msg}"))
}

/// The body of a create, or the document after a patch, checked as Ironic's
/// CONNECTOR_SCHEMA / TARGET_SCHEMA (and `args.uuid` on `node_uuid` and `uuid`).
fn check_doc(kind: Kind, doc: &Map<String, Value>) -> Result<(), ApiError> {
    // A body has the patchable fields and its UUID.
    let (patchable, required): (&[&str], &[&str]) = match kind {
        Kind::Connector => (CONNECTOR_PATCHABLE, &["connector_id", "node_uuid", "type"]),
        Kind::Target => (
            TARGET_PATCHABLE,
            &["boot_index", "node_uuid", "volume_id", "volume_type"],
        ),
    };
    let mut extras: Vec<&String> = doc
        .keys()
        .filter(|k| *k != "uuid" && !patchable.contains(&k.as_str()))
        .collect();
    if !extras.is_empty() {
        extras.sort();
        let names: Vec<String> = extras.iter().map(|k| format!("'{k}'")).collect();
        let verb = if names.len() == 1 { "was" } else { "were" };
        return Err(schema_error(format!(
            "Additional properties are not allowed ({} {verb} unexpected)",
            names.join(", ")
        )));
    }
    for r in required {
        if doc.get(*r).is_none_or(Value::is_null) {
            return Err(schema_error(format!("'{r}' is a required property")));
        }
    }
    for (k, v) in doc {
        let ok = match k.as_str() {
            "extra" | "properties" => v.is_object() || v.is_null(),
            "uuid" => v.is_string() || v.is_null(),
            "boot_index" => v.is_i64() || v.is_u64(),
            _ => v.is_string(),
        };
        if !ok {
            let ty = match k.as_str() {
                "extra" | "properties" => "'object', 'null'",
                "uuid" => "'string', 'null'",
                "boot_index" => "'integer'",
                _ => "'string'",
            };
            return Err(schema_error(format!("{v} is not of type {ty} ({k})")));
        }
    }
    for k in ["node_uuid", "uuid"] {
        if let Some(Value::String(s)) = doc.get(k) {
            check_uuid(k, s)?;
        }
    }
    // A connector's `type` and `connector_id` are any strings, as Ironic's CONNECTOR_SCHEMA
    // takes them (its api-ref lists the types storage interfaces read, the schema does not
    // enforce them): a create or a PATCH (`add` or `replace`) Ironic stores is stored.
    if kind == Kind::Target {
        if doc
            .get("boot_index")
            .and_then(Value::as_i64)
            .is_none_or(|i| i < 0)
        {
            return Err(ApiError::bad_request(
                "boot_index must be a non-negative integer",
            ));
        }
        for k in ["volume_id", "volume_type"] {
            if doc
                .get(k)
                .and_then(Value::as_str)
                .is_some_and(str::is_empty)
            {
                return Err(ApiError::bad_request(format!("{k} must not be empty")));
            }
        }
    }
    Ok(())
}

/// The node a body names: a missing node is the body's fault (Ironic's InvalidInput, 400).
async fn node_named(state: &AppState, uuid: &str) -> ApiResult<Node> {
    match state.conductor.store.get_node(uuid).await {
        Err(StoreError::NotFound { .. }) => Err(ApiError::bad_request(format!(
            "Invalid input for field/attribute node_uuid. Value: {uuid}. No node {uuid} exists."
        ))),
        r => Ok(r?),
    }
}

/// Ironic's conductor refusals: the node's lock (409), then its power state (400).
fn check_node_allows(node: &Node, action: &str, delete: bool) -> Result<(), ApiError> {
    if let Some(by) = &node.reservation {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "Node {} is locked by host {by}, please retry after the current operation is completed.",
                node.uuid
            ),
        ));
    }
    let off = node.power_state == Some(PowerState::Off);
    let idle = matches!(
        node.provision_state,
        ProvisionState::Manageable | ProvisionState::Enroll | ProvisionState::AdoptFailed
    );
    if off || (delete && idle) {
        return Ok(());
    }
    let state = node.power_state.map_or("None", |p| p.as_str());
    Err(ApiError::bad_request(format!(
        "The requested action \"{action}\" can not be performed on node \"{}\" while it is in state \"{state}\". Power the node off first.",
        node.uuid
    )))
}

fn str_of(doc: &Map<String, Value>, k: &str) -> String {
    doc.get(k)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn map_of(doc: &Map<String, Value>, k: &str) -> Map<String, Value> {
    doc.get(k)
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// `r` with the fields of a checked document, its UUID and its node's.
fn from_doc(r: Record, doc: &Map<String, Value>, uuid: String, node_uuid: String) -> Record {
    match r {
        Record::Connector(c) => Record::Connector(VolumeConnector {
            uuid,
            node_uuid,
            kind: str_of(doc, "type"),
            connector_id: str_of(doc, "connector_id"),
            extra: map_of(doc, "extra"),
            ..c
        }),
        Record::Target(t) => Record::Target(VolumeTarget {
            uuid,
            node_uuid,
            volume_type: str_of(doc, "volume_type"),
            properties: map_of(doc, "properties"),
            boot_index: doc.get("boot_index").and_then(Value::as_i64).unwrap_or(0),
            volume_id: str_of(doc, "volume_id"),
            extra: map_of(doc, "extra"),
            ..t
        }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn doc(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn connector_schema() {
        let n = "1be26c0b-03f2-4d2e-ae87-c02d7f33c123";
        let ok = doc(json!({"node_uuid": n, "type": "iqn", "connector_id": "iqn.2017-01.a:b"}));
        assert!(check_doc(Kind::Connector, &ok).is_ok());
        // Any string, as Ironic's schema: an unknown type, an empty id.
        let any = doc(json!({"node_uuid": n, "type": "floppy", "connector_id": ""}));
        assert!(check_doc(Kind::Connector, &any).is_ok());
        let not_string = doc(json!({"node_uuid": n, "type": 5, "connector_id": "x"}));
        assert!(check_doc(Kind::Connector, &not_string).is_err());
        let missing = doc(json!({"node_uuid": n, "type": "iqn"}));
        let e = check_doc(Kind::Connector, &missing).unwrap_err();
        assert!(e.message.contains("'connector_id' is a required property"));
        let extra = doc(json!({"node_uuid": n, "type": "iqn", "connector_id": "x", "foo": 1}));
        assert!(check_doc(Kind::Connector, &extra)
            .unwrap_err()
            .message
            .contains("'foo' was unexpected"));
        let bad_uuid = doc(json!({"node_uuid": "nope", "type": "iqn", "connector_id": "x"}));
        assert!(check_doc(Kind::Connector, &bad_uuid).is_err());
    }

    #[test]
    fn target_schema() {
        let n = "1be26c0b-03f2-4d2e-ae87-c02d7f33c123";
        let ok =
            doc(json!({"node_uuid": n, "volume_type": "iscsi", "volume_id": "v", "boot_index": 0}));
        assert!(check_doc(Kind::Target, &ok).is_ok());
        let neg = doc(
            json!({"node_uuid": n, "volume_type": "iscsi", "volume_id": "v", "boot_index": -1}),
        );
        assert!(check_doc(Kind::Target, &neg).is_err());
        let s = doc(
            json!({"node_uuid": n, "volume_type": "iscsi", "volume_id": "v", "boot_index": "0"}),
        );
        assert!(check_doc(Kind::Target, &s).is_err());
    }
}
