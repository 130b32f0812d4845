//! `node.network_data` (API 1.66) checked as Ironic's node schema checks it: `{}`, or a
//! Nova `network_data.json` document (Ironic's `network-data-schema.json`) with `links`,
//! `networks` and `services`, each entry carrying the keys its kind requires. The value
//! formats inside (MAC and IP address patterns) are not checked here.

use super::ApiError;
use serde_json::{Map, Value};

/// `links[].type` of a plain interface (`l2_link`); `bond` and `vlan` have their own keys.
const L2_TYPES: &[&str] = &[
    "bridge",
    "dvs",
    "hw_veb",
    "hyperv",
    "ovs",
    "tap",
    "vhostuser",
    "vif",
    "phy",
];

fn bad(what: String) -> ApiError {
    ApiError::bad_request(format!(
        "network_data is not a valid network_data.json document: {what}"
    ))
}

fn entries<'a>(nd: &'a Map<String, Value>, key: &str) -> Result<&'a Vec<Value>, ApiError> {
    match nd.get(key) {
        Some(Value::Array(a)) => Ok(a),
        Some(other) => Err(bad(format!("{key} must be a list, not {other}"))),
        None => Err(bad(format!(
            "{key} is missing (links, networks and services are required)"
        ))),
    }
}

fn require(entry: &Value, list: &str, i: usize, keys: &[&str]) -> Result<(), ApiError> {
    let Some(obj) = entry.as_object() else {
        return Err(bad(format!("{list}[{i}] must be an object, not {entry}")));
    };
    match keys.iter().find(|k| !obj.contains_key(**k)) {
        Some(k) => Err(bad(format!("{list}[{i}] lacks {k}"))),
        None => Ok(()),
    }
}

/// `{}` or a document with the schema's required structure; a 400 naming what is wrong.
pub fn check(nd: &Map<String, Value>) -> Result<(), ApiError> {
    if nd.is_empty() {
        return Ok(());
    }
    for (i, link) in entries(nd, "links")?.iter().enumerate() {
        require(link, "links", i, &["id", "type"])?;
        let kind = link["type"].as_str().unwrap_or("");
        let keys: &[&str] = match kind {
            "bond" => &["ethernet_mac_address", "bond_mode", "bond_links"],
            "vlan" => &["vlan_mac_address", "vlan_link", "vlan_id"],
            k if L2_TYPES.contains(&k) => &["ethernet_mac_address"],
            other => {
                return Err(bad(format!(
                    "links[{i}].type {other:?} is not bond, vlan or one of {}",
                    L2_TYPES.join(", ")
                )))
            }
        };
        require(link, "links", i, keys)?;
    }
    for (i, net) in entries(nd, "networks")?.iter().enumerate() {
        require(net, "networks", i, &["id", "link", "network_id", "type"])?;
        let kind = net["type"].as_str().unwrap_or("");
        if !(kind.starts_with("ipv4") || kind.starts_with("ipv6")) {
            return Err(bad(format!(
                "networks[{i}].type {kind:?} is not an ipv4 or ipv6 network type"
            )));
        }
    }
    for (i, service) in entries(nd, "services")?.iter().enumerate() {
        require(service, "services", i, &["address", "type"])?;
        if service["type"] != "dns" {
            return Err(bad(format!("services[{i}].type must be dns")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn ironic_structure() {
        assert!(check(&Map::new()).is_ok());
        let good = json!({
            "links": [{"id": "eth0", "type": "phy", "ethernet_mac_address": "52:54:00:12:34:56"},
                      {"id": "v", "type": "vlan", "vlan_mac_address": "52:54:00:12:34:56",
                       "vlan_link": "eth0", "vlan_id": 10}],
            "networks": [{"id": "n", "link": "eth0", "network_id": "x", "type": "ipv4_dhcp"}],
            "services": [{"type": "dns", "address": "10.0.0.1"}],
        });
        assert!(check(&map(good)).is_ok());
        for (doc, needle) in [
            (json!({"links": []}), "networks is missing"),
            (
                json!({"links": [{"id": "e", "type": "phy"}], "networks": [], "services": []}),
                "lacks ethernet_mac_address",
            ),
            (
                json!({"links": [{"id": "e", "type": "wifi"}], "networks": [], "services": []}),
                "wifi",
            ),
            (
                json!({"links": [], "networks": [{"id": "n"}], "services": []}),
                "lacks link",
            ),
            (
                json!({"links": [], "networks": [], "services": [{"type": "ntp", "address": "a"}]}),
                "must be dns",
            ),
            (
                json!({"links": {}, "networks": [], "services": []}),
                "must be a list",
            ),
        ] {
            let e = check(&map(doc)).expect_err(needle);
            assert!(e.message.contains(needle), "{}", e.message);
        }
    }
}
