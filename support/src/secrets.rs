//! Secrets at rest: the BMC passwords (and other secret keys) in a node's `driver_info` are
//! sealed with AES-256-GCM before the store writes them and opened when it reads them, so
//! the database file, its WAL and a PostgreSQL dump never hold them in clear. Only the store
//! backends call this module; everything above them sees clear values in memory, and the API
//! masks them as before.
//!
//! Which keys are secret is [`is_secret_key`], the same list the API masks.
//! A sealed value is the string `rivet-sealed:v2:<key id>:<base64url(ciphertext ‖ tag)>`:
//! the key id (8 hex characters, a fingerprint of the key) says which key sealed it, so a
//! rotation can tell old from new and a wrong key is named in the error. The node UUID and
//! the field's path (`driver_info.ipmi_password`) are the associated data: a sealed value
//! copied to another node or field does not open.
//!
//! v2 seals with AES-256-GCM-SIV (RFC 8452, the `aes-gcm-siv` crate), whose security does
//! not rest on unique nonces: the nonce is fixed per field (derived from the associated
//! data), so rewriting an unchanged node writes the same bytes and a repeated nonce reveals
//! at most that a field's value did not change. v1 values (a hand-built SIV: AES-256-GCM
//! with an HMAC-derived nonce, written by older rivetd) still open, and `rivetd secrets
//! rotate` rewrites them as v2. The plaintext (the value's JSON text) is padded with spaces
//! to a multiple of 32 bytes so the ciphertext does not reveal a password's exact length.
//!
//! The key: 32 bytes written as 64 hex characters, in a file of mode 0600 (`[secrets]
//! key_file`, made by `rivetd secrets init-key PATH`) or in `RIVET_SECRETS_KEY`. Without
//! either, a SQLite store gets a key file generated next to the database on first start; a
//! PostgreSQL store, shared by several controllers that must all hold the same key, refuses
//! to start. `[secrets] previous_key_file` is read but never written with: it lets rivetd
//! run during a rotation (`rivetd secrets rotate`).

pub use rivet_model::config::SecretsConfig;

use base64::Engine;
use ring::{aead, digest, hkdf, rand::SecureRandom};
use serde_json::{Map, Value};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What every sealed value this build writes starts with.
pub const SEALED_PREFIX: &str = "rivet-sealed:v2:";

/// Values written by older rivetd (AES-256-GCM with a synthetic nonce): read, never written.
const SEALED_PREFIX_V1: &str = "rivet-sealed:v1:";

/// What every sealed value, of any version, starts with.
const SEALED_ANY: &str = "rivet-sealed:";

/// Environment variable holding the key itself (64 hex characters).
pub const KEY_ENV: &str = "RIVET_SECRETS_KEY";

/// Plaintexts are padded to a multiple of this many bytes.
const PAD: usize = 32;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// Keys of `driver_info` whose values are secrets: sealed at rest, masked in every output and
/// log line.
pub fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "password",
        "passwd",
        "secret",
        "token",
        "private_key",
        "credential",
    ]
    .iter()
    .any(|s| k.contains(s))
}

/// Sealing and key failures. Messages never carry a secret or a key.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    /// The value was sealed with a key rivetd does not hold.
    #[error(
        "{field} of node {node} was sealed with key {sealed}, the configured key is {configured}; \
         set [secrets] previous_key_file to the key {sealed} or run rivetd secrets rotate"
    )]
    WrongKey {
        /// `driver_info.ipmi_password`.
        field: String,
        /// Node UUID.
        node: String,
        /// Key id in the value.
        sealed: String,
        /// Key id rivetd writes with.
        configured: String,
    },
    /// The right key, but the value does not authenticate.
    #[error(
        "{field} of node {node} does not open with key {key}: the sealed value was altered or \
         copied from another node or field; set the password again"
    )]
    Tampered {
        /// `driver_info.ipmi_password`.
        field: String,
        /// Node UUID.
        node: String,
        /// Key id.
        key: String,
    },
    /// Not a `rivet-sealed:v1:…` value this build can parse.
    #[error("{field} of node {node} is not a valid sealed value; set the password again")]
    Malformed {
        /// `driver_info.ipmi_password`.
        field: String,
        /// Node UUID.
        node: String,
    },
    /// A key file or variable could not be used.
    #[error("secrets key {origin}: {why}")]
    Key {
        /// File path or variable name.
        origin: String,
        /// What is wrong and what to do.
        why: String,
    },
    /// No key configured where one is required.
    #[error("{0}")]
    NoKey(String),
    /// The operating system's random source failed.
    #[error("cannot get random bytes for a secrets key")]
    Random,
}

