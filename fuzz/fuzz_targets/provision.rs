//! `PUT /v1/nodes/{id}/states/provision` body: limits (at most 200 clean steps), round trip.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rivet_protocol::api::ProvisionRequest;
use rivet_protocol::limits::{Limits, MAX_CLEAN_STEPS};

fuzz_target!(|data: &[u8]| {
    if let Some(p) = rivet_fuzz::check_body::<ProvisionRequest>(data, &Limits::ADMIN) {
        assert!(p.clean_steps.map_or(0, |s| s.len()) <= MAX_CLEAN_STEPS);
    }
});
