#!/usr/bin/env bash
# Installs a real browser for the web UI's tests (tests/web_ui.rs): Debian's chromium and
# chromium-driver (chromedriver, the WebDriver the tests drive it through), headless.
# Idempotent: installs only what is missing. Debian 12, run as root.
set -euo pipefail
missing=()
for p in chromium chromium-driver; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup-browser: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v chromedriver >/dev/null || { echo "setup-browser: chromedriver missing after install" >&2; exit 1; }
