//! `POST /agent/v1/heartbeat/{node}` body, including command results whose `result` carries an
//! inventory or a step list, under the heartbeat limits; and the heartbeat answer (a command)
//! as the agent parses it.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rivet_protocol::agent::{
    CleanStepsResult, HeartbeatRequest, HeartbeatResponse, InventoryResult,
};
use rivet_protocol::limits::Limits;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;

/// The controller reads a result's `result` as a typed value after the body was accepted.
fn typed_round_trip<T: DeserializeOwned + Serialize + PartialEq + Debug>(v: &serde_json::Value) {
    if let Ok(t) = serde_json::from_value::<T>(v.clone()) {
        let back = serde_json::to_value(&t).expect("to value");
        let again: T = serde_json::from_value(back).expect("re-parse");
        assert_eq!(again, t);
    }
}

fuzz_target!(|data: &[u8]| {
    if let Some(hb) = rivet_fuzz::check_body::<HeartbeatRequest>(data, &Limits::AGENT_HEARTBEAT) {
        for r in &hb.results {
            typed_round_trip::<InventoryResult>(&r.result);
            typed_round_trip::<CleanStepsResult>(&r.result);
        }
    }
    if let Ok(resp) = serde_json::from_slice::<HeartbeatResponse>(data) {
        let text = serde_json::to_vec(&resp).expect("serialize");
        let again: HeartbeatResponse = serde_json::from_slice(&text).expect("re-parse");
        assert_eq!(again, resp);
        if let Some(c) = &resp.command {
            assert!(!c.kind.name().is_empty());
        }
    }
});
