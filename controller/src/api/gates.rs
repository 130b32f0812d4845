//! Microversion gates of routes, in one place.
//!
//! Every route's microversion is its row in [`super::openapi::OPERATIONS`] (`since`), the
//! table the OpenAPI document is made from and tests/openapi.rs holds equal to the router;
//! the rows take their versions from `rivet_model::microversions`, the one table the
//! resources and the conductor's verbs read too.
//! [`require`] reads that row for every request the router matched, so a route can neither
//! be served below its microversion nor be documented at another one; handlers do not check
//! their route's version again. What Ironic answers
//! below the microversion is [`refusal`]: 404 as if the route did not exist, except where
//! Ironic's controller answers a write with 405 (deploy templates, runbooks, allocations, inspection rules) or a
//! route answers 406 or 405 ([`ROUTE_REFUSALS`]).
//!
//! Fields, filters and PATCH paths newer than the request are gated by the resources' own
//! tables (each resource's `FIELD_VERSIONS`, the node's in `render::NODE_FIELD_VERSIONS`
//! and `nodes::FILTER_VERSIONS`), always with 406.

use super::openapi::{operations, Op};
use super::version::{vstr, ApiVersion};
use super::ApiError;
use axum::extract::{MatchedPath, Request};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::sync::LazyLock;

/// Collections whose controller answers a write below its microversion with 405 Method Not
/// Allowed (Ironic: `HTTPMethodNotAllowed` in the POST/PATCH/DELETE of deploy templates,
/// runbooks, allocations and inspection rules), where a read gets 404.
const WRITE_405: &[&str] = &[
    "/v1/deploy_templates",
    "/v1/runbooks",
    "/v1/allocations",
    "/v1/inspection_rules",
];

/// Single routes whose refusal is not 404: (method, route template, status), each as
/// Ironic's controller or its routing answers it.
const ROUTE_REFUSALS: &[(&str, &str, u16)] = &[
    // Below 1.37 Ironic reads these paths as a node request for the field `traits`, newer
    // than the version (406), or finds no handler for the method (405).
    ("GET", "/v1/nodes/{ident}/traits", 406),
    ("PUT", "/v1/nodes/{ident}/traits", 405),
    ("PUT", "/v1/nodes/{ident}/traits/{trait}", 405),
    // RAID (1.12): `NotAcceptable` from the controller.
    ("PUT", "/v1/nodes/{ident}/states/raid", 406),
    (
        "GET",
        "/v1/drivers/{name}/raid/logical_disk_properties",
        406,
    ),
];

/// Ironic's status for `method` on the route template `path` below its microversion.
pub fn refusal(method: &str, path: &str) -> StatusCode {
    if let Some((_, _, code)) = ROUTE_REFUSALS
        .iter()
        .find(|(m, p, _)| *m == method && *p == path)
    {
        return StatusCode::from_u16(*code).unwrap_or(StatusCode::NOT_FOUND);
    }
    let write = matches!(method, "POST" | "PUT" | "PATCH" | "DELETE");
    // The collection (`/x`, `/x/`) or one member (`/x/{ident}`); not routes under a member
    // (a runbook's traits are 404 below their version, as any route).
    let collection = WRITE_405.iter().any(|c| {
        path.strip_prefix(c)
            .is_some_and(|r| r.is_empty() || (r.starts_with('/') && !r[1..].contains('/')))
    });
    if write && collection {
        StatusCode::METHOD_NOT_ALLOWED
    } else {
        StatusCode::NOT_FOUND
    }
}

/// The operations by (method, route template).
static BY_ROUTE: LazyLock<HashMap<(&'static str, &'static str), &'static Op>> =
    LazyLock::new(|| operations().map(|op| ((op.method, op.path), op)).collect());

/// The microversion `method` on the route template `path` needs; `None` for a route outside
/// the microversioned API.
pub(super) fn since(method: &Method, path: &str) -> Option<(u32, u32)> {
    BY_ROUTE
        .get(&(method.as_str(), path))
        .and_then(|op| op.since)
}

/// A method the route does not have. Below every microversion the path exists at, Ironic
/// refuses the path itself before it looks at the method (a node sub-resource's `_lookup`
/// aborts with 404: `PUT /v1/nodes/{node}/vmedia` at 1.88), so the answer is the route's
/// [`refusal`]; from there on it is 405, with Ironic's error body.
pub(super) async fn method_not_allowed(
    ApiVersion(asked): ApiVersion,
    method: Method,
    path: Option<MatchedPath>,
    uri: axum::http::Uri,
) -> ApiError {
    let template = path.as_ref().map(MatchedPath::as_str);
    let oldest = template.and_then(|t| {
        operations()
            .filter(|op| op.path == t)
            .map(|op| op.since)
            .min()
            .flatten()
    });
    if let (Some(t), Some(need)) = (template, oldest) {
        if asked < need {
            return ApiError::new(
                refusal(method.as_str(), t),
                format!(
                    "{} needs API version {} or later; this request asked for {}",
                    uri.path(),
                    vstr(need),
                    vstr(asked)
                ),
            );
        }
    }
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{method} is not allowed on {}", uri.path()),
    )
}

/// Route middleware: the request's microversion against its route's row.
pub(super) async fn require(ApiVersion(asked): ApiVersion, req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map(|p| p.as_str());
    if let Some(path) = route {
        if let Some(need) = since(req.method(), path) {
            if asked < need {
                let status = refusal(req.method().as_str(), path);
                let msg = format!(
                    "{} {} needs API version {} or later; this request asked for {} (send \
                     X-OpenStack-Ironic-API-Version: {} or later)",
                    req.method(),
                    req.uri().path(),
                    vstr(need),
                    vstr(asked),
                    vstr(need)
                );
                return ApiError::new(status, msg).into_response();
            }
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_to_templates_runbooks_and_allocations_are_405() {
        for (m, p, want) in [
            ("POST", "/v1/deploy_templates", 405),
            ("PATCH", "/v1/deploy_templates/{ident}", 405),
            ("DELETE", "/v1/runbooks/{ident}", 405),
            ("POST", "/v1/allocations", 405),
            ("GET", "/v1/deploy_templates", 404),
            ("GET", "/v1/runbooks/{ident}", 404),
            ("PUT", "/v1/nodes/{ident}/traits", 405),
            ("POST", "/v1/portgroups", 404),
            ("DELETE", "/v1/nodes/{ident}/allocation", 404),
            ("GET", "/v1/nodes/{ident}/traits", 406),
            ("PUT", "/v1/nodes/{ident}/traits/{trait}", 405),
            ("DELETE", "/v1/nodes/{ident}/traits", 404),
            ("POST", "/v1/nodes/{ident}/portgroups", 404),
            ("PUT", "/v1/runbooks/{ident}/traits", 404),
            ("DELETE", "/v1/runbooks/{ident}/traits/{name}", 404),
            ("POST", "/v1/runbooks/", 405),
        ] {
            assert_eq!(refusal(m, p).as_u16(), want, "{m} {p}");
        }
    }

    #[test]
    fn every_versioned_operation_has_a_gate() {
        let n = operations().filter(|op| op.since.is_some()).count();
        assert!(n > 100, "{n}");
        for op in operations() {
            let m = Method::from_bytes(op.method.as_bytes()).expect("method");
            assert_eq!(since(&m, op.path), op.since, "{} {}", op.method, op.path);
        }
    }
}
