//! rivetd configuration: one TOML file; every key has a default, and the command line and
//! environment override the file (`rivetd --print-config` shows the result).

use rivet_protocol::discovery::DiscoveryEnd;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Whole configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address the API listens on.
    pub listen: String,
    /// Database URL (`sqlite:PATH`).
    pub db: String,
    /// Serve admin endpoints without credentials (loopback listen addresses only).
    pub no_auth: bool,
    /// This controller's id, shown as `reservation`/`conductor` (default: host name).
    pub conductor_id: String,
    /// Log as JSON lines instead of human text.
    pub log_json: bool,
    /// PEM certificate chain to serve HTTPS with (`rivetd tls init DIR` makes one).
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of `tls_cert`.
    pub tls_key: Option<std::path::PathBuf>,
    /// Serve plain HTTP on a non-loopback address (off: the operator must say so).
    pub allow_plain_http: bool,
    /// Boot artefacts and iPXE scripts served to PXE-booting machines.
    pub boot: BootConfig,
    /// Admin credentials.
    pub auth: AuthConfig,
    /// Conductor timing.
    pub conductor: ConductorConfig,
    /// API limits.
    pub api: ApiConfig,
    /// What agents are told.
    pub agent: AgentSettings,
    /// Cleaning.
    pub cleaning: CleaningConfig,
    /// Deploying images.
    pub deploy: DeployConfig,
    /// Periodic power-state sync with the BMCs.
    pub power_sync: PowerSyncConfig,
    /// Out-of-band driver timeouts and retries.
    pub drivers: DriversConfig,
    /// Inspection.
    pub inspection: InspectionConfig,
    /// The key BMC passwords are sealed with in the store.
    pub secrets: SecretsConfig,
    /// Store connections.
    pub store: StoreConfig,
    /// Enrolling unknown machines that boot the ramdisk (off by default).
    pub discovery: DiscoveryConfig,
    /// Prometheus metrics: an extra listener without credentials (`/metrics` on the API
    /// address is always there, behind auth).
    pub metrics: MetricsConfig,
    /// Serial consoles (Ironic's `[console]` options, plus the captured log's bound).
    pub console: ConsoleConfig,
    /// The image cache of `image_download_source = "local"` deploys.
    pub image_cache: ImageCacheConfig,
}

/// Store connections.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// SQLite: read-only connections beside the one writer (WAL lets them read while it
    /// writes). 0 = every call on the writer connection, one at a time.
    pub sqlite_readers: usize,
    /// PostgreSQL: connections in the pool; each serves one query at a time.
    pub postgres_pool: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            sqlite_readers: 4,
            postgres_pool: 8,
        }
    }
}

/// Inspection settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InspectionConfig {
    /// Resource class for nodes that have none, from `{memory_mb}`, `{cpus}`, `{cpu_arch}`,
    /// `{local_gb}`; empty leaves it unset.
    pub resource_class_template: String,
}

impl Default for InspectionConfig {
    fn default() -> Self {
        InspectionConfig {
            resource_class_template: "bm-{memory_mb}-{cpus}-{cpu_arch}".into(),
        }
    }
}

/// Cleaning settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CleaningConfig {
    /// `"interface.step" = priority` overrides applied before merging (0 disables a step in
    /// automated cleaning), e.g. `{"deploy.erase_devices" = 0}`.
    pub priority_overrides: std::collections::BTreeMap<String, i64>,
    /// A step that runs longer than this fails the cleaning (the agent is told to abort it).
    pub step_timeout_s: u64,
}

impl Default for CleaningConfig {
    fn default() -> Self {
        CleaningConfig {
            priority_overrides: Default::default(),
            step_timeout_s: 6 * 3600,
        }
    }
}

