"""When a RoCEv2 sender's next packet goes: the one pacer of the lab's RNICs.

A `Pace` is one rate's schedule: the time its next packet is due, advanced by (frame bytes /
rate) per packet sent. A `Pacer` serves the senders of one port (the generator's flows, the
collective agent's QPs) under the port's own pace (its line rate, or none) and each sender's
(a flow's rate, DCQCN's rate for a QP, or none): whichever sender is due first goes, and
senders due together take turns, as an RNIC's QP arbiter does. Refused sends follow
`send_policy`.

Time is `time.monotonic()` seconds passed in by the caller, so the arithmetic is unit-tested
with a made-up clock. A sender is any object with the attributes and methods `Pacer.pump` names.
"""

from __future__ import annotations

import heapq
import itertools

from fabriclab.traffic import roce, send_policy

SEND_AHEAD_S = 0.0005
"""A packet due within this much is sent now, so one wake-up serves a batch of deadlines.

The pacer sleeps until its next packet is due and then sends everything due in the next
SEND_AHEAD_S, so this is both the batch a wake-up serves and the most a packet goes early.
Measured with the all-pairs generator on a veth (CPU seconds for 3 s of sending, median of 3):
4 flows x 20 Mbit/s cost 0.56 / 0.43 / 0.40 / 0.33 s at 0.1 / 0.3 / 0.5 / 1 ms, 8 x 60 Mbit/s
1.54 / 1.44 / 1.48 / 1.41 s. Longer saves more, but the batch lands in the host's queue at once:
0.5 ms at 800 Mbit/s (the most a lab host link carries here) is 50 KB, inside the default
64 KiB host buffer; 1 ms would overflow it."""
MAX_BURST_S = 0.005
"""A schedule that fell behind (a sleep overshoot, a CPU stall) catches up by at most this much.

Long enough to ride out the scheduler's wake-up delays on a busy two-core machine (measured with
four agents sending and receiving 60 Mbit/s each way: a 2 ms cap gave up 1-8% of the schedule,
5 ms under 0.5%), short enough that the catch-up burst (5 ms of the rate) stays small next to a
switch buffer. What is given up beyond it is counted in `Pace.behind_s`."""


class Pace:
    """One rate's schedule. `rate_mbps` None: unpaced (due whenever asked)."""

    __slots__ = ("behind_s", "due", "not_before", "seconds_per_byte")

    def __init__(self, rate_mbps=None, due=0.0):
        self.seconds_per_byte = 0.0
        self.due = due
        self.not_before = 0.0          # a backoff: unlike `due`, never sent ahead of
        self.behind_s = 0.0
        if rate_mbps is not None:
            self.set_rate(rate_mbps)

    def set_rate(self, rate_mbps):
        self.seconds_per_byte = 8.0 / (rate_mbps * 1e6)

    def charge(self, wire_bytes, now):
        """A packet of `wire_bytes` went at `now` in its turn: the next is due one frame time
        later. A schedule more than MAX_BURST_S behind gives up the excess (counted)."""
        floor = now - MAX_BURST_S
        if self.due < floor:
            self.behind_s += floor - self.due
            self.due = floor
        self.due += wire_bytes * self.seconds_per_byte

    def charge_out_of_turn(self, wire_bytes, now):
        """A packet that could not wait (an ACK, a CNP) went at `now`: it takes its frame time
        from the schedule but earns no catch-up credit."""
        self.due = max(self.due, now) + wire_bytes * self.seconds_per_byte

    def hold(self, until):
        """Nothing goes before `until` (a full queue backs off), and the time until then is not
        made good later."""
        self.not_before = until
        if until > self.due:
            self.due = until


class Pacer:
    """Serves one port's senders in deadline order under the port's pace.

    `port` has `pace` (a Pace: its line rate, or unpaced) and `transmit(packet, dst)`, which
    returns None when the packet went, or a `ports.Refusal`. A sender has:

        pace       a Pace, or None: limited by the port only
        held       the packet the port refused, offered again first (set by the pacer)
        queued     whether it is in this pacer (set by the pacer)
        dst        the destination address
        has_packet()        whether it has a packet to send
        next_packet(now)    build the next packet (its state moves on: a refused one is held)
        sent(wire, now)     the packet went: count it and charge its own pace
        refused(refusal, now)   the port refused it; a FATAL one is dropped from the pacer
                                (the sender records or raises its error)

    The heap's keys are max(sender's due time, time queued), with a running number to break
    ties, so senders due together go in the order they queued: round-robin, as an RNIC's
    arbiter serves its QPs.
    """

    def __init__(self, port):
        self.port = port
        self.heap = []
        self.order = itertools.count()

    def activate(self, sender, now):
        """Queue `sender` if it is not queued (it may have no packet: it is dropped when due)."""
        if not sender.queued:
            sender.queued = True
            due = sender.pace.due if sender.pace is not None else now
            heapq.heappush(self.heap, (max(due, now), next(self.order), sender))

    def pump(self, now):
        """Send every packet due by now + SEND_AHEAD_S; return when to call again: when the
        next packet is due (None: no sender has anything)."""
        port, heap = self.port, self.heap
        port_pace = port.pace
        ahead = now + SEND_AHEAD_S
        while heap:
            if port_pace.not_before > now:
                return port_pace.not_before
            if port_pace.due > ahead:
                return port_pace.due
            key, _, sender = heap[0]
            if key > ahead:
                return key
            packet = sender.held
            if packet is None:
                if not sender.has_packet():
                    heapq.heappop(heap)
                    sender.queued = False
                    continue
                packet = sender.next_packet(now)
            refusal = port.transmit(packet, sender.dst)
            if refusal is None:
                sender.held = None
                wire = len(packet) + roce.ETH_HEADER_LEN
                port_pace.charge(wire, now)
                sender.sent(wire, now)
                if sender.has_packet():
                    due = sender.pace.due if sender.pace is not None else now
                    heapq.heapreplace(heap, (max(due, now), next(self.order), sender))
                else:
                    heapq.heappop(heap)
                    sender.queued = False
                continue
            sender.held = packet
            sender.refused(refusal, now)
            if refusal.kind is send_policy.BUSY:
                port_pace.hold(now + send_policy.BUSY_BACKOFF_S)    # first in line again
            elif refusal.kind is send_policy.UNREACHABLE:
                retry = now + send_policy.UNREACHABLE_BACKOFF_S
                heapq.heapreplace(heap, (retry, next(self.order), sender))
            else:
                heapq.heappop(heap)
                sender.queued = False
        return None
