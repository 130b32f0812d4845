#!/usr/bin/env bash
# A virtual bare-metal lab on this machine: libvirt guests (TCG) that PXE-boot or boot
# virtual media like real servers, with Redfish (sushy-emulator) and IPMI (OpenIPMI's ipmi_sim,
# Serial-over-LAN included) BMCs, DHCP/TFTP (dnsmasq) on a private bridge, and, unless
# --no-rivetd, a rivetd for them.
#
#   scripts/lab.sh image [--force]          # build the ramdisk and the test image
#   scripts/lab.sh up [--nodes N] [--firmware F[,F...]] [--secure-boot] [--no-rivetd]
#   scripts/lab.sh status                   # exit 0 when everything is up
#   scripts/lab.sh down                     # remove everything `up` made
#
# Topology. Guests sit on the bridge rvbr0, which has no address in the root namespace; its
# only other port is a veth whose peer lives in the network namespace rvlab as 192.168.240.1.
# Everything the guests talk to listens there: dnsmasq (DHCP, TFTP), a static file server
# (:8080, the instance image) and a socat that forwards :6385 over a Unix socket to rivetd
# on the host's 127.0.0.1:16385 (Unix sockets cross namespaces; TCP does not). The BMCs,
# libvirt and rivetd stay on the host's loopback, so no traffic leaves the machine.
#
# Firmware (--firmware, per guest, comma-separated, the last one repeating; default uefi):
#   uefi         q35 + OVMF (Secure Boot capable code, NVRAM without keys: Secure Boot off)
#   secure-boot  q35 + OVMF with Microsoft's keys enrolled: Secure Boot enforcing
#   bios         pc + SeaBIOS
# --secure-boot turns every uefi guest into secure-boot. Each guest has its own NVRAM file
# (target/lab/nvram/), as a server has its own; sushy-tools switches boot mode and Secure Boot
# the way an operator would, through Redfish (BootSourceOverrideMode, SecureBoot).
#
# Everything lives in target/lab/: artefacts, disks, logs, generated configs, and run/, which
# records what `up` started or created so that `down` removes exactly that. Run as root
# (Debian 12; scripts/setup-lab.sh installs the tools). Each booting TCG guest keeps a core
# busy; an idle lab uses almost no CPU.
set -euo pipefail
# scripts/test-runner.sh gives test processes RUSTC_BOOTSTRAP=1 (for libtest's per-test times)
# and the lab is started from a test: cargo would take it for a new build configuration and
# rebuild every dependency (build scripts watch it) — twice, since the next cargo call
# without it rebuilds them back.
unset RUSTC_BOOTSTRAP

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LAB="$ROOT/target/lab"
RUN="$LAB/run"
VENV="$ROOT/.venv-lab"

BRIDGE=rvbr0
NETNS=rvlab
VETH_HOST=rvlab-br          # root-namespace end, a port of the bridge (no address)
VETH_NS=rvlab0              # namespace end, 192.168.240.1
TAP_PREFIX=rvlab-t          # guest N's NIC: tap rvlab-tN, a port of the bridge
NS_IP=192.168.240.1
NS_IP6=fd52:6c:ab::1        # only for router advertisements (see dnsmasq_up)
DHCP_FIRST=192.168.240.100
DHCP_LAST=192.168.240.200
API_PORT=6385               # rivetd as guests reach it (the forwarder in the namespace)
RIVETD_PORT=16385           # rivetd on the host's loopback
FILE_PORT=8080              # the instance-image server in the namespace
SUSHY_PORT=8101
IPMI_FIRST_PORT=6231        # guest N's IPMI BMC (ipmi_sim) on UDP 127.0.0.1:6231+N
SERIAL_FIRST_PORT=6331      # guest N's serial port: QEMU listens on TCP 127.0.0.1:6331+N; its BMC's SOL connects
MAC_PREFIX=52:54:00:6c:ab
DISK_BYTES=$((8 * 1024 * 1024 * 1024))   # sparse; IPA's root-disk floor is 4 GiB
# OVMF (Debian ovmf). The Secure Boot capable code serves every UEFI guest (it needs SMM, so
# q35); the NVRAM template decides whether Secure Boot is on.
OVMF_CODE=/usr/share/OVMF/OVMF_CODE_4M.secboot.fd
OVMF_VARS=/usr/share/OVMF/OVMF_VARS_4M.fd
OVMF_VARS_SB=/usr/share/OVMF/OVMF_VARS_4M.ms.fd
# SeaBIOS for Legacy: libvirt wants a loader path once sushy-tools makes the loader a ROM.
SEABIOS=/usr/share/seabios/bios-256k.bin
FIRMWARE=""                 # --firmware; empty = what each guest had, else uefi
DOMAIN_PREFIX=rivet-lab-
DOMAIN_TAG="rivet-lab: defined by scripts/lab.sh"   # libvirt <description>: marks our guests
BMC_USER=admin

API_URL="http://127.0.0.1:$RIVETD_PORT"
PUBLIC_URL="http://$NS_IP:$API_PORT"
IMAGE_URL="http://$NS_IP:$FILE_PORT/testimage.raw"

export LIBVIRT_DEFAULT_URI=qemu:///system
# Only to stop the VirtualBMC an older lab.sh started (legacy_vbmcd_down).
export VIRTUALBMC_CONFIG="$LAB/vbmc.conf"

log() { echo "lab: $*" >&2; }
die() { echo "lab: FAIL: $*" >&2; exit 1; }
virsh_q() { virsh -q "$@"; }
# `cmd | grep -q` under pipefail fails when grep exits before cmd has written everything
# (SIGPIPE); this reads all of its input.
matches() { grep -E "$1" >/dev/null; }

# ---------------------------------------------------------------------------------------
# Processes we start: NAME.pid in run/. A pid counts as ours only while its command line
# still names the lab directory (vbmcd: its environment names the lab's VirtualBMC config):
# a stale pid file never makes us signal a stranger.

pidfile() { echo "$RUN/$1.pid"; }

# Prints the pid of NAME if it runs, else fails.
alive() {
    local f pid src=cmdline want="$LAB" text
    f="$(pidfile "$1")"
    [ -s "$f" ] || return 1
    pid="$(head -n 1 "$f")"
    [[ "$pid" =~ ^[0-9]+$ ]] && [ "$pid" -gt 1 ] || return 1
    if [ "$1" = vbmcd ]; then src=environ; want="VIRTUALBMC_CONFIG=$VIRTUALBMC_CONFIG"; fi
    text="$(tr '\0' '\n' 2>/dev/null < "/proc/$pid/$src")" || return 1
    [[ "$text" == *"$want"* ]] || return 1
    echo "$pid"
}

# start_bg NAME LOGFILE CMD...: run CMD detached (own session, so that a Ctrl-C in the
# caller's terminal does not reach it) and record its pid. setsid does not fork here: a
# background job of a non-interactive shell is not a process-group leader.
start_bg() {
    local name="$1" logf="$2"
    shift 2
    setsid "$@" >>"$logf" 2>&1 </dev/null &
    echo $! > "$(pidfile "$name")"
    touch "$RUN/$name.group"
}

# Not gone and not a zombie: our detached processes are reparented to PID 1, which may reap
# them only a while after they exit.
running() {
    local state
    state="$(awk '/^State:/ {print $2}' "/proc/$1/status" 2>/dev/null)" || return 1
    [ -n "$state" ] && [ "$state" != Z ]
}

# Some live (non-zombie) process is called exactly NAME.
any_running() {
    local p
    for p in $(pgrep -x "$1"); do
        if running "$p"; then return 0; fi
    done
    return 1
}

