//! IPA mode: the agent as a drop-in ironic-python-agent, driven by a stock Ironic.
//!
//! Selected by `ipa-api-url=` on the kernel command line (as IPA reads it) or
//! `rivet-agent run --ironic URL`. The agent then
//! 1. posts its inventory to `ipa-inspection-callback-url=` when given (in-band inspection),
//! 2. looks its node up (`GET /v1/lookup` with every MAC, and `node_uuid` when known) until
//!    Ironic answers, keeping the agent token Ironic hands out,
//! 3. serves IPA's REST API ([`server`]) on `ipa-listen-port=` (9999), the one inbound port
//!    the agent ever opens, and
//! 4. heartbeats (`POST /v1/heartbeat/{node}` with its callback URL and token) every 30–60 %
//!    of Ironic's `heartbeat_timeout`, and at once whenever a command finishes, which is when
//!    Ironic moves a cleaning or deploy on.
//!
//! Commands ([`commands`]) run on the same executor and hardware managers as the rivetd
//! mode. The Ironic calls are in [`ironic`].

pub mod commands;
pub mod ironic;
pub mod server;

use crate::executor::Executor;
use crate::inventory::{self, InventoryOptions, Root};
use crate::logring::LogRing;
use commands::{Immediate, Plan};
use hyper::StatusCode;
use rivet_hardware_managers::Dispatcher;
use rivet_protocol::agent::{Command, CommandResult, CommandStatus};
use serde_json::{json, Map, Value};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What IPA mode needs besides the executor.
#[derive(Debug, Clone)]
pub struct IpaOptions {
    /// Ironic's API (`http://ironic:6385`).
    pub api_url: String,
    /// Where the agent's API listens (IPA's default `0.0.0.0:9999`).
    pub listen: SocketAddr,
    /// The callback URL sent in heartbeats; `None`: `http://ADDR:PORT` with the address the
    /// host uses to reach Ironic.
    pub advertise: Option<String>,
    /// Node UUID for lookup, when known.
    pub node: Option<String>,
    /// In-band inspection: where the inventory is posted first.
    pub inspection_callback: Option<String>,
    /// Extra CA (PEM) for an https Ironic.
    pub ca_pem: Option<Vec<u8>>,
    /// How the inventory is collected.
    pub inventory: InventoryOptions,
    /// Serve the API over TLS with a self-signed certificate sent to Ironic (IPA's automatic
    /// TLS; `ipa-enable-auto-tls=0` or `--ipa-no-tls` turns it off, and Ironic must then have
    /// `[agent] require_tls = false`).
    pub auto_tls: bool,
}

/// One command Ironic sent.
struct Record {
    id: String,
    method: String,
    params: Map<String, Value>,
    /// `None`: the executor runs it (its result is read from there).
    done: Option<Value>,
}

/// State shared by the API server and the heartbeat loop.
pub struct Shared {
    executor: Executor,
    dispatcher: Arc<Dispatcher>,
    log: LogRing,
    token: Mutex<Option<String>>,
    records: Mutex<Vec<Record>>,
    started: std::time::SystemTime,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn new_id() -> String {
    let b: [u8; 16] = rand::random();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// A GPT GUID from its on-disk (mixed-endian) bytes, lower case.
fn guid(b: &[u8; 16]) -> String {
    format!(
        "{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
        b[3], b[2], b[1], b[0], b[5], b[4], b[7], b[6], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]
    )
}

impl Shared {
    /// Over the agent's executor.
    pub fn new(executor: Executor, dispatcher: Arc<Dispatcher>, log: LogRing) -> Shared {
        Shared {
            executor,
            dispatcher,
            log,
            token: Mutex::new(None),
            records: Mutex::new(Vec::new()),
            started: std::time::SystemTime::now(),
        }
    }

    /// Whether `given` is the token Ironic handed out (any value while Ironic gave none).
    pub fn token_ok(&self, given: Option<&str>) -> bool {
        match lock(&self.token).as_deref() {
            None => true,
            Some(t) => given == Some(t),
        }
    }

    fn status(&self) -> Value {
        let started = self
            .started
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        json!({"started_at": started, "version": rivet_protocol::VERSION})
    }

