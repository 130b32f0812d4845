//! Merged cleaning through a real BMC emulator: sushy-tools' **libvirt** driver (the fake
//! driver of tests/redfish.rs has no BIOS and no firmware versions) in front of a tiny libvirt
//! domain of our own (TCG, 32 MiB, no disk, no NIC: powered on it idles in SeaBIOS), plus a
//! real `rivet-agent` process on loop devices with a vendor exec plugin, which finds the node
//! by its port's MAC (a MAC of this host). One node gets:
//!
//! 1. a manual clean mixing in-band and out-of-band steps: the plugin's `deploy.vendor_tune`,
//!    Redfish `firmware.update` (three `UpdateService.SimpleUpdate` calls; not abortable:
//!    `abort` while it runs gets 409 naming the node and the step, and the run goes on),
//!    Redfish `bios.apply_configuration`, then `deploy.erase_devices_metadata`. Manual
//!    cleaning keeps the operator's order (Ironic's rule; priorities only order automated
//!    cleaning);
//! 2. an automated clean whose plan is the merge of the agent's and the driver's steps by
//!    priority, Ironic's interface rank breaking ties: `bios.factory_reset` is given priority
//!    50 by `[cleaning] priority_overrides`, the same as the plugin's `deploy.vendor_tune`, and
//!    runs after it (deploy ranks above bios; by name it would run first).
//!
//! Both orders are read back from the node history (`GET /v1/nodes/{node}/history`), and the
//! BIOS attributes and `BiosVersion` from the emulator's own Redfish resources, not from
//! rivetd's cache. Needs root, libvirt + QEMU and `.venv-lab` (scripts/setup-lab.sh). When no
//! libvirtd answers, one is started for the test and stopped afterwards (unless other domains
//! appeared meanwhile). Bounded: every wait has its own limit (libvirtd and the emulator 30 s
//! each, each cleaning 60 s), so under 4 min at worst; measured 15-23 s with a running
//! libvirtd, 10-11 s with its own.

use anyhow::{bail, ensure, Context, Result};
use rivet_tests::agentproc::{have, is_root, AgentProcess, LoopDevice};
use rivet_tests::{fault, free_port, prerequisite, Rivetd};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const VIRSH_URI: &str = "qemu:///system";

/// The vendor plugin: `vendor_tune` (deploy interface, priority 50, abortable) appends its tag
/// to `$RIVET_TEST_DIR/vendor` so the test sees it ran on the "machine".
const VENDOR_PLUGIN: &str = r#"#!/bin/sh
set -u
case "${1:-}" in
describe) echo '{"name": "acme-vendor", "support_level": 3, "version": "1.0"}' ;;
steps) cat <<'JSON'
[{"interface": "deploy", "step": "vendor_tune", "priority": 50, "abortable": true,
  "argsinfo": {"tag": {"description": "line to record", "required": false}},
  "reboot_requested": false, "requires_ramdisk": true}]
JSON
;;
execute)
  req=$(cat)
  tag=${req#*\"tag\":\"}; [ "$tag" = "$req" ] && tag=automated; tag=${tag%%\"*}
  echo "$tag" >> "$RIVET_TEST_DIR/vendor"
  echo "{\"tuned\": \"$tag\"}" ;;
*) exit 64 ;;
esac
"#;

