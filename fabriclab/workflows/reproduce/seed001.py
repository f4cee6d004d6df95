"""Claims of seed 001 (Zion / DLRM training at Facebook): ring against fully-connected accelerator
topologies, from the paper's own analytical model (equations 1-4), for 8 nodes as in Figure 10.

The lab builds switched fabrics, not point-to-point accelerator rings, so these claims are the
analytical model's (fabriclab.model.collectives) and say so."""

from __future__ import annotations

from fabriclab.model import collectives as cc
from fabriclab.workflows.reproduce.claim import Claim, Effect, Finding

NODES = 8
NODE_BW = 100e9                 # bytes/s out of a node in all (the paper gives none; ratios scale with it)
SIZES = tuple(2 ** k for k in range(10, 31, 2))       # 1 KiB .. 1 GiB
ALPHAS_US = (0.5, 2.0, 8.0)                           # per-node (per-hop) latency
NOT_EMULATED = ("the lab's fabrics are switched, every host one hop from every other through a leaf; "
                "a point-to-point accelerator ring is not a fabric kind, so the claim is the analytical "
                "model's, not an emulation's")


def ratios(ring, fc, alpha_us):
    return [ring(size, NODES, alpha_us * 1e-6, NODE_BW).time / fc(size, NODES, alpha_us * 1e-6, NODE_BW).time
            for size in SIZES]


def _lines(ring, fc):
    return {"x": list(SIZES), "xlabel": "message size (bytes)", "ylabel": "T(ring) / T(fully connected)",
            "series": {f"alpha {a:g} us": ratios(ring, fc, a) for a in ALPHAS_US}}


def _trends(series):
    """Each curve falls with the message size, and a larger alpha lies above a smaller one."""
    curves = list(series.values())
    falling = all(b <= a + 1e-9 for c in curves for a, b in zip(c, c[1:]))
    ordered = all(hi[0] >= lo[0] for lo, hi in zip(curves, curves[1:]))
    return falling and ordered


def allreduce(docs):
    lines = _lines(cc.ring_allreduce, cc.fc_allreduce)
    big = [c[-1] for c in lines["series"].values()]
    small = [c[0] for c in lines["series"].values()]
    return Finding(
        lab=f"T ring / T FC at 1 GiB: {min(big):.3f}-{max(big):.3f}; at 1 KiB: {min(small):.2f}-{max(small):.2f} "
            f"(alpha {ALPHAS_US[0]:g}-{ALPHAS_US[-1]:g} us)",
        lab_value=max(big),
        effects=(Effect("curves fall with size and rise with alpha (1 yes, 0 no)", float(_trends(lines["series"])), ">", 0.5),
                 Effect("largest T ring / T FC at 1 GiB", max(big), "<", 1.01)),
        direction="the ratio falls to 1 as messages grow, and rises with the per-node latency",
        model="analytical (seed 001 eq. 1-2)", lines=lines)


def alltoall(docs):
    lines = _lines(cc.ring_topology_alltoall, cc.fc_alltoall)
    limit = cc.ring_hops_gamma(NODES) / (NODES - 1)
    big = [c[-1] for c in lines["series"].values()]
    at_100k = [ratio for ratio in (cc.ring_topology_alltoall(100_000, NODES, a * 1e-6, NODE_BW).time
                                   / cc.fc_alltoall(100_000, NODES, a * 1e-6, NODE_BW).time for a in ALPHAS_US)]
    return Finding(
        lab=f"T ring / T FC at 1 GiB: {min(big):.3f} (gamma/(p-1) = {limit:.3f}); at 100 KB "
            f"{min(at_100k):.2f}-{max(at_100k):.2f}",
        lab_value=min(big),
        effects=(Effect("curves fall with size and rise with alpha (1 yes, 0 no)", float(_trends(lines["series"])), ">", 0.5),
                 Effect("distance of T ring / T FC at 1 GiB from gamma/(p-1)", abs(min(big) - limit), "<", 0.01)),
        direction=f"the ratio falls with the message size towards gamma/(p-1) = {limit:.2f}",
        model="analytical (seed 001 eq. 3-4)", lines=lines)


CONDITIONS = (f"paper: 8 nodes, fixed per-node bandwidth B split over p-1 channels in FC; lab: the same "
              f"model, p = {NODES}, alpha {', '.join(f'{a:g}' for a in ALPHAS_US)} us, sizes 1 KiB-1 GiB")

CLAIMS = (
    Claim("001-allreduce-topology", "001", "Figure 10a, eq. 1-2", "for AllReduce the physical topology "
          "matters only for small messages and high per-node latency; large messages cost the same on "
          "a ring and a fully connected topology", "ratio -> 1 for large messages", 1.0, (), allreduce,
          CONDITIONS, NOT_EMULATED),
    Claim("001-alltoall-topology", "001", "Figure 10b, eq. 3-4", "for AlltoAll a fully connected topology "
          "beats a ring at every size: by gamma/(p-1), about 2.3x, for large messages on 8 nodes, and "
          "by more for small ones (up to 3x at 100 KB)", "~2.3x at large sizes", 2.3, (), alltoall,
          CONDITIONS, NOT_EMULATED + "; the small-message ratios depend on alpha and B, which the paper does "
          "not state (here B = 100 GB/s), so only the large-message limit is a number to compare"),
)
