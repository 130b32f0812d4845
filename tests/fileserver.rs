//! A static file server on a loopback port for the deploy scenarios: the image server an
//! operator would point `instance_info.image_source` at. Plain HTTP/1.1 over std threads,
//! `GET` and `HEAD`, `Content-Length`, single `Range: bytes=A-B` requests, and an optional
//! pace (bytes per second) so a test can catch a deploy mid-write, and faults: the next N
//! bodies cut after some bytes, ranges ignored (a whole body sent again). Files are streamed,
//! never read whole.

use anyhow::Result;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A running file server; stops when dropped.
pub struct FileServer {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    stop: Arc<AtomicBool>,
    knobs: Arc<Knobs>,
    /// Requests served so far (`GET` and `HEAD`).
    pub requests: Arc<AtomicU64>,
}

/// What a test can change while the server runs.
#[derive(Default)]
struct Knobs {
    pace: AtomicU64,
    /// Bodies still to cut, and after how many of their bytes.
    cuts_left: AtomicU64,
    cut_after: AtomicU64,
    /// Answer `Range` requests with the whole file (200), as servers without range support.
    ignore_ranges: AtomicBool,
    /// `Range` requests seen.
    ranges: AtomicU64,
    /// Whole bodies sent (a `GET` answered 200).
    full_gets: AtomicU64,
    /// Conditional requests (`If-None-Match` or `If-Modified-Since`), and those answered 304.
    conditional: AtomicU64,
    not_modified: AtomicU64,
    /// Image bytes sent in bodies.
    body_bytes: AtomicU64,
}

