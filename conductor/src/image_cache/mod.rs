//! rivetd's image cache for `image_download_source = "local"` (Ironic's master image cache):
//! each image is downloaded once from its origin however many deploys want it, verified
//! against its digest while it streams, kept content-addressed under `[image_cache] dir`, and
//! served to agents from rivetd's own listener (the controller's route) with a per-node token.
//!
//! - One download per image: lookups for an image already downloading wait on that download
//!   ([`ImageCache::ensure`]); its error (the origin's answer, a checksum mismatch) is every
//!   waiter's.
//! - Honest: a partial download lives in `partial/` and is never served; an image is entered
//!   only once its digest matched; a cached file whose length or mtime changed is hashed
//!   again before use, and discarded and fetched again if it no longer matches.
//! - Cheap to revalidate: a cached image older than `revalidate_after_s` is confirmed with a
//!   conditional GET (`If-None-Match` / `If-Modified-Since`); a 304 costs the origin nothing.
//! - Bounded: least recently used images are evicted over `max_bytes`, and images unused for
//!   `ttl_s` removed, but never one a running deploy reads (pinned by its node, or open).
//! - Survives restarts: the index is rebuilt from the directory ([`disk`]).

pub mod disk;
mod fetch;
pub mod token;

use chrono::{DateTime, Utc};
use disk::{EntryMeta, FileStamp, ImageDigest, Layout};
use futures_util::FutureExt;
use rivet_model::config::ImageCacheConfig;
use rivet_support::metrics::{self, ImageCacheOutcome};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use tokio::sync::watch;

/// A pin older than this is dropped even if its deploy never said it ended (a node deleted
/// by hand in the database): an image is never held forever.
const PIN_MAX_AGE_S: i64 = 24 * 3600;

/// The `url` of a configdrive's entry: it came from a deploy request, not an origin.
pub const CONFIGDRIVE_ORIGIN: &str = "configdrive (from a deploy request)";

/// The result every waiter of one download receives.
type FlightResult = Option<Result<EntryMeta, String>>;

#[derive(Default)]
struct State {
    loaded: bool,
    entries: BTreeMap<String, EntryMeta>,
    flights: HashMap<String, watch::Receiver<FlightResult>>,
    /// Node → (entries, since): the image its running deploy reads, and its configdrive
    /// when that is served from the cache too.
    pins: HashMap<String, (Vec<String>, DateTime<Utc>)>,
    /// Image → open downloads from the cache.
    readers: HashMap<String, usize>,
    stats: Stats,
}

/// Lookup and eviction counts since start (also in `/metrics`).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Stats {
    /// Served from the cache.
    pub hits: u64,
    /// Downloaded from the origin.
    pub misses: u64,
    /// Confirmed by the origin with a 304.
    pub revalidations: u64,
    /// Removed (LRU, ttl, purge, corrupt).
    pub evictions: u64,
}

/// One cached image as `GET /v1/image_cache` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ImageInfo {
    /// Content address.
    pub name: String,
    /// Origin URL (a password in it shown as `***`).
    pub url: String,
    /// Size.
    pub bytes: u64,
    /// Downloaded at.
    pub fetched_at: DateTime<Utc>,
    /// Last used by a deploy.
    pub last_used: DateTime<Utc>,
    /// Last confirmed by the origin.
    pub validated_at: Option<DateTime<Utc>>,
    /// Nodes whose running deploy reads it.
    pub pinned_by: Vec<String>,
    /// Downloads from the cache in progress.
    pub readers: usize,
}

/// A download from the cache in progress: its image is not evicted while this lives.
pub struct Reading {
    cache: Arc<ImageCache>,
    name: String,
}

impl Drop for Reading {
    fn drop(&mut self) {
        let mut st = self.cache.lock();
        if let Some(n) = st.readers.get_mut(&self.name) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                st.readers.remove(&self.name);
            }
        }
    }
}

/// Why a cached image cannot be opened for an agent.
#[derive(Debug)]
pub enum OpenError {
    /// Not (or no longer) in the cache.
    NotCached,
    /// Its bytes changed since they were verified: discarded (the next deploy fetches it
    /// again).
    Changed,
    /// The file could not be read.
    Io(String),
}

/// The image cache.
pub struct ImageCache {
    layout: Layout,
    config: ImageCacheConfig,
    client: OnceLock<reqwest::Client>,
    ca_pem: Option<String>,
    key: OnceLock<[u8; 32]>,
    state: Mutex<State>,
}

