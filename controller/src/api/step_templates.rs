//! What deploy templates and runbooks share: both are a named list of steps whose name is a
//! trait, served as one [`Resource`] ([`Api`]) that a [`Spec`] tells apart. The two
//! collections (`deploy_templates`, `runbooks`) sit above this module and name their spec.

use super::body::{at_most, is_logical_name, object_body, object_in, string_in, Named};
use super::render::document;
use super::resource::{fetch, found, page_of, paged, Access, Listing, Page, Patched, Resource};
use super::{listing, ApiError, ApiResult, AppState};
use chrono::Utc;
use rivet_store::{StepTemplate, StoreError, TemplateKind, TemplateQuery, TEMPLATE_SORT_KEYS};
use serde_json::{json, Map, Value};
use std::collections::HashSet;
use std::marker::PhantomData;

/// What differs between deploy templates and runbooks.
pub(super) struct Spec {
    pub kind: TemplateKind,
    /// Path segment and collection key.
    pub collection: &'static str,
    /// Microversion that adds the resource.
    pub since: (u32, u32),
    /// How messages call one.
    pub label: &'static str,
    /// The step's ordering key: `priority` (deploy) or `order` (runbook).
    pub order_key: &'static str,
    /// Whether a step must carry `args`.
    pub args_required: bool,
    /// Top-level fields a create body may have; a patch may change them all but `uuid`.
    pub create_fields: &'static [&'static str],
    /// The listing's filters.
    pub filters: &'static [&'static str],
    /// The version from which `description` and `traits` are shown and the name is any
    /// logical name instead of a trait (runbooks 1.112); `None`: description always, no
    /// traits, the name a trait.
    pub traits_since: Option<(u32, u32)>,
}

/// Step interfaces Ironic accepts in templates (`DEPLOYING_INTERFACE_PRIORITY`, the same
/// set as cleaning's).
const INTERFACES: &[&str] = &[
    "vendor",
    "power",
    "management",
    "firmware",
    "deploy",
    "bios",
    "raid",
];

/// The document of a template; step `args` with secrets masked as Ironic masks them.
pub(super) fn doc(
    spec: &Spec,
    t: &StepTemplate,
    base: &str,
    version: (u32, u32),
) -> Map<String, Value> {
    let steps: Vec<Value> = t
        .steps
        .iter()
        .map(|s| {
            let mut s = s.clone();
            if let Some(Value::Object(args)) = s.get("args") {
                s["args"] = Value::Object(rivet_drivers::mask_secrets(args));
            }
            s
        })
        .collect();
    let mut m = document(
        json!({
        "uuid": t.uuid,
        "name": t.name,
        "steps": steps,
        "extra": t.extra,
        }),
        base,
        spec.collection,
        &t.uuid,
        t.created_at,
        t.updated_at,
    );
    match spec.kind {
        TemplateKind::Deploy => {
            m.insert("description".into(), json!(t.description));
        }
        TemplateKind::Runbook => {
            m.insert("owner".into(), json!(t.owner));
            m.insert("public".into(), json!(t.public));
            m.insert("disable_ramdisk".into(), json!(t.disable_ramdisk));
            if new_runbook(spec, version) {
                m.insert("description".into(), json!(t.description));
                m.insert("traits".into(), json!(t.traits));
            }
        }
    }
    m
}

/// Whether `version` sees runbooks as 1.112 made them (traits, description, free names).
pub(super) fn new_runbook(spec: &Spec, version: (u32, u32)) -> bool {
    spec.traits_since.is_some_and(|since| version >= since)
}

/// A step's ordering value: an integer ≥ 0 or a string of digits (Ironic's schema).
fn order_value(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().filter(|i| *i >= 0),
        Value::String(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
            s.parse().ok()
        }
        _ => None,
    }
}

