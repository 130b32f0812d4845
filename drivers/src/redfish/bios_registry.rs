//! The BIOS attribute registry over Redfish, found the way sushy finds it for Ironic's
//! `cache_bios_settings` (API 1.74 registry fields): the Bios resource names its registry
//! (`AttributeRegistry`); the service root's `Registries` collection lists registry files,
//! each with `Location`s (by language) of the registry document; the registry is the one
//! whose file `Registry`/`Id` or whose document `Id` is that name, in English (or `default`).
//! Its `RegistryEntries.Attributes` give each setting's type, allowed values, bounds, ….
//! Only registries the BMC serves itself (`Location.Uri`) are read: Rivet does not fetch
//! `PublicationUri` documents from the Internet nor unpack `ArchiveUri` files.

use super::Ctx;
use crate::DriverError;
use serde_json::{Map, Value};

/// The language sushy asks for by default, as Ironic uses it.
const LANGUAGE: &str = "en";

/// Whether a `Language` value is English (`en`, `en-US`, …).
fn english(lang: &str) -> bool {
    let lang = lang.to_ascii_lowercase();
    lang == LANGUAGE || lang.split('-').next() == Some(LANGUAGE)
}

/// The local URIs of a registry file's documents: English ones first, then `default`.
fn locations(file: &Value) -> Vec<String> {
    let locs = file["Location"].as_array().cloned().unwrap_or_default();
    let uri = |l: &Value| l["Uri"].as_str().map(str::to_string);
    let mut out: Vec<String> = locs
        .iter()
        .filter(|l| l["Language"].as_str().is_some_and(english))
        .filter_map(uri)
        .collect();
    out.extend(
        locs.iter()
            .filter(|l| {
                l["Language"]
                    .as_str()
                    .is_some_and(|x| x.eq_ignore_ascii_case("default"))
            })
            .filter_map(uri),
    );
    out
}

/// An attribute registry document in a language Rivet reads.
fn usable(doc: &Value) -> bool {
    let attribute = doc["@odata.type"]
        .as_str()
        .is_some_and(|t| t.contains("AttributeRegistry"));
    // sushy skips a registry in another language; one that names none is taken.
    let lang = doc["Language"].as_str().is_none_or(english);
    attribute && lang
}

