"""Fabric specs: the declarative description a user edits (YAML) and the same model as a Python API.

A spec says *what* fabric to build (tiers, counts, rates, buffers); `fabric.py` turns it into the
graph of nodes, ports and addresses, and nothing here touches the network. Validation collects every
problem and reports each as one line naming the field, before anything is built.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import types
import re
from dataclasses import dataclass, field


from fabriclab.errors import SpecError
from fabriclab.units import parse_size_bytes
from fabriclab.queues.config import QueueSpec, check_against_fabric, queues_from_dict
from fabriclab.loading import clip, excerpt, is_file, load_yaml

KINDS = ("leafspine", "multiplane", "threetier")
# How a host's NICs reach the leaves. rack: every NIC to the host's one leaf (a ToR per rack).
# rail: leaves form rail groups of nics_per_host leaves and NIC i of every host in a group goes
# to leaf i of the group, as GPU clusters are cabled (seed 002 Figure 2's rails).
CABLINGS = ("rack", "rail")
MIN_MTU, MAX_MTU = 1500, 9216

# Addresses are 10.<plane>.<leaf>.<slot>: one octet each for planes and leaves, slots 1..253.
# A threetier fabric numbers its leaves across pods, so pods x leaves shares the one octet.
MAX_PLANES = 254
MAX_LEAVES = 254
MAX_PORTS_PER_LEAF = 253
MAX_SPINES = 64
MAX_PODS = 64
MAX_SUPER_SPINES = 256

# Rates are in bits: '20Mbit', '20Mbit/s', '400G'. 'B' and 'bps' are refused because tc reads them
# as bytes, and a rate off by 8x is worse than an error.
_RATE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgKMG]?)(bit|bit/s)?\s*$")
_TIME_RE = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+)\s*(ns|us|µs|ms|s)\s*$")
_RATE_UNIT_MBPS = {"": 1.0, "k": 1e-3, "m": 1.0, "g": 1e3}
_TIME_UNIT_US = {"ns": 1e-3, "us": 1.0, "µs": 1.0, "ms": 1e3, "s": 1e6}
# Lab links are software: below 0.1 Mbit/s tc's rates round toward 0 kbit and a jumbo frame
# takes seconds; above 100 Gbit/s no veth keeps up. The hardware a spec stands for may be faster.
RATE_BOUNDS_MBPS = {"host_rate_mbps": (0.1, 1e5), "fabric_rate_mbps": (0.1, 1e5),
                    "super_spine_rate_mbps": (0.1, 1e5), "real_host_rate_mbps": (0.1, 1e7)}
MAX_BUFFER_BYTES = 1 << 30
# A lab delay beyond this stalls everything that waits on a round trip (ARP, the controller's
# checks, ACK timeouts); real fabrics' microseconds at the lab's time scales stay far below it.
MAX_LAB_DELAY_MS = 10_000.0


def parse_rate_mbps(value, where):
    """A link rate: a number (Mbit/s) or a string such as '20Mbit', '1.5Gbit', '400G'."""
    if isinstance(value, bool):
        raise SpecError(f"{where}: rate must be a number of Mbit/s or a string like '20Mbit', got {excerpt(value)}")
    if isinstance(value, (int, float)):
        rate = float(value)
    elif isinstance(value, str) and (m := _RATE_RE.match(value)):
        rate = float(m.group(1)) * _RATE_UNIT_MBPS[m.group(2).lower()]
    else:
        raise SpecError(f"{where}: rate must be a number of Mbit/s or a string like '20Mbit', got {excerpt(value)}")
    if rate <= 0:
        raise SpecError(f"{where}: rate must be > 0, got {excerpt(value)}")
    if not math.isfinite(rate):
        raise SpecError(f"{where}: rate must be finite, got {excerpt(value)}")
    return rate




def parse_delay_us(value, where):
    """A real propagation delay: a number of microseconds or a string such as '500ns', '1.5us'."""
    hint = "a number of microseconds or a string like '500ns' or '2us'"
    if isinstance(value, bool):
        raise SpecError(f"{where}: delay must be {hint}, got {excerpt(value)}")
    if isinstance(value, (int, float)):
        usec = float(value)
    elif isinstance(value, str) and (m := _TIME_RE.match(value)):
        usec = float(m.group(1)) * _TIME_UNIT_US[m.group(2)]
    else:
        raise SpecError(f"{where}: delay must be {hint}, got {excerpt(value)}")
    if not math.isfinite(usec):
        raise SpecError(f"{where}: delay must be finite, got {excerpt(value)}")
    if usec < 0:
        raise SpecError(f"{where}: delay must be >= 0, got {excerpt(value)}")
    return usec


@dataclass(frozen=True)
class LinkDelay:
    """One-way propagation delay of each kind of cable, in *real* microseconds (the fabric's own
    time); the lab runs it stretched by the spec's time scale. 0: no delay."""

    host_us: float = 0.0     # host NIC <-> leaf
    fabric_us: float = 0.0   # leaf <-> spine


