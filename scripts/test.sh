#!/usr/bin/env bash
# The test command: installs what the tests need, then runs every check CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

export CARGO_TERM_COLOR=never
# Peers are installed by setup.sh: a test that finds one missing fails instead of skipping.
export RIVET_REQUIRE_PEERS=1
export RIVET_VENV="$PWD/.venv"
export RIVET_TEST_POSTGRES=${RIVET_TEST_POSTGRES:-postgres://rivet:rivet@127.0.0.1:55432/rivet}  # scripts/setup-postgres.sh

echo "== documentation links"
bash scripts/check-links.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo build (binaries the cross-crate tests run)"
cargo build --workspace --bins
echo "== cargo test"
cargo test --workspace --no-fail-fast -- --test-threads=2
echo "== fuzz targets (bounded; scripts/fuzz.sh SECONDS runs them longer)"
bash scripts/fuzz.sh 10
