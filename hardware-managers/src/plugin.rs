//! Exec plugins: executables in the plugin directory adapted into [`HardwareManager`]s, so
//! a vendor adds steps to the ramdisk without recompiling the agent. The protocol is in
//! `hardware-managers/PLUGINS.md`; in short `PLUGIN describe`, `PLUGIN steps` and
//! `PLUGIN execute` (request JSON on stdin) answer with JSON on stdout, report
//! `progress N/M [message]` lines on stderr, and exit 0 on success.
//!
//! Every call runs in its own process group with a time limit; on abort or timeout the
//! group gets SIGTERM, then SIGKILL after a grace period. Whatever a plugin does — crash,
//! hang, print garbage — the adapter returns an error that names the plugin and quotes
//! what it printed; it never panics and never blocks past the limits.

use crate::{HardwareManager, ManagerConfig, StepContext, StepError, SupportLevel};
use rivet_protocol::limits::{self, parse_strict};
use rivet_protocol::steps::StepDescriptor;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How much of a plugin's output an error message quotes.
const QUOTE_CHARS: usize = 200;
/// Stored stdout cap: a plugin that floods stdout cannot exhaust the ramdisk's memory.
const STDOUT_CAP: usize = 16 << 20;
/// Stored stderr tail.
const STDERR_TAIL: usize = 4096;
/// Poll interval while waiting for a plugin (bounds abort latency).
const POLL: Duration = Duration::from_millis(20);

/// What went wrong talking to a plugin.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The executable could not be started.
    #[error("plugin {plugin}: cannot run {path}: {source}")]
    Spawn {
        /// Plugin (file) name.
        plugin: String,
        /// Executable path.
        path: String,
        /// OS error.
        source: std::io::Error,
    },
    /// No answer within the time limit.
    #[error(
        "plugin {plugin}: `{call}` timed out after {secs} s and was killed; it printed: {output:?}"
    )]
    Timeout {
        /// Plugin name.
        plugin: String,
        /// `describe`, `steps` or `execute <step>`.
        call: String,
        /// The limit.
        secs: f64,
        /// First characters of its output.
        output: String,
    },
    /// Exited non-zero or was killed by a signal.
    #[error("plugin {plugin}: `{call}` failed ({status}): {stderr}")]
    Exit {
        /// Plugin name.
        plugin: String,
        /// Which call.
        call: String,
        /// Exit code or signal.
        status: String,
        /// Tail of stderr (or first characters of stdout when stderr is empty).
        stderr: String,
    },
    /// Exit 0 but the output is not what the protocol says.
    #[error("plugin {plugin}: `{call}` printed invalid output ({reason}): {output:?}")]
    BadOutput {
        /// Plugin name.
        plugin: String,
        /// Which call.
        call: String,
        /// Parse error.
        reason: String,
        /// First characters of stdout.
        output: String,
    },
    /// Cancelled by an abort; the plugin was terminated.
    #[error("plugin {plugin}: `{call}` aborted")]
    Aborted {
        /// Plugin name.
        plugin: String,
        /// Which call.
        call: String,
    },
}

impl From<PluginError> for StepError {
    fn from(e: PluginError) -> Self {
        match e {
            PluginError::Aborted { .. } => StepError::Aborted,
            other => StepError::Failed(other.to_string()),
        }
    }
}

/// First [`QUOTE_CHARS`] characters of some output, lossily decoded and trimmed.
fn quote(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    let s = s.trim();
    let mut out: String = s.chars().take(QUOTE_CHARS).collect();
    if s.chars().count() > QUOTE_CHARS {
        out.push('…');
    }
    out
}

/// Parse a `progress N/M [message]` stderr line.
pub fn parse_progress(line: &str) -> Option<(u64, u64, String)> {
    let rest = line.trim().strip_prefix("progress ")?;
    let (frac, msg) = rest.split_once(' ').unwrap_or((rest, ""));
    let (n, m) = frac.split_once('/')?;
    Some((n.parse().ok()?, m.parse().ok()?, msg.trim().to_string()))
}

