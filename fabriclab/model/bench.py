"""How long the flow model takes, and how much memory, as fabrics grow to 256K endpoints.

Each size is a 1:1 leaf/spine (hosts_per_leaf x host rate = spines x fabric rate when the spine
count equals hosts per leaf). The workload is a ring AllReduce with ranks shuffled over the
fabric, so nearly every flow crosses the spines (a linear ring would keep most of them inside a
leaf and measure little). Timed separately: building the graph, the shortest-path tables of every
destination leaf, each routing scheme (placement + max-min rates + CCT), the up-down max-flow of
every leaf pair, and one trial of 1% random link failures (new routes, capacities, the first
scheme again). Each size runs in a child process of its own, so its peak resident memory
(ru_maxrss) is its own and not the largest so far.
"""

from __future__ import annotations

import multiprocessing
import resource
import time

from fabriclab.errors import LabError
from fabriclab.model import evaluate, flows
from fabriclab.model.failures import capacity_ratios, failed_cables, trial_rng
from fabriclab.model.graph import ClosGraph, ClosParams
from fabriclab.model.maxflow import leaf_pair_capacity
from fabriclab.model.placement import SCHEMES
from fabriclab.model.routes import Routes

# The last size is 262,144 endpoints: 2048 leaves x 128 hosts, 128 spines (1:1). 4096x64x64 has
# as many endpoints but needs 4096 x 4160 distance entries, past graph.MAX_ROUTE_ENTRIES.
DEFAULT_SIZES = "8x4x4,32x16x16,128x32x32,512x64x64,2048x128x128"
DEFAULT_SCHEMES = "ecmp,te,ideal"


def parse_schemes(text):
    schemes = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in schemes if s not in SCHEMES]
    if bad or not schemes:
        raise LabError(f"unknown routing {bad[0] if bad else text!r} (known: {', '.join(SCHEMES)})")
    return schemes


def run_size_alone(leaves, spines, hosts_per_leaf, schemes, size=2**26, seed=0):
    """run_size in a forked child process; the row gains the child's peak_rss_mb."""
    with multiprocessing.get_context("fork").Pool(1) as pool:
        return pool.apply(_measured, (leaves, spines, hosts_per_leaf, tuple(schemes), size, seed))


def _measured(*args):
    row = run_size(*args)
    row["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # KiB on Linux
    return row


def run_size(leaves, spines, hosts_per_leaf, schemes, size=2**26, seed=0):
    """One row of timings (seconds) for a leaves x spines x hosts_per_leaf fabric."""
    row = {"leaves": leaves, "spines": spines, "hosts_per_leaf": hosts_per_leaf}
    start = t = time.perf_counter()

    def lap(name):
        nonlocal t
        now = time.perf_counter()
        row[f"{name}_s"] = now - t
        t = now

    graph = ClosGraph(ClosParams(name=f"bench{leaves}x{spines}x{hosts_per_leaf}", leaves=leaves,
                                 spines=spines, hosts_per_leaf=hosts_per_leaf))
    lap("build")
    collective = flows.ring_allreduce(graph, size, order="shuffled", seed=seed)
    lap("flows")
    routes = Routes(graph)
    for leaf in graph.leaves:
        routes.dist(leaf)
    lap("routes")
    row["cct_s"] = {}
    for scheme in schemes:
        row["cct_s"][scheme] = evaluate.run(graph, routes, collective, scheme).cct_s
        lap(scheme)
    baseline = leaf_pair_capacity(graph)
    lap("maxflow")
    down = failed_cables(graph, 0.01, trial_rng(seed, 0.01, 0))
    ratios = capacity_ratios(graph, baseline, down)
    evaluate.run(graph, Routes(graph, down), collective, schemes[0])
    lap("failure_trial")
    row.update(endpoints=graph.n_ports, switches=graph.n_switches, cables=graph.n_cables,
               flows=len(collective.steps[0].flows), leaf_pairs=len(baseline),
               min_capacity_1pct=min(ratios) if ratios else None, total_s=time.perf_counter() - start)
    return row