    /// A command as IPA shows it; `results` is the executor's finished results, read once
    /// per answer (Ironic polls the whole list).
    fn render(r: &Record, results: &[CommandResult]) -> Value {
        let base = |status: &str, result: Value, error: Value| {
            json!({"id": r.id, "command_name": commands::command_name(&r.method),
                   "command_params": r.params, "command_status": status,
                   "command_result": result, "command_error": error})
        };
        if let Some(done) = &r.done {
            return base("SUCCEEDED", done.clone(), Value::Null);
        }
        match results.iter().find(|c| c.id == r.id) {
            Some(c) if c.status == CommandStatus::Succeeded => base(
                "SUCCEEDED",
                commands::shape_result(&r.method, &r.params, c.result.clone()),
                Value::Null,
            ),
            Some(c) => {
                let msg = c.error.clone().unwrap_or_else(|| "command failed".into());
                let details = match &c.log_tail {
                    Some(t) if !t.is_empty() => format!("{msg}\n--- agent log:\n{t}"),
                    _ => msg.clone(),
                };
                base(
                    "FAILED",
                    Value::Null,
                    json!({"type": commands::error_type(&r.method), "code": 500,
                           "message": msg, "details": details}),
                )
            }
            None => base("RUNNING", Value::Null, Value::Null),
        }
    }

    fn list(&self) -> Vec<Value> {
        let results = self.executor.pending_results();
        let records = lock(&self.records);
        records.iter().map(|r| Self::render(r, &results)).collect()
    }

    fn get(&self, id: &str) -> Option<Value> {
        let results = self.executor.pending_results();
        let records = lock(&self.records);
        records
            .iter()
            .find(|r| r.id == id)
            .map(|r| Self::render(r, &results))
    }

    /// Run one IPA command; `wait`: answer once it finished.
    async fn run(
        self: &Arc<Self>,
        method: &str,
        params: Map<String, Value>,
        wait: bool,
    ) -> Result<Value, (StatusCode, &'static str, String)> {
        let plan = commands::plan(method, &params).map_err(|r| {
            (
                StatusCode::from_u16(r.code).unwrap_or(StatusCode::BAD_REQUEST),
                r.kind,
                r.message,
            )
        })?;
        tracing::info!(command = method, wait, "command from Ironic");
        let id = new_id();
        match plan {
            Plan::Execute(kind) => {
                if let Some(r) = self.executor.running() {
                    return Err((
                        StatusCode::CONFLICT,
                        "AgentIsBusy",
                        format!("Agent is busy: command {} ({}) is running", r.id, r.name),
                    ));
                }
                lock(&self.records).push(Record {
                    id: id.clone(),
                    method: method.to_string(),
                    params,
                    done: None,
                });
                let finished = self.executor.finished();
                self.executor.submit(Command {
                    id: id.clone(),
                    kind,
                });
                if wait {
                    loop {
                        // Registered before the check, so a finish in between still wakes it.
                        let notified = finished.notified();
                        tokio::pin!(notified);
                        notified.as_mut().enable();
                        if self.executor.pending_results().iter().any(|c| c.id == id) {
                            break;
                        }
                        notified.await;
                    }
                }
            }
            Plan::Immediate(what) => {
                let me = self.clone();
                let result = tokio::task::spawn_blocking(move || me.immediate(what))
                    .await
                    .map_err(|e| {
                        (
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "CommandExecutionError",
                            format!("command crashed: {e}"),
                        )
                    })?
                    .map_err(|m| (StatusCode::BAD_REQUEST, "InvalidCommandError", m))?;
                lock(&self.records).push(Record {
                    id: id.clone(),
                    method: method.to_string(),
                    params,
                    done: Some(result),
                });
            }
        }
        self.get(&id).ok_or((
            StatusCode::INTERNAL_SERVER_ERROR,
            "CommandExecutionError",
            "command vanished".into(),
        ))
    }

    /// The last successful `write_image` result.
    fn last_write(&self) -> Option<Value> {
        let records = lock(&self.records);
        let ids: Vec<String> = records
            .iter()
            .filter(|r| {
                r.method == "deploy.execute_deploy_step"
                    && r.params
                        .get("step")
                        .and_then(|s| s.get("step"))
                        .and_then(Value::as_str)
                        == Some("write_image")
            })
            .map(|r| r.id.clone())
            .collect();
        drop(records);
        let results = self.executor.pending_results();
        ids.iter().rev().find_map(|id| {
            results
                .iter()
                .find(|c| &c.id == id && c.status == CommandStatus::Succeeded)
                .map(|c| c.result.clone())
        })
    }

