//! `GET /v1/nodes/{node}/children` (API 1.83): the UUIDs of the nodes whose `parent_node`
//! is this node, and a link to the node listing filtered by it. 404 below 1.83, as Ironic.

use super::ver;
use crate::api::render::base_url;
use crate::api::{ApiError, ApiResult, ApiVersion, AppState};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::{Extension, Json};
use serde_json::{json, Value};

/// `MINOR_83_PARENT_CHILD_NODES`.
const CHILDREN_VERSION: (u32, u32) = (1, 83);

pub(super) async fn children(
    State(state): State<AppState>,
    Extension(ApiVersion(version)): Extension<ApiVersion>,
    headers: HeaderMap,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
    if version < CHILDREN_VERSION {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "child nodes need API version {} or later; this request asked for {}",
                ver(CHILDREN_VERSION),
                ver(version)
            ),
        ));
    }
    let node = state.conductor.store.get_node(&ident).await?;
    let kids = state.conductor.store.child_nodes(&node.uuid).await?;
    let base = base_url(&headers);
    Ok(Json(json!({
        "children": kids,
        "links": {
            "href": format!("{base}/v1/nodes/?parent_node={}", node.uuid),
            "rel": "children",
        },
    })))
}
