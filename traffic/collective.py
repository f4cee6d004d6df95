"""Runs a collective on a live lab: places ranks, starts one agent per rank, drives iterations.

    with Lab(load_spec("default")) as lab:
        result = run_collective(lab, CollectiveSpec("allreduce", sizes=(1 << 20,), verify=True))

The launcher owns the control plane the agents use instead of NCCL's bootstrap: a Unix socket in
the run folder (every host namespace shares the file system). Per message size it asks every
agent to prepare, then for each iteration sends a start time a little in the future and waits for
every rank's "done": that is the barrier between iterations. With `in_place` each size runs twice,
as nccl-tests runs it: out of place, then in place, each with its warm-up and its own result row.
Every wait is bounded; an agent that dies, reports a failed QP, or does not finish in time stops
the run with an error naming the rank, its host, and (when known) the peer it was waiting for.
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import selectors
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field

from fabriclab.errors import LabError
from fabriclab.loading import boolean, excerpt, number, whole
from fabriclab.measure import cpuload, telemetry, zones
from fabriclab.system import patience
from fabriclab.units import human_size
from fabriclab.traffic import agent_process, rank_channel, roce, schedules, softroce
from fabriclab.traffic import cc as cc_kinds
from fabriclab.traffic import plb as lb
from fabriclab.traffic.rank_driver import QP_METHODS
from fabriclab.traffic.stall import explain_stall

AGENT_MODULE = "fabriclab.traffic.agent"
AGENT_MODULES = {softroce.UDP: AGENT_MODULE, softroce.RXE: "fabriclab.traffic.verbs_agent"}
PLACEMENTS = ("order", "topology", "scatter", "random", "rail")
FIRST_QPN = 0x100
REORDER_MODES = ("go-back-n", "place")
START_MARGIN_S = 0.05        # "run" reaches every agent before its start time
IDLE_SLACK_S = 0.01          # past cc_idle_s: the agents' clocks and wake-ups are not exact
HELLO_TIMEOUT_S = 30.0       # agents import numpy and open sockets (many start at once)
READY_TIMEOUT_S = 15.0
FINAL_TIMEOUT_S = 10.0
AGENT_LATENCY_S = 0.01
"""What the agents add to a probe's round trip: each end's event loop must wake, read and send
(the two cores are shared by every agent and the switches)."""


SCALE_UP_FACTOR = 8
"""On a rail-cabled fabric, ranks of one host reach each other (a ring's change of rail, PXN's
first hop) through the host at this multiple of the NIC's rate, standing for the scale-up domain
(NVLink 4's 900 GB/s per GPU is 18 x a 400G NIC; the lab's two cores carry less than that over
loopback beside everything else). Rack fabrics keep such hops at the NIC's rate, as before."""

MAX_SIZE = 1 << 32                  # 4 GiB: hours at the lab's Mbit/s, beyond any useful run
MAX_PROGRAM = 4096                  # steps of a program: a replayed trace's collectives
MAX_GAP_S = 3600.0
# Whole-number fields and their physical bounds (inclusive).
WHOLE_BOUNDS = {"channels": (1, 64), "qps": (1, 64), "spray": (1, 256), "chunk_bytes": (4, 16 << 20),
                "piece_bytes": (4, 16 << 20), "iterations": (1, 1_000_000), "warmup": (0, 1000),
                "ack_every": (1, 1024), "retry_limit": (0, 7), "cts_buffers": (1, 64),
                "probe_timeouts": (1, 100), "root": (0, 1 << 16), "seed": (0, (1 << 32) - 1)}
# Optional times in seconds: a microsecond to a minute (the lab's round trips are milliseconds).
TIMEOUTS_S = ("ack_timeout_s", "probe_interval_s", "sw_timeout_s", "reorder_timeout_s")


