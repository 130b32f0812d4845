#!/usr/bin/env bash
# Installs everything the build, the demo and the tests need, idempotently.
# Debian 12, run as root. Safe to run again: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: musl for the static agent, block-device tools for erase tests, python venv
# for the Ironic client compatibility test, file(1) to check static linking; the compressors
# and cryptsetup make the images tests/deploy_integrity.rs must refuse or decode; dosfstools
# and mtools build the EFI System Partitions of tests/uefi_boot.rs; OpenSSH's client logs in
# at the consoles' SSH front door in tests/console_ssh.rs.
APT_PACKAGES=(musl-tools python3-venv gdisk parted e2fsprogs xfsprogs lvm2 util-linux file iproute2 socat sqlite3 xorriso curl
  zstd lz4 xz-utils bzip2 cryptsetup-bin dosfstools mtools openssh-client)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Rust components the checks use.
if command -v rustup >/dev/null 2>&1; then
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup target list --installed 2>/dev/null | grep -q x86_64-unknown-linux-musl \
    || rustup target add x86_64-unknown-linux-musl \
    || echo "setup: musl target unavailable; the agent build falls back to static glibc"
fi

# cargo-fuzz for the fuzz targets (scripts/fuzz.sh); they build with nightly when the machine
# has it, else with stable and RUSTC_BOOTSTRAP=1 (no other toolchain is fetched).
CARGO_FUZZ_VERSION=0.13.2
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "setup: installing cargo-fuzz $CARGO_FUZZ_VERSION"
  cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION" --quiet
fi

# cargo-machete: test.sh fails on a dependency a crate lists but no longer uses.
CARGO_MACHETE_VERSION=0.9.1
if [ "$(cargo machete --version 2>/dev/null || true)" != "$CARGO_MACHETE_VERSION" ]; then
  echo "setup: installing cargo-machete $CARGO_MACHETE_VERSION"
  cargo install cargo-machete --locked --version "$CARGO_MACHETE_VERSION" --quiet
fi

# python-ironicclient and the checkers below in the venv .venv (a link into the machine's venv
# cache: scripts/venv-home.sh).
IRONICCLIENT_VERSION=6.3.0
PROMETHEUS_CLIENT_VERSION=0.26.0
OPENAPI_SPEC_VALIDATOR_VERSION=0.9.0
source scripts/venv-home.sh
VENV=$(venv_home .venv "python-ironicclient==$IRONICCLIENT_VERSION prometheus-client==$PROMETHEUS_CLIENT_VERSION openapi-spec-validator==$OPENAPI_SPEC_VALIDATOR_VERSION")
if [ ! -x "$VENV/bin/baremetal" ]; then
  echo "setup: creating .venv with python-ironicclient $IRONICCLIENT_VERSION"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "python-ironicclient==$IRONICCLIENT_VERSION"
fi
# prometheus_client's parsers check rivetd's /metrics exposition in tests/metrics.rs.
if ! grep -qx "Version: $PROMETHEUS_CLIENT_VERSION" <<<"$("$VENV/bin/pip" show prometheus-client 2>/dev/null || true)"; then
  echo "setup: installing prometheus-client $PROMETHEUS_CLIENT_VERSION into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "prometheus-client==$PROMETHEUS_CLIENT_VERSION"
fi
# openapi-spec-validator checks docs/openapi.json (OpenAPI 3.1) in tests/openapi.rs.
if ! grep -qx "Version: $OPENAPI_SPEC_VALIDATOR_VERSION" <<<"$("$VENV/bin/pip" show openapi-spec-validator 2>/dev/null || true)"; then
  echo "setup: installing openapi-spec-validator $OPENAPI_SPEC_VALIDATOR_VERSION into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "openapi-spec-validator==$OPENAPI_SPEC_VALIDATOR_VERSION"
fi
bash scripts/setup-qemu.sh >/dev/null
# chromium + chromedriver for the web UI's browser tests (tests/web_ui.rs).
bash scripts/setup-browser.sh
bash scripts/setup-peers.sh
# Ironic 39 from PyPI, the reference tests/ironic_diff.rs compares rivetd's API with.
bash scripts/setup-ironic.sh
bash scripts/setup-lab.sh
bash scripts/setup-postgres.sh >/dev/null
echo "setup: ok"
