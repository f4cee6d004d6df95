"""Counter snapshots of a fabric, and what they say about link balance.

A snapshot is every switch port's counters (read by `counters`), its buffer's drops and the CPU's,
with the time they were read; two snapshots give each fabric link direction's Mbit/s and drops.
"""

from __future__ import annotations

import concurrent.futures
import statistics
import time

from fabriclab.measure import cpuload
from fabriclab.measure.counters import COUNTERS, SYS_NET, TC_QDISC_STATS, operstates, qdisc_drops, read_counters

__all__ = ["COUNTERS", "balance", "buffer_drops", "fabric_directions", "lab_snapshot", "link_utilization",
           "max_mean_ratio", "qdisc_drops", "read_counters", "seconds_between", "snapshot", "switch_ports_now",
           "window_error_ms"]


def fabric_directions(fabric):
    """Every direction of every fabric link: (label, from node, to node, tx interface, rate)."""
    rows = []
    for link in fabric.fabric_links:
        rows.append((link.label, link.a, link.b, link.a_intf, link.rate_mbps, "up"))
        rows.append((link.label, link.b, link.a, link.b_intf, link.rate_mbps, "down"))
    return rows


def snapshot(fabric, sys_net=SYS_NET, tc=TC_QDISC_STATS, cluster=None):
    """Counters of every switch port and the CPU's, with the time they were read (ports that are
    missing are left out).

    With a `cluster`, the ports of switches on other machines are read there, all at once
    (the cluster's counter reader there): `times` dates their interfaces by when they were read (on this
    machine's monotonic clock) and `error_s` is the largest error of that dating."""
    away = _away(fabric, cluster)
    remote = {intf for _m, pairs in away.values() for intf, _c in pairs}
    intfs = [intf for s in fabric.switches for intf in fabric.switch_ports(s).values() if intf not in remote]
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        elsewhere = pool.submit(cluster.read_counters_all, away, True) if away else None
        snap = {"time": time.monotonic(), "counters": read_counters(intfs, sys_net=sys_net),
                "drops": qdisc_drops(intfs, tc), "cpu": cpuload.sample()}
        readings = elsewhere.result() if elsewhere is not None else {}
    if readings:
        snap["times"], snap["error_s"] = {}, max(r.error_s for r in readings.values())
        for reading in readings.values():
            snap["counters"].update(reading.by_interface())
            snap["drops"].update(reading.drops)
            snap["times"].update({intf: reading.time for intf, _c in reading.pairs})
    return snap


def lab_snapshot(lab):
    """snapshot() of a running lab's fabric, on every machine it runs on."""
    return snapshot(lab.fabric, cluster=getattr(lab, "cluster", None))


def switch_ports_now(lab, switch):
    """({intf: counters}, {intf: buffer drops}, {intf: operstate}) of one switch's ports, read on
    the machine the switch runs on."""
    intfs = list(lab.fabric.switch_ports(switch).values())
    cluster = getattr(lab, "cluster", None)
    machine = cluster.machine_of_name(switch) if cluster is not None else None
    if machine is None or machine.local:
        return read_counters(intfs), qdisc_drops(intfs), operstates(intfs)
    reading = cluster.read_counters(machine, [(i, c) for i in intfs for c in COUNTERS], drops=True,
                                  states=True)
    return reading.by_interface(), reading.drops, reading.states


def _away(fabric, cluster):
    """{machine name: (Machine, [(interface, counter)])}: the switch ports on other machines."""
    away = {}
    if cluster is None:
        return away
    for switch in fabric.switches:
        machine = cluster.machine_of_name(switch)
        if not machine.local:
            pairs = away.setdefault(machine.name, (machine, []))[1]
            pairs += [(intf, c) for intf in fabric.switch_ports(switch).values() for c in COUNTERS]
    return away


def window_error_ms(before, after):
    """How far off the window's ends may be for ports read on other machines (0 on one machine)."""
    return round(max(before.get("error_s", 0.0), after.get("error_s", 0.0)) * 1e3, 3)


def seconds_between(before, after, intf):
    """The time between two snapshots' readings of `intf` (its machine's read where it has one)."""
    return after.get("times", {}).get(intf, after["time"]) - before.get("times", {}).get(intf, before["time"])


def link_utilization(fabric, before, after):
    """Per fabric-link direction: Mbit/s sent, utilization of its rate, buffer drops."""
    if after["time"] - before["time"] <= 0:
        raise ValueError("snapshots must be taken in order")
    rows = []
    for label, src, dst, intf, rate, direction in fabric_directions(fabric):
        b, a = before["counters"].get(intf), after["counters"].get(intf)
        seconds = seconds_between(before, after, intf)
        if b is None or a is None or seconds <= 0:
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
