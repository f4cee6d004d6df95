"""A collective on the flow model: max-min rates per step, step times, CCT, busbw, link balance.

Each step's flows start together and run at their max-min fair rates; the step ends when its
slowest flow has sent its bytes, and the next step starts then (collective steps depend on each
other). Rates stay fixed within a step: flows that finish early do not hand their bandwidth to
the rest, which makes a step's time an upper bound when rates are unequal. Times are at the
graph's link rates (the spec's, i.e. the emulation's); time_scale converts them to real hardware.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from fabriclab.model.collectives import bus_factor
from fabriclab.model.graph import HOST
from fabriclab.model.maxmin import link_loads, max_min_rates
from fabriclab.model.placement import place
from fabriclab.model.splitting import group_capacity, spread_loads

_INF = float("inf")


@dataclass
class Outcome:
    scheme: str
    collective: str
    size: int
    ranks: int
    cct_s: float                         # inf when some flow has no path
    steps: list = field(default_factory=list)
    unroutable: int = 0
    unsatisfied: int = 0
    loads: dict = field(default_factory=dict)    # link -> Mbit/s in the longest step
    rates: list = field(default_factory=list)    # Mbit/s per flow of the longest step
    bound: float | None = None           # optimal: the LP's least max fabric-link utilisation (longest step)

    @property
    def algbw_Bps(self):
        return self.size / self.cct_s if 0 < self.cct_s < _INF else 0.0

    @property
    def busbw_Bps(self):
        return self.algbw_Bps * bus_factor(self.collective, self.ranks)


def transfer_time(nbytes, rate_mbps):
    return nbytes * 8 / (rate_mbps * 1e6) if rate_mbps > 0 else _INF


def run(graph, routes, collective, scheme, hash_seed=0, shared_basis=False):
    """Evaluate `collective` (flows.Collective) under routing `scheme` over `routes`; the hashing
    schemes hash from each switch's basis (placement.place)."""
    out = Outcome(scheme, collective.name, collective.size, collective.ranks, 0.0)
    longest = -1.0
    for step in collective.steps:
        placed = place(graph, routes, step.flows, scheme, hash_seed, shared_basis)
        capacity = graph.link_cap + group_capacity(graph, placed.groups) if placed.groups else graph.link_cap
        rates = max_min_rates(capacity, placed.routes)
        time = max((transfer_time(f.nbytes, r) for f, r in zip(step.flows, rates)), default=0.0)
        out.cct_s += time * step.repeat
        out.unroutable += placed.unroutable
        out.unsatisfied += placed.unsatisfied
        out.steps.append({"name": step.name, "repeat": step.repeat, "flows": len(step.flows),
                          "time_s": time, "unroutable": placed.unroutable,
                          "unsatisfied": placed.unsatisfied, "rates_mbps": rate_summary(rates)})
        if time * step.repeat > longest:
            longest = time * step.repeat
            out.loads = spread_loads(graph, placed.groups, link_loads(placed.routes, rates))
            out.rates = rates
            out.bound = getattr(placed, "congestion", None)
    return out


def rate_summary(rates):
    if not rates:
        return {}
    ordered = sorted(rates)
    return {"min": ordered[0], "p50": ordered[len(ordered) // 2], "mean": statistics.fmean(ordered),
            "max": ordered[-1]}


def balance(graph, routes, loads):
    """Load spread over the live switch-to-switch links, per direction (up: towards the spines).

    max_mean is over every live link, as the emulation's telemetry.balance reports it; loaded
    counts only links that carry something, which says more when few links are in use.
    """
    down = routes.down
    result = {}
    for name, parity in (("up", 0), ("down", 1)):
        links = [e for e in range(2 * graph.n_ports + parity, graph.n_links, 2) if e // 2 not in down]
        values = [loads.get(e, 0.0) for e in links]
        util = [v / graph.link_cap[e] for v, e in zip(values, links)]
        loaded = [v for v in values if v > 1e-9]
        mean = statistics.fmean(values) if values else 0.0
        result[name] = {
            "links": len(values),
            "loaded_links": len(loaded),
            "mean_mbps": mean,
            "max_mbps": max(values, default=0.0),
            "max_utilization": max(util, default=0.0),
            "max_mean": max(values) / mean if mean > 0 else None,
            "max_mean_loaded": max(loaded) / statistics.fmean(loaded) if loaded else None,
        }
    return result


def link_rows(graph, loads, limit=None):
    """Per directed fabric link: label, direction, Mbit/s, utilization; busiest first."""
    rows = []
    for e, mbps in loads.items():
        if graph.link_kind[e] == HOST:
            continue
        src, dst = graph.link_src[e], graph.link_dst[e]
        rows.append({"link": graph.link_label(e), "from": graph.node_name(src), "to": graph.node_name(dst),
                     "direction": "up" if e % 2 == 0 else "down", "mbps": mbps,
                     "utilization": mbps / graph.link_cap[e]})
    rows.sort(key=lambda r: (-r["utilization"], r["link"], r["direction"]))
    return rows if limit is None else rows[:limit]
