//! `PUT /v1/nodes/{id}/states/power` body: limits, round trip.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rivet_protocol::api::PowerRequest;
use rivet_protocol::limits::Limits;

fuzz_target!(|data: &[u8]| {
    rivet_fuzz::check_body::<PowerRequest>(data, &Limits::ADMIN);
});