@dataclass
class CollectiveSpec:
    """What to run. Sizes in bytes (nccl-tests semantics, see `schedules`)."""

    collective: str = "allreduce"
    sizes: tuple = (1 << 20,)
    algorithm: str | None = None
    hosts: tuple | None = None          # host names taking part (default: all)
    nics: int | None = None             # NICs per host used as ranks (default: all)
    placement: str = "order"
    channels: int = 1
    qps: int = 1                        # QPs per connection per plane (QP scaling)
    qp_method: str = "round-robin"
    chunk_bytes: int = 65536            # NIC message size
    piece_bytes: int = 65536            # tree pipelining unit
    iterations: int = 5
    warmup: int = 1
    verify: bool = False
    in_place: bool = False              # also run every size in place, after out of place
    imbalance: float = 4.0              # AlltoAllv: max/min block size ratio
    root: int = 0                       # Gather's root rank
    sport_mode: str = "qp"
    spray: int = 1                      # source ports per QP, varied per packet (1: no spraying)
    dscp: int = roce.DEFAULT_DSCP
    control_dscp: int = roce.DEFAULT_DSCP
    cnp_dscp: int = 48
    ecn: int = roce.DEFAULT_ECN
    ack_every: int = 16
    ack_timeout_s: float | None = None  # default: from the spec's buffers and rates
    retry_limit: int = 7
    cts: bool = False
    cts_buffers: int = 2                # channel buffers per connection the receiver grants
    dcqcn: dict | None = None           # None: off; {} NIC defaults; or NIC parameter overrides
    # The congestion-control kind (traffic/cc.py): dcqcn, or spx (SPX CC: on at the senders
    # whenever chosen, with `spx` overriding its real-unit constants, traffic/spxcc.py).
    cc: str = "dcqcn"
    spx: dict | None = None
    seed: int = 1
    timeout_factor: float = 20.0        # an iteration may take this x its ideal time (+ slack)
    # udp (the emulated RNIC) | rxe (soft-RoCE verbs) | auto (doctor's choice). Python callers get
    # udp unless they ask: experiments and tests read counters only it has (retransmissions, CE
    # marks, local ACK timeouts, CNPs). The `collective` command and the prompt default to auto.
    backend: str = "udp"
    # The plane load balancer (traffic/plb.py): per-plane | global | static | software | esr.
    plb: str = "static"
    probe_interval_s: float | None = None   # default: the probe round trip's bound on the spec
    probe_timeouts: int = lb.PROBE_TIMEOUTS  # consecutive probe timeouts that remove a plane
    sw_timeout_s: float | None = None       # software: stall before a plane is given up (ACK timeout)
    # per-plane, global, esr: a destination silent this long starts its next burst with fresh
    # CC contexts (seed 002 6.7). None: the probe interval (a few round trips); 0: never.
    cc_idle_s: float | None = None
    # What the receiver does with a packet ahead of the expected PSN: go-back-n (NAK it, as an
    # RC QP of RoCEv2 does) or place (write it where its RETH says and remember it, as a NIC
    # built for per-packet load balancing does: seed 002 section 3). None: place where the plb
    # mode sends one QP on several planes, else go-back-n.
    reorder: str | None = None
    reorder_timeout_s: float | None = None  # place: a hole older than this is NAKed (default: a
                                            # path's buffers draining, the most reordering costs)
    # PXN: a transfer between two hosts' different NIC indexes (rails) is relayed through the
    # sender's host to its rank on the receiver's rail (schedules.relay_across_rails). None: on
    # where the fabric is rail-cabled and the backend keeps intra-host hops in the host (udp).
    pxn: bool | None = None
    # A program instead of `collective` x `sizes`: ((collective, size, gap_s), ...) run once each,
    # in order, step k starting at least gap_s after step k-1 ended (a replayed trace's compute
    # gaps). Needs iterations 1 and warmup 0: a program is one pass of a job, not a sweep.
    program: tuple | None = None

    def check(self):
        """Raise LabError naming the first bad field."""
        def bad(name, why):
            raise LabError(f"collective: {name} {why}, got {excerpt(getattr(self, name))}")

        if self.collective not in schedules.COLLECTIVES:
            bad("collective", f"must be one of {', '.join(schedules.COLLECTIVES)}")
        algorithms = schedules.ALGORITHMS.get(self.collective, ("ring",))
        if self.algorithm is not None and self.algorithm not in algorithms:
            bad("algorithm", f"for {self.collective} must be one of {', '.join(algorithms)}")
        if not isinstance(self.sizes, (tuple, list)) or not 1 <= len(self.sizes) <= 64:
            bad("sizes", "must be a list of 1 to 64 sizes")
        for size in self.sizes:
            whole(size, "collective: sizes", 4, MAX_SIZE)
        for name, (low, high) in WHOLE_BOUNDS.items():
            whole(getattr(self, name), f"collective: {name}", low, high)
        if self.chunk_bytes % 4:
            bad("chunk_bytes", "must be a multiple of 4")
        if self.program is not None:
            self._check_program(bad)
        if self.placement not in PLACEMENTS:
            bad("placement", f"must be one of {', '.join(PLACEMENTS)}")
        if self.qp_method not in QP_METHODS:
            bad("qp_method", f"must be one of {', '.join(QP_METHODS)}")
        if self.sport_mode not in ("qp", "shared"):
            bad("sport_mode", "must be qp or shared")
        for name in ("dscp", "control_dscp", "cnp_dscp"):
            if _not_int(getattr(self, name)) or not 0 <= getattr(self, name) <= 63:
                bad(name, "must be a DSCP value 0..63")
        if _not_int(self.ecn) or not 0 <= self.ecn <= 3:
            bad("ecn", "must be an ECN codepoint 0..3")
        for name in TIMEOUTS_S:
            if getattr(self, name) is not None:
                number(getattr(self, name), f"collective: {name} (s)", 1e-6, 60)
        if self.cc_idle_s is not None:
            number(self.cc_idle_s, "collective: cc_idle_s (s; 0: never reset)", 0, 3600)
        number(self.imbalance, "collective: imbalance (AlltoAllv's max/min block ratio)", 1, 1000)
        number(self.timeout_factor, "collective: timeout_factor", 1, 1000, low_open=True)
        for name in ("verify", "in_place", "cts"):
            boolean(getattr(self, name), f"collective: {name}")
        if self.pxn is not None:
            boolean(self.pxn, "collective: pxn")
        if self.cc not in cc_kinds.KINDS:
            bad("cc", f"must be one of {', '.join(cc_kinds.KINDS)}")
        if self.cc != "dcqcn" and self.dcqcn is not None:
            bad("dcqcn", f"is for cc dcqcn, not {self.cc} (use {self.cc}'s own parameters)")
        if self.cc != "spx" and self.spx is not None:
            bad("spx", f"is for cc spx, not {self.cc}")
        for name in cc_kinds.KINDS:
            values = getattr(self, name)
            if values is None:
                continue
            if not isinstance(values, dict) or not all(isinstance(k, str) for k in values):
                bad(name, f"must be null or a mapping of {name} parameters")
            try:                # the NIC units are checked here; the line rate with the fabric
                cc_kinds.kind(name).scaled(1e6, 1.0, values)
            except (TypeError, ValueError) as exc:
                raise LabError(f"collective: {name}: {exc}") from None
        if self.backend not in softroce.BACKENDS:
            bad("backend", f"must be one of {', '.join(softroce.BACKENDS)}")
        if self.plb not in lb.MODES:
            bad("plb", f"must be one of {', '.join(lb.MODES)}")
        if self.reorder is not None and self.reorder not in REORDER_MODES:
            bad("reorder", f"must be one of {', '.join(REORDER_MODES)}")
        if self.reorder == "go-back-n" and self.plb in lb.MULTIPATH:
            bad("reorder", f"must be place with plb {self.plb}: its QPs send on every plane, so "
                           "their packets arrive out of order")

    def _check_program(self, bad):
        if not isinstance(self.program, (tuple, list)) or not 1 <= len(self.program) <= MAX_PROGRAM:
            bad("program", f"must be a list of 1 to {MAX_PROGRAM} (collective, size, gap_s) steps")
        if self.iterations != 1 or self.warmup != 0 or self.in_place:
            raise LabError("collective: a program runs once: iterations 1, warmup 0, not in place")
        for k, step in enumerate(self.program):
            if not isinstance(step, (tuple, list)) or len(step) != 3:
                raise LabError(f"collective: program step {k} must be (collective, size, gap_s), "
                               f"got {excerpt(step)}")
            collective, size, gap = step
            if collective not in schedules.COLLECTIVES:
                raise LabError(f"collective: program step {k}: collective must be one of "
                               f"{', '.join(schedules.COLLECTIVES)}, got {excerpt(collective)}")
            whole(size, f"collective: program step {k} size", 4, MAX_SIZE)
            number(gap, f"collective: program step {k} gap_s", 0, MAX_GAP_S)

    def steps(self):
        """What runs, in order: (collective, size, gap_s before it or None for the usual gap)."""
        if self.program is not None:
            return [tuple(step) for step in self.program]
        return [(self.collective, size, None) for size in self.sizes]

    def cc_params(self):
        """The chosen kind's parameter overrides, or None when the senders run no per-QP CC
        (dcqcn without `dcqcn`; spx is always on)."""
        if self.cc == "spx":
            return dict(self.spx or {})
        return None if self.dcqcn is None else dict(self.dcqcn)

    def reorder_mode(self):
        """The receiver's way with out-of-order packets: `reorder`, or the plb mode's default."""
        if self.reorder is not None:
            return self.reorder
        return "place" if self.plb in lb.MULTIPATH else "go-back-n"


def step_algorithm(spec, collective):
    """The spec's algorithm where `collective` has that choice, else its only one."""
    return spec.algorithm if spec.algorithm in schedules.ALGORITHMS.get(collective, ()) else None


def _not_int(value):
    return isinstance(value, bool) or not isinstance(value, int)


@dataclass
class Rank:
    rank: int
    host: str
    nic: int
    ports: list                       # HostPort per plane, plane order


