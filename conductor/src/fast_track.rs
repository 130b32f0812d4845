//! Fast track (Ironic's `[deploy] fast_track`): a ramdisk that is already running and
//! heartbeating is used as it is, instead of powering the node off and booting it again.
//!
//! Three rules, each Ironic's:
//! - Ending: cleaning or in-band inspection that ends with fast track on leaves the node
//!   powered on and its agent keeps its token; the agent goes on long-polling in `available`,
//!   `manageable` or `enroll` (Ironic: `tear_down_inband_cleaning` and the inspection
//!   tear-down skip the power off; `wipe_*_internal_info` keep the token when fast-track-able).
//! - Lookup: with fast track on, a ramdisk may also look up in `enroll`, `manageable` and
//!   `available` (Ironic's `FASTTRACK_LOOKUP_ALLOWED_STATES`, [`FAST_TRACK_STATES`]; the
//!   lookup itself, `agent::lookup_allowed`, adds them to the states that expect a ramdisk).
//! - Starting: a deploy, cleaning or inspection skips the power off and the ramdisk boot when
//!   [`check`] passes (Ironic's `is_fast_track`): fast track on for the node, no `last_error`,
//!   the node powered on (its last known state), and an agent holding a token whose last
//!   heartbeat is younger than `[deploy] fast_track_timeout_s`. Otherwise the ramdisk is
//!   booted as usual, which also voids the old agent's token, so an agent that was given up
//!   on can never be handed the new operation's work.
//!
//! Ironic reboots into the ramdisk at the start of an inspection even with fast track on;
//! Rivet uses the running agent there too (its inventory is what a fresh boot would collect).
//!
//! Every use, and every refusal while fast track is on, is written to the node's history
//! ([`FAST_TRACK_ACTION`]) so an operator sees why a node did or did not reboot.

use super::Conductor;
use chrono::{DateTime, Utc};
use rivet_model::config::DeployConfig;
use rivet_model::node::Node;
use rivet_protocol::states::{PowerState, ProvisionState};
use serde_json::Value;

/// Audit action of the node-history rows fast track writes (INFO).
pub const FAST_TRACK_ACTION: &str = "fast_track";

/// The states where a ramdisk may look up only with fast track (added to the states that
/// expect a ramdisk, `agent::LOOKUP_ALLOWED`), and where a fast-track agent keeps its token.
pub const FAST_TRACK_STATES: &[ProvisionState] = &[
    ProvisionState::Enroll,
    ProvisionState::Manageable,
    ProvisionState::Available,
];

