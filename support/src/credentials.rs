//! Credentials in the config: argon2id hashes of admin passwords and API tokens (and the
//! legacy salted SHA-256 form older rivetd wrote, still verified), hex, and a comparison that
//! takes the same time whatever the bytes.

#[cfg(feature = "credentials")]
use sha2::{Digest, Sha256};

/// Hash a secret (an admin password or API token) for the config: argon2id with a random
/// salt, as a PHC string (`$argon2id$v=19$m=19456,t=2,p=1$…`), the parameters OWASP names
/// for argon2id. Slow on purpose; [`verify_secret`] callers cache successes.
#[cfg(feature = "credentials")]
pub fn hash_secret(secret: &str) -> Result<String, String> {
    use argon2::password_hash::{PasswordHasher, SaltString};
    use rand::RngCore;
    let mut salt = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut salt);
    let fail = |e: argon2::password_hash::Error| format!("argon2 could not hash the secret: {e}");
    let salt = SaltString::encode_b64(&salt).map_err(fail)?;
    argon2::Argon2::default()
        .hash_password(secret.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(fail)
}

/// The legacy form, `sha256$SALT$HEX`: still verified (configs written by older rivetd),
/// never written.
#[cfg(all(test, feature = "credentials"))]
fn legacy_sha256_hash(secret: &str, salt: &str) -> String {
    format!("sha256${salt}${}", salted_hex(salt, secret))
}

#[cfg(feature = "credentials")]
fn salted_hex(salt: &str, secret: &str) -> String {
    let mut h = Sha256::new();
    h.update(salt.as_bytes());
    h.update(b"$");
    h.update(secret.as_bytes());
    hex(&h.finalize())
}

/// Lower-case hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Check a secret against a hash from the config: argon2id (PHC string, what
/// [`hash_secret`] writes) or the legacy `sha256$SALT$HEX`, in constant time.
#[cfg(feature = "credentials")]
pub fn verify_secret(secret: &str, hash: &str) -> bool {
    if hash.starts_with("$argon2") {
        use argon2::password_hash::{PasswordHash, PasswordVerifier};
        return PasswordHash::new(hash).is_ok_and(|parsed| {
            argon2::Argon2::default()
                .verify_password(secret.as_bytes(), &parsed)
                .is_ok()
        });
    }
    let mut parts = hash.splitn(3, '$');
    let (Some("sha256"), Some(salt), Some(want)) = (parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    constant_time_eq(salted_hex(salt, secret).as_bytes(), want.as_bytes())
}

/// Compare without an early exit, so timing does not reveal the common prefix.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(all(test, feature = "credentials"))]
mod tests {
    use super::*;

    #[test]
    fn secret_hash_verifies() {
        let h = hash_secret("s3cret").expect("hash");
        assert!(h.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{h}");
        assert!(verify_secret("s3cret", &h));
        assert!(!verify_secret("s3cre", &h));
        assert_ne!(h, hash_secret("s3cret").expect("hash"), "salted");
        assert!(!verify_secret("s3cret", "md5$x$y"));
        assert!(!verify_secret("s3cret", "$argon2id$garbage"));
        // Hashes written by older rivetd still verify.
        let old = legacy_sha256_hash("s3cret", "NaCl");
        assert!(verify_secret("s3cret", &old));
        assert!(!verify_secret("s3cre", &old));
    }
}
