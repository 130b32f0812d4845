//! Strict, bounded parsing of request bodies: bytes → typed value, or an error that names the
//! field and the limit it broke.
//!
//! Before serde sees a body, [`scan`] walks it once, iteratively (no recursion, so a body of
//! 100,000 nested `[` cannot exhaust the stack), and enforces the [`Limits`] of that request
//! type: nesting depth, key and string lengths, keys per object, items per array, and named
//! per-request caps such as "at most 200 clean steps". Untyped fields (`driver_info`, `extra`,
//! a step's `args`) are covered the same way as typed ones, because the scan is over the text.
//! [`check_value`] applies the same limits to a document built in memory (the result of a JSON
//! patch), so repeated patches cannot grow a node past what a single body may carry — or past
//! serde_json's own recursion limit of 128, which would make the stored node unreadable.
//!
//! Pure: no I/O, so the fuzz targets use it exactly as `rivetd` does.

use serde::de::DeserializeOwned;
use serde_json::Value;
use std::fmt;

/// A cap on the length of one top-level array of a request, with the noun its error uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrayCap {
    /// Top-level field holding the array; `None` when the body itself is the array.
    pub field: Option<&'static str>,
    /// Most items accepted.
    pub max: usize,
    /// What the items are called in the error ("steps", "patch operations").
    pub noun: &'static str,
}

/// Limits for one kind of request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Deepest nesting of arrays and objects (the body itself is level 1).
    pub max_depth: usize,
    /// Longest object key, in bytes after unescaping.
    pub max_key_bytes: usize,
    /// Longest string value, in bytes after unescaping.
    pub max_string_bytes: usize,
    /// Fields whose strings (anywhere beneath them) may be longer: (key, limit in bytes).
    pub long_strings: &'static [(&'static str, usize)],
    /// Most keys in one object.
    pub max_keys: usize,
    /// Most items in one array.
    pub max_items: usize,
    /// Tighter caps on particular top-level arrays, checked with their own message.
    pub caps: &'static [ArrayCap],
}

/// Most steps in one manual clean (`clean_steps` of a provision request).
pub const MAX_CLEAN_STEPS: usize = 200;
/// Most operations in one JSON patch.
pub const MAX_PATCH_OPS: usize = 100;

impl Limits {
    /// Admin API bodies: node and port create, patch, provision, power, rules.
    pub const ADMIN: Limits = Limits {
        max_depth: 32,
        max_key_bytes: 255,
        max_string_bytes: 4096,
        // A config drive is a whole gzipped, base64-encoded image: only the body limit applies.
        long_strings: &[("configdrive", usize::MAX)],
        max_keys: 1000,
        max_items: 1000,
        caps: &[
            ArrayCap {
                field: Some("clean_steps"),
                max: MAX_CLEAN_STEPS,
                noun: "steps",
            },
            ArrayCap {
                field: None,
                max: MAX_PATCH_OPS,
                noun: "patch operations",
            },
        ],
    };

    /// `POST /agent/v1/lookup`: unauthenticated, flat, small.
    pub const AGENT_LOOKUP: Limits = Limits {
        max_depth: 4,
        max_key_bytes: 64,
        max_string_bytes: 256,
        long_strings: &[],
        max_keys: 32,
        max_items: 256,
        caps: &[],
    };

    /// `POST /agent/v1/heartbeat/{node}`: results may carry a whole inventory (hundreds of
    /// disks and NICs, every CPU flag) and a plugin's step output, so sizes are generous; the
    /// depth limit is what protects the controller. A heartbeat the controller refuses is
    /// retried by the agent forever, so these must stay well above anything a real agent sends.
    pub const AGENT_HEARTBEAT: Limits = Limits {
        max_depth: 64,
        max_key_bytes: 1024,
        max_string_bytes: 256 << 10,
        long_strings: &[("log_tail", usize::MAX), ("error", usize::MAX)],
        max_keys: 10_000,
        max_items: 100_000,
        caps: &[],
    };

    /// One step's output as the agent reports it (an exec plugin's stdout): a heartbeat nests
    /// it three levels down (body, `results`, the result), well inside [`Self::AGENT_HEARTBEAT`].
    pub const STEP_RESULT: Limits = Limits {
        max_depth: 32,
        max_key_bytes: 1024,
        max_string_bytes: 256 << 10,
        long_strings: &[],
        max_keys: 10_000,
        max_items: 100_000,
        caps: &[],
    };
}