/// Ironic's strict boolean strings (`oslo_utils.strutils.bool_from_string(strict=True)`).
fn parse_bool(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::String(s) => rivet_protocol::api::parse_bool_str(s),
        Value::Number(n) => match n.as_u64() {
            Some(1) => Some(true),
            Some(0) => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// Whether fast track is on for `node`: its `driver_info.fast_track` when set, else
/// `[deploy] fast_track`. `Err` says what is wrong with the node's value.
pub fn enabled(node: &Node, deploy: &DeployConfig) -> Result<bool, String> {
    match node.driver_info.get("fast_track") {
        None | Some(Value::Null) => Ok(deploy.fast_track),
        Some(v) => parse_bool(v).ok_or_else(|| {
            format!(
                "node {} has driver_info.fast_track = {v}, which is not a boolean; \
                 set it to true or false (or remove it to follow [deploy] fast_track)",
                node.ident()
            )
        }),
    }
}

/// [`enabled`], with a value that does not read as a boolean taken as off (logged): fast
/// track only ever saves a reboot, so off is the safe reading.
pub(crate) fn enabled_or_off(node: &Node, deploy: &DeployConfig) -> bool {
    enabled(node, deploy).unwrap_or_else(|e| {
        tracing::warn!(node = %node.uuid, error = %e, "fast track taken as off");
        false
    })
}

/// Ironic's `fast_track_able`: fast track on and nothing that rules it out whatever the
/// agent does (a recent failure, servicing, which must clean up after itself).
pub(crate) fn able(node: &Node, deploy: &DeployConfig) -> bool {
    enabled_or_off(node, deploy)
        && node.last_error.is_none()
        && !matches!(
            node.provision_state,
            ProvisionState::Servicing
                | ProvisionState::ServiceWait
                | ProvisionState::ServiceHold
                | ProvisionState::ServiceFailed
        )
}

/// Whether a node entering the stable state `to` keeps its agent's token: a fast-track
/// agent in one of [`FAST_TRACK_STATES`], on a node still powered on. Anything else forgets
/// it, as without fast track.
pub(crate) fn keeps_agent(node: &Node, to: ProvisionState, deploy: &DeployConfig) -> bool {
    FAST_TRACK_STATES.contains(&to)
        && node.runs.has_agent()
        && node.power_state == Some(PowerState::On)
        && able(node, deploy)
}

/// Why fast track cannot be used now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Fast track is off for the node (config or `driver_info.fast_track`).
    Off,
    /// `driver_info.fast_track` is not a boolean.
    Invalid(String),
    /// The node has a `last_error`.
    LastError,
    /// Servicing never uses fast track.
    Servicing,
    /// The node is not powered on as far as the conductor knows.
    NotPoweredOn(Option<PowerState>),
    /// No agent holds a token (none ever looked up, or its boot ended).
    NoAgent,
    /// The agent's last heartbeat is too old (seconds, or never).
    Silent {
        /// Seconds since the last heartbeat; `None`: none recorded.
        age_s: Option<i64>,
        /// `[deploy] fast_track_timeout_s`.
        limit_s: u64,
    },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Off => write!(f, "fast track is off for this node"),
            Refusal::Invalid(e) => write!(f, "{e}"),
            Refusal::LastError => write!(f, "the node has a last_error"),
            Refusal::Servicing => write!(f, "servicing never uses fast track"),
            Refusal::NotPoweredOn(p) => write!(
                f,
                "the node is not powered on (power state {})",
                p.map(|p| p.to_string()).unwrap_or_else(|| "unknown".into())
            ),
            Refusal::NoAgent => write!(f, "no agent holds a token for the running boot"),
            Refusal::Silent {
                age_s: Some(age),
                limit_s,
            } => write!(
                f,
                "the agent's last heartbeat was {age} s ago, over [deploy] fast_track_timeout_s = {limit_s} s"
            ),
            Refusal::Silent {
                age_s: None,
                limit_s,
            } => write!(
                f,
                "no heartbeat of the agent is recorded (limit [deploy] fast_track_timeout_s = {limit_s} s)"
            ),
        }
    }
}

/// Ironic's `is_fast_track` at `now`: `Ok(age of the last heartbeat in s)` when the running
/// ramdisk may take the operation.
pub(crate) fn check(
    node: &Node,
    deploy: &DeployConfig,
    now: DateTime<Utc>,
) -> Result<i64, Refusal> {
    match enabled(node, deploy) {
        Ok(true) => {}
        Ok(false) => return Err(Refusal::Off),
        Err(e) => return Err(Refusal::Invalid(e)),
    }
    if node.last_error.is_some() {
        return Err(Refusal::LastError);
    }
    if !able(node, deploy) {
        return Err(Refusal::Servicing);
    }
    if node.power_state != Some(PowerState::On) {
        return Err(Refusal::NotPoweredOn(node.power_state));
    }
    if !node.runs.has_agent() {
        return Err(Refusal::NoAgent);
    }
    let limit_s = deploy.fast_track_timeout_s;
    let age_s = node
        .liveness
        .last_heartbeat
        .map(|t| now.signed_duration_since(t).num_seconds().max(0));
    match age_s {
        Some(age) if age <= i64::try_from(limit_s).unwrap_or(i64::MAX) => Ok(age),
        _ => Err(Refusal::Silent { age_s, limit_s }),
    }
}

