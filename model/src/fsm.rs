//! The provision state machine: one table of (state, event) → state, no I/O.
//!
//! Events are Ironic's: the admin verbs (`manage`, `provide`, …) and the conductor's internal
//! `done`, `fail`, `wait`, `resume`, `hold`. Each row also says who may fire it, because a few
//! verbs appear in the table as conductor-only moves (deleting → cleaning on `clean`, the end
//! of a manual clean on `manage`) that an admin must not trigger by hand.

use rivet_protocol::states::{ProvisionState, Verb};
use std::fmt::Write as _;

use ProvisionState as S;

/// An event that moves a node between provision states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Event {
    /// Validate the BMC / leave a failure state.
    Manage,
    /// Automated cleaning then available.
    Provide,
    /// Inspect the hardware.
    Inspect,
    /// Manual cleaning (or cleaning after tear-down).
    Clean,
    /// Abort a wait or hold.
    Abort,
    /// Deploy (`active`/`deploy`).
    Deploy,
    /// Tear down (`deleted`/`undeploy`).
    Delete,
    /// Redeploy.
    Rebuild,
    /// Adopt a deployed node.
    Adopt,
    /// Boot the rescue ramdisk.
    Rescue,
    /// Leave rescue.
    Unrescue,
    /// Leave a hold.
    Unhold,
    /// Run service steps on an active node.
    Service,
    /// Conductor: the work of this state finished.
    Done,
    /// Conductor: the work of this state failed.
    Fail,
    /// Conductor: now waiting for the ramdisk.
    Wait,
    /// Conductor: the ramdisk called back; continue.
    Resume,
    /// Conductor: a `hold` step paused the work.
    Hold,
}

impl Event {
    /// Every event, in declaration order.
    pub const ALL: &'static [Event] = &[
        Event::Manage,
        Event::Provide,
        Event::Inspect,
        Event::Clean,
        Event::Abort,
        Event::Deploy,
        Event::Delete,
        Event::Rebuild,
        Event::Adopt,
        Event::Rescue,
        Event::Unrescue,
        Event::Unhold,
        Event::Service,
        Event::Done,
        Event::Fail,
        Event::Wait,
        Event::Resume,
        Event::Hold,
    ];

    /// The event an admin verb fires.
    pub fn from_verb(verb: Verb) -> Event {
        match verb {
            Verb::Manage => Event::Manage,
            Verb::Provide => Event::Provide,
            Verb::Inspect => Event::Inspect,
            Verb::Clean => Event::Clean,
            Verb::Abort => Event::Abort,
            Verb::Active | Verb::Deploy => Event::Deploy,
            Verb::Deleted | Verb::Undeploy => Event::Delete,
            Verb::Rebuild => Event::Rebuild,
            Verb::Adopt => Event::Adopt,
            Verb::Rescue => Event::Rescue,
            Verb::Unrescue => Event::Unrescue,
            Verb::Unhold => Event::Unhold,
            Verb::Service => Event::Service,
        }
    }

    /// Name used in the diagram and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Event::Manage => "manage",
            Event::Provide => "provide",
            Event::Inspect => "inspect",
            Event::Clean => "clean",
            Event::Abort => "abort",
            Event::Deploy => "deploy",
            Event::Delete => "delete",
            Event::Rebuild => "rebuild",
            Event::Adopt => "adopt",
            Event::Rescue => "rescue",
            Event::Unrescue => "unrescue",
            Event::Unhold => "unhold",
            Event::Service => "service",
            Event::Done => "done",
            Event::Fail => "fail",
            Event::Wait => "wait",
            Event::Resume => "resume",
            Event::Hold => "hold",
        }
    }
}

/// Who may fire a row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    /// An admin, through `PUT /v1/nodes/{id}/states/provision`.
    Admin,
    /// Only the conductor.
    Conductor,
}

/// One row: `from --event--> to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// Source state.
    pub from: ProvisionState,
    /// Event.
    pub event: Event,
    /// Destination state.
    pub to: ProvisionState,
    /// Who may fire it.
    pub by: By,
}

