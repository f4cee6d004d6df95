"""plane-convergence: how large a message the per-plane load balancer needs to learn an
asymmetric fabric (seed 002 section 6.7, Figure 15c).

The multiplane-asymmetry setup (Figure 16 testbed, AR in the switches, noise that never stops,
P2/L2 and P3/L3 at a quarter of their uplinks) with per-plane NICs only, over a sweep of message
sizes. Every burst starts with fresh CC contexts, because the destination was silent between
bursts and the NIC let its state go; until the contexts of the degraded planes have been cut,
a quarter of the packets take the slow planes and the burst waits for them. The ratio of a
size's asymmetric to its symmetric busbw therefore rises with the size, towards the converged
value once the learning is a small part of the burst.
"""

from __future__ import annotations

from fabriclab.results import plots
from fabriclab.table import format_table
from fabriclab.units import human_size
from fabriclab.workflows.experiments import multiplane as mp
from fabriclab.workflows.experiments import multiplane_asymmetry as asym
from fabriclab.workflows.plan import Job, RunPlan

NAME = "plane-convergence"
SUMMARY = ("per-plane load balancing's asymmetric/symmetric busbw against message size, one-to-many "
           "and AlltoAll beside noise (seed 002 6.7, Fig. 15c)")
DEFAULT_SPEC = "spectrumx_fig16"
DEFAULT_ROUTING = "ar"
CC_OPTION = True          # --cc spx: SPX CC in the NICs, "ar" ECN marking in the switches
REFERENCE = {
    "source": "seed 002 section 6.7, Figure 15c",
    "finding": ("Paper: below about 4 MB the PLB has not gathered enough per-plane congestion signals, "
                "normalized bandwidth as low as 0.85 (one-to-many) and 0.75 (AlltoAll); past about 32 MB "
                "(335 us at line rate) it converges, above 0.97 and 0.90. The lab's bytes are the "
                "paper's bytes: a time scale stretches time and divides rates, so a lab message of "
                "N MiB stands for N MiB."),
}


def prepare(spec, options):
    return asym.prepare(spec, options)          # the same testbed, and the same quick rates


def sizes_for(options):
    return (1 << 20, 4 << 20) if options.quick else (256 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20)


def runs(fabric, options):
    workloads = ("one-to-many",) if options.quick else tuple(asym.WORKLOADS)
    asymmetry = mp.degraded_uplinks(fabric)
    out = []
    for workload in workloads:
        for condition in asym.CONDITIONS:
            jobs = [Job("noise", asym.noise_job(fabric, workload, options), "noise"),
                    Job("main", asym.main_job(fabric, workload, sizes_for(options), "per-plane", options))]
            out.append(RunPlan(f"{workload}, {condition}", options.routing, jobs,
                               conditions=asymmetry if condition == "asymmetric" else [],
                               tags={"workload": workload, "condition": condition, "plb": "per-plane",
                                     "cc": options.cc}))
    return out


def ratios(doc):
    """{workload: [(size, symmetric busbw, asymmetric busbw, ratio)]}."""
    by = {(r["tags"]["workload"], r["tags"]["condition"]): r for r in doc["runs"]}
    out = {}
    for (workload, condition), run in by.items():
        if condition != "symmetric":
            continue
        rows = zip(mp.size_rows(run, "main"), mp.size_rows(by[(workload, "asymmetric")], "main"))
        out[workload] = [(s["size"], s["busbw_mbps"], a["busbw_mbps"],
                          a["busbw_mbps"] / s["busbw_mbps"] if s["busbw_mbps"] else None) for s, a in rows]
    return out


def table(doc):
    rows = [(workload, human_size(size), f"{sym:.2f}", f"{asy:.2f}", "-" if ratio is None else f"{ratio:.2f}")
            for workload, series in ratios(doc).items() for size, sym, asy, ratio in series]
    scale = doc["scale"]
    cc = doc["runs"][0]["tags"].get("cc", "dcqcn")
    title = (f"per-plane PLB on {doc['fabric']['name']}, plane ports {scale['host_rate_mbps']:g} Mbit/s "
             f"(time scale x{scale['time_scale'] or 1:.0f}), NIC CC {cc}; normalized: asymmetric / "
             f"symmetric busbw")
    return (format_table(("workload", "size", "symmetric busbw", "asymmetric busbw", "normalized"), rows,
                         title=title) + "\n" + doc["experiment"]["reference"]["finding"])


def plot(doc, folder):
    by_workload = ratios(doc)
    sizes = [size for size, *_ in next(iter(by_workload.values()))]
    plots.lines(folder / "plane_convergence.png", "per-plane PLB: asymmetric / symmetric busbw", sizes,
                {workload: [r for *_, r in rows] for workload, rows in by_workload.items()},
                "message size (bytes)", "normalized busbw", reference=(1.0, "symmetric"))
