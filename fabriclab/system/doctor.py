"""What this kernel and machine can do, and which mechanism the lab uses for each feature.

`probe()` finds out by trying things for real (loading a module, adding a qdisc on a veth inside a
throwaway network namespace, attaching a compiled BPF program) and caches the answer for the life of
the process. `mechanisms()` is a pure function from those capabilities to the lab's choices, so it
can be unit-tested with made-up capabilities. `fabriclab doctor` prints both.
"""

import dataclasses
import importlib.util
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass

from fabriclab.errors import EnvironmentProblem
from fabriclab.system.procs import pid_alive

SYSTEM_PYTHON = "/usr/bin/python3"
PROBE_PREFIX = "flprobe-"
FIX_HINT = "run `sudo ./lab.sh bootstrap` (or `sudo .venv/bin/fabriclab provision`)"
ROOT_HINT = "run it as root (sudo)"

# qdisc name -> arguments after `tc qdisc add dev X root`; each is the smallest
# configuration the lab would really use (RED with ECN that never drops, not plain RED).
QDISC_TRIALS = {
    "htb": ["htb", "default", "1"],
    "tbf": ["tbf", "rate", "10mbit", "burst", "32kbit", "latency", "50ms"],
    "bfifo": ["bfifo", "limit", "100000"],
    "red": ["red", "limit", "400000", "min", "30000", "max", "90000", "avpkt", "1000",
            "burst", "55", "ecn", "nodrop", "bandwidth", "10mbit", "probability", "0.1"],
    "netem": ["netem", "delay", "1ms"],
    "prio": ["prio"],
}
# Words `tc qdisc show` must print for a trial qdisc to count: a kernel older than 5.8 accepts
# RED's nodrop flag and ignores it, and the lab's lossless class must never be dropped by RED.
QDISC_SHOWS = {"red": ("ecn", "nodrop")}

# The smallest TC program there is: pass every packet. No headers needed.
BPF_PROBE_SECTION = "classifier"
BPF_PROBE_SOURCE = """\
struct __sk_buff;
__attribute__((section("classifier"), used))
int fabriclab_probe(struct __sk_buff *skb) { return 0; /* TC_ACT_OK */ }
char _license[] __attribute__((section("license"), used)) = "GPL";
"""


@dataclass(frozen=True)
class Capabilities:
    """What the probe found. For the tc fields, None means "not probed" (e.g. not root)."""

    root: bool = False
    kernel: str = ""
    loadable_modules: bool = False
    ovs_kernel_module: bool = False
    ovs_running: bool = False
    ovs_version: str | None = None
    htb: bool | None = None
    tbf: bool | None = None
    bfifo: bool | None = None
    red: bool | None = None
    netem: bool | None = None
    prio: bool | None = None
    clsact: bool | None = None
    bpf_classifier: bool | None = None
    clang: bool = False
    rdma_rxe: bool = False
    rdma_tool: bool = False
    pyverbs: bool = False          # rdma-core's Python verbs (python3-pyverbs), for the rxe agent
    ethtool: bool = False
    iperf3: bool = False
    mininet_system: bool = False
    mininet_here: bool = False
    realtime: bool | None = None   # a process may take SCHED_FIFO (None: not probed)
    preemption: str = ""           # the kernel's preemption model: none | voluntary | full | rt ("": unknown)
    # (capability, why) pairs explaining a failed or skipped probe.
    notes: tuple[tuple[str, str], ...] = ()

    def note(self, name):
        return dict(self.notes).get(name, "")


@dataclass(frozen=True)
class Mechanism:
    """One lab feature: whether it works here, what the lab uses for it, and why."""

    feature: str
    available: bool
    mechanism: str
    note: str
    required: bool = False
    planned: bool = False     # chosen for this kernel, but not yet built into the lab


# ---------------------------------------------------------------------------
# Mechanism selection: pure functions of Capabilities.


def _not_probed(caps, name):
    return caps.note(name) or "not probed"