impl Conductor {
    /// At the start of `operation` (deploy, cleaning, inspection), before the conductor would
    /// power the node off and boot the ramdisk: whether the running ramdisk takes the
    /// operation instead. The decision is logged and, whenever fast track is on, recorded in
    /// the node's history.
    pub(crate) async fn fast_track_start(&self, node: &Node, operation: &str) -> bool {
        match check(node, &self.config.deploy, Utc::now()) {
            Ok(age) => {
                tracing::info!(node = %node.uuid, operation, last_heartbeat_age_s = age, "fast track: the running ramdisk takes the operation; no reboot");
                self.record_fast_track(
                    node,
                    &format!(
                        "fast track: {operation} uses the ramdisk already running (last heartbeat {age} s ago); no power off or reboot"
                    ),
                )
                .await;
                true
            }
            Err(Refusal::Off) => false,
            Err(why) => {
                tracing::info!(node = %node.uuid, operation, reason = %why, "fast track not used: booting the ramdisk");
                self.record_fast_track(
                    node,
                    &format!("fast track not used for {operation}: {why}; booting the ramdisk"),
                )
                .await;
                false
            }
        }
    }

    /// At the end of `operation` (cleaning, in-band inspection), instead of powering the node
    /// off: whether to leave the ramdisk running for a fast-track start. The agent has just
    /// delivered the result that ended the operation, so it is taken as alive without looking
    /// at its heartbeat's age (the start checks that).
    pub(crate) async fn fast_track_keep_running(&self, node: &Node, operation: &str) -> bool {
        // The state the node will rest in does not matter here, only that it is one of
        // FAST_TRACK_STATES, which every end of cleaning and inspection is.
        if !keeps_agent(node, ProvisionState::Available, &self.config.deploy) {
            return false;
        }
        tracing::info!(node = %node.uuid, operation, "fast track: the ramdisk is left running, the node powered on");
        self.record_fast_track(
            node,
            &format!(
                "fast track: {operation} ended with the ramdisk left running and the node powered on, for the next operation to use"
            ),
        )
        .await;
        true
    }

