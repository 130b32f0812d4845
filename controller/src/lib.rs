//! rivetd, the Rivet controller.
//!
//! It owns the node and port records ([`store`]), the provision state machine ([`fsm`]), the
//! conductor that moves nodes through it ([`conductor`]), the out-of-band BMC drivers
//! ([`drivers`]) and the HTTP API ([`api`]). It must not run in-band work itself: disk erase
//! and inventory belong to the agent, which it only talks to through the agent protocol.
#![warn(missing_docs)]

// The model layer under its old module names, so paths like `crate::fsm::Event` stay put.
pub use rivet_model::{config, fsm, inspection, interfaces, runs};
// The support layer likewise.
pub use rivet_support::{bootiso, cluster, configdrive, secrets, tls};
// The drivers layer likewise.
pub use rivet_drivers as drivers;
// The store layer, beside the drivers.
pub use rivet_store as store;
// The conductor layer, over both, and its metrics exposition.
pub use rivet_conductor::{self as conductor, metrics};

pub mod api;
pub mod metrics_http;
pub mod server;
