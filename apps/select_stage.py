"""The uplink selection stage (select_stage.bpf.c) from Python: load, attach, program, read.

The E-ECMP and flowlet apps load the stage in the controller process; `StageSync` attaches it to
the egress of every fabric port of every switch (tc clsact, prio 1) and writes the members of
every ECMP group into its `members` map whenever the controller recomputes, before OpenFlow
changes go out (a dead member leaves the map at the moment the controller hears of it). The maps are pinned under
/sys/fs/bpf/fabriclab/<run id>/select/, so the lab can read the counters (`read_stats`) and
`fabriclab clean` removes what a killed run left.

`flow_hash` is the stage's hash in Python, bit for bit: tests and tools predict with it which
member E-ECMP picks for a packet.
"""

from __future__ import annotations

import ctypes
import pathlib
import socket
import subprocess
import sys
import time

from fabriclab.apps.control import StageStatus
from fabriclab.errors import LabError
from fabriclab.queues import datapath

SOURCE = pathlib.Path(__file__).with_name("select_stage.bpf.c")
PROGRAM = "select_egress"
PRIO = 1                     # before link loss (prio 2) and the queue model's program (prio 3)
MAX_MEMBERS = 16
MODES = {"off": 0, "hash": 1, "flowlet": 2}
ROCE_PORT = 4791
HIST_BUCKETS = 32
COUNTERS = ("packets", "redirected", "roce", "no_members", "flowlet_new", "flowlet_kept",
            "flowlet_expired", "flowlet_moved", "member_gone")
NSTATS = len(COUNTERS) + HIST_BUCKETS
EVENTS = {0: None, 4: "new", 5: "kept", 6: "expired", 7: "moved", 8: "member_gone"}


