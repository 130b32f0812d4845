//! Step merging: plain functions over plain data, no I/O.
//!
//! Automated cleaning takes the agent's in-band steps and the driver's out-of-band steps,
//! applies operator priority overrides, drops priority 0, and sorts by priority (highest
//! first) with Ironic's interface order breaking ties. Manual cleaning keeps the operator's
//! order and checks every requested step exists and has its required arguments.

use rivet_protocol::steps::{RequestedStep, StepDescriptor};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// Where a step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// In-band, on the agent.
    Agent,
    /// Out-of-band, through the node's driver.
    Driver,
    /// Inside the conductor (`hold`, `wait`, `power_on`, `power_off`, `reboot`).
    Conductor,
}

/// A step in a node's cleaning plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedStep {
    /// The descriptor (priority after overrides).
    #[serde(flatten)]
    pub step: StepDescriptor,
    /// Arguments to run it with.
    #[serde(default)]
    pub args: Map<String, Value>,
    /// Where it runs.
    pub source: Source,
}

/// Tie-break rank of an interface (Ironic's order: higher runs first).
pub fn interface_rank(interface: &str) -> u8 {
    match interface {
        "vendor" => 7,
        "power" => 6,
        "management" => 5,
        "firmware" => 4,
        "deploy" => 3,
        "bios" => 2,
        "raid" => 1,
        _ => 0,
    }
}

/// Steps the conductor runs itself (Ironic's reserved names), usable in manual cleaning.
pub fn conductor_steps() -> Vec<StepDescriptor> {
    let mk = |step: &str, arg: Option<(&str, &str)>| StepDescriptor {
        interface: "power".into(),
        step: step.into(),
        priority: 0,
        abortable: true,
        argsinfo: arg
            .map(|(n, d)| {
                BTreeMap::from([(
                    n.to_string(),
                    rivet_protocol::steps::ArgInfo {
                        description: d.into(),
                        required: false,
                    },
                )])
            })
            .unwrap_or_default(),
        reboot_requested: false,
        requires_ramdisk: false,
    };
    let mut hold = mk("hold", None);
    hold.interface = "deploy".into();
    let mut wait = mk("wait", Some(("seconds", "how long to wait")));
    wait.interface = "deploy".into();
    vec![
        hold,
        wait,
        mk("power_on", None),
        mk("power_off", None),
        mk("reboot", None),
    ]
}

/// Every step available to a node: the agent's (deploy interface unless they say otherwise),
/// the driver's, and the conductor's reserved ones. One per (interface, step): for the
/// deploy interface the agent's wins, elsewhere the driver's.
pub fn available(agent: &[StepDescriptor], driver: &[StepDescriptor]) -> Vec<PlannedStep> {
    let mut out: Vec<PlannedStep> = Vec::new();
    let mut push = |s: &StepDescriptor, source: Source| {
        let dup = out
            .iter()
            .any(|p| p.step.interface == s.interface && p.step.step == s.step);
        if !dup {
            out.push(PlannedStep {
                step: s.clone(),
                args: Map::new(),
                source,
            });
        }
    };
    for s in agent.iter().filter(|s| s.interface == "deploy") {
        push(s, Source::Agent);
    }
    for s in driver {
        push(s, Source::Driver);
    }
    for s in agent.iter().filter(|s| s.interface != "deploy") {
        push(s, Source::Agent);
    }
    for s in conductor_steps() {
        push(&s, Source::Conductor);
    }
    out
}

/// The automated cleaning plan.
pub fn automated_plan(
    agent: &[StepDescriptor],
    driver: &[StepDescriptor],
    overrides: &BTreeMap<String, i64>,
) -> Vec<PlannedStep> {
    let mut plan: Vec<PlannedStep> = available(agent, driver)
        .into_iter()
        .filter(|p| p.source != Source::Conductor)
        .map(|mut p| {
            let key = format!("{}.{}", p.step.interface, p.step.step);
            if let Some(prio) = overrides.get(&key) {
                p.step.priority = *prio;
            }
            p
        })
        .filter(|p| p.step.priority > 0)
        .collect();
    plan.sort_by(|a, b| {
        b.step
            .priority
            .cmp(&a.step.priority)
            .then(interface_rank(&b.step.interface).cmp(&interface_rank(&a.step.interface)))
            .then(a.step.step.cmp(&b.step.step))
    });
    plan
}

