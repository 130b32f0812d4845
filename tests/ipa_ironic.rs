//! The IPA-compatible mode against a stock OpenStack Ironic: Ironic 39.0.0 from PyPI (the venv
//! `scripts/setup-ironic.sh` makes; one process, SQLite, noauth, no message bus) drives a
//! local `rivet-agent run --ironic …` on loop devices through its own API, exactly as it drives
//! ironic-python-agent: automated cleaning (metadata erase and a full erase: both disks read
//! back zero), a direct deploy of a raw and of a qcow2 image with a configdrive (the image's
//! bytes and a config-2 ISO with the node's uuid on the disk), undeploy back to available,
//! in-band inspection (the agent's inventory in Ironic's `/v1/nodes/{id}/inventory`), and an
//! abort in clean wait.
//!
//! The node is `fake-hardware` (power, boot, management `fake`; deploy `direct`; inspect
//! `agent`; raid `no-raid`), so nothing powers a machine: the test plays the machine. Every
//! power action Ironic takes (it stamps `driver_internal_info.last_power_state_change`) kills
//! the running agent, and whenever Ironic then waits for the ramdisk (clean wait, wait
//! call-back, inspect wait, rescue wait) with the power on, a fresh agent process "boots" —
//! as tests/qemu_deploy.rs starts a fresh VM per phase.
//!
//! Stock Ironic needs one thing a real lab would not: `properties.vendor = "lenovo"`: fake
//! management supports only the `pxe` boot device, so prepare_instance_boot's "boot from disk"
//! fails for every direct deploy on fake-hardware, except that Ironic skips that call for
//! Lenovo machines in UEFI mode (Ironic's default boot mode). See `IPA_CONFIG` for the
//! settings that make it quick.

use anyhow::{bail, ensure, Context, Result};
use rivet_tests::agentproc::{all_zero, have, is_root, read_at, write_at, LoopDevice};
use rivet_tests::fileserver::FileServer;
use rivet_tests::ironic_peer::{self, Ironic};
use rivet_tests::{bin, free_port, prerequisite, qemu, run_tool, sha256_file};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// The deploy target (the test image is 64 MiB; the configdrive partition goes after it).
const DISK0_MIB: u64 = 160;
/// A second disk, erased too.
const DISK1_MIB: u64 = 32;

/// What stock Ironic needs, on top of tests/ironic_peer.rs's base, to drive a loopback agent
/// quickly with no outside network. One line per reason:
const IPA_CONFIG: &str = "\
[DEFAULT]
# direct: the agent writes the image; fake stays for the base's other users.
enabled_deploy_interfaces = direct,fake
# agent: Ironic's built-in in-band inspection (continue_inspection), no ironic-inspector.
enabled_inspect_interfaces = agent,fake,no-inspect
[api]
# Handed to the agent in lookup's config; IPA heartbeats every 0.3-0.6 of it (default 300 s).
ramdisk_heartbeat_timeout = 6
[agent]
# require_tls stays true (the default): the agent serves IPA's API over automatic TLS and
# sends its self-signed certificate as agent_verify_ca, as IPA does.
# http (the default) hands a plain http image_source URL to the agent unchanged; only
# file:// URLs, Glance images or `local` make Ironic cache (and with force_raw_images
# convert qcow2 to raw) and re-serve the image from its own [deploy] http_url.
image_download_source = http
# tear_down_agent: fake power never reports the soft power-off, so do not poll it for 30 s.
post_deploy_get_power_state_retries = 0
post_deploy_get_power_state_retry_interval = 1
# Polling interval of commands Ironic waits for (install_bootloader) instead of 6 s.
command_wait_interval = 1
# A failed step should fail with the agent's error, not with a log collection attempt.
deploy_logs_collect = never
[conductor]
# manage → provide and undeploy run automated cleaning through the agent.
automated_clean = true
[deploy]
# Automated cleaning runs both: the metadata erase first, then the full erase.
erase_devices_metadata_priority = 99
erase_devices_priority = 10
# Full erase = one random pass then zeros (IPA's shred defaults, stated): disks read zero.
shred_random_overwrite_iterations = 1
shred_final_overwrite_with_zeros = true
[inspector]
# fake boot / noop network cannot boot the ramdisk for Ironic: unmanaged inspection (the
# ramdisk knows the callback URL itself, --inspection-callback).
require_managed_boot = false
[service_catalog]
# Ironic's own URL (no Keystone catalog): preparing cleaning and deploy builds the ramdisk's
# ipa-api-url from it, and fails without it (\"Couldn't get the URL of the Ironic API\").
endpoint_override = {url}
";

