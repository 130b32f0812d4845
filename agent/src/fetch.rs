//! Image and configdrive downloads for `write_image`: the agent's side of
//! [`rivet_hardware_managers::deploy::ImageFetcher`].
//!
//! Each download runs on a thread with its own small tokio runtime (the step runs on a
//! blocking thread, in the ramdisk and in `rivet-agent step` alike) and hands the body to the
//! step through a bounded channel of chunks: the network keeps going while the disk writes,
//! and at most a few MiB are in flight, whatever the image's size. Dropping the reader ends
//! the download. Opening retries a few times on connection errors and 5xx answers, as IPA
//! does; a body cut mid-way is resumed with an HTTP Range request (or, where the server
//! ignores ranges, fetched again with the bytes already read dropped), up to the deploy's
//! `download_retries`; errors name the URL and the HTTP status.

use rivet_hardware_managers::deploy::{Fetched, ImageFetcher};
use std::io::Read;
use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::time::Duration;

/// Chunks in flight between the download and the writer: with 1 MiB chunks, 16 MiB of
/// download keep arriving while the writer waits on the disk.
const IN_FLIGHT: usize = 16;
/// The network's small pieces are gathered into chunks of this size before they cross to the
/// writer (fewer hand-overs, and the in-flight bound counts bytes, not pieces).
const CHUNK: usize = 1 << 20;
/// Attempts at opening a URL.
const ATTEMPTS: u32 = 3;
/// Pause between attempts.
const RETRY_PAUSE: Duration = Duration::from_secs(2);
/// Pause before resuming a body cut mid-way.
const RESUME_PAUSE: Duration = Duration::from_millis(500);

/// Ask again for `url` from byte `from`: `(response, false)` when the server resumed there
/// (206 with a matching `Content-Range`), `(response, true)` when it sent the whole body
/// again (200: the caller drops the first `from` bytes).
async fn resume(
    client: &reqwest::Client,
    url: &str,
    shown: &str,
    from: u64,
) -> Result<(reqwest::Response, bool), String> {
    let r = client
        .get(url)
        .header(reqwest::header::RANGE, format!("bytes={from}-"))
        .send()
        .await
        .map_err(|e| format!("{shown}: {}", chain(&e)))?;
    match r.status().as_u16() {
        206 => {
            let starts_at = r
                .headers()
                .get(reqwest::header::CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("bytes "))
                .and_then(|v| v.split('-').next())
                .and_then(|v| v.trim().parse::<u64>().ok());
            if starts_at == Some(from) {
                Ok((r, false))
            } else {
                Err(format!(
                    "{shown} answered a range that does not start at byte {from}"
                ))
            }
        }
        200 => Ok((r, true)),
        s => Err(format!("{shown} answered {s} to a resumed request")),
    }
}

/// Downloads over HTTP(S) with rustls, trusting the usual roots, the agent's own CA (the
/// controller's, `--ca`) and a CA the deploy names.
#[derive(Debug, Clone, Default)]
pub struct HttpFetcher {
    agent_ca: Option<PathBuf>,
}

impl HttpFetcher {
    /// A fetcher that also trusts the PEM file `agent_ca`.
    pub fn new(agent_ca: Option<PathBuf>) -> HttpFetcher {
        HttpFetcher { agent_ca }
    }

    fn client(&self, ca_pem: Option<&str>) -> Result<reqwest::Client, String> {
        let mut b = reqwest::Client::builder()
            .use_rustls_tls()
            .connect_timeout(Duration::from_secs(60))
            .read_timeout(Duration::from_secs(120))
            .user_agent(concat!("rivet-agent/", env!("CARGO_PKG_VERSION")));
        let mut pems: Vec<Vec<u8>> = Vec::new();
        if let Some(p) = &self.agent_ca {
            pems.push(std::fs::read(p).map_err(|e| format!("reading CA {}: {e}", p.display()))?);
        }
        if let Some(p) = ca_pem {
            pems.push(p.as_bytes().to_vec());
        }
        for pem in pems {
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| format!("a CA certificate does not parse: {e}"))?;
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        b.build()
            .map_err(|e| format!("building the HTTP client: {e}"))
    }
}

