//! rivetd, the Rivet controller.
//!
//! It owns the node and port records ([`store`]), the provision state machine ([`fsm`]), the
//! conductor that moves nodes through it ([`conductor`]), the out-of-band BMC drivers
//! ([`drivers`]) and the HTTP API ([`api`]). It must not run in-band work itself: disk erase
//! and inventory belong to the agent, which it only talks to through the agent protocol.
#![warn(missing_docs)]

pub mod api;
pub mod bootiso;
pub mod cluster;
pub mod conductor;
pub mod config;
pub mod configdrive;
pub mod drivers;
pub mod fsm;
pub mod http1;
pub mod inspection;
pub mod interfaces;
pub mod metrics;
pub mod runs;
pub mod secrets;
pub mod server;
pub mod store;
pub mod tls;
