#!/usr/bin/python3
"""IPA (ironic-python-agent from PyPI, in .venv-ipa) against rivet-agent, side by side on
this machine in one run: sizes, inventory time and peak RSS, start → first heartbeat
recorded by a stock Ironic, and a 2 GiB raw image written onto a loop device.

Run by scripts/bench-ipa.sh (which installs and builds what this needs); stdlib only.
Prints markdown rows and writes them to target/bench/ipa-vs-rivet.md.

Safety, because IPA is a ramdisk agent that assumes it owns the machine it runs on:
  * the full IPA agent (heartbeat bench) runs as user nobody with no supplementary groups,
    so it cannot power off or reboot the host, take network links down (its lockdown),
    unmount, load modules or open any disk for writing; Ironic's config gives both erase
    steps priority 0, so automated cleaning has no step for the agent to run, and the
    agent is SIGKILLed as soon as Ironic has logged its first heartbeat;
  * IPA's inventory (as root) calls only the read-only collection; the host-changing parts
    of GenericHardwareManager.initialize (iscsistart -b, mdadm --assemble --scan, modprobe
    of ipmi and multipath modules, starting multipathd) are replaced by no-ops;
  * IPA's image writer is called on an explicit loop device path (its root-device
    selection is not used; IPA does not list loop devices anyway).
"""

import argparse
import datetime
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request