def place_ranks(fabric, spec):
    """Ranks on (host, NIC) in the chosen order.

    order: host by host, NIC by NIC, as a launcher fills nodes. topology: grouped by zone (a
    threetier fabric's pod), then by leaf (a rail group's hosts on a rail fabric), so that ring
    neighbours share a zone and a leaf wherever they can: a ring crosses between zones once per
    zone it spans, the minimum cut (seed 000 3.2). It is the same as `order` when hosts are
    numbered leaf by leaf, as the lab's are; it differs for a host list given out of order.
    scatter: hosts dealt round-robin over the zones (over the leaves, or rail groups, where there
    is one zone), so every ring neighbour sits in another one: what a scheduler blind to the
    topology can do. random: a seeded shuffle of (host, NIC) slots. rail: rail by rail, hosts
    grouped as `topology`, every other rail in reverse (a snake), so a ring's neighbours on two
    hosts share a NIC index (a rail) and the ring changes rail inside a host, as NCCL's
    rail-aligned rings do.
    """
    names = list(spec.hosts) if spec.hosts else list(fabric.hosts)
    unknown = [h for h in names if h not in fabric.hosts]
    if unknown:
        raise LabError(f"host {excerpt(unknown[0])} is not in fabric {excerpt(fabric.spec.name)} "
                       f"(hosts: {', '.join(fabric.hosts)})")
    if len(set(names)) != len(names):
        raise LabError("collective: a host is listed twice")
    nics = spec.nics if spec.nics is not None else fabric.spec.nics_per_host
    if _not_int(nics) or not 1 <= nics <= fabric.spec.nics_per_host:
        raise LabError(f"collective: nics must be 1..{fabric.spec.nics_per_host} on this fabric, "
                       f"got {excerpt(nics)}")
    hosts = [fabric.hosts[h] for h in names]
    if spec.placement in ("topology", "rail"):
        hosts.sort(key=lambda h: (fabric.pod_of(h.name), h.group, h.index))
    if spec.placement == "scatter":
        hosts = _deal(hosts, lambda h: fabric.pod_of(h.name) if fabric.spec.kind == "threetier" else h.group)
    if spec.placement == "rail":
        slots = [(h, nic) for nic in range(nics) for h in (hosts if nic % 2 == 0 else hosts[::-1])]
    else:
        slots = [(h, nic) for h in hosts for nic in range(nics)]
    if spec.placement == "random":
        random.Random(spec.seed).shuffle(slots)
    ranks = []
    for i, (host, nic) in enumerate(slots):
        ports = sorted((p for p in host.ports if p.nic == nic), key=lambda p: p.plane)
        ranks.append(Rank(i, host.name, nic, ports))
    if len(ranks) < 2:
        raise LabError(f"collective: {len(ranks)} rank; a collective needs at least 2")
    return ranks


def _deal(hosts, group_of):
    """Hosts one per group in turn (groups in order, hosts within a group in order)."""
    groups = {}
    for h in sorted(hosts, key=lambda h: h.index):
        groups.setdefault(group_of(h), []).append(h)
    queues = [groups[g] for g in sorted(groups)]
    out = []
    while any(queues):
        for queue in queues:
            if queue:
                out.append(queue.pop(0))
    return out


def registered_regions(schedules_, rank):
    """The memory a verbs agent registers once for every size and mode: each region at its
    largest (in place a buffer lives inside another region, which may then be larger)."""
    regions = {}
    for schedule in schedules_:
        for name, size in schedule.regions[rank].items():
            regions[name] = max(regions.get(name, 0), size)
    return regions


def plan_qps(ranks, schedules_, spec, rng):
    """Per rank: the QP descriptions the agent needs, for every connection any size uses.

    Plane-bound modes (static, software) open `qps` QPs per connection on every plane; the
    multipath modes `qps` QPs per connection in all, each sending on every plane (its "port" is
    then only its number's plane, for the record). Every QP knows its peer's address on every
    plane."""
    connections = sorted({c for s in schedules_ for c in s.connections()})
    planes = len(ranks[0].ports)
    # Each NIC numbers its QPs from its own counter, which starts anywhere on a real device; the
    # same start everywhere would give every ring connection the same QP pair (and source port).
    next_qpn = [rng.randrange(FIRST_QPN, 1 << 23) for _ in ranks]
    out = [[] for _ in ranks]
    bound = spec.plb in lb.PLANE_BOUND
    for a, b, channel in connections:
        for plane in range(planes if bound else 1):
            for k in range(spec.qps):
                qa, qb = next_qpn[a], next_qpn[b]
                next_qpn[a] += 1
                next_qpn[b] += 1
                pa, pb = ranks[a].ports[plane], ranks[b].ports[plane]
                sport = roce.udp_source_port(qa, qb, shared=spec.sport_mode == "shared",
                                             src=pa.ip, dst=pb.ip)
                psn_ab, psn_ba = rng.randrange(1 << 24), rng.randrange(1 << 24)
                for me, peer, qpn, peer_qpn, port, peer_port, send, recv in (
                        (a, b, qa, qb, pa, pb, psn_ab, psn_ba), (b, a, qb, qa, pb, pa, psn_ba, psn_ab)):
                    out[me].append({"qpn": qpn, "peer": peer, "peer_qpn": peer_qpn,
                                    "channel": channel, "port": plane if bound else k % planes,
                                    "index": k, "peer_address": peer_port.ip,
                                    "peer_addresses": [p.ip for p in ranks[peer].ports],
                                    "sport": sport, "send_psn": send, "recv_psn": recv,
                                    # a rank on the same host: reached through the host
                                    "local": ranks[a].host == ranks[b].host})
    return out


def nic_queue_bytes(fabric, host_delay_ms=0.0):
    """The NIC transmit queue under the queue model: its host buffer (a real NIC fetches work only
    as fast as it can send, so a pause must not find megabytes queued behind it), plus the bytes
    its cable's delay holds (the lab's delay sits in the NIC's own qdisc, charged to the sender's
    socket). The kernel charges a jumbo frame's truesize, about 1.5x its length, hence the factor.
    None: no model."""
    if fabric.spec.queues is None:
        return None
    in_flight = fabric.spec.host_rate_mbps * 1e6 / 8 * host_delay_ms / 1000
    return int(1.5 * (max(fabric.spec.buffers.host, 4 * (fabric.spec.mtu + 14)) + in_flight))


def lab_delay_ms(lab, kind):
    """The one-way delay the lab puts on a `kind` ('host' | 'fabric') cable (0 without)."""
    delay = getattr(lab, "link_delay_ms", None)
    return 0.0 if delay is None else delay(kind)


def path_rtt_s(lab):
    """The round trip the lab's link delays add between hosts on different leaves."""
    return 4 * (lab_delay_ms(lab, "host") + lab_delay_ms(lab, "fabric")) / 1000


def path_drain_s(fabric):
    """How long the buffers of a fabric's longest path take to drain: host, two leaves and a
    spine at the host rate; a threetier fabric's cross-zone path adds a second spine and a
    super-spine, and drains at the slower of the host and super-spine rates (an oversubscribed
    tier queues there, and the 2-tier figure would undercount that path's wait)."""
    spec = fabric.spec
    b = spec.buffers
    if spec.kind == "threetier":
        return ((b.host + 2 * b.leaf + 2 * b.spine + b.super_spine) * 8
                / (min(spec.host_rate_mbps, spec.core_rate_mbps) * 1e6))
    return (b.host + 2 * b.leaf + b.spine) * 8 / (spec.host_rate_mbps * 1e6)


