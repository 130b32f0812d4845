//! Root device hints, with Ironic's names and operators (`properties.root_device`).
//!
//! One implementation for the controller (inspection derives `local_gb` from the root disk)
//! and the agent (`write_image` picks its target disk). Pure: disks in, a choice out.
//!
//! Hints: `size` (GiB, integer), `model`, `vendor`, `serial`, `wwn`, `wwn_with_extension`,
//! `wwn_vendor_extension`, `name` (with or without `/dev/`), `by_path`, `hctl` (strings),
//! `rotational` (boolean). A value is either bare (equality) or an operator and a value:
//! strings `s==`, `s!=`, `s>=`, `s>`, `s<=`, `s<`, `<in>` (substring); numbers `==`, `!=`,
//! `>=`, `>`, `<=`, `<`; booleans `<is>`; and `<or> A <or> B` for any of several values.
//! String comparisons ignore case except for `name` and `by_path`. Every hint must match;
//! the first disk (inventory order) that matches all is chosen. Without hints: the smallest
//! disk of at least 4 GiB, as IPA does.

use crate::inventory::Disk;
use serde_json::{Map, Value};

const GIB: u64 = 1 << 30;

/// Hint names understood.
pub const HINT_NAMES: &[&str] = &[
    "size",
    "model",
    "vendor",
    "serial",
    "wwn",
    "wwn_with_extension",
    "wwn_vendor_extension",
    "name",
    "by_path",
    "hctl",
    "rotational",
];

/// A malformed hint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HintError(pub String);

impl std::fmt::Display for HintError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for HintError {}

fn err(m: String) -> HintError {
    HintError(m)
}

const STRING_OPS: &[&str] = &["s==", "s!=", "s>=", "s<=", "s>", "s<", "<in>"];
const NUMBER_OPS: &[&str] = &["==", "!=", ">=", "<=", ">", "<", "="];

/// `(operator, value)` of one alternative; `None` = equality.
fn split_op<'a>(expr: &'a str, ops: &[&'static str]) -> (Option<&'static str>, &'a str) {
    let e = expr.trim();
    for op in ops {
        if let Some(rest) = e.strip_prefix(op) {
            return (Some(op), rest.trim());
        }
    }
    (None, e)
}

/// The alternatives of an expression: `<or> A <or> B` → [A, B]; anything else → [it].
fn alternatives(expr: &str) -> Vec<&str> {
    let e = expr.trim();
    if e.starts_with("<or>") {
        e.split("<or>")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect()
    } else {
        vec![e]
    }
}

fn string_matches(key: &str, have: Option<&str>, want: &Value) -> Result<bool, HintError> {
    let expr = match want {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => return Err(err(format!("root device hint {key} must be a string"))),
    };
    let exact = matches!(key, "name" | "by_path");
    let norm = |s: &str| {
        let s = if key == "name" && !s.starts_with("/dev/") && !s.starts_with('/') {
            format!("/dev/{s}")
        } else {
            s.to_string()
        };
        if exact {
            s
        } else {
            s.to_ascii_lowercase()
        }
    };
    let Some(have) = have else { return Ok(false) };
    let have = norm(have);
    for alt in alternatives(&expr) {
        let (op, value) = split_op(alt, STRING_OPS);
        let value = norm(value);
        let hit = match op {
            None | Some("s==") => have == value,
            Some("s!=") => have != value,
            Some("s>=") => have >= value,
            Some("s<=") => have <= value,
            Some("s>") => have > value,
            Some("s<") => have < value,
            Some("<in>") => have.contains(&value),
            Some(_) => false,
        };
        if hit {
            return Ok(true);
        }
    }
    Ok(false)
}

fn number_matches(key: &str, have: u64, want: &Value) -> Result<bool, HintError> {
    let expr = match want {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        _ => {
            return Err(err(format!(
                "root device hint {key} must be a number of GiB"
            )))
        }
    };
    for alt in alternatives(&expr) {
        let (op, value) = split_op(alt, NUMBER_OPS);
        let n: u64 = value.parse().map_err(|_| {
            err(format!(
                "root device hint {key} {expr:?} is not a whole number of GiB with an optional ==, !=, >=, >, <=, <"
            ))
        })?;
        let hit = match op {
            None | Some("==") | Some("=") => have == n,
            Some("!=") => have != n,
            Some(">=") => have >= n,
            Some("<=") => have <= n,
            Some(">") => have > n,
            Some("<") => have < n,
            Some(_) => false,
        };
        if hit {
            return Ok(true);
        }
    }
    Ok(false)
}

fn bool_matches(key: &str, have: bool, want: &Value) -> Result<bool, HintError> {
    let parse = |s: &str| match s.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(err(format!(
            "root device hint {key} must be true or false, not {s:?}"
        ))),
    };
    let w = match want {
        Value::Bool(b) => *b,
        Value::String(s) => parse(s.trim().strip_prefix("<is>").unwrap_or(s))?,
        Value::Number(n) => n.as_u64() == Some(1),
        _ => return Err(err(format!("root device hint {key} must be true or false"))),
    };
    Ok(have == w)
}

