#!/usr/bin/env bash
# A server's whole life on a lab VM, driven with the `rivet` CLI and watched live:
# enroll → manage → inspect (in the ramdisk) → provide (automated cleaning) → deploy a
# whole-disk image with a configdrive → the VM boots it from its disk and prints the
# configdrive's uuid on its serial console → undeploy → cleaning → available.
#
#   bash scripts/demo-lab.sh            # redfish + redfish-virtual-media (the default)
#   bash scripts/demo-lab.sh --ipxe     # ipmi + ipxe
#
# Brings the lab up first (scripts/lab.sh up --nodes 1, with its rivetd; see docs/boot.md "Try it on
# VMs"); leaves it up afterwards (`bash scripts/lab.sh down` removes it). Root, Debian 12;
# scripts/setup.sh installs what it needs. About 3 minutes on 2 cores without KVM.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=vmedia
case "${1:-}" in
    "") ;;
    --ipxe) mode=ipxe ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo-lab: unknown argument $1 (try --help)" >&2; exit 2 ;;
esac

echo "== building rivetd, rivet and rivet-agent"
cargo build -q --workspace --bins
echo "== the lab: libvirt guest, sushy-tools (Redfish), ipmi_sim (IPMI + SOL), dnsmasq, rivetd"
bash scripts/lab.sh up --nodes 1 >/dev/null

lab=target/lab/lab.json
field() { /usr/bin/python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2], {"d": d}))' "$lab" "$1"; }
RIVET_URL="$(field 'd["api_url"]')"
RIVET_TOKEN="$(field 'd["rivetd"]["token"]')"
export RIVET_URL RIVET_TOKEN
rivet() { target/debug/rivet "$@"; }
name="$(field 'd["nodes"][0]["name"]')"
mac="$(field 'd["nodes"][0]["macs"][0]')"
serial="$(field 'd["nodes"][0]["serial_log"]')"
image="$(field 'd["image"]["url"]')"
sha="$(field 'd["image"]["sha256"]')"

# A fresh start: the guest off, no node of that name (an earlier run's is deleted; a node that
# cannot be deleted in its state is named in the error).
virsh -c qemu:///system destroy "$name" >/dev/null 2>&1 || true
if rivet node show "$name" >/dev/null 2>&1; then
    rivet node maintenance "$name" set --reason "demo-lab: starting again" >/dev/null
    rivet node delete "$name" >/dev/null || {
        echo "demo-lab: cannot delete the node $name left by an earlier run; run: bash scripts/lab.sh down" >&2
        exit 1
    }
fi

start=$(date +%s)
phase_start=$start
phase() {
    local now
    now=$(date +%s)
    printf '   %-34s %4d s\n' "$1" "$((now - phase_start))" | tee -a "$summary"
    phase_start=$now
}
summary="$(mktemp)"
trap 'rm -f "$summary"' EXIT

if [ "$mode" = vmedia ]; then
    echo "== enroll $name: redfish BMC (sushy-tools), boot interface redfish-virtual-media"
    rivet node create --driver redfish --name "$name" --boot-interface redfish-virtual-media \
        --driver-info "redfish_address=$(field 'd["nodes"][0]["redfish"]["address"]')" \
        --driver-info "redfish_system_id=$(field 'd["nodes"][0]["redfish"]["system_id"]')" \
        --driver-info "redfish_username=$(field 'd["nodes"][0]["redfish"]["username"]')" \
        --driver-info "redfish_password=$(field 'd["nodes"][0]["redfish"]["password"]')" >/dev/null
else
    echo "== enroll $name: IPMI BMC (ipmi_sim), boot interface ipxe, port $mac"
    rivet node create --driver ipmi --name "$name" --boot-interface ipxe \
        --driver-info "ipmi_address=$(field 'd["nodes"][0]["ipmi"]["address"]')" \
        --driver-info "ipmi_port=$(field 'd["nodes"][0]["ipmi"]["port"]')" \
        --driver-info "ipmi_username=$(field 'd["nodes"][0]["ipmi"]["username"]')" \
        --driver-info "ipmi_password=$(field 'd["nodes"][0]["ipmi"]["password"]')" >/dev/null
    rivet port create --node "$name" --address "$mac" >/dev/null
fi
phase "enroll"

echo "== manage: rivetd reads the power state through the BMC"
rivet node manage "$name"
rivet node wait "$name" --state manageable
phase "manage"

if [ "$mode" = vmedia ]; then
    echo "== inspect: the BMC boots the ramdisk from rivetd's ISO; the agent reports the hardware"
    rivet node inspect "$name"
    rivet node wait "$name" --state manageable
    phase "inspect"
    rivet node show "$name" --fields properties
fi

echo "== provide: automated cleaning in the ramdisk"
rivet node provide "$name"
rivet node wait "$name" --state available
phase "provide (cleaning)"

echo "== deploy $image with a configdrive"
lines_before=$(wc -c < "$serial" 2>/dev/null || echo 0)
rivet node deploy "$name" --image "$image" --checksum "sha256:$sha" \
    --configdrive "{\"meta_data\": {\"hostname\": \"$name\"}}" --wait
phase "deploy"

echo "== the VM boots the image from its disk (serial console: $serial)"
deadline=$(( $(date +%s) + 300 ))
until tail -c "+$((lines_before + 1))" "$serial" 2>/dev/null | grep -a -o -m1 "rivet-lab-instance booted.*"; do
    if [ "$(date +%s)" -gt "$deadline" ]; then
        echo "demo-lab: the instance did not print its marker in 300 s; console tail:" >&2
        tail -n 20 "$serial" >&2
        exit 1
    fi
    sleep 1
done
phase "instance booted"

echo "== undeploy: the ramdisk cleans the disk again"
rivet node undeploy "$name" --wait
phase "undeploy (cleaning)"
rivet node show "$name" --fields provision_state,power_state,last_error

echo "== summary ($mode)"
cat "$summary"
printf '   %-34s %4d s\n' "whole life" "$(( $(date +%s) - start ))"
