//! Inspection rules in Ironic's schema (API 1.96): a rule is `conditions` and `actions`, each
//! an `{"op", "args", "loop", "multiple"}` operation, run in `priority` order (highest first)
//! at the end of inspection and on discovery. Validation, `{inventory[x]}`/`{node.x}`
//! interpolation, conditions and actions follow `ironic/common/inspection_rules/`; this
//! module has no I/O: the conductor hands it JSON views of the node and its ports and
//! writes back what the actions changed.
//!
//! Rivet extensions (documented in docs/design-notes.md terms, kept small):
//! - a string argument that is exactly one placeholder (`"{inventory[cpu][count]}"`) takes the
//!   referenced JSON value itself (Python's `format` would give its text), so numbers stay
//!   numbers; and `eq`/`lt`/`gt` compare numerically when both sides are numbers or
//!   numeric text;
//! - bodies in Rivet's former schema (`{"field", "op", "value"}` conditions,
//!   `{"action": "set-property"|"set-resource-class"|"set-extra"|...}` actions) are converted
//!   to this schema when read ([`from_stored`]), so rules stored before 1.96 keep working.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::net::IpAddr;

// Rules are admin bodies (POST/PATCH /v1/inspection_rules): admin limits.
impl rivet_protocol::limits::Limited for Rule {}

/// The one inspection phase Ironic has.
pub const PHASES: &[&str] = &["main"];

/// Keys whose values rules never see (Ironic's `SENSITIVE_FIELDS`, masked as `***` with its
/// default `mask_secrets = always`).
const SENSITIVE_FIELDS: &[&str] = &["password", "auth_token", "bmc_password"];

/// Highest priority a user rule may have.
pub const MAX_PRIORITY: i64 = 9999;

/// A rule as created, stored and (unless sensitive) served at `/v1/inspection_rules`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// UUID (generated when absent on create).
    #[serde(default)]
    pub uuid: Option<String>,
    /// What it is for (at most 255 characters).
    #[serde(default)]
    pub description: Option<String>,
    /// Higher runs earlier, 0..=9999.
    #[serde(default, deserialize_with = "int_or_text")]
    pub priority: i64,
    /// Conditions and actions hidden in API output; cannot be unset.
    #[serde(default, deserialize_with = "null_false")]
    pub sensitive: bool,
    /// When it runs: `main`.
    #[serde(default = "main_phase", deserialize_with = "null_main")]
    pub phase: String,
    /// All must hold (none: always applies).
    #[serde(default, deserialize_with = "null_empty")]
    pub conditions: Vec<Operation>,
    /// Applied in order; at least one.
    pub actions: Vec<Operation>,
}

fn null_false<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Option::<bool>::deserialize(d)?.unwrap_or(false))
}

/// python-ironicclient sends `--priority` as text ("20").
fn int_or_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(0),
        Value::Number(n) => n
            .as_i64()
            .ok_or_else(|| serde::de::Error::custom(format!("priority {n} is not an integer"))),
        Value::String(s) => s
            .trim()
            .parse()
            .map_err(|_| serde::de::Error::custom(format!("priority {s:?} is not an integer"))),
        other => Err(serde::de::Error::custom(format!(
            "priority {other} is not an integer"
        ))),
    }
}

fn main_phase() -> String {
    "main".into()
}

fn null_main<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_else(|| "main".into()))
}

fn null_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Operation>, D::Error> {
    Ok(Option::<Vec<Operation>>::deserialize(d)?.unwrap_or_default())
}

impl Default for Rule {
    fn default() -> Self {
        Rule {
            uuid: None,
            description: None,
            priority: 0,
            sensitive: false,
            phase: "main".into(),
            conditions: Vec::new(),
            actions: Vec::new(),
        }
    }
}

/// One condition or action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Operation {
    /// Operator (`eq`, `!eq`, …) or action (`set-attribute`, …).
    pub op: String,
    /// Named arguments (an object), or positional ones (an array, deprecated in Ironic).
    pub args: Value,
    /// Run once per item (a list) or once with the item (an object), as `{item}`.
    #[serde(default, rename = "loop", skip_serializing_if = "Option::is_none")]
    pub loop_items: Option<Value>,
    /// How looped condition results combine: any, all, first, last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiple: Option<String>,
}

/// An operator's or action's signature: required and optional arguments, and which of them
/// are interpolated outside loops (Ironic's `FORMATTED_ARGS`).
struct Sig {
    name: &'static str,
    required: &'static [&'static str],
    optional: &'static [&'static str],
    formatted: &'static [&'static str],
}

const fn sig(
    name: &'static str,
    required: &'static [&'static str],
    optional: &'static [&'static str],
    formatted: &'static [&'static str],
) -> Sig {
    Sig {
        name,
        required,
        optional,
        formatted,
    }
}

const OPERATORS: &[Sig] = &[
    sig("eq", &["values"], &["force_strings"], &["values"]),
    sig("lt", &["values"], &["force_strings"], &["values"]),
    sig("gt", &["values"], &["force_strings"], &["values"]),
    sig("is-empty", &["value"], &[], &["value"]),
    sig(
        "in-net",
        &["address", "subnet"],
        &[],
        &["address", "subnet"],
    ),
    sig("matches", &["value", "regex"], &[], &["value"]),
    sig("contains", &["value", "regex"], &[], &["value"]),
    sig("one-of", &["value"], &["values"], &["value"]),
    sig("is-none", &["value"], &[], &["value"]),
    sig("is-true", &["value"], &[], &["value"]),
    sig("is-false", &["value"], &[], &["value"]),
];

