//! Simulated agents: light tasks that speak the real agent protocol over loopback
//! (`rivet_protocol::agent` types, `POST /agent/v1/lookup`, `POST /agent/v1/heartbeat/{node}`
//! with `Authorization: Bearer TOKEN`), one token each, all sharing one HTTP client.
//!
//! They answer commands at once: `get_inventory` with a small canned inventory,
//! `get_clean_steps` with the [`Profile`]'s steps, `execute_step` with `{}` — except the
//! profile's long step, which "runs" forever and is reported in `running` with growing
//! progress, as an agent erasing disks does for hours.

use anyhow::{bail, Result};
use reqwest::StatusCode;
use rivet_protocol::agent::{
    Command, CommandKind, CommandResult, CommandStatus, HeartbeatRequest, HeartbeatResponse,
    LookupRequest, LookupResponse, Progress, RunningCommand, HEARTBEAT_PATH, LOOKUP_PATH,
};
use rivet_protocol::inventory::{Boot, Cpu, Disk, Interface, Inventory, Memory, SystemVendor};
use rivet_protocol::steps::StepDescriptor;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// The agent version the simulated agents report.
pub const VERSION: &str = "rivet-bench-sim";

/// What the simulated hardware offers.
#[derive(Debug, Clone)]
pub struct Profile {
    /// Steps returned by `get_clean_steps`.
    pub steps: Vec<StepDescriptor>,
    /// An `execute_step` of this step never finishes (reported as running).
    pub long_step: Option<String>,
}

impl Profile {
    /// Two no-op steps, priorities 50 and 40 (the clean-fleet bench).
    pub fn noop() -> Profile {
        Profile {
            steps: vec![
                StepDescriptor::in_band("noop_a", 50),
                StepDescriptor::in_band("noop_b", 40),
            ],
            long_step: None,
        }
    }

    /// One `erase_devices` (priority 10) that runs until the bench ends (the fleet bench).
    pub fn long_erase() -> Profile {
        Profile {
            steps: vec![StepDescriptor::in_band("erase_devices", 10)],
            long_step: Some("erase_devices".into()),
        }
    }
}

/// A small but complete inventory (IPA shape), different per node.
pub fn inventory(i: usize) -> Inventory {
    let mac = |n: usize| {
        format!(
            "52:54:{:02x}:{:02x}:{:02x}:{:02x}",
            n,
            (i >> 16) & 0xff,
            (i >> 8) & 0xff,
            i & 0xff
        )
    };
    Inventory {
        cpu: Cpu {
            model_name: "Simulated CPU @ 2.40GHz".into(),
            frequency: "2400".into(),
            count: 64,
            architecture: "x86_64".into(),
            flags: vec!["fpu".into(), "sse2".into(), "avx2".into()],
            socket_count: 2,
        },
        memory: Memory {
            total: 270_582_939_648,
            physical_mb: 262_144,
        },
        disks: (0..2)
            .map(|d| Disk {
                name: format!("/dev/nvme{d}n1"),
                model: "SIM NVMe 1.92TB".into(),
                size: 1_920_383_410_176,
                rotational: false,
                serial: Some(format!("SIM{i:08}D{d}")),
                ..Default::default()
            })
            .collect(),
        interfaces: (0..2)
            .map(|n| Interface {
                name: format!("eno{}", n + 1),
                mac_address: mac(n),
                has_carrier: true,
                speed_mbps: Some(25_000),
                ..Default::default()
            })
            .collect(),
        system_vendor: SystemVendor {
            product_name: "SimServer 1000".into(),
            serial_number: format!("SIM{i:08}"),
            manufacturer: "Rivet".into(),
            ..Default::default()
        },
        boot: Boot {
            current_boot_mode: "uefi".into(),
            pxe_interface: Some(mac(0)),
        },
        hostname: format!("sim-{i}"),
        ..Default::default()
    }
}

/// The HTTP side shared by every simulated agent.
#[derive(Clone)]
pub struct Link {
    http: reqwest::Client,
    base: String,
    long_poll: Duration,
}

impl Link {
    /// One client (one connection pool) for all agents talking to `base`.
    pub fn new(base: &str, long_poll_s: u64) -> Result<Link> {
        Ok(Link {
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(usize::MAX)
                .tcp_nodelay(true)
                .build()?,
            base: base.to_string(),
            long_poll: Duration::from_secs(long_poll_s),
        })
    }
}

