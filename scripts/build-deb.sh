#!/usr/bin/env bash
# Build the Debian package `rivet`: rivetd + rivet, the hardened systemd unit, the default
# configuration (a conffile), man pages and shell completions generated from the binaries'
# clap definitions, and the operator docs.
#
#   bash scripts/build-deb.sh                       # release build, package in target/deb/
#   bash scripts/build-deb.sh --bin-dir target/debug --out DIR --fast   # existing binaries (tests)
#
# Plain dpkg-deb rather than cargo-deb: the package is two binaries and a few files, and
# cargo-deb would be one more tool to build on every CI machine.
set -euo pipefail
cd "$(dirname "$0")/.."

bin_dir=""
out=target/deb
compress=(-Zxz)
while [ $# -gt 0 ]; do
  case "$1" in
    --bin-dir) bin_dir=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --fast) compress=(-Zgzip -z1); shift ;;   # tests: debug binaries are large
    *) echo "build-deb: unknown argument $1 (use --bin-dir DIR, --out DIR, --fast)" >&2; exit 2 ;;
  esac
done
if [ -z "$bin_dir" ]; then
  cargo build --release -p rivet-controller -p rivet-cli --bins
  bin_dir=target/release
fi
for b in rivetd rivet; do
  [ -x "$bin_dir/$b" ] || { echo "build-deb: $bin_dir/$b is missing; build it first" >&2; exit 1; }
done

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
arch=$(dpkg --print-architecture)
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT

install -D -m 0755 "$bin_dir/rivetd" "$root/usr/bin/rivetd"
install -D -m 0755 "$bin_dir/rivet" "$root/usr/bin/rivet"
install -D -m 0644 packaging/rivetd.service "$root/lib/systemd/system/rivetd.service"
install -D -m 0644 packaging/rivetd.toml "$root/etc/rivet/rivetd.toml"

mkdir -p "$root/usr/share/man/man1"
"$bin_dir/rivetd" man "$root/usr/share/man/man1"
"$bin_dir/rivet" man "$root/usr/share/man/man1"
gzip -9n "$root"/usr/share/man/man1/*.1

mkdir -p "$root/usr/share/bash-completion/completions" \
  "$root/usr/share/zsh/vendor-completions" "$root/usr/share/fish/vendor_completions.d"
for b in rivetd rivet; do
  "$bin_dir/$b" completion bash > "$root/usr/share/bash-completion/completions/$b"
  "$bin_dir/$b" completion zsh > "$root/usr/share/zsh/vendor-completions/_$b"
  "$bin_dir/$b" completion fish > "$root/usr/share/fish/vendor_completions.d/$b.fish"
done

doc="$root/usr/share/doc/rivet"
install -D -m 0644 README.md "$doc/README.md"
install -m 0644 docs/operations.md docs/architecture.md docs/boot.md docs/api-versions.md "$doc/"

mkdir -p "$root/DEBIAN"
echo /etc/rivet/rivetd.toml > "$root/DEBIAN/conffiles"
cat > "$root/DEBIAN/control" <<CONTROL
Package: rivet
Version: $version
Architecture: $arch
Maintainer: Rivet developers <rivet@localhost>
Section: admin
Priority: optional
Depends: libc6
Recommends: ipmitool, dnsmasq-base
Installed-Size: $(du -sk "$root" | cut -f1)
Description: Rivet bare-metal provisioning controller and CLI
 rivetd provisions and cleans bare-metal servers with OpenStack Ironic's
 state machine and API; rivet is its admin command line. The rivetd
 service is installed but not enabled: add an admin token to
 /etc/rivet/rivetd.toml, then systemctl enable --now rivetd.
CONTROL
# Only tell a running systemd about the new unit. Under `dpkg --root` (DPKG_ROOT set, as the
# package test installs it into a scratch root) there is nothing to tell.
cat > "$root/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload || true
fi
POSTINST
cp "$root/DEBIAN/postinst" "$root/DEBIAN/postrm"
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/postrm"

mkdir -p "$out"
deb="$out/rivet_${version}_${arch}.deb"
dpkg-deb --root-owner-group "${compress[@]}" --build "$root" "$deb" >/dev/null
echo "$deb"
