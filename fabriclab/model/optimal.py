"""The optimal placement: the least possible maximum link utilisation, the bound TE is held to.

Every leaf pair's demand (the sum of its flows' demands, each flow's NIC share as TE computes
it) may be split in any proportions over the pair's shortest paths (the up-down paths of a
failure-free Clos; the lab's shortest paths after failures). The placement minimises the largest
utilisation of any switch-to-switch link: the min-congestion multicommodity flow, a linear
program solved exactly by HiGHS (scipy.optimize.linprog).

Demands are aggregated by destination leaf: one commodity per destination, with a variable per
link of its shortest-path DAG and flow conservation at each switch. That is exact, because a flow
with one sink decomposes into paths from each source carrying that source's supply. Each
switch then splits what it forwards towards a leaf in the proportions of the solution, which
reproduces the solution's link loads for every source at once. Rates and CCT then come from
max-min fairness over these routes, as for every scheme; `congestion` is the LP's optimum.

The LP grows with (destination leaves) x (links of each destination's DAG that the sources use):
MAX_VARIABLES keeps HiGHS within about 30 s and 1.2 GB; past it the placement is refused in
one line before anything big is built.
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy.optimize import OptimizeWarning, linprog
from scipy.sparse import coo_matrix

from fabriclab.errors import LabError
from fabriclab.model.splitting import Splitter, demands, group_capacity, leaf_of, per_flow

# Measured on a shuffled ring AllReduce, 1:1 fabrics (docs/model.md): 64x16x16, about 16K
# variables, 0.5 s; 128x32x32, 135K, 2.8 s; 256x32x32, 270K, 8.6 s and 0.4 GB; 256x64x64,
# 1.06M, 28 s and 1.2 GB. The limit lets that last one through and stops before minutes and GBs.
MAX_VARIABLES = 1_100_000
# Interior point without crossover: the LP is very degenerate (any even-enough split is optimal)
# and the crossover to a vertex took most of the time (112 s against 2.8 s at 128x32x32; dual
# simplex 5 s against 0.5 s at 64x16x16). The optimum is the same to 1e-9.
LP_OPTIONS = {"run_crossover": "off"}
LP_METHOD = "highs-ipm"


def place_optimal(graph, routes, flows):
    """A Placement with routes splitting each leaf pair optimally; .congestion is the optimum
    (largest fabric-link utilisation at the demands; 0 when nothing crosses the fabric)."""
    need = demands(graph, flows)
    supply = {}                                   # destination leaf -> {source leaf: demand}
    for flow, d in zip(flows, need):
        a, b = leaf_of(graph, flow.src), leaf_of(graph, flow.dst)
        if a != b and routes.reachable(a, b):
            per = supply.setdefault(b, {})
            per[a] = per.get(a, 0.0) + d
    dags, n_vars = {}, 0
    for b, sources in supply.items():
        dags[b] = _dag(routes, b, sources, MAX_VARIABLES - n_vars)
        n_vars += len(dags[b][0])
        if n_vars > MAX_VARIABLES:
            raise LabError(f"optimal: the placement's LP would have more than {MAX_VARIABLES} link variables "
                           f"({len(supply)} destination leaves); drop optimal from --routing, or use fewer leaves")
    hops, congestion = {}, 0.0
    if n_vars:
        x, congestion = _solve(graph, dags, supply, n_vars)
        hops = _shares(graph, dags, x)
    splitter = Splitter(graph, routes, weighted=True, hops=hops)
    placed = per_flow(graph, flows, lambda _flow, a, b: splitter.pair(a, b))
    placed.scheme = "optimal"
    placed.congestion = congestion
    return placed


def _dag(routes, b, sources, room):
    """(links, switches) of leaf b's shortest-path DAG that traffic from `sources` can use."""
    links, seen, frontier = [], set(sources), list(sources)
    dst_of = routes.graph.link_dst
    while frontier:
        nxt = []
        for x in frontier:
            for e in routes.options(x, b):
                links.append(e)
                y = dst_of[e]
                if y != b and y not in seen:
                    seen.add(y)
                    nxt.append(y)
        frontier = nxt
        if len(links) > room:             # past the limit already: the caller refuses
            break
    return links, seen


def _solve(graph, dags, supply, n_vars):
    cap = graph.link_cap
    src_of, dst_of = graph.link_src, graph.link_dst
    t = n_vars                                     # the last variable: the utilisation bound
    eq_rows, eq_cols, eq_vals, eq_rhs = [], [], [], []
    ub_rows, ub_cols, ub_vals = [], [], []
    link_row = {}
    col = 0
    for b, (links, nodes) in dags.items():
        node_row = {}
        for v in nodes:
            node_row[v] = len(eq_rhs)
            eq_rhs.append(supply[b].get(v, 0.0))   # what v puts in; transit switches put in 0
        for e in links:
            eq_rows.append(node_row[src_of[e]])
            eq_cols.append(col)
            eq_vals.append(1.0)
            y = dst_of[e]
            if y != b:
                eq_rows.append(node_row[y])
                eq_cols.append(col)
                eq_vals.append(-1.0)
            row = link_row.setdefault(e, len(link_row))
            ub_rows.append(row)
            ub_cols.append(col)
            ub_vals.append(1.0)
            col += 1
    for e, row in link_row.items():                # sum of commodities on e <= cap(e) x t
        ub_rows.append(row)
        ub_cols.append(t)
        ub_vals.append(-cap[e])
    a_eq = coo_matrix((eq_vals, (eq_rows, eq_cols)), shape=(len(eq_rhs), n_vars + 1)).tocsr()
    a_ub = coo_matrix((ub_vals, (ub_rows, ub_cols)), shape=(len(link_row), n_vars + 1)).tocsr()
    cost = np.zeros(n_vars + 1)
    cost[t] = 1.0
    with warnings.catch_warnings():            # scipy warns that it passes run_crossover on verbatim
        warnings.simplefilter("ignore", OptimizeWarning)
        found = linprog(cost, A_ub=a_ub, b_ub=np.zeros(len(link_row)), A_eq=a_eq, b_eq=np.asarray(eq_rhs),
                        bounds=(0, None), method=LP_METHOD, options=LP_OPTIONS)
    if found.status != 0:
        raise LabError(f"optimal: the LP solver stopped without an optimum ({found.message[:80]})")
    return np.maximum(found.x[:n_vars], 0.0), float(found.x[t])


def _shares(graph, dags, x):
    """{(switch, leaf): ((link, next switch, share), ...)} from the solution's link flows."""
    hops, col = {}, 0
    dst_of = graph.link_dst
    for b, (links, _nodes) in dags.items():
        out = {}
        for e in links:
            out.setdefault(graph.link_src[e], []).append((e, float(x[col])))
            col += 1
        for v, carried in out.items():
            total = sum(amount for _e, amount in carried)
            if total > 0:
                hops[v, b] = tuple((e, dst_of[e], amount / total) for e, amount in carried)
            # a switch the solution sends nothing through keeps the weighted split (never used)
    return hops


def congestion(graph, flows, placed):
    """Largest fabric-link utilisation when every flow sends its demand along its route in
    `placed`: how close a placement comes to the optimum, whatever rates max-min then gives."""
    cap = graph.link_cap + group_capacity(graph, placed.groups) if placed.groups else graph.link_cap
    load = {}
    for route, d in zip(placed.routes, demands(graph, flows)):
        for e, share in (route[1:-1] if route else ()):     # the ends are the host links
            load[e] = load.get(e, 0.0) + share * d
    return max((v / cap[e] for e, v in load.items()), default=0.0)
