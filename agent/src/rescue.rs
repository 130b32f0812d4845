//! `finalize_rescue`: give the ramdisk a `rescue` login whose password the operator chose.
//!
//! Only the SHA-512 crypt hash of the password reaches the agent. It is written into the
//! `passwd` and `shadow` files of a *rescue root*: `/` when the agent is the ramdisk's init
//! (the ramdisk is throw-away and this is the only way in), otherwise a directory the operator
//! configured (`--rescue-root`). A developer's `rivet-agent run` therefore never touches the
//! host's own accounts: without a configured directory the command fails and says so.

use std::io::Write;
use std::path::{Path, PathBuf};

/// The login the rescue password belongs to (Ironic's name).
pub const RESCUE_USER: &str = "rescue";

/// Where the rescue login is written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RescueRoot {
    /// Nowhere: a local agent without `--rescue-root` refuses `finalize_rescue`.
    #[default]
    Refuse,
    /// `<dir>/etc/passwd` and `<dir>/etc/shadow`.
    Dir(PathBuf),
}

impl RescueRoot {
    /// The root for this process: `/` only when it owns the machine (the ramdisk's init or
    /// its worker); else the configured directory, if any.
    pub fn choose(owns_machine: bool, configured: Option<PathBuf>) -> RescueRoot {
        match (configured, owns_machine) {
            (Some(d), _) => RescueRoot::Dir(d),
            (None, true) => RescueRoot::Dir(PathBuf::from("/")),
            (None, false) => RescueRoot::Refuse,
        }
    }
}

/// Why the rescue login could not be set.
#[derive(Debug, thiserror::Error)]
pub enum RescueError {
    /// Not the ramdisk and no directory configured.
    #[error("this agent is not the ramdisk's init and has no --rescue-root directory; refusing to change the host's accounts")]
    NoRoot,
    /// The hash is not a SHA-512 or SHA-256 crypt string.
    #[error("rescue_password_hash is not a SHA-512 or SHA-256 crypt hash ($6$... or $5$...)")]
    BadHash,
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RescueError + '_ {
    move |source| RescueError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// A SHA-512 or SHA-256 crypt string (`$6$[rounds=N$]salt$hash`, `$5$…`: rivetd sends the
/// first, a stock Ironic the second by default), crypt's alphabet only (no `:` or newline
/// can reach the shadow file).
fn valid_hash(h: &str) -> bool {
    (h.starts_with("$6$") || h.starts_with("$5$"))
        && h.len() < 256
        && h.split('$').count() >= 4
        && h.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '$' | '.' | '/' | '='))
}

