//! Request paths as Ironic answers them besides the canonical `/v1/...` form, rewritten
//! before routing so that every route serves them the same way:
//!
//! - **No `/v1` prefix.** Ironic's root controller serves its default version for a path
//!   that names none (`/nodes/detail?instance_uuid=…` is `/v1/nodes/detail?…`). Clients that
//!   join a path to the bare endpoint rely on it. Only the v1 collections are prefixed, so
//!   `/metrics`, `/agent/…` and `/boot/…` stay what they are.
//! - **A `.json` suffix, below 1.91.** Ironic strips a trailing `.json` from a path (what is
//!   left of pecan's content type from the extension; only JSON was ever served) when the
//!   request's `X-OpenStack-Ironic-API-Version` header names a version below 1.91
//!   (`JsonExtensionMiddleware`: no header, `latest` or 1.91 on keeps it, so
//!   `/v1/nodes/n1.json` is then the node named `n1.json`). A node, port group, allocation,
//!   deploy template or runbook whose name really ends in `.json` is still found when it is
//!   stripped: the suffix is kept when the stripped name names nothing and the whole one does
//!   (Ironic's `_get_with_suffix`).
//! - **A node identifier that is neither a UUID nor a valid name** is a 400 on every node
//!   route (Ironic's `args.uuid_or_name` on `node_ident`), never a lookup.

use super::deploy_templates::Deploy;
use super::resource::Resource;
use super::runbooks::Runbook;
use super::step_templates::Api as Templates;
use super::{allocations, body, portgroups, ApiError, AppState};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rivet_model::microversions as mv;
use rivet_protocol::api::VERSION_HEADER;

/// The first path segments Ironic's v1 API serves (its root controller's children).
const V1_COLLECTIONS: &[&str] = &[
    "nodes",
    "ports",
    "portgroups",
    "chassis",
    "drivers",
    "conductors",
    "allocations",
    "deploy_templates",
    "runbooks",
    "volume",
    "events",
    "shards",
    "inspection_rules",
    "lookup",
    "heartbeat",
    "continue_inspection",
];

/// Paths whose `.json` is part of the name.
const LITERAL_JSON: &[&str] = &["/v1/openapi.json"];

/// Collections whose members are found by name, where a name may end in `.json`.
#[derive(Clone, Copy)]
enum Named {
    Node,
    Portgroup,
    Allocation,
    DeployTemplate,
    Runbook,
}

impl Named {
    fn of(collection: &str) -> Option<Named> {
        Some(match collection {
            "nodes" => Named::Node,
            "portgroups" => Named::Portgroup,
            "allocations" => Named::Allocation,
            "deploy_templates" => Named::DeployTemplate,
            "runbooks" => Named::Runbook,
            _ => return None,
        })
    }

    async fn exists(self, state: &AppState, ident: &str) -> bool {
        let store = &state.conductor.store;
        match self {
            Named::Node => store.get_node(ident).await.is_ok(),
            Named::Portgroup => portgroups::Api::get(state, ident).await.is_ok(),
            Named::Allocation => allocations::Api::get(state, ident).await.is_ok(),
            Named::DeployTemplate => Templates::<Deploy>::get(state, ident).await.is_ok(),
            Named::Runbook => Templates::<Runbook>::get(state, ident).await.is_ok(),
        }
    }
}

/// Whether a `.json` suffix is a content type for this request: its
/// `X-OpenStack-Ironic-API-Version` names a minor version from 1 to below
/// [`mv::DOT_JSON`], read as Ironic's middleware reads it (that header alone, before
/// negotiation: no header, `latest` and a malformed one keep the suffix).
fn strips_json(headers: &HeaderMap) -> bool {
    let minor = headers
        .get(VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once('.'))
        .and_then(|(_, minor)| minor.parse::<u32>().ok());
    minor.is_some_and(|m| m != 0 && m < mv::DOT_JSON.1)
}

/// The canonical path of `path` and whether a `.json` suffix was taken off it (only when
/// `strip_json`); `None` when `path` is canonical already (nearly every request: nothing is
/// allocated for those).
fn canonical(path: &str, strip_json: bool) -> Option<(String, bool)> {
    let first = path.trim_start_matches('/').split('/').next().unwrap_or("");
    let first = first.strip_suffix(".json").unwrap_or(first);
    let prefixed = V1_COLLECTIONS.contains(&first);
    let v1 = prefixed || path.starts_with("/v1/");
    let trimmed = path.trim_end_matches('/');
    let suffixed = v1
        && strip_json
        && !LITERAL_JSON.contains(&path)
        && trimmed
            .strip_suffix(".json")
            .is_some_and(|stripped| !stripped.ends_with('/'));
    if !prefixed && !suffixed {
        return None;
    }
    let p = if suffixed {
        &trimmed[..trimmed.len() - ".json".len()]
    } else {
        path
    };
    let p = if prefixed {
        format!("/v1{p}")
    } else {
        p.to_string()
    };
    Some((p, suffixed))
}

