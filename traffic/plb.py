"""The plane load balancer of a multiplane NIC (seed 002, sections 3.2, 4.3, 4.4.1, 6.5, 6.7).

A host NIC with one port per plane is one RoCE device: a QP's packets may take any plane. What
decides which one is the `--plb` mode:

    per-plane  per destination, one congestion-control context per plane (its RTT probes, its
               CNPs, its rate allowance); per packet, planes whose allowance is exhausted or that
               failed are excluded and the packet goes to the eligible plane whose local egress
               queue frees first (seed 002 Figure 4)
    global     one congestion-control context per destination across the planes (the paper's
               Global CC), the same per-packet choice
    static     QPs bound to planes and NIC messages dealt to them in turn: an even split,
               whatever the planes' state (the load-oblivious reference, and the lab's old way)
    software   NCCL-style balancing above the transport: messages dealt to the planes' QPs, and a
               plane whose messages stop completing for `sw_timeout_s` is given up (its messages
               go to the other planes) until it answers probes again (seed 002 Fig. 12 "SW LB")
    esr        entropy source routing: per destination a set of entropy values (UDP source
               ports) that each name a plane and, through the switches' hash, a path in it; one
               CC context over them, and a CNP both cuts the rate and moves the marked entropy
               elsewhere (seed 002 6.7: CC and load balancing entangled)

This module holds the decisions, with no sockets and no clock of its own (every call takes
`now`): `PlaneLiveness` (probes, timeouts, removal and return of one plane towards one
destination), `CcContext` (a rate allowance of one congestion-control kind, `traffic/cc.py`),
`EntropySet` (ESR's entropies) and
`Destination` (one peer's contexts, liveness and entropies). The agent (`agent.UdpRnic`) moves
the packets and applies the decisions.
"""

from __future__ import annotations

import random

from fabriclab.traffic import cc, roce, spxcc
from fabriclab.traffic.pacer import SEND_AHEAD_S, Pace
from fabriclab.loading import excerpt

MODES = ("per-plane", "global", "static", "software", "esr")
MULTIPATH = frozenset({"per-plane", "global", "esr"})
"""Modes where one QP sends on every plane, packet by packet, into a placing responder."""
PLANE_BOUND = frozenset({"static", "software"})
"""Modes where each QP belongs to one plane (software moves it when that plane fails)."""
DEFAULT_MODE = "static"

PROBE_TIMEOUTS = 3
"""Consecutive probe timeouts that remove a plane towards a destination. One late probe (a frame
of another class ahead of it at every hop, an agent descheduled for a few ms on the lab's two
cores) must not remove a healthy plane; three in a row at the RTT bound is the paper's "within
a few RTTs" (seed 002 4.4.1)."""
ESR_ENTROPIES_PER_PLANE = 4
"""ESR entropy values per plane and destination: more than the paths a plane of the lab's specs
offers between two leaves (2 spines, or 2 parallel links), so the hash can reach each of them."""
REORDER_WINDOW = 2048
"""Packets a placing responder accepts ahead of the expected PSN (its bitmap). The requester
starts no new message beyond it. A lossless 4-plane lab path holds at most its buffers: with
64 KiB per hop and four hops per plane, 1 MiB, which is 256 packets of 4 KiB or 1024 of 1 KiB."""


def check_mode(mode):
    """The mode, or ValueError with a one-line message."""
    if mode not in MODES:
        raise ValueError(f"plb must be one of {', '.join(MODES)}, got {excerpt(mode)}")
    return mode


