"""The queue model's settings (the `queues:` section of a fabric spec) and its arithmetic.

Three traffic classes, chosen by DSCP: `lossless` (RoCE data: PFC, ECN), `control` (CNP, and CTS/ACK
when the collective puts them there: strict priority, never paused) and `lossy` (everything else:
tail drop). The arithmetic here (thresholds, the marking probability, the pause hysteresis) is the
same the eBPF data path (`fabricq.bpf.c`) runs per packet; the unit tests check it by hand.

Buffers follow a lossless switch's split: PFC is accounted per *ingress* port (bytes that arrived on
that port and have not left the switch), as real switches do; ECN and lossy tail drop look at the
*egress* queue. An ingress port pauses its upstream at XOFF and resumes it at XON; the headroom above
XOFF absorbs what is in flight while the pause takes effect, and a lossless packet beyond it is a
"lossless drop" (a mis-sized headroom, which the tests require to stay zero).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from fabriclab.errors import LabError, SpecError
from fabriclab.units import parse_size_bytes
from fabriclab.loading import excerpt

CLASSES = ("lossless", "control", "lossy")
LOSSLESS, CONTROL, LOSSY = range(3)
ETH_HEADER = 14

ECN_MODES = ("red", "step", "off", "ar")
# The data path's ecn_mode numbers: red 1, step 2, ar 4 (3 is ECN_QDISC); off 0.
ECN_MODE_IDS = {"off": 0, "red": 1, "step": 2, "ar": 4}
ECN_AR = ECN_MODE_IDS["ar"]
# Who marks: the kernel's RED qdisc where it exists ("auto" picks it), or the eBPF program.
ECN_MARKERS = ("auto", "red", "bpf")
# The data path's ecn_mode for a class whose RED qdisc marks: the program only counts the marks.
ECN_QDISC = 3
WATCHDOG_ACTIONS = ("drop", "forward")
SWITCH_ROLES = ("leaf", "spine", "super_spine")     # the ports that account, mark and pause

# A switch's PFC watchdog catches pauses longer than 200 ms (seed 000 section 6.3.2). The default
# watchdog stands for that in real time: at a lab time scale of x40000 it is 8000 s of lab time,
# so it fires on a stuck port, never on a long but healthy pause. Storm tests set their own.
REAL_WATCHDOG_MS = 200.0
MAX_LAB_MS = 3_600_000.0             # reaction, restore and watchdog times: within a lab hour

# Probabilities travel to the data path as integers in 1/2^20 steps.
PROB_ONE = 1 << 20


@dataclass(frozen=True)
class EcnProfile:
    """RED-style marking between kmin and kmax of egress occupancy (bytes), up to pmax, and every
    ECN-capable packet at or above kmax (DCQCN's switch profile); `step` marks at or above kmin only
    (DCTCP's K); `ar` marks at or above kmin only when every other eligible member of the packet's
    adaptive-routing group is at or above its kmin too (`ar_mark`: SPX's switches mark only when
    adaptive routing's capacity is exhausted, seed 002 4.2). None for a threshold means: derived
    from the port's buffer."""

    mode: str = "red"
    kmin: int | None = None
    kmax: int | None = None
    pmax: float = 0.2


@dataclass(frozen=True)
class PfcSettings:
    """Priority flow control on the lossless class. None for a threshold means: derived from the
    buffer, the link rate and `reaction_ms` (how long a pause takes to stop the upstream sender)."""

    enabled: bool = True
    xoff: int | None = None
    xon: int | None = None
    headroom: int | None = None
    reaction_ms: float = 5.0
    watchdog_ms: float | None = None  # lab ms; None: REAL_WATCHDOG_MS of real time, scaled; 0: off
    watchdog_action: str = "drop"
    restore_ms: float = 1000.0


@dataclass(frozen=True)
class QueueSpec:
    lossless_dscp: tuple = (26,)
    control_dscp: tuple = (46, 48, 56)
    ecn: EcnProfile = field(default_factory=EcnProfile)
    ecn_by_role: tuple = ()          # ((role, EcnProfile), ...): overrides for one role's ports
    pfc: PfcSettings = field(default_factory=PfcSettings)
    ecn_marker: str = "auto"         # auto | red | bpf (see ECN_MARKERS)

    def ecn_for(self, role):
        return dict(self.ecn_by_role).get(role, self.ecn)

    def dscp_classes(self):
        """A 64-entry table: DSCP -> class index."""
        table = [LOSSY] * 64
        for d in self.lossless_dscp:
            table[d] = LOSSLESS
        for d in self.control_dscp:
            table[d] = CONTROL
        return table

    def to_dict(self):
        data = dataclasses.asdict(self)
        data["ecn_by_role"] = {role: dataclasses.asdict(p) for role, p in self.ecn_by_role}
        return data

    @classmethod
    def from_dict(cls, data):
        """The inverse of to_dict (and of dataclasses.asdict), for results and Fabric.from_json."""
        by_role = data.get("ecn_by_role") or {}
        items = by_role.items() if isinstance(by_role, dict) else by_role
        return cls(lossless_dscp=tuple(data["lossless_dscp"]), control_dscp=tuple(data["control_dscp"]),
                   ecn=EcnProfile(**data["ecn"]),
                   ecn_by_role=tuple((role, EcnProfile(**p)) for role, p in items),
                   pfc=PfcSettings(**data["pfc"]), ecn_marker=data.get("ecn_marker", "auto"))


@dataclass(frozen=True)
class Thresholds:
    """What the data path enforces for one port and class (all bytes; pmax in 1/2^20)."""

    ecn_mode: int          # 0 off, 1 red, 2 step (3, ECN_QDISC: a RED qdisc marks, see queues/red.py)
    kmin: int
    kmax: int
    pmax: int
    limit: int             # egress tail drop (lossy, control)
    pfc: bool
    xoff: int
    xon: int
    headroom_limit: int    # ingress bytes above which a lossless packet is dropped


def watchdog_lab_ms(pfc, time_scale):
    """The watchdog's timeout in lab milliseconds: as set, or REAL_WATCHDOG_MS at the time scale
    (1 where the spec states no real rate)."""
    if pfc.watchdog_ms is not None:
        return pfc.watchdog_ms
    return REAL_WATCHDOG_MS * (time_scale or 1.0)


def check_cut(fraction):
    """A buffer fault's fraction of the usable buffer, in (0, 1]; LabError in one line otherwise."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise LabError(f"a buffer cut keeps a fraction of the buffer in (0, 1], got {excerpt(fraction)}")
    return float(fraction)


def cut_limit(buffer_bytes, fraction):
    """The bytes a port's class may queue under a buffer cut to `fraction` (0: no cut)."""
    return 0 if fraction >= 1 else max(1, int(buffer_bytes * fraction))


def frame_bytes(mtu):
    return mtu + ETH_HEADER


def default_headroom(rate_mbps, mtu, reaction_ms, delay_ms=0.0):
    """In-flight bytes while a pause takes effect: at line rate for the reaction time plus the
    cable's round trip (the pause travels up it while the data already sent travels down), plus a
    frame already on the wire at each end (the one being sent and the one the gate lets finish)."""
    return int(rate_mbps * 1e6 / 8 * (reaction_ms + 2 * delay_ms) / 1000) + 2 * frame_bytes(mtu)


def pfc_thresholds(buffer_bytes, rate_mbps, mtu, pfc, delay_ms=0.0):
    """(xoff, xon, headroom) of one ingress port whose cable is `delay_ms` long one way (lab
    time), explicit settings winning over derived ones."""
    frame = frame_bytes(mtu)
    headroom = pfc.headroom if pfc.headroom is not None else default_headroom(rate_mbps, mtu, pfc.reaction_ms,
                                                                              delay_ms)
    xoff = pfc.xoff if pfc.xoff is not None else buffer_bytes - headroom
    xon = pfc.xon if pfc.xon is not None else max(0, xoff - 2 * frame)
    return xoff, xon, headroom


def ecn_thresholds(buffer_bytes, profile):
    """(kmin, kmax) for a port: by default a fifth and three fifths of its buffer."""
    kmin = profile.kmin if profile.kmin is not None else buffer_bytes // 5
    kmax = profile.kmax if profile.kmax is not None else (buffer_bytes * 3) // 5
    if profile.mode in ("step", "ar"):
        kmax = kmin
    return kmin, kmax


def thresholds(spec, role, cls, buffer_bytes, rate_mbps, mtu, ecn=None, delay_ms=0.0):
    """The Thresholds of one port (owned by a node of `role`, its cable `delay_ms` long one way)
    for class index `cls`; `ecn` overrides the spec's profile for that role (a change made on a
    running fabric)."""
    profile = ecn or spec.ecn_for(role)
    kmin, kmax = ecn_thresholds(buffer_bytes, profile)
    mode = ECN_MODE_IDS[profile.mode]
    lossless = cls == LOSSLESS and spec.pfc.enabled
    xoff, xon, headroom = pfc_thresholds(buffer_bytes, rate_mbps, mtu, spec.pfc, delay_ms)
    return Thresholds(
        ecn_mode=mode if cls != CONTROL else 0,
        kmin=kmin, kmax=kmax, pmax=int(round(profile.pmax * PROB_ONE)),
        limit=buffer_bytes,
        pfc=lossless,
        xoff=xoff if lossless else 0, xon=xon if lossless else 0,
        headroom_limit=xoff + headroom if lossless else 0)


def mark_probability(occupancy, kmin, kmax, pmax, mode="red"):
    """Probability (0..1) that an ECN-capable packet arriving to `occupancy` bytes is marked CE."""
    if mode == "off":
        return 0.0
    if mode in ("step", "ar") or kmax <= kmin:
        return 1.0 if occupancy >= kmin else 0.0
    if occupancy < kmin:
        return 0.0
    if occupancy >= kmax:
        return 1.0
    return pmax * (occupancy - kmin) / (kmax - kmin)


def mark_threshold(occupancy, kmin, kmax, pmax_fixed):
    """The data path's integer form: mark when a uniform 20-bit random number is below this."""
    if occupancy < kmin:
        return 0
    if occupancy >= kmax or kmax <= kmin:
        return PROB_ONE
    return pmax_fixed * (occupancy - kmin) // (kmax - kmin)


def ar_mark(occupancy, kmin, others):
    """Whether the "ar" ECN mode marks an ECN-capable packet that finds its egress queue at
    `occupancy` bytes (threshold `kmin`): only when that queue is at or above kmin and so is every
    other eligible member of the packet's adaptive-routing group, `others` [(occupancy, kmin)]
    (the uplinks the switch could have chosen for it; empty where the port is the only way).
    While one member has room, adaptive routing can still move the burst there: no mark."""
    return occupancy >= kmin and all(occ >= k for occ, k in others)


class PauseState:
    """One ingress port's pause hysteresis, as the data path runs it: XOFF when the bytes held
    reach xoff, XON when they fall to xon. `events` lists ('xoff'|'xon', held) transitions."""

    def __init__(self, xoff, xon):
        if not 0 <= xon < xoff:
            raise ValueError(f"need 0 <= xon < xoff, got xon={xon} xoff={xoff}")
        self.xoff, self.xon = xoff, xon
        self.held = 0
        self.paused = False
        self.events = []

    def arrive(self, nbytes):
        self.held += nbytes
        if not self.paused and self.held >= self.xoff:
            self.paused = True
            self.events.append(("xoff", self.held))

    def depart(self, nbytes):
        self.held -= nbytes
        if self.paused and self.held <= self.xon:
            self.paused = False
            self.events.append(("xon", self.held))


# -- parsing the spec section ------------------------------------------------------------------

def _size(value, where):
    return parse_size_bytes(value, where)


def _number(value, where, low=0.0, high=None, strict_low=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{where}: must be a number, got {excerpt(value)}")
    if not math.isfinite(value):
        raise SpecError(f"{where}: must be a finite number, got {excerpt(value)}")
    if value < low or (strict_low and value == low) or (high is not None and value > high):
        bound = f"> {low}" if strict_low else f">= {low}"
        raise SpecError(f"{where}: must be {bound}" + (f" and <= {high}" if high is not None else "")
                        + f", got {excerpt(value)}")
    return float(value)


def _dscps(value, where):
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value:
        raise SpecError(f"{where}: must be a DSCP 0..63 or a list of them, got {excerpt(value)}")
    for d in value:
        if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d <= 63:
            raise SpecError(f"{where}: DSCP values are 0..63, got {excerpt(d)}")
    return tuple(sorted(set(value)))


def _ecn_from_dict(value, where, base=None):
    if value in ("off", False):
        return EcnProfile(mode="off")
    if not isinstance(value, dict):
        raise SpecError(f"{where}: must be a mapping (mode, kmin, kmax, pmax) or 'off', got {excerpt(value)}")
    kwargs = dataclasses.asdict(base) if base else {}
    for key, item in value.items():
        if key == "mode":
            if item is False:             # YAML 1.1 reads a bare `off` as false
                item = "off"
            if item not in ECN_MODES:
                raise SpecError(f"{where}.mode: must be one of {', '.join(ECN_MODES)}, got {excerpt(item)}")
            kwargs["mode"] = item
        elif key in ("kmin", "kmax"):
            kwargs[key] = _size(item, f"{where}.{key}")
        elif key == "pmax":
            kwargs["pmax"] = _number(item, f"{where}.pmax", 0.0, 1.0, strict_low=True)
        else:
            raise SpecError(f"{where}: unknown key {excerpt(key)} (known: kmax, kmin, mode, pmax)")
    profile = EcnProfile(**kwargs)
    if profile.kmin is not None and profile.kmax is not None and profile.kmax < profile.kmin:
        raise SpecError(f"{where}: kmax ({profile.kmax}) must be >= kmin ({profile.kmin})")
    return profile


def _pfc_from_dict(value, where):
    if value in ("off", False):
        return PfcSettings(enabled=False)
    if not isinstance(value, dict):
        raise SpecError(f"{where}: must be a mapping or 'off', got {excerpt(value)}")
    kwargs = {}
    for key, item in value.items():
        if key == "enabled":
            if not isinstance(item, bool):
                raise SpecError(f"{where}.enabled: must be true or false, got {excerpt(item)}")
            kwargs[key] = item
        elif key in ("xoff", "xon", "headroom"):
            kwargs[key] = _size(item, f"{where}.{key}")
        elif key in ("reaction_ms", "restore_ms"):
            kwargs[key] = _number(item, f"{where}.{key}", 0.0, MAX_LAB_MS, strict_low=True)
        elif key == "watchdog_ms":
            # `real`: the default, a switch's 200 ms of real time at the fabric's time scale
            if isinstance(item, str) and item != "real":
                raise SpecError(f"{where}.watchdog_ms: must be lab milliseconds (>= 0, 0: off) or 'real', "
                                f"got {excerpt(item)}")
            kwargs[key] = None if item == "real" else _number(item, f"{where}.{key}", 0.0, MAX_LAB_MS)
        elif key == "watchdog_action":
            if item not in WATCHDOG_ACTIONS:
                raise SpecError(f"{where}.watchdog_action: must be one of "
                                f"{', '.join(WATCHDOG_ACTIONS)}, got {excerpt(item)}")
            kwargs[key] = item
        else:
            known = ", ".join(f.name for f in dataclasses.fields(PfcSettings))
            raise SpecError(f"{where}: unknown key {excerpt(key)} (known: {known})")
    pfc = PfcSettings(**kwargs)
    if pfc.xoff is not None and pfc.xon is not None and pfc.xon >= pfc.xoff:
        raise SpecError(f"{where}: xon ({pfc.xon}) must be below xoff ({pfc.xoff})")
    return pfc


def queues_from_dict(value, where="queues"):
    """Parse the `queues:` section. `true` or `{}` takes every default."""
    if value is True:
        value = {}
    if not isinstance(value, dict):
        raise SpecError(f"{where}: must be a mapping (classes, ecn, pfc) or true, got {excerpt(value)}")
    kwargs = {}
    for key, item in value.items():
        if key == "classes":
            if not isinstance(item, dict):
                raise SpecError(f"{where}.classes: must map lossless/control to DSCP lists, got {excerpt(item)}")
            for cls, dscps in item.items():
                if cls not in ("lossless", "control"):
                    raise SpecError(f"{where}.classes: unknown class {excerpt(cls)} (known: control, lossless; "
                                    f"every other DSCP is lossy)")
                kwargs[f"{cls}_dscp"] = _dscps(dscps, f"{where}.classes.{cls}")
        elif key == "ecn":
            if isinstance(item, dict) and "marker" in item:
                marker = item["marker"]
                if marker not in ECN_MARKERS:
                    raise SpecError(f"{where}.ecn.marker: must be one of {', '.join(ECN_MARKERS)}, "
                                    f"got {excerpt(marker)}")
                kwargs["ecn_marker"] = marker
                item = {k: v for k, v in item.items() if k != "marker"}
            if isinstance(item, dict):
                general = {k: v for k, v in item.items() if k not in SWITCH_ROLES}
                base = _ecn_from_dict(general, f"{where}.ecn")
                kwargs["ecn"] = base
                kwargs["ecn_by_role"] = tuple(
                    (role, _ecn_from_dict(item[role], f"{where}.ecn.{role}", base))
                    for role in SWITCH_ROLES if role in item)
            else:
                kwargs["ecn"] = _ecn_from_dict(item, f"{where}.ecn")
        elif key == "pfc":
            kwargs["pfc"] = _pfc_from_dict(item, f"{where}.pfc")
        else:
            raise SpecError(f"{where}: unknown key {excerpt(key)} (known: classes, ecn, pfc)")
    spec = QueueSpec(**kwargs)
    both = set(spec.lossless_dscp) & set(spec.control_dscp)
    if both:
        raise SpecError(f"{where}.classes: DSCP {sorted(both)[0]} is in both lossless and control")
    return spec


def check_against_fabric(spec, buffers, rates, mtu, where="queues", delays=None):
    """Problems (one line each) with thresholds that cannot work on these buffers and rates.

    `buffers` maps role -> bytes, `rates` maps role -> the fastest link rate of that role's ports,
    `delays` role -> the longest one-way lab delay (ms) of their cables (none: 0). A role missing
    from `rates` has no switch in this fabric (super_spine outside a threetier fabric).
    """
    problems = []
    frame = frame_bytes(mtu)
    for role in (r for r in SWITCH_ROLES if r in rates):
        buf, rate = buffers[role], rates[role]
        if spec.pfc.enabled:
            xoff, xon, headroom = pfc_thresholds(buf, rate, mtu, spec.pfc, (delays or {}).get(role, 0.0))
            if xoff + headroom > buf and spec.pfc.xoff is not None:
                problems.append(f"{where}.pfc: xoff {xoff} B plus {headroom} B of headroom is more than "
                                f"the {role} buffer ({buf} B): what arrives after XOFF would be dropped")
            elif xoff < 2 * frame:
                problems.append(f"{where}.pfc: {role} buffer {buf} B leaves XOFF at {xoff} B after "
                                f"{headroom} B of headroom; it needs at least two {mtu}-MTU frames "
                                f"({2 * frame} B): grow buffers.{role}, or lower pfc.reaction_ms or the delay")
            elif xon >= xoff:
                problems.append(f"{where}.pfc: xon ({xon}) must be below xoff ({xoff}) for {role} ports")
        kmin, kmax = ecn_thresholds(buf, spec.ecn_for(role))
        if spec.ecn_for(role).mode != "off" and kmin > buf:
            problems.append(f"{where}.ecn: kmin {kmin} B is above the {role} buffer ({buf} B); "
                            f"no packet would ever be marked")
        elif spec.ecn_for(role).mode != "off" and kmax > buf:
            problems.append(f"{where}.ecn: kmax {kmax} B is above the {role} buffer ({buf} B); "
                            f"marking would never reach pmax")
    return problems
