//! Real BMC peers for the driver tests, started on loopback ports and killed on drop:
//!
//! - [`Sushy`]: the sushy-tools Redfish emulator (fake driver, no libvirt) from the venv
//!   `.venv-sushy` that `scripts/setup-peers.sh` makes; optional htpasswd (bcrypt) basic auth
//!   and TLS; a fresh state directory each time.
//! - [`IpmiSim`]: OpenIPMI's `ipmi_sim` with a lan.conf, sim.emu and a chassis_control
//!   script that keeps power and boot device in files the test reads.
//! - [`RedfishMock`]: an in-tree Redfish service (axum) serving exactly what sushy's fake
//!   driver does not: BIOS (sushy: 501), Processors (501), UpdateService.SimpleUpdate (500)
//!   with a task that completes after N polls, SessionService, and error bodies with
//!   `@Message.ExtendedInfo`.
//! - [`FileServer`]: a tiny HTTP server for virtual media images; [`TlsFiles`]: a CA and a
//!   server certificate for 127.0.0.1 made with the openssl CLI.

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};
use std::io::{Read, Write};
use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Whether `name` is an executable on PATH.
pub fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false)
}

/// A loopback TCP port with nothing listening (bound, then released).
pub fn closed_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// A free loopback UDP port.
pub fn free_udp_port() -> Result<u16> {
    let s = UdpSocket::bind("127.0.0.1:0")?;
    Ok(s.local_addr()?.port())
}

/// A child process killed (and reaped) on drop.
pub struct ChildGuard {
    child: Option<Child>,
    what: &'static str,
}

impl ChildGuard {
    fn new(child: Child, what: &'static str) -> ChildGuard {
        ChildGuard {
            child: Some(child),
            what,
        }
    }

    /// Whether the process has exited already.
    pub fn exited(&mut self) -> bool {
        matches!(
            self.child.as_mut().map(|c| c.try_wait()),
            Some(Ok(Some(_))) | None
        )
    }

    /// Its process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            eprintln!("stopped {} (pid {})", self.what, c.id());
        }
    }
}

fn wait_until(timeout: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

// ---------------------------------------------------------------- sushy-emulator

/// The venv holding sushy-tools (`RIVET_SUSHY_VENV` overrides).
pub fn sushy_venv() -> PathBuf {
    std::env::var_os("RIVET_SUSHY_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv-sushy"))
}

/// Whether sushy-emulator is installed.
pub fn have_sushy() -> bool {
    sushy_venv().join("bin/sushy-emulator").is_file()
}

/// A fake system for the emulator.
#[derive(Debug, Clone)]
pub struct FakeSystem {
    /// UUID (the Redfish system id).
    pub uuid: String,
    /// Name (an alias; the emulator redirects it to the UUID).
    pub name: String,
    /// `On` or `Off`.
    pub power_state: String,
    /// NIC MACs.
    pub macs: Vec<String>,
}

impl FakeSystem {
    /// A powered-off system with one NIC.
    pub fn new(name: &str, mac: &str) -> FakeSystem {
        FakeSystem {
            uuid: new_uuid(),
            name: name.into(),
            power_state: "Off".into(),
            macs: vec![mac.into()],
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "uuid": self.uuid,
            "name": self.name,
            "power_state": self.power_state,
            "external_notifier": false,
            "nics": self.macs.iter().map(|m| json!({"mac": m, "ip": "127.0.0.1"})).collect::<Vec<_>>(),
        })
    }
}

/// A random UUID (v4 layout) without another dependency.
pub fn new_uuid() -> String {
    let mut b = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut b);
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// How to start the emulator.
#[derive(Debug, Clone, Default)]
pub struct SushyOptions {
    /// Systems it serves.
    pub systems: Vec<FakeSystem>,
    /// Basic-auth user and password (htpasswd with a bcrypt hash).
    pub auth: Option<(String, String)>,
    /// Serve HTTPS with this certificate and key.
    pub tls: Option<(PathBuf, PathBuf)>,
}

/// A running sushy-emulator.
pub struct Sushy {
    guard: ChildGuard,
    /// `http(s)://127.0.0.1:PORT`.
    pub url: String,
    /// Its port.
    pub port: u16,
    /// Its log (stdout and stderr).
    pub log: PathBuf,
    auth: Option<(String, String)>,
    http: reqwest::blocking::Client,
    _dir: tempfile::TempDir,
}

