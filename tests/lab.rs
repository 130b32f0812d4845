//! A server's whole life on VMs that behave like servers, driven through the public API only:
//! the lab of `scripts/lab.sh` (libvirt TCG guests, sushy-tools for Redfish and OpenIPMI's
//! ipmi_sim for IPMI and Serial-over-LAN in front of the same guests, a bridge and a network
//! namespace with dnsmasq) and a rivetd on the host that the guests reach through the lab's
//! forwarder.
//!
//! Both guests boot UEFI (OVMF; lab.json `firmware`), with 8 GiB disks and no root device
//! hint. The redfish node's image has its UEFI loader only at `\EFI\rivet\grubx64.efi`: the
//! firmware boots it only through the boot entry the agent writes. (The ipxe node's image
//! also has the removable path: its rescue is a network boot, after which OVMF drops the
//! entries QEMU's boot order does not name — a QEMU trait, not a server's.) The instance
//! prints the firmware it booted (`firmware=uefi secure_boot=0`) before its marker.
//!
//! - `rivet-lab-0`, redfish + `redfish-virtual-media`: enroll → manage (the BMC is verified)
//!   → inspect in the ramdisk (its MACs and disk size are the domain's) → provide (automated
//!   cleaning in the ramdisk) → deploy a whole-disk image with a configdrive → the guest boots
//!   from its disk and prints the configdrive's uuid on its serial console → power sync sees
//!   the instance power itself off → undeploy → cleaning → available, powered off. Then the
//!   same machine with `capabilities secure_boot:true` and Debian's signed shim/GRUB/kernel
//!   image: Rivet turns Secure Boot on through Redfish, the instance reports
//!   `secure_boot=1`, undeploy turns it off; and with `boot_mode:bios`: Rivet switches the
//!   BMC to Legacy, the instance reports `firmware=bios`. Then a deploy aborted while the
//!   ramdisk boots ends in `deploy failed` with the guest off.
//! - `rivet-lab-1`, ipmi + `ipxe`: the same from manage to active and back, at the same time,
//!   with its serial console (`ipmitool-socat`) enabled before the ramdisk first boots: rivetd
//!   holds a real SOL session with the guest's BMC (ipmi_sim, whose SOL device is the guest's
//!   serial port); a TCP viewer, a WebSocket viewer and rivetd's console log all show the
//!   ramdisk kernel booting and the instance's marker, and a second `ipmitool sol activate`
//!   is refused by the BMC. While active: rescue with a password → the ramdisk offers a login
//!   on its serial console; the test types through the console WebSocket: a wrong password is
//!   refused, the right one gives a shell as `rescue`, whose answer both viewers see.
//!   Disabling the console closes both viewers and lets a new SOL session in. Unrescue → the
//!   instance boots again. Then the node is deleted (maintenance) and a redfish node for the
//!   same instance is adopted (power, disk and console untouched) and serviced with
//!   `bios.apply_configuration` (ProcTurboMode flipped, read back from sushy-tools' Bios
//!   resource). Then fast track (`driver_info.fast_track`), while the other guest goes
//!   through its firmwares: the undeploy's cleaning leaves the ramdisk up, and a deploy right
//!   after starts `write_image` within a second of the request without a reboot (console
//!   checked); with fast track off again, the undeploy powers it off.
//! - Discovery: both nodes deleted, both guests PXE-boot as unknown machines; with
//!   `[discovery] enabled` rivetd serves them the ramdisk, which enrols one node per guest with
//!   the domain's MAC and powers it off.
//! - A redfish node whose BMC does not answer fails verification within 30 s.
//!
//! Each phase's duration is printed. One test, because the guests are slow (TCG): the phases
//! of both nodes run side by side. Measured on 2 shared cores: the scenario 190–290 s
//! depending on load (rescue, adopt and servicing overlap rivet-lab-0's longer inspect path;
//! discovery ≈ 35 s), plus the lab's bring-up; every wait has its own bound (at most 15 min
//! for one state). Needs root, scripts/setup-lab.sh's packages and
//! `cargo build --workspace --bins`; skips without them unless RIVET_REQUIRE_PEERS=1.

use anyhow::{bail, ensure, Context, Result};
use rivet_tests::{bin, prerequisite, run_tool, Rivetd};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Where the lab's forwarder sends the guests' requests (lab.sh: 192.168.240.1:6385 → here).
const RIVETD_PORT: u16 = 16385;
/// What the guests call rivetd.
const PUBLIC_URL: &str = "http://192.168.240.1:6385";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn ready() -> bool {
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    prerequisite(
        is_root,
        "root (the lab makes a bridge, a namespace and VMs)",
    ) && prerequisite(
        Path::new("/usr/sbin/libvirtd").exists() && Path::new("/usr/sbin/dnsmasq").exists(),
        "libvirt and dnsmasq (scripts/setup-lab.sh installs them)",
    ) && prerequisite(
        root().join(".venv-lab/bin/sushy-emulator").exists(),
        "sushy-tools in .venv-lab (scripts/setup-lab.sh)",
    ) && prerequisite(
        rivet_tests::peers::have_ipmi_sim(),
        "ipmi_sim and ipmitool, the lab's IPMI BMCs (scripts/setup-lab.sh)",
    ) && prerequisite(
        bin("rivetd").exists(),
        "rivetd is not built: cargo build --workspace --bins",
    )
}

fn lab_sh(args: &[&str]) -> Command {
    let mut c = Command::new("bash");
    c.arg(root().join("scripts/lab.sh"))
        .args(args)
        .current_dir(root());
    c
}

/// The lab for this test. A lab that was already up (a user's, kept between runs) stays up;
/// one this test brought up is taken down again when the test ends, however it ends, so no
/// daemon or VM outlives the run.
struct Lab {
    json: Value,
    take_down: bool,
}

impl Drop for Lab {
    fn drop(&mut self) {
        if self.take_down {
            if let Err(e) = run_tool(&mut lab_sh(&["down"])) {
                eprintln!("lab: scripts/lab.sh down failed: {e:#}");
            }
        }
    }
}

/// `scripts/lab.sh up` (idempotent) and its lab.json.
fn lab_up(nodes: usize) -> Result<Lab> {
    let t = Instant::now();
    let was_up = lab_sh(&["status"])
        .output()
        .is_ok_and(|o| o.status.success());
    let mut lab = Lab {
        json: Value::Null,
        take_down: !was_up,
    };
    run_tool(&mut lab_sh(&[
        "up",
        "--nodes",
        &nodes.to_string(),
        "--no-rivetd",
    ]))
    .context("scripts/lab.sh up")?;
    eprintln!("lab: up in {:.1?} (already up: {was_up})", t.elapsed());
    let text = std::fs::read_to_string(root().join("target/lab/lab.json"))?;
    lab.json = serde_json::from_str(&text)?;
    Ok(lab)
}

/// Phase timings, printed as they end.
struct Clock {
    lines: std::sync::Mutex<Vec<String>>,
}

impl Clock {
    fn phase<T>(&self, node: &str, phase: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let t = Instant::now();
        let r = f().with_context(|| format!("{node}: {phase}"))?;
        let line = format!(
            "{node:<14} {phase:<40} {:>7.1} s",
            t.elapsed().as_secs_f64()
        );
        eprintln!("lab: {line}");
        if let Ok(mut l) = self.lines.lock() {
            l.push(line);
        }
        Ok(r)
    }
}

/// A node of the lab and how to reach its console.
struct Guest {
    name: String,
    /// The firmware lab.sh gave the domain: `uefi`, `secure-boot` or `bios`.
    firmware: String,
    mac: String,
    disk_bytes: u64,
    serial_log: PathBuf,
    /// lab.json's `ipmi`: the guest's IPMI BMC (ipmi_sim, with SOL onto the serial port).
    ipmi: Value,
    /// The domain's disk file.
    disk: PathBuf,
    node: Value,
    /// The guest's Redfish BMC, to check what Rivet did through it.
    redfish: Redfish,
}