    /// A node-history row about fast track.
    async fn record_fast_track(&self, node: &Node, event: &str) {
        self.record_history(node, FAST_TRACK_ACTION, event, "the fast-track decision")
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{lookup_allowed, LOOKUP_ALLOWED};
    use rivet_model::runs::AgentSession;
    use serde_json::json;

    fn on() -> DeployConfig {
        DeployConfig {
            fast_track: true,
            fast_track_timeout_s: 300,
            ..Default::default()
        }
    }

    /// A node in `available`, powered on, with an agent that heartbeated at `hb`.
    fn running(hb: Option<DateTime<Utc>>) -> Node {
        let mut n = Node::new("n-uuid".into(), "fake-hardware".into());
        n.provision_state = ProvisionState::Available;
        n.power_state = Some(PowerState::On);
        n.runs.agent = Some(AgentSession {
            token_hash: "h".into(),
            boot_id: None,
        });
        n.liveness.last_heartbeat = hb;
        n
    }

    #[test]
    fn driver_info_overrides_the_config_with_ironics_strings() {
        let mut n = running(None);
        assert_eq!(enabled(&n, &DeployConfig::default()), Ok(false));
        assert_eq!(enabled(&n, &on()), Ok(true));
        for (v, want) in [
            (json!(true), true),
            (json!("Yes"), true),
            (json!("on"), true),
            (json!("1"), true),
            (json!(false), false),
            (json!("off"), false),
            (json!("n"), false),
            (json!(0), false),
        ] {
            n.driver_info.insert("fast_track".into(), v.clone());
            assert_eq!(enabled(&n, &on()), Ok(want), "{v}");
            assert_eq!(enabled(&n, &DeployConfig::default()), Ok(want), "{v}");
        }
        n.driver_info.insert("fast_track".into(), json!("maybe"));
        let e = enabled(&n, &on()).expect_err("not a boolean");
        assert!(
            e.contains("n-uuid") && e.contains("driver_info.fast_track"),
            "{e}"
        );
        // Unreadable: off everywhere, never on.
        assert!(!lookup_allowed(&n, &on()));
        assert!(matches!(
            check(&n, &on(), Utc::now()),
            Err(Refusal::Invalid(_))
        ));
        n.driver_info.insert("fast_track".into(), Value::Null);
        assert_eq!(enabled(&n, &on()), Ok(true), "null follows the config");
    }

    #[test]
    fn lookup_states_are_ironics_two_sets() {
        let mut n = running(None);
        let off = DeployConfig::default();
        for s in FAST_TRACK_STATES {
            n.provision_state = *s;
            assert!(!lookup_allowed(&n, &off), "{s} without fast track");
            assert!(lookup_allowed(&n, &on()), "{s} with fast track");
        }
        for s in [
            ProvisionState::Active,
            ProvisionState::CleanFailed,
            ProvisionState::DeployFailed,
            ProvisionState::Verifying,
        ] {
            n.provision_state = s;
            assert!(!lookup_allowed(&n, &on()), "{s} never");
        }
        for s in LOOKUP_ALLOWED {
            n.provision_state = *s;
            assert!(lookup_allowed(&n, &off), "{s} always");
        }
    }

    #[test]
    fn check_is_ironics_is_fast_track() {
        let now = Utc::now();
        let fresh = Some(now - chrono::Duration::seconds(20));
        assert_eq!(check(&running(fresh), &on(), now), Ok(20));
        assert_eq!(
            check(&running(fresh), &DeployConfig::default(), now),
            Err(Refusal::Off)
        );
        let mut n = running(fresh);
        n.last_error = Some("earlier failure".into());
        assert_eq!(check(&n, &on(), now), Err(Refusal::LastError));
        let mut n = running(fresh);
        n.power_state = Some(PowerState::Off);
        assert_eq!(
            check(&n, &on(), now),
            Err(Refusal::NotPoweredOn(Some(PowerState::Off)))
        );
        let mut n = running(fresh);
        n.runs.agent = None;
        assert_eq!(check(&n, &on(), now), Err(Refusal::NoAgent));
        let mut n = running(fresh);
        n.provision_state = ProvisionState::Servicing;
        assert_eq!(check(&n, &on(), now), Err(Refusal::Servicing));
        // The timeout, at its edge and past it, and no heartbeat at all.
        let at_limit = Some(now - chrono::Duration::seconds(300));
        assert_eq!(check(&running(at_limit), &on(), now), Ok(300));
        let stale = Some(now - chrono::Duration::seconds(301));
        let e = check(&running(stale), &on(), now).expect_err("stale");
        assert_eq!(
            e,
            Refusal::Silent {
                age_s: Some(301),
                limit_s: 300
            }
        );
        assert!(e.to_string().contains("fast_track_timeout_s = 300"), "{e}");
        assert!(matches!(
            check(&running(None), &on(), now),
            Err(Refusal::Silent { age_s: None, .. })
        ));
    }

    #[test]
    fn the_agent_is_kept_only_on_a_powered_fast_track_node_at_rest() {
        let n = running(None);
        assert!(keeps_agent(&n, ProvisionState::Available, &on()));
        assert!(keeps_agent(&n, ProvisionState::Manageable, &on()));
        assert!(keeps_agent(&n, ProvisionState::Enroll, &on()));
        assert!(!keeps_agent(&n, ProvisionState::Active, &on()));
        assert!(!keeps_agent(
            &n,
            ProvisionState::Available,
            &DeployConfig::default()
        ));
        let mut off = n.clone();
        off.power_state = Some(PowerState::Off);
        assert!(!keeps_agent(&off, ProvisionState::Available, &on()));
        let mut failed = n.clone();
        failed.last_error = Some("x".into());
        assert!(!keeps_agent(&failed, ProvisionState::Manageable, &on()));
        let mut none = n;
        none.runs.agent = None;
        assert!(!keeps_agent(&none, ProvisionState::Available, &on()));
    }
}