/// `[deploy]`: what the agent may write, what a failed deploy does with the power, and fast
/// track.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeployConfig {
    /// Image formats the agent writes; anything else is refused before a byte reaches the
    /// disk (Ironic's `permitted_image_formats`).
    pub permitted_image_formats: Vec<String>,
    /// PEM file of an extra CA the agent trusts for image and configdrive URLs.
    pub image_ca_file: Option<std::path::PathBuf>,
    /// Power a node off through its power interface when its deploy fails (Ironic's
    /// option of the same name), after the agent was told to stop: a half-written disk is
    /// never left running or booting. `false` leaves the node powered as it was (the ramdisk
    /// stays up for debugging). A node with `disable_power_off` is never powered off.
    pub power_off_after_deploy_failure: bool,
    /// How many times the agent resumes (HTTP Range) or restarts an image download cut
    /// mid-way before `write_image` fails, 0 to [`MAX_DOWNLOAD_RETRIES`].
    pub image_download_retries: u32,
    /// The boot mode of a node none of whose settings names one and whose BMC does not say
    /// (Ironic's `[deploy] default_boot_mode`, `uefi` as in Ironic); typed, so a value other
    /// than `uefi` or `bios` is refused when the file is read. See [`crate::boot_mode`].
    pub default_boot_mode: rivet_protocol::deploy::BootMode,
    /// Ironic's fast track: a ramdisk that finished cleaning or inspection is left running
    /// (node powered on, agent keeping its token and heartbeating in `available`,
    /// `manageable` or `enroll`, where its lookup is then accepted too), and the next
    /// deploy, cleaning or inspection starts its first in-band step on it at once instead
    /// of powering off and booting the ramdisk again. Off by default, as in Ironic: a
    /// node left powered on with a ramdisk draws power and keeps its disks reachable from
    /// the provisioning network. A node's `driver_info.fast_track` (a boolean, or Ironic's
    /// strings "true"/"false"/"yes"/"no"/"on"/"off"/"1"/"0"…) overrides it.
    pub fast_track: bool,
    /// How recent the agent's last heartbeat must be for fast track to use it (Ironic's
    /// `fast_track_timeout`), 0 to [`MAX_FAST_TRACK_TIMEOUT_S`]. Older, the agent is taken
    /// for gone and the ramdisk is booted as usual. Keep it above `[agent] long_poll_s`:
    /// an idle agent heartbeats once per long poll, so a smaller value makes a live agent
    /// look gone (which only costs the reboot fast track would have saved).
    #[serde(alias = "fast_track_timeout")]
    pub fast_track_timeout_s: u64,
}

/// Most `[deploy] image_download_retries` accepted: beyond it a broken image server only
/// makes a deploy take longer to fail.
pub const MAX_DOWNLOAD_RETRIES: u32 = 20;

/// Longest `[deploy] fast_track_timeout_s`, Ironic's bound: beyond a few minutes the agent
/// the heartbeat came from may well have been powered off and booted into something else.
pub const MAX_FAST_TRACK_TIMEOUT_S: u64 = 300;

impl Default for DeployConfig {
    fn default() -> Self {
        DeployConfig {
            permitted_image_formats: rivet_protocol::deploy::DEFAULT_PERMITTED_FORMATS
                .iter()
                .map(|s| s.to_string())
                .collect(),
            image_ca_file: None,
            power_off_after_deploy_failure: true,
            image_download_retries: rivet_protocol::deploy::DEFAULT_DOWNLOAD_RETRIES,
            default_boot_mode: rivet_protocol::deploy::BootMode::Uefi,
            fast_track: false,
            fast_track_timeout_s: MAX_FAST_TRACK_TIMEOUT_S,
        }
    }
}

impl DeployConfig {
    /// Refuse values rivetd cannot work with, naming the key and the range.
    pub fn check(&self) -> Result<(), String> {
        if self.image_download_retries > MAX_DOWNLOAD_RETRIES {
            return Err(format!(
                "[deploy] image_download_retries = {} is out of range: use 0 to {MAX_DOWNLOAD_RETRIES} \
                 (retries of a cut image download; default {})",
                self.image_download_retries,
                rivet_protocol::deploy::DEFAULT_DOWNLOAD_RETRIES
            ));
        }
        if self.fast_track_timeout_s > MAX_FAST_TRACK_TIMEOUT_S {
            return Err(format!(
                "[deploy] fast_track_timeout_s = {} is out of range: use 0 to {MAX_FAST_TRACK_TIMEOUT_S} \
                 (how recent an agent's last heartbeat must be for fast track; default {MAX_FAST_TRACK_TIMEOUT_S})",
                self.fast_track_timeout_s
            ));
        }
        Ok(())
    }

    /// The extra CA's PEM text, if configured and readable (a missing file is reported at
    /// start-up by `check`).
    pub fn image_ca_pem(&self) -> Option<String> {
        self.image_ca_file
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
    }
}