def mechanisms(caps):
    """Map each lab feature key to the Mechanism the lab will use on a machine with `caps`.

    Keys, in table order: root, ovs, ovs_datapath, mininet, shaping, ecn, delay, queue_model,
    roce, pfc_agent, ethtool, iperf3. Mechanisms: ovs_datapath "kernel" | "userspace"; shaping "htb" | "tbf";
    ecn "red" | "bpf-clsact" | "unavailable"; delay "netem" | "none"; queue_model "bpf-clsact" |
    "unavailable"; roce "rdma_rxe" | "udp"; pfc_agent "SCHED_FIFO" | "SCHED_OTHER".
    """
    m = {}

    m["root"] = Mechanism(
        "root privileges", caps.root, "", "" if caps.root else "the lab needs root: " + ROOT_HINT,
        required=True)

    if caps.ovs_running:
        ovs_note = f"Open vSwitch {caps.ovs_version}" if caps.ovs_version else "running"
        for extra in ("ovs_heap", "rcu"):
            if caps.note(extra):
                ovs_note += "; " + caps.note(extra)
    else:
        hint = FIX_HINT if caps.root else ROOT_HINT
        ovs_note = (caps.note("ovs") or "not running") + "; " + hint
    m["ovs"] = Mechanism("Open vSwitch", caps.ovs_running,
                         "ovs-vswitchd" if caps.ovs_running else "", ovs_note, required=True)

    if caps.ovs_kernel_module:
        m["ovs_datapath"] = Mechanism("OVS datapath", True, "kernel",
                                      "openvswitch module loaded: datapath_type=system")
    else:
        why = caps.note("ovs_kernel_module") or "no openvswitch kernel module"
        m["ovs_datapath"] = Mechanism("OVS datapath", True, "userspace",
                                      f"{why}: datapath_type=netdev")

    if caps.mininet_here:
        mn_note = "importable"
    elif caps.mininet_system:
        mn_note = ("importable by /usr/bin/python3 only: create the venv with "
                   "--system-site-packages; " + FIX_HINT)
    else:
        mn_note = (caps.note("mininet") or "not installed") + "; " + FIX_HINT
    m["mininet"] = Mechanism("Mininet", caps.mininet_here, "mininet" if caps.mininet_here else "",
                             mn_note, required=True)

    if caps.htb:
        m["shaping"] = Mechanism("link shaping", True, "htb", "htb qdisc on each port",
                                 required=True)
    elif caps.tbf:
        m["shaping"] = Mechanism("link shaping", True, "tbf",
                                 "htb missing (" + _not_probed(caps, "htb") + "): single-rate tbf",
                                 required=True)
    else:
        m["shaping"] = Mechanism("link shaping", False, "",
                                 "neither htb nor tbf works: " + _not_probed(caps, "htb"),
                                 required=True)

    bpf_ok = bool(caps.clsact and caps.bpf_classifier)
    # ECN is marked under the queue model (which needs BPF for its accounting and PFC): by the
    # kernel's RED qdisc in each switch port's classes where it exists, else by the BPF program.
    if bpf_ok and caps.red:
        m["ecn"] = Mechanism("ECN marking", True, "red",
                             "RED qdisc (ecn nodrop) in each switch port's classes; the BPF program "
                             "counts its marks")
    elif bpf_ok:
        m["ecn"] = Mechanism("ECN marking", True, "bpf-clsact",
                             "no RED qdisc (" + _not_probed(caps, "red") + "): the queue model's BPF "
                             "program on port egress marks CE")
    else:
        why = "RED qdisc present, but " if caps.red else ""
        m["ecn"] = Mechanism("ECN marking", False, "unavailable",
                             why + "marking runs under the queue model, which needs BPF: " + _bpf_reason(caps))

    if caps.netem:
        m["delay"] = Mechanism("link delay", True, "netem",
                               "netem at each port's root, ahead of the shaping tree")
    else:
        m["delay"] = Mechanism("link delay", False, "none",
                               "no netem (" + _not_probed(caps, "netem") + "): links add no delay")

    if bpf_ok:
        m["queue_model"] = Mechanism("PFC/queue model", True, "bpf-clsact",
                                     "BPF on port clsact accounts queues, marks, signals PFC; "
                                     "tbf gates pause")
    else:
        m["queue_model"] = Mechanism("PFC/queue model", False, "unavailable", _bpf_reason(caps))

    if caps.rdma_rxe and caps.rdma_tool and caps.pyverbs:
        m["roce"] = Mechanism("RoCE transport", True, "rdma_rxe",
                              "soft-RoCE devices on the hosts' NIC ports, driven through RDMA verbs")
    else:
        if not caps.rdma_rxe:
            why = caps.note("rdma_rxe") or "no rdma_rxe module"
        elif not caps.rdma_tool:
            why = "the `rdma` tool (iproute2) is missing"
        else:
            why = "python3-pyverbs is missing (" + FIX_HINT + ")"
        m["roce"] = Mechanism("RoCE transport", True, "udp",
                              f"{why}: the lab's userspace RoCEv2 generator")

    if caps.realtime and caps.preemption in ("none", "voluntary"):
        # Measured 2026-11-28 (preempt=none, 2 cores): with a pytest run beside the lab, the agent's
        # longest wait for its wake-up grew from under 1 ms to 9 ms (benchmark --pfc-reaction).
        m["pfc_agent"] = Mechanism("PFC agent", True, "SCHED_FIFO",
                                   f"its own process, real-time scheduled; but this kernel preempts only at "
                                   f"points it chooses (preempt={caps.preemption}), so another program's work "
                                   f"in the kernel can hold a pause by milliseconds: boot with preempt=full")
    elif caps.realtime:
        m["pfc_agent"] = Mechanism("PFC agent", True, "SCHED_FIFO",
                                   "its own process, real-time scheduled: a pause waits for no other program")
    else:
        why = caps.note("realtime") or "not probed"
        m["pfc_agent"] = Mechanism("PFC agent", True, "SCHED_OTHER",
                                   f"no real-time scheduling ({why}): its own process, but pauses may wait "
                                   "for the CPU behind busy programs; give the lab CAP_SYS_NICE or RLIMIT_RTPRIO")

    m["ethtool"] = Mechanism(
        "offload control", caps.ethtool, "ethtool" if caps.ethtool else "",
        "turns checksum offload off on veths" if caps.ethtool else "ethtool missing; " + FIX_HINT)
    m["iperf3"] = Mechanism(
        "iperf3", caps.iperf3, "iperf3" if caps.iperf3 else "",
        "TCP baseline checks" if caps.iperf3 else "iperf3 missing; " + FIX_HINT)
    # Honesty: the choice is made here, but these mechanisms are not in the lab yet.
    for key in PLANNED:
        mech = m[key]
        if mech.mechanism in PLANNED[key]:
            m[key] = dataclasses.replace(mech, planned=True)
    return m


