//! Deploy wire types: the arguments of the agent's `write_image` deploy step and its result.
//!
//! rivetd builds [`WriteImageArgs`] from the node's `instance_info`, `properties.root_device`
//! and the configdrive of the provision request, and sends it as the `args` of an
//! `execute_step` command (`interface: deploy`, `step: write_image`). The agent streams the
//! image to the chosen disk and answers with a [`WriteImageResult`].

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Name of the in-band deploy step that writes the image.
pub const WRITE_IMAGE: &str = "write_image";
/// Priority of `write_image` among deploy steps (Ironic's).
pub const WRITE_IMAGE_PRIORITY: i64 = 80;
/// Largest configdrive accepted, after decoding (IPA refuses larger).
pub const MAX_CONFIGDRIVE_BYTES: u64 = 64 << 20;
/// Retries of a cut image download when the controller names none (IPA's connection retries).
pub const DEFAULT_DOWNLOAD_RETRIES: u32 = 3;
/// Image formats written when the operator permits nothing else (Ironic's default).
pub const DEFAULT_PERMITTED_FORMATS: &[&str] = &["raw", "qcow2", "iso"];

/// Arguments of `write_image`. Unknown fields are refused so a controller/agent mismatch is
/// a clear error, not a silently ignored setting.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteImageArgs {
    /// `http://` or `https://` URL of the image (`instance_info.image_source`).
    pub image_source: String,
    /// Declared format (`instance_info.image_disk_format`): `raw`, `qcow2`, `iso`. When set,
    /// an image whose detected format differs is refused before anything is written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_format: Option<String>,
    /// `sha256` or `sha512` (`instance_info.image_os_hash_algo`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os_hash_algo: Option<String>,
    /// Hex digest of the image file as served (`instance_info.image_os_hash_value`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os_hash_value: Option<String>,
    /// Legacy `instance_info.image_checksum`: a hex digest (its length names the algorithm:
    /// 64 sha256, 128 sha512) or the http(s) URL of a checksums file (`SHA256SUMS` style,
    /// the line naming the image's file is used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
    /// `properties.root_device` hints (Ironic's names and operators); none = the smallest
    /// disk of at least 4 GiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_device: Option<Map<String, Value>>,
    /// Configdrive: gzip+base64 of an ISO 9660 image, or the http(s) URL of such an image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configdrive: Option<String>,
    /// Formats the operator permits; empty = [`DEFAULT_PERMITTED_FORMATS`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub permitted_formats: Vec<String>,
    /// Extra PEM CA bundle trusted for the image and configdrive URLs (besides the
    /// agent's own trust roots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_pem: Option<String>,
    /// How many times a download cut mid-way is resumed (HTTP Range) or restarted before the
    /// step fails (`[deploy] image_download_retries`); none = [`DEFAULT_DOWNLOAD_RETRIES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub download_retries: Option<u32>,
    /// The mode the node boots its instance in. `uefi`: once the image is on the disk, the
    /// agent finds its EFI System Partition and loader and writes the firmware's boot entry
    /// (a UEFI node whose image has no ESP fails the step). `bios` or none: no boot entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_mode: Option<BootMode>,
}

/// How a node's firmware boots: Ironic's `boot_mode` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BootMode {
    /// UEFI firmware: boot entries in NVRAM, an EFI System Partition on the disk.
    Uefi,
    /// Legacy BIOS: the disk's MBR boot code.
    Bios,
}

impl BootMode {
    /// Ironic's spelling: `uefi` or `bios`.
    pub fn as_str(self) -> &'static str {
        match self {
            BootMode::Uefi => "uefi",
            BootMode::Bios => "bios",
        }
    }

    /// From Ironic's spelling (`uefi`, `bios`); anything else is `None`.
    pub fn parse(s: &str) -> Option<BootMode> {
        match s {
            "uefi" => Some(BootMode::Uefi),
            "bios" => Some(BootMode::Bios),
            _ => None,
        }
    }
}

impl WriteImageArgs {
    /// Parse from an `execute_step` args map, naming the bad field.
    pub fn from_args(args: &Map<String, Value>) -> Result<WriteImageArgs, String> {
        serde_json::from_value(Value::Object(args.clone()))
            .map_err(|e| format!("write_image arguments: {e}"))
    }

    /// As an `execute_step` args map.
    pub fn to_args(&self) -> Map<String, Value> {
        match serde_json::to_value(self) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        }
    }

    /// Download retries in force.
    pub fn retries(&self) -> u32 {
        self.download_retries.unwrap_or(DEFAULT_DOWNLOAD_RETRIES)
    }

    /// The formats in force.
    pub fn permitted(&self) -> Vec<String> {
        if self.permitted_formats.is_empty() {
            DEFAULT_PERMITTED_FORMATS
                .iter()
                .map(|s| s.to_string())
                .collect()
        } else {
            self.permitted_formats.clone()
        }
    }
}

/// Where a configdrive string points, by Ironic's rule: a URL is fetched, anything else is
/// gzip+base64 data.
pub fn configdrive_is_url(configdrive: &str) -> bool {
    let c = configdrive.trim_start();
    c.starts_with("http://") || c.starts_with("https://")
}