fn describe_status(s: ExitStatus) -> String {
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(sig)) => format!(
            "killed by signal {sig}{}",
            if s.core_dumped() { ", core dumped" } else { "" }
        ),
        _ => s.to_string(),
    }
}

/// Send `sig` to the plugin's process group (ESRCH — already gone — is fine).
fn signal_group(pgid: u32, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pgid) {
        // SAFETY: kill(2) has no memory-safety preconditions; a negative pid addresses the
        // process group the adapter created for this call.
        unsafe {
            libc::kill(-pid, sig);
        }
    }
}

/// What one call produced.
struct CallOutput {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr_tail: String,
}

/// Limits of one call.
struct Limits<'a> {
    timeout: Duration,
    grace: Duration,
    /// Cancellation, honoured only for abortable steps.
    cancel: Option<&'a StepContext>,
    /// Where progress lines go.
    progress: Option<&'a StepContext>,
}

fn run_call(
    path: &Path,
    plugin: &str,
    args: &[&str],
    stdin: Option<Vec<u8>>,
    limits: &Limits<'_>,
) -> Result<CallOutput, PluginError> {
    let call = args.join(" ");
    let mut child = Command::new(path)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Own process group, so a timeout or abort also reaches the plugin's children
        // (`sleep`, flash tools) and no grandchild keeps our pipes open.
        .process_group(0)
        .spawn()
        .map_err(|source| PluginError::Spawn {
            plugin: plugin.into(),
            path: path.display().to_string(),
            source,
        })?;
    let pgid = child.id();
    let writer = match (child.stdin.take(), stdin) {
        (Some(mut w), Some(data)) => Some(std::thread::spawn(move || {
            // EPIPE if the plugin does not read its request: not our failure to report.
            let _ = w.write_all(&data);
        })),
        _ => None,
    };
    let stdout_reader = child.stdout.take().map(|mut r| {
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            let mut buf = [0u8; 8192];
            loop {
                match r.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let room = STDOUT_CAP.saturating_sub(kept.len());
                        kept.extend_from_slice(&buf[..n.min(room)]);
                    }
                }
            }
            kept
        })
    });
    let tail = Arc::new(Mutex::new(String::new()));
    let stderr_reader = child.stderr.take().map(|r| {
        let tail = Arc::clone(&tail);
        let progress = limits.progress.cloned();
        let plugin = plugin.to_string();
        std::thread::spawn(move || {
            let mut r = BufReader::new(r);
            let mut line = Vec::new();
            loop {
                line.clear();
                match r.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                let text = String::from_utf8_lossy(&line);
                let text = text.trim_end();
                if let (Some(ctx), Some((n, m, msg))) = (&progress, parse_progress(text)) {
                    ctx.set_progress(n, m, msg);
                    continue;
                }
                tracing::debug!(plugin = %plugin, line = %text, "plugin stderr");
                if let Ok(mut t) = tail.lock() {
                    t.push_str(text);
                    t.push('\n');
                    if t.len() > STDERR_TAIL {
                        let mut cut = t.len() - STDERR_TAIL;
                        while !t.is_char_boundary(cut) {
                            cut += 1;
                        }
                        t.drain(..cut);
                    }
                }
            }
        })
    });

    let started = Instant::now();
    // Some(reason) when we had to stop it.
    let mut stopped: Option<bool> = None; // Some(true) = aborted, Some(false) = timed out
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) => {}
            Err(_) => {
                // Cannot poll: kill and reap, report as a timeout-style failure.
                stopped = Some(false);
            }
        }
        let aborted = limits.cancel.is_some_and(|c| c.is_cancelled());
        if stopped.is_none() && (aborted || started.elapsed() >= limits.timeout) {
            stopped = Some(aborted);
        }
        if stopped.is_some() {
            signal_group(pgid, libc::SIGTERM);
            let term_at = Instant::now();
            let s = loop {
                if let Ok(Some(s)) = child.try_wait() {
                    break Some(s);
                }
                if term_at.elapsed() >= limits.grace {
                    break None;
                }
                std::thread::sleep(POLL);
            };
            match s {
                Some(s) => break s,
                None => {
                    signal_group(pgid, libc::SIGKILL);
                    match child.wait() {
                        Ok(s) => break s,
                        Err(_) => break ExitStatus::from_raw(libc::SIGKILL),
                    }
                }
            }
        }
        std::thread::sleep(POLL);
    };
    // The plugin is done: whatever it left running in its group goes too.
    signal_group(pgid, libc::SIGKILL);
    if let Some(w) = writer {
        let _ = w.join();
    }
    let stdout = stdout_reader
        .and_then(|h| h.join().ok())
        .unwrap_or_default();
    if let Some(h) = stderr_reader {
        let _ = h.join();
    }
    let stderr_tail = tail.lock().map(|t| t.clone()).unwrap_or_default();
    match stopped {
        Some(true) => Err(PluginError::Aborted {
            plugin: plugin.into(),
            call,
        }),
        Some(false) => Err(PluginError::Timeout {
            plugin: plugin.into(),
            call,
            secs: limits.timeout.as_secs_f64(),
            output: quote(if stdout.is_empty() {
                stderr_tail.as_bytes()
            } else {
                &stdout
            }),
        }),
        None => Ok(CallOutput {
            status,
            stdout,
            stderr_tail,
        }),
    }
}

