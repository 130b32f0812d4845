#!/usr/bin/env bash
# Installs the BMC peers the driver tests run against, idempotently (Debian 12, as root):
# OpenIPMI's ipmi_sim and ipmitool from apt, and sushy-tools (the Redfish emulator) in the
# venv .venv-sushy. Safe to run again: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v ipmi_sim >/dev/null 2>&1 || missing+=(openipmi)
command -v ipmitool >/dev/null 2>&1 || missing+=(ipmitool)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup-peers: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

source scripts/venv-home.sh
SUSHY_TOOLS_VERSION=2.2.0
VENV=$(venv_home .venv-sushy "sushy-tools==$SUSHY_TOOLS_VERSION")
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('sushy-tools') != '$SUSHY_TOOLS_VERSION')" >/dev/null 2>&1 \
   || [ ! -x "$VENV/bin/sushy-emulator" ]; then
  echo "setup-peers: creating .venv-sushy with sushy-tools $SUSHY_TOOLS_VERSION"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "sushy-tools==$SUSHY_TOOLS_VERSION"
fi
# Keep the venv out of git without touching the top-level .gitignore.
[ -f "$VENV/.gitignore" ] || echo '*' > "$VENV/.gitignore"
echo "setup-peers: ok"
