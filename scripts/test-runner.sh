#!/usr/bin/env bash
# cargo's runner in scripts/test.sh: libtest prints each test's time (`--report-time`:
# `test NAME ... ok <1.234s>`), which test.sh sorts into the slowest ten. The flag is
# unstable: RUSTC_BOOTSTRAP=1 unlocks it in the test process (the artefacts are the ones cargo
# built; nothing is recompiled for it). Only test binaries (target/*/deps/) get the flags: a
# `cargo run` that a test starts inherits the runner and must run as asked.
case "$1" in
  */deps/*) export RUSTC_BOOTSTRAP=1; exec "$@" -Z unstable-options --report-time ;;
  *) exec "$@" ;;
esac