class PlaneLiveness:
    """Whether one plane reaches one destination, from probes (seed 002 4.4.1).

    A probe goes out when nothing was heard on the plane for `interval_s` (an ACK on the plane
    counts: it proves the round trip as well as an echo does, so a busy plane needs no probes);
    one is outstanding at a time. A probe not echoed within `interval_s`, with nothing else
    heard on the plane since it left, is a timeout; `timeouts` in a row remove the plane. A
    removed plane keeps being probed and returns with the first echo."""

    __slots__ = ("interval_s", "timeouts", "removed", "consecutive", "outstanding", "sent_at",
                 "last_heard", "next_seq", "probes_sent", "probe_timeouts", "echoes",
                 "rtt_min", "rtt_max", "rtt_sum")

    def __init__(self, interval_s, timeouts=PROBE_TIMEOUTS):
        if not interval_s > 0:
            raise ValueError(f"probe interval must be > 0 s, got {excerpt(interval_s)}")
        if isinstance(timeouts, bool) or not isinstance(timeouts, int) or timeouts < 1:
            raise ValueError(f"probe timeouts must be a whole number >= 1, got {excerpt(timeouts)}")
        self.interval_s = interval_s
        self.timeouts = timeouts
        self.removed = False
        self.consecutive = 0
        self.outstanding = None          # the sequence number of the probe in flight
        self.sent_at = 0.0
        self.last_heard = None           # None: nothing yet (the first tick probes at once)
        self.next_seq = 1
        self.probes_sent = self.probe_timeouts = self.echoes = 0
        self.rtt_min = self.rtt_max = None
        self.rtt_sum = 0.0

    def expire(self, now):
        """Count the outstanding probe as timed out if its time is up; True when this removed
        the plane."""
        if self.outstanding is None or now < self.sent_at + self.interval_s:
            return False
        self.outstanding = None
        if self.last_heard is not None and self.last_heard > self.sent_at:
            self.consecutive = 0             # heard on the plane since: the probe was just lost
            return False
        self.probe_timeouts += 1
        self.consecutive += 1
        if self.consecutive >= self.timeouts and not self.removed:
            self.removed = True
            return True
        return False

    def wants_probe(self, now):
        """Whether a probe should go now (after `expire`)."""
        if self.outstanding is not None:
            return False
        return self.removed or self.last_heard is None or now - self.last_heard >= self.interval_s

    def probe_sent(self, now):
        """A probe left: its sequence number (echoed back by the destination)."""
        seq = self.next_seq
        self.next_seq = seq % 0xFFFFFFFF + 1
        self.outstanding = seq
        self.sent_at = now
        self.probes_sent += 1
        return seq

    def heard(self, now):
        """Something of this destination's arrived on the plane (an ACK): the plane works, but
        a removed plane waits for an echo to return."""
        self.last_heard = now
        if not self.removed:
            self.consecutive = 0

    def on_echo(self, seq, now):
        """A probe's echo came back: True when it answers the outstanding probe (a removed plane
        is then back; the caller compares `removed` before and after)."""
        if seq != self.outstanding:
            return False                     # a late echo of a probe already counted as lost
        rtt = now - self.sent_at
        self.outstanding = None
        self.echoes += 1
        self.rtt_sum += rtt
        self.rtt_min = rtt if self.rtt_min is None else min(self.rtt_min, rtt)
        self.rtt_max = rtt if self.rtt_max is None else max(self.rtt_max, rtt)
        self.last_heard = now
        self.consecutive = 0
        self.removed = False
        return True

    def summary(self):
        ms = (lambda v: None if v is None else round(v * 1e3, 3))
        return {"probes_sent": self.probes_sent, "probe_timeouts": self.probe_timeouts,
                "echoes": self.echoes, "removed": self.removed,
                "rtt_ms": {"min": ms(self.rtt_min), "max": ms(self.rtt_max),
                           "mean": ms(self.rtt_sum / self.echoes) if self.echoes else None}}


