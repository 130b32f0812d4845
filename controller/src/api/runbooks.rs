//! `/v1/runbooks` (Ironic 1.92): named step lists a node may run when one of its traits is
//! the runbook's name. `{"target": "clean"|"service", "runbook": X}` is resolved here
//! ([`resolve`]) into the request's `clean_steps`/`service_steps` before the verb runs.
//! The resource is the one deploy templates use too (`super::step_templates`).

use super::resource::{self, fetch, Access};
use super::step_templates::{self as dt, Spec};
use super::version::ApiVersion;
use super::{ApiError, ApiResult, AppState};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use rivet_model::microversions as mv;
use rivet_protocol::api::ProvisionRequest;
use rivet_protocol::states::Verb;
use rivet_protocol::steps::RequestedStep;
use rivet_store::{StepTemplate, TemplateKind};
use serde_json::{json, Map, Value};

const RUNBOOK: Spec = Spec {
    kind: TemplateKind::Runbook,
    collection: "runbooks",
    since: mv::RUNBOOKS,
    label: "Runbook",
    order_key: "order",
    args_required: false,
    create_fields: &[
        "uuid",
        "name",
        "steps",
        "disable_ramdisk",
        "extra",
        "public",
        "owner",
    ],
    filters: &["owner", "public"],
    traits_since: Some(mv::RUNBOOK_TRAITS),
};

/// Runbooks.
pub(super) struct Runbook;

impl dt::Kind for Runbook {
    const SPEC: Spec = RUNBOOK;
}

/// The runbook collection.
type Api = dt::Api<Runbook>;

pub fn routes() -> Router<AppState> {
    resource::routes::<Api>()
        .route(
            "/v1/runbooks/{ident}/traits",
            get(traits_list).put(traits_set).delete(traits_clear),
        )
        .route(
            "/v1/runbooks/{ident}/traits/{name}",
            put(trait_add).delete(trait_remove),
        )
}

/// The runbook for a traits request; 404 below 1.112 as Ironic.
async fn traits_of(state: &AppState, version: (u32, u32), ident: &str) -> ApiResult<StepTemplate> {
    if version < mv::RUNBOOK_TRAITS {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "The API version does not allow runbook traits (send X-OpenStack-Ironic-API-Version: 1.112 or later)",
        ));
    }
    fetch::<Api>(state, ident, Access::Read).await
}

fn check_trait(t: &Value) -> ApiResult<()> {
    match super::node_actions::traits::trait_error(t) {
        Some(e) => Err(ApiError::bad_request(e)),
        None => Ok(()),
    }
}

async fn save_traits(state: &AppState, mut r: StepTemplate, traits: Vec<String>) -> ApiResult<()> {
    let mut traits: Vec<String> = traits
        .into_iter()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    std::mem::swap(&mut r.traits, &mut traits);
    state.conductor.store.update_template(&r).await?;
    Ok(())
}

async fn traits_list(
    State(state): State<AppState>,
    ApiVersion(version): ApiVersion,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
    let r = traits_of(&state, version, &ident).await?;
    Ok(Json(json!({ "traits": r.traits })))
}

const ONE_OR_ALL: &str = "A single runbook trait may be added via PUT /v1/runbooks/<runbook identifier>/traits/<trait> with no body, or all runbook traits may be replaced via PUT /v1/runbooks/<runbook identifier>/traits with the list of traits specified in the request body.";

async fn traits_set(
    State(state): State<AppState>,
    ApiVersion(version): ApiVersion,
    Path(ident): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let r = traits_of(&state, version, &ident).await?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(ONE_OR_ALL));
    }
    let doc: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("the body is not JSON: {e}")))?;
    let Value::Object(m) = doc else {
        return Err(ApiError::bad_request(ONE_OR_ALL));
    };
    if let Some(bad) = m.keys().find(|k| *k != "traits") {
        return Err(ApiError::bad_request(format!(
            "Additional properties are not allowed ('{bad}' was unexpected)"
        )));
    }
    let Some(Value::Array(items)) = m.get("traits") else {
        return Err(ApiError::bad_request(ONE_OR_ALL));
    };
    items.iter().try_for_each(check_trait)?;
    let traits = items
        .iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    save_traits(&state, r, traits).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn trait_add(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiVersion(version): ApiVersion,
    Path((ident, name)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<Response> {
    let r = traits_of(&state, version, &ident).await?;
    check_trait(&Value::from(name.clone()))?;
    if !body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "No body should be provided when adding a trait",
        ));
    }
    let mut traits = r.traits.clone();
    traits.push(name.clone());
    save_traits(&state, r, traits).await?;
    let mut resp = StatusCode::NO_CONTENT.into_response();
    if let Ok(loc) = HeaderValue::from_str(&format!(
        "{}/v1/runbooks/{ident}/traits/{name}",
        super::render::base_url(&headers)
    )) {
        resp.headers_mut().insert(header::LOCATION, loc);
    }
    Ok(resp)
}

