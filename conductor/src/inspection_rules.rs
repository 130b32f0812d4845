//! Running the inspection rules on a node: load them (converting rules stored in Rivet's
//! former schema, and rewriting them in Ironic's), build the node and port views the rule
//! engine works on, and write back what the actions changed. Used at the end of in-band and
//! out-of-band inspection and on discovery.

use super::Conductor;
use rivet_model::inspection::rules::{self, Rule, Target};
use rivet_model::node::Node;
use rivet_store::{PortQuery, Store, StoreError};
use serde_json::{json, Map, Value};

/// Every rule, Ironic-shaped. Bodies in the former schema are converted and stored again,
/// so the conversion happens once per rule.
pub async fn load_rules(store: &dyn Store) -> Result<Vec<Rule>, StoreError> {
    let mut out = Vec::new();
    for doc in store.list_rules().await? {
        match rules::from_stored(&doc) {
            Ok(rule) => {
                if rules::is_legacy(&doc) {
                    if let Some(uuid) = rule.uuid.clone() {
                        let mut body = serde_json::to_value(&rule).unwrap_or(Value::Null);
                        if let (Value::Object(b), Some(c)) = (&mut body, doc.get("created_at")) {
                            b.insert("created_at".into(), c.clone());
                        }
                        store.put_rule(&uuid, rule.priority, &body).await?;
                        tracing::info!(rule = %uuid, "inspection rule converted to Ironic's schema");
                    }
                }
                out.push(rule);
            }
            Err(e) => {
                let uuid = doc.get("uuid").and_then(Value::as_str).unwrap_or("?");
                tracing::warn!(rule = %uuid, error = %e, "stored inspection rule cannot be read; skipped");
            }
        }
    }
    Ok(out)
}

/// What rules see of a node (and may change: [`rules::NODE_SETTABLE`] and traits).
pub fn node_view(n: &Node) -> Map<String, Value> {
    let v = json!({
        "uuid": n.uuid,
        "name": n.name,
        "driver": n.driver,
        "driver_info": n.driver_info,
        "properties": n.properties,
        "instance_info": n.instance_info,
        "extra": n.extra,
        "resource_class": n.resource_class,
        "description": n.attrs.description,
        "owner": n.attrs.owner,
        "lessee": n.attrs.lessee,
        "network_data": n.attrs.network_data,
        "traits": n.traits,
        "provision_state": n.provision_state.to_string(),
        "power_state": n.power_state.map(|p| p.to_string()),
        "maintenance": n.maintenance,
        "conductor_group": n.attrs.conductor_group,
        "shard": n.attrs.shard,
        "chassis_uuid": n.chassis_uuid,
    });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn opt_string(view: &Map<String, Value>, k: &str) -> Result<Option<String>, String> {
    match view.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!("{k} must be a string, not {other}")),
    }
}

fn object(view: &Map<String, Value>, k: &str) -> Result<Map<String, Value>, String> {
    match view.get(k) {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(m)) => Ok(m.clone()),
        Some(other) => Err(format!("{k} must be an object, not {other}")),
    }
}

/// Write the rule-settable fields of `view` back into `n`; a wrong type is an error naming
/// the field (nothing is written then).
pub fn write_node(n: &mut Node, view: &Map<String, Value>) -> Result<(), String> {
    let driver = opt_string(view, "driver")?
        .filter(|d| !d.is_empty())
        .ok_or("driver must be a non-empty string")?;
    let traits = match view.get("traits") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|t| t.as_str().map(String::from).ok_or("traits must be strings"))
            .collect::<Result<Vec<_>, _>>()?,
        _ => Vec::new(),
    };
    let mut new = n.clone();
    new.name = opt_string(view, "name")?;
    new.driver = driver;
    new.driver_info = object(view, "driver_info")?;
    new.properties = object(view, "properties")?;
    new.instance_info = object(view, "instance_info")?;
    new.extra = object(view, "extra")?;
    new.attrs.network_data = object(view, "network_data")?;
    new.resource_class = opt_string(view, "resource_class")?;
    new.attrs.description = opt_string(view, "description")?;
    new.attrs.owner = opt_string(view, "owner")?;
    new.attrs.lessee = opt_string(view, "lessee")?;
    new.traits = traits;
    *n = new;
    Ok(())
}

impl Conductor {
    /// Apply the `main` phase rules to `node` (changed in place, not saved) and to its ports
    /// (saved). `Err` carries the message for `last_error`; the node is then unchanged.
    pub(crate) async fn apply_inspection_rules(
        &self,
        node: &mut Node,
        inventory: &Value,
    ) -> Result<Result<(), String>, StoreError> {
        let all = load_rules(self.store.as_ref()).await?;
        if all.is_empty() {
            return Ok(Ok(()));
        }
        let ports = self
            .store
            .list_ports(&PortQuery {
                node_uuid: Some(node.uuid.clone()),
                ..Default::default()
            })
            .await?;
        let port_view = |p: &rivet_model::port::Port| {
            let v = json!({"uuid": p.uuid, "address": p.address, "pxe_enabled": p.pxe_enabled, "extra": p.extra});
            v.as_object().cloned().unwrap_or_default()
        };
        let mut target = Target {
            inventory: inventory.clone(),
            node: node_view(node),
            ports: ports.iter().map(port_view).collect(),
            ..Target::default()
        };
        let applied = match rules::apply_rules(&all, "main", &mut target) {
            Ok(a) => a,
            Err(e) => {
                return Ok(Err(format!(
                    "inspection rule {} failed node {}: {}",
                    e.rule,
                    node.ident(),
                    e.message
                )))
            }
        };
        for (level, msg) in &target.logs {
            match level.as_str() {
                "debug" => tracing::debug!(node = %node.uuid, "inspection rule: {msg}"),
                "warning" => tracing::warn!(node = %node.uuid, "inspection rule: {msg}"),
                "error" | "critical" => {
                    tracing::error!(node = %node.uuid, "inspection rule: {msg}")
                }
                _ => tracing::info!(node = %node.uuid, "inspection rule: {msg}"),
            }
        }
        let mut changed = node.clone();
        if let Err(e) = write_node(&mut changed, &target.node) {
            return Ok(Err(format!(
                "inspection rules left node {} invalid: {e}",
                node.ident()
            )));
        }
        for (old, view) in ports.iter().zip(&target.ports) {
            let pxe = view
                .get("pxe_enabled")
                .and_then(Value::as_bool)
                .unwrap_or(old.pxe_enabled);
            let extra = match view.get("extra") {
                Some(Value::Object(m)) => m.clone(),
                _ => Map::new(),
            };
            if pxe != old.pxe_enabled || extra != old.extra {
                let mut p = old.clone();
                p.pxe_enabled = pxe;
                p.extra = extra;
                self.store.update_port(&p).await?;
            }
        }
        *node = changed;
        if !applied.is_empty() {
            tracing::info!(node = %node.uuid, rules = ?applied, "inspection rules applied");
        }
        Ok(Ok(()))
    }
}