class CcContext:
    """One congestion-control context: a reaction point's rate (DCQCN's or SPX's, by the kind
    of `params`: `traffic/cc.py`) as an allowance (a `Pace` at that rate). A plane whose context
    is not due is excluded from the choice. A kind that takes RTT samples (SPX) gets an
    `spxcc.RttProbe` (`probe`) whose probes time out after `rtt_timeout_s`."""

    __slots__ = ("params", "rp", "pace", "min_rate", "cnps", "resets", "probe", "rtt_timeout_s")

    def __init__(self, params, rtt_timeout_s=0.05, probe_every_bytes=0):
        self.params = params
        self.rp = cc.reaction_point(params)
        self.pace = Pace(params.line_rate_mbps)
        self.min_rate = params.line_rate_mbps
        self.cnps = 0
        self.resets = 0
        self.rtt_timeout_s = rtt_timeout_s
        self.probe = (spxcc.RttProbe(rtt_timeout_s, probe_every_bytes)
                      if cc.of_params(params).uses_rtt else None)

    def reset(self):
        """Forget what was learnt (the NIC released the context of an idle destination): line
        rate again. The Pace object stays, because the lanes hold it."""
        self.rp = cc.reaction_point(self.params)
        self.pace.set_rate(self.params.line_rate_mbps)
        self.resets += 1

    def allows(self, now):
        """The allowance is not exhausted: a packet may go now."""
        return self.pace.due <= now + SEND_AHEAD_S

    def sent(self, wire, now):
        if self.probe is not None:
            self.probe.on_data(wire)
        rp = self.rp
        if rp.throttled:                 # unthrottled DCQCN has nothing to count or time
            rp.on_sent(wire, now)
            self.pace.set_rate(rp.rate_mbps)
        self.pace.charge(wire, now)

    def advance(self, now):
        if self.rp.throttled:
            self.rp.advance(now)
            self.pace.set_rate(self.rp.rate_mbps)

    def on_cnp(self, now):
        self.cnps += 1
        self.rp.on_cnp(now)
        self.pace.set_rate(self.rp.rate_mbps)
        self.min_rate = min(self.min_rate, self.rp.rate_mbps)

    def on_echo(self, seq, now):
        """An RTT probe's echo: the sample moves the rate (SPX). True if it was a sample."""
        rtt = self.probe.on_echo(seq, now) if self.probe is not None else None
        if rtt is None:
            return False
        self.rp.on_rtt(rtt, now)
        self.pace.set_rate(self.rp.rate_mbps)
        self.min_rate = min(self.min_rate, self.rp.rate_mbps)
        return True

    def summary(self):
        out = {"rate_mbps": round(self.rp.rate_mbps, 6), "min_rate_mbps": round(self.min_rate, 6),
               "cnps": self.cnps, "resets": self.resets,
               **{k: v for k, v in self.rp.counters.items() if k != "cnps"}}
        if self.probe is not None:
            out["rtt_probes"] = self.probe.summary()
        return out


class EntropySet:
    """ESR: a destination's entropy values, each a (plane, UDP source port). Packets take them
    in turn; a marked one is replaced by a fresh random value (on any usable plane)."""

    def __init__(self, planes, per_plane, rng):
        self.rng = rng
        self.planes = planes
        self.entries = [[plane, self._sport()] for _ in range(per_plane) for plane in range(planes)]
        self.turn = 0
        self.repaths = 0

    def _sport(self):
        return roce.ROCE_UDP_SPORT_MIN | self.rng.getrandbits(14)

    def take(self, usable):
        """The next entropy on a usable plane, as (plane, sport); None when no plane is usable.
        `usable` is a sequence of booleans by plane."""
        entries = self.entries
        for _ in range(len(entries)):
            entry = entries[self.turn]
            self.turn = (self.turn + 1) % len(entries)
            if usable[entry[0]]:
                return entry[0], entry[1]
        return None

    def repath(self, sport, usable):
        """The entropy `sport` was marked (or its plane failed): draw it again. True if found."""
        choices = [p for p in range(self.planes) if usable[p]] or list(range(self.planes))
        for entry in self.entries:
            if entry[1] == sport:
                entry[0], entry[1] = self.rng.choice(choices), self._sport()
                self.repaths += 1
                return True
        return False

    def per_plane(self):
        counts = [0] * self.planes
        for plane, _sport in self.entries:
            counts[plane] += 1
        return counts


