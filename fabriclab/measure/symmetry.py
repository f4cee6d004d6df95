"""Symmetry groups and what breaks them (seed 002, sections 5.1 and 5.2).

A well-balanced fabric loads the members of a symmetry group alike: a leaf's uplinks, a spine's
downlinks, the planes of a multiplane fabric, the rails, the NICs of one job. A member far from
its group's median is an outlier worth a look (a degraded optic, a misconfigured NIC, a hash
collision). The same idea over time exposes a straggler: a healthy NIC of a collective either sends
at line rate or waits, so its bandwidth histogram is bimodal; a slow one sits in between.

Everything here works on a PortSeries (portsampler) and returns plain dicts for results files.
"""

from __future__ import annotations

import statistics

TOLERANCE = 0.25          # a member more than 25 % off its group's median is an outlier
ACTIVE_FRACTION = 0.05    # a group is checked only when its median carries >= 5 % of line rate
HIST_BINS = 10            # NIC histograms: tenths of line rate (the last bin takes >= 90 %)
IDLE_FRACTION = 0.1       # a bin below 10 % of line rate counts as idle


def groups(columns, hosts=None):
    """{group name: {member label: [column names]}} for the fabric's symmetry groups; NIC groups
    only take `hosts` (a job's hosts) when given. Groups with one member are left out."""
    out = {}

    def add(group, member, column):
        out.setdefault(group, {}).setdefault(member, []).append(column)

    planes = {c.plane for c in columns}
    nics = {c.nic for c in columns if c.kind == "nic_tx"}
    for c in columns:
        if c.kind == "up":
            add(f"{c.src} uplinks", c.name, c.name)
            if len(planes) > 1:
                add("planes (uplink load)", f"plane {c.plane}", c.name)
        elif c.kind == "down":
            add(f"{c.src} downlinks", c.name, c.name)
        elif c.kind == "nic_tx" and (hosts is None or c.host in hosts):
            add("NIC send" if len(nics) == 1 else f"rail {c.nic} NIC send", c.src, c.name)
            if len(planes) > 1:
                add(f"{c.host} n{c.nic} planes", f"plane {c.plane}", c.name)
    return {name: members for name, members in out.items() if len(members) > 1}


def outliers(loads, rate_mbps, tolerance=TOLERANCE, active_fraction=ACTIVE_FRACTION):
    """Members of one group ({label: Mbit/s}) more than `tolerance` off the group's median.
    A group whose median is below `active_fraction` of `rate_mbps` is idle: nothing to say."""
    if len(loads) < 2:
        return []
    median = statistics.median(loads.values())
    if median < active_fraction * rate_mbps:
        return []
    flagged = []
    for member, mbps in loads.items():
        deviation = (mbps - median) / median
        if abs(deviation) > tolerance:
            flagged.append({"member": member, "mbps": round(mbps, 3), "deviation": round(deviation, 3)})
    return flagged


METRICS = ("mean", "busy")


def check(series, start=None, end=None, hosts=None, tolerance=TOLERANCE, active_fraction=ACTIVE_FRACTION,
          metric="mean", bin_s=0.05):
    """Every symmetry group's loads between two series times, its max/mean and its outliers.

    metric `mean`: average Mbit/s, the share of traffic each member carries (hash imbalance,
    seed 002 Figure 6). metric `busy`: the mean over the `bin_s` bins in which the member was
    busy (above IDLE_FRACTION of its rate), the rate it reaches when it sends. A collective gives
    every flow the same bytes per iteration, so a slow link that carries one flow has the mean of
    its healthy peers; its busy rate stays low."""

    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}")
    if metric == "mean":
        means = series.mean_mbps(start, end)
    else:
        _times, mbps = series.rates(bin_s, start, end)
        means = {}
        for i, c in enumerate(series.columns):
            busy = mbps[:, i][mbps[:, i] >= IDLE_FRACTION * c.rate_mbps]
            means[c.name] = float(busy.mean()) if len(busy) else 0.0
    rate = {c.name: c.rate_mbps for c in series.columns}
    report = []
    for name, members in groups(series.columns, hosts).items():
        loads = {label: sum(means[c] for c in cols) for label, cols in members.items()}
        member_rate = max(sum(rate[c] for c in cols) for cols in members.values())
        values = list(loads.values())
        mean = statistics.fmean(values)
        report.append({
            "group": name, "metric": metric, "members": {k: round(v, 3) for k, v in loads.items()},
            "median_mbps": round(statistics.median(values), 3),
            "max_mean_ratio": round(max(values) / mean, 3) if mean > 0 else None,
            "outliers": outliers(loads, member_rate, tolerance, active_fraction),
        })
    return report


def flagged(report):
    """[(group, member, deviation, metric)] of check() reports: the lines an operator reads first."""
    return [(g["group"], o["member"], o["deviation"], g.get("metric", "mean")) for g in report for o in g["outliers"]]


def nic_histograms(series, bin_s, start=None, end=None, hosts=None, kind="nic_tx"):
    """Per NIC port: the share of `bin_s` bins at each tenth of line rate, the idle share, and the
    mean utilization of its busy bins (what a straggler lowers)."""
    times, mbps = series.rates(bin_s, start, end)
    out = {}
    if not len(times):
        return out
    for i, c in enumerate(series.columns):
        if c.kind != kind or (hosts is not None and c.host not in hosts):
            continue
        util = mbps[:, i] / c.rate_mbps
        counts = [0] * HIST_BINS
        for u in util:
            counts[min(HIST_BINS - 1, max(0, int(u * HIST_BINS)))] += 1
        busy = [u for u in util if u >= IDLE_FRACTION]
        out[c.src if kind == "nic_tx" else c.dst] = {
            "histogram": [round(n / len(util), 4) for n in counts],
            "idle_share": round(1 - len(busy) / len(util), 4),
            "mean_utilization": round(float(util.mean()), 4),
            "busy_mean_utilization": round(statistics.fmean(busy), 4) if busy else 0.0,
        }
    return out


def stragglers(histograms, tolerance=TOLERANCE):
    """NIC ports whose busy-bin utilization is more than `tolerance` below the median NIC's."""
    busy = {port: h["busy_mean_utilization"] for port, h in histograms.items() if h["busy_mean_utilization"] > 0}
    if len(busy) < 2:
        return []
    median = statistics.median(busy.values())
    return sorted(port for port, value in busy.items() if value < (1 - tolerance) * median)
