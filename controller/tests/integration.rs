//! The controller's integration tests, one module a file, linked into one test binary: the
//! link step is paid once for all of them, not once a file. Run one file's tests with
//! `cargo test -p rivet-controller --test integration FILE::`.

mod support;

mod api;
mod audit;
mod corrupt;
mod interfaces;
mod limits;
mod node_logs_api;
mod roles;
mod secrets;
mod store_allocations;
mod store_backends;
mod store_counts;
mod store_node_filters;
mod store_node_health;
mod store_node_logs;
mod store_node_resources;
mod store_ports;
mod supervision;