/// Steps checked as Ironic's `DEPLOY_STEP_SCHEMA`/`RUNBOOK_STEP_SCHEMA` and its duplicate
/// check; returned normalized (the ordering value an integer, `args` an object).
pub(super) fn check_steps(spec: &Spec, steps: &Value) -> Result<Vec<Value>, ApiError> {
    let Value::Array(items) = steps else {
        return Err(ApiError::bad_request(format!(
            "{steps} is not of type 'array' (field steps)"
        )));
    };
    if items.is_empty() {
        return Err(ApiError::bad_request(
            "[] is too short: a template needs at least one step (field steps)",
        ));
    }
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut dups = Vec::new();
    for (i, s) in items.iter().enumerate() {
        let Value::Object(m) = s else {
            return Err(ApiError::bad_request(format!(
                "steps[{i}]: {s} is not of type 'object'"
            )));
        };
        let allowed = ["interface", "step", "args", spec.order_key];
        if let Some(bad) = m.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(ApiError::bad_request(format!(
                "steps[{i}]: Additional properties are not allowed ('{bad}' was unexpected)"
            )));
        }
        let mut required = vec!["interface", "step", spec.order_key];
        if spec.args_required {
            required.push("args");
        }
        if let Some(missing) = required.iter().find(|k| !m.contains_key(**k)) {
            return Err(ApiError::bad_request(format!(
                "steps[{i}]: '{missing}' is a required property"
            )));
        }
        let interface = m.get("interface").and_then(Value::as_str).unwrap_or("");
        if !INTERFACES.contains(&interface) {
            return Err(ApiError::bad_request(format!(
                "steps[{i}]: interface {} is not one of {}",
                m.get("interface").cloned().unwrap_or(Value::Null),
                INTERFACES.join(", ")
            )));
        }
        let step = match m.get("step") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            other => {
                return Err(ApiError::bad_request(format!(
                    "steps[{i}]: step {} must be a non-empty string",
                    other.cloned().unwrap_or(Value::Null)
                )))
            }
        };
        let args = match m.get("args") {
            None => Map::new(),
            Some(Value::Object(a)) => a.clone(),
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "steps[{i}]: args {other} is not of type 'object'"
                )))
            }
        };
        let order = m.get(spec.order_key).and_then(order_value).ok_or_else(|| {
            ApiError::bad_request(format!(
                "steps[{i}]: {} {} must be an integer of 0 or more",
                spec.order_key,
                m.get(spec.order_key).cloned().unwrap_or(Value::Null)
            ))
        })?;
        if !seen.insert((interface.to_string(), step.clone())) {
            dups.push(format!("interface: {interface}, step: {step}"));
        }
        out.push(json!({
            "interface": interface,
            "step": step,
            "args": args,
            spec.order_key: order,
        }));
    }
    if !dups.is_empty() {
        return Err(ApiError::bad_request(format!(
            "Duplicate {} steps. A {} cannot have multiple steps with the same interface and step. Duplicates: {}",
            if spec.kind == TemplateKind::Deploy { "deploy" } else { "runbook" },
            spec.label.to_lowercase(),
            dups.join("; ")
        )));
    }
    Ok(out)
}

/// A name: a trait, or (runbooks from 1.112) any RFC 3986 unreserved string.
fn check_name(name: &Value, logical: bool) -> Result<String, ApiError> {
    if logical {
        if !name.as_str().is_some_and(is_logical_name) {
            return Err(ApiError::bad_request(format!(
                "name: {name} does not match '^[A-Za-z0-9\\-._~]+$' (1-255 characters)"
            )));
        }
    } else if let Some(e) = super::node_actions::traits::trait_error(name) {
        return Err(ApiError::bad_request(format!("name: {e}")));
    }
    Ok(name.as_str().unwrap_or_default().to_string())
}

fn opt_string(doc: &Map<String, Value>, key: &str, max: usize) -> Result<Option<String>, ApiError> {
    at_most(key, string_in(doc, key, Named::Field)?, max)
}

