//! Inspection rules: conditions on the inventory and the node, actions on the node.
//!
//! A rule applies when all its conditions hold; rules run in priority order (highest first,
//! then oldest first) after every inspection. `fail` stops inspection with its message.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A rule as stored and served at `/v1/inspection_rules`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// UUID (generated when absent on create).
    #[serde(default)]
    pub uuid: Option<String>,
    /// What it is for.
    #[serde(default)]
    pub description: String,
    /// Higher runs earlier.
    #[serde(default)]
    pub priority: i64,
    /// All must hold.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// Applied in order.
    pub actions: Vec<Action>,
}

/// `field op value`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    /// `inventory.cpu.count`, `node.driver`, `node.properties.cpus`, `inventory.disks.0.size`…
    pub field: String,
    /// eq, ne, gt, lt, contains, matches.
    pub op: String,
    /// What to compare with.
    pub value: Value,
}

/// What a rule does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Action {
    /// `properties[name] = value`.
    SetProperty {
        /// Property name.
        name: String,
        /// Value.
        value: Value,
    },
    /// A capability in `properties.capabilities`.
    SetCapability {
        /// Capability name.
        name: String,
        /// Value.
        value: String,
    },
    /// Add a trait (e.g. `CUSTOM_GPU`).
    AddTrait {
        /// Trait name.
        name: String,
    },
    /// Set the resource class.
    SetResourceClass {
        /// The class.
        value: String,
    },
    /// `extra[name] = value`.
    SetExtra {
        /// Key.
        name: String,
        /// Value.
        value: Value,
    },
    /// Fail inspection.
    Fail {
        /// Shown in last_error.
        message: String,
    },
}

const OPS: &[&str] = &["eq", "ne", "gt", "lt", "contains", "matches"];

/// Check a rule; the error names the offending field.
pub fn validate(rule: &Rule) -> Result<(), String> {
    if rule.actions.is_empty() {
        return Err("actions: a rule needs at least one action".into());
    }
    for (i, c) in rule.conditions.iter().enumerate() {
        if !(c.field.starts_with("inventory.") || c.field.starts_with("node.")) {
            return Err(format!(
                "conditions[{i}].field: {:?} must start with \"inventory.\" or \"node.\"",
                c.field
            ));
        }
        if !OPS.contains(&c.op.as_str()) {
            return Err(format!(
                "conditions[{i}].op: unknown operator {:?} (use {})",
                c.op,
                OPS.join(", ")
            ));
        }
        if matches!(c.op.as_str(), "gt" | "lt") && !c.value.is_number() {
            return Err(format!("conditions[{i}].value: {} needs a number", c.op));
        }
        if c.op == "matches" {
            let pattern = c.value.as_str().ok_or_else(|| {
                format!("conditions[{i}].value: matches needs a regular expression string")
            })?;
            regex_lite::Regex::new(pattern)
                .map_err(|e| format!("conditions[{i}].value: invalid regular expression: {e}"))?;
        }
    }
    for (i, a) in rule.actions.iter().enumerate() {
        let empty = match a {
            Action::SetProperty { name, .. }
            | Action::SetCapability { name, .. }
            | Action::AddTrait { name }
            | Action::SetExtra { name, .. } => name.is_empty(),
            Action::SetResourceClass { value } => value.is_empty(),
            Action::Fail { message } => message.is_empty(),
        };
        if empty {
            return Err(format!(
                "actions[{i}]: name/value/message must not be empty"
            ));
        }
    }
    Ok(())
}

/// Look up a dotted path; numeric segments index arrays.
pub fn lookup<'a>(doc: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(doc, |v, seg| match v {
        Value::Object(m) => m.get(seg),
        Value::Array(a) => seg.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    })
}

fn holds(c: &Condition, doc: &Value) -> bool {
    let Some(actual) = lookup(doc, &c.field) else {
        return false;
    };
    let num = |v: &Value| v.as_f64();
    match c.op.as_str() {
        "eq" => actual == &c.value || (num(actual).is_some() && num(actual) == num(&c.value)),
        "ne" => !(actual == &c.value || (num(actual).is_some() && num(actual) == num(&c.value))),
        "gt" => matches!((num(actual), num(&c.value)), (Some(a), Some(b)) if a > b),
        "lt" => matches!((num(actual), num(&c.value)), (Some(a), Some(b)) if a < b),
        "contains" => match (actual, &c.value) {
            (Value::String(a), Value::String(b)) => a.contains(b.as_str()),
            (Value::Array(a), v) => a.contains(v),
            _ => false,
        },
        "matches" => match (actual.as_str(), c.value.as_str()) {
            (Some(a), Some(p)) => regex_lite::Regex::new(p)
                .map(|r| r.is_match(a))
                .unwrap_or(false),
            _ => false,
        },
        _ => false,
    }
}

