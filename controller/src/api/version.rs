//! Microversion negotiation (`X-OpenStack-Ironic-API-Version`), the version documents, the
//! request's [`ApiVersion`] as handlers extract it, and the field gates (406 for a field a
//! client's version does not have, fields hidden from older clients).

use super::ApiError;
use axum::extract::{FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use rivet_model::microversions as mv;
use rivet_protocol::api::{
    MAX_VERSION, MAX_VERSION_HEADER, MIN_VERSION, MIN_VERSION_HEADER, VERSION_HEADER,
};
use serde_json::json;

/// The microversion a request is served at, and how every handler reads it: as an
/// extractor, `ApiVersion(version): ApiVersion` ([`negotiate`] sets it for every request a
/// handler sees; the minimum when absent, as Ironic reads no header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiVersion(pub (u32, u32));

impl<S: Send + Sync> FromRequestParts<S> for ApiVersion {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<ApiVersion>()
            .copied()
            .unwrap_or(ApiVersion(MIN_VERSION)))
    }
}

/// Drops the fields `table` gates above `version` from a document (Ironic's
/// `hide_fields_in_newer_versions`).
pub(super) fn hide_newer(
    doc: &mut serde_json::Map<String, serde_json::Value>,
    table: &[(&str, (u32, u32))],
    version: (u32, u32),
) {
    for (field, since) in table {
        if version < *since {
            doc.remove(*field);
        }
    }
}

/// `1.N` of a version.
pub(super) fn vstr(v: (u32, u32)) -> String {
    format!("{}.{}", v.0, v.1)
}

/// Ironic's NotAcceptable (406) for a field the client's microversion does not have.
pub(super) fn not_acceptable(what: &str, need: (u32, u32)) -> ApiError {
    ApiError::new(
        StatusCode::NOT_ACCEPTABLE,
        format!(
            "Request not acceptable: {what} requires API version {} or later; send the \
             X-OpenStack-Ironic-API-Version header",
            vstr(need)
        ),
    )
}

/// 406 for every name in `names` that `table` gates above `version`.
pub(super) fn check_gated<'a>(
    table: &[(&str, (u32, u32))],
    names: impl IntoIterator<Item = &'a str>,
    version: (u32, u32),
) -> Result<(), ApiError> {
    for n in names {
        if let Some((f, since)) = table.iter().find(|(f, _)| *f == n) {
            if version < *since {
                return Err(not_acceptable(f, *since));
            }
        }
    }
    Ok(())
}

fn fmt(v: (u32, u32)) -> String {
    format!("{}.{}", v.0, v.1)
}

/// The version a request asks for; no header means the minimum, as in Ironic.
fn requested(headers: &HeaderMap) -> Result<(u32, u32), String> {
    // The standard header wins when present: `OpenStack-API-Version: baremetal 1.N`.
    let raw = headers
        .get("OpenStack-API-Version")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.trim()
                .strip_prefix("baremetal")
                .map(|s| s.trim().to_string())
        })
        .or_else(|| {
            headers
                .get(VERSION_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(|s| s.trim().to_string())
        });
    let Some(raw) = raw else {
        return Ok(MIN_VERSION);
    };
    if raw.eq_ignore_ascii_case("latest") {
        return Ok(MAX_VERSION);
    }
    let parsed = raw
        .split_once('.')
        .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)));
    let v = parsed
        .ok_or_else(|| format!("invalid API version {raw:?}: expected MAJOR.MINOR or latest"))?;
    if v < MIN_VERSION || v > MAX_VERSION {
        return Err(format!(
            "version {} is not supported; this server serves {} to {}",
            fmt(v),
            fmt(MIN_VERSION),
            fmt(MAX_VERSION)
        ));
    }
    Ok(v)
}

