//! `POST /v1/nodes` body: limits, strict parse, round trip.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rivet_protocol::api::NodeCreate;
use rivet_protocol::limits::{check_value, Limits};

fuzz_target!(|data: &[u8]| {
    if let Some(n) = rivet_fuzz::check_body::<NodeCreate>(data, &Limits::ADMIN) {
        // What the body carried is within the limits a stored node is held to.
        let v = serde_json::to_value(&n).expect("to value");
        check_value(&v, &Limits::ADMIN).expect("a parsed body passes check_value");
    }
});
