//! `rivet node …`: enrol, list, show, update, delete, and drive the state machine.

use crate::client::{seg, Client};
use crate::output::{self, Output};
use crate::wait;
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use reqwest::StatusCode;
use rivet_protocol::api::{
    BootDeviceRequest, MaintenanceRequest, NodeCreate, PatchOp, PowerRequest, ProvisionRequest,
    TraitsRequest, VmediaAttachRequest,
};
use rivet_protocol::states::{PowerState, Verb};
use rivet_protocol::steps::RequestedStep;
use serde_json::{json, Map, Value};

/// `rivet node` subcommands.
#[derive(Debug, Subcommand)]
pub enum NodeCmd {
    /// Enrol a node (it starts in "enroll").
    Create(CreateArgs),
    /// BIOS, firmware, children, indicators, NMI, boot mode, RAID, console.
    #[command(flatten)]
    Resources(crate::node_resources::NodeResourceCmd),
    /// Attach to the node's serial console (`~.` at the start of a line leaves).
    Console(crate::console::ConsoleArgs),
    /// The node's captured console log (`--tail BYTES`, `--follow`).
    ConsoleLog(crate::console::LogArgs),
    /// List nodes (all pages unless --limit is given).
    List(ListArgs),
    /// Show one node as a Field/Value table.
    Show {
        /// Node UUID or name.
        node: String,
        /// Only these fields (comma separated), e.g. provision_state,last_error.
        #[arg(long, value_delimiter = ',')]
        fields: Vec<String>,
    },
    /// Change fields with JSON-patch add/remove: --set driver_info/ipmi_address=1.2.3.4.
    Update {
        /// Node UUID or name.
        node: String,
        /// PATH=VALUE to add or replace (VALUE parsed as JSON when it parses, else a string).
        #[arg(long = "set", value_name = "PATH=VALUE")]
        set: Vec<String>,
        /// PATH to remove.
        #[arg(long = "unset", value_name = "PATH")]
        unset: Vec<String>,
        /// With a new driver: reset every interface not set here to its default (API 1.45).
        #[arg(long)]
        reset_interfaces: bool,
    },
    /// Delete a node.
    Delete {
        /// Node UUID or name.
        node: String,
    },
    /// enroll → verifying → manageable (validates the BMC); also leaves failure states.
    Manage(NodeArg),
    /// manageable → cleaning → available.
    Provide(NodeArg),
    /// Inspect the hardware.
    Inspect(NodeArg),
    /// Abort a wait or hold state (clean wait → clean failed, …).
    Abort(NodeArg),
    /// Leave a hold state.
    Unhold(NodeArg),
    #[command(flatten)]
    Lifecycle(crate::lifecycle::LifecycleCmd),
    /// Deploy an image (target "active"): sets instance_info from the flags, then deploys.
    Deploy(DeployArgs),
    /// Deploy again onto an active or failed node (target "rebuild").
    Rebuild(DeployArgs),
    /// Tear down a deployment (target "deleted"): then automated cleaning, then available.
    Undeploy(WaitFlag),
    /// Manual cleaning from manageable.
    Clean {
        /// Node UUID or name.
        node: String,
        /// Steps as JSON, or @FILE (@- for stdin): [{"interface": "deploy", "step": "erase_devices_metadata", "args": {}}].
        #[arg(long, value_name = "JSON|@FILE")]
        clean_steps: String,
    },
    /// Power on, off or reboot.
    Power {
        /// Node UUID or name.
        node: String,
        /// The action.
        action: PowerAction,
    },
    /// Put a node in maintenance or take it out.
    Maintenance {
        /// Node UUID or name.
        node: String,
        #[command(subcommand)]
        action: MaintenanceAction,
    },
    /// The node's cached clean steps (JSON).
    CleanSteps(NodeArg),
    /// The node's hardware inventory (JSON).
    Inventory(NodeArg),
    /// The node's history (API 1.78): its provision transitions and failures, oldest first.
    History(NodeArg),
    /// The agent logs kept when a step failed on the ramdisk, newest first (Rivet extension).
    Logs(crate::node_logs::LogsArgs),
    /// Wait until the node reaches a provision state, showing progress on stderr.
    Wait(wait::WaitArgs),
    /// The node's traits (API 1.37): list, add, remove.
    Trait {
        #[command(subcommand)]
        action: TraitAction,
    },
    /// Check every interface has what it needs: an Interface / Result / Reason table.
    Validate(NodeArg),
    /// The boot device: show it (default), set it, or list what the driver supports.
    BootDevice {
        /// Node UUID or name.
        node: String,
        #[command(subcommand)]
        action: Option<BootDeviceAction>,
    },
    /// Virtual media (redfish): attach an ISO by URL, detach, show.
    Vmedia {
        /// Node UUID or name.
        node: String,
        #[command(subcommand)]
        action: VmediaAction,
    },
    /// VIFs attached to the node's ports and port groups (API 1.28).
    #[command(subcommand)]
    Vif(crate::port::VifCmd),
}