/// `[boot]`: what `GET /boot/{file}` and `GET /boot/ipxe/{node}` serve (no credentials: a
/// PXE-booting machine has none).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BootConfig {
    /// Directory holding image-build's output (vmlinuz, rivet.initramfs, rivet.iso). Unset:
    /// nothing is served.
    pub artefact_dir: Option<std::path::PathBuf>,
    /// rivetd's URL as booting machines reach it, used in iPXE scripts for the artefacts and
    /// as `rivet.controller=`. Unset: `http://` + the request's Host header.
    pub public_url: Option<String>,
    /// rivetd's URL as BMCs reach it, for the virtual-media ISO they download (Ironic's
    /// `external_http_url`): BMCs often sit on a management network that booting machines
    /// do not. Unset: `public_url`.
    pub external_http_url: Option<String>,
    /// Kernel arguments added to every iPXE boot (console, log level…).
    pub kernel_append: String,
}

impl Default for BootConfig {
    fn default() -> Self {
        BootConfig {
            artefact_dir: None,
            public_url: None,
            external_http_url: None,
            kernel_append: "console=tty0 console=ttyS0,115200n8".into(),
        }
    }
}

/// Admin credentials, stored hashed (`rivetd hash-secret` prints a hash).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Bearer tokens (also accepted as `X-Auth-Token`).
    pub tokens: Vec<TokenEntry>,
    /// HTTP basic users.
    pub users: Vec<UserEntry>,
}

/// A bearer token.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    /// Who holds it (for logs).
    pub name: String,
    /// `sha256$SALT$HEX`.
    pub hash: String,
    /// What it may do.
    #[serde(default)]
    pub role: Role,
}

/// What a credential may do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Everything.
    #[default]
    Admin,
    /// Read, provision and power verbs, maintenance; no node/port create, update or delete,
    /// no inspection-rule changes, and driver_info is not shown.
    Operator,
    /// Read only; driver_info is not shown.
    Reader,
    /// `GET /metrics` only (a Prometheus scraper's token).
    Metrics,
}

impl Role {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Operator => "operator",
            Role::Reader => "reader",
            Role::Metrics => "metrics",
        }
    }
}

/// An HTTP basic user.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserEntry {
    /// User name.
    pub name: String,
    /// `sha256$SALT$HEX` of the password.
    pub hash: String,
    /// What the user may do.
    #[serde(default)]
    pub role: Role,
    /// OpenSSH public keys (`ssh-ed25519 AAAA… comment`) that log this user in at the
    /// console's SSH front door (`[console] ssh_listen`).
    #[serde(default)]
    pub ssh_keys: Vec<String>,
}

/// Conductor timing.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConductorConfig {
    /// How often the periodic scan runs.
    pub check_interval_s: u64,
    /// Timeout of `clean wait`, from `provision_updated_at`.
    pub clean_wait_timeout_s: u64,
    /// Timeout of `inspect wait`.
    pub inspect_wait_timeout_s: u64,
    /// Timeout of `wait call-back` (Ironic's `deploy_callback_timeout`): no word from the
    /// ramdisk for this long fails the deploy.
    #[serde(alias = "deploy_wait_timeout_s")]
    pub deploy_callback_timeout_s: u64,
    /// Timeout of `rescue wait`.
    pub rescue_wait_timeout_s: u64,
    /// Run automated cleaning on provide / after tear-down (a node's `automated_clean` wins).
    pub automated_clean: bool,
    /// How often this controller writes its registration heartbeat (several rivetd on one
    /// database); its node leases live as long as these heartbeats do.
    pub heartbeat_interval_s: u64,
    /// A controller silent for this long is dead: its leases expire with it and the hash
    /// ring hands its nodes to the others. Keep it several heartbeat intervals.
    pub dead_after_s: u64,
    /// A node in `available` may be deleted (Ironic's `allow_deleting_available_nodes`,
    /// default true); false keeps deletion to enroll, manageable, adopt failed or maintenance.
    pub allow_deleting_available_nodes: bool,
    /// Most nodes in `deploying` or `wait call-back` at once across the fleet (Ironic's
    /// `max_concurrent_deploy`, default 250, at least 1). A deploy request past it is refused
    /// with 503 and Ironic's `ConcurrentActionLimit` message (not queued); the node stays as
    /// it was. The limit itself is never named in the answer (Ironic's reasoning: an attacker
    /// would tailor the attack to it).
    pub max_concurrent_deploy: u32,
}