stop_proc() {
    local name="$1" pid i target
    if pid="$(alive "$name")"; then
        # What start_bg started leads its own process group: signal the group, so that
        # socat's forks go too.
        target="$pid"
        if [ -f "$RUN/$name.group" ] && [ "$(ps -o pgid= -p "$pid" | tr -d ' ')" = "$pid" ]; then
            target="-$pid"
        fi
        kill -TERM -- "$target" 2>/dev/null || true
        for i in $(seq 50); do
            running "$pid" || break
            sleep 0.1
        done
        if running "$pid"; then
            log "$name ($pid) ignored SIGTERM; killing it"
            kill -KILL -- "$target" 2>/dev/null || true
        fi
        log "stopped $name ($pid)"
    fi
    rm -f "$(pidfile "$name")" "$RUN/$name.group"
}

# wait_for PROC SECONDS CMD...: poll CMD until it succeeds. PROC ("-": none) is the process
# that should make CMD succeed: if it dies, give up at once; and a success only counts while
# it runs (a stranger on the same port must not pass for it).
wait_for() {
    local proc="$1" secs="$2" i
    shift 2
    for i in $(seq $((secs * 5))); do
        if [ "$proc" != - ] && ! alive "$proc" >/dev/null; then return 1; fi
        if "$@" >/dev/null 2>&1; then
            if [ "$proc" = - ] || alive "$proc" >/dev/null; then return 0; fi
            return 1
        fi
        sleep 0.2
    done
    return 1
}

password() { cat "$LAB/password"; }

# ---------------------------------------------------------------------------------------
# image: the ramdisk (rivetd serves it for PXE and virtual media) and the test image.

kernel_package() {
    local deb
    deb="$(ls "$ROOT"/target/kernel-cache/linux-image-*.deb 2>/dev/null | sort -V | tail -n 1 || true)"
    if [ -z "$deb" ]; then
        log "no kernel package cached: running scripts/setup-qemu.sh"
        deb="$(bash "$ROOT/scripts/setup-qemu.sh" | tail -n 1)"
    fi
    [ -f "$deb" ] || die "no linux-image-*.deb in target/kernel-cache (scripts/setup-qemu.sh)"
    # Extracted once next to the .deb, as the QEMU tests do (tests/qemu.rs, the same lock):
    # dpkg-deb's xz decompression of the whole package is ~85 s of CPU, and image-build given
    # the .deb itself would pay it again for the ramdisk and for each of the three test images.
    if [ ! -d "$deb.d/boot" ]; then
        (
            flock 9
            if [ ! -d "$deb.d/boot" ]; then
                log "extracting $(basename "$deb") once into $deb.d"
                local tmp="$deb.$$.tmp"
                rm -rf "$tmp" && mkdir -p "$tmp"
                dpkg-deb -x "$deb" "$tmp" || { rm -rf "$tmp"; die "dpkg-deb -x $deb failed"; }
                mv -T "$tmp" "$deb.d"
            fi
        ) 9>"$deb.lock"
        [ -d "$deb.d/boot" ] || die "extracting $deb into $deb.d failed"
    fi
    echo "$deb.d"
}

# stale OUTPUT... -- INPUT...: true when an output is missing or older than an input file
# (inputs may be directories: their *.rs and Cargo.toml files count).
stale() {
    local outs=() oldest="" o
    while [ "$1" != "--" ]; do outs+=("$1"); shift; done
    shift
    for o in "${outs[@]}"; do
        [ -f "$o" ] || return 0
        if [ -z "$oldest" ] || [ "$o" -ot "$oldest" ]; then oldest="$o"; fi
    done
    [ -n "$(find "$@" \( -name '*.rs' -o -name Cargo.toml -o -name '*.deb' -o -name '*.sh' \) \
        -newer "$oldest" -print -quit 2>/dev/null)" ]
}

cmd_image() {
    local force=0
    while [ $# -gt 0 ]; do
        case "$1" in
            --force) force=1 ;;
            *) die "image: unknown argument $1" ;;
        esac
        shift
    done
    mkdir -p "$LAB/ramdisk" "$LAB/www"
    local kp deb
    kp="$(kernel_package)"
    deb="${kp%.d}"
    cd "$ROOT"
    local rd="$LAB/ramdisk"
    if [ "$force" = 1 ] || stale "$rd/vmlinuz" "$rd/rivet.initramfs" "$rd/rivet.iso" -- \
        "$deb" agent protocol hardware-managers image-build Cargo.lock scripts/build-agent.sh; then
        log "building the ramdisk into $rd"
        cargo run -q -p rivet-image-build -- --out "$rd" --controller "$PUBLIC_URL" \
            --kernel-package "$kp" >&2
    else
        log "ramdisk up to date in $rd"
    fi
    # testimage.raw: UEFI loader only at \EFI\rivet\ (it boots on a UEFI guest only through
    # the boot entry the agent writes); testimage-removable.raw: also \EFI\BOOT\BOOTX64.EFI,
    # as cloud images have (OVMF drops boot entries QEMU's boot order does not name, e.g.
    # after a network boot into a rescue ramdisk: then only the removable path boots);
    # testimage-signed.raw: Debian's signed shim + GRUB + kernel, for Secure Boot guests. All
    # boot BIOS guests through syslinux.
    local img layout
    for layout in vendor removable signed; do
        img="$LAB/www/testimage.raw"
        [ "$layout" = vendor ] || img="$LAB/www/testimage-$layout.raw"
        if [ "$force" = 1 ] || stale "$img" "$img.sha256" -- "$deb" image-build; then
            log "building the test image $img ($layout UEFI loader)"
            cargo run -q -p rivet-image-build -- --test-image "$img" --test-image-efi "$layout" \
                --kernel-package "$kp" >&2
            sha256sum "$img" | cut -d' ' -f1 > "$img.sha256.tmp"
            mv "$img.sha256.tmp" "$img.sha256"
        else
            log "test image up to date: $img"
        fi
    done
}

# ---------------------------------------------------------------------------------------
# libvirt without systemd.

virsh_ok() { timeout 10 virsh -q list >/dev/null 2>&1; }

# Settings libvirt needs here: no systemd/cgroup v2 to place guests, no security labels, and
# QEMU as root so it can open files under target/.
QEMU_CONF_SETTINGS='security_driver = "none"
user = "root"
group = "root"
cgroup_controllers = [ ]
remember_owner = 0'

patch_qemu_conf() {
    local conf=/etc/libvirt/qemu.conf keys
    # Keep the original once: a second `up` must not save our own edit as "the original".
    [ -f "$RUN/qemu.conf.orig" ] || cp -p "$conf" "$RUN/qemu.conf.orig"
    keys='security_driver|user|group|cgroup_controllers|remember_owner'
    {
        sed -E "s/^([[:space:]]*($keys)[[:space:]]*=)/# (scripts\/lab.sh) \1/" "$RUN/qemu.conf.orig"
        echo "# --- added by scripts/lab.sh (restored by lab.sh down) ---"
        echo "$QEMU_CONF_SETTINGS"
    } > "$conf.lab.tmp"
    chmod --reference="$RUN/qemu.conf.orig" "$conf.lab.tmp"
    mv "$conf.lab.tmp" "$conf"
}