/// `rivet node trait list|add|remove NODE [TRAIT…]`.
#[derive(Debug, Subcommand)]
pub enum TraitAction {
    /// List the node's traits.
    List(NodeArg),
    /// Add traits: standard os-traits names (HW_CPU_X86_VMX…) or CUSTOM_[A-Z0-9_]+.
    Add {
        /// Node UUID or name.
        node: String,
        /// The traits.
        #[arg(required = true)]
        traits: Vec<String>,
    },
    /// Remove traits, or every trait with --all.
    Remove {
        /// Node UUID or name.
        node: String,
        /// The traits.
        traits: Vec<String>,
        /// Remove every trait.
        #[arg(long, conflicts_with = "traits")]
        all: bool,
    },
    /// Replace every trait with these (none: remove them all).
    Set {
        /// Node UUID or name.
        node: String,
        /// The traits.
        traits: Vec<String>,
    },
}

/// `rivet node boot-device NODE show|set|supported`.
#[derive(Debug, Subcommand)]
pub enum BootDeviceAction {
    /// The boot device the BMC reports (the default).
    Show,
    /// Set the boot device for the next boot, or every boot with --persistent.
    Set {
        /// pxe, disk, cdrom, bios, safe or uefihttp, as the driver supports.
        device: String,
        /// For every boot from now on.
        #[arg(long)]
        persistent: bool,
    },
    /// The boot devices the node's driver can set.
    Supported,
}

/// `rivet node vmedia NODE attach URL | detach | show`.
#[derive(Debug, Subcommand)]
pub enum VmediaAction {
    /// Insert an ISO by its http(s) URL (the BMC downloads it).
    Attach {
        /// The image's URL.
        #[arg(value_name = "URL")]
        image_url: String,
        /// The virtual device.
        #[arg(long, default_value = "cdrom")]
        device_type: String,
    },
    /// Eject what is inserted.
    Detach,
    /// The BMC's virtual media devices and what they hold.
    Show,
}

/// `rivet node deploy` / `rebuild`.
#[derive(Debug, Args)]
pub struct DeployArgs {
    /// Node UUID or name.
    pub node: String,
    /// http(s) URL of the whole-disk image (instance_info.image_source); kept as set when
    /// not given.
    #[arg(long, value_name = "URL")]
    pub image: Option<String>,
    /// The image's digest as ALGO:HEX (sha256, sha512), or HEX (its length tells sha256 from
    /// sha512).
    #[arg(long, value_name = "ALGO:HEX")]
    pub checksum: Option<String>,
    /// The image's format, checked by the agent before writing.
    #[arg(long, value_name = "raw|qcow2|iso")]
    pub disk_format: Option<String>,
    /// Configdrive: a file (an ISO, sent gzip+base64; or a .json file), a JSON object
    /// `{"meta_data": …, "user_data": …}`, or an http(s) URL.
    #[arg(long, value_name = "FILE|JSON|URL")]
    pub configdrive: Option<String>,
    /// Wait for active, showing the image write's progress.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up after this many seconds.
    #[arg(long, default_value_t = 3600)]
    pub timeout: u64,
}

/// A node, and whether to wait for the operation to end.
#[derive(Debug, Args)]
pub struct WaitFlag {
    /// Node UUID or name.
    pub node: String,
    /// Wait until the node rests (available after undeploy's cleaning).
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up after this many seconds.
    #[arg(long, default_value_t = 3600)]
    pub timeout: u64,
}

/// Just a node.
#[derive(Debug, Args)]
pub struct NodeArg {
    /// Node UUID or name.
    pub node: String,
}

/// `rivet node create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Driver: fake-hardware, redfish, ipmi.
    #[arg(long)]
    driver: String,
    /// Unique name.
    #[arg(long)]
    name: Option<String>,
    /// BMC settings, e.g. redfish_address=https://10.0.0.5 (repeatable).
    #[arg(long = "driver-info", value_name = "KEY=VALUE")]
    driver_info: Vec<String>,
    /// Hardware property, e.g. cpus=8 (repeatable).
    #[arg(long = "property", value_name = "KEY=VALUE")]
    properties: Vec<String>,
    /// Free-form operator data (repeatable).
    #[arg(long = "extra", value_name = "KEY=VALUE")]
    extra: Vec<String>,
    /// Resource class.
    #[arg(long)]
    resource_class: Option<String>,
    /// Per-node automated cleaning switch.
    #[arg(long, value_name = "true|false")]
    automated_clean: Option<bool>,
    /// How the ramdisk boots: ipxe (default), pxe, redfish-virtual-media (redfish), fake.
    #[arg(long)]
    boot_interface: Option<String>,
    /// How the image reaches the disk: direct (the agent writes it) or fake.
    #[arg(long)]
    deploy_interface: Option<String>,
    /// Owning project (API 1.50).
    #[arg(long)]
    owner: Option<String>,
    /// Project the node is leased to (API 1.65).
    #[arg(long)]
    lessee: Option<String>,
    /// Free text (API 1.51).
    #[arg(long)]
    description: Option<String>,
    /// Conductor group (API 1.46).
    #[arg(long)]
    conductor_group: Option<String>,
    /// Shard (API 1.82).
    #[arg(long)]
    shard: Option<String>,
    /// Name of the instance (API 1.104).
    #[arg(long)]
    instance_name: Option<String>,
    /// The chassis the node is in.
    #[arg(long)]
    chassis_uuid: Option<String>,
    /// Parent node UUID or name (API 1.83).
    #[arg(long)]
    parent_node: Option<String>,
    /// Instance network configuration (JSON, or @FILE), used for a configdrive without
    /// one (API 1.66).
    #[arg(long, value_name = "JSON|@FILE")]
    network_data: Option<String>,
    /// Never power the node off (API 1.95): the conductor reboots it instead.
    #[arg(long)]
    disable_power_off: bool,
}

