//! Secrets at rest through the real rivetd binary on a SQLite file: BMC passwords given at
//! node creation never reach the database file, its -wal or -shm, nor rivetd's log (at debug
//! level), nor the API, while the drivers still log in with them (the in-tree Redfish mock
//! and OpenIPMI's ipmi_sim check the password). `rivetd secrets rotate` then re-seals them
//! with a new key: it reports the count, a second run changes nothing, rivetd on the old key
//! answers a clear error naming both keys, and rivetd on the new key drives the BMCs again.
//!
//! The IPMI half needs ipmi_sim and ipmitool (scripts/setup-peers.sh); without them it skips
//! with a message unless RIVET_REQUIRE_PEERS=1.

use anyhow::{bail, ensure, Context, Result};
use base64::Engine;
use rivet_tests::peers::{have_ipmi_sim, IpmiSim, MockState, RedfishMock};
use rivet_tests::{bin, free_port, prerequisite};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const REDFISH_PW: &str = "Rf-At-Rest-S3cret-pw";
const IPMI_PW: &str = "Ipmi-At-Rest-pw";

/// rivetd on `db` with debug logging into `log`, killed on drop.
struct Daemon {
    child: Child,
    url: String,
    http: reqwest::blocking::Client,
}

impl Daemon {
    fn start(db: &Path, config: &Path, log: &Path) -> Result<Daemon> {
        let port = free_port()?;
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let child = Command::new(bin("rivetd"))
            .args(["--listen", &format!("127.0.0.1:{port}"), "--no-auth"])
            .arg("--db")
            .arg(format!("sqlite:{}", db.display()))
            .arg("--config")
            .arg(config)
            .env("RIVET_LOG", "debug")
            .env_remove("RIVET_SECRETS_KEY")
            .stdout(Stdio::null())
            .stderr(logf)
            .spawn()
            .context("spawning rivetd (cargo build -p rivet-controller --bins)")?;
        let d = Daemon {
            child,
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()?,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if d.http.get(format!("{}/v1", d.url)).send().is_ok() {
                return Ok(d);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!(
            "rivetd did not start; log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        )
    }

    /// (status, body text).
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<(u16, String)> {
        let mut req = self
            .http
            .request(
                reqwest::Method::from_bytes(method.as_bytes())?,
                format!("{}{path}", self.url),
            )
            .header("X-OpenStack-Ironic-API-Version", "latest");
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().with_context(|| format!("{method} {path}"))?;
        Ok((r.status().as_u16(), r.text()?))
    }

    fn wait(&self, node: &str, pred: impl Fn(&Value) -> bool) -> Result<Value> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (s, text) = self.call("GET", &format!("/v1/nodes/{node}"), None)?;
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            if s == 200 && pred(&v) {
                return Ok(v);
            }
            ensure!(Instant::now() < deadline, "node {node}: {s} {text}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stop it hard, as a crash would: nothing gets checkpointed.
    fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every form a password could leak in: itself, and inside an HTTP basic header.
fn leaks(user: &str, pw: &str) -> Vec<String> {
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pw}"));
    vec![pw.to_string(), basic]
}

fn assert_absent(bytes: &[u8], needles: &[String], what: &str) {
    let hay = String::from_utf8_lossy(bytes);
    for n in needles {
        assert!(!hay.contains(n.as_str()), "{what} holds a BMC password");
    }
}

/// The raw bytes of the database file and its -wal/-shm, as they are on disk now.
fn db_files(db: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    ["", "-wal", "-shm"]
        .iter()
        .map(|s| PathBuf::from(format!("{}{s}", db.display())))
        .filter_map(|p| std::fs::read(&p).ok().map(|b| (p, b)))
        .collect()
}

fn rivetd_cli(args: &[&str]) -> Result<String> {
    let out = Command::new(bin("rivetd"))
        .args(args)
        .env_remove("RIVET_SECRETS_KEY")
        .env("RIVET_LOG", "warn")
        .output()?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    ensure!(out.status.success(), "rivetd {args:?}: {stdout}{stderr}");
    Ok(stdout)
}

#[test]
fn bmc_passwords_never_in_the_database_file_or_logs() -> Result<()> {
    let with_ipmi = prerequisite(
        have_ipmi_sim(),
        "ipmi_sim and ipmitool for the IPMI half (Debian openipmi, ipmitool; scripts/setup-peers.sh)",
    );
    let mock = RedfishMock::start(MockState {
        password: REDFISH_PW.into(),
        ..MockState::default()
    })?;
    let sim = if with_ipmi {
        Some(IpmiSim::start("admin", IPMI_PW)?)
    } else {
        None
    };
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("rivet.db");
    let log = dir.path().join("rivetd.log");
    let conf = dir.path().join("rivetd.toml");
    std::fs::write(&conf, "[drivers]\npoll_interval_ms = 100\n")?;
    let mut needles = leaks(&mock.snapshot().user, REDFISH_PW);
    needles.extend(leaks("admin", IPMI_PW));

    let d = Daemon::start(&db, &conf, &log)?;
    let mut nodes = vec![("rf", "redfish", Value::Object(mock.driver_info(REDFISH_PW)))];
    if let Some(sim) = &sim {
        nodes.push(("bmc", "ipmi", sim.driver_info(IPMI_PW)));
    }
    for (name, driver, info) in &nodes {
        let (s, text) = d.call(
            "POST",
            "/v1/nodes",
            Some(json!({"name": name, "driver": driver, "driver_info": info})),
        )?;
        ensure!(s == 201, "create {name}: {s} {text}");
        assert_absent(text.as_bytes(), &needles, "the create answer");
        // manage reads the power state: the BMC accepts only the right password.
        let (s, text) = d.call(
            "PUT",
            &format!("/v1/nodes/{name}/states/provision"),
            Some(json!({"target": "manage"})),
        )?;
        ensure!(s == 202, "manage {name}: {s} {text}");
        let n = d.wait(name, |v| v["provision_state"] != "verifying")?;
        assert_eq!(n["provision_state"], "manageable", "{n}");
        assert_eq!(n["driver_info"][format!("{driver}_password")], "******");
    }
    let (_, listing) = d.call("GET", "/v1/nodes/detail", None)?;
    assert_absent(listing.as_bytes(), &needles, "the node listing");
    d.kill9();

    let files = db_files(&db);
    ensure!(files.len() >= 2, "expected the database and its WAL");
    let mut sealed = false;
    for (path, bytes) in &files {
        assert_absent(bytes, &needles, &path.display().to_string());
        sealed |= String::from_utf8_lossy(bytes).contains("rivet-sealed:v2:");
    }
    assert!(sealed, "no sealed value found in the database files");
    let key_file = PathBuf::from(format!("{}.key", db.display()));
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key_file)?.permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "generated key file mode");
    }
    let text = std::fs::read_to_string(&log)?;
    assert!(
        text.contains("generated a key"),
        "the generated key is logged"
    );
    assert_absent(text.as_bytes(), &needles, "rivetd's log");

    // Rotate to a new key, offline.
    let db_url = format!("sqlite:{}", db.display());
    let new_key = dir.path().join("new.key");
    let out = rivetd_cli(&["secrets", "init-key", &new_key.display().to_string()])?;
    assert!(out.contains("mode 0600"), "{out}");
    let rotate = ["secrets", "rotate", "--db", &db_url, "--new-key-file"];
    let out = rivetd_cli(&[&rotate[..], &[new_key.to_str().context("utf8")?]].concat())?;
    let n = nodes.len();
    assert!(
        out.contains(&format!("re-sealed {n} secrets in {n} of {n} nodes")),
        "{out}"
    );
    let out = rivetd_cli(&[&rotate[..], &[new_key.to_str().context("utf8")?]].concat())?;
    assert!(
        out.contains(&format!("re-sealed 0 secrets in 0 of {n} nodes")),
        "{out}"
    );
    for (path, bytes) in &db_files(&db) {
        assert_absent(bytes, &needles, &path.display().to_string());
    }

    // rivetd still on the old key refuses to start: a clear error naming both keys, no
    // password (rather than serving 500s on every node read).
    let out = Command::new(bin("rivetd"))
        .args([
            "--listen",
            &format!("127.0.0.1:{}", free_port()?),
            "--no-auth",
        ])
        .arg("--db")
        .arg(format!("sqlite:{}", db.display()))
        .arg("--config")
        .arg(&conf)
        .env_remove("RIVET_SECRETS_KEY")
        .stdout(Stdio::null())
        .output()
        .context("running rivetd on the old key")?;
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "rivetd started on the old key");
    assert!(
        text.contains("at start-up")
            && text.contains("was sealed with key")
            && text.contains("the configured key is"),
        "{text}"
    );
    assert_absent(text.as_bytes(), &needles, "the wrong-key error");

    // On the new key the BMCs answer again.
    std::fs::write(
        &conf,
        format!(
            "[drivers]\npoll_interval_ms = 100\n[secrets]\nkey_file = {:?}\n",
            new_key.display().to_string()
        ),
    )?;
    let d = Daemon::start(&db, &conf, &log)?;
    for (name, _, _) in &nodes {
        let (s, text) = d.call(
            "PUT",
            &format!("/v1/nodes/{name}/states/power"),
            Some(json!({"target": "power on"})),
        )?;
        ensure!(s == 202, "power on {name}: {s} {text}");
        let n = d.wait(name, |v| v["target_power_state"].is_null())?;
        assert_eq!(n["power_state"], "power on", "{n}");
        assert!(n["last_error"].is_null(), "{n}");
    }
    d.kill9();
    let text = std::fs::read_to_string(&log)?;
    assert_absent(text.as_bytes(), &needles, "rivetd's log");
    Ok(())
}