class Config(ctypes.Structure):
    _fields_ = [("mode", ctypes.c_uint32), ("hash_qp", ctypes.c_uint32), ("gap_ns", ctypes.c_uint64),
                ("window_ns", ctypes.c_uint64), ("clock_ns", ctypes.c_uint64),
                ("seed", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


class MemberKey(ctypes.Structure):
    _fields_ = [("ifindex", ctypes.c_uint32), ("net", ctypes.c_uint32)]


class Members(ctypes.Structure):
    _fields_ = [("n", ctypes.c_uint32), ("ifindex", ctypes.c_uint32 * MAX_MEMBERS)]


class Decision(ctypes.Structure):
    _fields_ = [("chosen", ctypes.c_uint32), ("event", ctypes.c_uint32)]


class TestRunOpts(ctypes.Structure):
    """libbpf's struct bpf_test_run_opts (the fields up to `cpu`)."""
    _fields_ = [("sz", ctypes.c_size_t), ("data_in", ctypes.c_void_p), ("data_out", ctypes.c_void_p),
                ("data_size_in", ctypes.c_uint32), ("data_size_out", ctypes.c_uint32),
                ("ctx_in", ctypes.c_void_p), ("ctx_out", ctypes.c_void_p),
                ("ctx_size_in", ctypes.c_uint32), ("ctx_size_out", ctypes.c_uint32),
                ("retval", ctypes.c_uint32), ("repeat", ctypes.c_int), ("duration", ctypes.c_uint32),
                ("flags", ctypes.c_uint32), ("cpu", ctypes.c_uint32), ("batch_size", ctypes.c_uint32)]


# -- the hash, as the stage computes it -----------------------------------------------------------
MASK = 0xFFFFFFFF


def mix(h, w):
    """murmur3's 32-bit finalizer after folding in one word (select_stage.bpf.c: mix)."""
    h = (h ^ w) & MASK
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & MASK
    h ^= h >> 16
    return h


def _ip(address):
    return int.from_bytes(socket.inet_aton(address), "big")


def flow_hash(src, dst, proto, sport, dport, qp=None, seed=0):
    """The stage's hash of a packet: 5-tuple, then the BTH destination QP when `qp` is given
    (E-ECMP hashes it for every RoCEv2 packet)."""
    h = seed & MASK
    for word in (_ip(src), _ip(dst), ((sport & 0xFFFF) << 16) | (dport & 0xFFFF), proto):
        h = mix(h, word)
    return mix(h, qp & 0xFFFFFF) if qp is not None else h


def eecmp_member(members, src, dst, sport, qp, seed=0, dport=ROCE_PORT, proto=17):
    """Which of `members` (in the group's order) E-ECMP sends a RoCEv2 packet to."""
    return members[flow_hash(src, dst, proto, sport, dport, qp, seed) % len(members)]


def net_key(address):
    """A destination's /24 as the stage keys it (network byte order in a native u32)."""
    raw = socket.inet_aton(address)
    return int.from_bytes(raw[:3] + b"\0", sys.byteorder)


# -- members from the controller's desired state ----------------------------------------------------
def group_members(fabric, desired):
    """{(egress interface, destination /24 address): [member interfaces]} for every select group
    with two or more members, from the routing's desired switch states."""
    table = {}
    for switch, state in desired.items():
        names = fabric.switch_ports(switch)
        for flow in state.flows:
            if flow.action[0] != "group":
                continue
            dst = dict(flow.match).get("ipv4_dst")
            ports = state.groups.get(flow.action[1])
            if not isinstance(dst, tuple) or not isinstance(ports, tuple) or len(ports) < 2:
                continue
            intfs = [names[p] for p in sorted(ports)]
            for intf in intfs:
                table[(intf, dst[0])] = intfs
    return table


def fabric_port_names(fabric, switch):
    """A switch's interfaces that face other switches (where the stage is attached)."""
    out = []
    for link in fabric.fabric_links:
        if link.a == switch:
            out.append(link.a_intf)
        elif link.b == switch:
            out.append(link.b_intf)
    return out


def pins_for(run_id):
    return datapath.pin_dir(run_id) / "select"


def stage_settings(mode, options):
    """SelectStage's settings in `mode` from a routing app's options (apps/__init__.py)."""
    settings = {"seed": options.get("seed", 0)}
    if mode == "flowlet":
        settings.update(hash_qp=options.get("qp", False), gap_ns=options["gap_us"] * 1e3,
                        window_ns=options.get("load_window_us", 2000.0) * 1e3)
    return settings


class StageSync:
    """Keeps a loaded stage attached to every connected switch's fabric ports and its members
    equal to the select groups of the state the controller is about to program."""

    def __init__(self, stage, fabric, mode):
        self.stage = stage
        self.fabric = fabric
        self.mode = mode
        self.updated = None

    def before_program(self, desired, connected):
        # Attach to a switch's ports once it has connected (its interfaces exist by then), and
        # write the members first: a member whose link died must leave before anything else.
        for switch in sorted(connected):
            self.stage.attach(fabric_port_names(self.fabric, switch))
        self.stage.set_members(group_members(self.fabric, desired))
        self.updated = time.time()

    def status(self):
        return StageStatus(self.mode, str(self.stage.pins), len(self.stage.written), len(self.stage.attached),
                           self.updated)


class SelectStage:
    """One loaded stage (one per controller process); `mode` is 'hash' or 'flowlet'."""

    def __init__(self, pins, mode, gap_ns=0, window_ns=2_000_000, hash_qp=False, seed=0):
        if mode not in MODES:
            raise ValueError(f"stage mode must be one of {', '.join(MODES)}")
        self.pins = pathlib.Path(pins)
        self.settings = Config(MODES[mode], int(hash_qp), int(gap_ns), max(1, int(window_ns)), 0,
                               seed & MASK, 0)
        self.obj = None
        self.written = {}          # MemberKey tuple -> members tuple, as in the map
        self.attached = set()

    def load(self):
        lib = datapath.libbpf()
        path = datapath.compile_object(SOURCE, "the routing apps' selection stage")
        datapath.ensure_bpffs()
        obj = lib.bpf_object__open_file(str(path).encode(), None)
        if not obj:
            raise LabError(f"libbpf cannot open {path}")
        self.obj = obj
        err = lib.bpf_object__load(obj)
        if err:
            raise LabError(f"the kernel refused the selection stage's eBPF program: {err}")
        datapath.remove_pins(target=self.pins)
        self.pins.mkdir(parents=True)
        prog = lib.bpf_object__find_program_by_name(obj, PROGRAM.encode())
        if lib.bpf_program__pin(prog, str(self.pins / PROGRAM).encode()):
            raise LabError(f"cannot pin the selection stage under {self.pins}")
        self.prog_fd = lib.bpf_program__fd(prog)
        maps = {}
        for name in ("config", "members", "flowlets", "loads", "stats", "last"):
            ptr = lib.bpf_object__find_map_by_name(obj, name.encode())
            if name in ("config", "stats", "members") and lib.bpf_map__pin(ptr, str(self.pins / name).encode()):
                raise LabError(f"cannot pin the selection stage's {name} map under {self.pins}")
            maps[name] = lib.bpf_map__fd(ptr)
        self.config = datapath.Map(maps["config"], ctypes.c_uint32, Config)
        self.members = datapath.Map(maps["members"], MemberKey, Members)
        self.stats_map = datapath.Map(maps["stats"], ctypes.c_uint32, ctypes.c_uint64)
        self.last = datapath.Map(maps["last"], ctypes.c_uint32, Decision)
        self.flowlets_fd = maps["flowlets"]
        self.config.update(0, self.settings)
        return self

    # -- attaching ----------------------------------------------------------------------------------
    def attach(self, intfs):
        """Put the stage on the egress of root-namespace interfaces (the switches' ports)."""
        todo = [i for i in intfs if i not in self.attached]
        if not todo:
            return
        cmds = []
        for intf in todo:
            cmds += [f"qdisc replace dev {intf} clsact",
                     f"filter replace dev {intf} egress prio {PRIO} handle 1 bpf da pinned "
                     f"{self.pins / PROGRAM}"]
        proc = subprocess.run(["tc", "-batch", "-"], input="\n".join(cmds) + "\n",
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise LabError(f"attaching the selection stage failed: "
                           f"{(proc.stderr.strip().splitlines() or ['?'])[0]}")
        self.attached.update(todo)

    # -- members ------------------------------------------------------------------------------------
    def set_members(self, table):
        """Write {(egress interface, /24 address): [member interfaces]}; entries not in `table`
        are removed. Interfaces that do not exist (yet) are left out."""
        wanted = {}
        for (intf, net), member_intfs in table.items():
            try:
                here = socket.if_nametoindex(intf)
                indexes = tuple(socket.if_nametoindex(m) for m in member_intfs[:MAX_MEMBERS])
            except OSError:
                continue
            wanted[(here, net_key(net))] = indexes
        for key in set(self.written) - set(wanted):
            self.members.delete(MemberKey(*key))
        for key, indexes in wanted.items():
            if self.written.get(key) != indexes:
                value = Members(len(indexes))
                for i, index in enumerate(indexes):
                    value.ifindex[i] = index
                self.members.update(MemberKey(*key), value)
        self.written = wanted

    # -- counters and tests -------------------------------------------------------------------------
    def stats(self):
        return stats_from(self.stats_map)

    def set_clock(self, clock_ns):
        """Run the stage on a fake clock (tests); 0 returns it to the kernel's clock."""
        self.settings.clock_ns = int(clock_ns)
        self.config.update(0, self.settings)

    def test_run(self, packet, ifindex, mark=0):
        """Run the program once on `packet` as if leaving by `ifindex` (BPF_PROG_TEST_RUN):
        (tc verdict, ifindex the stage chose or 0, event name)."""
        self.last.update(0, Decision(0, 0))
        data = ctypes.create_string_buffer(bytes(packet), len(packet))
        ctx = (ctypes.c_uint8 * 192)()           # struct __sk_buff: mark at 8, ifindex at 40
        ctypes.c_uint32.from_buffer(ctx, 8).value = mark
        ctypes.c_uint32.from_buffer(ctx, 40).value = ifindex
        opts = TestRunOpts(sz=ctypes.sizeof(TestRunOpts), data_in=ctypes.cast(data, ctypes.c_void_p),
                           data_size_in=len(packet), ctx_in=ctypes.cast(ctx, ctypes.c_void_p),
                           ctx_size_in=ctypes.sizeof(ctx), repeat=1)
        err = datapath.libbpf().bpf_prog_test_run_opts(self.prog_fd, ctypes.byref(opts))
        if err:
            raise LabError(f"BPF_PROG_TEST_RUN failed: {err}")
        decision = self.last.lookup(0)
        return opts.retval, decision.chosen, EVENTS.get(decision.event)

    def close(self):
        datapath.remove_pins(target=self.pins)
        if self.obj:
            datapath.libbpf().bpf_object__close(self.obj)
            self.obj = None


def stats_from(stats_map):
    values = stats_map.lookup_all(NSTATS)
    out = {name: int(values[i]) for i, name in enumerate(COUNTERS)}
    hist = [int(values[len(COUNTERS) + b]) for b in range(HIST_BUCKETS)]
    # bucket 0: under 1 us; bucket b: [2^(b-1), 2^b) us
    out["gap_histogram_us"] = {("<1" if b == 0 else f"{1 << (b - 1)}-{1 << b}"): n
                               for b, n in enumerate(hist) if n}
    return out


def read_stats(run_id):
    """The stage's counters of a live run, from its pins (None when no stage is loaded)."""
    path = pins_for(run_id) / "stats"
    if not path.exists():
        return None
    stats_map = datapath.Map.pinned(path, ctypes.c_uint32, ctypes.c_uint64)
    if stats_map is None:
        return None
    try:
        return stats_from(stats_map)
    finally:
        stats_map.close()


def detach(fabric):
    """Take the stage off every switch port (when a run changes to an app without one)."""
    cmds = [f"filter del dev {intf} egress prio {PRIO}"
            for switch in fabric.switches for intf in fabric_port_names(fabric, switch)]
    if cmds:
        subprocess.run(["tc", "-force", "-batch", "-"], input="\n".join(cmds) + "\n",
                       capture_output=True, text=True)
