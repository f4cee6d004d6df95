"""ecmp-tiers: how evenly each hashing scheme spreads all-pairs flows over the uplinks of every
tier (seed 000 section 4.1, ECMP's imbalance; apps/hashing.py, why every switch hashes from its own
basis).

All-pairs traffic at 30% load with four flows (QPs) per host pair on `ecmp_tiers` (2 zones of 2
leaves x 2 spines under 4 super-spines: two uplinks a spine): no link fills, so an uplink's rate
counts the flows hashed onto it. Per scheme (ECMP, E-ECMP, flowlet, and ECMP with one hash basis
on every switch, the misconfiguration), per tier (leaf to spine, spine to super-spine), the
uplinks' max/mean, beside the flow model's max/mean for the same flows hashed as the lab's
switches hash them (the same bases) and the band uniform random hashing of the same flows gives
(5th-95th percentile over draws). On a multiplane spec (`--spec multiplane_pfc`) the one tier is
every plane's leaf uplinks.
"""

from __future__ import annotations

import random
import statistics

from fabriclab.results import figures
from fabriclab.table import format_table
from fabriclab.workflows.experiments import label, num
from fabriclab.workflows.plan import Job, RunPlan

NAME = "ecmp-tiers"
SUMMARY = ("all-pairs flows under ECMP, E-ECMP, flowlet and ECMP with one hash basis everywhere: uplink "
           "max/mean at every tier against the flow model and uniform random hashing (seed 000 4.1)")
DEFAULT_SPEC = "ecmp_tiers"
DEFAULT_ROUTING = None       # the runs name their own routing apps
REFERENCE = {
    "source": "seed 000 section 4.1 (ECMP at DC scale)",
    "finding": ("Paper: ECMP hashes leave links unevenly loaded (max/mean about 1.2 with 1,000 flows on 16 "
                "links, worse with the few elephant flows of training), at every tier a flow crosses. "
                "Switches that share one hash seed choose alike at every tier: the second tier "
                "polarizes, which per-device seeds (as real switches use) avoid."),
}
LOAD = 0.3
FLOWS_PER_PAIR = 4
CASES = (("ECMP", "ecmp"), ("ECMP, one basis everywhere", "ecmp:shared_basis=on"), ("E-ECMP", "eecmp"),
         ("flowlet", "flowlet"))
TIERS = ("leaf", "spine")           # the tier an uplink leaves: leaf -> spine, spine -> super-spine
RANDOM_DRAWS = 2000                 # 2 s here; the 99th percentile moves by under 0.01 past it


def prepare(spec, options):
    return spec


def runs(fabric, options):
    from fabriclab.apps.choice import Routing
    from fabriclab.traffic.allpairs import AllPairsSpec

    job = Job("all-pairs", AllPairsSpec(duration_s=2.0 if options.quick else 6.0, load=LOAD,
                                        flows_per_pair=FLOWS_PER_PAIR))
    band = random_band(fabric, options.seed)
    out = []
    for name, choice in CASES:
        routing = Routing.parse(choice)
        out.append(RunPlan(name, routing, [job], tags={"scheme": name, "random": band,
                                                       "model": model_prediction(fabric, routing.with_seed(options.seed))}))
    return out


# -- what the tiers' uplinks carry ------------------------------------------------------------------
def uplinks(fabric):
    """{tier: [(from switch, to switch)]}: every up-cable of each tier that has any."""
    roles = {s.name: s.role for s in fabric.switches.values()}
    up = {"leaf": "spine", "spine": "super_spine"}
    out = {}
    for link in fabric.fabric_links:
        if roles.get(link.b) == up.get(roles.get(link.a)):
            out.setdefault(roles[link.a], []).append((link.a, link.b))
    return {tier: sorted(cables) for tier, cables in out.items()}


def tier_loads(run):
    """{tier: [Mbit/s of each uplink]} of a run, read from its all-pairs job's links."""
    rows = run["jobs"]["all-pairs"]["links"]
    by_cable = {(r["from"], r["to"]): r["mbps"] for r in rows}
    roles = run["tags"]["random"]["roles"]
    out = {}
    for (a, b), mbps in sorted(by_cable.items()):
        if roles.get(a) in TIERS and roles.get(b) == {"leaf": "spine", "spine": "super_spine"}[roles[a]]:
            out.setdefault(roles[a], []).append(mbps)
    return out


def max_mean(values):
    values = list(values)
    mean = statistics.fmean(values) if values else 0
    return max(values) / mean if mean else None


def measured(run):
    """{tier: uplink max/mean} of a run."""
    return {tier: max_mean(loads) for tier, loads in tier_loads(run).items()}


def idle_uplinks(run, below_mbps=0.05):
    """{tier: uplinks that carried (next to) nothing}: a polarized tier has some."""
    return {tier: sum(1 for v in loads if v < below_mbps) for tier, loads in tier_loads(run).items()}