/// Why a `raid` step is missing, when nothing more precise can be said (see
/// [`NoRaidSteps::reason`]). The agent RAID interface's steps (`raid.create_configuration`,
/// `raid.delete_configuration`, `raid.apply_configuration`) run in the ramdisk, which
/// advertises them only when it can build software RAID (mdadm and the kernel's md support),
/// and Rivet takes them only through the `agent` RAID interface, as Ironic takes them only
/// through `AgentRAID`.
pub const NO_RAID_STEPS: &str = ": this node's agent offered no RAID steps: its ramdisk has no \
mdadm / md support, or raid_interface is not agent";

/// Why a node has no `raid` step of the agent's, as far as the caller can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoRaidSteps<'a> {
    /// Unknown (the general [`NO_RAID_STEPS`]).
    Unknown,
    /// The node's `raid_interface` is not `agent`: the agent's RAID steps are dropped.
    Interface(&'a str),
    /// The node's deploy interface boots no agent at all.
    NoAgent(&'a str),
    /// `raid_interface` is `agent` and the agent's list of steps has no RAID step.
    AgentOffersNone,
    /// As [`NoRaidSteps::AgentOffersNone`], as the node's last cleaning recorded it.
    AgentOfferedNone,
}

impl NoRaidSteps<'_> {
    /// The reason for `raid_interface` and whether an agent's steps are known: `None` when
    /// no agent runs on the node, else whether the agent's list was just gathered.
    pub fn of<'a>(
        raid_interface: &'a str,
        deploy_interface: &'a str,
        gathered: Option<bool>,
    ) -> NoRaidSteps<'a> {
        if raid_interface != "agent" {
            return NoRaidSteps::Interface(raid_interface);
        }
        match gathered {
            None => NoRaidSteps::NoAgent(deploy_interface),
            Some(true) => NoRaidSteps::AgentOffersNone,
            Some(false) => NoRaidSteps::AgentOfferedNone,
        }
    }

    /// The text appended to a refusal of a `raid` step (starts with ": ").
    pub fn reason(&self) -> String {
        match self {
            NoRaidSteps::Unknown => NO_RAID_STEPS.to_string(),
            NoRaidSteps::Interface(i) => format!(
                ": this node's agent offered no RAID steps: raid_interface is {i}, not agent, \
                 and only the agent RAID interface takes the agent's RAID steps (set \
                 raid_interface to agent)"
            ),
            NoRaidSteps::NoAgent(d) => format!(
                ": this node's agent offered no RAID steps: no agent runs on it (deploy_interface \
                 is {d}; the agent RAID steps need deploy_interface direct)"
            ),
            NoRaidSteps::AgentOffersNone => ": this node's agent offered no RAID steps: its \
                ramdisk has no mdadm / md support (raid_interface is agent)"
                .to_string(),
            NoRaidSteps::AgentOfferedNone => ": this node's agent offered no RAID steps at its \
                last cleaning: its ramdisk has no mdadm / md support (raid_interface is agent; \
                after booting a ramdisk that has, a manual clean with no steps gathers them \
                again)"
                .to_string(),
        }
    }
}

/// Whether a node takes an agent step of `interface`: the agent's `raid` steps only through
/// the `agent` RAID interface (Ironic's `AgentRAID.get_clean_steps`/`get_deploy_steps` are
/// the only way in for them); every other agent step as always.
pub fn takes_agent_step(interface: &str, raid_interface: &str) -> bool {
    interface != "raid" || raid_interface == "agent"
}

/// The agent's steps a node with `raid_interface` takes (see [`takes_agent_step`]).
pub fn agent_steps_for(agent: &[StepDescriptor], raid_interface: &str) -> Vec<StepDescriptor> {
    agent
        .iter()
        .filter(|s| takes_agent_step(&s.interface, raid_interface))
        .cloned()
        .collect()
}

/// Of `planned` (a clean-step cache, say), the steps a node with `raid_interface` takes:
/// the agent's `raid` steps go unless it is `agent`.
pub fn planned_for(planned: Vec<PlannedStep>, raid_interface: &str) -> Vec<PlannedStep> {
    planned
        .into_iter()
        .filter(|p| {
            p.source != Source::Agent || takes_agent_step(&p.step.interface, raid_interface)
        })
        .collect()
}

