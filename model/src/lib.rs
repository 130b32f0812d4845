//! The bottom layer of rivetd: what a node's life *is*, with no I/O. Everything above it
//! (support, store, drivers, conductor, api, the daemon) may use it; it uses only
//! `rivet-protocol`, serde and a few pure crates — no tokio, no axum, no SQL — so the compiler
//! keeps it that way. docs/architecture.md draws the layers.
//!
//! - [`fsm`]: Ironic's provision state machine (states, events, who may fire them).
//! - [`runs`]: the typed run state of a node's operations (cleaning, deploy, inspection…).
//! - [`steps`]: planned steps, where they run, and Ironic's ordering rules.
//! - [`interfaces`]: hardware types and the interfaces each enables.
//! - [`inspection`]: what an inventory says about a node, and the operator's inspection rules.
//! - [`internal_info`]: the `driver_internal_info` keys Rivet writes, one typed reader and writer each.
//! - [`node`]: the node record (and its chassis) that the API, the conductor and the store share.
//! - [`port`]: a node's ports and port groups, likewise.
//! - [`records`]: firmware readings and MAC addresses, shared by drivers and store.
//! - [`raid`]: Ironic's RAID schema, the agent RAID steps' arguments, and what a built
//!   configuration changes on the node.
//! - [`boot_mode`]: a node's effective boot mode and whether Secure Boot is requested.
//! - [`config`]: every section of rivetd's configuration file.
//! - [`microversions`]: the microversion of every API route, resource and provision verb.
#![warn(missing_docs)]

pub mod boot_mode;
pub mod config;
pub mod fsm;
pub mod inspection;
pub mod interfaces;
pub mod internal_info;
pub mod microversions;
pub mod node;
pub mod port;
pub mod raid;
pub mod records;
pub mod runs;
pub mod steps;
