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

from fabriclab.errors import LabError
from fabriclab.results import figures
from fabriclab.table import format_table
from fabriclab.workflows import faults
from fabriclab.workflows.experiments import first_size, label, num
from fabriclab.workflows.plan import Job, RunPlan

NAME = "routing-schemes"
SUMMARY = ("ring AllReduce over every host, each ring hop crossing leaves, under ECMP, ECMP + QP "
           "scaling, E-ECMP + QP scaling with shared source ports, TE and flowlet; then l1-s1 fails "
           "under each scheme")
DEFAULT_SPEC = "routing"
DEFAULT_ROUTING = None       # the runs name their own routing apps
LOSSY_OPTION = True          # lossless (PFC) by default; --lossy without
REFERENCE = {
    "source": "seed 000 sections 4.1-4.5, Figure 7, 4.4.2, Figure 11",
    "finding": ("Paper: ECMP collides elephant flows (MMR > 1.2 at 1,000 flows on 16 links, worse in "
                "production); QP scaling helps only while QPs differ in source port; E-ECMP + QP "
                "scaling gains up to 40% busbw on AllReduce; TE spreads links evenly (80% each vs "
                "40-90% under E-ECMP) and beats E-ECMP by 5-10%, but degrades under failures; "
                "flowlet switching balances by load, with OOS falling as the interval grows."),
}
FAULT = ("l1", "s1")
FAULT_AFTER_S = 0.6          # the link fails this long into the measured iterations


def prepare(spec, options):
    """Lossless by default, as seed 000's RoCE fabric: a collision then costs pauses, not drops and
    go-back-N. `--lossy` takes the queue model away (tail-drop fifos), and the table says so."""
    if options.lossy:
        return dataclasses.replace(spec, queues=None)
    if spec.queues is None or not spec.queues.pfc.enabled:
        raise LabError(f"routing-schemes runs on a lossless class: spec {spec.name!r} has "
                       f"{'no queues: section' if spec.queues is None else 'PFC off'}; add one, or pass --lossy")
    return spec


def ring_order(fabric):
    """Hosts leaf-major interleaved: h1 (l1), h5 (l2), h9 (l3), ..., then the second host of each."""
    by_leaf = {}
    for host in fabric.hosts.values():
        by_leaf.setdefault(host.group, []).append(host.name)
    rows = [by_leaf[k] for k in sorted(by_leaf)]
    return tuple(name for i in range(max(map(len, rows))) for row in rows if i < len(row) for name in [row[i]])


def workload(fabric, options, qps=1, shared=False, iterations=None):
    """The ring; its queue pairs (and so their UDP source ports, a draw of the hash) are seeded by
    the options' seed: with 16 flows on 16 uplinks one collision halves the whole ring, so one
    seed says little about what a scheme gains on average (`reproduce` judges over draws)."""
    from fabriclab.traffic.collective import CollectiveSpec

    quick = options.quick
    return CollectiveSpec(collective="allreduce", sizes=((256 if quick else 1024) * 1024,),
                          hosts=ring_order(fabric), qps=qps, sport_mode="shared" if shared else "qp",
                          iterations=iterations or (3 if quick else 4), warmup=1, seed=options.seed)


SCHEMES = (
    ("ECMP", "ecmp", 1, False),
    ("ECMP + 4 QPs", "ecmp", 4, False),
    ("ECMP + 4 QPs shared sport", "ecmp", 4, True),
    ("E-ECMP + 4 QPs shared sport", "eecmp", 4, True),
    ("TE", "te", 1, False),
    ("flowlet", "flowlet", 1, False),
)


