"""Alpha-beta cost model of collectives: what a collective should take, from latency and bandwidth.

Every function returns a Cost: the predicted time as a sum of named terms (latency, bandwidth,
copies), so a report can say which term dominates. Units: bytes, bytes per second, seconds.
`size` is the message size nccl-tests reports for that collective (the buffer each rank reduces
for AllReduce; the total output for AllGather; the total input for ReduceScatter; the bytes each
rank sends in all for AlltoAll). `p` ranks, `alpha` the per-step latency, `bw` a rank's
bandwidth in one direction.

Sources: the ring vs fully-connected formulas are seed 001 equations 1-4; in-network aggregation
is seed 003 section 3 (each worker sends and receives |U| once, against ring all-reduce's
2|U|(n-1)/n each way); the ring and tree terms are the standard alpha-beta analyses of these
algorithms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Cost:
    collective: str
    algorithm: str
    size: float
    ranks: int
    terms: dict = field(default_factory=dict)      # name -> seconds

    @property
    def time(self):
        return sum(self.terms.values())

    @property
    def dominant(self):
        return max(self.terms, key=self.terms.get) if self.terms else None

    @property
    def algbw(self):
        """nccl-tests' algorithm bandwidth: size / time (bytes per second)."""
        return self.size / self.time if self.time > 0 else math.inf

    @property
    def busbw(self):
        """nccl-tests' bus bandwidth: algbw scaled so it compares with link bandwidth."""
        return self.algbw * bus_factor(self.collective, self.ranks)


def bus_factor(collective, p):
    """nccl-tests' correction from algbw to busbw for each collective."""
    if collective == "allreduce":
        return 2 * (p - 1) / p
    if collective in ("allgather", "reducescatter", "alltoall", "alltoallv"):
        return (p - 1) / p
    return 1.0


def phases(collective):
    """How many times a collective's buffer passes through its ranks: AllReduce twice (reduce,
    then share the result), the others once. Whole-buffer host staging is charged per phase."""
    return 2 if collective == "allreduce" else 1


def _check(size, p, alpha, bw):
    if size < 0:
        raise ValueError(f"size must be >= 0 bytes, got {size}")
    if p < 2:
        raise ValueError(f"a collective needs at least 2 ranks, got {p}")
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0 s, got {alpha}")
    if bw <= 0:
        raise ValueError(f"bandwidth must be > 0 bytes/s, got {bw}")


def ring_allreduce(size, p, alpha, bw):
    """Reduce-scatter then all-gather around a ring: 2(p-1) steps of size/p (seed 001 eq. 1)."""
    _check(size, p, alpha, bw)
    return Cost("allreduce", "ring", size, p, {
        "latency": 2 * (p - 1) * alpha,
        "bandwidth": 2 * (p - 1) / p * size / bw,
    })


def fc_allreduce(size, p, alpha, bw):
    """Fully connected, total bandwidth bw split over p-1 channels (seed 001 eq. 2)."""
    _check(size, p, alpha, bw)
    channel = bw / (p - 1)
    return Cost("allreduce", "fully-connected", size, p, {
        "latency": 2 * alpha,
        "bandwidth": 2 * size / (channel * p),
    })


def tree_allreduce(size, p, alpha, bw):
    """Pipelined (double) binary tree: reduce up, broadcast down; depth log2(p) each way.

    Latency grows with log2(p) rather than p; with pipelining the bandwidth term approaches
    2 x size / bw (each half of the data crosses every rank's link once up and once down).
    """
    _check(size, p, alpha, bw)
    return Cost("allreduce", "tree", size, p, {
        "latency": 2 * math.ceil(math.log2(p)) * alpha,
        "bandwidth": 2 * size / bw,
    })


def _one_pass(collective, algorithm, size, p, alpha, bw):
    """p-1 steps, each moving size/p per rank: ring reduce-scatter, ring all-gather, pairwise
    all-to-all all cost this."""
    _check(size, p, alpha, bw)
    return Cost(collective, algorithm, size, p, {
        "latency": (p - 1) * alpha,
        "bandwidth": (p - 1) / p * size / bw,
    })


def ring_reducescatter(size, p, alpha, bw):
    return _one_pass("reducescatter", "ring", size, p, alpha, bw)


def ring_allgather(size, p, alpha, bw):
    return _one_pass("allgather", "ring", size, p, alpha, bw)


