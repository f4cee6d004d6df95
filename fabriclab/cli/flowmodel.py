"""`fabriclab model fabric|failures|benchmark`: the flow-level fabric model from the command line.

No network is built: a spec (the same YAML files the emulation builds) becomes a ClosGraph, a
collective becomes flows, a routing scheme places them, and max-min fair rates give each step's
time. Results documents are kind "model" and record the spec's link rates, buffers and time
scale, like the emulation's results.json, so the two can be read side by side.
"""

from __future__ import annotations

import json
import math
import pathlib
import platform
import sys
import time

from fabriclab import __version__
from fabriclab.errors import LabError
from fabriclab.model import flows
from fabriclab.workflows.benchmark import parse_fabric_sizes
from fabriclab.units import parse_sizes
from fabriclab.table import format_table
from fabriclab.topologies.spec import load_spec, parse_rate_mbps
from fabriclab.loading import excerpt

# The model's solvers (numpy, scipy) are imported by the commands that use them, not here: every
# `fabriclab` command builds this parser, and scipy's import alone took 18 s of a 27 s command in
# the full-kernel guest (software-emulated).
DEFAULT_SIZE = "64M"
MAX_LINK_ROWS = 2048


def register(sub):
    q = sub.add_parser("fabric", help="flow model: rates, CCT and link balance of a collective on a spec")
    _fabric_args(q)
    _workload_args(q)
    q.add_argument("--routing", default=None,
                   help="comma-separated schemes (default: every scheme of the model; optimal is left out, "
                        "with a note, when its LP is past its size limit)")
    q.add_argument("--links", type=int, default=0, metavar="N",
                   help="also print the N busiest fabric links of each scheme")
    _output_args(q)
    q.set_defaults(func=cmd_fabric)

    q = sub.add_parser("failures", help="flow model: leaf-pair max-flow and CCT under random link failures")
    _fabric_args(q)
    q.add_argument("--fraction", default="0.01,0.05", help="comma-separated failed shares of fabric cables")
    q.add_argument("--trials", type=int, default=10, help="random failure sets per fraction (default 10)")
    q.add_argument("--seed", type=int, default=0, help="seed of the failure sets and the shuffled ring")
    _workload_args(q, default_collective="alltoall", allow_none=True, seed=False)
    q.add_argument("--routing", default="ecmp,eecmp,te,ideal", help="comma-separated schemes for the CCT")
    _output_args(q)
    q.set_defaults(func=cmd_failures)

    q = sub.add_parser("benchmark", help="flow model: time and memory against fabric size (up to 256K endpoints)")
    q.add_argument("--sizes", help="LEAVESxSPINESxHOSTS_PER_LEAF list (default: five sizes from 8x4x4 to "
                                   "2048x128x128, model/bench.py)")
    q.add_argument("--routing", help="comma-separated schemes (default: ecmp, te and ideal, model/bench.py)")
    _output_args(q)
    q.set_defaults(func=cmd_benchmark)


def _fabric_args(q):
    q.add_argument("spec", metavar="SPEC", help="spec name (topologies/*.yaml) or YAML path")
    q.add_argument("--pods", type=int, help="3-tier: pods of the spec's leaves and spines (needs --superspines)")
    q.add_argument("--superspines", type=int, help="3-tier: super-spines per spine group")
    q.add_argument("--core-rate", dest="core_rate", help="spine-superspine link rate (default: fabric_rate)")
    q.add_argument("--leaves", type=int, help="override the spec's leaves (per pod, per plane)")
    q.add_argument("--spines", type=int, help="override the spec's spines (per pod, per plane)")
    q.add_argument("--hosts-per-leaf", dest="hosts_per_leaf", type=int, help="override hosts_per_leaf")


def _workload_args(q, default_collective="allreduce", allow_none=False, seed=True):
    choices = list(flows.COLLECTIVES) + (["none"] if allow_none else [])
    q.add_argument("--collective", default=default_collective, choices=choices)
    q.add_argument("--size", default=DEFAULT_SIZE, help=f"message size, e.g. 1M, 64M, 1G (default {DEFAULT_SIZE})")
    q.add_argument("--qps", type=int, default=1, help="QPs per connection (default 1)")
    q.add_argument("--sport-mode", dest="sport_mode", choices=flows.SPORT_MODES, default="qp",
                   help="UDP source port from the QP pair (qp) or one per NIC pair (shared)")
    q.add_argument("--order", choices=flows.ORDERS, default="linear", help="ring order of the ranks")
    if seed:
        q.add_argument("--seed", type=int, default=0, help="seed of the shuffled ring")
    q.add_argument("--hash-seed", dest="hash_seed", type=int, default=0,
                   help="the run's hash seed: with each switch's dpid, its hash basis (as the emulation's)")
    q.add_argument("--shared-basis", dest="shared_basis", action="store_true",
                   help="every switch hashes from one basis: the misconfiguration that polarizes each tier")
    q.add_argument("--max-flows", dest="max_flows", type=int, default=flows.DEFAULT_MAX_FLOWS,
                   help=f"refuse workloads with more flows (default {flows.DEFAULT_MAX_FLOWS})")


