//! `image_download_source = "local"` for a deploy: which source a node uses (Ironic's
//! precedence), the image cached before `write_image` is sent, the agent pointed at
//! rivetd's copy with a per-node token, and the checks that serve it.
//!
//! The URL is `{rivetd}/image-cache/{sha256-<hex>}` with the node's UUID and its token as
//! the URL's user and password (the agent's HTTP client sends them as Basic auth; logs show
//! the password as `***`). The token is an HMAC of (node, the `write_image` command's id,
//! image) under the cache's key: it is good while that very command is the node's running
//! deploy step, in `deploying` or `wait call-back`, and for nothing else.

use super::image_cache::disk::ImageDigest;
use super::image_cache::{token, OpenError, Reading};
use super::Conductor;
use rivet_model::config::ImageDownloadSource;
use rivet_model::node::Node;
use rivet_protocol::deploy::{configdrive_is_url, WriteImageArgs};
use rivet_protocol::states::ProvisionState;
use serde_json::Value;

/// What a `local` deploy's `write_image` reads from rivetd's cache (entry names).
#[derive(Debug)]
pub(crate) struct Localized {
    /// The image.
    pub image: String,
    /// The configdrive, when it was too long to send inline.
    pub configdrive: Option<String>,
}

/// Why a download from the image cache is refused.
#[derive(Debug)]
pub enum ImageRefusal {
    /// Unknown node or image (404).
    NotFound(String),
    /// A wrong token, or one whose deploy step is over (403).
    Forbidden(String),
    /// The cached file could not be read, or changed (503: the deploy fails and the next
    /// one fetches it again).
    Unavailable(String),
}

impl Conductor {
    /// The `image_download_source` in force for `node`: `instance_info`, then
    /// `driver_info`, then `[agent] image_download_source` (Ironic's order).
    pub fn image_download_source(&self, node: &Node) -> Result<ImageDownloadSource, String> {
        let field = |m: &serde_json::Map<String, Value>| {
            m.get("image_download_source")
                .and_then(Value::as_str)
                .filter(|s| !s.trim().is_empty())
                .map(str::to_string)
        };
        match field(&node.instance_info).or_else(|| field(&node.driver_info)) {
            Some(s) => {
                ImageDownloadSource::parse(&s).map_err(|e| format!("node {}: {e}", node.ident()))
            }
            None => Ok(self.config.agent.image_download_source),
        }
    }

    /// The digest `args` names (resolving a checksums file's URL through the origin).
    async fn wanted_digest(&self, args: &WriteImageArgs) -> Result<ImageDigest, String> {
        match (&args.os_hash_algo, &args.os_hash_value, &args.checksum) {
            (Some(algo), Some(hex), _) => ImageDigest::new(algo, hex),
            (_, _, Some(c)) if configdrive_is_url(c) => {
                self.image_cache
                    .digest_from_checksums(c.trim(), &args.image_source)
                    .await
            }
            (_, _, Some(c)) => {
                let hex = c.trim();
                let algo = rivet_protocol::deploy::algo_for_len(hex.len()).ok_or_else(|| {
                    "image_checksum must be a sha256 or sha512 hex digest (md5 is refused)"
                        .to_string()
                })?;
                ImageDigest::new(algo, hex)
            }
            _ => Err("no digest to verify the image with: give image_os_hash_algo and image_os_hash_value, or image_checksum".into()),
        }
    }

    /// Point `args` at rivetd's cached copy of the image, for `command` of `node`. With
    /// `cached` (the image resolved when the command was first built) only the URL is made
    /// again; without it the image is cached first — this waits for its one download — and
    /// its name returned to be kept in the run. The agent still verifies the digest. A
    /// configdrive longer than `[image_cache] configdrive_inline_max_bytes` is served from
    /// the cache the same way.
    pub(crate) async fn localize_image(
        &self,
        node: &Node,
        args: &mut WriteImageArgs,
        command: &str,
        cached: Option<&str>,
    ) -> Result<Localized, String> {
        let digest = match cached.and_then(ImageDigest::from_name) {
            Some(d) => d,
            None => {
                let d = self.wanted_digest(args).await?;
                let url = args.image_source.trim().to_string();
                tokio::select! {
                    r = self.image_cache.ensure(&url, &d) => { r?; }
                    _ = self.shutdown.cancelled() => {
                        return Err("rivetd is shutting down; the deploy resumes when it starts again".into());
                    }
                }
                d
            }
        };
        let name = digest.name();
        let key = self
            .image_cache
            .key()
            .ok_or("the image cache is not loaded (its directory could not be read)")?;
        let token = token::token(key, &node.uuid, command, &name);
        args.image_source = self.own_url(&node.uuid, &token, &name)?;
        args.os_hash_algo = Some(digest.algo.to_string());
        args.os_hash_value = Some(digest.hex.clone());
        args.checksum = None;
        let configdrive = self.localize_configdrive(node, args, command).await?;
        let pinned = std::iter::once(name.clone())
            .chain(configdrive.clone())
            .collect();
        self.image_cache.pin(&node.uuid, pinned);
        Ok(Localized {
            image: name,
            configdrive,
        })
    }

