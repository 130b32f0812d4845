//! rivet-agent: the in-band agent that runs in the Rivet ramdisk.
//!
//! This crate owns everything the agent does on the machine: its configuration (kernel command
//! line, env, flags: [`config`]), the hardware inventory collected in pure Rust
//! ([`inventory`]), the conversation with the controller (lookup and long-poll heartbeat:
//! [`client`], [`heartbeat`]), the one-at-a-time command executor ([`executor`]), its own log
//! ring ([`logring`]) and its PID-1 duties ([`pid1`]). It must not implement steps itself: steps
//! belong to hardware managers (`rivet-hardware-managers`), which this crate only dispatches
//! to. Talking to rivetd it only ever makes outbound requests (no listening port); in IPA
//! mode ([`ipa`], a stock Ironic drives it) it serves IPA's REST API, as IPA does.
//!
//! In-process use (tests, simulators):
//! ```no_run
//! # async fn demo() -> Result<(), rivet_agent::client::ClientError> {
//! use rivet_agent::inventory::InventoryOptions;
//! use rivet_agent::{Agent, AgentOptions, Executor, ExecutorOptions, HttpTransport, LogRing};
//! use rivet_hardware_managers::{default_managers, Dispatcher, ManagerConfig};
//! use std::sync::Arc;
//!
//! let devices = vec!["/tmp/disk0.img".into()];
//! let mcfg = ManagerConfig { devices: Some(devices.clone()), ..Default::default() };
//! let dispatcher = Arc::new(Dispatcher::new(default_managers(&mcfg)));
//! let inventory = InventoryOptions { devices: Some(devices), ..Default::default() };
//! let opts = AgentOptions {
//!     controllers: vec!["http://127.0.0.1:6385".into()],
//!     inventory: inventory.clone(),
//!     ..Default::default()
//! };
//! let exec_opts = ExecutorOptions { inventory, ..Default::default() };
//! let executor = Executor::new(dispatcher.clone(), exec_opts, LogRing::new(50, true));
//! let agent = Agent::new(opts, HttpTransport::new(None)?, dispatcher, executor);
//! let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
//! let task = tokio::spawn(agent.run(async move { let _ = stop_rx.await; }));
//! // … drive the controller …
//! let _ = stop_tx.send(());
//! let _ = task.await;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
// Tests may unwrap: a panic there is the failure report.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod backoff;
pub mod cli;
pub mod client;
pub mod config;
pub mod discovery;
pub mod executor;
pub mod fetch;
pub mod heartbeat;
pub mod inventory;
pub mod ipa;
pub mod logring;
pub mod pid1;
pub mod rescue;

pub use backoff::BackoffConfig;
pub use cli::{run, run_with};
pub use client::{HttpTransport, Transport};
pub use executor::{Executor, ExecutorOptions, PowerMode};
pub use heartbeat::{Agent, AgentOptions};
pub use logring::LogRing;
