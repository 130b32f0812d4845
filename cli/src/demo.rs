//! `rivet demo`: the README's main command, end to end on one machine.
//!
//! Starts `rivetd` (found next to this executable) on a SQLite file in a temporary directory,
//! enrolls a `fake-hardware` node (with the agent's deploy interface, `direct`) and plays its
//! ramdisk with a local `rivet-agent` process whose disks are two sparse files in that
//! directory (never the host's disks). The node goes enroll → manageable → provide (automated
//! cleaning: `erase_devices_metadata`, then `erase_devices`) → available, the disks are read
//! back to check they are all zeroes; then a generated whole-disk image is deployed with a
//! configdrive (served over loopback HTTP, streamed and verified by the agent) → active, the
//! image's bytes and the `config-2` partition are checked on the disk; undeploy → automated
//! cleaning → available; then manage → a manual clean with an explicit step list →
//! manageable. Progress is printed as it happens, a summary at the end.
//!
//! The disks' seed contents and the image's partition table are written, and the disks read
//! back, in Rust ([`disk`]): the demo runs no disk tool (sgdisk, mkfs, wipefs, blkid).
//!
//! Everything it starts is stopped and the directory removed on every way out (guards that
//! drop), and a failure prints the node's `last_error` and the tails of both logs.

mod disk;

use crate::client::{seg, Client};
use crate::output;
use crate::wait::{elapsed, is_failure, Snapshot};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use rivet_protocol::api::{NodeCreate, PortCreate, ProvisionRequest};
use rivet_protocol::states::Verb;
use rivet_protocol::steps::RequestedStep;
use serde_json::{Map, Value};
use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How often the node is polled.
const POLL: Duration = Duration::from_millis(300);
const NODE_NAME: &str = "demo-1";
/// A made-up MAC for the node's one port (QEMU's prefix).
const NODE_MAC: &str = "52:54:00:12:34:56";
const MIB: u64 = 1 << 20;
/// rivetd's settings for the demo: short long polls, a fast conductor scan.
const RIVETD_CONFIG: &str = "[agent]\nlong_poll_s = 10\n\n[conductor]\ncheck_interval_s = 1\n";

/// `rivet demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Size of each of the node's two sparse-file disks, in MiB.
    #[arg(long, default_value_t = 512, value_name = "MIB")]
    disk_mib: u64,
    /// Give up when one phase (manage, a cleaning) takes longer than this, in seconds.
    #[arg(long, default_value_t = 300, value_name = "SECS")]
    timeout: u64,
    /// Keep the temporary directory (database, logs, disk files) for a look afterwards.
    #[arg(long)]
    keep: bool,
}

/// Run the demo. On failure the diagnostics are printed here; the caller prints the error.
pub async fn run(a: DemoArgs) -> Result<()> {
    // The deploy needs room for the image and the agent's 64 MiB config-2 partition after it.
    let least = DemoImage::MIB + 64 + 1;
    if a.disk_mib < least {
        bail!(
            "--disk-mib {} is too small for the {} MiB image and its 64 MiB configdrive \
             partition; use at least {least}",
            a.disk_mib,
            DemoImage::MIB
        );
    }
    let bins = Bins::locate()?;
    let dir = TempDir::create(a.keep)?;
    let mut demo = Demo::start(bins, &dir.path, &a).await?;
    let outcome = demo.scenario(&a).await;
    if outcome.is_err() {
        demo.report_failure().await;
    }
    // Stop the agent and rivetd before their directory goes.
    drop(demo);
    drop(dir);
    outcome
}

/// The two programs the demo runs, from the directory of this executable.
struct Bins {
    rivetd: PathBuf,
    agent: PathBuf,
}

impl Bins {
    fn locate() -> Result<Bins> {
        let exe = std::env::current_exe().context("cannot tell where this executable is")?;
        let dir = exe
            .parent()
            .ok_or_else(|| anyhow!("{} has no parent directory", exe.display()))?;
        let find = |name: &str| {
            let p = dir.join(name);
            if p.is_file() {
                Ok(p)
            } else {
                Err(anyhow!(
                    "{name} not found next to {} (in {}): run `cargo build --workspace --bins` \
                     first (or `bash scripts/demo.sh`, which does)",
                    exe.display(),
                    dir.display()
                ))
            }
        };
        Ok(Bins {
            rivetd: find("rivetd")?,
            agent: find("rivet-agent")?,
        })
    }
}

/// A private temporary directory, removed on drop unless kept.
struct TempDir {
    path: PathBuf,
    keep: bool,
}

impl TempDir {
    fn create(keep: bool) -> Result<TempDir> {
        use std::os::unix::fs::DirBuilderExt;
        let base = std::env::temp_dir();
        for attempt in 0u32..100 {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let path = base.join(format!(
                "rivet-demo.{}.{:x}",
                std::process::id(),
                nanos ^ attempt
            ));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(TempDir { path, keep }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot create {}", path.display()))
                }
            }
        }
        bail!("cannot create a temporary directory in {}", base.display())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if self.keep {
            println!("kept {}", self.path.display());
        } else if let Err(e) = std::fs::remove_dir_all(&self.path) {
            eprintln!("warning: could not remove {}: {e}", self.path.display());
        }
    }
}