libvirt_up() {
    if virsh_ok; then
        if alive libvirtd >/dev/null; then log "libvirtd: ours, running"
        else log "libvirtd: already running (not ours): reusing it, down leaves it alone"; fi
        return 0
    fi
    if any_running libvirtd; then
        die "a libvirtd runs but 'virsh -c qemu:///system list' does not answer; stop it or fix it first"
    fi
    log "starting virtlogd and libvirtd"
    patch_qemu_conf
    # libvirtd leaves its runtime tree in /run/libvirt; remove it on down if it is ours.
    [ -d /run/libvirt ] || touch "$RUN/run-libvirt.created"
    mkdir -p /run/libvirt /var/log/libvirt/qemu
    # libvirt's network driver autostarts networks (the `default` one puts an address and NAT
    # on the host) unless this marker says autostart already happened in this boot. Leave the
    # networks untouched; only stop the daemon from starting them.
    mkdir -p /run/libvirt/network
    if [ ! -e /run/libvirt/network/autostarted ]; then
        touch /run/libvirt/network/autostarted
        touch "$RUN/network-autostarted.created"
    fi
    if ! alive virtlogd >/dev/null; then
        LIBVIRT_LOG_OUTPUTS="3:file:$LAB/virtlogd.log" virtlogd -d -p "$(pidfile virtlogd)" \
            || die "virtlogd did not start (see $LAB/virtlogd.log)"
    fi
    LIBVIRT_LOG_OUTPUTS="3:file:$LAB/libvirtd.log" libvirtd -d -p "$(pidfile libvirtd)" \
        || die "libvirtd did not start (see $LAB/libvirtd.log)"
    wait_for libvirtd 30 virsh_ok || die "libvirtd started but 'virsh list' does not answer (see $LAB/libvirtd.log)"
}

pool_running() { virsh_q pool-info default 2>/dev/null | matches '^State:[[:space:]]+running'; }
netns_exists() { ip netns list 2>/dev/null | matches "^$NETNS( |\$)"; }

# sushy-tools' InsertMedia uploads the ISO into the pool named `default`.
pool_up() {
    local target
    # (no pool yet: virsh fails, and under pipefail the assignment would end the script)
    target="$( (virsh_q pool-dumpxml default 2>/dev/null || true) | sed -n '/<path>/{s:.*<path>\(.*\)</path>.*:\1:p;q;}')"
    if [ -n "$target" ] && [ ! -d "$target" ]; then
        # A pool left by a lab whose checkout is gone: it cannot start; make ours.
        log "the storage pool 'default' points at $target, which is gone: redefining it"
        virsh_q pool-destroy default >/dev/null 2>&1 || true
        virsh_q pool-undefine default >/dev/null 2>&1 || die "cannot undefine the stale pool 'default'"
    fi
    if virsh_q pool-info default >/dev/null 2>&1; then
        if ! pool_running; then
            log "starting the inactive storage pool 'default'"
            virsh_q pool-start default >/dev/null || die "cannot start the storage pool 'default'"
        fi
        return 0
    fi
    log "creating the storage pool 'default' in $LAB/pool"
    mkdir -p "$LAB/pool"
    virsh_q pool-define-as default dir --target "$LAB/pool" >/dev/null || die "pool-define-as default failed"
    touch "$RUN/pool.created"
    virsh_q pool-start default >/dev/null || die "cannot start the storage pool 'default'"
}

# ---------------------------------------------------------------------------------------
# The network: bridge, namespace, veth.

no_ipv6() { echo 1 > "/proc/sys/net/ipv6/conf/$1/disable_ipv6" 2>/dev/null || true; }
in_ns() { ip netns exec "$NETNS" "$@"; }

network_up() {
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge stp_state 0 forward_delay 0
    fi
    # Disabled before the link comes up: no link-local address ever appears in the root
    # namespace.
    no_ipv6 "$BRIDGE"
    ip link set "$BRIDGE" up
    netns_exists || ip netns add "$NETNS"
    if ! ip link show "$VETH_HOST" >/dev/null 2>&1; then
        ip link add "$VETH_HOST" type veth peer name "$VETH_NS" netns "$NETNS"
    fi
    no_ipv6 "$VETH_HOST"
    ip link set "$VETH_HOST" master "$BRIDGE"
    ip link set "$VETH_HOST" up
    in_ns ip link set lo up
    in_ns ip addr show dev "$VETH_NS" | matches "inet $NS_IP/" \
        || in_ns ip addr add "$NS_IP/24" dev "$VETH_NS"
    in_ns ip addr show dev "$VETH_NS" | matches "inet6 $NS_IP6/" \
        || in_ns ip addr add "$NS_IP6/64" dev "$VETH_NS" nodad
    in_ns ip link set "$VETH_NS" up
    # With br_netfilter loaded, bridged frames go through the host's iptables FORWARD chain.
    if [ "$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || echo 0)" = 1 ] \
        && iptables -S FORWARD 2>/dev/null | matches '^-P FORWARD DROP'; then
        log "warning: bridge-nf-call-iptables=1 and iptables FORWARD policy DROP: guests' DHCP may be dropped"
    fi
}

# ---------------------------------------------------------------------------------------
# DHCP + TFTP in the namespace.

dnsmasq_up() {
    mkdir -p "$LAB/tftp"
    cp -u /usr/lib/ipxe/undionly.kpxe "$LAB/tftp/undionly.kpxe"
    cp -u /usr/lib/ipxe/ipxe.efi "$LAB/tftp/ipxe.efi"
    # iPXE expands ${...} in scripts, not in a DHCP file name: hand iPXE a script that chains
    # to rivetd with the booting NIC's MAC. If rivetd has nothing for it, fall through to the
    # next boot device after a pause.
    cat > "$LAB/tftp/boot.ipxe" <<EOF
#!ipxe
echo rivet-lab: chaining to $PUBLIC_URL for \${net0/mac}
chain $PUBLIC_URL/boot/ipxe?mac=\${net0/mac} || goto failed
:failed
echo rivet-lab: no boot script from rivetd; next boot device in 10 s
sleep 10
exit 1
EOF
    cat > "$LAB/dnsmasq.conf" <<EOF
# Generated by scripts/lab.sh: DHCP and TFTP for the lab's guests, inside netns $NETNS.
port=0
interface=$VETH_NS
bind-interfaces
dhcp-range=$DHCP_FIRST,$DHCP_LAST,255.255.255.0,1h
dhcp-authoritative
dhcp-leasefile=$LAB/dnsmasq.leases
# No default route and no DNS server: there is nothing beyond $NS_IP.
dhcp-option=option:router
dhcp-option=option:dns-server
# Router advertisements (SLAAC only, router lifetime 0: not a default router). iPXE waits
# for IPv6 autoconfiguration as well as DHCP before it boots; without an RA it waits ~13 s.
enable-ra
dhcp-range=${NS_IP6%1},ra-only,64
ra-param=$VETH_NS,60,0
dhcp-userclass=set:ipxe,iPXE
# UEFI firmware (client architecture 7 or 9: x86-64) gets EFI iPXE; BIOS gets undionly.
dhcp-match=set:efi64,option:client-arch,7
dhcp-match=set:efi64,option:client-arch,9
dhcp-boot=tag:ipxe,boot.ipxe,,$NS_IP
dhcp-boot=tag:!ipxe,tag:efi64,ipxe.efi,,$NS_IP
dhcp-boot=tag:!ipxe,tag:!efi64,undionly.kpxe,,$NS_IP
enable-tftp
tftp-root=$LAB/tftp
# dnsmasq would drop to 'nobody' after start-up, and nobody cannot read a checkout in a home
# directory of mode 0700 (/root): TFTP then fails with "TFTP directory inaccessible". It keeps
# root here, where it reads only the lab's files and answers only inside the lab's namespace.
user=root
pid-file=$(pidfile dnsmasq)
log-facility=$LAB/dnsmasq.log
log-dhcp
no-hosts
no-resolv
EOF
    if alive dnsmasq >/dev/null; then
        # Pick up a changed config (SIGHUP does not re-read dhcp-range and friends).
        if ! cmp -s "$LAB/dnsmasq.conf" "$RUN/dnsmasq.conf.running"; then stop_proc dnsmasq; else return 0; fi
    fi
    in_ns dnsmasq --conf-file="$LAB/dnsmasq.conf" || die "dnsmasq did not start (see $LAB/dnsmasq.log)"
    cp "$LAB/dnsmasq.conf" "$RUN/dnsmasq.conf.running"
    wait_for - 5 alive dnsmasq || die "dnsmasq exited (see $LAB/dnsmasq.log)"
}

