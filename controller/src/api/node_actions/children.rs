//! `GET /v1/nodes/{node}/children` (API 1.83): the UUIDs of the nodes whose `parent_node`
//! is this node, and a link to the node listing filtered by it. 404 below 1.83, as Ironic.

use crate::api::render::base_url;
use crate::api::{ApiResult, AppState};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;
use serde_json::{json, Value};

pub(super) async fn children(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
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
