"""routing-schemes: the same ring AllReduce under ECMP, QP scaling, E-ECMP, TE and flowlet
switching (seed 000, section 4), then one uplink failure under each scheme.

The ring is laid out so every hop crosses leaves (h1, h5, h9, h13, h2, ...): each leaf sends four
flows up its four uplinks and receives four down, a 1:1 fabric where a single hash collision
halves two flows. Per case: uplink utilization (spread and max/mean), busbw, CCT p50/p99, OOS and
retransmissions; the failure cases time how long the collective's delivered traffic stays below
half its rate after l1-s1 goes down, and the uplink balance afterwards.
"""

from __future__ import annotations

import dataclasses
import threading
import time

from fabriclab.measure import recovery

from fabriclab.measure import telemetry
from fabriclab.results import figures
from fabriclab.workflows.experiments.runner import Case, Job, case_label, job_summary
from fabriclab.measure.portsampler import PortSampler
from fabriclab.table import format_table
from fabriclab.traffic.collective import CollectiveSpec, run_collective

NAME = "routing-schemes"
SUMMARY = ("ring AllReduce over every host, each ring hop crossing leaves, under ECMP, ECMP + QP "
           "scaling, E-ECMP + QP scaling with shared source ports, TE and flowlet; then l1-s1 fails "
           "under each scheme")
DEFAULT_SPEC = "routing"
REFERENCE = {
    "source": "seed 000 sections 4.1-4.5, Figure 7, 4.4.2, Figure 11",
    "finding": ("Paper: ECMP collides elephant flows (MMR > 1.2 at 1,000 flows on 16 links, worse in "
                "production); QP scaling helps only while QPs differ in source port; E-ECMP + QP "
                "scaling gains up to 40% busbw on AllReduce; TE spreads links evenly (80% each vs "
                "40-90% under E-ECMP) and beats E-ECMP by 5-10%, but degrades under failures; "
                "flowlet switching balances by load, with OOS falling as the interval grows."),
}
FAULT = ("l1", "s1")
FAULT_AFTER_S = 0.6
SAMPLE_S = 0.005
BIN_S = 0.05


@dataclasses.dataclass
class RoutingCase(Case):
    routing: str = "ecmp"
    fault: tuple | None = None


def prepare(spec, options):
    return spec


def ring_order(fabric):
    """Hosts leaf-major interleaved: h1 (l1), h5 (l2), h9 (l3), ..., then the second host of each."""
    by_leaf = {}
    for host in fabric.hosts.values():
        by_leaf.setdefault(host.leaf_index, []).append(host.name)
    rows = [by_leaf[k] for k in sorted(by_leaf)]
    return tuple(name for i in range(max(map(len, rows))) for row in rows if i < len(row) for name in [row[i]])


def workload(fabric, options, qps=1, shared=False, iterations=None):
    quick = options.quick
    return CollectiveSpec(collective="allreduce", sizes=((256 if quick else 1024) * 1024,),
                          hosts=ring_order(fabric), qps=qps, sport_mode="shared" if shared else "qp",
                          iterations=iterations or (2 if quick else 4), warmup=1, seed=options.seed)


SCHEMES = (
    ("ECMP", "ecmp", 1, False),
    ("ECMP + 4 QPs", "ecmp", 4, False),
    ("ECMP + 4 QPs shared sport", "ecmp", 4, True),
    ("E-ECMP + 4 QPs shared sport", "eecmp", 4, True),
    ("TE", "te", 1, False),
    ("flowlet", "flowlet", 1, False),
)


def cases(fabric, options):
    out = [RoutingCase(name, [Job("ring", workload(fabric, options, qps, shared))], routing=routing)
           for name, routing, qps, shared in SCHEMES]
    failing = ("ECMP", "TE") if options.quick else ("ECMP + 4 QPs", "E-ECMP + 4 QPs shared sport", "TE", "flowlet")
    for name, routing, qps, shared in SCHEMES:
        if name in failing:
            spec = workload(fabric, options, qps, shared, iterations=3 if options.quick else 6)
            out.append(RoutingCase(f"{name}, {FAULT[0]}-{FAULT[1]} fails", [Job("ring", spec)],
                                   routing=routing, fault=FAULT))
    return out