# Mechanisms doctor can choose that the lab does not run yet (none now).
PLANNED = {}


def _bpf_reason(caps):
    if not caps.clang:
        return "clang missing (needed to build BPF programs); " + FIX_HINT
    if not caps.clsact:
        return "clsact qdisc: " + _not_probed(caps, "clsact")
    return "bpf classifier: " + _not_probed(caps, "bpf_classifier")


def ovs_datapath_type(caps):
    """The OVS bridge datapath_type the fabric builder should use: "system" or "netdev"."""
    return "system" if mechanisms(caps)["ovs_datapath"].mechanism == "kernel" else "netdev"


def missing_required(mechs):
    """The required features that are not available, in table order."""
    return [m for m in mechs.values() if m.required and not m.available]


def check_required(caps=None):
    """Raise EnvironmentProblem naming every missing required feature; for code about to build."""
    caps = probe() if caps is None else caps
    missing = missing_required(mechanisms(caps))
    if missing:
        raise EnvironmentProblem(missing_message(missing))


def missing_message(missing):
    names = [m.feature for m in missing]
    if "root privileges" in names:
        others = [n for n in names if n != "root privileges"]
        also = f" (without root these could not be checked: {', '.join(others)})" if others else ""
        return f"not running as root: {ROOT_HINT}{also}"
    return f"missing required: {', '.join(names)}; {FIX_HINT}"


# ---------------------------------------------------------------------------
# Rendering.


def render_table(mechs):
    rows = [("feature", "available", "mechanism the lab uses", "note")]
    for m in mechs.values():
        mechanism = (m.mechanism or "-") + (" (planned)" if m.planned else "")
        rows.append((m.feature, "yes" if m.available else "no", mechanism, m.note))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = []
    for i, row in enumerate(rows):
        cells = [row[c].ljust(widths[c]) for c in range(3)]
        lines.append(" | ".join(cells + [row[3]]).rstrip())
        if i == 0:
            lines.append("-+-".join("-" * w for w in widths) + "-+-" + "-" * 4)
    return "\n".join(lines)


