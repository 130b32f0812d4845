#!/usr/bin/env bash
# The main job, end to end on this machine: `rivet demo` starts rivetd on a SQLite file in a
# temp dir, enrolls a fake-hardware node whose "ramdisk" is a local rivet-agent process with
# two sparse-file disks (never the host's disks), runs automated cleaning (metadata erase, then
# erase) to available, checks the disks read back as zeroes, deploys a whole-disk GPT image
# with a configdrive and checks both on the disk, undeploys, then a manual clean, and prints
# a summary. See cli/src/demo.rs. Flags: `bash scripts/demo.sh --help`.
#
# Needs only the Rust toolchain (cargo, rustc and the C compiler/linker `cc` they use): host
# binaries, no musl target, and no disk tools — the demo writes its partition tables and reads
# the disks back in Rust (tests/demo_bare.rs runs this script with nothing else on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "demo: cargo not found; install the Rust toolchain (https://rustup.rs), then run this again" >&2
  exit 1
fi
if ! command -v cc >/dev/null 2>&1; then
  echo "demo: cc not found; rustc links with it: apt-get install gcc (Debian), then run this again" >&2
  exit 1
fi

echo "== building rivetd, rivet and rivet-agent"
# The same build as scripts/test.sh's, so neither rebuilds after the other.
cargo build -q --workspace --bins
exec "${CARGO_TARGET_DIR:-target}/debug/rivet" demo "$@"