/// Request body types and the limits their endpoint applies.
pub trait Limited {
    /// The limits for this body; admin limits unless the type says otherwise.
    fn limits() -> &'static Limits {
        &Limits::ADMIN
    }
}

impl Limited for crate::api::NodeCreate {}
impl Limited for crate::api::ProvisionRequest {}
impl Limited for crate::api::PowerRequest {}
impl Limited for crate::api::MaintenanceRequest {}
impl Limited for crate::api::PortCreate {}
impl Limited for Vec<crate::api::PatchOp> {}
impl Limited for Value {}
impl Limited for crate::agent::LookupRequest {
    fn limits() -> &'static Limits {
        &Limits::AGENT_LOOKUP
    }
}
impl Limited for crate::agent::HeartbeatRequest {
    fn limits() -> &'static Limits {
        &Limits::AGENT_HEARTBEAT
    }
}

/// Why a body was refused. Every variant is the client's fault (HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyError {
    /// Nothing was sent.
    Empty,
    /// Not JSON.
    Syntax(String),
    /// JSON, but not the shape the endpoint takes.
    Invalid {
        /// Field path (`clean_steps[2].args`), empty for the whole body.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// Over one of the [`Limits`].
    Limit {
        /// Field path, empty for the whole body.
        path: String,
        /// Which limit, with the number found and the number allowed.
        message: String,
    },
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BodyError::Empty => f.write_str("request body is empty; expected JSON"),
            BodyError::Syntax(m) => write!(f, "malformed JSON in request body: {m}"),
            BodyError::Invalid { path, message } if path.is_empty() => {
                write!(f, "invalid request body: {message}")
            }
            BodyError::Invalid { path, message } => {
                write!(f, "invalid request body: field {path}: {message}")
            }
            BodyError::Limit { path, message } if path.is_empty() => {
                write!(f, "request body: {message}")
            }
            BodyError::Limit { path, message } => write!(f, "{path}: {message}"),
        }
    }
}

impl std::error::Error for BodyError {}

/// Parse `bytes` as `T` under `T`'s limits.
pub fn parse<T: DeserializeOwned + Limited>(bytes: &[u8]) -> Result<T, BodyError> {
    parse_strict(bytes, T::limits())
}

/// Parse `bytes` as `T` under `limits`: the limits first, then serde with the failing field's
/// path in the error.
pub fn parse_strict<T: DeserializeOwned>(bytes: &[u8], limits: &Limits) -> Result<T, BodyError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(BodyError::Empty);
    }
    scan(bytes, limits)?;
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                BodyError::Syntax(inner.to_string())
            }
            _ => BodyError::Invalid {
                path: if path == "." { String::new() } else { path },
                message: inner.to_string(),
            },
        }
    })?;
    Ok(value)
}

/// One open array or object during the scan.
enum Frame {
    Object {
        /// The key whose value is being read (or was last read).
        key: Option<String>,
        keys: usize,
        expect_key: bool,
    },
    Array {
        /// Commas seen: the index of the current item.
        index: usize,
        nonempty: bool,
    },
}

/// Longest path an error message shows; deeper paths keep their end, where the problem is.
const PATH_CHARS: usize = 200;

fn path_of(stack: &[Frame]) -> String {
    let mut out = String::new();
    for f in stack {
        match f {
            Frame::Object { key: Some(k), .. } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Frame::Object { key: None, .. } => {}
            Frame::Array { index, .. } => {
                out.push('[');
                out.push_str(&index.to_string());
                out.push(']');
            }
        }
    }
    if out.chars().count() > PATH_CHARS {
        let tail: String = {
            let mut t: Vec<char> = out.chars().rev().take(PATH_CHARS).collect();
            t.reverse();
            t.into_iter().collect()
        };
        out = format!("…{tail}");
    }
    out
}

/// The string limit for a value inside `stack`: the nearest enclosing long-string field's, or
/// the general one.
fn string_limit(stack: &[Frame], limits: &Limits) -> usize {
    for f in stack.iter().rev() {
        if let Frame::Object { key: Some(k), .. } = f {
            if let Some((_, n)) = limits.long_strings.iter().find(|(name, _)| name == k) {
                return *n;
            }
        }
    }
    limits.max_string_bytes
}