/// A 32-byte master key. Neither `Debug` nor any message shows its bytes.
pub struct Key {
    bytes: [u8; 32],
    id: String,
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.id)
    }
}

impl Key {
    fn from_bytes(bytes: [u8; 32]) -> Key {
        let d = digest::digest(
            &digest::SHA256,
            &[b"rivet-secrets key id\0" as &[u8], &bytes].concat(),
        );
        let id = crate::credentials::hex(&d.as_ref()[..4]);
        Key { bytes, id }
    }

    /// A new random key.
    pub fn generate() -> Result<Key, SecretsError> {
        let mut bytes = [0u8; 32];
        ring::rand::SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| SecretsError::Random)?;
        Ok(Key::from_bytes(bytes))
    }

    /// Parse the text form (64 hex characters, surrounding whitespace ignored). `origin`
    /// names where it came from, for the error.
    pub fn from_text(text: &str, origin: &str) -> Result<Key, SecretsError> {
        let t = text.trim();
        let bad = || {
            SecretsError::Key {
            origin: origin.to_string(),
            why: "is not 64 hex characters (32 bytes); make a key with `rivetd secrets init-key PATH` \
                  or `openssl rand -hex 32`"
                .into(),
        }
        };
        if t.len() != 64 || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let mut bytes = [0u8; 32];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = u8::from_str_radix(&t[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Key::from_bytes(bytes))
    }

    /// Read a key file, refusing one that its group or others may read or write.
    pub fn load(path: &Path) -> Result<Key, SecretsError> {
        use std::os::unix::fs::PermissionsExt;
        let origin = format!("file {}", path.display());
        let err = |why: String| SecretsError::Key {
            origin: origin.clone(),
            why,
        };
        let meta = std::fs::metadata(path).map_err(|e| err(format!("cannot be read: {e}")))?;
        if !meta.is_file() {
            return Err(err("is not a regular file".into()));
        }
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(err(format!(
                "has mode {mode:04o}: its group or others may read it; run chmod 600 {}",
                path.display()
            )));
        }
        let text =
            std::fs::read_to_string(path).map_err(|e| err(format!("cannot be read: {e}")))?;
        Key::from_text(&text, &origin)
    }

    /// Write this key to a new file of mode 0600 (never over an existing file).
    pub fn write_new(&self, path: &Path) -> Result<(), SecretsError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let err = |e: std::io::Error| SecretsError::Key {
            origin: format!("file {}", path.display()),
            why: format!("cannot be created: {e}"),
        };
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(err)?;
        f.write_all(format!("{}\n", crate::credentials::hex(&self.bytes)).as_bytes())
            .and_then(|_| f.sync_all())
            .map_err(err)
    }

    /// The key's fingerprint, as it appears in sealed values.
    pub fn id(&self) -> &str {
        &self.id
    }
}

/// One key, ready to seal (v2) and open (v2, and v1 for values older rivetd wrote).
struct Sealer {
    id: String,
    siv: aes_gcm_siv::Aes256GcmSiv,
    aead: aead::LessSafeKey,
    /// v1's nonce key: only tests still write v1 values.
    #[cfg(test)]
    nonce_key: ring::hmac::Key,
}

/// The format of a sealed value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// AES-256-GCM with an HMAC-derived nonce (older rivetd).
    V1,
    /// AES-256-GCM-SIV.
    V2,
}

/// `hkdf::KeyType` for a 32-byte output.
struct Len32;

impl hkdf::KeyType for Len32 {
    fn len(&self) -> usize {
        32
    }
}