const ACTIONS: &[Sig] = &[
    sig("fail", &["msg"], &[], &[]),
    sig("log", &["msg"], &["level"], &["msg"]),
    sig("set-attribute", &["path", "value"], &[], &["value"]),
    sig(
        "extend-attribute",
        &["path", "value"],
        &["unique"],
        &["value"],
    ),
    sig("del-attribute", &["path"], &[], &[]),
    sig("set-capability", &["name", "value"], &[], &["value"]),
    sig("unset-capability", &["name"], &[], &[]),
    sig("add-trait", &["name"], &[], &[]),
    sig("remove-trait", &["name"], &[], &[]),
    sig("set-plugin-data", &["path", "value"], &[], &["value"]),
    sig(
        "extend-plugin-data",
        &["path", "value"],
        &["unique"],
        &["value"],
    ),
    sig("unset-plugin-data", &["path"], &[], &[]),
    sig(
        "set-port-attribute",
        &["port_id", "path", "value"],
        &[],
        &["value"],
    ),
    sig(
        "extend-port-attribute",
        &["port_id", "path", "value"],
        &["unique"],
        &["value"],
    ),
    sig("del-port-attribute", &["port_id", "path"], &[], &[]),
];

/// Ironic has an `api-call` action (an HTTP GET from the conductor); Rivet refuses it.
const REFUSED_ACTIONS: &[&str] = &["api-call"];

/// Node fields rules may set or delete (the rest are the conductor's).
pub const NODE_SETTABLE: &[&str] = &[
    "name",
    "driver",
    "driver_info",
    "properties",
    "instance_info",
    "extra",
    "resource_class",
    "description",
    "owner",
    "lessee",
    "network_data",
];

/// Port fields rules may set or delete.
pub const PORT_SETTABLE: &[&str] = &["pxe_enabled", "extra"];

fn find(table: &'static [Sig], name: &str) -> Option<&'static Sig> {
    table.iter().find(|s| s.name == name)
}

/// `!eq` → (`eq`, inverted); more than one `!` is an error.
pub fn parse_inverted(op: &str) -> Result<(String, bool), String> {
    let op = op.trim();
    if op.matches('!').count() > 1 {
        return Err(format!(
            "{op:?}: multiple exclamation marks are not allowed; invert an operator with one (!eq)"
        ));
    }
    let inverted = op.starts_with('!');
    Ok((op.trim_start_matches('!').trim().to_string(), inverted))
}

/// Positional arguments by name (required first, then optional), as Ironic normalizes them.
fn named_args(s: &Sig, args: &Value) -> Result<Map<String, Value>, String> {
    match args {
        Value::Object(m) => Ok(m.clone()),
        Value::Array(a) => {
            if a.len() < s.required.len() {
                return Err(format!(
                    "not enough arguments provided, missing: {}",
                    s.required[a.len()..].join(", ")
                ));
            }
            let names = s.required.iter().chain(s.optional.iter());
            if a.len() > s.required.len() + s.optional.len() {
                return Err(format!(
                    "too many arguments: {} takes at most {}",
                    s.name,
                    s.required.len() + s.optional.len()
                ));
            }
            Ok(names
                .zip(a.iter())
                .map(|(n, v)| (n.to_string(), v.clone()))
                .collect())
        }
        _ => Err("args must be either a list or dictionary".into()),
    }
}

fn check_args(s: &Sig, args: &Value) -> Result<Map<String, Value>, String> {
    let m = named_args(s, args)?;
    let missing: Vec<&str> = s
        .required
        .iter()
        .filter(|r| !m.contains_key(**r))
        .copied()
        .collect();
    let unexpected: Vec<&str> = m
        .keys()
        .filter(|k| !s.required.contains(&k.as_str()) && !s.optional.contains(&k.as_str()))
        .map(String::as_str)
        .collect();
    let mut msg = Vec::new();
    if !missing.is_empty() {
        msg.push(format!(
            "missing required argument(s): {}",
            missing.join(", ")
        ));
    }
    if !unexpected.is_empty() {
        msg.push(format!("unexpected argument(s): {}", unexpected.join(", ")));
    }
    if msg.is_empty() {
        Ok(m)
    } else {
        Err(msg.join("; "))
    }
}

fn is_literal(v: &Value) -> bool {
    v.as_str().is_some_and(|s| !s.contains('{'))
}

fn check_loop(what: &str, o: &Operation) -> Result<(), String> {
    match &o.loop_items {
        None | Some(Value::Array(_)) | Some(Value::Object(_)) => Ok(()),
        Some(_) => Err(format!("{what}: loop must be a list or an object")),
    }
}

/// Check a rule as Ironic's `validate_rule` does; every message names the operation
/// (`conditions[0] (eq)`) and the bad argument. All problems are reported at once.
pub fn validate(rule: &Rule) -> Result<(), String> {
    let mut errors = Vec::new();
    if rule.actions.is_empty() {
        errors.push("actions: a rule needs at least one action".to_string());
    }
    if !PHASES.contains(&rule.phase.as_str()) {
        errors.push(format!(
            "Invalid phase: {}. Valid phases are: {}",
            rule.phase,
            PHASES.join(", ")
        ));
    }
    if rule.priority < 0 {
        errors.push("Priority cannot be negative for user-defined rules.".into());
    }
    if rule.priority > MAX_PRIORITY {
        errors.push("Priority must be between 0 and 9999 for user-defined rules.".into());
    }
    if rule
        .description
        .as_ref()
        .is_some_and(|d| d.chars().count() > 255)
    {
        errors.push("description: longer than 255 characters".into());
    }
    for (i, c) in rule.conditions.iter().enumerate() {
        let (op, _) = match parse_inverted(&c.op) {
            Ok(x) => x,
            Err(e) => {
                errors.push(format!("conditions[{i}].op: {e}"));
                continue;
            }
        };
        let what = format!("conditions[{i}] ({op})");
        let Some(s) = find(OPERATORS, &op) else {
            errors.push(format!(
                "conditions[{i}].op: Unsupported condition operator: {op:?} (use {}, optionally with a leading !)",
                OPERATORS.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
            ));
            continue;
        };
        if let Err(e) = check_loop(&what, c) {
            errors.push(e);
        }
        if let Some(m) = &c.multiple {
            if !["any", "all", "first", "last"].contains(&m.as_str()) {
                errors.push(format!(
                    "{what}: multiple {m:?} is not one of any, all, first, last"
                ));
            }
        }
        match check_args(s, &c.args) {
            Err(e) => errors.push(format!(
                "Invalid parameters for condition operator {op} in {what}: {e}"
            )),
            Ok(args) => {
                if let Some(re) = args.get("regex").filter(|v| is_literal(v)) {
                    if let Err(e) = compile(re.as_str().unwrap_or_default(), &op) {
                        errors.push(format!("{what}: args.regex: {e}"));
                    }
                }
                if let Some(net) = args.get("subnet").filter(|v| is_literal(v)) {
                    if parse_net(net.as_str().unwrap_or_default()).is_none() {
                        errors.push(format!("{what}: args.subnet: {net} is not a network"));
                    }
                }
            }
        }
    }
    for (i, a) in rule.actions.iter().enumerate() {
        let what = format!("actions[{i}] ({})", a.op);
        if REFUSED_ACTIONS.contains(&a.op.as_str()) {
            errors.push(format!(
                "actions[{i}].op: {:?} is not supported by Rivet (the conductor makes no HTTP calls for rules)",
                a.op
            ));
            continue;
        }
        let Some(s) = find(ACTIONS, &a.op) else {
            errors.push(format!(
                "actions[{i}].op: Unsupported action operator: {:?} (use {})",
                a.op,
                ACTIONS
                    .iter()
                    .map(|s| s.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            continue;
        };
        if let Err(e) = check_loop(&what, a) {
            errors.push(e);
        }
        match check_args(s, &a.args) {
            Err(e) => errors.push(format!(
                "Invalid parameters for action operator {} in {what}: {e}",
                a.op
            )),
            Ok(args) => {
                if let Some(p) = args.get("path").filter(|v| is_literal(v)) {
                    let p = p.as_str().unwrap_or_default();
                    let settable = if a.op.contains("port") {
                        PORT_SETTABLE
                    } else {
                        NODE_SETTABLE
                    };
                    let top = normalize_path(p).first().cloned().unwrap_or_default();
                    if !a.op.contains("plugin-data") && !settable.contains(&top.as_str()) {
                        errors.push(format!(
                            "{what}: args.path: {p:?} is not a field rules may change (use {})",
                            settable.join(", ")
                        ));
                    }
                }
                if let Some(l) = args.get("level").and_then(Value::as_str) {
                    if !["debug", "info", "warning", "error", "critical"]
                        .contains(&l.to_lowercase().as_str())
                    {
                        errors.push(format!("{what}: args.level: invalid log level {l:?}"));
                    }
                }
            }
        }
    }
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        _ => Err(format!(
            "Multiple validation errors occurred: {}",
            errors.join("; ")
        )),
    }
}

fn compile(regex: &str, op: &str) -> Result<regex_lite::Regex, String> {
    // Python's re.match anchors at the start; `matches` also anchors the end.
    let pattern = if op == "matches" {
        format!("^(?:{regex})$")
    } else {
        regex.to_string()
    };
    regex_lite::Regex::new(&pattern).map_err(|e| format!("invalid regular expression: {e}"))
}

fn parse_net(net: &str) -> Option<(IpAddr, u8)> {
    let (addr, len) = match net.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (net, None),
    };
    let addr: IpAddr = addr.trim().parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let len = match len {
        Some(l) => l.trim().parse::<u8>().ok().filter(|l| *l <= max)?,
        None => max,
    };
    Some((addr, len))
}

fn in_net(address: &str, net: &str) -> Result<bool, String> {
    let (net_addr, len) = parse_net(net).ok_or_else(|| format!("invalid value: {net:?}"))?;
    let addr: IpAddr = address
        .trim()
        .parse()
        .map_err(|_| format!("invalid value: {address:?} is not an IP address"))?;
    Ok(match (addr, net_addr) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len)
            };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    })
}

