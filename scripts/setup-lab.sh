#!/usr/bin/env bash
# Installs what the virtual bare-metal lab (scripts/lab.sh) needs, idempotently (Debian 12, as
# root): libvirt + QEMU (TCG guests), dnsmasq and iPXE for PXE, OpenIPMI's ipmi_sim (the IPMI
# BMCs, with Serial-over-LAN) and, in the venv .venv-lab, sushy-tools (Redfish BMCs) on top of
# libvirt. (The venv still holds VirtualBMC, which lab.sh used before ipmi_sim; dropping it
# would rebuild every machine's venv for nothing.) Safe to run again: it installs only what is
# missing and takes about a second when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "setup-lab: $*" >&2; }

APT_PACKAGES=(libvirt-daemon-system libvirt-clients qemu-system-x86 qemu-utils ovmf python3-libvirt
              dnsmasq-base ipxe python3-venv ipmitool openipmi socat iproute2 curl
              shim-signed grub-efi-amd64-signed grub-efi-amd64-bin mtools dosfstools syslinux syslinux-common gdisk)
SUSHY_TOOLS_VERSION=2.2.0
VIRTUALBMC_VERSION=3.3.0
# Debian's python with its site packages (python3-libvirt): see install_venv.
source scripts/venv-home.sh
VENV=$(venv_home .venv-lab "sushy-tools==$SUSHY_TOOLS_VERSION virtualbmc==$VIRTUALBMC_VERSION system-site-packages" /usr/bin/python3)

# Without systemd as PID 1, the maintainer scripts of libvirt-daemon-system try to start
# services and fail the whole install. A policy-rc.d that answers 101 ("action forbidden")
# makes invoke-rc.d skip them; the lab starts its daemons itself. Remove it only if we made it.
policy_rc_d=/usr/sbin/policy-rc.d
made_policy=0
drop_policy() { if [ "$made_policy" = 1 ]; then rm -f "$policy_rc_d"; fi; }

apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    if [ ! -e "$policy_rc_d" ]; then
        made_policy=1
        trap drop_policy EXIT
        printf '#!/bin/sh\nexit 101\n' > "$policy_rc_d"
        chmod 755 "$policy_rc_d"
    fi
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

install_packages() {
    local missing=() p
    for p in "${APT_PACKAGES[@]}"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]}"
        # All in one transaction: qemu-system-x86 alone can remove a newer (backported)
        # qemu-utils that conflicts with it; naming qemu-utils too keeps a matching one.
        apt_install "${APT_PACKAGES[@]}"
    fi
    if ! qemu-img --version >/dev/null 2>&1; then
        log "qemu-img gone after installing qemu-system-x86: installing the matching qemu-utils"
        apt_install qemu-utils
    fi
    qemu-img --version >/dev/null 2>&1 || { log "FAIL: qemu-img missing after installing qemu-utils"; exit 1; }
}

venv_ok() {
    "$VENV/bin/python" - "$SUSHY_TOOLS_VERSION" "$VIRTUALBMC_VERSION" <<'EOF' >/dev/null 2>&1
import importlib.metadata as m, sys
import libvirt  # noqa: F401  (Debian's python3-libvirt, seen through --system-site-packages)
sys.exit(m.version("sushy-tools") != sys.argv[1] or m.version("virtualbmc") != sys.argv[2])
EOF
}

install_venv() {
    if venv_ok && [ -x "$VENV/bin/sushy-emulator" ] && [ -x "$VENV/bin/vbmcd" ]; then
        return
    fi
    log "creating .venv-lab with sushy-tools $SUSHY_TOOLS_VERSION and virtualbmc $VIRTUALBMC_VERSION"
    # Debian's python, with its site packages: the venv then sees python3-libvirt, and pip
    # never tries to build libvirt-python (which needs headers and fails). Another python3
    # first on PATH would not see it.
    /usr/bin/python3 -m venv --system-site-packages "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check \
        "sushy-tools==$SUSHY_TOOLS_VERSION" "virtualbmc==$VIRTUALBMC_VERSION"
    venv_ok || { log "FAIL: $VENV lacks sushy-tools/virtualbmc/libvirt after installing"; exit 1; }
}

install_packages
install_venv
# Keep the venv out of git without touching the top-level .gitignore.
[ -f "$VENV/.gitignore" ] || echo '*' > "$VENV/.gitignore"
echo "setup-lab: ok"