impl Sealer {
    fn new(key: &Key) -> Sealer {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, b"rivet-secrets v1").extract(&key.bytes);
        // Each expansion asks for 32 bytes of HKDF-SHA256's 255 × 32-byte maximum: it cannot
        // fail.
        let derive = |label: &[u8]| {
            let mut out = [0u8; 32];
            prk.expand(&[label], Len32)
                .and_then(|o| o.fill(&mut out))
                .unwrap_or_else(|_| unreachable!("HKDF-SHA256 gives 32 bytes"));
            out
        };
        let (enc, siv) = (derive(b"aead"), derive(b"aes-gcm-siv"));
        #[cfg(test)]
        let mac = derive(b"nonce");
        let unbound = aead::UnboundKey::new(&aead::AES_256_GCM, &enc)
            .unwrap_or_else(|_| unreachable!("AES-256 takes a 32-byte key"));
        use aes_gcm_siv::KeyInit;
        Sealer {
            id: key.id.clone(),
            siv: aes_gcm_siv::Aes256GcmSiv::new(&siv.into()),
            aead: aead::LessSafeKey::new(unbound),
            #[cfg(test)]
            nonce_key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &mac),
        }
    }

    /// The plaintext of `value`: its JSON text padded with spaces (JSON whitespace: the
    /// padded text parses to the same value).
    fn padded(value: &Value) -> Vec<u8> {
        let mut plain = value.to_string().into_bytes();
        plain.resize(plain.len().div_ceil(PAD).max(1) * PAD, b' ');
        plain
    }

    /// The v2 nonce of a field: fixed per (node, field), so sealing is deterministic.
    fn siv_nonce(aad: &[u8]) -> aes_gcm_siv::Nonce {
        let d = digest::digest(&digest::SHA256, aad);
        *aes_gcm_siv::Nonce::from_slice(&d.as_ref()[..12])
    }

    fn seal(&self, aad: &[u8], value: &Value) -> String {
        use aes_gcm_siv::aead::{Aead, Payload};
        let plain = Self::padded(value);
        let sealed = self
            .siv
            .encrypt(&Self::siv_nonce(aad), Payload { msg: &plain, aad })
            // Only inputs beyond 64 GiB fail.
            .unwrap_or_default();
        format!("{SEALED_PREFIX}{}:{}", self.id, B64.encode(sealed))
    }

    /// The v1 form, as older rivetd wrote it (tests make v1 values with it).
    #[cfg(test)]
    fn seal_v1(&self, aad: &[u8], value: &Value) -> String {
        let plain = Self::padded(value);
        let mut ctx = ring::hmac::Context::with_key(&self.nonce_key);
        ctx.update(&(aad.len() as u64).to_be_bytes());
        ctx.update(aad);
        ctx.update(&plain);
        let tag = ctx.sign();
        let mut nonce = [0u8; aead::NONCE_LEN];
        nonce.copy_from_slice(&tag.as_ref()[..aead::NONCE_LEN]);
        let mut out = nonce.to_vec();
        let mut body = plain;
        // Sealing fails only for inputs beyond 64 GiB.
        let _ = self.aead.seal_in_place_append_tag(
            aead::Nonce::assume_unique_for_key(nonce),
            aead::Aad::from(aad),
            &mut body,
        );
        out.extend_from_slice(&body);
        format!("{SEALED_PREFIX_V1}{}:{}", self.id, B64.encode(out))
    }

    fn open(&self, format: Format, aad: &[u8], b64: &str) -> Opened {
        let Ok(raw) = B64.decode(b64) else {
            return Opened::Malformed;
        };
        if format == Format::V2 {
            use aes_gcm_siv::aead::{Aead, Payload};
            return match self
                .siv
                .decrypt(&Self::siv_nonce(aad), Payload { msg: &raw, aad })
            {
                Ok(plain) => match serde_json::from_slice(&plain) {
                    Ok(v) => Opened::Value(v),
                    Err(_) => Opened::Malformed,
                },
                Err(_) if raw.len() < 16 => Opened::Malformed,
                Err(_) => Opened::Unauthentic,
            };
        }
        if raw.len() < aead::NONCE_LEN + aead::AES_256_GCM.tag_len() {
            return Opened::Malformed;
        }
        let (nonce, body) = raw.split_at(aead::NONCE_LEN);
        let Ok(nonce) = aead::Nonce::try_assume_unique_for_key(nonce) else {
            return Opened::Malformed;
        };
        let mut body = body.to_vec();
        match self
            .aead
            .open_in_place(nonce, aead::Aad::from(aad), &mut body)
        {
            Ok(plain) => match serde_json::from_slice(plain) {
                Ok(v) => Opened::Value(v),
                Err(_) => Opened::Malformed,
            },
            Err(_) => Opened::Unauthentic,
        }
    }
}

/// What opening a sealed payload gave.
enum Opened {
    Value(Value),
    /// Not base64 of nonce ‖ ciphertext ‖ tag, or not JSON inside.
    Malformed,
    /// The tag does not match: altered, or sealed for another node or field.
    Unauthentic,
}

/// The associated data of a sealed value: the node and the field.
fn aad(node: &str, field: &str) -> Vec<u8> {
    format!("{}:{node}:{field}", node.len()).into_bytes()
}

/// `(format, key id, payload)` of a sealed value.
fn split_sealed(s: &str) -> Option<(Format, &str, &str)> {
    let (format, rest) = match s.strip_prefix(SEALED_PREFIX) {
        Some(rest) => (Format::V2, rest),
        None => (Format::V1, s.strip_prefix(SEALED_PREFIX_V1)?),
    };
    let (id, payload) = rest.split_once(':')?;
    Some((format, id, payload))
}