/// Exit non-zero → [`PluginError::Exit`] with the stderr tail.
fn check_status(plugin: &str, call: &str, out: &CallOutput) -> Result<(), PluginError> {
    if out.status.success() {
        return Ok(());
    }
    let tail = out.stderr_tail.trim();
    let stderr = if tail.is_empty() {
        format!("no stderr; stdout: {:?}", quote(&out.stdout))
    } else {
        // The end of stderr is where the reason usually is.
        let start = tail
            .char_indices()
            .rev()
            .nth(499)
            .map(|(i, _)| i)
            .unwrap_or(0);
        tail[start..].to_string()
    };
    Err(PluginError::Exit {
        plugin: plugin.into(),
        call: call.into(),
        status: describe_status(out.status),
        stderr,
    })
}

fn parse_json<T: for<'de> Deserialize<'de>>(
    plugin: &str,
    call: &str,
    stdout: &[u8],
) -> Result<T, PluginError> {
    serde_json::from_slice(stdout).map_err(|e| PluginError::BadOutput {
        plugin: plugin.into(),
        call: call.into(),
        reason: e.to_string(),
        output: quote(stdout),
    })
}

/// `describe` answer.
#[derive(Debug, Deserialize)]
struct Describe {
    name: String,
    support_level: u8,
    #[serde(default)]
    version: Option<String>,
}

/// What a plugin's `describe` says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Description {
    /// Manager name (not blank).
    pub name: String,
    /// Support level.
    pub level: SupportLevel,
    /// Version (`1.0` when the plugin gives none).
    pub version: String,
}

/// Parse the stdout of `PLUGIN describe` (`file_name` names the plugin in errors).
pub fn parse_describe(file_name: &str, stdout: &[u8]) -> Result<Description, PluginError> {
    let d: Describe = parse_json(file_name, "describe", stdout)?;
    let bad = |reason: String| PluginError::BadOutput {
        plugin: file_name.into(),
        call: "describe".into(),
        reason,
        output: quote(stdout),
    };
    if d.name.trim().is_empty() {
        return Err(bad("empty \"name\"".into()));
    }
    let level = match d.support_level {
        0 => SupportLevel::None,
        1 => SupportLevel::Generic,
        2 => SupportLevel::Mainline,
        3 => SupportLevel::Vendor,
        n => return Err(bad(format!("support_level {n} is not 0-3"))),
    };
    Ok(Description {
        name: d.name,
        level,
        version: d.version.unwrap_or_else(|| "1.0".into()),
    })
}

