//! Per-node download tokens: HMAC-SHA-256 under the cache's own key of (node, the
//! `write_image` command, image), so a token is good for one node's one deploy step and
//! image only, and rivetd stores none of them (it recomputes the one it expects).

use hmac::{KeyInit, Mac};

type HmacSha256 = hmac::Hmac<sha2_hmac::Sha256>;

/// HMAC-SHA-256 (RFC 2104) over `msg` with `key`.
fn mac(key: &[u8], msg: &[u8]) -> HmacSha256 {
    // HMAC takes a key of any length: this cannot fail.
    let mut m = <HmacSha256 as KeyInit>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of every length"));
    m.update(msg);
    m
}

fn message(node: &str, command: &str, name: &str) -> String {
    format!("{node}\n{command}\n{name}")
}

/// The token of `node`'s command `command` reading image `name` (hex).
pub fn token(key: &[u8], node: &str, command: &str, name: &str) -> String {
    let tag = mac(key, message(node, command, name).as_bytes())
        .finalize()
        .into_bytes();
    tag.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `presented` (hex, as [`token`] writes it) is the token of `node`'s command
/// `command` reading image `name`; compared in constant time by the `hmac` crate.
pub fn valid(key: &[u8], node: &str, command: &str, name: &str, presented: &str) -> bool {
    let Some(bytes) = from_hex(presented) else {
        return false;
    };
    mac(key, message(node, command, name).as_bytes())
        .verify_slice(&bytes)
        .is_ok()
}

fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc4231_case_2() {
        let tag = mac(b"Jefe", b"what do ya want for nothing?")
            .finalize()
            .into_bytes();
        let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn tokens_differ_per_node_command_and_image() {
        let k = [7u8; 32];
        let t = token(&k, "n1", "c1", "sha256-aa");
        assert!(valid(&k, "n1", "c1", "sha256-aa", &t));
        assert!(!valid(&k, "n2", "c1", "sha256-aa", &t));
        assert!(!valid(&k, "n1", "c2", "sha256-aa", &t));
        assert!(!valid(&k, "n1", "c1", "sha256-bb", &t));
        assert!(!valid(&[8u8; 32], "n1", "c1", "sha256-aa", &t));
        // Not hex, a truncated tag, an odd length: refused, not a panic.
        assert!(!valid(&k, "n1", "c1", "sha256-aa", "zz"));
        assert!(!valid(&k, "n1", "c1", "sha256-aa", &t[..62]));
        assert!(!valid(&k, "n1", "c1", "sha256-aa", &t[..63]));
    }
}
