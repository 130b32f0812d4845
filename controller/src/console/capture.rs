//! A node's captured console on disk, bounded: everything the SOL session printed while the
//! console was enabled, newest last, at most `[console] log_max_bytes`, kept across rivetd
//! restarts.
//!
//! Two files per node in the capture directory: `UUID.log` (being written) and `UUID.log.1`
//! (the half before it). When `UUID.log` reaches half the bound it replaces `UUID.log.1`, so
//! the oldest half is dropped in one rename — no rewriting, nothing read back, and a crash
//! leaves two whole files. A reader concatenates `.1` then the current file.
//!
//! Plain blocking I/O: callers run it under `spawn_blocking` (the hub's capture task hands
//! it a batch of chunks at a time), never on the async runtime.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The two files of a node's capture.
#[derive(Debug, Clone)]
pub struct CapturePaths {
    current: PathBuf,
    previous: PathBuf,
}

impl CapturePaths {
    /// The capture of `node_uuid` in `dir`. The UUID comes from the store (never from a
    /// request), so it is a plain file name.
    pub fn new(dir: &Path, node_uuid: &str) -> CapturePaths {
        CapturePaths {
            current: dir.join(format!("{node_uuid}.log")),
            previous: dir.join(format!("{node_uuid}.log.1")),
        }
    }

    /// Whether anything was ever captured.
    pub fn exists(&self) -> bool {
        self.current.exists() || self.previous.exists()
    }

    /// Up to `max` of the newest bytes, oldest first (`None`: nothing captured).
    pub fn tail(&self, max: u64) -> std::io::Result<Option<Vec<u8>>> {
        if !self.exists() {
            return Ok(None);
        }
        let mut out = read_tail(&self.current, max)?;
        let missing = max.saturating_sub(out.len() as u64);
        if missing > 0 {
            let mut older = read_tail(&self.previous, missing)?;
            older.extend_from_slice(&out);
            out = older;
        }
        Ok(Some(out))
    }
}

/// Up to `max` last bytes of `path` (empty when it does not exist).
fn read_tail(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    let start = len.saturating_sub(max);
    f.seek(SeekFrom::Start(start))?;
    let mut out = Vec::with_capacity((len - start) as usize);
    f.take(max).read_to_end(&mut out)?;
    Ok(out)
}

/// The writer of one node's capture.
pub struct CaptureWriter {
    paths: CapturePaths,
    half: u64,
    file: Option<File>,
    len: u64,
}

impl CaptureWriter {
    /// A writer appending to `paths`, keeping at most `max_bytes` in all.
    pub fn open(paths: CapturePaths, max_bytes: u64) -> std::io::Result<CaptureWriter> {
        if let Some(dir) = paths.current.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut w = CaptureWriter {
            paths,
            half: (max_bytes / 2).max(1),
            file: None,
            len: 0,
        };
        w.reopen()?;
        Ok(w)
    }

    fn reopen(&mut self) -> std::io::Result<()> {
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.paths.current)?;
        self.len = f.metadata()?.len();
        self.file = Some(f);
        Ok(())
    }

    /// Append `bytes`, rotating when the current half is full.
    pub fn append(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        // One chunk larger than half the bound: only its newest half can be kept.
        if bytes.len() as u64 > self.half {
            bytes = &bytes[bytes.len() - self.half as usize..];
        }
        if self.len + bytes.len() as u64 > self.half && self.len > 0 {
            self.file = None;
            std::fs::rename(&self.paths.current, &self.paths.previous)?;
            self.reopen()?;
        }
        if self.file.is_none() {
            self.reopen()?;
        }
        if let Some(f) = self.file.as_mut() {
            f.write_all(bytes)?;
            self.len += bytes.len() as u64;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn bounded_newest_last_and_reopened() {
        let dir = std::env::temp_dir().join(format!("rivet-capture-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let paths = CapturePaths::new(&dir, "n1");
        assert!(paths.tail(10).unwrap().is_none());
        let mut w = CaptureWriter::open(paths.clone(), 100).unwrap();
        for i in 0..100u8 {
            w.append(&[i, i]).unwrap();
        }
        let all = paths.tail(1000).unwrap().unwrap();
        assert!(all.len() <= 100 && all.len() >= 50, "{}", all.len());
        assert_eq!(all.last(), Some(&99));
        // Oldest first, contiguous.
        assert!(all.windows(2).all(|w| w[1] == w[0] || w[1] == w[0] + 1));
        assert_eq!(paths.tail(3).unwrap().unwrap(), vec![98, 99, 99]);
        drop(w);
        // A restart appends to what is there.
        let mut w = CaptureWriter::open(paths.clone(), 100).unwrap();
        w.append(b"Z").unwrap();
        assert_eq!(paths.tail(2).unwrap().unwrap(), vec![99, b'Z']);
        // A chunk larger than the bound keeps its newest half.
        w.append(&[7u8; 1000]).unwrap();
        let t = paths.tail(1000).unwrap().unwrap();
        assert!(t.len() <= 100, "{}", t.len());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
