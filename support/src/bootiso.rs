//! The per-node virtual-media ISO: image-build's `rivet.iso` with the parameter region of its
//! `grub.cfg` rewritten for one node (see `rivet_protocol::bootparams` for why a rewrite and
//! not a build). This module finds the regions (once per artefact file) and says what a node's
//! region holds; `api::boot` streams the patched bytes and the conductor checks, before it
//! asks a BMC to insert the ISO, that it can be served.

use rivet_protocol::bootparams;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// The ramdisk ISO's file name in `[boot] artefact_dir`.
pub const ISO: &str = "rivet.iso";

/// Why the per-node ISO cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum BootIsoError {
    /// No artefact directory configured.
    #[error("rivetd has no [boot] artefact_dir, so it has no ramdisk ISO to give the BMC; set it to image-build's output directory")]
    NoArtefacts,
    /// Neither URL is configured.
    #[error("rivetd has no [boot] public_url (the URL the ramdisk calls back to) and no external_http_url (the URL the BMC downloads the ISO from); set them")]
    NoUrl,
    /// The ISO is missing or unreadable.
    #[error("cannot read the ramdisk ISO {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// An ISO made by an older image-build.
    #[error("the ramdisk ISO {path} has no per-node parameter region; rebuild it with this version of image-build")]
    NoRegion {
        /// The file.
        path: PathBuf,
    },
    /// The parameters do not fit.
    #[error("boot parameters for the ISO: {0}")]
    Params(#[from] bootparams::RegionError),
}

/// The regions of one artefact file, valid while its size and mtime stay the same.
struct Scanned {
    path: PathBuf,
    len: u64,
    modified: Option<SystemTime>,
    regions: Vec<u64>,
}

static SCANNED: Mutex<Option<Scanned>> = Mutex::new(None);

/// The ISO's path, its length and the offsets of its parameter regions. Reads the whole file
/// the first time and after it changes (tens of MiB, once per image-build run); blocking, so
/// call it from a blocking context.
pub fn regions(path: &Path) -> Result<(u64, Vec<u64>), BootIsoError> {
    let read = |source| BootIsoError::Read {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(read)?;
    let (len, modified) = (meta.len(), meta.modified().ok());
    {
        let cache = SCANNED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = cache.as_ref() {
            if s.path == path && s.len == len && s.modified == modified {
                return Ok((len, s.regions.clone()));
            }
        }
    }
    let bytes = std::fs::read(path).map_err(read)?;
    let regions: Vec<u64> = bootparams::find_regions(&bytes)
        .into_iter()
        .map(|r| r as u64)
        .collect();
    if regions.is_empty() {
        return Err(BootIsoError::NoRegion {
            path: path.to_path_buf(),
        });
    }
    tracing::info!(iso = %path.display(), regions = regions.len(), "scanned the ramdisk ISO for its parameter region");
    *SCANNED.lock().unwrap_or_else(|p| p.into_inner()) = Some(Scanned {
        path: path.to_path_buf(),
        len: bytes.len() as u64,
        modified,
        regions: regions.clone(),
    });
    Ok((bytes.len() as u64, regions))
}

/// The region a node's ISO carries: where the ramdisk calls back and which node it is.
pub fn node_region(public_url: &str, node: &str) -> Result<String, BootIsoError> {
    Ok(bootparams::region(&format!(
        "rivet.controller={} rivet.node={node}",
        public_url.trim_end_matches('/')
    ))?)
}

/// The URL a BMC downloads `node`'s ISO from.
pub fn iso_url(boot: &rivet_model::config::BootConfig, node: &str) -> Result<String, BootIsoError> {
    let base = boot
        .external_http_url
        .as_deref()
        .or(boot.public_url.as_deref())
        .ok_or(BootIsoError::NoUrl)?;
    Ok(format!(
        "{}/boot/iso/{node}.iso",
        base.trim_end_matches('/')
    ))
}

/// Everything a virtual-media boot of `node` needs, checked before the BMC is asked: the URL
/// to give it (and that the ISO it will fetch exists and can carry the node's parameters).
pub fn check(boot: &rivet_model::config::BootConfig, node: &str) -> Result<String, BootIsoError> {
    let dir = boot
        .artefact_dir
        .as_deref()
        .ok_or(BootIsoError::NoArtefacts)?;
    let public = boot.public_url.as_deref().ok_or(BootIsoError::NoUrl)?;
    node_region(public, node)?;
    regions(&dir.join(ISO))?;
    iso_url(boot, node)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn scan_finds_the_region_and_notices_a_rebuild() {
        let dir = tempfile::tempdir().unwrap();
        let iso = dir.path().join(ISO);
        let region = bootparams::region("rivet.controller=http://x").unwrap();
        std::fs::write(&iso, format!("abc{region}\nrest")).unwrap();
        let (len, at) = regions(&iso).unwrap();
        assert_eq!((len, at), (3 + 512 + 5, vec![3]));
        std::fs::write(&iso, "no region here").unwrap();
        assert!(matches!(regions(&iso), Err(BootIsoError::NoRegion { .. })));
    }

    #[test]
    fn check_names_what_is_missing() {
        let mut boot = rivet_model::config::BootConfig::default();
        assert!(matches!(check(&boot, "n"), Err(BootIsoError::NoArtefacts)));
        boot.artefact_dir = Some("/nonexistent".into());
        assert!(matches!(check(&boot, "n"), Err(BootIsoError::NoUrl)));
        boot.public_url = Some("http://192.168.240.1:6385/".into());
        assert!(matches!(check(&boot, "n"), Err(BootIsoError::Read { .. })));
        assert_eq!(
            iso_url(&boot, "n").unwrap(),
            "http://192.168.240.1:6385/boot/iso/n.iso"
        );
        boot.external_http_url = Some("http://127.0.0.1:16385".into());
        assert_eq!(
            iso_url(&boot, "n").unwrap(),
            "http://127.0.0.1:16385/boot/iso/n.iso"
        );
        assert!(node_region("http://h", "n")
            .unwrap()
            .starts_with("rivet.params=v1 rivet.controller=http://h rivet.node=n "));
    }
}
