"""Cross-zone bytes of a job on a threetier fabric: what crossed the super-spine tier.

Seed 000 (section 3.2) joins AI zones through an oversubscribed aggregation tier (ATSW) and has
the scheduler find a "minimum cut" of the training nodes across zones, so that little traffic
has to cross it. Two views of the same quantity, so each checks the other:
- from the schedule: the bytes of every transfer whose two ranks sit in different zones (what
  the placement decided, before any packet moved);
- from the counters: what the spines sent up their super-spine links between two snapshots
  (every cross-zone packet goes up once and down once; counting the up direction counts it
  once). It is wire bytes: headers, ACKs and retransmissions on top of the schedule's payload.
"""

from __future__ import annotations


def crosses(fabric, host_a, host_b):
    """Whether traffic between two hosts crosses zones (the super-spine tier)."""
    return fabric.pod_of(host_a) != fabric.pod_of(host_b)


def schedule_bytes(fabric, rank_hosts, transfers):
    """(cross-zone bytes, all bytes between distinct ranks) of one pass of `transfers`
    (schedules.Transfer: src, dst rank, nbytes), ranks placed on `rank_hosts[rank]`."""
    cross = total = 0
    for t in transfers:
        if t.src == t.dst:
            continue
        total += t.nbytes
        if crosses(fabric, rank_hosts[t.src], rank_hosts[t.dst]):
            cross += t.nbytes
    return cross, total


def counted_bytes(fabric, before, after):
    """Bytes the spines sent up to the super-spines between two telemetry snapshots (None
    when a counter is missing from either)."""
    total = 0
    for link in fabric.core_links:
        b, a = before["counters"].get(link.a_intf), after["counters"].get(link.a_intf)
        if b is None or a is None:
            return None
        total += a["tx_bytes"] - b["tx_bytes"]
    return total


def record(fabric, rank_hosts, transfers, iterations, window):
    """The cross-zone part of a collective size's result; None on a fabric with one zone."""
    if fabric.spec.kind != "threetier":
        return None
    cross, total = schedule_bytes(fabric, rank_hosts, transfers)
    pairs = sum(1 for a, b in zip(rank_hosts, rank_hosts[1:] + rank_hosts[:1]) if crosses(fabric, a, b))
    return {
        "schedule_bytes": cross * iterations,
        "share": round(cross / total, 4) if total else 0.0,
        "counted_bytes": counted_bytes(fabric, *window),
        # ring neighbours (rank i, i+1 mod n) in different zones: a ring's cut
        "ring_hops_across": pairs,
        "zones": sorted({fabric.pod_of(h) for h in rank_hosts}),
    }
