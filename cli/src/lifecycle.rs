//! `rivet node rescue|unrescue|adopt|service|hold`: the rest of a deployed node's life.
//!
//! The rescue password is never taken from the command line (it would show in `ps` and in
//! shell history): it comes from `RIVET_RESCUE_PASSWORD` or the first line of stdin.

use crate::client::{seg, Client};
use crate::output::Output;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use rivet_protocol::api::ProvisionRequest;
use rivet_protocol::states::Verb;
use rivet_protocol::steps::RequestedStep;
use serde_json::{json, Value};

/// Lifecycle subcommands of `rivet node`.
#[derive(Debug, Subcommand)]
pub enum LifecycleCmd {
    /// active → rescuing → rescue wait → rescue: boot the rescue ramdisk with a `rescue`
    /// login. The password comes from RIVET_RESCUE_PASSWORD, else the first line of stdin.
    Rescue(NodeOnly),
    /// rescue → unrescuing → active: boot the instance again.
    Unrescue(NodeOnly),
    /// manageable → adopting → active: take over a node that already runs its instance
    /// (nothing is written, the power is left alone).
    Adopt(AdoptArgs),
    /// active → servicing → active: run service steps on a deployed node (API 1.87).
    Service(ServiceArgs),
    /// Pause a node with a `hold` step (clean hold / service hold); `rivet node unhold`
    /// continues, `rivet node abort` stops.
    Hold(HoldArgs),
}

/// Just the node.
#[derive(Debug, Args)]
pub struct NodeOnly {
    /// Node UUID or name.
    node: String,
}

/// `rivet node adopt`.
#[derive(Debug, Args)]
pub struct AdoptArgs {
    /// Node UUID or name.
    node: String,
    /// Set instance_info.image_source first: the image the running instance came from.
    #[arg(long, value_name = "URL")]
    image: Option<String>,
}

/// `rivet node service`.
#[derive(Debug, Args)]
pub struct ServiceArgs {
    /// Node UUID or name.
    node: String,
    /// The steps as a JSON list, e.g. '[{"interface":"bios","step":"apply_configuration","args":{...}}]'.
    #[arg(long, value_name = "JSON")]
    steps: String,
    /// Run only out-of-band steps, without booting the ramdisk (API 1.108).
    #[arg(long)]
    disable_ramdisk: bool,
}

/// Where `rivet node hold` pauses.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum HoldIn {
    /// Manual cleaning (manageable → clean hold).
    Clean,
    /// Servicing (active → service hold).
    Service,
}

/// `rivet node hold`.
#[derive(Debug, Args)]
pub struct HoldArgs {
    /// Node UUID or name.
    node: String,
    /// Which operation holds: manual cleaning or servicing.
    #[arg(long = "in", value_enum, default_value = "service")]
    within: HoldIn,
}

fn hold_step() -> RequestedStep {
    RequestedStep {
        interface: "deploy".into(),
        step: "hold".into(),
        args: Default::default(),
        order: None,
    }
}

fn rescue_password() -> Result<String> {
    if let Ok(p) = std::env::var("RIVET_RESCUE_PASSWORD") {
        if !p.is_empty() {
            return Ok(p);
        }
    }
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .context("reading the rescue password from stdin")?;
    let p = line.trim_end_matches(['\r', '\n']).to_string();
    if p.is_empty() {
        bail!("no rescue password: set RIVET_RESCUE_PASSWORD or give it on stdin");
    }
    Ok(p)
}

fn request(target: Verb) -> ProvisionRequest {
    // Through JSON so fields other helpers add to the request stay at their defaults.
    serde_json::from_value(json!({ "target": target })).unwrap_or(ProvisionRequest {
        target,
        clean_steps: None,
        configdrive: None,
        deploy_steps: None,
        rescue_password: None,
        disable_ramdisk: None,
        service_steps: None,
        runbook: None,
    })
}

async fn send(client: &Client, out: Output, node: &str, body: &ProvisionRequest) -> Result<()> {
    client
        .put(
            &format!("/v1/nodes/{}/states/provision", seg(node)),
            Some(body),
        )
        .await?;
    out.note(&format!(
        "Accepted \"{}\" for node {node}; follow it with `rivet node wait {node} --state STATE`",
        body.target
    ));
    Ok(())
}

/// Run a lifecycle subcommand.
pub async fn run(cmd: LifecycleCmd, client: &Client, out: Output) -> Result<()> {
    match cmd {
        LifecycleCmd::Rescue(n) => {
            let mut body = request(Verb::Rescue);
            body.rescue_password = Some(rescue_password()?);
            send(client, out, &n.node, &body).await
        }
        LifecycleCmd::Unrescue(n) => send(client, out, &n.node, &request(Verb::Unrescue)).await,
        LifecycleCmd::Adopt(a) => {
            if let Some(url) = &a.image {
                let ops: Value = json!([
                    {"op": "add", "path": "/instance_info/image_source", "value": url}
                ]);
                client
                    .patch(&format!("/v1/nodes/{}", seg(&a.node)), &ops)
                    .await?;
            }
            send(client, out, &a.node, &request(Verb::Adopt)).await
        }
        LifecycleCmd::Service(a) => {
            let steps: Vec<RequestedStep> = serde_json::from_str(&a.steps)
                .context("--steps must be a JSON list of {\"interface\", \"step\", \"args\"}")?;
            let mut body = request(Verb::Service);
            body.service_steps = Some(steps);
            if a.disable_ramdisk {
                body.disable_ramdisk = Some(true);
            }
            send(client, out, &a.node, &body).await
        }
        LifecycleCmd::Hold(h) => {
            let body = match h.within {
                HoldIn::Clean => {
                    let mut b = request(Verb::Clean);
                    b.clean_steps = Some(vec![hold_step()]);
                    b
                }
                HoldIn::Service => {
                    let mut b = request(Verb::Service);
                    b.service_steps = Some(vec![hold_step()]);
                    b
                }
            };
            send(client, out, &h.node, &body).await
        }
    }
}
