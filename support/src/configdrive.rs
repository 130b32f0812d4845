//! The configdrive of a deploy request, in Ironic's three forms.
//!
//! A string that is an http(s) URL is handed to the agent, which fetches it; any other string
//! is gzip+base64 of an ISO 9660 image and is checked here (it decodes, it is an ISO, it is
//! at most 64 MiB — decompression stops at the limit, so a gzip bomb costs nothing); a JSON
//! object `{meta_data, user_data, network_data, vendor_data}` (API 1.56) is built into a
//! `config-2` ISO as Ironic/openstacksdk do: `openstack/latest/meta_data.json` (with the
//! node's uuid and name filled in when missing), `user_data` (a dict or list JSON-encoded, a
//! string as is; only when given), `network_data.json` and `vendor_data.json` (`{}` when
//! missing). The ISO carries Rock Ridge and Joliet names so cloud-init reads the lower-case
//! paths (hadris-iso writes it).

use base64::Engine;
use rivet_protocol::deploy::{configdrive_is_url, MAX_CONFIGDRIVE_BYTES};
use serde_json::{Map, Value};
use std::io::{Cursor, Read, Write};

/// A configdrive as the agent takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prepared {
    /// Fetched by the agent.
    Url(String),
    /// gzip+base64 of the ISO.
    Inline(String),
}

impl Prepared {
    /// The string stored in `instance_info.configdrive` and sent to the agent.
    pub fn into_string(self) -> String {
        match self {
            Prepared::Url(s) | Prepared::Inline(s) => s,
        }
    }
}

/// Why a configdrive is refused (a 400 naming the field).
#[derive(Debug, thiserror::Error)]
pub enum ConfigDriveError {
    /// A URL that is not one.
    #[error("configdrive URL {0:?} is not a valid http(s) URL")]
    BadUrl(String),
    /// Not base64.
    #[error(
        "configdrive is neither an http(s) URL nor base64 (gzip+base64 of an ISO 9660 image): {0}"
    )]
    NotBase64(String),
    /// Not gzip.
    #[error("configdrive decodes from base64 but is not gzip-compressed: {0}")]
    NotGzip(String),
    /// Not an ISO.
    #[error("configdrive is not an ISO 9660 image (no CD001 volume descriptor)")]
    NotIso,
    /// Too big.
    #[error("configdrive is larger than {} MiB once decompressed", MAX_CONFIGDRIVE_BYTES >> 20)]
    TooBig,
    /// An unknown key in the object form.
    #[error("configdrive.{0} is not a configdrive field; use meta_data, user_data, network_data, vendor_data")]
    UnknownKey(String),
    /// A key with a value of the wrong type.
    #[error("configdrive.{0} must be a JSON object")]
    NotObject(&'static str),
    /// Neither a string nor an object.
    #[error("configdrive must be a string (gzip+base64 ISO or its URL) or an object of meta_data, user_data, network_data, vendor_data")]
    WrongType,
    /// Building the ISO failed.
    #[error("building the configdrive ISO failed: {0}")]
    Build(String),
}

/// The object form with the node's own `network_data` (API 1.66) filled in where the request
/// gives none (absent, null or `{}`); the string forms are the user's finished image and stay
/// as they are.
pub fn with_node_network_data(value: &Value, node_network_data: &Map<String, Value>) -> Value {
    match value {
        Value::Object(m) if !node_network_data.is_empty() => {
            let given = match m.get("network_data") {
                None | Some(Value::Null) => false,
                Some(Value::Object(o)) => !o.is_empty(),
                Some(_) => true,
            };
            let mut m = m.clone();
            if !given {
                m.insert(
                    "network_data".into(),
                    Value::Object(node_network_data.clone()),
                );
            }
            Value::Object(m)
        }
        v => v.clone(),
    }
}

/// Validate and normalise the `configdrive` of a provision request.
pub fn prepare(
    value: &Value,
    node_uuid: &str,
    node_name: Option<&str>,
) -> Result<Prepared, ConfigDriveError> {
    match value {
        Value::String(s) if configdrive_is_url(s) => {
            let u = s.trim();
            let rest = u.split_once("://").map(|(_, r)| r).unwrap_or("");
            let host = rest.split(['/', '?', '#']).next().unwrap_or("");
            if host.is_empty() || u.chars().any(char::is_whitespace) {
                return Err(ConfigDriveError::BadUrl(u.to_string()));
            }
            Ok(Prepared::Url(u.to_string()))
        }
        Value::String(s) => {
            let iso = decode_inline(s)?;
            check_iso(&iso)?;
            Ok(Prepared::Inline(s.trim().to_string()))
        }
        Value::Object(m) => {
            let iso = build_iso(m, node_uuid, node_name)?;
            Ok(Prepared::Inline(encode(&iso)?))
        }
        _ => Err(ConfigDriveError::WrongType),
    }
}