impl Sushy {
    /// Start the emulator and wait until it answers.
    pub fn start(opts: SushyOptions) -> Result<Sushy> {
        let dir = tempfile::tempdir()?;
        let port = crate::free_port()?;
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state)?;
        let systems: Vec<Value> = opts.systems.iter().map(FakeSystem::to_json).collect();
        // The config is Python that sushy-tools executes before its drivers start. Its fake
        // driver applies each power change a random 1–11 s late (`random.randint(1, 11)`,
        // hard-coded), so every power action of a test waited 6 s on average. Late it stays
        // (1–2 s: rivetd's wait for the BMC to apply a change is still exercised); the other
        // draws of `random` are untouched.
        let mut conf = format!(
            "import json\n\
             import random as _random\n\
             _randint = _random.randint\n\
             _random.randint = lambda a, b: _randint(1, 2) if (a, b) == (1, 11) else _randint(a, b)\n\
             SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\n\
             SUSHY_EMULATOR_LISTEN_PORT = {port}\n\
             SUSHY_EMULATOR_FAKE_DRIVER = True\n\
             SUSHY_EMULATOR_STATE_DIR = {state:?}\n\
             SUSHY_EMULATOR_FAKE_SYSTEMS = json.loads({systems:?})\n",
            state = state.display().to_string(),
            systems = Value::Array(systems).to_string(),
        );
        if let Some((user, password)) = &opts.auth {
            let file = dir.path().join("htpasswd");
            std::fs::write(&file, format!("{user}:{}\n", bcrypt_hash(password)?))?;
            conf.push_str(&format!(
                "SUSHY_EMULATOR_AUTH_FILE = {:?}\n",
                file.display().to_string()
            ));
        }
        if let Some((cert, key)) = &opts.tls {
            conf.push_str(&format!(
                "SUSHY_EMULATOR_SSL_CERT = {:?}\nSUSHY_EMULATOR_SSL_KEY = {:?}\n",
                cert.display().to_string(),
                key.display().to_string()
            ));
        }
        let conf_path = dir.path().join("emulator.conf");
        std::fs::write(&conf_path, conf)?;
        let log = dir.path().join("sushy.log");
        let logf = std::fs::File::create(&log)?;
        let child = Command::new(sushy_venv().join("bin/sushy-emulator"))
            .arg("--config")
            .arg(&conf_path)
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf)
            .spawn()
            .context("starting sushy-emulator")?;
        let scheme = if opts.tls.is_some() { "https" } else { "http" };
        let mut s = Sushy {
            guard: ChildGuard::new(child, "sushy-emulator"),
            url: format!("{scheme}://127.0.0.1:{port}"),
            port,
            log,
            auth: opts.auth,
            http: reqwest::blocking::Client::builder()
                .danger_accept_invalid_certs(true)
                .timeout(Duration::from_secs(10))
                .build()?,
            _dir: dir,
        };
        let root = format!("{}/redfish/v1/", s.url);
        let up = wait_until(Duration::from_secs(30), || {
            s.http
                .get(&root)
                .send()
                .map(|r| r.status().is_success())
                .unwrap_or(false)
        });
        if !up || s.guard.exited() {
            bail!("sushy-emulator did not start; log:\n{}", s.log_text());
        }
        Ok(s)
    }

    /// The emulator's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn req(&self, m: reqwest::Method, path: &str) -> reqwest::blocking::RequestBuilder {
        let r = self.http.request(m, format!("{}{path}", self.url));
        match &self.auth {
            Some((u, p)) => r.basic_auth(u, Some(p)),
            None => r,
        }
    }

    /// GET a resource as JSON.
    pub fn get(&self, path: &str) -> Result<Value> {
        let r = self.req(reqwest::Method::GET, path).send()?;
        let status = r.status();
        let v: Value = r.json().unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("GET {path}: {status} {v}");
        }
        Ok(v)
    }

    /// POST JSON; the status.
    pub fn post(&self, path: &str, body: Value) -> Result<u16> {
        Ok(self
            .req(reqwest::Method::POST, path)
            .json(&body)
            .send()?
            .status()
            .as_u16())
    }

    /// `/redfish/v1/Systems/{uuid}`.
    pub fn system(&self, uuid: &str) -> Result<Value> {
        self.get(&format!("/redfish/v1/Systems/{uuid}"))
    }

    /// The system's `PowerState`.
    pub fn power_state(&self, uuid: &str) -> Result<String> {
        Ok(self.system(uuid)?["PowerState"]
            .as_str()
            .unwrap_or("")
            .to_string())
    }

    /// Wait until the system reports `want` (the fake driver applies changes 1–2 s late here,
    /// see [`Sushy::start`]).
    pub fn wait_power(&self, uuid: &str, want: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let now = self.power_state(uuid)?;
            if now == want {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("system {uuid} still {now:?}, not {want:?}, after {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `driver_info` for a node on system `uuid` (credentials as given).
    pub fn driver_info(&self, uuid: &str, user: &str, password: &str) -> Value {
        json!({
            "redfish_address": self.url,
            "redfish_system_id": format!("/redfish/v1/Systems/{uuid}"),
            "redfish_username": user,
            "redfish_password": password,
        })
    }

    /// ComputerSystem.Reset requests the emulator has served (from its access log).
    pub fn reset_requests(&self) -> usize {
        self.log_text()
            .lines()
            .filter(|l| l.contains("POST ") && l.contains("ComputerSystem.Reset"))
            .count()
    }

    /// Its process id.
    pub fn pid(&self) -> Option<u32> {
        self.guard.pid()
    }
}

/// A bcrypt hash of `password` (cost 4: sushy checks it on every request), made by the
/// bcrypt module sushy-tools itself depends on. The password goes through stdin.
fn bcrypt_hash(password: &str) -> Result<String> {
    let mut child = Command::new(sushy_venv().join("bin/python"))
        .args([
            "-c",
            "import sys, bcrypt; print(bcrypt.hashpw(sys.stdin.buffer.read(), bcrypt.gensalt(rounds=4)).decode())",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("running the sushy venv's python for bcrypt")?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(password.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("bcrypt hashing failed");
    }
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

// ---------------------------------------------------------------- ipmi_sim

/// Whether ipmi_sim and ipmitool are installed.
pub fn have_ipmi_sim() -> bool {
    on_path("ipmi_sim") && on_path("ipmitool")
}

/// The chassis_control script: `SCRIPT 0x20 get power boot` / `SCRIPT 0x20 set power 1 …`;
/// soft shutdown and power cycle count as power off (the simulator powers back on itself).
const CHASSIS_SCRIPT: &str = r#"#!/bin/sh
D="$(dirname "$0")/chassis"
mkdir -p "$D"
echo "$*" >> "$D/calls"
shift
op="$1"; shift
case "$op" in
get)
  for k in "$@"; do
    case "$k" in
      power) echo "power:$(cat "$D/power" 2>/dev/null || echo 0)";;
      boot) echo "boot:$(cat "$D/boot" 2>/dev/null || echo default)";;
    esac
  done;;
set)
  while [ $# -ge 2 ]; do
    case "$1" in
      power) echo "$2" > "$D/power";;
      shutdown) [ "$2" = 1 ] && echo 0 > "$D/power";;
      boot) echo "$2" > "$D/boot";;
      reset) echo "$2" > "$D/reset";;
    esac
    shift 2
  done;;
