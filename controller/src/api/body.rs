//! Strict JSON bodies: a syntax error, an unknown field, a wrong type or a broken limit (depth,
//! string length, steps per request — `rivet_protocol::limits`) is a 400 that names the field;
//! an oversize body is a 413 naming the limit. The checks of a body's fields that Ironic's
//! schemas make (UUIDs, MACs, booleans, strings, objects, logical names) are here too, for
//! every resource's body.

use super::ApiError;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use rivet_protocol::limits::Limited;
use rivet_store::normalize_mac;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// A JSON request body of type `T`, parsed under `T`'s limits.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned + Limited, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|rej| {
            if rej.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "request body is larger than this server accepts (api.max_body_bytes)",
                )
            } else {
                ApiError::new(rej.status(), format!("cannot read request body: {rej}"))
            }
        })?;
        parse(&bytes).map(JsonBody)
    }
}

/// Parse bytes as `T` under `T`'s limits, with field-naming errors.
pub fn parse<T: DeserializeOwned + Limited>(bytes: &[u8]) -> Result<T, ApiError> {
    rivet_protocol::limits::parse(bytes).map_err(|e| ApiError::bad_request(e.to_string()))
}

// ------------------------------------------------- the field checks of Ironic's schemas

/// A UUID in a path, query or body: anything else is a 400, as Ironic's `args.uuid`.
pub(super) fn check_uuid(what: &str, v: &str) -> Result<String, ApiError> {
    uuid::Uuid::parse_str(v)
        .map(|u| u.to_string())
        .map_err(|_| ApiError::bad_request(format!("Expected UUID for {what}: {v}")))
}

/// An identifier that must be a UUID or a name (Ironic's `args.uuid_or_name`): anything
/// else — a MAC address, a name with a space — is a 400, never a lookup.
pub(super) fn check_uuid_or_name(what: &str, v: &str) -> Result<String, ApiError> {
    if is_logical_name(v) || uuid::Uuid::parse_str(v).is_ok() {
        return Ok(v.to_string());
    }
    Err(ApiError::bad_request(format!(
        "Expected UUID or name for {what}: {v}"
    )))
}

/// A MAC as Ironic's `args.mac_address` takes it (lower-cased).
pub(super) fn mac(address: &str) -> Result<String, ApiError> {
    normalize_mac(address).ok_or_else(|| {
        ApiError::bad_request(format!("Expected a MAC address but received {address}."))
    })
}

/// Ironic's `args.boolean`: a JSON boolean or one of its strings.
pub(super) fn boolean(name: &str, v: &Value) -> Result<bool, ApiError> {
    match v {
        Value::Bool(b) => Ok(*b),
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "true" | "1" | "t" | "yes" | "y" | "on" => Ok(true),
            "false" | "0" | "f" | "no" | "n" | "off" => Ok(false),
            _ => Err(ApiError::bad_request(format!(
                "Invalid {name}: unrecognized value '{s}', acceptable values are: '0', '1', \
                 'f', 'false', 'n', 'no', 'off', 'on', 't', 'true', 'y', 'yes'"
            ))),
        },
        other => Err(ApiError::bad_request(format!(
            "{other} is not of type 'string', 'boolean', 'null'"
        ))),
    }
}

/// How a resource's messages name a body field: Ironic's schema errors read differently
/// per resource (`… (extra)`, `… (field extra)`, or without the name).
#[derive(Clone, Copy)]
pub(super) enum Named {
    Key,
    Field,
    Bare,
}

fn type_error(other: &Value, types: &str, key: &str, named: Named) -> ApiError {
    let name = match named {
        Named::Key => format!(" ({key})"),
        Named::Field => format!(" (field {key})"),
        Named::Bare => String::new(),
    };
    ApiError::bad_request(format!("{other} is not of type {types}{name}"))
}

/// A string field (`None` for absent or null).
pub(super) fn string_in(
    doc: &Map<String, Value>,
    key: &str,
    named: Named,
) -> Result<Option<String>, ApiError> {
    match doc.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(type_error(other, "'string', 'null'", key, named)),
    }
}

/// An object field (`{}` for absent or null).
pub(super) fn object_in(
    doc: &Map<String, Value>,
    key: &str,
    named: Named,
) -> Result<Map<String, Value>, ApiError> {
    match doc.get(key) {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(m)) => Ok(m.clone()),
        Some(other) => Err(type_error(other, "'object', 'null'", key, named)),
    }
}

/// A create's body: a JSON object (`what` names one in the message) with only `allowed` keys
/// (Ironic's `additionalProperties: false`).
pub(super) fn object_body(
    body: Value,
    what: &str,
    allowed: &[&str],
) -> Result<Map<String, Value>, ApiError> {
    let Value::Object(doc) = body else {
        return Err(ApiError::bad_request(format!(
            "{what} must be a JSON object"
        )));
    };
    if let Some(bad) = doc.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(ApiError::bad_request(format!(
            "Additional properties are not allowed ('{bad}' was unexpected)"
        )));
    }
    Ok(doc)
}

/// A body's `uuid` (checked), or a new one when it has none.
pub(super) fn uuid_in(doc: &Map<String, Value>, named: Named) -> Result<String, ApiError> {
    match string_in(doc, "uuid", named)? {
        Some(u) => check_uuid("uuid", &u),
        None => Ok(uuid::Uuid::new_v4().to_string()),
    }
}

/// A string of at most `max` characters, in Ironic's schema words.
pub(super) fn check_length(key: &str, s: &str, max: usize) -> Result<(), ApiError> {
    let n = s.chars().count();
    if n > max {
        return Err(ApiError::bad_request(format!(
            "'{s}' is too long: {key} is {n} characters; at most {max} are allowed"
        )));
    }
    Ok(())
}

/// A string of at most `max` characters, in the words of the allocation and template APIs.
pub(super) fn at_most(
    key: &str,
    v: Option<String>,
    max: usize,
) -> Result<Option<String>, ApiError> {
    if v.as_ref().is_some_and(|s| s.chars().count() > max) {
        return Err(ApiError::bad_request(format!(
            "{key} is too long: at most {max} characters are allowed"
        )));
    }
    Ok(v)
}

/// An optional string field of at most `max` characters (`None` for absent or null).
pub(super) fn opt_string(
    doc: &Map<String, Value>,
    key: &str,
    max: Option<usize>,
) -> Result<Option<String>, ApiError> {
    let v = string_in(doc, key, Named::Key)?;
    if let (Some(s), Some(max)) = (&v, max) {
        check_length(key, s, max)?;
    }
    Ok(v)
}

/// An object field (`{}` for absent or null).
pub(super) fn opt_object(
    doc: &Map<String, Value>,
    key: &str,
) -> Result<Map<String, Value>, ApiError> {
    object_in(doc, key, Named::Key)
}

/// Ironic's `is_valid_logical_name`: RFC 3986 unreserved characters, at most 255.
pub(super) fn is_logical_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._~".contains(c))
}

/// A name that [`is_logical_name`], or a 400 naming the `kind` of resource.
pub(super) fn check_logical_name(kind: &str, name: &str) -> Result<(), ApiError> {
    if is_logical_name(name) {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "Cannot use invalid name '{name}' for a {kind}: use 1-255 characters from \
             A-Z a-z 0-9 - . _ ~"
        )))
    }
}