/// Replace the line of `user` in a colon-separated account file (or add it), keeping every
/// other line as it was.
fn upsert(text: &str, user: &str, line: &str) -> String {
    let mut out = String::new();
    let mut found = false;
    for l in text.lines() {
        if l.split(':').next() == Some(user) {
            if !found {
                out.push_str(line);
                out.push('\n');
                found = true;
            }
        } else {
            out.push_str(l);
            out.push('\n');
        }
    }
    if !found {
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Write `text` to `path` through a temporary file and a rename, with `mode`.
fn replace_file(path: &Path, text: &str, mode: u32) -> Result<(), RescueError> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("rivet-tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io(&tmp))?;
    f.write_all(text.as_bytes()).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// Set the `rescue` user's password hash under `root`. Returns the files written.
pub fn finalize(root: &RescueRoot, hash: &str) -> Result<Vec<PathBuf>, RescueError> {
    let RescueRoot::Dir(dir) = root else {
        return Err(RescueError::NoRoot);
    };
    if !valid_hash(hash) {
        return Err(RescueError::BadHash);
    }
    let etc = dir.join("etc");
    std::fs::create_dir_all(&etc).map_err(io(&etc))?;
    let passwd = etc.join("passwd");
    let shadow = etc.join("shadow");
    let read = |p: &Path| match std::fs::read_to_string(p) {
        Ok(t) => Ok(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(io(p)(e)),
    };
    let home = format!("/home/{RESCUE_USER}");
    let p = upsert(
        &read(&passwd)?,
        RESCUE_USER,
        &format!("{RESCUE_USER}:x:0:0:rescue user:{home}:/bin/sh"),
    );
    // Days since the epoch of the last change, as shadow(5) wants.
    let days = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() / 86400)
        .unwrap_or(0);
    let s = upsert(
        &read(&shadow)?,
        RESCUE_USER,
        &format!("{RESCUE_USER}:{hash}:{days}:0:99999:7:::"),
    );
    replace_file(&passwd, &p, 0o644)?;
    replace_file(&shadow, &s, 0o600)?;
    let _ = std::fs::create_dir_all(dir.join(home.trim_start_matches('/')));
    Ok(vec![passwd, shadow])
}

/// The consoles to offer a login on, from the kernel command line (`console=ttyS0,115200`),
/// else `ttyS0` and `tty1`: `(device, baud)`.
pub fn consoles(cmdline: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = cmdline
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("console="))
        .map(|c| {
            let (dev, rest) = c.split_once(',').unwrap_or((c, "115200"));
            let baud: String = rest.chars().take_while(char::is_ascii_digit).collect();
            let baud = if baud.is_empty() {
                "115200".into()
            } else {
                baud
            };
            (dev.to_string(), baud)
        })
        .filter(|(d, _)| !d.is_empty() && d.chars().all(|c| c.is_ascii_alphanumeric()))
        .collect();
    if out.is_empty() {
        out = vec![
            ("ttyS0".into(), "115200".into()),
            ("tty1".into(), "38400".into()),
        ];
    }
    out
}

/// Set once this ramdisk is in rescue: the controller stops accepting its token then, and the
/// agent must neither look up again nor discover (a known machine's discovery answer is
/// "power off", which would end the rescue). The ramdisk stays up for the rescue user.
static IN_RESCUE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this process finalized a rescue in the ramdisk (see [`start_logins`]).
pub fn in_rescue() -> bool {
    IN_RESCUE.load(std::sync::atomic::Ordering::SeqCst)
}

/// In the ramdisk (the agent owns the machine): start a login prompt on each console, so
/// the `rescue` user can log in; each prompt comes back after a logout. Returns the consoles
/// a prompt was started on. Never called for a local agent.
pub fn start_logins(root: &Path) -> Vec<String> {
    IN_RESCUE.store(true, std::sync::atomic::Ordering::SeqCst);
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let getty = ["sbin/getty", "bin/getty", "usr/sbin/getty"]
        .iter()
        .map(|p| root.join(p))
        .find(|p| p.exists());
    let Some(getty) = getty else {
        tracing::warn!(
            "no getty in the ramdisk: the rescue login is set but no console prompt offers it"
        );
        return Vec::new();
    };
    let mut started = Vec::new();
    for (dev, baud) in consoles(&cmdline) {
        if !Path::new("/dev").join(&dev).exists() {
            continue;
        }
        let script = format!(
            "while true; do {} -L {baud} {dev} vt100; sleep 1; done",
            getty.display()
        );
        match std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(script)
            .stdin(std::process::Stdio::null())
            .spawn()
        {
            Ok(_) => started.push(dev),
            Err(e) => tracing::warn!(console = %dev, error = %e, "cannot start a login prompt"),
        }
    }
    started
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh empty directory (removed by the caller's `Drop` guard).
    struct TmpDir(PathBuf);
    impl TmpDir {
        fn new(tag: &str) -> TmpDir {
            let d = std::env::temp_dir().join(format!(
                "rivet-rescue-{tag}-{}-{:?}",
                std::process::id(),
                std::time::SystemTime::now()
            ));
            std::fs::create_dir_all(&d).unwrap();
            TmpDir(d)
        }
        fn path(&self) -> &Path {
            &self.0
        }
    }
    impl Drop for TmpDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const HASH: &str = "$6$abcdefgh$ltjgWl6579NluT/Vi1nwEvcil.G5Nbc4NiXZaNGStk8PSwGfQv72N2CKPPrVACtLtip/cZ/1GM/O6IND4WQhG.";

    #[test]
    fn consoles_from_cmdline() {
        assert_eq!(
            consoles("root=x console=tty0 console=ttyS1,9600n8 quiet"),
            vec![
                ("tty0".to_string(), "115200".to_string()),
                ("ttyS1".to_string(), "9600".to_string())
            ]
        );
        assert_eq!(consoles("quiet").len(), 2);
        assert!(consoles("console=../etc/x").len() == 2);
    }

    #[test]
    fn local_agent_without_dir_refuses() {
        assert_eq!(RescueRoot::choose(false, None), RescueRoot::Refuse);
        assert!(matches!(
            finalize(&RescueRoot::Refuse, HASH),
            Err(RescueError::NoRoot)
        ));
        assert_eq!(
            RescueRoot::choose(true, None),
            RescueRoot::Dir(PathBuf::from("/"))
        );
    }

    #[test]
    fn writes_and_replaces_entries() {
        let dir = TmpDir::new("w");
        let etc = dir.path().join("etc");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(
            etc.join("shadow"),
            "root:*:1::::::\nrescue:$6$old$x:1:0:99999:7:::\n",
        )
        .unwrap();
        let root = RescueRoot::Dir(dir.path().into());
        finalize(&root, HASH).unwrap();
        let shadow = std::fs::read_to_string(etc.join("shadow")).unwrap();
        assert!(shadow.starts_with("root:*:1::::::\n"), "{shadow}");
        assert_eq!(shadow.matches("rescue:").count(), 1, "{shadow}");
        assert!(shadow.contains(&format!("rescue:{HASH}:")), "{shadow}");
        let passwd = std::fs::read_to_string(etc.join("passwd")).unwrap();
        assert!(passwd.starts_with("rescue:x:0:0:"), "{passwd}");
    }

    #[test]
    fn refuses_what_is_not_a_hash() {
        let dir = TmpDir::new("r");
        let root = RescueRoot::Dir(dir.path().into());
        // Ironic's default hash (SHA-256 crypt) as well as rivetd's.
        assert!(valid_hash(
            "$5$rounds=5000$saltsalt$Xk4Q2vCw0yE1Q9n7mA.bcdefgh/ijklmno"
        ));
        assert!(valid_hash(HASH));
        for bad in ["secret", "$1$abc$def", "$6$a$b:0:0", "$6$a$b\nroot::0"] {
            assert!(
                matches!(finalize(&root, bad), Err(RescueError::BadHash)),
                "{bad}"
            );
        }
        assert!(!dir.path().join("etc/shadow").exists());
    }
}
