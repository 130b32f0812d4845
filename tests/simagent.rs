//! A simulated ramdisk for scenarios with many nodes or several controllers: it speaks the
//! real agent protocol over HTTP (lookup, long-poll heartbeats, results kept until
//! acknowledged, a repeated command id ignored) and, like the real agent given several
//! `rivet.controller` URLs, moves to the next controller when its own stops answering. What a
//! command does is the test's ([`Steps`]): the takeover and storage-fault tests count the
//! executions of each step there, to prove none ran twice.
//!
//! (rivet-bench has its own, tuned to run thousands per process: bench/src/sim.rs.)

use anyhow::{bail, Result};
use rivet_protocol::agent::{
    Command, CommandResult, CommandStatus, HeartbeatRequest, HeartbeatResponse, LookupRequest,
    LookupResponse, HEARTBEAT_PATH, LOOKUP_PATH,
};
use serde_json::Value;
use std::collections::HashSet;
use std::future::Future;
use std::time::{Duration, Instant};

/// What the simulated ramdisk does with the commands it is given, and with answers it did not
/// expect.
pub trait Steps: Send + 'static {
    /// Run `cmd` for `node` and return its result (a step sleeps and counts, say).
    fn execute(&mut self, node: &str, cmd: &Command) -> impl Future<Output = Value> + Send;
    /// An answer that is neither a success, a 401 (token gone: look up again) nor a 404
    /// (node expects no ramdisk): `Err` ends this agent with it, `Ok` retries after a pause
    /// (a 503 while the database is away, say).
    fn unexpected(&mut self, node: &str, what: &str, status: u16, body: &str) -> Result<()>;
}

/// One simulated ramdisk for one node.
pub struct SimAgent<S> {
    node: String,
    /// Controllers in the order this agent tries them.
    urls: Vec<String>,
    current: usize,
    token: Option<String>,
    results: Vec<CommandResult>,
    seen: HashSet<String>,
    http: reqwest::Client,
    version: &'static str,
    steps: S,
}

impl<S: Steps> SimAgent<S> {
    /// An agent for `node`, trying `urls` in order, reporting `version` as its agent version;
    /// `http` may be shared between agents (its timeout bounds a held poll, so it must be
    /// longer than rivetd's `long_poll_s` in the test's config).
    pub fn new(
        node: &str,
        urls: Vec<String>,
        version: &'static str,
        http: reqwest::Client,
        steps: S,
    ) -> SimAgent<S> {
        SimAgent {
            node: node.to_string(),
            urls,
            current: 0,
            token: None,
            results: Vec::new(),
            seen: HashSet::new(),
            http,
            version,
            steps,
        }
    }

    fn url(&self) -> String {
        self.urls[self.current % self.urls.len().max(1)].clone()
    }

    /// The controller did not answer: try the next one, as the real agent does.
    fn fail_over(&mut self) {
        self.current += 1;
    }

    /// Look up until a token comes. A 404 before the operation started may only mean the
    /// node does not expect a ramdisk yet (keep asking); once `started`, it means the
    /// operation ended: `Ok(false)`.
    async fn look_up(&mut self, deadline: Instant, started: bool) -> Result<bool> {
        while Instant::now() < deadline {
            let req = LookupRequest {
                node_uuid: Some(self.node.clone()),
                agent_version: self.version.into(),
                ..Default::default()
            };
            let sent = self
                .http
                .post(format!("{}{LOOKUP_PATH}", self.url()))
                .json(&req)
                .send()
                .await;
            match sent {
                Err(_) => self.fail_over(),
                Ok(r) => match r.status().as_u16() {
                    200 => {
                        if let Ok(body) = r.json::<LookupResponse>().await {
                            self.token = body.agent_token;
                            if self.token.is_some() {
                                return Ok(true);
                            }
                        }
                    }
                    404 if started => return Ok(false),
                    404 => {}
                    s => {
                        let body = r.text().await.unwrap_or_default();
                        self.steps.unexpected(&self.node, "lookup", s, &body)?;
                    }
                },
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        bail!("node {}: no agent token before the deadline", self.node)
    }

    /// Converse until the node no longer expects this ramdisk (`Ok`), or fail at `deadline`.
    pub async fn run(mut self, deadline: Instant) -> Result<()> {
        self.look_up(deadline, false).await?;
        while Instant::now() < deadline {
            let req = HeartbeatRequest {
                agent_version: self.version.into(),
                running: None,
                results: self.results.clone(),
                wait: true,
                boot_id: None,
            };
            let sent = self
                .http
                .post(format!("{}{HEARTBEAT_PATH}/{}", self.url(), self.node))
                .bearer_auth(self.token.clone().unwrap_or_default())
                .json(&req)
                .send()
                .await;
            let resp = match sent {
                Ok(r) => r,
                Err(_) => {
                    self.fail_over();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            match resp.status().as_u16() {
                200 => {}
                // The token is gone: the node rests (lookup says 404), or the conductor
                // rebooted the node and a new boot earns a new token — what the real agent
                // finds out by looking up again.
                401 => {
                    if !self.look_up(deadline, true).await? {
                        return Ok(());
                    }
                    continue;
                }
                s => {
                    let body = resp.text().await.unwrap_or_default();
                    self.steps.unexpected(&self.node, "heartbeat", s, &body)?;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            }
            let Ok(answer) = resp.json::<HeartbeatResponse>().await else {
                // The controller died mid-answer: the results are still held, resend.
                self.fail_over();
                continue;
            };
            self.results.retain(|r| !answer.acks.contains(&r.id));
            if let Some(cmd) = answer.command {
                // A repeated command id is ignored: its result is still held until acked.
                if self.seen.insert(cmd.id.clone()) {
                    let result = self.steps.execute(&self.node, &cmd).await;
                    self.results.push(CommandResult {
                        id: cmd.id.clone(),
                        name: cmd.kind.name().into(),
                        status: CommandStatus::Succeeded,
                        result,
                        error: None,
                        log_tail: None,
                    });
                }
            }
        }
        bail!(
            "node {}: the operation did not end before the deadline",
            self.node
        )
    }
}
