//! The Debian package: built by `scripts/build-deb.sh` from the test build's binaries,
//! installed with the real `dpkg` into a scratch root (the host's packages, accounts and
//! services are never touched), its unit file checked by `systemd-analyze verify`, and rivetd
//! started from the installed unit's own `ExecStart` line, as systemd would, with
//! `NOTIFY_SOCKET` pointing at the test: READY=1 only once the API answers, STOPPING=1 on
//! SIGTERM, exit 0. Then `dpkg -r` removes it and keeps the edited conffile.

use anyhow::{bail, ensure, Context, Result};
use rivet_tests::{bin, free_port, prerequisite, run_tool};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// An empty dpkg database under `root`, so `dpkg --root` installs there.
fn scratch_root(root: &Path) -> Result<()> {
    for d in ["var/lib/dpkg/info", "var/lib/dpkg/updates"] {
        std::fs::create_dir_all(root.join(d))?;
    }
    std::fs::write(root.join("var/lib/dpkg/status"), "")?;
    std::fs::write(root.join("var/lib/dpkg/available"), "")?;
    Ok(())
}

fn dpkg(root: &Path, args: &[&str]) -> Result<String> {
    let root_arg = format!("--root={}", root.display());
    let log = format!("--log={}", root.join("dpkg.log").display());
    run_tool(
        Command::new("dpkg")
            .args([root_arg.as_str(), log.as_str(), "--force-script-chrootless"])
            .args(args),
    )
}

/// The `ExecStart=` command line of a unit file, split on whitespace (ours has no quoting).
fn exec_start(unit: &str) -> Result<Vec<String>> {
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .context("the unit has no ExecStart=")?;
    Ok(line.split_whitespace().map(str::to_string).collect())
}