def render_json(caps, mechs):
    caps_dict = dataclasses.asdict(caps)
    caps_dict["notes"] = dict(caps.notes)
    missing = missing_required(mechs)
    doc = {
        "ok": not missing,
        "missing": [m.feature for m in missing],
        "ovs_datapath_type": ovs_datapath_type(caps),
        "features": {key: dataclasses.asdict(m) for key, m in mechs.items()},
        "capabilities": caps_dict,
    }
    return json.dumps(doc, indent=2)


# ---------------------------------------------------------------------------
# The probe: real attempts, cached per process.

_cache = None
_lock = threading.Lock()


def probe(refresh=False):
    """Probe this machine once per process (again with refresh=True) and return Capabilities."""
    global _cache
    with _lock:
        if _cache is None or refresh:
            _cache = _probe_now()
        return _cache


def _run(argv, timeout=30):
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(argv, 127, "", str(exc))


def _why(proc):
    """One line saying why a command failed."""
    for text in (proc.stderr, proc.stdout):
        for line in (text or "").splitlines():
            line = line.strip()
            if line:
                return line.removeprefix("Error: ")
    return f"exit status {proc.returncode}"


def _kernel_module(name, notes):
    """True if module `name` is loaded, loading it with modprobe when the kernel can."""
    if os.path.isdir(f"/sys/module/{name}"):
        return True
    if not os.path.exists("/proc/modules"):
        notes[name] = "kernel has no loadable modules"
        return False
    if shutil.which("modprobe") is None:
        notes[name] = "modprobe not installed"
        return False
    proc = _run(["modprobe", name])
    if proc.returncode == 0 and os.path.isdir(f"/sys/module/{name}"):
        return True
    notes[name] = "modprobe failed: " + _why(proc)
    return False


def _probe_ovs(notes):
    """(running, version): both ovsdb-server and ovs-vswitchd must answer."""
    if shutil.which("ovs-vsctl") is None:
        notes["ovs"] = "openvswitch-switch not installed"
        return False, None
    db = _run(["ovs-vsctl", "--timeout=5", "show"], timeout=10)
    if db.returncode != 0:
        notes["ovs"] = "ovsdb-server unreachable: " + _why(db)
        return False, None
    vswitchd = _run(["ovs-appctl", "--timeout=5", "-t", "ovs-vswitchd", "version"], timeout=10)
    if vswitchd.returncode != 0:
        notes["ovs"] = "ovs-vswitchd not answering: " + _why(vswitchd)
        return False, None
    first = vswitchd.stdout.strip().splitlines()
    version = first[0].split()[-1] if first else None
    if not _ovs_keeps_its_heap():
        notes["ovs_heap"] = ("ovs-vswitchd returns its heap to the kernel (started without "
                             "GLIBC_TUNABLES=glibc.malloc.trim_threshold): its first lab run may "
                             "saturate; `fabriclab provision` with no lab up restarts it with it")
    if _rcu_expedited() is False:
        notes["rcu"] = ("RCU grace periods are not expedited (/sys/kernel/rcu_expedited is 0): OVS waits "
                        "for one per packet socket it closes, so a 48-switch fabric takes 22 s to come "
                        "down instead of 5; `fabriclab provision` sets it")
    return True, version


RCU_EXPEDITED = pathlib.Path("/sys/kernel/rcu_expedited")


def _rcu_expedited():
    """Whether the kernel expedites RCU grace periods (see playbooks/roles/openvswitch/
    defaults/main.yml); None when it cannot be told."""
    try:
        return RCU_EXPEDITED.read_text().strip() != "0"
    except OSError:
        return None


def _ovs_keeps_its_heap():
    """Whether the running ovs-vswitchd was started with a raised malloc trim threshold (see
    playbooks/roles/openvswitch/defaults/main.yml); True when it cannot be told."""
    try:
        pid = pathlib.Path("/var/run/openvswitch/ovs-vswitchd.pid").read_text().strip()
        env = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return True
    return any(v.startswith(b"GLIBC_TUNABLES=") and b"glibc.malloc.trim_threshold=" in v for v in env)


def _mininet_importable(python):
    proc = _run([python, "-c", "import mininet.net"], timeout=60)
    return proc.returncode == 0, _why(proc)


