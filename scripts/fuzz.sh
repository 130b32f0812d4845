#!/usr/bin/env bash
# Runs the cargo-fuzz targets in fuzz/ for a bounded time each and reports what ran.
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]    (default: 10 s each, every target)
#   bash scripts/fuzz.sh --build-only             (build every target, run none: scripts/test.sh
#                                                  builds them beside the tests)
# Seeds are fuzz/corpus/<target>/ (committed); inputs a run finds interesting go to
# fuzz/work/<target>/ (git-ignored) and are reused by the next run; a crash stops the run
# and is saved under fuzz/artifacts/<target>/ with the command that reproduces it.
set -euo pipefail
cd "$(dirname "$0")/.."

build_only=0
if [ "${1:-}" = --build-only ]; then
  build_only=1
  shift
fi
secs=${1:-10}
shift || true
# cargo-fuzz passes unstable flags (-Zsanitizer…): nightly when the machine has it, else the
# one stable toolchain with RUSTC_BOOTSTRAP=1 (same compiler, unstable flags unlocked), since
# a CI machine may not be able to fetch another toolchain.
if cargo +nightly --version >/dev/null 2>&1; then
  toolchain=+nightly
else
  toolchain=+stable
  export RUSTC_BOOTSTRAP=1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  what="cargo-fuzz is missing (scripts/setup.sh installs it)"
  if [ "${RIVET_REQUIRE_PEERS:-}" = 1 ]; then
    echo "fuzz: $what (RIVET_REQUIRE_PEERS=1)" >&2
    exit 1
  fi
  echo "fuzz: skipping: $what"
  exit 0
fi

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo $toolchain fuzz list --fuzz-dir fuzz)
fi

echo "fuzz: building ${#targets[@]} targets (toolchain ${toolchain#+})"
start=$(date +%s)
cargo $toolchain fuzz build --fuzz-dir fuzz
echo "fuzz: built in $(( $(date +%s) - start )) s"
[ "$build_only" = 1 ] && exit 0

# One target a core at a time (libFuzzer runs one process a target): same seconds each, less
# wall time. A crash is reported with its log when its target ends; the run then fails.
fuzz_one() {
  local t=$1 log runs corpus
  mkdir -p "fuzz/work/$t"
  log=$(mktemp)
  # -timeout: one input taking over 10 s is a finding (a parser must be linear);
  # -rss_limit_mb: so must be memory.
  if ! cargo $toolchain fuzz run --fuzz-dir fuzz "$t" "fuzz/work/$t" "fuzz/corpus/$t" -- \
      -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    rm -f "$log"
    echo "fuzz: $t FAILED; the input is under fuzz/artifacts/$t/" >&2
    return 1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  corpus=$(ls "fuzz/work/$t" | wc -l)
  echo "fuzz: $t: ${secs} s, $runs runs, no crash ($corpus inputs in fuzz/work/$t)"
  rm -f "$log"
}

jobs_max=${FUZZ_JOBS:-$(nproc)}
failures=$(mktemp -d)
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do
    wait -n || true
  done
  # A target that fails leaves its name in $failures (an exit status can be reaped unseen).
  { fuzz_one "$t" || touch "$failures/$t"; } &
done
wait
failed=$(ls "$failures")
rm -rf "$failures"
if [ -n "$failed" ]; then
  echo "fuzz: failed: $failed" >&2
  exit 1
fi
