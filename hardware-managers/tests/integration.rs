//! The hardware managers's integration tests, one module a file, linked into one test binary: the
//! link step is paid once for all of them, not once a file. Run one file's tests with
//! `cargo test -p rivet-hardware-managers --test integration FILE::`.

mod common;

mod full_erase;
mod managers;
mod metadata;
mod qcow2_bound;
mod safety;