def _probe_tc(root, clang, notes):
    """Try each qdisc, clsact and a BPF classifier on a veth inside a throwaway namespace."""
    names = list(QDISC_TRIALS) + ["clsact", "bpf_classifier"]
    found = dict.fromkeys(names)
    if not root:
        for name in names:
            notes[name] = "not probed: needs root"
        return found
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            for name in names:
                notes[name] = f"not probed: `{tool}` (iproute2) missing"
            return found

    netns = f"{PROBE_PREFIX}{os.getpid()}"
    created = False
    try:
        add = _run(["ip", "netns", "add", netns])
        if add.returncode != 0:
            for name in names:
                notes[name] = "not probed: cannot create a network namespace: " + _why(add)
            return found
        created = True
        veth = _run(["ip", "-n", netns, "link", "add", "flp0", "type", "veth",
                     "peer", "name", "flp1"])
        if veth.returncode != 0:
            for name in names:
                notes[name] = "not probed: cannot create a veth pair: " + _why(veth)
            return found
        _run(["ip", "-n", netns, "link", "set", "flp0", "up"])
        _run(["ip", "-n", netns, "link", "set", "flp1", "up"])

        for name, args in QDISC_TRIALS.items():
            proc = _run(["tc", "-n", netns, "qdisc", "add", "dev", "flp0", "root", *args])
            found[name] = proc.returncode == 0
            if found[name]:
                shown = _run(["tc", "-n", netns, "qdisc", "show", "dev", "flp0"]).stdout.split()
                missing = [word for word in QDISC_SHOWS.get(name, ()) if word not in shown]
                if missing:
                    found[name] = False
                    notes[name] = f"the kernel ignored {' '.join(missing)} (too old)"
                _run(["tc", "-n", netns, "qdisc", "del", "dev", "flp0", "root"])
            else:
                notes[name] = _why(proc)

        proc = _run(["tc", "-n", netns, "qdisc", "add", "dev", "flp0", "clsact"])
        found["clsact"] = proc.returncode == 0
        if not found["clsact"]:
            notes["clsact"] = _why(proc)
            notes["bpf_classifier"] = "not probed: clsact missing"
        elif not clang:
            notes["bpf_classifier"] = "not probed: clang missing"
        else:
            found["bpf_classifier"] = _probe_bpf(netns, notes)
    finally:
        if created:
            _run(["ip", "netns", "del", netns])
    return found


def _probe_bpf(netns, notes):
    with tempfile.TemporaryDirectory(prefix="fabriclab-bpf-") as tmp:
        src = os.path.join(tmp, "probe.c")
        obj = os.path.join(tmp, "probe.o")
        with open(src, "w") as f:
            f.write(BPF_PROBE_SOURCE)
        cc = _run(["clang", "-target", "bpf", "-O2", "-c", src, "-o", obj], timeout=60)
        if cc.returncode != 0:
            notes["bpf_classifier"] = "clang -target bpf failed: " + _why(cc)
            return False
        attach = _run(["tc", "-n", netns, "filter", "add", "dev", "flp0", "egress",
                       "bpf", "da", "obj", obj, "sec", BPF_PROBE_SECTION])
        if attach.returncode != 0:
            notes["bpf_classifier"] = "tc filter ... bpf da failed: " + _why(attach)
            return False
        return True


def cleanup_stale_probes():
    """Delete flprobe-<pid> namespaces whose process is gone (a probe killed midway); return them."""
    if shutil.which("ip") is None:
        return []
    listing = _run(["ip", "netns", "list"])
    removed = []
    for line in listing.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(PROBE_PREFIX):
            continue
        pid = name[len(PROBE_PREFIX):]
        if pid.isdigit() and pid_alive(int(pid)):
            continue
        if _run(["ip", "netns", "del", name]).returncode == 0:
            removed.append(name)
    return removed


def kernel_preemption(release_version="", cmdline="", config="", debugfs=""):
    """The running kernel's preemption model from what it shows: debugfs's sched/preempt ("none
    (voluntary) full": the one in brackets), else `preempt=` on a PREEMPT_DYNAMIC kernel's command
    line, else its build config, else `uname -v` (PREEMPT_RT, PREEMPT); "" when none of them says."""
    import re

    current = re.search(r"\((none|voluntary|full|lazy)\)", debugfs or "")
    if current:
        return current.group(1)
    if "PREEMPT_RT" in release_version:
        return "rt"
    chosen = re.search(r"(?:^|\s)preempt=(none|voluntary|full|lazy)(?:\s|$)", cmdline or "")
    if chosen and "PREEMPT_DYNAMIC" in release_version:
        return chosen.group(1)
    for option, model in (("CONFIG_PREEMPT_RT", "rt"), ("CONFIG_PREEMPT_NONE", "none"),
                          ("CONFIG_PREEMPT_VOLUNTARY", "voluntary"), ("CONFIG_PREEMPT_LAZY", "lazy"),
                          ("CONFIG_PREEMPT", "full")):
        if re.search(rf"^{option}=y$", config or "", re.M):
            return model
    if re.search(r"\bPREEMPT\b", release_version) and "PREEMPT_DYNAMIC" not in release_version:
        return "full"
    return ""


