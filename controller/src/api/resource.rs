//! One resource layer for the admin API's collections: ports, port groups, chassis,
//! allocations, deploy templates, runbooks, volume connectors and targets, inspection rules.
//!
//! A [`Resource`] says only what is the resource's own: its record and store calls, its
//! document, the filters of its listing, its sort keys, list fields and patchable fields,
//! its microversion gates, its checks, and Ironic's words for its errors (the hooks with a
//! default are where resources differ). The handlers here — list, show, create, PATCH,
//! DELETE and [`routes`] — are written once for all of them, so that a listing pages, links
//! its next page, takes `fields=` and `detail` the same way everywhere.

use super::body::check_uuid;
use super::listing;
use super::render::{base_url, created, parse_fields, select};
use super::version::{check_gated, ApiVersion};
use super::{patch, ApiError, ApiResult, AppState, JsonBody};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use rivet_protocol::api::PatchOp;
use rivet_store::{SortDir, StoreError};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::future::Future;

/// What a request does to a resource, for its microversion gate (Ironic answers reads and
/// writes of a too-new resource differently for some resources).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    Read,
    Create,
    Update,
    Delete,
}

/// The parent a listing is under (`/v1/nodes/{node}/ports`), as the path named it.
pub(super) enum Parent {
    Node(String),
    Portgroup(String),
}

/// What every listing reads the same way: the page asked for.
pub(super) struct Page {
    pub limit: usize,
    /// The marker as [`Resource::marker`] resolved it.
    pub marker: Option<String>,
    pub sort_key: String,
    /// `None` when the request gave no `sort_dir` (each store has its default).
    pub sort_dir: Option<SortDir>,
}

/// The query parameters of every listing, after its filters; `/detail` takes neither
/// `fields` nor `detail` (Ironic's `detail_request_query`).
pub(super) const PAGE_PARAMS: &[&str] = &[
    "limit", "marker", "sort_key", "sort_dir", "fields", "detail",
];

/// A listing as its resource's hooks see it.
pub(super) struct Listing<'a> {
    pub params: &'a HashMap<String, String>,
    pub version: (u32, u32),
    pub parent: Option<&'a Parent>,
    /// The listing's path (`/v1/nodes/{node}/ports/detail`), for messages and its next link.
    pub path: &'a str,
}

impl Listing<'_> {
    /// The node the listing is under, else the one its `param` filter names.
    pub fn node(&self, param: &str) -> Option<&String> {
        match self.parent {
            Some(Parent::Node(n)) => Some(n),
            _ => self.params.get(param),
        }
    }
}

/// A PATCH as its resource's hooks see it: the patched document, and the request.
pub(super) struct Patched<'a> {
    pub doc: Map<String, Value>,
    pub ops: &'a [PatchOp],
    pub version: (u32, u32),
}

/// A store query's `sort_dir`: some stores take the request's (`None`: their default), the
/// others ascending unless told otherwise.
pub(super) trait SortParam {
    fn from_request(dir: Option<SortDir>) -> Self;
}

impl SortParam for Option<SortDir> {
    fn from_request(dir: Option<SortDir>) -> Self {
        dir
    }
}

impl SortParam for SortDir {
    fn from_request(dir: Option<SortDir>) -> Self {
        dir.unwrap_or(SortDir::Asc)
    }
}

/// A store query with a listing's [`Page`] and the resource's own filters:
/// `paged!(PortQuery { node_uuid, address }, page)`.
macro_rules! paged {
    ($query:ident { $($filters:tt)* }, $page:expr) => {{
        let page: super::resource::Page = $page;
        $query {
            limit: page.limit,
            marker: page.marker,
            sort_key: page.sort_key,
            sort_dir: super::resource::SortParam::from_request(page.sort_dir),
            $($filters)*
        }
    }};
}
pub(super) use paged;

/// The `fields` of a single-resource GET's query.
pub(super) trait ShowFields {
    fn fields(&self) -> Option<&str>;
}

impl ShowFields for listing::ShowParams {
    fn fields(&self) -> Option<&str> {
        self.fields.as_deref()
    }
}

impl ShowFields for listing::ShowParamsDetail {
    fn fields(&self) -> Option<&str> {
        self.fields.as_deref()
    }
}