LINK_KINDS = ("host", "fabric")


@dataclass(frozen=True)
class Buffers:
    """Per-port egress buffer in bytes, by the role of the node that owns the port."""

    host: int = 64 * 1024
    leaf: int = 64 * 1024
    spine: int = 256 * 1024
    # threetier only (the ATSW tier); other kinds have no such switch and leave it unused
    super_spine: int = 1024 * 1024


@dataclass(frozen=True)
class FabricSpec:
    """A fabric as the user describes it. Build one from YAML with `load_spec`, or directly.

    kind 'leafspine' is a 2-tier Clos; 'multiplane' is `planes` independent leaf/spine fabrics with
    every host NIC owning one port per plane (Spectrum-X style). `leaves`, `spines` and
    `hosts_per_leaf` are per plane. 'threetier' is `pods` leaf/spine fabrics (AI zones; `leaves`
    and `spines` per pod) joined by `super_spines` (seed 000's ATSW tier): spine k of every pod
    connects to the super-spines of group k, super_spines / spines of them.
    `cabling` 'rail' puts NIC i of each host on leaf i of its rail group (CABLINGS); then
    `hosts_per_leaf` is the hosts of a group, each with one NIC on every leaf of the group.
    """

    name: str
    kind: str = "leafspine"
    leaves: int = 2
    spines: int = 2
    hosts_per_leaf: int = 2
    nics_per_host: int = 1
    planes: int = 1
    cabling: str = "rack"
    host_rate_mbps: float = 10.0
    fabric_rate_mbps: float = 10.0
    parallel_links: int = 1
    buffers: Buffers = field(default_factory=Buffers)
    # Ethernet MTU of every link. AI fabrics run RoCE with a 4096-byte path MTU over jumbo frames;
    # for the lab it also means four times fewer packets per bit through the software switches.
    mtu: int = 9000
    # The rate a lab host link stands for on real hardware (e.g. 400 Gbit/s): results record the
    # ratio so nobody mistakes a 20 Mbit/s emulation for a 400G measurement.
    real_host_rate_mbps: float | None = None
    description: str = ""
    # The queue model (traffic classes, ECN, PFC; fabriclab/queues/). None: plain shaping only.
    queues: QueueSpec | None = None
    # Propagation delay per cable kind, in real time (netem, where the kernel has it).
    delay: LinkDelay = field(default_factory=LinkDelay)
    # threetier: pods (AI zones) and the aggregation tier joining them
    pods: int = 1
    super_spines: int = 0
    super_spine_rate_mbps: float | None = None     # spine <-> super-spine links; None: fabric_rate

    def __post_init__(self):
        problems = validate(self)
        if problems:
            raise SpecError(problems[0] if len(problems) == 1 else
                            f"{len(problems)} problems: " + "; ".join(problems))

    @property
    def total_leaves(self):
        """Leaves per plane over all pods (threetier numbers them across pods)."""
        return self.pods * self.leaves

    @property
    def hosts(self):
        return host_count(self)

    @property
    def host_ports_per_leaf(self):
        return host_ports_per_leaf(self)

    @property
    def core_rate_mbps(self):
        """The spine <-> super-spine link rate (threetier)."""
        return self.super_spine_rate_mbps or self.fabric_rate_mbps

    @property
    def cross_zone_oversubscription(self):
        """threetier: a spine's downlink over its uplink capacity (leaves x parallel_links x
        fabric_rate over super_spines / spines x super_spine_rate); None for other kinds. Above 1
        the cross-zone tier is oversubscribed, as seed 000's ATSW layer is by design."""
        if self.kind != "threetier":
            return None
        down = self.leaves * self.parallel_links * self.fabric_rate_mbps
        up = (self.super_spines // self.spines) * self.core_rate_mbps
        return down / up

    @property
    def oversubscription(self):
        """Downlink over uplink capacity at a leaf: > 1 means the leaf is oversubscribed."""
        down = self.host_ports_per_leaf * self.host_rate_mbps
        up = self.spines * self.parallel_links * self.fabric_rate_mbps
        return down / up

    def derated(self, factor):
        """The same fabric with every link `factor` times slower: the time scale `factor` times larger
        (real_host_rate is what the links stand for and stays), buffers in bytes as they are (each
        then holds `factor` times the lab time, the same real time), delays in real time, so
        scaled along. What a run that saturated the CPU is run again at (experiments.run_experiment)."""
        if not factor >= 1:
            raise SpecError(f"spec {self.name!r}: a derating factor is >= 1, got {factor}")
        return dataclasses.replace(
            self, host_rate_mbps=self.host_rate_mbps / factor, fabric_rate_mbps=self.fabric_rate_mbps / factor,
            super_spine_rate_mbps=None if self.super_spine_rate_mbps is None else self.super_spine_rate_mbps / factor)

    @property
    def time_scale(self):
        """How many times slower than the modelled hardware the lab runs (None if not stated)."""
        if self.real_host_rate_mbps is None:
            return None
        return self.real_host_rate_mbps / self.host_rate_mbps

    @property
    def has_delay(self):
        return any(getattr(self.delay, f"{kind}_us") > 0 for kind in LINK_KINDS)

    def lab_delay_ms(self, kind):
        """The one-way delay of a `kind` ('host' | 'fabric') cable in the lab: real x time scale."""
        real_us = getattr(self.delay, f"{kind}_us")
        if not real_us:
            return 0.0
        return real_us * self.time_scale / 1000.0

    # what to_dict adds to the fields: computed, so a spec read back leaves them out
    DERIVED = ("oversubscription", "cross_zone_oversubscription", "time_scale", "lab_delay_ms")

    def to_dict(self):
        data = dataclasses.asdict(self)
        data["oversubscription"] = round(self.oversubscription, 4)
        if self.kind == "threetier":
            data["cross_zone_oversubscription"] = round(self.cross_zone_oversubscription, 4)
        else:
            del data["buffers"]["super_spine"]      # no such switch; a spec read back gets the default
        data["time_scale"] = self.time_scale
        data["lab_delay_ms"] = {kind: self.lab_delay_ms(kind) for kind in LINK_KINDS}
        return data


def host_ports_per_leaf(spec):
    """Host cables on one leaf (per plane): a rack leaf takes every NIC of its hosts, a rail leaf
    one NIC of each host of its group. Works on a draft (any object with the fields)."""
    if spec.cabling == "rail":
        return spec.hosts_per_leaf
    return spec.hosts_per_leaf * spec.nics_per_host


def host_count(spec):
    """Hosts of a spec: hosts_per_leaf under each leaf (rack) or in each rail group (rail)."""
    leaves = spec.pods * spec.leaves                # threetier numbers leaves across pods
    if spec.cabling == "rail":
        return leaves // spec.nics_per_host * spec.hosts_per_leaf
    return leaves * spec.hosts_per_leaf


def _cabling_problems(spec, where):
    """Rail cabling needs whole rail groups: at least 2 NICs (one NIC is rack cabling) and
    leaves a multiple of nics_per_host."""
    cabling = getattr(spec, "cabling", "rack")
    if cabling not in CABLINGS:
        return [f"{where}: cabling must be one of {', '.join(CABLINGS)}, got {excerpt(cabling)}"]
    if cabling != "rail":
        return []
    nics, leaves = spec.nics_per_host, spec.leaves
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in (nics, leaves)):
        return []                       # the counts' own problems say what is wrong
    if nics < 2:
        return [f"{where}: cabling rail needs nics_per_host >= 2 (NIC i of each host goes to rail "
                f"leaf i of its group), got {nics}"]
    if leaves % nics:
        return [f"{where}: cabling rail groups leaves by nics_per_host ({nics}): leaves must be a "
                f"multiple of it, got {leaves}"]
    return []


