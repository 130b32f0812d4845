#!/usr/bin/env bash
# Installs what image-build and the QEMU end-to-end tests need, idempotently (Debian 12, root):
# QEMU (TCG is enough) and OVMF (UEFI firmware for the ISO test), busybox-static for the
# ramdisk's /init, socat for the guestfwd relay, xorriso + GRUB (BIOS and UEFI) + mtools for
# the ISO, cpio for inspection, mdadm for the ramdisk's software RAID (the binary only, unpacked
# from Debian's package to /usr/local/lib/rivet/mdadm/mdadm, not installed), and a Debian
# kernel package (not installed: downloaded with `apt-get download` into the kernel cache,
# where image-build and the tests find it).
#
#   scripts/setup-qemu.sh            # prints the cached kernel package's path last
#
# RIVET_KERNEL_CACHE overrides the cache directory (default: target/kernel-cache).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

log() { echo "setup-qemu: $*" >&2; }

APT_PACKAGES=(qemu-system-x86 qemu-utils zstd syslinux syslinux-common dosfstools ovmf busybox-static socat xorriso grub-pc-bin grub-efi-amd64-bin mtools cpio gdisk e2fsprogs util-linux
              shim-signed grub-efi-amd64-signed
              libudev1)   # mdadm's one library besides glibc: image-build copies it into the ramdisk
missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
updated=0
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    updated=1
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# A machine that came with a newer (backported) qemu-utils loses it when Debian's
# qemu-system-x86 is installed (the two versions conflict, apt removes qemu-utils): install
# the matching qemu-utils again, then make sure the tool is really there.
if ! qemu-img --version >/dev/null 2>&1; then
    log "qemu-img gone after installing qemu-system-x86: installing the matching qemu-utils"
    export DEBIAN_FRONTEND=noninteractive
    [ "$updated" = 1 ] || { apt-get update -qq; updated=1; }
    apt-get install -y -qq --no-install-recommends qemu-utils >/dev/null
fi
qemu-img --version >/dev/null 2>&1 || { log "FAIL: qemu-img missing after installing qemu-utils"; exit 1; }

# mdadm for the ramdisk (image-build ships it at /usr/sbin/mdadm with its loader and
# libraries, and looks here first). Debian's package is not installed: its postinst would
# start a monitor daemon and scan the host's disks. Only its binary is unpacked.
MDADM=/usr/local/lib/rivet/mdadm/mdadm
if ! "$MDADM" --version >/dev/null 2>&1; then
    log "unpacking mdadm from Debian's package into ${MDADM%/*} (not installed)"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    fetch_mdadm() { (cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root mdadm >&2); }
    if ! fetch_mdadm; then
        [ "$updated" = 0 ] || { log "FAIL: apt-get download mdadm"; exit 1; }
        apt-get update -qq
        updated=1
        fetch_mdadm
    fi
    dpkg-deb -x "$tmp"/mdadm_*.deb "$tmp/root"
    src="$tmp/root/sbin/mdadm"
    [ -f "$src" ] || src="$tmp/root/usr/sbin/mdadm"
    [ -f "$src" ] || { log "FAIL: no sbin/mdadm in $(ls "$tmp"/mdadm_*.deb)"; exit 1; }
    install -D -m 0755 "$src" "$MDADM.new"
    mv -f "$MDADM.new" "$MDADM"
    rm -rf "$tmp"
    trap - EXIT
    "$MDADM" --version >/dev/null 2>&1 || { log "FAIL: $MDADM --version does not run"; exit 1; }
fi
log "mdadm: $MDADM ($("$MDADM" --version 2>&1 | head -n 1))"

cache="${RIVET_KERNEL_CACHE:-$root/target/kernel-cache}"
mkdir -p "$cache"
newest() {
    apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64$' 2>/dev/null \
        | awk '{print $1}' | sort -V | tail -n 1
}
pkg="$(newest)"
if [ -z "$pkg" ] && [ "$updated" = 0 ]; then
    apt-get update -qq
    pkg="$(newest)"
fi
if [ -z "$pkg" ]; then
    # No package index: keep whatever is cached.
    have="$(ls "$cache"/linux-image-6.1.0-*-amd64_*.deb 2>/dev/null | sort -V | tail -n 1 || true)"
    if [ -n "$have" ]; then
        log "no linux-image package in the apt index; using cached $have"
        echo "$have"
        exit 0
    fi
    log "FAIL: no linux-image-6.1.0-*-amd64 package in the apt index"
    exit 1
fi
have="$(ls "$cache/${pkg}"_*.deb 2>/dev/null | head -n 1 || true)"
if [ -z "$have" ]; then
    log "downloading $pkg into $cache"
    (cd "$cache" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >&2)
    have="$(ls "$cache/${pkg}"_*.deb | head -n 1)"
fi
log "kernel package: $have"
echo "$have"
