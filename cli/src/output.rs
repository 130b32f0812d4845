//! Output: aligned tables (column widths from content) or raw JSON with `--json`.

use serde_json::Value;

/// How results are printed.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    /// Print raw JSON responses instead of tables.
    pub json: bool,
}

impl Output {
    /// Print a document: pretty JSON in `--json` mode, else a Field/Value table.
    pub fn document(&self, doc: &Value) {
        if self.json {
            print_json(doc);
        } else {
            print!("{}", field_table(doc));
        }
    }

    /// A confirmation line for actions without a body (suppressed in `--json` mode).
    pub fn note(&self, msg: &str) {
        if !self.json {
            println!("{msg}");
        }
    }
}

/// Pretty-print JSON to stdout.
pub fn print_json(v: &Value) {
    match serde_json::to_string_pretty(v) {
        Ok(s) => println!("{s}"),
        Err(_) => println!("{v}"),
    }
}

/// One table cell: strings bare, null empty, nested values as compact JSON, and no control
/// characters so a multi-line `last_error` cannot break the layout.
pub fn cell(v: &Value) -> String {
    let s = match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Cut a cell to `max` characters, marking the cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// Render rows under headers, columns as wide as their widest cell, two spaces apart, a
/// dashed rule under the header, no trailing spaces.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let n = headers.len();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, c) in row.iter().enumerate().take(n) {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| -> String {
        let mut out = String::new();
        for (i, c) in cells.enumerate().take(n) {
            if i > 0 {
                out.push_str("  ");
            }
            out.push_str(c);
            if i + 1 < n {
                let pad = widths[i].saturating_sub(c.chars().count());
                out.push_str(&" ".repeat(pad));
            }
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
        out
    };
    let mut out = line(&mut headers.iter().copied());
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    out.push_str(&line(&mut rule.iter().map(String::as_str)));
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    out
}

/// A two-column Field/Value table of an object's keys (sorted, as serde_json keeps them).
pub fn field_table(doc: &Value) -> String {
    match doc {
        Value::Object(m) => {
            let rows: Vec<Vec<String>> = m
                .iter()
                .filter(|(_, v)| !is_links(v))
                .map(|(k, v)| vec![k.clone(), cell(v)])
                .collect();
            table(&["Field", "Value"], &rows)
        }
        other => format!("{}\n", cell(other)),
    }
}

/// Hypermedia links (`[{"href", "rel"}, …]`): navigation for programs, noise in a table.
fn is_links(v: &Value) -> bool {
    v.as_array().is_some_and(|a| {
        !a.is_empty()
            && a.iter()
                .all(|l| l.get("href").is_some() && l.get("rel").is_some())
    })
}

/// Rows for a list of objects: one column per key, in order.
pub fn rows(items: &[Value], keys: &[&str]) -> Vec<Vec<String>> {
    items
        .iter()
        .map(|item| {
            keys.iter()
                .map(|k| cell(item.get(*k).unwrap_or(&Value::Null)))
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn widths_follow_content() {
        let t = table(
            &["UUID", "Name"],
            &[
                vec!["a".into(), "longer-name".into()],
                vec!["abcdef".into(), String::new()],
            ],
        );
        assert_eq!(
            t,
            "UUID    Name\n------  -----------\na       longer-name\nabcdef\n"
        );
    }

    #[test]
    fn cells() {
        assert_eq!(cell(&json!(null)), "");
        assert_eq!(cell(&json!("x\ny")), "x y");
        assert_eq!(cell(&json!({"a": 1})), r#"{"a":1}"#);
        assert_eq!(cell(&json!(false)), "false");
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(truncate("abc", 4), "abc");
    }

    #[test]
    fn field_table_sorted() {
        let t = field_table(&json!({"uuid": "u", "extra": {"foo": "bar"},
                                    "links": [{"href": "http://x/v1/nodes/u", "rel": "self"}]}));
        assert_eq!(
            t,
            "Field  Value\n-----  -------------\nextra  {\"foo\":\"bar\"}\nuuid   u\n"
        );
    }
}