/// The `RegistryEntries.Attributes` of the registry `name`; `None` when the BMC serves no
/// such registry.
pub(crate) async fn attributes(ctx: &Ctx, name: &str) -> Result<Option<Vec<Value>>, DriverError> {
    let root = ctx.client.get("/redfish/v1/").await?;
    let Some(path) = root["Registries"]["@odata.id"].as_str() else {
        return Ok(None);
    };
    let collection = ctx.client.get(path).await?;
    let members: Vec<String> = collection["Members"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter_map(|x| x["@odata.id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let mut files = Vec::new();
    for m in &members {
        files.push(ctx.client.get(m).await?);
    }
    // A file named like the registry first: that needs no document read to decide.
    let named = |f: &Value| f["Registry"] == name || f["Id"] == name;
    files.sort_by_key(|f| !named(f));
    for file in &files {
        for uri in locations(file) {
            let doc = match ctx.client.get(&uri).await {
                Ok(d) => d,
                Err(e) => {
                    tracing::debug!(uri = %uri, error = %e, "registry document not read");
                    continue;
                }
            };
            if usable(&doc) && (named(file) || doc["Id"] == name) {
                let attrs = doc["RegistryEntries"]["Attributes"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                return Ok(Some(attrs));
            }
        }
    }
    Ok(None)
}

/// A registry boolean as sushy reads one (`bool(value)`); absent or `null` stays null.
fn flag(v: &Value) -> Value {
    match v {
        Value::Null => Value::Null,
        Value::Bool(b) => Value::Bool(*b),
        Value::Number(n) => Value::Bool(n.as_f64().is_some_and(|x| x != 0.0)),
        Value::String(s) => Value::Bool(!s.is_empty()),
        Value::Array(a) => Value::Bool(!a.is_empty()),
        Value::Object(o) => Value::Bool(!o.is_empty()),
    }
}

/// Ironic's `allowable_values`: each enumeration entry's `ValueName`, else its
/// `ValueDisplayName` (entries with neither are left out, as Ironic does).
fn allowable(v: &Value) -> Value {
    match v.as_array() {
        Some(items) => Value::Array(
            items
                .iter()
                .filter_map(|i| {
                    i["ValueName"]
                        .as_str()
                        .filter(|s| !s.is_empty())
                        .or_else(|| i["ValueDisplayName"].as_str().filter(|s| !s.is_empty()))
                        .map(|s| Value::String(s.to_string()))
                })
                .collect(),
        ),
        None => v.clone(),
    }
}

/// Ironic's registry fields of the setting `name` from registry `entries`; empty (all
/// null) when the registry has no entry for it.
pub(crate) fn fields(entries: &[Value], name: &str) -> Map<String, Value> {
    let mut out = Map::new();
    let Some(e) = entries.iter().find(|e| e["AttributeName"] == name) else {
        return out;
    };
    let plain = [
        ("attribute_type", "Type"),
        ("lower_bound", "LowerBound"),
        ("upper_bound", "UpperBound"),
        ("max_length", "MaxLength"),
        ("min_length", "MinLength"),
    ];
    for (ours, theirs) in plain {
        out.insert(ours.into(), e[theirs].clone());
    }
    out.insert("allowable_values".into(), allowable(&e["Value"]));
    out.insert("read_only".into(), flag(&e["ReadOnly"]));
    out.insert("reset_required".into(), flag(&e["ResetRequired"]));
    out.insert("unique".into(), flag(&e["IsSystemUniqueProperty"]));
    out.retain(|_, v| !v.is_null());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn entry_fields_by_ironic_names() {
        let entries = vec![
            json!({"AttributeName": "BootMode", "Type": "Enumeration", "ReadOnly": false,
                   "ResetRequired": true,
                   "Value": [{"ValueName": "Bios", "ValueDisplayName": "BIOS"},
                             {"ValueDisplayName": "UEFI"}, {"Other": 1}]}),
            json!({"AttributeName": "Cores", "Type": "Integer", "LowerBound": 1,
                   "UpperBound": 64, "IsSystemUniqueProperty": true}),
            json!({"AttributeName": "Tag", "Type": "String", "MinLength": 0, "MaxLength": 16,
                   "ReadOnly": true}),
        ];
        let b = fields(&entries, "BootMode");
        assert_eq!(b["attribute_type"], "Enumeration");
        assert_eq!(b["allowable_values"], json!(["Bios", "UEFI"]));
        assert_eq!(b["read_only"], false);
        assert_eq!(b["reset_required"], true);
        assert!(!b.contains_key("unique"));
        assert!(!b.contains_key("lower_bound"));
        let c = fields(&entries, "Cores");
        assert_eq!(
            (c["lower_bound"].clone(), c["upper_bound"].clone()),
            (json!(1), json!(64))
        );
        assert_eq!(c["unique"], true);
        let t = fields(&entries, "Tag");
        assert_eq!(
            (t["min_length"].clone(), t["max_length"].clone()),
            (json!(0), json!(16))
        );
        assert_eq!(t["read_only"], true);
        assert!(fields(&entries, "Missing").is_empty());
    }

    #[test]
    fn english_locations_first_then_default() {
        let file = json!({"Location": [
            {"Language": "de", "Uri": "/de"},
            {"Language": "default", "Uri": "/any"},
            {"Language": "en-US", "Uri": "/en"},
            {"Language": "en", "PublicationUri": "https://example.invalid/r.json"}
        ]});
        assert_eq!(
            locations(&file),
            vec!["/en".to_string(), "/any".to_string()]
        );
        assert!(usable(
            &json!({"@odata.type": "#AttributeRegistry.v1_1_1.AttributeRegistry", "Language": "en-GB"})
        ));
        assert!(!usable(
            &json!({"@odata.type": "#MessageRegistry.v1_0_0.MessageRegistry", "Language": "en"})
        ));
        assert!(!usable(
            &json!({"@odata.type": "#AttributeRegistry.v1_1_1.AttributeRegistry", "Language": "fr"})
        ));
    }
}