/// `rivet node list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only nodes in this provision state.
    #[arg(long)]
    provision_state: Option<String>,
    /// Only nodes in (true) or out of (false) maintenance.
    #[arg(long, value_name = "true|false")]
    maintenance: Option<bool>,
    /// Only nodes with this driver.
    #[arg(long)]
    driver: Option<String>,
    /// Only nodes of this resource class.
    #[arg(long)]
    resource_class: Option<String>,
    /// At most N nodes (one page; no following of `next` links).
    #[arg(long)]
    limit: Option<u64>,
    /// Sort key, e.g. name, created_at, provision_state.
    #[arg(long)]
    sort_key: Option<String>,
    /// Sort direction.
    #[arg(long)]
    sort_dir: Option<SortDir>,
    /// Also show Driver, Resource Class, Target State and Last Error.
    #[arg(long)]
    long: bool,
    /// Only nodes with this owner.
    #[arg(long)]
    owner: Option<String>,
    /// Only nodes with this lessee.
    #[arg(long)]
    lessee: Option<String>,
    /// Only nodes owned by or leased to this project.
    #[arg(long)]
    project: Option<String>,
    /// Only nodes in this conductor group.
    #[arg(long)]
    conductor_group: Option<String>,
    /// Only nodes this conductor manages now.
    #[arg(long)]
    conductor: Option<String>,
    /// Only nodes in these shards (repeatable).
    #[arg(long = "shard")]
    shards: Vec<String>,
    /// Only nodes with (true) or without (false) a shard.
    #[arg(long, value_name = "true|false")]
    sharded: Option<bool>,
    /// Only nodes with (true) or without (false) an instance.
    #[arg(long, value_name = "true|false")]
    associated: Option<bool>,
    /// Only retired (true) or not retired (false) nodes.
    #[arg(long, value_name = "true|false")]
    retired: Option<bool>,
    /// Only nodes with this instance name.
    #[arg(long)]
    instance_name: Option<String>,
    /// Only nodes with this fault (power failure, clean failure, ...).
    #[arg(long)]
    fault: Option<String>,
    /// Only nodes in this chassis.
    #[arg(long)]
    chassis_uuid: Option<String>,
    /// Only nodes whose description contains this text.
    #[arg(long)]
    description_contains: Option<String>,
}

/// Sort direction.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum SortDir {
    /// Ascending.
    Asc,
    /// Descending.
    Desc,
}

/// Power actions.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PowerAction {
    /// Power on.
    On,
    /// Power off (hard).
    Off,
    /// Reboot (hard).
    Reboot,
    /// ACPI soft power off.
    SoftOff,
    /// ACPI soft reboot.
    SoftReboot,
}

impl PowerAction {
    fn target(self) -> PowerState {
        match self {
            PowerAction::On => PowerState::On,
            PowerAction::Off => PowerState::Off,
            PowerAction::Reboot => PowerState::Rebooting,
            PowerAction::SoftOff => PowerState::SoftOff,
            PowerAction::SoftReboot => PowerState::SoftRebooting,
        }
    }
}

/// `rivet node maintenance NODE set|unset`.
#[derive(Debug, Subcommand)]
pub enum MaintenanceAction {
    /// Put the node in maintenance.
    Set {
        /// Why.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Take the node out of maintenance.
    Unset,
}

/// Parse a value: JSON when it parses (numbers, booleans, objects, quoted strings), else the
/// text as a string.
pub fn parse_value(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.to_string()))
}

/// Parse `KEY=VALUE` pairs into a map.
fn parse_pairs(flag: &str, pairs: &[String]) -> Result<Map<String, Value>> {
    let mut map = Map::new();
    for p in pairs {
        let (k, v) = p
            .split_once('=')
            .filter(|(k, _)| !k.trim().is_empty())
            .ok_or_else(|| anyhow!("--{flag} {p:?}: expected KEY=VALUE"))?;
        map.insert(k.trim().to_string(), parse_value(v));
    }
    Ok(map)
}

/// `a/b` or `/a/b` → `/a/b`.
fn pointer(path: &str) -> Result<String> {
    let p = path.trim().trim_start_matches('/');
    if p.is_empty() || p.split('/').any(str::is_empty) {
        bail!("{path:?} is not a field path; use e.g. extra/foo or driver_info/ipmi_address");
    }
    Ok(format!("/{p}"))
}