/// Reads from a lab guest's Redfish BMC (sushy-tools).
struct Redfish {
    address: String,
    system: String,
    username: String,
    password: String,
}

impl Redfish {
    fn get(&self, path: &str) -> Result<Value> {
        let r = reqwest::blocking::Client::new()
            .get(format!("{}{path}", self.address))
            .basic_auth(&self.username, Some(&self.password))
            .timeout(Duration::from_secs(10))
            .send()?;
        ensure!(r.status().is_success(), "GET {path}: {}", r.status());
        Ok(r.json()?)
    }

    fn send(&self, method: reqwest::Method, path: &str, body: Value) -> Result<()> {
        let r = reqwest::blocking::Client::new()
            .request(method.clone(), format!("{}{path}", self.address))
            .basic_auth(&self.username, Some(&self.password))
            .json(&body)
            .timeout(Duration::from_secs(30))
            .send()?;
        ensure!(
            r.status().is_success(),
            "{method} {path} {body}: {}",
            r.status()
        );
        Ok(())
    }

    /// Boot from the network and power on, as an operator racking a new machine would.
    fn pxe_boot(&self) -> Result<()> {
        self.send(
            reqwest::Method::PATCH,
            &self.system,
            json!({"Boot": {"BootSourceOverrideTarget": "Pxe",
                            "BootSourceOverrideEnabled": "Continuous"}}),
        )?;
        self.send(
            reqwest::Method::POST,
            &format!("{}/Actions/ComputerSystem.Reset", self.system),
            json!({"ResetType": "On"}),
        )
    }

    /// The BIOS attributes the BMC reports.
    fn bios(&self) -> Result<Value> {
        let sys = self.get(&self.system)?;
        let path = sys["Bios"]["@odata.id"]
            .as_str()
            .context("the system has no Bios link")?;
        Ok(self.get(path)?["Attributes"].clone())
    }