/// A child process, killed and reaped on drop.
struct Proc {
    name: &'static str,
    child: Child,
}

impl Proc {
    /// Start `cmd` with stdout discarded and stderr appended to `log`.
    fn spawn(name: &'static str, cmd: &mut Command, log: &Path) -> Result<Proc> {
        let logf = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("cannot open {}", log.display()))?;
        let child = cmd
            .env("NO_COLOR", "1") // plain log files
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(logf)
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        Ok(Proc { name, child })
    }

    /// An error if the process has exited.
    fn check_alive(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(Some(status)) => bail!("{} exited unexpectedly ({status})", self.name),
            _ => Ok(()),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One of the node's disks.
struct Disk {
    path: PathBuf,
    /// What was written on it before cleaning.
    contents: String,
}

/// One timed part of the run, for the summary.
struct Phase {
    name: String,
    took: Duration,
    /// `interface.step` and how long it was seen running (`None`: it ran between two polls).
    steps: Vec<(String, Option<Duration>)>,
}

/// What the watcher saw of the current phase's steps.
#[derive(Default)]
struct StepWatch {
    /// The plan, from `driver_internal_info.clean_plan` while cleaning runs.
    plan: Vec<String>,
    /// Steps seen in `clean_step`, in order: name, first seen, first poll without it.
    seen: Vec<(String, Instant, Option<Instant>)>,
}

impl StepWatch {
    fn observe(&mut self, node: &Value, snap: &Snapshot, now: Instant) {
        let plan = plan_of(node);
        if !plan.is_empty() {
            self.plan = plan;
        }
        let current = self
            .seen
            .last()
            .filter(|s| s.2.is_none())
            .map(|s| s.0.clone());
        if current != snap.step {
            if let Some(last) = self.seen.last_mut().filter(|s| s.2.is_none()) {
                last.2 = Some(now);
            }
            if let Some(step) = &snap.step {
                self.seen.push((step.clone(), now, None));
            }
        }
    }

    /// The steps of the phase with their observed durations: the plan when it was seen
    /// (a short cleaning may run entirely between two polls), else `expected`, else the
    /// steps seen.
    fn finish(mut self, now: Instant, expected: Vec<String>) -> Vec<(String, Option<Duration>)> {
        if let Some(last) = self.seen.last_mut().filter(|s| s.2.is_none()) {
            last.2 = Some(now);
        }
        let took = |name: &str| {
            self.seen
                .iter()
                .find(|s| s.0 == name)
                .map(|s| s.2.unwrap_or(now) - s.1)
        };
        let names = match (self.plan.is_empty(), expected.is_empty()) {
            (false, _) => self.plan.clone(),
            (true, false) => expected,
            (true, true) => self.seen.iter().map(|s| s.0.clone()).collect(),
        };
        names
            .into_iter()
            .map(|n| {
                let t = took(&n);
                (n, t)
            })
            .collect()
    }
}

/// `interface.step` of each step of the node's cleaning plan, when one is running.
fn plan_of(node: &Value) -> Vec<String> {
    node.pointer("/driver_internal_info/clean_plan")
        .and_then(Value::as_array)
        .map(|plan| {
            plan.iter()
                .filter_map(|s| {
                    let step = s.get("step")?.as_str()?;
                    let interface = s.get("interface").and_then(Value::as_str);
                    Some(match interface {
                        Some(i) => format!("{i}.{step}"),
                        None => step.to_string(),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The running step's progress (`clean_step` or `deploy_step`) as a whole percentage, when
/// it has `done` and `total`.
fn percent(node: &Value) -> Option<u64> {
    let p = node
        .pointer("/clean_step/progress")
        .or_else(|| node.pointer("/deploy_step/progress"))?;
    let done = p.get("done")?.as_u64()?;
    let total = p.get("total")?.as_u64().filter(|t| *t > 0)?;
    Some((done.min(total) * 100) / total)
}

/// The running demo: rivetd, maybe the agent, the node, and what happened so far.
struct Demo {
    client: Client,
    url: String,
    dir: PathBuf,
    bins: Bins,
    disks: Vec<Disk>,
    /// Declared before rivetd: fields drop in order, and the agent should go first.
    agent: Option<Proc>,
    rivetd: Proc,
    /// Node UUID, once enrolled.
    node: Option<String>,
    start: Instant,
    /// Provision states seen, consecutive repeats folded.
    states: Vec<String>,
    phases: Vec<Phase>,
    steps: StepWatch,
    /// Progress output: rewrite the live line in place on a terminal.
    tty: bool,
    /// A progress line is open (terminal only).
    live: bool,
    /// What the last progress line showed, and its step's percentage.
    last_line: Option<(Snapshot, Option<u64>)>,
}

impl Demo {
    /// Start rivetd on a free loopback port and wait until it serves `/v1`.
    async fn start(bins: Bins, dir: &Path, a: &DemoArgs) -> Result<Demo> {
        let start = Instant::now();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("cannot find a free loopback port")?
            .port();
        let url = format!("http://127.0.0.1:{port}");
        let config = dir.join("rivetd.toml");
        std::fs::write(&config, RIVETD_CONFIG)
            .with_context(|| format!("cannot write {}", config.display()))?;
        let db = dir.join("rivet.db");
        let rivetd = Proc::spawn(
            "rivetd",
            Command::new(&bins.rivetd)
                .arg("--listen")
                .arg(format!("127.0.0.1:{port}"))
                .arg("--db")
                .arg(format!("sqlite:{}", db.display()))
                .arg("--no-auth")
                .arg("--config")
                .arg(&config),
            &dir.join("rivetd.log"),
        )?;
        let mut demo = Demo {
            client: Client::new(&url, None)?,
            url,
            dir: dir.to_path_buf(),
            bins,
            disks: Vec::new(),
            agent: None,
            rivetd,
            node: None,
            start,
            states: Vec::new(),
            phases: Vec::new(),
            steps: StepWatch::default(),
            tty: std::io::stdout().is_terminal(),
            live: false,
            last_line: None,
        };
        println!("== rivetd");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Err(e) = demo.rivetd.check_alive() {
                bail!("{e}; its log:\n{}", tail(&demo.dir.join("rivetd.log"), 30));
            }
            if demo.client.get("/v1", &[]).await.is_ok() {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "rivetd did not answer GET /v1 within 30 s; its log:\n{}",
                    tail(&demo.dir.join("rivetd.log"), 30)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        println!("   {} (SQLite file {})", demo.url, db.display());
        println!("   logs: {}/rivetd.log, agent.log", demo.dir.display());
        demo.disks = make_disks(&demo.dir, a.disk_mib)?;
        Ok(demo)
    }

    fn uuid(&self) -> Result<&str> {
        self.node
            .as_deref()
            .ok_or_else(|| anyhow!("the node is not enrolled yet"))
    }

    /// The whole story.
    async fn scenario(&mut self, a: &DemoArgs) -> Result<()> {
        let limit = Duration::from_secs(a.timeout);

        println!("== enroll a fake-hardware node with one port ({NODE_MAC})");
        let node = self.enroll().await?;
        println!(
            "   node {NODE_NAME} {}: {}",
            self.uuid()?,
            Snapshot::of(&node).line()
        );

        println!("== manage: rivetd checks the node's (fake) BMC");
        let t = Instant::now();
        self.verb(Verb::Manage, None).await?;
        self.wait_state("manageable", limit).await?;
        self.end_phase("manage", t, Vec::new());

        println!("== provide: automated cleaning boots the ramdisk and waits for it");
        let t = Instant::now();
        self.verb(Verb::Provide, None).await?;
        self.wait_state("clean wait", limit).await?;
        println!("   the fake driver \"booted\" the ramdisk: start rivet-agent on the disk files");
        self.start_agent()?;
        self.wait_state("available", limit).await?;
        self.ramdisk_gone();
        let expected = self.automated_steps().await?;
        self.end_phase("automated cleaning", t, expected);

        println!("== the disks after cleaning, read back in full");
        check_zeroed(&self.disks)?;

        self.deploy_and_undeploy(limit).await?;

        println!("== manage, then a manual clean: [deploy.erase_devices_metadata]");
        let t = Instant::now();
        self.verb(Verb::Manage, None).await?;
        self.wait_state("manageable", limit).await?;
        let steps = vec![RequestedStep {
            interface: "deploy".into(),
            step: "erase_devices_metadata".into(),
            args: Map::new(),
            order: None,
        }];
        let expected = steps
            .iter()
            .map(|s| format!("{}.{}", s.interface, s.step))
            .collect();
        self.verb(Verb::Clean, Some(steps)).await?;
        // A new cleaning boots the ramdisk again (the old agent's token ended with the last
        // cleaning): the fake driver does nothing, so restart the agent process, as a reboot
        // into the ramdisk would.
        self.wait_state("clean wait", limit).await?;
        println!(
            "   the fake driver \"rebooted\" the node into the ramdisk: start rivet-agent again"
        );
        self.start_agent()?;
        self.wait_state("manageable", limit).await?;
        self.ramdisk_gone();
        self.end_phase("manual cleaning", t, expected);

        self.print_clean_steps().await?;
        self.summary();
        Ok(())
    }

    /// Deploy a generated image with a configdrive, check the disk, then undeploy.
    async fn deploy_and_undeploy(&mut self, limit: Duration) -> Result<()> {
        let disk = self
            .disks
            .first()
            .map(|d| d.path.clone())
            .ok_or_else(|| anyhow!("the demo has no disk"))?;
        let image = DemoImage::make(&self.dir)?;
        let server = ImageServer::start(&image.path)?;
        println!(
            "== deploy: a {} MiB whole-disk image ({}), sha256 {}…, served at {}",
            image.len / MIB,
            image.layout,
            &image.sha256[..12],
            server.url
        );
        // The target disk by root device hint (Ironic's `name`), and the image to write.
        let patch = serde_json::json!([
            {"op": "add", "path": "/properties/root_device",
             "value": {"name": disk.display().to_string()}},
            {"op": "add", "path": "/instance_info/image_source", "value": server.url},
            {"op": "add", "path": "/instance_info/image_os_hash_algo", "value": "sha256"},
            {"op": "add", "path": "/instance_info/image_os_hash_value", "value": image.sha256},
        ]);
        self.client
            .patch(&format!("/v1/nodes/{}", seg(self.uuid()?)), &patch)
            .await
            .context("setting the image on the node")?;
        let t = Instant::now();
        let body = ProvisionRequest {
            target: Verb::Active,
            clean_steps: None,
            configdrive: Some(serde_json::json!({
                "meta_data": {"hostname": "demo-1.example"},
                "user_data": "#cloud-config\nfinal_message: deployed by rivet demo\n",
            })),
            deploy_steps: None,
            rescue_password: None,
            disable_ramdisk: None,
            service_steps: None,
            runbook: None,
        };
        let path = format!("/v1/nodes/{}/states/provision", seg(self.uuid()?));
        self.client
            .put(&path, Some(&body))
            .await
            .context("\"active\" was refused")?;
        self.wait_state("wait call-back", limit).await?;
        println!("   the fake driver \"booted\" the deploy ramdisk: start rivet-agent again");
        self.start_agent()?;
        let node = self.wait_state("active", limit).await?;
        self.ramdisk_gone();
        self.end_phase("deploy", t, Vec::new());
        let written = node
            .pointer("/driver_internal_info/deployed_image")
            .cloned()
            .unwrap_or(Value::Null);
        println!(
            "   agent: wrote {} to {}, verified sha256, configdrive on {}",
            written.get("format").and_then(Value::as_str).unwrap_or("?"),
            written.get("device").and_then(Value::as_str).unwrap_or("?"),
            written
                .get("configdrive_partition")
                .and_then(Value::as_str)
                .unwrap_or("?")
        );
        image.check_on(&disk, self.uuid()?)?;
        drop(server);

        println!("== undeploy: tear down, automated cleaning, available");
        let t = Instant::now();
        self.verb(Verb::Deleted, None).await?;
        self.wait_state("clean wait", limit).await?;
        println!(
            "   the fake driver \"rebooted\" the node into the ramdisk: start rivet-agent again"
        );
        self.start_agent()?;
        let node = self.wait_state("available", limit).await?;
        self.ramdisk_gone();
        self.end_phase("undeploy + cleaning", t, Vec::new());
        if node.get("instance_info") != Some(&serde_json::json!({})) {
            bail!(
                "instance_info is not empty after undeploy: {}",
                node["instance_info"]
            );
        }
        let first = read_range(&disk, 0, MIB as usize)?;
        if first.iter().any(|b| *b != 0) {
            bail!(
                "{}: the first MiB holds data after undeploy",
                file_name(&disk)
            );
        }
        println!(
            "   {}: partition table and configdrive erased, instance_info cleared",
            file_name(&disk)
        );
        Ok(())
    }

    async fn enroll(&mut self) -> Result<Value> {
        let body = NodeCreate {
            name: Some(NODE_NAME.into()),
            driver: "fake-hardware".into(),
            // The local agent does the in-band work: the agent's deploy interface.
            deploy_interface: Some("direct".into()),
            // The "machine" is a local process on disk files: it has no firmware of its own
            // to hold a UEFI boot entry (the agent never touches this host's), so it boots
            // its instance the BIOS way.
            properties: serde_json::json!({"capabilities": "boot_mode:bios"})
                .as_object()
                .cloned()
                .unwrap_or_default(),
            ..Default::default()
        };
        let node = self.client.post("/v1/nodes", &body).await?;
        let uuid = node
            .get("uuid")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("rivetd created a node without a uuid: {node}"))?
            .to_string();
        let port = PortCreate {
            address: NODE_MAC.into(),
            node_uuid: uuid.clone(),
            pxe_enabled: true,
            ..Default::default()
        };
        self.client.post("/v1/ports", &port).await?;
        self.node = Some(uuid);
        self.note_state(&Snapshot::of(&node).state);
        Ok(node)
    }

    /// `PUT …/states/provision`.
    async fn verb(&mut self, verb: Verb, clean_steps: Option<Vec<RequestedStep>>) -> Result<()> {
        let body = ProvisionRequest {
            target: verb,
            clean_steps,
            configdrive: None,
            deploy_steps: None,
            rescue_password: None,
            disable_ramdisk: None,
            service_steps: None,
            runbook: None,
        };
        let path = format!("/v1/nodes/{}/states/provision", seg(self.uuid()?));
        self.client
            .put(&path, Some(&body))
            .await
            .with_context(|| format!("\"{verb}\" was refused"))?;
        Ok(())
    }

    /// The node left the ramdisk (powered off after cleaning, or booted into its instance):
    /// stop the agent process standing in for it, so that it cannot look the node up again
    /// and take the next boot's one-time token.
    fn ramdisk_gone(&mut self) {
        self.agent = None;
    }

    /// Start the "ramdisk": a rivet-agent process on the disk files.
    fn start_agent(&mut self) -> Result<()> {
        // An old "ramdisk" still running goes first, as a reboot would take it.
        self.ramdisk_gone();
        let devices: Vec<String> = self
            .disks
            .iter()
            .map(|d| d.path.display().to_string())
            .collect();
        let agent = Proc::spawn(
            "rivet-agent",
            Command::new(&self.bins.agent)
                .arg("run")
                .arg("--controller")
                .arg(&self.url)
                .arg("--node")
                .arg(self.uuid()?)
                .arg("--devices")
                .arg(devices.join(",")),
            &self.dir.join("agent.log"),
        )?;
        println!("   rivet-agent pid {}", agent.child.id());
        self.agent = Some(agent);
        Ok(())
    }

    async fn get_node(&self) -> Result<Value> {
        let path = format!("/v1/nodes/{}", seg(self.uuid()?));
        Ok(self.client.get(&path, &[]).await?)
    }

    /// Wait for a provision state, or fail with the node's last_error.
    async fn wait_state(&mut self, want: &str, limit: Duration) -> Result<Value> {
        let found = self
            .watch(
                |n| n.get("provision_state").and_then(Value::as_str) == Some(want),
                limit,
            )
            .await?;
        self.end_live();
        match found {
            Some(node) => Ok(node),
            None => {
                let node = self.get_node().await.unwrap_or(Value::Null);
                let snap = Snapshot::of(&node);
                bail!(
                    "node {NODE_NAME} did not reach \"{want}\" within {} s; it is in \"{}\"; \
                     last_error: {}",
                    limit.as_secs(),
                    snap.state,
                    snap.last_error.as_deref().unwrap_or("none")
                )
            }
        }
    }

    /// Poll the node every [`POLL`] until `done` holds (`Some(node)`) or `limit` passes
    /// (`None`), printing a line when its state or running step changes. A failure state,
    /// or rivetd or the agent exiting, is an error.
    async fn watch(
        &mut self,
        done: impl Fn(&Value) -> bool,
        limit: Duration,
    ) -> Result<Option<Value>> {
        let deadline = Instant::now() + limit;
        loop {
            self.rivetd.check_alive()?;
            if let Some(agent) = self.agent.as_mut() {
                agent.check_alive()?;
            }
            let node = self.get_node().await?;
            let snap = Snapshot::of(&node);
            let now = Instant::now();
            self.note_state(&snap.state);
            self.steps.observe(&node, &snap, now);
            self.show(&snap, percent(&node));
            if done(&node) {
                return Ok(Some(node));
            }
            if is_failure(&snap.state) {
                self.end_live();
                bail!(
                    "node {NODE_NAME} landed in \"{}\"; last_error: {}",
                    snap.state,
                    snap.last_error.as_deref().unwrap_or("none")
                );
            }
            if now >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(POLL.min(deadline - now)).await;
        }
    }

    fn note_state(&mut self, state: &str) {
        if self.states.last().map(String::as_str) != Some(state) {
            self.states.push(state.to_string());
        }
    }

    /// A progress line: new when the state or step changes (or, off a terminal, when the
    /// step's progress passes another quarter), rewritten in place on a terminal.
    fn show(&mut self, snap: &Snapshot, pct: Option<u64>) {
        let text = format!("   [{:>6}] {}", elapsed(self.start.elapsed()), snap.line());
        let key = |s: &Snapshot| (s.state.clone(), s.target.clone(), s.step.clone());
        match &self.last_line {
            Some((last, last_pct)) if key(last) == key(snap) => {
                if *last_pct != pct {
                    if self.tty {
                        print!("\r{text}\x1b[K");
                        let _ = std::io::stdout().flush();
                    } else if pct.map(|p| p / 25) != last_pct.map(|p| p / 25) {
                        self.new_line(&text);
                    }
                }
            }
            _ => self.new_line(&text),
        }
        self.last_line = Some((snap.clone(), pct));
    }

    fn new_line(&mut self, text: &str) {
        self.end_live();
        if self.tty {
            print!("{text}");
            let _ = std::io::stdout().flush();
            self.live = true;
        } else {
            println!("{text}");
        }
    }

    /// End an open progress line, so the next output starts on its own line.
    fn end_live(&mut self) {
        if self.live {
            println!();
            self.live = false;
        }
    }

    /// Close a timed phase; `expected` names its steps in case none was seen running.
    fn end_phase(&mut self, name: &str, started: Instant, expected: Vec<String>) {
        let now = Instant::now();
        let steps = std::mem::take(&mut self.steps).finish(now, expected);
        self.phases.push(Phase {
            name: name.to_string(),
            took: now - started,
            steps,
        });
        self.last_line = None;
    }

    /// `GET /v1/nodes/{id}/clean_steps`: the document and its list of steps.
    async fn clean_steps(&self) -> Result<(Value, Vec<Value>)> {
        let path = format!("/v1/nodes/{}/clean_steps", seg(self.uuid()?));
        let doc = self.client.get(&path, &[]).await?;
        let steps = doc
            .get("clean_steps")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        Ok((doc, steps))
    }

    /// What automated cleaning runs, from the cached steps: priority above 0, highest first
    /// (no priority overrides in the demo's config).
    async fn automated_steps(&self) -> Result<Vec<String>> {
        let (_, mut steps) = self.clean_steps().await?;
        let priority = |s: &Value| s.get("priority").and_then(Value::as_i64).unwrap_or(0);
        steps.retain(|s| priority(s) > 0);
        steps.sort_by_key(|s| std::cmp::Reverse(priority(s)));
        Ok(steps
            .iter()
            .filter_map(|s| {
                let interface = s.get("interface")?.as_str()?;
                Some(format!("{interface}.{}", s.get("step")?.as_str()?))
            })
            .collect())
    }

    /// The cached steps as a table.
    async fn print_clean_steps(&self) -> Result<()> {
        let (doc, steps) = self.clean_steps().await?;
        println!(
            "== cached clean steps (GET /v1/nodes/{{id}}/clean_steps, updated {})",
            doc.get("updated_at")
                .and_then(Value::as_str)
                .unwrap_or("never")
        );
        let rows = output::rows(&steps, &["step", "interface", "priority", "source"]);
        for line in output::table(&["Step", "Interface", "Priority", "Source"], &rows).lines() {
            println!("   {line}");
        }
        Ok(())
    }

    fn summary(&self) {
        println!("== summary");
        println!(
            "   node         {NODE_NAME} ({}), driver fake-hardware",
            self.node.as_deref().unwrap_or("?")
        );
        println!("   states seen  {}", self.states.join(" → "));
        for p in &self.phases {
            let steps: Vec<String> = p
                .steps
                .iter()
                .map(|(name, took)| match took {
                    Some(d) => format!("{name} {}", elapsed(*d)),
                    None => format!("{name} <{}s", POLL.as_secs_f64()),
                })
                .collect();
            let steps = if steps.is_empty() {
                String::new()
            } else {
                format!("  steps: {}", steps.join(", "))
            };
            println!("   {:<19} {:>6}{steps}", p.name, elapsed(p.took));
        }
        let disks: Vec<&str> = self.disks.iter().map(|d| d.contents.as_str()).collect();
        println!(
            "   disks        {} sparse files, erased and read back as zeroes",
            self.disks.len()
        );
        for d in disks {
            println!("                before: {d}");
        }
        println!(
            "   total        {} wall (step times as seen by polling every {}s)",
            elapsed(self.start.elapsed()),
            POLL.as_secs_f64()
        );
    }

    /// What went wrong, from the node and both logs.
    async fn report_failure(&mut self) {
        self.end_live();
        eprintln!("== the demo failed");
        if self.node.is_some() {
            match self.get_node().await {
                Ok(node) => {
                    let snap = Snapshot::of(&node);
                    eprintln!("node {NODE_NAME} is in \"{}\"", snap.state);
                    eprintln!(
                        "last_error: {}",
                        snap.last_error.as_deref().unwrap_or("none")
                    );
                }
                Err(e) => eprintln!("cannot read the node: {e}"),
            }
        }
        for log in ["rivetd.log", "agent.log"] {
            let path = self.dir.join(log);
            if path.exists() {
                eprintln!("-- last lines of {log}:\n{}", tail(&path, 25));
            }
        }
    }
}

/// The last `n` lines of a file.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Two sparse files with something worth erasing on them.
fn make_disks(dir: &Path, mib: u64) -> Result<Vec<Disk>> {
    println!("== the node's disks: two sparse files of {mib} MiB");
    let mut disks = Vec::new();
    for i in 0..2 {
        let path = dir.join(format!("disk{i}.img"));
        File::create(&path)
            .and_then(|f| f.set_len(mib * MIB))
            .with_context(|| format!("cannot create {}", path.display()))?;
        let mut contents = seed(&path, i, mib)?;
        write_pattern(&path, mib / 2 * MIB)?;
        contents.push_str(&format!(" + 1 MiB pattern at {} MiB", mib / 2));
        println!("   {}: {contents}", file_name(&path));
        disks.push(Disk { path, contents });
    }
    Ok(disks)
}

/// A partition table and a filesystem signature, written here (no disk tools needed): disk 0
/// a GPT with two partitions and an ext4 superblock in the first, disk 1 an ext4 superblock
/// on the whole disk. Returns what was written.
fn seed(path: &Path, index: usize, mib: u64) -> Result<String> {
    let size = mib * MIB;
    if index == 0 {
        let root_mib = (mib / 4).clamp(1, 64);
        let root_last = (1 + root_mib) * MIB / disk::SECTOR - 1;
        let parts = [
            disk::Part {
                first: MIB / disk::SECTOR,
                last: root_last,
                name: "demo-root",
            },
            disk::Part {
                first: root_last + 1,
                last: disk::usable(size).1,
                name: "",
            },
        ];
        disk::new_gpt(size, &parts, seed_of(path))?.write_to(path)?;
        disk::write_ext4_superblock(path, MIB, root_mib * MIB, "demo-root")?;
        return Ok(format!(
            "GPT (2 partitions) + ext4 superblock \"demo-root\" in partition 1 ({root_mib} MiB)"
        ));
    }
    disk::write_ext4_superblock(path, 0, size, "demo-data")?;
    Ok("ext4 superblock \"demo-data\" on the whole disk".into())
}

/// Something different per run and file, for the GUIDs of a new GPT.
fn seed_of(path: &Path) -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let name = path
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01B3)
        });
    nanos ^ name ^ (u64::from(std::process::id()) << 32)
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Read every disk fully (in parallel: a sparse file reads at only a few hundred MB/s) and
/// fail unless all of it is zeroes.
fn check_zeroed(disks: &[Disk]) -> Result<()> {
    let scans: Vec<Result<(u64, u64)>> = std::thread::scope(|s| {
        let handles: Vec<_> = disks.iter().map(|d| s.spawn(|| scan(&d.path))).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("disk scan panicked")))
            })
            .collect()
    });
    for (d, r) in disks.iter().zip(scans) {
        let (size, dirty) = r?;
        let name = file_name(&d.path);
        if dirty > 0 {
            bail!(
                "{name}: {dirty} MiB of {} MiB still hold data after cleaning",
                size / MIB
            );
        }
        println!("   {name}: {} MiB, all zero", size / MIB);
    }
    Ok(())
}

/// 1 MiB of recognisable text at `offset`.
fn write_pattern(path: &Path, offset: u64) -> Result<()> {
    let text = b"rivet demo data, erase me. ";
    let block: Vec<u8> = text.iter().copied().cycle().take(MIB as usize).collect();
    let mut f = OpenOptions::new()
        .write(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    f.seek(SeekFrom::Start(offset))
        .and_then(|_| f.write_all(&block))
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Read a file fully: its size and how many of its MiB hold anything but zeroes.
fn scan(path: &Path) -> Result<(u64, u64)> {
    let mut f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let zero = vec![0u8; MIB as usize];
    let mut buf = vec![0u8; MIB as usize];
    let (mut size, mut dirty) = (0u64, 0u64);
    loop {
        let mut got = 0;
        while got < buf.len() {
            let n = f
                .read(&mut buf[got..])
                .with_context(|| format!("cannot read {}", path.display()))?;
            if n == 0 {
                break;
            }
            got += n;
        }
        if got == 0 {
            return Ok((size, dirty));
        }
        size += got as u64;
        // Slice equality is a memcmp, fast even in a debug build.
        if buf[..got] != zero[..got] {
            dirty += 1;
        }
    }
}

/// `len` bytes of a file from `offset`.
fn read_range(path: &Path, offset: u64, len: usize) -> Result<Vec<u8>> {
    let mut f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut buf = vec![0u8; len];
    f.seek(SeekFrom::Start(offset))
        .and_then(|_| f.read_exact(&mut buf))
        .with_context(|| format!("cannot read {}", path.display()))?;
    Ok(buf)
}

/// The image the demo deploys: 32 MiB, a GPT with one partition (written here, as
/// `sgdisk -o -n 1:2048:0` would), filled with a pattern that names each MiB (so a misplaced
/// block shows).
struct DemoImage {
    path: PathBuf,
    len: u64,
    sha256: String,
    layout: &'static str,
}

impl DemoImage {
    const MIB: u64 = 32;

    fn make(dir: &Path) -> Result<DemoImage> {
        use sha2::{Digest, Sha256};
        let path = dir.join("demo-image.raw");
        let len = Self::MIB * MIB;
        {
            let mut f =
                File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
            for i in 0..Self::MIB {
                let text = format!("rivet demo image, MiB {i:04}. ");
                let block: Vec<u8> = text.bytes().cycle().take(MIB as usize).collect();
                f.write_all(&block)
                    .with_context(|| format!("cannot write {}", path.display()))?;
            }
        }
        let (_, last) = disk::usable(len);
        let root = disk::Part {
            first: MIB / disk::SECTOR,
            last,
            name: "demo-root",
        };
        disk::new_gpt(len, &[root], seed_of(&path))?.write_to(&path)?;
        let layout = "GPT, one partition";
        let mut hasher = Sha256::new();
        let mut f = File::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
        let mut buf = vec![0u8; MIB as usize];
        loop {
            let n = f
                .read(&mut buf)
                .with_context(|| format!("cannot read {}", path.display()))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        let sha256 = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(DemoImage {
            path,
            len,
            sha256,
            layout,
        })
    }

    /// The image's data (past its GPT, which the agent fixes up) is on `disk`, and a
    /// `config-2` ISO 9660 volume holding the node's uuid follows it.
    fn check_on(&self, disk: &Path, uuid: &str) -> Result<()> {
        let span = (self.len - 2 * MIB) as usize;
        let want = read_range(&self.path, MIB, span)?;
        let got = read_range(disk, MIB, span)?;
        if want != got {
            bail!("{}: the image's data is not on the disk", file_name(disk));
        }
        let size = std::fs::metadata(disk)
            .with_context(|| format!("cannot stat {}", disk.display()))?
            .len();
        // Partitions start on MiB boundaries; an ISO 9660 volume descriptor sits 32 KiB in.
        let mut found = None;
        let mut at = self.len;
        while at + 0x8000 + 2048 <= size {
            let pvd = read_range(disk, at + 0x8000, 72)?;
            if &pvd[..6] == b"\x01CD001" {
                found = Some((at, pvd));
                break;
            }
            at += MIB;
        }
        let (start, pvd) = found.ok_or_else(|| {
            anyhow!(
                "{}: no configdrive (ISO 9660) after the image",
                file_name(disk)
            )
        })?;
        let label = String::from_utf8_lossy(&pvd[40..72]).trim().to_string();
        if label != "config-2" {
            bail!(
                "{}: the ISO after the image is labelled {label:?}, not config-2",
                file_name(disk)
            );
        }
        let iso = read_range(disk, start, ((size - start).min(4 * MIB)) as usize)?;
        if !iso.windows(uuid.len()).any(|w| w == uuid.as_bytes()) {
            bail!(
                "{}: the configdrive does not hold the node's uuid",
                file_name(disk)
            );
        }
        let pvd = start;
        println!(
            "   {}: the image's {} MiB are on the disk; config-2 ISO at {} MiB holds meta_data uuid {uuid}",
            file_name(disk),
            self.len / MIB,
            pvd / MIB
        );
        Ok(())
    }
}

/// A loopback HTTP server for one file (the operator's image server), on a thread; stops
/// when dropped.
struct ImageServer {
    url: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl ImageServer {
    fn start(file: &Path) -> Result<ImageServer> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .context("cannot listen on a loopback port")?;
        listener.set_nonblocking(true)?;
        let url = format!("http://{}/{}", listener.local_addr()?, file_name(file));
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (s, file) = (stop.clone(), file.to_path_buf());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let file = file.clone();
                        std::thread::spawn(move || {
                            let _ = serve_file(conn, &file);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Ok(ImageServer { url, stop })
    }
}

impl Drop for ImageServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Answer one request with the file (any path: the server has one file).
fn serve_file(mut conn: std::net::TcpStream, file: &Path) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
        if conn.read(&mut byte)? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let mut f = File::open(file)?;
    let len = f.metadata()?.len();
    write!(
        conn,
        "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n"
    )?;
    if !head.starts_with(b"HEAD") {
        std::io::copy(&mut f, &mut conn)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn plan_and_percent() {
        let node = json!({
            "driver_internal_info": {"clean_plan": [
                {"interface": "deploy", "step": "erase_devices_metadata", "priority": 99},
                {"interface": "deploy", "step": "erase_devices", "priority": 10},
            ]},
            "clean_step": {"step": "erase_devices", "progress": {"done": 3, "total": 4}},
        });
        assert_eq!(
            plan_of(&node),
            vec!["deploy.erase_devices_metadata", "deploy.erase_devices"]
        );
        assert_eq!(percent(&node), Some(75));
        assert_eq!(percent(&json!({"clean_step": {}})), None);
        assert!(plan_of(&json!({})).is_empty());
    }

    #[test]
    fn steps_between_polls_have_no_time() {
        let t0 = Instant::now();
        let mut w = StepWatch::default();
        let running = json!({
            "provision_state": "clean wait",
            "driver_internal_info": {"clean_plan": [
                {"interface": "deploy", "step": "a"}, {"interface": "deploy", "step": "b"}]},
            "clean_step": {"interface": "deploy", "step": "b"},
        });
        w.observe(&running, &Snapshot::of(&running), t0);
        let idle = json!({"provision_state": "available"});
        let t1 = t0 + Duration::from_secs(2);
        w.observe(&idle, &Snapshot::of(&idle), t1);
        let steps = w.finish(t1, vec!["deploy.x".into()]);
        assert_eq!(
            steps,
            vec![
                ("deploy.a".to_string(), None),
                ("deploy.b".to_string(), Some(Duration::from_secs(2)))
            ]
        );
    }

    #[test]
    fn scan_counts_dirty_mebibytes() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("d.img");
        File::create(&path)
            .and_then(|f| f.set_len(4 * MIB + 10))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(scan(&path).ok(), Some((4 * MIB + 10, 0)));
        write_pattern(&path, 2 * MIB).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(scan(&path).ok(), Some((4 * MIB + 10, 1)));
    }
}