fn add_range_headers(headers: &mut HeaderMap) {
    headers.insert(
        MIN_VERSION_HEADER,
        HeaderValue::from_str(&fmt(MIN_VERSION)).unwrap_or(HeaderValue::from_static("1.1")),
    );
    headers.insert(
        MAX_VERSION_HEADER,
        HeaderValue::from_str(&fmt(MAX_VERSION)).unwrap_or(HeaderValue::from_static("1.1")),
    );
}

/// The request id headers (1.107): Ironic's `Openstack-Request-Id` and the standard
/// `X-OpenStack-Request-Id` mirroring it, on every response.
pub const REQUEST_ID_HEADERS: [&str; 2] = ["Openstack-Request-Id", "X-OpenStack-Request-Id"];

/// A fresh request id, `req-<uuid>` as oslo.middleware makes them (one per request: a
/// client's own id is not taken over, so ids in rivetd's log are unique).
fn request_id() -> String {
    format!("req-{}", uuid::Uuid::new_v4())
}

/// The caller's id of the request, as oslo.middleware's `global_request_id`: an inbound
/// `X-OpenStack-Request-Id` of the form `req-<uuid>` (anything else is ignored, so a client
/// cannot put arbitrary text into rivetd's log). One id then traces a call from the client
/// (nova, an operator's tool) through rivetd.
fn global_request_id(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(REQUEST_ID_HEADERS[1])?.to_str().ok()?.trim();
    let uuid = v.strip_prefix("req-")?;
    // Hyphenated, 36 characters: what oslo's regex accepts.
    (uuid.len() == 36 && uuid::Uuid::parse_str(uuid).is_ok()).then(|| v.to_ascii_lowercase())
}

/// Middleware: negotiate, 406 outside the range, echo the version used, and name the
/// request (its id is in the response headers and in the log lines of the request).
pub async fn negotiate(mut req: Request, next: Next) -> Response {
    let id = request_id();
    // Node routes name their node (as given: a name or a UUID) on every line of the request.
    let path = req.uri().path().to_string();
    let node = path
        .strip_prefix("/v1/nodes/")
        .and_then(|rest| rest.split('/').next())
        .filter(|n| !n.is_empty() && *n != "detail" && *n != "validate")
        .map(str::to_string);
    let global = global_request_id(req.headers());
    let span = tracing::info_span!(
        "request",
        request_id = %id,
        global_request_id = global.as_deref(),
        node = node.as_deref()
    );
    let method = req.method().clone();
    let mut resp = match requested(req.headers()) {
        Ok(v) => {
            req.extensions_mut().insert(ApiVersion(v));
            let mut resp = tracing::Instrument::instrument(next.run(req), span.clone()).await;
            if let Ok(h) = HeaderValue::from_str(&fmt(v)) {
                resp.headers_mut().insert(VERSION_HEADER, h);
            }
            resp
        }
        Err(msg) => {
            let _entered = span.enter();
            ApiError::new(StatusCode::NOT_ACCEPTABLE, msg).into_response()
        }
    };
    if path.starts_with("/v1") {
        // One line per API request, as Ironic's WSGI server logs them.
        span.in_scope(|| {
            tracing::info!(method = %method, path = %path, status = resp.status().as_u16(), "request handled")
        });
    }
    add_range_headers(resp.headers_mut());
    if let Ok(h) = HeaderValue::from_str(&id) {
        for name in REQUEST_ID_HEADERS {
            resp.headers_mut().insert(name, h.clone());
        }
    }
    resp
}

fn version_doc(host: &str) -> serde_json::Value {
    json!({
        "id": "v1",
        "status": "CURRENT",
        "min_version": fmt(MIN_VERSION),
        "version": fmt(MAX_VERSION),
        "links": [{"href": format!("http://{host}/v1/"), "rel": "self"}],
    })
}

fn host(headers: &HeaderMap) -> String {
    headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost")
        .to_string()
}

/// `GET /`.
pub async fn root(headers: HeaderMap) -> impl IntoResponse {
    let host = host(&headers);
    Json(json!({
        "name": "Rivet Bare Metal API (Ironic-compatible)",
        "description": "Rivet provisions and cleans bare-metal servers.",
        "default_version": version_doc(&host),
        "versions": [version_doc(&host)],
    }))
}