# ---------------------------------------------------------------------------------------
# Forwarder (guests → rivetd) and the instance-image server.

SOCK="$RUN/rivetd.sock"

forwarder_up() {
    [ ${#SOCK} -lt 100 ] || die "socket path $SOCK is too long for a Unix socket; move the repo to a shorter path"
    if ! alive socat-host >/dev/null; then
        start_bg socat-host "$LAB/socat.log" \
            socat "UNIX-LISTEN:$SOCK,fork,unlink-early,mode=600" "TCP:127.0.0.1:$RIVETD_PORT"
    fi
    if ! alive socat-ns >/dev/null; then
        start_bg socat-ns "$LAB/socat.log" ip netns exec "$NETNS" \
            socat "TCP-LISTEN:$API_PORT,bind=$NS_IP,fork,reuseaddr" "UNIX-CONNECT:$SOCK"
    fi
    wait_for socat-host 5 test -S "$SOCK" || die "socat did not create $SOCK (see $LAB/socat.log)"
    wait_for socat-ns 5 in_ns bash -c "exec 3<>/dev/tcp/$NS_IP/$API_PORT" \
        || die "nothing listens on $NS_IP:$API_PORT in $NETNS (see $LAB/socat.log)"
}

fileserver_up() {
    if ! alive fileserver >/dev/null; then
        start_bg fileserver "$LAB/fileserver.log" ip netns exec "$NETNS" \
            /usr/bin/python3 -m http.server "$FILE_PORT" --bind "$NS_IP" --directory "$LAB/www"
    fi
    wait_for fileserver 10 in_ns curl -sfI "$IMAGE_URL" \
        || die "$IMAGE_URL does not answer in $NETNS (see $LAB/fileserver.log)"
}

# ---------------------------------------------------------------------------------------
# Guests.

domain_name() { echo "$DOMAIN_PREFIX$1"; }
tap_name() { echo "$TAP_PREFIX$1"; }
domain_mac() { printf '%s:%02x\n' "$MAC_PREFIX" "$1"; }
serial_log() { echo "$LAB/serial/$(domain_name "$1").log"; }
# The serial port is also a TCP port QEMU listens on (what the guest prints still goes to the
# log). It takes one client, the guest's BMC: ipmi_sim connects to it as its SOL device
# (bmcs_up), so typing into the guest goes through Serial-over-LAN, as on a server. TCP
# rather than a Unix socket because ipmi_sim's SOL device is a tty or tcp:/telnet: only.
serial_port() { echo $((SERIAL_FIRST_PORT + $1)); }

# Ours: the description we put there. Anything else with our name is left alone.
is_lab_domain() { [ "$(virsh_q desc "$1" 2>/dev/null)" = "$DOMAIN_TAG" ]; }

lab_domains() {
    virsh_q list --all --name 2>/dev/null | grep "^$DOMAIN_PREFIX" | while read -r d; do
        if is_lab_domain "$d"; then echo "$d"; fi
    done
}

# The firmware guest I asks for: --firmware's Ith entry (the last one repeats), else what
# the guest was defined with, else uefi.
firmware_of() {
    local i="$1" list
    if [ -n "$FIRMWARE" ]; then
        IFS=, read -ra list <<< "$FIRMWARE"
        if [ "$i" -lt "${#list[@]}" ]; then echo "${list[$i]}"; else echo "${list[-1]}"; fi
    elif [ -s "$RUN/$(domain_name "$i").firmware" ]; then
        cat "$RUN/$(domain_name "$i").firmware"
    else
        echo uefi
    fi
}

# The <os> element and machine features for a firmware.
os_xml() {
    local fw="$1" name="$2"
    case "$fw" in
        # The SeaBIOS loader named, as sushy-tools writes it for Legacy: without a loader
        # element sushy-tools reports no boot mode at all, and rivetd would take its
        # default (uefi) for the machine's.
        bios) cat <<EOF
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <loader readonly='yes' type='rom'>$SEABIOS</loader>
    <boot dev='hd'/>
    <boot dev='network'/>
    <bios useserial='yes' rebootTimeout='10000'/>
  </os>
  <features><acpi/><apic/></features>
EOF
        ;;
        uefi|secure-boot)
            # sushy-tools names NVRAM files NAME.secboot.fd / NAME.nosecboot.fd when it toggles
            # Secure Boot (a fresh copy of the template): start with the same convention.
            local secure=no vars="$OVMF_VARS" nv="$LAB/nvram/$name.nosecboot.fd"
            if [ "$fw" = secure-boot ]; then secure=yes vars="$OVMF_VARS_SB" nv="$LAB/nvram/$name.secboot.fd"; fi
            cat <<EOF
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <loader readonly='yes' secure='$secure' type='pflash'>$OVMF_CODE</loader>
    <nvram template='$vars'>$nv</nvram>
    <boot dev='hd'/>
    <boot dev='network'/>
  </os>
  <features><acpi/><apic/><smm state='on'/></features>
EOF
        ;;
        *) die "unknown firmware $fw (uefi, secure-boot or bios)" ;;
    esac
}

# The firmware a defined guest has now, from its libvirt definition: pflash is OVMF (secure
# loader: Secure Boot), anything else SeaBIOS.
domain_firmware() {
    local xml
    xml="$(virsh_q dumpxml --inactive "$1" 2>/dev/null || true)"
    if [[ "$xml" == *"type='pflash'"* ]]; then
        if [[ "$xml" == *"secure='yes'"* ]]; then echo secure-boot; else echo uefi; fi
    else
        echo bios
    fi
}

domain_xml() {
    local i="$1" name disk fw cdrom
    name="$(domain_name "$i")"
    disk="$LAB/disks/$name.raw"
    fw="$(firmware_of "$i")"
    # q35 has no IDE: the CD drive sits on SATA there.
    if [ "$fw" = bios ]; then cdrom="<target dev='hdc' bus='ide'/>"; else cdrom="<target dev='sdc' bus='sata'/>"; fi
    cat <<EOF
<domain type='qemu'>
  <name>$name</name>
  <description>$DOMAIN_TAG</description>
  <memory unit='MiB'>512</memory>
  <vcpu>1</vcpu>
$(os_xml "$fw" "$name")
  <clock offset='utc'/>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw'/>
      <source file='$disk'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <disk type='file' device='cdrom'>
      <driver name='qemu' type='raw'/>
      $cdrom
      <readonly/>
    </disk>
    <interface type='ethernet'>
      <mac address='$(domain_mac "$i")'/>
      <target dev='$(tap_name "$i")' managed='no'/>
      <model type='virtio'/>
    </interface>
    <serial type='tcp'>
      <source mode='bind' host='127.0.0.1' service='$(serial_port "$i")'/>
      <protocol type='raw'/>
      <log file='$(serial_log "$i")' append='on'/>
      <target port='0'/>
    </serial>
    <video><model type='none'/></video>
    <memballoon model='none'/>
  </devices>
</domain>
EOF
}

# The guest's NIC is a tap we make (libvirt's managed='no'), not one libvirt makes when the
# guest starts: ours has IPv6 off before it comes up, so the root namespace never holds an
# address on the lab's network, not even a link-local one.
tap_up() {
    local tap
    tap="$(tap_name "$1")"
    ip link show "$tap" >/dev/null 2>&1 || ip tuntap add dev "$tap" mode tap
    no_ipv6 "$tap"
    ip link set "$tap" master "$BRIDGE"
    ip link set "$tap" up
}

