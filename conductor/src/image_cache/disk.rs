//! The cache's directory, the index's source of truth across restarts:
//! `images/<algo>-<hex>` (an image, named by its digest), `images/<algo>-<hex>.json` (where it
//! came from, its HTTP validators, when it was used and verified), `partial/` (downloads in
//! progress: never served, emptied at start), `token.key` (the download tokens' key, 0600).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use std::io::Read;
use std::path::{Path, PathBuf};

/// A digest that names a cached image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageDigest {
    /// `sha256` or `sha512`.
    pub algo: &'static str,
    /// Lower-case hex.
    pub hex: String,
}

impl ImageDigest {
    /// From an algorithm and a hex digest of the right length.
    pub fn new(algo: &str, hex: &str) -> Result<ImageDigest, String> {
        let hex = hex.trim().to_ascii_lowercase();
        let algo = match algo {
            "sha256" => "sha256",
            "sha512" => "sha512",
            other => {
                return Err(format!(
                    "image digest algorithm {other:?} is not supported; use sha256 or sha512"
                ))
            }
        };
        let len = if algo == "sha256" { 64 } else { 128 };
        if hex.len() != len || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("{hex:?} is not a {algo} hex digest"));
        }
        Ok(ImageDigest { algo, hex })
    }

    /// From a cached image's name (`sha256-<hex>`); anything else (a path, `..`) is `None`.
    pub fn from_name(name: &str) -> Option<ImageDigest> {
        let (algo, hex) = name.split_once('-')?;
        let d = ImageDigest::new(algo, hex).ok()?;
        (d.name() == name).then_some(d)
    }

    /// The content address: `sha256-<hex>`.
    pub fn name(&self) -> String {
        format!("{}-{}", self.algo, self.hex)
    }
}

/// A running digest of either algorithm.
pub enum Hasher {
    /// SHA-256.
    Sha256(sha2::Sha256),
    /// SHA-512.
    Sha512(sha2::Sha512),
}

impl Hasher {
    /// For `algo` (`sha256` or anything else: sha512).
    pub fn new(algo: &str) -> Hasher {
        if algo == "sha256" {
            Hasher::Sha256(sha2::Sha256::new())
        } else {
            Hasher::Sha512(sha2::Sha512::new())
        }
    }

    /// Add bytes.
    pub fn update(&mut self, b: &[u8]) {
        match self {
            Hasher::Sha256(h) => h.update(b),
            Hasher::Sha512(h) => h.update(b),
        }
    }

    /// The hex digest.
    pub fn hex(self) -> String {
        let bytes: Vec<u8> = match self {
            Hasher::Sha256(h) => h.finalize().to_vec(),
            Hasher::Sha512(h) => h.finalize().to_vec(),
        };
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// What identifies a file's bytes cheaply: a changed length or mtime means it must be hashed
/// again before it is trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStamp {
    /// Length.
    pub len: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i128,
}

impl FileStamp {
    /// The stamp of `path`.
    pub fn of(path: &Path) -> std::io::Result<FileStamp> {
        let m = std::fs::metadata(path)?;
        let mtime_ns = m
            .modified()?
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i128)
            .unwrap_or(0);
        Ok(FileStamp {
            len: m.len(),
            mtime_ns,
        })
    }
}

/// One cached image's record (its `.json` file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntryMeta {
    /// Content address (`sha256-<hex>`).
    pub name: String,
    /// The origin URL it was last fetched or validated from.
    pub url: String,
    /// Size.
    pub bytes: u64,
    /// The origin's `ETag`.
    #[serde(default)]
    pub etag: Option<String>,
    /// The origin's `Last-Modified`.
    #[serde(default)]
    pub last_modified: Option<String>,
    /// When it was downloaded.
    pub fetched_at: DateTime<Utc>,
    /// When a deploy last used it (LRU and ttl).
    pub last_used: DateTime<Utc>,
    /// When the origin last confirmed it (a download or a 304).
    #[serde(default)]
    pub validated_at: Option<DateTime<Utc>>,
    /// The file's stamp when its digest was last checked.
    #[serde(default)]
    pub verified: Option<FileStamp>,
}

/// The directory layout.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The cache directory.
    pub root: PathBuf,
}

impl Layout {
    fn images(&self) -> PathBuf {
        self.root.join("images")
    }

    /// Where downloads in progress are written.
    pub fn partial_dir(&self) -> PathBuf {
        self.root.join("partial")
    }

    /// A cached image's data file.
    pub fn image(&self, name: &str) -> PathBuf {
        self.images().join(name)
    }

    fn meta(&self, name: &str) -> PathBuf {
        self.images().join(format!("{name}.json"))
    }