MIB = 1 << 20
NOBODY = 65534
SYS_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def log(msg):
    print(f"bench-ipa: {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_rusage(cmd, env=None, user=None, cwd=None, timeout=600):
    """Run cmd under GNU time; (wall seconds, peak RSS KiB, exit code, stdout, stderr).

    Peak RSS is GNU time's %M (wait4's ru_maxrss). ru_maxrss survives execve, so the
    process must be forked from a small one: a child forked from this Python would report
    this Python's ~20 MiB. `user` runs cmd as that uid/gid with no supplementary groups
    (setpriv, between time and cmd)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as tf:
        wrap = ["/usr/bin/time", "-f", "%M %U %S", "-o", tf.name]
        if user is not None:
            wrap += ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--"]
        t = time.monotonic()
        p = subprocess.Popen(wrap + list(cmd), stdin=subprocess.DEVNULL, stdout=out,
                             stderr=err, env=env, cwd=cwd, start_new_session=True)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        wall = time.monotonic() - t
        out.seek(0)
        err.seek(0)
        lines = [l for l in tf.read().splitlines() if l.strip()]
        try:
            f = lines[-1].split()
            rss, cpu = int(f[0]), float(f[1]) + float(f[2])
        except (IndexError, ValueError):
            rss, cpu = 0, float("nan")
        run_rusage.cpu = cpu
        return wall, rss, p.returncode, out.read().decode(errors="replace"), \
            err.read().decode(errors="replace")


def median(v):
    return statistics.median(v) if v else float("nan")


def fmt_mib(nbytes):
    return f"{nbytes / MIB:.1f} MiB"


def du_bytes(paths, exclude=()):
    """Sum of regular file sizes (apparent) under paths, counting each inode once."""
    seen = set()
    total = 0
    for root in paths:
        if os.path.isfile(root):
            st = os.stat(root)
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
            continue
        for d, dirs, files in os.walk(root):
            dirs[:] = [x for x in dirs if x not in exclude]
            for f in files:
                p = os.path.join(d, f)
                st = os.lstat(p)
                if not os.path.isfile(p) or os.path.islink(p):
                    continue
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def ldd_libs(files):
    libs = set()
    for f in files:
        r = subprocess.run(["ldd", f], capture_output=True, text=True)
        for line in r.stdout.splitlines():
            m = re.search(r"=>\s+(/\S+)", line) or re.match(r"\s*(/\S+)", line)
            if m:
                libs.add(os.path.realpath(m.group(1)))
    return sorted(libs)


# ---------------------------------------------------------------------------------------
# 1. Sizes


def sizes(a):
    rows = []
    agent = os.path.getsize(a.agent)
    initramfs = os.path.getsize(a.initramfs)
    r = subprocess.run(f"zcat {a.initramfs} | cpio -it 2>/dev/null", shell=True,
                       capture_output=True, text=True)
    a.nmods = sum(1 for l in r.stdout.splitlines() if l.endswith(".ko"))
    site = os.path.join(a.ipa_venv, "lib", f"python{a.pyver}", "site-packages")
    # The venv's own installer is not part of what IPA runs.
    installer = {"pip", "setuptools", "pkg_resources", "_distutils_hack"}
    site_dirs = [os.path.join(site, x) for x in os.listdir(site)
                 if x.split("-")[0] not in installer and not x.startswith("distutils-precedence")]
    site_bytes = du_bytes(site_dirs)
    stdlib = f"/usr/lib/python{a.pyver}"
    stdlib_bytes = du_bytes([stdlib], exclude={"dist-packages", "test", "idlelib",
                                               "tkinter", "turtledemo", "ensurepip"})
    interp = os.path.realpath(os.path.join(a.ipa_venv, "bin", "python3"))
    sos = [interp]
    for d in (site, stdlib):
        for root, _, files in os.walk(d):
            sos += [os.path.join(root, f) for f in files if ".so" in f]
    libs = [l for l in ldd_libs(sos) if not l.startswith(site)]
    libs_bytes = du_bytes(libs)
    interp_bytes = os.path.getsize(interp)
    total = site_bytes + stdlib_bytes + interp_bytes + libs_bytes
    # Compressed like the initramfs (gzip -9 of a cpio/tar of the same files).
    listing = "\n".join(site_dirs + [stdlib, interp] + libs) + "\n"
    excl = " ".join(f"--exclude={stdlib}/{x}" for x in
                    ("dist-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip"))
    r = subprocess.run(
        f"tar -c --absolute-names {excl} --files-from=- 2>/dev/null | gzip -9 | wc -c",
        input=listing, shell=True, capture_output=True, text=True, check=True)
    gz = int(r.stdout.strip())
    log(f"sizes: rivet-agent {agent}, initramfs {initramfs}; IPA site-packages {site_bytes}, "
        f"stdlib {stdlib_bytes}, python {interp_bytes}, shared libs {libs_bytes} "
        f"({len(libs)}), total {total}, gzip -9 {gz}")
    a.results["sizes"] = dict(agent=agent, initramfs=initramfs, ipa_site=site_bytes,
                              stdlib=stdlib_bytes, interp=interp_bytes, libs=libs_bytes,
                              nlibs=len(libs), ipa_total=total, ipa_gz=gz)
    rows.append(
        f"| Agent size, rivet-agent vs IPA {a.ipa_version} (PyPI, measured here, not a built "
        f"IPA ramdisk) | rivet-agent static binary (stripped) **{fmt_mib(agent)}**; its whole "
        f"ramdisk (`rivet.initramfs`: agent, busybox, mdadm, {a.nmods} kernel modules; gzip) "
        f"**{fmt_mib(initramfs)}**. IPA needs, before any system tool: site-packages "
        f"{fmt_mib(site_bytes)} (IPA and its {a.ipa_ndeps} PyPI dependencies, pip/setuptools "
        f"left out) + Python {a.pyver} stdlib {fmt_mib(stdlib_bytes)} + interpreter "
        f"{fmt_mib(interp_bytes)} + {len(libs)} shared libraries {fmt_mib(libs_bytes)} = "
        f"**{fmt_mib(total)}** ({fmt_mib(gz)} as gzip -9): {total / agent:.0f}× the agent, "
        f"and its gzip {gz / initramfs:.1f}× rivet's whole initramfs — without the kernel "
        f"modules, udev, lshw, qemu-img, parted, mdadm… a real IPA ramdisk adds | "
        f"`bash scripts/bench-ipa.sh` |")
    return rows


# ---------------------------------------------------------------------------------------
# 2. Inventory

IPA_INVENTORY = r"""
import json, logging, sys, time
t0 = time.monotonic()
from oslo_config import cfg
from ironic_python_agent import config, hardware   # config registers IPA's options
cfg.CONF([], project='ironic-python-agent')
# No node is cached here: do not wait 10 x 3 s for a root device hint to appear.
cfg.CONF.set_override('disk_wait_attempts', 0)
logging.basicConfig(level=logging.ERROR)
# GenericHardwareManager.initialize changes the host: stand-ins for those four calls.
hardware._check_for_iscsi = lambda: None          # iscsistart -f / -b
hardware._md_scan_and_assemble = lambda: None     # mdadm --assemble --scan
hardware._load_ipmi_modules = lambda: None        # modprobe ipmi_*
hardware.MULTIPATH_ENABLED = False                # modprobe dm_multipath, multipathd
t1 = time.monotonic()
hardware.get_managers()
t2 = time.monotonic()
info = hardware.dispatch_to_managers('list_hardware_info')
t3 = time.monotonic()
print(json.dumps({"import_s": t1 - t0, "init_s": t2 - t1, "inventory_s": t3 - t2,
                  "disks": [d.name for d in info["disks"]],
                  "interfaces": [i.name for i in info["interfaces"]]}))
"""


def inventory(a):
    loop = a.inv_loop
    rivet_wall, rivet_rss = [], []
    renv = dict(os.environ, RIVET_LOG="warn")
    # Wall time without the GNU time wrapper (its own start is a good part of 2 ms)…
    for _ in range(a.inv_runs):
        t = time.monotonic()
        r = subprocess.run([a.agent, "inventory", "--devices", loop], env=renv,
                           capture_output=True)
        rivet_wall.append(time.monotonic() - t)
        if r.returncode != 0:
            raise SystemExit(f"rivet-agent inventory failed: {r.stderr.decode()}")
    # …and peak RSS under it.
    for _ in range(5):
        wall, rss, rc, out, err = run_rusage([a.agent, "inventory", "--devices", loop],
                                             env=renv)
        if rc != 0:
            raise SystemExit(f"rivet-agent inventory failed: {err}")
        rivet_rss.append(rss)
    rivet_disks = [d["name"] for d in json.loads(out).get("disks", [])]
    script = os.path.join(a.work, "ipa_inventory.py")
    with open(script, "w") as f:
        f.write(IPA_INVENTORY)
    env = {"PATH": f"{a.sysroot_bin}:{SYS_PATH}", "HOME": "/tmp", "LANG": "C.UTF-8"}

    def ipa_runs(user, n):
        walls, rsss, inner = [], [], []
        for _ in range(n):
            wall, rss, rc, out, err = run_rusage([a.ipa_python, script], env=env, user=user,
                                                 cwd=a.work if user is None else "/")
            if rc != 0:
                raise SystemExit(f"IPA inventory failed (user {user}): {err[-3000:]}")
            walls.append(wall)
            rsss.append(rss)
            inner.append(json.loads(out.strip().splitlines()[-1]))
        return walls, rsss, inner

    ipa_wall, ipa_rss, ipa_in = ipa_runs(None, a.ipa_inv_runs)
    nb_wall, nb_rss, nb_in = ipa_runs(NOBODY, max(3, a.ipa_inv_runs // 2))
    r = dict(
        rivet_wall=median(rivet_wall), rivet_rss=median(rivet_rss), rivet_rss_max=max(rivet_rss),
        rivet_disks=rivet_disks, runs=a.inv_runs, ipa_runs=a.ipa_inv_runs,
        ipa_wall=median(ipa_wall), ipa_rss=median(ipa_rss), ipa_rss_max=max(ipa_rss),
        ipa_import=median([x["import_s"] for x in ipa_in]),
        ipa_init=median([x["init_s"] for x in ipa_in]),
        ipa_inv=median([x["inventory_s"] for x in ipa_in]),
        ipa_disks=ipa_in[-1]["disks"], ipa_ifaces=ipa_in[-1]["interfaces"],
        nobody_wall=median(nb_wall), nobody_inv=median([x["inventory_s"] for x in nb_in]),
        nobody_rss=median(nb_rss))
    a.results["inventory"] = r
    log(f"inventory: {json.dumps(r)}")
    return [
        f"| Inventory, rivet-agent vs IPA {a.ipa_version} on this machine (rivet: `rivet-agent "
        f"inventory --devices LOOP`, {a.inv_runs} runs; IPA: `dispatch_to_managers("
        f"'list_hardware_info')` in a fresh Python, as root, {a.ipa_inv_runs} runs — IPA "
        f"lists the host's own disk {', '.join(r['ipa_disks'])}, as it never lists loop "
        f"devices; medians; peak RSS = GNU time's %M) | rivet-agent **{r['rivet_wall'] * 1000:.1f} "
        f"ms** for the whole process, peak RSS **{r['rivet_rss'] / 1024:.1f} MiB**. IPA "
        f"**{r['ipa_wall']:.2f} s** for the process — imports {r['ipa_import']:.2f} s, "
        f"hardware managers' start {r['ipa_init']:.2f} s, `list_hardware_info` itself "
        f"**{r['ipa_inv'] * 1000:.0f} ms** (lshw, lsblk, ip, dmidecode, ipmitool…) — peak RSS "
        f"**{r['ipa_rss'] / 1024:.1f} MiB**: {r['ipa_wall'] / r['rivet_wall']:.0f}× the time, "
        f"{r['ipa_rss'] / r['rivet_rss']:.0f}× the memory (`list_hardware_info` alone: "
        f"{r['ipa_inv'] / r['rivet_wall']:.0f}×). As user nobody (the heartbeat bench's "
        f"IPA): {r['nobody_wall']:.2f} s, `list_hardware_info` {r['nobody_inv'] * 1000:.0f} ms | "
        f"`bash scripts/bench-ipa.sh` |"]


# ---------------------------------------------------------------------------------------
# 3. Start → first heartbeat against a stock Ironic

IRONIC_CONF = """\
[DEFAULT]
auth_strategy = noauth
rpc_transport = none
host = bench-ipa
use_stderr = true
debug = false
minimum_memory_warning_only = true
enabled_hardware_types = fake-hardware
enabled_bios_interfaces = fake,no-bios
enabled_boot_interfaces = fake
enabled_console_interfaces = fake,no-console
enabled_deploy_interfaces = direct,fake
enabled_firmware_interfaces = fake,no-firmware
enabled_inspect_interfaces = agent,fake,no-inspect
enabled_management_interfaces = fake
enabled_network_interfaces = noop
enabled_power_interfaces = fake
enabled_raid_interfaces = fake,no-raid,agent
enabled_rescue_interfaces = fake,no-rescue
enabled_storage_interfaces = noop
enabled_vendor_interfaces = fake,no-vendor
[api]
host_ip = 127.0.0.1
port = {port}
ramdisk_heartbeat_timeout = 6
[database]
connection = sqlite:///{dir}/ironic.db
[dhcp]
dhcp_provider = none
[conductor]
automated_clean = true
[deploy]
fast_track = false
# Safety: automated cleaning has no step for the agent (it is only asked for its steps).
erase_devices_priority = 0
erase_devices_metadata_priority = 0
[agent]
# require_tls stays true (the default): both agents serve their API over automatic TLS
# with a self-signed certificate and send it in the heartbeat (agent_verify_ca).
certificates_path = {dir}/certificates
image_download_source = http
deploy_logs_collect = never
[oslo_concurrency]
lock_path = {dir}/locks
[service_catalog]
auth_type = none
endpoint_override = http://127.0.0.1:{port}
"""


class Ironic:
    def __init__(self, a):
        self.a = a
        self.dir = os.path.join(a.work, "ironic")
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.conf = os.path.join(self.dir, "ironic.conf")
        with open(self.conf, "w") as f:
            f.write(IRONIC_CONF.format(port=self.port, dir=self.dir))
        self.log = os.path.join(self.dir, "ironic.log")
        logf = open(self.log, "w")
        subprocess.run([os.path.join(a.ironic_venv, "bin", "ironic-dbsync"), "--config-file",
                        self.conf, "create_schema"], stdout=logf, stderr=logf, check=True)
        self.proc = subprocess.Popen([os.path.join(a.ironic_venv, "bin", "ironic"),
                                      "--config-file", self.conf], stdout=logf, stderr=logf,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        a.cleanups.append(self.stop)
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                _, body = self.call("GET", "/v1/conductors")
                if any(c["hostname"] == "bench-ipa" for c in body.get("conductors", [])):
                    log(f"ironic up on {self.url} (log {self.log})")
                    return
            except (OSError, ValueError):
                pass
            if self.proc.poll() is not None:
                raise SystemExit(f"ironic exited; see {self.log}")
            time.sleep(0.2)
        raise SystemExit(f"ironic did not come up; see {self.log}")

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "X-OpenStack-Ironic-API-Version": "latest", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                text = r.read()
                return r.status, (json.loads(text) if text else None)
        except urllib.error.HTTPError as e:
            text = e.read()
            try:
                return e.code, json.loads(text)
            except ValueError:
                return e.code, text.decode(errors="replace")

    def node(self, uuid):
        return self.call("GET", f"/v1/nodes/{uuid}")[1]

    def provision(self, uuid, target):
        code, body = self.call("PUT", f"/v1/nodes/{uuid}/states/provision", {"target": target})
        if code != 202:
            raise SystemExit(f"provision {target}: {code} {body}")

    def wait_state(self, uuid, states, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            n = self.node(uuid)
            if n["provision_state"] in states:
                return n
            time.sleep(0.1)
        n = self.node(uuid)
        raise SystemExit(f"node {uuid} stuck in {n['provision_state']} (want {states}); "
                         f"last_error {n.get('last_error')}")

    def to_clean_wait(self, uuid):
        """Whatever the node's state, take it through manage → provide to clean wait. A
        node whose agent was killed at its first heartbeat goes to `clean failed` by itself
        (Ironic cannot reach the agent for its clean steps); abort if it has not after 20 s."""
        deadline = time.time() + 20
        while True:
            st = self.node(uuid)["provision_state"]
            if st not in ("cleaning", "clean wait", "verifying", "clean hold"):
                break
            if time.time() > deadline:
                self.call("PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "abort"})
                deadline = time.time() + 30
            time.sleep(0.1)
        if st in ("enroll", "available", "clean failed"):
            self.provision(uuid, "manage")
            self.wait_state(uuid, {"manageable"})
        self.provision(uuid, "provide")
        self.wait_state(uuid, {"clean wait"}, timeout=60)

    def log_offset(self):
        return os.path.getsize(self.log)

    LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) .* (GET|POST) "
                      r"(/v1/lookup\S*|/v1/heartbeat/\S+) - (\d{3}) ")

    def scan(self, offset):
        """(lookup 200 time, first heartbeat 202 time) as epoch seconds, from offset."""
        lookup = hb = None
        with open(self.log, errors="replace") as f:
            f.seek(offset)
            for line in f:
                m = self.LINE.match(line)
                if not m:
                    continue
                ts = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
                if m.group(3).startswith("/v1/lookup") and m.group(4) == "200" and lookup is None:
                    lookup = ts
                if m.group(3).startswith("/v1/heartbeat") and m.group(4) == "202":
                    hb = ts
                    break
        return lookup, hb


def host_mac():
    r = subprocess.run(["ip", "-j", "route", "get", "1.1.1.1"], capture_output=True, text=True)
    dev = None
    try:
        dev = json.loads(r.stdout)[0]["dev"]
    except (ValueError, IndexError, KeyError):
        pass
    for name in ([dev] if dev else []) + sorted(os.listdir("/sys/class/net")):
        try:
            mac = open(f"/sys/class/net/{name}/address").read().strip()
        except OSError:
            continue
        if name != "lo" and mac and mac != "00:00:00:00:00:00":
            return mac
    raise SystemExit("no network interface with a MAC address")


def vm_hwm_kib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def heartbeat(a):
    ironic = Ironic(a)
    code, node = ironic.call("POST", "/v1/nodes", {
        "name": "bench-ipa", "driver": "fake-hardware", "boot_interface": "fake",
        "deploy_interface": "direct", "management_interface": "fake",
        "power_interface": "fake", "raid_interface": "no-raid",
        "inspect_interface": "no-inspect"})
    if code != 201:
        raise SystemExit(f"creating the node: {code} {node}")
    uuid = node["uuid"]
    # IPA looks its node up by the MACs of this host's interfaces.
    code, port = ironic.call("POST", "/v1/ports", {"node_uuid": uuid, "address": a.mac})
    if code != 201:
        raise SystemExit(f"creating the port: {code} {port}")

    ipa_port = free_port()
    ipa_conf = os.path.join(a.work, "ipa.conf")
    with open(ipa_conf, "w") as f:
        f.write(textwrap.dedent(f"""\
            [DEFAULT]
            api_url = {ironic.url}
            listen_host = 127.0.0.1
            listen_port = {ipa_port}
            advertise_host = 127.0.0.1
            advertise_port = {ipa_port}
            # no inspection: lookup and heartbeat only
            inspection_callback_url =
            use_stderr = true
            debug = false
            """))
    os.chmod(ipa_conf, 0o644)
    rivet_port = free_port()
    agents = {
        "rivet": dict(cmd=[a.agent, "run", "--ironic", ironic.url, "--ipa-listen",
                           f"127.0.0.1:{rivet_port}", "--devices", a.inv_loop, "--node", uuid],
                      env=dict(os.environ, RIVET_LOG="info"), user=None),
        "ipa": dict(cmd=[os.path.join(a.ipa_venv, "bin", "ironic-python-agent"),
                         "--config-file", ipa_conf],
                    # A PATH nobody can search (no /root/… entries: an unsearchable one
                    # turns "mdadm not installed" into PermissionError, fatal to IPA).
                    env={"PATH": f"{a.sysroot_bin}:{SYS_PATH}", "HOME": "/tmp",
                         "LANG": "C.UTF-8"},
                    user=NOBODY),
    }
    # IPA writes its automatic TLS certificate to this fixed path; as nobody it needs the
    # directory made for it (removed again at the end).
    run_dir = "/run/ironic-python-agent"
    if os.path.exists(run_dir):
        if os.stat(run_dir).st_uid != NOBODY:
            raise SystemExit(f"{run_dir} exists and is not this bench's: remove it first")
    else:
        os.mkdir(run_dir, 0o700)
        os.chown(run_dir, NOBODY, NOBODY)
    a.cleanups.append(lambda: shutil.rmtree(run_dir, ignore_errors=True))
    res = {k: [] for k in agents}
    for rep in range(a.hb_reps):
        for name, spec in agents.items():
            ironic.to_clean_wait(uuid)
            offset = ironic.log_offset()
            logpath = os.path.join(a.work, f"{name}-heartbeat-{rep}.log")
            logf = open(logpath, "w")
            kw = dict(user=spec["user"], group=spec["user"], extra_groups=[]) \
                if spec["user"] is not None else {}
            t0 = time.time()
            m0 = time.monotonic()
            p = subprocess.Popen(spec["cmd"], env=spec["env"], stdout=logf, stderr=logf,
                                 stdin=subprocess.DEVNULL, cwd="/tmp", start_new_session=True,
                                 **kw)
            lookup = hb = None
            hwm = None
            try:
                while time.monotonic() - m0 < a.hb_timeout:
                    lookup, hb = ironic.scan(offset)
                    if hb is not None:
                        hwm = vm_hwm_kib(p.pid)
                        break
                    if p.poll() is not None:
                        break
                    time.sleep(0.01)
            finally:
                # Kill at once: nothing after the first heartbeat is measured.
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
                logf.close()
            if hb is None:
                tail = open(logpath, errors="replace").read()[-4000:]
                raise SystemExit(f"{name}: no heartbeat in {a.hb_timeout} s (exit "
                                 f"{p.returncode}); log {logpath}:\n{tail}")
            r = dict(hb=hb - t0, lookup=(lookup - t0) if lookup else None, hwm=hwm)
            res[name].append(r)
            log(f"heartbeat {name} round {rep}: lookup {r['lookup']:.2f} s, first heartbeat "
                f"{r['hb']:.2f} s, VmHWM {hwm} KiB")
    r = {k: dict(hb=median([x["hb"] for x in v]), hb_min=min(x["hb"] for x in v),
                 hb_max=max(x["hb"] for x in v),
                 lookup=median([x["lookup"] for x in v if x["lookup"] is not None]),
                 hwm=median([x["hwm"] for x in v if x["hwm"]]))
         for k, v in res.items()}
    a.results["heartbeat"] = r
    ri, ip = r["rivet"], r["ipa"]
    return [
        f"| Process start → first heartbeat recorded by a stock Ironic 39 (node in `clean "
        f"wait`, fake-hardware, automatic TLS on both agents; the time of Ironic's `POST "
        f"/v1/heartbeat … 202` log line minus the spawn; median of {a.hb_reps} interleaved "
        f"rounds). IPA {a.ipa_version} from PyPI runs on the host as user nobody (so it can "
        f"neither power the host off, take its links down nor write its disks), Ironic has no "
        f"clean step for it, and it is killed at its first heartbeat; RSS = VmHWM then | rivet-agent **{ri['hb']:.2f} "
        f"s** (lookup {ri['lookup']:.2f} s; range {ri['hb_min']:.2f}–{ri['hb_max']:.2f}), RSS "
        f"high-water mark {ri['hwm'] / 1024:.1f} MiB; IPA **{ip['hb']:.2f} s** (lookup "
        f"{ip['lookup']:.2f} s; range {ip['hb_min']:.2f}–{ip['hb_max']:.2f}), "
        f"{ip['hwm'] / 1024:.1f} MiB: {ip['hb'] / ri['hb']:.0f}× the time, "
        f"{ip['hwm'] / ri['hwm']:.0f}× the memory. Neither includes a kernel boot (rivet's "
        f"ramdisk under QEMU: see the boot_bench row) | `bash scripts/bench-ipa.sh` |"]


# ---------------------------------------------------------------------------------------
# 4. 2 GiB deploy: rivet-agent step write_image vs IPA's raw-image streaming writer

IPA_WRITE = r"""
import json, resource, subprocess, sys, time
from oslo_config import cfg
from ironic_python_agent import config, hardware
from ironic_python_agent.extensions import standby
cfg.CONF([], project='ironic-python-agent')
image_info = json.loads(sys.argv[1])
device = sys.argv[2]
# Never let IPA choose a disk: this run has no business with the host's own.
def _refuse(*a, **k):
    raise RuntimeError('bench: IPA tried to pick a disk itself')
hardware.dispatch_to_managers = _refuse
standby._validate_image_info(None, image_info)
ext = standby.StandbyExtension()
ext.partition_uuids = {}
def cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
c0 = cpu()
t0 = time.monotonic()
# What prepare_image runs for a whole-disk raw image with stream_raw_images (Ironic's
# default), after its root device choice: stream with checksum, fix the GPT, read the
# partition table back, note the disk identifier.
ext._stream_raw_image_onto_device(image_info, device)
standby._validate_partitioning(device)
ext._fix_up_partition_uuids(image_info, device)
t1 = time.monotonic()
# IPA's full_sync (what standby.sync / power_off run before the node reboots).
subprocess.run(['sync'], check=True)
t2 = time.monotonic()
print(json.dumps({"write_s": t1 - t0, "sync_s": t2 - t1, "cpu_s": cpu() - c0,
                  "root_uuid": ext.partition_uuids.get('root uuid')}))
"""


# Loopback HTTP file server: sendfile(2), so serving costs neither agent CPU time
# (http.server's copy loop would be the bottleneck of both).
FILE_SERVER = r"""
import http.server, os, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def _open(self):
        path = os.path.join(sys.argv[2], os.path.basename(self.path.split("?")[0]))
        try:
            f = open(path, "rb")
        except OSError:
            self.send_error(404)
            return None
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(os.fstat(f.fileno()).st_size))
        self.end_headers()
        self.wfile.flush()
        return f
    def do_HEAD(self):
        f = self._open()
        if f:
            f.close()
    def do_GET(self):
        f = self._open()
        if f:
            with f:
                self.connection.sendfile(f)
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def make_image(path, gib):
    """Half random MiBs, half zero MiBs (as rivet-bench deploy), then a one-partition GPT."""
    with open(path, "wb") as f:
        for i in range(gib * 1024):
            f.write(os.urandom(MIB) if i % 2 else bytes(MIB))
    subprocess.run(["sgdisk", "-Z", "-n", "1:2048:0", "-t", "1:8300", path], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(8 * MIB)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def deploy(a):
    www = os.path.join(a.work, "www")
    os.makedirs(www, exist_ok=True)
    img = os.path.join(www, "image.raw")
    size = a.deploy_gib * 1024 * MIB
    digest_file = img + ".sha256"
    if not (os.path.exists(img) and os.path.getsize(img) == size + 0
            and os.path.exists(digest_file)):
        log(f"making a {a.deploy_gib} GiB image")
        digest = make_image(img, a.deploy_gib)
        open(digest_file, "w").write(digest)
    digest = open(digest_file).read().strip()
    port = free_port()
    server = os.path.join(a.work, "file_server.py")
    with open(server, "w") as f:
        f.write(FILE_SERVER)
    srv = subprocess.Popen(["/usr/bin/python3", server, str(port), www],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    a.cleanups.append(lambda: (srv.kill(), srv.wait()))
    url = f"http://127.0.0.1:{port}/image.raw"
    for _ in range(100):
        try:
            urllib.request.urlopen(url + ".sha256", timeout=2).read()
            break
        except OSError:
            time.sleep(0.1)
    backing = os.path.join(a.work, "deploy-disk.img")
    with open(backing, "wb") as f:
        f.truncate(size + 256 * MIB)
    a.cleanups.append(lambda: os.unlink(backing))
    dev = attach_loop(a, backing)

    def check(who):
        """The device holds the image (past the first MiB, before the last: the GPT headers
        are rewritten by both agents when they fix the backup GPT's place)."""
        r = subprocess.run(["cmp", "--ignore-initial=1048576", f"--bytes={size - 2 * MIB}",
                            img, dev], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"{who}: the device does not hold the image: {r.stdout}{r.stderr}")
        subprocess.run(["dd", f"of={dev}", "bs=1M", "count=4", "if=/dev/zero", "oflag=direct",
                        "status=none"], check=True)
    script = os.path.join(a.work, "ipa_write.py")
    with open(script, "w") as f:
        f.write(IPA_WRITE)
    env = dict(os.environ, PATH=f"{a.sysroot_bin}:{os.environ['PATH']}")
    rivet_args = json.dumps({"image_source": url, "os_hash_algo": "sha256",
                             "os_hash_value": digest, "root_device": {"name": dev}})
    ipa_info = json.dumps({"id": "image.raw", "urls": [url], "disk_format": "raw",
                           "container_format": "bare", "stream_raw_images": True,
                           "image_type": "whole-disk", "os_hash_algo": "sha256",
                           "os_hash_value": digest, "node_uuid": "bench-ipa"})
    rv, ipa_total, ipa_write, rv_rss, ipa_rss, rv_cpu, ipa_cpu = [], [], [], [], [], [], []
    for rep in range(a.deploy_reps):
        wall, rss, rc, out, err = run_rusage(
            [a.agent, "step", "write_image", "--devices", dev, "--args", rivet_args],
            env=dict(os.environ, RIVET_LOG="warn"))
        if rc != 0:
            raise SystemExit(f"rivet-agent write_image failed: {err[-3000:]}")
        rv.append(wall)
        rv_rss.append(rss)
        rv_cpu.append(run_rusage.cpu)
        check("rivet-agent")
        wall, rss, rc, out, err = run_rusage([a.ipa_python, script, ipa_info, dev], env=env,
                                             cwd=a.work)
        if rc != 0:
            raise SystemExit(f"IPA write failed: {err[-3000:]}")
        j = json.loads(out.strip().splitlines()[-1])
        ipa_write.append(j["write_s"])
        ipa_total.append(j["write_s"] + j["sync_s"])
        ipa_rss.append(rss)
        ipa_cpu.append(j["cpu_s"])
        check("IPA")
        log(f"deploy round {rep}: rivet write_image {rv[-1]:.2f} s (CPU {rv_cpu[-1]:.2f} s); "
            f"IPA stream+checks {j['write_s']:.2f} s + sync {j['sync_s']:.2f} s (CPU "
            f"{j['cpu_s']:.2f} s)")
    mib = size / MIB
    r = dict(rivet=median(rv), ipa=median(ipa_total), ipa_write=median(ipa_write),
             rivet_rss=median(rv_rss), ipa_rss=median(ipa_rss), reps=a.deploy_reps,
             rivet_cpu=median(rv_cpu), ipa_cpu=median(ipa_cpu), rivet_all=rv, ipa_all=ipa_total,
             load=os.getloadavg()[0])
    a.results["deploy"] = r
    return [
        f"| Deploy a {a.deploy_gib} GiB raw image (half random, half zero MiBs; one-partition "
        f"GPT) over loopback HTTP (sendfile) onto a loop device, both sha256-verified, the "
        f"device checked against the image after each write: `rivet-agent step write_image` "
        f"(whole process) vs IPA {a.ipa_version}'s own streaming writer for raw whole-disk "
        f"images (`StandbyExtension._stream_raw_image_onto_device` + `_validate_partitioning` "
        f"+ `_fix_up_partition_uuids`, then its `sync`; in-process, import time not counted, "
        f"root device choice skipped); median of {a.deploy_reps} interleaved rounds, load "
        f"average {r['load']:.1f} | rivet-agent **{r['rivet']:.2f} s "
        f"({mib / r['rivet']:.0f} MiB/s)**, CPU {r['rivet_cpu']:.2f} s, peak RSS "
        f"{r['rivet_rss'] / 1024:.1f} MiB; IPA **{r['ipa']:.2f} s ({mib / r['ipa']:.0f} "
        f"MiB/s)**, CPU {r['ipa_cpu']:.2f} s, peak RSS {r['ipa_rss'] / 1024:.1f} MiB (whole "
        f"process, Python included): rivet at **{r['ipa'] / r['rivet']:.2f}× IPA's rate, "
        f"{r['rivet_cpu'] / r['ipa_cpu']:.2f}× its CPU time**. Rounds: rivet "
        f"{', '.join(f'{x:.2f}' for x in r['rivet_all'])} s; IPA "
        f"{', '.join(f'{x:.2f}' for x in r['ipa_all'])} s | `bash scripts/bench-ipa.sh` |"]


def attach_loop(a, backing):
    dev = subprocess.run(["losetup", "-f", "--show", "-P", backing], capture_output=True,
                         text=True, check=True).stdout.strip()

    def detach():
        subprocess.run(["losetup", "-d", dev], stderr=subprocess.DEVNULL)
    a.cleanups.append(detach)
    log(f"attached {dev} ← {backing}")
    return dev


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--agent", required=True)
    p.add_argument("--initramfs", required=True)
    p.add_argument("--ipa-venv", required=True)
    p.add_argument("--ironic-venv", required=True)
    p.add_argument("--sysroot-bin", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--inv-runs", type=int, default=20)
    p.add_argument("--ipa-inv-runs", type=int, default=10)
    p.add_argument("--hb-reps", type=int, default=5)
    p.add_argument("--hb-timeout", type=float, default=120)
    p.add_argument("--deploy-gib", type=int, default=2)
    p.add_argument("--deploy-reps", type=int, default=3)
    p.add_argument("--only", default="sizes,inventory,heartbeat,deploy")
    a = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (losetup, and IPA's inventory reads what root reads)")
    for k in ("agent", "initramfs", "ipa_venv", "ironic_venv", "sysroot_bin", "work", "out"):
        setattr(a, k, os.path.abspath(getattr(a, k)))
    a.results = {}
    a.cleanups = []
    a.ipa_python = os.path.join(a.ipa_venv, "bin", "python3")
    a.pyver = subprocess.run([a.ipa_python, "-c", "import sys;print('%d.%d'%sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    a.ipa_version = subprocess.run(
        [a.ipa_python, "-c", "import importlib.metadata as m;print(m.version('ironic-python-agent'))"],
        capture_output=True, text=True, check=True).stdout.strip()
    a.ipa_ndeps = int(subprocess.run(
        [a.ipa_python, "-m", "pip", "list", "--format=freeze", "--exclude", "pip",
         "--exclude", "setuptools", "--exclude", "ironic-python-agent"],
        capture_output=True, text=True, check=True).stdout.count("\n"))
    a.mac = host_mac()
    os.makedirs(a.work, exist_ok=True)
    os.chmod(a.work, 0o755)
    only = set(a.only.split(","))
    rows = []

    def on_signal(sig, _frame):
        raise SystemExit(f"signal {sig}")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        inv_backing = os.path.join(a.work, "inventory-disk.img")
        with open(inv_backing, "wb") as f:
            f.truncate(64 * MIB)
        a.cleanups.append(lambda: os.unlink(inv_backing))
        a.inv_loop = attach_loop(a, inv_backing)
        if "sizes" in only:
            rows += sizes(a)
        if "inventory" in only:
            rows += inventory(a)
        if "heartbeat" in only:
            rows += heartbeat(a)
        if "deploy" in only:
            rows += deploy(a)
    finally:
        for c in reversed(a.cleanups):
            try:
                c()
            except Exception as e:  # noqa: BLE001 — keep cleaning up
                log(f"cleanup: {e}")
    with open(os.path.join(a.work, "results.json"), "w") as f:
        json.dump(a.results, f, indent=1)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "?")
    mem = int(next(l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemTotal")))
    head = (f"Machine: {os.cpu_count()} cores ({cpu}), {mem / 1048576:.1f} GiB RAM, "
            f"load average {os.getloadavg()[0]:.2f} at the end.\n"
            f"Command: `bash scripts/bench-ipa.sh`; IPA {a.ipa_version} (PyPI) in .venv-ipa, "
            f"stock Ironic 39 in .venv-ironic.\n\n| What | Result | Command |\n|---|---|---|\n")
    text = head + "".join(r + "\n" for r in rows)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write(text)
    print(text, end="")


if __name__ == "__main__":
    main()