guests_up() {
    local n="$1" i name fw had
    mkdir -p "$LAB/disks" "$LAB/serial" "$LAB/nvram"
    for ((i = 0; i < n; i++)); do
        name="$(domain_name "$i")"
        fw="$(firmware_of "$i")"
        tap_up "$i"
        if virsh_q dominfo "$name" >/dev/null 2>&1 && [ ! -e "$LAB/disks/$name.raw" ]; then
            # Ours by its tag, but its disk is not in this checkout: another clone's lab (a run
            # that stopped before `down`). Start this guest afresh here.
            is_lab_domain "$name" || die "a domain $name exists that scripts/lab.sh did not define; remove or rename it"
            log "$name was defined by another checkout; defining it afresh here"
            remove_guest "$name"
        fi
        if virsh_q dominfo "$name" >/dev/null 2>&1; then
            is_lab_domain "$name" || die "a domain $name exists that scripts/lab.sh did not define; remove or rename it"
            # Disks from an older, smaller lab grow (sparse; the next deploy or clean redoes
            # the partition table anyway).
            if [ "$(stat -c %s "$LAB/disks/$name.raw")" -lt "$DISK_BYTES" ]; then
                truncate -s "$DISK_BYTES" "$LAB/disks/$name.raw"
            fi
            # Redefine, disk kept: a guest from an older lab.sh (serial port a file or a Unix
            # socket), one whose firmware was asked to change, or one whose firmware drifted (a
            # test switched it through its BMC and stopped before switching back).
            had="$(domain_firmware "$name")"
            if [[ "$(virsh_q dumpxml --inactive "$name")" != *"service='$(serial_port "$i")'"* ]] || [ "$had" != "$fw" ]; then
                log "redefining $name ($had → $fw firmware)"
                virsh_q destroy "$name" >/dev/null 2>&1 || true
                virsh_q undefine --nvram "$name" >/dev/null 2>&1 || virsh_q undefine "$name" >/dev/null || die "virsh undefine $name failed"
                rm -f "$LAB/nvram/$name".*
                domain_xml "$i" > "$RUN/$name.xml"
                virsh_q define "$RUN/$name.xml" >/dev/null || die "virsh define $name failed"
                echo "$fw" > "$RUN/$name.firmware"
            fi
            continue
        fi
        log "defining $name ($(domain_mac "$i"), $fw firmware)"
        rm -f "$LAB/disks/$name.raw" "$LAB/nvram/$name".*
        truncate -s "$DISK_BYTES" "$LAB/disks/$name.raw"
        : > "$(serial_log "$i")"
        domain_xml "$i" > "$RUN/$name.xml"
        virsh_q define "$RUN/$name.xml" >/dev/null || die "virsh define $name failed"
        echo "$fw" > "$RUN/$name.firmware"
    done
    # Guests beyond --nodes from an earlier, bigger lab.
    for name in $(lab_domains); do
        i="${name#"$DOMAIN_PREFIX"}"
        if [[ "$i" =~ ^[0-9]+$ ]] && [ "$i" -ge "$n" ]; then remove_guest "$name"; fi
    done
}

remove_guest() {
    local name="$1" uuid v
    uuid="$(virsh_q domuuid "$name" 2>/dev/null || true)"
    virsh_q destroy "$name" >/dev/null 2>&1 || true
    # UEFI guests have an NVRAM file, which plain undefine refuses to leave behind.
    virsh_q undefine --nvram "$name" >/dev/null 2>&1 || virsh_q undefine "$name" >/dev/null || log "warning: undefine $name failed"
    # Virtual media sushy uploaded for this guest.
    if [ -n "$uuid" ]; then
        for v in $(virsh_q vol-list default 2>/dev/null | awk -v s="-$uuid.img" 'substr($1, length($1) - length(s) + 1) == s {print $1}'); do
            virsh_q vol-delete "$v" --pool default >/dev/null || true
        done
    fi
    rm -f "$LAB/disks/$name.raw" "$RUN/$name.xml" "$RUN/$name.firmware" "$LAB/nvram/$name".* "/var/log/libvirt/qemu/$name.log"
    ip link del "$(tap_name "${name#"$DOMAIN_PREFIX"}")" 2>/dev/null || true
    log "removed $name"
}

# ---------------------------------------------------------------------------------------
# BMCs: sushy-emulator (Redfish) for all guests, one ipmi_sim (IPMI and SOL) per guest.

ensure_password() {
    if [ ! -s "$LAB/password" ]; then
        # 16 characters: IPMI 2.0 takes up to 20.
        (umask 077 && /usr/bin/python3 -c 'import secrets; print(secrets.token_hex(8))' > "$LAB/password")
    fi
    if [ ! -s "$LAB/rivetd-token" ]; then
        (umask 077 && /usr/bin/python3 -c 'import secrets; print(secrets.token_hex(24))' > "$LAB/rivetd-token")
    fi
    if [ ! -s "$LAB/htpasswd" ] || ! grep -q "^$BMC_USER:" "$LAB/htpasswd"; then
        # sushy-tools checks basic auth against an htpasswd file of bcrypt digests only.
        (umask 077 && "$VENV/bin/python" -c '
import bcrypt, sys
print("%s:%s" % (sys.argv[1], bcrypt.hashpw(open(sys.argv[2]).read().strip().encode(), bcrypt.gensalt()).decode()))
' "$BMC_USER" "$LAB/password" > "$LAB/htpasswd")
    fi
}

sushy_up() {
    local n="$1" allowed="" i name
    for ((i = 0; i < n; i++)); do
        name="$(domain_name "$i")"
        # Requests name a system by UUID or by name: allow both.
        allowed+="'$name', '$(virsh_q domuuid "$name")', "
    done
    cat > "$LAB/sushy.conf" <<EOF
# Generated by scripts/lab.sh: Redfish for the lab's guests only.
SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'
SUSHY_EMULATOR_LISTEN_PORT = $SUSHY_PORT
SUSHY_EMULATOR_LIBVIRT_URI = 'qemu:///system'
SUSHY_EMULATOR_AUTH_FILE = '$LAB/htpasswd'
SUSHY_EMULATOR_ALLOWED_INSTANCES = [$allowed]
# Debian's OVMF, not sushy-tools' defaults (another distribution's names): boot mode and
# Secure Boot PATCHes rewrite a guest's loader and NVRAM template with these.
SUSHY_EMULATOR_BOOT_LOADER_MAP = {'UEFI': {'x86_64': '$OVMF_CODE'}, 'Legacy': {'x86_64': '$SEABIOS'}}
SUSHY_EMULATOR_SECURE_BOOT_ENABLED_NVRAM = '$OVMF_VARS_SB'
SUSHY_EMULATOR_SECURE_BOOT_DISABLED_NVRAM = '$OVMF_VARS'
EOF
    if alive sushy >/dev/null; then
        if cmp -s "$LAB/sushy.conf" "$RUN/sushy.conf.running"; then return 0; fi
        stop_proc sushy   # the allow-list changed with --nodes
    fi
    start_bg sushy "$LAB/sushy.log" "$VENV/bin/sushy-emulator" --config "$LAB/sushy.conf"
    cp "$LAB/sushy.conf" "$RUN/sushy.conf.running"
    wait_for sushy 30 curl -sf -u "$BMC_USER:$(password)" "http://127.0.0.1:$SUSHY_PORT/redfish/v1/Systems" \
        || die "sushy-emulator does not answer on 127.0.0.1:$SUSHY_PORT (see $LAB/sushy.log$(tail -n 3 "$LAB/sushy.log" | sed 's/^/\n    /'))"
}

# One OpenIPMI ipmi_sim per guest: IPMI 2.0 (RMCP+) on UDP 127.0.0.1:6231+N with power and
# boot-device control through chassis-control (below), and Serial-over-LAN onto the guest's
# serial port (`sol "tcp:127.0.0.1:6331+N"`). What was checked about it: docs/console.md.
BMC_DIR="$LAB/bmc"

# ipmi_sim's chassis_control program, shared by the guests (the domain is its first argument):
#   chassis-control DOMAIN get power|boot ...        prints PARM:VALUE for each
#   chassis-control DOMAIN set PARM VALUE [...]      power 0|1, reset 1, shutdown 1,
#                                                    boot none|pxe|default|cdrom|bios
# ipmi_sim runs it through popen(3) and answers nothing else until it returns, and ipmitool
# gives up on a request after ~3 s (rivetd's -N 1 -R 2): power changes, which take seconds
# (QEMU took 2 s to exit after libvirt's SIGTERM on a loaded machine, and rivetd's `power off`
# failed), therefore run in the background, one at a time per domain (flock), their errors in
# bmc/DOMAIN/chassis.log, and the power state shows the change once it is done, as a real
# BMC's does (rivetd polls it). Anything else that fails prints why on stdout (ipmi_sim logs
# it) and exits non-zero (the IPMI request then fails). ipmi_sim hands it only
# the boot device selector: the persistent and EFI flags of `chassis bootdev … options=` are
# dropped, and the device is written into the domain's definition (one <os><boot dev=…/>,
# per-device boot orders removed) as VirtualBMC did: it holds from the next start on.
write_chassis_control() {
    cat > "$BMC_DIR/chassis-control.tmp" <<'EOF'
#!/bin/sh
# Generated by scripts/lab.sh: a lab guest's power and boot device for ipmi_sim.
export LIBVIRT_DEFAULT_URI=qemu:///system
dom="$1"
op="$2"
[ -n "$dom" ] && [ -n "$op" ] || { echo "usage: $0 DOMAIN get|set ..."; exit 1; }
shift 2

fail() { echo "$dom: $*"; exit 1; }
dir="$(dirname "$0")/$dom"
active() {
    state="$(virsh -q domstate "$dom" 2>&1)" || fail "virsh domstate: $state"
    case "$state" in
        "shut off"|crashed) return 1 ;;
        *) return 0 ;;
    esac
}
run() { out="$("$@" 2>&1)" || fail "$*: $out"; }
# later CMD...: CMD in the background after the domain's earlier power changes; no descriptor
# of ipmi_sim's pipe stays open, so ipmi_sim gets its answer now.
later() {
    (
        flock 9 || exit 1
        out="$("$@" 2>&1)" || echo "$(date -u +%FT%TZ) $*: $out"
    ) 9>"$dir/power.lock" >>"$dir/chassis.log" 2>&1 </dev/null &
}
on() { active || run virsh -q start "$dom"; }
off() { ! active || run virsh -q destroy "$dom"; }
reset() { ! active || run virsh -q reset "$dom"; }
acpi_off() { ! active || run virsh -q shutdown "$dom"; }

# The first <boot dev=…/> of the definition, as ipmi_sim names it.
get_boot() {
    xml="$(virsh -q dumpxml --inactive "$dom" 2>&1)" || fail "virsh dumpxml: $xml"
    dev="$(printf '%s\n' "$xml" | sed -n "s/.*<boot dev='\([a-z]*\)'.*/\1/p" | sed -n 1p)"
    case "$dev" in
        network) echo pxe ;;
        cdrom) echo cdrom ;;
        *) echo default ;;
    esac
}