/// What a heartbeat got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    /// 200; command (if any) handled, acks applied.
    Ok,
    /// 401: the token is gone (the node finished or was reset).
    Unauthorized,
    /// 404: unknown node.
    NotFound,
}

/// One simulated agent.
pub struct SimAgent {
    /// The node it runs on.
    pub node: String,
    index: usize,
    token: Option<String>,
    results: Vec<CommandResult>,
    seen: HashSet<String>,
    running: Option<RunningCommand>,
    progress: u64,
    /// Report the long step's progress (growing bytes) in every heartbeat.
    pub report_progress: bool,
}

impl SimAgent {
    /// A fresh ramdisk boot on `node` (`index` varies the inventory).
    pub fn new(node: String, index: usize) -> SimAgent {
        SimAgent {
            node,
            index,
            token: None,
            results: Vec::new(),
            seen: HashSet::new(),
            running: None,
            progress: 0,
            report_progress: true,
        }
    }

    /// Whether the profile's long step is running.
    pub fn long_step_running(&self) -> bool {
        self.running.is_some()
    }

    /// `POST /agent/v1/lookup` by node UUID. `Ok(true)` with a token, `Ok(false)` on 404 (no
    /// ramdisk expected); an answer without a token is an error (it was issued before).
    pub async fn lookup(&mut self, link: &Link) -> Result<bool> {
        let req = LookupRequest {
            node_uuid: Some(self.node.clone()),
            agent_version: VERSION.into(),
            ..Default::default()
        };
        let resp = link
            .http
            .post(format!("{}{LOOKUP_PATH}", link.base))
            .timeout(Duration::from_secs(30))
            .json(&req)
            .send()
            .await?;
        match resp.status() {
            StatusCode::OK => {
                let body: LookupResponse = resp.json().await?;
                match body.agent_token {
                    Some(t) => {
                        self.token = Some(t);
                        Ok(true)
                    }
                    None => bail!("lookup of node {} returned no token", self.node),
                }
            }
            StatusCode::NOT_FOUND => Ok(false),
            s => bail!("lookup of node {}: {s} {}", self.node, resp.text().await?),
        }
    }

    /// One heartbeat; `wait` asks for the long poll. Returns what happened and the latency
    /// (request sent → answer read).
    pub async fn heartbeat(
        &mut self,
        link: &Link,
        profile: &Profile,
        wait: bool,
    ) -> Result<(Beat, Duration)> {
        let report = self.report_progress;
        if let Some(r) = self.running.as_mut().filter(|_| report) {
            self.progress += 1 << 30;
            r.progress = Some(Progress {
                done: self.progress,
                total: 2 * 1_920_383_410_176,
                message: "erasing /dev/nvme0n1, /dev/nvme1n1".into(),
                rate: None,
            });
        }
        let req = HeartbeatRequest {
            agent_version: VERSION.into(),
            running: self.running.clone(),
            results: self.results.clone(),
            wait,
            boot_id: None,
        };
        let body = serde_json::to_vec(&req)?;
        let timeout = if wait {
            link.long_poll + Duration::from_secs(15)
        } else {
            Duration::from_secs(15)
        };
        let start = Instant::now();
        let resp = link
            .http
            .post(format!("{}{HEARTBEAT_PATH}/{}", link.base, self.node))
            .bearer_auth(self.token.as_deref().unwrap_or_default())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .timeout(timeout)
            .body(body)
            .send()
            .await?;
        let status = resp.status();
        let bytes = resp.bytes().await?;
        let took = start.elapsed();
        match status {
            StatusCode::OK => {}
            StatusCode::UNAUTHORIZED => return Ok((Beat::Unauthorized, took)),
            StatusCode::NOT_FOUND => return Ok((Beat::NotFound, took)),
            s => bail!(
                "heartbeat of node {}: {s} {}",
                self.node,
                String::from_utf8_lossy(&bytes)
            ),
        }
        let answer: HeartbeatResponse = serde_json::from_slice(&bytes)?;
        self.results.retain(|r| !answer.acks.contains(&r.id));
        if let Some(cmd) = answer.command {
            self.handle(cmd, profile);
        }
        Ok((Beat::Ok, took))
    }

    fn finish(&mut self, cmd: &Command, status: CommandStatus, result: Value) {
        self.results.push(CommandResult {
            id: cmd.id.clone(),
            name: cmd.kind.name().into(),
            status,
            result,
            error: None,
            log_tail: None,
        });
    }

