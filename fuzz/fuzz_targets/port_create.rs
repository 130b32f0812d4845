//! `POST /v1/ports` body: limits, round trip.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rivet_protocol::api::PortCreate;
use rivet_protocol::limits::Limits;

fuzz_target!(|data: &[u8]| {
    rivet_fuzz::check_body::<PortCreate>(data, &Limits::ADMIN);
});