/// API limits.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// Largest page of a listing.
    pub max_limit: usize,
    /// A client must finish sending its request headers within this time, so slow clients
    /// cannot pin connections.
    pub header_read_timeout_s: u64,
    /// After this many requests on one keep-alive connection the answer carries
    /// `Connection: close`, so one client cannot hold a connection (and its worker) forever
    /// and load spreads when clients reconnect; 0 = no limit.
    pub max_requests_per_connection: u64,
    /// Requests on plain-TCP connections that are read and worked on at once; more wait,
    /// unread, in their sockets until one finishes (a held long poll stops counting once it
    /// is parked). A whole fleet heartbeating at the same moment — after a restart, or when
    /// every held poll times out together — then costs this many requests' memory, not the
    /// fleet's. Well above what two cores serve at once; 0 = no limit.
    pub max_requests_in_progress: usize,
    /// Failed admin authentications accepted per source address per minute; beyond it 429
    /// (and no audit row each: the log says it once a minute). Guessing credentials, or a
    /// stranger filling the audit trail, is bounded; 0 = no limit.
    pub failed_auth_per_minute: u32,
}

/// What agents are told at lookup.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentSettings {
    /// How long a heartbeat is held open when there is nothing to send (each poll between 80 %
    /// and 100 % of it, at random, so that agents that started together drift apart).
    pub long_poll_s: u64,
    /// No heartbeat for this long fails the node's wait state.
    pub heartbeat_timeout_s: u64,
    /// Lookups accepted per source address per minute (also the burst); beyond it 429 with
    /// `Retry-After`. 0 = no limit. See the default for the reasoning.
    pub lookup_per_minute: u32,
    /// Failed agent-token checks (heartbeat with a wrong or missing token, or for an unknown
    /// node) per source address per minute before they are answered 429. Successful
    /// heartbeats are never limited. 0 = no limit.
    pub failed_auth_per_minute: u32,
    /// Where the agent downloads the instance image from (Ironic's
    /// `[agent] image_download_source`): `http`, the image's own URL; `local`, rivetd
    /// downloads it once into its image cache (`[image_cache]`) and each agent gets a URL on
    /// rivetd's own listener, valid for its deploy only. A node's
    /// `instance_info.image_download_source`, else its `driver_info.image_download_source`,
    /// overrides it, as in Ironic. (Ironic's `swift` is not offered.)
    pub image_download_source: ImageDownloadSource,
}

/// Ironic's `image_download_source` values Rivet serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageDownloadSource {
    /// The agent downloads the image from its URL (Ironic's default).
    #[default]
    Http,
    /// rivetd caches the image and serves it to the agent.
    Local,
}

impl ImageDownloadSource {
    /// Ironic's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ImageDownloadSource::Http => "http",
            ImageDownloadSource::Local => "local",
        }
    }

    /// From a node field (`instance_info` / `driver_info`); the error names the values.
    pub fn parse(s: &str) -> Result<ImageDownloadSource, String> {
        match s.trim() {
            "http" => Ok(ImageDownloadSource::Http),
            "local" => Ok(ImageDownloadSource::Local),
            "swift" => Err("image_download_source \"swift\" is not supported by Rivet (no Object Storage); use http or local".into()),
            other => Err(format!(
                "invalid value for image_download_source: {other:?}; valid values are http or local"
            )),
        }
    }
}

/// `[image_cache]`: rivetd's cache of instance images for `image_download_source = "local"`
/// (Ironic's master image cache: `image_cache_size`, `image_cache_ttl`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ImageCacheConfig {
    /// Where cached images live. Unset: `image-cache` next to the SQLite database file, or
    /// under `$STATE_DIRECTORY` (systemd's) or the working directory with PostgreSQL.
    pub dir: Option<PathBuf>,
    /// Most bytes of cached images (Ironic's `image_cache_size`, 20480 MiB). Least recently
    /// used images not read by a running deploy are evicted to stay under it; images that
    /// running deploys read are never evicted, so the cache may exceed it while they run.
    pub max_bytes: u64,
    /// An image unused for this long is removed (Ironic's `image_cache_ttl`, one week),
    /// in seconds; 0 keeps images until `max_bytes` needs their room.
    pub ttl_s: u64,
    /// A cached image validated with its origin (a conditional request) this recently is
    /// used without asking again, so a fleet arriving together costs the origin one request.
    pub revalidate_after_s: u64,
    /// With `image_download_source = "local"`, a configdrive whose text (gzip + base64) is
    /// longer than this is stored in the cache and the agent downloads it from rivetd with
    /// the node's token, instead of carrying it inline in `write_image`'s arguments (which
    /// are kept in the node's run and sent in every answer that carries the command). 0
    /// serves every configdrive from the cache.
    pub configdrive_inline_max_bytes: u64,
}

impl Default for ImageCacheConfig {
    fn default() -> Self {
        ImageCacheConfig {
            dir: None,
            max_bytes: 20480 << 20,
            ttl_s: 10080 * 60,
            revalidate_after_s: 10,
            configdrive_inline_max_bytes: 64 << 10,
        }
    }
}

