#!/usr/bin/env bash
# The test command: installs what the tests need, then runs every check CI runs, timing each
# phase and listing the ten slowest tests at the end so the next regression is visible.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
phase_name="" phase_start=$t0
phases=()
phase() {
  local now
  now=$(date +%s)
  if [ -n "$phase_name" ]; then
    phases+=("$(printf '%6d s  %s' $((now - phase_start)) "$phase_name")")
  fi
  phase_name=$1 phase_start=$now
  [ -n "$phase_name" ] && echo "== $phase_name"
  return 0
}

phase "set-up (scripts/setup.sh)"
bash scripts/setup.sh

export CARGO_TERM_COLOR=never
# Peers are installed by setup.sh: a test that finds one missing fails instead of skipping.
export RIVET_REQUIRE_PEERS=1
export RIVET_VENV="$PWD/.venv"
export RIVET_TEST_POSTGRES=${RIVET_TEST_POSTGRES:-postgres://rivet:rivet@127.0.0.1:55432/rivet}  # scripts/setup-postgres.sh

phase "documentation links"
bash scripts/check-links.sh
phase "import circles (scripts/check-module-cycles.py)"
python3 scripts/check-module-cycles.py
phase "unused dependencies (cargo machete)"
cargo machete
phase "cargo fmt --check"
cargo fmt --all -- --check
# Clippy as the workspace's compiler: the crates of this workspace are linted while they are
# built for real, so the lints and the tests share one build (`cargo clippy` would type-check
# every dependency a second time, in check mode). The same environment for every cargo call
# below keeps one set of artefacts. CLIPPY_ARGS is how cargo-clippy hands `-D warnings` over.
export RUSTC_WORKSPACE_WRAPPER
RUSTC_WORKSPACE_WRAPPER=$(command -v clippy-driver || rustup which clippy-driver)
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
phase "cargo build with clippy's lints (libraries, binaries, tests, examples)"
cargo build --workspace --lib --bins --tests --examples
phase "cargo test (the fuzz targets build beside it)"
log=target/test-output.log
# The fuzz targets (a release build in fuzz/'s own target dir, ~2 min of both cores) build
# while the tests run: the tests leave about a quarter of the CPU idle (waiting on guests,
# BMCs and timers), and at nice 19 the build takes only what they leave.
fuzz_build_log=target/fuzz-build.log
# Its own process group (setsid), so a failed test run can stop the whole build.
setsid env -u RUSTC_WORKSPACE_WRAPPER -u CLIPPY_ARGS nice -n 19 bash scripts/fuzz.sh --build-only \
  >"$fuzz_build_log" 2>&1 &
fuzz_build=$!
# A third lane for the scenario that mostly waits: the agent cut off for two minutes erases a
# disk a cgroup throttles behind a link that is down, using next to no CPU, and would hold one
# of the two test threads for ~3 min. It runs beside them, from the binary the build made (a
# second `cargo test` would wait on the first one's lock), in the crate's directory as cargo
# runs it, through the same runner.
waiting_test=faults_controller::agent_cut_off_for_two_minutes_mid_erase_finishes_once
lane_log=target/test-lane.log
# The same targets as the run below, so cargo resolves the same features: a no-op build.
scenarios=$(cargo test --workspace --lib --bins --tests --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "scenarios" and m.get("executable"):
        print(m["executable"])')
if [ -z "$scenarios" ]; then
  echo "cannot find the scenarios test binary in cargo's output" >&2
  exit 1
fi
root=$PWD
(cd tests && "$root/scripts/test-runner.sh" "$scenarios" --exact "$waiting_test") >"$lane_log" 2>&1 &
lane=$!
# The runner adds libtest's per-test times (scripts/test-runner.sh); the doc tests run apart
# because rustdoc's harness does not take that flag.
status=0
CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/scripts/test-runner.sh" \
  cargo test --workspace --no-fail-fast --lib --bins --tests -- --test-threads=2 \
  --skip "$waiting_test" 2>&1 | tee "$log" || status=$?
cargo test --workspace --doc 2>&1 | tee -a "$log" || status=$?
lane_status=0
wait "$lane" || lane_status=$?
{ echo "     Running (beside the others) scenarios"; cat "$lane_log"; } | tee -a "$log"
if [ "$lane_status" != 0 ]; then status=$lane_status; fi
if [ "$status" = 0 ]; then
  phase "fuzz targets (bounded; scripts/fuzz.sh SECONDS runs them longer)"
  fuzz_built=0
  wait "$fuzz_build" || fuzz_built=$?
  cat "$fuzz_build_log"
  if [ "$fuzz_built" != 0 ]; then
    echo "fuzz: the build beside the tests failed (exit $fuzz_built; its output is above)" >&2
    exit "$fuzz_built"
  fi
  env -u RUSTC_WORKSPACE_WRAPPER -u CLIPPY_ARGS bash scripts/fuzz.sh 10
else
  kill -- -"$fuzz_build" 2>/dev/null || true
  wait "$fuzz_build" 2>/dev/null || true
fi
phase ""

echo "== the ten slowest tests"
awk '/^     Running /{bin=$NF; gsub(/[()]/,"",bin)} /^test .* <[0-9.]+s>$/{t=$NF; gsub(/[<>s]/,"",t); sub(/.*\//,"",bin); sub(/-[0-9a-f]+$/,"",bin); printf "%9.1f s  %s %s\n", t, bin, $2}' "$log" \
  | sort -rn | awk "NR <= 10"
echo "== phases"
printf '%s\n' "${phases[@]}"
printf '%6d s  total\n' $(( $(date +%s) - t0 ))
# One closing line for the whole run (each binary's `test result:` lines summed).
awk '/^test result: /{for(i=1;i<=NF;i++){if($(i+1)~/^passed;?$/)p+=$i; if($(i+1)~/^failed;?$/)f+=$i}} END{printf "%d passed, %d failed\n", p, f}' "$log"
exit "$status"