fn opt_bool(doc: &Map<String, Value>, key: &str) -> Result<bool, ApiError> {
    match doc.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(ApiError::bad_request(format!(
            "{other} is not of type 'boolean', 'null' (field {key})"
        ))),
    }
}

/// The template a (created or patched) document describes, checked.
fn from_doc(
    spec: &Spec,
    d: &Map<String, Value>,
    base: StepTemplate,
    version: (u32, u32),
) -> Result<StepTemplate, ApiError> {
    let name = check_name(
        d.get("name")
            .ok_or_else(|| ApiError::bad_request("'name' is a required property"))?,
        new_runbook(spec, version),
    )?;
    let steps = check_steps(
        spec,
        d.get("steps")
            .ok_or_else(|| ApiError::bad_request("'steps' is a required property"))?,
    )?;
    let extra = object_in(d, "extra", Named::Field)?;
    let mut t = StepTemplate {
        name,
        steps,
        extra,
        ..base
    };
    match spec.kind {
        TemplateKind::Deploy => t.description = opt_string(d, "description", 255)?,
        TemplateKind::Runbook => {
            if new_runbook(spec, version) {
                t.description = opt_string(d, "description", 255)?;
            }
            t.owner = opt_string(d, "owner", 255)?;
            t.public = opt_bool(d, "public")?;
            t.disable_ramdisk = opt_bool(d, "disable_ramdisk")?;
        }
    }
    Ok(t)
}

/// Which of the two a template collection is.
pub(super) trait Kind: Send + Sync + 'static {
    const SPEC: Spec;
}

/// A template collection: `/v1/deploy_templates` or `/v1/runbooks`.
pub(super) struct Api<K>(PhantomData<fn() -> K>);