def validate(spec):
    """Every problem with a spec, one line each, naming the spec and the field."""
    where = f"spec {excerpt(spec.name)}" if isinstance(spec.name, str) and spec.name else "spec"
    problems = []
    if not isinstance(spec.name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", spec.name):
        problems.append(f"{where}: name must be 1-64 letters, digits, '_', '.', '-', got {excerpt(spec.name)}")
    if spec.kind not in KINDS:
        problems.append(f"{where}: kind must be one of {', '.join(KINDS)}, got {excerpt(spec.kind)}")

    def count(fname, minimum, maximum=None):
        value = getattr(spec, fname)
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{where}: {fname} must be a whole number, got {excerpt(value)}")
        elif value < minimum:
            problems.append(f"{where}: {fname} must be >= {minimum}, got {excerpt(value)}")
        elif maximum is not None and value > maximum:
            problems.append(f"{where}: {fname} must be <= {maximum}, got {excerpt(value)}")

    count("leaves", 1, MAX_LEAVES)
    count("spines", 1, MAX_SPINES)
    count("hosts_per_leaf", 1)
    count("nics_per_host", 1, 16)
    count("parallel_links", 1, 16)
    count("planes", 1, MAX_PLANES)
    count("mtu", MIN_MTU, MAX_MTU)
    count("pods", 1, MAX_PODS)
    count("super_spines", 0, MAX_SUPER_SPINES)
    problems += _tier_problems(spec, where)
    if spec.kind == "leafspine" and spec.planes != 1:
        problems.append(f"{where}: planes must be 1 for kind leafspine (use kind multiplane), got {excerpt(spec.planes)}")
    if spec.kind == "multiplane" and isinstance(spec.planes, int) and spec.planes < 2:
        problems.append(f"{where}: planes must be >= 2 for kind multiplane, got {excerpt(spec.planes)}")
    problems += _cabling_problems(spec, where)
    for fname, label in (("host_rate_mbps", "host_rate_mbps"), ("fabric_rate_mbps", "fabric_rate_mbps"),
                         ("super_spine_rate_mbps", "super_spine_rate"), ("real_host_rate_mbps", "real_host_rate")):
        value = getattr(spec, fname)
        if value is None and fname in ("real_host_rate_mbps", "super_spine_rate_mbps"):
            continue
        low, high = RATE_BOUNDS_MBPS[fname]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            problems.append(f"{where}: {label} must be > 0, got {excerpt(value)}")
        elif not math.isfinite(value):
            problems.append(f"{where}: {label} must be finite, got {excerpt(value)}")
        elif not low <= value <= high:
            problems.append(f"{where}: {label} must be {low:g} to {high:g} Mbit/s, got {value:g}")
    real, host = spec.real_host_rate_mbps, spec.host_rate_mbps
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
           for v in (real, host)) and real < host:
        problems.append(f"{where}: real_host_rate ({real:g} Mbit/s) is what the lab's host_rate "
                        f"({host:g} Mbit/s) stands for, so it cannot be slower: the lab runs slower "
                        f"than the hardware, never faster")
    if not isinstance(spec.buffers, Buffers):
        problems.append(f"{where}: buffers must be a Buffers, got {excerpt(spec.buffers)}")
    else:
        mtu_ok = isinstance(spec.mtu, int) and not isinstance(spec.mtu, bool) and MIN_MTU <= spec.mtu <= MAX_MTU
        frame = spec.mtu + 14 if mtu_ok else 0     # a bad MTU is its own problem, not the buffers'

        for role, size in dataclasses.asdict(spec.buffers).items():
            if role == "super_spine" and spec.kind != "threetier":
                if size != Buffers().super_spine:
                    problems.append(f"{where}: buffers.super_spine is for kind threetier (its super-spines), "
                                    f"got it for kind {excerpt(spec.kind)}")
                continue
            if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
                problems.append(f"{where}: buffers.{role} must be > 0 bytes, got {excerpt(size)}")
            elif size > MAX_BUFFER_BYTES:
                problems.append(f"{where}: buffers.{role} must be at most 1 GiB per port (tc's bfifo "
                                f"counts in 32 bits), got {size}")
            elif size < 2 * frame:
                problems.append(f"{where}: buffers.{role} must hold two {spec.mtu}-byte-MTU frames "
                                f"({2 * frame} bytes), got {size}")
    if not problems:
        ports = host_ports_per_leaf(spec)
        if ports > MAX_PORTS_PER_LEAF:
            what = "hosts_per_leaf" if spec.cabling == "rail" else "hosts_per_leaf x nics_per_host"
            problems.append(f"{where}: {what} is {ports}, at most "
                            f"{MAX_PORTS_PER_LEAF} host ports fit a leaf's /24")
        longest = max(_longest_interface_names(spec), key=len)
        if len(longest) > MAX_INTERFACE_NAME:
            problems.append(f"{where}: interface {excerpt(longest)} would exceed Linux's "
                            f"{MAX_INTERFACE_NAME}-character limit; use fewer planes, leaves or ports")
    problems += _delay_problems(spec, where)
    queues = getattr(spec, "queues", None)
    if not problems and queues is not None:
        if not isinstance(queues, QueueSpec):
            problems.append(f"{where}: queues must be a QueueSpec, got {excerpt(queues)}")
        else:
            rates = {"leaf": max(spec.host_rate_mbps, spec.fabric_rate_mbps), "spine": spec.fabric_rate_mbps}
            # a cable's delay needs headroom for its round trip (a FabricSpec knows its lab delay)
            delay = getattr(spec, "lab_delay_ms", lambda kind: 0.0)
            delays = {"leaf": max(delay("host"), delay("fabric")), "spine": delay("fabric")}
            if spec.kind == "threetier":
                core = spec.super_spine_rate_mbps or spec.fabric_rate_mbps
                rates.update(spine=max(spec.fabric_rate_mbps, core), super_spine=core)
                delays["super_spine"] = delay("fabric")
            problems += check_against_fabric(queues, dataclasses.asdict(spec.buffers), rates, spec.mtu,
                                             f"{where}: queues", delays)
    return problems