/// Counts from a rotation (`rivetd secrets rotate`, run by the store layer).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RotateReport {
    /// Nodes read.
    pub nodes_checked: u64,
    /// Nodes written.
    pub nodes_changed: u64,
    /// Secret values sealed anew with the new key.
    pub fields_resealed: u64,
    /// Of those, how many were still in clear (written before sealing existed).
    pub fields_were_clear: u64,
}

enum Mode {
    Keyed {
        current: Box<Sealer>,
        previous: Vec<Sealer>,
    },
    /// Values cross unchanged (only a rotation, which handles sealed text itself).
    Passthrough,
}

/// The sealer the store backends hold: seals with the current key, opens with it or a
/// previous one.
pub struct Secrets {
    mode: Mode,
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.mode {
            Mode::Keyed { current, previous } => f
                .debug_struct("Secrets")
                .field("key", &current.id)
                .field(
                    "previous",
                    &previous.iter().map(|p| &p.id).collect::<Vec<_>>(),
                )
                .finish(),
            Mode::Passthrough => f.write_str("Secrets(passthrough)"),
        }
    }
}

impl Secrets {
    /// Seal with `current`; also open what `previous` keys sealed.
    pub fn new(current: &Key, previous: &[Key]) -> Secrets {
        Secrets {
            mode: Mode::Keyed {
                current: Box::new(Sealer::new(current)),
                previous: previous
                    .iter()
                    .filter(|k| k.id != current.id)
                    .map(Sealer::new)
                    .collect(),
            },
        }
    }

    /// A random key held only by the returned value: for tests and throwaway stores.
    /// What it seals cannot be read after it is dropped.
    pub fn ephemeral() -> Arc<Secrets> {
        // The OS random source failing is not something a test can recover from either.
        let key = Key::generate().unwrap_or_else(|e| panic!("{e}"));
        Arc::new(Secrets::new(&key, &[]))
    }

    /// Seals and opens nothing: sealed text crosses as it is (a rotation reads and writes
    /// it itself).
    pub fn passthrough() -> Secrets {
        Secrets {
            mode: Mode::Passthrough,
        }
    }

    /// Id of the key new values are sealed with.
    pub fn key_id(&self) -> Option<&str> {
        match &self.mode {
            Mode::Keyed { current, .. } => Some(&current.id),
            Mode::Passthrough => None,
        }
    }

    /// The secrets of a controller: the key from `RIVET_SECRETS_KEY`, `[secrets] key_file`,
    /// or (SQLite) the key file next to the database, made when `create` and the database
    /// holds no sealed values yet (`holds_sealed`: the store's answer for a database file).
    pub fn from_config(
        config: &SecretsConfig,
        db_url: &str,
        create: bool,
        holds_sealed: &dyn Fn(&Path) -> bool,
    ) -> Result<Secrets, SecretsError> {
        let current = match std::env::var(KEY_ENV) {
            Ok(text) if !text.trim().is_empty() => {
                let k = Key::from_text(&text, KEY_ENV)?;
                tracing::info!(key = k.id(), "secrets key from {KEY_ENV}");
                k
            }
            _ => match &config.key_file {
                Some(path) => {
                    let k = Key::load(path)?;
                    tracing::info!(key = k.id(), path = %path.display(), "secrets key file");
                    k
                }
                None => default_key(db_url, create, holds_sealed)?,
            },
        };
        let previous = match &config.previous_key_file {
            Some(path) => vec![Key::load(path)?],
            None => Vec::new(),
        };
        Ok(Secrets::new(&current, &previous))
    }

    /// `info` as the JSON text to store, its secrets sealed for node `uuid`.
    pub fn seal_info(&self, uuid: &str, info: &Map<String, Value>) -> String {
        match &self.mode {
            Mode::Keyed { current, .. } => {
                Value::Object(seal_map(current, uuid, "driver_info", info)).to_string()
            }
            Mode::Passthrough => Value::Object(info.clone()).to_string(),
        }
    }

    /// A node's `driver_info` (of node `uuid`) with its secrets opened in place (values
    /// still in clear, written before sealing existed, are kept). A passthrough instance
    /// leaves sealed text as it is (`rivetd secrets rotate` reads it raw).
    pub fn open_info(&self, uuid: &str, info: &mut Map<String, Value>) -> Result<(), SecretsError> {
        if let Mode::Keyed { .. } = self.mode {
            self.open_map(uuid, "driver_info", info)?;
        }
        Ok(())
    }

