//! Node listings written straight into the response bytes.
//!
//! The listing's JSON is exactly what [`super::render::node_full`] → `gate_node` →
//! `node_fields::apply` → `select` builds as a `serde_json::Value` tree, serialized — without
//! the tree. At 1,000 nodes a page, building that tree (a copy of every stored document,
//! masked), serializing it and dropping it was most of a detail listing's time (profile in
//! docs/profile/README.md). The tree path stays for single nodes and is the reference this
//! one is tested against, byte for byte (`tests` below).
//!
//! Keys come out in the order a `serde_json::Map` iterates them — sorted by their bytes
//! (the workspace does not enable `preserve_order`) — which is the order of [`FIELDS`]
//! (checked by a test).

use super::render::{internal_shown, steps_with_progress, NODE_FIELD_VERSIONS, NODE_LIST_FIELDS};
use super::ApiError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use rivet_drivers::is_secret_key;
use rivet_model::interfaces::Iface;
use rivet_model::node::Node;
use rivet_store::NodeManagement;
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::HashMap;

type Out = Vec<u8>;
type Res = serde_json::Result<()>;

/// One node with what is shown beside it.
struct Input<'a> {
    n: &'a Node,
    kept: Option<&'a NodeManagement>,
    /// The base URL's JSON string contents (escaped, no quotes).
    base: &'a str,
    /// The request's microversion.
    version: (u32, u32),
}