const fn t(from: ProvisionState, event: Event, to: ProvisionState, by: By) -> Transition {
    Transition {
        from,
        event,
        to,
        by,
    }
}

use By::{Admin as A, Conductor as C};
use Event as E;

/// The whole table (Ironic's, rescue, adopt and servicing included).
pub const TABLE: &[Transition] = &[
    t(S::Enroll, E::Manage, S::Verifying, A),
    t(S::Verifying, E::Done, S::Manageable, C),
    t(S::Verifying, E::Fail, S::Enroll, C),
    t(S::Manageable, E::Provide, S::Cleaning, A),
    t(S::Manageable, E::Clean, S::Cleaning, A),
    t(S::Manageable, E::Inspect, S::Inspecting, A),
    t(S::Manageable, E::Adopt, S::Adopting, A),
    t(S::Inspecting, E::Done, S::Manageable, C),
    t(S::Inspecting, E::Wait, S::InspectWait, C),
    t(S::Inspecting, E::Fail, S::InspectFailed, C),
    t(S::InspectWait, E::Done, S::Manageable, C),
    t(S::InspectWait, E::Resume, S::Inspecting, C),
    t(S::InspectWait, E::Fail, S::InspectFailed, C),
    t(S::InspectWait, E::Abort, S::InspectFailed, A),
    t(S::InspectFailed, E::Manage, S::Manageable, A),
    t(S::InspectFailed, E::Inspect, S::Inspecting, A),
    t(S::Cleaning, E::Done, S::Available, C),
    t(S::Cleaning, E::Manage, S::Manageable, C),
    t(S::Cleaning, E::Wait, S::CleanWait, C),
    t(S::Cleaning, E::Hold, S::CleanHold, C),
    t(S::Cleaning, E::Fail, S::CleanFailed, C),
    t(S::CleanWait, E::Resume, S::Cleaning, C),
    t(S::CleanWait, E::Hold, S::CleanHold, C),
    t(S::CleanWait, E::Fail, S::CleanFailed, C),
    t(S::CleanWait, E::Abort, S::CleanFailed, A),
    t(S::CleanHold, E::Unhold, S::CleanWait, A),
    t(S::CleanHold, E::Abort, S::CleanFailed, A),
    t(S::CleanFailed, E::Manage, S::Manageable, A),
    t(S::Available, E::Deploy, S::Deploying, A),
    t(S::Available, E::Manage, S::Manageable, A),
    t(S::Deploying, E::Wait, S::WaitCallBack, C),
    t(S::Deploying, E::Hold, S::DeployHold, C),
    t(S::Deploying, E::Done, S::Active, C),
    t(S::Deploying, E::Fail, S::DeployFailed, C),
    t(S::WaitCallBack, E::Resume, S::Deploying, C),
    t(S::WaitCallBack, E::Hold, S::DeployHold, C),
    t(S::WaitCallBack, E::Fail, S::DeployFailed, C),
    t(S::WaitCallBack, E::Abort, S::DeployFailed, A),
    t(S::WaitCallBack, E::Delete, S::Deleting, A),
    t(S::DeployHold, E::Unhold, S::WaitCallBack, A),
    t(S::DeployHold, E::Abort, S::DeployFailed, A),
    t(S::DeployFailed, E::Deploy, S::Deploying, A),
    t(S::DeployFailed, E::Rebuild, S::Deploying, A),
    t(S::DeployFailed, E::Delete, S::Deleting, A),
    t(S::Active, E::Rebuild, S::Deploying, A),
    t(S::Active, E::Delete, S::Deleting, A),
    t(S::Active, E::Rescue, S::Rescuing, A),
    t(S::Deleting, E::Clean, S::Cleaning, C),
    t(S::Deleting, E::Fail, S::Error, C),
    t(S::Error, E::Rebuild, S::Deploying, A),
    t(S::Error, E::Delete, S::Deleting, A),
    t(S::Adopting, E::Done, S::Active, C),
    t(S::Adopting, E::Fail, S::AdoptFailed, C),
    t(S::AdoptFailed, E::Adopt, S::Adopting, A),
    t(S::AdoptFailed, E::Manage, S::Manageable, A),
    t(S::Rescuing, E::Done, S::Rescue, C),
    t(S::Rescuing, E::Wait, S::RescueWait, C),
    t(S::Rescuing, E::Fail, S::RescueFailed, C),
    t(S::RescueWait, E::Resume, S::Rescuing, C),
    t(S::RescueWait, E::Fail, S::RescueFailed, C),
    t(S::RescueWait, E::Abort, S::RescueFailed, A),
    t(S::RescueWait, E::Delete, S::Deleting, A),
    t(S::Rescue, E::Rescue, S::Rescuing, A),
    t(S::Rescue, E::Unrescue, S::Unrescuing, A),
    t(S::Rescue, E::Delete, S::Deleting, A),
    t(S::RescueFailed, E::Rescue, S::Rescuing, A),
    t(S::RescueFailed, E::Unrescue, S::Unrescuing, A),
    t(S::RescueFailed, E::Delete, S::Deleting, A),
    t(S::Unrescuing, E::Done, S::Active, C),
    t(S::Unrescuing, E::Fail, S::UnrescueFailed, C),
    t(S::UnrescueFailed, E::Rescue, S::Rescuing, A),
    t(S::UnrescueFailed, E::Unrescue, S::Unrescuing, A),
    t(S::UnrescueFailed, E::Delete, S::Deleting, A),
    t(S::Active, E::Service, S::Servicing, A),
    t(S::Servicing, E::Done, S::Active, C),
    t(S::Servicing, E::Fail, S::ServiceFailed, C),
    t(S::Servicing, E::Wait, S::ServiceWait, C),
    t(S::Servicing, E::Hold, S::ServiceHold, C),
    t(S::ServiceWait, E::Hold, S::ServiceHold, C),
    t(S::ServiceWait, E::Resume, S::Servicing, C),
    t(S::ServiceWait, E::Fail, S::ServiceFailed, C),
    t(S::ServiceWait, E::Abort, S::ServiceFailed, A),
    t(S::ServiceWait, E::Delete, S::Deleting, A),
    t(S::ServiceHold, E::Unhold, S::ServiceWait, A),
    t(S::ServiceHold, E::Fail, S::ServiceFailed, C),
    t(S::ServiceHold, E::Abort, S::ServiceFailed, A),
    t(S::ServiceFailed, E::Service, S::Servicing, A),
    t(S::ServiceFailed, E::Rescue, S::Rescuing, A),
    t(S::ServiceFailed, E::Delete, S::Deleting, A),
    t(S::ServiceFailed, E::Abort, S::Active, A),
];