esac
"#;

/// A running ipmi_sim on a loopback UDP port.
pub struct IpmiSim {
    _guard: ChildGuard,
    /// UDP port.
    pub port: u16,
    /// BMC user.
    pub user: String,
    /// Its password.
    pub password: String,
    dir: tempfile::TempDir,
}

impl IpmiSim {
    /// Start the simulator with one admin user and wait until ipmitool gets an answer.
    pub fn start(user: &str, password: &str) -> Result<IpmiSim> {
        Self::start_with(user, password, "")
    }

    /// [`IpmiSim::start`] with `extra` lines at the end of lan.conf (e.g. a `sol` device).
    pub fn start_with(user: &str, password: &str, extra: &str) -> Result<IpmiSim> {
        let dir = tempfile::tempdir()?;
        let port = free_udp_port()?;
        let script = dir.path().join("chassis_control.sh");
        std::fs::write(&script, CHASSIS_SCRIPT)?;
        std::process::Command::new("chmod")
            .arg("+x")
            .arg(&script)
            .status()?;
        let lan = format!(
            "name \"bmc\"\n\
             set_working_mc 0x20\n\
             startlan 1\n\
             \x20 addr 127.0.0.1 {port}\n\
             \x20 priv_limit admin\n\
             \x20 allowed_auths_callback none md2 md5 straight\n\
             \x20 allowed_auths_user none md2 md5 straight\n\
             \x20 allowed_auths_operator none md2 md5 straight\n\
             \x20 allowed_auths_admin none md2 md5 straight\n\
             \x20 guid a123456789abcdefa123456789abcdef\n\
             endlan\n\
             chassis_control \"{} 0x20\"\n\
             user 2 true \"{user}\" \"{password}\" admin 10 none md2 md5 straight\n\
             {extra}\n",
            script.display()
        );
        std::fs::write(dir.path().join("lan.conf"), lan)?;
        std::fs::write(
            dir.path().join("sim.emu"),
            "mc_setbmc 0x20\n\
             mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr\n\
             sel_enable 0x20 1000 0x0a\n\
             mc_enable 0x20\n",
        )?;
        std::fs::create_dir_all(dir.path().join("state"))?;
        let log = std::fs::File::create(dir.path().join("ipmi_sim.log"))?;
        let child = Command::new("ipmi_sim")
            .current_dir(dir.path())
            .args(["-c", "lan.conf", "-f", "sim.emu", "-s", "state", "-n"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting ipmi_sim")?;
        let mut sim = IpmiSim {
            _guard: ChildGuard::new(child, "ipmi_sim"),
            port,
            user: user.into(),
            password: password.into(),
            dir,
        };
        let up = wait_until(Duration::from_secs(15), || {
            sim.ipmitool(&["chassis", "power", "status"])
                .map(|o| o.contains("Chassis Power"))
                .unwrap_or(false)
        });
        if !up || sim._guard.exited() {
            bail!(
                "ipmi_sim did not answer; log:\n{}",
                std::fs::read_to_string(sim.dir.path().join("ipmi_sim.log")).unwrap_or_default()
            );
        }
        Ok(sim)
    }

    /// Run ipmitool against the simulator (password through the environment).
    pub fn ipmitool(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("ipmitool")
            .args([
                "-I",
                "lanplus",
                "-H",
                "127.0.0.1",
                "-C",
                "3",
                "-N",
                "1",
                "-R",
                "1",
            ])
            .args(["-p", &self.port.to_string(), "-U", &self.user, "-E"])
            .args(args)
            .env("IPMI_PASSWORD", &self.password)
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            bail!(
                "ipmitool {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn state_file(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join("chassis").join(name))
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    }

    /// The chassis power as the script recorded it: "1", "0" or "" (never set).
    pub fn power(&self) -> String {
        self.state_file("power")
    }

    /// The boot device as the script recorded it (pxe, default, cdrom…).
    pub fn boot(&self) -> String {
        self.state_file("boot")
    }

    /// Every call the simulator made to the chassis script.
    pub fn calls(&self) -> String {
        self.state_file("calls")
    }

    /// `driver_info` for a node on this BMC.
    pub fn driver_info(&self, password: &str) -> Value {
        json!({
            "ipmi_address": "127.0.0.1",
            "ipmi_port": self.port,
            "ipmi_username": self.user,
            "ipmi_password": password,
        })
    }
}

// ---------------------------------------------------------------- file server

/// A tiny HTTP/1.1 server answering every request with the same bytes.
pub struct FileServer {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    hits: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FileServer {
    /// Serve `body` (as `application/octet-stream`) until dropped.
    pub fn start(body: Vec<u8>) -> Result<FileServer> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let url = format!("http://{}", listener.local_addr()?);
        let hits = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (h, s) = (hits.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((mut conn, _)) => {
                        h.fetch_add(1, Ordering::SeqCst);
                        let _ = serve_one(&mut conn, &body);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Ok(FileServer {
            url,
            hits,
            stop,
            thread: Some(thread),
        })
    }

    /// Requests served so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

fn serve_one(conn: &mut std::net::TcpStream, body: &[u8]) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let head = buf.starts_with(b"HEAD ");
    write!(
        conn,
        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\
         Content-Disposition: attachment; filename=\"boot.iso\"\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    if !head {
        conn.write_all(body)?;
    }
    conn.flush()
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// ---------------------------------------------------------------- TLS files

/// A CA and a server certificate/key for 127.0.0.1, signed by it (openssl CLI).
pub struct TlsFiles {
    /// The CA certificate (a bundle to pass as `redfish_verify_ca`).
    pub ca: PathBuf,
    /// The server certificate.
    pub cert: PathBuf,
    /// The server key.
    pub key: PathBuf,
}

impl TlsFiles {
    /// Generate into `dir`.
    pub fn generate(dir: &Path) -> Result<TlsFiles> {
        let p = |n: &str| dir.join(n);
        let run = |args: &[&str]| -> Result<()> {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .output()?;
            if !out.status.success() {
                bail!("openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            }
            Ok(())
        };
        run(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=Rivet test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ])?;
        run(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ])?;
        std::fs::write(
            p("ext.cnf"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
        )?;
        run(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
            "-out",
            "server.pem",
        ])?;
        Ok(TlsFiles {
            ca: p("ca.pem"),
            cert: p("server.pem"),
            key: p("server.key"),
        })
    }
}

// ---------------------------------------------------------------- in-tree Redfish mock

/// The mock's mutable state; tests read and change it through [`RedfishMock::state`].
#[derive(Debug, Clone)]
pub struct MockState {
    /// Basic / session user.
    pub user: String,
    /// Its password.
    pub password: String,
    /// Live session tokens.
    pub sessions: Vec<String>,
    /// Sessions created so far.
    pub logins: usize,
    /// Whether basic auth is refused (sessions only).
    pub sessions_only: bool,
    /// `On` / `Off`.
    pub power: String,
    /// The system's `Status.Health` (`OK`, `Warning`, `Critical`); `None`: no `Status`.
    pub health: Option<String>,
    /// ComputerSystem.Reset types received.
    pub resets: Vec<String>,
    /// Current BIOS attributes.
    pub bios: Map<String, Value>,
    /// Factory defaults.
    pub bios_defaults: Map<String, Value>,
    /// Staged in Bios/Settings, applied at the next reset.
    pub bios_pending: Map<String, Value>,
    /// Bios.ResetBios calls.
    pub bios_factory_resets: usize,
    /// Attributes the BMC stages but silently drops at the next boot (a value its firmware
    /// refuses), so a reboot leaves them as they were.
    pub bios_dropped: Vec<String>,
    /// SimpleUpdate request bodies.
    pub updates: Vec<Value>,
    /// Polls of the current task so far.
    pub task_polls: usize,
    /// Polls before the task completes.
    pub task_polls_needed: usize,
    /// Answer 503 to this many next requests for the system.
    pub fail_next: usize,
    /// Every request, as "METHOD PATH".
    pub requests: Vec<String>,
    /// `RegistryEntries.Attributes` of the BIOS attribute registry the BMC serves under
    /// `/redfish/v1/Registries`; `None`: no `Registries` at all.
    pub bios_registry: Option<Vec<Value>>,
    /// The Chassis' `NetworkAdapters` (documents with `Id`, `Manufacturer`, `Model`,
    /// `SerialNumber`, `Controllers[].FirmwarePackageVersion`).
    pub network_adapters: Vec<Value>,
}

/// The registry the mock's Bios resource names. Unlike its registry file's `Id` and
/// `Registry`, only the registry document's `Id` matches it (as in sushy-tools).
pub const MOCK_BIOS_REGISTRY: &str = "BiosAttributeRegistryP89.v1_0_0";
const MOCK_REGISTRY_FILE: &str = "/redfish/v1/Registries/BiosAttributeRegistry.v1_0_0";
const MOCK_MANAGER: &str = "/redfish/v1/Managers/bmc";
const MOCK_CHASSIS: &str = "/redfish/v1/Chassis/1U";

/// The mock's default BIOS attribute registry entries.
pub fn mock_bios_registry() -> Vec<Value> {
    vec![
        json!({"AttributeName": "ProcTurboMode", "Type": "Enumeration", "ReadOnly": false,
               "ResetRequired": true, "DisplayName": "Turbo Boost",
               "Value": [{"ValueName": "Enabled", "ValueDisplayName": "On"},
                         {"ValueName": "Disabled", "ValueDisplayName": "Off"}]}),
        json!({"AttributeName": "BootMode", "Type": "Enumeration", "ReadOnly": false,
               "Value": [{"ValueDisplayName": "Bios"}, {"ValueName": "Uefi"}]}),
        json!({"AttributeName": "CoreCount", "Type": "Integer", "LowerBound": 1,
               "UpperBound": 64, "ReadOnly": false, "ResetRequired": true}),
        json!({"AttributeName": "AssetTag", "Type": "String", "MinLength": 0, "MaxLength": 16,
               "IsSystemUniqueProperty": true, "ReadOnly": true}),
    ]
}

impl Default for MockState {
    fn default() -> Self {
        let bios: Map<String, Value> = json!({
            "ProcTurboMode": "Enabled",
            "BootMode": "Uefi",
            "NumLock": true,
        })
        .as_object()
        .cloned()
        .unwrap_or_default();
        MockState {
            user: "admin".into(),
            password: "mock-password".into(),
            sessions: Vec::new(),
            logins: 0,
            sessions_only: false,
            power: "Off".into(),
            health: None,
            resets: Vec::new(),
            bios_defaults: bios.clone(),
            bios,
            bios_pending: Map::new(),
            bios_factory_resets: 0,
            bios_dropped: Vec::new(),
            updates: Vec::new(),
            task_polls: 0,
            task_polls_needed: 3,
            fail_next: 0,
            requests: Vec::new(),
            bios_registry: Some(mock_bios_registry()),
            network_adapters: vec![
                json!({"Id": "NIC.Slot.1", "Manufacturer": "Acme Networks", "Model": "AN-25G",
                       "SerialNumber": "ACME0001",
                       "Controllers": [{"FirmwarePackageVersion": "22.31.6"}]}),
                // No serial number: the component is named by its Id.
                json!({"Id": "NIC.Embedded.1", "Manufacturer": "Other Corp",
                       "Controllers": [{"FirmwarePackageVersion": "1.0.9"}]}),
                // No firmware version: not a component.
                json!({"Id": "NIC.Slot.2", "Manufacturer": "Acme Networks",
                       "Controllers": [{}]}),
            ],
        }
    }
}

/// The mock's system path.
pub const MOCK_SYSTEM: &str = "/redfish/v1/Systems/sys1";
/// MACs the mock's system reports.
pub const MOCK_MACS: [&str; 2] = ["52:54:00:AA:BB:01", "52:54:00:aa:bb:02"];

/// An in-tree Redfish service on a loopback port, stopped on drop.
pub struct RedfishMock {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Shared state.
    pub state: Arc<Mutex<MockState>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RedfishMock {
    /// Start with `state`.
    pub fn start(state: MockState) -> Result<RedfishMock> {
        let state = Arc::new(Mutex::new(state));
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let url = format!("http://{}", listener.local_addr()?);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let st = state.clone();
        let thread = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                let app = axum::Router::new().fallback(mock_handler).with_state(st);
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stop_rx.await;
                    })
                    .await;
            });
        });
        Ok(RedfishMock {
            url,
            state,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// A copy of the state.
    pub fn snapshot(&self) -> MockState {
        self.state.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Change the state.
    pub fn with<T>(&self, f: impl FnOnce(&mut MockState) -> T) -> T {
        let mut s = match self.state.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        f(&mut s)
    }

    /// `driver_info` for the mock's system.
    pub fn driver_info(&self, password: &str) -> Map<String, Value> {
        let user = self.snapshot().user;
        json!({
            "redfish_address": self.url,
            "redfish_system_id": MOCK_SYSTEM,
            "redfish_username": user,
            "redfish_password": password,
        })
        .as_object()
        .cloned()
        .unwrap_or_default()
    }
}

impl Drop for RedfishMock {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

type MockResponse = axum::response::Response;

fn reply(status: u16, body: Value) -> MockResponse {
    let mut r = axum::response::Response::new(axum::body::Body::from(body.to_string()));
    *r.status_mut() = axum::http::StatusCode::from_u16(status)
        .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    r
}

fn with_header(mut r: MockResponse, name: &'static str, value: &str) -> MockResponse {
    if let Ok(v) = axum::http::HeaderValue::from_str(value) {
        r.headers_mut().insert(name, v);
    }
    r
}

/// A Redfish error body with ExtendedInfo.
pub fn redfish_error(status: u16, id: &str, message: &str) -> MockResponse {
    reply(
        status,
        json!({"error": {
            "code": "Base.1.8.GeneralError",
            "message": "A general error has occurred. See ExtendedInfo for more information.",
            "@Message.ExtendedInfo": [{
                "@odata.type": "#Message.v1_1_1.Message",
                "MessageId": id,
                "Message": message,
                "Severity": "Warning",
                "Resolution": "Correct the request and resubmit it."
            }]
        }}),
    )
}

fn authorized(s: &MockState, headers: &axum::http::HeaderMap) -> bool {
    use base64::Engine;
    if let Some(t) = headers.get("X-Auth-Token").and_then(|v| v.to_str().ok()) {
        return s.sessions.iter().any(|x| x == t);
    }
    if s.sessions_only {
        return false;
    }
    let Some(basic) = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
    else {
        return false;
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(basic)
        .ok()
        .and_then(|b| String::from_utf8(b).ok());
    decoded == Some(format!("{}:{}", s.user, s.password))
}

async fn mock_handler(
    axum::extract::State(state): axum::extract::State<Arc<Mutex<MockState>>>,
    method: axum::http::Method,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> MockResponse {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut s = match state.lock() {
        Ok(s) => s,
        Err(p) => p.into_inner(),
    };
    let path = uri.path().trim_end_matches('/').to_string();
    s.requests.push(format!("{method} {path}"));
    route(&mut s, method.as_str(), &path, &headers, &body)
}

fn system_doc(s: &MockState) -> Value {
    let mut doc = json!({
        "@odata.id": MOCK_SYSTEM,
        "@odata.type": "#ComputerSystem.v1_13_0.ComputerSystem",
        "Id": "sys1",
        "BiosVersion": "1.2.3",
        "PowerState": s.power,
        "Boot": {"BootSourceOverrideEnabled": "Disabled", "BootSourceOverrideTarget": "None"},
        "ProcessorSummary": {"Count": 2, "LogicalProcessorCount": 16},
        "MemorySummary": {"TotalSystemMemoryGiB": 64},
        "Bios": {"@odata.id": format!("{MOCK_SYSTEM}/Bios")},
        "Processors": {"@odata.id": format!("{MOCK_SYSTEM}/Processors")},
        "EthernetInterfaces": {"@odata.id": format!("{MOCK_SYSTEM}/EthernetInterfaces")},
        "Links": {
            "ManagedBy": [{"@odata.id": MOCK_MANAGER}],
            "Chassis": [{"@odata.id": MOCK_CHASSIS}]
        },
        "Actions": {"#ComputerSystem.Reset": {
            "target": format!("{MOCK_SYSTEM}/Actions/ComputerSystem.Reset"),
            "ResetType@Redfish.AllowableValues": ["On", "ForceOff", "GracefulShutdown", "ForceRestart", "GracefulRestart", "Nmi"]
        }}
    });
    if let Some(h) = &s.health {
        doc["Status"] = json!({"State": "Enabled", "Health": h});
    }
    doc
}

fn task_doc(state: &str, status: &str, pct: u64, msg: &str) -> Value {
    json!({
        "@odata.id": "/redfish/v1/TaskService/Tasks/1",
        "@odata.type": "#Task.v1_4_3.Task",
        "Id": "1",
        "TaskState": state,
        "TaskStatus": status,
        "PercentComplete": pct,
        "Messages": [{"MessageId": "Update.1.0.Progress", "Message": msg}]
    })
}

fn route(
    s: &mut MockState,
    method: &str,
    path: &str,
    headers: &axum::http::HeaderMap,
    body: &Value,
) -> MockResponse {
    let sys = MOCK_SYSTEM;
    // Unauthenticated: the service root and session creation.
    match (method, path) {
        ("GET", "/redfish/v1") => {
            let mut root = json!({
                "@odata.id": "/redfish/v1/",
                "RedfishVersion": "1.15.0",
                "Systems": {"@odata.id": "/redfish/v1/Systems"},
                "UpdateService": {"@odata.id": "/redfish/v1/UpdateService"},
                "SessionService": {"@odata.id": "/redfish/v1/SessionService"},
                "Links": {"Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions"}}
            });
            if s.bios_registry.is_some() {
                root["Registries"] = json!({"@odata.id": "/redfish/v1/Registries"});
            }
            return reply(200, root);
        }
        ("POST", "/redfish/v1/SessionService/Sessions") => {
            if body["UserName"] != s.user.as_str() || body["Password"] != s.password.as_str() {
                return redfish_error(
                    401,
                    "Base.1.8.NoValidSession",
                    "Invalid username or password.",
                );
            }
            s.logins += 1;
            let token = format!("token-{}", s.logins);
            s.sessions.push(token.clone());
            let r = reply(
                201,
                json!({"@odata.id": format!("/redfish/v1/SessionService/Sessions/{}", s.logins), "UserName": s.user}),
            );
            let r = with_header(r, "X-Auth-Token", &token);
            return with_header(
                r,
                "Location",
                &format!("/redfish/v1/SessionService/Sessions/{}", s.logins),
            );
        }
        _ => {}
    }
    if !authorized(s, headers) {
        return redfish_error(
            401,
            "Base.1.8.InsufficientPrivilege",
            "There are insufficient privileges for the account or credentials associated with the current session to perform the requested operation.",
        );
    }
    if path.starts_with(sys) && s.fail_next > 0 {
        s.fail_next -= 1;
        return redfish_error(
            503,
            "Base.1.8.ServiceTemporarilyUnavailable",
            "The service is temporarily unavailable. Retry in 1 seconds.",
        );
    }
    let bios = format!("{sys}/Bios");
    let settings = format!("{sys}/Bios/Settings");
    match (method, path) {
        ("GET", "/redfish/v1/Systems") => reply(
            200,
            json!({"Members": [{"@odata.id": sys}], "Members@odata.count": 1}),
        ),
        ("GET", p) if p == sys => reply(200, system_doc(s)),
        ("POST", p) if p == format!("{sys}/Actions/ComputerSystem.Reset") => {
            let t = body["ResetType"].as_str().unwrap_or("").to_string();
            s.power = match t.as_str() {
                "On" | "ForceRestart" | "GracefulRestart" => "On",
                "ForceOff" | "GracefulShutdown" => "Off",
                // An NMI leaves the power as it is.
                "Nmi" => {
                    s.resets.push(t);
                    return reply(204, Value::Null);
                }
                _ => {
                    return redfish_error(
                        400,
                        "Base.1.8.ActionParameterValueNotInList",
                        &format!("The value {t} for the parameter ResetType is not in the list of acceptable values."),
                    )
                }
            }
            .into();
            // BIOS settings take effect at the next boot.
            if t != "ForceOff" && t != "GracefulShutdown" {
                let mut pending = std::mem::take(&mut s.bios_pending);
                pending.retain(|k, _| !s.bios_dropped.contains(k));
                s.bios.extend(pending);
            }
            s.resets.push(t);
            reply(204, Value::Null)
        }
        ("GET", p) if p == bios => reply(
            200,
            json!({
                "@odata.id": bios,
                "AttributeRegistry": MOCK_BIOS_REGISTRY,
                "Attributes": s.bios,
                "@Redfish.Settings": {
                    "SettingsObject": {"@odata.id": settings},
                    "SupportedApplyTimes": ["OnReset"]
                },
                "Actions": {"#Bios.ResetBios": {"target": format!("{bios}/Actions/Bios.ResetBios")}}
            }),
        ),
        ("GET", p) if p == settings => reply(
            200,
            json!({"@odata.id": settings, "Attributes": s.bios_pending}),
        ),
        ("PATCH", p) if p == settings => {
            let Some(attrs) = body["Attributes"].as_object() else {
                return redfish_error(
                    400,
                    "Base.1.8.PropertyMissing",
                    "The property Attributes is a required property and must be included in the request.",
                );
            };
            for (k, _) in attrs {
                if !s.bios.contains_key(k) {
                    return redfish_error(
                        400,
                        "Base.1.8.PropertyUnknown",
                        &format!("The property {k} is not in the list of valid properties for the resource."),
                    );
                }
            }
            s.bios_pending.extend(attrs.clone());
            reply(204, Value::Null)
        }
        ("POST", p) if p == format!("{bios}/Actions/Bios.ResetBios") => {
            s.bios_factory_resets += 1;
            s.bios_pending = s.bios_defaults.clone();
            reply(204, Value::Null)
        }
        ("GET", p) if p == format!("{sys}/Processors") => reply(
            200,
            json!({"Members": [
                {"@odata.id": format!("{sys}/Processors/CPU1")},
                {"@odata.id": format!("{sys}/Processors/CPU2")}
            ]}),
        ),
        ("GET", p) if p.starts_with(&format!("{sys}/Processors/CPU")) => reply(
            200,
            json!({"@odata.id": p, "ProcessorType": "CPU", "ProcessorArchitecture": "x86",
                   "InstructionSet": "x86-64", "TotalCores": 4, "TotalThreads": 8}),
        ),
        ("GET", p) if p == format!("{sys}/EthernetInterfaces") => reply(
            200,
            json!({"Members": [
                {"@odata.id": format!("{sys}/EthernetInterfaces/1")},
                {"@odata.id": format!("{sys}/EthernetInterfaces/2")}
            ]}),
        ),
        ("GET", p) if p.starts_with(&format!("{sys}/EthernetInterfaces/")) => {
            let i: usize = p
                .rsplit('/')
                .next()
                .and_then(|x| x.parse().ok())
                .unwrap_or(1);
            reply(
                200,
                json!({"@odata.id": p, "MACAddress": MOCK_MACS[(i - 1).min(1)]}),
            )
        }
        ("GET", p) if p.starts_with("/redfish/v1/Registries") => registry_route(s, p),
        ("GET", MOCK_MANAGER) => reply(
            200,
            json!({"@odata.id": MOCK_MANAGER, "Id": "bmc", "FirmwareVersion": "4.5.6",
                   "Model": "MockBMC 9000", "Manufacturer": "Rivet Mocks"}),
        ),
        ("GET", MOCK_CHASSIS) => reply(
            200,
            json!({"@odata.id": MOCK_CHASSIS, "Id": "1U",
                   "NetworkAdapters": {"@odata.id": format!("{MOCK_CHASSIS}/NetworkAdapters")}}),
        ),
        ("GET", p) if p == format!("{MOCK_CHASSIS}/NetworkAdapters") => reply(
            200,
            json!({"Members": s.network_adapters.iter()
                .map(|a| json!({"@odata.id": format!("{MOCK_CHASSIS}/NetworkAdapters/{}", a["Id"].as_str().unwrap_or(""))}))
                .collect::<Vec<_>>()}),
        ),
        ("GET", p) if p.starts_with(&format!("{MOCK_CHASSIS}/NetworkAdapters/")) => {
            let id = p.rsplit('/').next().unwrap_or("");
            match s.network_adapters.iter().find(|a| a["Id"] == id) {
                Some(a) => {
                    let mut a = a.clone();
                    a["@odata.id"] = json!(p);
                    reply(200, a)
                }
                None => redfish_error(
                    404,
                    "Base.1.8.ResourceMissingAtURI",
                    &format!("The resource at the URI {p} was not found."),
                ),
            }
        }
        ("GET", "/redfish/v1/UpdateService") => reply(
            200,
            json!({"@odata.id": "/redfish/v1/UpdateService", "Actions": {"#UpdateService.SimpleUpdate": {
                "target": "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
                "TransferProtocol@Redfish.AllowableValues": ["HTTP", "HTTPS"]
            }}}),
        ),
        ("POST", "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate") => {
            if body["ImageURI"].as_str().is_none() {
                return redfish_error(
                    400,
                    "Base.1.8.ActionParameterMissing",
                    "The action SimpleUpdate requires the parameter ImageURI to be present in the request body.",
                );
            }
            s.updates.push(body.clone());
            s.task_polls = 0;
            let r = reply(202, task_doc("New", "OK", 0, "Update queued"));
            with_header(r, "Location", "/redfish/v1/TaskService/TaskMonitors/1")
        }
        ("GET", "/redfish/v1/TaskService/TaskMonitors/1")
        | ("GET", "/redfish/v1/TaskService/Tasks/1") => {
            s.task_polls += 1;
            let bad = s
                .updates
                .last()
                .and_then(|u| u["ImageURI"].as_str())
                .is_some_and(|u| u.contains("bad"));
            if s.task_polls < s.task_polls_needed {
                let pct = (100 * s.task_polls / s.task_polls_needed.max(1)) as u64;
                return reply(202, task_doc("Running", "OK", pct, "Flashing"));
            }
            if bad {
                reply(
                    200,
                    task_doc(
                        "Exception",
                        "Critical",
                        100,
                        "Image verification failed: signature mismatch",
                    ),
                )
            } else {
                reply(200, task_doc("Completed", "OK", 100, "Update successful"))
            }
        }
        _ => redfish_error(
            404,
            "Base.1.8.ResourceMissingAtURI",
            &format!("The resource at the URI {path} was not found."),
        ),
    }
}

/// `/redfish/v1/Registries`: a message registry file and the BIOS attribute registry file,
/// each with a document in English (absent when the state has no registry).
fn registry_route(s: &MockState, path: &str) -> MockResponse {
    let missing = || {
        redfish_error(
            404,
            "Base.1.8.ResourceMissingAtURI",
            &format!("The resource at the URI {path} was not found."),
        )
    };
    let Some(entries) = &s.bios_registry else {
        return missing();
    };
    let messages = "/redfish/v1/Registries/Messages";
    let file = |id: &str, registry: &str, at: &str| {
        json!({"@odata.id": at, "@odata.type": "#MessageRegistryFile.v1_1_0.MessageRegistryFile",
               "Id": id, "Name": id, "Registry": registry, "Languages": ["en"],
               "Location": [{"Language": "en", "Uri": format!("{at}/en")}]})
    };
    match path {
        "/redfish/v1/Registries" => reply(
            200,
            json!({"Members": [{"@odata.id": messages}, {"@odata.id": MOCK_REGISTRY_FILE}],
                   "Members@odata.count": 2}),
        ),
        p if p == messages => reply(200, file("Messages", "Base.1.8", messages)),
        p if p == format!("{messages}/en") => reply(
            200,
            json!({"@odata.type": "#MessageRegistry.v1_4_0.MessageRegistry", "Id": "Base.1.8.0",
                   "Language": "en", "RegistryPrefix": "Base", "RegistryVersion": "1.8.0",
                   "Messages": {}}),
        ),
        MOCK_REGISTRY_FILE => reply(
            200,
            file(
                "BiosAttributeRegistry.v1_0_0",
                "BiosAttributeRegistry1.0",
                MOCK_REGISTRY_FILE,
            ),
        ),
        p if p == format!("{MOCK_REGISTRY_FILE}/en") => reply(
            200,
            json!({"@odata.id": p, "@odata.type": "#AttributeRegistry.v1_1_1.AttributeRegistry",
                   "Id": MOCK_BIOS_REGISTRY, "Language": "en", "OwningEntity": "Rivet Mocks",
                   "RegistryVersion": "1.0.0", "RegistryEntries": {"Attributes": entries}}),
        ),
        _ => missing(),
    }
}