/// `/v1/{collection}/{ident}` with nothing after it: the collection and the identifier.
fn member(path: &str) -> Option<(&str, &str)> {
    let mut parts = path.strip_prefix("/v1/")?.split('/');
    let collection = parts.next()?;
    let ident = parts.next()?;
    (parts.next().is_none() && !ident.is_empty()).then_some((collection, ident))
}

/// Node sub-paths that are not a node identifier.
const NODE_COLLECTION_WORDS: &[&str] = &["detail", "validate"];

/// Middleware in front of the router: see the module documentation.
pub async fn normalize(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let rewrite = canonical(path, strips_json(req.headers()));
    let (mut canon, stripped) = match &rewrite {
        Some((c, stripped)) => (c.clone(), *stripped),
        None => (String::new(), false),
    };
    if stripped {
        if let Some((collection, ident)) = member(&canon) {
            if let Some(named) = Named::of(collection) {
                let whole = format!("{ident}.json");
                if !named.exists(&state, ident).await && named.exists(&state, &whole).await {
                    canon = format!("/v1/{collection}/{whole}");
                }
            }
        }
    }
    let effective = if rewrite.is_some() {
        canon.as_str()
    } else {
        path
    };
    if let Some(ident) = effective
        .strip_prefix("/v1/nodes/")
        .and_then(|rest| rest.split('/').next())
        .filter(|i| !i.is_empty() && !NODE_COLLECTION_WORDS.contains(i))
    {
        // Percent-encoded characters are not in a valid name either, so the raw segment
        // is checked as it came.
        if let Err(e) = body::check_uuid_or_name("node_ident", ident) {
            return e.into_response();
        }
    }
    if rewrite.is_some() {
        let rewritten = match req.uri().query() {
            Some(q) => format!("{canon}?{q}"),
            None => canon,
        };
        match rewritten.parse::<Uri>() {
            Ok(uri) => *req.uri_mut() = uri,
            Err(_) => {
                return ApiError::bad_request(format!("malformed request path {path:?}"))
                    .into_response()
            }
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `normalize` routes by below 1.91: the rewritten path, or the path as it came.
    fn canonical(path: &str) -> (String, bool) {
        super::canonical(path, true).unwrap_or_else(|| (path.to_string(), false))
    }

    #[test]
    fn v1_is_added_to_ironic_collections_only() {
        assert_eq!(canonical("/nodes/detail").0, "/v1/nodes/detail");
        assert_eq!(canonical("/nodes").0, "/v1/nodes");
        assert_eq!(canonical("/volume/targets").0, "/v1/volume/targets");
        for kept in [
            "/",
            "/v1",
            "/metrics",
            "/agent/v1/lookup",
            "/boot/ipxe",
            "/v1/nodes",
        ] {
            assert_eq!(canonical(kept), (kept.to_string(), false), "{kept}");
        }
    }

    #[test]
    fn a_json_suffix_is_taken_off() {
        assert_eq!(
            canonical("/v1/nodes/n1.json"),
            ("/v1/nodes/n1".into(), true)
        );
        assert_eq!(canonical("/v1/nodes.json"), ("/v1/nodes".into(), true));
        assert_eq!(canonical("/nodes/n1.json"), ("/v1/nodes/n1".into(), true));
        assert_eq!(
            canonical("/v1/nodes/n1/states.json/"),
            ("/v1/nodes/n1/states".into(), true)
        );
        assert_eq!(
            canonical("/v1/openapi.json"),
            ("/v1/openapi.json".into(), false)
        );
        assert!(!canonical("/v1/nodes/.json").1);
        // From 1.91 the suffix is part of the identifier.
        assert_eq!(super::canonical("/v1/nodes/n1.json", false), None);
        assert_eq!(
            super::canonical("/nodes/n1.json", false),
            Some(("/v1/nodes/n1.json".into(), false))
        );
    }

    #[test]
    fn only_a_version_below_1_91_strips() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(VERSION_HEADER, v.parse().expect("header value"));
            strips_json(&h)
        };
        assert!(with("1.90") && with("1.1") && with(" 1.6 "));
        assert!(!with("1.91") && !with("1.99") && !with("latest") && !with("1.0"));
        assert!(!with("bogus") && !strips_json(&HeaderMap::new()));
    }

    #[test]
    fn a_member_is_the_last_segment() {
        assert_eq!(member("/v1/nodes/n1"), Some(("nodes", "n1")));
        assert_eq!(member("/v1/nodes/n1/states"), None);
        assert_eq!(member("/v1/nodes"), None);
    }
}