/// Parse the stdout of `PLUGIN steps`.
pub fn parse_steps(plugin: &str, stdout: &[u8]) -> Result<Vec<StepDescriptor>, PluginError> {
    parse_json(plugin, "steps", stdout)
}

/// Parse the stdout of `PLUGIN execute` for `call` (`execute STEP`); empty output is a null
/// result. The result travels to the controller inside a heartbeat, so it is held to
/// [`limits::Limits::STEP_RESULT`]: output the controller would refuse fails the step here,
/// with the reason, instead of leaving the agent resending a heartbeat that is never accepted.
pub fn parse_execute_output(plugin: &str, call: &str, stdout: &[u8]) -> Result<Value, PluginError> {
    if stdout.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    parse_strict(stdout, &limits::Limits::STEP_RESULT).map_err(|e| PluginError::BadOutput {
        plugin: plugin.into(),
        call: call.into(),
        reason: e.to_string(),
        output: quote(stdout),
    })
}

/// An exec plugin adapted into a [`HardwareManager`]. Its description and steps are read
/// once at load time; each `execute` is one process.
#[derive(Debug, Clone)]
pub struct ExecPlugin {
    path: PathBuf,
    name: String,
    version: String,
    level: SupportLevel,
    steps: Vec<StepDescriptor>,
    describe_timeout: Duration,
    execute_timeout: Duration,
    grace: Duration,
}

impl ExecPlugin {
    /// Run `describe` and `steps`; any failure is an error naming the plugin.
    pub fn load(path: &Path, cfg: &ManagerConfig) -> Result<ExecPlugin, PluginError> {
        let file_name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string());
        let limits = Limits {
            timeout: cfg.plugin_describe_timeout,
            grace: cfg.plugin_kill_grace.min(cfg.plugin_describe_timeout),
            cancel: None,
            progress: None,
        };
        let out = run_call(path, &file_name, &["describe"], None, &limits)?;
        check_status(&file_name, "describe", &out)?;
        let d = parse_describe(&file_name, &out.stdout)?;
        let name = d.name;
        let out = run_call(path, &name, &["steps"], None, &limits)?;
        check_status(&name, "steps", &out)?;
        let steps = parse_steps(&name, &out.stdout)?;
        Ok(ExecPlugin {
            path: path.to_path_buf(),
            name,
            version: d.version,
            level: d.level,
            steps,
            describe_timeout: cfg.plugin_describe_timeout,
            execute_timeout: cfg.plugin_execute_timeout,
            grace: cfg.plugin_kill_grace,
        })
    }

    /// Executable path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Time limit for `describe`/`steps`.
    pub fn describe_timeout(&self) -> Duration {
        self.describe_timeout
    }
}

/// Load every executable regular file in `dir` (sorted by name; hidden files and editor
/// backups ignored). A plugin that fails to load is skipped with a warning.
pub fn load_dir(dir: &Path, cfg: &ManagerConfig) -> Vec<ExecPlugin> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        tracing::debug!(dir = %dir.display(), "no plugin directory");
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = rd
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            !n.starts_with('.') && !n.ends_with('~')
        })
        .map(|e| e.path())
        .filter(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for p in paths {
        match ExecPlugin::load(&p, cfg) {
            Ok(plugin) => {
                tracing::info!(plugin = %plugin.name, path = %p.display(), steps = plugin.steps.len(), "loaded exec plugin");
                out.push(plugin);
            }
            Err(e) => tracing::warn!(path = %p.display(), error = %e, "skipping exec plugin"),
        }
    }
    out
}

impl HardwareManager for ExecPlugin {
    fn name(&self) -> &str {
        &self.name
    }

    fn version(&self) -> &str {
        &self.version
    }

    fn evaluate_support(&self) -> SupportLevel {
        self.level
    }

    fn steps(&self) -> Vec<StepDescriptor> {
        self.steps.clone()
    }