/// Path parts: slash notation (`driver_info/ipmi_address`) or dot notation.
pub fn normalize_path(path: &str) -> Vec<String> {
    if path.contains('/') {
        path.trim_matches('/')
            .split('/')
            .map(String::from)
            .collect()
    } else {
        path.split('.').map(String::from).collect()
    }
}

/// Python's `str()` of a JSON value, closely enough for rules (`None`, `True`, `[]`).
pub fn py_str(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        other => other.to_string(),
    }
}

/// Look up `node.properties[cpus]` / `inventory.cpu.count` / `item[path]` in `ctx`.
fn resolve<'a>(ctx: &'a Map<String, Value>, field: &str) -> Option<&'a Value> {
    let mut parts = Vec::new();
    let mut rest = field;
    let first_end = rest.find(['.', '[']).unwrap_or(rest.len());
    parts.push(&rest[..first_end]);
    rest = &rest[first_end..];
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            parts.push(&r[..end]);
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            parts.push(&r[..end]);
            rest = &r[end + 1..];
        } else {
            return None;
        }
    }
    let (head, tail) = parts.split_first()?;
    let mut v = ctx.get(*head)?;
    for p in tail {
        v = match v {
            Value::Object(m) => m.get(*p)?,
            Value::Array(a) => a.get(p.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(v)
}

/// Python `str.format` over `ctx`; `Err` when a field is missing (the caller keeps the text).
fn format_str(s: &str, ctx: &Map<String, Value>) -> Result<Value, ()> {
    // One placeholder and nothing else: the value itself (Rivet extension, see module doc).
    if let Some(inner) = s.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
        if !inner.contains(['{', '}', '!', ':']) && !inner.is_empty() {
            return resolve(ctx, inner).cloned().ok_or(());
        }
    }
    let mut out = String::new();
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '{' if s[i + 1..].starts_with('{') => {
                chars.next();
                out.push('{');
            }
            '}' if s[i + 1..].starts_with('}') => {
                chars.next();
                out.push('}');
            }
            '{' => {
                let end = s[i + 1..].find('}').ok_or(())? + i + 1;
                let field = &s[i + 1..end];
                // Conversions and format specs are not interpreted.
                let field = field.split([':', '!']).next().unwrap_or_default();
                out.push_str(&py_str(resolve(ctx, field).ok_or(())?));
                while chars.peek().is_some_and(|(j, _)| *j <= end) {
                    chars.next();
                }
            }
            '}' => return Err(()),
            c => out.push(c),
        }
    }
    Ok(Value::String(out))
}