/// Build the RFC 6902 list for `--set` / `--unset`.
pub fn patch_ops(set: &[String], unset: &[String]) -> Result<Vec<PatchOp>> {
    let mut ops = Vec::new();
    for s in set {
        let (path, value) = s
            .split_once('=')
            .ok_or_else(|| anyhow!("--set {s:?}: expected PATH=VALUE"))?;
        ops.push(PatchOp {
            op: "add".into(),
            path: pointer(path)?,
            value: Some(parse_value(value)),
        });
    }
    for path in unset {
        ops.push(PatchOp {
            op: "remove".into(),
            path: pointer(path)?,
            value: None,
        });
    }
    if ops.is_empty() {
        bail!("nothing to change: give --set PATH=VALUE and/or --unset PATH");
    }
    Ok(ops)
}

/// `--clean-steps`: inline JSON, `@FILE` or `@-`.
fn clean_steps(arg: &str) -> Result<Vec<RequestedStep>> {
    let text = match arg.strip_prefix('@') {
        Some("-") => {
            std::io::read_to_string(std::io::stdin()).context("reading clean steps from stdin")?
        }
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read clean steps from {path}"))?,
        None => arg.to_string(),
    };
    serde_json::from_str(&text).map_err(|e| {
        anyhow!(
            "--clean-steps is not a valid step list ({e}); expected e.g. \
             [{{\"interface\": \"deploy\", \"step\": \"erase_devices_metadata\", \"args\": {{}}}}]"
        )
    })
}

fn node_path(node: &str) -> String {
    format!("/v1/nodes/{}", seg(node))
}

/// Run a `rivet node` subcommand.
pub async fn run(cmd: NodeCmd, client: &Client, out: Output) -> Result<()> {
    match cmd {
        NodeCmd::Create(a) => create(a, client, out).await,
        NodeCmd::Resources(c) => crate::node_resources::run(c, client, out).await,
        NodeCmd::Console(a) => crate::console::run(a, client).await,
        NodeCmd::ConsoleLog(a) => crate::console::run_log(a, client).await,
        NodeCmd::List(a) => list(a, client, out).await,
        NodeCmd::Show { node, fields } => {
            let mut query = Vec::new();
            if !fields.is_empty() {
                query.push(("fields", fields.join(",")));
            }
            let doc = client.get(&node_path(&node), &query).await?;
            out.document(&doc);
            Ok(())
        }
        NodeCmd::Update {
            node,
            set,
            unset,
            reset_interfaces,
        } => {
            let ops = patch_ops(&set, &unset)?;
            let mut path = node_path(&node);
            if reset_interfaces {
                path.push_str("?reset_interfaces=true");
            }
            let doc = client.patch(&path, &ops).await?;
            out.document(&doc);
            Ok(())
        }
        NodeCmd::Delete { node } => {
            client.delete(&node_path(&node)).await?;
            out.note(&format!("Deleted node {node}"));
            Ok(())
        }
        NodeCmd::Manage(n) => provision(client, out, &n.node, Verb::Manage, None).await,
        NodeCmd::Provide(n) => provision(client, out, &n.node, Verb::Provide, None).await,
        NodeCmd::Inspect(n) => provision(client, out, &n.node, Verb::Inspect, None).await,
        NodeCmd::Abort(n) => provision(client, out, &n.node, Verb::Abort, None).await,
        NodeCmd::Unhold(n) => provision(client, out, &n.node, Verb::Unhold, None).await,
        NodeCmd::Lifecycle(c) => crate::lifecycle::run(c, client, out).await,
        NodeCmd::Deploy(a) => deploy(client, out, a, Verb::Active).await,
        NodeCmd::Rebuild(a) => deploy(client, out, a, Verb::Rebuild).await,
        NodeCmd::Undeploy(w) => {
            provision(client, out, &w.node, Verb::Deleted, None).await?;
            if w.wait {
                let args = wait::WaitArgs {
                    node: w.node.clone(),
                    state: "available".into(),
                    timeout: w.timeout,
                };
                wait::run(args, client, out).await?;
            }
            Ok(())
        }
        NodeCmd::Clean {
            node,
            clean_steps: s,
        } => {
            let steps = clean_steps(&s)?;
            provision(client, out, &node, Verb::Clean, Some(steps)).await
        }
        NodeCmd::Power { node, action } => {
            let body = PowerRequest {
                target: action.target(),
                timeout: None,
            };
            client
                .put(&format!("{}/states/power", node_path(&node)), Some(&body))
                .await?;
            out.note(&format!(
                "Requested \"{}\" for node {node}",
                action.target()
            ));
            Ok(())
        }
        NodeCmd::Maintenance { node, action } => {
            let path = format!("{}/maintenance", node_path(&node));
            match action {
                MaintenanceAction::Set { reason } => {
                    client
                        .put(&path, Some(&MaintenanceRequest { reason }))
                        .await?;
                    out.note(&format!("Node {node} is in maintenance"));
                }
                MaintenanceAction::Unset => {
                    client.delete(&path).await?;
                    out.note(&format!("Node {node} is out of maintenance"));
                }
            }
            Ok(())
        }
        NodeCmd::CleanSteps(n) => sub_document(client, &n.node, "clean_steps", "clean steps").await,
        NodeCmd::Inventory(n) => sub_document(client, &n.node, "inventory", "inventory").await,
        NodeCmd::History(n) => history(client, out, &n.node).await,
        NodeCmd::Logs(a) => crate::node_logs::run(client, out, a).await,
        NodeCmd::Wait(a) => wait::run(a, client, out).await,
        NodeCmd::Trait { action } => traits(client, out, action).await,
        NodeCmd::Validate(n) => validate(client, out, &n.node).await,
        NodeCmd::BootDevice { node, action } => {
            boot_device(client, out, &node, action.unwrap_or(BootDeviceAction::Show)).await
        }
        NodeCmd::Vmedia { node, action } => vmedia(client, out, &node, action).await,
        NodeCmd::Vif(cmd) => crate::port::run_vif(cmd, client, out).await,
    }
}