def default_ack_timeout(fabric, rtt_s=0.0, dscp=roce.DEFAULT_DSCP):
    """Long enough for a packet to wait behind full buffers on every hop of a path and its ACK
    to come back: 2 x the longest path's drain time (path_drain_s), plus 50 ms (4 times the
    buffers' drain time for a job in the lossless class), plus the round trip of the links' delay.
    A job in a lossy class of a PFC fabric is tail-dropped like one on a fabric without PFC, and
    recovers as soon."""
    drain_s = path_drain_s(fabric)
    queues = fabric.spec.queues
    if queues is not None and queues.pfc.enabled and dscp in queues.lossless_dscp:
        # Lossless: nothing is dropped, but a flow sharing a paused path waits behind the others'
        # bytes and the pauses themselves; a premature timeout would only add duplicates.
        drain_s *= 4
    return round(2 * drain_s + 0.05 + rtt_s, 3)


def default_reorder_timeout(fabric, rtt_s=0.0):
    """How long a placing receiver waits for a hole before it NAKs it as lost: the time every
    buffer of a path takes to drain (path_drain_s), the most a packet can fall behind another of
    its QP on a lossless path, plus the links' delay. A hole NAKed too early costs one duplicate
    packet; one found only by the ACK timeout, go-back-N."""
    return round(path_drain_s(fabric) + rtt_s / 2, 4)


def roce_frame_bytes(payload_bytes):
    """A full RDMA WRITE packet on the wire (Ethernet header included)."""
    return payload_bytes + roce.ROCE_OVERHEAD + roce.RETH_LEN + roce.ETH_HEADER_LEN


def iteration_gap(plb_mode, cc_idle_s):
    """Seconds from every rank's "done" to the next iteration's start. Where the PLB keeps CC
    contexts and releases them after `cc_idle_s` of silence, an iteration is a burst: the gap
    outlasts cc_idle_s, so each iteration starts with fresh contexts (seed 002 6.7) instead of
    inheriting a rate the last one cut, which DCQCN's timer takes seconds of lab time to undo."""
    if plb_mode in lb.MULTIPATH and cc_idle_s:
        return max(START_MARGIN_S, cc_idle_s + IDLE_SLACK_S)
    return START_MARGIN_S


def default_probe_interval(fabric, cnp_dscp, payload_bytes, rtt_s=0.0):
    """The bound on a probe's round trip, used as the probe interval and timeout.

    Probes and echoes carry the CNPs' DSCP. Where the queue model puts it in the control class
    (strict priority, never paused) a probe waits at most for the frame already on the wire at
    each of the 8 egress ports of a round trip across the spines (NIC, leaf, spine, leaf, each
    way): 8 RoCE frame times at the slower of the host and fabric rates, the time scale's image
    of the few microseconds a real probe takes. Without that class it queues with the data, and
    the bound is every buffer on the way draining, both ways. Plus the links' round-trip delay
    and the agents' own latency (AGENT_LATENCY_S)."""
    spec = fabric.spec
    rate = min(spec.host_rate_mbps, spec.fabric_rate_mbps) * 1e6
    queues = spec.queues
    if queues is not None and cnp_dscp in queues.control_dscp:
        wait_s = 8 * roce_frame_bytes(payload_bytes) * 8 / rate
    else:
        b = spec.buffers
        wait_s = 2 * (b.host + 2 * b.leaf + b.spine) * 8 / rate
    return round(wait_s + rtt_s + AGENT_LATENCY_S, 4)


def egress_room_bytes(fabric, payload_bytes, host_delay_ms=0.0):
    """The NIC egress queue below which a plane counts as having room (per-plane and global
    PLB): two full frames at the kernel's truesize (about 1.5x, as `nic_queue_bytes`), plus what
    the host cable's delay holds where the lab puts that delay in the NIC's own qdisc."""
    in_flight = fabric.spec.host_rate_mbps * 1e6 / 8 * host_delay_ms / 1000
    return int(2 * 1.5 * roce_frame_bytes(payload_bytes) + in_flight)


@dataclass
class CollectiveRun:
    spec: CollectiveSpec
    ranks: list
    payload_bytes: int
    ack_timeout_s: float
    link_rate_mbps: float
    sizes: list = field(default_factory=list)        # per size: a result row (dict)
    finals: dict = field(default_factory=dict)       # rank -> final counters
    abandoned: bool = False      # a noise job's last iteration was given up when it was told to stop
    elapsed_s: float = 0.0
    queues: dict | None = None                       # the queue model's counters over the run
    traffic_window: tuple | None = None              # wall clock: first measured start, last end
    backend: str = softroce.UDP                      # what moved the bytes: udp | rdma_rxe
    pids: dict = field(default_factory=dict)         # rank -> its agent's process id
    plb: dict | None = None                          # the plane load balancer's settings
    reorder: str = "go-back-n"                       # the receivers' way with reordering
    reorder_timeout_s: float | None = None           # place: a hole's wait before its NAK
    pxn: bool = False                                # cross-rail transfers relayed in the host
    scale_up_rate_mbps: float | None = None          # same-host hops' pace (None: the NIC's)
    cc: dict | None = None                           # the senders' congestion control as run


class _AgentLink:
    """The launcher's end of one agent's control connection (the framing is rank_channel's)."""

    def __init__(self, rank, proc, clock_offset_s=0.0):
        self.rank, self.proc = rank, proc
        # The agent's wall clock minus this one's (a rank on another machine of a cluster): the
        # start times it is sent are on its clock, the times it reports are set back onto this one.
        self.clock_offset_s = clock_offset_s
        self.sock = None
        self.hello = {}
        self.lines = rank_channel.Lines()

    def send(self, message):
        if self.clock_offset_s and "start_at" in message:
            message = {**message, "start_at": message["start_at"] + self.clock_offset_s}
        self.sock.sendall(rank_channel.frame(message))

    def messages(self):
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            return None
        messages = self.lines.feed(chunk)
        if self.clock_offset_s:
            for message in messages:
                _onto_this_clock(message, self.clock_offset_s)
        return messages


def _onto_this_clock(message, offset_s):
    """Set an agent's wall-clock times onto this machine's clock: an iteration's start and end
    ("done"), and in "final" each QP's first send and last ACK and the plane load balancer's
    timeline start and event times."""
    def shift(record, key):
        if isinstance(record, dict) and isinstance(record.get(key), (int, float)) \
                and not isinstance(record[key], bool):
            record[key] -= offset_s

    if "done" in message:
        shift(message, "start")
        shift(message, "end")
    if "final" in message:
        for qp in message.get("qps") or ():
            shift(qp, "first_send")
            shift(qp, "last_ack")
        plb_record = message.get("plb")
        if isinstance(plb_record, dict):
            shift(plb_record.get("timeline"), "start")
            for event in plb_record.get("events") or ():
                shift(event, "t")


class _Abandoned(Exception):
    """A background job's iteration given up: its stop came while it ran."""


