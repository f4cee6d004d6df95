"""flowlet-interval: out-of-order packets and balance as the flowlet interval grows (seed 000
section 4.5, Figure 11).

The routing-schemes ring AllReduce (every hop crosses leaves) under flowlet switching at several
intervals. A flow idle for longer than the interval moves to the least-loaded uplink; when the
interval is shorter than the time the packets already sent need to arrive, the next packet can
overtake them and the NIC sees it out of sequence. The paper's OOS fall steeply as the interval
grows and are negligible from about half the fabric's round trip; past that, the balance a
shorter interval buys has diminishing returns.

Intervals are lab time: at the lab's 10 Mbit/s a 1 KiB packet takes about 0.8 ms on a link and
a round trip through the software switches a few ms, so the sweep runs from well below one
packet's time to several round trips; a loaded ring's queues can hold packets past 16 ms, so
the longest interval is 64 ms (docs/routing.md has the draws that chose it). The NICs go back N
on a hole (as the paper's RNICs did), so each out-of-order packet also costs retransmissions.
"""

from __future__ import annotations

from fabriclab.results import figures
from fabriclab.table import format_table
from fabriclab.workflows.experiments import first_size, label, num
from fabriclab.workflows.experiments.routing import workload
from fabriclab.workflows.plan import Job, RunPlan

NAME = "flowlet-interval"
SUMMARY = ("ring AllReduce under flowlet switching at intervals from 0.25 to 64 ms (lab time): "
           "out-of-order packets, retransmissions, busbw and uplink balance (seed 000 Figure 11)")
DEFAULT_SPEC = "routing"
DEFAULT_ROUTING = None       # the runs name their own routing apps
REFERENCE = {
    "source": "seed 000 section 4.5, Figure 11 (200G testbed)",
    "finding": ("Paper: out-of-order packets go down non-linearly as the flowlet interval grows, below "
                "1 packet/s at 256-512 us (about half the round trip); a shorter interval balances "
                "more aggressively with diminishing returns on performance."),
}
GAPS_MS = (0.25, 1.0, 4.0, 16.0, 64.0)
QUICK_GAPS_MS = (0.25, 2.0, 64.0)


def prepare(spec, options):
    return spec


def runs(fabric, options):
    ring = Job("ring", workload(fabric, options))
    return [RunPlan(f"flowlet {gap:g} ms", f"flowlet:gap_us={gap * 1000:g}", [ring], tags={"gap_ms": gap})
            for gap in (QUICK_GAPS_MS if options.quick else GAPS_MS)]


def oos_per_s(run):
    """Out-of-sequence packets per second of the measured iterations."""
    ring = first_size(run, "ring")
    seconds = sum(ring["cct_ms"]["all"]) / 1e3
    return ring["counters"].get("out_of_sequence", 0) / seconds if seconds else None


def table(doc):
    rows = []
    for run in doc["runs"]:
        ring = first_size(run, "ring")
        up = ring["balance"]["up"] or {}
        rows.append((label(run), f"{run['tags']['gap_ms']:g}", ring["counters"].get("out_of_sequence", 0),
                     f"{oos_per_s(run):.1f}", ring["counters"].get("retransmitted_packets", 0),
                     f"{ring['busbw_mbps']:.2f}", num(up.get("max_mean_ratio"))))
    scale = doc["scale"]
    title = (f"flowlet interval sweep on {doc['fabric']['name']}, links {scale['host_rate_mbps']:g} Mbit/s "
             f"(time scale x{scale['time_scale'] or 1:.0f}); intervals in lab time")
    header = ("case", "interval ms", "OOS", "OOS/s", "retrans", "busbw Mbit/s", "uplink max/mean")
    return format_table(header, rows, title=title) + "\n" + doc["experiment"]["reference"]["finding"]


def plot(doc, folder):
    runs_ = doc["runs"]
    figures.compare(folder / "flowlet_interval.png", "flowlet interval (lab ms)",
                    [f"{r['tags']['gap_ms']:g} ms" for r in runs_], [
        ("out-of-sequence packets / s", [oos_per_s(r) for r in runs_]),
        ("busbw (Mbit/s)", [first_size(r, "ring")["busbw_mbps"] for r in runs_]),
        ("uplink max/mean", [(first_size(r, "ring")["balance"]["up"] or {}).get("max_mean_ratio") for r in runs_]),
    ])