fn limit(stack: &[Frame], message: String) -> BodyError {
    BodyError::Limit {
        path: path_of(stack),
        message,
    }
}

/// The cap for the array that `stack` (ending with that array's frame) is in, if any.
fn cap_for(stack: &[Frame], limits: &Limits) -> Option<ArrayCap> {
    let field = match stack {
        [Frame::Array { .. }] => None,
        [Frame::Object { key: Some(k), .. }, Frame::Array { .. }] => Some(k.as_str()),
        _ => return None,
    };
    limits.caps.iter().copied().find(|c| c.field == field)
}

fn hex4(b: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(b.get(..4)?).ok()?;
    u32::from_str_radix(s, 16).ok()
}

/// Read the string starting after the opening quote at `bytes[start]`; return the index after
/// the closing quote, the raw (still escaped) contents and its unescaped length in bytes.
/// An unterminated string runs to the end (serde reports it).
fn read_string(bytes: &[u8], start: usize) -> (usize, &[u8], usize) {
    let mut i = start;
    let mut len = 0usize;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => return (i + 1, &bytes[start..i], len),
            b'\\' => {
                let esc = bytes.get(i + 1).copied();
                if esc == Some(b'u') {
                    // A high surrogate and its partner make one 4-byte character.
                    len += match hex4(&bytes[(i + 2).min(bytes.len())..]) {
                        Some(0xD800..=0xDBFF) => 4,
                        Some(0xDC00..=0xDFFF) => 0,
                        Some(c) if c < 0x80 => 1,
                        Some(c) if c < 0x800 => 2,
                        _ => 3,
                    };
                    i += 6;
                } else {
                    len += 1;
                    i += 2;
                }
            }
            _ => {
                len += 1;
                i += 1;
            }
        }
    }
    (bytes.len(), &bytes[start.min(bytes.len())..], len)
}

/// Check `bytes` (JSON text) against `limits` in one pass without recursion. Text that is not
/// JSON may pass; serde rejects it afterwards.
pub fn scan(bytes: &[u8], limits: &Limits) -> Result<(), BodyError> {
    let mut stack: Vec<Frame> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        // Any token directly inside an array makes it non-empty.
        if b != b']' {
            if let Some(Frame::Array { nonempty, .. }) = stack.last_mut() {
                *nonempty = true;
            }
        }
        match b {
            b'{' | b'[' => {
                if stack.len() >= limits.max_depth {
                    return Err(limit(
                        &stack,
                        format!("nested deeper than {} levels", limits.max_depth),
                    ));
                }
                stack.push(if b == b'{' {
                    Frame::Object {
                        key: None,
                        keys: 0,
                        expect_key: true,
                    }
                } else {
                    Frame::Array {
                        index: 0,
                        nonempty: false,
                    }
                });
                i += 1;
            }
            b'}' | b']' => {
                if let Some(Frame::Array { index, nonempty }) = stack.last() {
                    let items = if *nonempty { index + 1 } else { 0 };
                    if let Some(cap) = cap_for(&stack, limits) {
                        if items > cap.max {
                            let mut s = stack;
                            s.pop();
                            let path = match cap.field {
                                Some(f) => f.to_string(),
                                None => path_of(&s),
                            };
                            return Err(BodyError::Limit {
                                path,
                                message: format!(
                                    "{items} {}, at most {} per request",
                                    cap.noun, cap.max
                                ),
                            });
                        }
                    }
                }
                stack.pop();
                i += 1;
            }
            b',' => {
                // A capped array is counted at its end, so its error can give the full count.
                let capped = cap_for(&stack, limits).is_some();
                match stack.last_mut() {
                    Some(Frame::Array { index, .. }) => {
                        *index += 1;
                        if !capped && *index >= limits.max_items {
                            let n = *index + 1;
                            return Err(limit(
                                &stack,
                                format!(
                                    "more than {} items in one list ({n} so far)",
                                    limits.max_items
                                ),
                            ));
                        }
                    }
                    Some(Frame::Object { expect_key, .. }) => *expect_key = true,
                    None => {}
                }
                i += 1;
            }
            b'"' => {
                let (next, raw, len) = read_string(bytes, i + 1);
                let is_key = matches!(
                    stack.last(),
                    Some(Frame::Object {
                        expect_key: true,
                        ..
                    })
                );
                if is_key {
                    if len > limits.max_key_bytes {
                        return Err(limit(
                            &stack,
                            format!(
                                "a key of {len} bytes, at most {} allowed",
                                limits.max_key_bytes
                            ),
                        ));
                    }
                    if let Some(Frame::Object {
                        key,
                        keys,
                        expect_key,
                    }) = stack.last_mut()
                    {
                        *keys += 1;
                        *key = Some(String::from_utf8_lossy(raw).into_owned());
                        *expect_key = false;
                        if *keys > limits.max_keys {
                            let n = *keys;
                            return Err(limit(
                                &stack[..stack.len().saturating_sub(1)],
                                format!(
                                    "more than {} keys in one object ({n} so far)",
                                    limits.max_keys
                                ),
                            ));
                        }
                    }
                } else {
                    let max = string_limit(&stack, limits);
                    if len > max {
                        return Err(limit(
                            &stack,
                            format!("string of {len} bytes, at most {max} allowed"),
                        ));
                    }
                }
                i = next;
            }
            _ => i += 1,
        }
    }
    Ok(())
}

