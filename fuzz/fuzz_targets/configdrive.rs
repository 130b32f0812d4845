//! A configdrive body from arbitrary bytes (the inline `configdrive` string or a URL's body):
//! `deploy::configdrive::decode`. Properties: nothing panics or allocates past the limit;
//! what is accepted is an ISO 9660 image of at most `MAX_CONFIGDRIVE_BYTES`, and decodes the
//! same from each form Ironic sends (gzip, base64 of gzip, base64 wrapped at 76 columns);
//! a refusal is a short message.
#![no_main]
use base64::Engine;
use libfuzzer_sys::fuzz_target;
use rivet_hardware_managers::deploy::configdrive::{decode, is_iso};
use rivet_protocol::deploy::MAX_CONFIGDRIVE_BYTES;
use std::io::Write;

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).expect("gzip");
    e.finish().expect("gzip")
}

fuzz_target!(|data: &[u8]| {
    match decode(data) {
        Ok(iso) => {
            assert!(is_iso(&iso), "accepted something that is not an ISO 9660 image");
            assert!(iso.len() as u64 <= MAX_CONFIGDRIVE_BYTES, "{} bytes", iso.len());
            // Round trip through the other forms (kept to small ISOs: a gzip bomb may
            // legitimately expand to the 64 MiB limit).
            if iso.len() <= 1 << 20 {
                assert_eq!(decode(&iso).as_ref(), Ok(&iso), "the plain ISO");
                let gz = gzip(&iso);
                assert_eq!(decode(&gz).as_ref(), Ok(&iso), "gzip");
                let b64 = base64::engine::general_purpose::STANDARD.encode(&gz);
                assert_eq!(decode(b64.as_bytes()).as_ref(), Ok(&iso), "base64 of gzip");
                let wrapped: Vec<u8> = b64
                    .as_bytes()
                    .chunks(76)
                    .flat_map(|l| l.iter().copied().chain([b'\n']))
                    .collect();
                assert_eq!(decode(&wrapped).as_ref(), Ok(&iso), "wrapped base64");
            }
        }
        Err(m) => {
            assert!(!m.is_empty());
            assert!(m.len() <= 512, "error message of {} bytes: {m}", m.len());
        }
    }
});