set_boot() {
    case "$1" in
        none) return 0 ;;   # IPMI: no override requested
        pxe) dev=network ;;
        default) dev=hd ;;
        cdrom) dev=cdrom ;;
        *) fail "boot device $1 has no libvirt equivalent" ;;
    esac
    xml="$(virsh -q dumpxml --inactive --security-info "$dom" 2>&1)" || fail "virsh dumpxml: $xml"
    tmp="$(mktemp)" || fail "mktemp"
    if ! printf '%s' "$xml" | /usr/bin/python3 -c '
import sys, xml.etree.ElementTree as ET
tree = ET.fromstring(sys.stdin.read())
for parent in tree.findall("devices/*") + tree.findall("os"):
    for b in parent.findall("boot"):
        parent.remove(b)
ET.SubElement(tree.find("os"), "boot", {"dev": sys.argv[1]})
sys.stdout.write(ET.tostring(tree, encoding="unicode"))
' "$dev" > "$tmp" 2>&1; then
        msg="$(cat "$tmp")"
        rm -f "$tmp"
        fail "rewriting the boot order: $msg"
    fi
    out="$(virsh -q define "$tmp" 2>&1)"
    rc=$?
    rm -f "$tmp"
    [ "$rc" = 0 ] || fail "virsh define: $out"
}

case "$op" in
    get)
        for parm in "$@"; do
            case "$parm" in
                power) if active; then echo power:1; else echo power:0; fi ;;
                boot) echo "boot:$(get_boot)" ;;
                *) fail "cannot get $parm" ;;
            esac
        done
        ;;
    set)
        while [ $# -ge 2 ]; do
            parm="$1"
            val="$2"
            shift 2
            case "$parm:$val" in
                power:1) later on ;;
                power:0) later off ;;
                reset:1) later reset ;;
                shutdown:1) later acpi_off ;;
                boot:*) set_boot "$val" ;;
                identify:*) ;;
                *) fail "cannot set $parm to $val" ;;
            esac
        done
        ;;
    *) fail "unknown operation $op" ;;
esac
EOF
    chmod 700 "$BMC_DIR/chassis-control.tmp"
    mv "$BMC_DIR/chassis-control.tmp" "$BMC_DIR/chassis-control"
}

ipmi_port() { echo $((IPMI_FIRST_PORT + $1)); }

# `chassis power status` answers (-C 3: without a cipher suite ipmitool probes for seconds).
ipmi_ok() {
    IPMI_PASSWORD="$(password)" ipmitool -I lanplus -H 127.0.0.1 -p "$1" -C 3 -N 1 -R 2 \
        -U "$BMC_USER" -E power status
}

# A VirtualBMC left by an older lab.sh holds the BMC ports: stop it (its BMCs go with it).
legacy_vbmcd_down() {
    if alive vbmcd >/dev/null; then
        stop_proc vbmcd
        log "stopped the VirtualBMC of an older lab.sh"
    fi
    rm -rf "${LAB:?}/vbmc" "$LAB/vbmc.conf" "$RUN/vbmcd.pid" "$RUN/vbmcd.group" "$RUN/vbmcd.writes-zero.pid"
}

bmcs_up() {
    local n="$1" i name dir port f
    legacy_vbmcd_down
    mkdir -p "$BMC_DIR"
    chmod 700 "$BMC_DIR"   # lan.conf holds the BMC password in clear
    write_chassis_control
    for ((i = 0; i < n; i++)); do
        name="$(domain_name "$i")"
        dir="$BMC_DIR/$name"
        port="$(ipmi_port "$i")"
        mkdir -p "$dir/state"
        # The BMC's GUID is the machine's UUID, as servers report it.
        (umask 077 && cat > "$dir/lan.conf.new" <<EOF
# Generated by scripts/lab.sh: $name's BMC.
name "$name"
set_working_mc 0x20
startlan 1
  addr 127.0.0.1 $port
  priv_limit admin
  allowed_auths_callback none md2 md5 straight
  allowed_auths_user none md2 md5 straight
  allowed_auths_operator none md2 md5 straight
  allowed_auths_admin none md2 md5 straight
  guid $(virsh_q domuuid "$name" | tr -d -- '-\n')
endlan
chassis_control "$BMC_DIR/chassis-control $name"
sol "tcp:127.0.0.1:$(serial_port "$i")" 115200
user 2 true "$BMC_USER" "$(password)" admin 10 none md2 md5 straight
EOF
        )
        cat > "$dir/sim.emu" <<EOF
mc_setbmc 0x20
mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr
sel_enable 0x20 1000 0x0a
mc_enable 0x20
EOF
        if alive "ipmi-sim-$i" >/dev/null && cmp -s "$dir/lan.conf.new" "$dir/lan.conf"; then
            rm -f "$dir/lan.conf.new"
        else
            stop_proc "ipmi-sim-$i"
            mv "$dir/lan.conf.new" "$dir/lan.conf"
            start_bg "ipmi-sim-$i" "$dir/ipmi_sim.log" \
                ipmi_sim -n -c "$dir/lan.conf" -f "$dir/sim.emu" -s "$dir/state"
        fi
        wait_for "ipmi-sim-$i" 20 ipmi_ok "$port" \
            || die "ipmitool power status on 127.0.0.1:$port fails (see $dir/ipmi_sim.log)"
    done
    # The BMCs of guests beyond --nodes (an earlier, bigger lab).
    for f in "$RUN"/ipmi-sim-*.pid; do
        [ -e "$f" ] || continue
        i="${f##*/ipmi-sim-}"
        i="${i%.pid}"
        if [[ "$i" =~ ^[0-9]+$ ]] && [ "$i" -ge "$n" ]; then
            stop_proc "ipmi-sim-$i"
            rm -rf "${BMC_DIR:?}/$(domain_name "$i")"
        fi
    done
}

