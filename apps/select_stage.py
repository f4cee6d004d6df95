"""The uplink selection stage (select_stage.bpf.c) from Python: load, attach, program, read.

The E-ECMP, flowlet and adaptive routing apps load the stage in the controller process;
`StageSync` attaches it to the egress of every fabric port of every switch (tc clsact, prio 1) and,
whenever the controller recomputes and before OpenFlow changes go out, writes the members of every
ECMP group with their capacity weights into its `members` map, and each port's rate and queue
model index into `port_cfg`. A member whose link dies leaves every choice when the first packet
finds it without carrier (on kernels that let the stage read its device, else when the controller
hears of it and rewrites the members). AR reads the queue model's occupancies once its `stats`
map is linked (`link_queues`: the model starts after the controller). The maps are pinned under
/sys/fs/bpf/fabriclab/<run id>/select/, so the lab can read the counters (`read_stats`) and the
ports' records (`read_ports`), and `fabriclab clean` removes what a killed run left.

`flow_hash` is the stage's hash in Python, bit for bit: tests and tools predict with it which
member E-ECMP picks for a packet; `ar_choices` is AR's choice as probabilities.
"""

from __future__ import annotations

import ctypes
import errno
import os
import pathlib
import socket
import subprocess
import sys
import time

from fabriclab.apps.control import StageStatus
from fabriclab.apps.hashing import eecmp_member, flow_hash, mix  # noqa: F401 - the stage's Python twins
from fabriclab.apps.ecmp import WeightedGroup, group_ports
from fabriclab.errors import LabError
from fabriclab.queues import datapath

SOURCE = pathlib.Path(__file__).with_name("select_stage.bpf.c")
PROGRAM = "select_egress"
PRIO = 1                     # before link loss (prio 2) and the queue model's program (prio 3)
MAX_MEMBERS = 16
MODES = {"off": 0, "hash": 1, "flowlet": 2, "ar": 3}
CFG_CARRIER = 1              # config flags: a member without carrier leaves in the data path
CFG_QUEUES_LINKED = 0x100    # (noted by user space) AR reads the queue model's occupancies
ROCE_PORT = 4791
STAGE_MARK = 0x40000000     # on a packet the stage redirected (select_stage.bpf.c)
HIST_BUCKETS = 32
COUNTERS = ("packets", "redirected", "roce", "no_members", "flowlet_new", "flowlet_kept",
            "flowlet_expired", "flowlet_moved", "member_gone", "ar_tied", "ar_queue_model",
            "ar_virtual", "carrier_lost", "rescued", "skipped_down", "no_live")
NSTATS = len(COUNTERS) + HIST_BUCKETS
EVENTS = {0: None, 4: "new", 5: "kept", 6: "expired", 7: "moved", 8: "member_gone", 9: "ar", 13: "rescued"}
# The kernel function that lets a tc program read the device it runs on (Linux 6.3+); where the
# kernel lacks it, the stage is built without reading the carrier and a dead member leaves when
# the controller recomputes.
CARRIER_KFUNC = "bpf_cast_to_kern_ctx"
KERNEL_BTF = pathlib.Path("/sys/kernel/btf/vmlinux")
MAPS = ("config", "members", "flowlets", "loads", "stats", "last", "port_cfg", "vqueues", "port_down",
        "port_state", "queue_stats")
PINNED = ("config", "stats", "members", "port_state")


class Config(ctypes.Structure):
    _fields_ = [("mode", ctypes.c_uint32), ("hash_qp", ctypes.c_uint32), ("gap_ns", ctypes.c_uint64),
                ("window_ns", ctypes.c_uint64), ("clock_ns", ctypes.c_uint64),
                ("seed", ctypes.c_uint32), ("flags", ctypes.c_uint32), ("quantum", ctypes.c_uint32),
                ("pad", ctypes.c_uint32)]


class MemberKey(ctypes.Structure):
    _fields_ = [("ifindex", ctypes.c_uint32), ("net", ctypes.c_uint32)]


class Members(ctypes.Structure):
    _fields_ = [("n", ctypes.c_uint32), ("ifindex", ctypes.c_uint32 * MAX_MEMBERS),
                ("weight", ctypes.c_uint32 * MAX_MEMBERS)]