fn interpolate(v: &Value, ctx: &Map<String, Value>, op: &str) -> Value {
    match v {
        Value::String(s) => match format_str(s, ctx) {
            Ok(v) => v,
            // Ironic: a missing field is "nothing" for is-empty, else the text stays.
            Err(()) if op == "is-empty" => Value::Null,
            Err(()) => v.clone(),
        },
        Value::Array(a) => Value::Array(a.iter().map(|x| interpolate(x, ctx, op)).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| {
                    let k = match format_str(k, ctx) {
                        Ok(Value::String(s)) => s,
                        _ => k.clone(),
                    };
                    (k, interpolate(x, ctx, op))
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

fn mask(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| {
                    if SENSITIVE_FIELDS.contains(&k.as_str()) {
                        (k.clone(), Value::from("***"))
                    } else {
                        (k.clone(), mask(x))
                    }
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(mask).collect()),
        other => other.clone(),
    }
}

/// What rules work on. `node` and `ports` are JSON views (see `NODE_SETTABLE`); ports carry
/// `uuid`. `plugin_data` lives for this run.
#[derive(Debug, Clone, Default)]
pub struct Target {
    /// The inventory (read only).
    pub inventory: Value,
    /// The node's fields; `traits` is a list of names.
    pub node: Map<String, Value>,
    /// The node's ports.
    pub ports: Vec<Map<String, Value>>,
    /// Data rules share (`set-plugin-data`, `{plugin_data[x]}`).
    pub plugin_data: Map<String, Value>,
    /// `log` actions: (level, message).
    pub logs: Vec<(String, String)>,
}

/// Why rules stopped inspection.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleError {
    /// The rule.
    pub rule: String,
    /// A `fail` action's message, or what went wrong.
    pub message: String,
}

fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    }
}

fn compare(a: &Value, b: &Value, op: &str, force_strings: bool) -> Result<bool, String> {
    if force_strings {
        let (a, b) = (py_str(a), py_str(b));
        return Ok(match op {
            "eq" => a == b,
            "lt" => a < b,
            _ => a > b,
        });
    }
    let both_numbers = matches!((a, b), (Value::Number(_), _) | (_, Value::Number(_)));
    if let (Some(x), Some(y), true) = (number(a), number(b), both_numbers) {
        return Ok(match op {
            "eq" => x == y,
            "lt" => x < y,
            _ => x > y,
        });
    }
    match op {
        "eq" => Ok(a == b),
        _ => match (a, b) {
            (Value::String(x), Value::String(y)) => Ok(if op == "lt" { x < y } else { x > y }),
            _ => match (number(a), number(b)) {
                (Some(x), Some(y)) => Ok(if op == "lt" { x < y } else { x > y }),
                _ => Err(format!(
                    "cannot compare {} and {} with {op}",
                    py_str(a),
                    py_str(b)
                )),
            },
        },
    }
}

fn truthy(v: &Value, want: bool) -> bool {
    match v {
        Value::Bool(b) => *b == want,
        Value::Number(n) => (n.as_f64().unwrap_or(0.0) != 0.0) == want,
        Value::String(s) => {
            let s = s.to_lowercase();
            if want {
                s == "yes" || s == "true"
            } else {
                s == "no" || s == "false"
            }
        }
        Value::Null => !want,
        _ => false,
    }
}

fn context(t: &Target, item: Option<&Value>) -> Map<String, Value> {
    let mut ctx = Map::new();
    ctx.insert("node".into(), Value::Object(t.node.clone()));
    ctx.insert("inventory".into(), mask(&t.inventory));
    ctx.insert(
        "plugin_data".into(),
        mask(&Value::Object(t.plugin_data.clone())),
    );
    if let Some(item) = item {
        ctx.insert("item".into(), item.clone());
    }
    ctx
}

/// The arguments of `o` by name, interpolated as Ironic does (formatted args only, or all
/// of them inside a loop).
fn args_for(
    s: &Sig,
    o: &Operation,
    op: &str,
    t: &Target,
    item: Option<&Value>,
) -> Result<Map<String, Value>, String> {
    let raw = check_args(s, &o.args)?;
    let ctx = context(t, item);
    Ok(raw
        .into_iter()
        .map(|(k, v)| {
            if item.is_some() || s.formatted.contains(&k.as_str()) {
                let v = interpolate(&v, &ctx, op);
                (k, v)
            } else {
                (k, v)
            }
        })
        .collect())
}

fn check_one(
    s: &Sig,
    c: &Operation,
    op: &str,
    t: &Target,
    item: Option<&Value>,
) -> Result<bool, String> {
    let a = args_for(s, c, op, t, item)?;
    let arg = |k: &str| a.get(k).cloned().unwrap_or(Value::Null);
    Ok(match op {
        "eq" | "lt" | "gt" => {
            let Value::Array(values) = arg("values") else {
                return Err(format!(
                    "Failed to check condition {op}: expected a list for 'values', got {}",
                    py_str(&arg("values"))
                ));
            };
            let force = item.is_some() || truthy(&arg("force_strings"), true);
            let mut ok = true;
            for w in values.windows(2) {
                ok &= compare(&w[0], &w[1], op, force)?;
            }
            ok
        }
        "is-empty" => ["", "None", "[]", "{}"].contains(&py_str(&arg("value")).as_str()),
        "in-net" => in_net(&py_str(&arg("address")), &py_str(&arg("subnet")))?,
        "matches" | "contains" => {
            let re = compile(&py_str(&arg("regex")), op)?;
            re.is_match(&py_str(&arg("value")))
        }
        "one-of" => match arg("values") {
            Value::Array(vs) => vs.contains(&arg("value")),
            Value::Null => false,
            other => other == arg("value"),
        },
        "is-none" => arg("value").is_null(),
        "is-true" => truthy(&arg("value"), true),
        "is-false" => truthy(&arg("value"), false),
        _ => return Err(format!("Unsupported operator: {op:?}")),
    })
}

