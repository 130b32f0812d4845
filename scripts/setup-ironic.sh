#!/usr/bin/env bash
# Installs OpenStack Ironic 39.0.0 in the venv .venv-ironic, idempotently (Debian 12, as root),
# for tests/ironic_diff.rs (the differential test runs it as one process: API and conductor
# together, no auth, no message bus, SQLite, on a loopback port beside rivetd) and
# tests/ipa_ironic.rs (it drives rivet-agent's IPA mode). Safe to run again: when the pinned
# version is already there it does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

/usr/bin/python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || {
  echo "setup-ironic: installing python3-venv"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
}
# Ironic builds a deploy's configdrive ISO from its JSON form with openstacksdk, which runs
# genisoimage, mkisofs or xorrisofs (tests/ipa_ironic.rs deploys with one): xorriso has the
# last.
command -v xorrisofs >/dev/null 2>&1 || command -v genisoimage >/dev/null 2>&1 || {
  echo "setup-ironic: installing xorriso (configdrive ISOs)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends xorriso >/dev/null
}

IRONIC_VERSION=39.0.0
source scripts/venv-home.sh
VENV=$(venv_home .venv-ironic "ironic==$IRONIC_VERSION" /usr/bin/python3)
# The installed version, as `pip show` reports it (read without a pipe: grep -q closing it
# early would fail the check under pipefail).
installed=$("$VENV/bin/pip" show ironic 2>/dev/null || true)
if ! grep -qx "Version: $IRONIC_VERSION" <<<"$installed" \
   || [ ! -x "$VENV/bin/ironic" ] || [ ! -x "$VENV/bin/ironic-dbsync" ]; then
  echo "setup-ironic: creating .venv-ironic with ironic $IRONIC_VERSION"
  /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "ironic==$IRONIC_VERSION"
fi
# Keep the venv out of git without touching the top-level .gitignore.
[ -f "$VENV/.gitignore" ] || echo '*' > "$VENV/.gitignore"
echo "setup-ironic: ok"