def _whole(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _tier_problems(spec, where):
    """The threetier fields: pods and super-spines only with kind threetier, and sizes that wire."""
    kind, pods, supers = spec.kind, spec.pods, spec.super_spines
    if kind != "threetier":
        out = []
        if _whole(pods) and pods != 1:
            out.append(f"{where}: pods must be 1 for kind {excerpt(kind)} (use kind threetier), got {pods}")
        if _whole(supers) and supers != 0:
            out.append(f"{where}: super_spines is for kind threetier, got {supers} for kind {excerpt(kind)}")
        if spec.super_spine_rate_mbps is not None:
            out.append(f"{where}: super_spine_rate is for kind threetier, got it for kind {excerpt(kind)}")
        return out
    out = []
    if _whole(spec.planes) and spec.planes != 1:
        out.append(f"{where}: planes must be 1 for kind threetier, got {spec.planes}")
    if _whole(pods) and pods < 2:
        out.append(f"{where}: pods must be >= 2 for kind threetier (one pod is a leafspine), got {pods}")
    if _whole(supers) and supers < 1:
        out.append(f"{where}: super_spines must be >= 1 for kind threetier, got {supers}")
    elif _whole(supers) and _whole(spec.spines) and spec.spines >= 1 and supers % spec.spines:
        out.append(f"{where}: super_spines ({supers}) must be a multiple of spines ({spec.spines}): "
                   f"spine k of every pod joins the super-spines of group k")
    if _whole(pods) and _whole(spec.leaves) and pods >= 1 and spec.leaves >= 1 \
            and pods * spec.leaves > MAX_LEAVES:
        out.append(f"{where}: pods x leaves is {pods * spec.leaves}, at most {MAX_LEAVES}: leaves are "
                   f"numbered across pods in the address's one octet (10.1.<leaf>.<slot>)")
    return out


def _delay_problems(spec, where):
    delay = getattr(spec, "delay", LinkDelay())
    if not isinstance(delay, LinkDelay):
        return [f"{where}: delay must be a LinkDelay, got {excerpt(delay)}"]
    problems = []
    for kind in LINK_KINDS:
        value = getattr(delay, f"{kind}_us")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value < 0:
            problems.append(f"{where}: delay.{kind} must be >= 0 microseconds, got {excerpt(value)}")
    if problems or not any(getattr(delay, f"{kind}_us") for kind in LINK_KINDS):
        return problems
    real = spec.real_host_rate_mbps
    if real is None:
        return [f"{where}: delay is real time and needs real_host_rate to scale it into lab time "
                f"(time_scale = real_host_rate / host_rate)"]
    host = spec.host_rate_mbps
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or not math.isfinite(v)
           for v in (real, host)):
        return []                       # the rates' own problems say what is wrong
    scale = real / host
    for kind in LINK_KINDS:
        lab_ms = getattr(delay, f"{kind}_us") * scale / 1000.0
        if lab_ms > MAX_LAB_DELAY_MS:
            problems.append(f"{where}: delay.{kind} {getattr(delay, f'{kind}_us'):g} us at time scale "
                            f"x{scale:g} is {lab_ms:.0f} ms in the lab; at most {MAX_LAB_DELAY_MS:.0f} ms")
    return problems


