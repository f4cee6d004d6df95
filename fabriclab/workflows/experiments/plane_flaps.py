"""plane-flaps: host links flapping at a mean time between failures during repeated AllReduce;
the collective's completion time against how fast the NICs take a failed plane out (seed 002
sections 6.5-6.6, Figures 13 and 14b).

A ring AllReduce over every host of a lossless four-plane fabric (`multiplane_pfc`), iteration
after iteration, while every host link fails now and then (exponential gaps of mean `MTBF_S`
per link, down for `DOWN_S`, the same draws in every case). Cases: no flaps (the baseline);
the per-plane load balancer, which takes a plane out when its own port loses carrier and a peer's
plane after a few probe timeouts; NCCL-style software balancing with a timeout of 0.1 to 1.6 s
before it gives a stalled plane up. Until a plane is out, what is sent on it is lost, and the
ring waits for the slowest hop: CCT's tail grows with the reaction time, as Figure 14b's
simulation shows (P99 CCT +20% within 10 ms, +53% at 100 ms, +260% at 300 ms, for 10 s flaps).
"""

from __future__ import annotations

import re
import statistics

from fabriclab.errors import LabError
from fabriclab.results import figures
from fabriclab.table import format_table
from fabriclab.units import human_size
from fabriclab.workflows import faults
from fabriclab.workflows.experiments import label
from fabriclab.workflows.plan import Job, RunPlan

NAME = "plane-flaps"
SUMMARY = ("host links flap at an MTBF during repeated ring AllReduce: CCT against the plane load "
           "balancer's reaction time, per-plane and NCCL-style software (seed 002 6.5-6.6, Fig. 13-14b)")
DEFAULT_SPEC = "multiplane_pfc"
DEFAULT_ROUTING = "ar"
REFERENCE = {
    "source": "seed 002 sections 6.5-6.6, Figures 13 and 14b",
    "finding": ("Paper: with SPX a host link flap costs under 5% of a training step and steps return to "
                "baseline when the link does; in simulation P99 CCT grows 20% while convergence stays "
                "within 10 ms, 53% at 100 ms and 260% at 300 ms (10 s flaps)."),
}
AGGREGATE_FLAPS_PER_S = 1.0          # across every host link
DOWN_S = 0.4
SOFTWARE_TIMEOUTS = (0.1, 0.4, 1.6)
_DOWN = re.compile(r"^(h\d+)-p(\d+)l\d+ down$")


def prepare(spec, options):
    if spec.planes < 2:
        raise LabError(f"plane-flaps needs a multiplane spec; {spec.name!r} has one plane")
    return spec


def host_links(fabric):
    return [link.label for link in fabric.links if link.kind == "host"]


def cases(options):
    """(label, plb mode, software timeout, flaps)."""
    timeouts = (0.4,) if options.quick else SOFTWARE_TIMEOUTS
    return ([("no flaps", "per-plane", None, False), ("per-plane", "per-plane", None, True)]
            + [(f"software, {t:g} s", "software", t, True) for t in timeouts])


def runs(fabric, options):
    from fabriclab.traffic.collective import CollectiveSpec

    links = host_links(fabric)
    flaps = faults.Fault(0, "random_flaps", links, 0.0,
                         {"mtbf": len(links) / AGGREGATE_FLAPS_PER_S, "duration": DOWN_S,
                          "until": 600.0, "seed": options.seed})
    size = (1 << 20) if options.quick else (2 << 20)
    iterations = 6 if options.quick else 16
    hosts = tuple(sorted(fabric.hosts, key=lambda h: fabric.hosts[h].index))
    out = []
    for name, mode, sw_timeout, flapping in cases(options):
        ring = CollectiveSpec("allreduce", sizes=(size,), hosts=hosts, plb=mode, iterations=iterations,
                              warmup=1, sw_timeout_s=sw_timeout, seed=options.seed, timeout_factor=100.0)
        out.append(RunPlan(name, options.routing, [Job("ring", ring)], faults=[flaps] if flapping else [],
                           tags={"plb": mode, "sw_timeout_s": sw_timeout, "flaps": flapping}))
    return out


# -- reading the document ---------------------------------------------------------------------------
def downs(run):
    """[(unix time, host, plane)] of every host link that went down during the run."""
    out = []
    for fault in run["faults"]:
        for event in fault["events"]:
            m = _DOWN.match(event["event"])
            if m and not event["undo"]:
                out.append((run["origin_unix"] + event["t_s"], m.group(1), int(m.group(2))))
    return out


def reactions(run):
    """Seconds from a host link going down to each NIC's removal of that plane (its own or a
    peer's), for the removals that follow a down of their plane."""
    went = downs(run)
    out = []
    for record in (run["jobs"]["ring"].get("plb") or {}).get("ranks", {}).values():
        for event in (record or {}).get("events", ()):
            if event["event"] != "removed":
                continue
            before = [t for t, _host, plane in went if plane == event["plane"] and t <= event["t"]]
            if before:
                out.append(event["t"] - max(before))
    return out


def table(doc):
    runs_ = doc["runs"]
    base = next((r for r in runs_ if not r["tags"]["flaps"]), None)
    base_p50 = base["jobs"]["ring"]["sizes"][0]["cct_ms"]["p50"] if base else None
    rows = []
    for run in runs_:
        row = run["jobs"]["ring"]["sizes"][0]
        cct = row["cct_ms"]
        react = reactions(run)
        rows.append((label(run), len(downs(run)), f"{statistics.median(react):.3f}" if react else "-",
                     f"{cct['p50']:.0f}", f"{cct['p99']:.0f}", f"{cct['max']:.0f}",
                     f"{cct['p99'] / base_p50:.2f}" if base_p50 else "-", f"{row['busbw_mbps']:.2f}",
                     row["counters"].get("retransmitted_packets", 0), row["counters"].get("local_ack_timeout_err", 0)))
    first = runs_[0]["jobs"]["ring"]["sizes"][0]
    scale = doc["scale"]
    title = (f"ring AllReduce {human_size(first['size'])} x {len(first['cct_ms']['all'])} iterations over "
             f"{first['ranks']} hosts of {doc['fabric']['name']}; host links flap {AGGREGATE_FLAPS_PER_S:g}/s "
             f"in all, down {DOWN_S:g} s each; time scale x{scale['time_scale'] or 1:.0f}")
    header = ("case", "flaps", "reaction s (median)", "CCT p50 ms", "p99", "max", "p99 / no-flap p50",
              "busbw Mbit/s", "retrans", "ACK timeouts")
    return format_table(header, rows, title=title) + "\n" + doc["experiment"]["reference"]["finding"]


def plot(doc, folder):
    runs_ = doc["runs"]
    figures.compare(folder / "plane_flaps.png", "ring AllReduce under host link flaps", [r["label"] for r in runs_], [
        ("CCT p99 (ms)", [r["jobs"]["ring"]["sizes"][0]["cct_ms"]["p99"] for r in runs_]),
        ("CCT p50 (ms)", [r["jobs"]["ring"]["sizes"][0]["cct_ms"]["p50"] for r in runs_]),
    ])