/// `rivet node history NODE`: created_at, severity, event type, event and user per entry.
async fn history(client: &Client, out: Output, node: &str) -> Result<()> {
    let doc = client
        .get(
            &format!("/v1/nodes/{}/history", crate::client::seg(node)),
            &[("detail", "true".into())],
        )
        .await?;
    if out.json {
        crate::output::print_json(&doc);
        return Ok(());
    }
    let entries = doc
        .get("history")
        .and_then(serde_json::Value::as_array)
        .cloned()
        .unwrap_or_default();
    let keys = ["created_at", "severity", "event_type", "event", "user"];
    let headers = ["Created at", "Severity", "Event type", "Event", "User"];
    print!(
        "{}",
        crate::output::table(&headers, &crate::output::rows(&entries, &keys))
    );
    Ok(())
}

/// `--network-data`: a JSON object, inline or from @FILE.
fn network_data(v: &str) -> Result<Map<String, Value>> {
    let text = match v.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| anyhow!("--network-data: cannot read {path}: {e}"))?,
        None => v.to_string(),
    };
    match serde_json::from_str(&text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err(anyhow!("--network-data must be a JSON object, not {other}")),
        Err(e) => Err(anyhow!("--network-data is not JSON: {e}")),
    }
}

async fn create(a: CreateArgs, client: &Client, out: Output) -> Result<()> {
    let body = NodeCreate {
        name: a.name,
        driver: a.driver,
        driver_info: parse_pairs("driver-info", &a.driver_info)?,
        properties: parse_pairs("property", &a.properties)?,
        extra: parse_pairs("extra", &a.extra)?,
        resource_class: a.resource_class,
        automated_clean: a.automated_clean,
        boot_interface: a.boot_interface,
        deploy_interface: a.deploy_interface,
        owner: a.owner,
        lessee: a.lessee,
        description: a.description,
        conductor_group: a.conductor_group,
        shard: a.shard,
        instance_name: a.instance_name,
        chassis_uuid: a.chassis_uuid,
        parent_node: a.parent_node,
        network_data: match a.network_data {
            Some(v) => Some(network_data(&v)?),
            None => None,
        },
        disable_power_off: a.disable_power_off.then_some(true),
        ..Default::default()
    };
    let doc = client.post("/v1/nodes", &body).await?;
    out.document(&doc);
    Ok(())
}

const LIST_COLUMNS: &[(&str, &str)] = &[
    ("UUID", "uuid"),
    ("Name", "name"),
    ("Power State", "power_state"),
    ("Provisioning State", "provision_state"),
    ("Maintenance", "maintenance"),
];

const LONG_COLUMNS: &[(&str, &str)] = &[
    ("Driver", "driver"),
    ("Resource Class", "resource_class"),
    ("Target State", "target_provision_state"),
    ("Last Error", "last_error"),
];

/// Pages fetched at most when following `next` links (a guard against a looping server).
const MAX_PAGES: usize = 10_000;