/// A collection of the admin API. See the module documentation.
pub(super) trait Resource: Send + Sync + 'static {
    /// The stored record.
    type Record: Send + Sync;
    /// The body a create takes.
    type Body: DeserializeOwned + rivet_protocol::limits::Limited + Send;

    /// The path under `/v1` (`ports`, `volume/connectors`), also the kind of its links.
    const PATH: &'static str;
    /// How Ironic names one in its messages (`Port`, `Volume connector`).
    const NAME: &'static str;
    /// The path parameter's name in the routes (the OpenAPI document names it so).
    const IDENT: &'static str = "ident";
    /// Whether a single-resource GET takes (and ignores) `detail`, as Ironic's volume API.
    const SHOW_TAKES_DETAIL: bool = false;
    /// Whether the collection has a `/detail` listing.
    const DETAIL_ROUTE: bool = true;
    /// The microversion that adds the resource (a constant of `rivet_model::microversions`).
    const SINCE: (u32, u32) = rivet_model::microversions::BASE;
    /// Fields that appeared after the resource, with the microversion of each: a client
    /// below it is refused them in `fields`, PATCH paths and `sort_key` (406).
    const FIELD_VERSIONS: &'static [(&'static str, (u32, u32))] = &[];
    /// Fields of a listing without `detail` (Ironic's `_DEFAULT_RETURN_FIELDS`).
    const LIST_FIELDS: &'static [&'static str];
    /// The listing's own query parameters (its filters); every listing takes the page's
    /// too ([`PAGE_PARAMS`]).
    const FILTERS: &'static [&'static str] = &[];
    /// Whether a listing takes `detail` (Ironic's allocations do not: they show whole
    /// documents).
    const DETAIL_PARAM: bool = true;
    /// Keys a listing sorts by.
    const SORT_KEYS: &'static [&'static str];
    /// Fields Ironic refuses to sort by (its `invalid_sort_key_list`).
    const UNSORTABLE: &'static [&'static str] = &["extra"];
    /// Fields a PATCH may change (Ironic's `PATCH_ALLOWED_FIELDS`).
    const PATCHABLE: &'static [&'static str] = &[];
    /// The largest page; `None`: `[api] max_limit`.
    const MAX_LIMIT: Option<usize> = None;

    /// The record's document as a client at `version` sees it.
    fn doc(r: &Self::Record, base: &str, version: (u32, u32)) -> Map<String, Value>;
    /// An empty record: its document names the fields `fields=` may ask for.
    fn blank() -> Self::Record;
    /// The record by identifier.
    fn get(
        state: &AppState,
        ident: &str,
    ) -> impl Future<Output = Result<Self::Record, StoreError>> + Send;

    /// One page of a listing: the resource's filters, the page, the store's answer (see
    /// [`page_of`]).
    fn list(
        state: &AppState,
        listing: &Listing<'_>,
        page: Page,
    ) -> impl Future<Output = ApiResult<Vec<Self::Record>>> + Send;

    /// A new record from a create's body (checked, stored).
    fn create(
        state: &AppState,
        body: Self::Body,
        version: (u32, u32),
    ) -> impl Future<Output = ApiResult<Self::Record>> + Send;

    /// The record a patched document describes (checked, stored).
    fn patched(
        state: &AppState,
        r: Self::Record,
        patch: Patched<'_>,
    ) -> impl Future<Output = ApiResult<Self::Record>> + Send;

    /// Deletes the record (after the resource's own refusals).
    fn delete(state: &AppState, r: Self::Record) -> impl Future<Output = ApiResult<()>> + Send;

    // ------------------------------------------------------------- hooks with a default

    /// The microversion a request of `access` needs.
    fn since(_access: Access) -> (u32, u32) {
        Self::SINCE
    }

    /// Ironic's answer to a request of `access` below [`Resource::since`].
    fn too_old(version: (u32, u32), access: Access) -> ApiError {
        let since = Self::since(access);
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "The API version does not allow {} (this request asked for {}.{}; send \
                 X-OpenStack-Ironic-API-Version: {}.{} or later)",
                Self::PATH.replace('_', " "),
                version.0,
                version.1,
                since.0,
                since.1
            ),
        )
    }

    /// Fields a PATCH may change at `version`.
    fn patchable(_version: (u32, u32)) -> Vec<&'static str> {
        Self::PATCHABLE.to_vec()
    }

    /// The document a PATCH applies to: the patchable fields of the record's document.
    /// Resources whose document hides fields from older clients patch the whole one, so that
    /// a PATCH from such a client keeps what it cannot see.
    fn patch_doc(r: &Self::Record, version: (u32, u32)) -> ApiResult<Value> {
        Ok(select(Self::doc(r, "", version), &Self::patchable(version)))
    }

    /// The identifier of a path, checked (some resources take UUIDs only).
    fn ident(ident: &str, _access: Access) -> ApiResult<String> {
        Ok(ident.to_string())
    }

    /// Gates of a listing's query parameters at `version`, and gates of its parent (`path`:
    /// the listing's, for the message).
    fn check_list(_listing: &Listing<'_>) -> ApiResult<()> {
        Ok(())
    }

    /// Gates of `fields=` at `version` (listing and show).
    fn check_fields(fields: &str, version: (u32, u32)) -> ApiResult<()> {
        check_gated(
            Self::FIELD_VERSIONS,
            fields.split(',').map(str::trim),
            version,
        )
    }

    /// Gates of a PATCH's paths at `version`.
    fn check_patch(ops: &[PatchOp], version: (u32, u32)) -> ApiResult<()> {
        let touched = patch::patched_fields(ops);
        check_gated(
            Self::FIELD_VERSIONS,
            touched.iter().map(String::as_str),
            version,
        )
    }

    /// Applies a PATCH to [`Resource::patch_doc`].
    fn apply_patch(doc: &mut Value, ops: &[PatchOp], version: (u32, u32)) -> ApiResult<()> {
        patch::apply(doc, ops, &Self::patchable(version))
    }

    /// A listing's unknown query parameter.
    fn unknown_param(bad: &str, allowed: &[&str]) -> ApiError {
        listing::unknown_param(bad, allowed)
    }

    /// A `sort_key` that is not one of [`Resource::SORT_KEYS`].
    fn unknown_sort_key(key: &str) -> ApiError {
        ApiError::bad_request(format!(
            "sort_key {key:?} is not supported; use one of {}",
            Self::SORT_KEYS.join(", ")
        ))
    }

    /// Whether a listing shows whole documents.
    fn detail(params: &HashMap<String, String>, from_detail: bool) -> ApiResult<bool> {
        listing::detail_param(params, from_detail)
    }

    /// The `marker` of a listing as its store takes it.
    fn marker(_state: &AppState, marker: &str) -> impl Future<Output = ApiResult<String>> + Send {
        let checked = check_uuid("marker", marker);
        async move { checked }
    }
}