impl ImageCacheConfig {
    /// The cache directory in force for a database URL `db`.
    pub fn dir_for(&self, db: &str) -> PathBuf {
        if let Some(d) = &self.dir {
            return d.clone();
        }
        if let Some(file) = db.strip_prefix("sqlite:") {
            let file = file.trim_start_matches("//");
            let parent = std::path::Path::new(file)
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .map(|p| p.to_path_buf())
                .unwrap_or_else(|| PathBuf::from("."));
            return parent.join("image-cache");
        }
        match std::env::var_os("STATE_DIRECTORY") {
            Some(d) => PathBuf::from(d).join("image-cache"),
            None => PathBuf::from("image-cache"),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:6385".into(),
            db: "sqlite:rivet.db".into(),
            no_auth: false,
            conductor_id: hostname(),
            log_json: false,
            tls_cert: None,
            tls_key: None,
            allow_plain_http: false,
            boot: BootConfig::default(),
            auth: AuthConfig::default(),
            conductor: ConductorConfig::default(),
            api: ApiConfig::default(),
            agent: AgentSettings::default(),
            cleaning: CleaningConfig::default(),
            deploy: DeployConfig::default(),
            inspection: InspectionConfig::default(),
            secrets: SecretsConfig::default(),
            store: StoreConfig::default(),
            power_sync: PowerSyncConfig::default(),
            drivers: DriversConfig::default(),
            discovery: Default::default(),
            metrics: Default::default(),
            console: Default::default(),
            image_cache: Default::default(),
        }
    }
}

/// What the power sync does when a BMC's power state differs from the recorded one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PowerSyncPolicy {
    /// Record the BMC's state on the node (and log the change).
    Record,
    /// Set the BMC back to the recorded state.
    Enforce,
}

/// Periodic power-state sync.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PowerSyncConfig {
    /// Seconds between two passes; 0 disables the sync.
    pub interval_s: u64,
    /// `record` or `enforce`.
    pub policy: PowerSyncPolicy,
    /// BMCs read at the same time during one pass.
    pub concurrency: usize,
}

impl Default for PowerSyncConfig {
    fn default() -> Self {
        PowerSyncConfig {
            interval_s: 60,
            policy: PowerSyncPolicy::Record,
            concurrency: 8,
        }
    }
}

impl Default for ConductorConfig {
    fn default() -> Self {
        ConductorConfig {
            check_interval_s: 10,
            clean_wait_timeout_s: 1800,
            inspect_wait_timeout_s: 1800,
            deploy_callback_timeout_s: 1800,
            rescue_wait_timeout_s: 1800,
            automated_clean: true,
            heartbeat_interval_s: 2,
            dead_after_s: 10,
            allow_deleting_available_nodes: true,
            max_concurrent_deploy: 250,
        }
    }
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            max_body_bytes: 1 << 20,
            max_limit: 1000,
            header_read_timeout_s: 10,
            max_requests_per_connection: 1000,
            max_requests_in_progress: 1024,
            failed_auth_per_minute: 60,
        }
    }
}

impl Default for AgentSettings {
    fn default() -> Self {
        AgentSettings {
            long_poll_s: 30,
            heartbeat_timeout_s: 300,
            // Sized for the worst honest case: 1,000 machines PXE-booting at once behind one
            // NAT (a DHCP relay only relays DHCP; HTTP normally comes from each machine's own
            // address, which is the easy case). Each looks up once when it is expected, and
            // one that is not expected yet retries at most twice a minute (agent backoff cap
            // 30 s): 1,000 × 2 = 2,000/min, so 3,000 of burst and 50/s of refill leave
            // headroom. A stranger guessing MACs still needs days for one vendor's 2^24.
            image_download_source: ImageDownloadSource::Http,
            lookup_per_minute: 3000,
            // Honest failures are rare: one 401 per agent when its operation ends (the held
            // heartbeat learns the token is gone), so a 1,000-node batch finishing together
            // behind one NAT needs 1,000 at once. Tokens are 256-bit, so this limit is about
            // the cost of hammering (a store read per attempt) and log noise, not guessing.
            failed_auth_per_minute: 1200,
        }
    }
}

/// This host's name (the default conductor id and its registered hostname).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "rivetd".into())
}

impl Config {
    /// Parse a TOML file's text.
    pub fn from_toml(text: &str) -> Result<Config, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// The effective configuration as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
    }
}