# -- running ----------------------------------------------------------------------------------------
def run_cases(lab, cases_, sample_s=SAMPLE_S, folder=None, progress=None):
    results = []
    for number, case in enumerate(cases_):
        if progress:
            progress(number, case)
        if lab.routing != case.routing:
            lab.set_routing(case.routing)
        sampler = PortSampler(lab.fabric, SAMPLE_S).start()
        timer = None
        fault = {}
        if case.fault:
            def inject():
                fault["at"] = time.time()
                lab.link_down(*case.fault, wait=False)
            # the fault lands a fixed time into the measured iterations (after agent start-up)
            timer = threading.Thread(target=_after_start, args=(lab, inject), daemon=True)
            timer.start()
        placement = {}
        done = threading.Event()
        te_watch = threading.Thread(target=_te_while_running, args=(lab, placement, done), daemon=True)
        te_watch.start()
        try:
            run = run_collective(lab, case.measured().spec, name="job-ring")
        finally:
            done.set()
            te_watch.join(5)
            series = sampler.stop()
            if timer is not None:
                timer.join(5)
            if case.fault:
                lab.link_up(*case.fault)
        result = {"case": case.name, "routing": case.routing,
                  "jobs": {"ring": job_summary(run)},
                  "uplinks": run.sizes[0]["balance"]["up"], "downlinks": run.sizes[0]["balance"]["down"],
                  "links": run.sizes[0]["links"], "stage": lab.stage_stats(),
                  "te": _te_summary(placement.get("last"))}
        if case.fault and "at" in fault:
            at, end = series.to_series_time(fault["at"]), series.to_series_time(run.traffic_window[1])
            hit = recovery.impact(*series.delivered(BIN_S), at, end)
            dead = {link.label for link in lab.resolve_link(*case.fault)}
            # over the uplinks still up, from recovery to the end of the run
            ups = [c.name for c in series.columns if c.kind == "up" and c.link not in dead]
            loads = series.mean_mbps(at + (hit["recovery_s"] or 0), end)
            after = [loads[u] for u in ups]
            result["fault"] = {"link": list(case.fault), "at_s": round(fault["at"] - run.traffic_window[0], 3),
                               "recovery_s": hit["recovery_s"], "delivered_before_mbps": hit["baseline_mbps"],
                               "uplinks_after": {"max_mean_ratio": telemetry.max_mean_ratio(after),
                                                 "max_mbps": round(max(after), 3), "min_mbps": round(min(after), 3)}}
        results.append(result)
    return results


def _te_while_running(lab, placement, done):
    """Keep TE's last placement that includes the ring job: once the launcher retracts the job at
    its end, TE recomputes without it, so reading the placement afterwards races that."""
    while not done.wait(0.1):
        current = lab.te_placement()
        if current and "job-ring" in (current.get("jobs") or []):
            placement["last"] = current


def _after_start(lab, inject):
    """Wait for the job's agents to be up (its jobs.json entry), then FAULT_AFTER_S more."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "job-ring" not in lab.jobs:
        time.sleep(0.01)
    time.sleep(FAULT_AFTER_S)
    if "job-ring" in lab.jobs:
        inject()


def _te_summary(placement):
    if not placement:
        return None
    return {"recomputes": placement.get("recomputes"), "placed": len(placement.get("placed", [])),
            "unplaced": len(placement.get("unplaced", [])),
            "uplinks": sorted({p["uplink_intf"] for p in placement.get("placed", [])})}


# -- reporting --------------------------------------------------------------------------------------
def table(doc):
    rows = []
    for case in doc["cases"]:
        ring = case["jobs"]["ring"]
        up = case["uplinks"] or {}
        f = case.get("fault") or {}
        after = f.get("uplinks_after") or {}
        rows.append((case_label(case), f"{ring['busbw_mbps']:.2f}", f"{ring['cct_ms']['p50']:.0f}",
                     f"{ring['cct_ms']['p99']:.0f}", _num(up.get("max_mean_ratio")),
                     f"{up.get('min_mbps', 0):.1f}-{up.get('max_mbps', 0):.1f}",
                     ring["counters"]["out_of_sequence"], ring["counters"]["retransmitted_packets"],
                     (ring.get("buffer_drops") or {}).get("total", "-"),
                     _num(f.get("recovery_s")) if f else "", _num(after.get("max_mean_ratio")) if f else ""))
    scale = doc["scale"]
    title = (f"routing schemes on {doc['fabric']['name']}, links {scale['host_rate_mbps']:g} Mbit/s "
             f"(time scale x{scale['time_scale'] or 1:.0f}); uplink spread in Mbit/s averaged over "
             f"the measured iterations")
    header = ("case", "busbw Mbit/s", "CCT p50 ms", "p99", "uplink max/mean", "uplink min-max",
              "OOS", "retrans", "drops", "recovery s", "max/mean after")
    return format_table(header, rows, title=title) + "\n" + doc["reference"]["finding"]


def _num(value):
    return "-" if value is None else f"{value:.3g}"


def plot(doc, folder):
    plain = [c for c in doc["cases"] if not c.get("fault")]
    short = [dict(c, case=c["case"].replace(" shared sport", "\nshared").replace(" + 4 QPs", "\n+4 QPs"))
             for c in plain]
    figures.compare(folder / "routing_schemes.png", "same ring AllReduce, one scheme per bar", short, [
        ("busbw (Mbit/s)", [c["jobs"]["ring"]["busbw_mbps"] for c in plain]),
        ("uplink max/mean", [(c["uplinks"] or {}).get("max_mean_ratio") for c in plain]),
        ("out-of-sequence packets", [c["jobs"]["ring"]["counters"]["out_of_sequence"] for c in plain]),
    ])
    failed = [c for c in doc["cases"] if c.get("fault")]
    if failed:
        figures.compare(folder / "routing_failures.png", f"{FAULT[0]}-{FAULT[1]} fails during the ring",
                        [dict(c, case=c["case"].split(",")[0].replace(" shared sport", "\nshared")) for c in failed], [
            ("recovery (s)", [c["fault"].get("recovery_s") for c in failed]),
            ("uplink max/mean after", [(c["fault"].get("uplinks_after") or {}).get("max_mean_ratio")
                                       for c in failed]),
            ("busbw (Mbit/s)", [c["jobs"]["ring"]["busbw_mbps"] for c in failed]),
        ])