/// The conductor's move: where `event` takes a node in `from`, if anywhere.
pub fn next(from: ProvisionState, event: Event) -> Option<ProvisionState> {
    TABLE
        .iter()
        .find(|t| t.from == from && t.event == event)
        .map(|t| t.to)
}

/// An admin's move: where `verb` takes a node in `from`, if an admin may fire it there.
pub fn next_for_verb(from: ProvisionState, verb: Verb) -> Option<ProvisionState> {
    let event = Event::from_verb(verb);
    TABLE
        .iter()
        .find(|t| t.from == from && t.event == event && t.by == By::Admin)
        .map(|t| t.to)
}

/// Verbs an admin may send in `state`, for error messages.
pub fn allowed_verbs(state: ProvisionState) -> Vec<Verb> {
    Verb::ALL
        .iter()
        .copied()
        .filter(|v| next_for_verb(state, *v).is_some())
        .collect()
}

/// The state a node is heading for when it enters `to` through `event` from `from`
/// (`target_provision_state`). `None` when `to` is stable.
pub fn target_of(from: ProvisionState, event: Event, to: ProvisionState) -> Option<ProvisionState> {
    use ProvisionState::*;
    if to.is_stable() || to.is_failed() {
        return None;
    }
    Some(match to {
        Verifying => Manageable,
        Inspecting | InspectWait => Manageable,
        Cleaning | CleanWait | CleanHold => {
            // Manual cleaning returns to manageable; automated (provide, tear-down) to available.
            if from == Manageable && event == Event::Clean {
                Manageable
            } else {
                Available
            }
        }
        Deploying | WaitCallBack | DeployHold => Active,
        Deleting => Available,
        Adopting => Active,
        Rescuing | RescueWait => Rescue,
        Unrescuing => Active,
        Servicing | ServiceWait | ServiceHold => Active,
        _ => return None,
    })
}