    fn sealer_for(&self, id: &str) -> Option<&Sealer> {
        match &self.mode {
            Mode::Keyed { current, previous } => std::iter::once(&**current)
                .chain(previous)
                .find(|s| s.id == id),
            Mode::Passthrough => None,
        }
    }

    /// The value sealed in `s` (a `rivet-sealed:` string) for field `path` of node `uuid`.
    fn open_value(&self, uuid: &str, path: &str, s: &str) -> Result<Value, SecretsError> {
        let malformed = || SecretsError::Malformed {
            field: path.to_string(),
            node: uuid.to_string(),
        };
        let (format, id, payload) = split_sealed(s).ok_or_else(malformed)?;
        let sealer = self.sealer_for(id).ok_or_else(|| SecretsError::WrongKey {
            field: path.to_string(),
            node: uuid.to_string(),
            sealed: id.to_string(),
            configured: self.key_id().unwrap_or("(none)").to_string(),
        })?;
        match sealer.open(format, &aad(uuid, path), payload) {
            Opened::Value(v) => Ok(v),
            Opened::Malformed => Err(malformed()),
            Opened::Unauthentic => Err(SecretsError::Tampered {
                field: path.to_string(),
                node: uuid.to_string(),
                key: id.to_string(),
            }),
        }
    }

    fn open_map(
        &self,
        uuid: &str,
        path: &str,
        map: &mut Map<String, Value>,
    ) -> Result<(), SecretsError> {
        for (k, v) in map.iter_mut() {
            let field = format!("{path}.{k}");
            match v {
                Value::String(s) if is_secret_key(k) && s.starts_with(SEALED_ANY) => {
                    *v = self.open_value(uuid, &field, s)?;
                }
                Value::Object(m) if !is_secret_key(k) => self.open_map(uuid, &field, m)?,
                _ => {}
            }
        }
        Ok(())
    }
}

/// `map` with every secret value sealed (nested maps too, as the API masks them).
fn seal_map(
    sealer: &Sealer,
    uuid: &str,
    path: &str,
    map: &Map<String, Value>,
) -> Map<String, Value> {
    map.iter()
        .map(|(k, v)| {
            let field = format!("{path}.{k}");
            let v = if is_secret_key(k) && !v.is_null() {
                Value::String(sealer.seal(&aad(uuid, &field), v))
            } else if let Value::Object(m) = v {
                Value::Object(seal_map(sealer, uuid, &field, m))
            } else {
                v.clone()
            };
            (k.clone(), v)
        })
        .collect()
}

/// Re-seal, in the stored `map` of node `uuid`, every secret not yet sealed with `new`.
/// Returns (values re-sealed, of which were in clear).
fn reseal_map(
    old: &Secrets,
    new: &Sealer,
    uuid: &str,
    path: &str,
    map: &mut Map<String, Value>,
) -> Result<(u64, u64), SecretsError> {
    let (mut changed, mut clear) = (0, 0);
    for (k, v) in map.iter_mut() {
        let field = format!("{path}.{k}");
        if is_secret_key(k) && !v.is_null() {
            let plain = match &*v {
                Value::String(s) if s.starts_with(SEALED_ANY) => {
                    match split_sealed(s) {
                        // Already under the new key, in this build's format: check it
                        // opens, leave it. (A v1 value under the same key is rewritten.)
                        Some((Format::V2, id, payload)) if id == new.id => {
                            match new.open(Format::V2, &aad(uuid, &field), payload) {
                                Opened::Value(_) => continue,
                                Opened::Malformed => {
                                    return Err(SecretsError::Malformed {
                                        field,
                                        node: uuid.to_string(),
                                    })
                                }
                                Opened::Unauthentic => {
                                    return Err(SecretsError::Tampered {
                                        field,
                                        node: uuid.to_string(),
                                        key: id.to_string(),
                                    })
                                }
                            }
                        }
                        _ => old.open_value(uuid, &field, s)?,
                    }
                }
                other => {
                    clear += 1;
                    other.clone()
                }
            };
            *v = Value::String(new.seal(&aad(uuid, &field), &plain));
            changed += 1;
        } else if let Value::Object(m) = v {
            let (c, l) = reseal_map(old, new, uuid, &field, m)?;
            changed += c;
            clear += l;
        }
    }
    Ok((changed, clear))
}

/// Re-seals stored `driver_info` maps with a new key (`rivetd secrets rotate`, which the
/// store layer runs over every node).
pub struct Resealer(Sealer);

impl Resealer {
    /// Sealing with `new`.
    pub fn new(new: &Key) -> Resealer {
        Resealer(Sealer::new(new))
    }