fn virsh(args: &[&str]) -> Result<String> {
    let out = Command::new("timeout")
        .arg("20")
        .arg("virsh")
        .arg("-q")
        .arg("-c")
        .arg(VIRSH_URI)
        .args(args)
        .output()
        .context("running virsh")?;
    if !out.status.success() {
        bail!(
            "virsh {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}

fn virsh_ok() -> bool {
    virsh(&["list"]).is_ok()
}

fn pid_in(file: &Path) -> Option<i32> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

fn kill_pid(pid: i32) {
    let _ = Command::new("kill").arg(pid.to_string()).status();
}

fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// libvirtd for the test: the running one when it answers (left alone), else our own
/// virtlogd + libvirtd, configured as scripts/lab.sh does (QEMU as root, no cgroups, no
/// security driver) and stopped on drop, with `/etc/libvirt/qemu.conf` restored.
struct Libvirt {
    ours: Option<OwnDaemons>,
}

struct OwnDaemons {
    dir: tempfile::TempDir,
    qemu_conf: Option<String>,
    marker_created: bool,
    /// `/run/libvirt` did not exist before: removed once the daemons are gone.
    run_created: bool,
    /// virtlogd was started too (its pid file is next to libvirtd's).
    virtlogd: bool,
}

impl Libvirt {
    fn up() -> Result<Libvirt> {
        // A libvirtd that runs but does not answer yet is starting or stopping (another
        // scenario's lab coming up or going down): give it 20 s to settle either way.
        let settle = Instant::now() + Duration::from_secs(20);
        loop {
            if virsh_ok() {
                return Ok(Libvirt { ours: None });
            }
            let running = Command::new("pgrep")
                .args(["-x", "libvirtd"])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !running {
                break;
            }
            ensure!(
                Instant::now() < settle,
                "a libvirtd runs but `virsh -c {VIRSH_URI} list` does not answer (waited 20 s)"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        let dir = tempfile::tempdir()?;
        let conf = Path::new("/etc/libvirt/qemu.conf");
        let original = std::fs::read_to_string(conf).ok();
        let keys = [
            "security_driver",
            "user",
            "group",
            "cgroup_controllers",
            "remember_owner",
        ];
        let mut patched: String = original
            .as_deref()
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let t = l.trim_start();
                let set = keys.iter().any(|k| {
                    t.strip_prefix(k)
                        .is_some_and(|r| r.trim_start().starts_with('='))
                });
                if set {
                    format!("# (tests/cleaning_merged.rs) {l}\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        patched.push_str(
            "# --- added by tests/cleaning_merged.rs (restored when the test ends) ---\n\
             security_driver = \"none\"\nuser = \"root\"\ngroup = \"root\"\n\
             cgroup_controllers = [ ]\nremember_owner = 0\n",
        );
        let own = OwnDaemons {
            dir,
            qemu_conf: original,
            marker_created: false,
            run_created: !Path::new("/run/libvirt").exists(),
            virtlogd: false,
        };
        // From here on the drop guard restores what was changed.
        let mut me = Libvirt { ours: Some(own) };
        std::fs::write(conf, patched)?;
        for d in ["/run/libvirt/network", "/var/log/libvirt/qemu"] {
            std::fs::create_dir_all(d)?;
        }
        // Keep libvirt from autostarting its `default` network (host address and NAT).
        let marker = Path::new("/run/libvirt/network/autostarted");
        if !marker.exists() {
            std::fs::write(marker, "")?;
            if let Some(own) = me.ours.as_mut() {
                own.marker_created = true;
            }
        }
        let logd_running = Command::new("pgrep")
            .args(["-x", "virtlogd"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        let own = me.ours.as_mut().context("own daemons")?;
        if !logd_running {
            let pidf = own.dir.path().join("virtlogd.pid");
            let st = Command::new("virtlogd")
                .arg("-d")
                .arg("-p")
                .arg(&pidf)
                .status()?;
            ensure!(st.success(), "virtlogd did not start");
            own.virtlogd = true;
        }
        let pidf = own.dir.path().join("libvirtd.pid");
        let log = own.dir.path().join("libvirtd.log");
        let st = Command::new("libvirtd")
            .arg("-d")
            .arg("-p")
            .arg(&pidf)
            .env("LIBVIRT_LOG_OUTPUTS", format!("3:file:{}", log.display()))
            .status()?;
        ensure!(st.success(), "libvirtd did not start");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !virsh_ok() {
            ensure!(
                Instant::now() < deadline,
                "libvirtd does not answer: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(me)
    }
}

impl Drop for Libvirt {
    fn drop(&mut self) {
        let Some(own) = self.ours.take() else { return };
        // Someone else's guests (a lab started meanwhile) keep the daemon and its settings.
        let others = virsh(&["list", "--all", "--name"])
            .map(|s| s.lines().any(|l| !l.trim().is_empty()))
            .unwrap_or(false);
        if others {
            eprintln!("cleaning_merged: other libvirt domains exist; leaving libvirtd running");
            return;
        }
        let mut pids: Vec<i32> = pid_in(&own.dir.path().join("libvirtd.pid"))
            .into_iter()
            .collect();
        if own.virtlogd {
            pids.extend(pid_in(&own.dir.path().join("virtlogd.pid")));
        }
        for pid in &pids {
            kill_pid(*pid);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(orig) = &own.qemu_conf {
            let _ = std::fs::write("/etc/libvirt/qemu.conf", orig);
        }
        if own.run_created && !pids.iter().any(|p| alive(*p)) {
            let _ = std::fs::remove_dir_all("/run/libvirt");
        } else if own.marker_created {
            let _ = std::fs::remove_file("/run/libvirt/network/autostarted");
        }
    }
}

/// Our own domain, destroyed and undefined on drop.
struct Domain {
    name: String,
    uuid: String,
}

impl Domain {
    fn define(dir: &Path) -> Result<Domain> {
        let name = format!("rivet-merge-{}", std::process::id());
        let uuid = rivet_tests::peers::new_uuid();
        let qemu = ["/usr/bin/qemu-system-x86_64", "/usr/libexec/qemu-kvm"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .context("no qemu-system-x86_64")?;
        let xml = format!(
            "<domain type='qemu'>\n  <name>{name}</name>\n  <uuid>{uuid}</uuid>\n\
             <memory unit='MiB'>32</memory>\n  <vcpu>1</vcpu>\n\
             <os><type arch='x86_64' machine='pc'>hvm</type>\
             <loader readonly='yes' type='rom'>/usr/share/seabios/bios-256k.bin</loader>\
             <boot dev='hd'/></os>\n\
             <on_poweroff>destroy</on_poweroff><on_reboot>restart</on_reboot>\n\
             <devices><emulator>{qemu}</emulator><memballoon model='none'/></devices>\n\
             </domain>\n"
        );
        let file = dir.join("domain.xml");
        std::fs::write(&file, xml)?;
        // Leftovers of an earlier run of this same process id cannot exist; define fresh.
        virsh(&["define", &file.display().to_string()])?;
        Ok(Domain { name, uuid })
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        let _ = virsh(&["destroy", &self.name]);
        let _ = virsh(&["undefine", &self.name]);
    }
}

/// sushy-emulator (libvirt driver) on its own loopback port, serving only our domain. The
/// domain has no NIC, so a PXE boot override could not name a device: the emulator is told
/// to accept overrides without applying them (the agent runs on this host, not in the VM).
struct SushyLibvirt {
    child: Child,
    url: String,
    log: PathBuf,
    http: reqwest::blocking::Client,
}

impl SushyLibvirt {
    fn start(dir: &Path, domain: &Domain) -> Result<SushyLibvirt> {
        let port = free_port()?;
        let conf = dir.join("sushy.conf");
        std::fs::write(
            &conf,
            format!(
                "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\n\
                 SUSHY_EMULATOR_LISTEN_PORT = {port}\n\
                 SUSHY_EMULATOR_LIBVIRT_URI = '{VIRSH_URI}'\n\
                 SUSHY_EMULATOR_IGNORE_BOOT_DEVICE = True\n\
                 SUSHY_EMULATOR_ALLOWED_INSTANCES = ['{}', '{}']\n",
                domain.uuid, domain.name
            ),
        )?;
        let log = dir.join("sushy.log");
        let logf = std::fs::File::create(&log)?;
        let child = Command::new(lab_venv().join("bin/sushy-emulator"))
            .arg("--config")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf)
            .spawn()
            .context("starting sushy-emulator")?;
        let mut s = SushyLibvirt {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
            http: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(20))
                .build()?,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if s.get(&format!("/redfish/v1/Systems/{}", domain.uuid))
                .is_ok()
            {
                return Ok(s);
            }
            if Instant::now() > deadline || matches!(s.child.try_wait(), Ok(Some(_))) {
                bail!("sushy-emulator did not start:\n{}", s.log_text());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn get(&self, path: &str) -> Result<Value> {
        let r = self.http.get(format!("{}{path}", self.url)).send()?;
        ensure!(r.status().is_success(), "GET {path}: {}", r.status());
        Ok(r.json()?)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for SushyLibvirt {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn lab_venv() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(|p| p.join(".venv-lab"))
        .unwrap_or_else(|| PathBuf::from(".venv-lab"))
}

/// A MAC address of this host that the agent reports (physical interfaces first).
fn host_mac() -> Result<String> {
    let mut found: Vec<(bool, String, String)> = std::fs::read_dir("/sys/class/net")?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let mac = std::fs::read_to_string(e.path().join("address")).ok()?;
            let mac = mac.trim().to_ascii_lowercase();
            let usable = name != "lo" && mac.len() == 17 && mac != "00:00:00:00:00:00";
            usable.then(|| (!e.path().join("device").exists(), name, mac))
        })
        .collect();
    found.sort();
    found
        .into_iter()
        .next()
        .map(|(_, _, mac)| mac)
        .context("this host has no network interface with a MAC address")
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// `interface.step` of every finished clean step in the node's history since `from` (the
/// number of entries seen before), oldest first.
fn executed_steps(d: &Rivetd, node: &str, from: usize) -> Result<(Vec<String>, usize)> {
    let (s, v) = d.call(
        "GET",
        &format!("/v1/nodes/{node}/history?detail=true"),
        None,
    )?;
    ensure!(s == 200, "history: {s} {v}");
    let entries = v["history"].as_array().cloned().unwrap_or_default();
    // A finished step carries the user whose verb started the cleaning.
    for e in entries.iter().skip(from) {
        if e["event"]
            .as_str()
            .is_some_and(|t| t.starts_with("clean step "))
        {
            ensure!(
                e["user"].is_string(),
                "a clean step entry without its user: {e}"
            );
        }
    }
    let steps = entries
        .iter()
        .skip(from)
        .filter(|e| e["event_type"] == "cleaning")
        .filter_map(|e| {
            e["event"]
                .as_str()?
                .strip_prefix("clean step ")?
                .split_once(" done (")
                .map(|(step, _)| step.to_string())
        })
        .collect();
    Ok((steps, entries.len()))
}

fn bios_attr(sushy: &SushyLibvirt, uuid: &str, name: &str) -> Result<Value> {
    let sys = sushy.get(&format!("/redfish/v1/Systems/{uuid}"))?;
    let path = sys["Bios"]["@odata.id"]
        .as_str()
        .context("the emulator's System has no Bios link")?;
    Ok(sushy.get(path)?["Attributes"][name].clone())
}

fn bios_version(sushy: &SushyLibvirt, uuid: &str) -> Result<String> {
    let sys = sushy.get(&format!("/redfish/v1/Systems/{uuid}"))?;
    sys["BiosVersion"]
        .as_str()
        .map(str::to_string)
        .context("the emulator's System has no BiosVersion")
}

/// The minor part of `MAJOR.MINOR.PATCH` (what sushy's SimpleUpdate bumps).
fn minor(version: &str) -> Result<u64> {
    version
        .split('.')
        .nth(1)
        .and_then(|m| m.parse().ok())
        .with_context(|| format!("version {version:?} has no numeric minor part"))
}

#[test]
fn manual_and_automated_cleaning_merge_in_band_and_redfish_steps() -> Result<()> {
    let venv_ok = lab_venv().join("bin/sushy-emulator").exists();
    if !prerequisite(
        is_root()
            && have("losetup")
            && have("virsh")
            && have("libvirtd")
            && have("virtlogd")
            && venv_ok,
        "root, libvirt (virsh, libvirtd, virtlogd) and .venv-lab/bin/sushy-emulator (scripts/setup-lab.sh)",
    ) {
        return Ok(());
    }
    let _one = rivet_tests::libvirt_lock();
    let started = Instant::now();
    let dir = tempfile::tempdir()?;
    let _libvirt = Libvirt::up()?;
    let domain = Domain::define(dir.path())?;
    let sushy = SushyLibvirt::start(dir.path(), &domain)?;
    let uuid = domain.uuid.clone();

    // The agent's "machine": two loop devices and the vendor plugin.
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins)?;
    let plugin = plugins.join("acme-vendor");
    std::fs::write(&plugin, VENDOR_PLUGIN)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755))?;
    let mut loops = Vec::new();
    for i in 0..2 {
        let f = dir.path().join(format!("disk{i}.img"));
        std::fs::File::create(&f)?.set_len(16 << 20)?;
        loops.push(LoopDevice::attach(&f)?);
    }

    // bios.factory_reset gets the plugin step's priority: a tie the interface rank breaks.
    let conf = "[drivers]\npoll_interval_ms = 100\npower_wait_s = 20\n\
         [agent]\nlong_poll_s = 1\n[conductor]\ncheck_interval_s = 1\n\
         [cleaning]\npriority_overrides = {\"deploy.erase_devices\" = 0, \"bios.factory_reset\" = 50}\n";
    let d = Rivetd::start_in(dir.path(), conf)?;
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(json!({
            "driver": "redfish", "name": "merge", "deploy_interface": "direct",
            "automated_clean": true,
            // The test's domain is a SeaBIOS machine without ACPI (its loader named, so
            // sushy-tools reports Legacy): said here too, or a BMC that reported nothing
            // would be switched to rivetd's default, UEFI, which libvirt refuses without ACPI.
            "properties": {"capabilities": "boot_mode:bios"},
            "driver_info": {
                "redfish_address": sushy.url,
                "redfish_system_id": format!("/redfish/v1/Systems/{uuid}"),
                "redfish_username": "admin", "redfish_password": "merge-password",
            }
        })),
    )?;
    ensure!(s == 201, "{v}");
    let node_uuid = v["uuid"].as_str().unwrap_or_default().to_string();
    // The agent runs on this host: the node's port carries a MAC of this host, the one
    // the agent's lookup must find the node by.
    let mac = host_mac()?;
    let (s, v) = d.call(
        "POST",
        "/v1/ports",
        Some(json!({"node_uuid": node_uuid, "address": mac})),
    )?;
    ensure!(s == 201, "{v}");
    let diag = |what: &str, e: anyhow::Error| {
        anyhow::anyhow!(
            "{what}: {e}\n--- rivetd ---\n{}\n--- agent ---\n{}\n--- sushy ---\n{}",
            tail(&d.log_text()),
            tail(&std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default()),
            tail(&sushy.log_text())
        )
    };
    let settle = |what: &str, secs: u64| {
        d.wait_node("merge", Duration::from_secs(secs), |v| {
            v["target_provision_state"].is_null()
                && ["manageable", "available", "clean failed", "enroll"]
                    .iter()
                    .any(|s| v["provision_state"] == *s)
        })
        .map_err(|e| diag(what, e))
    };
    let (s, v) = d.call(
        "PUT",
        "/v1/nodes/merge/states/provision",
        Some(json!({"target": "manage"})),
    )?;
    ensure!(s == 202, "{v}");
    let n = settle("manage", 30)?;
    ensure!(n["provision_state"] == "manageable", "{n}");

    let dir_s = dir.path().display().to_string();
    let devices: Vec<&Path> = loops.iter().map(|l| l.path.as_path()).collect();
    // The node hint names no enrolled node (as a ramdisk booted without `rivet.node=`), so
    // rivetd finds the node by the port's MAC among those the agent reports.
    let no_such_node = rivet_tests::peers::new_uuid();
    let _agent = AgentProcess::start(
        &d.url,
        &no_such_node,
        &devices,
        Some(&plugins),
        &dir.path().join("agent.log"),
        &[("RIVET_TEST_DIR", dir_s.as_str())],
    )?;

    // ---- 1. Manual clean: the operator's order, firmware not abortable. ----
    assert_eq!(
        bios_attr(&sushy, &uuid, "ProcTurboMode")?,
        "Enabled",
        "emulator default"
    );
    let version_before = minor(&bios_version(&sushy, &uuid)?)?;
    let (_, seen) = executed_steps(&d, "merge", 0)?;
    let target = format!("/redfish/v1/Systems/{uuid}");
    let images: Vec<Value> = (1..=3)
        .map(|i| json!({"url": format!("http://127.0.0.1:9/bios-{i}.bin"), "targets": [target]}))
        .collect();
    let manual = json!([
        {"interface": "deploy", "step": "vendor_tune", "args": {"tag": "manual"}},
        {"interface": "firmware", "step": "update", "args": {"firmware_images": images}},
        {"interface": "bios", "step": "apply_configuration",
         "args": {"settings": [{"name": "ProcTurboMode", "value": "Disabled"}]}},
        {"interface": "deploy", "step": "erase_devices_metadata", "args": {}},
    ]);
    let t_manual = Instant::now();
    let (s, v) = d.call(
        "PUT",
        "/v1/nodes/merge/states/provision",
        Some(json!({"target": "clean", "clean_steps": manual})),
    )?;
    ensure!(s == 202, "{v}");

    // Abort while the firmware update runs: refused (409) with the node and the step named.
    let mut refusals: Vec<(u16, String)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, n) = d.call("GET", "/v1/nodes/merge", None)?;
        let state = n["provision_state"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if n["target_provision_state"].is_null() && state != "cleaning" {
            break;
        }
        let in_firmware = state == "cleaning"
            && n["clean_step"]["interface"] == "firmware"
            && n["clean_step"]["step"] == "update";
        if in_firmware && refusals.len() < 2 {
            let (s, v) = d.call(
                "PUT",
                "/v1/nodes/merge/states/provision",
                Some(json!({"target": "abort"})),
            )?;
            refusals.push((s, fault(&v)));
            let (s, v) = d.call("DELETE", "/v1/nodes/merge/provision", None)?;
            refusals.push((s, fault(&v)));
        }
        if Instant::now() > deadline {
            return Err(diag(
                "manual clean",
                anyhow::anyhow!("did not end in 60 s: {n}"),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let n = settle("manual clean", 5)?;
    let manual_secs = t_manual.elapsed().as_secs_f64();
    ensure!(
        n["provision_state"] == "manageable" && n["last_error"].is_null(),
        "{}",
        diag("manual clean", anyhow::anyhow!("ended as {n}"))
    );
    ensure!(
        !refusals.is_empty(),
        "the test never saw firmware.update running (no abort was tried)"
    );
    for (status, msg) in &refusals {
        assert_eq!(*status, 409, "{msg}");
        assert!(msg.contains("merge"), "names the node: {msg}");
        assert!(
            msg.contains("firmware.update") || msg.contains("bios.apply_configuration"),
            "names the running step: {msg}"
        );
        assert!(msg.contains("cannot be aborted"), "{msg}");
    }
    assert!(
        refusals.iter().any(|(_, m)| m.contains("firmware.update")),
        "{refusals:?}"
    );
    let (order, seen) = executed_steps(&d, "merge", seen)?;
    assert_eq!(
        order,
        [
            "deploy.vendor_tune",
            "firmware.update",
            "bios.apply_configuration",
            "deploy.erase_devices_metadata"
        ],
        "manual cleaning runs the operator's order"
    );
    // The emulator itself has the new setting and three firmware updates.
    assert_eq!(bios_attr(&sushy, &uuid, "ProcTurboMode")?, "Disabled");
    assert_eq!(minor(&bios_version(&sushy, &uuid)?)?, version_before + 3);
    let (s, v) = d.call("GET", "/v1/nodes/merge/bios/ProcTurboMode", None)?;
    ensure!(s == 200, "{v}");
    assert_eq!(v["ProcTurboMode"]["value"], "Disabled", "rivetd's cache");
    let vendor = std::fs::read_to_string(dir.path().join("vendor")).unwrap_or_default();
    assert_eq!(vendor.lines().collect::<Vec<_>>(), ["manual"]);

    // ---- 2. Automated clean: merged by priority, interface rank on ties. ----
    let t_auto = Instant::now();
    let (s, v) = d.call(
        "PUT",
        "/v1/nodes/merge/states/provision",
        Some(json!({"target": "provide"})),
    )?;
    ensure!(s == 202, "{v}");
    let n = settle("automated clean", 60)?;
    let auto_secs = t_auto.elapsed().as_secs_f64();
    ensure!(
        n["provision_state"] == "available" && n["last_error"].is_null(),
        "{}",
        diag("automated clean", anyhow::anyhow!("ended as {n}"))
    );
    let (order, _) = executed_steps(&d, "merge", seen)?;
    assert_eq!(
        order,
        [
            "deploy.erase_devices_metadata",
            "deploy.vendor_tune",
            "bios.factory_reset"
        ],
        "priority 99, then the tie at 50: deploy ranks above bios"
    );
    // factory_reset really reached the BMC: the emulator is back at its default.
    assert_eq!(bios_attr(&sushy, &uuid, "ProcTurboMode")?, "Enabled");
    let vendor = std::fs::read_to_string(dir.path().join("vendor")).unwrap_or_default();
    assert_eq!(vendor.lines().collect::<Vec<_>>(), ["manual", "automated"]);
    eprintln!(
        "cleaning_merged: manual clean {manual_secs:.1} s, automated clean {auto_secs:.1} s, \
         whole test {:.1} s; {} abort(s) refused, e.g. {:?}",
        started.elapsed().as_secs_f64(),
        refusals.len(),
        refusals.first()
    );
    Ok(())
}
