//! Wire types shared by `rivetd`, `rivet-agent` and the `rivet` CLI.
//!
//! This crate owns the shapes of everything that crosses the network: the Ironic-shaped admin
//! API bodies ([`api`]), the agent protocol ([`agent`]), the hardware inventory ([`inventory`])
//! and the provision state names ([`states`]). It must not do I/O or hold behaviour beyond
//! parsing and naming: the state table lives in the controller, collection in the agent.
#![warn(missing_docs)]
// Tests may unwrap: a panic there is the failure report.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod agent;
pub mod api;
pub mod bootparams;
pub mod deploy;
pub mod discovery;
pub mod hints;
pub mod inventory;
pub mod limits;
pub mod patch;
pub mod states;
pub mod steps;

/// Agent and controller version string, sent in heartbeats and shown by `rivetd --version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