def ring_hops_gamma(p):
    """Seed 001's gamma: the total hop count of an AlltoAll on a bidirectional ring of p nodes."""
    q, r = divmod(p - 1, 2)
    return 2 * sum(range(1, q + 1)) + r * p / 2


def ring_topology_alltoall(size, p, alpha, bw):
    """AlltoAll over a ring topology, hop by hop (seed 001 eq. 3): gamma (size/(bw p) + alpha)."""
    _check(size, p, alpha, bw)
    gamma = ring_hops_gamma(p)
    return Cost("alltoall", "ring-topology", size, p, {
        "latency": gamma * alpha,
        "bandwidth": gamma * size / (bw * p),
    })


def fc_alltoall(size, p, alpha, bw):
    """AlltoAll on a fully connected topology (seed 001 eq. 4): one step."""
    _check(size, p, alpha, bw)
    return Cost("alltoall", "fully-connected", size, p, {
        "latency": alpha,
        "bandwidth": (p - 1) / p * size / bw,
    })


def pairwise_alltoall(size, p, alpha, bw):
    """AlltoAll through a switched fabric, one peer per step (p-1 steps of size/p)."""
    return _one_pass("alltoall", "pairwise", size, p, alpha, bw)


def pairwise_alltoallv(sizes, alpha, bw):
    """AlltoAllv: sizes[i][j] bytes from rank i to j; the busiest sender or receiver sets the time."""
    p = len(sizes)
    if p < 2 or any(len(row) != p for row in sizes):
        raise ValueError("sizes must be a square matrix of at least 2 x 2 bytes")
    sent = [sum(row[j] for j in range(p) if j != i) for i, row in enumerate(sizes)]
    received = [sum(sizes[i][j] for i in range(p) if i != j) for j in range(p)]
    busiest = max(max(sent), max(received))
    _check(busiest, p, alpha, bw)
    return Cost("alltoallv", "pairwise", sum(sent) / p, p, {
        "latency": (p - 1) * alpha,
        "bandwidth": busiest / bw,
    })


def ina_allreduce(size, p, alpha, bw):
    """In-network aggregation (SwitchML, seed 003 section 3): each worker sends size once and
    receives the aggregate once; one round trip through the switch for latency."""
    _check(size, p, alpha, bw)
    return Cost("allreduce", "in-network", size, p, {
        "latency": 2 * alpha,
        "bandwidth": size / bw,
    })


def bytes_per_worker(algorithm, size, p):
    """Bytes each worker sends plus receives (seed 003: 2|U| for INA, 4|U|(n-1)/n for ring)."""
    if algorithm == "in-network":
        return 2 * size
    if algorithm == "ring":
        return 4 * size * (p - 1) / p
    raise ValueError(f"no byte count for algorithm {algorithm!r}")


@dataclass(frozen=True)
class Tier:
    """One level of a hierarchy: its latency per step and a rank's bandwidth on it."""

    alpha: float
    bw: float


def hierarchical_allreduce(size, gpus_per_node, nodes, scale_up: Tier, scale_out: Tier):
    """Reduce-scatter inside each node, ring all-reduce of each GPU's shard across nodes (one ring
    per NIC, all in parallel), all-gather inside the node. The terms say which tier dominates."""
    g, n = gpus_per_node, nodes
    if g < 1 or n < 1 or g * n < 2:
        raise ValueError(f"need at least 2 GPUs in all, got {g} per node x {n} nodes")
    terms = {}
    if g > 1:
        rs = ring_reducescatter(size, g, scale_up.alpha, scale_up.bw)
        terms["scale-up reduce-scatter"] = rs.time
    if n > 1:
        ar = ring_allreduce(size / g, n, scale_out.alpha, scale_out.bw)
        terms["scale-out all-reduce"] = ar.time
    if g > 1:
        ag = ring_allgather(size, g, scale_up.alpha, scale_up.bw)
        terms["scale-up all-gather"] = ag.time
    return Cost("allreduce", "hierarchical", size, g * n, terms)


ALGORITHMS = {
    ("allreduce", "ring"): ring_allreduce,
    ("allreduce", "tree"): tree_allreduce,
    ("allreduce", "fully-connected"): fc_allreduce,
    ("allreduce", "in-network"): ina_allreduce,
    ("reducescatter", "ring"): ring_reducescatter,
    ("allgather", "ring"): ring_allgather,
    ("alltoall", "pairwise"): pairwise_alltoall,
    ("alltoall", "fully-connected"): fc_alltoall,
    ("alltoall", "ring-topology"): ring_topology_alltoall,
}