/// Writes one field's value.
type Field = fn(&mut Out, &Input<'_>) -> Res;

/// Every field of a node document, in the order a `Map` holds them; each as `node_full`
/// computes it.
static FIELDS: &[(&str, Field)] = &[
    ("allocation_uuid", |o, i| json(o, &i.n.allocation_uuid)),
    ("automated_clean", |o, i| json(o, &i.n.automated_clean)),
    ("bios_interface", |o, i| iface(o, i, Iface::Bios)),
    ("boot_interface", |o, i| iface(o, i, Iface::Boot)),
    ("boot_mode", |o, i| match i.kept {
        Some(m) => json(o, &m.boot_mode),
        None => null(o),
    }),
    ("chassis_uuid", |o, i| json(o, &i.n.chassis_uuid)),
    ("clean_step", |o, i| json(o, &steps_with_progress(i.n).0)),
    ("conductor", |o, i| json(o, &i.n.conductor)),
    ("conductor_group", |o, i| {
        json(o, &i.n.attrs.conductor_group)
    }),
    ("console_enabled", |o, i| {
        json(o, &i.kept.is_some_and(|m| m.console_enabled))
    }),
    ("console_interface", |o, i| iface(o, i, Iface::Console)),
    ("created_at", |o, i| time(o, Some(&i.n.created_at))),
    ("deploy_interface", |o, i| iface(o, i, Iface::Deploy)),
    ("deploy_step", |o, i| json(o, &steps_with_progress(i.n).1)),
    ("description", |o, i| json(o, &i.n.attrs.description)),
    ("disable_power_off", |o, i| {
        json(o, &i.n.attrs.disable_power_off)
    }),
    ("driver", |o, i| json(o, &i.n.driver)),
    ("driver_info", |o, i| {
        json(o, &Masked::plain(&i.n.driver_info))
    }),
    ("driver_internal_info", |o, i| {
        let shown = internal_shown(i.n);
        json(
            o,
            &Masked {
                map: &i.n.driver_internal_info,
                configdrive: false,
                shown: Some(&shown),
            },
        )
    }),
    ("extra", |o, i| json(o, &i.n.extra)),
    ("fault", |o, i| json(o, &i.n.fault)),
    ("firmware_interface", |o, i| iface(o, i, Iface::Firmware)),
    ("health", |o, i| json(o, &i.n.health)),
    ("inspect_interface", |o, i| {
        json(o, i.n.inspect_interface.as_deref().unwrap_or("agent"))
    }),
    ("inspection_finished_at", |o, i| {
        time(o, i.n.inspection_finished_at.as_ref())
    }),
    ("inspection_started_at", |o, i| {
        time(o, i.n.inspection_started_at.as_ref())
    }),
    ("instance_info", |o, i| {
        json(
            o,
            &Masked {
                map: &i.n.instance_info,
                configdrive: true,
                shown: None,
            },
        )
    }),
    ("instance_name", |o, i| json(o, &i.n.attrs.instance_name)),
    ("instance_uuid", |o, i| json(o, &i.n.instance_uuid)),
    ("last_error", |o, i| match &i.n.corrupt {
        // A record whose stored fields do not decode says so where operators look first.
        Some(c) => json(o, &c.message(i.n.ident())),
        None => json(o, &i.n.last_error),
    }),
    ("lessee", |o, i| json(o, &i.n.attrs.lessee)),
    ("links", |o, i| {
        href(o, i, "[{", "/v1/nodes/", "", "self,")?;
        href(o, i, "{", "/nodes/", "", "bookmark]")
    }),
    ("maintenance", |o, i| json(o, &i.n.maintenance)),
    ("maintenance_reason", |o, i| {
        json(o, &i.n.maintenance_reason)
    }),
    ("management_interface", |o, i| {
        iface(o, i, Iface::Management)
    }),
    ("name", |o, i| json(o, &i.n.name)),
    ("network_data", |o, i| json(o, &i.n.attrs.network_data)),
    ("network_interface", |o, i| iface(o, i, Iface::Network)),
    ("owner", |o, i| json(o, &i.n.attrs.owner)),
    ("parent_node", |o, i| json(o, &i.n.attrs.parent_node)),
    ("portgroups", |o, i| {
        href(o, i, "[{", "/v1/nodes/", "/portgroups", "self,")?;
        href(o, i, "{", "/nodes/", "/portgroups", "bookmark]")
    }),
    ("ports", |o, i| {
        href(o, i, "[{", "/v1/nodes/", "/ports", "self,")?;
        href(o, i, "{", "/nodes/", "/ports", "bookmark]")
    }),
    ("power_interface", |o, i| iface(o, i, Iface::Power)),
    ("power_state", |o, i| json(o, &i.n.power_state)),
    ("properties", |o, i| json(o, &i.n.properties)),
    ("protected", |o, i| json(o, &i.n.attrs.protected)),
    ("protected_reason", |o, i| {
        json(o, &i.n.attrs.protected_reason)
    }),
    ("provision_state", |o, i| {
        json(
            o,
            &super::render::provision_state_at(i.n.provision_state, i.version),
        )
    }),
    ("provision_updated_at", |o, i| {
        time(o, i.n.provision_updated_at.as_ref())
    }),
    ("raid_config", |o, i| match i.kept {
        Some(m) => json(o, &m.raid_config),
        None => raw(o, "{}"),
    }),
    ("raid_interface", |o, i| iface(o, i, Iface::Raid)),
    ("rescue_interface", |o, i| iface(o, i, Iface::Rescue)),
    ("reservation", |o, i| json(o, &i.n.reservation)),
    ("resource_class", |o, i| json(o, &i.n.resource_class)),
    ("retired", |o, i| json(o, &i.n.attrs.retired)),
    ("retired_reason", |o, i| json(o, &i.n.attrs.retired_reason)),
    ("secure_boot", |o, i| match i.kept {
        Some(m) => json(o, &m.secure_boot),
        None => null(o),
    }),
    ("service_step", |o, i| {
        json(o, &rivet_conductor::servicing::service_step(i.n))
    }),
    ("shard", |o, i| json(o, &i.n.attrs.shard)),
    ("states", |o, i| {
        href(o, i, "[{", "/v1/nodes/", "/states", "self,")?;
        href(o, i, "{", "/nodes/", "/states", "bookmark]")
    }),
    ("storage_interface", |o, i| iface(o, i, Iface::Storage)),
    ("target_power_state", |o, i| {
        json(o, &i.n.target_power_state)
    }),
    ("target_provision_state", |o, i| {
        json(o, &i.n.target_provision_state)
    }),
    ("target_raid_config", |o, i| match i.kept {
        Some(m) => json(o, &m.target_raid_config),
        None => raw(o, "{}"),
    }),
    ("traits", |o, i| json(o, &i.n.traits)),
    ("updated_at", |o, i| time(o, i.n.updated_at.as_ref())),
    ("uuid", |o, i| json(o, &i.n.uuid)),
    ("vendor_interface", |o, i| iface(o, i, Iface::Vendor)),
    ("volume", |o, i| {
        href(o, i, "[{", "/v1/nodes/", "/volume", "self,")?;
        href(o, i, "{", "/nodes/", "/volume", "bookmark]")
    }),
];

fn json<T: Serialize + ?Sized>(o: &mut Out, v: &T) -> Res {
    serde_json::to_writer(o, v)
}

fn raw(o: &mut Out, text: &str) -> Res {
    o.extend_from_slice(text.as_bytes());
    Ok(())
}

fn null(o: &mut Out) -> Res {
    raw(o, "null")
}

/// A time as `render::time` shows it.
fn time(o: &mut Out, t: Option<&DateTime<Utc>>) -> Res {
    match t {
        Some(t) => json(o, &super::render::timestamp(t)),
        None => null(o),
    }
}

fn iface(o: &mut Out, i: &Input<'_>, which: Iface) -> Res {
    json(o, &i.n.interfaces.get(&i.n.driver, which))
}

/// `{open}"href":"{base}{path}{uuid}{tail}","rel":"{rel}"}{close}` where `rel_close` is the
/// relation followed by what closes the object (`,` or `]`): a link as `render::links`
/// shows it, without building its URL first.
fn href(o: &mut Out, i: &Input<'_>, open: &str, path: &str, tail: &str, rel_close: &str) -> Res {
    let (rel, close) = rel_close.split_at(rel_close.len() - 1);
    o.extend_from_slice(open.as_bytes());
    o.extend_from_slice(b"\"href\":\"");
    o.extend_from_slice(i.base.as_bytes());
    o.extend_from_slice(path.as_bytes());
    escaped(o, &i.n.uuid)?;
    o.extend_from_slice(tail.as_bytes());
    o.extend_from_slice(b"\",\"rel\":\"");
    o.extend_from_slice(rel.as_bytes());
    o.extend_from_slice(b"\"}");
    o.extend_from_slice(close.as_bytes());
    Ok(())
}

/// The contents of `s` as a JSON string (no quotes), escaped as serde_json escapes them.
fn escaped(o: &mut Out, s: &str) -> Res {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        o.extend_from_slice(s.as_bytes());
    } else {
        let quoted = serde_json::to_string(s)?;
        o.extend_from_slice(&quoted.as_bytes()[1..quoted.len() - 1]);
    }
    Ok(())
}

