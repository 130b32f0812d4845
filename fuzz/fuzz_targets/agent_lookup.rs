//! `POST /agent/v1/lookup` body (unauthenticated: the tightest limits), round trip; and the
//! lookup answer as the agent parses it.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rivet_protocol::agent::{LookupRequest, LookupResponse};
use rivet_protocol::limits::Limits;

fuzz_target!(|data: &[u8]| {
    if let Some(r) = rivet_fuzz::check_body::<LookupRequest>(data, &Limits::AGENT_LOOKUP) {
        assert!(r.macs.len() <= Limits::AGENT_LOOKUP.max_items);
    }
    // The agent reads the answer with plain serde: it must not panic, and must round-trip.
    if let Ok(resp) = serde_json::from_slice::<LookupResponse>(data) {
        let text = serde_json::to_vec(&resp).expect("serialize");
        let again: LookupResponse = serde_json::from_slice(&text).expect("re-parse");
        assert_eq!(again, resp);
    }
});