    /// Create the directories, empty `partial/` (a download cut by a restart is never
    /// resumed or served), read every complete image's record; records without their data
    /// file (or of another length) and data files without a record are removed.
    pub fn load(&self) -> std::io::Result<Vec<EntryMeta>> {
        std::fs::create_dir_all(self.images())?;
        std::fs::create_dir_all(self.partial_dir())?;
        for e in std::fs::read_dir(self.partial_dir())? {
            let _ = std::fs::remove_file(e?.path());
        }
        let mut out = Vec::new();
        let mut names = std::collections::HashSet::new();
        for e in std::fs::read_dir(self.images())? {
            let path = e?.path();
            let Some(file) = path.file_name().and_then(|f| f.to_str()) else {
                continue;
            };
            let Some(name) = file.strip_suffix(".json") else {
                continue;
            };
            let meta: Option<EntryMeta> = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .filter(|m: &EntryMeta| m.name == name && ImageDigest::from_name(name).is_some());
            let data_len = std::fs::metadata(self.image(name)).map(|m| m.len()).ok();
            match meta {
                Some(m) if data_len == Some(m.bytes) => {
                    names.insert(name.to_string());
                    out.push(m);
                }
                _ => {
                    tracing::warn!(image = %name, "image cache: record without its complete image; removed");
                    self.remove(name);
                }
            }
        }
        for e in std::fs::read_dir(self.images())? {
            let path = e?.path();
            let Some(file) = path.file_name().and_then(|f| f.to_str()) else {
                continue;
            };
            if !file.ends_with(".json") && !names.contains(file) {
                let _ = std::fs::remove_file(&path);
            }
        }
        Ok(out)
    }

    /// Write a record (a temporary file renamed over the old one).
    pub fn write_meta(&self, m: &EntryMeta) -> std::io::Result<()> {
        let tmp = self.images().join(format!(".{}.json.tmp", m.name));
        std::fs::write(
            &tmp,
            serde_json::to_vec_pretty(m).map_err(std::io::Error::other)?,
        )?;
        std::fs::rename(&tmp, self.meta(&m.name))
    }

    /// Remove an image and its record.
    pub fn remove(&self, name: &str) {
        let _ = std::fs::remove_file(self.meta(name));
        let _ = std::fs::remove_file(self.image(name));
    }

    /// The download tokens' key: read, or made on first use (readable by rivetd only).
    pub fn key(&self) -> std::io::Result<[u8; 32]> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.root.join("token.key");
        match std::fs::read(&path) {
            Ok(b) if b.len() == 32 => {
                let mut k = [0u8; 32];
                k.copy_from_slice(&b);
                return Ok(k);
            }
            Ok(_) => {
                return Err(std::io::Error::other(format!(
                    "{} is not a 32-byte key; remove it to make a new one",
                    path.display()
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let key: [u8; 32] = rand::random();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        std::io::Write::write_all(&mut f, &key)?;
        f.sync_all()?;
        Ok(key)
    }
}

/// The digest of a file (blocking: run it on the blocking pool).
pub fn hash_file(path: &Path, algo: &str) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Hasher::new(algo);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(h.hex());
        }
        h.update(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_digests_only() {
        let d = ImageDigest::new("sha256", &"AB".repeat(32)).expect("digest");
        assert_eq!(d.name(), format!("sha256-{}", "ab".repeat(32)));
        assert_eq!(ImageDigest::from_name(&d.name()), Some(d));
        for bad in [
            "sha256-../x",
            "md5-abc",
            "sha256-",
            "sha256-zz",
            "../images",
        ] {
            assert!(ImageDigest::from_name(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn load_keeps_complete_images_and_drops_the_rest() {
        let dir = tempfile::tempdir().expect("tmp");
        let l = Layout {
            root: dir.path().to_path_buf(),
        };
        assert!(l.load().expect("empty").is_empty());
        let name = format!("sha256-{}", "a".repeat(64));
        std::fs::write(l.image(&name), b"abc").expect("data");
        let now = Utc::now();
        let m = EntryMeta {
            name: name.clone(),
            url: "http://o/i".into(),
            bytes: 3,
            etag: None,
            last_modified: None,
            fetched_at: now,
            last_used: now,
            validated_at: None,
            verified: None,
        };
        l.write_meta(&m).expect("meta");
        let orphan = format!("sha256-{}", "b".repeat(64));
        std::fs::write(l.image(&orphan), b"x").expect("orphan");
        std::fs::write(l.partial_dir().join("x.part"), b"half").expect("partial");
        let loaded = l.load().expect("load");
        assert_eq!(loaded, vec![m]);
        assert!(!l.image(&orphan).exists());
        assert_eq!(std::fs::read_dir(l.partial_dir()).expect("dir").count(), 0);
        let k = l.key().expect("key");
        assert_eq!(l.key().expect("again"), k);
    }
}