class Launcher:
    """Runs one collective job. Several can run at once on disjoint hosts (a victim beside a
    noise job): each needs its own `name` (its control folder); `stop`, a threading.Event, ends
    a job after its current iteration (at least one measured) instead of its last. With
    `abandon`, a job that has finished a measured iteration ends at once when `stop` is set,
    mid-iteration: noise, whose last iteration nobody measures (waiting for it was 12 s of a
    51 s victim-noise draw, 2026-11-28, though a first measured iteration is still waited for);
    its final counters are read as they stand."""

    def __init__(self, lab, spec, progress=None, name="collective", stop=None, on_ready=None, abandon=False):
        spec.check()
        self.lab, self.spec, self.progress = lab, spec, progress
        self.name, self.stop, self.abandon = name, stop, abandon
        self._diagnosing = False      # asking the ranks why they stalled (see _stuck)
        self.on_ready = on_ready      # called once every agent is up, before the first iteration
        fabric = lab.fabric
        self.ranks = place_ranks(fabric, spec)
        n = len(self.ranks)
        self.backend = softroce.backend_for(spec)
        self.pxn = pxn_enabled(fabric, spec, self.backend)
        self._modes = (False, True) if spec.in_place else (False,)
        self.gaps = [gap for _c, _s, gap in spec.steps()]
        try:
            # Every schedule is checked here (cheaply: its parameters and size, up to 64 sizes or
            # 4096 program steps, each maybe a million steps and transfers) and built when the
            # job first needs it, so checking a plan builds none.
            for collective, size, _gap in spec.steps():
                schedules.validate(collective, n, size, algorithm=step_algorithm(spec, collective),
                                   channels=spec.channels, piece_bytes=spec.piece_bytes,
                                   imbalance=spec.imbalance, root=spec.root)
        except ValueError as exc:
            raise LabError(f"collective: {exc}") from None
        self.payload_bytes = roce.path_mtu_for(fabric.spec.mtu)
        self.ack_timeout = spec.ack_timeout_s or default_ack_timeout(fabric, path_rtt_s(lab), spec.dscp)
        self.reorder_timeout = spec.reorder_timeout_s or default_reorder_timeout(fabric, path_rtt_s(lab))
        self.rate_mbps = fabric.spec.host_rate_mbps
        self.scale_up_rate = (self.rate_mbps * SCALE_UP_FACTOR if fabric.spec.cabling == "rail"
                              else None)
        self.plb = {"mode": spec.plb,
                    "probe_interval_s": spec.probe_interval_s or default_probe_interval(
                        fabric, spec.cnp_dscp, self.payload_bytes, path_rtt_s(lab)),
                    "probe_timeouts": spec.probe_timeouts,
                    # NCCL gives a plane up after the transport's own timeout (NCCL_IB_TIMEOUT):
                    # the lab's is the local ACK timeout, derived from the same buffers.
                    "sw_timeout_s": spec.sw_timeout_s or self.ack_timeout,
                    "egress_room_bytes": egress_room_bytes(fabric, self.payload_bytes,
                                                           lab_delay_ms(lab, "host"))}
        self.plb["cc_idle_s"] = (self.plb["probe_interval_s"] if spec.cc_idle_s is None
                                 else spec.cc_idle_s)
        self.iteration_gap_s = iteration_gap(spec.plb, self.plb["cc_idle_s"])
        self.softroce = None                 # the job's rxe devices while they exist
        self.links = {}
        self.selector = selectors.DefaultSelector()
        self.server = None
        self.forwarded = []          # machines whose agents reach control.sock over SSH
        self.folder = None

    @functools.cached_property
    def cases(self):
        """What runs, in order: (index of the size or step, its schedule), out of place then in
        place; built on first use."""
        spec, n = self.spec, len(self.ranks)
        locality = [(r.host, r.nic) for r in self.ranks] if self.pxn else None
        try:
            return [(index, schedules.build(collective, n, size, algorithm=step_algorithm(spec, collective),
                                            channels=spec.channels, piece_bytes=spec.piece_bytes,
                                            imbalance=spec.imbalance, seed=spec.seed, root=spec.root,
                                            in_place=in_place, pxn=locality))
                    for index, (collective, size, _gap) in enumerate(spec.steps()) for in_place in self._modes]
        except ValueError as exc:
            raise LabError(f"collective: {exc}") from None

    @property
    def schedules(self):
        """One per size or step: both modes move the same bytes between the same ranks."""
        return [schedule for _index, schedule in self.cases if not schedule.in_place]

    def describe(self, rank):
        r = self.ranks[rank]
        return f"rank {rank} ({r.host} {r.ports[0].intf})"

    # -- agents -----------------------------------------------------------------------------------

    def _configs(self):
        spec = self.spec
        qps = plan_qps(self.ranks, self.schedules, spec, random.Random(spec.seed))
        qp_cc = cc = None
        multipath = spec.plb in lb.MULTIPATH
        overrides = spec.cc_params()
        if overrides is not None or multipath:
            params = self.cc_params_scaled()
            # A multipath NIC's CC lives in its per-destination contexts (always on: it is half
            # of the plane choice); the kind's parameters then set those, not a per-QP CC.
            if multipath:
                cc = params
            else:
                qp_cc = params
        rank_table = [{"rank": r.rank, "host": r.host, "nic": r.nic,
                       "addresses": [p.ip for p in r.ports]} for r in self.ranks]
        transport = {"payload_bytes": self.payload_bytes, "chunk_bytes": spec.chunk_bytes,
                     "qp_method": spec.qp_method, "ack_every": spec.ack_every, "spray": spec.spray,
                     "ack_timeout_s": self.ack_timeout, "retry_limit": spec.retry_limit,
                     "dscp": spec.dscp, "control_dscp": spec.control_dscp,
                     "cnp_dscp": spec.cnp_dscp, "ecn": spec.ecn,
                     "cts": {"enabled": spec.cts, "buffers": spec.cts_buffers,
                             "refresh_s": max(0.01, self.ack_timeout / 4)},
                     "cc_kind": spec.cc, "qp_cc": qp_cc, "nic_queue_bytes": nic_queue_bytes(self.lab.fabric,
                                                        lab_delay_ms(self.lab, "host")),
                     "plb": {**self.plb, "cc": cc}, "reorder": spec.reorder_mode(),
                     "reorder_timeout_s": self.reorder_timeout,
                     "scale_up_rate_mbps": self.scale_up_rate}
        collective = {"collective": spec.collective, "algorithm": self.schedules[0].algorithm,
                      "channels": spec.channels, "piece_bytes": spec.piece_bytes,
                      "imbalance": spec.imbalance, "seed": spec.seed, "root": spec.root,
                      "pxn": self.pxn}
        if spec.program is not None:
            # per step: its collective and algorithm (the agents build the same schedules)
            collective["program"] = [[s.collective, s.algorithm] for s in self.schedules]
        for r in self.ranks:
            config = {"rank": r.rank, "ranks": rank_table, "qps": qps[r.rank],
                      "ports": [{"address": p.ip, "rate_mbps": self.rate_mbps, "intf": p.intf}
                                for p in r.ports],
                      "transport": transport, "collective": collective,
                      "sizes": [size for _c, size, _g in spec.steps()], "verify": spec.verify, "data_seed": spec.seed,
                      "control": str(self.folder / "control.sock")}
            if self.backend == softroce.RXE:
                config["rdma"] = {"devices": self.softroce.devices(r.rank),
                                  "regions": registered_regions([s for _i, s in self.cases], r.rank)}
            yield r, config

    def cc_params_scaled(self):
        """The chosen congestion control's parameters on this fabric's links and time scale
        (a dict, as the agents and the results get them)."""
        spec = self.spec
        try:
            return cc_kinds.kind(spec.cc).scaled(self.rate_mbps, self.lab.fabric.spec.time_scale or 1.0,
                                                 spec.cc_params() or {}).to_dict()
        except (TypeError, ValueError) as exc:
            raise LabError(f"collective: {spec.cc}: {exc}") from None

    def cc_record(self):
        """The congestion control the senders run, for the results: its kind, where it lives
        (per QP, or the plane load balancer's contexts) and every parameter in lab units after
        the time scale (None where nothing runs one: no per-QP CC asked for on a plane-bound
        mode, or the rxe backend)."""
        spec = self.spec
        multipath = spec.plb in lb.MULTIPATH
        if self.backend != softroce.UDP or (spec.cc_params() is None and not multipath):
            return None
        return {"kind": spec.cc, "where": "plb contexts" if multipath else "qp",
                "time_scale": self.lab.fabric.spec.time_scale or 1.0,
                "overrides": spec.cc_params() or {}, "params": self.cc_params_scaled()}

    def start_agents(self):
        self.folder = self.lab.run.path(self.name)
        self.folder.mkdir(exist_ok=True)
        control = self.folder / "control.sock"
        control.unlink(missing_ok=True)
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(control))
        self.server.listen(len(self.ranks) + 4)
        self.server.setblocking(False)
        self.selector.register(self.server, selectors.EVENT_READ, None)
        cluster = getattr(self.lab, "cluster", None)
        if cluster is not None:       # ranks on other machines report through the lab's SSH
            for machine in cluster.remote_machines({r.host for r in self.ranks}):
                cluster.forward(machine, control)
                self.forwarded.append(machine)
        if self.backend == softroce.RXE:
            peers = {}
            for schedule in self.schedules:
                for a, b, channel in schedule.connections():
                    peers.setdefault(a, set()).add((b, channel))
                    peers.setdefault(b, set()).add((a, channel))
            most = max((len(p) for p in peers.values()), default=1) * self.spec.qps
            self.softroce = softroce.SoftRoce(self.lab, self.ranks, self.name, qps_per_port=most)
            self.softroce.attach()
        module = AGENT_MODULES[self.backend]
        for rank, config in self._configs():
            path = self.folder / f"rank{rank.rank}.json"
            path.write_text(json.dumps(config))
            agent_process.prepare(self.lab, rank.host, [path])
            proc = agent_process.start(self.lab, rank.host, module, ["--config", path], "collective-agent")
            self.links[rank.rank] = _AgentLink(rank.rank, proc, agent_process.clock_offset_s(self.lab, rank.host))
        self._gather("hello", range(len(self.ranks)), patience.scaled(HELLO_TIMEOUT_S), "start")
        if self.backend == softroce.RXE:
            # The devices number their own QPs and keys: every agent learns every rank's.
            table = {str(rank): link.hello["verbs"] for rank, link in self.links.items()}
            for link in self.links.values():
                link.send({"connect": table})
            self._gather("connected", list(self.links), patience.scaled(READY_TIMEOUT_S),
                         "connecting QPs")
        if hasattr(self.lab, "announce_job"):
            self.lab.announce_job(self.name, self.placement_pairs())
        self.announced = True
        if self.on_ready is not None:
            self.on_ready(time.time())

    def placement_pairs(self):
        """[(source ip, destination ip, bytes)] the job moves per iteration of all its sizes,
        NIC port to NIC port (a plane's bytes go between the two ranks' ports on that plane):
        what a scheduler tells traffic engineering about a job."""
        planes = len(self.ranks[0].ports)
        totals = {}
        for schedule in self.schedules:
            for t in schedule.transfers:
                if self.ranks[t.src].host == self.ranks[t.dst].host:
                    continue            # the host delivers it itself: it never meets the fabric
                for plane in range(planes):
                    key = (self.ranks[t.src].ports[plane].ip, self.ranks[t.dst].ports[plane].ip)
                    totals[key] = totals.get(key, 0) + t.nbytes / planes
        return [(src, dst, round(nbytes)) for (src, dst), nbytes in sorted(totals.items())]

    def _accept(self):
        conn, _ = self.server.accept()
        conn.setblocking(True)
        # The first line names the rank; read it synchronously (the agent sends it at once).
        conn.settimeout(5.0)
        buffer = b""
        while b"\n" not in buffer:
            chunk = conn.recv(4096)
            if not chunk:
                conn.close()
                return
            buffer += chunk
        line, rest = buffer.split(b"\n", 1)
        hello = json.loads(line)
        link = self.links[hello["hello"]]
        conn.settimeout(None)
        link.sock, link.lines = conn, rank_channel.Lines(rest)
        link.hello = hello
        self.selector.register(conn, selectors.EVENT_READ, link)

    def _gather(self, kind, ranks, timeout_s, doing, on_message=None, until=None):
        """Wait until every rank in `ranks` sent a `kind` message; returns {rank: message}. Raises
        _Abandoned once `until()` is true (looked at every 0.2 s at most)."""
        waiting = set(ranks)
        got = {}
        if kind == "hello":
            deadline = time.monotonic() + timeout_s
            while waiting:
                self._check_alive(doing)
                if time.monotonic() > deadline:
                    rank = min(waiting)
                    raise LabError(f"{self.describe(rank)}: agent did not connect within "
                                   f"{timeout_s:.0f} s")
                for key, _ in self.selector.select(0.1):
                    if key.data is None:
                        self._accept()
                waiting = {r for r in waiting if self.links[r].sock is None}
            return got
        def take(link):
            """Handle what `link` sent; False once it has hung up."""
            messages = link.messages()
            if messages is None:
                return False
            for message in messages:
                if "error" in message:
                    raise LabError(f"{message['error']} (while {doing})")
                if kind in message:
                    got[link.rank] = message
                    waiting.discard(link.rank)
                    if on_message:
                        on_message(link.rank, message)
            return True

        deadline = time.monotonic() + timeout_s
        while waiting:
            if until is not None and until():
                raise _Abandoned(doing)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._stuck(waiting, doing, timeout_s)
            for key, _ in self.selector.select(min(0.2, max(0.0, remaining))):
                link = key.data
                if link is None:
                    continue
                if not take(link):
                    if link.rank in got:          # it said what we waited for, then left
                        self.selector.unregister(link.sock)
                        continue
                    raise LabError(self._death(link.rank, doing))
            for rank, link in self.links.items():
                if rank in got or link.proc.poll() is None:
                    continue
                # It exited. An agent that sent its last word and exited can be seen exiting
                # before its message is read: what it said is still in its socket.
                if rank in waiting and link.sock is not None:
                    while take(link):
                        pass
                if rank not in got:
                    raise LabError(self._death(rank, doing))
        return got

    def _check_alive(self, doing, finished=()):
        for rank, link in self.links.items():
            if rank not in finished and link.proc.poll() is not None:
                raise LabError(self._death(rank, doing))

    def _death(self, rank, doing):
        proc = self.links[rank].proc
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return f"{self.describe(rank)}: agent closed its control connection while {doing}"
        line = agent_process.last_error_line(proc)
        code = proc.returncode
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return f"{self.describe(rank)}: agent died ({how}) while {doing}" + (f": {line}" if line else "")

    def _stuck(self, waiting, doing, timeout_s):
        """A bounded wait ran out: ask every rank what it waits for and what it still sends, then
        fail naming the chain from the first stuck rank to the one that holds it up."""
        if self._diagnosing:                      # the status question itself went unanswered
            raise LabError(f"{self.describe(min(waiting))} did not answer within {timeout_s:.1f} s while {doing}")
        statuses = {}
        self._diagnosing = True
        try:
            live = [r for r, link in self.links.items() if link.sock is not None and link.proc.poll() is None]
            for rank in live:
                self.links[rank].send({"status": True})
            # kept as they come: a rank that does not answer (frozen) leaves the others' answers
            self._gather("status", live, 2.0, "asking for status",
                         on_message=lambda rank, message: statuses.__setitem__(rank, message["state"]))
        except (LabError, OSError):
            pass
        finally:
            self._diagnosing = False
        detail = explain_stall(min(waiting), statuses, self.describe)
        raise LabError(f"{self.describe(min(waiting))} did not finish within {timeout_s:.1f} s while "
                       f"{doing}{': ' + detail if detail else ''}")

    def stop_agents(self):
        finals = {}
        if all(link.sock for link in self.links.values()):
            for link in self.links.values():
                link.send({"stop": True})
            finals = self._gather("final", list(self.links), patience.scaled(FINAL_TIMEOUT_S), "stopping")
        return finals

    def cleanup(self):
        if getattr(self, "announced", False):
            self.lab.retract_job(self.name)
            self.announced = False
        for link in self.links.values():
            if link.proc.poll() is None:
                link.proc.terminate()
                try:                      # a stopped agent (SIGSTOP) acts on SIGTERM once it runs again
                    os.kill(link.proc.pid, signal.SIGCONT)
                except OSError:
                    pass
        deadline = time.monotonic() + 3
        for link in self.links.values():
            try:
                link.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                link.proc.kill()
                link.proc.wait()
            if link.sock:
                link.sock.close()
        if self.softroce is not None:
            # After the agents: a device in use by a live process cannot go.
            self.softroce.detach()
            self.softroce = None
        for machine in self.forwarded:
            self.lab.cluster.unforward(machine, self.folder / "control.sock")
        self.forwarded = []
        if self.server:
            self.server.close()
        self.selector.close()

    # -- iterations -------------------------------------------------------------------------------

    def ideal_time(self, schedule):
        """Seconds the busiest rank needs to send its bytes at line rate (framing included)."""
        per_packet = roce.ROCE_OVERHEAD + roce.RETH_LEN + roce.ETH_HEADER_LEN
        most = max(max(schedule.sent_bytes(r), schedule.received_bytes(r))
                   for r in range(schedule.ranks))
        wire = most * (1 + per_packet / self.payload_bytes)
        return wire * 8 / (self.rate_mbps * 1e6 * len(self.ranks[0].ports))

    def run(self):
        spec = self.spec
        result = CollectiveRun(spec, self.ranks, self.payload_bytes, self.ack_timeout, self.rate_mbps,
                               backend=self.backend, plb=self.plb, reorder=spec.reorder_mode(),
                               reorder_timeout_s=self.reorder_timeout, pxn=self.pxn,
                               scale_up_rate_mbps=self.scale_up_rate, cc=self.cc_record())
        t0 = time.monotonic()
        total_steps = len(self.cases) * (spec.iterations + spec.warmup)
        done_steps = 0
        try:
            self.start_agents()
            result.pids = {rank: link.hello.get("pid") for rank, link in self.links.items()}
            everyone = list(self.links)
            last_end = None
            abandoned = False
            for index, schedule in self.cases:
                label = f"{schedule.collective} {human_size(schedule.size)}" + (" in place" * schedule.in_place)
                for link in self.links.values():
                    link.send({"prepare": index, "in_place": schedule.in_place})
                self._gather("ready", everyone, patience.scaled(READY_TIMEOUT_S), f"preparing {label}")
                ideal = self.ideal_time(schedule)
                timeout = ideal * spec.timeout_factor + 4 * self.ack_timeout + 2.0
                iterations = []
                before = None
                for it in range(spec.warmup + spec.iterations):
                    if self.stop is not None and self.stop.is_set() and it > spec.warmup:
                        break
                    if it == spec.warmup:
                        before = telemetry.lab_snapshot(self.lab)
                    marks = self.softroce.counters() if self.softroce is not None else None
                    start_at = time.time() + self.iteration_gap_s
                    gap = self.gaps[index]
                    if gap is not None and last_end is not None:
                        # a program's compute gap, from the previous step's end (the barrier)
                        start_at = max(start_at, last_end + gap)
                    for link in self.links.values():
                        link.send({"run": it, "start_at": start_at})
                    until = self.stop.is_set if self.abandon and self.stop is not None and iterations else None
                    try:
                        done = self._gather("done", everyone, timeout + START_MARGIN_S,
                                            f"running {label} iteration {it + 1}", until=until)
                    except _Abandoned:
                        abandoned = True
                        break
                    if marks is not None:
                        self.softroce.add_iteration_counters(done, marks)
                    if it >= spec.warmup:
                        iterations.append((start_at, done))
                    done_steps += 1
                    if self.progress:
                        self.progress(done_steps / total_steps, label)
                window = (before, telemetry.lab_snapshot(self.lab))
                first, last = iterations[0][0], max(m["end"] for m in iterations[-1][1].values())
                idle = None if last_end is None else round(first - last_end, 6)
                last_end = last
                old = result.traffic_window
                result.traffic_window = (min(first, old[0]), max(last, old[1])) if old else (first, last)
                row = self._summarise(schedule, ideal, iterations, window)
                if spec.program is not None:
                    row["gap_s"] = idle           # the idle time before it, as it ran
                result.sizes.append(row)
                if abandoned:
                    break
            result.abandoned = abandoned
            finals = self.stop_agents()
            if self.softroce is not None:
                self.softroce.add_final_counters(finals)
            result.finals = {rank: msg for rank, msg in finals.items()}
        finally:
            self.cleanup()
        result.elapsed_s = time.monotonic() - t0
        return result

    def _summarise(self, schedule, ideal, iterations, window):
        n = schedule.ranks
        times = [max(m["end"] for m in done.values()) - start for start, done in iterations]
        counters = {}
        for _start, done in iterations:
            for message in done.values():
                for key, value in message["counters"].items():
                    counters[key] = counters.get(key, 0) + value
        verify = None
        if self.spec.verify and schedule.defined:
            checks = [m["verify"] for _s, done in iterations for m in done.values()]
            bad = [c for c in checks if not c["ok"]]
            verify = {"ok": not bad, "checked_outputs": len(checks),
                      "mismatched_outputs": len(bad),
                      # nccl-tests' #wrong: wrong elements over all ranks (its one checked run;
                      # here the worst measured iteration)
                      "wrong_elements": max(sum(m["verify"].get("mismatches", 0) for m in done.values())
                                            for _s, done in iterations),
                      "max_abs_err": max((c.get("max_abs_err", 0.0) for c in checks), default=0.0)}
            if bad:
                verify["first_mismatch"] = bad[0].get("first_mismatch")
        mean = sum(times) / len(times)
        factor = schedules.bus_factor(schedule.collective, n)
        algbw = schedule.size / mean if mean > 0 else math.inf
        per_rank = [m["end"] - start for start, done in iterations for m in done.values()]
        # CPU seconds each rank's agent used per iteration: the cost of the emulated RNIC.
        agent_cpu = [sum(done[r]["cpu_s"] for _s, done in iterations) / len(iterations)
                     for r in range(n)]
        planes = len(self.ranks[0].ports)
        plane_bytes = [sum(m.get("plane_tx_bytes", [0] * planes)[p] for _s, done in iterations
                           for m in done.values()) for p in range(planes)]
        sent = sum(plane_bytes)
        links = telemetry.link_utilization(self.lab.fabric, *window)
        cpu = cpuload.between(window[0]["cpu"], window[1]["cpu"])
        return {
            "collective": schedule.collective, "algorithm": schedule.algorithm,
            "size": schedule.size, "in_place": schedule.in_place, "ranks": n, "iterations": len(times),
            "time_s": {"mean": mean, "p50": _percentile(times, 50), "p99": _percentile(times, 99),
                       "min": min(times), "max": max(times), "all": times},
            "rank_time_s_mean": sum(per_rank) / len(per_rank),
            "ideal_time_s": ideal,
            "algbw_mbps": algbw * 8 / 1e6,
            "busbw_mbps": algbw * factor * 8 / 1e6,
            "bus_factor": factor,
            # A rank's NIC has one port per plane: busbw compares with all of them together.
            "nic_rate_mbps": self.rate_mbps * len(self.ranks[0].ports),
            "busbw_fraction_of_nic": algbw * factor * 8 / 1e6 / (self.rate_mbps * len(self.ranks[0].ports)),
            "bytes_sent_per_rank": [schedule.sent_bytes(r) for r in range(n)],
            "counters": counters,
            "agent_cpu_s": agent_cpu,
            # What the ranks' NICs sent on each plane (data packets on the wire, retransmissions
            # included): the plane load balancer's split.
            "planes": {"tx_bytes": plane_bytes,
                       "share": [round(b / sent, 4) if sent else None for b in plane_bytes]},
            "rails": rail_traffic(schedule, self.ranks, self.lab.fabric),
            "flows": _flow_summary(iterations),
            "verify": verify,
            # The window spans the measured iterations and the launcher's pauses between them,
            # so utilizations are averages over it; the balance (max/mean) is what compares.
            "window_s": round(window[1]["time"] - window[0]["time"], 4),
            # On a cluster, ports of other machines are read over SSH: their readings' error.
            "window_error_ms": telemetry.window_error_ms(*window),
            "links": links,
            # threetier: what crossed between zones, from the schedule and the super-spines' counters
            "cross_zone": zones.record(self.lab.fabric, [r.host for r in self.ranks], schedule.transfers,
                                       len(times), window),
            "buffer_drops": telemetry.buffer_drops(self.lab.fabric, *window),
            "balance": {"up": telemetry.balance(links, "up"),
                        "down": telemetry.balance(links, "down")},
            "cpu": cpu,
            "valid": cpuload.valid(cpu),
        }


