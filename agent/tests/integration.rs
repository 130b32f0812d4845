//! The agent's integration tests, one module a file, linked into one test binary: the
//! link step is paid once for all of them, not once a file. Run one file's tests with
//! `cargo test -p rivet-agent --test integration FILE::`.

mod http_agent;
mod inventory_host;
