//! Checks shared by the fuzz targets: a body either parses under its limits and survives a
//! serialize → parse round trip unchanged, or is refused with a short message that names what
//! is wrong. Nothing may panic, recurse without bound, or take more than linear time.

use rivet_protocol::limits::{parse_strict, BodyError, Limits};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;

/// Longest error message any body may produce (a field path is cut to 200 characters, a key
/// to 255 bytes; serde may quote one string value).
pub const MAX_MESSAGE: usize = 16 << 10;

/// Parse `data` as `T` under `limits` and check the properties above.
pub fn check_body<T>(data: &[u8], limits: &Limits) -> Option<T>
where
    T: DeserializeOwned + Serialize + PartialEq + Debug,
{
    match parse_strict::<T>(data, limits) {
        Err(e) => {
            check_error(&e);
            None
        }
        Ok(v) => {
            let text = serde_json::to_vec(&v).expect("a parsed body serializes");
            let again: T = parse_strict(&text, limits).unwrap_or_else(|e| {
                panic!(
                    "re-parse of the serialized body failed: {e}\nbody: {}",
                    String::from_utf8_lossy(&text)
                )
            });
            assert_eq!(again, v, "round trip changed the body");
            Some(v)
        }
    }
}

/// An error renders, is not empty and is not unbounded.
pub fn check_error(e: &BodyError) {
    let m = e.to_string();
    assert!(!m.is_empty());
    assert!(m.len() <= MAX_MESSAGE, "error message of {} bytes", m.len());
}
