"""ecmp-balance: how evenly ECMP's hash spreads many equal flows over a leaf's uplinks (seed 000
section 4.1: a max/mean of about 1.2 with 1,000 flows on 16 links, far worse with few).

All-pairs traffic on the routing-schemes fabric (4 leaves x 4 uplinks, 16 hosts): every host streams
to every other at half its link rate, split evenly over its flows, so the uplinks are never full and
an uplink's rate counts the flows hashed onto it. Two cases: one flow per host pair (192 flows cross
leaves, 12 per uplink on average) and five (960, close to the paper's 1,000 on 16 links). Beside
each, the max/mean that hashing uniformly at random gives for the same flows and uplinks (the mean
over many draws): a hash that behaves as random should land near it.
"""

from __future__ import annotations

import random
import statistics

from fabriclab.results import figures
from fabriclab.table import format_table
from fabriclab.workflows.experiments import label, num
from fabriclab.workflows.plan import Job, RunPlan

NAME = "ecmp-balance"
SUMMARY = ("all-pairs traffic with 1 and 5 flows per host pair under ECMP: uplink max/mean against "
           "uniform random hashing of the same flows (seed 000 4.1)")
DEFAULT_SPEC = "routing"
REFERENCE = {
    "source": "seed 000 section 4.1 (ECMP)",
    "finding": "Paper: with 1,000 flows hashed onto 16 links the max/mean link load is about 1.2; "
               "with the few elephant flows of training it is far worse.",
    "max_mean_1000_flows": 1.2,
}
FLOWS_PER_PAIR = (1, 5)
LOAD = 0.5


def prepare(spec, options):
    return spec


def runs(fabric, options):
    from fabriclab.traffic.allpairs import AllPairsSpec

    duration = 2.0 if options.quick else 6.0
    out = []
    for n in FLOWS_PER_PAIR:
        groups = uplink_groups(fabric, n)
        tags = {"flows_per_pair": n, "crossing_flows": sum(f for f, _ in groups),
                "uplinks": sum(u for _, u in groups),
                "random_max_mean": round(expected_max_mean(groups, seed=options.seed), 4)}
        out.append(RunPlan(f"ECMP, {n} flow{'s' if n > 1 else ''} per pair", options.routing,
                           [Job("all-pairs", AllPairsSpec(duration_s=duration, load=LOAD, flows_per_pair=n))],
                           tags=tags))
    return out


def uplink_groups(fabric, flows_per_pair):
    """[(flows, uplinks)] per leaf: the all-pairs flows that leave the leaf (each host port sends
    to the same NIC and plane of every other host: traffic.allpairs.peers) and the uplinks they
    hash over. Counted per port, so every NIC's leaf counts, under rail cabling and in every plane."""
    from fabriclab.traffic.allpairs import peers

    ports = [p for host in fabric.hosts.values() for p in host.ports]
    groups = []
    for leaf in sorted(s for s, sw in fabric.switches.items() if sw.role == "leaf"):
        leaving = sum(1 for port in ports if port.leaf == leaf
                      for dst in peers(fabric, port) if dst.leaf != leaf)
        uplinks = sum(1 for link in fabric.links if link.kind == "fabric" and link.a == leaf)
        groups.append((leaving * flows_per_pair, uplinks))
    return groups


def expected_max_mean(groups, trials=400, seed=1):
    """The mean, over `trials` draws, of the max/mean link load when each group's flows pick one of
    its uplinks uniformly at random (the same rate per flow)."""
    rng = random.Random(seed)
    total_flows = sum(f for f, _ in groups)
    total_links = sum(n for _, n in groups)
    mean = total_flows / total_links
    ratios = []
    for _ in range(trials):
        worst = 0
        for flows, links in groups:
            counts = [0] * links
            for _ in range(flows):
                counts[rng.randrange(links)] += 1
            worst = max(worst, max(counts))
        ratios.append(worst / mean)
    return statistics.fmean(ratios)


def uplink_ratio(run):
    return run["jobs"]["all-pairs"]["balance"]["up"].get("max_mean_ratio")


def table(doc):
    rows = []
    for run in doc["runs"]:
        up = run["jobs"]["all-pairs"]["balance"]["up"]
        rows.append((label(run), run["tags"]["crossing_flows"], run["tags"]["uplinks"],
                     num(up.get("max_mean_ratio")), num(run["tags"]["random_max_mean"]),
                     f"{up.get('min_mbps', 0):.2f}-{up.get('max_mbps', 0):.2f}"))
    scale = doc["scale"]
    title = (f"ECMP uplink balance on {doc['fabric']['name']}, all-pairs at {LOAD:.0%} load, links "
             f"{scale['host_rate_mbps']:g} Mbit/s (time scale x{scale['time_scale'] or 1:.0f})")
    header = ("case", "flows crossing leaves", "uplinks", "uplink max/mean", "random hashing",
              "uplink min-max Mbit/s")
    return format_table(header, rows, title=title) + "\n" + doc["experiment"]["reference"]["finding"]


def plot(doc, folder):
    runs_ = doc["runs"]
    figures.compare(folder / "ecmp_balance.png", "ECMP uplink balance by flow count", [r["label"] for r in runs_], [
        ("uplink max/mean", [uplink_ratio(r) for r in runs_]),
        ("random hashing max/mean", [r["tags"]["random_max_mean"] for r in runs_]),
    ])