/// A stored document as `mask_secrets` shows it (a secret's value as `******`, nested
/// objects too), serialized from the stored map instead of a masked copy of it;
/// `configdrive` also shows a top-level `configdrive` as `******` (`instance_info`), and
/// `shown` replaces or adds keys after masking (`driver_internal_info`).
struct Masked<'a> {
    map: &'a Map<String, Value>,
    configdrive: bool,
    shown: Option<&'a Map<String, Value>>,
}

impl<'a> Masked<'a> {
    fn plain(map: &'a Map<String, Value>) -> Masked<'a> {
        Masked {
            map,
            configdrive: false,
            shown: None,
        }
    }
}

const MASK: &str = "******";

impl Serialize for Masked<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut out = s.serialize_map(None)?;
        let mut stored = self.map.iter().peekable();
        let mut shown = self.shown.into_iter().flatten().peekable();
        loop {
            // Both iterate in key order: merge them, a shown key replacing a stored one.
            let a = stored.peek().map(|&(k, _)| k.as_str());
            let b = shown.peek().map(|&(k, _)| k.as_str());
            let take_shown = match (a, b) {
                (None, None) => break,
                (Some(_), None) => false,
                (None, Some(_)) => true,
                (Some(a), Some(b)) => {
                    if a == b {
                        stored.next();
                    }
                    b <= a
                }
            };
            if take_shown {
                if let Some((k, v)) = shown.next() {
                    out.serialize_entry(k, v)?;
                }
                continue;
            }
            let Some((k, v)) = stored.next() else { break };
            if (self.configdrive && k == "configdrive") || (is_secret_key(k) && !v.is_null()) {
                out.serialize_entry(k, MASK)?;
            } else if let Value::Object(m) = v {
                out.serialize_entry(k, &Masked::plain(m))?;
            } else {
                out.serialize_entry(k, v)?;
            }
        }
        out.end()
    }
}