/// Collections the v1 document links to from a microversion on (Ironic's
/// `VERSIONED_CONTROLLERS`). IPA's ramdisk endpoints (`lookup`, `heartbeat`,
/// `continue_inspection`) are not linked: rivetd answers them only with a 404 that says to
/// boot Rivet's ramdisk (docs/ironic-compatibility.md).
const VERSIONED_COLLECTIONS: &[(&str, (u32, u32))] = &[
    ("portgroups", mv::PORTGROUPS),
    ("volume", mv::VOLUME),
    ("conductors", mv::CONDUCTORS),
    ("allocations", mv::ALLOCATIONS),
    ("events", mv::EVENTS),
    ("deploy_templates", mv::DEPLOY_TEMPLATES),
    ("shards", mv::SHARDS),
    ("runbooks", mv::RUNBOOKS),
    ("inspection_rules", mv::INSPECTION_RULES),
];

/// `GET /v1`: Ironic's v1 document at the request's microversion.
pub async fn v1(headers: HeaderMap, ApiVersion(version): ApiVersion) -> impl IntoResponse {
    let host = host(&headers);
    let link = |p: &str| {
        json!([
            {"href": format!("http://{host}/v1/{p}/"), "rel": "self"},
            {"href": format!("http://{host}/{p}/"), "rel": "bookmark"},
        ])
    };
    let mut doc = json!({
        "id": "v1",
        "version": version_doc(&host),
        "media_types": {"base": "application/json", "type": "application/vnd.openstack.ironic.v1+json"},
        "links": [
            {"href": format!("http://{host}/v1/"), "rel": "self"},
            {"href": "https://docs.openstack.org/ironic/latest/contributor/webapi.html", "rel": "describedby", "type": "text/html"},
        ],
        "chassis": link("chassis"),
        "nodes": link("nodes"),
        "ports": link("ports"),
        "drivers": link("drivers"),
    });
    for (name, since) in VERSIONED_COLLECTIONS {
        if version >= *since {
            doc[*name] = link(name);
        }
    }
    Json(doc)
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_well_formed_caller_id_is_the_global_id() {
        let mut h = HeaderMap::new();
        assert_eq!(global_request_id(&h), None);
        let id = "req-0b1c7e3a-6d2e-4c55-9d1b-7f1e2a3b4c5d";
        h.insert("x-openstack-request-id", HeaderValue::from_static(id));
        assert_eq!(global_request_id(&h).as_deref(), Some(id));
        for bad in [
            "hello",
            "req-",
            "req-0b1c7e3a6d2e4c559d1b7f1e2a3b4c5d",
            "req-0b1c7e3a-6d2e-4c55-9d1b-7f1e2a3b4c5dX",
        ] {
            h.insert("x-openstack-request-id", HeaderValue::from_static(bad));
            assert_eq!(global_request_id(&h), None, "{bad}");
        }
    }

    use super::*;

    fn h(v: &str) -> HeaderMap {
        let mut m = HeaderMap::new();
        m.insert(VERSION_HEADER, HeaderValue::from_str(v).expect("header"));
        m
    }

    #[test]
    fn negotiation() {
        assert_eq!(requested(&HeaderMap::new()), Ok(MIN_VERSION));
        assert_eq!(requested(&h("latest")), Ok(MAX_VERSION));
        assert_eq!(requested(&h("1.15")), Ok((1, 15)));
        assert!(requested(&h("2.0")).is_err());
        assert!(requested(&h("1.999")).is_err());
        assert!(requested(&h("banana")).is_err());
        let mut m = h("1.15");
        m.insert(
            "OpenStack-API-Version",
            HeaderValue::from_static("baremetal 1.20"),
        );
        assert_eq!(requested(&m), Ok((1, 20)));
    }
}