bmcs_down() {
    local f
    for f in "$RUN"/ipmi-sim-*.pid; do
        [ -e "$f" ] || continue
        f="${f##*/}"
        stop_proc "${f%.pid}"
    done
    rm -rf "${BMC_DIR:?}"
}

# ---------------------------------------------------------------------------------------
# rivetd for the lab's users.

rivetd_binary() {
    local b="" c
    for c in "$ROOT/target/release/rivetd" "$ROOT/target/debug/rivetd"; do
        if [ -x "$c" ] && { [ -z "$b" ] || [ "$c" -nt "$b" ]; }; then b="$c"; fi
    done
    if [ -z "$b" ]; then
        log "building rivetd"
        (cd "$ROOT" && cargo build -q -p rivet-controller --bin rivetd) >&2 || die "cargo build rivetd failed"
        b="$ROOT/target/debug/rivetd"
    fi
    echo "$b"
}

write_rivetd_config() {
    local hash
    hash="$("$1" hash-secret < "$LAB/password")"
    local token_hash
    token_hash="$("$1" hash-secret < "$LAB/rivetd-token")"
    (umask 077 && cat > "$LAB/rivetd.toml" <<EOF
# Generated by scripts/lab.sh: rivetd for the lab (guests reach it through the forwarder).
listen = "127.0.0.1:$RIVETD_PORT"
db = "sqlite:$LAB/rivet.db"
conductor_id = "rivet-lab"

[agent]
long_poll_s = 10

[conductor]
check_interval_s = 2

[power_sync]
interval_s = 10

# The lab's disks are emulated (TCG): automated cleaning wipes metadata only. Full erase is
# tested on loop devices (tests/cleaning.rs) and shown by \`rivet demo\`.
[cleaning]
priority_overrides = { "deploy.erase_devices" = 0 }

# Fast track, as Metal3 runs it: cleaning and inspection leave the ramdisk up, and the next
# deploy, cleaning or inspection starts on it without a reboot (minutes of POST on servers).
[deploy]
fast_track = true

[boot]
artefact_dir = "$LAB/ramdisk"
public_url = "$PUBLIC_URL"
external_http_url = "$API_URL"

[[auth.users]]
name = "$BMC_USER"
hash = "$hash"
role = "admin"

[[auth.tokens]]
name = "lab"
hash = "$token_hash"
role = "admin"
EOF
    )
}

rivetd_up() {
    if alive rivetd >/dev/null; then return 0; fi
    local bin
    bin="$(rivetd_binary)"
    write_rivetd_config "$bin"
    if ! "$bin" --config "$LAB/rivetd.toml" --print-config >/dev/null 2>"$RUN/rivetd-check.err"; then
        die "$bin rejects $LAB/rivetd.toml (an older build? cargo build -p rivet-controller): $(cat "$RUN/rivetd-check.err")"
    fi
    rm -f "$RUN/rivetd-check.err"
    start_bg rivetd "$LAB/rivetd.log" "$bin" --config "$LAB/rivetd.toml"
    wait_for rivetd 30 curl -sf "$API_URL/v1" \
        || die "rivetd does not answer on $API_URL (see $LAB/rivetd.log$(tail -n 3 "$LAB/rivetd.log" | sed 's/^/\n    /'))"
}

# ---------------------------------------------------------------------------------------
# lab.json: what a user or a test needs to drive the lab.

write_lab_json() {
    local n="$1" rivetd_started="$2" i name nodes=()
    for ((i = 0; i < n; i++)); do
        name="$(domain_name "$i")"
        nodes+=("$name" "$(domain_mac "$i")" "$(virsh_q domuuid "$name")" \
                "$(ipmi_port "$i")" "$(serial_log "$i")" "$(firmware_of "$i")" "$(serial_port "$i")")
    done
    /usr/bin/python3 - "$LAB/lab.json" "$rivetd_started" "$(password)" "$(cat "$LAB/rivetd-token")" \
        "${nodes[@]}" <<EOF
import json, os, sys
out, started, password, token = sys.argv[1:5]
rest = sys.argv[5:]
nodes = []
for k in range(0, len(rest), 7):
    name, mac, uuid, port, serial, firmware, serial_port = rest[k:k + 7]
    nodes.append({
        "name": name,
        "firmware": firmware,
        "macs": [mac],
        "disk_bytes": $DISK_BYTES,
        "redfish": {"address": "http://127.0.0.1:$SUSHY_PORT",
                    "system_id": "/redfish/v1/Systems/" + uuid,
                    "username": "$BMC_USER", "password": password},
        "ipmi": {"address": "127.0.0.1", "port": int(port),
                 "username": "$BMC_USER", "password": password},
        "serial_log": serial,
        # The guest's serial port (QEMU's TCP server): its one client is the BMC's SOL.
        "serial_tcp": "127.0.0.1:" + serial_port,
        "disk": "$LAB/disks/" + name + ".raw",
    })
lab = {
    "api_url": "$API_URL",
    "rivetd": {
        "listen": "127.0.0.1:$RIVETD_PORT",
        "public_url": "$PUBLIC_URL",
        "external_http_url": "$API_URL",
        "artefact_dir": "$LAB/ramdisk",
        "started": started == "true",
        "username": "$BMC_USER", "password": password, "token": token,
    },
    "nodes": nodes,
    "image": {
        "url": "$IMAGE_URL",
        "sha256": open("$LAB/www/testimage.raw.sha256").read().strip(),
        "path": "$LAB/www/testimage.raw",
    },
    "removable_image": {
        "url": "$IMAGE_URL".replace("testimage.raw", "testimage-removable.raw"),
        "sha256": open("$LAB/www/testimage-removable.raw.sha256").read().strip(),
        "path": "$LAB/www/testimage-removable.raw",
    },
    "signed_image": {
        "url": "$IMAGE_URL".replace("testimage.raw", "testimage-signed.raw"),
        "sha256": open("$LAB/www/testimage-signed.raw.sha256").read().strip(),
        "path": "$LAB/www/testimage-signed.raw",
    },
}
tmp = out + ".tmp"
with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
    json.dump(lab, f, indent=2)
    f.write("\n")
os.replace(tmp, out)
EOF
}

# ---------------------------------------------------------------------------------------
# Subcommands.

need_root() { [ "$(id -u)" = 0 ] || die "run as root (network namespaces, bridges, libvirt)"; }