    fn immediate(&self, what: Immediate) -> Result<Value, String> {
        match what {
            Immediate::Sync => {
                nix::unistd::sync();
                Ok(Value::Null)
            }
            Immediate::NoServiceSteps => Ok(json!({"service_steps": {},
                "hardware_manager_version": self.dispatcher.versions()})),
            Immediate::PartitionUuids => self.partition_uuids(),
            Immediate::InstallBootloader { boot_mode } => {
                let entry = self
                    .last_write()
                    .and_then(|w| w.get("uefi_boot_entry").cloned())
                    .filter(|e| !e.is_null());
                match (boot_mode.as_str(), entry) {
                    ("uefi", Some(e)) => Ok(json!({"uefi_boot_entry": e,
                        "message": "write_image already made the image's loader the first UEFI boot entry"})),
                    _ => Err(format!(
                        "Unknown command: image.install_bootloader ({boot_mode}): rivet-agent \
                         installs no bootloader; a whole-disk image carries its own, and on \
                         UEFI write_image writes the boot entry"
                    )),
                }
            }
            Immediate::CollectLogs => {
                let text = self.log.tail();
                let gz = logs_tar_gz(&text).map_err(|e| format!("cannot pack the logs: {e}"))?;
                use base64::Engine;
                Ok(json!({"system_logs": base64::engine::general_purpose::STANDARD.encode(gz)}))
            }
        }
    }

    /// IPA's `get_partition_uuids` for the disk `write_image` wrote.
    fn partition_uuids(&self) -> Result<Value, String> {
        use rivet_hardware_managers::deploy::gpt;
        let Some(w) = self.last_write() else {
            return Ok(json!({}));
        };
        let device = w
            .get("device")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let f = std::fs::File::open(&device).map_err(|e| format!("{device}: {e}"))?;
        let size =
            rivet_hardware_managers::erase::device::Target::open(std::path::Path::new(&device))
                .map(|t| (t.size, t.sector))
                .map_err(|e| e.to_string())?;
        let dev = gpt::Device::new(&f, &device, size.1, size.0);
        let parts = gpt::partitions(&dev).map_err(|e| e.to_string())?;
        let mut root = Value::Null;
        let mut esp = Value::Null;
        for p in &parts {
            if let gpt::PartitionId::Gpt {
                type_guid,
                unique_guid,
            } = p.id
            {
                if type_guid == rivet_hardware_managers::deploy::uefi::esp::ESP_TYPE {
                    esp = json!(guid(&unique_guid));
                } else if root.is_null() {
                    root = json!(guid(&unique_guid));
                }
            }
        }
        Ok(json!({"root uuid": root, "efi system partition uuid": esp,
                  "PReP Boot partition uuid": null}))
    }
}

/// A one-file tar.gz: `rivet-agent.log`.
fn logs_tar_gz(text: &str) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    let data = text.as_bytes();
    let mut header = [0u8; 512];
    let put = |h: &mut [u8; 512], at: usize, s: &str| {
        h[at..at + s.len()].copy_from_slice(s.as_bytes());
    };
    put(&mut header, 0, "rivet-agent.log");
    put(&mut header, 100, "0000644\0");
    put(&mut header, 108, "0000000\0");
    put(&mut header, 116, "0000000\0");
    put(&mut header, 124, &format!("{:011o}\0", data.len()));
    let mtime = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    put(&mut header, 136, &format!("{mtime:011o}\0"));
    header[156] = b'0';
    put(&mut header, 257, "ustar\0");
    put(&mut header, 263, "00");
    header[148..156].copy_from_slice(b"        ");
    let sum: u32 = header.iter().map(|b| u32::from(*b)).sum();
    put(&mut header, 148, &format!("{sum:06o}\0 "));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&header)?;
    gz.write_all(data)?;
    gz.write_all(&vec![0u8; (512 - data.len() % 512) % 512])?;
    gz.write_all(&[0u8; 1024])?;
    gz.finish()
}

/// The callback URL: given, or `http://ADDR:PORT` with the local address a route to Ironic
/// uses (a connected UDP socket sends nothing), or the listen address when that is specific.
fn callback_url(opts: &IpaOptions) -> String {
    if let Some(a) = &opts.advertise {
        return a.trim_end_matches('/').to_string();
    }
    let scheme = if opts.auto_tls { "https" } else { "http" };
    let port = opts.listen.port();
    if !opts.listen.ip().is_unspecified() {
        return format!("{scheme}://{}", opts.listen);
    }
    let host = reqwest::Url::parse(&opts.api_url)
        .ok()
        .and_then(|u| u.socket_addrs(|| Some(6385)).ok())
        .and_then(|a| a.into_iter().next())
        .and_then(|ironic| {
            let bind: SocketAddr = if ironic.is_ipv6() {
                "[::]:0".parse().ok()?
            } else {
                "0.0.0.0:0".parse().ok()?
            };
            let s = std::net::UdpSocket::bind(bind).ok()?;
            s.connect(ironic).ok()?;
            s.local_addr().ok().map(|a| a.ip())
        });
    match host {
        Some(std::net::IpAddr::V6(h)) => format!("{scheme}://[{h}]:{port}"),
        Some(h) => format!("{scheme}://{h}:{port}"),
        None => format!("{scheme}://127.0.0.1:{port}"),
    }
}

