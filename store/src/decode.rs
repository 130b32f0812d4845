//! Stored node columns back into typed fields, the same way for both backends.
//!
//! A stored value that does not decode is never replaced by a default that could later be
//! written back (that is how a record gets lost): the first such field is recorded on the
//! node as [`Corrupt`], the API shows the node with that error, and every write of it is
//! refused with [`super::StoreError::Corrupt`] until someone repairs the value in the
//! database. The fields still get an empty value so that a read can answer.

use rivet_model::node::Corrupt;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use std::str::FromStr;

/// Collects the first decode failure while a row is read.
#[derive(Debug, Default)]
pub struct Decoder {
    corrupt: Option<Corrupt>,
}

impl Decoder {
    /// What went wrong, if anything.
    pub fn finish(self) -> Option<Corrupt> {
        self.corrupt
    }

    /// Record that `field` does not decode (when nothing else was recorded first).
    pub fn fail(&mut self, field: &'static str, error: impl std::fmt::Display) {
        self.note(field, error);
    }

    fn note(&mut self, field: &'static str, error: impl std::fmt::Display) {
        if self.corrupt.is_none() {
            let mut error = error.to_string();
            if error.len() > 200 {
                let mut cut = 200;
                while !error.is_char_boundary(cut) {
                    cut -= 1;
                }
                error.truncate(cut);
                error.push('…');
            }
            self.corrupt = Some(Corrupt { field, error });
        }
    }

    /// A JSON object column (`driver_info`, `extra`…).
    pub fn map(&mut self, field: &'static str, text: &str) -> Map<String, Value> {
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(m)) => m,
            Ok(other) => {
                self.note(
                    field,
                    format_args!("expected a JSON object, found {}", kind(&other)),
                );
                Map::new()
            }
            Err(e) => {
                self.note(field, e);
                Map::new()
            }
        }
    }

    /// A nullable JSON column (`clean_step`, `deploy_step`).
    pub fn opt_value(&mut self, field: &'static str, text: Option<&str>) -> Option<Value> {
        let text = text?;
        match serde_json::from_str(text) {
            Ok(v) => Some(v),
            Err(e) => {
                self.note(field, e);
                None
            }
        }
    }

    /// A typed JSON column; absent means the type's default.
    pub fn json<T: DeserializeOwned + Default>(
        &mut self,
        field: &'static str,
        text: Option<&str>,
    ) -> T {
        let Some(text) = text else {
            return T::default();
        };
        match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) => {
                self.note(field, e);
                T::default()
            }
        }
    }

    /// A text column holding one of a fixed set of names; `fallback` stands in for display.
    pub fn parse<T: FromStr>(&mut self, field: &'static str, text: &str, fallback: T) -> T {
        match text.parse() {
            Ok(v) => v,
            Err(_) => {
                self.note(field, format_args!("unknown value {text:?}"));
                fallback
            }
        }
    }

    /// A nullable text column holding one of a fixed set of names.
    pub fn opt_parse<T: FromStr>(&mut self, field: &'static str, text: Option<&str>) -> Option<T> {
        let text = text?;
        match text.parse() {
            Ok(v) => Some(v),
            Err(_) => {
                self.note(field, format_args!("unknown value {text:?}"));
                None
            }
        }
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rivet_protocol::states::ProvisionState;

    #[test]
    fn first_failure_is_kept_and_fields_still_read() {
        let mut d = Decoder::default();
        assert_eq!(d.map("extra", r#"{"a":1}"#).len(), 1);
        assert!(d.map("driver_internal_info", "{bad").is_empty());
        assert!(d.map("properties", "[1]").is_empty());
        let state = d.parse("provision_state", "nonsense", ProvisionState::Error);
        assert_eq!(state, ProvisionState::Error);
        let c = d.finish().expect("corrupt");
        assert_eq!(c.field, "driver_internal_info");
        assert!(c.message("n1").contains("node n1"), "{}", c.message("n1"));
    }

    #[test]
    fn wrong_type_and_unknown_names_are_corrupt() {
        let mut d = Decoder::default();
        d.map("properties", r#""text""#);
        assert_eq!(d.finish().map(|c| c.field), Some("properties"));
        let mut d = Decoder::default();
        let p: Option<ProvisionState> = d.opt_parse("target_provision_state", Some("x"));
        assert!(p.is_none());
        assert_eq!(d.finish().map(|c| c.field), Some("target_provision_state"));
        let mut d = Decoder::default();
        let t: Vec<String> = d.json("traits", None);
        assert!(t.is_empty());
        assert!(d.finish().is_none());
    }
}