/// The table as a Graphviz DOT document (`rivetd fsm --dot`; committed as
/// docs/state-machine.dot and kept in sync by a test).
pub fn to_dot() -> String {
    let mut out = String::new();
    out.push_str("// Generated by `rivetd fsm --dot` from model/src/fsm.rs. Do not edit.\n");
    out.push_str("digraph provision_states {\n");
    out.push_str("  rankdir=LR;\n  node [shape=box, style=rounded, fontname=\"Helvetica\"];\n");
    out.push_str("  edge [fontname=\"Helvetica\", fontsize=10];\n");
    for s in ProvisionState::ALL {
        let style = if s.is_stable() {
            ", style=\"rounded,bold\""
        } else if s.is_failed() {
            ", color=red"
        } else {
            ""
        };
        let _ = writeln!(out, "  \"{s}\" [label=\"{s}\"{style}];");
    }
    for t in TABLE {
        let style = match t.by {
            By::Admin => "",
            By::Conductor => ", style=dashed",
        };
        let _ = writeln!(
            out,
            "  \"{}\" -> \"{}\" [label=\"{}\"{style}];",
            t.from,
            t.to,
            t.event.as_str()
        );
    }
    out.push_str("}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    /// The admin verbs allowed in each state, written out independently of TABLE so a slip
    /// in either shows up.
    fn expected_admin() -> BTreeMap<ProvisionState, BTreeSet<Verb>> {
        use Verb::*;
        let rows: &[(ProvisionState, &[Verb])] = &[
            (S::Enroll, &[Manage]),
            (S::Verifying, &[]),
            (S::Manageable, &[Provide, Clean, Inspect, Adopt]),
            (S::Inspecting, &[]),
            (S::InspectWait, &[Abort]),
            (S::InspectFailed, &[Manage, Inspect]),
            (S::Cleaning, &[]),
            (S::CleanWait, &[Abort]),
            (S::CleanFailed, &[Manage]),
            (S::CleanHold, &[Unhold, Abort]),
            (S::Available, &[Active, Deploy, Manage]),
            (S::Deploying, &[]),
            (S::WaitCallBack, &[Abort, Deleted, Undeploy]),
            (
                S::DeployFailed,
                &[Active, Deploy, Rebuild, Deleted, Undeploy],
            ),
            (S::DeployHold, &[Unhold, Abort]),
            (S::Active, &[Rebuild, Deleted, Undeploy, Rescue, Service]),
            (S::Deleting, &[]),
            (S::Error, &[Rebuild, Deleted, Undeploy]),
            (S::Adopting, &[]),
            (S::AdoptFailed, &[Adopt, Manage]),
            (S::Rescuing, &[]),
            (S::RescueWait, &[Abort, Deleted, Undeploy]),
            (S::Rescue, &[Rescue, Unrescue, Deleted, Undeploy]),
            (S::RescueFailed, &[Rescue, Unrescue, Deleted, Undeploy]),
            (S::Unrescuing, &[]),
            (S::UnrescueFailed, &[Rescue, Unrescue, Deleted, Undeploy]),
            (S::Servicing, &[]),
            (S::ServiceWait, &[Abort, Deleted, Undeploy]),
            (S::ServiceHold, &[Unhold, Abort]),
            (
                S::ServiceFailed,
                &[Service, Rescue, Deleted, Undeploy, Abort],
            ),
        ];
        rows.iter()
            .map(|(s, v)| (*s, v.iter().copied().collect()))
            .collect()
    }

    #[test]
    fn every_state_verb_pair() {
        let expected = expected_admin();
        assert_eq!(
            expected.len(),
            ProvisionState::ALL.len(),
            "a state is missing"
        );
        let mut checked = 0;
        for &state in ProvisionState::ALL {
            for &verb in Verb::ALL {
                let allowed = next_for_verb(state, verb).is_some();
                assert_eq!(
                    allowed,
                    expected[&state].contains(&verb),
                    "({state}, {verb}) allowed={allowed}"
                );
                checked += 1;
            }
        }
        assert_eq!(checked, ProvisionState::ALL.len() * Verb::ALL.len());
    }

    #[test]
    fn admin_destinations() {
        use Verb::*;
        let cases = [
            (S::Enroll, Manage, S::Verifying),
            (S::Manageable, Provide, S::Cleaning),
            (S::Manageable, Clean, S::Cleaning),
            (S::Manageable, Inspect, S::Inspecting),
            (S::CleanWait, Abort, S::CleanFailed),
            (S::CleanHold, Unhold, S::CleanWait),
            (S::InspectWait, Abort, S::InspectFailed),
            (S::WaitCallBack, Abort, S::DeployFailed),
            (S::CleanFailed, Manage, S::Manageable),
            (S::Available, Active, S::Deploying),
            (S::Active, Deleted, S::Deleting),
            (S::Active, Undeploy, S::Deleting),
            (S::Active, Service, S::Servicing),
            (S::ServiceHold, Unhold, S::ServiceWait),
            (S::ServiceFailed, Abort, S::Active),
            (S::DeployHold, Unhold, S::WaitCallBack),
            (S::RescueWait, Abort, S::RescueFailed),
        ];
        for (from, verb, to) in cases {
            assert_eq!(next_for_verb(from, verb), Some(to), "{from} --{verb}-->");
        }
    }

    #[test]
    fn conductor_only_moves_refused_to_admins() {
        assert_eq!(next(S::Deleting, Event::Clean), Some(S::Cleaning));
        assert_eq!(next_for_verb(S::Deleting, Verb::Clean), None);
        assert_eq!(next(S::Cleaning, Event::Manage), Some(S::Manageable));
        assert_eq!(next_for_verb(S::Cleaning, Verb::Manage), None);
    }

    #[test]
    fn internal_events() {
        assert_eq!(next(S::Verifying, Event::Done), Some(S::Manageable));
        assert_eq!(next(S::Verifying, Event::Fail), Some(S::Enroll));
        assert_eq!(next(S::Cleaning, Event::Wait), Some(S::CleanWait));
        assert_eq!(next(S::CleanWait, Event::Resume), Some(S::Cleaning));
        assert_eq!(next(S::Cleaning, Event::Done), Some(S::Available));
        assert_eq!(next(S::Available, Event::Done), None);
        // No stable state moves by itself.
        for t in TABLE {
            if t.from.is_stable() {
                assert_eq!(t.by, By::Admin, "{t:?}");
            }
        }
    }

    #[test]
    fn table_has_no_duplicate_rows() {
        let mut seen = BTreeSet::new();
        for t in TABLE {
            assert!(seen.insert((t.from, t.event)), "duplicate row {t:?}");
        }
    }

    #[test]
    fn targets() {
        assert_eq!(
            target_of(S::Manageable, Event::Clean, S::Cleaning),
            Some(S::Manageable)
        );
        assert_eq!(
            target_of(S::Manageable, Event::Provide, S::Cleaning),
            Some(S::Available)
        );
        assert_eq!(
            target_of(S::Enroll, Event::Manage, S::Verifying),
            Some(S::Manageable)
        );
        assert_eq!(target_of(S::Verifying, Event::Done, S::Manageable), None);
    }

    #[test]
    fn committed_diagram_in_sync() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/state-machine.dot");
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == to_dot(),
            "docs/state-machine.dot is stale: run `cargo run -p rivet-controller --bin rivetd -- fsm --dot > docs/state-machine.dot`"
        );
    }
}