/// Ironic's NotFound: `"{Name} {ident} could not be found."`.
pub(super) fn not_found(name: &str, ident: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("{name} {ident} could not be found."),
    )
}

/// A store result whose NotFound is `R`'s, in Ironic's words.
pub(super) fn found<R: Resource, T>(ident: &str, r: Result<T, StoreError>) -> ApiResult<T> {
    match r {
        Err(StoreError::NotFound { .. }) => Err(not_found(R::NAME, ident)),
        r => Ok(r?),
    }
}

/// A page from the store, its NotFound (the marker's) `R`'s.
pub(super) fn page_of<R: Resource, T>(r: Result<Vec<T>, StoreError>) -> ApiResult<Vec<T>> {
    match r {
        Err(StoreError::NotFound { ident, .. }) => Err(not_found(R::NAME, &ident)),
        r => Ok(r?),
    }
}

/// `R`'s microversion gate.
pub(super) fn gate<R: Resource>(version: (u32, u32), access: Access) -> ApiResult<()> {
    if version < R::since(access) {
        return Err(R::too_old(version, access));
    }
    Ok(())
}

/// The record a path names, its NotFound in Ironic's words.
pub(super) async fn fetch<R: Resource>(
    state: &AppState,
    ident: &str,
    access: Access,
) -> ApiResult<R::Record> {
    let ident = R::ident(ident, access)?;
    found::<R, _>(&ident, R::get(state, &ident).await)
}

/// Keeps `keep` of a document, and its links (Ironic's `sanitize_dict`, for a `fields=`
/// selection and a short listing alike).
pub(super) fn keep<R: Resource>(doc: Map<String, Value>, keep: &[impl AsRef<str>]) -> Value {
    super::render::sanitized(doc, keep)
}

/// The `fields=` of a request, checked against `R`'s document at `version`.
pub(super) fn fields_of<R: Resource>(
    fields: Option<&str>,
    base: &str,
    version: (u32, u32),
) -> ApiResult<Option<Vec<String>>> {
    if let Some(f) = fields {
        R::check_fields(f, version)?;
    }
    parse_fields(fields, &R::doc(&R::blank(), base, version))
}