async fn traits_clear(
    State(state): State<AppState>,
    ApiVersion(version): ApiVersion,
    Path(ident): Path<String>,
) -> ApiResult<StatusCode> {
    let r = traits_of(&state, version, &ident).await?;
    save_traits(&state, r, Vec::new()).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn trait_remove(
    State(state): State<AppState>,
    ApiVersion(version): ApiVersion,
    Path((ident, name)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let r = traits_of(&state, version, &ident).await?;
    // Removing a trait the runbook does not have is a no-op, as in Ironic.
    let traits = r.traits.iter().filter(|t| **t != name).cloned().collect();
    save_traits(&state, r, traits).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Ironic's `_handle_runbook`: a request naming a runbook gets the runbook's steps (in
/// their `order`) as its `clean_steps` or `service_steps`, once the node is found to carry
/// the runbook's name among its traits. A no-op without `runbook`.
pub(super) async fn resolve(
    state: &AppState,
    node_ident: &str,
    req: &mut ProvisionRequest,
    version: (u32, u32),
) -> ApiResult<()> {
    let Some(ident) = req.runbook.take() else {
        return Ok(());
    };
    if version < RUNBOOK.since {
        return Err(ApiError::new(
            StatusCode::NOT_ACCEPTABLE,
            "Request not acceptable. The minimal required API version should be 1.92 for runbook",
        ));
    }
    if !matches!(req.target, Verb::Clean | Verb::Service) {
        return Err(ApiError::bad_request(
            "\"runbooks\" is only valid when setting target provision state to any of ['clean', 'service']",
        ));
    }
    let runbook = fetch::<Api>(state, &ident, Access::Read).await?;
    let node = state.conductor.store.get_node(node_ident).await?;
    if version >= mv::RUNBOOK_TRAITS {
        // 1.112: one of the runbook's traits must be the node's.
        if runbook.traits.is_empty() {
            return Err(ApiError::bad_request(format!(
                "Runbook {} has no traits configured. Please ask an administrator to add traits to the runbook.",
                runbook.uuid
            )));
        }
        if !runbook.traits.iter().any(|t| node.traits.contains(t)) {
            let mut wanted = runbook.traits.clone();
            wanted.sort();
            return Err(ApiError::bad_request(format!(
                "This runbook has not been approved for use on this node {}. The node does not have any of the runbook's traits {wanted:?}. Please ask an administrator to add a matching trait to your node.",
                node.uuid
            )));
        }
    } else if !node.traits.contains(&runbook.name) {
        return Err(ApiError::bad_request(format!(
            "This runbook has not been approved for use on this node {}. Please ask an administrator to add it to your node traits.",
            node.uuid
        )));
    }
    let mut steps: Vec<(i64, RequestedStep)> = runbook
        .steps
        .iter()
        .map(|s| {
            let order = s.get("order").and_then(Value::as_i64).unwrap_or(0);
            let step = RequestedStep {
                interface: s
                    .get("interface")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                step: s
                    .get("step")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                args: match s.get("args") {
                    Some(Value::Object(a)) => a.clone(),
                    _ => Map::new(),
                },
                order: Some(order),
            };
            (order, step)
        })
        .collect();
    steps.sort_by_key(|(o, _)| *o);
    let steps: Vec<RequestedStep> = steps.into_iter().map(|(_, s)| s).collect();
    let (slot, what) = match req.target {
        Verb::Service => (&mut req.service_steps, "service_steps"),
        _ => (&mut req.clean_steps, "clean_steps"),
    };
    if slot.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::bad_request(format!(
            "Please provide either \"{what}\" or a runbook, but not both."
        )));
    }
    *slot = Some(steps);
    if runbook.disable_ramdisk {
        req.disable_ramdisk = Some(true);
    }
    tracing::info!(node = %node.uuid, runbook = %runbook.name, target = %req.target, "steps of runbook requested");
    Ok(())
}
