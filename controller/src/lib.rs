//! rivetd, the Rivet controller.
//!
//! It serves the HTTP API ([`api`]) over the lower crates, each named by its own path: the
//! records and the provision state machine (`rivet_model`), the store (`rivet_store`), the
//! out-of-band BMC drivers (`rivet_drivers`) and the conductor that moves nodes through the
//! state machine (`rivet_conductor`); [`server`] wires them into the daemon, and [`ui`] is the web UI over the API. It must not run
//! in-band work itself: disk erase and inventory belong to the agent, which it only talks to
//! through the agent protocol.
#![warn(missing_docs)]

pub mod api;
pub mod console;
pub mod metrics_http;
pub mod server;
pub mod ui;
