//! The configdrive in every form IPA accepts, decoded to the ISO 9660 image that goes into
//! the `config-2` partition.
//!
//! Forms (Ironic's and IPA's): the inline string is base64 of gzip of the ISO (base64 of the
//! plain ISO is taken too); a URL's body is that same base64 text (Ironic's stored form, what
//! the conductor uploads to swift or its HTTP server), a gzipped ISO, or the ISO itself. The
//! JSON form never reaches the agent: rivetd builds the ISO from it.
//!
//! Pure functions over bytes, bounded: nothing here reads more than
//! [`MAX_CONFIGDRIVE_BYTES`] of output or allocates in proportion to anything but its input,
//! so a hostile body cannot exhaust the ramdisk (fuzzed by `fuzz/fuzz_targets/configdrive.rs`).

use rivet_protocol::deploy::MAX_CONFIGDRIVE_BYTES;
use std::io::{Cursor, Read};

/// Largest encoded body accepted: base64 of a gzip that does not compress (4/3 of the limit,
/// with room for line breaks).
pub const MAX_ENCODED_BYTES: u64 = MAX_CONFIGDRIVE_BYTES / 3 * 4 + (4 << 20);

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Whether `data` is an ISO 9660 image (its primary volume descriptor at 32 KiB).
pub fn is_iso(data: &[u8]) -> bool {
    data.len() >= 0x8006 && &data[0x8001..0x8006] == b"CD001"
}

/// Decode a configdrive body (inline string or a URL's body) to the ISO's bytes.
pub fn decode(body: &[u8]) -> Result<Vec<u8>, String> {
    if body.len() as u64 > MAX_ENCODED_BYTES {
        return Err(format!(
            "the configdrive is {} bytes encoded, more than the {} MiB a configdrive may be",
            body.len(),
            MAX_CONFIGDRIVE_BYTES >> 20
        ));
    }
    if is_iso(body) {
        return Ok(body.to_vec());
    }
    if body.starts_with(&GZIP_MAGIC) {
        return gunzip_iso(body);
    }
    // Base64 text: Ironic's stored form. Line breaks and spaces are allowed (the inline form
    // often arrives wrapped at 76 columns).
    use base64::Engine;
    let clean: Vec<u8> = body
        .iter()
        .copied()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    if clean.is_empty() {
        return Err("the configdrive is empty".into());
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&clean)
        .map_err(|e| {
            format!("the configdrive is neither an ISO 9660 image, gzip, nor base64 of them: {e}")
        })?;
    if bytes.starts_with(&GZIP_MAGIC) {
        gunzip_iso(&bytes)
    } else if is_iso(&bytes) {
        Ok(bytes)
    } else {
        Err("the configdrive's base64 decodes to neither gzip nor an ISO 9660 image".into())
    }
}

/// Every gzip member, to at most the size limit; the result must be an ISO.
fn gunzip_iso(gz: &[u8]) -> Result<Vec<u8>, String> {
    let mut iso = Vec::new();
    flate2::read::MultiGzDecoder::new(Cursor::new(gz))
        .take(MAX_CONFIGDRIVE_BYTES + 1)
        .read_to_end(&mut iso)
        .map_err(|e| format!("the configdrive's gzip does not decode: {e}"))?;
    if iso.len() as u64 > MAX_CONFIGDRIVE_BYTES {
        return Err(format!(
            "the configdrive is larger than {} MiB once decompressed",
            MAX_CONFIGDRIVE_BYTES >> 20
        ));
    }
    if !is_iso(&iso) {
        return Err("the configdrive's gzip holds no ISO 9660 image".into());
    }
    Ok(iso)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use base64::Engine;
    use std::io::Write;

    fn iso() -> Vec<u8> {
        let mut v = vec![0u8; 0x9000];
        v[0x8001..0x8006].copy_from_slice(b"CD001");
        v[0x8028..0x8030].copy_from_slice(b"config-2");
        v
    }

    fn gz(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn every_form_decodes_to_the_iso() {
        let b64 = |d: &[u8]| base64::engine::general_purpose::STANDARD.encode(d);
        let want = iso();
        assert_eq!(decode(&want).unwrap(), want, "plain ISO");
        assert_eq!(decode(&gz(&want)).unwrap(), want, "gzipped ISO");
        assert_eq!(
            decode(b64(&gz(&want)).as_bytes()).unwrap(),
            want,
            "Ironic's stored form"
        );
        assert_eq!(decode(b64(&want).as_bytes()).unwrap(), want, "base64 ISO");
        // Wrapped at 76 columns with a trailing newline, as `base64` writes it.
        let wrapped: String = b64(&gz(&want))
            .as_bytes()
            .chunks(76)
            .map(|c| format!("{}\n", String::from_utf8_lossy(c)))
            .collect();
        assert_eq!(decode(wrapped.as_bytes()).unwrap(), want);
    }

    #[test]
    fn bad_bodies_are_refused_with_a_reason() {
        assert!(decode(b"").unwrap_err().contains("empty"));
        assert!(decode(b"not base64 !!").unwrap_err().contains("neither"));
        let b64 = base64::engine::general_purpose::STANDARD.encode(b"hello");
        assert!(decode(b64.as_bytes()).unwrap_err().contains("neither gzip"));
        assert!(decode(&gz(b"hello")).unwrap_err().contains("no ISO"));
        let mut cut = gz(&iso());
        cut.truncate(cut.len() / 2);
        assert!(decode(&cut).unwrap_err().contains("gzip"));
    }
}