class Destination:
    """What the NIC keeps per destination (a peer rank): CC contexts (one per plane for
    per-plane, one in all for global and ESR, none for static and software, which use the QPs'
    own DCQCN), one `PlaneLiveness` per plane, and ESR's entropies."""

    def __init__(self, peer, mode, planes, plane_params=None, nic_params=None,
                 probe_interval_s=0.05, probe_timeouts=PROBE_TIMEOUTS, seed=0, probe_every_bytes=0):
        self.peer = peer
        self.mode = check_mode(mode)
        self.planes = planes
        if mode == "per-plane":
            self.contexts = [CcContext(plane_params, probe_interval_s, probe_every_bytes)
                             for _ in range(planes)]
        elif mode in ("global", "esr"):
            # one context, seen from each plane
            self.contexts = [CcContext(nic_params, probe_interval_s, probe_every_bytes)] * planes
        else:
            self.contexts = None
        self.liveness = [PlaneLiveness(probe_interval_s, probe_timeouts) for _ in range(planes)]
        self.entropy = (EntropySet(planes, ESR_ENTROPIES_PER_PLANE, random.Random(seed))
                        if mode == "esr" else None)
        self.sw_failed = [False] * planes          # software: planes it gave up on
        self.usable = [True] * planes              # the NIC's port is up and `reachable`
        self.qps = []
        self.last_active = None                    # the last ACK progress towards this peer

    def idle_reset(self, now, idle_s):
        """A new burst towards this peer after `idle_s` of silence starts with fresh CC contexts
        (seed 002 6.7: between bursts the PLB's state resets and is learnt again). True if so."""
        if (not self.contexts or not idle_s or self.last_active is None
                or now - self.last_active < idle_s or not all(q.requester.idle for q in self.qps)):
            return False
        for ctx in self.unique_contexts():
            ctx.reset()
        self.last_active = None
        return True

    def reachable(self, plane):
        """Not removed by probes (software: not given up on)."""
        if self.mode == "software":
            return not self.sw_failed[plane]
        return not self.liveness[plane].removed

    def unique_contexts(self):
        seen = []
        for ctx in self.contexts or ():
            if all(ctx is not other for other in seen):
                seen.append(ctx)
        return seen

    def summary(self):
        planes = []
        for plane in range(self.planes):
            row = {"plane": plane + 1, "liveness": self.liveness[plane].summary()}
            if self.mode == "per-plane":
                row["cc"] = self.contexts[plane].summary()
            if self.mode == "software":
                row["given_up"] = self.sw_failed[plane]
            planes.append(row)
        out = {"peer": self.peer, "planes": planes}
        if self.mode in ("global", "esr"):
            out["cc"] = self.contexts[0].summary()
        if self.entropy is not None:
            out["entropies_per_plane"] = self.entropy.per_plane()
            out["repaths"] = self.entropy.repaths
        return out


class Timeline:
    """A rank's cumulative counters over time: payload acknowledged (its sends, as ib_write_bw
    sees them: seed 002 Fig. 12), payload received (placed in its memory, duplicates not
    counted: the goodput it was sent) and data sent per plane, at the lab's time scale.

    Sampled on the agent's timer, not per packet (a per-packet bin cost 0.3 us of the agent's
    ~6 us per packet). An idle stretch keeps only its first and last samples, so differences
    between consecutive samples are the exact bytes of each interval."""

    MAX_SAMPLES = 50000

    def __init__(self, planes):
        self.planes = planes
        self.times, self.acked, self.received, self.sent = [], [], [], []
        self.pending = None               # the last sample of an idle stretch, not yet kept
        self.truncated = False

    def sample(self, now, acked, received, sent):
        """The counters at `now` (`sent`: a tuple by plane)."""
        if (self.times and self.acked[-1] == acked and self.received[-1] == received
                and self.sent[-1] == sent):
            self.pending = now
            return
        if len(self.times) >= self.MAX_SAMPLES:
            self.truncated = True
            return
        if self.pending is not None:
            self._keep(self.pending, self.acked[-1], self.received[-1], self.sent[-1])
            self.pending = None
        self._keep(now, acked, received, sent)

    def _keep(self, now, acked, received, sent):
        self.times.append(now)
        self.acked.append(acked)
        self.received.append(received)
        self.sent.append(sent)

    def record(self, clock_offset):
        if not self.times:
            return None
        t0 = self.times[0]
        return {"start": round(t0 + clock_offset, 6),
                "t_s": [round(t - t0, 6) for t in self.times],
                "acked_bytes": list(self.acked), "received_bytes": list(self.received),
                "sent_bytes": [[s[p] for s in self.sent] for p in range(self.planes)],
                "truncated": self.truncated}


def rate_series(timeline, bin_s, key="acked_bytes", plane=None, phase=0.0):
    """(bin start times after the timeline's start, Mbit/s) from a timeline record's cumulative
    counters, linearly interpolated at the bin edges. Edges fall `phase` seconds (taken modulo
    `bin_s`) after multiples of `bin_s` from the start, so a caller can put one on an event."""
    times = timeline["t_s"]
    values = timeline[key] if plane is None else timeline[key][plane]
    if len(times) < 2:
        return [], []
    edges, t = [], round(phase % bin_s, 9)
    while t <= times[-1] + 1e-12:
        edges.append(t)
        t = round(t + bin_s, 9)
    at = [_interp(x, times, values) for x in edges]
    return edges[:-1], [(b - a) * 8 / bin_s / 1e6 for a, b in zip(at, at[1:])]