impl FileServer {
    /// Serve the files of `root` (no sub-directories, no `..`).
    pub fn start(root: &Path) -> Result<FileServer> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let url = format!("http://{}", listener.local_addr()?);
        let stop = Arc::new(AtomicBool::new(false));
        let knobs = Arc::new(Knobs::default());
        let requests = Arc::new(AtomicU64::new(0));
        let root = root.to_path_buf();
        let (s, p, r) = (stop.clone(), knobs.clone(), requests.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let (root, p, r) = (root.clone(), p.clone(), r.clone());
                        std::thread::spawn(move || {
                            let _ = serve(conn, &root, &p, &r);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Ok(FileServer {
            url,
            stop,
            knobs,
            requests,
        })
    }

    /// URL of a file in the root.
    pub fn url_of(&self, name: &str) -> String {
        format!("{}/{name}", self.url)
    }

    /// Limit every body to about `bytes_per_s` (0 = as fast as possible); applies to
    /// transfers in progress too.
    pub fn set_pace(&self, bytes_per_s: u64) {
        self.knobs.pace.store(bytes_per_s, Ordering::Relaxed);
    }

    /// Close the connection of each of the next `bodies` responses after `after` bytes of
    /// its body, as a network that drops mid-transfer.
    pub fn cut_next(&self, bodies: u64, after: u64) {
        self.knobs.cut_after.store(after, Ordering::Relaxed);
        self.knobs.cuts_left.store(bodies, Ordering::Relaxed);
    }

    /// Answer range requests with the whole file (200), as a server without range support.
    pub fn ignore_ranges(&self, ignore: bool) {
        self.knobs.ignore_ranges.store(ignore, Ordering::Relaxed);
    }

    /// `Range` requests received so far.
    pub fn range_requests(&self) -> u64 {
        self.knobs.ranges.load(Ordering::Relaxed)
    }

    /// `GET`s answered 200 with the whole file.
    pub fn full_gets(&self) -> u64 {
        self.knobs.full_gets.load(Ordering::Relaxed)
    }

    /// Conditional requests received, and how many were answered 304.
    pub fn conditional(&self) -> (u64, u64) {
        (
            self.knobs.conditional.load(Ordering::Relaxed),
            self.knobs.not_modified.load(Ordering::Relaxed),
        )
    }

    /// Body bytes sent so far.
    pub fn body_bytes(&self) -> u64 {
        self.knobs.body_bytes.load(Ordering::Relaxed)
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn respond(conn: &mut TcpStream, status: &str, extra: &str) -> std::io::Result<()> {
    write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n{extra}\r\n"
    )
}

fn serve(mut conn: TcpStream, root: &Path, knobs: &Knobs, requests: &AtomicU64) -> Result<()> {
    let pace = &knobs.pace;
    conn.set_nonblocking(false)?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let target = parts.next().unwrap_or_default().to_string();
    let mut range: Option<(u64, Option<u64>)> = None;
    let mut if_none_match: Option<String> = None;
    let mut if_modified_since: Option<String> = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.trim().eq_ignore_ascii_case("if-none-match") {
                if_none_match = Some(v.trim().to_string());
            }
            if k.trim().eq_ignore_ascii_case("if-modified-since") {
                if_modified_since = Some(v.trim().to_string());
            }
            if k.trim().eq_ignore_ascii_case("range") {
                let v = v.trim().trim_start_matches("bytes=");
                if let Some((a, b)) = v.split_once('-') {
                    range = a.parse().ok().map(|a| (a, b.parse().ok()));
                }
            }
        }
    }
    requests.fetch_add(1, Ordering::Relaxed);
    if range.is_some() {
        knobs.ranges.fetch_add(1, Ordering::Relaxed);
        if knobs.ignore_ranges.load(Ordering::Relaxed) {
            range = None;
        }
    }
    let name = target.trim_start_matches('/');
    if name.is_empty() || name.contains('/') || name.contains("..") {
        return Ok(respond(&mut conn, "404 Not Found", "")?);
    }
    let path: PathBuf = root.join(name);
    let Ok(mut file) = std::fs::File::open(&path) else {
        return Ok(respond(&mut conn, "404 Not Found", "")?);
    };
    let meta = file.metadata()?;
    let size = meta.len();
    // Validators from the file's size and mtime: a changed file gets new ones.
    let mtime = meta
        .modified()?
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let etag = format!("\"{size:x}-{mtime:x}\"");
    let last_modified = httpdate::fmt_http_date(std::time::UNIX_EPOCH + Duration::from_secs(mtime));
    let validators = format!("ETag: {etag}\r\nLast-Modified: {last_modified}\r\n");
    if if_none_match.is_some() || if_modified_since.is_some() {
        knobs.conditional.fetch_add(1, Ordering::Relaxed);
        let unchanged = match (&if_none_match, &if_modified_since) {
            (Some(tag), _) => tag == &etag,
            (None, Some(since)) => httpdate::parse_http_date(since)
                .map(|t| t >= std::time::UNIX_EPOCH + Duration::from_secs(mtime))
                .unwrap_or(false),
            (None, None) => false,
        };
        if unchanged {
            knobs.not_modified.fetch_add(1, Ordering::Relaxed);
            return Ok(respond(&mut conn, "304 Not Modified", &validators)?);
        }
    }
    let (start, end, status) = match range {
        Some((a, b)) if a < size => {
            let end = b.map(|b| b.min(size - 1)).unwrap_or(size - 1);
            (a, end, "206 Partial Content")
        }
        Some(_) => {
            return Ok(respond(
                &mut conn,
                "416 Range Not Satisfiable",
                &format!("Content-Range: bytes */{size}\r\n"),
            )?)
        }
        None => (0, size.saturating_sub(1), "200 OK"),
    };
    let len = if size == 0 { 0 } else { end - start + 1 };
    let content_range = if status.starts_with("206") {
        format!("Content-Range: bytes {start}-{end}/{size}\r\n")
    } else {
        String::new()
    };
    write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Length: {len}\r\nAccept-Ranges: bytes\r\nContent-Type: application/octet-stream\r\n{validators}{content_range}Connection: close\r\n\r\n"
    )?;
    if method == "HEAD" {
        return Ok(());
    }
    if status.starts_with("200") {
        knobs.full_gets.fetch_add(1, Ordering::Relaxed);
    }
    file.seek(SeekFrom::Start(start))?;
    let cut = knobs
        .cuts_left
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok();
    let mut left = if cut {
        len.min(knobs.cut_after.load(Ordering::Relaxed))
    } else {
        len
    };
    let mut buf = vec![0u8; 1 << 20];
    while left > 0 {
        let rate = pace.load(Ordering::Relaxed);
        let chunk = if rate > 0 {
            (rate / 10).clamp(4096, buf.len() as u64)
        } else {
            buf.len() as u64
        };
        let n = file.read(&mut buf[..chunk.min(left) as usize])?;
        if n == 0 {
            break;
        }
        conn.write_all(&buf[..n])?;
        knobs.body_bytes.fetch_add(n as u64, Ordering::Relaxed);
        left -= n as u64;
        if rate > 0 {
            std::thread::sleep(Duration::from_secs_f64(n as f64 / rate as f64));
        }
    }
    Ok(())
}
