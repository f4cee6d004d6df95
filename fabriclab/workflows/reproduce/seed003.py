"""Claims of seed 003 (SwitchML: in-network aggregation)."""

from __future__ import annotations

from fabriclab.model import collectives as cc
from fabriclab.workflows.reproduce.claim import Claim, Effect, Finding, invalid_reasons, ratio


def _pairs(doc, kind):
    from fabriclab.workflows.experiments.switchml import cases

    return [(tags, s, r) for tags, s, r in cases(doc) if tags["kind"] == kind]


def _tat_ms(run):
    return run["jobs"]["switchml"]["aggregation"]["tat_s"]["p50"] * 1e3


def _ring_ms(run):
    return run["jobs"]["ring"]["sizes"][0]["cct_ms"]["p50"]


def speedup(docs):
    doc = docs["switchml"]
    largest = max(tags["elements"] for tags, _s, _r in _pairs(doc, "size"))
    rows = sorted(((tags["workers"], ratio(_ring_ms(r), _tat_ms(s))) for tags, s, r in _pairs(doc, "size")
                   if tags["elements"] == largest))
    n, top = rows[-1]
    bound = 2 * (n - 1) / n
    return Finding(
        lab=", ".join(f"{w} workers: x{x:.2f} (bound x{2 * (w - 1) / w:.2f})" for w, x in rows),
        lab_value=top, against=bound,
        effects=(Effect(f"ring time / SwitchML TAT, {n} workers", top, ">", 1.0),
                 Effect(f"speed-up {n} workers - {rows[0][0]} workers", top - rows[0][1], ">", 0.0)),
        direction="SwitchML beats ring AllReduce on the largest tensor, more so with more workers",
        model="bandwidth bound 2(n-1)/n (seed 003 section 3)",
        bars=[(f"lab n={w}", x) for w, x in rows] + [(f"bound n={w}", 2 * (w - 1) / w) for w, _x in rows],
        unit="ring time / SwitchML TAT", invalid=invalid_reasons(doc))


def bytes_per_worker(docs):
    doc = docs["switchml"]
    tags, s, r = max(_pairs(doc, "size"), key=lambda c: (c[0]["workers"], c[0]["elements"]))
    n = tags["workers"]
    ring_bytes = r["jobs"]["ring"]["sizes"][0]["bytes_sent_per_rank"][0]
    sml_bytes = s["jobs"]["switchml"]["aggregation"]["bytes_sent_per_worker"]
    got = ratio(ring_bytes, sml_bytes)
    tensor = 4 * tags["elements"]
    model = cc.bytes_per_worker("ring", tensor, n) / cc.bytes_per_worker("in-network", tensor, n)
    return Finding(
        lab=f"{n} workers: a ring rank sends x{got:.2f} what a SwitchML worker does",
        lab_value=got, against=model,
        effects=(Effect("ring bytes / SwitchML bytes", got, ">", 1.0 if n > 2 else 0.9),),
        direction="a ring rank sends 2(n-1)/n times the bytes a SwitchML worker sends",
        model=f"x{model:.2f} (payload only)", bars=[("lab", got), ("model 2(n-1)/n", model)],
        unit="ring bytes / SwitchML bytes", invalid=invalid_reasons(doc))


def _loss_rows(doc):
    """(losses, SwitchML's TAT and the ring's time under each loss over their loss-free times, and
    the same as milliseconds)."""
    rows = _pairs(doc, "loss")
    base_s, base_r = _tat_ms(rows[0][1]), _ring_ms(rows[0][2])
    losses = [tags["loss"] for tags, _s, _r in rows]
    sml_ms, ring_ms = [_tat_ms(s) for _t, s, _r in rows], [_ring_ms(r) for _t, _s, r in rows]
    return losses, [t / base_s for t in sml_ms], [t / base_r for t in ring_ms], sml_ms, ring_ms


def _loss_lines(losses, sml, ring, ylabel):
    return {"x": [max(l, 1e-5) for l in losses], "xlabel": "loss on every link (0 drawn at 0.001%)",
            "ylabel": ylabel, "series": {"SwitchML": sml, "ring AllReduce": ring}}


def loss(docs):
    doc = docs["switchml"]
    losses, sml, ring, _sml_ms, _ring_ms_ = _loss_rows(doc)
    return Finding(
        lab=", ".join(f"{l:.2%}: x{a:.2f}" for l, a in zip(losses[1:], sml[1:])) + " SwitchML TAT",
        lab_value=None,
        effects=(Effect(f"SwitchML TAT at {losses[1]:.2%} loss / loss-free", sml[1], "<", 1.3),
                 Effect(f"TAT at {losses[-1]:.2%} - at {losses[1]:.2%} (loss-free times)", sml[-1] - sml[1], ">", 0.0)),
        direction="0.01% loss costs SwitchML under 30% of its TAT, and the highest loss costs it most",
        lines=_loss_lines(losses, sml, ring, "time / loss-free time"), invalid=invalid_reasons(doc))


def loss_against_ring(docs):
    doc = docs["switchml"]
    losses, _sml, _ring, sml_ms, ring_ms = _loss_rows(doc)
    return Finding(
        lab=", ".join(f"{l:.2%}: {a:.0f} ms against the ring's {b:.0f}" for l, a, b in
                      zip(losses[2:], sml_ms[2:], ring_ms[2:])),
        lab_value=None,
        effects=tuple(Effect(f"SwitchML / ring time at {l:.2%} loss", a / b, "<", 1.0)
                      for l, a, b in zip(losses[2:], sml_ms[2:], ring_ms[2:])),
        direction="from 0.1% loss up, SwitchML aggregates sooner than the ring AllReduce",
        lines=_loss_lines(losses, sml_ms, ring_ms, "ms"), invalid=invalid_reasons(doc))


CONDITIONS = ("paper: 8 workers, 100G, a Tofino switch; lab: the `switchml` spec, workers under one leaf, "
              "the aggregator a host beside the ToR at n x the host rate, UDP ring AllReduce for comparison")

CLAIMS = (
    Claim("003-speedup", "003", "3, 6.1", "in-network aggregation beats ring AllReduce, approaching the "
          "bandwidth bound 2(n-1)/n as workers grow", "bound 2(n-1)/n", None, ("switchml",), speedup,
          CONDITIONS, "small tensors at the lab's rates are latency-bound, so the lab's speed-up is below "
          "the bandwidth bound"),
    Claim("003-bytes", "003", "3", "a worker sends the tensor once to the switch; a ring rank sends "
          "2(n-1)/n of it", "2(n-1)/n", None, ("switchml",), bytes_per_worker, CONDITIONS,
          "headers: SwitchML's packets carry 256 B of payload, the ring's full frames"),
    Claim("003-loss", "003", "6.3, Figure 6", "0.01% loss minimally affects tensor aggregation time; "
          "the cost grows with the loss rate, one retransmission timeout per lost packet's slot",
          "a trend", None, ("switchml",), loss, CONDITIONS),
    Claim("003-loss-vs-ring", "003", "6.3, Figure 6", "from 0.1% loss up SwitchML beats the rings of "
          "NCCL and Gloo, whose transports wait out timeouts", "a direction", None, ("switchml",),
          loss_against_ring, CONDITIONS,
          "the lab's ring runs on emulated RNICs that recover a loss by NAK and go-back-N with no "
          "timeout at these small bandwidth-delay products, so it hardly slows (x1.04 at 1%), while "
          "SwitchML waits out its timer; with 4 workers it still stays ahead, with fewer it need not",
          reproduced=False),
)
