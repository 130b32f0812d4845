//! A reproducible `newc` cpio writer (the format the kernel unpacks as an initramfs).
//!
//! Entries live in a sorted map, so the archive is written in path order whatever order they
//! were added in; a path sorts before everything below it, so parents always precede their
//! children. Every header carries mtime 0, uid/gid 0, device 0 and an inode number given by
//! the entry's position: the same entries always give the same bytes.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::PathBuf;

const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;
const S_IFLNK: u32 = 0o120_000;
const S_IFCHR: u32 = 0o020_000;

/// What an entry holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// A directory.
    Dir,
    /// A regular file with these bytes.
    Bytes(Vec<u8>),
    /// A regular file whose bytes are read from this host path when the archive is written.
    File(PathBuf),
    /// A symbolic link to this target.
    Symlink(String),
    /// A character device node (major, minor).
    CharDev(u32, u32),
}

/// One archive member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Permission bits (`0o755`…); the file type comes from [`Content`].
    pub perm: u32,
    /// What it holds.
    pub content: Content,
}

/// Errors while adding entries.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CpioError {
    /// A path that is empty, absolute after normalisation, or has `.`/`..` components.
    #[error("archive path {0:?} is not a clean relative path (no '.', '..' or empty components)")]
    BadPath(String),
    /// Two different entries at one path.
    #[error("archive path {0:?} is added twice with different contents")]
    Conflict(String),
    /// A file below something that is not a directory.
    #[error("archive path {path:?} needs {parent:?} to be a directory, but it is not")]
    NotADirectory {
        /// The entry being added.
        path: String,
        /// Its parent that is a file or link.
        parent: String,
    },
}

/// An initramfs under construction.
#[derive(Debug, Default, Clone)]
pub struct Archive {
    entries: BTreeMap<String, Entry>,
}

/// `/usr/bin/x` → `usr/bin/x`; refuses `.`, `..` and empty components.
fn clean(path: &str) -> Result<String, CpioError> {
    let trimmed = path.trim_start_matches('/').trim_end_matches('/');
    if trimmed.is_empty()
        || trimmed
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(CpioError::BadPath(path.to_string()));
    }
    Ok(trimmed.to_string())
}

impl Archive {
    /// An empty archive.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add an entry at `path` (leading `/` optional), creating missing parent directories
    /// (0755). Adding the same entry twice is fine; a different one at the same path is not,
    /// except that a file may replace a file (later `--extra` files override defaults).
    pub fn add(&mut self, path: &str, perm: u32, content: Content) -> Result<(), CpioError> {
        let path = clean(path)?;
        let mut parent = String::new();
        for comp in path
            .split('/')
            .collect::<Vec<_>>()
            .split_last()
            .map_or(&[][..], |(_, p)| p)
        {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(comp);
            match self.entries.get(&parent) {
                Some(Entry {
                    content: Content::Dir,
                    ..
                }) => {}
                Some(_) => {
                    return Err(CpioError::NotADirectory {
                        path,
                        parent: parent.clone(),
                    })
                }
                None => {
                    self.entries.insert(
                        parent.clone(),
                        Entry {
                            perm: 0o755,
                            content: Content::Dir,
                        },
                    );
                }
            }
        }
        let entry = Entry {
            perm: perm & 0o7777,
            content,
        };
        match self.entries.get(&path) {
            None => {}
            Some(old) if *old == entry => return Ok(()),
            Some(old) if is_file(&old.content) && is_file(&entry.content) => {}
            // An explicit directory entry may set the mode of an implied one.
            Some(Entry {
                content: Content::Dir,
                ..
            }) if entry.content == Content::Dir => {}
            Some(_) => return Err(CpioError::Conflict(path)),
        }
        self.entries.insert(path, entry);
        Ok(())
    }

    /// A directory.
    pub fn dir(&mut self, path: &str, perm: u32) -> Result<(), CpioError> {
        self.add(path, perm, Content::Dir)
    }

    /// A regular file from bytes.
    pub fn bytes(
        &mut self,
        path: &str,
        perm: u32,
        data: impl Into<Vec<u8>>,
    ) -> Result<(), CpioError> {
        self.add(path, perm, Content::Bytes(data.into()))
    }