MAX_INTERFACE_NAME = 15


def _longest_interface_names(spec):
    """The longest names fabric.py will give (it owns the convention; this only measures it)."""
    if spec.kind == "threetier":
        leaves, spines = spec.pods * spec.leaves, spec.pods * spec.spines
        leaf_ports = spec.hosts_per_leaf * spec.nics_per_host + spec.spines * spec.parallel_links
        spine_ports = spec.leaves * spec.parallel_links + spec.super_spines // spec.spines
        host = f"h{leaves * spec.hosts_per_leaf}-n{spec.nics_per_host - 1}"
        return [f"l{leaves}-eth{leaf_ports}", f"s{spines}-eth{spine_ports}",
                f"ss{spec.super_spines}-eth{spec.pods}", host]
    multi = spec.kind == "multiplane"
    plane = f"p{spec.planes}" if multi else ""
    leaf_ports = host_ports_per_leaf(spec) + spec.spines * spec.parallel_links
    spine_ports = spec.leaves * spec.parallel_links
    host = f"h{host_count(spec)}-n{spec.nics_per_host - 1}" + plane
    return [f"{plane}l{spec.leaves}-eth{leaf_ports}", f"{plane}s{spec.spines}-eth{spine_ports}", host]


# The YAML keys a user writes, mapped to the FabricSpec field and the parser for its value.
_YAML_FIELDS = {
    "name": ("name", None),
    "kind": ("kind", None),
    "description": ("description", None),
    "leaves": ("leaves", None),
    "spines": ("spines", None),
    "hosts_per_leaf": ("hosts_per_leaf", None),
    "nics_per_host": ("nics_per_host", None),
    "planes": ("planes", None),
    "cabling": ("cabling", None),
    "host_rate": ("host_rate_mbps", parse_rate_mbps),
    "fabric_rate": ("fabric_rate_mbps", parse_rate_mbps),
    "parallel_links": ("parallel_links", None),
    "real_host_rate": ("real_host_rate_mbps", parse_rate_mbps),
    "buffers": ("buffers", None),
    "mtu": ("mtu", None),
    "queues": ("queues", queues_from_dict),
    "delay": ("delay", None),
    "pods": ("pods", None),
    "super_spines": ("super_spines", None),
    "super_spine_rate": ("super_spine_rate_mbps", parse_rate_mbps),
}