async fn list(a: ListArgs, client: &Client, out: Output) -> Result<()> {
    let mut query: Vec<(&str, String)> = Vec::new();
    if let Some(s) = a.provision_state {
        query.push(("provision_state", s));
    }
    if let Some(m) = a.maintenance {
        query.push(("maintenance", m.to_string()));
    }
    if let Some(d) = a.driver {
        query.push(("driver", d));
    }
    if let Some(rc) = a.resource_class {
        query.push(("resource_class", rc));
    }
    if let Some(l) = a.limit {
        query.push(("limit", l.to_string()));
    }
    for (key, value) in [
        ("owner", a.owner),
        ("lessee", a.lessee),
        ("project", a.project),
        ("conductor_group", a.conductor_group),
        ("conductor", a.conductor),
        ("sharded", a.sharded.map(|b| b.to_string())),
        ("associated", a.associated.map(|b| b.to_string())),
        ("retired", a.retired.map(|b| b.to_string())),
        ("instance_name", a.instance_name),
        ("fault", a.fault),
        ("chassis_uuid", a.chassis_uuid),
        ("description_contains", a.description_contains),
    ] {
        if let Some(v) = value {
            query.push((key, v));
        }
    }
    if !a.shards.is_empty() {
        query.push(("shard", a.shards.join(",")));
    }
    if let Some(k) = a.sort_key {
        query.push(("sort_key", k));
    }
    if let Some(d) = a.sort_dir {
        let d = match d {
            SortDir::Asc => "asc",
            SortDir::Desc => "desc",
        };
        query.push(("sort_dir", d.to_string()));
    }
    let first = if a.long {
        "/v1/nodes/detail"
    } else {
        "/v1/nodes"
    };
    let mut nodes: Vec<Value> = Vec::new();
    let mut page = client.get(first, &query).await?;
    for _ in 0..MAX_PAGES {
        let items = page
            .get("nodes")
            .and_then(Value::as_array)
            .ok_or_else(|| anyhow!("rivetd answered {first} without a \"nodes\" list"))?;
        let got = items.len();
        nodes.extend(items.iter().cloned());
        if a.limit.is_some() || got == 0 {
            break;
        }
        let Some(next) = page
            .get("next")
            .and_then(Value::as_str)
            .and_then(Client::rebase)
        else {
            break;
        };
        page = client.get(&next, &[]).await?;
    }
    if out.json {
        output::print_json(&json!({ "nodes": nodes }));
        return Ok(());
    }
    let cols: Vec<(&str, &str)> = if a.long {
        LIST_COLUMNS.iter().chain(LONG_COLUMNS).copied().collect()
    } else {
        LIST_COLUMNS.to_vec()
    };
    let headers: Vec<&str> = cols.iter().map(|c| c.0).collect();
    let keys: Vec<&str> = cols.iter().map(|c| c.1).collect();
    let mut rows = output::rows(&nodes, &keys);
    if a.long {
        for row in &mut rows {
            if let Some(last) = row.last_mut() {
                *last = output::truncate(last, 60);
            }
        }
    }
    print!("{}", output::table(&headers, &rows));
    Ok(())
}

async fn provision(
    client: &Client,
    out: Output,
    node: &str,
    verb: Verb,
    clean_steps: Option<Vec<RequestedStep>>,
) -> Result<()> {
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
    client
        .put(
            &format!("{}/states/provision", node_path(node)),
            Some(&body),
        )
        .await?;
    out.note(&format!(
        "Accepted \"{verb}\" for node {node}; follow it with `rivet node wait {node} --state STATE`"
    ));
    Ok(())
}

/// `--checksum`: `ALGO:HEX` or bare `HEX` → (algo, hex).
fn parse_checksum(c: &str) -> Result<(String, String)> {
    let (algo, hex) = match c.split_once(':') {
        Some((a, h)) => (a.trim().to_ascii_lowercase(), h.trim().to_ascii_lowercase()),
        None => {
            let h = c.trim().to_ascii_lowercase();
            let a = match h.len() {
                64 => "sha256",
                128 => "sha512",
                n => bail!("--checksum {c:?}: a bare digest must be 64 (sha256) or 128 (sha512) hex digits, not {n}; or write ALGO:HEX"),
            };
            (a.to_string(), h)
        }
    };
    let want = match algo.as_str() {
        "sha256" => 64,
        "sha512" => 128,
        other => bail!("--checksum: {other} is not supported; use sha256 or sha512"),
    };
    if hex.len() != want || !hex.chars().all(|ch| ch.is_ascii_hexdigit()) {
        bail!("--checksum: a {algo} digest is {want} hex digits");
    }
    Ok((algo, hex))
}

/// `--configdrive`: a URL as is, a JSON object as the object form, a file: `.json` parsed,
/// anything else (an ISO) gzip+base64 encoded.
fn parse_configdrive(c: &str) -> Result<Value> {
    let t = c.trim();
    if t.starts_with("http://") || t.starts_with("https://") {
        return Ok(Value::from(t));
    }
    if t.starts_with('{') {
        let v: Value = serde_json::from_str(t).context("--configdrive: not valid JSON")?;
        return Ok(v);
    }
    let path = std::path::Path::new(t);
    let bytes = std::fs::read(path).with_context(|| format!("--configdrive: cannot read {t}"))?;
    if path.extension().is_some_and(|e| e == "json") {
        return serde_json::from_slice(&bytes)
            .with_context(|| format!("--configdrive: {t} is not valid JSON"));
    }
    Ok(Value::from(gzip_base64(&bytes)?))
}

fn gzip_base64(bytes: &[u8]) -> Result<String> {
    use base64::Engine;
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(bytes)?;
    Ok(base64::engine::general_purpose::STANDARD.encode(gz.finish()?))
}

