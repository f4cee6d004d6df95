"""Max-min fair rates by progressive filling, for flows that may be split over several links.

A flow's route is a list of (link, fraction): a single path has fraction 1 on each of its links;
per-packet spraying puts a share of the flow on each of several. A link is full when the sum of
fraction x rate of its flows reaches its capacity. Progressive filling raises every unfrozen flow
at the same pace; the first link to fill freezes its flows at the current level, and so on. The
result is the unique max-min fair allocation for fixed routes (Bertsekas and Gallager, Data
Networks, section 6.5), which is what long-lived flows under a fair transport converge to.

Freezing flows at level L only raises the fill level of their other links (a link at level
l >= L that loses weight w_f at rate L rises to (l w - L w_f) / (w - w_f) >= l), so a heap entry
is a lower bound: it is rechecked when popped and pushed back if its link rose meanwhile. Each
flow is frozen once, so the cost is about (total route length) + (re-pushes) x log(links).
"""

from __future__ import annotations

import heapq

_EPS = 1e-12


def max_min_rates(capacity, routes):
    """Rates (same unit as `capacity`) for `routes`: lists of (link, fraction), or None.

    A None or empty route (no path) gets rate 0.0. A link's capacity must be > 0.
    """
    n_flows = len(routes)
    rate = [0.0] * n_flows
    weight = {}          # link -> sum of fractions of unfrozen flows
    count = {}           # link -> unfrozen flows (exact zero test, no float residue)
    used = {}            # link -> capacity taken by frozen flows
    members = {}         # link -> flows crossing it
    for f, route in enumerate(routes):
        if not route:
            continue
        for e, share in route:
            if e in weight:
                weight[e] += share
                count[e] += 1
                members[e].append(f)
            else:
                weight[e], count[e], used[e], members[e] = share, 1, 0.0, [f]
    heap = [(capacity[e] / w, e) for e, w in weight.items()]
    heapq.heapify(heap)
    frozen = [not route for route in routes]
    level = 0.0
    while heap:
        lv, e = heapq.heappop(heap)
        if count[e] == 0:
            continue                      # every flow on it was frozen elsewhere
        now = (capacity[e] - used[e]) / max(weight[e], _EPS)
        if now > lv * (1 + 1e-12) + _EPS:
            heapq.heappush(heap, (now, e))    # rose since pushed: not the bottleneck yet
            continue
        level = max(level, now)           # levels only rise; guard against rounding
        for f in members[e]:
            if frozen[f]:
                continue
            frozen[f] = True
            rate[f] = level
            for e2, share in routes[f]:
                used[e2] += level * share
                weight[e2] -= share
                count[e2] -= 1
    return rate


def link_loads(routes, rates):
    """{link: load} summed over flows (fraction x rate)."""
    load = {}
    for route, r in zip(routes, rates):
        if route and r:
            for e, share in route:
                load[e] = load.get(e, 0.0) + share * r
    return load