/// The manual cleaning plan: the operator's order, each step checked.
/// `no_raid` says why a requested `raid` step is not among `available`.
pub fn manual_plan(
    requested: &[RequestedStep],
    available: &[PlannedStep],
    no_raid: NoRaidSteps,
) -> Result<Vec<PlannedStep>, String> {
    requested
        .iter()
        .map(|r| {
            let found = available
                .iter()
                .find(|p| p.step.interface == r.interface && p.step.step == r.step)
                .ok_or_else(|| {
                    let offered: Vec<String> = available
                        .iter()
                        .map(|p| format!("{}.{}", p.step.interface, p.step.step))
                        .collect();
                    format!(
                        "node does not support this clean step: clean step {}.{} is not offered for this node{} (offered: {})",
                        r.interface,
                        r.step,
                        if r.interface == "raid" { no_raid.reason() } else { String::new() },
                        offered.join(", ")
                    )
                })?;
            for (name, info) in &found.step.argsinfo {
                if info.required && !r.args.contains_key(name) {
                    return Err(format!(
                        "clean step {}.{} needs argument {name:?} ({})",
                        r.interface, r.step, info.description
                    ));
                }
            }
            Ok(PlannedStep {
                step: found.step.clone(),
                args: r.args.clone(),
                source: found.source,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rivet_protocol::steps::ArgInfo;

    fn step(interface: &str, name: &str, priority: i64) -> StepDescriptor {
        StepDescriptor {
            interface: interface.into(),
            ..StepDescriptor::in_band(name, priority)
        }
    }

    fn names(plan: &[PlannedStep]) -> Vec<String> {
        plan.iter()
            .map(|p| format!("{}.{}", p.step.interface, p.step.step))
            .collect()
    }

    #[test]
    fn merge_orders_by_priority_then_interface() {
        let agent = vec![
            step("deploy", "erase_devices_metadata", 99),
            step("deploy", "erase_devices", 10),
            step("deploy", "erase_devices_express", 0),
            step("raid", "delete_configuration", 10),
        ];
        let driver = vec![
            step("bios", "apply_configuration", 10),
            step("management", "reset_bmc", 10),
            step("firmware", "update", 99),
            step("vendor", "vendor_thing", 10),
        ];
        let plan = automated_plan(&agent, &driver, &BTreeMap::new());
        assert_eq!(
            names(&plan),
            [
                "firmware.update",
                "deploy.erase_devices_metadata",
                "vendor.vendor_thing",
                "management.reset_bmc",
                "deploy.erase_devices",
                "bios.apply_configuration",
                "raid.delete_configuration",
            ]
        );
        assert_eq!(plan[0].source, Source::Driver);
        assert_eq!(plan[1].source, Source::Agent);
    }

    #[test]
    fn overrides_disable_and_reorder() {
        let agent = vec![
            step("deploy", "erase_devices_metadata", 99),
            step("deploy", "erase_devices", 10),
            step("deploy", "erase_devices_express", 0),
        ];
        let driver = vec![step("bios", "factory_reset", 0)];
        let overrides = BTreeMap::from([
            ("deploy.erase_devices".to_string(), 0),
            ("deploy.erase_devices_express".to_string(), 50),
            ("bios.factory_reset".to_string(), 100),
        ]);
        let plan = automated_plan(&agent, &driver, &overrides);
        assert_eq!(
            names(&plan),
            [
                "bios.factory_reset",
                "deploy.erase_devices_metadata",
                "deploy.erase_devices_express"
            ]
        );
        assert_eq!(plan[0].step.priority, 100);
    }

    #[test]
    fn equal_priority_same_interface_is_alphabetical_and_stable() {
        let agent = vec![step("deploy", "zeta", 5), step("deploy", "alpha", 5)];
        let plan = automated_plan(&agent, &[], &BTreeMap::new());
        assert_eq!(names(&plan), ["deploy.alpha", "deploy.zeta"]);
    }

    #[test]
    fn agent_wins_deploy_driver_wins_elsewhere() {
        let agent = vec![
            step("deploy", "erase_devices", 10),
            step("bios", "apply_configuration", 1),
        ];
        let driver = vec![
            step("deploy", "erase_devices", 20),
            step("bios", "apply_configuration", 2),
        ];
        let all = available(&agent, &driver);
        let erase = all
            .iter()
            .find(|p| p.step.step == "erase_devices")
            .expect("erase");
        assert_eq!((erase.source, erase.step.priority), (Source::Agent, 10));
        let bios = all
            .iter()
            .find(|p| p.step.step == "apply_configuration")
            .expect("bios");
        assert_eq!((bios.source, bios.step.priority), (Source::Driver, 2));
    }

    #[test]
    fn manual_keeps_order_checks_existence_and_args() {
        let mut fw = step("deploy", "update_firmware", 0);
        fw.argsinfo.insert(
            "version".into(),
            ArgInfo {
                description: "target version".into(),
                required: true,
            },
        );
        let avail = available(&[step("deploy", "erase_devices", 10), fw], &[]);
        let req = |s: &str, args: Value| RequestedStep {
            interface: "deploy".into(),
            step: s.into(),
            args: args.as_object().cloned().unwrap_or_default(),
            order: None,
        };
        let plan = manual_plan(
            &[
                req("update_firmware", serde_json::json!({"version": "2"})),
                req("erase_devices", serde_json::json!({})),
            ],
            &avail,
            NoRaidSteps::Unknown,
        )
        .expect("valid");
        assert_eq!(
            names(&plan),
            ["deploy.update_firmware", "deploy.erase_devices"]
        );
        assert_eq!(plan[0].args["version"], "2");
        let e = manual_plan(
            &[req("update_firmware", serde_json::json!({}))],
            &avail,
            NoRaidSteps::Unknown,
        )
        .expect_err("arg");
        assert!(e.contains("version"), "{e}");
        let e = manual_plan(
            &[req("paint_it_blue", serde_json::json!({}))],
            &avail,
            NoRaidSteps::Unknown,
        )
        .expect_err("unknown");
        assert!(
            e.contains("paint_it_blue") && e.contains("deploy.erase_devices"),
            "{e}"
        );
        assert!(
            e.starts_with("node does not support this clean step"),
            "{e}"
        );
        assert!(!e.contains("RAID"), "{e}");
        let raid = RequestedStep {
            interface: "raid".into(),
            step: "create_configuration".into(),
            args: Map::new(),
            order: None,
        };
        let e = manual_plan(
            std::slice::from_ref(&raid),
            &avail,
            NoRaidSteps::of("agent", "direct", Some(true)),
        )
        .expect_err("no RAID step");
        assert!(
            e.contains("raid.create_configuration")
                && e.contains("this node's agent offered no RAID steps: its ramdisk has no mdadm"),
            "{e}"
        );
        let e = manual_plan(
            std::slice::from_ref(&raid),
            &avail,
            NoRaidSteps::of("no-raid", "direct", Some(true)),
        )
        .expect_err("no RAID step");
        assert!(e.contains("raid_interface is no-raid, not agent"), "{e}");
        let e = manual_plan(&[raid], &avail, NoRaidSteps::of("agent", "fake", None))
            .expect_err("no agent");
        assert!(e.contains("deploy_interface is fake"), "{e}");
        let hold = manual_plan(
            &[req("hold", serde_json::json!({}))],
            &avail,
            NoRaidSteps::Unknown,
        )
        .expect("reserved");
        assert_eq!(hold[0].source, Source::Conductor);
    }

    /// The agent's RAID steps reach a plan only through the agent RAID interface, as in
    /// Ironic (AgentRAID.get_clean_steps): with any other raid_interface they are dropped
    /// from automated plans (even with an override) and manual ones.
    #[test]
    fn agent_raid_steps_only_through_the_agent_raid_interface() {
        let agent = vec![
            step("deploy", "erase_devices_metadata", 99),
            step("raid", "delete_configuration", 0),
            step("raid", "create_configuration", 0),
        ];
        let overrides = BTreeMap::from([
            ("raid.delete_configuration".to_string(), 20),
            ("raid.create_configuration".to_string(), 10),
        ]);
        let with = agent_steps_for(&agent, "agent");
        assert_eq!(
            names(&automated_plan(&with, &[], &overrides)),
            [
                "deploy.erase_devices_metadata",
                "raid.delete_configuration",
                "raid.create_configuration"
            ]
        );
        for iface in ["no-raid", "fake"] {
            let without = agent_steps_for(&agent, iface);
            assert_eq!(
                names(&automated_plan(&without, &[], &overrides)),
                ["deploy.erase_devices_metadata"],
                "{iface}"
            );
            let req = RequestedStep {
                interface: "raid".into(),
                step: "create_configuration".into(),
                args: Map::new(),
                order: None,
            };
            let e = manual_plan(
                &[req],
                &available(&without, &[]),
                NoRaidSteps::of(iface, "direct", Some(true)),
            )
            .expect_err("dropped");
            assert!(e.contains(&format!("raid_interface is {iface}")), "{e}");
        }
        // A cache of everything offered, read for a node's raid_interface.
        let cached = available(&agent, &[step("raid", "oob_raid", 0)]);
        assert_eq!(planned_for(cached.clone(), "agent").len(), cached.len());
        let kept = names(&planned_for(cached, "no-raid"));
        assert!(
            kept.contains(&"raid.oob_raid".to_string()),
            "driver steps stay: {kept:?}"
        );
        assert!(
            !kept.iter().any(|n| n.ends_with("_configuration")),
            "{kept:?}"
        );
    }
}