/// `rivet node deploy|rebuild`: instance_info from the flags (one patch), then the verb.
async fn deploy(client: &Client, out: Output, a: DeployArgs, verb: Verb) -> Result<()> {
    let mut ops = Vec::new();
    let mut add = |key: &str, value: Value| {
        ops.push(serde_json::json!({"op": "add", "path": format!("/instance_info/{key}"), "value": value}));
    };
    if let Some(url) = &a.image {
        add("image_source", Value::from(url.clone()));
    }
    if let Some(c) = &a.checksum {
        let (algo, hex) = parse_checksum(c)?;
        add("image_os_hash_algo", Value::from(algo));
        add("image_os_hash_value", Value::from(hex));
    }
    if let Some(f) = &a.disk_format {
        add("image_disk_format", Value::from(f.clone()));
    }
    let configdrive = a
        .configdrive
        .as_deref()
        .map(parse_configdrive)
        .transpose()?;
    if !ops.is_empty() {
        client.patch(&node_path(&a.node), &ops).await?;
    }
    let body = ProvisionRequest {
        target: verb,
        clean_steps: None,
        configdrive,
        deploy_steps: None,
        rescue_password: None,
        disable_ramdisk: None,
        service_steps: None,
        runbook: None,
    };
    client
        .put(
            &format!("{}/states/provision", node_path(&a.node)),
            Some(&body),
        )
        .await?;
    out.note(&format!("Accepted \"{verb}\" for node {}", a.node));
    if a.wait {
        let args = wait::WaitArgs {
            node: a.node.clone(),
            state: "active".into(),
            timeout: a.timeout,
        };
        wait::run(args, client, out).await?;
    }
    Ok(())
}

/// Run `f` for each item, printing `done` for each success; every failure is reported at the
/// end (as the `baremetal` client does for traits).
async fn each<F, Fut>(items: &[String], out: Output, done: &str, f: F) -> Result<()>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<(), crate::client::ClientError>>,
{
    let mut failures = Vec::new();
    for item in items {
        match f(item.clone()).await {
            Ok(()) => out.note(&format!("{done} {item}")),
            Err(e) => failures.push(format!("{item}: {e}")),
        }
    }
    if !failures.is_empty() {
        bail!("{}", failures.join("\n"));
    }
    Ok(())
}

async fn traits(client: &Client, out: Output, action: TraitAction) -> Result<()> {
    let path = |node: &str| format!("{}/traits", node_path(node));
    match action {
        TraitAction::List(n) => {
            let doc = client.get(&path(&n.node), &[]).await?;
            if out.json {
                output::print_json(&doc);
                return Ok(());
            }
            let rows: Vec<Vec<String>> = doc
                .get("traits")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|t| vec![output::cell(t)])
                .collect();
            print!("{}", output::table(&["Trait"], &rows));
            Ok(())
        }
        TraitAction::Add { node, traits } => {
            each(&traits, out, "Added trait", |t| {
                let p = format!("{}/{}", path(&node), seg(&t));
                async move { client.put::<()>(&p, None).await.map(|_| ()) }
            })
            .await
        }
        TraitAction::Remove { node, traits, all } => {
            if all {
                client.delete(&path(&node)).await?;
                out.note(&format!("Removed every trait of node {node}"));
                return Ok(());
            }
            if traits.is_empty() {
                bail!("give the traits to remove, or --all");
            }
            each(&traits, out, "Removed trait", |t| {
                let p = format!("{}/{}", path(&node), seg(&t));
                async move { client.delete(&p).await }
            })
            .await
        }
        TraitAction::Set { node, traits } => {
            client
                .put(&path(&node), Some(&TraitsRequest { traits }))
                .await?;
            out.note(&format!("Set the traits of node {node}"));
            Ok(())
        }
    }
}

/// `rivet node validate`: one row per interface, sorted, as `baremetal node validate`.
async fn validate(client: &Client, out: Output, node: &str) -> Result<()> {
    let doc = client
        .get(&format!("{}/validate", node_path(node)), &[])
        .await?;
    if out.json {
        output::print_json(&doc);
        return Ok(());
    }
    let mut rows: Vec<Vec<String>> = doc
        .as_object()
        .into_iter()
        .flatten()
        .map(|(iface, v)| {
            vec![
                iface.clone(),
                output::cell(&v["result"]),
                output::cell(&v["reason"]),
            ]
        })
        .collect();
    rows.sort();
    print!(
        "{}",
        output::table(&["Interface", "Result", "Reason"], &rows)
    );
    Ok(())
}

async fn boot_device(
    client: &Client,
    out: Output,
    node: &str,
    action: BootDeviceAction,
) -> Result<()> {
    let path = format!("{}/management/boot_device", node_path(node));
    match action {
        BootDeviceAction::Show => out.document(&client.get(&path, &[]).await?),
        BootDeviceAction::Supported => {
            out.document(&client.get(&format!("{path}/supported"), &[]).await?)
        }
        BootDeviceAction::Set { device, persistent } => {
            let body = BootDeviceRequest {
                boot_device: device.clone(),
                persistent,
            };
            client.put(&path, Some(&body)).await?;
            out.note(&format!(
                "Boot device of node {node} set to {device}{}",
                if persistent {
                    " for every boot"
                } else {
                    " for the next boot"
                }
            ));
        }
    }
    Ok(())
}

