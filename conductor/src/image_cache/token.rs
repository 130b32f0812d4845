//! Per-node download tokens: HMAC-SHA-256 under the cache's own key of (node, the
//! `write_image` command, image), so a token is good for one node's one deploy step and
//! image only, and rivetd stores none of them (it recomputes the one it expects).

use sha2::{Digest, Sha256};

/// HMAC-SHA-256 (RFC 2104) over `msg` with `key` (sha2 is already in the tree; the hmac
/// crate in the lock file is built against another digest version).
pub fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    inner.update(msg);
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// The token of `node`'s command `command` reading image `name` (hex).
pub fn token(key: &[u8], node: &str, command: &str, name: &str) -> String {
    let mac = hmac_sha256(key, format!("{node}\n{command}\n{name}").as_bytes());
    mac.iter().map(|b| format!("{b:02x}")).collect()
}

/// Equal, in time that does not depend on where they differ.
pub fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc4231_case_2() {
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn tokens_differ_per_node_command_and_image() {
        let k = [7u8; 32];
        let t = token(&k, "n1", "c1", "sha256-aa");
        assert!(same(&t, &token(&k, "n1", "c1", "sha256-aa")));
        assert!(!same(&t, &token(&k, "n2", "c1", "sha256-aa")));
        assert!(!same(&t, &token(&k, "n1", "c2", "sha256-aa")));
        assert!(!same(&t, &token(&k, "n1", "c1", "sha256-bb")));
        assert!(!same(&t, &token(&[8u8; 32], "n1", "c1", "sha256-aa")));
    }
}