def spec_from_dict(data, source="spec"):
    """Build a FabricSpec from parsed YAML, with every unknown key or bad value named."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: must be a mapping of keys to values, got {type(data).__name__}")
    problems = []
    kwargs = {}
    for key, value in data.items():
        if key not in _YAML_FIELDS:
            known = ", ".join(sorted(_YAML_FIELDS))
            problems.append(f"{source}: unknown key {excerpt(key)} (known: {known})")
            continue
        fname, parse = _YAML_FIELDS[key]
        try:
            if key == "buffers":
                kwargs[fname] = _buffers_from_dict(value, f"{source}: buffers")
            elif key == "delay":
                kwargs[fname] = _delay_from_dict(value, f"{source}: delay")
            else:
                kwargs[fname] = parse(value, f"{source}: {key}") if parse else value
        except SpecError as exc:
            problems.append(str(exc))
    if "name" not in data:
        problems.append(f"{source}: missing required key 'name'")
    if data.get("kind") != "threetier" and isinstance(data.get("buffers"), dict) and "super_spine" in data["buffers"]:
        problems.append(f"{source}: buffers.super_spine is for kind threetier (its super-spines), "
                        f"got it for kind {excerpt(data.get('kind', 'leafspine'))}")
    if problems:
        # Report the values' problems too, so one run shows everything to fix.
        defaults = {f.name: f.default for f in dataclasses.fields(FabricSpec)
                    if f.default is not dataclasses.MISSING}
        draft = types.SimpleNamespace(**{**defaults, "buffers": Buffers(), "delay": LinkDelay(), "name": "",
                                         **{k: v for k, v in kwargs.items() if k != "buffers"}})
        problems += [p for p in validate(draft) if "name must be" not in p]
        raise SpecError(problems[0] if len(problems) == 1 else
                        f"{len(problems)} problems: " + "; ".join(problems))
    return FabricSpec(**kwargs)


def _buffers_from_dict(value, where):
    if not isinstance(value, dict):
        raise SpecError(f"{where}: must map host/leaf/spine/super_spine to sizes, got {excerpt(value)}")
    roles = {f.name for f in dataclasses.fields(Buffers)}
    sizes = {}
    problems = []
    for role, size in value.items():
        if role not in roles:
            problems.append(f"{where}: unknown role {excerpt(role)} (known: {', '.join(sorted(roles))})")
            continue
        try:
            sizes[role] = parse_size_bytes(size, f"{where}.{role}")
        except SpecError as exc:
            problems.append(str(exc))
    if problems:
        raise SpecError("; ".join(problems))
    return Buffers(**sizes)


def _delay_from_dict(value, where):
    if not isinstance(value, dict):
        raise SpecError(f"{where}: must map {'/'.join(LINK_KINDS)} to real one-way delays "
                        f"(e.g. {{fabric: 500ns}}), got {excerpt(value)}")
    delays, problems = {}, []
    for kind, item in value.items():
        if kind not in LINK_KINDS:
            problems.append(f"{where}: unknown link kind {excerpt(kind)} (known: {', '.join(LINK_KINDS)})")
            continue
        try:
            delays[f"{kind}_us"] = parse_delay_us(item, f"{where}.{kind}")
        except SpecError as exc:
            problems.append(str(exc))
    if problems:
        raise SpecError("; ".join(problems))
    return LinkDelay(**delays)


SPEC_DIR = pathlib.Path(__file__).resolve().parent


def shipped_specs():
    """Names of the specs shipped in topologies/."""
    return sorted(p.stem for p in SPEC_DIR.glob("*.yaml"))


def load_spec(path_or_name):
    """Load a spec from a YAML path, or by the name of a spec shipped in topologies/."""
    path = pathlib.Path(path_or_name)
    if not is_file(path):
        shipped = SPEC_DIR / f"{path_or_name}.yaml"
        if "/" in str(path_or_name) or not is_file(shipped):
            raise SpecError(f"no spec file {excerpt(str(path_or_name))} and no shipped spec of that name "
                            f"(shipped: {', '.join(shipped_specs())})")
        path = shipped
    data = load_yaml(path, "spec", error=SpecError)
    return spec_from_dict(data, source=clip(path))