/// Which fields a listing shows, worked out once per request: the microversion's, and of
/// those the ones asked for (`fields`), else all (`detail`), else the short form.
pub(super) struct NodeShape {
    shown: Vec<bool>,
    /// The base URL's JSON string contents.
    base: String,
    version: (u32, u32),
}

impl NodeShape {
    pub(super) fn new(
        base: &str,
        version: (u32, u32),
        fields: Option<&[String]>,
        detail: bool,
    ) -> Result<NodeShape, ApiError> {
        let shown = FIELDS
            .iter()
            .map(|(key, _)| {
                let gated = NODE_FIELD_VERSIONS
                    .iter()
                    .any(|(f, since)| f == key && version < *since);
                let asked = match (fields, detail) {
                    // `links` always, as Ironic's `sanitize_dict`.
                    (Some(f), _) => *key == "links" || f.iter().any(|f| f == key),
                    (None, true) => true,
                    (None, false) => NODE_LIST_FIELDS.contains(key),
                };
                !gated && asked
            })
            .collect();
        let mut escaped_base = Vec::with_capacity(base.len());
        escaped(&mut escaped_base, base).map_err(render_error)?;
        let base = String::from_utf8(escaped_base).map_err(render_error)?;
        Ok(NodeShape {
            shown,
            base,
            version,
        })
    }

    /// One node's document.
    fn write(&self, o: &mut Out, n: &Node, kept: Option<&NodeManagement>) -> Res {
        let input = Input {
            n,
            kept,
            base: &self.base,
            version: self.version,
        };
        o.push(b'{');
        let mut first = true;
        for ((key, field), shown) in FIELDS.iter().zip(&self.shown) {
            if !shown {
                continue;
            }
            if !first {
                o.push(b',');
            }
            first = false;
            // Keys are plain identifiers: nothing to escape.
            o.push(b'"');
            o.extend_from_slice(key.as_bytes());
            o.extend_from_slice(b"\":");
            field(o, &input)?;
        }
        o.push(b'}');
        Ok(())
    }

    /// The listing's body, `{"next": …, "nodes": [...]}` (`next` only when given), as the
    /// `Map` it replaces orders it.
    pub(super) fn listing(
        &self,
        nodes: &[Node],
        kept: &HashMap<String, NodeManagement>,
        next: Option<&str>,
    ) -> Result<Vec<u8>, ApiError> {
        let mut o = Vec::new();
        self.write_listing(&mut o, nodes, kept, next)
            .map_err(render_error)?;
        Ok(o)
    }

