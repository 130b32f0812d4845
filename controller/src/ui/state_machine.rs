//! `GET /ui/state-machine.json`: the verbs an admin may send in each provision state, read
//! from the model's table (`rivet_model::fsm`), so the UI offers exactly what the API accepts.

use axum::Json;
use rivet_model::fsm;
use rivet_protocol::states::ProvisionState;
use serde_json::{json, Map, Value};

/// The document: `{"states": [...], "verbs": {state: [verb, ...]}, "stable": [...],
/// "failed": [...]}`.
pub fn document() -> Value {
    let mut verbs = Map::new();
    for s in ProvisionState::ALL {
        let allowed: Vec<&str> = fsm::allowed_verbs(*s).iter().map(|v| v.as_str()).collect();
        verbs.insert(s.as_str().to_string(), json!(allowed));
    }
    let names = |keep: fn(ProvisionState) -> bool| -> Vec<&'static str> {
        ProvisionState::ALL
            .iter()
            .filter(|s| keep(**s))
            .map(|s| s.as_str())
            .collect()
    };
    json!({
        "states": names(|_| true),
        "verbs": verbs,
        "stable": names(ProvisionState::is_stable),
        "failed": names(ProvisionState::is_failed),
    })
}

/// The handler.
pub async fn serve() -> Json<Value> {
    Json(document())
}

#[cfg(test)]
mod tests {
    #[test]
    fn manageable_may_provide_but_not_undeploy() {
        let d = super::document();
        let m = d["verbs"]["manageable"].as_array().expect("manageable");
        assert!(m.iter().any(|v| v == "provide"));
        assert!(!m.iter().any(|v| v == "undeploy" || v == "deleted"));
        let active = d["verbs"]["active"].as_array().expect("active");
        assert!(active.iter().any(|v| v == "undeploy" || v == "deleted"));
    }
}
