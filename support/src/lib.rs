//! The support layer of rivetd: services that know the model but not the store, the drivers
//! or the conductor. It sits on `rivet-model` and under everything else; nothing here may
//! import from a layer above it, and the compiler sees to that. docs/architecture.md draws
//! the layers.
//!
//! - [`credentials`]: argon2id hashes of admin passwords and API tokens, constant-time compare.
//! - [`tls`]: the API's TLS configuration from PEM files, and a lab CA (`rivetd tls init`).
//! - [`cluster`]: the hash ring that shares nodes among live controllers.
//! - [`configdrive`]: configdrives checked, and the JSON form built into a config-2 ISO.
//! - [`bootiso`]: the per-node boot ISO for virtual media.
//! - [`secrets`]: driver_info secrets sealed at rest (AES-256-GCM-SIV), keys, rotation's re-sealing.
//! - [`metrics`]: the Prometheus registry and its recorders (labels are primitive values).
//! - [`http`]: the lean HTTP/1.1 server, hyper connections, deferred answers, `PeerAddr`.
//!
//! Cargo features keep the heavy parts out of the layers that do not use them: `http`
//! (the [`http`] module and the metrics middleware), `credentials` (argon2id hashing and
//! verifying; `credentials::hex` and `constant_time_eq` are always there), `configdrive`
//! (the ISO writer) and `tls`. All are on by default; the workspace's crates name theirs.
#![warn(missing_docs)]

pub mod bootiso;
pub mod cluster;
#[cfg(feature = "configdrive")]
pub mod configdrive;
pub mod credentials;
#[cfg(feature = "http")]
pub mod http;
pub mod metrics;
pub mod secrets;
#[cfg(feature = "tls")]
pub mod tls;