def _output_args(q):
    q.add_argument("--format", choices=("table", "json"), default="table")
    q.add_argument("--out", help="also write results.json into this folder")


# -- inputs -----------------------------------------------------------------------------------------

def build_graph(args):
    from fabriclab.model.graph import ClosGraph

    spec = load_spec(args.spec)
    core = None
    if args.core_rate is not None:
        core = parse_rate_mbps(args.core_rate, "--core-rate")
    overrides = {"pods": args.pods, "superspines": args.superspines, "core_rate_mbps": core,
                 "leaves": args.leaves, "spines": args.spines, "hosts_per_leaf": args.hosts_per_leaf}
    return ClosGraph.from_spec(spec, **overrides)


def overrides_of(args):
    """What the command line changed from the spec (recorded next to the spec in results)."""
    names = ("pods", "superspines", "core_rate", "leaves", "spines", "hosts_per_leaf")
    return {n: getattr(args, n) for n in names if getattr(args, n) is not None}


def one_size(text):
    sizes = parse_sizes(text)
    if len(sizes) != 1:
        raise LabError(f"--size takes one message size, got {excerpt(text)}")
    return sizes[0]


def parse_fractions(text):
    out = []
    for item in text.split(","):
        try:
            value = float(item)
        except ValueError:
            raise LabError(f"bad failure fraction {excerpt(item)}: expected numbers in [0, 1), e.g. 0.01,0.05") from None
        if not 0 <= value < 1:
            raise LabError(f"failure fraction must be in [0, 1), got {excerpt(item.strip())}")
        out.append(value)
    return out


def collective_of(graph, args):
    return flows.build(graph, args.collective, one_size(args.size), args.qps, args.sport_mode,
                       args.order, args.seed, args.max_flows)


# -- results ------------------------------------------------------------------------------------------

def result_doc(graph, what, overrides=None, **body):
    """The common head of every flow-model results document (cf. fabriclab/results.py)."""
    spec, p = graph.spec, graph.params
    scale = spec.time_scale if spec else None
    return {
        "fabriclab": __version__,
        "kind": "model",
        "model": what,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"python": platform.python_version()},
        "scale": {
            "host_rate_mbps": p.host_rate_mbps,
            "fabric_rate_mbps": p.fabric_rate_mbps,
            "core_rate_mbps": p.core_rate if p.tiers == 3 else None,
            "mtu": spec.mtu if spec else None,
            "buffers_bytes": spec.to_dict()["buffers"] if spec else None,
            "real_host_rate_mbps": spec.real_host_rate_mbps if spec else None,
            "time_scale": scale,
            "note": "flow model at the spec's (emulated) link rates; divide times by time_scale "
                    "for the real hardware; buffers are recorded but a fluid model has no queues",
        },
        "spec": spec.to_dict() if spec else None,
        "overrides": overrides or {},
        "fabric": graph.summary(),
        **body,
    }


def emit(doc, args, text):
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(_plain(doc), indent=1))
        _plot(doc, out)
    if args.format == "json":
        print(json.dumps(_plain(doc), indent=1))
    else:
        print(text)
    return 0


def _plot(doc, out):
    """The chart of a results document, next to it (benchmarks have none)."""
    from fabriclab.results import plots

    name = doc["fabric"].get("name", "") if isinstance(doc.get("fabric"), dict) else ""
    if doc["model"] == "fabric":
        rows = doc["results"]
        cct = [r["cct_s"] if r["cct_s"] is not None and math.isfinite(r["cct_s"]) else None
               for r in rows]
        plots.bars(out / "plot.png", f"{doc['workload']['collective']} on {name}: flow model",
                   [r["routing"] for r in rows],
                   [("CCT (s)", cct), ("uplink max/mean", [r["balance"]["up"]["max_mean"] for r in rows])])
    elif doc["model"] == "failures":
        plots.cdfs(out / "plot.png", f"leaf-pair capacity under random link failures, {name}",
                   {f"{100 * r['fraction']:g} % failed": r["capacity"]["cdf"] for r in doc["rows"]},
                   "share of the failure-free max-flow")