async fn vmedia(client: &Client, out: Output, node: &str, action: VmediaAction) -> Result<()> {
    let path = format!("{}/vmedia", node_path(node));
    match action {
        VmediaAction::Attach {
            image_url,
            device_type,
        } => {
            let body = VmediaAttachRequest {
                device_type,
                image_url: image_url.clone(),
                image_download_source: Some("http".into()),
            };
            client.post(&path, &body).await?;
            out.note(&format!("Attached {image_url} to node {node}"));
        }
        VmediaAction::Detach => {
            client.delete(&path).await?;
            out.note(&format!("Detached the virtual media of node {node}"));
        }
        VmediaAction::Show => {
            let doc = client.get(&path, &[]).await?;
            if out.json {
                output::print_json(&doc);
                return Ok(());
            }
            let items = doc.as_array().cloned().unwrap_or_default();
            let rows = output::rows(&items, &["media_types", "inserted", "image"]);
            print!(
                "{}",
                output::table(&["Media Types", "Inserted", "Image"], &rows)
            );
        }
    }
    Ok(())
}

/// `GET /v1/nodes/{id}/<what>`, printed as JSON. A 404 from a server that does not serve the
/// endpoint yet is told apart from a missing node.
async fn sub_document(client: &Client, node: &str, what: &str, label: &str) -> Result<()> {
    let path = format!("{}/{what}", node_path(node));
    match client.get(&path, &[]).await {
        Ok(doc) => {
            output::print_json(&doc);
            Ok(())
        }
        Err(e) if e.status() == Some(StatusCode::NOT_FOUND) => {
            // Is it the node that is missing, or the endpoint?
            client
                .get(&node_path(node), &[("fields", "uuid".into())])
                .await?;
            bail!(
                "node {node} has no {label} to show: {e}. This rivetd may not serve \
                 GET {path} yet, or the node has not been inspected/cleaned"
            )
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_json_when_they_parse() {
        assert_eq!(parse_value("8"), json!(8));
        assert_eq!(parse_value("true"), json!(true));
        assert_eq!(parse_value("1.2.3.4"), json!("1.2.3.4"));
        assert_eq!(parse_value("bar"), json!("bar"));
        assert_eq!(parse_value(r#"{"a":1}"#), json!({"a": 1}));
        assert_eq!(parse_value(r#""8""#), json!("8"));
    }

    #[test]
    fn pairs() {
        let m = parse_pairs("extra", &["a=1".into(), "b=x=y".into()]).unwrap_or_default();
        assert_eq!(Value::Object(m), json!({"a": 1, "b": "x=y"}));
        assert!(parse_pairs("extra", &["novalue".into()]).is_err());
        assert!(parse_pairs("extra", &["=v".into()]).is_err());
    }

    #[test]
    fn patch() {
        let ops = patch_ops(
            &["driver_info/ipmi_address=1.2.3.4".into()],
            &["/extra/foo".into()],
        )
        .unwrap_or_default();
        let v = serde_json::to_value(&ops).unwrap_or_default();
        assert_eq!(
            v,
            json!([
                {"op": "add", "path": "/driver_info/ipmi_address", "value": "1.2.3.4"},
                {"op": "remove", "path": "/extra/foo"},
            ])
        );
        assert!(patch_ops(&[], &[]).is_err());
        assert!(patch_ops(&["extra//x=1".into()], &[]).is_err());
        assert!(patch_ops(&["noequals".into()], &[]).is_err());
    }

    #[test]
    fn steps_parse() {
        let s = clean_steps(r#"[{"interface":"deploy","step":"erase_devices_metadata"}]"#)
            .unwrap_or_default();
        assert_eq!(s.len(), 1);
        assert!(clean_steps(r#"[{"interface":"deploy"}]"#).is_err());
        assert!(clean_steps("@/nonexistent/steps.json").is_err());
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn deploy_flags() {
        let h = "ab".repeat(32);
        assert_eq!(
            parse_checksum(&h).unwrap(),
            ("sha256".to_string(), h.clone())
        );
        assert_eq!(parse_checksum(&format!("SHA256:{h}")).unwrap().0, "sha256");
        assert!(parse_checksum("md5:d41d8cd98f00b204e9800998ecf8427e").is_err());
        assert!(parse_checksum("sha512:abcd").is_err());
        assert_eq!(
            parse_configdrive("https://h/cd").unwrap(),
            json!("https://h/cd")
        );
        assert_eq!(
            parse_configdrive(r#"{"meta_data": {}}"#).unwrap(),
            json!({"meta_data": {}})
        );
        let dir = tempfile::tempdir().unwrap();
        let iso = dir.path().join("cd.iso");
        std::fs::write(&iso, b"not really an iso").unwrap();
        let v = parse_configdrive(iso.to_str().unwrap()).unwrap();
        assert!(
            v.as_str().is_some_and(|s| s.starts_with("H4sI")),
            "gzip+base64: {v}"
        );
        assert!(parse_configdrive("/nonexistent/cd.iso").is_err());
    }
}
