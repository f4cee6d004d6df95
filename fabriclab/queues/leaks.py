"""Repairing the queue model's leaked ingress accounts.

The eBPF program counts a packet into its switch (the `held` bytes of the ingress port it came
by) when the port receives it, and out when it leaves by another port. A packet Open vSwitch
itself drops (no flow for it, a port that went down, a full receive socket when ovs-vswitchd is
starved of CPU, a flow the program's LRU flow table forgot) never leaves, so its bytes stay held
for good; past XOFF, the port would pause its upstream until the watchdog gave up on it.

What is certain once nothing has entered a port for QUIET_NS: every byte that came in by it has
left the switch or waits in one of the switch's egress queues of the same class (the trip through
OVS takes micro- to milliseconds). Its true held lies between 0 and the switch's egress occupancy
of that class; a count above that range leaked, a count below it was misattributed (a flow moved
to another ingress port while its packets were queued, so they were released against the new one).
The repair moves such a count to the nearest end of the range through the data path's `bias` map,
which only user space writes: it never guesses inside the range, so an account that leaked while
the switch's queues are busy is repaired once they drain. A quiet port still pausing its upstream
at or below XON, leak or not, has its upstream opened once (nothing left would send the XON).

A port whose cable is down is no place to wait: the kernel emptied its queue when the cable went
down and drops what is sent to it since, though the program still counts those bytes into its
occupancy. Its egress rows leave the range while the cable is down (`set_dead`), so the bytes
its switch took in for it, gone with the cable, are repaired as leaks; otherwise the phantom
occupancy would hold their ingress accounts above XON, pausing the upstream until the cable
returned (a stuck pause: with the watchdog at a switch's 200 ms real, for hours of lab time).
"""

from __future__ import annotations

import dataclasses

QUIET_NS = 100_000_000          # nothing entered the port for 100 ms: its packets are through OVS


@dataclasses.dataclass(frozen=True)
class Account:
    """One switch ingress port and class: its map row, the egress rows of the same switch and
    class (where its bytes may legitimately wait), and for a PFC class the XON threshold and
    the port whose gate it pauses."""

    row: int
    port: str
    cls: str
    egress_rows: tuple
    xon: int | None = None          # None: this class does not pause
    upstream: int | None = None     # port index of the peer whose gate closes


@dataclasses.dataclass(frozen=True)
class Repair:
    row: int
    port: str
    cls: str
    held_before: int         # the account as the data path saw it (bias applied)
    held_after: int
    bias: int                # the row's new bias (bytes taken off its raw count in all)
    resume: int | None       # upstream port index to open: it was left paused below XON
    t_ns: int

    @property
    def bytes(self):
        return self.held_before - self.held_after

    def describe(self):
        return {"port": self.port, "class": self.cls, "bytes": self.bytes, "held_before": self.held_before,
                "held_after": self.held_after, "resumed": self.resume is not None, "t_ns": self.t_ns}


class LeakRepair:
    def __init__(self, accounts, quiet_ns=QUIET_NS):
        self.accounts = list(accounts)
        self.quiet_ns = quiet_ns
        self.bias = {a.row: 0 for a in self.accounts}
        self.dead = frozenset()  # egress rows of ports whose cable is down (replaced whole: the
                                 # lab's thread writes it, the PFC agent's reads it)
        self._rx = {}            # row -> (rx_pkts last seen, when it last changed)
        self._resumed = {}       # row -> rx_pkts when a stuck pause was last opened

    def set_dead(self, rows, dead):
        """Rows of ports whose cable went down (`dead`) or came back up."""
        self.dead = self.dead | frozenset(rows) if dead else self.dead - frozenset(rows)

    def check(self, now_ns, stats):
        """Repairs due now. `stats` is indexable by row and has held, occ, rx_pkts and paused
        (the data path's raw counters); the caller writes each repair's bias to the map."""
        repairs = []
        for a in self.accounts:
            st = stats[a.row]
            seen = self._rx.get(a.row)
            if seen is None or seen[0] != st.rx_pkts:
                self._rx[a.row] = (st.rx_pkts, now_ns)
                continue
            if now_ns - seen[1] < self.quiet_ns:
                continue
            held = st.held - self.bias[a.row]
            dead = self.dead
            ceiling = max(0, sum(stats[r].occ for r in a.egress_rows if r not in dead))
            target = min(max(held, 0), ceiling)
            if target == held:
                # No leak, but paused at or below XON with nothing arriving (an XON lost to a
                # race between CPUs): open the upstream once; its next packet clears the flag.
                if (a.xon is not None and st.paused and held <= a.xon
                        and self._resumed.get(a.row) != st.rx_pkts):
                    self._resumed[a.row] = st.rx_pkts
                    repairs.append(Repair(a.row, a.port, a.cls, held, held, self.bias[a.row], a.upstream,
                                          now_ns))
                continue
            self.bias[a.row] += held - target
            resume = None
            if a.xon is not None and st.paused and target <= a.xon:
                resume = a.upstream
            repairs.append(Repair(a.row, a.port, a.cls, held, target, self.bias[a.row], resume, now_ns))
        return repairs


def accounts_of(ports, nclass, classes, pfc_xon):
    """An Account per switch port and class. `ports` are the model's PortInfo rows; `pfc_xon(port,
    cls)` is the XON threshold where the class pauses, else None."""
    by_node = {}
    for p in ports:
        by_node.setdefault(p.node, []).append(p)
    out = []
    for p in ports:
        if p.role == "host":
            continue           # hosts are sinks: they hold nothing
        for cls in range(nclass):
            xon = pfc_xon(p, cls)
            out.append(Account(p.idx * nclass + cls, p.name, classes[cls],
                               tuple(q.idx * nclass + cls for q in by_node[p.node]),
                               xon, p.peer if xon is not None else None))
    return out