class PortCfg(ctypes.Structure):
    _fields_ = [("rate_bytes", ctypes.c_uint64), ("qport", ctypes.c_uint32), ("basis", ctypes.c_uint32)]


class PortState(ctypes.Structure):
    _fields_ = [("chosen", ctypes.c_uint64), ("last_chosen_ns", ctypes.c_uint64),
                ("down_seen_ns", ctypes.c_uint64), ("down_events", ctypes.c_uint64),
                ("chosen_down_ns", ctypes.c_uint64)]


class Decision(ctypes.Structure):
    _fields_ = [("chosen", ctypes.c_uint32), ("event", ctypes.c_uint32), ("tied_weight", ctypes.c_uint32),
                ("pad", ctypes.c_uint32)]


# The stage reads the queue model's rows (datapath.QStat) up to `occ`; tests check the layout.
QSTAT_OCC_OFFSET = 48
QSTAT_SIZE = 152
BPF_MAP_TYPE_ARRAY = 2


class TestRunOpts(ctypes.Structure):
    """libbpf's struct bpf_test_run_opts (the fields up to `cpu`)."""
    _fields_ = [("sz", ctypes.c_size_t), ("data_in", ctypes.c_void_p), ("data_out", ctypes.c_void_p),
                ("data_size_in", ctypes.c_uint32), ("data_size_out", ctypes.c_uint32),
                ("ctx_in", ctypes.c_void_p), ("ctx_out", ctypes.c_void_p),
                ("ctx_size_in", ctypes.c_uint32), ("ctx_size_out", ctypes.c_uint32),
                ("retval", ctypes.c_uint32), ("repeat", ctypes.c_int), ("duration", ctypes.c_uint32),
                ("flags", ctypes.c_uint32), ("cpu", ctypes.c_uint32), ("batch_size", ctypes.c_uint32)]


# -- the hash, as the stage computes it: apps/hashing.py (mix, flow_hash, eecmp_member), with each
# switch's basis in its ports' PortCfg
MASK = 0xFFFFFFFF