/// The actions of every rule that applies to `doc` (`{"inventory": …, "node": …}`), in
/// priority order; `Err` with the message of the first `fail` action reached.
pub fn evaluate(rules: &[Rule], doc: &Value) -> Result<Vec<(String, Action)>, String> {
    let mut sorted: Vec<&Rule> = rules.iter().collect();
    sorted.sort_by_key(|r| std::cmp::Reverse(r.priority));
    let mut out = Vec::new();
    for rule in sorted {
        if rule.conditions.iter().all(|c| holds(c, doc)) {
            let id = rule.uuid.clone().unwrap_or_default();
            for a in &rule.actions {
                if let Action::Fail { message } = a {
                    return Err(message.clone());
                }
                out.push((id.clone(), a.clone()));
            }
        }
    }
    Ok(out)
}

/// Apply non-fail actions to a node's fields.
pub fn apply(
    actions: &[(String, Action)],
    properties: &mut Map<String, Value>,
    extra: &mut Map<String, Value>,
    traits: &mut Vec<String>,
    resource_class: &mut Option<String>,
) {
    for (_, a) in actions {
        match a {
            Action::SetProperty { name, value } => {
                properties.insert(name.clone(), value.clone());
            }
            Action::SetCapability { name, value } => {
                super::derive::set_capability(properties, name, value)
            }
            Action::AddTrait { name } => {
                if !traits.contains(name) {
                    traits.push(name.clone());
                }
            }
            Action::SetResourceClass { value } => *resource_class = Some(value.clone()),
            Action::SetExtra { name, value } => {
                extra.insert(name.clone(), value.clone());
            }
            Action::Fail { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(v: Value) -> Rule {
        serde_json::from_value(v).expect("rule")
    }

    #[test]
    fn validation_names_the_field() {
        let bad_op = rule(
            json!({"conditions": [{"field": "inventory.cpu.count", "op": "gte", "value": 1}], "actions": [{"action": "add-trait", "name": "X"}]}),
        );
        assert!(validate(&bad_op)
            .expect_err("op")
            .contains("conditions[0].op"));
        let bad_field = rule(
            json!({"conditions": [{"field": "cpu.count", "op": "eq", "value": 1}], "actions": [{"action": "add-trait", "name": "X"}]}),
        );
        assert!(validate(&bad_field)
            .expect_err("field")
            .contains("conditions[0].field"));
        let bad_re = rule(
            json!({"conditions": [{"field": "node.name", "op": "matches", "value": "("}], "actions": [{"action": "add-trait", "name": "X"}]}),
        );
        assert!(validate(&bad_re)
            .expect_err("re")
            .contains("regular expression"));
        assert!(validate(&rule(json!({"actions": []})))
            .expect_err("none")
            .contains("actions"));
        let unknown =
            serde_json::from_value::<Rule>(json!({"actions": [{"action": "launch-missiles"}]}));
        assert!(unknown.is_err());
    }

    #[test]
    fn ordering_conditions_and_fail() {
        let doc = json!({"inventory": {"cpu": {"count": 8, "model_name": "AMD EPYC 7702"}, "disks": [{"size": 100}]},
                         "node": {"driver": "fake-hardware", "properties": {}}});
        let rules = vec![
            rule(
                json!({"uuid": "low", "priority": 1, "conditions": [{"field": "inventory.cpu.count", "op": "gt", "value": 4}],
                        "actions": [{"action": "set-resource-class", "value": "big"}]}),
            ),
            rule(
                json!({"uuid": "high", "priority": 9, "conditions": [{"field": "inventory.cpu.model_name", "op": "matches", "value": "^AMD"}],
                        "actions": [{"action": "set-resource-class", "value": "amd"}, {"action": "add-trait", "name": "CUSTOM_AMD"}]}),
            ),
            rule(
                json!({"uuid": "never", "conditions": [{"field": "inventory.disks.0.size", "op": "lt", "value": 50}],
                        "actions": [{"action": "fail", "message": "disk too small"}]}),
            ),
        ];
        let acts = evaluate(&rules, &doc).expect("no fail");
        let ids: Vec<&str> = acts.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["high", "high", "low"]);
        let (mut p, mut e, mut t, mut rc) = (Map::new(), Map::new(), Vec::new(), None);
        apply(&acts, &mut p, &mut e, &mut t, &mut rc);
        assert_eq!(
            rc.as_deref(),
            Some("big"),
            "later (lower priority) rule has the last word"
        );
        assert_eq!(t, ["CUSTOM_AMD"]);

        let failing = vec![rule(
            json!({"conditions": [{"field": "inventory.disks.0.size", "op": "lt", "value": 500}],
                                       "actions": [{"action": "fail", "message": "root disk under 500 GiB"}]}),
        )];
        assert_eq!(
            evaluate(&failing, &doc).expect_err("fail"),
            "root disk under 500 GiB"
        );
        let missing = vec![rule(
            json!({"conditions": [{"field": "inventory.gpu.count", "op": "gt", "value": 0}],
                                       "actions": [{"action": "fail", "message": "x"}]}),
        )];
        assert!(evaluate(&missing, &doc)
            .expect("missing field does not hold")
            .is_empty());
    }
}