/// States in which Ironic waits for the ramdisk: a powered-on machine boots the agent.
const RAMDISK_WAITS: &[&str] = &[
    "clean wait",
    "wait call-back",
    "inspect wait",
    "rescue wait",
];
/// States that end a wait unless they are what the test waits for.
const FAILURES: &[&str] = &[
    "clean failed",
    "deploy failed",
    "inspect failed",
    "rescue failed",
    "error",
];

/// Everything the scenarios need; prints why not (skips) or fails under RIVET_REQUIRE_PEERS=1.
fn ready() -> bool {
    if !ironic_peer::available() {
        return false;
    }
    if !prerequisite(is_root(), "root (loop devices)") {
        return false;
    }
    let tools = [
        "losetup",
        "partx",
        "blkid",
        "sgdisk",
        "qemu-img",
        "osirrox",
        "xorrisofs",
    ];
    let missing: Vec<&str> = tools.iter().copied().filter(|t| !have(t)).collect();
    if !prerequisite(
        missing.is_empty(),
        &format!(
            "tools {} (scripts/setup.sh, scripts/setup-qemu.sh)",
            missing.join(", ")
        ),
    ) {
        return false;
    }
    if !prerequisite(
        qemu::kernel_package().is_some() && Path::new("/bin/busybox").is_file(),
        "a kernel package and busybox for the bootable test image (scripts/setup-qemu.sh)",
    ) {
        return false;
    }
    let agent = bin("rivet-agent");
    let ipa_mode = Command::new(&agent)
        .args(["run", "--help"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("--ironic"))
        .unwrap_or(false);
    prerequisite(
        ipa_mode,
        &format!(
            "{} with the IPA mode (`run --ironic`): cargo build --workspace --bins",
            agent.display()
        ),
    )
}

/// A MAC of one of this host's interfaces (what the agent reports in lookup).
fn host_mac() -> Result<String> {
    let mut macs = Vec::new();
    for e in std::fs::read_dir("/sys/class/net")? {
        let e = e?;
        if e.file_name() == "lo" {
            continue;
        }
        if let Ok(mac) = std::fs::read_to_string(e.path().join("address")) {
            let mac = mac.trim().to_lowercase();
            if mac.len() == 17 && mac != "00:00:00:00:00:00" {
                macs.push(mac);
            }
        }
    }
    macs.sort();
    macs.into_iter()
        .next()
        .context("no network interface with a MAC in /sys/class/net")
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The machine behind the fake-hardware node: runs a fresh agent process per ramdisk boot,
/// kills it on every power action.
struct Machine {
    ironic_url: String,
    node: String,
    devices: Vec<PathBuf>,
    dir: PathBuf,
    /// The node's NVRAM: a stand-in efivarfs the agent writes the instance's boot entry to
    /// (the node boots UEFI; the host's own firmware is never touched).
    efivars: PathBuf,
    agent: Option<Child>,
    /// `last_power_state_change` when the running (or last) agent booted.
    booted_at: Option<String>,
    /// The last power-action stamp seen.
    last_change: Option<String>,
    boots: usize,
    /// Whether the machine may boot the ramdisk at all (off: Ironic waits in vain).
    pub power_button: bool,
    /// Per boot: its log file.
    logs: Vec<PathBuf>,
    events: Vec<String>,
    t0: Instant,
}

impl Machine {
    fn new(ironic: &Ironic, node: &str, devices: &[&Path], dir: &Path) -> Result<Machine> {
        let efivars = dir.join("firmware/efi/efivars");
        std::fs::create_dir_all(&efivars)?;
        // What a UEFI firmware starts with: a network boot entry (a MAC device path) first.
        let mut pxe = 1u32.to_le_bytes().to_vec();
        let path: [u8; 41] = [
            3, 11, 37, 0, 0x52, 0x54, 0, 0x12, 0x34, 0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 0xff, 4, 0,
        ];
        pxe.extend_from_slice(&(path.len() as u16).to_le_bytes());
        pxe.extend(
            "UEFI PXEv4"
                .encode_utf16()
                .chain([0])
                .flat_map(u16::to_le_bytes),
        );
        pxe.extend_from_slice(&path);
        // efivarfs files: the attributes (NV|BS|RT) then the data.
        for (name, data) in [("Boot0000", pxe), ("BootOrder", vec![0, 0])] {
            std::fs::write(
                efivars.join(format!("{name}-8be4df61-93ca-11d2-aa0d-00e098032b8c")),
                [&7u32.to_le_bytes()[..], &data].concat(),
            )?;
        }
        Ok(Machine {
            ironic_url: ironic.url.clone(),
            node: node.to_string(),
            devices: devices.iter().map(|d| d.to_path_buf()).collect(),
            dir: dir.to_path_buf(),
            efivars,
            agent: None,
            booted_at: None,
            last_change: None,
            boots: 0,
            power_button: true,
            logs: Vec::new(),
            events: Vec::new(),
            t0: Instant::now(),
        })
    }

    fn event(&mut self, what: String) {
        let line = format!("{:7.2}s {what}", self.t0.elapsed().as_secs_f64());
        eprintln!("machine: {line}");
        self.events.push(line);
    }

    fn power_cut(&mut self, why: &str) {
        if let Some(mut c) = self.agent.take() {
            let _ = c.kill();
            let _ = c.wait();
            self.event(format!("agent boot {} killed: {why}", self.boots));
        }
    }

    /// Boot the ramdisk: a fresh `rivet-agent run --ironic …`.
    fn boot(&mut self, stamp: Option<String>, inspect: bool) -> Result<()> {
        self.boots += 1;
        let port = free_port()?;
        let log = self.dir.join(format!("agent-boot-{}.log", self.boots));
        let logf = std::fs::File::create(&log)?;
        let devs: Vec<String> = self
            .devices
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        let mut cmd = Command::new(bin("rivet-agent"));
        cmd.arg("run")
            .arg("--ironic")
            .arg(&self.ironic_url)
            .arg("--ipa-listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--devices")
            .arg(devs.join(","))
            .arg("--node")
            .arg(&self.node)
            .arg("--plugin-dir")
            .arg("/nonexistent");
        if inspect {
            cmd.arg("--inspection-callback")
                .arg(format!("{}/v1/continue_inspection", self.ironic_url));
        }
        let child = cmd
            .env("RIVET_LOG", "debug")
            .env("RIVET_EFIVARS", &self.efivars)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(logf)
            .spawn()
            .context("starting rivet-agent")?;
        self.agent = Some(child);
        self.booted_at = stamp;
        self.logs.push(log);
        self.event(format!(
            "agent boot {} (port {port}{})",
            self.boots,
            if inspect { ", inspection" } else { "" }
        ));
        Ok(())
    }

    /// Follow Ironic's power actions and waits for one observation of the node.
    fn tick(&mut self, node: &Value) -> Result<()> {
        let stamp = node["driver_internal_info"]["last_power_state_change"]
            .as_str()
            .map(str::to_string);
        let power = node["power_state"].as_str().unwrap_or_default();
        let state = node["provision_state"].as_str().unwrap_or_default();
        if stamp != self.last_change {
            self.last_change = stamp.clone();
            self.power_cut(&format!("power action ({power}) in {state}"));
        }
        if power == "power off" {
            self.power_cut("powered off");
        }
        if let Some(c) = self.agent.as_mut() {
            if let Some(status) = c.try_wait()? {
                // A ramdisk's agent runs until the power goes: it is not booted again in this
                // power cycle (a real machine would sit there too).
                self.agent = None;
                self.event(format!(
                    "agent boot {} exited by itself ({status}) in {state}",
                    self.boots
                ));
                ensure!(
                    status.success(),
                    "agent boot {} failed ({status}) in {state}",
                    self.boots
                );
            }
        }
        if self.agent.is_none()
            && self.power_button
            && power == "power on"
            && RAMDISK_WAITS.contains(&state)
            && (self.booted_at.is_none() || self.booted_at != stamp)
        {
            self.boot(stamp, state == "inspect wait")?;
        }
        Ok(())
    }

    /// Hang (SIGSTOP) or resume (SIGCONT) the running agent: a machine that stops answering.
    fn freeze(&mut self, hang: bool) -> Result<()> {
        let child = self.agent.as_ref().context("no agent runs")?;
        let pid = i32::try_from(child.id())?;
        let sig = if hang { libc::SIGSTOP } else { libc::SIGCONT };
        // SAFETY: kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(pid, sig) };
        ensure!(rc == 0, "kill({pid}): {}", std::io::Error::last_os_error());
        self.event(format!(
            "agent boot {} {}",
            self.boots,
            if hang {
                "hung (SIGSTOP)"
            } else {
                "resumed (SIGCONT)"
            }
        ));
        Ok(())
    }

    /// SIGKILL the agent if it runs (end of a scenario).
    fn halt(&mut self) {
        self.power_cut("scenario over");
    }

    fn diagnostics(&self) -> String {
        let mut out = format!("--- machine events:\n{}\n", self.events.join("\n"));
        for (i, log) in self.logs.iter().enumerate() {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let n = if i + 1 == self.logs.len() { 120 } else { 30 };
            out.push_str(&format!(
                "--- agent boot {} stderr ({}), last {n} lines:\n{}\n",
                i + 1,
                log.display(),
                tail(&text, n)
            ));
        }
        out
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        self.halt();
    }
}

/// One scenario: Ironic, two loop disks, the node, the machine, the image server.
struct Scene {
    ironic: Ironic,
    machine: Machine,
    uuid: String,
    mac: String,
    disk0: LoopDevice,
    disk1: LoopDevice,
    dir: tempfile::TempDir,
}

impl Scene {
    fn new() -> Result<Scene> {
        let dir = tempfile::tempdir()?;
        let f0 = dir.path().join("disk0.img");
        let f1 = dir.path().join("disk1.img");
        std::fs::File::create(&f0)?.set_len(DISK0_MIB * MIB)?;
        std::fs::File::create(&f1)?.set_len(DISK1_MIB * MIB)?;
        let disk0 = LoopDevice::attach(&f0)?;
        let disk1 = LoopDevice::attach(&f1)?;
        let ironic = Ironic::start_with("ironic-ipa", IPA_CONFIG)?;
        let mac = host_mac()?;
        let (code, node) = ironic.call(
            "POST",
            "/v1/nodes",
            Some(&json!({
                "name": "ipa-node",
                "driver": "fake-hardware",
                "boot_interface": "fake",
                "deploy_interface": "direct",
                "inspect_interface": "agent",
                "management_interface": "fake",
                "power_interface": "fake",
                "raid_interface": "no-raid",
                "properties": {
                    // See the module doc: lets prepare_instance_boot skip "boot from disk",
                    // which fake management refuses.
                    "vendor": "lenovo",
                    // IPA's root device hint: the deploy goes to disk0.
                    "root_device": {"name": disk0.path.display().to_string()},
                },
            })),
        )?;
        ensure!(code == 201, "creating the node: {code} {node}");
        let uuid = node["uuid"].as_str().context("node uuid")?.to_string();
        let (code, port) = ironic.call(
            "POST",
            "/v1/ports",
            Some(&json!({"node_uuid": uuid, "address": mac})),
        )?;
        ensure!(code == 201, "creating the port: {code} {port}");
        let machine = Machine::new(&ironic, &uuid, &[&disk0.path, &disk1.path], dir.path())?;
        Ok(Scene {
            ironic,
            machine,
            uuid,
            mac,
            disk0,
            disk1,
            dir,
        })
    }

    fn node(&self) -> Result<Value> {
        let (code, n) = self
            .ironic
            .call("GET", &format!("/v1/nodes/{}", self.uuid), None)?;
        ensure!(code == 200, "GET node: {code} {n}");
        Ok(n)
    }

    /// Ironic's log tail (without the test's own polling), the machine's events and every
    /// agent boot's stderr.
    fn diagnostics(&self) -> String {
        let poll = format!("GET /v1/nodes/{} - 200", self.uuid);
        let log = self.ironic.log_text();
        let lines: Vec<&str> = log.lines().filter(|l| !l.contains(&poll)).collect();
        format!(
            "{}--- ironic log (last 80 lines of {}, polling left out):\n{}",
            self.machine.diagnostics(),
            self.ironic.log.display(),
            lines[lines.len().saturating_sub(80)..].join("\n")
        )
    }

    /// `PUT /v1/nodes/{id}/states/provision`; 202 expected.
    fn verb(&mut self, body: Value) -> Result<()> {
        let (code, v) = self.ironic.call(
            "PUT",
            &format!("/v1/nodes/{}/states/provision", self.uuid),
            Some(&body),
        )?;
        if code != 202 {
            bail!(
                "{body}: {code} {}\n{}",
                rivet_tests::fault(&v),
                self.diagnostics()
            );
        }
        Ok(())
    }

    /// Poll the node (and play the machine) until `want`; fail on another failure state, on
    /// the agent dying, or after `secs`.
    fn wait(&mut self, want: &str, secs: u64) -> Result<Value> {
        self.wait_until(want, secs, |n| n["provision_state"] == want)
    }

    /// Poll until `done`; a failure state fails the wait unless `what` starts with it.
    fn wait_until(
        &mut self,
        what: &str,
        secs: u64,
        done: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let n = self.node()?;
            if let Err(e) = self.machine.tick(&n) {
                bail!("waiting for {what}: {e:#}\n{}", self.diagnostics());
            }
            if done(&n) {
                return Ok(n);
            }
            let state = n["provision_state"].as_str().unwrap_or_default();
            if FAILURES.contains(&state) && !what.starts_with(state) {
                bail!(
                    "waiting for {what}: node is {state:?}: {}\n{}",
                    n["last_error"],
                    self.diagnostics()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "waiting for {what}: still {state:?} (clean_step {}, deploy_step {}, \
                     power {}) after {secs} s\n{}",
                    n["clean_step"],
                    n["deploy_step"],
                    n["power_state"],
                    self.diagnostics()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Fill both disks with something cleaning must remove: a GPT with a partition, a
    /// filesystem-like signature, and non-zero bytes at the start, middle and end.
    fn dirty_disks(&self) -> Result<()> {
        for (disk, mib) in [(&self.disk0.path, DISK0_MIB), (&self.disk1.path, DISK1_MIB)] {
            run_tool(
                Command::new("sgdisk")
                    .args(["-o", "-n", "1:2048:0"])
                    .arg(disk),
            )?;
            let junk = vec![0xa5u8; 64 * 1024];
            for off in [MIB, mib * MIB / 2, mib * MIB - 2 * MIB] {
                write_at(disk, off, &junk)?;
            }
            ensure!(!all_zero(disk)?, "{} did not take the junk", disk.display());
        }
        Ok(())
    }

    fn disks_zero(&self) -> Result<()> {
        for disk in [&self.disk0.path, &self.disk1.path] {
            ensure!(
                all_zero(disk)?,
                "{} is not all zero after cleaning\n{}",
                disk.display(),
                self.diagnostics()
            );
        }
        Ok(())
    }

    /// Deploy `image_url` (checksum of the served file) with a JSON configdrive; `active`.
    fn deploy(&mut self, image_url: &str, checksum: &str, hostname: &str) -> Result<Value> {
        let (code, v) = self.ironic.call(
            "PATCH",
            &format!("/v1/nodes/{}", self.uuid),
            Some(&json!([
                {"op": "add", "path": "/instance_info/image_source", "value": image_url},
                {"op": "add", "path": "/instance_info/image_checksum", "value": checksum},
            ])),
        )?;
        ensure!(code == 200, "setting instance_info: {code} {v}");
        let t = Instant::now();
        self.verb(json!({
            "target": "active",
            "configdrive": {"meta_data": {"hostname": hostname}},
        }))?;
        let active = self.wait("active", 300)?;
        eprintln!(
            "deploy of {image_url}: active after {:.1} s",
            t.elapsed().as_secs_f64()
        );
        ensure!(active["last_error"].is_null(), "{active}");
        Ok(active)
    }

    /// The disk holds the image: its boot code and its partitions' bytes (the GPT headers are
    /// rewritten when the configdrive partition is added), and a config-2 ISO whose
    /// meta_data.json names this node and `hostname`.
    fn check_deployed(&self, image: &Path, hostname: &str) -> Result<()> {
        let disk = &self.disk0.path;
        let len = std::fs::metadata(image)?.len();
        ensure!(
            read_at(image, 0, 440)? == read_at(disk, 0, 440)?,
            "the disk's MBR boot code is not the image's\n{}",
            self.diagnostics()
        );
        // The image's partitions lie between its first and last MiB (GPT areas).
        let mut off = MIB;
        while off < len - MIB {
            let n = (len - MIB - off).min(8 * MIB) as usize;
            ensure!(
                read_at(image, off, n)? == read_at(disk, off, n)?,
                "the disk differs from the image within bytes {off}..{}\n{}",
                off + n as u64,
                self.diagnostics()
            );
            off += n as u64;
        }
        let part = config2_partition(disk)?;
        let meta = read_meta_data(&part, self.dir.path())?;
        ensure!(meta["uuid"] == self.uuid.as_str(), "meta_data.json: {meta}");
        ensure!(meta["hostname"] == hostname, "meta_data.json: {meta}");
        // Drop the partition devices again: the next erase sees the whole disk only.
        let _ = Command::new("partx")
            .arg("-d")
            .arg(disk)
            .stderr(Stdio::null())
            .status();
        Ok(())
    }

    /// Undeploy: tear down, automated cleaning through the agent, available.
    fn undeploy(&mut self) -> Result<()> {
        let t = Instant::now();
        self.verb(json!({"target": "deleted"}))?;
        let n = self.wait("available", 300)?;
        ensure!(n["instance_info"] == json!({}), "{n}");
        ensure!(n["instance_uuid"].is_null(), "{n}");
        eprintln!(
            "undeploy + cleaning: available after {:.1} s",
            t.elapsed().as_secs_f64()
        );
        self.disks_zero()
    }

    /// The clean steps Ironic started, in order, from its log ("Executing {…'step': 'NAME'…}
    /// on node UUID"; the dict's keys come in the agent's order).
    fn steps_started(&self) -> Vec<String> {
        self.ironic
            .log_text()
            .lines()
            .filter(|l| l.contains("ironic.conductor.cleaning") && l.contains(&self.uuid))
            .filter_map(|l| {
                let dict = l.split(" Executing {").nth(1)?;
                let s = dict.split("'step': '").nth(1)?;
                Some(s.split('\'').next()?.to_string())
            })
            .collect()
    }
}

/// The partition of `disk` whose filesystem label is config-2 (iso9660), by blkid.
fn config2_partition(disk: &Path) -> Result<PathBuf> {
    let _ = Command::new("partx").arg("-u").arg(disk).status();
    let name = disk
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut parts: Vec<PathBuf> = std::fs::read_dir("/dev")?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{name}p")))
            })
            .collect();
        parts.sort();
        for p in &parts {
            let out = Command::new("blkid")
                .args(["-p", "-o", "export"])
                .arg(p)
                .output()?;
            let text = String::from_utf8_lossy(&out.stdout);
            if text.contains("LABEL=config-2") && text.contains("TYPE=iso9660") {
                return Ok(p.clone());
            }
        }
        if Instant::now() > deadline {
            let table = run_tool(Command::new("sgdisk").arg("-p").arg(disk)).unwrap_or_default();
            bail!(
                "no partition labelled config-2 (iso9660) on {} (partitions {parts:?}):\n{table}",
                disk.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `openstack/latest/meta_data.json` of an ISO 9660 configdrive.
fn read_meta_data(iso: &Path, dir: &Path) -> Result<Value> {
    let out = dir.join("meta_data.json");
    let _ = std::fs::remove_file(&out);
    // xorriso takes a block device only with the stdio: prefix.
    run_tool(
        Command::new("osirrox")
            .arg("-indev")
            .arg(format!("stdio:{}", iso.display()))
            .args(["-extract", "/openstack/latest/meta_data.json"])
            .arg(&out),
    )?;
    Ok(serde_json::from_str(&std::fs::read_to_string(&out)?)?)
}

/// manage → provide (automated cleaning: metadata erase + full erase, both disks zero) →
/// deploy raw + configdrive → undeploy (cleaning) → deploy qcow2 + configdrive → undeploy.
#[test]
fn ironic_cleans_deploys_and_undeploys_through_the_agent() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let image = qemu::test_image()?;
    let mut sc = Scene::new()?;
    // The image server: the raw test image and its qcow2.
    let www = sc.dir.path().join("www");
    std::fs::create_dir(&www)?;
    let raw = www.join("image.raw");
    std::fs::copy(&image, &raw)?;
    let qcow2 = www.join("image.qcow2");
    run_tool(
        Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "qcow2"])
            .arg(&raw)
            .arg(&qcow2),
    )?;
    let files = FileServer::start(&www)?;

    // (1) manage → provide: automated cleaning in the agent.
    sc.dirty_disks()?;
    sc.verb(json!({"target": "manage"}))?;
    sc.wait("manageable", 60)?;
    let t = Instant::now();
    sc.verb(json!({"target": "provide"}))?;
    let n = sc.wait("available", 300)?;
    eprintln!(
        "automated cleaning: available after {:.1} s",
        t.elapsed().as_secs_f64()
    );
    ensure!(n["last_error"].is_null(), "{n}");
    let steps = sc.steps_started();
    ensure!(
        steps.first().map(String::as_str) == Some("erase_devices_metadata")
            && steps.iter().any(|s| s == "erase_devices"),
        "Ironic ran {steps:?}, not erase_devices_metadata then erase_devices\n{}",
        sc.diagnostics()
    );
    sc.disks_zero()?;

    // (2) deploy the raw image with a configdrive.
    let digest = sha256_file(&raw)?;
    sc.deploy(&files.url_of("image.raw"), &digest, "ipa-raw")?;
    sc.check_deployed(&raw, "ipa-raw")?;

    // (3) undeploy → cleaning → available, disks zero again.
    sc.undeploy()?;

    // (4) the same image as qcow2 (the checksum is the served file's).
    let digest = sha256_file(&qcow2)?;
    sc.deploy(&files.url_of("image.qcow2"), &digest, "ipa-qcow2")?;
    sc.check_deployed(&raw, "ipa-qcow2")?;
    sc.undeploy()?;
    sc.machine.halt();
    Ok(())
}

/// manageable → inspect: the agent posts its inventory to continue_inspection → manageable,
/// and Ironic's inventory endpoint shows the agent's disks and the node's interface.
#[test]
fn ironic_inspects_through_the_agent() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let mut sc = Scene::new()?;
    sc.verb(json!({"target": "manage"}))?;
    sc.wait("manageable", 60)?;
    let t = Instant::now();
    sc.verb(json!({"target": "inspect"}))?;
    sc.wait("inspect wait", 60)?;
    let n = sc.wait("manageable", 120)?;
    eprintln!(
        "inspection: manageable after {:.1} s",
        t.elapsed().as_secs_f64()
    );
    ensure!(n["last_error"].is_null(), "{n}\n{}", sc.diagnostics());
    ensure!(
        !n["inspection_finished_at"].is_null(),
        "inspection_finished_at not set: {n}"
    );
    let (code, inv) = sc
        .ironic
        .call("GET", &format!("/v1/nodes/{}/inventory", sc.uuid), None)?;
    ensure!(
        code == 200,
        "GET inventory: {code} {inv}\n{}",
        sc.diagnostics()
    );
    let inventory = &inv["inventory"];
    let disks: Vec<&str> = inventory["disks"]
        .as_array()
        .map(|d| d.iter().filter_map(|d| d["name"].as_str()).collect())
        .unwrap_or_default();
    for (disk, mib) in [(&sc.disk0.path, DISK0_MIB), (&sc.disk1.path, DISK1_MIB)] {
        let name = disk.display().to_string();
        let entry = inventory["disks"]
            .as_array()
            .and_then(|d| d.iter().find(|d| d["name"] == name.as_str()));
        ensure!(
            entry.is_some_and(|e| e["size"] == mib * MIB),
            "inventory disks {disks:?} lack {name} of {mib} MiB: {}",
            inventory["disks"]
        );
    }
    let macs: Vec<String> = inventory["interfaces"]
        .as_array()
        .map(|i| {
            i.iter()
                .filter_map(|i| i["mac_address"].as_str().map(str::to_lowercase))
                .collect()
        })
        .unwrap_or_default();
    ensure!(
        macs.contains(&sc.mac),
        "inventory interfaces {macs:?} lack the port's {}",
        sc.mac
    );
    // The default hooks ran on it: the architecture hook set cpu_arch.
    ensure!(
        n["properties"]["cpu_arch"].is_string(),
        "cpu_arch not set by inspection: {}",
        n["properties"]
    );
    sc.machine.halt();
    Ok(())
}

/// provide → abort in clean wait, once before the ramdisk boots and once while the agent runs
/// a clean step → clean failed, and manage works after each.
#[test]
fn ironic_aborts_cleaning_in_clean_wait() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let mut sc = Scene::new()?;
    sc.verb(json!({"target": "manage"}))?;
    sc.wait("manageable", 60)?;

    // Before the ramdisk boots: the machine stays off.
    sc.machine.power_button = false;
    sc.verb(json!({"target": "provide"}))?;
    sc.wait("clean wait", 60)?;
    sc.verb(json!({"target": "abort"}))?;
    // Ironic records clean failed first, then powers the node off.
    let n = sc.wait_until("clean failed, powered off", 60, |n| {
        n["provision_state"] == "clean failed" && n["power_state"] == "power off"
    })?;
    ensure!(
        n["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("aborted")),
        "{n}"
    );
    sc.verb(json!({"target": "manage"}))?;
    sc.wait("manageable", 60)?;
    ensure!(
        sc.machine.boots == 0,
        "the machine booted: {}",
        sc.diagnostics()
    );

    // While the agent runs a clean step: abort as soon as Ironic waits on a step.
    sc.machine.power_button = true;
    sc.dirty_disks()?;
    sc.verb(json!({"target": "provide"}))?;
    // The agent's erase of two loop disks takes well under a second, faster than an abort can
    // be aimed at it: the machine hangs (SIGSTOP) as soon as Ironic waits on a step, and the
    // abort comes while Ironic is not talking to it (no lock held, none taken for a quiet
    // half second: a heartbeat already sent would have been processed by then). Ironic does
    // not call the agent to abort, so a hung ramdisk is aborted as a busy one is.
    let mut tries = 0;
    loop {
        tries += 1;
        ensure!(
            tries <= 20,
            "could not catch cleaning in clean wait\n{}",
            sc.diagnostics()
        );
        let n = sc.wait_until("a clean step running in the agent", 120, |n| {
            n["provision_state"] == "available"
                || (n["provision_state"] == "clean wait"
                    && n["clean_step"]["step"].is_string()
                    && n["reservation"].is_null())
        })?;
        ensure!(
            n["provision_state"] != "available",
            "cleaning ended before the machine could hang in it\n{}",
            sc.diagnostics()
        );
        sc.machine.freeze(true)?;
        let quiet_until = Instant::now() + Duration::from_millis(500);
        let mut quiet = true;
        while Instant::now() < quiet_until {
            let n = sc.node()?;
            if n["provision_state"] != "clean wait" || !n["reservation"].is_null() {
                quiet = false;
                break;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        if quiet {
            break;
        }
        // Ironic was talking to the agent: let it answer, then try again.
        sc.machine.freeze(false)?;
    }
    let clean_step = sc.node()?["clean_step"]["step"].clone();
    sc.verb(json!({"target": "abort"}))?;
    // Ironic records clean failed first, then powers the node off.
    let n = sc.wait_until("clean failed, powered off", 60, |n| {
        n["provision_state"] == "clean failed" && n["power_state"] == "power off"
    })?;
    ensure!(
        n["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("aborted")),
        "{n}"
    );
    // The machine is off: the agent was killed with Ironic's power off.
    ensure!(
        sc.machine.agent.is_none(),
        "agent still running after abort"
    );
    eprintln!("aborted in clean wait during step {clean_step} (agent hung)");
    sc.verb(json!({"target": "manage"}))?;
    sc.wait("manageable", 60)?;
    sc.machine.halt();
    Ok(())
}