    fn write_listing(
        &self,
        o: &mut Out,
        nodes: &[Node],
        kept: &HashMap<String, NodeManagement>,
        next: Option<&str>,
    ) -> Res {
        o.push(b'{');
        if let Some(next) = next {
            o.extend_from_slice(b"\"next\":");
            json(o, next)?;
            o.push(b',');
        }
        o.extend_from_slice(b"\"nodes\":[");
        for (i, n) in nodes.iter().enumerate() {
            if i > 0 {
                o.push(b',');
            } else {
                // Documents of one listing are alike in size: room for all of them at
                // once (an eighth more) after the first, instead of doubling the buffer
                // a dozen times for a 2.5 MiB page.
                let before = o.len();
                self.write(o, n, kept.get(&n.uuid))?;
                let each = o.len() - before + 1;
                o.reserve(each.saturating_mul(nodes.len()) / 8 * 9);
                continue;
            }
            self.write(o, n, kept.get(&n.uuid))?;
        }
        o.extend_from_slice(b"]}");
        Ok(())
    }
}

fn render_error(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("cannot render the node listing: {e}"),
    )
}

/// A JSON body already serialized (what `axum::Json` answers, without a `Value`).
pub(super) struct JsonBytes(pub Vec<u8>);

impl IntoResponse for JsonBytes {
    fn into_response(self) -> Response {
        (
            [(
                axum::http::header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static("application/json"),
            )],
            self.0,
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use rivet_model::node::Corrupt;
    use rivet_protocol::api::{MAX_VERSION, MIN_VERSION};
    use rivet_protocol::states::{PowerState, ProvisionState};
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            other => panic!("not an object: {other}"),
        }
    }