    /// Run a command "instantly"; a repeated id is ignored, as the real agent does.
    fn handle(&mut self, cmd: Command, profile: &Profile) {
        if !self.seen.insert(cmd.id.clone()) {
            return;
        }
        match &cmd.kind {
            CommandKind::GetInventory => {
                let inv = serde_json::to_value(inventory(self.index)).unwrap_or(Value::Null);
                self.finish(&cmd, CommandStatus::Succeeded, json!({ "inventory": inv }));
            }
            CommandKind::GetCleanSteps => {
                let steps = serde_json::to_value(&profile.steps).unwrap_or(Value::Null);
                self.finish(
                    &cmd,
                    CommandStatus::Succeeded,
                    json!({"clean_steps": steps, "hardware_manager_versions": {"sim": "1.0"}}),
                );
            }
            CommandKind::ExecuteStep { step, .. } if Some(step) == profile.long_step.as_ref() => {
                self.running = Some(RunningCommand {
                    id: cmd.id.clone(),
                    name: cmd.kind.name().into(),
                    step: Some(step.clone()),
                    progress: None,
                });
            }
            CommandKind::Abort { command_id } => {
                if let Some(r) = self.running.take_if(|r| &r.id == command_id) {
                    self.results.push(CommandResult {
                        id: r.id,
                        name: r.name,
                        status: CommandStatus::Aborted,
                        result: Value::Null,
                        error: Some("aborted".into()),
                        log_tail: None,
                    });
                }
                self.finish(&cmd, CommandStatus::Succeeded, json!({}));
            }
            CommandKind::GetDeploySteps => {
                self.finish(
                    &cmd,
                    CommandStatus::Succeeded,
                    json!({"deploy_steps": [], "hardware_manager_versions": {"sim": "1.0"}}),
                );
            }
            CommandKind::ExecuteStep { .. }
            | CommandKind::Reboot
            | CommandKind::PowerOff
            | CommandKind::FinalizeRescue { .. } => {
                self.finish(&cmd, CommandStatus::Succeeded, json!({}));
            }
        }
    }

    /// Boot: look up (retrying 404 for a while), then long-poll and answer commands until
    /// the profile's long step runs (`Ok(true)`), or the node no longer expects this ramdisk
    /// (`Ok(false)`: cleaning ended), or `deadline`.
    pub async fn converse(
        &mut self,
        link: &Link,
        profile: &Profile,
        deadline: Instant,
    ) -> Result<bool> {
        while !self.lookup(link).await? {
            if Instant::now() > deadline {
                bail!("node {}: lookup kept answering 404", self.node);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        while Instant::now() < deadline {
            if self.long_step_running() && self.results.is_empty() {
                return Ok(true);
            }
            match self.heartbeat(link, profile, true).await {
                Ok((Beat::Ok, _)) => {}
                Ok((Beat::Unauthorized, _)) | Ok((Beat::NotFound, _)) => {
                    // The node finished (token dropped at a stable state) or was reset: a
                    // real agent looks up again; 404 means no ramdisk is expected any more.
                    if !self.lookup(link).await? {
                        return Ok(false);
                    }
                }
                Err(e) => {
                    warn_retry(&self.node, &e);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        bail!(
            "node {}: conversation did not finish before the deadline",
            self.node
        )
    }
}

/// Transport errors are retried like the real agent does; say so once per error on stderr.
fn warn_retry(node: &str, e: &anyhow::Error) {
    eprintln!("sim agent {node}: heartbeat failed, retrying: {e:#}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canned_inventory_round_trips() {
        let v = serde_json::to_value(inventory(7)).expect("to json");
        let back: Inventory = serde_json::from_value(v.clone()).expect("from json");
        assert_eq!(back.disks.len(), 2);
        assert_eq!(back.interfaces[0].mac_address, "52:54:00:00:00:07");
        assert!(v.to_string().len() < 2048, "small inventory");
    }

    #[test]
    fn repeated_command_ignored_and_long_step_runs() {
        let p = Profile::long_erase();
        let mut a = SimAgent::new("n".into(), 0);
        let c = Command {
            id: "c1".into(),
            kind: CommandKind::GetCleanSteps,
        };
        a.handle(c.clone(), &p);
        a.handle(c, &p);
        assert_eq!(a.results.len(), 1);
        a.handle(
            Command {
                id: "c2".into(),
                kind: CommandKind::ExecuteStep {
                    interface: "deploy".into(),
                    step: "erase_devices".into(),
                    args: Default::default(),
                },
            },
            &p,
        );
        assert!(a.long_step_running());
        assert_eq!(a.results.len(), 1);
    }
}
