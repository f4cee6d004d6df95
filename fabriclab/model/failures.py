"""Random link failures: leaf-pair capacity left (seed 002, Figure 1c) and CCT per routing scheme.

A trial fails round(fraction x cables) switch-to-switch cables chosen uniformly at random
(parallel members and every tier alike; host links stay up, as in the seed's leaf-to-spine
study). Both directions of a cable fail together. The same failure set is used for the capacity
and for every routing scheme, so schemes compare on equal terms. Trials are seeded per
(seed, fraction, trial): rerunning a study gives the same numbers.
"""

from __future__ import annotations

import random
import statistics

from fabriclab.errors import LabError
from fabriclab.model import evaluate
from fabriclab.model.maxflow import leaf_pair_capacity
from fabriclab.model.routes import Routes

PERCENTILES = (1, 5, 10, 25, 50)
CDF_POINTS = tuple(i / 20 for i in range(21))          # 0.00, 0.05, ..., 1.00


def failed_cables(graph, fraction, rng):
    if not 0 <= fraction < 1:
        raise LabError(f"failure fraction must be in [0, 1), got {fraction}")
    cables = graph.fabric_cables()
    return frozenset(rng.sample(cables, round(fraction * len(cables))))


def trial_rng(seed, fraction, trial):
    return random.Random(f"{seed}:{fraction!r}:{trial}")


def percentile(ordered, pct):
    """Nearest-rank percentile of a sorted list."""
    if not ordered:
        return None
    rank = max(1, -(-pct * len(ordered) // 100))      # ceil(pct/100 * n), at least the first
    return ordered[int(rank) - 1]


def distribution(ratios):
    """Summary of capacity ratios (one per leaf pair per trial): min, percentiles, mean, the share
    below 100 %, and the CDF at 0, 0.05, ..., 1 (the y values of seed 002 Figure 1c's curves)."""
    ordered = sorted(ratios)
    n = len(ordered)
    if not n:
        return {"samples": 0}
    cdf, i = [], 0
    for x in CDF_POINTS:
        while i < n and ordered[i] <= x + 1e-9:
            i += 1
        cdf.append([x, i / n])
    return {
        "samples": n,
        "min": ordered[0],
        **{f"p{p}": percentile(ordered, p) for p in PERCENTILES},
        "mean": statistics.fmean(ordered),
        "below_full": sum(1 for r in ordered if r < 1 - 1e-9) / n,
        "cdf": cdf,
    }


def capacity_ratios(graph, baseline, down):
    """Each leaf pair's up-down max-flow with `down` failed, over its failure-free value."""
    return [c / b if b > 0 else 0.0 for c, b in zip(leaf_pair_capacity(graph, down), baseline)]


def study(graph, fractions, trials=1, seed=0, collective=None, schemes=(), hash_seed=0, shared_basis=False):
    """Per fraction: capacity distribution over leaf pairs and trials; CCT per scheme if a
    collective (flows.Collective) is given, relative to the same scheme without failures."""
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise LabError(f"trials must be a whole number >= 1, got {trials!r}")
    baseline = leaf_pair_capacity(graph)
    clean = {}
    if collective is not None:
        routes = Routes(graph)
        clean = {s: evaluate.run(graph, routes, collective, s, hash_seed, shared_basis).cct_s for s in schemes}
    rows = []
    for fraction in fractions:
        ratios, failed, ccts = [], [], {s: [] for s in schemes}
        for trial in range(trials):
            down = failed_cables(graph, fraction, trial_rng(seed, fraction, trial))
            failed.append(len(down))
            ratios += capacity_ratios(graph, baseline, down)
            if collective is not None:
                routes = Routes(graph, down)
                for s in schemes:
                    ccts[s].append(evaluate.run(graph, routes, collective, s, hash_seed, shared_basis).cct_s)
        row = {"fraction": fraction, "trials": trials, "failed_cables": failed[0] if failed else 0,
               "capacity": distribution(ratios)}
        if collective is not None:
            row["cct"] = {s: cct_summary(values, clean[s]) for s, values in ccts.items()}
        rows.append(row)
    return {"fabric_cables": len(graph.fabric_cables()), "leaf_pairs": len(baseline),
            "no_failure_cct_s": clean, "rows": rows}


def cct_summary(values, clean):
    """Mean and worst CCT over trials, and both over the failure-free CCT of the same scheme."""
    finite = [v for v in values if v < float("inf")]
    disconnected = len(values) - len(finite)
    mean = statistics.fmean(finite) if finite else None
    worst = max(finite) if finite and not disconnected else None
    return {
        "mean_s": mean,
        "worst_s": worst,
        "slowdown_mean": mean / clean if mean and clean else None,
        "slowdown_worst": worst / clean if worst and clean else None,
        "disconnected_trials": disconnected,
    }
