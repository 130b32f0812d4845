#!/usr/bin/env bash
# The main job on the embedded defaults: rivetd on a SQLite file in a temp dir, a fake-driver
# node whose "ramdisk" is a local rivet-agent process with sparse-file disks (never the host's
# disks), driven through the state machine with the rivet CLI.
#
# What exists today: enroll → manage → provide boots the ramdisk (clean wait), the agent looks
# up, receives its one-time token and reports its inventory; abort → clean failed → manage.
# The cleaning engine (step merge, erase on the agent) is the next issue; until then the demo
# turns automated cleaning off for the node and finishes provide → available → deploy → active
# → undeploy → available.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== building rivetd, rivet and rivet-agent"
cargo build -q --workspace --bins
BIN=$PWD/target/debug

tmp=$(mktemp -d /tmp/rivet-demo.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export RIVET_URL=http://127.0.0.1:$port
"$BIN/rivetd" --listen "127.0.0.1:$port" --db "sqlite:$tmp/rivet.db" --no-auth 2>"$tmp/rivetd.log" &
pids+=($!)
for _ in $(seq 100); do curl -sf "$RIVET_URL/v1" >/dev/null && break; sleep 0.1; done
echo "== rivetd on $RIVET_URL, database $tmp/rivet.db"

truncate -s 256M "$tmp/disk0.img" "$tmp/disk1.img"
rivet() { "$BIN/rivet" "$@"; }

echo "== enroll"
rivet node create --driver fake-hardware --name demo-1 >/dev/null
rivet port create --node demo-1 --address 52:54:00:12:34:56 >/dev/null
rivet node list
uuid=$(rivet --json node show demo-1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["uuid"])')

echo "== manage (validates the BMC, reads power)"
rivet node manage demo-1
rivet node wait demo-1 --state manageable --timeout 30

echo "== provide: automated cleaning boots the ramdisk and waits for it"
rivet node provide demo-1
rivet node wait demo-1 --state "clean wait" --timeout 30
echo "== the 'ramdisk': rivet-agent with two sparse-file disks"
"$BIN/rivet-agent" run --controller "$RIVET_URL" --node "$uuid" \
  --devices "$tmp/disk0.img,$tmp/disk1.img" 2>"$tmp/agent.log" &
pids+=($!)
for _ in $(seq 200); do rivet node inventory demo-1 >"$tmp/inventory.json" 2>/dev/null && break; sleep 0.1; done
python3 - "$tmp/inventory.json" <<'PY'
import json, sys
inv = json.load(open(sys.argv[1]))["inventory"]
print(f"inventory: {inv['cpu']['count']} CPUs ({inv['cpu']['model_name']}), "
      f"{inv['memory']['total'] // 2**20} MiB RAM, {len(inv['interfaces'])} NICs")
for d in inv["disks"]:
    print(f"  disk {d['name']}: {d['size']} bytes")
PY

echo "== abort the cleaning (the cleaning engine is the next issue)"
rivet node abort demo-1
rivet node show demo-1 --fields provision_state,last_error
rivet node manage demo-1
rivet node wait demo-1 --state manageable --timeout 30

echo "== provide with automated cleaning off, deploy, undeploy"
rivet node update demo-1 --set automated_clean=false >/dev/null
rivet node provide demo-1
rivet node wait demo-1 --state available --timeout 30
rivet node deploy demo-1
rivet node wait demo-1 --state active --timeout 30
rivet node undeploy demo-1
rivet node wait demo-1 --state available --timeout 30

echo "== summary"
rivet node list --long
echo "demo finished: node demo-1 went enroll → manageable → clean wait (agent inventory) → clean failed (abort) → manageable → available → active → available"