    /// Re-seal, in the stored `info` of node `uuid`, every secret not yet sealed with the new
    /// key in the current format, opening old values with `old`. Returns (values re-sealed,
    /// of which were in clear).
    pub fn reseal_info(
        &self,
        old: &Secrets,
        uuid: &str,
        info: &mut Map<String, Value>,
    ) -> Result<(u64, u64), SecretsError> {
        reseal_map(old, &self.0, uuid, "driver_info", info)
    }
}

/// Where the key of a SQLite database without configured key lives.
pub fn default_key_path(db_url: &str) -> Option<PathBuf> {
    let path = db_url.strip_prefix("sqlite:")?;
    let path = path.strip_prefix("//").unwrap_or(path);
    (!path.is_empty() && !path.starts_with(':')).then(|| PathBuf::from(format!("{path}.key")))
}

fn default_key(
    db_url: &str,
    create: bool,
    holds_sealed: &dyn Fn(&Path) -> bool,
) -> Result<Key, SecretsError> {
    if db_url.starts_with("postgres") {
        return Err(SecretsError::NoKey(format!(
            "no secrets key configured: a PostgreSQL store is shared by controllers that must all \
             hold the same key, so rivetd does not make one up. Set [secrets] key_file (make one \
             with `rivetd secrets init-key PATH` and copy it to every controller) or {KEY_ENV}"
        )));
    }
    let Some(path) = default_key_path(db_url) else {
        // An in-memory database: nothing outlives the process, neither need the key.
        return Key::generate();
    };
    match std::fs::symlink_metadata(&path) {
        Ok(_) => {
            let k = Key::load(&path)?;
            tracing::info!(key = k.id(), path = %path.display(), "secrets key file next to the database");
            Ok(k)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
            let db = path.with_extension("");
            if holds_sealed(&db) {
                return Err(SecretsError::NoKey(format!(
                    "database {} holds BMC passwords sealed with a key, but its key file {} is \
                     missing: restore the key file from your backup (or set [secrets] key_file or \
                     {KEY_ENV}); rivetd does not generate a new key, which would leave them unreadable",
                    db.display(),
                    path.display()
                )));
            }
            let k = Key::generate()?;
            k.write_new(&path)?;
            tracing::warn!(
                key = k.id(),
                path = %path.display(),
                "no [secrets] key_file configured: generated a key for the SQLite database's BMC \
                 passwords; back it up with the database, which is unreadable without it"
            );
            Ok(k)
        }
        Err(e) => Err(SecretsError::Key {
            origin: format!("file {}", path.display()),
            why: format!("cannot be read ({e}); set [secrets] key_file or {KEY_ENV}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What sealing sees of a node: its uuid and its driver_info.
    #[derive(Debug, Clone, PartialEq)]
    struct Node {
        uuid: String,
        driver_info: Map<String, Value>,
    }

    fn node(uuid: &str, info: Value) -> Node {
        Node {
            uuid: uuid.into(),
            driver_info: info.as_object().cloned().unwrap_or_default(),
        }
    }

    impl Secrets {
        /// What the store does with a row it reads.
        fn open_node(&self, mut n: Node) -> Result<Node, SecretsError> {
            self.open_info(&n.uuid.clone(), &mut n.driver_info)?;
            Ok(n)
        }
    }

    /// What the store would write, read back as a node.
    fn stored(s: &Secrets, n: &Node) -> Node {
        let mut raw = n.clone();
        raw.driver_info = match serde_json::from_str(&s.seal_info(&n.uuid, &n.driver_info)) {
            Ok(Value::Object(m)) => m,
            other => panic!("sealed text is not an object: {other:?}"),
        };
        raw
    }

    fn info() -> Value {
        json!({"ipmi_address": "10.0.0.5", "ipmi_username": "admin",
               "ipmi_password": "hunter2-secret", "redfish_password": 12345,
               "nested": {"api_token": "tok-abc", "plain": "x"}, "empty_password": null})
    }

    #[test]
    fn round_trip_seals_every_secret_and_nothing_else() {
        let key = Key::generate().expect("key");
        let s = Secrets::new(&key, &[]);
        let n = node("u1", info());
        let raw = stored(&s, &n);
        let text = Value::Object(raw.driver_info.clone()).to_string();
        for secret in ["hunter2-secret", "12345", "tok-abc"] {
            assert!(!text.contains(secret), "{secret} in clear: {text}");
        }
        assert_eq!(raw.driver_info["ipmi_address"], "10.0.0.5");
        assert_eq!(raw.driver_info["nested"]["plain"], "x");
        assert!(raw.driver_info["empty_password"].is_null());
        let sealed = raw.driver_info["ipmi_password"].as_str().expect("string");
        assert!(
            sealed.starts_with(&format!("{SEALED_PREFIX}{}:", key.id())),
            "{sealed}"
        );
        assert_eq!(s.open_node(raw).expect("open"), n);
    }

    #[test]
    fn same_value_seals_to_same_text_and_length_is_padded() {
        let s = Secrets::new(&Key::generate().expect("key"), &[]);
        let a = stored(&s, &node("u1", json!({"ipmi_password": "a"})));
        let b = stored(&s, &node("u1", json!({"ipmi_password": "a"})));
        let c = stored(
            &s,
            &node("u1", json!({"ipmi_password": "abcdefghijklmnopqrstuvwxyz"})),
        );
        assert_eq!(a.driver_info, b.driver_info, "rewrites must not churn");
        let len = |n: &Node| n.driver_info["ipmi_password"].as_str().map(str::len);
        assert_eq!(len(&a), len(&c), "short passwords look alike");
        assert_ne!(a.driver_info, c.driver_info);
    }

    /// Values older rivetd sealed (v1: AES-256-GCM with a synthetic nonce) still open, and
    /// re-sealing under the same key rewrites them as v2 (AES-256-GCM-SIV), once.
    #[test]
    fn v1_values_open_and_are_resealed_as_v2() {
        let key = Key::generate().expect("key");
        let s = Secrets::new(&key, &[]);
        let sealer = Sealer::new(&key);
        let v1 = sealer.seal_v1(&aad("u1", "driver_info.ipmi_password"), &json!("old-pw"));
        assert!(v1.starts_with("rivet-sealed:v1:"), "{v1}");
        let mut raw = node(
            "u1",
            json!({"ipmi_password": v1.clone(), "ipmi_address": "h"}),
        );
        let opened = s.open_node(raw.clone()).expect("v1 opens");
        assert_eq!(opened.driver_info["ipmi_password"], "old-pw");
        // Tampering with a v1 value is still caught.
        let mut bad = v1.clone();
        bad.pop();
        bad.push(if v1.ends_with('A') { 'B' } else { 'A' });
        let mut tampered = raw.clone();
        tampered
            .driver_info
            .insert("ipmi_password".into(), json!(bad));
        assert!(s.open_node(tampered).is_err());

        let (changed, clear) =
            reseal_map(&s, &sealer, "u1", "driver_info", &mut raw.driver_info).expect("reseal");
        assert_eq!((changed, clear), (1, 0));
        let v2 = raw.driver_info["ipmi_password"]
            .as_str()
            .expect("str")
            .to_string();
        assert!(
            v2.starts_with(&format!("rivet-sealed:v2:{}:", key.id())),
            "{v2}"
        );
        assert_eq!(
            s.open_node(raw.clone()).expect("v2 opens").driver_info["ipmi_password"],
            "old-pw"
        );
        let again =
            reseal_map(&s, &sealer, "u1", "driver_info", &mut raw.driver_info).expect("again");
        assert_eq!(again, (0, 0), "a v2 value under the key is left alone");
        // A v2 value moved to another field does not open.
        let mut moved = raw.clone();
        moved
            .driver_info
            .insert("redfish_password".into(), json!(v2));
        assert!(s.open_node(moved).is_err());
    }

    #[test]
    fn wrong_key_names_both_keys() {
        let (k1, k2) = (Key::generate().expect("k1"), Key::generate().expect("k2"));
        let raw = stored(&Secrets::new(&k1, &[]), &node("u1", info()));
        let err = Secrets::new(&k2, &[])
            .open_node(raw.clone())
            .expect_err("wrong key");
        let msg = err.to_string();
        assert!(
            msg.contains("driver_info.") && msg.contains("of node u1"),
            "{msg}"
        );
        assert!(
            msg.contains(&format!("sealed with key {}", k1.id())),
            "{msg}"
        );
        assert!(
            msg.contains(&format!("the configured key is {}", k2.id())),
            "{msg}"
        );
        assert!(
            msg.contains("previous_key_file") && msg.contains("rotate"),
            "{msg}"
        );
        // With the old key as the previous one it opens.
        let both = Secrets::new(
            &k2,
            &[Key::from_text(&crate::credentials::hex(&k1.bytes), "t").expect("k1")],
        );
        assert_eq!(
            both.open_node(raw).expect("open").driver_info["ipmi_password"],
            "hunter2-secret"
        );
    }

    #[test]
    fn value_copied_to_another_node_or_field_is_refused() {
        let s = Secrets::new(&Key::generate().expect("key"), &[]);
        let raw = stored(&s, &node("u1", info()));
        let mut other = node("u2", json!({}));
        other.driver_info = raw.driver_info.clone();
        let err = s.open_node(other).expect_err("other node");
        assert!(matches!(err, SecretsError::Tampered { .. }), "{err}");
        assert!(err.to_string().contains("of node u2"), "{err}");

        let mut swapped = raw.clone();
        let p = swapped.driver_info["ipmi_password"].clone();
        swapped.driver_info.insert("redfish_password".into(), p);
        let err = s.open_node(swapped).expect_err("other field");
        assert!(
            err.to_string().contains("driver_info.redfish_password"),
            "{err}"
        );
    }

    #[test]
    fn tampered_ciphertext_is_refused() {
        let s = Secrets::new(&Key::generate().expect("key"), &[]);
        let raw = stored(&s, &node("u1", json!({"ipmi_password": "pw"})));
        let sealed = raw.driver_info["ipmi_password"]
            .as_str()
            .expect("str")
            .to_string();
        let (head, payload) = sealed.rsplit_once(':').expect("payload");
        let mut bytes = B64.decode(payload).expect("b64");
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let mut bad = raw.clone();
        bad.driver_info.insert(
            "ipmi_password".into(),
            Value::String(format!("{head}:{}", B64.encode(&bytes))),
        );
        let err = s.open_node(bad).expect_err("tampered");
        assert!(err.to_string().contains("was altered"), "{err}");
        let mut garbage = raw;
        garbage.driver_info.insert(
            "ipmi_password".into(),
            Value::String(format!("{head}:!!not base64!!")),
        );
        let err = s.open_node(garbage).expect_err("garbage");
        assert!(
            err.to_string().contains("not a valid sealed value"),
            "{err}"
        );
    }

    #[test]
    fn clear_legacy_values_are_read_and_resealed() {
        let (k1, k2) = (Key::generate().expect("k1"), Key::generate().expect("k2"));
        let old = Secrets::new(&k1, &[]);
        let legacy = node(
            "u1",
            json!({"ipmi_password": "old-clear", "redfish_password": "r"}),
        );
        assert_eq!(old.open_node(legacy.clone()).expect("legacy"), legacy);
        // One sealed with the old key, one still in clear.
        let mut raw = stored(&old, &legacy);
        raw.driver_info
            .insert("redfish_password".into(), json!("r"));
        let new = Sealer::new(&k2);
        let (changed, clear) =
            reseal_map(&old, &new, "u1", "driver_info", &mut raw.driver_info).expect("reseal");
        assert_eq!((changed, clear), (2, 1));
        let again =
            reseal_map(&old, &new, "u1", "driver_info", &mut raw.driver_info).expect("again");
        assert_eq!(again, (0, 0), "idempotent");
        assert_eq!(
            Secrets::new(&k2, &[]).open_node(raw.clone()).expect("new"),
            legacy
        );
        assert!(
            old.open_node(raw).is_err(),
            "the old key no longer opens it"
        );
    }

    #[test]
    fn key_text_and_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("k");
        let k = Key::generate().expect("key");
        k.write_new(&path).expect("write");
        assert_eq!(Key::load(&path).expect("load").id(), k.id());
        assert!(k.write_new(&path).is_err(), "never overwrites");
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        }
        let err = Key::load(&path).expect_err("group-readable");
        assert!(err.to_string().contains("mode 0640"), "{err}");
        let err = Key::from_text("abc", "RIVET_SECRETS_KEY").expect_err("short");
        assert!(err.to_string().contains("64 hex"), "{err}");
        assert!(!format!("{k:?}").contains(&crate::credentials::hex(&k.bytes)));
    }

    #[test]
    fn sqlite_without_key_gets_a_file_postgres_refuses() {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite:{}", dir.path().join("r.db").display());
        let cfg = SecretsConfig::default();
        assert!(
            Secrets::from_config(&cfg, &url, false, &|_| false).is_err(),
            "no file yet, no create"
        );
        let a = Secrets::from_config(&cfg, &url, true, &|_| false).expect("generate");
        let b = Secrets::from_config(&cfg, &url, true, &|_| false).expect("reuse");
        assert_eq!(a.key_id(), b.key_id());
        assert!(dir.path().join("r.db.key").exists());
        let err = Secrets::from_config(&cfg, "postgres://u@h/d", true, &|_| false).expect_err("pg");
        assert!(err.to_string().contains("key_file"), "{err}");
    }
}
