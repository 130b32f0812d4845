//! Node fields Ironic keeps on the node that Rivet stores beside it
//! ([`rivet_store::NodeManagement`]): `target_raid_config` and `raid_config` (1.12),
//! `boot_mode` and `secure_boot` (1.75), `console_enabled`. `render::node_full` holds their places (so `fields=`
//! and the version gates treat them as node fields); these functions put the stored values
//! in a node document and in `/states`.

use rivet_model::microversions as mv;
use rivet_store::NodeManagement;
use serde_json::{json, Map, Value};

/// `MINOR_75_NODE_BOOT_MODE`.
const BOOT_MODE_FIELDS_VERSION: (u32, u32) = (1, 75);

/// Set the stored values in `doc`, where its version shows them (keys already gated away
/// stay away).
pub(in crate::api) fn apply(doc: &mut Map<String, Value>, m: &NodeManagement) {
    for (k, v) in values(m) {
        if let Some(slot) = doc.get_mut(k) {
            *slot = v;
        }
    }
}

fn values(m: &NodeManagement) -> [(&'static str, Value); 5] {
    [
        ("console_enabled", json!(m.console_enabled)),
        ("target_raid_config", json!(m.target_raid_config)),
        ("raid_config", json!(m.raid_config)),
        ("boot_mode", json!(m.boot_mode)),
        ("secure_boot", json!(m.secure_boot)),
    ]
}

/// The fields `GET /v1/nodes/{node}/states` adds at `version` (Ironic's
/// `node_states_convert`: RAID from 1.12, boot mode from 1.75).
pub(in crate::api) fn states(
    states: &mut Map<String, Value>,
    m: &NodeManagement,
    version: (u32, u32),
) {
    for (k, v) in values(m) {
        let since = if k == "console_enabled" {
            (1, 1)
        } else if k.ends_with("raid_config") {
            mv::RAID
        } else {
            BOOT_MODE_FIELDS_VERSION
        };
        if version >= since {
            states.insert(k.to_string(), v);
        } else {
            states.remove(k);
        }
    }
}