/// The checked `sort_key` and `sort_dir` of a listing.
fn sort_of<R: Resource>(
    params: &HashMap<String, String>,
    version: (u32, u32),
) -> ApiResult<(String, Option<SortDir>)> {
    let sort_key = params
        .get("sort_key")
        .cloned()
        .unwrap_or_else(|| "id".into());
    check_gated(R::FIELD_VERSIONS, [sort_key.as_str()], version)?;
    if R::UNSORTABLE.contains(&sort_key.as_str()) {
        return Err(ApiError::bad_request(format!(
            "The sort_key value {sort_key} is an invalid field for sorting"
        )));
    }
    if !R::SORT_KEYS.contains(&sort_key.as_str()) {
        return Err(R::unknown_sort_key(&sort_key));
    }
    Ok((sort_key, listing::sort_dir_param(params)?))
}

/// A listing of `R`: the collection's, or its parent's; `/detail` when `from_detail`.
pub(super) async fn list_at<R: Resource>(
    state: &AppState,
    headers: &HeaderMap,
    version: (u32, u32),
    params: HashMap<String, String>,
    from_detail: bool,
    parent: Option<Parent>,
) -> ApiResult<Json<Value>> {
    gate::<R>(version, Access::Read)?;
    let allowed: Vec<&str> = R::FILTERS
        .iter()
        .chain(PAGE_PARAMS)
        .copied()
        .filter(|p| match *p {
            "fields" => !from_detail,
            "detail" => !from_detail && R::DETAIL_PARAM,
            _ => true,
        })
        .collect();
    if let Some(bad) = params.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(R::unknown_param(bad, &allowed));
    }
    let mut path = match &parent {
        None => format!("/v1/{}", R::PATH),
        Some(Parent::Node(n)) => format!("/v1/nodes/{n}/{}", R::PATH),
        Some(Parent::Portgroup(g)) => format!("/v1/portgroups/{g}/{}", R::PATH),
    };
    if from_detail {
        path.push_str("/detail");
    }
    let listing = Listing {
        params: &params,
        version,
        parent: parent.as_ref(),
        path: &path,
    };
    R::check_list(&listing)?;
    let base = base_url(headers);
    let fields = fields_of::<R>(params.get("fields").map(String::as_str), &base, version)?;
    let (sort_key, sort_dir) = sort_of::<R>(&params, version)?;
    let detail = R::detail(&params, from_detail)?;
    let marker = match params.get("marker") {
        Some(m) => Some(R::marker(state, m).await?),
        None => None,
    };
    let max = R::MAX_LIMIT.unwrap_or(state.conductor.config.api.max_limit);
    let limit = listing::page_limit(&params, max)?;
    let page = Page {
        limit,
        marker,
        sort_key,
        sort_dir,
    };
    let found = R::list(state, &listing, page).await?;
    let docs: Vec<Value> = found
        .iter()
        .map(|r| {
            let doc = R::doc(r, &base, version);
            match (&fields, detail) {
                (Some(f), _) => keep::<R>(doc, f),
                (None, true) => Value::Object(doc),
                (None, false) => keep::<R>(doc, R::LIST_FIELDS),
            }
        })
        .collect();
    let mut body = Map::new();
    // The listing's key: the collection's last path segment (`ports`, `connectors`).
    let key = R::PATH.rsplit('/').next().unwrap_or(R::PATH);
    body.insert(key.into(), Value::Array(docs));
    if found.len() == limit {
        if let Some(last) = found.last() {
            let doc = R::doc(last, &base, version);
            let uuid = doc.get("uuid").and_then(Value::as_str).unwrap_or_default();
            let next = listing::next_link(&base, &path, &params, limit, uuid);
            body.insert("next".into(), Value::from(next));
        }
    }
    Ok(Json(Value::Object(body)))
}

/// Where a listing handler is routed: the collection, or under a parent.
pub(super) trait At: Send + 'static {
    fn parent(ident: String) -> Option<Parent>;
}

/// `/v1/{collection}`.
pub(super) struct Collection;
/// `/v1/nodes/{node}/{collection}`.
pub(super) struct OfNode;
/// `/v1/portgroups/{portgroup}/{collection}`.
pub(super) struct OfPortgroup;

