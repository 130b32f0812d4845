//! Deploy templates (Ironic 1.55) at deploy time: a node whose `instance_info.traits` names
//! a deploy template deploys with the template's steps, as Ironic's
//! `_get_steps_from_deployment_templates` merges them: the operator's `deploy_steps` win
//! over a template's step of the same interface and name, a template's step wins over the
//! default one (priority 0 disables it), and two templates naming one step are refused.

use super::{Conductor, ConductorError};
use rivet_model::node::Node;
use rivet_protocol::steps::RequestedDeployStep;
use rivet_store::{TemplateKind, TemplateQuery};
use serde_json::{Map, Value};

/// The traits a deploy asks for (`instance_info.traits`, a list of strings).
fn requested_traits(node: &Node) -> Vec<String> {
    match node.instance_info.get("traits") {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

impl Conductor {
    /// `requested` (the deploy's own `deploy_steps`) with the steps of the deploy templates
    /// the node's instance asks for. The inner `Err` says why the deploy cannot go on.
    pub(crate) async fn with_template_steps(
        &self,
        node: &Node,
        mut requested: Vec<RequestedDeployStep>,
    ) -> Result<Result<Vec<RequestedDeployStep>, String>, ConductorError> {
        let traits = requested_traits(node);
        if traits.is_empty() {
            return Ok(Ok(requested));
        }
        let templates = self
            .store
            .list_templates(&TemplateQuery {
                names: Some(traits),
                ..TemplateQuery::all(TemplateKind::Deploy)
            })
            .await?;
        let mut from_templates: Vec<(String, RequestedDeployStep)> = Vec::new();
        for t in &templates {
            for s in &t.steps {
                let step = RequestedDeployStep {
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
                    priority: s.get("priority").and_then(Value::as_i64).unwrap_or(0),
                };
                if let Some((other, _)) = from_templates
                    .iter()
                    .find(|(_, o)| o.interface == step.interface && o.step == step.step)
                {
                    return Ok(Err(format!(
                        "deploy templates {other} and {} of node {} both name deploy step {}.{}; a step may come from one template only",
                        t.name,
                        node.ident(),
                        step.interface,
                        step.step
                    )));
                }
                from_templates.push((t.name.clone(), step));
            }
        }
        for (name, step) in from_templates {
            if !requested
                .iter()
                .any(|r| r.interface == step.interface && r.step == step.step)
            {
                tracing::info!(node = %node.uuid, template = %name, step = %format!("{}.{}", step.interface, step.step), priority = step.priority, "deploy template step added");
                requested.push(step);
            }
        }
        Ok(Ok(requested))
    }
}
