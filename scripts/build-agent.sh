#!/usr/bin/env bash
# Build the static rivet-agent for the ramdisk (profile `agent`: fat LTO, opt-level z,
# panic=abort, stripped). Idempotent; run as root on Debian (installs musl-tools if needed).
#
#   scripts/build-agent.sh            # prints the binary's path last on stdout
#
# musl is the default target. If the musl standard library cannot be installed (no rustup
# network), fall back to a static glibc build (+crt-static). Either way the result must be
# "statically linked" according to file(1), else the script fails.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
# The same build by hand and from the tests, whose environment (scripts/test.sh) lints the
# workspace through clippy-driver and unlocks libtest's timing flag.
unset RUSTC_BOOTSTRAP RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS

log() { echo "build-agent: $*" >&2; }

musl=x86_64-unknown-linux-musl
gnu=x86_64-unknown-linux-gnu
target=$musl
if ! rustup target list --installed 2>/dev/null | grep -qx "$musl"; then
    if ! rustup target add "$musl" >&2; then
        log "cannot add the $musl target; falling back to a static glibc build"
        target=$gnu
    fi
fi

if [ "$target" = "$musl" ]; then
    # ring (rustls' crypto) compiles C and assembly: it needs a musl C compiler.
    if ! command -v musl-gcc >/dev/null 2>&1; then
        log "installing musl-tools"
        if [ "$(id -u)" -ne 0 ]; then
            log "musl-gcc is missing and this is not root: apt-get install musl-tools"
            exit 1
        fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y musl-tools >&2 || {
            apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y musl-tools >&2
        }
    fi
    log "building for $target"
    CC_x86_64_unknown_linux_musl=musl-gcc \
        cargo build --profile agent -p rivet-agent --target "$target" >&2
else
    log "building for $target with +crt-static"
    RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
        cargo build --profile agent -p rivet-agent --target "$target" >&2
fi

bin="$target_dir/$target/agent/rivet-agent"
if [ ! -x "$bin" ]; then
    log "expected binary not found: $bin"
    exit 1
fi
info="$(file -L "$bin")"
log "$info"
case "$info" in
    *"statically linked"* | *"static-pie linked"*) ;;
    *)
        log "FAIL: $bin is not statically linked"
        exit 1
        ;;
esac
size=$(stat -c %s "$bin")
log "size: $size bytes ($(( (size + 1023) / 1024 )) KiB)"
echo "$bin"