    /// A node with every field set: secrets at the top and nested in each masked document,
    /// stored keys the run state and liveness replace, text that needs escaping, a running
    /// step with its progress, and a service run.
    fn full_node() -> Node {
        let t = |s: i64| {
            Utc.timestamp_opt(1_700_000_000 + s, 0)
                .single()
                .expect("time")
        };
        let mut n = Node::new(
            "1be26c0b-03f2-4d2e-ae87-c02d7f33c123".into(),
            "redfish".into(),
        );
        n.name = Some("rack1-\"u7\"".into());
        n.driver_info = obj(json!({
            "redfish_address": "https://10.0.0.9",
            "redfish_password": "s3cret-pw",
            "redfish_username": "root",
            "nested": {"auth_token": "s3cret-token", "plain": 1, "null_password": null,
                       "deeper": {"private_key": "s3cret-key"}},
            "empty_secret": null,
        }));
        n.driver_internal_info = obj(json!({
            "agent_url": "http://10.0.0.9:9999",
            "agent_version": "stored-and-replaced",
            "run_state": "stored-and-replaced",
            "cached_clean_steps": [{"step": "erase_devices", "priority": 10}],
            "token_secret": "s3cret-internal",
            "zz_last": {"password": "s3cret-nested"},
            "AA_first": "upper case sorts first",
        }));
        n.properties = obj(json!({"cpus": 64, "memory_mb": 262144, "local_gb": 1788.5,
                                  "capabilities": "boot_mode:uefi", "big": 1.0e300}));
        n.instance_info = obj(json!({
            "configdrive": {"user_data": "s3cret-userdata"},
            "image_source": "http://images/x.qcow2",
            "image_os_password": "s3cret-image",
            "root_gb": 10,
        }));
        n.instance_uuid = Some("7d5b5b6e-3c1d-4f5e-9d3a-0b6f0c1a2b3c".into());
        n.extra = obj(json!({"note": "tab\tnewline\nquote\"backslash\\ é ☃ \u{1}",
                             "nested": {"a": [1, 2, {"b": null}]}}));
        n.provision_state = ProvisionState::Cleaning;
        n.target_provision_state = Some(ProvisionState::Available);
        n.provision_updated_at = Some(t(1));
        n.power_state = Some(PowerState::On);
        n.target_power_state = Some(PowerState::Off);
        n.maintenance = true;
        n.maintenance_reason = Some("checking".into());
        n.fault = Some("clean failure".into());
        n.last_error = Some("it broke".into());
        n.clean_step = Some(json!({"interface": "deploy", "step": "erase_devices"}));
        n.deploy_step = Some(json!({}));
        n.reservation = Some("ctl-1".into());
        n.conductor = Some("ctl-2".into());
        n.automated_clean = Some(true);
        n.resource_class = Some("bm-large".into());
        n.created_at = t(0);
        n.updated_at = Some(t(2));
        n.version = 17;
        n.inspect_interface = Some("redfish".into());
        n.inspection_started_at = Some(t(3));
        n.inspection_finished_at = Some(t(4));
        n.traits = vec!["CUSTOM_A".into(), "CUSTOM_\"B\"".into()];
        n.interfaces
            .set(Iface::Boot, Some("redfish-virtual-media".into()));
        n.interfaces.set(Iface::Raid, Some("no-raid".into()));
        n.runs = serde_json::from_value(json!({
            "v": rivet_model::runs::RUNS_VERSION,
            "agent": {"token_hash": "s3cret-hash", "boot_id": "boot-1"},
            "clean": {"plan": [{"interface": "deploy", "step": "erase_devices",
                                "priority": 10, "source": "agent"}],
                      "step_index": 0, "command": "cmd-7"},
            "deploy": {"plan": [], "index": 0},
            "service": {"requested": [], "current": {"step": "update", "interface": "bios"}},
        }))
        .expect("runs");
        n.attrs.owner = Some("proj-a".into());
        n.attrs.lessee = Some("proj-b".into());
        n.attrs.description = Some("a node".into());
        n.attrs.conductor_group = "group-1".into();
        n.attrs.shard = Some("s1".into());
        n.attrs.instance_name = Some("vm-1".into());
        n.attrs.parent_node = Some("c0a1b2c3-0000-4000-8000-000000000001".into());
        n.attrs.network_data = obj(json!({"links": [], "networks": [], "services": []}));
        n.attrs.retired = true;
        n.attrs.retired_reason = Some("old".into());
        n.attrs.protected = true;
        n.attrs.protected_reason = Some("in use".into());
        n.attrs.disable_power_off = true;
        n.chassis_uuid = Some("c0a1b2c3-0000-4000-8000-000000000002".into());
        n.health = Some("OK".into());
        n.allocation_uuid = Some("c0a1b2c3-0000-4000-8000-000000000003".into());
        n.liveness.last_heartbeat = Some(t(5));
        n.liveness.agent_version = Some("0.1.0".into());
        n.liveness.progress = Some(json!({"command_id": "cmd-7", "progress": 42}));
        n
    }

    fn management() -> NodeManagement {
        NodeManagement {
            target_raid_config: obj(json!({"logical_disks": [{"size_gb": 100}]})),
            raid_config: obj(json!({"built": true})),
            boot_mode: Some("uefi".into()),
            secure_boot: Some(false),
            console_enabled: true,
        }
    }

