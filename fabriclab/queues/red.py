"""Native ECN marking: the kernel's RED qdisc in a switch port's lossless and lossy classes, where
the kernel has sch_red (full kernels; `doctor` says "ecn: red").

Where it sits (the rest of the tree is `shaping.queued_commands`):

    1:10 lossless ─ tbf 10: (pause gate) ─ red 11: (ecn nodrop) ─ its own bfifo
    1:30 lossy    ─ red 31: (ecn nodrop, in place of the fifo 30:) ─ its own bfifo

RED marks on its own queue, which is exactly the class's queue: the gate holds nothing of its own.
Its average is the instantaneous queue (EWMA weight 1, Wlog 0: a DCQCN switch marks on the
occupancy a packet finds, as the eBPF marker does), so the profiles mean what they mean there:
`red` marks between kmin and kmax with a probability rising to pmax and every ECN-capable packet at
or above kmax; `step` is RED with min = max = kmin (every packet from kmin); `off` puts both
thresholds out of reach. `nodrop` keeps RED from dropping a packet it cannot mark (not ECN-capable),
and the limit is the class's backstop, so RED itself never drops what the model admitted. Between
the thresholds RED spaces its marks out (Floyd's count since the last mark) rather than drawing each
packet independently, so it marks about twice as often as the eBPF marker for the same pmax.

The qdiscs are created and changed over rtnetlink, not with `tc`: tc computes the averaging weight
from a burst and cannot ask for Wlog 0, and a RED change through tc always passes a limit, which
makes the kernel swap RED's child fifo and drop the packets queued in it (a lossless queue must not
lose packets because someone changed an ECN threshold). A change here passes limit 0: the kernel
then keeps the child and its queue. The gate's own netlink changes leave RED alone (a tbf only
resizes a child that is a fifo).

Marks are counted twice over: the eBPF program sees a packet leave ECN-capable and arrive at the
far end of the cable marked (`marks`, the same definition as the eBPF marker's), and RED keeps its
own counter (`red_marked` here, read from the qdisc's statistics), which also counts packets that
arrived already marked and were "marked" again.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import struct
import threading

from fabriclab.errors import LabError
from fabriclab.queues.config import ETH_HEADER, ecn_thresholds
from fabriclab.queues.gate import NLMSG_ERROR, TCA_KIND, TCA_OPTIONS, nlattr, request, route_socket_in
from fabriclab.system.shaping import GATE_LIMIT_BYTES

RTM_NEWQDISC, RTM_GETQDISC = 36, 38
NLMSG_DONE = 3
NLM_F_REQUEST, NLM_F_ACK, NLM_F_REPLACE, NLM_F_CREATE, NLM_F_DUMP = 0x1, 0x4, 0x100, 0x400, 0x300
TCA_XSTATS = 4
TCA_RED_PARMS, TCA_RED_STAB, TCA_RED_MAX_P, TCA_RED_FLAGS = 1, 2, 3, 4
TC_RED_ECN, TC_RED_HARDDROP, TC_RED_ADAPTATIVE, TC_RED_NODROP = 1, 2, 4, 8
RED_FLAGS = TC_RED_ECN | TC_RED_NODROP
# Which flags this message sets (all of them: unset ones are cleared).
RED_FLAG_SELECTOR = TC_RED_ECN | TC_RED_HARDDROP | TC_RED_ADAPTATIVE | TC_RED_NODROP

EWMA_LOG = 0          # average weight 2^-0: the average is the queue a packet finds
SCELL_LOG = 0
# After any idle time the average starts again from zero (it already was: the queue was empty).
IDLE_STAB = bytes([31]) * 256
OFF_BYTES = 1 << 30   # thresholds no queue reaches: marking off
MAX_P_ONE = (1 << 32) - 1

# (handle, parent) of each class's RED qdisc: "11:" under the gate tbf's class 10:1, and "31:"
# grafted in place of the lossy class's fifo 30: (a qdisc cannot change kind under one handle).
PLACES = {"lossless": (0x00110000, 0x00100001), "lossy": (0x00310000, 0x00010030)}
CLASSES = tuple(PLACES)


@dataclasses.dataclass(frozen=True)
class RedParams:
    """One RED qdisc's settings (bytes; max_p in 1/2^32: the marking probability at qth_max)."""

    limit: int
    qth_min: int
    qth_max: int
    max_p: int
    plog: int

    @property
    def probability(self):
        return self.max_p / 2**32

    def describe(self):
        return {"min": self.qth_min, "max": self.qth_max, "probability": round(self.probability, 6),
                "limit": self.limit, "ewma_log": EWMA_LOG, "flags": "ecn nodrop"}


def class_limit(cls, buffer_bytes, mtu):
    """RED's own fifo limit: the backstop each class had (never reached while the model admits)."""
    if cls not in PLACES:
        raise ValueError(f"RED runs in the lossless and lossy classes, not {cls!r}")
    return GATE_LIMIT_BYTES if cls == "lossless" else buffer_bytes + 2 * (mtu + ETH_HEADER)


