"""The flows of a collective, step by step: which host port sends how many bytes to which, on
which QPs, from which UDP source port.

Conventions shared with the lab's traffic (traffic/allpairs.py, traffic/roce.py):
- a host talks to the port of the same NIC and plane (the same rail) of its peer, and a message
  is split equally over the host's rails;
- each connection is `qps` QPs carrying equal shares (seed 000 section 4.2.4, splitting a message
  over QPs); QP numbers follow all_pairs_plan: the sender's QP for peer j is FIRST_QPN + j*qps + k;
- the UDP source port comes from the QP pair as Linux derives it, or, in the shared-source-port
  corner case, from the NIC pair only (traffic.roce.udp_source_port).

Ring AllReduce is 2(p-1) steps in which every rank sends size/p to its successor; every step has
the same flows, so it is one Step repeated 2(p-1) times. AlltoAll is one step in which every
rank sends size/p to every other rank (size is what nccl-tests reports: each rank's whole buffer).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from fabriclab.errors import LabError
from fabriclab.loading import excerpt
from fabriclab.traffic.allpairs import FIRST_QPN
from fabriclab.traffic.roce import QPN_MASK, udp_source_port

COLLECTIVES = ("allreduce", "alltoall")
SPORT_MODES = ("qp", "shared")
ORDERS = ("linear", "shuffled")
DEFAULT_MAX_FLOWS = 1_000_000


class Flow:
    """One QP's stream: host ports as graph node ids, its QPs, its UDP source port and bytes."""

    __slots__ = ("src", "dst", "src_qpn", "dst_qpn", "sport", "nbytes")

    def __init__(self, src, dst, src_qpn, dst_qpn, sport, nbytes):
        self.src, self.dst = src, dst
        self.src_qpn, self.dst_qpn = src_qpn, dst_qpn
        self.sport, self.nbytes = sport, nbytes

    def __repr__(self):
        return (f"Flow({self.src}->{self.dst} qp {self.src_qpn}->{self.dst_qpn} "
                f"sport {self.sport} {self.nbytes:g} B)")


@dataclass
class Step:
    name: str
    flows: list
    repeat: int = 1


@dataclass(frozen=True)
class Collective:
    name: str            # allreduce | alltoall
    size: int            # bytes, as nccl-tests reports them
    ranks: int           # hosts taking part
    steps: tuple


def connection_flows(graph, pairs, nbytes, qps=1, sport_mode="qp"):
    """Flows for host pairs (0-based host indices): one per rail per QP, nbytes per connection."""
    if sport_mode not in SPORT_MODES:
        raise LabError(f"sport mode must be one of {', '.join(SPORT_MODES)}, got {excerpt(sport_mode)}")
    rails = graph.params.rails
    share = nbytes / (rails * qps)
    flows = []
    for i, j in pairs:
        src_ports, dst_ports = graph.host_port_ids[i], graph.host_port_ids[j]
        for r in range(rails):
            sp, dp = src_ports[r], dst_ports[r]
            shared = {"shared": True, "src": graph.ip_text(sp), "dst": graph.ip_text(dp)} \
                if sport_mode == "shared" else {}
            for k in range(qps):
                # allpairs numbering with 1-based host indices
                sq = FIRST_QPN + (j + 1) * qps + k
                dq = FIRST_QPN + (i + 1) * qps + k
                flows.append(Flow(sp, dp, sq, dq, udp_source_port(sq, dq, **shared), share))
    return flows


def _check(graph, size, qps, connections, max_flows):
    hosts = graph.params.hosts
    if hosts < 2:
        raise LabError(f"fabric {excerpt(graph.params.name)} has one host: a collective needs two")
    if isinstance(size, bool) or not isinstance(size, (int, float)) or size <= 0:
        raise LabError(f"message size must be > 0 bytes, got {excerpt(size)}")
    if isinstance(qps, bool) or not isinstance(qps, int) or not 1 <= qps <= 1024:
        raise LabError(f"QPs per connection must be a whole number in 1..1024, got {excerpt(qps)}")
    if FIRST_QPN + (hosts + 1) * qps > QPN_MASK:
        raise LabError(f"{hosts} hosts x {qps} QPs run out of 24-bit QP numbers")
    n = connections * graph.params.rails * qps
    if n > max_flows:
        raise LabError(f"{n} flows ({connections} connections x {graph.params.rails} rails x {qps} QPs) "
                       f"is more than --max-flows {max_flows}; use fewer hosts or QPs")


def rank_order(hosts, order="linear", seed=0):
    """Host indices in ring order: linear (a topology-aware ring, neighbours share a leaf) or
    shuffled (ranks scattered over the fabric, as a fragmented job placement leaves them)."""
    if order not in ORDERS:
        raise LabError(f"rank order must be one of {', '.join(ORDERS)}, got {excerpt(order)}")
    ranks = list(range(hosts))
    if order == "shuffled":
        random.Random(seed).shuffle(ranks)
    return ranks


def ring_allreduce(graph, size, qps=1, sport_mode="qp", order="linear", seed=0,
                   max_flows=DEFAULT_MAX_FLOWS):
    p = graph.params.hosts
    _check(graph, size, qps, p, max_flows)
    ranks = rank_order(p, order, seed)
    pairs = [(ranks[i], ranks[(i + 1) % p]) for i in range(p)]
    flows = connection_flows(graph, pairs, size / p, qps, sport_mode)
    return Collective("allreduce", size, p, (Step("ring step", flows, 2 * (p - 1)),))


def alltoall(graph, size, qps=1, sport_mode="qp", max_flows=DEFAULT_MAX_FLOWS):
    p = graph.params.hosts
    _check(graph, size, qps, p * (p - 1), max_flows)
    pairs = [(i, j) for i in range(p) for j in range(p) if i != j]
    flows = connection_flows(graph, pairs, size / p, qps, sport_mode)
    return Collective("alltoall", size, p, (Step("all pairs", flows, 1),))


def build(graph, collective, size, qps=1, sport_mode="qp", order="linear", seed=0,
          max_flows=DEFAULT_MAX_FLOWS):
    if collective == "allreduce":
        return ring_allreduce(graph, size, qps, sport_mode, order, seed, max_flows)
    if collective == "alltoall":
        return alltoall(graph, size, qps, sport_mode, max_flows)
    raise LabError(f"collective must be one of {', '.join(COLLECTIVES)}, got {excerpt(collective)}")
