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

from fabriclab.errors import LabError
from fabriclab.table import format_table
from fabriclab.units import human_size
from fabriclab.workflows import faults
from fabriclab.workflows.experiments import first_size
from fabriclab.workflows.plan import Job, RunPlan

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


def runs(fabric, options):
    """Per case two runs under the same conditions: SwitchML's aggregation, then the ring
    AllReduce of the same tensor (4 bytes per element) over the same hosts."""
    from fabriclab.switchml.launcher import AggregationSpec
    from fabriclab.traffic.collective import CollectiveSpec

    rack = [h for h in fabric.hosts if fabric.hosts[h].ports[0].leaf == "l1"]
    per_rack = fabric.spec.hosts_per_leaf - 1
    counts = [n for n in (QUICK_WORKERS if options.quick else WORKERS) if n <= per_rack] or [per_rack]
    sizes = QUICK_SIZES if options.quick else SIZES
    out = []
    for n, size, loss, kind in ([(n, size, 0.0, "size") for n in counts for size in sizes]
                                + [(counts[-1], sizes[-1], loss, "loss") for loss in (0.0, *LOSSES)]):
        case = f"n={n} {human_size(4 * size)}" if kind == "size" else f"loss {loss:.2%}"
        # p50 of 3 under loss too: one sample on a loaded machine can be 30 % off by itself,
        # which is the whole margin of "0.01 % loss costs little" (CI once saw it flip)
        iterations = 3
        workers = tuple(rack[:n])
        sml = AggregationSpec(elements=size, workers=workers, iterations=iterations, seed=n)
        ring = CollectiveSpec("allreduce", sizes=(4 * size,), hosts=workers, backend="udp",
                              iterations=iterations, warmup=1)
        lossy = [faults.Fault(0, "loss", "fabric", 0.0, {"fraction": loss})] if loss else []
        tags = {"case": case, "kind": kind, "workers": n, "elements": size, "loss": loss}
        out.append(RunPlan(f"{case} switchml", options.routing, [Job("switchml", sml)], conditions=lossy,
                           note=kind, tags={**tags, "mechanism": "switchml"}))
        out.append(RunPlan(f"{case} ring", options.routing, [Job("ring", ring)], conditions=lossy,
                           note=kind, tags={**tags, "mechanism": "ring"}))
    return out


def cases(doc):
    """[(tags, switchml run, ring run)] per case, in order."""
    by_case = {}
    for run in doc["runs"]:
        by_case.setdefault(run["tags"]["case"], {})[run["tags"]["mechanism"]] = run
    return [(pair["switchml"]["tags"], pair["switchml"], pair["ring"]) for pair in by_case.values()]


def _tat(run):
    return run["jobs"]["switchml"]["aggregation"]


def _dropped(run):
    return (run.get("link_loss") or {}).get("dropped_packets", 0)


def table(doc):
    rows = []
    for tags, sml_run, ring_run in cases(doc):
        if tags["kind"] != "size":
            continue
        s, r = _tat(sml_run), first_size(ring_run, "ring")
        ring_ms, sml_ms = r["cct_ms"]["p50"], s["tat_s"]["p50"] * 1e3
        ring_bytes = r["bytes_sent_per_rank"][0] if r["bytes_sent_per_rank"] else 0
        rows.append((tags["workers"], human_size(4 * tags["elements"]), f"{sml_ms:.1f}", f"{ring_ms:.1f}",
                     f"{ring_ms / sml_ms:.2f}x", f"{s['elements_per_s'] / 1e6:.3f}",
                     human_size(int(s["bytes_sent_per_worker"])), human_size(int(ring_bytes)),
                     s["retransmissions"]))
    out = [format_table(("workers", "tensor", "SwitchML TAT ms", "ring ms", "speed-up", "Melem/s",
                         "bytes/worker (SwitchML)", "bytes/rank (ring)", "retx"), rows,
                        title="SwitchML vs ring AllReduce (p50 of 3 iterations)")]
    loss = [(tags, s, r) for tags, s, r in cases(doc) if tags["kind"] == "loss"]
    if loss:
        base = _tat(loss[0][1])["tat_s"]["p50"]
        ring_base = first_size(loss[0][2], "ring")["cct_ms"]["p50"]
        out.append(format_table(("loss on every link", "SwitchML TAT ms", "inflation", "retransmissions",
                                 "dropped", "ring ms", "ring inflation", "ring retransmitted"),
                                [(f"{tags['loss']:.2%}", f"{_tat(s)['tat_s']['p50'] * 1e3:.1f}",
                                  f"{_tat(s)['tat_s']['p50'] / base:.2f}x", _tat(s)["retransmissions"],
                                  _dropped(s), f"{first_size(r, 'ring')['cct_ms']['p50']:.1f}",
                                  f"{first_size(r, 'ring')['cct_ms']['p50'] / ring_base:.2f}x",
                                  first_size(r, "ring")["counters"].get("retransmitted_packets", 0))
                                 for tags, s, r in loss],
                                title=f"TAT under loss, p50 of 3 ({loss[0][0]['workers']} workers, "
                                      f"{human_size(4 * loss[0][0]['elements'])}; seed 003 Figure 6)"))
    return "\n\n".join(out)


def plot(doc, folder):
    from fabriclab.results import plots

    sizes = [(tags, s, r) for tags, s, r in cases(doc) if tags["kind"] == "size"]
    for n in sorted({tags["workers"] for tags, _s, _r in sizes}):
        mine = [(tags, s, r) for tags, s, r in sizes if tags["workers"] == n]
        xs = [4 * tags["elements"] for tags, _s, _r in mine]
        plots.lines(folder / f"tat-n{n}.png", f"{n} workers: time to aggregate a tensor", xs,
                    {"SwitchML TAT": [_tat(s)["tat_s"]["p50"] * 1e3 for _t, s, _r in mine],
                     "ring AllReduce": [first_size(r, "ring")["cct_ms"]["p50"] for _t, _s, r in mine]},
                    "tensor bytes", "ms")
    loss = [(tags, s, r) for tags, s, r in cases(doc) if tags["kind"] == "loss"]
    if loss:
        base = _tat(loss[0][1])["tat_s"]["p50"]
        ring_base = first_size(loss[0][2], "ring")["cct_ms"]["p50"]
        plots.bars(folder / "loss-inflation.png", "TAT inflation under loss on every link (Figure 6)",
                   [f"{tags['loss']:.2%}" for tags, _s, _r in loss],
                   [("SwitchML: TAT / loss-free TAT", [_tat(s)["tat_s"]["p50"] / base for _t, s, _r in loss]),
                    ("ring AllReduce: time / loss-free",
                     [first_size(r, "ring")["cct_ms"]["p50"] / ring_base for _t, _s, r in loss])])
        # Figure 7: packets one worker sent per interval, and where each run's TAT ended.
        width = max(_tat(s)["tat_s"]["per_iteration"][0] for _t, s, _r in loss) / 50
        series, marks = {}, []
        for tags, s, _r in loss:
            t, end = _tat(s)["timeline"], _tat(s)["tat_s"]["per_iteration"][0]
            counts = [0] * (int(end / width) + 2)
            for when in t["sends"] + t["resends"]:
                counts[min(int(when / width), len(counts) - 1)] += 1
            series[f"{tags['loss']:.2%} loss"] = ([i * width for i in range(len(counts))], counts)
            marks.append((end, f"TAT at {tags['loss']:.2%}"))
        plots.timeline(folder / "timeline.png", "packets a worker sent per interval (Figure 7)", series,
                       "time from the aggregation's start (s)", f"packets per {width * 1e3:.1f} ms", marks=marks)
