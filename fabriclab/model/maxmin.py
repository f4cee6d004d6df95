"""Max-min fair rates by progressive filling, for flows that may be split over several links.

A flow's route is a list of (link, fraction): a single path has fraction 1 on each of its links;
per-packet spraying puts a share of the flow on each of several. A link is full when the sum of
fraction x rate of its flows reaches its capacity. Progressive filling raises every unfrozen flow
at the same pace; the first link to fill freezes its flows at the current level, and so on. The
result is the unique max-min fair allocation for fixed routes (Bertsekas and Gallager, Data
Networks, section 6.5), which is what long-lived flows under a fair transport converge to.

Freezing flows at level L only raises the fill level of their other links (a link at level
l >= L that loses weight w_f at rate L rises to (l w - L w_f) / (w - w_f) >= l), so every link at
the lowest level fills at once: each round freezes the flows of all of them, in numpy over the
(flow, link) entries still unfrozen, and drops those entries. The rounds are as many as the
distinct bottleneck levels (65 for ECMP on a shuffled ring at 32K endpoints), and each costs
the entries left; a heap of links with a Python loop per entry took 3-4 s at 262,144 flows.
"""

from __future__ import annotations

from itertools import chain

import numpy as np

_EPS = 1e-12


def max_min_rates(capacity, routes):
    """Rates (same unit as `capacity`) for `routes`: lists of (link, fraction), or None.

    A None or empty route (no path) gets rate 0.0. A link's capacity must be > 0.
    """
    rate = np.zeros(len(routes))
    lengths = np.fromiter((len(r) if r else 0 for r in routes), dtype=np.int64, count=len(routes))
    n = int(lengths.sum())
    if not n:
        return rate.tolist()
    pairs = np.fromiter(chain.from_iterable(chain.from_iterable(r for r in routes if r)),
                        dtype=np.float64, count=2 * n)
    # Number the links in use 0..m-1 so per-link arrays are as short as they can be.
    used_links, link = np.unique(pairs[0::2].astype(np.int64), return_inverse=True)
    share = pairs[1::2]
    flow = np.repeat(np.arange(len(routes)), lengths)
    cap = np.asarray(capacity, dtype=np.float64)[used_links]
    weight = np.bincount(link, share, minlength=len(used_links))     # unfrozen flows' fractions
    count = np.bincount(link, minlength=len(used_links))             # unfrozen flows (exact zero test)
    used = np.zeros(len(used_links))                                 # taken by frozen flows
    frozen = np.zeros(len(routes), dtype=bool)
    level = 0.0
    while len(flow):
        live = np.flatnonzero(count)
        fill = (cap[live] - used[live]) / np.maximum(weight[live], _EPS)
        low = fill.min()
        level = max(level, low)           # levels only rise; guard against rounding
        full = np.zeros(len(cap), dtype=bool)
        full[live[fill <= low * (1 + 1e-12) + _EPS]] = True
        frozen[flow[full[link]]] = True
        done = frozen[flow]
        rate[np.unique(flow[done])] = level
        gone, part = link[done], share[done]
        used += np.bincount(gone, part * level, minlength=len(cap))
        weight -= np.bincount(gone, part, minlength=len(cap))
        count -= np.bincount(gone, minlength=len(cap))
        keep = ~done
        flow, link, share = flow[keep], link[keep], share[keep]
    return rate.tolist()


def link_loads(routes, rates):
    """{link: load} summed over flows (fraction x rate)."""
    load = {}
    for route, r in zip(routes, rates):
        if route and r:
            for e, share in route:
                load[e] = load.get(e, 0.0) + share * r
    return load
