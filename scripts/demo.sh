#!/usr/bin/env bash
# The main job, end to end on this machine: `rivet demo` starts rivetd on a SQLite file in a
# temp dir, enrolls a fake-hardware node whose "ramdisk" is a local rivet-agent process with
# two sparse-file disks (never the host's disks), runs automated cleaning (metadata erase, then
# erase) to available, checks the disks read back as zeroes, then a manual clean, and prints a
# summary. See cli/src/demo.rs. Flags: `bash scripts/demo.sh --help`.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== building rivetd, rivet and rivet-agent"
cargo build -q --workspace --bins
exec target/debug/rivet demo "$@"
