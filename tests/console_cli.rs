//! `rivet node console` and `rivet node console-log` against a rivetd whose console is the
//! stand-in BMC of console.rs (it prints numbered lines and echoes what it is sent as
//! `ECHO:…`). The CLI runs with stdin a pipe (no raw mode) and under a pty (`script(1)`:
//! raw mode, and the terminal's mode restored afterwards), with an admin token.

use super::console::{config, contains, free_block, stand_in, ADMIN, READER};
use anyhow::{bail, ensure, Context, Result};
use rivet_tests::Rivetd;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running `rivet` with its stdin held and its stdout/stderr collected by threads.
struct Cli {
    child: Child,
    stdin: Option<ChildStdin>,
    out: Arc<Mutex<Vec<u8>>>,
    err: Arc<Mutex<Vec<u8>>>,
}

fn collect(mut from: impl Read + Send + 'static) -> Arc<Mutex<Vec<u8>>> {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let b = buf.clone();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        while let Ok(n) = from.read(&mut chunk) {
            if n == 0 {
                break;
            }
            if let Ok(mut g) = b.lock() {
                g.extend_from_slice(&chunk[..n]);
            }
        }
    });
    buf
}

impl Cli {
    fn spawn(mut cmd: Command) -> Result<Cli> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take();
        let out = collect(child.stdout.take().context("stdout")?);
        let err = collect(child.stderr.take().context("stderr")?);
        Ok(Cli {
            child,
            stdin,
            out,
            err,
        })
    }

    fn out(&self) -> Vec<u8> {
        self.out.lock().map(|g| g.clone()).unwrap_or_default()
    }

    fn err(&self) -> String {
        String::from_utf8_lossy(&self.err.lock().map(|g| g.clone()).unwrap_or_default())
            .into_owned()
    }

    fn wait_out(&self, needle: &[u8], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while !contains(&self.out(), needle) {
            if Instant::now() > deadline {
                let out = self.out();
                bail!(
                    "never printed {:?}; stdout ends {:?}; stderr {:?}",
                    String::from_utf8_lossy(needle),
                    String::from_utf8_lossy(&out[out.len().saturating_sub(300)..]),
                    self.err()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    fn type_in(&mut self, bytes: &[u8]) -> Result<()> {
        let stdin = self.stdin.as_mut().context("stdin closed")?;
        stdin.write_all(bytes)?;
        stdin.flush()?;
        Ok(())
    }

    /// Wait for the exit status (killing it after `timeout`).
    fn exit(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait()? {
                return Ok(s);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                bail!("rivet did not exit; stderr {:?}", self.err());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Cli {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rivet(d: &Rivetd, token: &str, args: &[&str]) -> Command {
    let mut c = Command::new(rivet_tests::bin("rivet"));
    c.args(args)
        .env("RIVET_URL", &d.url)
        .env("RIVET_TOKEN", token)
        .env_remove("RIVET_CA");
    c
}

/// The same command run under a pseudo-terminal by `script(1)`, followed by `stty -a` in that
/// terminal so the test sees the mode the CLI left behind.
fn rivet_in_pty(d: &Rivetd, token: &str, args: &[&str]) -> Command {
    let line = format!(
        "{} {}; echo EXIT=$?; stty -a",
        rivet_tests::bin("rivet").display(),
        args.join(" ")
    );
    let mut c = Command::new("script");
    c.args(["-qfec", &line, "/dev/null"])
        .env("RIVET_URL", &d.url)
        .env("RIVET_TOKEN", token)
        .env_remove("RIVET_CA");
    c
}

fn api(d: &Rivetd, method: &str, path: &str, body: Option<Value>) -> Result<(u16, Vec<u8>)> {
    let http = reqwest::blocking::Client::new();
    let mut r = http
        .request(method.parse()?, format!("{}{path}", d.url))
        .bearer_auth(ADMIN)
        .header("X-OpenStack-Ironic-API-Version", "latest");
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send()?;
    Ok((resp.status().as_u16(), resp.bytes()?.to_vec()))
}

fn console_enabled(d: &Rivetd, node: &str) -> Result<bool> {
    let (s, b) = api(d, "GET", &format!("/v1/nodes/{node}/states/console"), None)?;
    ensure!(s == 200, "{s}");
    let v: Value = serde_json::from_slice(&b)?;
    Ok(v["console_enabled"] == true)
}

fn set_console(d: &Rivetd, node: &str, on: bool) -> Result<()> {
    let (s, b) = api(
        d,
        "PUT",
        &format!("/v1/nodes/{node}/states/console"),
        Some(json!({ "enabled": on })),
    )?;
    ensure!(s == 202, "{s} {}", String::from_utf8_lossy(&b));
    let deadline = Instant::now() + Duration::from_secs(20);
    while console_enabled(d, node)? != on {
        ensure!(Instant::now() < deadline, "console of {node} never {on}");
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// A rivetd with admin and reader tokens and node `n1` whose stand-in console is enabled.
pub(crate) fn rivetd_with_console(dir: &std::path::Path) -> Result<Rivetd> {
    let ipmitool = stand_in(dir)?;
    let first = free_block(2)?;
    let admin = rivet_tests::hash_secret(ADMIN)?;
    let reader = rivet_tests::hash_secret(READER)?;
    let conf = format!(
        "{}[auth]\ntokens = [{{ name = \"adm\", hash = \"{admin}\", role = \"admin\" }}, \
         {{ name = \"ro\", hash = \"{reader}\", role = \"reader\" }}]\n",
        config(&ipmitool, first, 2)
    );
    let d = Rivetd::start_in_with_auth(dir, &conf)?;
    let (s, b) = api(
        &d,
        "POST",
        "/v1/nodes",
        Some(json!({
            "driver": "ipmi", "name": "n1", "console_interface": "ipmitool-socat",
            "driver_info": {"ipmi_address": "mode-normal", "ipmi_username": "admin", "ipmi_password": "pw"},
        })),
    )?;
    ensure!(s == 201, "create: {s} {}", String::from_utf8_lossy(&b));
    set_console(&d, "n1", true)?;
    Ok(d)
}

fn log(d: &Rivetd, tail: u64) -> Result<Vec<u8>> {
    let (s, b) = api(
        d,
        "GET",
        &format!("/v1/nodes/n1/console/log?tail={tail}"),
        None,
    )?;
    ensure!(s == 200, "log: {s}");
    Ok(b)
}

#[test]
fn rivet_node_console_attaches_types_and_leaves() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = rivetd_with_console(dir.path())?;
    let t = Duration::from_secs(20);

    // stdin a pipe: no raw mode; output arrives, a typed line reaches the BMC, `~.` leaves.
    let mut cli = Cli::spawn(rivet(&d, ADMIN, &["node", "console", "n1"]))?;
    cli.wait_out(b"activation 0", t)?;
    cli.type_in(b"hello-from-cli\n")?;
    cli.wait_out(b"ECHO:hello-from-cli", t)?;
    cli.type_in(b"~.")?;
    let status = cli.exit(t)?;
    ensure!(status.success(), "{status}: {}", cli.err());
    ensure!(
        cli.err().contains("connected, you may type"),
        "{}",
        cli.err()
    );
    ensure!(
        !contains(&log(&d, 65536)?, b"ECHO:~"),
        "the escape reached the node"
    );

    // --read-only never sends: its line never comes back, even from an admin.
    let mut ro = Cli::spawn(rivet(&d, ADMIN, &["node", "console", "n1", "--read-only"]))?;
    ro.wait_out(b"activation 0", t)?;
    ro.type_in(b"typed-read-only\n")?;
    std::thread::sleep(Duration::from_millis(1500));
    ro.type_in(b"~.")?;
    let status = ro.exit(t)?;
    ensure!(status.success(), "{status}: {}", ro.err());
    ensure!(ro.err().contains("read-only"), "{}", ro.err());
    ensure!(
        !contains(&log(&d, 65536)?, b"ECHO:typed-read-only"),
        "--read-only typed"
    );

    // A reader's token: the CLI says so, and rivetd refuses what it types.
    let mut reader = Cli::spawn(rivet(&d, READER, &["node", "console", "n1"]))?;
    reader.wait_out(b"activation 0", t)?;
    ensure!(reader.err().contains("read-only"), "{}", reader.err());
    reader.type_in(b"reader-typed\n")?;
    let deadline = Instant::now() + t;
    while !reader.err().contains("not sent") {
        ensure!(Instant::now() < deadline, "no refusal: {}", reader.err());
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(reader.stdin.take());
    let status = reader.exit(t)?;
    ensure!(status.success(), "end of stdin leaves: {status}");

    // Someone else holds the pen (a TCP viewer typed): keystrokes are refused and the CLI
    // says so; `~t` takes the pen over, and then they reach the BMC.
    let (_, st) = api(&d, "GET", "/v1/nodes/n1/states/console", None)?;
    let st: Value = serde_json::from_slice(&st)?;
    let port: u16 = st["console_info"]["url"]
        .as_str()
        .and_then(|u| u.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .context("console port")?;
    let mut tcp = std::net::TcpStream::connect(("127.0.0.1", port))?;
    tcp.write_all(b"from-tcp\n")?;
    let deadline = Instant::now() + t;
    while !contains(&log(&d, 65536)?, b"ECHO:from-tcp") {
        ensure!(
            Instant::now() < deadline,
            "the TCP viewer's line never arrived"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut cli = Cli::spawn(rivet(&d, ADMIN, &["node", "console", "n1"]))?;
    cli.wait_out(b"activation 0", t)?;
    ensure!(cli.err().contains("tcp viewer"), "{}", cli.err());
    cli.type_in(b"blocked-line\n")?;
    let deadline = Instant::now() + t;
    while !cli.err().contains("not sent") {
        ensure!(Instant::now() < deadline, "no refusal: {}", cli.err());
        std::thread::sleep(Duration::from_millis(50));
    }
    cli.type_in(b"~t")?;
    let deadline = Instant::now() + t;
    while !cli.err().contains("adm (role admin) holds the pen") {
        ensure!(Instant::now() < deadline, "no take-over: {}", cli.err());
        std::thread::sleep(Duration::from_millis(50));
    }
    cli.type_in(b"after-takeover\n")?;
    cli.wait_out(b"ECHO:after-takeover", t)?;
    cli.type_in(b"~.")?;
    ensure!(cli.exit(t)?.success(), "{}", cli.err());
    drop(tcp);

    // Under a pty: raw mode (Enter is \r), `~.` leaves with 0, the terminal is cooked again.
    let mut pty = Cli::spawn(rivet_in_pty(&d, ADMIN, &["node", "console", "n1"]))?;
    pty.wait_out(b"connected, you may type", t)?;
    pty.wait_out(b"activation 0", t)?;
    pty.type_in(b"typed-in-a-pty\r")?;
    pty.wait_out(b"ECHO:typed-in-a-pty", t)?;
    pty.type_in(b"~.")?;
    pty.wait_out(b"EXIT=0", t)?;
    pty.wait_out(b"speed", t)?;
    std::thread::sleep(Duration::from_millis(200));
    let after = String::from_utf8_lossy(&pty.out()).into_owned();
    let stty = after.rsplit("EXIT=0").next().unwrap_or_default();
    ensure!(
        stty.contains(" icanon") && stty.contains(" echo") && !stty.contains("-icanon"),
        "the terminal was left raw: {stty}"
    );
    pty.exit(t)?;

    // SIGTERM mid-session: exit status 1, and the terminal is cooked again all the same.
    let rivet_bin = rivet_tests::bin("rivet").display().to_string();
    let line =
        format!("sh -c 'echo PID=$$; exec {rivet_bin} node console n1'; echo EXIT=$?; stty -a");
    let mut c = Command::new("script");
    c.args(["-qfec", &line, "/dev/null"])
        .env("RIVET_URL", &d.url)
        .env("RIVET_TOKEN", ADMIN)
        .env_remove("RIVET_CA");
    let mut pty = Cli::spawn(c)?;
    pty.wait_out(b"activation 0", t)?;
    let out = String::from_utf8_lossy(&pty.out()).into_owned();
    let pid: i32 = out
        .split("PID=")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|s| s.parse().ok())
        .context("no PID line")?;
    let killed = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    ensure!(killed.success());
    pty.wait_out(b"EXIT=1", t)?;
    pty.wait_out(b"speed", t)?;
    std::thread::sleep(Duration::from_millis(200));
    let after = String::from_utf8_lossy(&pty.out()).into_owned();
    ensure!(after.contains("terminated (SIGTERM)"), "{after}");
    let stty = after.rsplit("EXIT=1").next().unwrap_or_default();
    ensure!(
        stty.contains(" icanon") && stty.contains(" echo") && !stty.contains("-icanon"),
        "SIGTERM left the terminal raw: {stty}"
    );
    pty.exit(t)?;
    Ok(())
}

#[test]
fn rivet_node_console_log_tail_and_follow() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = rivetd_with_console(dir.path())?;
    let t = Duration::from_secs(20);

    // --follow prints what the console prints after the tail.
    let follow = Cli::spawn(rivet(
        &d,
        READER,
        &["node", "console-log", "n1", "--tail", "64", "--follow"],
    ))?;
    follow.wait_out(b"activation 0", t)?;
    let seen = follow.out();
    let n = String::from_utf8_lossy(&seen).matches("line ").count();
    ensure!(n >= 1, "{}", String::from_utf8_lossy(&seen));
    // New lines keep coming.
    let deadline = Instant::now() + t;
    while String::from_utf8_lossy(&follow.out())
        .matches("line ")
        .count()
        < n + 3
    {
        ensure!(Instant::now() < deadline, "--follow stopped");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(follow);

    // With the console off the capture is still: --tail prints exactly its newest bytes.
    set_console(&d, "n1", false)?;
    let out = rivet(&d, READER, &["node", "console-log", "n1", "--tail", "100"]).output()?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = log(&d, 100)?;
    ensure!(want.len() == 100, "{}", want.len());
    ensure!(
        out.stdout == want,
        "{:?} != {:?}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&want)
    );
    let whole = rivet(&d, READER, &["node", "console-log", "n1"]).output()?;
    ensure!(whole.stdout.ends_with(&want) && whole.stdout.len() > 100);
    Ok(())
}