/// Whether a power_off, reboot or finalize_rescue command has succeeded: then, as IPA, the
/// agent heartbeats no more (the machine is going down, or now belongs to the rescue user).
fn powering_down(executor: &Executor) -> bool {
    executor.pending_results().iter().any(|c| {
        matches!(c.name.as_str(), "power_off" | "reboot" | "finalize_rescue")
            && c.status == CommandStatus::Succeeded
    })
}

/// Run IPA mode until `shutdown`.
pub async fn run(
    opts: IpaOptions,
    executor: Executor,
    dispatcher: Arc<Dispatcher>,
    log: LogRing,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    let client = ironic::IronicClient::new(&opts.api_url, opts.ca_pem.as_deref())
        .map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .map_err(|e| format!("cannot listen on {} for Ironic's calls: {e}", opts.listen))?;
    let callback = callback_url(&opts);
    let tls = if opts.auto_tls {
        let host = reqwest::Url::parse(&callback)
            .ok()
            .and_then(|u| u.host_str().map(|h| h.trim_matches(['[', ']']).to_string()))
            .unwrap_or_else(|| "127.0.0.1".into());
        Some(Arc::new(server::AutoTls::new(&host)?))
    } else {
        None
    };
    let shared = Arc::new(Shared::new(executor.clone(), dispatcher.clone(), log));
    tokio::pin!(shutdown);

    let inv = {
        let opts = opts.inventory.clone();
        let d = dispatcher.clone();
        tokio::task::spawn_blocking(move || {
            let mut inv = inventory::collect(&Root::default(), &opts);
            d.inventory(&mut inv);
            inv
        })
        .await
        .map_err(|e| format!("inventory crashed: {e}"))?
    };
    let macs: Vec<String> = inv
        .interfaces
        .iter()
        .map(|i| i.mac_address.to_ascii_lowercase())
        .filter(|m| !m.is_empty() && m != "00:00:00:00:00:00")
        .collect();
    let mut node = opts.node.clone();
    // At 1.84 Ironic answers an inspection as a lookup (node, token): then no lookup.
    let mut inspected: Option<ironic::Lookup> = None;
    if let Some(url) = &opts.inspection_callback {
        // IPA's body: the inventory, the disk it would deploy to, the PXE MAC.
        let root_disk = inv
            .disks
            .iter()
            .filter(|d| d.size >= 4 << 30)
            .min_by_key(|d| d.size)
            .or_else(|| inv.disks.first())
            .map(|d| json!({"name": d.name, "size": d.size}));
        let data = json!({"inventory": inv, "root_disk": root_disk,
                          "boot_interface": opts.inventory.pxe_mac,
                          "configuration": {"collectors": [], "managers": []}});
        let mut delay = Duration::from_secs(1);
        loop {
            match client.continue_inspection(url, &data).await {
                Ok(answer) => {
                    let uuid = answer
                        .get("uuid")
                        .or_else(|| answer.pointer("/node/uuid"))
                        .and_then(Value::as_str);
                    tracing::info!(node = ?uuid, "inventory posted for inspection");
                    if let Some(u) = uuid {
                        node.get_or_insert_with(|| u.to_string());
                    }
                    inspected = ironic::parse_lookup(&answer.to_string()).ok();
                    break;
                }
                Err(e) => tracing::warn!(error = %e, url, "posting the inventory failed; retrying"),
            }
            tokio::select! {
                _ = &mut shutdown => return Ok(()),
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(Duration::from_secs(30));
        }
    }

    // Lookup until Ironic knows the node and lets it in.
    let mut delay = Duration::from_secs(1);
    let found = loop {
        if let Some(l) = inspected.take() {
            break l;
        }
        match client.lookup(&macs, node.as_deref()).await {
            Ok(l) => break l,
            Err(e) => tracing::info!(error = %e, ?macs, node = ?node, "lookup: not yet"),
        }
        tokio::select! {
            _ = &mut shutdown => return Ok(()),
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(15));
    };
    tracing::info!(node = %found.uuid, callback = %callback, token = found.token.is_some(),
                   heartbeat_timeout_s = found.heartbeat_timeout.as_secs(), "looked up by Ironic");
    *lock(&shared.token) = found.token.clone();

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    // Supervised: the heartbeat loop below watches it, and an API that stopped ends IPA
    // mode with an error (the ramdisk's init then restarts the agent), rather than
    // heartbeating a callback URL nobody answers.
    let mut server = tokio::spawn(server::serve(
        listener,
        shared.clone(),
        tls.clone(),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let verify_ca = tls.as_ref().map(|t| t.cert_pem.clone());
    let finished = executor.finished();
    let version = format!("rivet-agent {}", rivet_protocol::VERSION);
    let mut next = Instant::now();
    // Results seen so far: a wake-up with no new one is not a reason to heartbeat.
    let mut seen = executor.pending_results().len();
    loop {
        if powering_down(&executor) {
            // As IPA: no heartbeat after power_off or reboot succeeded; the machine is going.
            tracing::info!("power off, reboot or rescue done: no more heartbeats");
            tokio::select! {
                _ = &mut shutdown => break,
                r = &mut server => return Err(format!("the IPA API server stopped: {r:?}")),
            }
        }
        if Instant::now() >= next {
            let token = lock(&shared.token).clone();
            match client
                .heartbeat(
                    &found.uuid,
                    &callback,
                    token.as_deref(),
                    &version,
                    verify_ca.as_deref(),
                )
                .await
            {
                Ok(()) => tracing::debug!(node = %found.uuid, "heartbeat"),
                Err(e) => tracing::warn!(node = %found.uuid, error = %e, "heartbeat refused"),
            }
            // IPA's interval: 30–60 % of Ironic's timeout.
            let frac = 0.3 + 0.3 * rand::random::<f64>();
            next = Instant::now() + found.heartbeat_timeout.mul_f64(frac);
        }
        let notified = finished.notified();
        tokio::select! {
            _ = &mut shutdown => break,
            r = &mut server => return Err(format!("the IPA API server stopped: {r:?}")),
            _ = tokio::time::sleep_until(next.into()) => {}
            _ = notified => {
                // A command finished: tell Ironic now, as IPA does.
                let now_seen = executor.pending_results().len();
                if now_seen > seen {
                    next = Instant::now();
                }
                seen = now_seen;
            }
        }
    }
    let _ = stop_tx.send(());
    if let Err(e) = server.await {
        tracing::warn!(error = %e, "IPA API server task failed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guids_print_as_uuids() {
        // C12A7328-F81F-11D2-BA4B-00A0C93EC93B (the ESP type) on disk.
        let esp = rivet_hardware_managers::deploy::uefi::esp::ESP_TYPE;
        assert_eq!(guid(&esp), "c12a7328-f81f-11d2-ba4b-00a0c93ec93b");
        assert_eq!(new_id().len(), 36);
    }

    #[test]
    fn log_archive_is_a_tar_gz() {
        let gz = logs_tar_gz("line one\nline two\n").unwrap();
        let mut d = flate2::read::GzDecoder::new(&gz[..]);
        let mut tar = Vec::new();
        std::io::Read::read_to_end(&mut d, &mut tar).unwrap();
        assert_eq!(&tar[0..15], b"rivet-agent.log");
        assert_eq!(&tar[257..262], b"ustar");
        assert_eq!(&tar[512..530], b"line one\nline two\n");
        assert_eq!(tar.len() % 512, 0);
        // The checksum field holds the header's byte sum with the field as spaces.
        let mut h = tar[..512].to_vec();
        let stored = u32::from_str_radix(std::str::from_utf8(&h[148..154]).unwrap(), 8).unwrap();
        h[148..156].copy_from_slice(b"        ");
        assert_eq!(stored, h.iter().map(|b| u32::from(*b)).sum::<u32>());
    }

    #[test]
    fn callback_url_from_listen_or_route() {
        let mut o = IpaOptions {
            api_url: "http://127.0.0.1:6385".into(),
            listen: "127.0.0.1:9999".parse().unwrap(),
            advertise: None,
            node: None,
            inspection_callback: None,
            ca_pem: None,
            inventory: InventoryOptions::default(),
            auto_tls: false,
        };
        assert_eq!(callback_url(&o), "http://127.0.0.1:9999");
        o.listen = "0.0.0.0:9999".parse().unwrap();
        assert_eq!(callback_url(&o), "http://127.0.0.1:9999");
        o.auto_tls = true;
        assert_eq!(callback_url(&o), "https://127.0.0.1:9999");
        o.advertise = Some("http://10.0.0.5:9999/".into());
        assert_eq!(callback_url(&o), "http://10.0.0.5:9999");
    }
}