def pxn_enabled(fabric, spec, backend):
    """Whether the job relays cross-rail transfers through the sender's host (PXN). Asked for,
    it needs a rail-cabled fabric and the udp backend (whose ranks on one host reach each other
    through the host, as GPUs over NVLink; rxe devices reach each other through the fabric).
    Left to the lab: on exactly there."""
    rail = fabric.spec.cabling == "rail"
    if spec.pxn and not rail:
        raise LabError(f"collective: pxn relays across rails; fabric {excerpt(fabric.spec.name)} is "
                       f"cabled by rack (set cabling: rail in its spec)")
    if spec.pxn and backend != softroce.UDP:
        raise LabError("collective: pxn needs the udp backend (rxe devices reach each other through "
                       "the fabric); use --backend udp")
    return bool(spec.pxn) if spec.pxn is not None else rail and backend == softroce.UDP


def rail_traffic(schedule, ranks, fabric):
    """Where one iteration's bytes go, by the NICs (rails) and leaves of their two ends:
    scale_up_bytes between ranks of one host (they never reach the fabric: the lab's host
    delivers them itself, as NVLink would), of which pxn_bytes are PXN's first hops (pxn_hops of
    them); and between hosts: rail_local_bytes (same NIC index, one leaf: a single switch hop),
    cross_group_bytes (same NIC index, different leaves: up through the spines on the rail) and
    cross_rail_bytes (different NIC indexes: through the spines onto another rail, what PXN
    avoids). From the schedule: what the job asked the fabric to carry, per iteration."""
    out = dict.fromkeys(("scale_up_bytes", "pxn_bytes", "pxn_hops", "rail_local_bytes",
                         "cross_group_bytes", "cross_rail_bytes"), 0)
    for t in schedule.transfers:
        a, b = ranks[t.src], ranks[t.dst]
        if a.host == b.host:
            out["scale_up_bytes"] += t.nbytes
            if t.tag in schedule.relays:
                out["pxn_bytes"] += t.nbytes
                out["pxn_hops"] += 1
        elif a.nic != b.nic:
            out["cross_rail_bytes"] += t.nbytes
        elif a.ports[0].leaf == b.ports[0].leaf:
            out["rail_local_bytes"] += t.nbytes
        else:
            out["cross_group_bytes"] += t.nbytes
    return out