need_tools() {
    local t missing=()
    for t in virsh libvirtd virtlogd dnsmasq socat ipmitool ipmi_sim curl ip qemu-system-x86_64; do
        command -v "$t" >/dev/null 2>&1 || missing+=("$t")
    done
    [ -x "$VENV/bin/sushy-emulator" ] || missing+=("$VENV")
    [ -f /usr/lib/ipxe/undionly.kpxe ] || missing+=("/usr/lib/ipxe/undionly.kpxe")
    [ -f /usr/lib/ipxe/ipxe.efi ] || missing+=("/usr/lib/ipxe/ipxe.efi")
    for t in "$OVMF_CODE" "$OVMF_VARS" "$OVMF_VARS_SB"; do [ -f "$t" ] || missing+=("$t"); done
    [ ${#missing[@]} -eq 0 ] || die "missing ${missing[*]}: run scripts/setup-lab.sh"
}

cmd_up() {
    local n=2 rivetd=1 secure=0 f
    while [ $# -gt 0 ]; do
        case "$1" in
            --nodes) [ $# -ge 2 ] || die "--nodes needs a number"; n="$2"; shift ;;
            --nodes=*) n="${1#--nodes=}" ;;
            --no-rivetd) rivetd=0 ;;
            --firmware) [ $# -ge 2 ] || die "--firmware needs uefi, secure-boot or bios"; FIRMWARE="$2"; shift ;;
            --firmware=*) FIRMWARE="${1#--firmware=}" ;;
            --secure-boot) secure=1 ;;
            *) die "up: unknown argument $1" ;;
        esac
        shift
    done
    [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 32 ] || die "--nodes must be 1..32"
    if [ "$secure" = 1 ]; then FIRMWARE="$(echo "${FIRMWARE:-uefi}" | sed 's/\buefi\b/secure-boot/g')"; fi
    for f in ${FIRMWARE//,/ }; do
        case "$f" in uefi|secure-boot|bios) ;; *) die "--firmware: unknown firmware $f (uefi, secure-boot or bios)" ;; esac
    done
    need_root
    need_tools
    # The secrets in target/lab (password, tokens, lab.json, the BMCs' configs) are written
    # mode 0600/0700; every daemon that reads the lab's files runs as root (dnsmasq_up).
    mkdir -p "$RUN"
    chmod 700 "$RUN"
    cmd_image   # rebuilds only what is older than its sources
    ensure_password
    libvirt_up
    pool_up
    network_up
    dnsmasq_up
    forwarder_up
    fileserver_up
    guests_up "$n"
    sushy_up "$n"
    bmcs_up "$n"
    if [ "$rivetd" = 1 ]; then rivetd_up; else stop_proc rivetd; fi
    echo "$n" > "$RUN/nodes"
    write_lab_json "$n" "$([ "$rivetd" = 1 ] && echo true || echo false)"
    log "up: $n guest(s); rivetd $([ "$rivetd" = 1 ] && echo "on $API_URL" || echo "not started (--no-rivetd)")"
    echo "$LAB/lab.json"
}

cmd_status() {
    local ok=0 name state n port bmc i
    check() {   # check LABEL CMD...
        local label="$1"
        shift
        if "$@" >/dev/null 2>&1; then printf '  %-32s up\n' "$label"
        else printf '  %-32s DOWN\n' "$label"; ok=1; fi
    }
    echo "lab in $LAB"
    check "namespace $NETNS" netns_exists
    check "bridge $BRIDGE" ip link show "$BRIDGE" up
    check "libvirt (virsh list)" virsh_ok
    check "storage pool default" pool_running
    for p in dnsmasq socat-host socat-ns fileserver sushy; do
        check "$p" alive "$p"
    done
    if alive rivetd >/dev/null; then
        printf '  %-32s up\n' "rivetd ($API_URL)"
    elif [ -f "$LAB/lab.json" ] && matches '"started": false' < "$LAB/lab.json"; then
        printf '  %-32s not started (--no-rivetd)\n' rivetd
    else
        printf '  %-32s DOWN\n' rivetd
        ok=1
    fi
    n="$(cat "$RUN/nodes" 2>/dev/null || echo 0)"
    [ "$n" -ge 1 ] || { printf '  %-32s none (lab not up)\n' "guests"; ok=1; }
    for ((i = 0; i < n; i++)); do
        name="$(domain_name "$i")"
        state="$(virsh_q domstate "$name" 2>/dev/null || echo missing)"
        [ "$state" != missing ] || ok=1
        port="$(ipmi_port "$i")"
        if alive "ipmi-sim-$i" >/dev/null && ipmi_ok "$port" >/dev/null 2>&1; then
            bmc="IPMI+SOL 127.0.0.1:$port"
        else
            bmc="IPMI DOWN"
            ok=1
        fi
        printf '  %-32s %s; %s\n' "$name" "$state" "$bmc"
    done
    [ "$ok" = 0 ] && echo "lab: up ($LAB/lab.json)" || echo "lab: not (fully) up"
    return "$ok"
}

cmd_down() {
    need_root
    local name
    stop_proc rivetd
    # Guests and their BMCs. libvirt must answer to remove domains: start it again if we
    # left definitions behind and it is gone.
    if ! virsh_ok && { ls /etc/libvirt/qemu/"$DOMAIN_PREFIX"*.xml >/dev/null 2>&1 || [ -f "$RUN/pool.created" ]; }; then
        log "libvirtd is not running but lab domains or the pool remain: starting it to remove them"
        mkdir -p "$RUN"
        libvirt_up
    fi
    # The BMCs first: nothing powers a guest on again while it is removed.
    bmcs_down
    legacy_vbmcd_down
    if virsh_ok; then
        for name in $(lab_domains); do remove_guest "$name"; done
        if [ -f "$RUN/pool.created" ]; then
            virsh_q pool-destroy default >/dev/null 2>&1 || true
            virsh_q pool-undefine default >/dev/null 2>&1 || log "warning: pool-undefine default failed"
            rm -rf "${LAB:?}/pool" "$RUN/pool.created"
            log "removed the storage pool 'default'"
        fi
    fi
    stop_proc sushy
    stop_proc dnsmasq
    stop_proc fileserver
    stop_proc socat-ns
    stop_proc socat-host
    rm -f "$SOCK" "$RUN"/*.running
    if netns_exists; then
        ip netns del "$NETNS"   # takes the veth pair with it
        log "removed netns $NETNS"
    fi
    if ip link show "$VETH_HOST" >/dev/null 2>&1; then ip link del "$VETH_HOST"; fi
    # Taps of guests whose domain is already gone (a half-failed up).
    for name in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | grep "^$TAP_PREFIX[0-9]*$"); do
        ip link del "$name"
    done
    if ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link del "$BRIDGE"
        log "removed bridge $BRIDGE"
    fi
    # libvirt last, and only if we started it.
    if alive libvirtd >/dev/null || alive virtlogd >/dev/null; then
        stop_proc libvirtd
        stop_proc virtlogd
    fi
    rm -f "$(pidfile libvirtd)" "$(pidfile virtlogd)"
    if [ -f "$RUN/network-autostarted.created" ]; then
        rm -f /run/libvirt/network/autostarted "$RUN/network-autostarted.created"
    fi
    if [ -f "$RUN/run-libvirt.created" ] && ! any_running libvirtd; then
        rm -rf /run/libvirt "$RUN/run-libvirt.created"
    fi
    if [ -f "$RUN/qemu.conf.orig" ]; then
        cp -p "$RUN/qemu.conf.orig" /etc/libvirt/qemu.conf
        rm -f "$RUN/qemu.conf.orig"
        log "restored /etc/libvirt/qemu.conf"
    fi
    # rivetd's database describes guests that no longer exist; the DHCP leases too.
    rm -f "$LAB"/rivet.db "$LAB"/rivet.db-* "$LAB"/rivet.db.key "$LAB/dnsmasq.leases"
    rm -f "$RUN/nodes" "$RUN/rivetd-check.err" "$LAB/lab.json"
    log "down"
}

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

main() {
    local cmd="${1:-}"
    [ $# -gt 0 ] && shift
    case "$cmd" in
        image) cmd_image "$@" ;;
        up) cmd_up "$@" ;;
        status) cmd_status "$@" ;;
        down) cmd_down "$@" ;;
        -h|--help|help) usage ;;
        *) usage >&2; exit 2 ;;
    esac
}

main "$@"