# -- what random hashing of the same flows gives --------------------------------------------------------
def _flows(fabric):
    """(source leaf, destination leaf) of every all-pairs flow that leaves its leaf."""
    from fabriclab.traffic.allpairs import peers

    ports = [p for h in fabric.hosts.values() for p in h.ports]
    return [(port.leaf, dst.leaf) for port in ports for dst in peers(fabric, port) if dst.leaf != port.leaf
            for _k in range(FLOWS_PER_PAIR)]


def random_band(fabric, seed=1, draws=RANDOM_DRAWS):
    """Uniform random hashing of the all-pairs flows, each switch choosing any shortest next hop:
    per tier the 5th, 50th, 95th and 99th percentile of the uplinks' max/mean over `draws` draws
    (what a hash that behaves as random does), and the switches' roles."""
    from fabriclab.apps.paths import next_hops

    hops = next_hops(fabric)
    roles = {s.name: s.role for s in fabric.switches.values()}
    cables = uplinks(fabric)
    peer = {}
    for link in fabric.fabric_links:
        peer[(link.a, link.a_port)] = link.b
        peer[(link.b, link.b_port)] = link.a
    flows = _flows(fabric)
    rng = random.Random(seed)
    ratios = {tier: [] for tier in cables}
    for _ in range(draws):
        counts = {tier: {c: 0 for c in cs} for tier, cs in cables.items()}
        for src, dst in flows:
            here = src
            while here != dst:
                nxt = peer[(here, rng.choice(hops[here][dst]))]
                tier = roles[here]
                if tier in counts and (here, nxt) in counts[tier]:
                    counts[tier][(here, nxt)] += 1
                here = nxt
        for tier, c in counts.items():
            ratios[tier].append(max_mean(c.values()))
    band = {}
    for tier, values in ratios.items():
        values.sort()
        pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]   # noqa: E731
        band[tier] = {f"p{q}": round(pick(q / 100), 4) for q in (5, 50, 95, 99)}
    return {"tiers": band, "flows": len(flows), "roles": roles}


def model_prediction(fabric, routing):
    """{tier: max/mean} the flow model gives for the all-pairs flows under `routing` (a Routing: its
    scheme, seed and shared basis): each switch hashing as the lab's does."""
    from fabriclab.model import flows as model_flows
    from fabriclab.model import placement
    from fabriclab.model.graph import ClosGraph
    from fabriclab.model.routes import Routes

    options = routing.settings
    scheme = {"ecmp": "ecmp", "eecmp": "eecmp", "flowlet": "flowlet"}.get(routing.name)
    if scheme is None:
        return {}
    graph = ClosGraph.from_spec(fabric.spec)
    pairs = [(i, j) for i in range(graph.params.hosts) for j in range(graph.params.hosts) if i != j]
    fl = model_flows.connection_flows(graph, pairs, 1 << 20, qps=FLOWS_PER_PAIR)
    placed = placement.place(graph, Routes(graph), fl, scheme, options.get("seed", 0), options.get("shared_basis", False))
    roles = {s.name: s.role for s in fabric.switches.values()}
    counts = {}
    for route in placed.routes:
        for e, _share in route or ():
            a, b = graph.sw_name[graph.link_src[e]] if graph.link_src[e] < graph.n_switches else None, \
                graph.sw_name[graph.link_dst[e]] if graph.link_dst[e] < graph.n_switches else None
            if a and b and roles[b] == {"leaf": "spine", "spine": "super_spine"}.get(roles[a]):
                counts[(a, b)] = counts.get((a, b), 0) + 1
    return {tier: round(max_mean(counts.get(c, 0) for c in cables), 4) for tier, cables in uplinks(fabric).items()}


# -- reporting --------------------------------------------------------------------------------------
def table(doc):
    rows = []
    for run in doc["runs"]:
        got = measured(run)
        predicted = run["tags"]["model"]
        idle = idle_uplinks(run)
        for tier, value in got.items():
            band = run["tags"]["random"]["tiers"].get(tier, {})
            rows.append((label(run), f"{tier} up", len(tier_loads(run)[tier]), num(value), num(predicted.get(tier)),
                         f"{num(band.get('p5'))}-{num(band.get('p95'))}", idle[tier]))
    scale = doc["scale"]
    title = (f"uplink balance by tier on {doc['fabric']['name']}, all-pairs at {LOAD:.0%} load, "
             f"{FLOWS_PER_PAIR} flows per pair, links {scale['host_rate_mbps']:g} Mbit/s (time scale "
             f"x{scale['time_scale'] or 1:.0f}); model: the flow model hashing as the switches do; random: "
             f"5th-95th percentile of uniform random hashing")
    header = ("case", "tier", "uplinks", "max/mean", "model", "random 5-95%", "idle uplinks")
    return format_table(header, rows, title=title) + "\n" + doc["experiment"]["reference"]["finding"]


def plot(doc, folder):
    runs_ = doc["runs"]
    tiers = [t for t in TIERS if any(t in measured(r) for r in runs_)]
    figures.compare(folder / "ecmp_tiers.png", "uplink max/mean by tier (all-pairs, 4 flows a pair)",
                    [r["label"].replace(", ", "\n") for r in runs_],
                    [(f"{tier} uplinks max/mean", [measured(r).get(tier) for r in runs_]) for tier in tiers])