/// `[console]`: serial consoles through the BMC (Serial-over-LAN). The option names and
/// defaults are Ironic's `[console]` ones where Ironic has them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsoleConfig {
    /// Ports a console's TCP listener takes (`START:END`, END excluded as in Ironic;
    /// several ranges separated by commas). A node's `driver_info.ipmi_terminal_port` wins.
    pub port_range: String,
    /// Address the TCP listeners bind and `console_info.url` names (Ironic's
    /// `socat_address`; Ironic defaults to the host's IP, Rivet to loopback: the raw TCP
    /// console has no credentials, so exposing it is the operator's decision).
    pub socat_address: String,
    /// A TCP viewer silent in both directions this long is disconnected (seconds, 0 =
    /// never; Ironic's socat `-T`).
    pub terminal_timeout: u64,
    /// How long the SOL child may take to report its session up (seconds).
    pub subprocess_timeout: u64,
    /// Most bytes kept of a node's captured console (oldest dropped first).
    pub log_max_bytes: u64,
    /// Where captured consoles are kept (unset: `console/` beside a SQLite database, else
    /// `/var/lib/rivet/console`).
    pub log_dir: Option<PathBuf>,
    /// The SSH front door's address (`ADDR:PORT`; unset, the default: no SSH). `ssh -p PORT
    /// NODE@HOST` attaches to NODE's console with an SSH key listed in `[auth] users`
    /// (`ssh_keys`) or a Rivet user's name and password.
    pub ssh_listen: Option<String>,
    /// The SSH front door's Ed25519 host key (OpenSSH format), made on first start (unset:
    /// `ssh_host_key` in the console log directory).
    pub ssh_host_key: Option<PathBuf>,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            port_range: "10000:20000".into(),
            socat_address: "127.0.0.1".into(),
            terminal_timeout: 600,
            subprocess_timeout: 10,
            log_max_bytes: 4 << 20,
            log_dir: None,
            ssh_listen: None,
            ssh_host_key: None,
        }
    }
}

/// Smallest `[console] log_max_bytes`: a screenful or two.
pub const MIN_CONSOLE_LOG_BYTES: u64 = 16 * 1024;

impl ConsoleConfig {
    /// The ports of `port_range`, in order (each range's end excluded, as Ironic's
    /// `range(start, end)`), or why the value is wrong.
    pub fn ports(&self) -> Result<Vec<std::ops::Range<u16>>, String> {
        let bad = |why: &str| {
            format!(
                "[console] port_range = {:?}: {why}; write START:END (END excluded), e.g. \"10000:20000\", \
                 or several separated by commas",
                self.port_range
            )
        };
        let mut out = Vec::new();
        for part in self.port_range.split(',') {
            let (a, b) = part
                .trim()
                .split_once(':')
                .ok_or_else(|| bad("a range is not START:END"))?;
            let a: u16 = a
                .trim()
                .parse()
                .map_err(|_| bad("a port is not a number 0-65535"))?;
            let b: u16 = b
                .trim()
                .parse()
                .map_err(|_| bad("a port is not a number 0-65535"))?;
            if a > b {
                return Err(bad("a range starts after its end"));
            }
            out.push(a..b);
        }
        Ok(out)
    }

    /// Refuse values rivetd cannot work with, naming the key.
    pub fn check(&self) -> Result<(), String> {
        self.ports()?;
        if self.socat_address.parse::<std::net::IpAddr>().is_err() {
            return Err(format!(
                "[console] socat_address = {:?} is not an IP address",
                self.socat_address
            ));
        }
        if self.log_max_bytes < MIN_CONSOLE_LOG_BYTES {
            return Err(format!(
                "[console] log_max_bytes = {} is too small: use at least {MIN_CONSOLE_LOG_BYTES}",
                self.log_max_bytes
            ));
        }
        Ok(())
    }

    /// The directory of captured consoles for a rivetd on database `db`.
    pub fn log_dir_for(&self, db: &str) -> PathBuf {
        if let Some(d) = &self.log_dir {
            return d.clone();
        }
        match db.strip_prefix("sqlite:") {
            Some(path) if !path.starts_with(':') => {
                let parent = std::path::Path::new(path)
                    .parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .unwrap_or(std::path::Path::new("."));
                parent.join("console")
            }
            _ => PathBuf::from("/var/lib/rivet/console"),
        }
    }

    /// The SSH host key's path in force for database `db`.
    pub fn ssh_host_key_path(&self, db: &str) -> PathBuf {
        self.ssh_host_key
            .clone()
            .unwrap_or_else(|| self.log_dir_for(db).join("ssh_host_key"))
    }
}

