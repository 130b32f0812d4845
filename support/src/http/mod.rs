//! HTTP serving below the API: the lean HTTP/1.1 server for plain TCP ([`lean`]), hyper for
//! TLS and hand-offs ([`hyper_conn`]), and the deferred answers that let a handler park a
//! long wait outside its request ([`deferred`]). None of it knows the routes.

pub mod deferred;
pub mod hyper_conn;
pub mod lean;

pub use hyper_conn::serve_connection;

use std::net::SocketAddr;

/// The TCP peer of a request, set by the servers here. Absent when the router is driven in-process
/// (tests), so users of it must treat it as optional.
#[derive(Clone, Copy, Debug)]
pub struct PeerAddr(pub SocketAddr);