    /// A regular file copied from the host when the archive is written.
    pub fn file(
        &mut self,
        path: &str,
        perm: u32,
        src: impl Into<PathBuf>,
    ) -> Result<(), CpioError> {
        self.add(path, perm, Content::File(src.into()))
    }

    /// A symbolic link.
    pub fn symlink(&mut self, path: &str, target: &str) -> Result<(), CpioError> {
        self.add(path, 0o777, Content::Symlink(target.to_string()))
    }

    /// Whether `path` is in the archive.
    pub fn contains(&self, path: &str) -> bool {
        clean(path).is_ok_and(|p| self.entries.contains_key(&p))
    }

    /// Entries in archive order.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &Entry)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Write the archive (uncompressed newc, with the trailer).
    pub fn write_to<W: Write>(&self, w: &mut W) -> io::Result<()> {
        let mut out = Counter { inner: w, n: 0 };
        for (ino, (path, entry)) in self.entries.iter().enumerate() {
            let ino = u32::try_from(ino + 1).map_err(|_| io::Error::other("too many entries"))?;
            let (kind, nlink, data, rdev): (u32, u32, Cow<'_, [u8]>, (u32, u32)) =
                match &entry.content {
                    Content::Dir => (S_IFDIR, 2, Cow::Borrowed(&[][..]), (0, 0)),
                    Content::Bytes(b) => (S_IFREG, 1, Cow::Borrowed(&b[..]), (0, 0)),
                    Content::File(src) => {
                        let b = std::fs::read(src).map_err(|e| {
                            io::Error::new(e.kind(), format!("reading {}: {e}", src.display()))
                        })?;
                        (S_IFREG, 1, Cow::Owned(b), (0, 0))
                    }
                    Content::Symlink(t) => (S_IFLNK, 1, Cow::Borrowed(t.as_bytes()), (0, 0)),
                    Content::CharDev(ma, mi) => (S_IFCHR, 1, Cow::Borrowed(&[][..]), (*ma, *mi)),
                };
            header(&mut out, ino, kind | entry.perm, nlink, &data, rdev, path)?;
            out.write_all(&data)?;
            pad(&mut out)?;
        }
        header(&mut out, 0, 0, 1, &[], (0, 0), "TRAILER!!!")?;
        out.flush()
    }
}

fn is_file(c: &Content) -> bool {
    matches!(c, Content::Bytes(_) | Content::File(_))
}

struct Counter<'a, W: Write> {
    inner: &'a mut W,
    n: u64,
}

impl<W: Write> Write for Counter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let k = self.inner.write(buf)?;
        self.n += k as u64;
        Ok(k)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn pad<W: Write>(w: &mut Counter<'_, W>) -> io::Result<()> {
    let rem = (4 - (w.n % 4) as usize) % 4;
    w.write_all(&[0u8; 3][..rem])
}