/// Out-of-band driver timeouts and retries (`[drivers]` in the config file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DriversConfig {
    /// Redfish: TCP/TLS connect timeout of one request.
    pub redfish_connect_timeout_s: u64,
    /// Redfish: whole-request timeout.
    pub redfish_request_timeout_s: u64,
    /// Redfish: extra attempts after a connection error or a 5xx answer (GETs also after
    /// a dropped connection or a timeout; see `redfish/client.rs`).
    pub redfish_retries: u32,
    /// Redfish: first back-off between attempts (doubles each time).
    pub redfish_retry_backoff_ms: u64,
    /// How long a power change may take to show on the BMC.
    pub power_wait_s: u64,
    /// Interval between two reads while waiting for the BMC (power, tasks).
    pub poll_interval_ms: u64,
    /// How long a BMC task (firmware update) may run.
    pub task_timeout_s: u64,
    /// The ipmitool executable.
    pub ipmitool: String,
    /// IPMI: timeout of one ipmitool call (the child is killed after it).
    pub ipmi_timeout_s: u64,
    /// IPMI: ipmitool's own retries (`-R`).
    pub ipmi_retries: u32,
    /// IPMI: ipmitool's per-try timeout (`-N`, seconds).
    pub ipmi_retry_timeout_s: u64,
}

impl Default for DriversConfig {
    fn default() -> Self {
        DriversConfig {
            redfish_connect_timeout_s: 10,
            redfish_request_timeout_s: 30,
            redfish_retries: 2,
            redfish_retry_backoff_ms: 500,
            power_wait_s: 60,
            poll_interval_ms: 1000,
            task_timeout_s: 3600,
            ipmitool: "ipmitool".into(),
            ipmi_timeout_s: 15,
            ipmi_retries: 2,
            ipmi_retry_timeout_s: 1,
        }
    }
}

/// `[secrets]`: the key driver_info secrets are sealed with.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecretsConfig {
    /// File holding the key: 64 hex characters (32 random bytes), mode 0600; make one with
    /// `rivetd secrets init-key PATH`. `RIVET_SECRETS_KEY` (the key itself) overrides it.
    /// Neither set: SQLite uses `<database file>.key`, generated on first start; PostgreSQL
    /// refuses to start.
    pub key_file: Option<PathBuf>,
    /// An older key still accepted for reading, never for writing (during a rotation).
    pub previous_key_file: Option<PathBuf>,
}

/// The `[discovery]` section.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiscoveryConfig {
    /// Enrol unknown machines that send their inventory (off: they get 403).
    pub enabled: bool,
    /// Driver of discovered nodes until a rule sets another (Ironic's
    /// `[auto_discovery] driver`).
    pub driver: String,
    /// What the ramdisk does afterwards: `poweroff` or `wait`.
    pub end: DiscoveryEnd,
    /// Discovery requests per minute per source address.
    pub per_minute: u32,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        DiscoveryConfig {
            enabled: false,
            driver: "fake-hardware".into(),
            end: DiscoveryEnd::Poweroff,
            // An honest ramdisk discovers once per boot; a burst of a rack booting at once is
            // absorbed by the bucket, a source posting inventories in a loop is not.
            per_minute: 60,
        }
    }
}