fn check_condition(c: &Operation, t: &Target) -> Result<bool, String> {
    let (op, inverted) = parse_inverted(&c.op)?;
    let s = find(OPERATORS, &op).ok_or_else(|| format!("Unsupported operator: {op:?}"))?;
    let result = match &c.loop_items {
        Some(Value::Array(items)) if !items.is_empty() => {
            let multiple = c.multiple.as_deref().unwrap_or("any");
            let mut results = Vec::new();
            for item in items {
                let r = check_one(s, c, &op, t, Some(item))? != inverted;
                if multiple == "first" && r {
                    return Ok(true);
                }
                results.push(r);
            }
            match multiple {
                "all" => results.iter().all(|r| *r),
                "last" => results.last().copied().unwrap_or(false),
                "first" => results.first().copied().unwrap_or(false),
                _ => results.iter().any(|r| *r),
            }
        }
        Some(item @ Value::Object(m)) if !m.is_empty() => {
            check_one(s, c, &op, t, Some(item))? != inverted
        }
        _ => check_one(s, c, &op, t, None)? != inverted,
    };
    Ok(result)
}

fn get_capabilities(props: &Map<String, Value>) -> Vec<(String, String)> {
    props
        .get("capabilities")
        .and_then(Value::as_str)
        .unwrap_or("")
        .split(',')
        .filter_map(|c| c.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn set_path(
    base: &mut Map<String, Value>,
    parts: &[String],
    value: Value,
    extend: Option<bool>,
) -> Result<(), String> {
    let (last, inner) = parts.split_last().ok_or("empty path")?;
    let mut cur = base;
    for p in inner {
        let next = cur
            .entry(p.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        if next.is_null() {
            *next = Value::Object(Map::new());
        }
        cur = next
            .as_object_mut()
            .ok_or_else(|| format!("{p} is not an object"))?;
    }
    match extend {
        None => {
            cur.insert(last.clone(), value);
        }
        Some(unique) => {
            let list = cur
                .entry(last.clone())
                .or_insert_with(|| Value::Array(Vec::new()));
            if list.is_null() {
                *list = Value::Array(Vec::new());
            }
            let list = list
                .as_array_mut()
                .ok_or_else(|| format!("Cannot extend non-list attribute {}", parts.join(".")))?;
            if !unique || !list.contains(&value) {
                list.push(value);
            }
        }
    }
    Ok(())
}

fn del_path(base: &mut Map<String, Value>, parts: &[String]) -> Result<(), String> {
    let (last, inner) = parts.split_last().ok_or("empty path")?;
    let mut cur = base;
    for p in inner {
        cur = cur
            .get_mut(p)
            .and_then(Value::as_object_mut)
            .ok_or_else(|| format!("{p} not found"))?;
    }
    if parts.len() == 1 {
        // A top-level field is reset, not removed.
        let v = cur
            .get_mut(last)
            .ok_or_else(|| format!("{last} not found"))?;
        *v = match v {
            Value::Object(_) => Value::Object(Map::new()),
            _ => Value::Null,
        };
        return Ok(());
    }
    cur.remove(last)
        .map(|_| ())
        .ok_or_else(|| format!("{last} not found"))
}

fn check_settable(parts: &[String], allowed: &[&str], what: &str) -> Result<(), String> {
    let top = parts.first().map(String::as_str).unwrap_or_default();
    if allowed.contains(&top) {
        Ok(())
    } else {
        Err(format!(
            "{what} field {top:?} cannot be changed by rules (use {})",
            allowed.join(", ")
        ))
    }
}

fn run_one(s: &Sig, a: &Operation, t: &mut Target, item: Option<&Value>) -> Result<(), Stop> {
    let args = args_for(s, a, &a.op, t, item).map_err(Stop::Error)?;
    let arg = |k: &str| args.get(k).cloned().unwrap_or(Value::Null);
    let text = |k: &str| py_str(&arg(k));
    let unique = truthy(&arg("unique"), true);
    let e = Stop::Error;
    match a.op.as_str() {
        "fail" => return Err(Stop::Fail(text("msg"))),
        "log" => {
            let level = args
                .get("level")
                .and_then(Value::as_str)
                .unwrap_or("info")
                .to_lowercase();
            t.logs.push((level, text("msg")));
        }
        "set-attribute" | "extend-attribute" => {
            let parts = normalize_path(&text("path"));
            check_settable(&parts, NODE_SETTABLE, "node").map_err(e)?;
            let extend = (a.op == "extend-attribute").then_some(unique);
            set_path(&mut t.node, &parts, arg("value"), extend).map_err(|err| {
                Stop::Error(format!("Failed to set attribute {}: {err}", text("path")))
            })?;
        }
        "del-attribute" => {
            let parts = normalize_path(&text("path"));
            check_settable(&parts, NODE_SETTABLE, "node").map_err(e)?;
            del_path(&mut t.node, &parts).map_err(|err| {
                Stop::Error(format!(
                    "Failed to delete attribute at {}: {err}",
                    text("path")
                ))
            })?;
        }
        "set-capability" | "unset-capability" => {
            let props = t
                .node
                .entry("properties")
                .or_insert_with(|| Value::Object(Map::new()));
            if !props.is_object() {
                *props = Value::Object(Map::new());
            }
            let Some(props) = props.as_object_mut() else {
                return Ok(());
            };
            let name = text("name");
            let mut caps: Vec<(String, String)> = get_capabilities(props)
                .into_iter()
                .filter(|(k, _)| *k != name)
                .collect();
            if a.op == "set-capability" {
                caps.push((name, text("value")));
            }
            let joined = caps
                .iter()
                .map(|(k, v)| format!("{k}:{v}"))
                .collect::<Vec<_>>()
                .join(",");
            props.insert("capabilities".into(), Value::from(joined));
        }
        "add-trait" | "remove-trait" => {
            let name = text("name");
            let traits = t
                .node
                .entry("traits")
                .or_insert_with(|| Value::Array(Vec::new()));
            if let Value::Array(list) = traits {
                list.retain(|x| x.as_str() != Some(name.as_str()));
                if a.op == "add-trait" {
                    list.push(Value::from(name));
                }
            }
        }
        "set-plugin-data" | "extend-plugin-data" => {
            let parts: Vec<String> = text("path").split('.').map(String::from).collect();
            let extend = (a.op == "extend-plugin-data").then_some(unique);
            set_path(&mut t.plugin_data, &parts, arg("value"), extend).map_err(|err| {
                Stop::Error(format!(
                    "Failed to set plugin data at {}: {err}",
                    text("path")
                ))
            })?;
        }
        "unset-plugin-data" => {
            let parts: Vec<String> = text("path").split('.').map(String::from).collect();
            // Ironic only warns when the path is absent.
            let _ = del_path(&mut t.plugin_data, &parts);
        }
        "set-port-attribute" | "extend-port-attribute" | "del-port-attribute" => {
            let id = text("port_id");
            let port = t
                .ports
                .iter_mut()
                .find(|p| p.get("uuid").and_then(Value::as_str) == Some(id.as_str()))
                .ok_or_else(|| Stop::Error(format!("Port {id} could not be found")))?;
            let parts = normalize_path(&text("path"));
            check_settable(&parts, PORT_SETTABLE, "port").map_err(e)?;
            let r = if a.op == "del-port-attribute" {
                del_path(port, &parts)
            } else {
                let extend = (a.op == "extend-port-attribute").then_some(unique);
                set_path(port, &parts, arg("value"), extend)
            };
            r.map_err(|err| {
                Stop::Error(format!(
                    "Failed to change attribute {} of port {id}: {err}",
                    text("path")
                ))
            })?;
        }
        other => return Err(Stop::Error(format!("Unsupported action: {other:?}"))),
    }
    Ok(())
}

enum Stop {
    Fail(String),
    Error(String),
}

fn run_action(a: &Operation, t: &mut Target) -> Result<(), Stop> {
    let s = find(ACTIONS, &a.op)
        .ok_or_else(|| Stop::Error(format!("Unsupported action: {:?}", a.op)))?;
    match &a.loop_items {
        Some(Value::Array(items)) if !items.is_empty() => {
            for item in items {
                run_one(s, a, t, Some(item))?;
            }
            Ok(())
        }
        Some(item @ Value::Object(m)) if !m.is_empty() => run_one(s, a, t, Some(item)),
        _ => run_one(s, a, t, None),
    }
}

/// Run the rules of `phase` on `t`, highest priority first (stable: equal priorities keep
/// their order); the UUIDs of the rules that applied. A `fail` action or an action that
/// cannot be carried out stops everything with `Err`.
pub fn apply_rules(rules: &[Rule], phase: &str, t: &mut Target) -> Result<Vec<String>, RuleError> {
    let mut sorted: Vec<&Rule> = rules.iter().filter(|r| r.phase == phase).collect();
    sorted.sort_by_key(|r| std::cmp::Reverse(r.priority));
    let mut applied = Vec::new();
    for rule in sorted {
        let id = rule.uuid.clone().unwrap_or_default();
        let err = |message: String| RuleError {
            rule: id.clone(),
            message,
        };
        let mut holds = true;
        for c in &rule.conditions {
            if !check_condition(c, t).map_err(|m| err(format!("condition {}: {m}", c.op)))? {
                holds = false;
                break;
            }
        }
        if !holds {
            continue;
        }
        for a in &rule.actions {
            run_action(a, t).map_err(|s| match s {
                Stop::Fail(m) => err(m),
                Stop::Error(m) => err(format!("action {}: {m}", a.op)),
            })?;
        }
        applied.push(id);
    }
    Ok(applied)
}

/// A rule document from the store: Ironic-shaped as is; Rivet's former schema converted.
pub fn from_stored(doc: &Value) -> Result<Rule, String> {
    let mut doc = doc.clone();
    if let Value::Object(m) = &mut doc {
        m.remove("created_at");
        m.remove("updated_at");
    }
    if is_legacy(&doc) {
        return convert_legacy(&doc);
    }
    serde_json::from_value(doc).map_err(|e| e.to_string())
}

/// Whether a stored body is in Rivet's pre-1.96 schema.
pub fn is_legacy(doc: &Value) -> bool {
    let has = |list: &str, key: &str| {
        doc.get(list)
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|x| x.get(key).is_some()))
    };
    has("conditions", "field") || has("actions", "action")
}

/// `inventory.disks.0.size` → `{inventory[disks][0][size]}`.
fn placeholder(field: &str) -> String {
    let mut parts = field.split('.');
    let head = parts.next().unwrap_or_default();
    let tail: String = parts.map(|p| format!("[{p}]")).collect();
    format!("{{{head}{tail}}}")
}

fn convert_legacy(doc: &Value) -> Result<Rule, String> {
    let s = |v: &Value, k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let mut rule = Rule {
        uuid: doc.get("uuid").and_then(Value::as_str).map(String::from),
        description: doc
            .get("description")
            .and_then(Value::as_str)
            .filter(|d| !d.is_empty())
            .map(String::from),
        priority: doc.get("priority").and_then(Value::as_i64).unwrap_or(0),
        ..Rule::default()
    };
    for c in doc
        .get("conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let field = placeholder(&s(c, "field"));
        let value = c.get("value").cloned().unwrap_or(Value::Null);
        let regex_of = |v: &Value| v.as_str().map(regex_lite::escape).unwrap_or_default();
        let (op, args) = match s(c, "op").as_str() {
            "eq" => ("eq", json!({"values": [field, value]})),
            "ne" => ("!eq", json!({"values": [field, value]})),
            "gt" => ("gt", json!({"values": [field, value]})),
            "lt" => ("lt", json!({"values": [field, value]})),
            "matches" => (
                "contains",
                json!({"value": field, "regex": value.as_str().unwrap_or_default()}),
            ),
            "contains" if value.is_string() => (
                "contains",
                json!({"value": field, "regex": regex_of(&value)}),
            ),
            "contains" => ("one-of", json!({"value": value, "values": field})),
            other => return Err(format!("legacy condition op {other:?} has no equivalent")),
        };
        rule.conditions.push(Operation {
            op: op.into(),
            args,
            loop_items: None,
            multiple: None,
        });
    }
    for a in doc
        .get("actions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let value = a.get("value").cloned().unwrap_or(Value::Null);
        let name = s(a, "name");
        let (op, args) = match s(a, "action").as_str() {
            "set-property" => (
                "set-attribute",
                json!({"path": format!("properties/{name}"), "value": value}),
            ),
            "set-extra" => (
                "set-attribute",
                json!({"path": format!("extra/{name}"), "value": value}),
            ),
            "set-resource-class" => (
                "set-attribute",
                json!({"path": "resource_class", "value": value}),
            ),
            "set-capability" => ("set-capability", json!({"name": name, "value": value})),
            "add-trait" => ("add-trait", json!({"name": name})),
            "fail" => ("fail", json!({"msg": s(a, "message")})),
            other => return Err(format!("legacy action {other:?} has no equivalent")),
        };
        rule.actions.push(Operation {
            op: op.into(),
            args,
            loop_items: None,
            multiple: None,
        });
    }
    Ok(rule)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(v: Value) -> Rule {
        serde_json::from_value(v).expect("rule")
    }

    fn target() -> Target {
        let inventory = json!({"cpu": {"count": 8, "model_name": "AMD EPYC 7702"},
            "bmc_address": "10.0.0.5", "disks": [{"size": 100}],
            "interfaces": [{"name": "eth0", "mac_address": "52:54:00:00:00:01"}]});
        let node = json!({"uuid": "n1", "driver": "fake-hardware", "properties": {},
            "driver_info": {}, "extra": {}, "traits": [], "resource_class": null});
        Target {
            inventory,
            node: node.as_object().cloned().unwrap_or_default(),
            ports: vec![json!({"uuid": "p1", "address": "52:54:00:00:00:01", "pxe_enabled": false, "extra": {}})
                .as_object()
                .cloned()
                .unwrap_or_default()],
            ..Target::default()
        }
    }

    #[test]
    fn validation_names_op_and_argument() {
        let e = validate(&rule(
            json!({"conditions": [{"op": "gte", "args": {"values": [1, 2]}}], "actions": [{"op": "add-trait", "args": {"name": "X"}}]}),
        ))
        .expect_err("op");
        assert!(e.contains("conditions[0].op") && e.contains("gte"), "{e}");
        let e = validate(&rule(
            json!({"actions": [{"op": "set-attribute", "args": {"path": "driver"}}]}),
        ))
        .expect_err("arg");
        assert!(
            e.contains("set-attribute") && e.contains("missing required argument(s): value"),
            "{e}"
        );
        let e = validate(&rule(
            json!({"actions": [{"op": "add-trait", "args": {"name": "X", "colour": "red"}}]}),
        ))
        .expect_err("extra arg");
        assert!(e.contains("unexpected argument(s): colour"), "{e}");
        let e = validate(&rule(
            json!({"conditions": [{"op": "!!eq", "args": {"values": [1, 1]}}], "actions": [{"op": "log", "args": {"msg": "x"}}]}),
        ))
        .expect_err("double bang");
        assert!(e.contains("exclamation"), "{e}");
        let e = validate(&rule(
            json!({"conditions": [{"op": "matches", "args": {"value": "x", "regex": "("}}], "actions": [{"op": "log", "args": {"msg": "x"}}]}),
        ))
        .expect_err("regex");
        assert!(e.contains("args.regex"), "{e}");
        let e = validate(&rule(
            json!({"priority": 10000, "phase": "late", "actions": [{"op": "log", "args": ["m"]}]}),
        ))
        .expect_err("two");
        assert!(
            e.contains("Multiple validation errors") && e.contains("phase"),
            "{e}"
        );
        let e = validate(&rule(
            json!({"actions": [{"op": "set-attribute", "args": {"path": "provision_state", "value": "active"}}]}),
        ))
        .expect_err("path");
        assert!(e.contains("provision_state"), "{e}");
        assert!(validate(&rule(
            json!({"actions": [{"op": "api-call", "args": {"url": "http://x"}}]})
        ))
        .is_err());
        validate(&rule(json!({"actions": [{"op": "set-attribute", "args": ["driver_info/x", "{inventory[bmc_address]}"]}]})))
            .expect("positional args");
    }

    #[test]
    fn conditions_actions_loops_and_interpolation() {
        let rules = vec![
            rule(json!({"uuid": "bmc", "priority": 50,
                "conditions": [{"op": "in-net", "args": {"address": "{inventory[bmc_address]}", "subnet": "10.0.0.0/24"}},
                               {"op": "!is-empty", "args": {"value": "{inventory[bmc_address]}"}}],
                "actions": [{"op": "set-attribute", "args": {"path": "driver", "value": "ipmi"}},
                            {"op": "set-attribute", "args": {"path": "driver_info/ipmi_address", "value": "{inventory[bmc_address]}"}},
                            {"op": "set-attribute", "args": {"path": "properties.cpus", "value": "{inventory[cpu][count]}"}},
                            {"op": "set-capability", "args": {"name": "cpu_vendor", "value": "amd"}},
                            {"op": "add-trait", "args": {"name": "CUSTOM_{x}"}},
                            {"op": "extend-attribute", "args": {"path": "extra.tags", "value": "{item}", "unique": true}, "loop": ["a", "b", "a"]},
                            {"op": "set-port-attribute", "args": {"port_id": "p1", "path": "extra/switch", "value": "sw{node[driver]}"}},
                            {"op": "log", "args": {"msg": "cpu {inventory[cpu][model_name]}"}}]})),
            rule(json!({"uuid": "low", "priority": 1,
                "conditions": [{"op": "gt", "args": {"values": ["{inventory[cpu][count]}", 4]}},
                               {"op": "eq", "args": {"values": ["{item}", "{item}"]}, "loop": [1, 2], "multiple": "all"},
                               {"op": "matches", "args": {"value": "{inventory[cpu][model_name]}", "regex": "AMD.*"}}],
                "actions": [{"op": "set-attribute", "args": ["resource_class", "big"]}]})),
            rule(
                json!({"uuid": "never", "conditions": [{"op": "lt", "args": {"values": ["{inventory[disks][0][size]}", 50]}}],
                "actions": [{"op": "fail", "args": {"msg": "too small"}}]}),
            ),
        ];
        for r in &rules {
            validate(r).expect("valid");
        }
        let mut t = target();
        let applied = apply_rules(&rules, "main", &mut t).expect("no fail");
        assert_eq!(applied, ["bmc", "low"]);
        assert_eq!(t.node["driver"], "ipmi");
        assert_eq!(t.node["driver_info"]["ipmi_address"], "10.0.0.5");
        assert_eq!(t.node["properties"]["cpus"], 8);
        assert_eq!(t.node["properties"]["capabilities"], "cpu_vendor:amd");
        assert_eq!(
            t.node["traits"],
            json!(["CUSTOM_{x}"]),
            "a missing field leaves the text"
        );
        assert_eq!(t.node["extra"]["tags"], json!(["a", "b"]));
        assert_eq!(t.node["resource_class"], "big");
        assert_eq!(
            t.ports[0]["extra"]["switch"], "swipmi",
            "interpolation sees the node as changed"
        );
        assert_eq!(
            t.logs,
            [("info".to_string(), "cpu AMD EPYC 7702".to_string())]
        );

        let failing = vec![rule(
            json!({"uuid": "f", "conditions": [{"op": "lt", "args": {"values": ["{inventory[disks][0][size]}", 500]}}],
            "actions": [{"op": "fail", "args": {"msg": "root disk under 500 GiB"}}]}),
        )];
        let e = apply_rules(&failing, "main", &mut target()).expect_err("fail");
        assert_eq!(
            (e.rule.as_str(), e.message.as_str()),
            ("f", "root disk under 500 GiB")
        );
        let bad_port = vec![rule(
            json!({"actions": [{"op": "set-port-attribute", "args": {"port_id": "nope", "path": "extra/x", "value": 1}}]}),
        )];
        assert!(apply_rules(&bad_port, "main", &mut target())
            .expect_err("port")
            .message
            .contains("nope"));
    }

    #[test]
    fn secrets_are_masked_and_operators_behave() {
        let mut t = target();
        if let Value::Object(m) = &mut t.inventory {
            m.insert("bmc_password".into(), json!("hunter2"));
        }
        let rules = vec![rule(
            json!({"actions": [{"op": "set-attribute", "args": {"path": "extra/p", "value": "{inventory[bmc_password]}"}}]}),
        )];
        apply_rules(&rules, "main", &mut t).expect("ok");
        assert_eq!(t.node["extra"]["p"], "***");
        let ctx = context(&target(), None);
        let c = |op: &str, args: Value| {
            check_condition(
                &Operation {
                    op: op.into(),
                    args,
                    loop_items: None,
                    multiple: None,
                },
                &Target {
                    node: ctx["node"].as_object().cloned().unwrap_or_default(),
                    inventory: ctx["inventory"].clone(),
                    ..Target::default()
                },
            )
            .expect("check")
        };
        assert!(c("is-empty", json!({"value": "{inventory[nothing]}"})));
        assert!(c("is-none", json!({"value": "{node[resource_class]}"})));
        assert!(c("is-true", json!({"value": "Yes"})));
        assert!(c("is-false", json!({"value": "false"})));
        assert!(!c("is-false", json!({"value": "maybe"})));
        assert!(c(
            "one-of",
            json!({"value": "{node[driver]}", "values": ["ipmi", "fake-hardware"]})
        ));
        assert!(c(
            "contains",
            json!({"value": "{inventory[cpu][model_name]}", "regex": "EPYC"})
        ));
        assert!(!c(
            "matches",
            json!({"value": "{inventory[cpu][model_name]}", "regex": "EPYC"})
        ));
        assert!(c(
            "!in-net",
            json!({"address": "192.168.1.1", "subnet": "10.0.0.0/8"})
        ));
        assert!(c(
            "in-net",
            json!({"address": "fd00::5", "subnet": "fd00::/64"})
        ));
        assert!(c(
            "eq",
            json!({"values": ["8", 8, "{inventory[cpu][count]}"]})
        ));
        assert!(c("lt", json!({"values": [1, 2, 3]})) && !c("lt", json!({"values": [1, 3, 2]})));
    }

    #[test]
    fn legacy_rules_convert_and_behave_the_same() {
        let old = json!({"uuid": "old", "priority": 3, "description": "",
            "conditions": [{"field": "inventory.cpu.count", "op": "gt", "value": 4},
                           {"field": "inventory.cpu.model_name", "op": "contains", "value": "EPYC"},
                           {"field": "node.driver", "op": "ne", "value": "ipmi"}],
            "actions": [{"action": "set-resource-class", "value": "amd"},
                        {"action": "set-property", "name": "vendor", "value": "amd"},
                        {"action": "add-trait", "name": "CUSTOM_AMD"}]});
        assert!(is_legacy(&old));
        let r = from_stored(&old).expect("converts");
        validate(&r).expect("valid in the new schema");
        let mut t = target();
        apply_rules(&[r], "main", &mut t).expect("applies");
        assert_eq!(t.node["resource_class"], "amd");
        assert_eq!(t.node["properties"]["vendor"], "amd");
        assert_eq!(t.node["traits"], json!(["CUSTOM_AMD"]));
        let new = json!({"uuid": "n", "actions": [{"op": "log", "args": {"msg": "x"}}], "created_at": "2026-01-01T00:00:00+00:00"});
        assert!(!is_legacy(&new));
        assert_eq!(from_stored(&new).expect("new").phase, "main");
    }
}