/// Does `disk` match one hint?
pub fn hint_matches(disk: &Disk, key: &str, want: &Value) -> Result<bool, HintError> {
    match key {
        "size" => number_matches(key, disk.size / GIB, want),
        "rotational" => bool_matches(key, disk.rotational, want),
        "name" => string_matches(key, Some(&disk.name), want),
        "model" => string_matches(key, Some(disk.model.trim()), want),
        "vendor" => string_matches(key, disk.vendor.as_deref().map(str::trim), want),
        "serial" => string_matches(key, disk.serial.as_deref(), want),
        "wwn" => string_matches(key, disk.wwn.as_deref(), want),
        // Rivet's inventory has no separate extension fields: the WWN stands in.
        "wwn_with_extension" | "wwn_vendor_extension" => {
            string_matches(key, disk.wwn.as_deref(), want)
        }
        "by_path" => string_matches(key, disk.by_path.as_deref(), want),
        "hctl" => string_matches(key, disk.hctl.as_deref(), want),
        other => Err(err(format!(
            "unknown root device hint {other:?} (supported: {})",
            HINT_NAMES.join(", ")
        ))),
    }
}

/// Check every hint is known and well formed, without any disk.
pub fn validate(hints: &Map<String, Value>) -> Result<(), HintError> {
    let probe = Disk::default();
    for (k, v) in hints {
        hint_matches(&probe, k, v)?;
    }
    Ok(())
}

/// Pick the root disk: every hint must match (first match in order); without hints the
/// smallest disk of at least 4 GiB. `Ok(None)` when no disk qualifies.
pub fn root_disk<'a>(
    disks: &'a [Disk],
    hints: Option<&Map<String, Value>>,
) -> Result<Option<&'a Disk>, HintError> {
    match hints.filter(|h| !h.is_empty()) {
        Some(h) => {
            validate(h)?;
            for d in disks {
                let mut all = true;
                for (k, v) in h {
                    if !hint_matches(d, k, v)? {
                        all = false;
                        break;
                    }
                }
                if all {
                    return Ok(Some(d));
                }
            }
            Ok(None)
        }
        None => Ok(disks
            .iter()
            .filter(|d| d.size >= 4 * GIB)
            .min_by_key(|d| d.size)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn disk(name: &str, gib: u64, serial: &str, rotational: bool) -> Disk {
        Disk {
            name: name.into(),
            model: "QEMU HARDDISK".into(),
            size: gib * GIB,
            rotational,
            serial: Some(serial.into()),
            vendor: Some("ATA".into()),
            by_path: Some(format!("/dev/disk/by-path/pci-0000:00:0{gib}.0")),
            hctl: Some(format!("0:0:{gib}:0")),
            wwn: Some(format!("0x500{gib}")),
            ..Default::default()
        }
    }

    fn pick(disks: &[Disk], hints: Value) -> Result<Option<String>, HintError> {
        let h = hints.as_object().cloned().unwrap_or_default();
        Ok(root_disk(disks, Some(&h))?.map(|d| d.name.clone()))
    }

    #[test]
    fn ironic_operators() {
        let disks = [
            disk("/dev/sda", 2, "AAA", true),
            disk("/dev/sdb", 10, "BBB", false),
            disk("/dev/sdc", 20, "CCC", true),
        ];
        assert_eq!(
            pick(&disks, json!({"size": 10})).unwrap().as_deref(),
            Some("/dev/sdb")
        );
        assert_eq!(
            pick(&disks, json!({"size": ">= 15"})).unwrap().as_deref(),
            Some("/dev/sdc")
        );
        assert_eq!(
            pick(&disks, json!({"size": "<or> 7 <or> 20"}))
                .unwrap()
                .as_deref(),
            Some("/dev/sdc")
        );
        assert_eq!(
            pick(&disks, json!({"size": "!= 2"})).unwrap().as_deref(),
            Some("/dev/sdb")
        );
        assert_eq!(
            pick(&disks, json!({"serial": "s== ccc"}))
                .unwrap()
                .as_deref(),
            Some("/dev/sdc")
        );
        assert_eq!(
            pick(&disks, json!({"serial": "s!= AAA"}))
                .unwrap()
                .as_deref(),
            Some("/dev/sdb")
        );
        assert_eq!(
            pick(&disks, json!({"serial": "s> BBB"}))
                .unwrap()
                .as_deref(),
            Some("/dev/sdc")
        );
        assert_eq!(
            pick(&disks, json!({"model": "<in> harddisk"}))
                .unwrap()
                .as_deref(),
            Some("/dev/sda")
        );
        assert_eq!(
            pick(&disks, json!({"name": "sdb"})).unwrap().as_deref(),
            Some("/dev/sdb")
        );
        assert_eq!(
            pick(&disks, json!({"rotational": false}))
                .unwrap()
                .as_deref(),
            Some("/dev/sdb")
        );
        assert_eq!(
            pick(&disks, json!({"rotational": "<is> True", "size": "> 5"}))
                .unwrap()
                .as_deref(),
            Some("/dev/sdc")
        );
        assert_eq!(
            pick(&disks, json!({"hctl": "0:0:20:0"}))
                .unwrap()
                .as_deref(),
            Some("/dev/sdc")
        );
        assert_eq!(pick(&disks, json!({"size": 99})).unwrap(), None);
        assert!(pick(&disks, json!({"colour": "red"}))
            .unwrap_err()
            .0
            .contains("unknown root device hint"));
        assert!(pick(&disks, json!({"size": ">= lots"}))
            .unwrap_err()
            .0
            .contains("size"));
        assert!(pick(&disks, json!({"rotational": "maybe"}))
            .unwrap_err()
            .0
            .contains("rotational"));
    }

    #[test]
    fn default_is_smallest_of_at_least_4_gib() {
        let disks = [
            disk("/dev/sda", 2, "A", true),
            disk("/dev/sdb", 30, "B", true),
            disk("/dev/sdc", 8, "C", true),
        ];
        assert_eq!(
            root_disk(&disks, None).unwrap().map(|d| d.name.as_str()),
            Some("/dev/sdc")
        );
        assert_eq!(root_disk(&disks[..1], None).unwrap(), None);
    }
}
