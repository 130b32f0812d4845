//! The consoles' SSH front door (`[console] ssh_listen`) with OpenSSH's own client, against a
//! rivetd whose console is console.rs's stand-in BMC (numbered lines; what it is sent comes
//! back as `ECHO:…`):
//!
//! - an admin's listed key attaches: the banner, the live lines, and a line typed in the SSH
//!   session reaches the BMC and comes back;
//! - a reader's listed key watches: its keys are refused with a notice and never reach the BMC;
//! - an unlisted key, and a wrong password, are refused (and audited); the right name and
//!   password through keyboard-interactive prompts attach;
//! - a node whose console is not enabled is named with the command that enables it;
//! - disabling the console ends every SSH viewer; attach and detach are in the audit trail.
//!
//! Needs OpenSSH's client (scripts/setup.sh installs it).

use super::console::{config, free_block, stand_in};
use anyhow::{ensure, Context, Result};
use rivet_tests::agentproc::have;
use rivet_tests::{free_port, prerequisite, Rivetd};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ADMIN_PW: &str = "admin-ssh-pw";
const VIEWER_PW: &str = "viewer-ssh-pw";

fn api(r: &Rivetd, method: &str, path: &str, body: Option<Value>) -> Result<(u16, Value)> {
    let mut req = reqwest::blocking::Client::new()
        .request(method.parse()?, format!("{}{path}", r.url))
        .basic_auth("admin", Some(ADMIN_PW))
        .header("X-OpenStack-Ironic-API-Version", "latest");
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send()?;
    let s = resp.status().as_u16();
    let text = resp.text()?;
    Ok((
        s,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    ))
}

/// A new Ed25519 key pair in `dir`: (private key path, public key line).
fn keygen(dir: &Path, name: &str) -> Result<(PathBuf, String)> {
    let key = dir.join(name);
    let st = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
        .arg(&key)
        .status()?;
    ensure!(st.success(), "ssh-keygen failed");
    let public = std::fs::read_to_string(key.with_extension("pub"))?;
    Ok((key, public.trim().to_string()))
}

/// An OpenSSH client session to `node`'s console, its output collected by a thread.
struct Ssh {
    child: Child,
    stdin: Option<ChildStdin>,
    out: Arc<Mutex<Vec<u8>>>,
}