/// Wait for a datagram on the notify socket; its text. Fails early if rivetd exits first.
fn notification(sock: &UnixDatagram, child: &mut Child, within: Duration) -> Result<String> {
    sock.set_read_timeout(Some(Duration::from_millis(200)))?;
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    loop {
        match sock.recv(&mut buf) {
            Ok(n) => return Ok(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(e) => return Err(e).context("reading the notify socket"),
        }
        if let Some(status) = child.try_wait()? {
            bail!("rivetd exited ({status}) without notifying");
        }
        if Instant::now() > deadline {
            bail!("no sd_notify message from rivetd within {within:?}");
        }
    }
}

#[test]
fn package_installs_verifies_and_starts_from_its_unit() -> Result<()> {
    let root_user = run_tool(Command::new("id").arg("-u"))?.trim() == "0";
    if !prerequisite(
        root_user && have("dpkg") && have("dpkg-deb") && have("systemd-analyze"),
        "root, dpkg, dpkg-deb and systemd-analyze (package test)",
    ) {
        return Ok(());
    }
    let tmp = tempfile::tempdir()?;
    let bin_dir = bin("rivetd")
        .parent()
        .context("binary directory")?
        .to_path_buf();
    let out = run_tool(
        Command::new("bash")
            .arg(repo().join("scripts/build-deb.sh"))
            .args(["--fast", "--bin-dir"])
            .arg(&bin_dir)
            .arg("--out")
            .arg(tmp.path()),
    )?;
    let deb = PathBuf::from(out.trim());
    ensure!(deb.exists(), "build-deb.sh printed {out:?}, not a package");
    let info = run_tool(Command::new("dpkg-deb").arg("--info").arg(&deb))?;
    ensure!(info.contains("Package: rivet"), "{info}");
    ensure!(info.contains("conffiles"), "no conffiles in {info}");

    let root = tmp.path().join("root");
    scratch_root(&root)?;
    // The scratch database knows no other package, so libc6 (which the host has) counts as
    // missing: dependencies are the one thing this install does not check.
    dpkg(
        &root,
        &["--force-depends", "-i", &deb.display().to_string()],
    )?;
    let listed = dpkg(&root, &["-L", "rivet"])?;
    for f in [
        "/usr/bin/rivetd",
        "/usr/bin/rivet",
        "/lib/systemd/system/rivetd.service",
        "/etc/rivet/rivetd.toml",
        "/usr/share/man/man1/rivetd.1.gz",
        "/usr/share/man/man1/rivet.1.gz",
        "/usr/share/man/man1/rivet-node.1.gz",
        "/usr/share/bash-completion/completions/rivet",
        "/usr/share/zsh/vendor-completions/_rivetd",
        "/usr/share/doc/rivet/operations.md",
    ] {
        ensure!(
            listed.lines().any(|l| l == f),
            "{f} not installed:\n{listed}"
        );
        ensure!(
            root.join(&f[1..]).exists(),
            "{f} listed but missing on disk"
        );
    }
    let completion =
        std::fs::read_to_string(root.join("usr/share/bash-completion/completions/rivet"))?;
    ensure!(
        completion.contains("rivet") && completion.contains("node"),
        "bash completion"
    );

    // systemd-analyze resolves the unit's dependencies inside the root: give it the host's
    // targets and slices (read-only copies), not its units.
    let units = root.join("lib/systemd/system");
    for entry in std::fs::read_dir("/lib/systemd/system")? {
        let p = entry?.path();
        let keep = p.extension().is_some_and(|e| e == "target" || e == "slice");
        if keep && p.is_file() {
            if let Some(name) = p.file_name() {
                std::fs::copy(&p, units.join(name))?;
            }
        }
    }
    let verify = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(format!("--root={}", root.display()))
        .arg("rivetd.service")
        .output()?;
    let complaints = format!(
        "{}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
    // It exits 0 on unknown keys and bad values, only printing them: both fail the test.
    ensure!(
        verify.status.success() && complaints.trim().is_empty(),
        "systemd-analyze verify rivetd.service: {}\n{complaints}",
        verify.status
    );

    // The shipped config has no credentials, and rivetd refuses to start without any: do
    // what the package description tells the operator, with the installed rivetd.
    let token = "packaging-test-token-0123456789";
    let hash = run_tool(Command::new(root.join("usr/bin/rivetd")).args(["hash-secret", token]))?;
    let conf = root.join("etc/rivet/rivetd.toml");
    let shipped = std::fs::read_to_string(&conf)?;
    let configured = format!(
        "{shipped}\n[auth]\ntokens = [{{ name = \"ops\", hash = \"{}\", role = \"admin\" }}]\n",
        hash.trim()
    );
    std::fs::write(&conf, &configured)?;

    // Start rivetd the way the unit does: its ExecStart, paths moved into the root. The
    // shipped config keeps its database in /var/lib/rivet; the environment points it (and
    // the port) at the scratch root instead, as an operator's drop-in would.
    let unit = std::fs::read_to_string(units.join("rivetd.service"))?;
    ensure!(unit.contains("Type=notify"), "the unit is not Type=notify");
    let argv: Vec<String> = exec_start(&unit)?
        .into_iter()
        .map(|a| match a.strip_prefix('/') {
            Some(rel) => root.join(rel).display().to_string(),
            None => a,
        })
        .collect();
    let notify_path = tmp.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path)?;
    let port = free_port()?;
    let state = root.join("var/lib/rivet");
    std::fs::create_dir_all(&state)?;
    let log = std::fs::File::create(tmp.path().join("rivetd.log"))?;
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .env("NOTIFY_SOCKET", &notify_path)
        .env(
            "RIVETD_DB",
            format!("sqlite:{}", state.join("rivet.db").display()),
        )
        .env("RIVETD_LISTEN", format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {argv:?}"))?;
    let result = (|| -> Result<()> {
        let started = Instant::now();
        let ready = notification(&notify, &mut child, Duration::from_secs(60))?;
        ensure!(ready.contains("READY=1"), "first notification {ready:?}");
        // Ready means serving: the very next request must be answered.
        let http = reqwest::blocking::Client::new();
        let v1 = http.get(format!("http://127.0.0.1:{port}/v1")).send()?;
        ensure!(
            v1.status().as_u16() == 200,
            "GET /v1 after READY=1: {}",
            v1.status()
        );
        let nodes = http
            .get(format!("http://127.0.0.1:{port}/v1/nodes"))
            .send()?;
        ensure!(
            nodes.status().as_u16() == 401,
            "GET /v1/nodes without a token: {}",
            nodes.status()
        );
        let nodes = http
            .get(format!("http://127.0.0.1:{port}/v1/nodes"))
            .header("X-Auth-Token", token)
            .send()?;
        ensure!(
            nodes.status().as_u16() == 200,
            "GET /v1/nodes with the configured token: {}",
            nodes.status()
        );
        eprintln!("rivetd from the package ready in {:?}", started.elapsed());
        let pid = child.id().to_string();
        run_tool(Command::new("kill").args(["-TERM", &pid]))?;
        let stopping = notification(&notify, &mut child, Duration::from_secs(30))?;
        ensure!(stopping.contains("STOPPING=1"), "on SIGTERM: {stopping:?}");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait()? {
                ensure!(
                    status.success(),
                    "rivetd exited with {status} after SIGTERM"
                );
                break;
            }
            if Instant::now() > deadline {
                bail!("rivetd still running 60 s after SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = child.kill();
        let _ = child.wait();
        let log = std::fs::read_to_string(tmp.path().join("rivetd.log")).unwrap_or_default();
        return result.with_context(|| format!("rivetd log:\n{log}"));
    }

    // Removal keeps the edited conffile (dpkg's rule) and removes the binaries.
    dpkg(&root, &["-r", "rivet"])?;
    ensure!(
        !root.join("usr/bin/rivetd").exists(),
        "rivetd left after dpkg -r"
    );
    ensure!(
        std::fs::read_to_string(&conf)? == configured,
        "the edited conffile was not kept"
    );
    Ok(())
}
