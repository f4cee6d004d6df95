"""Counter snapshots of a fabric, and what they say about link balance.

A snapshot is every switch port's counters (read by `counters`), its buffer's drops and the CPU's,
with the time they were read; two snapshots give each fabric link direction's Mbit/s and drops.
"""

from __future__ import annotations

import statistics
import time

from fabriclab.measure import cpuload
from fabriclab.measure.counters import COUNTERS, SYS_NET, TC_QDISC_STATS, qdisc_drops, read_counters

__all__ = ["COUNTERS", "balance", "buffer_drops", "fabric_directions", "link_utilization", "max_mean_ratio",
           "qdisc_drops", "read_counters", "snapshot"]


def fabric_directions(fabric):
    """Every direction of every fabric link: (label, from node, to node, tx interface, rate)."""
    rows = []
    for link in fabric.fabric_links:
        rows.append((link.label, link.a, link.b, link.a_intf, link.rate_mbps, "up"))
        rows.append((link.label, link.b, link.a, link.b_intf, link.rate_mbps, "down"))
    return rows


def snapshot(fabric, sys_net=SYS_NET, tc=TC_QDISC_STATS):
    """Counters of every switch port and the CPU's, with the time they were read (ports that are
    missing are left out)."""
    intfs = [intf for s in fabric.switches for intf in fabric.switch_ports(s).values()]
    return {"time": time.monotonic(), "counters": read_counters(intfs, sys_net=sys_net),
            "drops": qdisc_drops(intfs, tc), "cpu": cpuload.sample()}


def link_utilization(fabric, before, after):
    """Per fabric-link direction: Mbit/s sent, utilization of its rate, buffer drops."""
    seconds = after["time"] - before["time"]
    if seconds <= 0:
        raise ValueError("snapshots must be taken in order")
    rows = []
    for label, src, dst, intf, rate, direction in fabric_directions(fabric):
        b, a = before["counters"].get(intf), after["counters"].get(intf)
        if b is None or a is None:
            continue
        mbps = (a["tx_bytes"] - b["tx_bytes"]) * 8 / seconds / 1e6
        rows.append({
            "link": label, "from": src, "to": dst, "direction": direction, "intf": intf,
            "mbps": round(mbps, 3), "utilization": round(mbps / rate, 4),
            "drops": after["drops"].get(intf, 0) - before["drops"].get(intf, 0),
        })
    return rows


def buffer_drops(fabric, before, after):
    """Packets the buffers of every switch port dropped between two snapshots: the fabric links'
    and the host-facing ports' (a leaf's downlink to a host overflows when uplinks converge)."""
    fabric_intfs = {row[3] for row in fabric_directions(fabric)}
    out = {"fabric": 0, "host_ports": 0}
    for intf, count in after["drops"].items():
        delta = count - before["drops"].get(intf, 0)
        out["fabric" if intf in fabric_intfs else "host_ports"] += delta
    out["total"] = out["fabric"] + out["host_ports"]
    return out


def max_mean_ratio(values):
    """Load of the busiest member over the mean: 1.0 is perfect balance (seed 000's ECMP metric)."""
    values = list(values)
    if not values:
        return None
    mean = statistics.fmean(values)
    return round(max(values) / mean, 3) if mean > 0 else None


def balance(rows, direction="up"):
    """Max/mean and spread of one direction's utilization across all fabric links."""
    loads = [r["mbps"] for r in rows if r["direction"] == direction]
    if not loads:
        return {}
    return {
        "direction": direction,
        "links": len(loads),
        "mean_mbps": round(statistics.fmean(loads), 3),
        "max_mbps": round(max(loads), 3),
        "min_mbps": round(min(loads), 3),
        "stdev_mbps": round(statistics.pstdev(loads), 3),
        "max_mean_ratio": max_mean_ratio(loads),
    }