    /// `Boot.BootSourceOverrideMode` (`UEFI`/`Legacy`) and `SecureBootEnable`.
    fn boot_mode(&self) -> Result<(String, bool)> {
        let sys = self.get(&self.system)?;
        let mode = sys["Boot"]["BootSourceOverrideMode"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        // In Legacy mode sushy-tools refuses the SecureBoot resource (501): off.
        let secure = match sys["SecureBoot"]["@odata.id"].as_str() {
            Some(p) if mode != "Legacy" => self.get(p)?["SecureBootEnable"].as_bool() == Some(true),
            _ => false,
        };
        Ok((mode, secure))
    }

    fn power(&self) -> Result<String> {
        Ok(self.get(&self.system)?["PowerState"]
            .as_str()
            .unwrap_or_default()
            .to_string())
    }

    /// Whether any virtual CD holds an image.
    fn cd_inserted(&self) -> Result<bool> {
        let list = self.get(&format!("{}/VirtualMedia", self.system))?;
        for m in list["Members"].as_array().into_iter().flatten() {
            let dev = self.get(m["@odata.id"].as_str().unwrap_or_default())?;
            if dev["Inserted"].as_bool() == Some(true) {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

impl Guest {
    fn serial_len(&self) -> u64 {
        std::fs::metadata(&self.serial_log)
            .map(|m| m.len())
            .unwrap_or(0)
    }

    /// Serial output written since byte `from`.
    fn serial_since(&self, from: u64) -> String {
        let bytes = std::fs::read(&self.serial_log).unwrap_or_default();
        let from = (from as usize).min(bytes.len());
        String::from_utf8_lossy(&bytes[from..]).to_string()
    }

    fn serial_tail(&self, from: u64, n: usize) -> String {
        let s = self.serial_since(from);
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

fn verb(d: &Rivetd, uuid: &str, body: Value) -> Result<()> {
    let (s, v) = d.call(
        "PUT",
        &format!("/v1/nodes/{uuid}/states/provision"),
        Some(body.clone()),
    )?;
    ensure!(s == 202, "{body}: {s} {v}");
    Ok(())
}

/// Wait for `want`; a failed state or the deadline is an error showing the node, the guest's
/// console and rivetd's log.
fn wait_state(
    d: &Rivetd,
    g: &Guest,
    uuid: &str,
    want: &str,
    secs: u64,
    since: u64,
) -> Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let n = d.node(uuid)?;
        let state = n["provision_state"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if state == want {
            return Ok(n);
        }
        if (state.ends_with("failed") && !want.ends_with("failed")) || Instant::now() > deadline {
            let log = d.log_text();
            let lines: Vec<&str> = log.lines().filter(|l| l.contains(uuid)).collect();
            bail!(
                "{} is {state:?}, not {want:?}: {}\n--- serial console (tail):\n{}\n--- rivetd log for the node (tail):\n{}",
                g.name,
                n["last_error"],
                g.serial_tail(since, 40),
                lines[lines.len().saturating_sub(30)..].join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn wait_console(g: &Guest, needle: &str, since: u64, secs: u64) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let text = g.serial_since(since);
        if let Some(line) = text.lines().find(|l| l.contains(needle)) {
            return Ok(line.trim().to_string());
        }
        if Instant::now() > deadline {
            bail!(
                "{} did not print {needle:?} in {secs} s; console tail:\n{}",
                g.name,
                g.serial_tail(since, 40)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The whole-disk image the lab serves to guests.
struct Image {
    url: String,
    sha256: String,
}

/// How a node's life starts.
#[derive(Clone, Copy, PartialEq)]
enum Start {
    /// Enrol without ports; in-band inspection finds them (virtual media needs none).
    Inspect,
    /// Enrol with the guest's port (iPXE finds its node by MAC), no inspection.
    WithPort,
}

/// Where a [`lifecycle`] leaves its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Undeployed (cleaning) → available, powered off.
    Available,
    /// Still active, for what comes next to undeploy.
    Active,
}

/// enroll → manage → (inspect) → provide → deploy → the instance boots → power sync →
/// undeploy.
/// With `more` (the ipmi node), the node's serial console is enabled before its ramdisk first
/// boots (see [`NodeConsole`]): two viewers and rivetd's log show the ramdisk kernel's boot and
/// the instance's marker, and the BMC refuses a second SOL session; the active node is then
/// rescued (logged in through the console), the console disabled, and the node adopted and
/// serviced before its undeploy (see [`rescue_adopt_service`]).
fn lifecycle(
    d: &Rivetd,
    clock: &Clock,
    g: &Guest,
    image: &Image,
    start: Start,
    more: bool,
    end: End,
) -> Result<String> {
    let name = g.name.as_str();
    let inspect = start == Start::Inspect;
    let uuid = if inspect {
        let (s, v) = d.call("POST", "/v1/nodes", Some(g.node.clone()))?;
        ensure!(s == 201, "enroll {name}: {s} {v}");
        v["uuid"].as_str().context("uuid")?.to_string()
    } else {
        d.create_node_with_port(g.node.clone(), &g.mac)?
    };

    clock.phase(name, "manage (verify the BMC)", || {
        verb(d, &uuid, json!({"target": "manage"}))?;
        wait_state(d, g, &uuid, "manageable", 60, g.serial_len())
    })?;
    let console = if more {
        Some(clock.phase(
            name,
            "console: enable, a TCP and a WebSocket viewer",
            || NodeConsole::enable(d, g, &uuid),
        )?)
    } else {
        None
    };
    let marks = console.as_ref().map(NodeConsole::marks);

    if inspect {
        let n = clock.phase(name, "inspect (in-band, ramdisk)", || {
            let since = g.serial_len();
            verb(d, &uuid, json!({"target": "inspect"}))?;
            wait_state(d, g, &uuid, "manageable", 600, since)
        })?;
        let (s, inv) = d.call("GET", &format!("/v1/nodes/{uuid}/inventory"), None)?;
        ensure!(s == 200, "inventory: {s} {inv}");
        let macs: Vec<String> = inv["inventory"]["interfaces"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["mac_address"].as_str().map(str::to_lowercase))
            .collect();
        ensure!(
            macs.contains(&g.mac),
            "{name}: inventory MACs {macs:?} lack the domain's {}",
            g.mac
        );
        let sizes: Vec<u64> = inv["inventory"]["disks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d["size"].as_u64())
            .collect();
        ensure!(
            sizes.contains(&g.disk_bytes),
            "{name}: inventory disk sizes {sizes:?} lack the domain's {} bytes",
            g.disk_bytes
        );
        let (s, ports) = d.call("GET", &format!("/v1/ports?node={uuid}"), None)?;
        ensure!(s == 200, "{ports}");
        ensure!(
            ports["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|p| p["address"] == g.mac.as_str()),
            "{name}: inspection made no port for {}: {ports} (node: {n})",
            g.mac
        );
    }

    clock.phase(name, "provide (automated cleaning)", || {
        let since = g.serial_len();
        verb(d, &uuid, json!({"target": "provide"}))?;
        let n = wait_state(d, g, &uuid, "available", 600, since)?;
        ensure!(
            n["power_state"] == "power off",
            "{name} is not off after cleaning: {n}"
        );
        Ok(())
    })?;
    if let (Some(c), Some(from)) = (&console, marks) {
        clock.phase(name, "console: ramdisk boot seen; 2nd SOL refused", || {
            // The ramdisk kernel's command line, as it prints it while booting.
            c.everywhere(d, "rivet.controller=", from, 30)?;
            c.second_session_refused()
        })?;
    }

    set_image(d, &uuid, image)?;
    let marks = console.as_ref().map(NodeConsole::marks);
    let since = g.serial_len();
    let active = clock.phase(name, "deploy → active", || {
        let t = Instant::now();
        verb(
            d,
            &uuid,
            json!({"target": "active", "configdrive": {"meta_data": {"hostname": name}}}),
        )?;
        // What fast track saves: without it, the ramdisk boots before write_image starts.
        let n = d.wait_node(&uuid, Duration::from_secs(600), |n| {
            n["deploy_step"]["step"] == "write_image"
                || n["provision_state"] != "deploying" && n["provision_state"] != "wait call-back"
        })?;
        if n["deploy_step"]["step"] == "write_image" {
            eprintln!(
                "lab: {name}: deploy request → write_image {:.1?} (ramdisk booted)",
                t.elapsed()
            );
        }
        wait_state(d, g, &uuid, "active", 900, since)
    })?;
    // On UEFI the agent wrote the firmware's boot entry for the image's only loader.
    let entry = &active["driver_internal_info"]["deployed_image"]["uefi_boot_entry"];
    if g.firmware == "bios" {
        ensure!(
            entry.is_null(),
            "{name}: a boot entry on a BIOS node: {entry}"
        );
    } else {
        ensure!(
            entry["loader"] == "\\EFI\\rivet\\grubx64.efi",
            "{name}: the agent's boot entry: {entry}"
        );
    }
    if start == Start::Inspect {
        // Virtual media: the CD went before the instance booted.
        ensure!(
            !g.redfish.cd_inserted()?,
            "{name}: the ramdisk's CD is still inserted while active"
        );
    }
    let line = clock.phase(name, "active → instance marker on console", || {
        wait_console(g, rivet_image_build::testimage::MARKER, since, 300)
    })?;
    ensure!(
        line.ends_with(&format!("uuid={uuid}")),
        "{name}: the instance did not read the configdrive Rivet wrote: {line:?}"
    );
    if let (Some(c), Some(from)) = (&console, marks) {
        c.everywhere(d, &line, from, 30)?;
    }
    let want = if g.firmware == "bios" {
        "bios secure_boot=none"
    } else {
        "uefi secure_boot=0"
    };
    instance_firmware(g, since, want)?;
    // The test instance powers itself off after its marker: behind Rivet's back.
    clock.phase(name, "power sync sees the instance off", || {
        d.wait_node(&uuid, Duration::from_secs(60), |n| {
            n["power_state"] == "power off"
        })
    })?;

    let uuid = match console {
        Some(c) => rescue_adopt_service(d, clock, g, image, &uuid, c)?,
        None => uuid,
    };
    if end == End::Active {
        return Ok(uuid);
    }

    clock.phase(name, "undeploy → cleaning → available", || {
        let since = g.serial_len();
        verb(d, &uuid, json!({"target": "deleted"}))?;
        let n = wait_state(d, g, &uuid, "available", 900, since)?;
        ensure!(
            n["power_state"] == "power off",
            "{name} is not off after undeploy: {n}"
        );
        ensure!(n["instance_info"] == json!({}), "{n}");
        Ok(())
    })?;
    Ok(uuid)
}

/// What the booted instance printed about its firmware since `since` (its line before the
/// marker): `want` is e.g. `uefi secure_boot=1`.
fn instance_firmware(g: &Guest, since: u64, want: &str) -> Result<()> {
    let marker = rivet_image_build::testimage::FIRMWARE_MARKER;
    let out = g.serial_since(since);
    let seen = out
        .lines()
        .filter_map(|l| {
            l.find(marker)
                .map(|i| l[i + marker.len()..].trim().to_string())
        })
        .next_back();
    ensure!(
        seen.as_deref() == Some(want),
        "{}: the instance reports firmware {seen:?}, expected {want:?}",
        g.name
    );
    Ok(())
}

/// The virtual-media node, once more through a firmware other than its default, set the way
/// an operator sets it on Ironic: `instance_info.capabilities` `secure_boot:true` (with the
/// signed image) and then `properties.capabilities` `boot_mode:bios`. Each: deploy → the
/// instance reports the firmware it booted → the BMC says so; Secure Boot's undeploy turns it
/// off, and so does each undeploy.
fn firmware_variants(
    d: &Rivetd,
    clock: &Clock,
    g: &Guest,
    image: &Image,
    signed: &Image,
    uuid: &str,
) -> Result<()> {
    let name = g.name.as_str();
    let deploy = |image: &Image, caps: Option<Value>| -> Result<u64> {
        set_image(d, uuid, image)?;
        if let Some(caps) = caps {
            let (s, v) = d.call(
                "PATCH",
                &format!("/v1/nodes/{uuid}"),
                Some(json!([{"op": "add", "path": "/instance_info/capabilities", "value": caps}])),
            )?;
            ensure!(s == 200, "instance_info capabilities: {s} {v}");
        }
        let since = g.serial_len();
        verb(
            d,
            uuid,
            json!({"target": "active", "configdrive": {"meta_data": {"hostname": name}}}),
        )?;
        wait_state(d, g, uuid, "active", 900, since)?;
        let line = wait_console(g, rivet_image_build::testimage::MARKER, since, 300)?;
        ensure!(line.ends_with(&format!("uuid={uuid}")), "{name}: {line:?}");
        Ok(since)
    };
    let undeploy = || -> Result<()> {
        let since = g.serial_len();
        verb(d, uuid, json!({"target": "deleted"}))?;
        wait_state(d, g, uuid, "available", 900, since)?;
        Ok(())
    };
    if g.firmware != "bios" {
        clock.phase(name, "Secure Boot: signed image → active", || {
            let since = deploy(signed, Some(json!({"secure_boot": "true"})))?;
            instance_firmware(g, since, "uefi secure_boot=1")?;
            let (mode, secure) = g.redfish.boot_mode()?;
            ensure!(
                mode == "UEFI" && secure,
                "{name}: the BMC reports {mode}, Secure Boot {secure}"
            );
            let n = d.node(uuid)?;
            ensure!(n["boot_mode"] == "uefi" && n["secure_boot"] == true, "{n}");
            Ok(())
        })?;
        clock.phase(name, "Secure Boot: undeploy turns it off", || {
            undeploy()?;
            let (_, secure) = g.redfish.boot_mode()?;
            ensure!(!secure, "{name}: Secure Boot still on after undeploy");
            Ok(())
        })?;
    }
    clock.phase(name, "BIOS (boot_mode:bios) → active", || {
        let (s, v) = d.call(
            "PATCH",
            &format!("/v1/nodes/{uuid}"),
            Some(json!([{"op": "add", "path": "/properties/capabilities", "value": "boot_mode:bios"}])),
        )?;
        ensure!(s == 200, "capabilities: {s} {v}");
        let since = deploy(image, None)?;
        instance_firmware(g, since, "bios secure_boot=none")?;
        let (mode, _) = g.redfish.boot_mode()?;
        ensure!(mode == "Legacy", "{name}: the BMC reports boot mode {mode}");
        undeploy()
    })?;
    // Back to the lab's firmware for whatever runs next.
    let back = if g.firmware == "bios" {
        "boot_mode:bios"
    } else {
        "boot_mode:uefi"
    };
    let (s, v) = d.call(
        "PATCH",
        &format!("/v1/nodes/{uuid}"),
        Some(json!([{"op": "add", "path": "/properties/capabilities", "value": back}])),
    )?;
    ensure!(s == 200, "capabilities: {s} {v}");
    Ok(())
}

/// Fast track (`driver_info.fast_track`), Ironic's: cleaning leaves the ramdisk running
/// on the powered-on, available node; a deploy right after starts `write_image` on it within
/// a second of the request, with no reboot (the serial console shows neither firmware nor
/// kernel start between the end of cleaning and the image written). The node starts active
/// (the end of its [`lifecycle`]): its undeploy's cleaning is the one that keeps the ramdisk
/// (one ramdisk boot less than a separate manage → provide). Fast track is then turned off
/// again, and the undeploy takes the usual path, ending powered off.
fn fast_track(d: &Rivetd, clock: &Clock, g: &Guest, image: &Image, uuid: &str) -> Result<()> {
    let name = g.name.as_str();
    let set_fast_track = |on: bool| -> Result<()> {
        let (s, v) = d.call(
            "PATCH",
            &format!("/v1/nodes/{uuid}"),
            Some(json!([{"op": "add", "path": "/driver_info/fast_track", "value": on}])),
        )?;
        ensure!(s == 200, "driver_info.fast_track: {s} {v}");
        Ok(())
    };
    set_fast_track(true)?;
    let cleaned = clock.phase(
        name,
        "fast track: undeploy → cleaning (ramdisk kept)",
        || {
            let since = g.serial_len();
            verb(d, uuid, json!({"target": "deleted"}))?;
            let n = wait_state(d, g, uuid, "available", 900, since)?;
            ensure!(
                n["power_state"] == "power on",
                "{name}: with fast track the node stays on after cleaning: {n}"
            );
            ensure!(n["instance_info"] == json!({}), "{n}");
            Ok(g.serial_len())
        },
    )?;
    set_image(d, uuid, image)?;
    let waited = clock.phase(name, "fast track: deploy request → write_image", || {
        let t = Instant::now();
        verb(
            d,
            uuid,
            json!({"target": "active", "configdrive": {"meta_data": {"hostname": name}}}),
        )?;
        loop {
            let n = d.node(uuid)?;
            if n["deploy_step"]["step"] == "write_image" {
                return Ok(t.elapsed());
            }
            ensure!(
                t.elapsed() < Duration::from_secs(30),
                "{name}: write_image did not start within 30 s of the deploy: {n}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    })?;
    eprintln!("lab: fast track: deploy request → write_image {waited:.2?}");
    // Without fast track the ramdisk boots first: 17–18 s on a quiet machine, never under 8 s
    // (docs/numbers.md), and a loaded machine slows that boot far more than this round trip.
    // Seen with fast track: 1.7 s with three builds beside the run, 5.7 s at a load of 11 on
    // two cores (the guest is TCG). The console check below is what proves no boot happened.
    ensure!(
        waited < Duration::from_secs(8),
        "{name}: with fast track write_image started {waited:?} after the request"
    );
    clock.phase(name, "fast track: active, no reboot before it", || {
        let n = d.wait_node(uuid, Duration::from_secs(600), |n| {
            n["deploy_step"]["step"] != "write_image"
        })?;
        ensure!(n["provision_state"] != "deploy failed", "{n}");
        let between = g.serial_since(cleaned);
        // Firmware banners (OVMF's, SeaBIOS's) and the kernel's.
        for boot in ["BdsDxe", "SeaBIOS", "Linux version"] {
            ensure!(
                !between.contains(boot),
                "{name}: the guest booted ({boot:?}) between cleaning and write_image:\n{}",
                g.serial_tail(cleaned, 30)
            );
        }
        wait_state(d, g, uuid, "active", 900, cleaned)?;
        let line = wait_console(g, rivet_image_build::testimage::MARKER, cleaned, 300)?;
        ensure!(line.ends_with(&format!("uuid={uuid}")), "{name}: {line:?}");
        Ok(())
    })?;
    set_fast_track(false)?;
    clock.phase(name, "undeploy → cleaning → available", || {
        let since = g.serial_len();
        verb(d, uuid, json!({"target": "deleted"}))?;
        let n = wait_state(d, g, uuid, "available", 900, since)?;
        ensure!(
            n["power_state"] == "power off",
            "{name} is not off after undeploy: {n}"
        );
        Ok(())
    })
}

/// A viewer of a node's console read by a thread of its own while the scenario goes on: what
/// it received so far and whether its connection ended. Dropping it stops and joins the
/// thread.
struct Tap {
    what: &'static str,
    seen: Arc<Mutex<Vec<u8>>>,
    closed: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    /// Keystrokes to send (the WebSocket viewer only).
    keys: Option<mpsc::Sender<Vec<u8>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn locked(m: &Mutex<Vec<u8>>) -> std::sync::MutexGuard<'_, Vec<u8>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Tap {
    fn new(what: &'static str) -> Tap {
        Tap {
            what,
            seen: Arc::new(Mutex::new(Vec::new())),
            closed: Arc::new(AtomicBool::new(false)),
            stop: Arc::new(AtomicBool::new(false)),
            keys: None,
            thread: None,
        }
    }

    /// The raw TCP console (`console_info.url`), as `socat`/`telnet` users read it.
    fn tcp(port: u16) -> Result<Tap> {
        use std::io::Read;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port))
            .with_context(|| format!("connect to the TCP console on port {port}"))?;
        s.set_read_timeout(Some(Duration::from_millis(200)))?;
        let mut tap = Tap::new("TCP viewer");
        let (seen, closed, stop) = (tap.seen.clone(), tap.closed.clone(), tap.stop.clone());
        tap.thread = Some(std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            while !stop.load(Ordering::Relaxed) {
                match s.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => locked(&seen).extend_from_slice(&buf[..n]),
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(_) => break,
                }
            }
            closed.store(true, Ordering::Relaxed);
        }));
        Ok(tap)
    }

    /// The console WebSocket (`/v1/nodes/{node}/console/ws`), which also types.
    fn websocket(d: &Rivetd, uuid: &str) -> Result<Tap> {
        let mut ws = crate::console::WsViewer::connect(
            d.port,
            &format!("/v1/nodes/{uuid}/console/ws"),
            None,
        )?;
        let mut tap = Tap::new("WebSocket viewer");
        let (seen, closed, stop) = (tap.seen.clone(), tap.closed.clone(), tap.stop.clone());
        let (tx, rx) = mpsc::channel::<Vec<u8>>();
        tap.keys = Some(tx);
        tap.thread = Some(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                while let Ok(k) = rx.try_recv() {
                    if ws.send_bytes(&k).is_err() {
                        break;
                    }
                }
                let r = ws.pump();
                locked(&seen).append(&mut ws.bytes);
                if r.is_err() {
                    break;
                }
            }
            closed.store(true, Ordering::Relaxed);
        }));
        Ok(tap)
    }

    fn len(&self) -> usize {
        locked(&self.seen).len()
    }

    fn since(&self, from: usize) -> String {
        let seen = locked(&self.seen);
        String::from_utf8_lossy(&seen[from.min(seen.len())..]).into_owned()
    }

    /// Wait until the viewer has received `needle` after byte `from`.
    fn wait_for(&self, needle: &str, from: usize, secs: u64) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            {
                let seen = locked(&self.seen);
                if crate::console::contains(&seen[from.min(seen.len())..], needle.as_bytes()) {
                    return Ok(());
                }
            }
            if Instant::now() > deadline || self.closed.load(Ordering::Relaxed) {
                let text = self.since(from);
                let tail: String = text
                    .chars()
                    .rev()
                    .take(1500)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                bail!(
                    "the {} did not receive {needle:?} in {secs} s (closed: {}); it received:\n{tail}",
                    self.what,
                    self.closed.load(Ordering::Relaxed)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Type a line (a serial terminal's Enter is a carriage return).
    fn line(&self, text: &str) -> Result<()> {
        let keys = self.keys.as_ref().context("this viewer cannot type")?;
        keys.send(format!("{text}\r").into_bytes())
            .map_err(|_| anyhow::anyhow!("the {} has ended", self.what))
    }

    /// Wait for the connection to end (rivetd closed it).
    fn wait_closed(&self, secs: u64) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !self.closed.load(Ordering::Relaxed) {
            ensure!(
                Instant::now() < deadline,
                "the {} is still open {secs} s after the console was disabled",
                self.what
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The child's exit status if it ends within `limit`.
fn wait_exit(
    child: &mut std::process::Child,
    limit: Duration,
) -> Result<Option<std::process::ExitStatus>> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(Some(s));
        }
        if Instant::now() > deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The ipmi node's serial console, enabled before it first boots its ramdisk: rivetd holds the
/// SOL session of the guest's BMC (ipmi_sim, whose SOL device is the guest's serial port), a
/// TCP viewer and a WebSocket viewer watch it, and the WebSocket types the rescue login.
struct NodeConsole {
    uuid: String,
    tcp: Tap,
    ws: Tap,
    /// lab.json's `ipmi` of the guest: a second SOL session is tried against it.
    bmc: Value,
}

impl NodeConsole {
    fn enable(d: &Rivetd, g: &Guest, uuid: &str) -> Result<NodeConsole> {
        let (s, v) = d.call(
            "PUT",
            &format!("/v1/nodes/{uuid}/states/console"),
            Some(json!({"enabled": true})),
        )?;
        ensure!(s == 202, "console enable: {s} {v}");
        let n = d.wait_node(uuid, Duration::from_secs(60), |n| {
            n["console_enabled"] == true || !n["last_error"].is_null()
        })?;
        ensure!(n["console_enabled"] == true, "console not enabled: {n}");
        let (s, info) = d.call("GET", &format!("/v1/nodes/{uuid}/states/console"), None)?;
        ensure!(s == 200, "{s} {info}");
        let url = info["console_info"]["url"].as_str().unwrap_or_default();
        let port: u16 = url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .with_context(|| format!("console_info {info}"))?;
        Ok(NodeConsole {
            uuid: uuid.to_string(),
            tcp: Tap::tcp(port)?,
            ws: Tap::websocket(d, uuid)?,
            bmc: g.ipmi.clone(),
        })
    }

    /// Both viewers and rivetd's captured log have `needle`, which the guest printed after the
    /// viewers' byte counts `from` (the log is bounded; `needle` is recent).
    fn everywhere(&self, d: &Rivetd, needle: &str, from: (usize, usize), secs: u64) -> Result<()> {
        self.tcp.wait_for(needle, from.0, secs)?;
        self.ws.wait_for(needle, from.1, 30)?;
        let r = reqwest::blocking::Client::new()
            .get(format!("{}/v1/nodes/{}/console/log", d.url, self.uuid))
            .timeout(Duration::from_secs(30))
            .send()?;
        ensure!(r.status().is_success(), "console log: {}", r.status());
        let log = r.bytes()?;
        ensure!(
            crate::console::contains(&log, needle.as_bytes()),
            "the console log ({} bytes) lacks {needle:?}",
            log.len()
        );
        Ok(())
    }

    fn marks(&self) -> (usize, usize) {
        (self.tcp.len(), self.ws.len())
    }

    /// `ipmitool … sol activate` against the guest's BMC, stdin a pipe kept open. Ok(true): the
    /// BMC opened a session (ended again here); Ok(false): it refused, saying SOL is already
    /// active elsewhere.
    fn try_sol(&self) -> Result<bool> {
        // ipmitool's stdout is a pipe here, so it may hold "[SOL Session operational…]" in
        // its buffer until it exits: it goes to a file, read once ipmitool has ended. A
        // refusal ends ipmitool within a second or two; a session keeps it running until its
        // stdin closes, which ends the session.
        let dir = tempfile::tempdir()?;
        let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
        let mut child = self
            .ipmitool("activate")?
            .stdin(std::process::Stdio::piped())
            .stdout(std::fs::File::create(&out)?)
            .stderr(std::fs::File::create(&err)?)
            .spawn()
            .context("ipmitool sol activate")?;
        let early = wait_exit(&mut child, Duration::from_secs(5))?;
        drop(child.stdin.take());
        let status = match early {
            Some(s) => s,
            None => match wait_exit(&mut child, Duration::from_secs(10))? {
                Some(s) => s,
                None => {
                    let _ = child.kill();
                    child.wait()?
                }
            },
        };
        let said = std::fs::read_to_string(&out).unwrap_or_default();
        let err = std::fs::read_to_string(&err).unwrap_or_default();
        if said.contains("SOL Session operational") {
            // Leave the BMC as it was, whatever ipmitool did on its way out.
            let _ = self
                .ipmitool("deactivate")?
                .stdin(std::process::Stdio::null())
                .output();
            return Ok(true);
        }
        ensure!(
            !status.success() && err.contains("SOL payload already active"),
            "sol activate neither opened a session nor was refused as busy: {status}, {said:?}, {err:?}"
        );
        Ok(false)
    }

    /// `ipmitool -I lanplus … -E sol SUB` against the guest's BMC, the password in the
    /// environment.
    fn ipmitool(&self, sub: &str) -> Result<Command> {
        let bmc = &self.bmc;
        let mut c = Command::new("ipmitool");
        c.args(["-I", "lanplus", "-C", "3", "-H"])
            .arg(bmc["address"].as_str().context("ipmi address")?)
            .arg("-p")
            .arg(bmc["port"].as_u64().context("ipmi port")?.to_string())
            .arg("-U")
            .arg(bmc["username"].as_str().context("ipmi username")?)
            .args(["-E", "sol", sub])
            .env(
                "IPMI_PASSWORD",
                bmc["password"].as_str().context("ipmi password")?,
            );
        Ok(c)
    }

    /// While rivetd holds the session, the BMC refuses a second one.
    fn second_session_refused(&self) -> Result<()> {
        ensure!(
            !self.try_sol()?,
            "the BMC opened a second SOL session while rivetd holds one"
        );
        Ok(())
    }

    /// Disable: every viewer is closed and the BMC lets a new SOL session in.
    fn disable(self, d: &Rivetd) -> Result<()> {
        let (s, v) = d.call(
            "PUT",
            &format!("/v1/nodes/{}/states/console", self.uuid),
            Some(json!({"enabled": false})),
        )?;
        ensure!(s == 202, "console disable: {s} {v}");
        d.wait_node(&self.uuid, Duration::from_secs(60), |n| {
            n["console_enabled"] == false
        })?;
        self.tcp.wait_closed(30)?;
        self.ws.wait_closed(30)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.try_sol()? {
            ensure!(
                Instant::now() < deadline,
                "the BMC still refuses a SOL session 30 s after the console was disabled"
            );
            std::thread::sleep(Duration::from_secs(1));
        }
        Ok(())
    }
}

/// Log in on the rescue ramdisk's serial console, typing through rivetd's console WebSocket
/// (rivetd → ipmitool → the BMC's SOL → the serial port): a wrong password is refused, the
/// right one gives a shell that runs as `rescue`, whose answer comes back to the viewers.
fn rescue_login(
    d: &Rivetd,
    g: &Guest,
    console: &NodeConsole,
    password: &str,
    since: u64,
) -> Result<()> {
    wait_console(g, "login:", since, 120)?;
    let c = &console.ws;
    let from = console.marks();
    // The user name again if the prompt did not take it (a CI run lost the first line typed
    // at a fresh login prompt over SOL): a person at a console would type it again too.
    let mut tries = 0;
    loop {
        let mark = g.serial_len();
        c.line("rescue")?;
        tries += 1;
        match wait_console(g, "Password:", mark, 20) {
            Ok(_) => break,
            Err(e) if tries >= 3 => return Err(e),
            Err(_) => {}
        }
    }
    let mark = g.serial_len();
    c.line("not-the-rescue-password")?;
    wait_console(g, "Login incorrect", mark, 60)?;
    wait_console(g, "login:", mark, 60)?;
    let mark = g.serial_len();
    c.line("rescue")?;
    wait_console(g, "Password:", mark, 60)?;
    c.line(password)?;
    // The echo of the command differs from its output; typed again until a shell answers.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        c.line("echo rivet-$((6*7))-$LOGNAME-$(id -u)")?;
        if wait_console(g, "rivet-42-rescue-0", mark, 5).is_ok() {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "{}: no shell as rescue after the password; console tail:\n{}",
            g.name,
            g.serial_tail(mark, 30)
        );
    }
    ensure!(
        !g.serial_since(mark).contains(password) && !console.ws.since(from.1).contains(password),
        "{}: the password was echoed on the console",
        g.name
    );
    // What was typed through the WebSocket came back to both viewers.
    console.tcp.wait_for("rivet-42-rescue-0", from.0, 30)?;
    console.ws.wait_for("rivet-42-rescue-0", from.1, 30)?;
    if !browser_console(d, g, &console.uuid, mark)? {
        c.line("exit")?;
    }
    Ok(())
}

/// The node page's console in headless chromium against the guest's real SOL session, at
/// the rescue shell: the page shows what the guest printed before it opened (from the
/// captured log), takes the pen from the test's WebSocket viewer, and a command typed in the
/// page runs in the guest, whose echo and output show in the page and on the serial port.
/// It logs out of the shell itself. `false` when chromium is missing (outside CI).
fn browser_console(d: &Rivetd, g: &Guest, uuid: &str, mark: u64) -> Result<bool> {
    use rivet_tests::webdriver::{self, Browser};
    let Some((chromium, chromedriver)) = webdriver::required() else {
        return Ok(false);
    };
    let t = Duration::from_secs(60);
    let b = Browser::start(&chromium, &chromedriver)?;
    // rivetd runs with --no-auth: the page's viewer is an anonymous admin, as for the API.
    b.goto(&format!("{}/ui/nodes/{uuid}", d.url))?;
    b.wait_until(
        "the console panel ready",
        "const c = document.getElementById('console'); return !!c && c.dataset.ready === '1'",
        json!([]),
        t,
    )?;
    let buffer = || -> Result<String> {
        let v = b.script(
            "const c = window.rivetConsole; if (!c) return ''; \
             const b = c.term.buffer.active; let s = ''; \
             for (let i = 0; i < b.length; i++) { const l = b.getLine(i); \
             if (l) s += l.translateToString(true) + '\\n'; } return s;",
            json!([]),
        )?;
        Ok(v.as_str().unwrap_or_default().to_string())
    };
    let wait_page = |needle: &str| -> Result<()> {
        let deadline = Instant::now() + t;
        loop {
            let text = buffer()?;
            if text.contains(needle) {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "{}: {needle:?} never shown in the page's console; it shows {:?}",
                g.name,
                &text[text.len().saturating_sub(600)..]
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    // Printed before the page opened: it comes from the log.
    wait_page("rivet-42-rescue-0")?;
    // The test's WebSocket viewer typed last and holds the pen: take it over (the same
    // socket carries the takeover before the keys). Refused keys would never run below.
    b.click_css("[data-action=console-takeover]", t)?;
    let keys = b.wait_for(".xterm-helper-textarea", t)?;
    // U+E007 is WebDriver's Enter: xterm.js sends it as a carriage return.
    b.type_into(&keys, "echo browser-$((6*7))-$LOGNAME\u{E007}")?;
    // The typed line comes back as the shell's echo, then the command's output.
    wait_page("echo browser-$((6*7))-$LOGNAME")?;
    wait_page("browser-42-rescue")?;
    wait_console(g, "browser-42-rescue", mark, 30)?;
    b.screenshot_to_env("lab-console")?;
    b.type_into(&keys, "exit\u{E007}")?;
    Ok(true)
}

/// Delete a node in any state (maintenance first, as Ironic allows); the machine is left as
/// it is.
fn forget(d: &Rivetd, uuid: &str) -> Result<()> {
    let (s, v) = d.call(
        "PUT",
        &format!("/v1/nodes/{uuid}/maintenance"),
        Some(json!({"reason": "lab: the record goes, the machine stays"})),
    )?;
    ensure!(s == 202, "maintenance on {uuid}: {s} {v}");
    let (s, v) = d.call("DELETE", &format!("/v1/nodes/{uuid}"), None)?;
    ensure!(s == 204, "delete {uuid} in maintenance: {s} {v}");
    Ok(())
}

/// The first bytes of a guest's disk (the instance image is smaller): unchanged means the
/// disk was not written.
fn disk_head(g: &Guest) -> Result<Vec<u8>> {
    use std::io::Read;
    let mut buf = vec![0u8; 64 << 20];
    let mut f = std::fs::File::open(&g.disk).with_context(|| g.disk.display().to_string())?;
    f.read_exact(&mut buf)?;
    Ok(buf)
}

/// While the node is active: rescue (the rescue login works on the serial console) →
/// unrescue (the instance boots again); then the node is replaced by an adopted redfish node
/// for the same running instance (nothing booted, the disk untouched) and serviced with a
/// BIOS step that sushy-tools reads back. Returns the adopted node's UUID.
fn rescue_adopt_service(
    d: &Rivetd,
    clock: &Clock,
    g: &Guest,
    image: &Image,
    uuid: &str,
    console: NodeConsole,
) -> Result<String> {
    let name = g.name.as_str();
    let password = "lab-rescue-Pw-42";
    let since = g.serial_len();
    clock.phase(name, "rescue → ramdisk → rescue", || {
        verb(
            d,
            uuid,
            json!({"target": "rescue", "rescue_password": password}),
        )?;
        wait_state(d, g, uuid, "rescue", 900, since)
    })?;
    clock.phase(
        name,
        "rescue login through the console WebSocket, then the page",
        || rescue_login(d, g, &console, password, since),
    )?;
    clock.phase(name, "console: disable closes viewers, frees SOL", || {
        console.disable(d)
    })?;
    let since = g.serial_len();
    clock.phase(name, "unrescue → instance boots again", || {
        verb(d, uuid, json!({"target": "unrescue"}))?;
        wait_state(d, g, uuid, "active", 900, since)?;
        let line = wait_console(g, rivet_image_build::testimage::MARKER, since, 300)?;
        ensure!(
            line.ends_with(&format!("uuid={uuid}")),
            "{name}: after unrescue the console shows {line:?}"
        );
        d.wait_node(uuid, Duration::from_secs(60), |n| {
            n["power_state"] == "power off"
        })
    })?;

    // The instance stays; the node record goes (maintenance lets an active node be deleted)
    // and a redfish node for the same machine adopts it.
    forget(d, uuid)?;
    let r = &g.redfish;
    let adopted = d.create_node_with_port(
        json!({"driver": "redfish", "name": format!("{name}-adopted"), "boot_interface": "ipxe",
               "bios_interface": "redfish", "automated_clean": true,
               "driver_info": {"redfish_address": r.address, "redfish_system_id": r.system,
                               "redfish_username": r.username, "redfish_password": r.password},
               "properties": {"root_device": {"name": "/dev/vda"}}}),
        &g.mac,
    )?;
    let adopted = adopted.as_str();
    clock.phase(name, "adopt the running instance → active", || {
        verb(d, adopted, json!({"target": "manage"}))?;
        wait_state(d, g, adopted, "manageable", 60, g.serial_len())?;
        set_image(d, adopted, image)?;
        let (power, head, mark) = (r.power()?, disk_head(g)?, g.serial_len());
        verb(d, adopted, json!({"target": "adopt"}))?;
        let n = wait_state(d, g, adopted, "active", 60, mark)?;
        ensure!(
            r.power()? == power,
            "{name}: adoption changed the power state"
        );
        ensure!(disk_head(g)? == head, "{name}: adoption wrote to the disk");
        ensure!(
            g.serial_len() == mark,
            "{name}: the guest printed during adoption (it was booted):\n{}",
            g.serial_tail(mark, 20)
        );
        Ok(n)
    })?;

    let before = r.bios()?;
    let want = if before["ProcTurboMode"] == "Disabled" {
        "Enabled"
    } else {
        "Disabled"
    };
    let since = g.serial_len();
    clock.phase(name, "service: bios.apply_configuration", || {
        verb(
            d,
            adopted,
            json!({"target": "service", "disable_ramdisk": true, "service_steps": [
                {"interface": "bios", "step": "apply_configuration",
                 "args": {"settings": [{"name": "ProcTurboMode", "value": want}]}}]}),
        )?;
        let n = wait_state(d, g, adopted, "active", 600, since)?;
        ensure!(n["last_error"].is_null(), "{name}: {n}");
        Ok(())
    })?;
    let after = r.bios()?;
    ensure!(
        after["ProcTurboMode"] == want,
        "{name}: the BMC reports ProcTurboMode {} after servicing, not {want} (before: {})",
        after["ProcTurboMode"],
        before["ProcTurboMode"]
    );
    // Rivet's cache of the node's BIOS settings shows it too. (sushy-tools applies settings
    // at once, so the step reports nothing pending and no reboot is needed, as in Ironic.)
    let (s, v) = d.call(
        "GET",
        &format!("/v1/nodes/{adopted}/bios/ProcTurboMode"),
        None,
    )?;
    ensure!(s == 200, "GET bios setting: {s} {v}");
    ensure!(
        v["ProcTurboMode"]["value"] == want,
        "{name}: node BIOS cache {v}"
    );
    Ok(adopted.to_string())
}

/// Two machines nobody enrolled boot from the network: the ramdisk's discovery enrols each
/// as a node with its domain's MAC, then powers it off.
fn discover(d: &Rivetd, guests: &[&Guest]) -> Result<()> {
    for g in guests {
        g.redfish.pxe_boot()?;
    }
    let want: std::collections::BTreeSet<String> = guests.iter().map(|g| g.mac.clone()).collect();
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let (s, v) = d.call("GET", "/v1/nodes/detail", None)?;
        ensure!(s == 200, "{v}");
        let mut found = std::collections::BTreeSet::new();
        let mut count = 0;
        for n in v["nodes"].as_array().into_iter().flatten() {
            if n["driver_internal_info"]["auto_discovered"] != true {
                continue;
            }
            count += 1;
            let uuid = n["uuid"].as_str().unwrap_or_default();
            let (_, ports) = d.call("GET", &format!("/v1/ports?node={uuid}"), None)?;
            for p in ports["ports"].as_array().into_iter().flatten() {
                if let Some(m) = p["address"].as_str() {
                    found.insert(m.to_lowercase());
                }
            }
        }
        if found == want {
            ensure!(
                count == guests.len(),
                "{count} nodes discovered for {want:?}"
            );
            break;
        }
        if Instant::now() > deadline {
            let tails: Vec<String> = guests
                .iter()
                .map(|g| format!("--- {}:\n{}", g.name, g.serial_tail(0, 25)))
                .collect();
            bail!(
                "discovered MACs {found:?} ({count} nodes), want {want:?}\n{}",
                tails.join("\n")
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    // `[discovery] end = poweroff`: each ramdisk powers its machine off.
    for g in guests {
        let deadline = Instant::now() + Duration::from_secs(180);
        while g.redfish.power()? != "Off" {
            ensure!(
                Instant::now() < deadline,
                "{} is still on after discovery",
                g.name
            );
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    Ok(())
}

/// instance_info for a deploy of `image` (undeploy clears it).
fn set_image(d: &Rivetd, uuid: &str, image: &Image) -> Result<()> {
    let (s, v) = d.call(
        "PATCH",
        &format!("/v1/nodes/{uuid}"),
        Some(json!([{"op": "add", "path": "/instance_info", "value": {
            "image_source": image.url, "image_os_hash_algo": "sha256",
            "image_os_hash_value": image.sha256}}])),
    )?;
    ensure!(s == 200, "instance_info: {s} {v}");
    Ok(())
}

fn lab_node(lab: &Value, i: usize) -> Result<&Value> {
    lab["nodes"]
        .get(i)
        .with_context(|| format!("lab.json has no node {i}"))
}

fn guest(lab: &Value, i: usize, node: Value) -> Result<Guest> {
    let n = lab_node(lab, i)?;
    Ok(Guest {
        name: n["name"].as_str().context("name")?.to_string(),
        firmware: n["firmware"].as_str().unwrap_or("bios").to_string(),
        mac: n["macs"][0].as_str().context("mac")?.to_lowercase(),
        disk_bytes: n["disk_bytes"].as_u64().context("disk_bytes")?,
        serial_log: PathBuf::from(n["serial_log"].as_str().context("serial_log")?),
        ipmi: n["ipmi"].clone(),
        disk: PathBuf::from(n["disk"].as_str().context("disk")?),
        node,
        redfish: Redfish {
            address: n["redfish"]["address"]
                .as_str()
                .context("redfish address")?
                .into(),
            system: n["redfish"]["system_id"]
                .as_str()
                .context("system_id")?
                .into(),
            username: n["redfish"]["username"].as_str().unwrap_or_default().into(),
            password: n["redfish"]["password"].as_str().unwrap_or_default().into(),
        },
    })
}

fn redfish_info(n: &Value) -> Value {
    let r = &n["redfish"];
    let mut info = json!({"redfish_address": r["address"], "redfish_system_id": r["system_id"]});
    for (k, f) in [
        ("username", "redfish_username"),
        ("password", "redfish_password"),
    ] {
        if let Some(v) = r[k].as_str().filter(|v| !v.is_empty()) {
            info[f] = json!(v);
        }
    }
    info
}

#[test]
fn server_lifecycle_on_lab_vms() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let _libvirt = rivet_tests::libvirt_lock();
    let lab_guard = lab_up(2)?;
    let lab = &lab_guard.json;
    // Every run starts from machines that are off, as a rack's new servers would be (an
    // interrupted run may have left a guest in its ramdisk).
    for n in lab["nodes"].as_array().into_iter().flatten() {
        if let Some(name) = n["name"].as_str() {
            let _ = Command::new("virsh")
                .args(["-c", "qemu:///system", "destroy", name])
                .output();
        }
    }
    let image = Image {
        url: lab["image"]["url"]
            .as_str()
            .context("image url")?
            .to_string(),
        sha256: lab["image"]["sha256"]
            .as_str()
            .context("image sha256")?
            .to_string(),
    };
    // The ipxe node's instance goes through a rescue (a network boot): OVMF then drops the
    // boot entries QEMU's boot order does not name, so its image carries the removable path
    // too, as cloud images do.
    let removable = Image {
        url: lab["removable_image"]["url"]
            .as_str()
            .context("removable image url")?
            .to_string(),
        sha256: lab["removable_image"]["sha256"]
            .as_str()
            .context("removable image sha256")?
            .to_string(),
    };
    let artefacts = lab["rivetd"]["artefact_dir"]
        .as_str()
        .context("artefact_dir")?;
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("rivetd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[agent]\nlong_poll_s = 2\n[conductor]\ncheck_interval_s = 1\n\
             [power_sync]\ninterval_s = 2\n[discovery]\nenabled = true\n\
             [cleaning]\npriority_overrides = {{\"deploy.erase_devices\" = 0}}\n\
             [boot]\nartefact_dir = {artefacts:?}\npublic_url = \"{PUBLIC_URL}\"\n\
             external_http_url = \"http://127.0.0.1:{RIVETD_PORT}\"\n"
        ),
    )?;
    let cfg = cfg.display().to_string();
    let d = Rivetd::start(
        &dir.path().join("rivet.db"),
        RIVETD_PORT,
        &["--config", &cfg],
    )?;
    let clock = Clock {
        lines: std::sync::Mutex::new(Vec::new()),
    };
    let started = Instant::now();

    let n0 = lab_node(lab, 0)?;
    let vmedia = guest(
        lab,
        0,
        json!({"driver": "redfish", "name": n0["name"], "boot_interface": "redfish-virtual-media",
               "driver_info": redfish_info(n0), "automated_clean": true}),
    )?;
    let n1 = lab_node(lab, 1)?;
    let ipxe = guest(
        lab,
        1,
        json!({"driver": "ipmi", "name": n1["name"], "boot_interface": "ipxe", "rescue_interface": "agent",
               "console_interface": "ipmitool-socat",
               "driver_info": {"ipmi_address": n1["ipmi"]["address"], "ipmi_port": n1["ipmi"]["port"],
                               "ipmi_username": n1["ipmi"]["username"], "ipmi_password": n1["ipmi"]["password"]},
               "automated_clean": true}),
    )?;

    let signed = Image {
        url: lab["signed_image"]["url"]
            .as_str()
            .context("signed image url")?
            .to_string(),
        sha256: lab["signed_image"]["sha256"]
            .as_str()
            .context("signed image sha256")?
            .to_string(),
    };
    let (vmedia_uuid, ipxe_result) = std::thread::scope(|s| {
        // Side by side: each guest keeps one of the two cores busy while it boots. The
        // ipxe node ends its lifecycle active and goes on with fast track (its undeploy's
        // cleaning keeps the ramdisk); the virtual-media node then goes through the other
        // firmwares an operator asks for.
        let other = s.spawn(|| {
            let uuid = lifecycle(
                &d,
                &clock,
                &ipxe,
                &removable,
                Start::WithPort,
                true,
                End::Active,
            )?;
            fast_track(&d, &clock, &ipxe, &removable, &uuid)?;
            Ok::<_, anyhow::Error>(uuid)
        });
        let first = lifecycle(
            &d,
            &clock,
            &vmedia,
            &image,
            Start::Inspect,
            false,
            End::Available,
        )
        .and_then(|uuid| {
            firmware_variants(&d, &clock, &vmedia, &image, &signed, &uuid)?;
            Ok(uuid)
        });
        (first, other.join())
    });
    let ipxe_uuid = match ipxe_result {
        Ok(r) => r?,
        Err(_) => bail!("the ipxe node's thread panicked"),
    };
    let vmedia_uuid = vmedia_uuid?;

    // Abort while the ramdisk boots: deploy failed, the guest off.
    clock.phase(
        &vmedia.name,
        "abort in wait call-back → deploy failed",
        || {
            let since = vmedia.serial_len();
            set_image(&d, &vmedia_uuid, &image)?;
            verb(&d, &vmedia_uuid, json!({"target": "active"}))?;
            wait_state(&d, &vmedia, &vmedia_uuid, "wait call-back", 120, since)?;
            verb(&d, &vmedia_uuid, json!({"target": "abort"}))?;
            wait_state(&d, &vmedia, &vmedia_uuid, "deploy failed", 60, since)?;
            let n = d.wait_node(&vmedia_uuid, Duration::from_secs(60), |n| {
                n["power_state"] == "power off"
            })?;
            ensure!(
                n["last_error"].as_str().is_some_and(|e| !e.is_empty()),
                "{n}"
            );
            // rivetd powers off, then ejects, after answering the abort.
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let (power, cd) = (vmedia.redfish.power()?, vmedia.redfish.cd_inserted()?);
                if power == "Off" && !cd {
                    break;
                }
                ensure!(
                    Instant::now() < deadline,
                    "after the abort the BMC reports power {power:?}, CD inserted: {cd}"
                );
                std::thread::sleep(Duration::from_millis(500));
            }
            Ok(())
        },
    )?;

    // An unreachable BMC: verification fails within 30 s, saying so.
    clock.phase("unreachable", "manage with a dead BMC → enroll", || {
        let dead = rivet_tests::peers::closed_port()?;
        let (s, v) = d.call(
            "POST",
            "/v1/nodes",
            Some(json!({"driver": "redfish", "name": "dead-bmc",
                        "driver_info": {"redfish_address": format!("http://127.0.0.1:{dead}"),
                                        "redfish_system_id": "/redfish/v1/Systems/x"}})),
        )?;
        ensure!(s == 201, "{v}");
        let t = Instant::now();
        verb(&d, "dead-bmc", json!({"target": "manage"}))?;
        let n = d.wait_node("dead-bmc", Duration::from_secs(30), |n| {
            n["provision_state"] == "enroll" && n["target_provision_state"].is_null()
        })?;
        let err = n["last_error"].as_str().unwrap_or_default();
        ensure!(err.contains("dead-bmc") || err.contains("127.0.0.1"), "{n}");
        eprintln!("lab: dead BMC reported after {:.1?}: {err}", t.elapsed());
        Ok(())
    })?;

    // Both machines become unknown to Rivet (their nodes deleted) and boot from the network:
    // discovery enrols them again.
    clock.phase("both guests", "discovery of two unknown machines", || {
        for uuid in [&vmedia_uuid, &ipxe_uuid] {
            forget(&d, uuid)?;
        }
        discover(&d, &[&vmedia, &ipxe])
    })?;

    eprintln!("lab: whole scenario {:.1?}", started.elapsed());
    if let Some(kib) = d.peak_rss_kib() {
        eprintln!("lab: rivetd peak RSS {:.1} MiB", kib as f64 / 1024.0);
    }
    if let Ok(lines) = clock.lines.lock() {
        eprintln!("lab: phase durations (TCG guests)\n{}", lines.join("\n"));
    }
    Ok(())
}
