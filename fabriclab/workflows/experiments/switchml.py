"""In-network aggregation against ring AllReduce on the same fabric (seed 003, sections 6.1, 6.3).

Cases, on one fabric (a rack of up to 4 workers under leaf 1, an aggregator beside it):

1. size x workers: SwitchML's tensor aggregation time (TAT) and aggregated elements per second, and
   the same tensor (4 bytes per element) as a ring AllReduce of the collective engine over the same
   hosts. Ring AllReduce moves 2(n-1)/n of the tensor per worker and in-network aggregation one
   tensor, so SwitchML's edge approaches 2x as n grows (seed 003 section 3).
2. loss: the largest tensor with uniform random loss on every link (0.01 %, 0.1 %, 1 %: Figure 6),
   TAT normalised to the loss-free run, against the ring's time under the same loss (go-back-N),
   and the packets a worker sent per interval (Figure 7).

The aggregator's cable runs at n times the host rate (a switch aggregates across all its ports at
line rate; one server port would otherwise be what is measured): results record it.
"""

from __future__ import annotations

from fabriclab.lab import linkloss
from fabriclab.errors import LabError
from fabriclab.workflows.experiments.runner import Case, Job, size_summary
from fabriclab.table import format_table
from fabriclab.units import human_size

NAME = "switchml"
SUMMARY = ("in-network aggregation (SwitchML, aggregator beside the ToR) vs ring AllReduce: TAT, "
           "elements/s, bytes per worker, TAT inflation under loss (seed 003 Figs 6-7)")
DEFAULT_SPEC = "switchml"
REFERENCE = {
    "source": "seed 003 (SwitchML), sections 3, 6.1 and 6.3",
    "bytes per worker": "ring AllReduce sends 2(n-1)/n x the tensor, SwitchML 1x: up to 2x less",
    "loss": "0.01 % loss minimally affects TAT; SwitchML beats the rings from 0.1 % loss up (Figure 6)",
}
SIZES = (64 * 1024, 1024 * 1024)             # elements (x4 bytes)
QUICK_SIZES = (16 * 1024, 128 * 1024)
WORKERS = (2, 4)
QUICK_WORKERS = (2, 3)
LOSSES = (0.0001, 0.001, 0.01)


def prepare(spec, options):
    if spec.hosts_per_leaf < 3 or spec.nics_per_host != 1 or spec.planes != 1:
        raise LabError(f"switchml needs a single-plane spec with at least 3 hosts per leaf and one NIC "
                       f"per host; {spec.name!r} is not one")
    return spec


def cases(fabric, options):
    from fabriclab.traffic.collective import CollectiveSpec

    rack = [h for h in fabric.hosts if fabric.hosts[h].ports[0].leaf == "l1"]
    per_rack = fabric.spec.hosts_per_leaf - 1
    counts = [n for n in (QUICK_WORKERS if options.quick else WORKERS) if n <= per_rack] or [per_rack]
    sizes = QUICK_SIZES if options.quick else SIZES
    out = []
    for n, size, loss, kind in ([(n, size, 0.0, "size") for n in counts for size in sizes]
                                + [(counts[-1], sizes[-1], loss, "loss") for loss in (0.0, *LOSSES)]):
        name = f"n={n} {human_size(4 * size)}" if kind == "size" else f"loss {loss:.2%}"
        # The ring AllReduce of the same tensor over the same hosts is the case's job; SwitchML's
        # own fields ride along on the runner's Case.
        ring = CollectiveSpec("allreduce", sizes=(4 * size,), hosts=tuple(rack[:n]), backend="udp",
                              iterations=1 if kind == "loss" else 3, warmup=1)
        case = Case(name, [Job("ring", ring)], note=kind)
        case.workers, case.elements, case.loss = n, size, loss
        out.append(case)
    return out


def run_cases(lab, cases_, sample_s, folder, progress):
    from fabriclab.switchml.launcher import AggregationSpec, run_aggregation
    from fabriclab.traffic.collective import run_collective

    rack = [h for h in lab.fabric.hosts if lab.fabric.hosts[h].ports[0].leaf == "l1"]
    results = []
    for number, case in enumerate(cases_):
        if progress:
            progress(number, case)
        workers = tuple(rack[:case.workers])
        iterations = 1 if case.note == "loss" else 3
        spec = AggregationSpec(elements=case.elements, workers=workers, iterations=iterations,
                               seed=case.workers)
        if case.loss:
            lab.set_loss(list(lab.fabric.links), case.loss)
        try:
            before = sum(d for d, _ in linkloss.counters(lab).values())
            sml = run_aggregation(lab, spec)
            dropped = sum(d for d, _ in linkloss.counters(lab).values()) - before
            ring = run_collective(lab, case.jobs[0].spec)
        finally:
            if case.loss:
                lab.set_loss(list(lab.fabric.links), 0)
        summary = size_summary(ring.sizes[0])
        results.append({"name": case.name, "kind": case.note, "workers": case.workers,
                        "elements": case.elements, "loss": case.loss, "switchml": sml,
                        "packets_dropped": dropped,
                        "ring": {**summary, "bytes_sent_per_rank": ring.sizes[0]["bytes_sent_per_rank"]},
                        "jobs": {"ring": {"valid": summary["valid"]}}})
    return results