fn check_iso(iso: &[u8]) -> Result<(), ConfigDriveError> {
    if iso.len() >= 0x8006 && &iso[0x8001..0x8006] == b"CD001" {
        Ok(())
    } else {
        Err(ConfigDriveError::NotIso)
    }
}

/// gzip+base64 → the ISO's bytes, stopping past the size limit.
pub fn decode_inline(s: &str) -> Result<Vec<u8>, ConfigDriveError> {
    let clean: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    let gz = base64::engine::general_purpose::STANDARD
        .decode(clean.as_bytes())
        .map_err(|e| ConfigDriveError::NotBase64(e.to_string()))?;
    if !gz.starts_with(&[0x1f, 0x8b]) {
        return Err(ConfigDriveError::NotGzip("no gzip header".into()));
    }
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(Cursor::new(gz))
        .take(MAX_CONFIGDRIVE_BYTES + 1)
        .read_to_end(&mut out)
        .map_err(|e| ConfigDriveError::NotGzip(e.to_string()))?;
    if out.len() as u64 > MAX_CONFIGDRIVE_BYTES {
        return Err(ConfigDriveError::TooBig);
    }
    Ok(out)
}

fn encode(iso: &[u8]) -> Result<String, ConfigDriveError> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(iso)
        .map_err(|e| ConfigDriveError::Build(e.to_string()))?;
    let bytes = gz
        .finish()
        .map_err(|e| ConfigDriveError::Build(e.to_string()))?;
    Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// The `config-2` ISO for the object form.