    /// One listing to render: the nodes and how the request asked for them.
    struct Case<'a> {
        nodes: &'a [Node],
        kept: &'a HashMap<String, NodeManagement>,
        base: &'a str,
        version: (u32, u32),
        fields: Option<&'a [String]>,
        detail: bool,
        next: Option<&'a str>,
    }

    impl Case<'_> {
        /// The listing as the `Value` tree path builds it (nodes.rs before this module).
        fn reference(&self) -> Vec<u8> {
            let Case {
                nodes,
                kept,
                base,
                version,
                fields,
                detail,
                next,
            } = *self;
            let docs: Vec<Value> = nodes
                .iter()
                .map(|n| {
                    let mut full = super::super::render::node_full(n, base);
                    super::super::render::gate_node(&mut full, version);
                    if let Some(m) = kept.get(&n.uuid) {
                        super::super::node_actions::node_fields::apply(&mut full, m);
                    }
                    match (fields, detail) {
                        (Some(f), _) => super::super::render::sanitized(full, f),
                        (None, true) => Value::Object(full),
                        (None, false) => super::super::render::select(full, NODE_LIST_FIELDS),
                    }
                })
                .collect();
            let mut body =
                Value::Object(Map::from_iter([("nodes".to_string(), Value::Array(docs))]));
            if let Some(next) = next {
                body["next"] = Value::from(next);
            }
            serde_json::to_vec(&body).expect("serialize")
        }

        fn fast(&self) -> Vec<u8> {
            NodeShape::new(self.base, self.version, self.fields, self.detail)
                .map_err(|e| e.message)
                .expect("shape")
                .listing(self.nodes, self.kept, self.next)
                .map_err(|e| e.message)
                .expect("listing")
        }
    }

    #[test]
    fn fields_are_in_map_order() {
        for pair in FIELDS.windows(2) {
            assert!(
                pair[0].0.as_bytes() < pair[1].0.as_bytes(),
                "{} must come after {}",
                pair[0].0,
                pair[1].0
            );
        }
    }

    #[test]
    fn listing_is_byte_for_byte_the_tree_rendering() {
        let full = full_node();
        let mut corrupt = full_node();
        corrupt.uuid = "2be26c0b-03f2-4d2e-ae87-c02d7f33c124".into();
        corrupt.corrupt = Some(Corrupt {
            field: "extra",
            error: "expected value at line 1".into(),
        });
        corrupt.runs = rivet_model::runs::Runs::default();
        corrupt.liveness = Default::default();
        let mut bare = Node::new("3be26c0b-03f2-4d2e-ae87-c02d7f33c125".into(), "fake".into());
        bare.created_at = full.created_at;
        let nodes = vec![full, corrupt, bare];
        let kept = HashMap::from([(nodes[0].uuid.clone(), management())]);
        let some: Vec<String> = [
            "uuid",
            "driver_info",
            "links",
            "raid_config",
            "name",
            "nope",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let versions = [
            MIN_VERSION,
            (1, 5),
            (1, 31),
            (1, 52),
            (1, 74),
            (1, 75),
            (1, 108),
            MAX_VERSION,
        ];
        let next = "http://h/v1/nodes?limit=3&marker=x&fields=a%2Cb";
        for base in ["http://127.0.0.1:6385", "http://we\"ird\\host"] {
            for version in versions {
                for (fields, detail) in [
                    (None, true),
                    (None, false),
                    (Some(some.as_slice()), false),
                    (Some(&[][..]), true),
                ] {
                    for next in [None, Some(next)] {
                        let case = Case {
                            nodes: &nodes,
                            kept: &kept,
                            base,
                            version,
                            fields,
                            detail,
                            next,
                        };
                        let (want, got) = (case.reference(), case.fast());
                        assert_eq!(
                            String::from_utf8_lossy(&got),
                            String::from_utf8_lossy(&want),
                            "base {base} version {version:?} fields {fields:?} detail {detail}"
                        );
                    }
                }
            }
        }
        // The reference itself masks: no secret value appears in either.
        let got = Case {
            nodes: &nodes,
            kept: &kept,
            base: "http://h",
            version: MAX_VERSION,
            fields: None,
            detail: true,
            next: None,
        }
        .fast();
        let text = String::from_utf8_lossy(&got);
        assert!(!text.contains("s3cret"), "{text}");
        assert!(text.contains(r#""redfish_password":"******""#), "{text}");
        assert!(text.contains(r#""configdrive":"******""#), "{text}");
        assert!(text.contains(r#""null_password":null"#), "{text}");
    }

    #[test]
    fn empty_listing() {
        let kept = HashMap::new();
        for detail in [true, false] {
            let case = Case {
                nodes: &[],
                kept: &kept,
                base: "http://h",
                version: MAX_VERSION,
                fields: None,
                detail,
                next: None,
            };
            assert_eq!(case.fast(), case.reference());
        }
    }
}
