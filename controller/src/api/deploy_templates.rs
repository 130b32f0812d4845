//! `/v1/deploy_templates` (Ironic 1.55): named step lists whose steps join the deploy of a
//! node whose `instance_info.traits` names them (`conductor::deploying`). The resource is
//! the one `super::step_templates` serves for runbooks too.

use super::resource;
use super::step_templates::{Api, Kind, Spec};
use super::AppState;
use axum::Router;
use rivet_model::microversions as mv;
use rivet_store::TemplateKind;

const DEPLOY: Spec = Spec {
    kind: TemplateKind::Deploy,
    collection: "deploy_templates",
    since: mv::DEPLOY_TEMPLATES,
    label: "Deploy template",
    order_key: "priority",
    args_required: true,
    create_fields: &["uuid", "name", "description", "steps", "extra"],
    filters: &[],
    traits_since: None,
};

/// Deploy templates.
pub(super) struct Deploy;

impl Kind for Deploy {
    const SPEC: Spec = DEPLOY;
}

pub fn routes() -> Router<AppState> {
    resource::routes::<Api<Deploy>>()
}