pub fn build_iso(
    m: &Map<String, Value>,
    node_uuid: &str,
    node_name: Option<&str>,
) -> Result<Vec<u8>, ConfigDriveError> {
    use hadris_iso::read::PathSeparator;
    use hadris_iso::write::options::{CreationFeatures, IsoFormatOptions};
    use hadris_iso::write::{File as IsoFile, InputFiles, IsoImageWriter};
    use std::sync::Arc;

    for k in m.keys() {
        if !["meta_data", "user_data", "network_data", "vendor_data"].contains(&k.as_str()) {
            return Err(ConfigDriveError::UnknownKey(k.clone()));
        }
    }
    let object = |key: &'static str| -> Result<Map<String, Value>, ConfigDriveError> {
        match m.get(key) {
            None | Some(Value::Null) => Ok(Map::new()),
            Some(Value::Object(o)) => Ok(o.clone()),
            Some(_) => Err(ConfigDriveError::NotObject(key)),
        }
    };
    let mut meta = object("meta_data")?;
    meta.entry("uuid")
        .or_insert_with(|| Value::from(node_uuid.to_string()));
    if let Some(name) = node_name {
        meta.entry("name")
            .or_insert_with(|| Value::from(name.to_string()));
    }
    let json = |v: Map<String, Value>| serde_json::to_vec(&Value::Object(v)).unwrap_or_default();
    let file = |name: &str, contents: Vec<u8>| IsoFile::File {
        name: Arc::new(name.to_string()),
        contents,
    };
    let mut latest = vec![
        file("meta_data.json", json(meta)),
        file("network_data.json", json(object("network_data")?)),
        file("vendor_data.json", json(object("vendor_data")?)),
    ];
    match m.get("user_data") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => latest.push(file("user_data", s.as_bytes().to_vec())),
        Some(v) => latest.push(file(
            "user_data",
            serde_json::to_vec(v).map_err(|e| ConfigDriveError::Build(e.to_string()))?,
        )),
    }
    let files = InputFiles {
        path_separator: PathSeparator::ForwardSlash,
        files: vec![IsoFile::Directory {
            name: Arc::new("openstack".into()),
            children: vec![IsoFile::Directory {
                name: Arc::new("latest".into()),
                children: latest,
            }],
        }],
    };
    let opts = IsoFormatOptions {
        volume_name: "config-2".into(),
        system_id: None,
        volume_set_id: None,
        publisher_id: None,
        preparer_id: None,
        application_id: None,
        sector_size: 2048,
        features: CreationFeatures::extensions(),
        path_separator: PathSeparator::ForwardSlash,
        strict_charset: false,
    };
    let mut out = Cursor::new(Vec::new());
    IsoImageWriter::create(&mut out, files, opts)
        .map_err(|e| ConfigDriveError::Build(e.to_string()))?;
    let iso = out.into_inner();
    if iso.len() as u64 > MAX_CONFIGDRIVE_BYTES {
        return Err(ConfigDriveError::TooBig);
    }
    check_iso(&iso)?;
    Ok(iso)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn have(tool: &str) -> bool {
        std::process::Command::new(tool)
            .arg("-version")
            .output()
            .is_ok()
    }

    #[test]
    fn node_network_data_fills_a_missing_one() {
        let node_nd = json!({"links": [{"id": "eth0"}]});
        let node_nd = node_nd.as_object().unwrap();
        let filled = with_node_network_data(&json!({"meta_data": {}}), node_nd);
        assert_eq!(filled["network_data"], json!({"links": [{"id": "eth0"}]}));
        let empty = with_node_network_data(&json!({"network_data": {}}), node_nd);
        assert_eq!(empty["network_data"], json!({"links": [{"id": "eth0"}]}));
        let own = with_node_network_data(&json!({"network_data": {"links": []}}), node_nd);
        assert_eq!(own["network_data"], json!({"links": []}));
        let url = with_node_network_data(&json!("https://h/cd.iso"), node_nd);
        assert_eq!(url, json!("https://h/cd.iso"));
        let none = with_node_network_data(&json!({"meta_data": {}}), &Map::new());
        assert!(none.get("network_data").is_none());
    }

    #[test]
    fn forms_and_refusals() {
        assert_eq!(
            prepare(&json!("https://h/cd.iso"), "u", None).unwrap(),
            Prepared::Url("https://h/cd.iso".into())
        );
        assert!(matches!(
            prepare(&json!("http:// x"), "u", None),
            Err(ConfigDriveError::BadUrl(_))
        ));
        assert!(matches!(
            prepare(&json!("!!!"), "u", None),
            Err(ConfigDriveError::NotBase64(_))
        ));
        let not_gz = base64::engine::general_purpose::STANDARD.encode(b"plain");
        assert!(matches!(
            prepare(&json!(not_gz), "u", None),
            Err(ConfigDriveError::NotGzip(_))
        ));
        let not_iso = encode(b"hello").unwrap();
        assert!(matches!(
            prepare(&json!(not_iso), "u", None),
            Err(ConfigDriveError::NotIso)
        ));
        assert!(matches!(
            prepare(&json!({"colour": 1}), "u", None),
            Err(ConfigDriveError::UnknownKey(_))
        ));
        assert!(matches!(
            prepare(&json!({"meta_data": 1}), "u", None),
            Err(ConfigDriveError::NotObject(_))
        ));
        assert!(matches!(
            prepare(&json!(7), "u", None),
            Err(ConfigDriveError::WrongType)
        ));
        // A gzip bomb stops at the limit.
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..70 {
            gz.write_all(&zeros).unwrap();
        }
        let bomb = base64::engine::general_purpose::STANDARD.encode(gz.finish().unwrap());
        assert!(matches!(
            prepare(&json!(bomb), "u", None),
            Err(ConfigDriveError::TooBig)
        ));
    }

    /// The built ISO, read back by xorriso: label, paths, the uuid filled in, user_data
    /// JSON-encoded; and the inline form of it is accepted as such.
    #[test]
    fn object_form_builds_a_config2_iso() {
        let built = prepare(
            &json!({"meta_data": {"hostname": "h1"}, "user_data": {"runcmd": ["true"]}}),
            "0b5c3e0e-1111-4222-8333-944444444444",
            Some("n1"),
        )
        .unwrap();
        let Prepared::Inline(text) = built.clone() else {
            panic!("inline")
        };
        assert_eq!(
            prepare(&json!(text), "x", None).unwrap(),
            built,
            "the inline form is accepted back"
        );
        let iso = decode_inline(&text).unwrap();
        assert_eq!(String::from_utf8_lossy(&iso[0x8028..0x8030]), "config-2");
        if !have("osirrox") {
            eprintln!("skipped the read-back: xorriso not installed");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cd.iso");
        std::fs::write(&p, &iso).unwrap();
        for (inner, want) in [
            (
                "/openstack/latest/meta_data.json",
                "0b5c3e0e-1111-4222-8333-944444444444",
            ),
            ("/openstack/latest/user_data", "runcmd"),
            ("/openstack/latest/network_data.json", "{}"),
        ] {
            let out = dir.path().join("x");
            let _ = std::fs::remove_file(&out);
            let st = std::process::Command::new("osirrox")
                .arg("-indev")
                .arg(&p)
                .args(["-extract", inner])
                .arg(&out)
                .output()
                .unwrap();
            assert!(
                st.status.success(),
                "{}",
                String::from_utf8_lossy(&st.stderr)
            );
            let text = std::fs::read_to_string(&out).unwrap();
            assert!(text.contains(want), "{inner}: {text}");
        }
    }
}