def runs(fabric, options):
    """--quick: the schemes the seed 000 claims read (flowlet's own is flowlet-interval's)."""
    out = [RunPlan(name, routing, [Job("ring", workload(fabric, options, qps, shared))],
                   tags={"scheme": name})
           for name, routing, qps, shared in SCHEMES if not (options.quick and routing == "flowlet")]
    failing = ("E-ECMP + 4 QPs shared sport", "TE") if options.quick else ("ECMP + 4 QPs", "E-ECMP + 4 QPs shared sport", "TE", "flowlet")
    fault = faults.Fault(0, "link_down", f"{FAULT[0]}-{FAULT[1]}", FAULT_AFTER_S, {})
    for name, routing, qps, shared in SCHEMES:
        if name in failing:
            spec = workload(fabric, options, qps, shared, iterations=3 if options.quick else 6)
            out.append(RunPlan(f"{name}, {FAULT[0]}-{FAULT[1]} fails", routing, [Job("ring", spec)],
                               faults=[fault], tags={"scheme": name, "fault": f"{FAULT[0]}-{FAULT[1]}"}))
    return out


def _uplinks(run):
    return first_size(run, "ring")["balance"]["up"] or {}


def _fault(run):
    return (run["faults"] or [{}])[0]


# -- reporting --------------------------------------------------------------------------------------
def table(doc):
    rows = []
    for run in doc["runs"]:
        ring = first_size(run, "ring")
        up = _uplinks(run)
        f = _fault(run)
        after = f.get("uplinks_after") or {}
        recovery = (f.get("impact") or {}).get("recovery_s")
        rows.append((label(run), f"{ring['busbw_mbps']:.2f}", f"{ring['cct_ms']['p50']:.0f}",
                     f"{ring['cct_ms']['p99']:.0f}", num(up.get("max_mean_ratio")),
                     f"{up.get('min_mbps', 0):.1f}-{up.get('max_mbps', 0):.1f}",
                     ring["counters"].get("out_of_sequence", 0), ring["counters"].get("retransmitted_packets", 0),
                     (ring.get("buffer_drops") or {}).get("total", "-"),
                     num(recovery) if f else "", num(after.get("max_mean_ratio")) if f else ""))
    scale = doc["scale"]
    title = (f"routing schemes on {doc['fabric']['name']}, {conditions(doc)}, links {scale['host_rate_mbps']:g} Mbit/s "
             f"(time scale x{scale['time_scale'] or 1:.0f}); uplink spread in Mbit/s averaged over "
             f"the measured iterations")
    header = ("case", "busbw Mbit/s", "CCT p50 ms", "p99", "uplink max/mean", "uplink min-max",
              "OOS", "retrans", "drops", "recovery s", "max/mean after")
    return format_table(header, rows, title=title) + "\n" + doc["experiment"]["reference"]["finding"]


def conditions(doc):
    """Lossless (PFC) or LOSSY, as the run's document records the fabric's queues."""
    queues = (doc["mechanisms"].get("queue_model") or {}).get("spec")
    if queues and queues["pfc"]["enabled"]:
        return "lossless (PFC" + (", ECN off)" if queues["ecn"]["mode"] == "off" else ", ECN on)")
    return "LOSSY (tail drop, no PFC)"


def plot(doc, folder):
    plain = [r for r in doc["runs"] if not r["faults"]]
    figures.compare(folder / "routing_schemes.png", "same ring AllReduce, one scheme per bar",
                    [r["label"].replace(" shared sport", "\nshared").replace(" + 4 QPs", "\n+4 QPs") for r in plain], [
        ("busbw (Mbit/s)", [first_size(r, "ring")["busbw_mbps"] for r in plain]),
        ("uplink max/mean", [_uplinks(r).get("max_mean_ratio") for r in plain]),
        ("out-of-sequence packets", [first_size(r, "ring")["counters"].get("out_of_sequence", 0) for r in plain]),
    ])
    failed = [r for r in doc["runs"] if r["faults"]]
    if failed:
        figures.compare(folder / "routing_failures.png", f"{FAULT[0]}-{FAULT[1]} fails during the ring",
                        [r["label"].split(",")[0].replace(" shared sport", "\nshared") for r in failed], [
            ("recovery (s)", [(_fault(r).get("impact") or {}).get("recovery_s") for r in failed]),
            ("uplink max/mean after", [(_fault(r).get("uplinks_after") or {}).get("max_mean_ratio")
                                       for r in failed]),
            ("busbw (Mbit/s)", [first_size(r, "ring")["busbw_mbps"] for r in failed]),
        ])