impl ImageCache {
    /// A cache in `dir` (nothing is read until [`ImageCache::load`] or the first lookup);
    /// `ca_pem`: an extra CA trusted for origins (`[deploy] image_ca_file`).
    pub fn new(
        dir: std::path::PathBuf,
        config: ImageCacheConfig,
        ca_pem: Option<String>,
    ) -> ImageCache {
        ImageCache {
            layout: Layout { root: dir },
            config,
            client: OnceLock::new(),
            ca_pem,
            key: OnceLock::new(),
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// The cache directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.layout.root
    }

    /// Create the directory, read the token key and rebuild the index from the directory
    /// (once; later calls do nothing).
    pub async fn load(&self) -> Result<(), String> {
        if self.lock().loaded {
            return Ok(());
        }
        let layout = self.layout.clone();
        let (entries, key) = tokio::task::spawn_blocking(move || {
            let entries = layout.load()?;
            let key = layout.key()?;
            Ok::<_, std::io::Error>((entries, key))
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("image cache {}: {e}", self.layout.root.display()))?;
        let _ = self.key.set(key);
        let mut st = self.lock();
        if !st.loaded {
            st.loaded = true;
            for e in entries {
                st.entries.insert(e.name.clone(), e);
            }
            tracing::info!(dir = %self.layout.root.display(), images = st.entries.len(), "image cache loaded");
        }
        drop(st);
        self.publish();
        Ok(())
    }

    fn client(&self) -> Result<&reqwest::Client, String> {
        if let Some(c) = self.client.get() {
            return Ok(c);
        }
        let mut b = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(60))
            .read_timeout(std::time::Duration::from_secs(300));
        if let Some(pem) = &self.ca_pem {
            for cert in reqwest::Certificate::from_pem_bundle(pem.as_bytes())
                .map_err(|e| format!("[deploy] image_ca_file does not parse: {e}"))?
            {
                b = b.add_root_certificate(cert);
            }
        }
        let c = b
            .build()
            .map_err(|e| format!("image cache: building the HTTP client: {e}"))?;
        Ok(self.client.get_or_init(|| c))
    }

    /// The key download tokens are made with.
    pub fn key(&self) -> Option<&[u8; 32]> {
        self.key.get()
    }

    /// Resolve a legacy `image_checksum` that is a checksums file's URL.
    pub async fn digest_from_checksums(
        &self,
        checksums_url: &str,
        image_url: &str,
    ) -> Result<ImageDigest, String> {
        fetch::checksum_from_url(self.client()?, checksums_url, image_url).await
    }

    /// Make sure the image `digest` of `url` is cached and current: at once when it was
    /// validated within `revalidate_after_s`, else after the one download (or conditional
    /// request) for it, which this call starts or joins.
    pub async fn ensure(
        self: &Arc<Self>,
        url: &str,
        digest: &ImageDigest,
    ) -> Result<EntryMeta, String> {
        self.load().await?;
        let name = digest.name();
        let (mut rx, joined) = {
            let mut st = self.lock();
            if let Some(rx) = st.flights.get(&name) {
                (rx.clone(), true)
            } else {
                let existing = st.entries.get(&name).cloned();
                if let Some(e) = &existing {
                    if self.fresh(e, url) {
                        let e = self.touch(&mut st, &name);
                        st.stats.hits += 1;
                        metrics::image_cache_lookup(ImageCacheOutcome::Hit);
                        return e.ok_or_else(|| "image cache: entry vanished".to_string());
                    }
                }
                let (tx, rx) = watch::channel(None);
                st.flights.insert(name.clone(), rx.clone());
                let this = self.clone();
                let (url, digest) = (url.to_string(), digest.clone());
                // Its own task: the download goes on for the others if this waiter goes
                // away, and a panic in it is every waiter's error, not a hang.
                tokio::spawn(async move {
                    let r = std::panic::AssertUnwindSafe(this.flight(&url, &digest, existing))
                        .catch_unwind()
                        .await
                        .unwrap_or_else(|_| Err("image cache: the download task panicked".into()));
                    let mut st = this.lock();
                    st.flights.remove(&digest.name());
                    drop(st);
                    let _ = tx.send(Some(r));
                    this.publish();
                });
                (rx, false)
            }
        };
        let r = rx
            .wait_for(|v| v.is_some())
            .await
            .map_err(|_| "image cache: the download task ended without a result".to_string())?
            .clone()
            .unwrap_or_else(|| Err("image cache: no result".into()));
        if joined && r.is_ok() {
            let mut st = self.lock();
            st.stats.hits += 1;
            self.touch(&mut st, &name);
            metrics::image_cache_lookup(ImageCacheOutcome::Hit);
        }
        r
    }

    /// Cached, validated recently, from this URL, and its file unchanged since verified.
    fn fresh(&self, e: &EntryMeta, url: &str) -> bool {
        let recent = e.validated_at.is_some_and(|t| {
            (Utc::now() - t).num_seconds() < self.config.revalidate_after_s as i64
        });
        recent
            && e.url == url
            && e.verified.is_some()
            && FileStamp::of(&self.layout.image(&e.name)).ok() == e.verified
    }

    fn touch(&self, st: &mut State, name: &str) -> Option<EntryMeta> {
        let e = st.entries.get_mut(name)?;
        e.last_used = Utc::now();
        let e = e.clone();
        if let Err(err) = self.layout.write_meta(&e) {
            tracing::warn!(image = %name, error = %err, "image cache: cannot update the record");
        }
        Some(e)
    }

    /// The one download (or revalidation) of an image.
    async fn flight(
        &self,
        url: &str,
        digest: &ImageDigest,
        existing: Option<EntryMeta>,
    ) -> Result<EntryMeta, String> {
        let name = digest.name();
        let client = self.client()?;
        if let Some(mut e) = existing {
            let path = self.layout.image(&name);
            let stamp = FileStamp::of(&path).ok();
            let intact = match stamp {
                Some(s) if Some(s) == e.verified => true,
                Some(_) => {
                    let (p, algo) = (path.clone(), digest.algo);
                    tokio::task::spawn_blocking(move || disk::hash_file(&p, algo))
                        .await
                        .ok()
                        .and_then(Result::ok)
                        .is_some_and(|h| h == digest.hex)
                }
                None => false,
            };
            if intact {
                e.verified = stamp;
                match fetch::get(client, url, Some(&e)).await? {
                    fetch::Answer::NotModified => {
                        let now = Utc::now();
                        e.validated_at = Some(now);
                        e.last_used = now;
                        e.url = url.to_string();
                        let _ = self.layout.write_meta(&e);
                        let mut st = self.lock();
                        st.entries.insert(name.clone(), e.clone());
                        st.stats.hits += 1;
                        st.stats.revalidations += 1;
                        metrics::image_cache_lookup(ImageCacheOutcome::Revalidated);
                        tracing::info!(image = %name, "image cache: origin says unchanged (304)");
                        return Ok(e);
                    }
                    fetch::Answer::Body(resp) => return self.download(resp, url, digest).await,
                }
            }
            tracing::warn!(image = %name, "image cache: the cached file no longer matches its digest; discarded, fetching it again");
            self.discard(std::slice::from_ref(&name));
        }
        match fetch::get(client, url, None).await? {
            fetch::Answer::Body(resp) => self.download(resp, url, digest).await,
            fetch::Answer::NotModified => Err(format!(
                "the image origin {} answered 304 to an unconditional request",
                rivet_protocol::deploy::redact_url(url)
            )),
        }
    }

    async fn download(
        &self,
        resp: reqwest::Response,
        url: &str,
        digest: &ImageDigest,
    ) -> Result<EntryMeta, String> {
        let name = digest.name();
        // Room first, for what the origin says it will send.
        self.sweep(resp.content_length().unwrap_or(0));
        let partial = self
            .layout
            .partial_dir()
            .join(format!("{name}.{}", uuid::Uuid::new_v4().simple()));
        tracing::info!(image = %name, url = %rivet_protocol::deploy::redact_url(url), "image cache: downloading from the origin");
        let saved = fetch::save(resp, url, &partial, digest, self.config.max_bytes).await?;
        let path = self.layout.image(&name);
        tokio::fs::rename(&partial, &path)
            .await
            .map_err(|e| format!("image cache: storing {}: {e}", path.display()))?;
        let now = Utc::now();
        let e = EntryMeta {
            name: name.clone(),
            url: url.to_string(),
            bytes: saved.bytes,
            etag: saved.etag,
            last_modified: saved.last_modified,
            fetched_at: now,
            last_used: now,
            validated_at: Some(now),
            verified: FileStamp::of(&path).ok(),
        };
        self.layout
            .write_meta(&e)
            .map_err(|err| format!("image cache: writing the record of {name}: {err}"))?;
        {
            let mut st = self.lock();
            st.entries.insert(name.clone(), e.clone());
            st.stats.misses += 1;
        }
        metrics::image_cache_lookup(ImageCacheOutcome::Miss);
        tracing::info!(image = %name, bytes = e.bytes, "image cache: downloaded and verified");
        self.sweep(0);
        Ok(e)
    }

    /// Keep a configdrive (the text the agent decodes) as an entry of its own, addressed by
    /// its sha256, so agents download it as they download a cached image (with `Range`, the
    /// node's token, never evicted while its deploy runs). Idempotent: the same text is
    /// the same entry, its file written once.
    pub async fn store_configdrive(self: &Arc<Self>, text: &str) -> Result<EntryMeta, String> {
        self.load().await?;
        let mut h = disk::Hasher::new("sha256");
        h.update(text.as_bytes());
        let name = ImageDigest::new("sha256", &h.hex())?.name();
        let path = self.layout.image(&name);
        {
            let mut st = self.lock();
            let kept = st
                .entries
                .get(&name)
                .is_some_and(|e| e.verified.is_some() && FileStamp::of(&path).ok() == e.verified);
            if kept {
                return self
                    .touch(&mut st, &name)
                    .ok_or_else(|| "image cache: entry vanished".to_string());
            }
        }
        self.sweep(text.len() as u64);
        let partial = self
            .layout
            .partial_dir()
            .join(format!("{name}.{}", uuid::Uuid::new_v4().simple()));
        let data = text.as_bytes().to_vec();
        let (p, dest) = (partial.clone(), path.clone());
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::write(&p, &data)?;
            std::fs::rename(&p, &dest)
        })
        .await
        .map_err(|e| format!("image cache: storing the configdrive: {e}"))?
        .map_err(|e| {
            let _ = std::fs::remove_file(&partial);
            format!(
                "image cache: storing the configdrive as {}: {e}",
                path.display()
            )
        })?;
        let now = Utc::now();
        let e = EntryMeta {
            name: name.clone(),
            url: CONFIGDRIVE_ORIGIN.to_string(),
            bytes: text.len() as u64,
            etag: None,
            last_modified: None,
            fetched_at: now,
            last_used: now,
            validated_at: None,
            verified: FileStamp::of(&path).ok(),
        };
        self.layout
            .write_meta(&e)
            .map_err(|err| format!("image cache: writing the record of {name}: {err}"))?;
        self.lock().entries.insert(name.clone(), e.clone());
        tracing::info!(entry = %name, bytes = e.bytes, "image cache: configdrive stored");
        self.publish();
        Ok(e)
    }

    /// Mark `entries` (its image, and its configdrive when served from here) as read by
    /// `node`'s running deploy: never evicted while pinned.
    pub fn pin(&self, node: &str, entries: Vec<String>) {
        self.lock()
            .pins
            .insert(node.to_string(), (entries, Utc::now()));
        self.publish();
    }

    /// `node`'s deploy no longer reads its image.
    pub fn unpin(&self, node: &str) {
        let had = self.lock().pins.remove(node).is_some();
        if had {
            self.sweep(0);
        }
    }

    fn in_use(st: &State) -> std::collections::HashSet<String> {
        st.pins
            .values()
            .flat_map(|(names, _)| names.iter().cloned())
            .chain(st.readers.keys().cloned())
            .chain(st.flights.keys().cloned())
            .collect()
    }

    /// Remove images past the ttl, then least recently used ones until `need` more bytes
    /// fit under `max_bytes`; images in use are never removed. The names removed.
    pub fn sweep(&self, need: u64) -> Vec<String> {
        let now = Utc::now();
        let removed = {
            let mut st = self.lock();
            st.pins
                .retain(|_, (_, at)| (now - *at).num_seconds() < PIN_MAX_AGE_S);
            let busy = Self::in_use(&st);
            let mut removed = Vec::new();
            if self.config.ttl_s > 0 {
                for e in st.entries.values() {
                    if !busy.contains(&e.name)
                        && (now - e.last_used).num_seconds() >= self.config.ttl_s as i64
                    {
                        removed.push(e.name.clone());
                    }
                }
            }
            let mut total: u64 = st
                .entries
                .values()
                .filter(|e| !removed.contains(&e.name))
                .map(|e| e.bytes)
                .sum();
            let mut lru: Vec<&EntryMeta> = st
                .entries
                .values()
                .filter(|e| !busy.contains(&e.name) && !removed.contains(&e.name))
                .collect();
            lru.sort_by_key(|e| e.last_used);
            for e in lru {
                if total.saturating_add(need) <= self.config.max_bytes {
                    break;
                }
                total -= e.bytes;
                removed.push(e.name.clone());
            }
            if total.saturating_add(need) > self.config.max_bytes {
                tracing::warn!(bytes = total, need, max_bytes = self.config.max_bytes, "image cache: over max_bytes with only images in use left; they go once their deploys end");
            }
            removed
        };
        if !removed.is_empty() {
            tracing::info!(images = ?removed, "image cache: evicted");
            self.discard(&removed);
        }
        removed
    }

    fn discard(&self, names: &[String]) {
        {
            let mut st = self.lock();
            for n in names {
                if st.entries.remove(n).is_some() {
                    st.stats.evictions += 1;
                    metrics::image_cache_evicted(1);
                }
            }
        }
        for n in names {
            self.layout.remove(n);
        }
        self.publish();
    }

    /// Remove every image not in use; the names removed and the names kept (in use).
    pub fn purge(&self) -> (Vec<String>, Vec<String>) {
        let (gone, kept) = {
            let st = self.lock();
            let busy = Self::in_use(&st);
            st.entries
                .keys()
                .cloned()
                .partition::<Vec<_>, _>(|n| !busy.contains(n))
        };
        self.discard(&gone);
        (gone, kept)
    }

    /// The cached images and the counts.
    pub fn list(&self) -> (Vec<ImageInfo>, Stats) {
        let st = self.lock();
        let images = st
            .entries
            .values()
            .map(|e| ImageInfo {
                name: e.name.clone(),
                url: rivet_protocol::deploy::redact_url(&e.url),
                bytes: e.bytes,
                fetched_at: e.fetched_at,
                last_used: e.last_used,
                validated_at: e.validated_at,
                pinned_by: {
                    let mut v: Vec<String> = st
                        .pins
                        .iter()
                        .filter(|(_, (names, _))| names.contains(&e.name))
                        .map(|(node, _)| node.clone())
                        .collect();
                    v.sort();
                    v
                },
                readers: st.readers.get(&e.name).copied().unwrap_or(0),
            })
            .collect();
        (images, st.stats)
    }

    /// Open a cached image for an agent's download: the file, its length, and the guard
    /// that keeps it from eviction. A file changed since it was verified is discarded.
    pub fn open(self: &Arc<Self>, name: &str) -> Result<(std::fs::File, u64, Reading), OpenError> {
        let verified = {
            let st = self.lock();
            st.entries.get(name).map(|e| e.verified)
        };
        let Some(verified) = verified else {
            return Err(OpenError::NotCached);
        };
        let path = self.layout.image(name);
        let f = std::fs::File::open(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => OpenError::NotCached,
            _ => OpenError::Io(e.to_string()),
        })?;
        let stamp = FileStamp::of(&path).map_err(|e| OpenError::Io(e.to_string()))?;
        if verified != Some(stamp) {
            tracing::warn!(image = %name, "image cache: the cached file changed since it was verified; discarded");
            self.discard(&[name.to_string()]);
            return Err(OpenError::Changed);
        }
        let mut st = self.lock();
        *st.readers.entry(name.to_string()).or_default() += 1;
        Ok((
            f,
            stamp.len,
            Reading {
                cache: self.clone(),
                name: name.to_string(),
            },
        ))
    }

    /// Publish the contents to `/metrics`.
    fn publish(&self) {
        let st = self.lock();
        let busy = Self::in_use(&st);
        let images: Vec<(String, u64, bool)> = st
            .entries
            .values()
            .map(|e| (e.name.clone(), e.bytes, busy.contains(&e.name)))
            .collect();
        drop(st);
        metrics::set_image_cache(&images);
    }

    /// Sweep once a minute (ttl, and images whose deploys ended since the last sweep): a
    /// controller-wide loop, supervised with the others; it never ends by itself.
    pub async fn sweep_loop(self: Arc<Self>) -> crate::supervisor::LoopEnd {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(60));
        loop {
            tick.tick().await;
            if self.lock().loaded {
                self.sweep(0);
            }
        }
    }
}