def red_params(profile, buffer_bytes, limit):
    """RedParams for one port's ECN profile (an EcnProfile) on a buffer of `buffer_bytes`."""
    if profile.mode in ("off", "ar"):       # ar: the eBPF program marks (it sees the group)
        qmin = qmax = OFF_BYTES
        max_p = MAX_P_ONE
    else:
        qmin, qmax = ecn_thresholds(buffer_bytes, profile)   # step: qmax == qmin
        max_p = MAX_P_ONE if qmax <= qmin else min(int(profile.pmax * 2**32), MAX_P_ONE)
    return RedParams(limit, qmin, qmax, max_p, plog(qmin, qmax, max_p / 2**32))


def plog(qmin, qmax, probability):
    """log2 of (qmax - qmin) / probability, rounded up, as tc computes it. The kernel uses it only
    when no max_P is given (this module always gives one); it is shown in `tc -d qdisc show`."""
    span = qmax - qmin
    if span <= 0:
        return 0
    value = probability / span
    for i in range(32):
        if value > 1.0:
            return i
        value *= 2
    return 31


def red_message(seq, ifindex, cls, params, create=False):
    """An RTM_NEWQDISC for the RED qdisc of class `cls` on ifindex: create (graft, with its limit) or
    change (limit 0: the kernel keeps RED's fifo and the packets in it)."""
    handle, parent = PLACES[cls]
    qopt = struct.pack("=IIIBBBB", params.limit if create else 0, params.qth_min, params.qth_max,
                       EWMA_LOG, params.plog, SCELL_LOG, 0)
    options = (nlattr(TCA_RED_PARMS, qopt) + nlattr(TCA_RED_STAB, IDLE_STAB)
               + nlattr(TCA_RED_MAX_P, struct.pack("=I", params.max_p))
               + nlattr(TCA_RED_FLAGS, struct.pack("=II", RED_FLAGS, RED_FLAG_SELECTOR)))
    body = (struct.pack("=BxHiIII", socket.AF_UNSPEC, 0, ifindex, handle, parent, 0)
            + nlattr(TCA_KIND, b"red\0") + nlattr(TCA_OPTIONS, options))
    flags = NLM_F_REQUEST | NLM_F_ACK | ((NLM_F_CREATE | NLM_F_REPLACE) if create else 0)
    return struct.pack("=IHHII", 16 + len(body), RTM_NEWQDISC, flags, seq, 0) + body


def dump_message(seq):
    """RTM_GETQDISC dump of every qdisc in the socket's namespace, statistics included."""
    body = struct.pack("=BxHiIII", socket.AF_UNSPEC, 0, 0, 0, 0, 0)
    return struct.pack("=IHHII", 16 + len(body), RTM_GETQDISC, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


def parse_red_stats(data, seq):
    """({(ifindex, handle): {marked, early, pdrop}} for the RED qdiscs in a dump reply, done?)."""
    stats, offset, done = {}, 0, False
    while offset + 16 <= len(data):
        length, kind, _flags, rseq, _pid = struct.unpack_from("=IHHII", data, offset)
        if length < 16:
            break
        if rseq == seq:
            if kind == NLMSG_DONE:
                done = True
            elif kind == NLMSG_ERROR:
                err = -struct.unpack_from("=i", data, offset + 16)[0]
                raise LabError(f"reading the RED qdiscs' statistics failed: {os.strerror(err)}")
            elif kind == RTM_NEWQDISC:
                _family, ifindex, handle, _parent, _info = struct.unpack_from("=BxxxiIII", data, offset + 16)
                attrs = _attrs(data, offset + 36, offset + length)
                if attrs.get(TCA_KIND, b"").rstrip(b"\0") == b"red" and len(attrs.get(TCA_XSTATS, b"")) >= 16:
                    early, pdrop, _other, marked = struct.unpack_from("=IIII", attrs[TCA_XSTATS])
                    stats[(ifindex, handle)] = {"marked": marked, "early": early, "pdrop": pdrop}
        offset += (length + 3) & ~3
    return stats, done


def _attrs(data, start, end):
    out = {}
    while start + 4 <= end:
        length, kind = struct.unpack_from("=HH", data, start)
        if length < 4:
            break
        out[kind & 0x3FFF] = data[start + 4:start + length]
        start += (length + 3) & ~3
    return out


class RedQdiscs:
    """Create, change and read the RED qdiscs of the switch ports (all in the lab's own network
    namespace). Thread-safe: the prompt, the experiment runner and readers may share it."""

    def __init__(self):
        self._sock = route_socket_in(None)
        self._sock.settimeout(2.0)
        self._seq = 0
        self._lock = threading.Lock()

    def set(self, ifindex, cls, params, create=False, what=""):
        with self._lock:
            self._seq += 1
            doing = f"{'adding' if create else 'changing'} the RED qdisc of {what or ifindex} ({cls})"
            err = request(self._sock, red_message(self._seq, ifindex, cls, params, create), self._seq, doing)
        if err:
            raise LabError(f"{doing} failed: {os.strerror(err)}")

    def stats(self):
        """{(ifindex, handle): {marked, early, pdrop}} of every RED qdisc in the namespace."""
        with self._lock:
            self._seq += 1
            seq = self._seq
            self._sock.send(dump_message(seq))
            stats = {}
            while True:
                try:
                    part, done = parse_red_stats(self._sock.recv(1 << 20), seq)
                except socket.timeout:
                    raise LabError("no answer from the kernel reading the RED qdiscs' statistics") from None
                stats.update(part)
                if done:
                    return stats

    def close(self):
        self._sock.close()