def _probe_preemption():
    def read(path, limit=1 << 20):
        try:
            if path.endswith(".gz"):
                import gzip

                with gzip.open(path, "rt", errors="replace") as fh:
                    return fh.read(limit * 8)
            with open(path, errors="replace") as fh:
                return fh.read(limit)
        except (OSError, EOFError):
            return ""

    config = read(f"/boot/config-{platform.release()}") or read("/proc/config.gz")
    return kernel_preemption(platform.version(), read("/proc/cmdline", 4096), config,
                             read("/sys/kernel/debug/sched/preempt", 256))


def _probe_realtime(notes):
    """Whether a process of ours may take SCHED_FIFO, as the PFC agent asks (queues/agentproc.py)."""
    proc = _run([sys.executable, "-c", "import os; os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))"])
    if proc.returncode != 0:
        notes["realtime"] = (_why(proc) or "refused")[-120:]
    return proc.returncode == 0


def _probe_now():
    notes = {}
    root = os.geteuid() == 0
    if root:
        cleanup_stale_probes()
    clang = shutil.which("clang") is not None
    if not clang:
        notes["clang"] = "clang not installed"

    ovs_running, ovs_version = _probe_ovs(notes)
    ovs_kmod = _kernel_module("openvswitch", notes)
    if "openvswitch" in notes:
        notes["ovs_kernel_module"] = notes.pop("openvswitch")
    rxe = _kernel_module("rdma_rxe", notes)

    # The lab runs Mininet in this interpreter (the venv); /usr/bin/python3 is where it comes from.
    mn_system, why_system = _mininet_importable(SYSTEM_PYTHON)
    if os.path.realpath(sys.executable) == os.path.realpath(SYSTEM_PYTHON):
        mn_here, why_here = mn_system, why_system
    else:
        mn_here, why_here = _mininet_importable(sys.executable)
    if not mn_here:
        notes["mininet"] = why_here

    tc = _probe_tc(root, clang, notes)
    realtime = _probe_realtime(notes)

    return Capabilities(
        root=root,
        kernel=platform.release(),
        loadable_modules=os.path.exists("/proc/modules"),
        ovs_kernel_module=ovs_kmod,
        ovs_running=ovs_running,
        ovs_version=ovs_version,
        clang=clang,
        rdma_rxe=rxe,
        rdma_tool=shutil.which("rdma") is not None,
        pyverbs=importlib.util.find_spec("pyverbs") is not None,
        ethtool=shutil.which("ethtool") is not None,
        iperf3=shutil.which("iperf3") is not None,
        mininet_system=mn_system,
        mininet_here=mn_here,
        realtime=realtime,
        preemption=_probe_preemption(),
        notes=tuple(sorted(notes.items())),
        **tc,
    )


# ---------------------------------------------------------------------------
# The `doctor` subcommand.


__all__ = [
    "Capabilities", "Mechanism", "probe", "mechanisms", "ovs_datapath_type", "missing_required",
    "check_required", "render_table", "render_json", "cleanup_stale_probes",
    "require_environment",
]


def require_environment():
    """Root and a reachable Open vSwitch, or a one-line error saying what to run."""
    if os.geteuid() != 0:
        raise EnvironmentProblem("building a fabric needs root: run with sudo")
    try:
        ok = subprocess.run(["ovs-vsctl", "--timeout=5", "show"], capture_output=True).returncode == 0
    except FileNotFoundError:
        raise EnvironmentProblem("Open vSwitch is not installed: run `sudo ./lab.sh bootstrap`") from None
    if not ok:
        raise EnvironmentProblem("Open vSwitch is not running: run `sudo fabriclab provision` "
                                 "(or `/usr/share/openvswitch/scripts/ovs-ctl start`)")