/// `[metrics]` in the config file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// `ADDR:PORT` of an extra listener serving `GET /metrics` without credentials (plain
    /// HTTP: keep it on loopback or a monitoring network). Unset: only the API address
    /// serves it, behind auth.
    pub listen: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_round_trip_and_unknown_key() {
        let c = Config::default();
        let back = Config::from_toml(&c.to_toml()).expect("round trip");
        assert_eq!(back.listen, c.listen);
        let err = Config::from_toml("listne = \"x\"").expect_err("typo");
        assert!(err.contains("listne"), "{err}");
    }

    #[test]
    fn fast_track_defaults_spelling_and_range() {
        let d = Config::default().deploy;
        assert!(!d.fast_track, "off by default, as in Ironic");
        assert_eq!(d.fast_track_timeout_s, 300, "Ironic's default");
        // Ironic's spelling is accepted too, so an operator's ironic.conf values carry over.
        for text in [
            "[deploy]\nfast_track = true\nfast_track_timeout_s = 60\n",
            "[deploy]\nfast_track = true\nfast_track_timeout = 60\n",
        ] {
            let c = Config::from_toml(text).expect(text);
            assert!(c.deploy.fast_track, "{text}");
            assert_eq!(c.deploy.fast_track_timeout_s, 60, "{text}");
            assert_eq!(c.deploy.check(), Ok(()));
        }
        let shown = Config::default().to_toml();
        assert!(
            shown.contains("fast_track = false") && shown.contains("fast_track_timeout_s = 300"),
            "{shown}"
        );
        let c = Config::from_toml("[deploy]\nfast_track_timeout_s = 301\n").expect("parse");
        let err = c.deploy.check().expect_err("over Ironic's bound");
        assert!(
            err.contains("[deploy] fast_track_timeout_s = 301") && err.contains("0 to 300"),
            "{err}"
        );
        let err = Config::from_toml("[deploy]\nfast_track = \"yes\"\n").expect_err("not a bool");
        assert!(err.contains("fast_track"), "{err}");
    }

    #[test]
    fn deploy_failure_power_and_download_retries() {
        let d = Config::default().deploy;
        assert!(d.power_off_after_deploy_failure, "Ironic's default");
        assert_eq!(
            d.image_download_retries,
            rivet_protocol::deploy::DEFAULT_DOWNLOAD_RETRIES
        );
        assert_eq!(d.image_download_retries, 3);
        assert_eq!(d.check(), Ok(()));
        // Both keys are read from the file and shown by --print-config.
        let c = Config::from_toml(
            "[deploy]\npower_off_after_deploy_failure = false\nimage_download_retries = 0\n",
        )
        .expect("parse");
        assert!(!c.deploy.power_off_after_deploy_failure);
        assert_eq!(c.deploy.image_download_retries, 0);
        assert_eq!(c.deploy.check(), Ok(()));
        let shown = c.to_toml();
        assert!(
            shown.contains("power_off_after_deploy_failure = false")
                && shown.contains("image_download_retries = 0"),
            "{shown}"
        );
        for ok in [1, MAX_DOWNLOAD_RETRIES] {
            let d = DeployConfig {
                image_download_retries: ok,
                ..DeployConfig::default()
            };
            assert_eq!(d.check(), Ok(()), "{ok}");
        }
        let d = DeployConfig {
            image_download_retries: MAX_DOWNLOAD_RETRIES + 1,
            ..DeployConfig::default()
        };
        let err = d.check().expect_err("21 retries");
        assert!(
            err.contains("[deploy] image_download_retries = 21") && err.contains("0 to 20"),
            "{err}"
        );
        // Not a number of retries at all: refused when the file is read, naming the key.
        let err =
            Config::from_toml("[deploy]\nimage_download_retries = -1\n").expect_err("negative");
        assert!(err.contains("image_download_retries"), "{err}");
        let err = Config::from_toml("[deploy]\npower_off_after_deploy_failure = \"yes\"\n")
            .expect_err("not a bool");
        assert!(err.contains("power_off_after_deploy_failure"), "{err}");
    }

    #[test]
    fn console_port_range_reads_as_ironic() {
        let mut c = ConsoleConfig::default();
        assert_eq!(c.ports().expect("ports"), vec![10000..20000]);
        c.port_range = "5000:5002, 6000:6001".into();
        assert_eq!(c.ports().expect("ports"), vec![5000..5002, 6000..6001]);
        for bad in ["5000", "a:b", "7:3", "1:70000", ""] {
            c.port_range = bad.into();
            assert!(
                c.ports().expect_err("refused").contains("port_range"),
                "{bad}"
            );
        }
        c.port_range = "1:2".into();
        c.socat_address = "host".into();
        assert!(c.check().expect_err("refused").contains("socat_address"));
        assert_eq!(
            ConsoleConfig::default().log_dir_for("sqlite:/var/lib/x/r.db"),
            PathBuf::from("/var/lib/x/console")
        );
        assert_eq!(
            ConsoleConfig::default().log_dir_for("sqlite:r.db"),
            PathBuf::from("./console")
        );
    }

    #[test]
    fn default_boot_mode_is_uefi_and_checked() {
        use rivet_protocol::deploy::BootMode;
        assert_eq!(Config::default().deploy.default_boot_mode, BootMode::Uefi);
        let c = Config::from_toml("[deploy]\ndefault_boot_mode = \"bios\"\n").expect("bios");
        assert_eq!(c.deploy.default_boot_mode, BootMode::Bios);
        assert!(c.to_toml().contains("default_boot_mode = \"bios\""));
        let err = Config::from_toml("[deploy]\ndefault_boot_mode = \"efi\"\n").expect_err("efi");
        assert!(
            err.contains("default_boot_mode") && err.contains("uefi") && err.contains("bios"),
            "{err}"
        );
    }
}
