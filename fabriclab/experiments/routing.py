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
import statistics
import threading
import time

from fabriclab import telemetry
from fabriclab.experiments import figures
from fabriclab.experiments.runner import Case, Job, case_label, job_summary
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
class Watch(threading.Thread):
    """Samples the leaves' ports every SAMPLE_S: delivered bytes (towards hosts) and uplinks."""

    def __init__(self, fabric):
        super().__init__(daemon=True, name="routing-watch")
        self.fabric = fabric
        self.host_ports = [link.b_intf for link in fabric.host_links]
        self.uplinks = [link.a_intf if fabric.switches[link.a].role == "leaf" else link.b_intf
                        for link in fabric.fabric_links]
        self.samples = []
        self.done = threading.Event()

    def run(self):
        intfs = self.host_ports + self.uplinks
        while not self.done.is_set():
            counters = telemetry.read_counters(intfs)
            self.samples.append((time.time(), {i: c["tx_bytes"] for i, c in counters.items()}))
            self.done.wait(SAMPLE_S)

    def stop(self):
        self.done.set()
        self.join()
        return self.samples


def delivered_bins(samples, intfs, start, end):
    """[(bin start, Mbit/s delivered)] between start and end, in BIN_S bins."""
    out = []
    t = start
    while t + BIN_S <= end:
        inside = [s for s in samples if t <= s[0] <= t + BIN_S]
        if len(inside) >= 2:
            a, b = inside[0], inside[-1]
            nbytes = sum(b[1].get(i, 0) - a[1].get(i, 0) for i in intfs)
            out.append((t, nbytes * 8 / (b[0] - a[0]) / 1e6))
        t += BIN_S
    return out


def recovery(samples, intfs, fault_at, end):
    """Seconds from the fault until delivered traffic is back above half its pre-fault rate
    (0 when it never fell below half), and the pre-fault rate."""
    before = [mbps for t, mbps in delivered_bins(samples, intfs, fault_at - 0.5, fault_at) if mbps > 0]
    if not before:
        return None, None
    base = statistics.fmean(before)
    after = delivered_bins(samples, intfs, fault_at, end)
    fell = False
    for t, mbps in after:
        if mbps < base / 2:
            fell = True
        elif fell:
            return round(t - fault_at, 3), round(base, 3)
    return (0.0 if not fell else None), round(base, 3)


def uplink_balance(samples, uplinks, start, end):
    inside = [s for s in samples if start <= s[0] <= end]
    if len(inside) < 2:
        return None
    a, b = inside[0], inside[-1]
    loads = [(b[1].get(i, 0) - a[1].get(i, 0)) * 8 / (b[0] - a[0]) / 1e6 for i in uplinks]
    return {"max_mean_ratio": telemetry.max_mean_ratio(loads), "max_mbps": round(max(loads), 3),
            "min_mbps": round(min(loads), 3)}


def run_cases(lab, cases_, sample_s=SAMPLE_S, folder=None, progress=None):
    results = []
    for number, case in enumerate(cases_):
        if progress:
            progress(number, case)
        if lab.routing != case.routing:
            lab.set_routing(case.routing)
        watch = Watch(lab.fabric)
        watch.start()
        timer = None
        fault = {}
        if case.fault:
            def inject():
                fault["at"] = time.time()
                lab.link_down(*case.fault, wait=False)
            # the fault lands a fixed time into the measured iterations (after agent start-up)
            timer = threading.Thread(target=_after_start, args=(lab, inject), daemon=True)
            timer.start()
        try:
            run = run_collective(lab, case.measured().spec, name="job-ring")
        finally:
            samples = watch.stop()
            if timer is not None:
                timer.join(5)
            if case.fault:
                lab.link_up(*case.fault)
        result = {"case": case.name, "routing": case.routing,
                  "jobs": {"ring": job_summary(run)},
                  "uplinks": run.sizes[0]["balance"]["up"], "downlinks": run.sizes[0]["balance"]["down"],
                  "links": run.sizes[0]["links"], "stage": lab.stage_stats(),
                  "te": _te_summary(lab.te_placement())}
        if case.fault and "at" in fault:
            end = run.traffic_window[1]
            took, base = recovery(samples, watch.host_ports, fault["at"], end)
            dead = {i for link in lab.resolve_link(*case.fault) for i in (link.a_intf, link.b_intf)}
            result["fault"] = {"link": list(case.fault), "at_s": round(fault["at"] - run.traffic_window[0], 3),
                               "recovery_s": took, "delivered_before_mbps": base,
                               # over the uplinks still up, from recovery to the end of the run
                               "uplinks_after": uplink_balance(samples, [u for u in watch.uplinks if u not in dead],
                                                               fault["at"] + (took or 0), end)}
        results.append(result)
    return results


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
                     _num(f.get("recovery_s")) if f else "", _num(after.get("max_mean_ratio")) if f else ""))
    scale = doc["scale"]
    title = (f"routing schemes on {doc['fabric']['name']}, links {scale['host_rate_mbps']:g} Mbit/s "
             f"(time scale x{scale['time_scale'] or 1:.0f}); uplink spread in Mbit/s averaged over "
             f"the measured iterations")
    header = ("case", "busbw Mbit/s", "CCT p50 ms", "p99", "uplink max/mean", "uplink min-max",
              "OOS", "retrans", "recovery s", "max/mean after")
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