    /// An inline configdrive longer than `[image_cache] configdrive_inline_max_bytes`
    /// stored in the cache (once: it is content-addressed) and `args` pointed at it with
    /// `node`'s token for `command`; its entry's name. Each send stores it again if it was
    /// purged meanwhile, so a resent command never points at a missing file.
    async fn localize_configdrive(
        &self,
        node: &Node,
        args: &mut WriteImageArgs,
        command: &str,
    ) -> Result<Option<String>, String> {
        let Some(text) = args.configdrive.as_deref().map(str::trim) else {
            return Ok(None);
        };
        let max = self.config.image_cache.configdrive_inline_max_bytes;
        if text.is_empty() || configdrive_is_url(text) || (text.len() as u64) <= max {
            return Ok(None);
        }
        let entry = self.image_cache.store_configdrive(text).await?;
        let key = self
            .image_cache
            .key()
            .ok_or("the image cache is not loaded (its directory could not be read)")?;
        let token = token::token(key, &node.uuid, command, &entry.name);
        args.configdrive = Some(self.own_url(&node.uuid, &token, &entry.name)?);
        tracing::info!(node = %node.uuid, entry = %entry.name, bytes = entry.bytes,
            "configdrive served from the image cache (longer than configdrive_inline_max_bytes)");
        Ok(Some(entry.name))
    }

    /// rivetd's own URL for a cached image: `[boot] public_url`, else the listen address.
    fn own_url(&self, node: &str, token: &str, name: &str) -> Result<String, String> {
        let base = match &self.config.boot.public_url {
            Some(u) => u.trim_end_matches('/').to_string(),
            None => {
                let addr: std::net::SocketAddr = self.config.listen.parse().map_err(|_| {
                    format!("listen address {:?} is not ADDR:PORT", self.config.listen)
                })?;
                if addr.ip().is_unspecified() {
                    return Err(format!(
                        "image_download_source = \"local\" needs rivetd's URL as agents reach it: rivetd listens on {addr}; set [boot] public_url"
                    ));
                }
                let scheme = if self.config.tls_cert.is_some() {
                    "https"
                } else {
                    "http"
                };
                format!("{scheme}://{addr}")
            }
        };
        let (scheme, rest) = base
            .split_once("://")
            .ok_or_else(|| format!("[boot] public_url {base:?} is not a URL"))?;
        Ok(format!(
            "{scheme}://{node}:{token}@{rest}/image-cache/{name}"
        ))
    }

    /// May `node_uuid` with `token` download image `name` now? The open file, its length
    /// and the guard that keeps it cached while it is read.
    pub async fn open_cached_image(
        &self,
        node_uuid: &str,
        token: &str,
        name: &str,
    ) -> Result<(std::fs::File, u64, Reading), ImageRefusal> {
        if ImageDigest::from_name(name).is_none() {
            return Err(ImageRefusal::NotFound(format!("no cached image {name:?}")));
        }
        let node = match self.store.get_node(node_uuid).await {
            Ok(n) => n,
            Err(rivet_store::StoreError::NotFound { .. }) => {
                return Err(ImageRefusal::NotFound("no such node".into()))
            }
            Err(e) => return Err(ImageRefusal::Unavailable(e.to_string())),
        };
        let run = node.runs.deploy.as_ref();
        let deploying = matches!(
            node.provision_state,
            ProvisionState::Deploying | ProvisionState::WaitCallBack
        );
        let (Some(command), true) = (run.and_then(|r| r.command.as_deref()), deploying) else {
            return Err(ImageRefusal::Forbidden(format!(
                "node {} has no running deploy step that reads a cached image",
                node.uuid
            )));
        };
        let key = self
            .image_cache
            .key()
            .ok_or_else(|| ImageRefusal::Unavailable("the image cache is not loaded".into()))?;
        let reads = run.is_some_and(|r| {
            r.local_image.as_deref() == Some(name) || r.local_configdrive.as_deref() == Some(name)
        });
        let good = reads && token::valid(key, &node.uuid, command, name, token);
        if !good {
            return Err(ImageRefusal::Forbidden(format!(
                "this token does not let node {} read image {name}",
                node.uuid
            )));
        }
        let cache = self.image_cache.clone();
        let name = name.to_string();
        match tokio::task::spawn_blocking(move || cache.open(&name)).await {
            Ok(Ok(x)) => Ok(x),
            Ok(Err(OpenError::NotCached)) => Err(ImageRefusal::NotFound("the image is no longer cached".into())),
            Ok(Err(OpenError::Changed)) => Err(ImageRefusal::Unavailable(
                "the cached image changed since it was verified; it was discarded (deploy again to fetch it anew)".into(),
            )),
            Ok(Err(OpenError::Io(e))) => Err(ImageRefusal::Unavailable(e)),
            Err(e) => Err(ImageRefusal::Unavailable(e.to_string())),
        }
    }
}