impl Ssh {
    fn start(port: u16, node: &str, auth: &[&str], env: &[(&str, &str)]) -> Result<Ssh> {
        let mut cmd = Command::new("ssh");
        cmd.args(["-tt", "-p", &port.to_string()])
            .args([
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "LogLevel=ERROR",
                "-o",
                "ConnectTimeout=10",
            ])
            .args(auth)
            .arg(format!("{node}@127.0.0.1"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().context("starting ssh")?;
        let out = Arc::new(Mutex::new(Vec::new()));
        for pipe in [
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let out = out.clone();
            std::thread::spawn(move || {
                let mut pipe = pipe;
                let mut buf = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    out.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .extend_from_slice(&buf[..n]);
                }
            });
        }
        let stdin = child.stdin.take();
        Ok(Ssh { child, stdin, out })
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }

    fn wait_for(&self, needle: &str, secs: u64) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !self.text().contains(needle) {
            ensure!(
                Instant::now() < deadline,
                "{needle:?} never came; the SSH session shows:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    fn send(&mut self, s: &str) -> Result<()> {
        let stdin = self.stdin.as_mut().context("stdin")?;
        stdin.write_all(s.as_bytes())?;
        stdin.flush()?;
        Ok(())
    }

    /// The client's exit status within `secs` (`None`: still running).
    fn exited(&mut self, secs: u64) -> Result<Option<i32>> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(st) = self.child.try_wait()? {
                return Ok(Some(st.code().unwrap_or(-1)));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Ssh {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// What the stand-in BMC echoed, from the node's console log.
fn echoed(r: &Rivetd, node: &str) -> Result<String> {
    let (s, log) = api(r, "GET", &format!("/v1/nodes/{node}/console/log"), None)?;
    ensure!(s == 200, "log: {s}");
    Ok(log.as_str().unwrap_or_default().to_string())
}

#[test]
fn ssh_front_door_keys_passwords_roles_and_audit() -> Result<()> {
    if !prerequisite(
        have("ssh") && have("ssh-keygen"),
        "OpenSSH's client (scripts/setup.sh installs openssh-client)",
    ) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let ipmitool = stand_in(dir.path())?;
    let first = free_block(2)?;
    let ssh_port = free_port()?;
    let (admin_key, admin_pub) = keygen(dir.path(), "admin-key")?;
    let (viewer_key, viewer_pub) = keygen(dir.path(), "viewer-key")?;
    let (stranger_key, _) = keygen(dir.path(), "stranger-key")?;
    let admin = rivet_tests::hash_secret(ADMIN_PW)?;
    let viewer = rivet_tests::hash_secret(VIEWER_PW)?;
    let r = Rivetd::start_authed_in(
        dir.path(),
        &format!(
            "{}ssh_listen = \"127.0.0.1:{ssh_port}\"\n[auth]\nusers = [\n\
             {{ name = \"admin\", hash = \"{admin}\", role = \"admin\", ssh_keys = [\"{admin_pub}\"] }},\n\
             {{ name = \"viewer\", hash = \"{viewer}\", role = \"reader\", ssh_keys = [\"{viewer_pub}\"] }},\n]\n",
            config(&ipmitool, first, 2)
        ),
    )?;
    for name in ["n1", "n2"] {
        let (s, v) = api(
            &r,
            "POST",
            "/v1/nodes",
            Some(json!({
                "driver": "ipmi", "name": name, "console_interface": "ipmitool-socat",
                "driver_info": {"ipmi_address": "mode-normal", "ipmi_username": "admin", "ipmi_password": "pw"},
            })),
        )?;
        ensure!(s == 201, "create {name}: {s} {v}");
    }
    let (s, _) = api(
        &r,
        "PUT",
        "/v1/nodes/n1/states/console",
        Some(json!({"enabled": true})),
    )?;
    ensure!(s == 202, "enable: {s}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !echoed(&r, "n1")?.contains("line 2 ") {
        ensure!(Instant::now() < deadline, "the console never printed");
        std::thread::sleep(Duration::from_millis(100));
    }
    let key = |k: &Path| -> Vec<String> {
        vec![
            "-i".into(),
            k.display().to_string(),
            "-o".into(),
            "IdentitiesOnly=yes".into(),
            "-o".into(),
            "BatchMode=yes".into(),
        ]
    };

    // An admin's key: the banner, live lines, and a typed line reaches the BMC.
    let a = key(&admin_key);
    let mut s1 = Ssh::start(ssh_port, "n1", &args(&a), &[])?;
    s1.wait_for(
        "[rivet: console of node n1 as admin (role admin, SSH key)",
        30,
    )?;
    s1.wait_for(" activation 0", 30)?;
    let text = s1.text();
    let last: u64 = text
        .rsplit("line ")
        .next()
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    s1.wait_for(&format!("line {} activation 0", last + 2), 30)?;
    s1.send("typed-over-ssh\r")?;
    s1.wait_for("ECHO:typed-over-ssh", 30)?;
    ensure!(echoed(&r, "n1")?.contains("ECHO:typed-over-ssh"));

    // A reader's key watches; its keys are refused and never reach the BMC.
    let v = key(&viewer_key);
    let mut s2 = Ssh::start(ssh_port, "n1", &args(&v), &[])?;
    s2.wait_for("as viewer (role reader, SSH key), read-only", 30)?;
    s2.send("from-the-reader\r")?;
    s2.wait_for("[rivet: read-only: your role may only watch]", 30)?;
    std::thread::sleep(Duration::from_secs(1));
    ensure!(!echoed(&r, "n1")?.contains("from-the-reader"));

    // An unlisted key is refused.
    let st = key(&stranger_key);
    let mut s3 = Ssh::start(ssh_port, "n1", &args(&st), &[])?;
    ensure!(
        s3.exited(30)? == Some(255),
        "an unlisted key got in: {}",
        s3.text()
    );
    ensure!(s3.text().contains("Permission denied"), "{}", s3.text());

    // A Rivet user's name and password, asked by keyboard-interactive prompts (answered by
    // an askpass program: the first prompt gets the name, the second the password).
    let askpass = |pw: &str| -> Result<PathBuf> {
        let p = dir.path().join(format!("askpass-{}", pw.len()));
        std::fs::write(
            &p,
            format!("#!/bin/sh\ncase \"$1\" in *Rivet*) echo admin ;; *) echo '{pw}' ;; esac\n"),
        )?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))?;
        Ok(p)
    };
    let kbd = [
        "-o",
        "PubkeyAuthentication=no",
        "-o",
        "PreferredAuthentications=keyboard-interactive",
        "-o",
        "NumberOfPasswordPrompts=1",
    ];
    let wrong = askpass("not-the-password")?;
    let wrong = wrong.display().to_string();
    let mut s4 = Ssh::start(
        ssh_port,
        "n1",
        &kbd,
        &[("SSH_ASKPASS", &wrong), ("SSH_ASKPASS_REQUIRE", "force")],
    )?;
    ensure!(
        s4.exited(30)? == Some(255),
        "a wrong password got in: {}",
        s4.text()
    );
    let right = askpass(ADMIN_PW)?;
    let right = right.display().to_string();
    let s5 = Ssh::start(
        ssh_port,
        "n1",
        &kbd,
        &[("SSH_ASKPASS", &right), ("SSH_ASKPASS_REQUIRE", "force")],
    )?;
    s5.wait_for("[rivet: console of node n1 as admin (role admin)", 30)?;

    // A node without an enabled console: named, with the command that enables it.
    let mut s6 = Ssh::start(ssh_port, "n2", &args(&a), &[])?;
    s6.wait_for("console access is not enabled on node n2", 30)?;
    s6.wait_for("baremetal node console enable n2", 5)?;
    ensure!(s6.exited(30)?.is_some(), "the session to n2 stayed open");

    // Disabling the console ends every SSH viewer.
    let (s, _) = api(
        &r,
        "PUT",
        "/v1/nodes/n1/states/console",
        Some(json!({"enabled": false})),
    )?;
    ensure!(s == 202, "disable: {s}");
    for (what, s) in [("admin", &mut s1), ("reader", &mut s2)] {
        ensure!(
            s.exited(30)?.is_some(),
            "the {what}'s SSH session outlived the console"
        );
    }
    drop(s5);

    // Attach, detach and the refusals are in the audit trail; no keystrokes are.
    let uuid = api(&r, "GET", "/v1/nodes/n1", None)?.1["uuid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, audit) = api(&r, "GET", &format!("/v1/audit?node={uuid}&limit=200"), None)?;
        let rows = audit["audit"].as_array().cloned().unwrap_or_default();
        let has = |action: &str, actor: &str, detail: &str| {
            rows.iter().any(|r| {
                r["action"] == action
                    && r["actor"].as_str().is_some_and(|a| a.starts_with(actor))
                    && r["detail"].as_str().is_some_and(|d| d.contains(detail))
            })
        };
        let all = has("console:attach", "admin (role admin, SSH key)", "SSH")
            && has(
                "console:attach",
                "viewer (role reader, SSH key)",
                "read-only",
            )
            && has(
                "console:detach",
                "admin (role admin, SSH key)",
                "SSH: console disabled",
            )
            && has("console:refused", "unknown SSH key", "publickey")
            && has("console:refused", "admin", "keyboard-interactive")
            && has("console:attach", "admin (role admin)", "SSH");
        let text = audit.to_string();
        ensure!(
            !text.contains("typed-over-ssh") && !text.contains("not-the-password"),
            "keystrokes or a password in the audit trail"
        );
        if all {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "audit rows missing: {}",
            serde_json::to_string_pretty(&rows)?
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}