    fn execute(
        &self,
        step: &str,
        args: &Map<String, Value>,
        ctx: &StepContext,
    ) -> Result<Value, StepError> {
        let desc = self
            .steps
            .iter()
            .find(|s| s.step == step)
            .ok_or_else(|| StepError::UnknownStep(step.into()))?;
        let timeout = match args.get("timeout_s") {
            None => self.execute_timeout,
            Some(v) => match v.as_f64() {
                Some(s) if s > 0.0 && s.is_finite() => Duration::from_secs_f64(s),
                _ => {
                    return Err(StepError::BadArgument {
                        name: "timeout_s".into(),
                        reason: "expected a positive number of seconds".into(),
                    })
                }
            },
        };
        let call = format!("execute {step}");
        let request = json!({"step": step, "args": args}).to_string().into_bytes();
        let limits = Limits {
            timeout,
            grace: self.grace,
            // A step advertised `abortable: false` (firmware flashing) is never interrupted:
            // the abort takes effect when it ends.
            cancel: desc.abortable.then_some(ctx),
            progress: Some(ctx),
        };
        let out = run_call(&self.path, &self.name, &["execute"], Some(request), &limits).map_err(
            |e| match e {
                PluginError::Aborted { plugin, .. } => PluginError::Aborted {
                    plugin,
                    call: call.clone(),
                },
                PluginError::Timeout {
                    plugin,
                    secs,
                    output,
                    ..
                } => PluginError::Timeout {
                    plugin,
                    call: call.clone(),
                    secs,
                    output,
                },
                other => other,
            },
        )?;
        check_status(&self.name, &call, &out)?;
        Ok(parse_execute_output(&self.name, &call, &out.stdout)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines() {
        assert_eq!(parse_progress("progress 1/3"), Some((1, 3, String::new())));
        assert_eq!(
            parse_progress("progress 2/3 flashing bank B\n"),
            Some((2, 3, "flashing bank B".into()))
        );
        assert_eq!(parse_progress("progress x/3"), None);
        assert_eq!(parse_progress("progressive"), None);
    }

    #[test]
    fn quote_truncates() {
        let long = "x".repeat(500);
        let q = quote(long.as_bytes());
        assert_eq!(q.chars().count(), QUOTE_CHARS + 1);
        assert_eq!(quote(b"  hi \n"), "hi");
    }

    #[test]
    fn describe_and_steps_output() {
        let d = parse_describe("p", br#"{"name": "acme", "support_level": 3}"#).expect("accepted");
        assert_eq!(
            (d.name.as_str(), d.level, d.version.as_str()),
            ("acme", SupportLevel::Vendor, "1.0")
        );
        let e = parse_describe("p", br#"{"name": " ", "support_level": 3}"#).expect_err("refused");
        assert!(e.to_string().contains("empty \"name\""), "{e}");
        let e = parse_describe("p", br#"{"name": "a", "support_level": 9}"#).expect_err("refused");
        assert!(e.to_string().contains("support_level 9 is not 0-3"), "{e}");
        assert!(parse_steps("p", b"[]").expect("accepted").is_empty());
        assert!(parse_steps("p", b"nope").is_err());
    }

    // Regression: a plugin's step output nested deeper than the controller accepts in a
    // heartbeat left the agent resending a result that was refused every time; it is now a
    // failed step that says why.
    #[test]
    fn execute_output_within_heartbeat_limits() {
        assert_eq!(
            parse_execute_output("p", "execute s", b" \n").expect("accepted"),
            Value::Null
        );
        let ok = parse_execute_output("p", "execute s", br#"{"flashed": ["bank a"]}"#)
            .expect("accepted");
        assert_eq!(ok, json!({"flashed": ["bank a"]}));
        let deep = format!("{}{}", "[".repeat(40), "]".repeat(40));
        let e = parse_execute_output("p", "execute s", deep.as_bytes()).expect_err("refused");
        let m = e.to_string();
        assert!(
            m.contains("plugin p: `execute s` printed invalid output"),
            "{m}"
        );
        assert!(m.contains("nested deeper than 32 levels"), "{m}");
    }
}