fn header<W: Write>(
    w: &mut Counter<'_, W>,
    ino: u32,
    mode: u32,
    nlink: u32,
    data: &[u8],
    rdev: (u32, u32),
    name: &str,
) -> io::Result<()> {
    let size = u32::try_from(data.len()).map_err(|_| {
        io::Error::other(format!(
            "{name}: larger than 4 GiB, cpio newc cannot hold it"
        ))
    })?;
    let namesize = u32::try_from(name.len() + 1).map_err(|_| io::Error::other("name too long"))?;
    // magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor, devminor, rdevmajor,
    // rdevminor, namesize, check.
    let fields = [
        ino, mode, 0, 0, nlink, 0, size, 0, 0, rdev.0, rdev.1, namesize, 0,
    ];
    let mut h = String::with_capacity(110);
    h.push_str("070701");
    for f in fields {
        h.push_str(&format!("{f:08X}"));
    }
    w.write_all(h.as_bytes())?;
    w.write_all(name.as_bytes())?;
    w.write_all(&[0])?;
    pad(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(buf: &[u8]) -> Vec<(String, u32, u32, Vec<u8>)> {
        let mut out = Vec::new();
        let mut pos = 0;
        loop {
            let h = std::str::from_utf8(&buf[pos..pos + 110]).expect("ascii header");
            assert_eq!(&h[..6], "070701");
            let field = |i: usize| u32::from_str_radix(&h[6 + i * 8..14 + i * 8], 16).expect("hex");
            let (ino, mode, size, namesize) = (field(0), field(1), field(6), field(11));
            assert_eq!(field(5), 0, "mtime");
            assert_eq!((field(2), field(3)), (0, 0), "uid/gid");
            let name_start = pos + 110;
            let name = std::str::from_utf8(&buf[name_start..name_start + namesize as usize - 1])
                .expect("name")
                .to_string();
            let mut p = name_start + namesize as usize;
            p = p.div_ceil(4) * 4;
            let data = buf[p..p + size as usize].to_vec();
            p += size as usize;
            pos = p.div_ceil(4) * 4;
            if name == "TRAILER!!!" {
                assert_eq!(pos, buf.len());
                return out;
            }
            out.push((name, ino, mode, data));
        }
    }

    #[test]
    fn sorted_parents_first_and_deterministic() {
        let mut a = Archive::new();
        a.bytes("/usr/bin/tool", 0o755, b"hello".to_vec())
            .expect("add");
        a.symlink("bin/sh", "/bin/busybox").expect("add");
        a.add("dev/console", 0o600, Content::CharDev(5, 1))
            .expect("add");
        a.dir("tmp", 0o1777).expect("add");
        let mut b = Archive::new();
        b.dir("tmp", 0o1777).expect("add");
        b.add("dev/console", 0o600, Content::CharDev(5, 1))
            .expect("add");
        b.symlink("bin/sh", "/bin/busybox").expect("add");
        b.bytes("usr/bin/tool", 0o755, b"hello".to_vec())
            .expect("add");
        let (mut x, mut y) = (Vec::new(), Vec::new());
        a.write_to(&mut x).expect("write");
        b.write_to(&mut y).expect("write");
        assert_eq!(x, y, "insertion order must not matter");
        let entries = parse(&x);
        let names: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "bin",
                "bin/sh",
                "dev",
                "dev/console",
                "tmp",
                "usr",
                "usr/bin",
                "usr/bin/tool"
            ]
        );
        let inos: Vec<u32> = entries.iter().map(|e| e.1).collect();
        assert_eq!(inos, (1..=8).collect::<Vec<_>>());
        assert_eq!(entries[1].2, S_IFLNK | 0o777);
        assert_eq!(entries[1].3, b"/bin/busybox");
        assert_eq!(entries[4].2, S_IFDIR | 0o1777);
        assert_eq!(entries[7].2, S_IFREG | 0o755);
        assert_eq!(entries[7].3, b"hello");
    }

    #[test]
    fn refuses_bad_paths_and_conflicts() {
        let mut a = Archive::new();
        assert!(matches!(
            a.bytes("a/../b", 0o644, vec![]),
            Err(CpioError::BadPath(_))
        ));
        assert!(matches!(
            a.bytes("/", 0o644, vec![]),
            Err(CpioError::BadPath(_))
        ));
        a.bytes("f", 0o644, vec![1]).expect("add");
        assert!(matches!(
            a.bytes("f/g", 0o644, vec![]),
            Err(CpioError::NotADirectory { .. })
        ));
        assert!(matches!(a.symlink("f", "x"), Err(CpioError::Conflict(_))));
        a.bytes("f", 0o600, vec![2])
            .expect("a file may replace a file");
        a.dir("d", 0o700).expect("add");
        a.dir("d", 0o755).expect("a dir may be re-declared");
    }

    #[test]
    fn file_content_is_read_at_write_time() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("x");
        std::fs::write(&src, b"abc").expect("write");
        let mut a = Archive::new();
        a.file("x", 0o644, &src).expect("add");
        let mut out = Vec::new();
        a.write_to(&mut out).expect("write");
        assert_eq!(parse(&out)[0].3, b"abc");
        assert_eq!(out.len() % 4, 0);
    }
}
