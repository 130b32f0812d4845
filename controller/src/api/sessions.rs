//! Browser sessions: the web UI's credential. A user of `[auth] users` logs in once at
//! `/ui/login` and gets a random session id in an `HttpOnly; SameSite=Strict` cookie (plus
//! `Secure` over TLS); the API's auth layer accepts that cookie as an alternative to a token
//! or basic credentials. A cookie travels with every request the browser makes, so a
//! cookie-authenticated change (anything but GET/HEAD) also needs the session's CSRF value in
//! the [`CSRF_HEADER`] header: a page on another origin can neither read that value nor set
//! a custom header without a CORS preflight rivetd never grants.
//!
//! Sessions live in this process's memory, keyed by the SHA-256 of the id (the id itself is
//! kept nowhere): a restart logs everyone out, and a session is valid only on the rivetd that
//! issued it. Bounded: at most [`MAX_SESSIONS`], the oldest dropped first.

use axum::http::HeaderMap;
use rivet_model::config::Role;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The session cookie's name.
pub const COOKIE: &str = "rivet_session";
/// The header a cookie-authenticated change must carry, with the session's CSRF value.
pub const CSRF_HEADER: &str = "x-rivet-csrf";
/// How long a session lasts from its log-in (a working day); then the user logs in again.
pub const TTL: Duration = Duration::from_secs(8 * 3600);
/// Most sessions kept at once.
pub const MAX_SESSIONS: usize = 10_000;

/// Who a session belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionUser {
    /// The `[auth] users` name.
    pub name: String,
    /// Its role (as configured when it logged in).
    pub role: Role,
    /// The value [`CSRF_HEADER`] must carry.
    pub csrf: String,
}

struct Entry {
    user: SessionUser,
    expires: Instant,
}

/// The sessions of this process.
#[derive(Default)]
pub struct Sessions {
    map: Mutex<HashMap<[u8; 32], Entry>>,
}

/// 256 bits from the OS's CSPRNG, as hex (two v4 UUIDs carry 244 random bits; the rest
/// are their fixed version bits).
fn random_hex() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

fn key(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

impl Sessions {
    /// A new session for `name` with `role`; returns the id to put in the cookie.
    pub fn create(&self, name: &str, role: Role) -> String {
        let id = random_hex();
        let user = SessionUser {
            name: name.to_string(),
            role,
            csrf: random_hex(),
        };
        let now = Instant::now();
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_SESSIONS {
            map.retain(|_, e| e.expires > now);
        }
        while map.len() >= MAX_SESSIONS {
            // Still full of live sessions: the one closest to expiry goes.
            let Some(oldest) = map.iter().min_by_key(|(_, e)| e.expires).map(|(k, _)| *k) else {
                break;
            };
            map.remove(&oldest);
        }
        map.insert(
            key(&id),
            Entry {
                user,
                expires: now + TTL,
            },
        );
        id
    }

    /// The user of session `id`, while it lasts.
    pub fn get(&self, id: &str) -> Option<SessionUser> {
        let k = key(id);
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        match map.get(&k) {
            Some(e) if e.expires > Instant::now() => Some(e.user.clone()),
            Some(_) => {
                map.remove(&k);
                None
            }
            None => None,
        }
    }

    /// End session `id` (log-out).
    pub fn remove(&self, id: &str) {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key(id));
    }

    /// Sessions held now (tests).
    pub fn count(&self) -> usize {
        self.map.lock().map(|m| m.len()).unwrap_or(0)
    }
}

/// The session id a request's `Cookie` headers carry, if any.
pub fn cookie_value(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.trim())
        .filter(|v| !v.is_empty())
}

/// The `Set-Cookie` value that hands session `id` to the browser: script cannot read it,
/// other sites' pages never send it, and over TLS it never travels in clear.
pub fn set_cookie(id: &str, secure: bool) -> String {
    format!(
        "{COOKIE}={id}; Path=/; Max-Age={}; HttpOnly; SameSite=Strict{}",
        TTL.as_secs(),
        if secure { "; Secure" } else { "" }
    )
}

/// The `Set-Cookie` value that makes the browser forget its session.
pub fn clear_cookie(secure: bool) -> String {
    format!(
        "{COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict{}",
        if secure { "; Secure" } else { "" }
    )
}

/// Whether `presented` equals `expected`, in time independent of where they differ.
pub fn same_secret(presented: &str, expected: &str) -> bool {
    let (a, b) = (presented.as_bytes(), expected.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn a_session_is_found_by_its_id_until_it_is_removed() {
        let s = Sessions::default();
        let id = s.create("ada", Role::Reader);
        assert_eq!(id.len(), 64);
        let user = s.get(&id).expect("session");
        assert_eq!((user.name.as_str(), user.role), ("ada", Role::Reader));
        assert_ne!(user.csrf, id);
        assert!(s.get("nope").is_none());
        s.remove(&id);
        assert!(s.get(&id).is_none());
    }

    #[test]
    fn cookie_flags_and_parsing() {
        let c = set_cookie("abc", false);
        assert!(c.contains("HttpOnly") && c.contains("SameSite=Strict") && c.contains("Max-Age="));
        assert!(!c.contains("Secure"));
        assert!(set_cookie("abc", true).ends_with("; Secure"));
        assert!(clear_cookie(true).contains("Max-Age=0"));
        let mut h = HeaderMap::new();
        h.append(
            "cookie",
            HeaderValue::from_static("a=1; rivet_session=xyz; b=2"),
        );
        assert_eq!(cookie_value(&h), Some("xyz"));
        let mut h = HeaderMap::new();
        h.append("cookie", HeaderValue::from_static("rivet_sessionx=1"));
        assert_eq!(cookie_value(&h), None);
    }

    #[test]
    fn secrets_compare_exactly() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abd", "abc"));
        assert!(!same_secret("ab", "abc"));
    }

    #[test]
    fn the_table_is_bounded() {
        let s = Sessions::default();
        for _ in 0..MAX_SESSIONS + 5 {
            s.create("u", Role::Reader);
        }
        assert_eq!(s.count(), MAX_SESSIONS);
    }
}