/// Check a document built in memory against `limits` (depth, key and string lengths, keys per
/// object, items per array), iteratively.
pub fn check_value(doc: &Value, limits: &Limits) -> Result<(), BodyError> {
    // (value, containers above it, its path, the string limit that applies to it)
    let mut todo: Vec<(&Value, usize, String, usize)> =
        vec![(doc, 0, String::new(), limits.max_string_bytes)];
    while let Some((v, depth, path, max_string)) = todo.pop() {
        let err = |message: String| BodyError::Limit {
            path: path.clone(),
            message,
        };
        let join = |seg: &str| {
            if path.is_empty() {
                seg.to_string()
            } else {
                format!("{path}.{seg}")
            }
        };
        match v {
            Value::Object(_) | Value::Array(_) if depth >= limits.max_depth => {
                return Err(err(format!(
                    "nested deeper than {} levels",
                    limits.max_depth
                )));
            }
            Value::Object(m) => {
                if m.len() > limits.max_keys {
                    return Err(err(format!(
                        "{} keys in one object, at most {} allowed",
                        m.len(),
                        limits.max_keys
                    )));
                }
                for (k, child) in m {
                    if k.len() > limits.max_key_bytes {
                        return Err(err(format!(
                            "a key of {} bytes, at most {} allowed",
                            k.len(),
                            limits.max_key_bytes
                        )));
                    }
                    let max = limits
                        .long_strings
                        .iter()
                        .find(|(name, _)| name == k)
                        .map_or(max_string, |(_, n)| *n);
                    todo.push((child, depth + 1, join(k), max));
                }
            }
            Value::Array(a) => {
                if a.len() > limits.max_items {
                    return Err(err(format!(
                        "{} items in one list, at most {} allowed",
                        a.len(),
                        limits.max_items
                    )));
                }
                for (n, child) in a.iter().enumerate() {
                    todo.push((child, depth + 1, format!("{path}[{n}]"), max_string));
                }
            }
            Value::String(s) if s.len() > max_string => {
                return Err(err(format!(
                    "string of {} bytes, at most {max_string} allowed",
                    s.len()
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{HeartbeatRequest, LookupRequest};
    use crate::api::{NodeCreate, PatchOp, ProvisionRequest};
    use serde_json::json;

    fn limit_msg<T: DeserializeOwned + Limited + fmt::Debug>(body: &str) -> String {
        match parse::<T>(body.as_bytes()) {
            Err(e @ BodyError::Limit { .. }) => e.to_string(),
            other => panic!("expected a limit error, got {other:?}"),
        }
    }

    #[test]
    fn deep_nesting_is_refused_without_recursion() {
        // Deep enough to overflow the stack of a recursive parser.
        let body = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let e = parse_strict::<Value>(body.as_bytes(), &Limits::ADMIN).unwrap_err();
        assert!(
            e.to_string().contains("nested deeper than 32 levels"),
            "{e}"
        );
        // Unterminated, too.
        let e = parse_strict::<Value>("{\"a\":".repeat(100_000).as_bytes(), &Limits::ADMIN)
            .unwrap_err();
        assert!(matches!(e, BodyError::Limit { .. }), "{e}");
    }

    #[test]
    fn depth_holds_for_untyped_fields() {
        let mut v = json!(1);
        for _ in 0..32 {
            v = json!({ "k": v });
        }
        // The body's object is level 1, driver_info's value levels 2 to 33.
        let body = json!({"driver": "fake-hardware", "driver_info": v}).to_string();
        let m = limit_msg::<NodeCreate>(&body);
        assert!(m.starts_with("driver_info.k.k"), "{m}");
        assert!(m.ends_with("nested deeper than 32 levels"), "{m}");
        // One level less is fine.
        let v = v["k"].clone();
        let body = json!({"driver": "fake-hardware", "driver_info": v}).to_string();
        parse::<NodeCreate>(body.as_bytes()).unwrap();
    }

    #[test]
    fn long_strings_and_keys_are_refused() {
        let body = json!({"driver": "fake-hardware", "name": "n".repeat(5000)}).to_string();
        assert_eq!(
            limit_msg::<NodeCreate>(&body),
            "name: string of 5000 bytes, at most 4096 allowed"
        );
        let body = json!({"driver": "x", "extra": {"a": ["ok", "x".repeat(4097)]}}).to_string();
        assert_eq!(
            limit_msg::<NodeCreate>(&body),
            "extra.a[1]: string of 4097 bytes, at most 4096 allowed"
        );
        let body = json!({"driver": "x", "extra": {"k".repeat(300): 1}}).to_string();
        assert_eq!(
            limit_msg::<NodeCreate>(&body),
            "extra: a key of 300 bytes, at most 255 allowed"
        );
        // Escapes count as the bytes they decode to: 4096 é (2 bytes each) is 8192 bytes.
        let body = format!(r#"{{"driver":"x","name":"{}"}}"#, "\\u00e9".repeat(2048));
        parse::<NodeCreate>(body.as_bytes()).unwrap();
        let body = format!(r#"{{"driver":"x","name":"{}"}}"#, "\\u00e9".repeat(2049));
        assert!(limit_msg::<NodeCreate>(&body).contains("4098 bytes"));
        // A config drive is a whole image: only the body size limits it.
        let body = json!({"target": "active", "configdrive": "A".repeat(100_000)}).to_string();
        parse::<ProvisionRequest>(body.as_bytes()).unwrap();
    }

    #[test]
    fn keys_and_items_are_counted() {
        let many: serde_json::Map<String, Value> =
            (0..1001).map(|i| (format!("k{i}"), json!(i))).collect();
        let body = json!({"driver": "x", "properties": many}).to_string();
        assert_eq!(
            limit_msg::<NodeCreate>(&body),
            "properties: more than 1000 keys in one object (1001 so far)"
        );
        let body = json!({"driver": "x", "extra": {"l": vec![0; 1001]}}).to_string();
        assert_eq!(
            limit_msg::<NodeCreate>(&body),
            "extra.l[1000]: more than 1000 items in one list (1001 so far)"
        );
        let body = json!({"macs": vec!["aa:bb:cc:dd:ee:ff"; 300]}).to_string();
        assert!(limit_msg::<LookupRequest>(&body).contains("more than 256 items"));
    }

    #[test]
    fn steps_and_patch_operations_per_request() {
        let step = json!({"interface": "deploy", "step": "erase_devices_metadata"});
        let body = json!({"target": "clean", "clean_steps": vec![step.clone(); 5000]}).to_string();
        assert_eq!(
            limit_msg::<ProvisionRequest>(&body),
            "clean_steps: 5000 steps, at most 200 per request"
        );
        let body = json!({"target": "clean", "clean_steps": vec![step; 200]}).to_string();
        assert_eq!(
            parse::<ProvisionRequest>(body.as_bytes())
                .unwrap()
                .clean_steps
                .map(|s| s.len()),
            Some(200)
        );
        let op = json!({"op": "add", "path": "/extra/a", "value": 1});
        let body = json!(vec![op.clone(); 101]).to_string();
        assert_eq!(
            limit_msg::<Vec<PatchOp>>(&body),
            "request body: 101 patch operations, at most 100 per request"
        );
        let body = json!(vec![op; 100]).to_string();
        assert_eq!(parse::<Vec<PatchOp>>(body.as_bytes()).unwrap().len(), 100);
        // An empty list is not "one item".
        assert_eq!(parse::<Vec<PatchOp>>(b" [ ] ").unwrap().len(), 0);
    }

    #[test]
    fn heartbeat_with_a_large_inventory_passes() {
        let disk = json!({"name": "/dev/sda", "model": "m", "size": 1u64 << 40, "rotational": false,
            "serial": "S1", "wwn": null, "vendor": "v", "by_path": "/dev/disk/by-path/pci-0000:00:1f.2-ata-1"});
        let nic = json!({"name": "eth0", "mac_address": "aa:bb:cc:dd:ee:ff", "ipv4_address": "10.0.0.1",
            "has_carrier": true, "lldp": null, "vendor": "0x8086", "product": "0x1572"});
        let result = json!({"inventory": {"disks": vec![disk; 500], "interfaces": vec![nic; 256],
            "cpu": {"flags": vec!["avx512f"; 300]}}});
        let body =
            json!({"agent_version": "0.1.0", "results": [{"id": "c1", "name": "get_inventory",
            "status": "SUCCEEDED", "result": result, "log_tail": "l".repeat(500_000)}]})
            .to_string();
        assert!(body.len() < 1 << 20);
        parse::<HeartbeatRequest>(body.as_bytes()).unwrap();
        // But not nesting a step's output 65 levels deep.
        let mut deep = json!(1);
        for _ in 0..62 {
            deep = json!([deep]);
        }
        let body = json!({"agent_version": "0.1.0", "results": [{"id": "c1", "name": "x",
            "status": "FAILED", "result": deep}]})
        .to_string();
        assert!(limit_msg::<HeartbeatRequest>(&body).contains("nested deeper than 64 levels"));
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(parse::<NodeCreate>(b"  ").unwrap_err(), BodyError::Empty);
        let e = parse::<NodeCreate>(br#"{"driver": 5}"#).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("invalid request body: field driver:"),
            "{e}"
        );
        let e = parse::<NodeCreate>(br#"{"driver": "x""#).unwrap_err();
        assert!(matches!(e, BodyError::Syntax(_)), "{e}");
        let e = parse::<ProvisionRequest>(
            br#"{"target":"clean","clean_steps":[{"interface":"deploy"}]}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("field clean_steps[0]"), "{e}");
    }

    // Regression (fuzz node_create, node_patch): without serde_json's float_roundtrip some
    // numbers parsed 1 ULP off their shortest form, so a node's numbers changed each time the
    // store wrote it as text and read it back.
    #[test]
    fn numbers_survive_a_text_round_trip() {
        let body = br#"{"driver": "ipmi", "driver_info": {"ipmi_port": 62333333333333333333333333333333333333333},
            "properties": {"a": 1.5e+200, "b": 0.1, "c": 2.2250738585072011e-308}}"#;
        let n: NodeCreate = parse(body).unwrap();
        let again: NodeCreate = parse(serde_json::to_string(&n).unwrap().as_bytes()).unwrap();
        assert_eq!(again, n);
    }

    #[test]
    fn check_value_matches_scan() {
        let mut v = json!("x");
        for _ in 0..32 {
            v = json!({ "a": v });
        }
        assert!(check_value(&v, &Limits::ADMIN).is_ok());
        let deeper = json!({ "a": v });
        let e = check_value(&deeper, &Limits::ADMIN).unwrap_err();
        assert!(
            e.to_string().contains("nested deeper than 32 levels"),
            "{e}"
        );
        assert!(scan(deeper.to_string().as_bytes(), &Limits::ADMIN).is_err());
        let long = json!({"extra": {"a": ["x".repeat(4097)]}});
        assert_eq!(
            check_value(&long, &Limits::ADMIN).unwrap_err().to_string(),
            "extra.a[0]: string of 4097 bytes, at most 4096 allowed"
        );
        let cd = json!({"instance_info": {"configdrive": "x".repeat(10_000)}});
        assert!(check_value(&cd, &Limits::ADMIN).is_ok());
    }
}
