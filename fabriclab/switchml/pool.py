"""One job's pool of aggregation slots: algorithm 3 of seed 003 (switch logic with packet loss
recovery), plus what a leaf needs to sit under a parent aggregator (section 7).

State, per slot index i and pool version v (the slot's two copies):

- values[v, i]: the running sum of the k integers (the shadow copy once v's use is complete)
- count[v, i]: contributions so far, modulo n, so 0 means "complete" (or never used)
- seen[v, i, w]: worker w's update for this use has been added

An update from w for (v, i) that was not seen is added; it clears seen[1-v, i, w], because w
sends to v only after it has the result of 1-v's use. The n-th contribution completes the use and
the result goes to every worker. An update that was seen is a retransmission: if the use is
complete the worker lost the result and gets it again, unicast, from values[v, i]; otherwise it is
a duplicate and dropped. values[v, i] is overwritten only by v's next use, whose first update a
worker sends after receiving the result of the 1-v use in between; that use completed only when
every worker had sent to 1-v, which each did only after receiving v's result. So no worker needs
the shadow copy any more when it goes (paper, section 4.5). Like the paper, this relies on a
packet not being overtaken by one sent two uses of its slot later, which holds on paths that keep
a flow's order (sim.py keeps to it too).

Arithmetic wraps modulo 2^32, like the switch's 32-bit adders (numpy int32 addition). The paper
prevents overflow rather than handling it: quantize.py chooses the scale so that n workers cannot
overflow. Wrapping is then exact whenever the true sum fits in int32, whatever order or grouping
the contributions are added in, so partial sums may pass the limit and the result is still right,
and a two-level sum equals a one-level sum bit for bit. Saturation would lose both properties.

Algorithm 3 as written decides "first contribution" by count = 1 after the increment, which with
n = 1 is never true (the count wraps straight to 0) and would add onto the last result; here the
first contribution is the one that finds count = 0, which is the same for n >= 2.

Hierarchy (a pool with an `upstream` index, at a leaf aggregator):

- on completing a use, the leaf does not multicast; it forwards the rack's partial sum upward as
  one update (its worker id there is `upstream`), with the rack's maximum look-ahead exponent.
- the parent's result for (v, i) is accepted once, when the leaf's own use is complete and no
  result has come yet (and the offsets agree); the leaf overwrites values[v, i] with it, marks it
  final and multicasts it to its workers. A second copy is dropped.
- a worker's retransmission for a complete use gets the final result by unicast if the leaf has it;
  if not, the leaf's partial, its result, or another rack's partial was lost above, and the leaf
  forwards its partial upward again (flagged as a retransmission). The parent runs algorithm 3 on
  it: a partial it has not seen is added; a seen one for a complete use is answered with the
  parent's shadow copy, by unicast to this leaf; a seen one for an incomplete use is dropped, and
  the parent completes when the missing rack's own workers retransmit. So any worker's timeout
  reaches, level by level, the aggregator where the packet was lost (section 7).
- The shadow argument holds at both levels: a leaf reuses (v, i) only when all its workers send to
  v again, and the parent only when all leaves do; either happens only after every worker of the
  job has received v's result.
"""

from __future__ import annotations

import collections
from typing import NamedTuple

import numpy as np

from fabriclab.switchml.job import JobConfig
from fabriclab.switchml.packet import NO_EXPONENT, Packet


class Destination(NamedTuple):
    """Where an aggregator's output goes, in its own terms; the adapter (the UDP server, the
    simulator) maps it to addresses. `worker` is a worker id, only for UNICAST."""

    kind: str
    worker: int = -1


MULTICAST = "multicast"
UNICAST = "unicast"
UPSTREAM = "upstream"
ALL_WORKERS = Destination(MULTICAST)
PARENT = Destination(UPSTREAM)


def to_worker(worker: int) -> Destination:
    return Destination(UNICAST, worker)


Action = tuple[Destination, Packet]