impl<K: Kind> Resource for Api<K> {
    type Record = StepTemplate;
    const PATH: &'static str = K::SPEC.collection;
    /// Ironic has no `/detail` listing for templates or runbooks (`?detail=true` instead):
    /// `…/detail` is a template named `detail`.
    const DETAIL_ROUTE: bool = false;
    const NAME: &'static str = K::SPEC.label;
    const SINCE: (u32, u32) = K::SPEC.since;
    const LIST_FIELDS: &'static [&'static str] = &["uuid", "name", "links"];
    const FILTERS: &'static [&'static str] = K::SPEC.filters;
    const SORT_KEYS: &'static [&'static str] = TEMPLATE_SORT_KEYS;
    const UNSORTABLE: &'static [&'static str] = &[];

    fn doc(t: &StepTemplate, base: &str, version: (u32, u32)) -> Map<String, Value> {
        doc(&K::SPEC, t, base, version)
    }

    fn blank() -> StepTemplate {
        StepTemplate {
            kind: K::SPEC.kind,
            uuid: String::new(),
            name: String::new(),
            description: None,
            traits: Vec::new(),
            steps: Vec::new(),
            extra: Map::new(),
            owner: None,
            public: false,
            disable_ramdisk: false,
            created_at: Utc::now(),
            updated_at: None,
            version: 0,
        }
    }
    /// A UUID or a name (Ironic's `args.uuid_or_name`), else a 400.
    fn ident(ident: &str, _access: Access) -> ApiResult<String> {
        let what = match K::SPEC.kind {
            TemplateKind::Deploy => "template_ident",
            _ => "runbook_ident",
        };
        super::body::check_uuid_or_name(what, ident)
    }

    async fn get(state: &AppState, ident: &str) -> Result<StepTemplate, StoreError> {
        state
            .conductor
            .store
            .get_template(K::SPEC.kind, ident)
            .await
    }

    fn unknown_sort_key(key: &str) -> ApiError {
        ApiError::bad_request(format!(
            "The sort_key value {key} is an invalid field for sorting; use one of {}",
            TEMPLATE_SORT_KEYS.join(", ")
        ))
    }

    /// A marker is a template by UUID or name.
    async fn marker(state: &AppState, marker: &str) -> ApiResult<String> {
        Ok(fetch::<Self>(state, marker, Access::Read).await?.uuid)
    }

    async fn list(state: &AppState, l: &Listing<'_>, page: Page) -> ApiResult<Vec<StepTemplate>> {
        let params = l.params;
        let q = paged!(
            TemplateQuery {
                owner: params.get("owner").cloned(),
                public: listing::bool_param(params, "public")?,
                ..TemplateQuery::all(K::SPEC.kind)
            },
            page
        );
        page_of::<Self, _>(state.conductor.store.list_templates(&q).await)
    }

    type Body = Value;

    async fn create(state: &AppState, body: Value, version: (u32, u32)) -> ApiResult<StepTemplate> {
        let spec = &K::SPEC;
        let mut allowed = spec.create_fields.to_vec();
        if new_runbook(spec, version) {
            allowed.push("description");
        }
        let what = format!("a {}", spec.label.to_lowercase());
        let body = object_body(body, &what, &allowed)?;
        let uuid = match body.get("uuid") {
            None | Some(Value::Null) => uuid::Uuid::new_v4().to_string(),
            Some(Value::String(u)) => uuid::Uuid::parse_str(u)
                .map_err(|_| ApiError::bad_request(format!("Expected a UUID but received {u}.")))?
                .to_string(),
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "{other} is not of type 'string', 'null' (field uuid)"
                )))
            }
        };
        let blank = StepTemplate {
            uuid,
            ..Self::blank()
        };
        let t = from_doc(spec, &body, blank, version)?;
        let saved = state.conductor.store.create_template(&t).await?;
        tracing::info!(kind = spec.kind.as_str(), uuid = %saved.uuid, name = %saved.name, "template created");
        Ok(saved)
    }
    fn patch_doc(t: &StepTemplate, version: (u32, u32)) -> ApiResult<Value> {
        let mut d = Value::Object(doc(&K::SPEC, t, "", version));
        // Patch the stored steps, not the masked ones shown. The shared patch applier walks
        // objects only: the steps are keyed by index for the patch (`/steps/0/priority`) and
        // made a list again after it, `-` (append) last.
        d["steps"] = Value::Object(
            t.steps
                .iter()
                .enumerate()
                .map(|(i, s)| (i.to_string(), s.clone()))
                .collect(),
        );
        Ok(d)
    }

    fn patchable(version: (u32, u32)) -> Vec<&'static str> {
        let mut patchable: Vec<&str> = K::SPEC.create_fields.to_vec();
        patchable.retain(|f| *f != "uuid");
        if new_runbook(&K::SPEC, version) {
            patchable.push("description");
        }
        patchable
    }

    async fn patched(state: &AppState, t: StepTemplate, p: Patched<'_>) -> ApiResult<StepTemplate> {
        let mut d = p.doc;
        let version = p.version;
        if let Some(Value::Object(by_index)) = d.get("steps") {
            let mut items: Vec<(usize, Value)> = Vec::new();
            for (k, v) in by_index {
                let i = match k.as_str() {
                    "-" => usize::MAX,
                    k => k.parse().map_err(|_| {
                        ApiError::bad_request(format!("patch path /steps/{k}: not a step index"))
                    })?,
                };
                items.push((i, v.clone()));
            }
            items.sort_by_key(|(i, _)| *i);
            d.insert(
                "steps".into(),
                Value::Array(items.into_iter().map(|(_, v)| v).collect()),
            );
        }
        let new = from_doc(&K::SPEC, &d, t, version)?;
        Ok(state.conductor.store.update_template(&new).await?)
    }
    async fn delete(state: &AppState, t: StepTemplate) -> ApiResult<()> {
        let store = &state.conductor.store;
        found::<Self, _>(&t.uuid, store.delete_template(K::SPEC.kind, &t.uuid).await)
    }
}