def _flow_summary(iterations):
    """Per-QP throughput over the measured iterations: bytes / time from first send to last ACK
    within each iteration, as a distribution across QPs (the ECMP-collision signature)."""
    rates = []
    for _start, done in iterations:
        for message in done.values():
            for flow in message.get("flows", []):
                if flow["seconds"] > 0:
                    rates.append(flow["bytes"] * 8 / flow["seconds"] / 1e6)
    if not rates:
        return None
    return {"qps_measured": len(rates), "min_mbps": round(min(rates), 4),
            "p50_mbps": round(_percentile(rates, 50), 4), "max_mbps": round(max(rates), 4),
            "mean_mbps": round(sum(rates) / len(rates), 4)}


def _percentile(values, q):
    ordered = sorted(values)
    if not ordered:
        return None
    k = (len(ordered) - 1) * q / 100
    low, high = math.floor(k), math.ceil(k)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


def run_collective(lab, spec, progress=None, name="collective", stop=None):
    """Run `spec` on a live lab; returns a CollectiveRun. LabError on any failure, nothing left
    running. `name` and `stop`: see Launcher."""
    before = queue_report(lab)
    return queue_report(lab, Launcher(lab, spec, progress, name=name, stop=stop).run(), before)


def queue_report(lab, run=None, before=None):
    """Without `run`: the queue model's counters now (None without a model). With it: attach the
    model's report since `before` to the run and return the run."""
    if run is None:
        return (lab.queues.counters(), time.monotonic_ns()) if getattr(lab, "queues", None) else None
    if before is not None:
        run.queues = lab.queues.report(*before)
    return run