class SlotPool:
    """Algorithm 3 over one job's s slots of k integers. `level` is this aggregator's tier (1 at
    a ToR, 2 at a spine): it accepts updates from level - 1 and a parent's results from
    level + 1, and stamps its own packets with it. `upstream` makes it a leaf."""

    def __init__(self, job: JobConfig, *, level: int = 1, upstream: int | None = None):
        self.job = job
        self.level = level
        self.upstream = upstream
        n, s, k = job.workers, job.slots, job.elements
        self.values = np.zeros((2, s, k), dtype=np.int32)
        self.lengths = np.zeros((2, s), dtype=np.int64)
        self.count = np.zeros((2, s), dtype=np.int64)
        self.seen = np.zeros((2, s, n), dtype=bool)
        self.next_exponent = np.full((2, s), NO_EXPONENT, dtype=np.int64)
        self.offset = np.zeros((2, s), dtype=np.int64)
        self.final = np.zeros((2, s), dtype=bool)      # a leaf holds the parent's result
        self.counters: collections.Counter[str] = collections.Counter()

    def handle(self, p: Packet) -> list[Action]:
        """The packets to send in answer to p (an update from below or a result from above)."""
        problem = self._reject_reason(p)
        if problem:
            self.counters[problem] += 1
            return []
        return self._result_from_parent(p) if p.result else self._update(p)

    def _reject_reason(self, p: Packet) -> str:
        if p.slot >= self.job.slots or p.elements > self.job.elements:
            return "malformed"
        if p.result:
            return "" if self.upstream is not None and p.level == self.level + 1 else "wrong_level"
        if p.level != self.level - 1:
            return "wrong_level"
        return "" if p.worker < self.job.workers else "malformed"

    # -- algorithm 3 ------------------------------------------------------------------------------

    def _update(self, p: Packet) -> list[Action]:
        v, i, w = p.version, p.slot, p.worker
        if self.seen[v, i, w]:
            if self.count[v, i] == 0:
                return self._retransmission_of_complete(p)
            self.counters["duplicates"] += 1
            return []
        first = self.count[v, i] == 0
        if not first and p.elements != self.lengths[v, i]:
            self.counters["malformed"] += 1      # workers disagree on the chunk: leave state alone
            return []
        self.seen[v, i, w] = True
        self.seen[1 - v, i, w] = False
        self.count[v, i] = (self.count[v, i] + 1) % self.job.workers
        if first:
            self.values[v, i, :p.elements] = p.vector
            self.lengths[v, i] = p.elements
            self.next_exponent[v, i] = p.next_exponent
            self.offset[v, i] = p.offset
            self.final[v, i] = False
        else:
            row = self.values[v, i, :p.elements]
            np.add(row, p.vector, out=row)       # wraps modulo 2^32, as the switch does
            self.next_exponent[v, i] = max(self.next_exponent[v, i], p.next_exponent)
        self.counters["aggregated"] += 1
        if self.count[v, i] != 0:
            return []
        self.counters["completed"] += 1
        if self.upstream is not None:
            self.counters["forwarded"] += 1
            return [(PARENT, self._partial(p, retransmit=False))]
        self.counters["multicast"] += 1
        return [(ALL_WORKERS, self._result(p))]

    def _retransmission_of_complete(self, p: Packet) -> list[Action]:
        v, i = p.version, p.slot
        if self.upstream is None or self.final[v, i]:
            self.counters["unicast"] += 1
            return [(to_worker(p.worker), self._result(p))]
        self.counters["reforwarded"] += 1
        return [(PARENT, self._partial(p, retransmit=True))]

    # -- hierarchy: a leaf under a parent aggregator -----------------------------------------------

    def _result_from_parent(self, p: Packet) -> list[Action]:
        v, i = p.version, p.slot
        awaiting = (self.count[v, i] == 0 and self.seen[v, i].all() and not self.final[v, i]
                    and self.offset[v, i] == p.offset and self.lengths[v, i] == p.elements)
        if not awaiting:
            self.counters["duplicate_results"] += 1
            return []
        self.values[v, i, :p.elements] = p.vector
        self.next_exponent[v, i] = p.next_exponent
        self.final[v, i] = True
        self.counters["relayed"] += 1
        return [(ALL_WORKERS, self._result(p))]

    # -- packets out ------------------------------------------------------------------------------

    def _result(self, p: Packet) -> Packet:
        """The slot's (v, i) copy as a result, in the header of the packet that asked for it."""
        v, i = p.version, p.slot
        return p.replace(vector=self.values[v, i, :self.lengths[v, i]].copy(), result=True,
                         retransmit=False, next_exponent=int(self.next_exponent[v, i]),
                         level=self.level)

    def _partial(self, p: Packet, *, retransmit: bool) -> Packet:
        """The rack's sum for (v, i) as this leaf's update to its parent."""
        v, i = p.version, p.slot
        return p.replace(worker=self.upstream, offset=int(self.offset[v, i]),
                         vector=self.values[v, i, :self.lengths[v, i]].copy(), result=False,
                         retransmit=retransmit, next_exponent=int(self.next_exponent[v, i]),
                         level=self.level)