impl At for Collection {
    fn parent(_: String) -> Option<Parent> {
        None
    }
}

impl At for OfNode {
    fn parent(ident: String) -> Option<Parent> {
        Some(Parent::Node(ident))
    }
}

impl At for OfPortgroup {
    fn parent(ident: String) -> Option<Parent> {
        Some(Parent::Portgroup(ident))
    }
}

/// `GET` of a listing (`DETAIL`: its `/detail` form).
pub(super) async fn list<R: Resource, A: At, const DETAIL: bool>(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiVersion(version): ApiVersion,
    ident: Option<Path<String>>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    let parent = ident.and_then(|Path(i)| A::parent(i));
    list_at::<R>(&state, &headers, version, params, DETAIL, parent).await
}

/// `GET /v1/{collection}/{ident}`.
pub(super) async fn show<R: Resource, Q: DeserializeOwned + ShowFields + Send>(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiVersion(version): ApiVersion,
    Path(ident): Path<String>,
    Query(p): Query<Q>,
) -> ApiResult<Json<Value>> {
    gate::<R>(version, Access::Read)?;
    if let Some(f) = p.fields() {
        R::check_fields(f, version)?;
    }
    let r = fetch::<R>(&state, &ident, Access::Read).await?;
    let doc = R::doc(&r, &base_url(&headers), version);
    Ok(Json(match parse_fields(p.fields(), &doc)? {
        Some(f) => keep::<R>(doc, &f),
        None => Value::Object(doc),
    }))
}

/// `POST /v1/{collection}`: 201 with the document and its `Location`.
pub(super) async fn create<R: Resource>(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiVersion(version): ApiVersion,
    JsonBody(body): JsonBody<R::Body>,
) -> ApiResult<Response> {
    gate::<R>(version, Access::Create)?;
    let r = R::create(&state, body, version).await?;
    let base = base_url(&headers);
    let doc = R::doc(&r, &base, version);
    let uuid = doc
        .get("uuid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    Ok(created(doc, &base, R::PATH, &uuid))
}

/// `PATCH /v1/{collection}/{ident}` (JSON patch).
pub(super) async fn update<R: Resource>(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiVersion(version): ApiVersion,
    Path(ident): Path<String>,
    JsonBody(ops): JsonBody<Vec<PatchOp>>,
) -> ApiResult<Json<Value>> {
    gate::<R>(version, Access::Update)?;
    R::check_patch(&ops, version)?;
    let r = fetch::<R>(&state, &ident, Access::Update).await?;
    let mut doc = R::patch_doc(&r, version)?;
    R::apply_patch(&mut doc, &ops, version)?;
    let Value::Object(doc) = doc else {
        return Err(ApiError::bad_request(format!(
            "patch replaced the whole {}",
            R::NAME.to_lowercase()
        )));
    };
    let patch = Patched {
        doc,
        ops: &ops,
        version,
    };
    let saved = R::patched(&state, r, patch).await?;
    Ok(Json(Value::Object(R::doc(
        &saved,
        &base_url(&headers),
        version,
    ))))
}

/// `DELETE /v1/{collection}/{ident}`.
pub(super) async fn remove<R: Resource>(
    State(state): State<AppState>,
    ApiVersion(version): ApiVersion,
    Path(ident): Path<String>,
) -> ApiResult<StatusCode> {
    gate::<R>(version, Access::Delete)?;
    let r = fetch::<R>(&state, &ident, Access::Delete).await?;
    R::delete(&state, r).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The routes of `R`'s collection: `/v1/{collection}` (and with a trailing slash), its
/// `/detail`, and `/v1/{collection}/{ident}`.
pub(super) fn routes<R: Resource>() -> Router<AppState> {
    let path = format!("/v1/{}", R::PATH);
    let collection = || get(list::<R, Collection, false>).post(create::<R>);
    let one = if R::SHOW_TAKES_DETAIL {
        get(show::<R, listing::ShowParamsDetail>)
    } else {
        get(show::<R, listing::ShowParams>)
    };
    let mut router = Router::new()
        .route(&path, collection())
        .route(&format!("{path}/"), collection())
        .route(
            &format!("{path}/{{{}}}", R::IDENT),
            one.patch(update::<R>).delete(remove::<R>),
        );
    if R::DETAIL_ROUTE {
        router = router.route(&format!("{path}/detail"), get(list::<R, Collection, true>));
    }
    router
}
