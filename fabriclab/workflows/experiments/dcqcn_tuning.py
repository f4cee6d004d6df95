"""AlltoAll completion time and PFC pauses under DCQCN's NIC defaults and relaxed settings (seed
000 section 5.2.1, Figure 13).

The paper kept relaxed (5 MB) ECN thresholds at the CTSWs, then swept the NICs' DCQCN settings on a
128-GPU AlltoAll, the collective with the worst congestion and queue build-up in training. Relaxed
settings bought at most ~3% of completion time, and in every case PFC got 2-3x worse; Meta then
ran its 400G fabric on PFC alone.

Here: the `oversubscribed` spec (4 leaves of 4 hosts, 2:1 uplinks), relaxed ECN everywhere (the
ecn-dcqcn experiment's relaxed profile), an AlltoAll over every host, and four cases on one fabric.
On the 1:1 `routing` spec the lab's AlltoAll ran at line rate with no pause and the four cases
alike (3.82 s each, 2026-12-02): its schedule is a permutation per step, so nothing queues but ECMP
collisions. The paper's AlltoAll is its worst case for congestion and queue build-up; the 2:1
uplinks make that here. The cases:
the NICs' defaults and three relaxed combinations, each easing one part of DCQCN (NIC units,
traffic/dcqcn.py's NIC_DEFAULTS):

- gentler cuts: a CNP cuts by alpha/4 instead of alpha/2, never below 75% of the rate;
- faster recovery: the increase timer every 100 us instead of 300, steps of 20 and 200 Mbit/s;
- fewer CNPs: at most one every 50 us per QP, and alpha moves five times slower.

The paper does not list its combinations; these three ease one part each, so the table says which
part of DCQCN costs what.
"""

from __future__ import annotations

from fabriclab.results import figures
from fabriclab.table import format_table
from fabriclab.units import human_size
from fabriclab.workflows.experiments import ecn_dcqcn, first_size, hops, label, queue_totals
from fabriclab.workflows.plan import Job, RunPlan

NAME = "dcqcn-tuning"
SUMMARY = "AlltoAll CCT and PFC pauses: DCQCN's NIC defaults vs relaxed settings (seed 000 5.2.1, Figure 13)"
DEFAULT_SPEC = "oversubscribed"
REFERENCE = {
    "source": "seed 000 (RoCE at Meta), section 5.2.1 and Figure 13: 128-GPU AlltoAll, relaxed CTSW ECN",
    "finding": "relaxed DCQCN settings gained at most ~3% of completion time, and PFC pauses grew 2-3x "
               "in every case",
}
# label -> DCQCN NIC overrides ({}: the NIC's defaults)
SETTINGS = {
    "DCQCN defaults": {},
    "gentler cuts": {"rpg_gd": 12, "rpg_min_dec_fac": 75},
    "faster recovery": {"rpg_time_reset": 100, "rpg_ai_rate": 20, "rpg_hai_rate": 200},
    "fewer CNPs": {"min_time_between_cnps": 50, "dce_tcp_g": 1023},
}
DEFAULTS = "DCQCN defaults"


def prepare(spec, options):
    """As ecn-dcqcn: PFC on, ECN marking on, the PFC watchdog off."""
    return ecn_dcqcn.prepare(spec, options)


def runs(fabric, options):
    from fabriclab.traffic.collective import CollectiveSpec

    size = (256 if options.quick else 1024) * 1024
    iterations, warmup = (1, 0) if options.quick else (3, 1)
    ecn = ecn_dcqcn.thresholds(fabric, "relaxed")
    out = []
    for name, nic in SETTINGS.items():
        # 100x: a QP cut hard stays slow for seconds of lab time (ecn_dcqcn.runs says why)
        spec = CollectiveSpec(collective="alltoall", sizes=(size,), iterations=iterations, warmup=warmup,
                              seed=options.seed, dcqcn=dict(nic), timeout_factor=100.0)
        changed = ", ".join(f"{k} {v}" for k, v in nic.items()) or "the NIC's defaults"
        note = f"AlltoAll {human_size(size)} over {len(fabric.hosts)} hosts, relaxed ECN; DCQCN: {changed}"
        out.append(RunPlan(name, options.routing, [Job("alltoall", spec)], ecn=ecn, note=note,
                           tags={"dcqcn": name}))
    return out


def pauses(run):
    return sum(h.get("pauses", 0) for h in hops(run).values())


def table(doc):
    rows = []
    for run in doc["runs"]:
        job = first_size(run, "alltoall")
        nic = hops(run).get("leaf->NIC", {})
        rows.append((label(run), f"{job['cct_ms']['mean']:.0f}", f"{job['cct_ms']['p50']:.0f}",
                     f"{job['busbw_mbps']:.2f}", queue_totals(run).get("marks", 0),
                     job["counters"].get("cnp_sent", 0), pauses(run), f"{100 * nic.get('paused_share', 0):.1f}",
                     job["counters"].get("retransmitted_packets", 0)))
    scale = doc["scale"]
    job = first_size(doc["runs"][0], "alltoall")
    title = (f"AlltoAll {human_size(job['size'])} over {job['ranks']} ranks on {doc['fabric']['name']}, relaxed ECN, "
             f"links {scale['host_rate_mbps']:g} Mbit/s (time scale x{scale['time_scale'] or 1:.0f})")
    header = ("DCQCN", "CCT mean ms", "p50", "busbw Mbit/s", "CE marks", "CNPs", "PFC pauses", "NIC paused %",
              "retrans")
    return format_table(header, rows, title=title) + "\nseed 000: " + doc["experiment"]["reference"]["finding"]


def plot(doc, folder):
    runs_ = doc["runs"]
    figures.compare(folder / "dcqcn_tuning.png", "AlltoAll under DCQCN settings", [r["label"] for r in runs_], [
        ("CCT mean ms", [first_size(r, "alltoall")["cct_ms"]["mean"] for r in runs_]),
        ("CNPs", [first_size(r, "alltoall")["counters"].get("cnp_sent", 0) for r in runs_]),
        ("PFC pauses", [pauses(r) for r in runs_]),
    ])