/// The digest algorithm a hex digest's length names: 64 sha256, 128 sha512 (md5's 32 is
/// refused, as Ironic does by default).
pub fn algo_for_len(len: usize) -> Option<&'static str> {
    match len {
        64 => Some("sha256"),
        128 => Some("sha512"),
        _ => None,
    }
}

/// The line of a checksums file (`HEX  name`, `HEX *name` or BSD `SHA256 (name) = HEX`)
/// that names `file`.
pub fn checksum_from_file(text: &str, file: &str) -> Option<String> {
    for line in text.lines() {
        let l = line.trim();
        if let Some(rest) = l.split_once(" (").map(|(_, r)| r) {
            if let Some((name, hex)) = rest.split_once(") = ") {
                if name == file {
                    return Some(hex.trim().to_ascii_lowercase());
                }
            }
        }
        let mut parts = l.split_whitespace();
        if let (Some(hex), Some(name)) = (parts.next(), parts.next()) {
            let name = name.trim_start_matches('*');
            if name == file || name.rsplit('/').next() == Some(file) {
                return Some(hex.to_ascii_lowercase());
            }
        }
    }
    None
}

/// The file name at the end of a URL's path (what a checksums file names it by).
pub fn url_file_name(url: &str) -> String {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    path.rsplit('/').next().unwrap_or(path).to_string()
}

/// A URL as it may be logged or shown: a password in its user-info (rivetd's image-cache
/// URLs carry the node's download token there) replaced by `***`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let auth_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(auth_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        None => url.to_string(),
    }
}

/// What `write_image` did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WriteImageResult {
    /// The disk written (`/dev/vda`).
    pub device: String,
    /// Why this disk: `root device hints {…}` or `smallest disk of at least 4 GiB`.
    pub chosen_by: String,
    /// Detected format of the image content (`raw`, `qcow2`, `iso`).
    pub format: String,
    /// Compression the stream carried (`gzip`, `zstd`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    /// Bytes downloaded (the image file as served).
    pub image_bytes: u64,
    /// Virtual size of the image written to the disk.
    pub virtual_size: u64,
    /// Algorithm of the verified digest.
    pub hash_algo: String,
    /// The verified digest (hex).
    pub hash_value: String,
    /// Partition holding the configdrive (`/dev/vda3`), if one was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configdrive_partition: Option<String>,
    /// Seconds from the first byte requested to the disk flushed.
    pub seconds: f64,
    /// The firmware boot entry written for a `uefi` node (none for `bios`). The controller
    /// records it in `driver_internal_info.deployed_image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uefi_boot_entry: Option<UefiBootEntry>,
}

/// The UEFI boot entry `write_image` made (IPA's `manage_uefi`): which loader of the image's
/// EFI System Partition the firmware now boots first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UefiBootEntry {
    /// The variable written, `Boot0003`; it is first in `BootOrder`.
    pub number: String,
    /// The entry's description (the label of the vendor's `BOOTX64.CSV`, else `ironic1`,
    /// IPA's label).
    pub label: String,
    /// The loader on the ESP, as the firmware spells it: `\EFI\debian\shimx64.efi`.
    pub loader: String,
    /// Number of the EFI System Partition on the disk (1-based).
    pub partition: u32,
    /// The ESP's GPT unique partition GUID (lower-case), or the MBR disk signature as
    /// `mbr:xxxxxxxx`.
    pub partition_id: String,
    /// Entries removed: ones Rivet made before, or ones for the same loader on the same
    /// partition (`Boot0001`, …).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_round_trip_and_refuse_unknown_fields() {
        let a = WriteImageArgs {
            image_source: "http://10.0.0.1/img.raw".into(),
            os_hash_algo: Some("sha256".into()),
            os_hash_value: Some("ab".repeat(32)),
            ..Default::default()
        };
        let m = a.to_args();
        assert_eq!(WriteImageArgs::from_args(&m).unwrap(), a);
        let mut bad = m.clone();
        bad.insert("colour".into(), Value::from(1));
        let e = WriteImageArgs::from_args(&bad).unwrap_err();
        assert!(e.contains("colour"), "{e}");
        assert_eq!(a.permitted(), vec!["raw", "qcow2", "iso"]);
    }

    #[test]
    fn redacted_urls_hide_the_password_only() {
        assert_eq!(
            redact_url("http://n1:s3cret@10.0.0.1:6385/image-cache/sha256-ab"),
            "http://n1:***@10.0.0.1:6385/image-cache/sha256-ab"
        );
        assert_eq!(redact_url("https://h/img.raw"), "https://h/img.raw");
        assert_eq!(redact_url("https://h/a@b"), "https://h/a@b");
        assert_eq!(redact_url("not a url"), "not a url");
    }

    #[test]
    fn configdrive_kinds() {
        assert!(configdrive_is_url("https://h/cd.iso"));
        assert!(!configdrive_is_url("H4sIAAAAAAAA"));
    }
}
