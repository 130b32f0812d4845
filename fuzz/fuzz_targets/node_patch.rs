//! `PATCH /v1/nodes/{id}` body: the operations parse under the limits, then apply twice to a
//! node document (as two requests would). An accepted result must keep the node's fields, stay
//! within the limits and survive the store's JSON text round trip.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rivet_protocol::api::PatchOp;
use rivet_protocol::limits::{check_value, Limits};
use rivet_protocol::patch::NODE_PATCHABLE;
use serde_json::{json, Value};

fuzz_target!(|data: &[u8]| {
    let Some(ops) = rivet_fuzz::check_body::<Vec<PatchOp>>(data, &Limits::ADMIN) else {
        return;
    };
    let mut doc = json!({
        "name": "n1",
        "driver": "fake-hardware",
        "driver_info": {"redfish_address": "https://10.0.0.1", "redfish_username": "admin"},
        "properties": {"cpus": 8, "memory_mb": 4096, "capabilities": "boot_mode:uefi"},
        "instance_info": {},
        "instance_uuid": null,
        "extra": {"rack": "r1", "tags": ["a", "b"]},
        "resource_class": "baremetal",
        "automated_clean": null,
        "inspect_interface": null,
    });
    // Every patchable field is in the document (the interface fields are null until set),
    // so the field-set check below compares like with like.
    if let Some(obj) = doc.as_object_mut() {
        for key in NODE_PATCHABLE {
            obj.entry(*key).or_insert(Value::Null);
        }
    }
    for _ in 0..2 {
        let mut next = doc.clone();
        if rivet_protocol::patch::apply(&mut next, &ops, NODE_PATCHABLE).is_err() {
            return;
        }
        if let Err(e) = check_value(&next, &Limits::ADMIN) {
            rivet_fuzz::check_error(&e);
            return;
        }
        let keys: Vec<&String> = next.as_object().expect("still an object").keys().collect();
        assert_eq!(
            keys.len(),
            NODE_PATCHABLE.len(),
            "patch changed the set of fields: {keys:?}"
        );
        // The store writes each field as JSON text and reads it back.
        let text = next.to_string();
        let back: Value = serde_json::from_str(&text).expect("a patched node reads back");
        assert_eq!(back, next);
        doc = next;
    }
});