def _interp(x, xs, ys):
    import bisect

    i = bisect.bisect_right(xs, x)
    if i == 0:
        return ys[0]
    if i >= len(xs):
        return ys[-1]
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1


FAILOVER_FRACTION = 0.75
"""Seed 002 6.5: the time for a flow to reach 75% of its original rate after one of four planes
failed (all that three planes can carry)."""
FAILOVER_TOLERANCE = 0.05
"""Three planes carry exactly 75% of four: measured goodput sits on the line, so "reached"
allows 5% below it (the lab's goodput varies by about that from bin to bin)."""
FAILOVER_BIN_S = 0.02
"""failover_time's bins, and so its resolution: about two of the agent's timeline samples."""
FAILOVER_HOLD_S = 0.2
"""Rates are means over this long (ten 20 ms bins), so one slow bin is not a failure."""
FAILOVER_STALL = 0.75
"""Reached means not lost again: a sender whose window has not yet filled with stuck messages
keeps its rate for a while after a failure and then stalls; that early rate is not a recovery.
A later mean below 75% of the target is such a stall; a dip of a few percent is not. Measured
(2026-12-02, plane-failover quick, 6 unloaded draws and 8 with a busy loop on one of 2 cores): the
per-plane balancer's 0.2 s means stayed at or above 0.94 of the target through the outage;
software's fell to 0-0.38 of it before its timeout at 10 Mbit/s and to 0.63-0.66 at the derated
5 Mbit/s (a half-full window drains slower), and kept at least 0.87 after it. At 0.5 the derated
runs' partial stall was not one, and software read "back" 0.1 s after the fault."""


def failover_time(timeline, fault_at, until=None, key="received_bytes", bin_s=FAILOVER_BIN_S,
                  fraction=FAILOVER_FRACTION, hold_s=FAILOVER_HOLD_S,
                  tolerance=FAILOVER_TOLERANCE, lookback_s=0.5):
    """Seconds from `fault_at` (unix time) until a timeline's rate reached `fraction` of what it
    was over the `lookback_s` before the fault (from the stream's first bytes) and did not stall
    again before `until` (unix time: the repair or the end). Rates are means over `hold_s`.
    Returns {"baseline_mbps", "target_mbps", "recovery_s", "after_mbps", "resolution_s"};
    recovery_s is None when it never got there.

    Bins start at the fault, so recovery_s is a whole number of bins: 0 says the mean from the
    fault on never fell below the target, i.e. back within `resolution_s` (one bin). Bins that
    started wherever the timeline did would report their phase against the fault instead."""
    start = timeline["start"]
    times, mbps = rate_series(timeline, bin_s, key, phase=fault_at - start)
    rel = [round(start + t - fault_at, 6) for t in times]     # seconds from the fault, edges on it
    # From the stream's first bytes on: agents that started late on a busy machine (0.7 s after
    # the origin, 2026-12-02) left empty bins before it that said nothing about its rate.
    first = next((i for i, m in enumerate(mbps) if m > 0), len(mbps))
    before = [m for i, (r, m) in enumerate(zip(rel, mbps))
              if i > first and -lookback_s <= r and r + bin_s <= 1e-6]
    if not before:
        return {"baseline_mbps": None, "target_mbps": None, "recovery_s": None, "after_mbps": None,
                "resolution_s": bin_s}
    end = rel[-1] + bin_s if until is None else until - fault_at
    baseline = sum(before) / len(before)
    target = fraction * baseline * (1 - tolerance)
    after = [(r, m) for r, m in zip(rel, mbps) if r >= -1e-6 and r + bin_s <= end + 1e-6]
    hold = max(1, round(hold_s / bin_s))
    recovered = None
    for i in range(len(after) - hold + 1):
        mean = sum(m for _t, m in after[i:i + hold]) / hold
        if mean >= target and recovered is None:
            recovered = i
        elif mean < FAILOVER_STALL * target:
            recovered = None             # it stalled: not recovered yet
    if recovered is None:
        return {"baseline_mbps": round(baseline, 3), "target_mbps": round(target, 3),
                "recovery_s": None, "after_mbps": None, "resolution_s": bin_s}
    rest = [m for _t, m in after[recovered:]]
    return {"baseline_mbps": round(baseline, 3), "target_mbps": round(target, 3),
            "recovery_s": round(max(0.0, after[recovered][0]), 4),
            "after_mbps": round(sum(rest) / len(rest), 3), "resolution_s": bin_s}