/// The body's chunks as a blocking reader.
struct ChannelReader {
    rx: Receiver<Result<Vec<u8>, String>>,
    /// Emptied chunks go back to the download thread: a ramdisk's allocator (musl) maps and
    /// unmaps every large allocation, so fresh 1 MiB buffers would cost page faults per MiB.
    recycle: SyncSender<Vec<u8>>,
    current: Vec<u8>,
    pos: usize,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pos >= self.current.len() {
            match self.rx.recv() {
                Ok(Ok(chunk)) => {
                    let done = std::mem::replace(&mut self.current, chunk);
                    if done.capacity() > 0 {
                        let _ = self.recycle.try_send(done);
                    }
                    self.pos = 0;
                }
                Ok(Err(e)) => return Err(std::io::Error::other(e)),
                // The download ended (its sender is gone after the last chunk).
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len() - self.pos);
        buf[..n].copy_from_slice(&self.current[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

impl ImageFetcher for HttpFetcher {
    fn open(&self, url: &str, ca_pem: Option<&str>, retries: u32) -> Result<Fetched, String> {
        let client = self.client(ca_pem)?;
        let url = url.to_string();
        // What logs and errors show: the URL without a password (rivetd's image-cache URLs
        // carry the node's download token in it).
        let shown = rivet_protocol::deploy::redact_url(&url);
        let (open_tx, open_rx) = sync_channel::<Result<Option<u64>, String>>(1);
        let (tx, rx) = sync_channel::<Result<Vec<u8>, String>>(IN_FLIGHT);
        let (recycle, recycled) = sync_channel::<Vec<u8>>(IN_FLIGHT + 2);
        std::thread::Builder::new()
            .name("image-download".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = open_tx.send(Err(format!("starting the download runtime: {e}")));
                        return;
                    }
                };
                rt.block_on(async move {
                    let mut last = String::new();
                    let mut resp = None;
                    for attempt in 1..=ATTEMPTS {
                        match client.get(&url).send().await {
                            Ok(r) if r.status().is_success() => {
                                resp = Some(r);
                                break;
                            }
                            Ok(r) if r.status().is_server_error() => {
                                last = format!("{shown} answered {}", r.status());
                            }
                            Ok(r) => {
                                // 4xx: retrying will not help.
                                last = format!("{shown} answered {}", r.status());
                                break;
                            }
                            Err(e) => last = format!("{shown}: {}", chain(&e)),
                        }
                        if attempt < ATTEMPTS {
                            tracing::warn!(url = %shown, attempt, error = %last, "download failed; retrying");
                            tokio::time::sleep(RETRY_PAUSE).await;
                        }
                    }
                    let Some(mut resp) = resp else {
                        let _ = open_tx.send(Err(last));
                        return;
                    };
                    let total = resp.content_length();
                    if open_tx.send(Ok(total)).is_err() {
                        return;
                    }
                    let mut pending: Vec<u8> = Vec::with_capacity(CHUNK);
                    // Bytes of the file handed on so far, and bytes of a restarted body still
                    // to drop (they were handed on before the cut).
                    let mut received: u64 = 0;
                    let mut skip: u64 = 0;
                    let mut cuts: u32 = 0;
                    loop {
                        let cut = match resp.chunk().await {
                            Ok(Some(bytes)) => {
                                let drop_n = skip.min(bytes.len() as u64) as usize;
                                skip -= drop_n as u64;
                                let bytes = &bytes[drop_n..];
                                received += bytes.len() as u64;
                                pending.extend_from_slice(bytes);
                                if pending.len() >= CHUNK {
                                    let fresh = match recycled.try_recv() {
                                        Ok(mut v) => {
                                            v.clear();
                                            v
                                        }
                                        Err(_) => Vec::with_capacity(CHUNK),
                                    };
                                    let full = std::mem::replace(&mut pending, fresh);
                                    // The reader went away (step aborted or failed): stop.
                                    if tx.send(Ok(full)).is_err() {
                                        return;
                                    }
                                }
                                continue;
                            }
                            Ok(None) => match total {
                                Some(t) if received < t => {
                                    format!("the body ended at {received} of {t} bytes")
                                }
                                _ => {
                                    if !pending.is_empty() {
                                        let _ = tx.send(Ok(pending));
                                    }
                                    return;
                                }
                            },
                            Err(e) => chain(&e),
                        };
                        // Cut mid-way: resume from `received`, up to `retries` times.
                        loop {
                            if cuts >= retries {
                                let _ = tx.send(Err(format!(
                                    "{shown}: download interrupted after {received} bytes ({cut}); gave up after {retries} retries"
                                )));
                                return;
                            }
                            cuts += 1;
                            tracing::warn!(url = %shown, received, retry = cuts, of = retries, error = %cut, "download cut; resuming");
                            tokio::time::sleep(RESUME_PAUSE).await;
                            match resume(&client, &url, &shown, received).await {
                                Ok((r, restarted)) => {
                                    resp = r;
                                    skip = if restarted { received } else { 0 };
                                    break;
                                }
                                Err(e) => {
                                    tracing::warn!(url = %shown, error = %e, "resuming the download failed");
                                }
                            }
                        }
                    }
                });
            })
            .map_err(|e| format!("starting the download thread: {e}"))?;
        let len = open_rx
            .recv()
            .map_err(|_| "the download thread stopped".to_string())??;
        Ok(Fetched {
            reader: Box::new(ChannelReader {
                rx,
                recycle,
                current: Vec::new(),
                pos: 0,
            }),
            len,
        })
    }
}
