"""esr: four AlltoAlls at once, on the plane load balancer with per-plane CC and adaptive routing
in the switches, against entropy source routing (seed 002 section 6.7, Figure 15d).

With ESR the NIC owns the whole path: each destination has a set of entropy values (UDP source
ports), each naming a plane and, through the switches' ECMP hash, a path inside it; one CC
context covers them all, and a CNP both cuts that rate and moves the marked entropy elsewhere.
Congestion control and load balancing then react to the same marks at once. With the PLB the
switches balance inside each plane packet by packet (AR) and the NIC's per-plane contexts only
pick planes. Concurrent AlltoAlls of `HOSTS_PER_JOB` hosts under different leaves share the
fabric; the throughput over time is read from the NICs' own timelines. The paper ran four jobs;
the lab runs two: four planes triple every packet's switch hops, and three pairs of NICs at line
rate already drove Open vSwitch's forwarding thread past 90% (a run the lab marks not valid).
"""

from __future__ import annotations

import statistics

from fabriclab.errors import LabError
from fabriclab.results import plots
from fabriclab.table import format_table
from fabriclab.units import human_size
from fabriclab.workflows.experiments import label
from fabriclab.workflows.experiments import multiplane as mp
from fabriclab.workflows.plan import Job, RunPlan

NAME = "esr"
SUMMARY = ("four concurrent AlltoAlls: the per-plane PLB with AR in the switches against entropy "
           "source routing over ECMP (seed 002 6.7, Fig. 15d)")
DEFAULT_SPEC = "spectrumx_fig16"
DEFAULT_ROUTING = None        # each case names its own: AR under the PLB, ECMP under ESR
REFERENCE = {
    "source": "seed 002 section 6.7, Figure 15d",
    "finding": ("Paper: four concurrent All2All over 32 nodes: SPX scales smoothly to about 92 GB/s; ESR "
                "oscillates between 55 and 80 GB/s above 256 MB, its CC and load balancing entangled."),
}
HOSTS_PER_JOB = 2
CASES = (("PLB + AR", "per-plane", "ar"), ("ESR + ECMP", "esr", "ecmp"))
BIN_S = 0.1


def prepare(spec, options):
    return spec


def jobs_for(_options):
    return 2


def job_hosts(fabric, jobs):
    """`jobs` disjoint host sets, each with its hosts under different leaves (so every AlltoAll
    crosses the spines): job j takes the j-th host under each of the first HOSTS_PER_JOB leaves."""
    by_leaf = mp.leaf_hosts(fabric)
    leaves = sorted(by_leaf)[:HOSTS_PER_JOB]
    if len(leaves) < HOSTS_PER_JOB or any(len(by_leaf[k]) < jobs for k in leaves):
        raise LabError(f"esr needs {jobs} hosts under each of {HOSTS_PER_JOB} leaves; {fabric.spec.name!r} "
                       f"has {', '.join(str(len(by_leaf[k])) for k in sorted(by_leaf))}")
    return [tuple(by_leaf[k][j] for k in leaves) for j in range(jobs)]


def runs(fabric, options):
    from fabriclab.traffic.collective import CollectiveSpec

    if fabric.spec.planes < 2:
        raise LabError(f"esr needs a multiplane spec; {fabric.spec.name!r} has one plane")
    size = (4 << 20) if options.quick else (16 << 20)
    iterations = 2 if options.quick else 3
    out = []
    for name, mode, routing in CASES:
        jobs = [Job(f"a2a{j + 1}", CollectiveSpec("alltoall", sizes=(size,), hosts=hosts, plb=mode,
                                                  iterations=iterations, warmup=0, seed=options.seed + j))
                for j, hosts in enumerate(job_hosts(fabric, jobs_for(options)))]
        out.append(RunPlan(name, routing, jobs, tags={"plb": mode}))
    return out


# -- reading the document ---------------------------------------------------------------------------
def throughput(run, bin_s=BIN_S):
    """(bin times from the run's first sample, {job: [Mbit/s]}): what each job's NICs had
    acknowledged, summed over its ranks, on one grid of `bin_s` bins."""
    from fabriclab.traffic import plb

    series = {}
    for name, job in run["jobs"].items():
        for record in (job.get("plb") or {}).get("ranks", {}).values():
            timeline = (record or {}).get("timeline")
            if timeline:
                ts, mbps = plb.rate_series(timeline, bin_s, "acked_bytes")
                series.setdefault(name, []).append(([timeline["start"] + t for t in ts], mbps))
    stamps = [t for ranks in series.values() for ts, _ in ranks for t in ts]
    if not stamps:
        return [], {}
    start, n = min(stamps), int((max(stamps) - min(stamps)) / bin_s) + 1
    out = {}
    for name, ranks in series.items():
        total = out[name] = [0.0] * n
        for ts, mbps in ranks:
            for t, v in zip(ts, mbps):
                total[min(n - 1, int(round((t - start) / bin_s)))] += v
    return [i * bin_s for i in range(n)], out


def together(per_job):
    """The summed throughput of the bins in which every job was sending, less the first and last
    tenth of them (start-up, and the last packets of the first job to end): the jobs competing."""
    if not per_job:
        return []
    columns = list(zip(*per_job.values()))
    both = [sum(c) for c in columns if all(v > 0 for v in c)]
    k = max(1, len(both) // 10)
    return both[k:-k] or both


def table(doc):
    rows = []
    for run in doc["runs"]:
        _ts, per_job = throughput(run)
        mid = together(per_job)
        busbws = [job["sizes"][0]["busbw_mbps"] for job in run["jobs"].values()]
        cnps = sum(job["sizes"][0]["counters"].get("cnp_sent", 0) for job in run["jobs"].values())
        rows.append((label(run), run["routing"], f"{sum(busbws):.2f}", f"{min(busbws):.2f}",
                     f"{statistics.mean(mid):.1f}" if mid else "-",
                     f"{statistics.pstdev(mid) / statistics.mean(mid):.2f}" if mid and statistics.mean(mid) else "-",
                     f"{min(mid):.1f}-{max(mid):.1f}" if mid else "-", cnps))
    first = next(iter(doc["runs"][0]["jobs"].values()))["sizes"][0]
    scale = doc["scale"]
    title = (f"{len(doc['runs'][0]['jobs'])} AlltoAlls of {human_size(first['size'])} over {first['ranks']} hosts each on "
             f"{doc['fabric']['name']}, plane ports {scale['host_rate_mbps']:g} Mbit/s (time scale "
             f"x{scale['time_scale'] or 1:.0f}); throughput: every NIC's acknowledged data, {BIN_S * 1e3:.0f} ms bins, while every job sends")
    header = ("case", "switches", "busbw sum Mbit/s", "slowest job", "throughput mean", "cv",
              "throughput range", "CNPs")
    return format_table(header, rows, title=title) + "\n" + doc["experiment"]["reference"]["finding"]


def plot(doc, folder):
    series = {}
    for run in doc["runs"]:
        ts, per_job = throughput(run)
        series[run["label"]] = (ts, [sum(c) for c in zip(*per_job.values())])
    plots.timeline(folder / "esr.png", f"{len(doc['runs'][0]['jobs'])} concurrent AlltoAlls: throughput over time", series,
                   "seconds from the first sample", f"Mbit/s ({BIN_S * 1e3:.0f} ms bins)")