def _plain(value):
    """JSON has no infinity: an unreachable flow's time is written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# -- fabric ---------------------------------------------------------------------------------------------

def cmd_fabric(args):
    if args.links < 0:
        raise LabError(f"--links must be >= 0, got {args.links}")
    from fabriclab.model import bench, evaluate, placement
    from fabriclab.model.routes import Routes

    schemes = bench.parse_schemes(args.routing or ",".join(placement.SCHEMES))
    graph = build_graph(args)
    collective = collective_of(graph, args)
    routes = Routes(graph)
    nic_mbps = graph.params.host_rate_mbps * graph.params.rails
    scale = graph.spec.time_scale if graph.spec else None
    results, tables, notes = [], [], []
    for scheme in schemes:
        try:
            outcome = evaluate.run(graph, routes, collective, scheme, args.hash_seed, args.shared_basis)
        except LabError as err:
            if scheme != "optimal" or args.routing:
                raise
            notes.append(f"optimal left out: {err}")     # asked for by default only: say why
            continue
        bal = evaluate.balance(graph, routes, outcome.loads)
        busbw_mbps = outcome.busbw_Bps * 8 / 1e6
        rows = evaluate.link_rows(graph, outcome.loads)
        results.append({
            "routing": scheme,
            "cct_s": outcome.cct_s,                 # inf (null in JSON) if a flow has no path
            "cct_real_s": outcome.cct_s / scale if scale else None,
            "algbw_mbps": outcome.algbw_Bps * 8 / 1e6,
            "busbw_mbps": busbw_mbps,
            "busbw_real_gbps": busbw_mbps * scale / 1e3 if scale else None,
            "busbw_share_of_nic": busbw_mbps / nic_mbps,
            "unroutable_flows": outcome.unroutable,
            "unsatisfied_flows": outcome.unsatisfied,
            "steps": outcome.steps,
            "balance": bal,
            "lp_max_utilization": outcome.bound,
            "links": rows if graph.n_cables <= MAX_LINK_ROWS else rows[:100],
        })
        if args.links:
            tables.append(format_table(
                ("link", "direction", "Mbit/s", "util %"),
                [(r["link"], f"{r['from']}->{r['to']}", f"{r['mbps']:.2f}", f"{100 * r['utilization']:.1f}")
                 for r in rows[:args.links]], title=f"Busiest fabric links, {scheme}"))
    workload = {"collective": collective.name, "size": collective.size, "ranks": collective.ranks,
                "qps": args.qps, "sport_mode": args.sport_mode, "order": args.order, "seed": args.seed,
                "hash_seed": args.hash_seed, "shared_basis": args.shared_basis,
                "flows_per_step": len(collective.steps[0].flows),
                "rails": graph.params.rails}
    by = {r["routing"]: r for r in results}
    versus = None
    if "te" in by and "optimal" in by:
        te, best = by["te"]["cct_s"], by["optimal"]["cct_s"]
        versus = {"te_cct_over_optimal": te / best if 0 < best < math.inf and te < math.inf else None,
                  "optimal_max_utilization": by["optimal"]["lp_max_utilization"]}
        if versus["te_cct_over_optimal"] is not None:
            notes.append(f"TE's CCT is {versus['te_cct_over_optimal']:.3f} x the optimal placement's "
                         f"(LP: max fabric-link utilisation {versus['optimal_max_utilization']:.3f} at the demands)")
    doc = result_doc(graph, "fabric", overrides_of(args), workload=workload, results=results,
                     te_vs_optimal=versus, notes=notes)
    ring = f", {args.order} ring" if collective.name == "allreduce" else ""
    title = (f"{collective.name} {args.size} on {graph.params.name} ({graph.params.tiers}-tier, "
             f"{collective.ranks} hosts x {graph.params.rails} rail(s), {args.qps} QP(s) per connection, "
             f"sport {args.sport_mode}{ring}): flow model at {graph.params.host_rate_mbps:g} Mbit/s host links"
             + (f", time scale x{scale:.0f}" if scale else ""))
    header = ("routing", "CCT s", "busbw Mbit/s", "busbw % NIC", "min rate Mbit/s", "up max/mean",
              "down max/mean", "max util %", "unrouted", "TE unmet")
    table = format_table(header, [(
        r["routing"], _cell(r["cct_s"], 4), _cell(r["busbw_mbps"], 3), _cell(100 * r["busbw_share_of_nic"], 1),
        _cell(min(s["rates_mbps"].get("min", 0.0) for s in r["steps"]), 3),
        _cell(r["balance"]["up"]["max_mean"], 2), _cell(r["balance"]["down"]["max_mean"], 2),
        _cell(100 * max(r["balance"]["up"]["max_utilization"], r["balance"]["down"]["max_utilization"]), 1),
        r["unroutable_flows"], r["unsatisfied_flows"]) for r in results], title=title)
    return emit(doc, args, "\n\n".join([table + "".join(f"\n{n}" for n in notes), *tables]))


def _cell(value, digits):
    """A number with `digits` decimals; None (printed '-', aligned as a number) when missing."""
    return None if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


# -- failures -----------------------------------------------------------------------------------------

def cmd_failures(args):
    from fabriclab.model import bench, failures

    fractions = parse_fractions(args.fraction)
    schemes = bench.parse_schemes(args.routing)
    if args.trials < 1:
        raise LabError(f"--trials must be >= 1, got {args.trials}")
    graph = build_graph(args)
    collective = None if args.collective == "none" else collective_of(graph, args)
    found = failures.study(graph, fractions, args.trials, args.seed, collective,
                           schemes if collective else (), args.hash_seed, args.shared_basis)
    workload = None if collective is None else {
        "collective": collective.name, "size": collective.size, "ranks": collective.ranks, "qps": args.qps,
        "sport_mode": args.sport_mode, "order": args.order, "hash_seed": args.hash_seed,
        "shared_basis": args.shared_basis}
    doc = result_doc(graph, "failures", overrides_of(args), seed=args.seed, workload=workload, **found)
    title = (f"Leaf-pair max-flow under random fabric link failures, {graph.params.name} "
             f"({found['fabric_cables']} fabric cables, {found['leaf_pairs']} leaf pairs x {args.trials} trial(s), "
             f"seed {args.seed}): "
             f"share of the failure-free capacity")
    cap_rows = []
    for row in found["rows"]:
        c = row["capacity"]
        cap_rows.append((f"{100 * row['fraction']:g} %", row["failed_cables"], c["samples"],
                         *(f"{100 * c[k]:.1f}" for k in ("min", "p1", "p5", "p10", "p50", "mean")),
                         f"{100 * c['below_full']:.1f}"))
    text = [format_table(("failed", "cables", "pair samples", "min %", "p1 %", "p5 %", "p10 %", "p50 %", "mean %",
                          "pairs < 100 %"), cap_rows, title=title)]
    if collective is not None:
        cct_rows = []
        for row in found["rows"]:
            for s in schemes:
                c = row["cct"][s]
                cct_rows.append((f"{100 * row['fraction']:g} %", s,
                                 _cell(found["no_failure_cct_s"][s], 4), _cell(c["mean_s"], 4),
                                 _cell(c["worst_s"], 4), _cell(c["slowdown_mean"], 3),
                                 _cell(c["slowdown_worst"], 3), c["disconnected_trials"]))
        text.append(format_table(("failed", "routing", "no-failure CCT s", "mean CCT s", "worst CCT s",
                                  "mean slowdown", "worst slowdown", "disconnected"), cct_rows,
                                 title=f"{collective.name} {args.size} CCT under the same failures"))
    return emit(doc, args, "\n\n".join(text))


# -- benchmark ------------------------------------------------------------------------------------------

def cmd_benchmark(args):
    from fabriclab.model import bench

    sizes = parse_fabric_sizes(args.sizes or bench.DEFAULT_SIZES)
    schemes = bench.parse_schemes(args.routing or bench.DEFAULT_SCHEMES)
    rows = []
    for leaves, spines, hosts in sizes:
        row = bench.run_size_alone(leaves, spines, hosts, schemes)
        rows.append(row)
        if args.format == "table":
            print(f"  {leaves}x{spines}x{hosts}: {row['total_s']:.1f} s, {row['peak_rss_mb']:.0f} MB",
                  file=sys.stderr, flush=True)
    doc = {"fabriclab": __version__, "kind": "model", "model": "benchmark",
           "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "machine": {"python": platform.python_version(), "processor": platform.machine()},
           "workload": "ring allreduce 64M, shuffled ranks, 1 QP; 1% failure trial", "rows": rows}
    header = ("endpoints", "LxSxH", "switches", "flows", "leaf pairs", "build s", "routes s",
              *(f"{s} s" for s in schemes), "max-flow s", "1% fail s", "total s", "peak MB")
    table = format_table(header, [(
        r["endpoints"], f"{r['leaves']}x{r['spines']}x{r['hosts_per_leaf']}", r["switches"], r["flows"],
        r["leaf_pairs"], f"{r['build_s']:.2f}", f"{r['routes_s']:.2f}", *(f"{r[f'{s}_s']:.2f}" for s in schemes),
        f"{r['maxflow_s']:.2f}", f"{r['failure_trial_s']:.2f}", f"{r['total_s']:.1f}",
        f"{r['peak_rss_mb']:.0f}") for r in rows],
        title="Flow model time and peak memory against fabric size (one core; each size in its own process)")
    return emit(doc, args, table)
