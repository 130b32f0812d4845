#!/usr/bin/env bash
# IPA vs rivet-agent on this machine, same run, same stock Ironic (docs/numbers.md): agent
# and ramdisk size, inventory time and peak RSS, process start → first heartbeat recorded
# by Ironic 39, and a 2 GiB raw image written onto a loop device. Not part of CI.
#
#   sudo bash scripts/bench-ipa.sh [--only sizes,inventory,heartbeat,deploy] [--deploy-gib N] …
#
# IPA is ironic-python-agent from PyPI (pinned below) in .venv-ipa on the host: no IPA
# ramdisk is built here. The tools it shells out to come from Debian (lshw, parted, gdisk…);
# udevadm, which this host lacks, is taken out of Debian's udev package into
# .venv-ipa/sysroot/bin (not installed system-wide: no udevd is started). Idempotent; run
# as root (losetup). Only loopback traffic; every loop device is detached on the way out.
#
# How each number is taken, and what keeps IPA from touching this host: scripts/bench-ipa.py.
# The table is printed and written to target/bench/ipa-vs-rivet.md.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
log() { echo "bench-ipa: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
    log "run as root (losetup)"
    exit 1
fi

# The newest IPA release; its series matches Ironic 39 (OpenStack 2026.x).
IPA_VERSION=13.0.0
VENV=.venv-ipa

export DEBIAN_FRONTEND=noninteractive
need=()
command -v lshw >/dev/null || need+=(lshw)
[ -x /usr/bin/time ] || need+=(time)
command -v sgdisk >/dev/null || need+=(gdisk)
command -v parted >/dev/null || need+=(parted)
command -v partprobe >/dev/null || need+=(parted)
command -v hexdump >/dev/null || need+=(bsdextrautils)
command -v dmidecode >/dev/null || need+=(dmidecode)
command -v ipmitool >/dev/null || need+=(ipmitool)
command -v qemu-img >/dev/null || need+=(qemu-utils)
/usr/bin/python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
if [ "${#need[@]}" -gt 0 ]; then
    log "installing ${need[*]}"
    apt-get install -y -qq --no-install-recommends "${need[@]}" >&2 || {
        apt-get update -qq >&2
        apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
    }
fi

installed=$("$VENV/bin/pip" show ironic-python-agent 2>/dev/null || true)
if ! grep -qx "Version: $IPA_VERSION" <<<"$installed" || [ ! -x "$VENV/bin/ironic-python-agent" ]; then
    log "creating $VENV with ironic-python-agent $IPA_VERSION"
    rm -rf "$VENV"
    /usr/bin/python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "ironic-python-agent==$IPA_VERSION" >&2
fi
[ -f "$VENV/.gitignore" ] || echo '*' > "$VENV/.gitignore"

# udevadm: IPA runs `udevadm settle` before listing disks.
sysroot_bin="$root/$VENV/sysroot/bin"
mkdir -p "$sysroot_bin"
if command -v udevadm >/dev/null; then
    ln -sf "$(command -v udevadm)" "$sysroot_bin/udevadm"
elif [ ! -x "$sysroot_bin/udevadm" ]; then
    log "taking udevadm out of Debian's udev package (not installing it)"
    tmp="$(mktemp -d)"
    (cd "$tmp" && apt-get download udev >&2 2>/dev/null || { apt-get update -qq >&2 && apt-get download udev >&2; })
    dpkg-deb -x "$tmp"/udev_*.deb "$tmp/root"
    install -m 0755 "$tmp/root/bin/udevadm" "$sysroot_bin/udevadm"
    rm -rf "$tmp"
fi

bash scripts/setup-ironic.sh >&2

if ! agent="$(bash scripts/build-agent.sh)"; then
    agent="$root/target/x86_64-unknown-linux-musl/agent/rivet-agent"
    [ -x "$agent" ] || { log "scripts/build-agent.sh failed and there is no earlier build"; exit 1; }
    log "scripts/build-agent.sh failed: measuring the earlier build $agent"
fi

initramfs="$root/target/qemu-e2e/artefacts/rivet.initramfs"
if [ ! -f "$initramfs" ]; then
    log "no $initramfs: building the ramdisk with rivet-image-build"
    cargo run --release -p rivet-image-build -- --out "$root/target/bench/ipa-ramdisk" --no-iso >&2
    initramfs="$root/target/bench/ipa-ramdisk/rivet.initramfs"
fi

exec /usr/bin/python3 scripts/bench-ipa.py \
    --agent "$agent" \
    --initramfs "$initramfs" \
    --ipa-venv "$root/$VENV" \
    --ironic-venv "$root/.venv-ironic" \
    --sysroot-bin "$sysroot_bin" \
    --work "$root/target/bench/ipa-work" \
    --out "$root/target/bench/ipa-vs-rivet.md" \
    "$@"
