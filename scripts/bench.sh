#!/usr/bin/env bash
# Rivet's benchmarks end to end: build the release binaries, then run every rivet-bench
# subcommand at its default sizes plus the large ones (fleet at 10,000 nodes, api at
# 100,000 nodes) and print docs/numbers.md's tables on stdout (progress on stderr).
# A few minutes on 2 cores once built. Only loopback traffic; rivetd runs as a child on a
# temporary SQLite file and is killed at the end of each bench.
#
#   bash scripts/bench.sh            # everything
#   bash scripts/bench.sh --quick    # default sizes only (no 10,000-node fleets, no 100,000-node api)
#
# The full run also measures 10,000 agents against 1 and against 3 rivetd sharing one
# PostgreSQL (a scratch database, dropped at the end) when RIVET_BENCH_POSTGRES names a
# server, or scripts/setup-postgres.sh can start the loopback one.
#
# The table is also written to target/bench/numbers.md.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
quick=false
[ "${1:-}" = "--quick" ] && quick=true

log() { echo "bench: $*" >&2; }

log "building release rivetd and rivet-bench"
cargo build --release -p rivet-controller -p rivet-bench >&2
bench="$root/target/release/rivet-bench"

agent_args=()
if agent_bin="$(bash scripts/build-agent.sh)"; then
    agent_args=(--agent-bin "$agent_bin")
else
    log "scripts/build-agent.sh failed; the agent bench falls back to target/release/rivet-agent"
    cargo build --release -p rivet-agent >&2
    agent_args=(--agent-bin "$root/target/release/rivet-agent")
fi

out_dir="$root/target/bench"
mkdir -p "$out_dir"
table="$out_dir/numbers.md"

cpu_model="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
mem_gib="$(awk '/^MemTotal/ {printf "%.1f", $2 / 1048576}' /proc/meminfo)"
os="$(. /etc/os-release && echo "$PRETTY_NAME")"
{
    echo "Machine: $(nproc) cores ($cpu_model), $mem_gib GiB RAM, $os, $(uname -r)."
    echo "Command: \`bash scripts/bench.sh\` ($(git rev-parse --short HEAD 2>/dev/null || echo unknown))."
    echo
    echo "| What | Result | Command |"
    echo "|---|---|---|"
} | tee "$table"

run() {
    log "rivet-bench $*"
    local start=$SECONDS
    "$bench" "$@" | tee -a "$table"
    log "rivet-bench $* took $((SECONDS - start)) s"
}

total_start=$SECONDS
run clean-fleet --nodes 1000
run fleet --nodes 1000
if ! $quick; then
    run fleet --nodes 10000 --rates 2500,5000,7500,10000 --seconds 20 --long-poll-phase
    pg_url="${RIVET_BENCH_POSTGRES:-}"
    if [ -z "$pg_url" ] && bash scripts/setup-postgres.sh >&2; then
        pg_url="postgres://rivet:rivet@127.0.0.1:55432/rivet"
    fi
    if [ -n "$pg_url" ]; then
        for n in 1 3; do
            run fleet --nodes 10000 --rates 1000,2500,5000 --seconds 20 \
                --postgres "$pg_url" --controllers "$n"
        done
    else
        log "no PostgreSQL (RIVET_BENCH_POSTGRES unset, scripts/setup-postgres.sh failed): no multi-controller rows"
    fi
fi
run api --nodes 10000
if ! $quick; then
    run api --nodes 100000
fi
# Serial consoles: RSS per console with 1,000 streaming, keystroke round trip (stand-in BMCs).
run console --steps 100,1000
run agent "${agent_args[@]}"
# write_image against curl | dd on a loop device (root): raw, qcow2 and zstd of one 2 GiB image.
run deploy --size-gib 2 --reps 3 "${agent_args[@]}"

# Step dispatch latency and one-node cleaning: tests/dispatch_bench.rs (the real agent
# library in-process against the release rivetd). Its rows have two columns; add the command.
if [ -f tests/dispatch_bench.rs ] && grep -q 'name = "dispatch_bench"' tests/Cargo.toml; then
    log "dispatch_bench (tests/dispatch_bench.rs)"
    cargo run --release -q -p rivet-tests --example dispatch_bench \
        | grep '^| ' | grep -v '^| What \|^|---' \
        | sed 's/ |$/ | `cargo run --release -p rivet-tests --example dispatch_bench` |/' \
        | tee -a "$table" || log "dispatch_bench failed; its rows are missing"
else
    log "tests/dispatch_bench.rs not present; no dispatch latency rows"
fi
log "all benches took $((SECONDS - total_start)) s; table in $table"