def table(doc):
    rows = []
    for c in doc["cases"]:
        if c["kind"] != "size":
            continue
        s, r = c["switchml"], c["ring"]
        ring_ms, sml_ms = r["cct_ms"]["p50"], s["tat_s"]["p50"] * 1e3
        ring_bytes = r["bytes_sent_per_rank"][0] if r["bytes_sent_per_rank"] else 0
        rows.append((c["workers"], human_size(4 * c["elements"]), f"{sml_ms:.1f}", f"{ring_ms:.1f}",
                     f"{ring_ms / sml_ms:.2f}x", f"{s['elements_per_s'] / 1e6:.3f}",
                     human_size(int(s["bytes_sent_per_worker"])), human_size(int(ring_bytes)),
                     s["retransmissions"]))
    out = [format_table(("workers", "tensor", "SwitchML TAT ms", "ring ms", "speed-up", "Melem/s",
                         "bytes/worker (SwitchML)", "bytes/rank (ring)", "retx"), rows,
                        title="SwitchML vs ring AllReduce (p50 of 3 iterations)")]
    loss_rows = [c for c in doc["cases"] if c["kind"] == "loss"]
    if loss_rows:
        base = loss_rows[0]["switchml"]["tat_s"]["p50"]
        ring_base = loss_rows[0]["ring"]["cct_ms"]["p50"]
        out.append(format_table(("loss on every link", "SwitchML TAT ms", "inflation", "retransmissions",
                                 "dropped", "ring ms", "ring inflation", "ring retransmitted"),
                                [(f"{c['loss']:.2%}", f"{c['switchml']['tat_s']['p50'] * 1e3:.1f}",
                                  f"{c['switchml']['tat_s']['p50'] / base:.2f}x", c["switchml"]["retransmissions"],
                                  c["packets_dropped"], f"{c['ring']['cct_ms']['p50']:.1f}",
                                  f"{c['ring']['cct_ms']['p50'] / ring_base:.2f}x",
                                  c["ring"]["counters"]["retransmitted_packets"]) for c in loss_rows],
                                title=f"TAT under loss ({loss_rows[0]['workers']} workers, "
                                      f"{human_size(4 * loss_rows[0]['elements'])}; seed 003 Figure 6)"))
    return "\n\n".join(out)


def plot(doc, folder):
    from fabriclab.results import plots

    sizes = [c for c in doc["cases"] if c["kind"] == "size"]
    for n in sorted({c["workers"] for c in sizes}):
        mine = [c for c in sizes if c["workers"] == n]
        xs = [4 * c["elements"] for c in mine]
        plots.lines(folder / f"tat-n{n}.png", f"{n} workers: time to aggregate a tensor", xs,
                    {"SwitchML TAT": [c["switchml"]["tat_s"]["p50"] * 1e3 for c in mine],
                     "ring AllReduce": [c["ring"]["cct_ms"]["p50"] for c in mine]},
                    "tensor bytes", "ms")
    loss = [c for c in doc["cases"] if c["kind"] == "loss"]
    if loss:
        base = loss[0]["switchml"]["tat_s"]["p50"]
        ring_base = loss[0]["ring"]["cct_ms"]["p50"]
        plots.bars(folder / "loss-inflation.png", "TAT inflation under loss on every link (Figure 6)",
                   [f"{c['loss']:.2%}" for c in loss],
                   [("SwitchML: TAT / loss-free TAT", [c["switchml"]["tat_s"]["p50"] / base for c in loss]),
                    ("ring AllReduce: time / loss-free", [c["ring"]["cct_ms"]["p50"] / ring_base for c in loss])])
        # Figure 7: packets one worker sent per interval, and where each run's TAT ended.
        width = max(c["switchml"]["tat_s"]["per_iteration"][0] for c in loss) / 50
        series, marks = {}, []
        for c in loss:
            t, end = c["switchml"]["timeline"], c["switchml"]["tat_s"]["per_iteration"][0]
            counts = [0] * (int(end / width) + 2)
            for when in t["sends"] + t["resends"]:
                counts[min(int(when / width), len(counts) - 1)] += 1
            series[f"{c['loss']:.2%} loss"] = ([i * width for i in range(len(counts))], counts)
            marks.append((end, f"TAT at {c['loss']:.2%}"))
        plots.timeline(folder / "timeline.png", "packets a worker sent per interval (Figure 7)", series,
                       "time from the aggregation's start (s)", f"packets per {width * 1e3:.1f} ms", marks=marks)