def ar_choices(depths, weights=None, quantum=0, down=()):
    """Where adaptive routing sends a packet, as {member: probability}: the members (not in
    `down`) at the least depth in bytes, scaled by the largest weight over the member's own and
    compared in steps of `quantum` bytes; among those, each in proportion to its weight."""
    weights = weights or {m: 1 for m in depths}
    wmax = max([1, *weights.values()])
    step = quantum or 1
    level = {m: depths[m] * wmax // weights[m] // step for m in depths if m not in down and weights[m] > 0}
    if not level:
        return {}
    least = min(level.values())
    tied = [m for m, v in level.items() if v == least]
    total = sum(weights[m] for m in tied)
    return {m: weights[m] / total for m in tied}


def net_key(address):
    """A destination's /24 as the stage keys it (network byte order in a native u32)."""
    raw = socket.inet_aton(address)
    return int.from_bytes(raw[:3] + b"\0", sys.byteorder)


# -- members from the controller's desired state ----------------------------------------------------
def group_members(fabric, desired):
    """{(egress interface, destination /24 address): [(member interface, weight)]} for every
    select group with two or more members, from the routing's desired switch states."""
    table = {}
    for switch, state in desired.items():
        names = fabric.switch_ports(switch)
        for flow in state.flows:
            if flow.action[0] != "group":
                continue
            dst = dict(flow.match).get("ipv4_dst")
            group = state.groups.get(flow.action[1])
            if not isinstance(dst, tuple) or not isinstance(group, (tuple, WeightedGroup)):
                continue
            members = sorted(group_ports(group))
            if len(members) < 2:
                continue
            entry = [(names[port], weight) for port, weight in members]
            for intf, _weight in entry:
                table[(intf, dst[0])] = entry
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


def port_settings(fabric, seed=0, shared=False):
    """{interface: (rate in Mbit/s, queue model port index + 1 or 0, its switch's hash basis)} of
    every fabric port, and the number of rows of the queue model's stats map (0 without one)."""
    from fabriclab.apps.hashing import switch_basis

    qports, rows = {}, 0
    if fabric.spec.queues is not None:
        from fabriclab.queues.model import port_table

        table = port_table(fabric)
        qports = {p.name: p.idx + 1 for p in table}
        rows = len(table) * datapath.NCLASS
    out = {}
    for link in fabric.fabric_links:
        for switch, intf in ((link.a, link.a_intf), (link.b, link.b_intf)):
            basis = switch_basis(fabric.switches[switch].dpid, seed, shared)
            out[intf] = (link.rate_mbps, qports.get(intf, 0), basis)
    return out, rows


def pins_for(run_id):
    return datapath.pin_dir(run_id) / "select"


def queue_stats_pin(run_id):
    """Where the queue model of run `run_id` pins its per port and class counters."""
    return datapath.pin_dir(run_id) / "queues" / "stats"


def stage_settings(mode, options):
    """SelectStage's settings in `mode` from a routing app's options (apps/__init__.py)."""
    settings = {"seed": options.get("seed", 0), "carrier": options.get("carrier", True)}
    if mode == "flowlet":
        settings.update(hash_qp=options.get("qp", False), gap_ns=options["gap_us"] * 1e3,
                        window_ns=options.get("load_window_us", 2000.0) * 1e3)
    if mode == "ar":
        settings.update(quantum=options.get("quantum_bytes", 0))
    return settings


def kernel_lets_stage_read_carrier(btf=KERNEL_BTF):
    """Whether the kernel has the function that lets a tc program read its device."""
    try:
        return b"\0" + CARRIER_KFUNC.encode() + b"\0" in btf.read_bytes()
    except OSError:
        return False


class StageRefused(LabError):
    """The kernel refused to load the stage. `verdict`: its verifier's, which the same kernel gives
    the same program every time (too complex, invalid), not a want of memory or privilege."""

    VERDICTS = (errno.E2BIG, errno.EACCES, errno.EINVAL)

    def __init__(self, err):
        super().__init__(f"the kernel refused the selection stage's eBPF program: {err}")
        self.verdict = -err in self.VERDICTS


def _refusal_marker():
    """Where the refusal of this carrier variant by this kernel is remembered: beside the compile
    cache's objects, named for the source's text and the kernel's release."""
    import hashlib
    import platform

    digest = hashlib.sha256(stage_source(True).read_bytes()).hexdigest()[:16]
    return datapath.cache_dir() / f"select_stage_carrier-{digest}.refused-{platform.release()[:60]}"


def carrier_refused():
    """Whether this kernel refused the carrier variant of this stage's text before. Its verifier
    gives up on it after a million instructions, 10 s of CPU, on every load (seen on 6.18 with
    the kfunc present), and every routing app with a stage loads one: without this memory each
    start of E-ECMP, flowlet or AR paid 10 s for the same refusal."""
    marker = _refusal_marker()
    if not os.path.lexists(marker):
        return False
    datapath.check_private(marker)
    return True


def remember_carrier_refused(exc):
    marker = _refusal_marker()
    tmp = marker.with_name(f"{marker.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{str(exc)[:300]}\n")
    tmp.replace(marker)


def stage_source(reads_carrier):
    """The stage's source, with STAGE_READS_CARRIER defined for the variant that reads it (a file
    of its own in the compile cache, so each variant is compiled once per version of the text)."""
    if not reads_carrier:
        return SOURCE
    text = f'#define STAGE_READS_CARRIER 1\n#line 1 "{SOURCE.name}"\n' + SOURCE.read_text()
    path = datapath.cache_dir() / "select_stage_carrier.bpf.c"
    if os.path.lexists(path):
        datapath.check_private(path)
        if path.read_text() == text:
            return path
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


class StageSync:
    """Keeps a loaded stage attached to every connected switch's fabric ports, its members equal to
    the select groups of the state the controller is about to program, and its ports' settings."""

    def __init__(self, stage, fabric, mode, run_id="", seed=0, shared=False):
        self.stage = stage
        self.fabric = fabric
        self.mode = mode
        self.ports, _rows = port_settings(fabric, seed, shared)
        self.queue_pin = queue_stats_pin(run_id) if fabric.spec.queues is not None and mode == "ar" else None
        self.updated = None

    def before_program(self, desired, connected):
        # Attach to a switch's ports once it has connected (its interfaces exist by then), and
        # write the members first: a member whose link died must leave before anything else.
        for switch in sorted(connected):
            self.stage.attach(fabric_port_names(self.fabric, switch))
        self.stage.set_ports(self.ports)
        self.stage.set_members(group_members(self.fabric, desired))
        self.stage.forget_down_ports_that_are_up()
        self.link_queues()
        self.updated = time.time()

    def link_queues(self):
        """Link the queue model's occupancies once it has pinned them; True when linked (or when
        this stage has no use for them)."""
        if self.queue_pin is None or self.stage.queues_linked:
            return True
        return self.stage.link_queues(self.queue_pin)

    def status(self):
        return StageStatus(self.mode, str(self.stage.pins), len(self.stage.written), len(self.stage.attached),
                           self.updated, self.stage.depth_source() if self.mode == "ar" else "",
                           self.stage.carrier_source())


class SelectStage:
    """One loaded stage (one per controller process); `mode` is 'hash', 'flowlet' or 'ar'.
    `queue_rows`: the size of the queue model's stats map AR may link (0: none)."""

    def __init__(self, pins, mode, gap_ns=0, window_ns=2_000_000, hash_qp=False, seed=0, quantum=0,
                 carrier=True, queue_rows=0):
        if mode not in MODES:
            raise ValueError(f"stage mode must be one of {', '.join(MODES)}")
        self.pins = pathlib.Path(pins)
        self.settings = Config(MODES[mode], int(hash_qp), int(gap_ns), max(1, int(window_ns)), 0,
                               seed & MASK, 0, int(quantum), 0)
        self.want_carrier = carrier
        self.reads_carrier = False
        self.queue_rows = queue_rows
        self.queues_linked = False
        self.link_error = ""
        self.obj = None
        self.written = {}          # MemberKey tuple -> ((ifindex, weight), ...), as in the map
        self.port_written = {}     # ifindex -> (rate_bytes, qport, basis)
        self.attached = set()

    def load(self):
        """Compile and load the stage: the variant that reads its port's carrier where the kernel
        allows it (falling back to the other if the kernel refuses it)."""
        variants = [True, False] if kernel_lets_stage_read_carrier() and not carrier_refused() else [False]
        error = None
        for reads in variants:
            try:
                self._load(reads)
            except LabError as exc:
                error = exc
                self._close_object()
                if reads and getattr(exc, "verdict", False):
                    remember_carrier_refused(exc)
                continue
            self.reads_carrier = reads
            if reads and self.want_carrier:
                self.settings.flags |= CFG_CARRIER
            self.config.update(0, self.settings)
            return self
        raise error

    def _load(self, reads_carrier):
        lib = datapath.libbpf()
        path = datapath.compile_object(stage_source(reads_carrier), "the routing apps' selection stage")
        datapath.ensure_bpffs()
        obj = lib.bpf_object__open_file(str(path).encode(), None)
        if not obj:
            raise LabError(f"libbpf cannot open {path}")
        self.obj = obj
        # The queue model's stats map must match the inner map's template to be linked: a template
        # of its size replaces the one the source declares (libbpf 1.1 cannot resize that one).
        template = lib.bpf_map_create(BPF_MAP_TYPE_ARRAY, None, 4, QSTAT_SIZE, max(1, self.queue_rows), None)
        if template < 0:
            raise LabError(f"cannot create the selection stage's queue map template: {os.strerror(-template)}")
        try:
            lib.bpf_map__set_inner_map_fd(lib.bpf_object__find_map_by_name(obj, b"queue_stats"), template)
            err = lib.bpf_object__load(obj)
        finally:
            os.close(template)
        if err:
            raise StageRefused(err)
        datapath.remove_pins(target=self.pins)
        self.pins.mkdir(parents=True)
        prog = lib.bpf_object__find_program_by_name(obj, PROGRAM.encode())
        if lib.bpf_program__pin(prog, str(self.pins / PROGRAM).encode()):
            raise LabError(f"cannot pin the selection stage under {self.pins}")
        self.prog_fd = lib.bpf_program__fd(prog)
        maps = {}
        for name in MAPS:
            ptr = lib.bpf_object__find_map_by_name(obj, name.encode())
            if name in PINNED and lib.bpf_map__pin(ptr, str(self.pins / name).encode()):
                raise LabError(f"cannot pin the selection stage's {name} map under {self.pins}")
            maps[name] = lib.bpf_map__fd(ptr)
        self.config = datapath.Map(maps["config"], ctypes.c_uint32, Config)
        self.members = datapath.Map(maps["members"], MemberKey, Members)
        self.stats_map = datapath.Map(maps["stats"], ctypes.c_uint32, ctypes.c_uint64)
        self.last = datapath.Map(maps["last"], ctypes.c_uint32, Decision)
        self.port_cfg = datapath.Map(maps["port_cfg"], ctypes.c_uint32, PortCfg)
        self.port_down = datapath.Map(maps["port_down"], ctypes.c_uint32, ctypes.c_uint64)
        self.port_state = datapath.Map(maps["port_state"], ctypes.c_uint32, PortState)
        self.vqueues_fd = maps["vqueues"]
        self.queue_stats = datapath.Map(maps["queue_stats"], ctypes.c_uint32, ctypes.c_uint32)
        self.flowlets_fd = maps["flowlets"]

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

    # -- members and ports --------------------------------------------------------------------------
    def set_members(self, table):
        """Write {(egress interface, /24 address): [member interface or (interface, weight)]};
        entries not in `table` are removed. Interfaces that do not exist (yet) are left out."""
        wanted = {}
        for (intf, net), entry in table.items():
            members = [m if isinstance(m, tuple) else (m, 1) for m in entry[:MAX_MEMBERS]]
            try:
                here = socket.if_nametoindex(intf)
                indexes = tuple((socket.if_nametoindex(m), int(w)) for m, w in members)
            except OSError:
                continue
            wanted[(here, net_key(net))] = indexes
        for key in set(self.written) - set(wanted):
            self.members.delete(MemberKey(*key))
        for key, indexes in wanted.items():
            if self.written.get(key) != indexes:
                value = Members(len(indexes))
                for i, (index, weight) in enumerate(indexes):
                    value.ifindex[i] = index
                    value.weight[i] = max(1, weight)
                self.members.update(MemberKey(*key), value)
        self.written = wanted

    def set_ports(self, ports):
        """Write each port's {interface: (rate in Mbit/s, queue model index + 1 or 0[, its
        switch's hash basis])}; a port with no basis hashes from the stage's seed."""
        for intf, (rate_mbps, qport, *basis) in ports.items():
            try:
                index = socket.if_nametoindex(intf)
            except OSError:
                continue
            value = (int(rate_mbps * 1e6 / 8), int(qport), int(basis[0]) if basis else self.settings.seed)
            if self.port_written.get(index) != value:
                self.port_cfg.update(index, PortCfg(*value))
                self.port_written[index] = value

    def forget_down_ports_that_are_up(self):
        """Clear the data path's down mark of every port whose carrier is back: the stage itself
        clears it only when a packet leaves by the port, and it sends none there while marked."""
        for key in self.port_down.keys():
            try:
                name = socket.if_indextoname(key.value)
                up = pathlib.Path(f"/sys/class/net/{name}/carrier").read_text().strip() == "1"
            except OSError:
                up = False            # gone, or administratively down (carrier reads EINVAL)
            if up:
                self.port_down.delete(key.value)

    def link_queues(self, pin):
        """Let AR read the queue model's occupancies from its pinned stats map; True once linked."""
        stats = datapath.Map.pinned(pin, ctypes.c_uint32, ctypes.c_uint32)
        if stats is None:
            return False
        try:
            return self.use_queue_map(stats.fd)
        finally:
            stats.close()

    def use_queue_map(self, fd):
        """Read occupancies from the queue stats map open as `fd` (rows of datapath.QStat)."""
        try:
            self.queue_stats.update(0, ctypes.c_uint32(fd))
        except LabError as exc:
            self.link_error = f"the queue model's stats map does not fit the stage: {exc}"
            return False
        self.queues_linked = True
        self.link_error = ""
        self.settings.flags |= CFG_QUEUES_LINKED
        self.config.update(0, self.settings)
        return True

    def depth_source(self):
        if self.queues_linked:
            return "queue model"
        return "virtual queue" + (f" ({self.link_error})" if self.link_error else "")

    def carrier_source(self):
        return "data path" if self.settings.flags & CFG_CARRIER else "controller"

    # -- counters and tests -------------------------------------------------------------------------
    def stats(self):
        return stats_from(self.stats_map, self.config)

    def port_records(self):
        return ports_from(self.port_state)

    def set_clock(self, clock_ns):
        """Run the stage on a fake clock (tests); 0 returns it to the kernel's clock."""
        self.settings.clock_ns = int(clock_ns)
        self.config.update(0, self.settings)

    def test_run(self, packet, ifindex, mark=0):
        """Run the program once on `packet` as if leaving by `ifindex` (BPF_PROG_TEST_RUN):
        (tc verdict, ifindex the stage chose or 0, event name)."""
        self.last.update(0, Decision(0, 0, 0, 0))
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
        self._close_object()

    def _close_object(self):
        if self.obj:
            datapath.libbpf().bpf_object__close(self.obj)
            self.obj = None


def stats_from(stats_map, config_map=None):
    values = stats_map.lookup_all(NSTATS)
    out = {name: int(values[i]) for i, name in enumerate(COUNTERS)}
    if config_map is not None:
        cfg = config_map.lookup(0)
        if cfg is not None:
            out["carrier"] = "data path" if cfg.flags & CFG_CARRIER else "controller"
            if cfg.mode == MODES["ar"]:
                out["depth"] = "queue model" if cfg.flags & CFG_QUEUES_LINKED else "virtual queue"
    hist = [int(values[len(COUNTERS) + b]) for b in range(HIST_BUCKETS)]
    # bucket 0: under 1 us; bucket b: [2^(b-1), 2^b) us
    out["gap_histogram_us"] = {("<1" if b == 0 else f"{1 << (b - 1)}-{1 << b}"): n
                               for b, n in enumerate(hist) if n}
    return out


def ports_from(port_state):
    """{interface: {chosen, last_chosen_ns, down_seen_ns, down_events, chosen_down_ns}} of the
    ports the stage chose or found down (interfaces that are gone are named by their index)."""
    out = {}
    for key in port_state.keys():
        record = port_state.lookup(key.value)
        if record is None:
            continue
        try:
            name = socket.if_indextoname(key.value)
        except OSError:
            name = str(key.value)
        out[name] = {f: int(getattr(record, f)) for f, _t in PortState._fields_}
    return out


def _pinned(run_id, name, key_type, value_type):
    path = pins_for(run_id) / name
    return datapath.Map.pinned(path, key_type, value_type) if path.exists() else None


def down_ports(records):
    """The ports a packet found dead: {interface: {down_events, chosen_while_down_ms}}, the latter
    how long after a packet first found the port dead the stage last chose it (0: never, the
    data path took it out at once; with the carrier check off, until the controller did)."""
    out = {}
    for name, r in records.items():
        if r["down_events"]:
            late = r["chosen_down_ns"] - r["down_seen_ns"] if r["chosen_down_ns"] else 0
            out[name] = {"down_events": r["down_events"], "chosen_while_down_ms": round(max(0, late) / 1e6, 3)}
    return out


def read_stats(run_id):
    """The stage's counters of a live run, from its pins (None when no stage is loaded), with the
    ports a packet found dead (`down_ports`) when there are any."""
    stats_map = _pinned(run_id, "stats", ctypes.c_uint32, ctypes.c_uint64)
    if stats_map is None:
        return None
    config_map = _pinned(run_id, "config", ctypes.c_uint32, Config)
    try:
        out = stats_from(stats_map, config_map)
    finally:
        stats_map.close()
        if config_map is not None:
            config_map.close()
    dead = down_ports(read_ports(run_id) or {})
    if dead:
        out["down_ports"] = dead
    return out


def read_ports(run_id):
    """The stage's per port records of a live run (None when no stage is loaded)."""
    state = _pinned(run_id, "port_state", ctypes.c_uint32, PortState)
    if state is None:
        return None
    try:
        return ports_from(state)
    finally:
        state.close()


def detach(fabric):
    """Take the stage off every switch port (when a run changes to an app without one)."""
    cmds = [f"filter del dev {intf} egress prio {PRIO}"
            for switch in fabric.switches for intf in fabric_port_names(fabric, switch)]
    if cmds:
        subprocess.run(["tc", "-force", "-batch", "-"], input="\n".join(cmds) + "\n",
                       capture_output=True, text=True)
